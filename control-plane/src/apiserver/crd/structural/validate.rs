//! Validation of custom objects against their schema (upstream's
//! `apiextensions-apiserver/pkg/apiserver/validation` over kube-openapi's
//! validators), with upstream's messages and field paths.

use std::collections::HashMap;
use std::sync::Mutex;

use regex::Regex;
use serde_json::Value;

use super::{additional, child, embedded, flag, formats, index, properties, type_name, MAX_DEPTH};
use crate::apiserver::objects::str_list;
use crate::apiserver::status::Cause;

/// Compiled patterns, shared by every object of every kind; dropped
/// whole when it grows past this many (patterns come from definitions,
/// so this only happens with many definitions).
const PATTERN_CACHE: usize = 1024;
/// A bound on one pattern's compiled size.
const PATTERN_SIZE: usize = 1 << 20;

static PATTERNS: Mutex<Option<HashMap<String, Regex>>> = Mutex::new(None);

/// Compile a schema's pattern (linear-time engine, bounded size).
///
/// # Errors
/// Why the pattern cannot be used.
pub fn compile(pattern: &str) -> Result<Regex, String> {
    let mut cache = PATTERNS.lock().expect("pattern cache lock");
    let cache = cache.get_or_insert_with(HashMap::new);
    if let Some(r) = cache.get(pattern) {
        return Ok(r.clone());
    }
    let r = regex::RegexBuilder::new(pattern)
        .size_limit(PATTERN_SIZE)
        .build()
        .map_err(|e| e.to_string())?;
    if cache.len() >= PATTERN_CACHE {
        cache.clear();
    }
    cache.insert(pattern.to_string(), r.clone());
    Ok(r)
}

/// The causes that make `obj` (a whole custom object) invalid. At the
/// root, `apiVersion`, `kind` and `metadata` are the server's to check,
/// but for the schema's constraints on `metadata.name`/`generateName`.
pub fn validate(schema: &Value, obj: &Value) -> Vec<Cause> {
    let mut c = Vec::new();
    let Some(m) = obj.as_object() else {
        return value(schema, obj, "");
    };
    let props = properties(schema);
    if let Some(meta) = props.and_then(|p| p.get("metadata")).and_then(properties) {
        for k in ["name", "generateName"] {
            if let (Some(s), Some(v)) = (meta.get(k), obj["metadata"].get(k)) {
                walk(s, v, &format!("metadata.{k}"), 1, &mut c);
            }
        }
    }
    object(schema, m, "", 0, true, &mut c);
    c
}

/// The causes that make `v` invalid against `schema` at `path`.
pub fn value(schema: &Value, v: &Value, path: &str) -> Vec<Cause> {
    let mut c = Vec::new();
    walk(schema, v, path, 0, &mut c);
    c
}

/// `Invalid value: <json>: detail`, as upstream prints numbers bare and
/// strings quoted.
fn invalid(field: &str, v: &Value, detail: String) -> Cause {
    let shown = match v {
        Value::Object(_) | Value::Array(_) => format!("{v}"),
        other => other.to_string(),
    };
    Cause {
        reason: "FieldValueInvalid",
        field: field.to_string(),
        message: format!("Invalid value: {shown}: {detail}"),
    }
}

/// What a path is called inside a message (`spec.replicas`; the root is
/// `body`).
fn named(path: &str) -> &str {
    if path.is_empty() {
        "body"
    } else {
        path
    }
}

fn type_ok(ty: &str, v: &Value) -> bool {
    match ty {
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "array" => v.is_array(),
        "object" => v.is_object(),
        _ => true,
    }
}

fn walk(schema: &Value, v: &Value, path: &str, depth: usize, c: &mut Vec<Cause>) {
    if depth > MAX_DEPTH || !schema.is_object() {
        return;
    }
    let ty = schema
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if v.is_null() {
        if flag(schema, "nullable")
            || (ty.is_empty() && !flag(schema, "x-kubernetes-int-or-string"))
        {
            return;
        }
        let want = if ty.is_empty() { "integer,string" } else { ty };
        c.push(invalid(
            path,
            &Value::String("null".into()),
            format!("{} in body must be of type {want}: \"null\"", named(path)),
        ));
        return;
    }
    if flag(schema, "x-kubernetes-int-or-string") {
        if !(v.is_string() || v.is_i64() || v.is_u64()) {
            c.push(invalid(
                path,
                &Value::String(type_name(v).into()),
                format!(
                    "{} in body must be of type integer,string: \"{}\"",
                    named(path),
                    type_name(v)
                ),
            ));
            return;
        }
    } else if !ty.is_empty() && !type_ok(ty, v) {
        c.push(invalid(
            path,
            &Value::String(type_name(v).into()),
            format!(
                "{} in body must be of type {ty}: \"{}\"",
                named(path),
                type_name(v)
            ),
        ));
        return;
    }
    if let Some(e) = schema.get("enum").and_then(Value::as_array) {
        if !e.contains(v) {
            let allowed: Vec<String> = e.iter().map(|x| x.to_string()).collect();
            c.push(Cause {
                reason: "FieldValueNotSupported",
                field: path.to_string(),
                message: format!(
                    "Unsupported value: {v}: supported values: {}",
                    allowed.join(", ")
                ),
            });
        }
    }
    match v {
        Value::String(s) => string(schema, s, v, path, c),
        Value::Number(_) => number(schema, v, path, c),
        Value::Array(a) => array(schema, a, v, path, depth, c),
        Value::Object(m) => object(schema, m, path, depth, false, c),
        _ => {}
    }
    junctors(schema, v, path, depth, c);
}

fn string(schema: &Value, s: &str, v: &Value, path: &str, c: &mut Vec<Cause>) {
    let chars = s.chars().count() as u64;
    if let Some(max) = schema.get("maxLength").and_then(Value::as_u64) {
        if chars > max {
            c.push(Cause::too_long(path, max as usize));
        }
    }
    if let Some(min) = schema.get("minLength").and_then(Value::as_u64) {
        if chars < min {
            c.push(invalid(
                path,
                v,
                format!(
                    "{} in body should be at least {min} chars long",
                    named(path)
                ),
            ));
        }
    }
    if let Some(p) = schema.get("pattern").and_then(Value::as_str) {
        if let Ok(re) = compile(p) {
            if !re.is_match(s) {
                c.push(invalid(
                    path,
                    v,
                    format!("{} in body should match '{p}'", named(path)),
                ));
            }
        }
    }
    if let Some(f) = schema.get("format").and_then(Value::as_str) {
        if formats::matches(f, s) == Some(false) {
            c.push(invalid(
                path,
                v,
                format!("{} in body must be of type {f}: {v}", named(path)),
            ));
        }
    }
}

fn number(schema: &Value, v: &Value, path: &str, c: &mut Vec<Cause>) {
    let Some(x) = v.as_f64() else { return };
    let bound = |k: &str| schema.get(k).and_then(Value::as_f64);
    let shown = |k: &str| schema.get(k).map(Value::to_string).unwrap_or_default();
    if let Some(max) = bound("maximum") {
        if flag(schema, "exclusiveMaximum") && x >= max {
            c.push(invalid(
                path,
                v,
                format!(
                    "{} in body should be less than {}",
                    named(path),
                    shown("maximum")
                ),
            ));
        } else if x > max {
            c.push(invalid(
                path,
                v,
                format!(
                    "{} in body should be less than or equal to {}",
                    named(path),
                    shown("maximum")
                ),
            ));
        }
    }
    if let Some(min) = bound("minimum") {
        if flag(schema, "exclusiveMinimum") && x <= min {
            c.push(invalid(
                path,
                v,
                format!(
                    "{} in body should be greater than {}",
                    named(path),
                    shown("minimum")
                ),
            ));
        } else if x < min {
            c.push(invalid(
                path,
                v,
                format!(
                    "{} in body should be greater than or equal to {}",
                    named(path),
                    shown("minimum")
                ),
            ));
        }
    }
    if let Some(m) = bound("multipleOf").filter(|m| *m > 0.0) {
        let q = x / m;
        if (q - q.round()).abs() > 1e-9 {
            c.push(invalid(
                path,
                v,
                format!(
                    "{} in body should be a multiple of {}",
                    named(path),
                    shown("multipleOf")
                ),
            ));
        }
    }
}

fn array(schema: &Value, a: &[Value], v: &Value, path: &str, depth: usize, c: &mut Vec<Cause>) {
    let n = a.len() as u64;
    if let Some(max) = schema.get("maxItems").and_then(Value::as_u64) {
        if n > max {
            c.push(Cause::too_many(path, a.len(), max as usize));
        }
    }
    if let Some(min) = schema.get("minItems").and_then(Value::as_u64) {
        if n < min {
            c.push(invalid(
                path,
                v,
                format!("{} in body should have at least {min} items", named(path)),
            ));
        }
    }
    match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
        Some("set") => {
            for (i, x) in a.iter().enumerate() {
                if a[..i].contains(x) {
                    c.push(duplicate(&index(path, i), x));
                }
            }
        }
        Some("map") => {
            let keys = str_list(&schema["x-kubernetes-list-map-keys"]);
            let key_of = |x: &Value| -> Vec<Value> {
                keys.iter()
                    .map(|k| x.get(*k).cloned().unwrap_or(Value::Null))
                    .collect()
            };
            let mut seen: Vec<Vec<Value>> = Vec::with_capacity(a.len());
            for (i, x) in a.iter().enumerate() {
                let k = key_of(x);
                if seen.contains(&k) {
                    let shown: serde_json::Map<String, Value> = keys
                        .iter()
                        .zip(k.iter())
                        .map(|(name, val)| (name.to_string(), val.clone()))
                        .collect();
                    c.push(duplicate(&index(path, i), &Value::Object(shown)));
                }
                seen.push(k);
            }
        }
        _ => {}
    }
    if let Some(items) = schema.get("items").filter(|i| i.is_object()) {
        for (i, x) in a.iter().enumerate() {
            walk(items, x, &index(path, i), depth + 1, c);
        }
    }
}

fn duplicate(field: &str, v: &Value) -> Cause {
    Cause {
        reason: "FieldValueDuplicate",
        field: field.to_string(),
        message: format!("Duplicate value: {v}"),
    }
}

/// `root`: the object itself, whose `apiVersion`, `kind` and `metadata`
/// the server checks.
fn object(
    schema: &Value,
    m: &serde_json::Map<String, Value>,
    path: &str,
    depth: usize,
    root: bool,
    c: &mut Vec<Cause>,
) {
    for k in str_list(&schema["required"]) {
        if !m.contains_key(k) {
            c.push(Cause::required(child(path, k)));
        }
    }
    let n = m.len() as u64;
    if let Some(max) = schema.get("maxProperties").and_then(Value::as_u64) {
        if n > max {
            c.push(Cause::too_many(path, m.len(), max as usize));
        }
    }
    if let Some(min) = schema.get("minProperties").and_then(Value::as_u64) {
        if n < min {
            c.push(invalid(
                path,
                &Value::from(n),
                format!(
                    "{} in body should have at least {min} properties",
                    named(path)
                ),
            ));
        }
    }
    if embedded(schema) {
        for k in ["apiVersion", "kind"] {
            if m.get(k).and_then(Value::as_str).is_none_or(str::is_empty) {
                c.push(Cause::required_because(child(path, k), "must not be empty"));
            }
        }
    }
    let props = properties(schema);
    let extra = additional(schema);
    for (k, x) in m {
        if root && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        match props.and_then(|p| p.get(k)) {
            Some(s) => walk(s, x, &child(path, k), depth + 1, c),
            None => {
                if let Some(s) = extra {
                    walk(s, x, &child(path, k), depth + 1, c);
                }
            }
        }
    }
}

fn junctors(schema: &Value, v: &Value, path: &str, depth: usize, c: &mut Vec<Cause>) {
    let branches = |key: &str| -> Vec<&Value> {
        schema
            .get(key)
            .and_then(Value::as_array)
            .map(|a| a.iter().collect())
            .unwrap_or_default()
    };
    let passes = |s: &Value| {
        let mut sub = Vec::new();
        walk(s, v, path, depth + 1, &mut sub);
        sub
    };
    for s in branches("allOf") {
        c.extend(passes(s));
    }
    let any = branches("anyOf");
    if !any.is_empty() {
        let results: Vec<Vec<Cause>> = any.iter().map(|s| passes(s)).collect();
        if results.iter().all(|r| !r.is_empty()) {
            c.push(invalid(
                path,
                v,
                format!(
                    "{} in body must validate at least one schema (anyOf)",
                    named(path)
                ),
            ));
            c.extend(results.into_iter().flatten());
        }
    }
    let one = branches("oneOf");
    if !one.is_empty() {
        let results: Vec<Vec<Cause>> = one.iter().map(|s| passes(s)).collect();
        if results.iter().filter(|r| r.is_empty()).count() != 1 {
            c.push(invalid(
                path,
                v,
                format!(
                    "{} in body must validate one and only one schema (oneOf)",
                    named(path)
                ),
            ));
        }
    }
    if let Some(not) = schema.get("not") {
        if passes(not).is_empty() {
            c.push(invalid(
                path,
                v,
                format!("{} in body must not validate the schema (not)", named(path)),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn messages(schema: Value, obj: Value) -> Vec<String> {
        validate(&schema, &obj)
            .into_iter()
            .map(|c| c.line())
            .collect()
    }

    fn spec(props: Value, required: Value) -> Value {
        json!({"type": "object", "properties": {"spec": {"type": "object", "properties": props, "required": required}}})
    }

    #[test]
    fn upstream_messages() {
        let s = spec(
            json!({
                "replicas": {"type": "integer", "minimum": 0, "maximum": 10, "multipleOf": 2},
                "color": {"type": "string", "enum": ["red", "blue"]},
                "label": {"type": "string", "pattern": "^[a-z]+$", "minLength": 2, "maxLength": 4},
                "when": {"type": "string", "format": "date-time"},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2, "x-kubernetes-list-type": "set"},
                "ports": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["port"],
                          "items": {"type": "object", "required": ["port"], "properties": {"port": {"type": "integer"}}}},
                "size": {"x-kubernetes-int-or-string": true},
                "opt": {"type": "string", "nullable": true},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            }),
            json!(["color"]),
        );
        let ok = json!({"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "a"},
            "spec": {"replicas": 4, "color": "red", "label": "ab", "when": "2024-01-01T00:00:00Z",
                     "tags": ["a"], "ports": [{"port": 1}, {"port": 2}], "size": "10%", "opt": null,
                     "labels": {"a": "b"}}});
        assert!(messages(s.clone(), ok).is_empty());
        let bad = json!({"spec": {"replicas": 11, "color": "pink", "label": "A", "when": "later",
            "tags": ["a", "a", "b"], "ports": [{"port": 1}, {"port": 1}], "size": true, "labels": {"a": 1}}});
        let mut got = messages(s, bad);
        got.sort();
        let mut want = vec![
            "spec.color: Unsupported value: \"pink\": supported values: \"red\", \"blue\"",
            "spec.label: Invalid value: \"A\": spec.label in body should be at least 2 chars long",
            "spec.label: Invalid value: \"A\": spec.label in body should match '^[a-z]+$'",
            "spec.labels.a: Invalid value: \"integer\": spec.labels.a in body must be of type string: \"integer\"",
            "spec.ports[1]: Duplicate value: {\"port\":1}",
            "spec.replicas: Invalid value: 11: spec.replicas in body should be less than or equal to 10",
            "spec.replicas: Invalid value: 11: spec.replicas in body should be a multiple of 2",
            "spec.size: Invalid value: \"boolean\": spec.size in body must be of type integer,string: \"boolean\"",
            "spec.tags: Too many: 3: must have at most 2 items",
            "spec.tags[1]: Duplicate value: \"a\"",
            "spec.when: Invalid value: \"later\": spec.when in body must be of type date-time: \"later\"",
        ];
        want.sort();
        assert_eq!(got, want);
        let missing = messages(
            spec(json!({"color": {"type": "string"}}), json!(["color"])),
            json!({"spec": {}}),
        );
        assert_eq!(missing, ["spec.color: Required value"]);
    }

    #[test]
    fn junctors_and_null() {
        let s = spec(
            json!({
                "a": {"type": "string", "anyOf": [{"pattern": "^x"}, {"pattern": "^y"}]},
                "b": {"type": "integer", "not": {"minimum": 5}},
                "c": {"type": "string"},
            }),
            json!([]),
        );
        assert!(messages(s.clone(), json!({"spec": {"a": "xa", "b": 1}})).is_empty());
        let got = messages(s, json!({"spec": {"a": "za", "b": 7, "c": null}}));
        assert!(got.contains(&"spec.a: Invalid value: \"za\": spec.a in body must validate at least one schema (anyOf)".to_string()), "{got:?}");
        assert!(
            got.contains(
                &"spec.b: Invalid value: 7: spec.b in body must not validate the schema (not)"
                    .to_string()
            ),
            "{got:?}"
        );
        assert!(
            got.contains(
                &"spec.c: Invalid value: \"null\": spec.c in body must be of type string: \"null\""
                    .to_string()
            ),
            "{got:?}"
        );
    }

    #[test]
    fn backtracking_patterns_are_linear() {
        let s = spec(
            json!({"a": {"type": "string", "pattern": "^(a+)+$"}}),
            json!([]),
        );
        let long = format!("{}!", "a".repeat(50_000));
        // A backtracking engine would not finish this in any test's time.
        let got = messages(s, json!({"spec": {"a": long}}));
        assert_eq!(got.len(), 1);
    }
}
