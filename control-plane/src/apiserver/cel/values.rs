//! Objects as CEL sees them, typed by their schema (upstream's
//! `SchemaDeclType` and `UnstructuredToVal`): integers and numbers apart,
//! `byte`, `duration`, `date` and `date-time` strings as bytes, durations
//! and timestamps, objects as maps whose property names are escaped into
//! identifiers.

use std::collections::HashMap;
use std::sync::Arc;

use base64::Engine;
use cel::objects::{Key, Map};
use cel::Value as Cel;
use serde_json::Value;

use crate::apiserver::crd::structural::{additional, embedded, properties};

/// CEL keywords upstream escapes as `__name__`.
const RESERVED: &[&str] = &[
    "true",
    "false",
    "null",
    "in",
    "as",
    "break",
    "const",
    "continue",
    "else",
    "for",
    "function",
    "if",
    "import",
    "let",
    "loop",
    "package",
    "namespace",
    "return",
    "var",
    "void",
    "while",
];

/// How a property is named in CEL (upstream's `Escape`): None when the
/// name cannot be spelled as an identifier, so the property is not
/// reachable from rules.
pub fn escape(name: &str) -> Option<String> {
    if RESERVED.contains(&name) {
        return Some(format!("__{name}__"));
    }
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(c) = rest.chars().next() {
        if let Some(r) = rest.strip_prefix("__") {
            out.push_str("__underscores__");
            rest = r;
            continue;
        }
        match c {
            '.' => out.push_str("__dot__"),
            '-' => out.push_str("__dash__"),
            '/' => out.push_str("__slash__"),
            c if c.is_ascii_alphanumeric() || c == '_' => out.push(c),
            _ => return None,
        }
        rest = &rest[c.len_utf8()..];
    }
    let first = out.chars().next()?;
    (first.is_ascii_alphabetic() || first == '_').then_some(out)
}

/// The property an escaped identifier names (the reverse of [`escape`]).
pub fn unescape(ident: &str) -> String {
    if let Some(inner) = ident.strip_prefix("__").and_then(|s| s.strip_suffix("__")) {
        if RESERVED.contains(&inner) {
            return inner.to_string();
        }
    }
    ident
        .replace("__underscores__", "\u{0}")
        .replace("__dot__", ".")
        .replace("__dash__", "-")
        .replace("__slash__", "/")
        .replace('\u{0}', "__")
}

/// The schema of a property or map value reached by `field`.
pub fn field_schema<'s>(schema: &'s Value, field: &str) -> Option<&'s Value> {
    match properties(schema) {
        Some(p) => p.get(field),
        None => additional(schema),
    }
}

/// `v` as CEL sees it under `schema` (None: untyped, as JSON says). The
/// root of an object, and embedded resources, keep `apiVersion`, `kind`
/// and `metadata.name`/`generateName` only.
pub fn to_cel(schema: Option<&Value>, v: &Value, root: bool) -> Cel {
    let ty = schema
        .and_then(|s| s.get("type"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    match v {
        Value::Null => Cel::Null,
        Value::Bool(b) => Cel::Bool(*b),
        Value::Number(n) => match (ty, n.as_i64(), n.as_u64()) {
            ("number", ..) => Cel::Float(n.as_f64().unwrap_or_default()),
            (_, Some(i), _) => Cel::Int(i),
            (_, None, Some(u)) => Cel::UInt(u),
            _ => Cel::Float(n.as_f64().unwrap_or_default()),
        },
        Value::String(s) => string(schema, s),
        Value::Array(items) => {
            let item = schema.and_then(|s| s.get("items"));
            Cel::List(Arc::new(
                items.iter().map(|i| to_cel(item, i, false)).collect(),
            ))
        }
        Value::Object(m) => {
            let mut out: HashMap<Key, Cel> = HashMap::with_capacity(m.len());
            let typed = schema.and_then(properties);
            let keeps_meta = root || schema.is_some_and(embedded);
            for (k, val) in m {
                if keeps_meta && k == "metadata" {
                    out.insert(Key::from("metadata"), metadata(val));
                    continue;
                }
                let key = match typed {
                    Some(_) => match escape(k) {
                        Some(e) => e,
                        None => continue,
                    },
                    None => k.clone(),
                };
                let sub = match schema {
                    Some(s) => field_schema(s, k),
                    None => None,
                };
                out.insert(Key::from(key), to_cel(sub, val, false));
            }
            Cel::Map(Map { map: Arc::new(out) })
        }
    }
}

/// The metadata rules may read: name and generateName.
fn metadata(meta: &Value) -> Cel {
    let mut out: HashMap<Key, Cel> = HashMap::new();
    for k in ["name", "generateName"] {
        if let Some(s) = meta.get(k).and_then(Value::as_str) {
            out.insert(Key::from(k), Cel::String(Arc::new(s.to_string())));
        }
    }
    Cel::Map(Map { map: Arc::new(out) })
}

/// A string, typed by its format where upstream types it (a value its
/// format does not parse stays a string; schema validation reports it).
// The cel crate's timestamps are chrono's: the one place it is used.
#[allow(clippy::disallowed_types)]
fn string(schema: Option<&Value>, s: &str) -> Cel {
    let format = schema
        .and_then(|s| s.get("format"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    let plain = || Cel::String(Arc::new(s.to_string()));
    match format {
        "byte" => base64::engine::general_purpose::STANDARD
            .decode(s)
            .map_or_else(|_| plain(), |b| Cel::Bytes(Arc::new(b))),
        "date-time" => {
            chrono::DateTime::parse_from_rfc3339(s).map_or_else(|_| plain(), Cel::Timestamp)
        }
        "date" => chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d").map_or_else(
            |_| plain(),
            |d| Cel::Timestamp(d.and_time(chrono::NaiveTime::MIN).and_utc().fixed_offset()),
        ),
        "duration" => go_duration(s).map_or_else(plain, Cel::Duration),
        _ => plain(),
    }
}

/// A Go duration (`1h30m`, `-1.5s`, `300ms`), as `time.ParseDuration`.
pub fn go_duration(s: &str) -> Option<chrono::Duration> {
    let (neg, mut rest) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if rest == "0" {
        return Some(chrono::Duration::zero());
    }
    if rest.is_empty() {
        return None;
    }
    let mut nanos: f64 = 0.0;
    while !rest.is_empty() {
        let end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|&e| e > 0)?;
        let n: f64 = rest[..end].parse().ok()?;
        rest = &rest[end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let per = match &rest[..unit_end] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        nanos += n * per;
        rest = &rest[unit_end..];
    }
    if nanos > i64::MAX as f64 {
        return None;
    }
    let d = chrono::Duration::nanoseconds(nanos as i64);
    Some(if neg { -d } else { d })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_escape_as_upstream() {
        assert_eq!(escape("foo").as_deref(), Some("foo"));
        assert_eq!(escape("namespace").as_deref(), Some("__namespace__"));
        assert_eq!(
            escape("a-b.c/d").as_deref(),
            Some("a__dash__b__dot__c__slash__d")
        );
        assert_eq!(escape("x__y").as_deref(), Some("x__underscores__y"));
        assert_eq!(escape("1a"), None);
        assert_eq!(escape("a b"), None);
        for n in ["namespace", "a-b.c/d", "x__y", "plain"] {
            assert_eq!(unescape(&escape(n).unwrap()), n);
        }
    }

    #[test]
    fn values_take_their_schema_types() {
        let schema = json!({"type": "object", "properties": {
            "n": {"type": "number"}, "i": {"type": "integer"},
            "d": {"type": "string", "format": "duration"},
            "t": {"type": "string", "format": "date-time"},
            "my-key": {"type": "string"}}});
        let v = to_cel(
            Some(&schema),
            &json!({"n": 3, "i": 3, "d": "1m30s", "t": "2024-01-02T03:04:05Z", "my-key": "x",
                    "metadata": {"name": "a", "labels": {"x": "y"}}}),
            true,
        );
        let Cel::Map(m) = v else { panic!("{v:?}") };
        let get = |k: &str| m.map.get(&Key::from(k)).cloned();
        assert_eq!(get("n"), Some(Cel::Float(3.0)));
        assert_eq!(get("i"), Some(Cel::Int(3)));
        assert_eq!(get("d"), Some(Cel::Duration(chrono::Duration::seconds(90))));
        assert!(matches!(get("t"), Some(Cel::Timestamp(_))));
        assert_eq!(
            get("my__dash__key"),
            Some(Cel::String(Arc::new("x".into())))
        );
        let Some(Cel::Map(meta)) = get("metadata") else {
            panic!()
        };
        assert_eq!(meta.map.len(), 1, "only name and generateName");
    }

    #[test]
    fn go_durations_parse() {
        assert_eq!(go_duration("1h"), Some(chrono::Duration::hours(1)));
        assert_eq!(
            go_duration("-1.5s"),
            Some(-chrono::Duration::milliseconds(1500))
        );
        assert_eq!(
            go_duration("300ms"),
            Some(chrono::Duration::milliseconds(300))
        );
        assert_eq!(go_duration("0"), Some(chrono::Duration::zero()));
        assert_eq!(go_duration("1x"), None);
        assert_eq!(go_duration(""), None);
        assert_eq!(go_duration("h"), None);
    }
}
