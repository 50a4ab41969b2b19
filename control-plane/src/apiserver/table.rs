//! Server-side printing: `meta.k8s.io/v1` `Table` responses with the columns
//! upstream's printers (`pkg/printers/internalversion`) give each kind, so
//! `kubectl get` output looks as users expect.

use serde_json::{json, Value};

use super::objects::{self, parse_time};
use super::resources::ResourceDef;

/// Whether the Accept header asks for a Table.
pub fn wants_table(accept: &str) -> bool {
    accept
        .split(',')
        .any(|a| a.contains("as=Table") && a.contains("g=meta.k8s.io"))
}

/// Whether the Accept header asks for metadata only
/// (`as=PartialObjectMetadata[List]`, used by metadata informers).
pub fn wants_metadata(accept: &str) -> bool {
    accept
        .split(',')
        .any(|a| a.contains("as=PartialObjectMetadata") && a.contains("g=meta.k8s.io"))
}

/// An object reduced to `PartialObjectMetadata`.
pub fn partial_metadata(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or(json!({})),
    })
}

/// (name, type, priority, description)
pub type Col = (&'static str, &'static str, u8, &'static str);

pub const NAME: Col = (
    "Name",
    "string",
    0,
    "Name must be unique within a namespace.",
);
pub const AGE: Col = (
    "Age",
    "string",
    0,
    "CreationTimestamp is a timestamp representing the server time when this object was created.",
);
/// The three wide columns of every workload with a pod template.
pub const TEMPLATE: [Col; 3] = [
    (
        "Containers",
        "string",
        1,
        "Names of each container in the template.",
    ),
    (
        "Images",
        "string",
        1,
        "Images referenced by each container in the template.",
    ),
    ("Selector", "string", 1, "Label selector for pods."),
];

/// `columnDefinitions` of the kind's Table.
pub fn column_definitions(def: &ResourceDef) -> Value {
    Value::Array(
        def.strategy
            .columns()
            .into_iter()
            .map(|(name, ty, priority, description)| {
                let format = if name == "Name" { "name" } else { "" };
                json!({"name": name, "type": ty, "format": format, "description": description, "priority": priority})
            })
            .collect(),
    )
}

/// A whole Table for `objs`. `include_object` is `None`, `Metadata` (the
/// default) or `Object`.
pub fn table(
    def: &ResourceDef,
    objs: &[Value],
    list_meta: Value,
    include_object: &str,
    with_columns: bool,
) -> Value {
    let rows: Vec<Value> = objs.iter().map(|o| row(def, o, include_object)).collect();
    let mut t = json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "rows": rows,
    });
    if with_columns {
        t["columnDefinitions"] = column_definitions(def);
    } else {
        t["columnDefinitions"] = Value::Null;
    }
    t
}

fn row(def: &ResourceDef, obj: &Value, include_object: &str) -> Value {
    let object = match include_object {
        "None" => Value::Null,
        "Object" => obj.clone(),
        _ => json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj.get("metadata").cloned().unwrap_or(json!({})),
        }),
    };
    json!({"cells": def.strategy.cells(obj), "object": object})
}

pub(crate) fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

pub(crate) fn i(v: &Value) -> i64 {
    v.as_i64().unwrap_or(0)
}

pub(crate) fn or_none(s: String) -> String {
    if s.is_empty() {
        "<none>".into()
    } else {
        s
    }
}

fn age_of(obj: &Value) -> String {
    objects::meta_str(obj, "creationTimestamp")
        .map(since)
        .unwrap_or_else(|| "<unknown>".into())
}

/// Human age of a timestamp, like upstream's `translateTimestampSince`.
pub fn since(ts: &str) -> String {
    match parse_time(ts) {
        Some(t) => human_duration(objects::seconds_since(t)),
        None => "<unknown>".into(),
    }
}

pub use kube_util::duration::human_duration;

pub(crate) fn template_containers(obj: &Value) -> (String, String) {
    let cs = obj["spec"]["template"]["spec"]["containers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let names: Vec<String> = cs.iter().map(|c| s(&c["name"])).collect();
    let images: Vec<String> = cs.iter().map(|c| s(&c["image"])).collect();
    (names.join(","), images.join(","))
}

pub(crate) fn selector_string(sel: &Value) -> String {
    let mut parts: Vec<String> = Vec::new();
    if let Some(m) = sel["matchLabels"].as_object() {
        parts.extend(m.iter().map(|(k, v)| format!("{k}={}", s(v))));
    }
    if let Some(exprs) = sel["matchExpressions"].as_array() {
        for e in exprs {
            let vals: Vec<String> = e["values"]
                .as_array()
                .into_iter()
                .flatten()
                .map(s)
                .collect();
            let op = s(&e["operator"]);
            let key = s(&e["key"]);
            parts.push(match op.as_str() {
                "In" => format!("{key} in ({})", vals.join(",")),
                "NotIn" => format!("{key} notin ({})", vals.join(",")),
                "Exists" => key,
                "DoesNotExist" => format!("!{key}"),
                _ => format!("{key} {op}"),
            });
        }
    }
    or_none(parts.join(","))
}

pub(crate) fn or_unknown(s: String) -> String {
    if s.is_empty() {
        "<unknown>".into()
    } else {
        s
    }
}

pub(crate) fn or_unset(s: String) -> String {
    if s.is_empty() {
        "<unset>".into()
    } else {
        s
    }
}

/// The Name cell.
pub(crate) fn name_cell(obj: &Value) -> Value {
    json!(objects::name(obj).unwrap_or_default())
}

/// The Age cell.
pub(crate) fn age_cell(obj: &Value) -> Value {
    json!(age_of(obj))
}

/// The (Containers, Images, Selector) cells of a workload with a pod
/// template.
pub(crate) fn template_cells(obj: &Value) -> [Value; 3] {
    let (c, im) = template_containers(obj);
    [
        json!(c),
        json!(im),
        json!(selector_string(&obj["spec"]["selector"])),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(125), "2m5s");
        assert_eq!(human_duration(3600 * 3 + 60), "3h1m");
        assert_eq!(human_duration(86400 * 3), "3d");
    }
}
