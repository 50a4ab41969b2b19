//! Small helpers over objects kept as `serde_json::Value`.

use serde_json::{Map, Value};

/// `metadata`, created when missing.
pub fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = Value::Object(Map::new());
    }
    obj["metadata"]
        .as_object_mut()
        .expect("metadata is an object")
}

pub fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?
        .get(field)?
        .as_str()
        .filter(|s| !s.is_empty())
}

pub fn name(obj: &Value) -> Option<&str> {
    meta_str(obj, "name")
}

pub fn namespace(obj: &Value) -> Option<&str> {
    meta_str(obj, "namespace")
}

/// A string at a dotted path (`spec.nodeName`).
pub fn str_at<'a>(obj: &'a Value, path: &str) -> Option<&'a str> {
    value_at(obj, path)?.as_str()
}

pub fn value_at<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(obj, |v, k| v.get(k))
}

/// Labels as (key, value) pairs.
pub fn labels(obj: &Value) -> Vec<(&str, &str)> {
    obj.get("metadata")
        .and_then(|m| m.get("labels"))
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.as_str(), v.as_str()?)))
                .collect()
        })
        .unwrap_or_default()
}

pub fn finalizers(obj: &Value) -> Vec<String> {
    obj.get("metadata")
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

pub fn has_deletion_timestamp(obj: &Value) -> bool {
    meta_str(obj, "deletionTimestamp").is_some()
}

/// RFC 3339 UTC time with seconds, as Kubernetes writes `metav1.Time`.
pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Time in `metav1.MicroTime` form (leases, events.k8s.io).
pub fn now_micro() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

pub fn parse_time(s: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.with_timezone(&chrono::Utc))
}

/// Random suffix for `generateName`, from upstream's alphabet (no vowels, so
/// no words, and no look-alike characters).
pub fn random_suffix(n: usize) -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..n)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// A random (version 4) UUID for `metadata.uid`. The bytes come from the
/// thread's ChaCha generator (seeded from the OS, reseeded as it goes):
/// `Uuid::new_v4` asks the kernel for every one, a syscall per create.
pub fn new_uid() -> String {
    uuid::Builder::from_random_bytes(rand::random())
        .into_uuid()
        .to_string()
}

/// Parse stored bytes and stamp `resourceVersion` from the store revision
/// (upstream never stores it in the value either).
pub fn decode_stored(value: &[u8], revision: i64) -> Option<Value> {
    let mut v: Value = serde_json::from_slice(value).ok()?;
    if v.is_object() {
        meta_mut(&mut v).insert(
            "resourceVersion".into(),
            Value::String(revision.to_string()),
        );
    }
    Some(v)
}

/// Bytes to store: the object without `resourceVersion`.
pub fn encode_for_store(obj: &Value) -> Vec<u8> {
    // Most writes carry no resourceVersion (create drops it): serialize
    // in place instead of deep-copying the object first.
    if obj
        .get("metadata")
        .and_then(|m| m.get("resourceVersion"))
        .is_none()
    {
        return serde_json::to_vec(obj).unwrap_or_default();
    }
    let mut v = obj.clone();
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
    }
    serde_json::to_vec(&v).unwrap_or_default()
}

/// Stored bytes with `metadata.resourceVersion` spliced in, without parsing
/// the object (lists and gets are mostly this). None when the top-level
/// `metadata` object is not found; callers then take the parsing path.
pub fn splice_resource_version(stored: &[u8], revision: i64) -> Option<Vec<u8>> {
    const PAT: &[u8] = b"\"metadata\":{";
    let (mut depth, mut in_str, mut esc) = (0i32, false, false);
    for (i, &c) in stored.iter().enumerate() {
        if in_str {
            if esc {
                esc = false;
            } else if c == b'\\' {
                esc = true;
            } else if c == b'"' {
                in_str = false;
            }
            continue;
        }
        match c {
            b'"' => {
                if depth == 1 && stored[i..].starts_with(PAT) {
                    let at = i + PAT.len();
                    let mut out = Vec::with_capacity(stored.len() + 32);
                    out.extend_from_slice(&stored[..at]);
                    out.extend_from_slice(format!("\"resourceVersion\":\"{revision}\"").as_bytes());
                    if stored.get(at) != Some(&b'}') {
                        out.push(b',');
                    }
                    out.extend_from_slice(&stored[at..]);
                    return Some(out);
                }
                in_str = true;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth -= 1,
            _ => {}
        }
    }
    None
}

/// Just the metadata a selector on labels, name or namespace needs; serde
/// skips the rest of the object without building it.
#[derive(Debug, Default, serde::Deserialize)]
struct Lite {
    #[serde(default)]
    metadata: LiteMeta,
}

#[derive(Debug, Default, serde::Deserialize)]
struct LiteMeta {
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    labels: std::collections::BTreeMap<String, String>,
}

/// `{"metadata": {name, namespace, labels}}` of stored bytes, cheaply.
pub fn lite_metadata(stored: &[u8]) -> Option<Value> {
    let l: Lite = serde_json::from_slice(stored).ok()?;
    Some(
        serde_json::json!({"metadata": {"name": l.metadata.name, "namespace": l.metadata.namespace, "labels": l.metadata.labels}}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uids_are_distinct_version_4_uuids() {
        let (a, b) = (new_uid(), new_uid());
        assert_ne!(a, b);
        let u = uuid::Uuid::parse_str(&a).unwrap();
        assert_eq!(u.get_version(), Some(uuid::Version::Random));
    }

    #[test]
    fn splices_at_the_top_level_metadata_only() {
        let stored = br#"{"apiVersion":"v1","data":{"x":"\"metadata\":{"},"kind":"ConfigMap","metadata":{"name":"a"}}"#;
        let out = splice_resource_version(stored, 7).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["metadata"]["resourceVersion"], "7");
        assert_eq!(v["data"]["x"], "\"metadata\":{");
        let empty = splice_resource_version(br#"{"metadata":{}}"#, 3).unwrap();
        assert_eq!(empty, br#"{"metadata":{"resourceVersion":"3"}}"#);
        assert!(splice_resource_version(br#"{"spec":{"metadata":{}}}"#, 3).is_none());
        assert_eq!(
            lite_metadata(br#"{"metadata":{"name":"n","labels":{"a":"b"}},"spec":{}}"#).unwrap()
                ["metadata"]["labels"]["a"],
            "b"
        );
    }
}
