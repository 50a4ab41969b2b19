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

/// The strings of a JSON array (others skipped); none when `v` is not one.
pub fn str_list(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
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
    format!("{:.0}", jiff::Timestamp::now())
}

/// Time in `metav1.MicroTime` form (leases, events.k8s.io).
pub fn now_micro() -> String {
    format!("{:.6}", jiff::Timestamp::now())
}

/// An RFC 3339 time with any offset.
pub fn parse_time(s: &str) -> Option<jiff::Timestamp> {
    s.parse().ok()
}

/// Whole seconds from `t` to now (negative for a time to come).
pub fn seconds_since(t: jiff::Timestamp) -> i64 {
    jiff::Timestamp::now().as_second() - t.as_second()
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

/// Bytes to store: the object without `resourceVersion`, in upstream's
/// field order (answers splice these bytes).
pub fn encode_for_store(obj: &Value) -> Vec<u8> {
    // Most writes carry no resourceVersion (create drops it): serialize
    // in place instead of deep-copying the object first.
    if obj
        .get("metadata")
        .and_then(|m| m.get("resourceVersion"))
        .is_none()
    {
        return super::order::to_vec(obj);
    }
    let mut v = obj.clone();
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
    }
    super::order::to_vec(&v)
}

/// Stored bytes with `metadata.resourceVersion` spliced in, without parsing
/// the object (lists and gets are mostly this), where upstream puts it:
/// after `name`, `generateName`, `namespace`, `selfLink` and `uid`. None
/// when the top-level `metadata` object is not found; callers then take
/// the parsing path.
pub fn splice_resource_version(stored: &[u8], revision: i64) -> Option<Vec<u8>> {
    const PAT: &[u8] = b"\"metadata\":{";
    let mut i = 0;
    let mut depth = 0i32;
    while i < stored.len() {
        match stored[i] {
            b'"' => {
                if depth == 1 && stored[i..].starts_with(PAT) {
                    let at = after_identity(stored, i + PAT.len())?;
                    let empty = stored.get(at) == Some(&b'}');
                    let lead = at > i + PAT.len();
                    let mut out = Vec::with_capacity(stored.len() + 32);
                    out.extend_from_slice(&stored[..at]);
                    if lead {
                        out.push(b',');
                    }
                    out.extend_from_slice(format!("\"resourceVersion\":\"{revision}\"").as_bytes());
                    if !empty {
                        out.push(b',');
                    }
                    // Skip the comma that followed the last identity key.
                    let rest = if lead && stored.get(at) == Some(&b',') {
                        at + 1
                    } else {
                        at
                    };
                    out.extend_from_slice(&stored[rest..]);
                    return Some(out);
                }
                i = skip_string(stored, i)?;
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth -= 1,
            _ => {}
        }
        i += 1;
    }
    None
}

/// The metadata keys that come before `resourceVersion` in Go's ObjectMeta.
const BEFORE_RV: &[&[u8]] = &[b"name", b"generateName", b"namespace", b"selfLink", b"uid"];

/// In the metadata object whose members start at `start`, the offset just
/// after the last member that precedes `resourceVersion` (`start` when
/// none does); there, at a `,` or the closing `}`, it goes in.
fn after_identity(b: &[u8], start: usize) -> Option<usize> {
    let mut pos = start;
    loop {
        if b.get(pos) != Some(&b'"') {
            return Some(pos);
        }
        let key_end = skip_string(b, pos)?;
        let key = &b[pos + 1..key_end - 1];
        if !BEFORE_RV.contains(&key) {
            return pos.checked_sub(usize::from(pos > start));
        }
        // `"key":value`, then `,` or `}`.
        let value_end = skip_value(b, key_end + 1)?;
        match b.get(value_end) {
            Some(b',') => pos = value_end + 1,
            _ => return Some(value_end),
        }
    }
}

/// The offset after the JSON string that starts at `i` (a `"`).
fn skip_string(b: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    while j < b.len() {
        match b[j] {
            b'\\' => j += 2,
            b'"' => return Some(j + 1),
            _ => j += 1,
        }
    }
    None
}

/// The offset after the (compact) JSON value that starts at `i`.
fn skip_value(b: &[u8], i: usize) -> Option<usize> {
    let mut j = i;
    let mut depth = 0i32;
    while j < b.len() {
        match b[j] {
            b'"' => {
                j = skip_string(b, j)?;
                if depth == 0 {
                    return Some(j);
                }
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                if depth == 0 {
                    return Some(j);
                }
                depth -= 1;
                if depth == 0 {
                    return Some(j + 1);
                }
            }
            b',' if depth == 0 => return Some(j),
            _ => {}
        }
        j += 1;
    }
    Some(j)
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
        // Where Go's ObjectMeta has it: after the identity, before the rest.
        let cases: [(&[u8], &[u8]); 4] = [
            (
                br#"{"kind":"Pod","metadata":{"name":"p","namespace":"d","uid":"u","creationTimestamp":"t"},"spec":{}}"#,
                br#"{"kind":"Pod","metadata":{"name":"p","namespace":"d","uid":"u","resourceVersion":"9","creationTimestamp":"t"},"spec":{}}"#,
            ),
            (
                br#"{"metadata":{"name":"p","uid":"u"}}"#,
                br#"{"metadata":{"name":"p","uid":"u","resourceVersion":"9"}}"#,
            ),
            (
                br#"{"metadata":{"labels":{"name":"x"}}}"#,
                br#"{"metadata":{"resourceVersion":"9","labels":{"name":"x"}}}"#,
            ),
            (
                br#"{"metadata":{"name":"a\"b","generateName":"g-"}}"#,
                br#"{"metadata":{"name":"a\"b","generateName":"g-","resourceVersion":"9"}}"#,
            ),
        ];
        for (stored, want) in cases {
            let got = splice_resource_version(stored, 9).unwrap();
            assert_eq!(String::from_utf8_lossy(&got), String::from_utf8_lossy(want));
        }
        assert!(splice_resource_version(br#"{"spec":{"metadata":{}}}"#, 3).is_none());
        assert_eq!(
            lite_metadata(br#"{"metadata":{"name":"n","labels":{"a":"b"}},"spec":{}}"#).unwrap()
                ["metadata"]["labels"]["a"],
            "b"
        );
    }
}
