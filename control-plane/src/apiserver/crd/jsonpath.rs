//! The JSONPath subset CRD printer columns use (client-go's syntax):
//! fields (`.spec.replicas`), indexes (`[0]`, `[-1]`), wildcards (`[*]`)
//! and equality filters (`[?(@.type=="Ready")]`). A column shows the first
//! value its path finds.

use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
enum Step {
    Field(String),
    Index(i64),
    All,
    /// `[?(@.a.b=="v")]`: elements whose `a.b` equals `v`.
    Filter(Vec<String>, Value),
}

/// Parse a path (with or without `{}`), or say what is wrong with it.
///
/// # Errors
/// A message for the CRD's `jsonPath` field.
fn parse(path: &str) -> Result<Vec<Step>, String> {
    let p = path.trim();
    let p = p
        .strip_prefix('{')
        .and_then(|q| q.strip_suffix('}'))
        .unwrap_or(p);
    if !p.starts_with('.') {
        return Err("must be a simple json path starting with .".into());
    }
    let mut steps = Vec::new();
    let mut rest = p;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            let name = &r[..end];
            if name.is_empty() {
                return Err(format!("empty field name in {path:?}"));
            }
            steps.push(Step::Field(name.to_string()));
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let end = r
                .find(']')
                .ok_or_else(|| format!("unclosed [ in {path:?}"))?;
            let inner = r[..end].trim();
            steps.push(bracket(inner, path)?);
            rest = &r[end + 1..];
        } else {
            return Err(format!("unexpected {rest:?} in {path:?}"));
        }
    }
    Ok(steps)
}

fn bracket(inner: &str, path: &str) -> Result<Step, String> {
    if inner == "*" {
        return Ok(Step::All);
    }
    if let Ok(i) = inner.parse::<i64>() {
        return Ok(Step::Index(i));
    }
    let filter = inner
        .strip_prefix("?(")
        .and_then(|f| f.strip_suffix(')'))
        .ok_or_else(|| format!("unsupported [{inner}] in {path:?}"))?;
    let (lhs, rhs) = filter
        .split_once("==")
        .ok_or_else(|| format!("only == filters are supported in {path:?}"))?;
    let field = lhs
        .trim()
        .strip_prefix("@.")
        .ok_or_else(|| format!("a filter must start with @. in {path:?}"))?;
    let rhs = rhs.trim();
    let want = if let Some(s) = rhs
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .or_else(|| rhs.strip_prefix('\'').and_then(|s| s.strip_suffix('\'')))
    {
        Value::String(s.to_string())
    } else {
        serde_json::from_str(rhs).map_err(|_| format!("bad filter value {rhs} in {path:?}"))?
    };
    Ok(Step::Filter(
        field.split('.').map(String::from).collect(),
        want,
    ))
}

/// Whether `path` is one this module evaluates.
///
/// # Errors
/// What is wrong with it.
pub fn check(path: &str) -> Result<(), String> {
    parse(path).map(|_| ())
}

/// The first value `path` finds in `obj`.
pub fn first<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    let steps = parse(path).ok()?;
    walk(obj, &steps)
}

fn walk<'a>(v: &'a Value, steps: &[Step]) -> Option<&'a Value> {
    let Some((step, rest)) = steps.split_first() else {
        return Some(v);
    };
    match step {
        Step::Field(f) => walk(v.get(f)?, rest),
        Step::Index(i) => {
            let a = v.as_array()?;
            let i = if *i < 0 { a.len() as i64 + i } else { *i };
            walk(a.get(usize::try_from(i).ok()?)?, rest)
        }
        Step::All => v.as_array()?.iter().find_map(|e| walk(e, rest)),
        Step::Filter(field, want) => v
            .as_array()?
            .iter()
            .filter(|e| field.iter().try_fold(*e, |x, k| x.get(k)) == Some(want))
            .find_map(|e| walk(e, rest)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn columns_find_their_values() {
        let o = json!({"spec": {"replicas": 3, "ports": [{"port": 80}, {"port": 443}]},
            "status": {"conditions": [{"type": "Synced", "status": "False"}, {"type": "Ready", "status": "True"}]}});
        assert_eq!(first(&o, ".spec.replicas"), Some(&json!(3)));
        assert_eq!(first(&o, "{.spec.ports[1].port}"), Some(&json!(443)));
        assert_eq!(first(&o, ".spec.ports[-1].port"), Some(&json!(443)));
        assert_eq!(first(&o, ".spec.ports[*].port"), Some(&json!(80)));
        assert_eq!(
            first(&o, ".status.conditions[?(@.type==\"Ready\")].status"),
            Some(&json!("True"))
        );
        assert_eq!(first(&o, ".spec.missing"), None);
        assert!(check("spec.replicas").is_err());
        assert!(check(".spec[?(@.a<1)]").is_err());
        assert!(check(".spec[").is_err());
    }
}
