//! Label and field selectors, parsed as upstream's `labels.Parse` and
//! `fields.ParseSelector` accept them.

use serde_json::Value;

use super::objects;

/// Selector parse errors (answered as 400 Bad Request).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("unable to parse requirement: {0}")]
    Syntax(String),
    #[error("field label not supported: {0}")]
    UnsupportedField(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    Eq(String),
    NotEq(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    NotExists,
    Gt(i64),
    Lt(i64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Requirement {
    key: String,
    op: Op,
}

/// A label selector: all requirements must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<Requirement>);

/// Split at commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn set_values(s: &str) -> Result<Vec<String>, Error> {
    let s = s.trim();
    let inner = s
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| Error::Syntax(format!("expected a parenthesised set, found {s:?}")))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, Error> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let req = if let Some(k) = part.strip_prefix('!') {
                Requirement {
                    key: k.trim().to_string(),
                    op: Op::NotExists,
                }
            } else if let Some((k, v)) = part.split_once("!=") {
                Requirement {
                    key: k.trim().into(),
                    op: Op::NotEq(v.trim().into()),
                }
            } else if let Some((k, v)) = part.split_once("==") {
                Requirement {
                    key: k.trim().into(),
                    op: Op::Eq(v.trim().into()),
                }
            } else if let Some((k, v)) = part.split_once('=') {
                Requirement {
                    key: k.trim().into(),
                    op: Op::Eq(v.trim().into()),
                }
            } else if let Some((k, v)) = part.split_once(" notin ") {
                Requirement {
                    key: k.trim().into(),
                    op: Op::NotIn(set_values(v)?),
                }
            } else if let Some((k, v)) = part.split_once(" in ") {
                Requirement {
                    key: k.trim().into(),
                    op: Op::In(set_values(v)?),
                }
            } else if let Some((k, v)) = part.split_once('>') {
                let n = v
                    .trim()
                    .parse()
                    .map_err(|_| Error::Syntax(format!("{part:?}: expected an integer")))?;
                Requirement {
                    key: k.trim().into(),
                    op: Op::Gt(n),
                }
            } else if let Some((k, v)) = part.split_once('<') {
                let n = v
                    .trim()
                    .parse()
                    .map_err(|_| Error::Syntax(format!("{part:?}: expected an integer")))?;
                Requirement {
                    key: k.trim().into(),
                    op: Op::Lt(n),
                }
            } else {
                Requirement {
                    key: part.to_string(),
                    op: Op::Exists,
                }
            };
            if req.key.is_empty() || req.key.contains(char::is_whitespace) {
                return Err(Error::Syntax(format!("{part:?}: invalid label key")));
            }
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    /// A selector from `metadata.labels`-style `matchLabels` pairs.
    pub fn from_map(m: &serde_json::Map<String, Value>) -> Self {
        LabelSelector(
            m.iter()
                .filter_map(|(k, v)| {
                    Some(Requirement {
                        key: k.clone(),
                        op: Op::Eq(v.as_str()?.to_string()),
                    })
                })
                .collect(),
        )
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether every object this selects has label `key` = `value`.
    pub fn requires(&self, key: &str, value: &str) -> bool {
        self.0.iter().any(|r| {
            r.key == key
                && match &r.op {
                    Op::Eq(v) => v == value,
                    Op::In(vs) => vs.iter().all(|v| v == value),
                    _ => false,
                }
        })
    }

    pub fn matches_labels(&self, labels: &[(&str, &str)]) -> bool {
        self.0.iter().all(|r| {
            let v = labels.iter().find(|(k, _)| *k == r.key).map(|(_, v)| *v);
            match (&r.op, v) {
                (Op::Eq(want), Some(v)) => v == want,
                (Op::Eq(_), None) => false,
                (Op::NotEq(want), v) => v != Some(want.as_str()),
                (Op::In(set), Some(v)) => set.iter().any(|s| s == v),
                (Op::In(_), None) => false,
                (Op::NotIn(set), v) => v.is_none_or(|v| !set.iter().any(|s| s == v)),
                (Op::Exists, v) => v.is_some(),
                (Op::NotExists, v) => v.is_none(),
                (Op::Gt(n), Some(v)) => v.parse::<i64>().is_ok_and(|x| x > *n),
                (Op::Lt(n), Some(v)) => v.parse::<i64>().is_ok_and(|x| x < *n),
                (Op::Gt(_) | Op::Lt(_), None) => false,
            }
        })
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.is_empty() || self.matches_labels(&objects::labels(obj))
    }
}

/// A field selector: `field=value` / `field!=value` terms.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    /// `selectable`: the kind's fields beyond `metadata.name` and
    /// `metadata.namespace` (its strategy's `selectable_fields`).
    pub fn parse(s: &str, selectable: &[&str]) -> Result<Self, Error> {
        let mut terms = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, neg, v) = if let Some((k, v)) = part.split_once("!=") {
                (k, true, v)
            } else if let Some((k, v)) = part.split_once("==") {
                (k, false, v)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, false, v)
            } else {
                return Err(Error::Syntax(format!(
                    "invalid field selector {part:?}: expected field=value"
                )));
            };
            let k = k.trim();
            if !matches!(k, "metadata.name" | "metadata.namespace") && !selectable.contains(&k) {
                return Err(Error::UnsupportedField(format!("\"{k}\"")));
            }
            terms.push((k.to_string(), neg, v.trim().to_string()));
        }
        Ok(FieldSelector(terms))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Only `metadata.name`/`metadata.namespace` terms (checkable on the
    /// cheap metadata-only parse).
    pub fn metadata_only(&self) -> bool {
        self.0.iter().all(|(k, _, _)| k.starts_with("metadata."))
    }

    /// The name an `metadata.name=X` term pins, if any.
    pub fn name(&self) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, neg, _)| k == "metadata.name" && !neg)
            .map(|(_, _, v)| v.as_str())
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(field, neg, want)| {
            let got = field_value(obj, field);
            (got == *want) != *neg
        })
    }
}

/// A field's value as upstream's field set renders it (missing = "").
fn field_value(obj: &Value, field: &str) -> String {
    let v = if field == "source" {
        objects::value_at(obj, "source.component").or_else(|| obj.get("reportingComponent"))
    } else {
        objects::value_at(obj, field)
    };
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Number(n)) => n.to_string(),
        _ if field == "spec.unschedulable" || field == "spec.hostNetwork" => "false".into(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selectors() {
        let obj = json!({"metadata": {"labels": {"app": "web", "tier": "fe"}}});
        for (s, want) in [
            ("app=web", true),
            ("app==web,tier=fe", true),
            ("app!=web", false),
            ("app in (web, db)", true),
            ("app notin (web)", false),
            ("tier", true),
            ("!tier", false),
            ("missing!=x", true),
            ("env notin (prod)", true),
            ("env in (prod)", false),
        ] {
            assert_eq!(LabelSelector::parse(s).unwrap().matches(&obj), want, "{s}");
        }
    }

    const POD_FIELDS: &[&str] = &["spec.nodeName", "status.phase"];

    #[test]
    fn field_selectors() {
        let pod = json!({"metadata": {"name": "p", "namespace": "d"}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}});
        assert!(
            FieldSelector::parse("spec.nodeName=n1,status.phase!=Failed", POD_FIELDS)
                .unwrap()
                .matches(&pod)
        );
        assert!(!FieldSelector::parse("spec.nodeName=", POD_FIELDS)
            .unwrap()
            .matches(&pod));
        assert!(FieldSelector::parse("spec.bogus=1", POD_FIELDS).is_err());
        assert_eq!(
            FieldSelector::parse("metadata.name=p", POD_FIELDS)
                .unwrap()
                .name(),
            Some("p")
        );
    }
}
