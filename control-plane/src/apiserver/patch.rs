//! PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and
//! strategic merge patch with upstream's merge keys and directives
//! (`$patch`, `$retainKeys`, `$setElementOrder/`, `$deleteFromPrimitiveList/`).
//!
//! The merge keys below are the `patchMergeKey`/`patchStrategy` tags of the
//! upstream Go types that the server serves; kubectl computes its patches
//! from the same tags, so both sides agree on what a list item is.

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value};

use super::status::ApiError;

/// Patch failures.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The patch body is not valid JSON/YAML of the right shape (400).
    #[error("{0}")]
    Malformed(String),
    /// The patch is well formed but cannot apply to this object (422).
    #[error("{0}")]
    Apply(String),
    /// A JSON patch with more operations than upstream takes (413).
    #[error("{0}")]
    TooLarge(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<Error> for ApiError {
    fn from(e: Error) -> ApiError {
        match e {
            Error::Malformed(m) => ApiError::bad_request(m),
            Error::Apply(m) => ApiError::new(422, "Invalid", m),
            Error::TooLarge(m) => ApiError::new(413, "RequestEntityTooLarge", m),
        }
    }
}

/// Upstream's `maxJSONPatchOperations`: each operation may walk the whole
/// object, so their number bounds the work.
pub const MAX_JSON_PATCH_OPERATIONS: usize = 10_000;

/// What all of a JSON patch's `copy` operations may add, in JSON bytes
/// (upstream's `--json-patch-max-copy-bytes` default): each copy of the
/// root doubles the object, so without a bound a small patch allocates
/// without end.
pub const MAX_JSON_PATCH_COPY_BYTES: usize = 3 * 1024 * 1024;

/// Which patch format the Content-Type names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Json,
    Merge,
    Strategic,
    /// Server-side apply: see [`super::server_side_apply`], which every
    /// handler goes through. [`apply`] takes it as a strategic merge of
    /// the applied configuration (the patch fuzzers' model).
    Apply,
}

impl PatchType {
    pub fn from_content_type(ct: &str) -> Option<Self> {
        match super::media_type(ct) {
            "application/json-patch+json" => Some(PatchType::Json),
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => {
                Some(PatchType::Apply)
            }
            _ => None,
        }
    }
}

/// Apply `body` of type `pt` to `doc` (an object of `kind`).
pub fn apply(doc: &Value, body: &[u8], pt: PatchType, kind: &str) -> Result<Value> {
    match pt {
        PatchType::Json => {
            let p: json_patch::Patch = serde_json::from_slice(body)
                .map_err(|e| Error::Malformed(format!("invalid JSON patch: {e}")))?;
            let out = json_patch(doc, &p.0)?;
            if !out.is_object() {
                return Err(Error::Apply(
                    "the patched document must stay a JSON object".into(),
                ));
            }
            Ok(out)
        }
        PatchType::Merge => {
            let p: Value = parse_object(body)?;
            let mut out = doc.clone();
            json_patch::merge(&mut out, &p);
            Ok(out)
        }
        PatchType::Strategic | PatchType::Apply => {
            let p: Value = parse_object(body)?;
            strategic(doc, &p, kind)
        }
    }
}

/// Apply a JSON patch's operations in turn to a copy of `doc`, within
/// upstream's bounds on their number and on what copies add.
fn json_patch(doc: &Value, ops: &[json_patch::PatchOperation]) -> Result<Value> {
    if ops.len() > MAX_JSON_PATCH_OPERATIONS {
        return Err(Error::TooLarge(format!(
            "The allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPERATIONS}, got {}",
            ops.len()
        )));
    }
    let mut out = doc.clone();
    let mut copy_budget = MAX_JSON_PATCH_COPY_BYTES;
    for (i, op) in ops.iter().enumerate() {
        if let json_patch::PatchOperation::Copy(c) = op {
            if let Some(v) = out.pointer(c.from.as_str()) {
                copy_budget = spend(copy_budget, v).ok_or_else(|| {
                    Error::Apply(format!(
                        "the JSON patch could not be applied: its copies add more than {MAX_JSON_PATCH_COPY_BYTES} bytes"
                    ))
                })?;
            }
        }
        // One at a time, without json_patch's undo log: on failure the
        // copy is dropped whole, so there is nothing to undo.
        json_patch::patch_unsafe(&mut out, std::slice::from_ref(op)).map_err(|e| {
            Error::Apply(format!(
                "the JSON patch could not be applied: operation {i} failed at path {:?}: {}",
                e.path.as_str(),
                e.kind
            ))
        })?;
    }
    Ok(out)
}

/// `budget` less the JSON size of `v`; None when `v` is larger. Costs at
/// most `budget` bytes of serializing, however large `v` is.
fn spend(budget: usize, v: &Value) -> Option<usize> {
    struct Meter(usize);
    impl std::io::Write for Meter {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 = self
                .0
                .checked_sub(b.len())
                .ok_or(std::io::ErrorKind::FileTooLarge)?;
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut meter = Meter(budget);
    serde_json::to_writer(&mut meter, v).ok()?;
    Some(meter.0)
}

fn parse_object(body: &[u8]) -> Result<Value> {
    let v: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(_) => serde_saphyr::from_slice(body)
            .map_err(|e| Error::Malformed(format!("invalid patch body: {e}")))?,
    };
    if !v.is_object() {
        return Err(Error::Malformed(
            "the patch body must be a JSON object".into(),
        ));
    }
    Ok(v)
}

/// How a list field merges.
struct ListRule {
    /// Merge key for lists of objects; None for a merged list of primitives.
    key: Option<&'static str>,
    item: &'static str,
}

/// (type, field) -> type of an object field.
const FIELDS: &[(&str, &str, &str)] = &[
    ("Pod", "spec", "PodSpec"),
    ("Pod", "status", "PodStatus"),
    ("PodTemplateSpec", "spec", "PodSpec"),
    ("Deployment", "spec", "WorkloadSpec"),
    ("ReplicaSet", "spec", "WorkloadSpec"),
    ("DaemonSet", "spec", "WorkloadSpec"),
    ("Job", "spec", "WorkloadSpec"),
    ("WorkloadSpec", "template", "PodTemplateSpec"),
    ("Deployment", "status", "Status"),
    ("ReplicaSet", "status", "Status"),
    ("DaemonSet", "status", "Status"),
    ("Job", "status", "Status"),
    ("Namespace", "status", "Status"),
    ("Service", "spec", "ServiceSpec"),
    ("Service", "status", "Status"),
    ("Node", "spec", "NodeSpec"),
    ("Node", "status", "NodeStatus"),
    ("PodSpec", "affinity", "Affinity"),
];

/// (type, field) -> list merge rule; lists not named here are replaced whole
/// (upstream's default, "atomic").
const LISTS: &[(&str, &str, ListRule)] = &[
    (
        "MutatingWebhookConfiguration",
        "webhooks",
        ListRule {
            key: Some("name"),
            item: "",
        },
    ),
    (
        "ValidatingWebhookConfiguration",
        "webhooks",
        ListRule {
            key: Some("name"),
            item: "",
        },
    ),
    (
        "ObjectMeta",
        "finalizers",
        ListRule {
            key: None,
            item: "",
        },
    ),
    (
        "ObjectMeta",
        "ownerReferences",
        ListRule {
            key: Some("uid"),
            item: "",
        },
    ),
    (
        "PodSpec",
        "containers",
        ListRule {
            key: Some("name"),
            item: "Container",
        },
    ),
    (
        "PodSpec",
        "initContainers",
        ListRule {
            key: Some("name"),
            item: "Container",
        },
    ),
    (
        "PodSpec",
        "ephemeralContainers",
        ListRule {
            key: Some("name"),
            item: "Container",
        },
    ),
    (
        "PodSpec",
        "volumes",
        ListRule {
            key: Some("name"),
            item: "Volume",
        },
    ),
    (
        "PodSpec",
        "imagePullSecrets",
        ListRule {
            key: Some("name"),
            item: "",
        },
    ),
    (
        "PodSpec",
        "hostAliases",
        ListRule {
            key: Some("ip"),
            item: "",
        },
    ),
    (
        "PodSpec",
        "topologySpreadConstraints",
        ListRule {
            key: Some("topologyKey"),
            item: "",
        },
    ),
    (
        "PodSpec",
        "resourceClaims",
        ListRule {
            key: Some("name"),
            item: "",
        },
    ),
    (
        "PodSpec",
        "schedulingGates",
        ListRule {
            key: Some("name"),
            item: "",
        },
    ),
    (
        "Container",
        "env",
        ListRule {
            key: Some("name"),
            item: "",
        },
    ),
    (
        "Container",
        "ports",
        ListRule {
            key: Some("containerPort"),
            item: "",
        },
    ),
    (
        "Container",
        "volumeMounts",
        ListRule {
            key: Some("mountPath"),
            item: "",
        },
    ),
    (
        "Container",
        "volumeDevices",
        ListRule {
            key: Some("devicePath"),
            item: "",
        },
    ),
    (
        "PodStatus",
        "conditions",
        ListRule {
            key: Some("type"),
            item: "",
        },
    ),
    (
        "PodStatus",
        "podIPs",
        ListRule {
            key: Some("ip"),
            item: "",
        },
    ),
    (
        "ServiceSpec",
        "ports",
        ListRule {
            key: Some("port"),
            item: "",
        },
    ),
    (
        "NodeSpec",
        "podCIDRs",
        ListRule {
            key: None,
            item: "",
        },
    ),
    (
        "NodeStatus",
        "conditions",
        ListRule {
            key: Some("type"),
            item: "",
        },
    ),
    (
        "NodeStatus",
        "addresses",
        ListRule {
            key: Some("type"),
            item: "",
        },
    ),
    (
        "Status",
        "conditions",
        ListRule {
            key: Some("type"),
            item: "",
        },
    ),
];

fn field_type(ty: &str, field: &str) -> &'static str {
    if field == "metadata" {
        return "ObjectMeta";
    }
    FIELDS
        .iter()
        .find(|(t, f, _)| *t == ty && *f == field)
        .map(|(_, _, c)| *c)
        .unwrap_or("")
}

fn list_rule(ty: &str, field: &str) -> Option<&'static ListRule> {
    LISTS
        .iter()
        .find(|(t, f, _)| *t == ty && *f == field)
        .map(|(_, _, r)| r)
}

/// Strategic merge of `patch` into `doc` (an object of `kind`).
pub fn strategic(doc: &Value, patch: &Value, kind: &str) -> Result<Value> {
    let mut out = doc.clone();
    match (out.as_object_mut(), patch.as_object()) {
        (Some(o), Some(p)) => {
            if !merge_map(o, p, kind)? {
                return Err(Error::Apply(
                    "a strategic merge patch cannot delete the whole object".into(),
                ));
            }
            Ok(out)
        }
        _ => Err(Error::Malformed(
            "the patch body must be a JSON object".into(),
        )),
    }
}

/// Merge `patch` into `orig`; false when the patch says `$patch: delete`.
fn merge_map(orig: &mut Map<String, Value>, patch: &Map<String, Value>, ty: &str) -> Result<bool> {
    match patch.get("$patch").and_then(Value::as_str) {
        Some("delete") => return Ok(false),
        Some("replace") => {
            *orig = strip(patch);
            return Ok(true);
        }
        Some("merge") | None => {}
        Some(other) => {
            return Err(Error::Malformed(format!(
                "unknown patch directive $patch: {other}"
            )))
        }
    }
    for (k, pv) in patch {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Some(del)) = (orig.get_mut(field), pv.as_array()) {
                let del: HashSet<String> = del.iter().map(identity).collect();
                list.retain(|v| !del.contains(&identity(v)));
            }
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        if pv.is_null() {
            orig.remove(k);
            continue;
        }
        let child_ty = field_type(ty, k);
        match (orig.get_mut(k), pv) {
            (Some(Value::Object(o)), Value::Object(p)) => {
                if !merge_map(o, p, child_ty)? {
                    orig.remove(k);
                }
            }
            (Some(Value::Array(o)), Value::Array(p)) if list_rule(ty, k).is_some() => {
                let rule = list_rule(ty, k).expect("checked");
                merge_list(o, p, rule)?;
            }
            (_, Value::Array(p)) if list_rule(ty, k).is_some() => {
                let rule = list_rule(ty, k).expect("checked");
                let mut o = Vec::new();
                merge_list(&mut o, p, rule)?;
                orig.insert(k.clone(), Value::Array(o));
            }
            (_, Value::Object(p)) => {
                if p.get("$patch").and_then(Value::as_str) == Some("delete") {
                    orig.remove(k);
                } else {
                    orig.insert(k.clone(), Value::Object(strip(p)));
                }
            }
            (_, v) => {
                orig.insert(k.clone(), strip_value(v));
            }
        }
    }
    // `$retainKeys` (volume sources, deployment strategy): drop every key the
    // patch did not list, so switching a union member removes the old one.
    if let Some(keep) = patch.get("$retainKeys").and_then(Value::as_array) {
        let keep: HashSet<&str> = keep.iter().filter_map(Value::as_str).collect();
        orig.retain(|k, _| keep.contains(k.as_str()));
    }
    for (k, order) in patch {
        if let (Some(field), Some(order)) = (k.strip_prefix("$setElementOrder/"), order.as_array())
        {
            let key = list_rule(ty, field).and_then(|r| r.key);
            if let Some(Value::Array(list)) = orig.get_mut(field) {
                reorder(list, order, key);
            }
        }
    }
    Ok(true)
}

// Lists are merged through indexes rather than by searching them for each
// patch item: a 3 MiB patch holds some 150 000 items, and comparing each
// with every other took minutes (tests/fuzz_patches.rs).
fn merge_list(orig: &mut Vec<Value>, patch: &[Value], rule: &ListRule) -> Result<()> {
    // `{"$patch": "replace"}` as an element replaces the whole list.
    if patch
        .iter()
        .any(|v| v.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        *orig = patch
            .iter()
            .filter(|v| v.get("$patch").is_none())
            .map(strip_value)
            .collect();
        return Ok(());
    }
    let Some(key) = rule.key else {
        let mut seen: HashSet<String> = orig.iter().map(identity).collect();
        for v in patch {
            if seen.insert(identity(v)) {
                orig.push(strip_value(v));
            }
        }
        return Ok(());
    };
    // Removed items become None until the end, so positions stay valid.
    let mut items: Vec<Option<Value>> = std::mem::take(orig).into_iter().map(Some).collect();
    // Merge key -> positions of the items that have it, in list order.
    let mut index: HashMap<String, Vec<usize>> = HashMap::new();
    for (i, o) in items.iter().enumerate() {
        if let Some(kv) = o.as_ref().and_then(|o| o.get(key)) {
            index.entry(identity(kv)).or_default().push(i);
        }
    }
    for item in patch {
        let Some(p) = item.as_object() else {
            return Err(Error::Apply(format!(
                "list items merged by {key:?} must be objects"
            )));
        };
        let Some(kv) = p.get(key) else {
            return Err(Error::Apply(format!(
                "map: {item} does not contain declared merge key: {key}"
            )));
        };
        let id = identity(kv);
        if p.get("$patch").and_then(Value::as_str) == Some("delete") {
            for i in index.remove(&id).unwrap_or_default() {
                items[i] = None;
            }
            continue;
        }
        let positions = index.entry(id).or_default();
        match positions.first() {
            Some(&i) => {
                if let Some(o) = items[i].as_mut().and_then(Value::as_object_mut) {
                    if !merge_map(o, p, rule.item)? {
                        items[i] = None;
                        positions.remove(0);
                    }
                }
            }
            None => {
                positions.push(items.len());
                items.push(Some(Value::Object(strip(p))));
            }
        }
    }
    *orig = items.into_iter().flatten().collect();
    Ok(())
}

/// A value's identity for the indexes above: its JSON text, which is equal
/// for equal values (serde_json's maps are sorted), -0.0 and 0.0 aside.
fn identity(v: &Value) -> String {
    v.to_string()
}

/// Order `list` as `order` lists it; items it does not name keep their
/// relative order after the named ones.
fn reorder(list: &mut [Value], order: &[Value], key: Option<&str>) {
    let at = |v: &Value| match key {
        Some(k) => v.get(k).map(identity),
        None => Some(identity(v)),
    };
    // The first place each item is named in `order`.
    let mut rank: HashMap<String, usize> = HashMap::new();
    for (i, o) in order.iter().enumerate() {
        if let Some(id) = at(o) {
            rank.entry(id).or_insert(i);
        }
    }
    // Stable: unnamed items keep their order after the named ones.
    list.sort_by_cached_key(|v| {
        at(v)
            .and_then(|id| rank.get(&id).copied())
            .unwrap_or(usize::MAX)
    });
}

/// A copy without `$` directives and null members (for values added
/// rather than merged). A null in a patch says "absent": upstream drops
/// those of a value that the original does not have (its
/// `discardNullValuesFromPatch`), and keeping them would store a null a
/// typed field cannot hold (`data: {k: null}` in a ConfigMap).
fn strip(m: &Map<String, Value>) -> Map<String, Value> {
    m.iter()
        .filter(|(k, v)| !k.starts_with('$') && !v.is_null())
        .map(|(k, v)| (k.clone(), strip_value(v)))
        .collect()
}

fn strip_value(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(strip(m)),
        Value::Array(a) => Value::Array(
            a.iter()
                .filter(|x| x.get("$patch").and_then(Value::as_str) != Some("delete"))
                .map(strip_value)
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kubectl_apply_patch_changes_image_and_removes_env() {
        let doc = json!({"kind": "Deployment", "spec": {"replicas": 1, "template": {"spec": {"containers": [
            {"name": "app", "image": "busybox:1", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]},
            {"name": "side", "image": "x"}
        ]}}}});
        // What kubectl apply sends when image changes and env B is removed.
        let patch = json!({"spec": {"template": {"spec": {
            "$setElementOrder/containers": [{"name": "app"}, {"name": "side"}],
            "containers": [{"name": "app", "image": "busybox:2",
                "$setElementOrder/env": [{"name": "A"}],
                "env": [{"$patch": "delete", "name": "B"}]}]
        }}}});
        let out = strategic(&doc, &patch, "Deployment").unwrap();
        let c = &out["spec"]["template"]["spec"]["containers"];
        assert_eq!(c[0]["image"], "busybox:2");
        assert_eq!(c[0]["env"], json!([{"name": "A", "value": "1"}]));
        assert_eq!(c[1]["name"], "side");
    }

    #[test]
    fn retain_keys_and_null_delete() {
        let doc = json!({"spec": {"volumes": [{"name": "v", "emptyDir": {}}], "nodeName": "n"}});
        let patch = json!({"spec": {"nodeName": null, "volumes": [{"name": "v", "hostPath": {"path": "/x"}, "$retainKeys": ["hostPath", "name"]}]}});
        let out = strategic(&doc, &patch, "Pod").unwrap();
        assert_eq!(
            out["spec"],
            json!({"volumes": [{"name": "v", "hostPath": {"path": "/x"}}]})
        );
    }

    #[test]
    fn atomic_lists_are_replaced_and_finalizers_merged() {
        let doc =
            json!({"metadata": {"finalizers": ["a"]}, "spec": {"tolerations": [{"key": "a"}]}});
        let patch =
            json!({"metadata": {"finalizers": ["b"]}, "spec": {"tolerations": [{"key": "b"}]}});
        let out = strategic(&doc, &patch, "Pod").unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["a", "b"]));
        assert_eq!(out["spec"]["tolerations"], json!([{"key": "b"}]));
        let patch = json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}});
        let out = strategic(&out, &patch, "Pod").unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["b"]));
    }

    #[test]
    fn merge_and_json_patch() {
        let doc = json!({"metadata": {"labels": {"a": "1"}}});
        let out = apply(
            &doc,
            br#"{"metadata":{"labels":{"a":null,"b":"2"}}}"#,
            PatchType::Merge,
            "Pod",
        )
        .unwrap();
        assert_eq!(out["metadata"]["labels"], json!({"b": "2"}));
        let out = apply(
            &doc,
            br#"[{"op":"replace","path":"/metadata/labels/a","value":"3"}]"#,
            PatchType::Json,
            "Pod",
        )
        .unwrap();
        assert_eq!(out["metadata"]["labels"]["a"], "3");
        assert!(matches!(
            apply(&doc, b"[{", PatchType::Json, "Pod"),
            Err(Error::Malformed(_))
        ));
        let root = br#"[{"op":"replace","path":"","value":[1]}]"#;
        assert!(matches!(
            apply(&doc, root, PatchType::Json, "Pod"),
            Err(Error::Apply(_))
        ));
        assert!(matches!(
            apply(
                &doc,
                br#"[{"op":"remove","path":"/nope"}]"#,
                PatchType::Json,
                "Pod"
            ),
            Err(Error::Apply(_))
        ));
    }
}
