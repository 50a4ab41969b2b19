//! Each kind's typed model (its k8s-openapi type): request objects are
//! decoded through it into their canonical JSON, which also finds the
//! fields the kind does not have (`fieldValidation`), and its schema goes
//! into the OpenAPI documents.

use std::marker::PhantomData;

use schemars::{JsonSchema, SchemaGenerator};
use serde::{de::DeserializeOwned, Serialize};
use serde_json::Value;

use super::resources::ResourceDef;

/// A kind's typed model, as the resource table holds it.
pub trait Model: Send + Sync {
    /// Through the typed model and back: the canonical JSON.
    ///
    /// # Errors
    /// Wrong types or shapes (`invalid type: string "x", expected i32`).
    fn canonical(&self, obj: &Value) -> Result<Value, serde_json::Error>;

    /// JSON text straight into the model, skipping the untyped tree;
    /// None when the text has a field the model lacks or does not decode.
    fn canonical_json(&self, body: &[u8]) -> Option<Value>;

    /// Add the kind's schema (and those it refers to) to `gen`.
    fn add_schema(&self, gen: &mut SchemaGenerator);

    /// The kind's schema as JSON, for kinds that are not Rust types (the
    /// custom ones, whose schema comes with their definition). Shared:
    /// every write to a custom kind reads it.
    fn json_schema(&self) -> Option<std::sync::Arc<Value>> {
        None
    }
}

/// The model of k8s-openapi type `K`.
pub struct Typed<K>(pub PhantomData<fn() -> K>);

impl<K> Model for Typed<K>
where
    K: DeserializeOwned + Serialize + JsonSchema,
{
    fn canonical(&self, obj: &Value) -> Result<Value, serde_json::Error> {
        // Borrowed: no deep copy of the object first.
        let t = K::deserialize(obj)?;
        serde_json::to_value(&t)
    }

    fn canonical_json(&self, body: &[u8]) -> Option<Value> {
        let mut de = serde_json::Deserializer::from_slice(body);
        let mut ignored = false;
        let t: K = serde_ignored::deserialize(&mut de, |_| ignored = true).ok()?;
        de.end().ok()?;
        if ignored {
            return None;
        }
        serde_json::to_value(&t).ok()
    }

    fn add_schema(&self, gen: &mut SchemaGenerator) {
        gen.subschema_for::<K>();
    }
}

/// Decode through the typed model and back: the canonical JSON, plus the
/// paths of fields the type does not have (`fieldValidation`). Kinds
/// without a model come back as they are.
///
/// # Errors
/// Wrong types or shapes, answered as 400 Bad Request.
pub fn decode_typed(
    def: &ResourceDef,
    obj: &Value,
) -> Result<(Value, Vec<String>), serde_json::Error> {
    let typed = match def.model {
        Some(m) => m.canonical(obj)?,
        None => obj.clone(),
    };
    let mut unknown = Vec::new();
    unknown_fields(&mut Vec::new(), obj, &typed, &mut unknown);
    Ok((typed, unknown))
}

/// The canonical JSON of a JSON request body decoded straight into the
/// typed model. None unless that takes: a kind without a model, a body the
/// model refuses, or one with fields the model lacks go the general way
/// ([`decode_typed`]), which words their errors and warnings.
pub fn decode_json_body(def: &ResourceDef, body: &[u8]) -> Option<Value> {
    // Deeply nested text goes the general way, whose untyped parse stops
    // at serde_json's depth limit cheaply: typed decoding recurses through
    // many more frames per level.
    if nesting(body) > FAST_PATH_DEPTH {
        return None;
    }
    def.model?.canonical_json(body)
}

/// The deepest nesting [`decode_json_body`] decodes straight into a
/// model (real objects rarely pass 20).
const FAST_PATH_DEPTH: usize = 48;

/// How deeply arrays and objects nest in JSON text (strings skipped).
fn nesting(body: &[u8]) -> usize {
    let (mut depth, mut max, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for &b in body {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                max = max.max(depth);
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// Paths of the fields a JSON text names twice in one object
/// (`spec.replicas`), which a decoded tree cannot show: the last one wins
/// there. Upstream's strict decoding reports them under `fieldValidation`.
/// Text that is not JSON has none (its decoding fails elsewhere, with a
/// better message).
pub fn duplicate_fields(body: &[u8]) -> Vec<String> {
    let mut path = Vec::new();
    let mut out = Vec::new();
    let mut de = serde_json::Deserializer::from_slice(body);
    let _ = serde::de::DeserializeSeed::deserialize(
        Duplicates {
            path: &mut path,
            out: &mut out,
        },
        &mut de,
    );
    out
}

/// Walks a JSON value, noting keys seen twice in one object.
struct Duplicates<'a> {
    path: &'a mut Vec<String>,
    out: &'a mut Vec<String>,
}

impl Duplicates<'_> {
    fn at(&self, key: &str) -> String {
        let mut p = String::new();
        for step in self.path.iter() {
            if !p.is_empty() && !step.starts_with('[') {
                p.push('.');
            }
            p.push_str(step);
        }
        if !p.is_empty() {
            p.push('.');
        }
        p.push_str(key);
        p
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for Duplicates<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Duplicates<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = std::collections::HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                self.out.push(self.at(&key));
            }
            self.path.push(key);
            map.next_value_seed(Duplicates {
                path: self.path,
                out: self.out,
            })?;
            self.path.pop();
        }
        Ok(())
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0;
        loop {
            self.path.push(format!("[{i}]"));
            let more = seq.next_element_seed(Duplicates {
                path: self.path,
                out: self.out,
            })?;
            self.path.pop();
            if more.is_none() {
                return Ok(());
            }
            i += 1;
        }
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

/// One step of a path into an object.
enum Step<'a> {
    Field(&'a str),
    Index(usize),
}

/// `spec.containers[0].bogus`, the way upstream names a field.
fn path_text(path: &[Step<'_>]) -> String {
    let mut out = String::new();
    for step in path {
        match step {
            Step::Field(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Step::Index(i) => {
                use std::fmt::Write;
                let _ = write!(out, "[{i}]");
            }
        }
    }
    out
}

/// Paths in `sent` that the typed round trip dropped. Free-form maps
/// (labels, data) survive the round trip whole, so only schema fields show.
/// `path` leads to `sent`; a path is only spelled out for a field that is
/// reported, since almost none are.
fn unknown_fields<'a>(
    path: &mut Vec<Step<'a>>,
    sent: &'a Value,
    typed: &Value,
    out: &mut Vec<String>,
) {
    match (sent, typed) {
        (Value::Object(s), Value::Object(t)) => {
            for (k, v) in s {
                path.push(Step::Field(k));
                match t.get(k) {
                    Some(tv) => unknown_fields(path, v, tv, out),
                    None if v.is_null() => {}
                    None => out.push(path_text(path)),
                }
                path.pop();
            }
        }
        (Value::Array(s), Value::Array(t)) => {
            for (i, (sv, tv)) in s.iter().zip(t.iter()).enumerate() {
                path.push(Step::Index(i));
                unknown_fields(path, sv, tv, out);
                path.pop();
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::resources::lookup;
    use serde_json::json;

    #[test]
    fn unknown_fields_are_found() {
        let pods = lookup("", "v1", "pods").unwrap();
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"x": "y"}},
            "spec": {"containers": [{"name": "c", "image": "i", "bogus": 1}], "nope": true}});
        let (_, unknown) = decode_typed(pods, &pod).unwrap();
        assert_eq!(
            unknown,
            vec![
                "spec.containers[0].bogus".to_string(),
                "spec.nope".to_string()
            ]
        );
        let bad = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": 5}});
        assert!(decode_typed(pods, &bad).is_err());
    }

    #[test]
    fn nesting_skips_strings() {
        assert_eq!(nesting(br#"{"a": [1, {"b": "{{[["}], "c": "\"{"}"#), 3);
        assert_eq!(nesting(b"[]"), 1);
        assert_eq!(nesting(b"1"), 0);
    }

    #[test]
    fn duplicate_fields_are_found_where_they_are() {
        let body = br#"{"metadata": {"name": "a", "name": "b"}, "spec": {"containers": [{"image": "x", "image": "y"}]}, "spec": {}}"#;
        assert_eq!(
            duplicate_fields(body),
            vec!["metadata.name", "spec.containers[0].image", "spec"]
        );
        assert!(duplicate_fields(br#"{"a": {"a": 1}, "b": [1, {"a": 2}]}"#).is_empty());
        assert!(duplicate_fields(b"not json").is_empty());
        // Deep nesting stops at serde_json's recursion limit, not the stack.
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(duplicate_fields(deep.as_bytes()).is_empty());
    }

    #[test]
    fn json_bodies_decode_straight_to_the_same_canonical_object() {
        let pods = lookup("", "v1", "pods").unwrap();
        let pod = json!({"metadata": {"name": "p", "labels": {"x": "y"}},
            "spec": {"containers": [{"name": "c", "image": "i", "ports": [{"containerPort": 80}],
                "resources": {"requests": {"cpu": "10m"}}}], "nodeSelector": {}}});
        let body = serde_json::to_vec(&pod).unwrap();
        let (want, unknown) = decode_typed(pods, &pod).unwrap();
        assert!(unknown.is_empty());
        assert_eq!(decode_json_body(pods, &body), Some(want));
        // Left to the general path, which words errors and warnings.
        for refused in [
            r#"{"metadata": {"name": "p"}, "spec": {"nope": true}}"#,
            r#"{"apiVersion": "apps/v1", "kind": "Pod", "metadata": {"name": "p"}}"#,
            r#"{"metadata": {"name": 5}}"#,
            r#"{"metadata": {"name": "p"}} trailing"#,
            r#"[]"#,
            "",
        ] {
            assert_eq!(
                decode_json_body(pods, refused.as_bytes()),
                None,
                "{refused}"
            );
        }
    }
}
