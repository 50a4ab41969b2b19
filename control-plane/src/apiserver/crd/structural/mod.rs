//! Structural schemas (OpenAPI v3 with the Kubernetes extensions) of custom
//! resources, as upstream's `apiextensions-apiserver/pkg/apiserver/schema`:
//! the checks a definition's schema must pass ([`check`]), and what the
//! schema does to objects: [`prune`] unknown fields, [`apply_defaults`],
//! [`validate`].
//!
//! Every walk follows the schema, whose depth [`check`] bounds, so no
//! object or schema can make one recurse without end; patterns use a
//! linear-time engine.

mod check;
mod defaults;
mod formats;
mod prune;
mod validate;

pub use check::check;
pub use defaults::apply_defaults;
pub use prune::prune;
pub use validate::validate;

use serde_json::Value;

/// How deep a schema may nest (upstream has no fixed limit; its request
/// size limit and Go's stack bound it). Deeper schemas are refused.
pub const MAX_DEPTH: usize = 64;

/// The JSON type names upstream's messages use.
pub(crate) fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// `spec.items[0]`-style paths.
pub(crate) fn child(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

pub(crate) fn index(path: &str, i: usize) -> String {
    format!("{path}[{i}]")
}

/// The schema's properties, if any.
pub(crate) fn properties(schema: &Value) -> Option<&serde_json::Map<String, Value>> {
    schema.get("properties").and_then(Value::as_object)
}

pub(crate) fn flag(schema: &Value, key: &str) -> bool {
    schema.get(key).and_then(Value::as_bool) == Some(true)
}

/// The schema of an object's other keys: `additionalProperties` as a
/// schema (`true` is the empty schema).
pub(crate) fn additional(schema: &Value) -> Option<&Value> {
    match schema.get("additionalProperties") {
        Some(v @ Value::Object(_)) => Some(v),
        _ => None,
    }
}

/// Whether a node is an embedded object (`apiVersion`, `kind` and
/// `metadata` kept and checked inside it).
pub(crate) fn embedded(schema: &Value) -> bool {
    flag(schema, "x-kubernetes-embedded-resource")
}
