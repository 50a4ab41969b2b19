//! Steps into an object (upstream `fieldpath.PathElement`) and paths of them,
//! with upstream's order, display and FieldsV1 key form.

use std::cmp::Ordering;
use std::fmt;

use serde_json::{Map, Value};

/// One step into an object.
#[derive(Debug, Clone)]
pub enum PathElement {
    /// A struct field or map key: `f:name`.
    Field(String),
    /// A map-list item by its key fields, sorted by name: `k:{"name":"c"}`.
    Key(Vec<(String, Value)>),
    /// A set-list item by value: `v:"x"`.
    Value(Value),
    /// A list item by position: `i:3` (only read from clients' FieldsV1).
    Index(usize),
}

impl PathElement {
    /// The element's key in FieldsV1, values written as Go writes JSON.
    pub fn to_fields_v1_key(&self) -> String {
        match self {
            PathElement::Field(name) => format!("f:{name}"),
            PathElement::Key(fields) => {
                let pairs: Vec<String> = (fields.iter())
                    .map(|(n, v)| format!("{}:{}", go_json(&n.as_str().into()), go_json(v)))
                    .collect();
                format!("k:{{{}}}", pairs.join(","))
            }
            PathElement::Value(v) => format!("v:{}", go_json(v)),
            PathElement::Index(i) => format!("i:{i}"),
        }
    }

    /// Parse a FieldsV1 key; `Ok(None)` for an unknown element type, which
    /// upstream drops rather than refuses (a later version may add types).
    pub fn from_fields_v1_key(key: &str) -> Result<Option<Self>, String> {
        let (kind, rest) = match key.as_bytes() {
            [k, b':', ..] => (*k, key.get(2..).unwrap_or_default()),
            _ => return Err(format!("key must be a type letter and a colon: {key:?}")),
        };
        let json = |e: serde_json::Error| e.to_string();
        Ok(Some(match kind {
            b'f' => PathElement::Field(rest.into()),
            b'v' => PathElement::Value(serde_json::from_str(rest).map_err(json)?),
            b'k' => {
                let map: Map<String, Value> = serde_json::from_str(rest).map_err(json)?;
                let mut fields: Vec<(String, Value)> = map.into_iter().collect();
                fields.sort_by(|a, b| a.0.cmp(&b.0));
                PathElement::Key(fields)
            }
            b'i' => PathElement::Index(rest.parse().map_err(|e| format!("{e}"))?),
            _ => return Ok(None),
        }))
    }

    fn rank(&self) -> u8 {
        match self {
            PathElement::Field(_) => 0,
            PathElement::Key(_) => 1,
            PathElement::Value(_) => 2,
            PathElement::Index(_) => 3,
        }
    }
}

impl Ord for PathElement {
    /// Upstream's order: fields, keys, values, indexes.
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (PathElement::Field(a), PathElement::Field(b)) => a.cmp(b),
            (PathElement::Key(a), PathElement::Key(b)) => (a.iter().zip(b))
                .map(|((an, av), (bn, bv))| an.cmp(bn).then_with(|| cmp_value(av, bv)))
                .find(|c| c.is_ne())
                .unwrap_or_else(|| a.len().cmp(&b.len())),
            (PathElement::Value(a), PathElement::Value(b)) => cmp_value(a, b),
            (PathElement::Index(a), PathElement::Index(b)) => a.cmp(b),
            _ => self.rank().cmp(&other.rank()),
        }
    }
}

impl PartialOrd for PathElement {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for PathElement {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for PathElement {}

impl fmt::Display for PathElement {
    /// As upstream's conflict messages: `.f`, `[k=80,p="TCP"]`, `[="v"]`, `[3]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathElement::Field(name) => write!(f, ".{name}"),
            PathElement::Key(fields) => {
                let pairs: Vec<String> = fields
                    .iter()
                    .map(|(n, v)| format!("{n}={}", value_text(v)))
                    .collect();
                write!(f, "[{}]", pairs.join(","))
            }
            PathElement::Value(v) => write!(f, "[={}]", value_text(v)),
            PathElement::Index(i) => write!(f, "[{i}]"),
        }
    }
}

/// A path from an object's root.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Path(pub Vec<PathElement>);

impl Path {
    /// A path of field names, like `["spec", "replicas"]`.
    pub fn fields(names: &[&str]) -> Path {
        Path(
            names
                .iter()
                .map(|n| PathElement::Field(n.to_string()))
                .collect(),
        )
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|pe| write!(f, "{pe}"))
    }
}

/// Upstream `value.ToString`: JSON-ish, a map's pairs run together.
fn value_text(v: &Value) -> String {
    match v {
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(value_text).collect::<Vec<_>>().join(",")
        ),
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| format!("{k}={}", value_text(v)))
            .collect(),
        other => other.to_string(),
    }
}

/// Compact JSON as Go's `encoding/json` writes it, HTML characters escaped,
/// so FieldsV1 keys are byte for byte upstream's.
pub(crate) fn go_json(v: &Value) -> String {
    let s = v.to_string();
    [
        ('<', "\\u003c"),
        ('>', "\\u003e"),
        ('&', "\\u0026"),
        ('\u{2028}', "\\u2028"),
        ('\u{2029}', "\\u2029"),
    ]
    .iter()
    .fold(s, |s, (c, esc)| {
        if s.contains(*c) {
            s.replace(*c, esc)
        } else {
            s
        }
    })
}

/// Upstream `value.Compare`: numbers (by value, 1 == 1.0), then strings,
/// bools, lists, maps, null.
pub fn cmp_value(a: &Value, b: &Value) -> Ordering {
    let rank = |v: &Value| match v {
        Value::Number(_) => 0,
        Value::String(_) => 1,
        Value::Bool(_) => 2,
        Value::Array(_) => 3,
        Value::Object(_) => 4,
        Value::Null => 5,
    };
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(p), Some(q)) => p.cmp(&q),
            _ => (x.as_f64().unwrap_or_default()).total_cmp(&y.as_f64().unwrap_or_default()),
        },
        (Value::String(x), Value::String(y)) => x.cmp(y),
        (Value::Bool(x), Value::Bool(y)) => x.cmp(y),
        (Value::Array(x), Value::Array(y)) => (x.iter().zip(y))
            .map(|(p, q)| cmp_value(p, q))
            .find(|c| c.is_ne())
            .unwrap_or_else(|| x.len().cmp(&y.len())),
        (Value::Object(x), Value::Object(y)) => (x.iter().zip(y))
            .map(|((pk, pv), (qk, qv))| pk.cmp(qk).then_with(|| cmp_value(pv, qv)))
            .find(|c| c.is_ne())
            .unwrap_or_else(|| x.len().cmp(&y.len())),
        _ => rank(a).cmp(&rank(b)),
    }
}

/// Upstream `value.Equals`: JSON equality with 1 == 1.0.
pub fn value_eq(a: &Value, b: &Value) -> bool {
    cmp_value(a, b).is_eq()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn display_keys_and_order_as_upstream() {
        let key = |k: &str| PathElement::from_fields_v1_key(k).unwrap().unwrap();
        let mut p = Path::fields(&["spec", "containers"]);
        p.0.extend([key(r#"k:{"name":"nginx"}"#), key("f:image")]);
        assert_eq!(p.to_string(), r#".spec.containers[name="nginx"].image"#);
        // Key fields come back sorted, whatever order the client wrote.
        let port = key(r#"k:{"protocol":"TCP","containerPort":80}"#);
        assert_eq!(port.to_string(), r#"[containerPort=80,protocol="TCP"]"#);
        assert_eq!(
            port.to_fields_v1_key(),
            r#"k:{"containerPort":80,"protocol":"TCP"}"#
        );
        assert_eq!(
            (key(r#"v:"value""#).to_string(), key("i:3").to_string()),
            (r#"[="value"]"#.into(), "[3]".into())
        );
        for k in ["f:a.b", r#"v:"a\u003cb""#, "v:5", "i:3"] {
            assert_eq!(key(k).to_fields_v1_key(), k);
        }
        assert_eq!(PathElement::from_fields_v1_key("z:whatever"), Ok(None));
        for bad in ["f", "", "fx", "k:[1]", "k:{", "v:1 2", "i:x", "i:-1", "é:x"] {
            assert!(PathElement::from_fields_v1_key(bad).is_err(), "{bad}");
        }
        assert!(
            key("f:z") < key(r#"k:{"a":1}"#)
                && key(r#"k:{"a":1}"#) < key("v:0")
                && key("v:0") < key("i:0")
        );
        assert!(key(r#"k:{"port":80}"#) < key(r#"k:{"port":443}"#));
        assert!(value_eq(&json!({"a": [1, "x"]}), &json!({"a": [1.0, "x"]})));
    }
}
