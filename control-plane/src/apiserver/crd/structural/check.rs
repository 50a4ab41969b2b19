//! Whether a definition's schema is structural and usable (upstream's
//! `ValidateStructural` and the CRD validation's schema checks), with
//! upstream's messages. Also bounds the schema's depth, which every other
//! walk relies on.

use serde_json::Value;

use super::{additional, child, flag, properties, validate, MAX_DEPTH};
use crate::apiserver::objects::str_list;
use crate::apiserver::status::Cause;

const TYPES: &[&str] = &["array", "boolean", "integer", "number", "object", "string"];

/// Keys a structural schema may not use.
const UNSUPPORTED: &[&str] = &[
    "$ref",
    "$schema",
    "id",
    "definitions",
    "dependencies",
    "patternProperties",
    "additionalItems",
];

/// Keys that may not appear inside `allOf`/`anyOf`/`oneOf`/`not`: value
/// validations only there.
const NOT_IN_JUNCTORS: &[&str] = &[
    "type",
    "default",
    "nullable",
    "additionalProperties",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-embedded-resource",
    "x-kubernetes-int-or-string",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
    "x-kubernetes-validations",
];

const JUNCTORS: &[&str] = &["allOf", "anyOf", "oneOf"];

/// The causes that make `schema` unusable; `path` is where the schema sits
/// in the definition (`spec.versions[0].schema.openAPIV3Schema`).
pub fn check(schema: &Value, path: &str) -> Vec<Cause> {
    let mut c = Vec::new();
    if !schema.is_object() {
        c.push(Cause::invalid(path, "", "must be an object"));
        return c;
    }
    match schema.get("type").and_then(Value::as_str) {
        None | Some("") if !flag(schema, "x-kubernetes-preserve-unknown-fields") => c.push(
            Cause::required_because(format!("{path}.type"), "must not be empty at the root"),
        ),
        Some(t) if !t.is_empty() && t != "object" => c.push(Cause::invalid(
            format!("{path}.type"),
            t,
            "must be object at the root",
        )),
        _ => {}
    }
    for key in ["default", "nullable"] {
        if schema
            .get(key)
            .is_some_and(|v| !v.is_null() && *v != Value::Bool(false))
        {
            c.push(Cause::forbidden(
                format!("{path}.{key}"),
                "must not be used at the root",
            ));
        }
    }
    if let Some(meta) = properties(schema).and_then(|p| p.get("metadata")) {
        metadata(meta, &format!("{path}.properties[metadata]"), &mut c);
    }
    node(schema, path, 0, Ctx::Root, &mut c);
    c
}

#[derive(Clone, Copy, PartialEq)]
enum Ctx {
    Root,
    Property,
    Items,
    Additional,
    Junctor,
}

/// At the root, `metadata` may only constrain `name` and `generateName`.
fn metadata(meta: &Value, path: &str, c: &mut Vec<Cause>) {
    let Some(m) = meta.as_object() else { return };
    let allowed = |k: &str| matches!(k, "type" | "properties" | "description");
    let props_ok =
        properties(meta).is_none_or(|p| p.keys().all(|k| k == "name" || k == "generateName"));
    if !m.keys().all(|k| allowed(k)) || !props_ok {
        c.push(Cause::forbidden(
            path,
            "must not specify anything other than name and generateName, but metadata is implicitly specified",
        ));
    }
    if meta
        .get("type")
        .and_then(Value::as_str)
        .is_some_and(|t| t != "object")
    {
        c.push(Cause::invalid(
            format!("{path}.type"),
            meta["type"].as_str().unwrap_or_default(),
            "must be object",
        ));
    }
}

fn node(schema: &Value, path: &str, depth: usize, ctx: Ctx, c: &mut Vec<Cause>) {
    if depth > MAX_DEPTH {
        c.push(Cause::forbidden(
            path,
            &format!("must not be nested more than {MAX_DEPTH} levels deep"),
        ));
        return;
    }
    let Some(m) = schema.as_object() else {
        c.push(Cause::invalid(path, "", "must be an object"));
        return;
    };
    for key in UNSUPPORTED {
        if m.contains_key(*key) {
            c.push(Cause::forbidden(
                child(path, key),
                &format!("{key} is not supported"),
            ));
        }
    }
    if ctx == Ctx::Junctor {
        for key in NOT_IN_JUNCTORS {
            if m.contains_key(*key) {
                c.push(Cause::forbidden(
                    child(path, key),
                    "must be empty to be structural",
                ));
            }
        }
    }
    let preserve = flag(schema, "x-kubernetes-preserve-unknown-fields");
    let int_or_string = flag(schema, "x-kubernetes-int-or-string");
    let ty = m.get("type").and_then(Value::as_str).unwrap_or_default();
    if !ty.is_empty() && !TYPES.contains(&ty) {
        c.push(Cause::not_supported(child(path, "type"), ty, TYPES));
    }
    if m.get("type").is_some_and(|t| !t.is_string()) {
        c.push(Cause::invalid(child(path, "type"), "", "must be a string"));
    }
    if ty.is_empty() && !preserve && !int_or_string && ctx != Ctx::Junctor && ctx != Ctx::Root {
        let what = match ctx {
            Ctx::Items => "must not be empty for specified array items",
            _ => "must not be empty for specified object fields",
        };
        c.push(Cause::required_because(child(path, "type"), what));
    }
    if int_or_string && !ty.is_empty() {
        c.push(Cause::invalid(
            child(path, "type"),
            ty,
            "must be empty if x-kubernetes-int-or-string is true",
        ));
    }
    if flag(schema, "x-kubernetes-embedded-resource") && ty != "object" {
        c.push(Cause::invalid(
            child(path, "type"),
            ty,
            "must be object if x-kubernetes-embedded-resource is true",
        ));
    }
    if flag(schema, "uniqueItems") {
        c.push(Cause::forbidden(
            child(path, "uniqueItems"),
            "uniqueItems cannot be set to true since the runtime complexity becomes quadratic",
        ));
    }
    if m.contains_key("properties") && m.contains_key("additionalProperties") {
        c.push(Cause::forbidden(
            child(path, "additionalProperties"),
            "additionalProperties and properties are mutual exclusive",
        ));
    }
    if m.get("additionalProperties") == Some(&Value::Bool(false)) {
        c.push(Cause::forbidden(
            child(path, "additionalProperties"),
            "must not be false",
        ));
    }
    if ty == "array" && !m.contains_key("items") && ctx != Ctx::Junctor {
        c.push(Cause::required_because(
            child(path, "items"),
            "must be specified",
        ));
    }
    if let Some(p) = m.get("pattern") {
        match p.as_str() {
            Some(p) => {
                if let Err(e) = validate::compile(p) {
                    c.push(Cause::invalid(
                        child(path, "pattern"),
                        p,
                        &format!("must be a valid regular expression, but isn't: {e}"),
                    ));
                }
            }
            None => c.push(Cause::invalid(
                child(path, "pattern"),
                "",
                "must be a string",
            )),
        }
    }
    list_type(schema, path, c);
    if let Some(props) = properties(schema) {
        for (k, v) in props {
            node(
                v,
                &format!("{path}.properties[{k}]"),
                depth + 1,
                sub_ctx(ctx, Ctx::Property),
                c,
            );
        }
    }
    if let Some(items) = m.get("items") {
        if items.is_array() {
            c.push(Cause::forbidden(
                child(path, "items"),
                "items must be a schema object and not an array",
            ));
        } else {
            node(
                items,
                &child(path, "items"),
                depth + 1,
                sub_ctx(ctx, Ctx::Items),
                c,
            );
        }
    }
    if let Some(a) = additional(schema) {
        node(
            a,
            &child(path, "additionalProperties"),
            depth + 1,
            sub_ctx(ctx, Ctx::Additional),
            c,
        );
    }
    for j in JUNCTORS {
        for (i, s) in m
            .get(*j)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            node(s, &format!("{path}.{j}[{i}]"), depth + 1, Ctx::Junctor, c);
        }
    }
    if let Some(not) = m.get("not") {
        node(not, &child(path, "not"), depth + 1, Ctx::Junctor, c);
    }
    if let Some(d) = m.get("default") {
        if ctx == Ctx::Junctor {
            // Reported above.
        } else if !d.is_null() || flag(schema, "nullable") {
            let causes = validate::value(schema, d, "default");
            if let Some(first) = causes.first() {
                c.push(Cause::invalid(
                    child(path, "default"),
                    &d.to_string(),
                    &format!("must validate: {}: {}", first.field, first.message),
                ));
            }
        }
    }
}

/// Inside a junctor, everything below stays in value-validation context.
fn sub_ctx(parent: Ctx, ctx: Ctx) -> Ctx {
    if parent == Ctx::Junctor {
        Ctx::Junctor
    } else {
        ctx
    }
}

fn list_type(schema: &Value, path: &str, c: &mut Vec<Cause>) {
    let Some(lt) = schema.get("x-kubernetes-list-type") else {
        if schema.get("x-kubernetes-list-map-keys").is_some() {
            c.push(Cause::forbidden(
                child(path, "x-kubernetes-list-map-keys"),
                "must not be set if x-kubernetes-list-type is not map",
            ));
        }
        return;
    };
    let field = child(path, "x-kubernetes-list-type");
    let lt = lt.as_str().unwrap_or_default();
    if !matches!(lt, "atomic" | "set" | "map") {
        c.push(Cause::not_supported(field, lt, &["atomic", "set", "map"]));
        return;
    }
    if schema.get("type").and_then(Value::as_str) != Some("array") {
        c.push(Cause::invalid(field, lt, "must only be used on type array"));
        return;
    }
    let items = schema.get("items").unwrap_or(&Value::Null);
    let item_type = items
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    match lt {
        "map" => {
            if item_type != "object" {
                c.push(Cause::invalid(
                    child(path, "items.type"),
                    item_type,
                    "must be object if parent array's x-kubernetes-list-type is map",
                ));
            }
            let keys = str_list(&schema["x-kubernetes-list-map-keys"]);
            let keys_field = child(path, "x-kubernetes-list-map-keys");
            if keys.is_empty() {
                c.push(Cause::required_because(
                    keys_field,
                    "must not be empty if x-kubernetes-list-type is map",
                ));
                return;
            }
            let required = str_list(&items["required"]);
            for k in keys {
                let prop = properties(items).and_then(|p| p.get(k));
                let scalar = prop
                    .and_then(|p| p.get("type"))
                    .and_then(Value::as_str)
                    .is_some_and(|t| matches!(t, "string" | "integer" | "number" | "boolean"));
                let present =
                    required.contains(&k) || prop.is_some_and(|p| p.get("default").is_some());
                if !scalar || !present {
                    c.push(Cause::invalid(
                        keys_field.clone(),
                        k,
                        "entries must all be names of required or defaulted scalar item properties",
                    ));
                }
            }
        }
        "set"
            if item_type == "object"
                && items.get("x-kubernetes-map-type").and_then(Value::as_str) != Some("atomic") =>
        {
            c.push(Cause::invalid(
                child(path, "items.x-kubernetes-map-type"),
                "",
                "must be atomic as item of a list with x-kubernetes-list-type=set",
            ));
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn messages(schema: Value) -> Vec<String> {
        check(&schema, "s").into_iter().map(|c| c.line()).collect()
    }

    #[test]
    fn structural_rules() {
        assert!(
            messages(json!({"type": "object", "properties": {"spec": {"type": "object"}}}))
                .is_empty()
        );
        assert_eq!(
            messages(json!({"properties": {}})),
            ["s.type: Required value: must not be empty at the root"]
        );
        assert_eq!(
            messages(json!({"type": "object", "properties": {"a": {"default": 1}}})),
            ["s.properties[a].type: Required value: must not be empty for specified object fields"]
        );
        assert_eq!(
            messages(json!({"type": "object", "properties": {"a": {"type": "array"}}})),
            ["s.properties[a].items: Required value: must be specified"]
        );
        assert_eq!(
            messages(
                json!({"type": "object", "properties": {"a": {"type": "object", "$ref": "#/x"}}})
            ),
            ["s.properties[a].$ref: Forbidden: $ref is not supported"]
        );
        assert_eq!(
            messages(
                json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "(a"}}})
            )
            .len(),
            1
        );
        assert_eq!(
            messages(json!({"type": "object", "properties": {"a": {"type": "integer", "minimum": 5, "default": 1}}})),
            ["s.properties[a].default: Invalid value: \"1\": must validate: default: Invalid value: 1: default in body should be greater than or equal to 5"]
        );
        assert_eq!(
            messages(
                json!({"type": "object", "properties": {"a": {"type": "string", "anyOf": [{"type": "string"}]}}})
            ),
            ["s.properties[a].anyOf[0].type: Forbidden: must be empty to be structural"]
        );
        assert_eq!(
            messages(
                json!({"type": "object", "properties": {"a": {"type": "string", "x-kubernetes-validations": [{"rule": "self != ''"}]}}})
            ),
            Vec::<String>::new(),
            "rules are the CEL check's"
        );
        assert_eq!(
            messages(json!({"type": "object", "properties": {"metadata": {"type": "object", "properties": {"labels": {"type": "object"}}}}})),
            ["s.properties[metadata]: Forbidden: must not specify anything other than name and generateName, but metadata is implicitly specified"]
        );
        assert_eq!(
            messages(json!({"type": "object", "properties": {"l": {"type": "array", "x-kubernetes-list-type": "map", "items": {"type": "object", "properties": {"k": {"type": "string"}}}}}})),
            ["s.properties[l].x-kubernetes-list-map-keys: Required value: must not be empty if x-kubernetes-list-type is map"]
        );
    }

    #[test]
    fn depth_is_bounded() {
        let mut s = json!({"type": "string"});
        for _ in 0..60 {
            s = json!({"type": "object", "properties": {"a": s}});
        }
        assert!(check(&s, "s").is_empty());
        for _ in 0..40 {
            s = json!({"type": "object", "properties": {"a": s}});
        }
        let c = check(&s, "s");
        assert_eq!(c.len(), 1, "{c:?}");
        assert!(c[0].message.contains("nested more than 64 levels"));
    }
}
