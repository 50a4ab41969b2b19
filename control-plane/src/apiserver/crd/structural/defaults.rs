//! Structural defaulting (upstream's `structuraldefaulting.Default`):
//! absent properties with a `default` get it, and so do nulls where the
//! schema is not nullable; the walk goes into objects, their additional
//! properties and array items.

use serde_json::Value;

use super::{additional, flag, properties, MAX_DEPTH};

/// Apply the schema's defaults to `obj` in place.
pub fn apply_defaults(schema: &Value, obj: &mut Value) {
    walk(schema, obj, 0);
}

fn walk(schema: &Value, v: &mut Value, depth: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    match v {
        Value::Object(m) => {
            if let Some(props) = properties(schema) {
                for (k, s) in props {
                    let Some(d) = s.get("default") else { continue };
                    match m.get(k) {
                        None => {
                            m.insert(k.clone(), d.clone());
                        }
                        Some(Value::Null) if !flag(s, "nullable") => {
                            m.insert(k.clone(), d.clone());
                        }
                        _ => {}
                    }
                }
                for (k, x) in m.iter_mut() {
                    if let Some(s) = props.get(k) {
                        walk(s, x, depth + 1);
                    }
                }
            } else if let Some(s) = additional(schema) {
                for x in m.values_mut() {
                    if x.is_null() && !flag(s, "nullable") {
                        if let Some(d) = s.get("default") {
                            *x = d.clone();
                        }
                    }
                    walk(s, x, depth + 1);
                }
            }
        }
        Value::Array(a) => {
            if let Some(s) = schema.get("items") {
                for x in a.iter_mut() {
                    if x.is_null() && !flag(s, "nullable") {
                        if let Some(d) = s.get("default") {
                            *x = d.clone();
                        }
                    }
                    walk(s, x, depth + 1);
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
    fn defaults_fill_absent_and_null_fields() {
        let s = json!({"type": "object", "properties": {"spec": {"type": "object", "default": {}, "properties": {
            "replicas": {"type": "integer", "default": 1},
            "mode": {"type": "string", "default": "fast"},
            "opt": {"type": "string", "nullable": true, "default": "x"},
            "ports": {"type": "array", "items": {"type": "object", "properties": {"proto": {"type": "string", "default": "TCP"}}}},
            "labels": {"type": "object", "additionalProperties": {"type": "string", "default": "v"}},
        }}}});
        let mut o = json!({"spec": {"mode": null, "opt": null, "ports": [{}, {"proto": "UDP"}], "labels": {"a": null}}});
        apply_defaults(&s, &mut o);
        assert_eq!(
            o,
            json!({"spec": {"replicas": 1, "mode": "fast", "opt": null, "ports": [{"proto": "TCP"}, {"proto": "UDP"}], "labels": {"a": "v"}}})
        );
        let mut empty = json!({});
        apply_defaults(&s, &mut empty);
        assert_eq!(
            empty,
            json!({"spec": {"replicas": 1, "mode": "fast", "opt": "x"}})
        );
    }
}
