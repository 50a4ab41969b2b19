//! Pruning (upstream's `pruning.PruneWithOptions`): fields the schema does
//! not specify are dropped, unless a node preserves unknown fields;
//! `apiVersion`, `kind` and `metadata` stay at the root and in embedded
//! resources. The dropped paths are returned for `fieldValidation`.

use serde_json::Value;

use super::{additional, child, embedded, flag, index, properties, MAX_DEPTH};

/// Drop the fields `schema` does not know from `obj`; returns their paths
/// in document order.
pub fn prune(schema: &Value, obj: &mut Value) -> Vec<String> {
    let mut out = Vec::new();
    walk(schema, obj, "", true, 0, &mut out);
    out
}

fn walk(
    schema: &Value,
    v: &mut Value,
    path: &str,
    root: bool,
    depth: usize,
    out: &mut Vec<String>,
) {
    if depth > MAX_DEPTH {
        return;
    }
    match v {
        Value::Object(m) => {
            let keep_meta = root || embedded(schema);
            let preserve = flag(schema, "x-kubernetes-preserve-unknown-fields");
            let props = properties(schema);
            let extra = additional(schema);
            let mut drop = Vec::new();
            for (k, x) in m.iter_mut() {
                let here = child(path, k);
                if keep_meta && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                    // metadata is the server's (ObjectMeta) unless the
                    // schema says more about it.
                    if let Some(s) = props.and_then(|p| p.get(k)).filter(|_| k != "metadata") {
                        walk(s, x, &here, false, depth + 1, out);
                    }
                    continue;
                }
                match props.and_then(|p| p.get(k)).or(extra) {
                    Some(s) => walk(s, x, &here, false, depth + 1, out),
                    None if preserve
                        || schema.get("additionalProperties") == Some(&Value::Bool(true)) => {}
                    None => drop.push((k.clone(), here)),
                }
            }
            for (k, here) in drop {
                m.remove(&k);
                out.push(here);
            }
        }
        Value::Array(a) => {
            if let Some(s) = schema.get("items") {
                for (i, x) in a.iter_mut().enumerate() {
                    walk(s, x, &index(path, i), false, depth + 1, out);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_fields_go_and_are_reported() {
        let s = json!({"type": "object", "properties": {
        "spec": {"type": "object", "properties": {
            "a": {"type": "string"},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true, "properties": {"n": {"type": "object", "properties": {}}}},
            "items": {"type": "array", "items": {"type": "object", "properties": {"k": {"type": "string"}}}},
            "tpl": {"type": "object", "x-kubernetes-embedded-resource": true, "properties": {"spec": {"type": "object"}}},
            "m": {"type": "object", "additionalProperties": {"type": "object", "properties": {"x": {"type": "string"}}}},
        }}}});
        let mut o = json!({"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "n"}, "junk": 1,
            "spec": {"a": "1", "b": 2, "free": {"any": 1, "n": {"gone": 1}},
                     "items": [{"k": "v", "z": 1}], "tpl": {"apiVersion": "v1", "kind": "Pod", "metadata": {}, "spec": {"q": 1}, "extra": 1},
                     "m": {"one": {"x": "1", "y": 2}}}});
        let mut pruned = prune(&s, &mut o);
        pruned.sort();
        assert_eq!(
            pruned,
            [
                "junk",
                "spec.b",
                "spec.free.n.gone",
                "spec.items[0].z",
                "spec.m.one.y",
                "spec.tpl.extra",
                "spec.tpl.spec.q"
            ]
        );
        assert_eq!(
            o,
            json!({"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "n"},
                "spec": {"a": "1", "free": {"any": 1, "n": {}}, "items": [{"k": "v"}],
                         "tpl": {"apiVersion": "v1", "kind": "Pod", "metadata": {}, "spec": {}}, "m": {"one": {"x": "1"}}}})
        );
    }
}
