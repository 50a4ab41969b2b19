//! PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and
//! strategic merge patch with upstream's merge keys and directives
//! (`$patch`, `$retainKeys`, `$setElementOrder/`, `$deleteFromPrimitiveList/`).
//!
//! The merge keys below are the `patchMergeKey`/`patchStrategy` tags of the
//! upstream Go types that the server serves; kubectl computes its patches
//! from the same tags, so both sides agree on what a list item is.

use serde_json::{Map, Value};

/// Patch failures.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The patch body is not valid JSON/YAML of the right shape (400).
    #[error("{0}")]
    Malformed(String),
    /// The patch is well formed but cannot apply to this object (422).
    #[error("{0}")]
    Apply(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Which patch format the Content-Type names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Json,
    Merge,
    Strategic,
    /// Server-side apply. Approximated as a strategic merge of the applied
    /// configuration (no managedFields yet): fields the applier drops are
    /// not removed.
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
            let mut out = doc.clone();
            json_patch::patch(&mut out, &p)
                .map_err(|e| Error::Apply(format!("the JSON patch could not be applied: {e}")))?;
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
                list.retain(|v| !del.contains(v));
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
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        orig.retain(|k, _| keep.contains(&k.as_str()));
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
        for v in patch {
            if !orig.contains(v) {
                orig.push(v.clone());
            }
        }
        return Ok(());
    };
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
        let pos = orig.iter().position(|o| o.get(key) == Some(kv));
        if p.get("$patch").and_then(Value::as_str) == Some("delete") {
            orig.retain(|o| o.get(key) != Some(kv));
            continue;
        }
        match pos {
            Some(i) => {
                if let Some(o) = orig[i].as_object_mut() {
                    if !merge_map(o, p, rule.item)? {
                        orig.remove(i);
                    }
                }
            }
            None => orig.push(Value::Object(strip(p))),
        }
    }
    Ok(())
}

/// Order `list` as `order` lists it; items it does not name keep their
/// relative order after the named ones.
fn reorder(list: &mut [Value], order: &[Value], key: Option<&str>) {
    let rank = |v: &Value| -> usize {
        let found = match key {
            Some(k) => order
                .iter()
                .position(|o| o.get(k).is_some() && o.get(k) == v.get(k)),
            None => order.iter().position(|o| o == v),
        };
        found.unwrap_or(usize::MAX)
    };
    list.sort_by_key(rank);
}

/// A copy without `$` directives (for values added rather than merged).
fn strip(m: &Map<String, Value>) -> Map<String, Value> {
    m.iter()
        .filter(|(k, _)| !k.starts_with('$'))
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
