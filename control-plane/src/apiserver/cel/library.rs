//! The part of Kubernetes' CEL libraries rules most often call
//! (`k8s.io/apiserver/pkg/cel/library`): the list library (`isSorted`,
//! `sum`, `min`, `max`, `indexOf`, `lastIndexOf` on lists), the regex
//! library (`find`, `findAll`) and the IP and CIDR checks (`isIP`,
//! `isCIDR`). The `ip()`, `cidr()`, `url()` and `quantity()` types are not
//! here: rules calling them are refused when their definition is written.

use std::cmp::Ordering;
use std::sync::Arc;

use cel::common::types::{DYN_TYPE, INT_TYPE, LIST_TYPE, STRING_TYPE};
use cel::common::value::{CowVal, Val};
use cel::{Env, ExecutionError, Value};

/// Registers the functions on `env`.
pub fn register(env: &mut Env) -> Result<(), cel::DeclarationError> {
    env.add_member_overload("isSorted", "list.isSorted()", LIST_TYPE, vec![], is_sorted)?;
    env.add_member_overload("sum", "list.sum()", LIST_TYPE, vec![], sum)?;
    env.add_member_overload("min", "list.min()", LIST_TYPE, vec![], min)?;
    env.add_member_overload("max", "list.max()", LIST_TYPE, vec![], max)?;
    env.add_member_overload(
        "indexOf",
        "list.indexOf(dyn)",
        LIST_TYPE,
        vec![DYN_TYPE],
        index_of,
    )?;
    env.add_member_overload(
        "lastIndexOf",
        "list.lastIndexOf(dyn)",
        LIST_TYPE,
        vec![DYN_TYPE],
        last_index_of,
    )?;
    env.add_member_overload(
        "find",
        "string.find(string)",
        STRING_TYPE,
        vec![STRING_TYPE],
        find,
    )?;
    env.add_member_overload(
        "findAll",
        "string.findAll(string)",
        STRING_TYPE,
        vec![STRING_TYPE],
        find_all,
    )?;
    env.add_member_overload(
        "findAll",
        "string.findAll(string,int)",
        STRING_TYPE,
        vec![STRING_TYPE, INT_TYPE],
        find_all,
    )?;
    env.add_overload("isIP", "isIP(string)", vec![STRING_TYPE], is_ip)?;
    env.add_overload("isCIDR", "isCIDR(string)", vec![STRING_TYPE], is_cidr)?;
    Ok(())
}

fn values(args: &[CowVal<'_, '_>]) -> Result<Vec<Value>, ExecutionError> {
    args.iter().map(|a| Value::try_from(a.as_ref())).collect()
}

fn out<'b, 'v>(v: Value) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let boxed: Box<dyn Val> = Box::<dyn Val>::try_from(v)?;
    Ok(CowVal::from(boxed))
}

fn error(function: &str, message: impl ToString) -> ExecutionError {
    ExecutionError::function_error(function, message)
}

/// The receiver list and the arguments after it.
fn list(
    function: &str,
    args: &[CowVal<'_, '_>],
) -> Result<(Arc<Vec<Value>>, Vec<Value>), ExecutionError> {
    let mut v = values(args)?.into_iter();
    match v.next() {
        Some(Value::List(l)) => Ok((l, v.collect())),
        other => Err(error(function, format!("expected a list, got {other:?}"))),
    }
}

/// How two elements of one list order, as CEL's `<` orders them.
fn order(function: &str, a: &Value, b: &Value) -> Result<Ordering, ExecutionError> {
    match (a, b) {
        (Value::Int(x), Value::Int(y)) => Ok(x.cmp(y)),
        (Value::UInt(x), Value::UInt(y)) => Ok(x.cmp(y)),
        (Value::Float(x), Value::Float(y)) => x
            .partial_cmp(y)
            .ok_or_else(|| error(function, "NaN is not comparable")),
        (Value::String(x), Value::String(y)) => Ok(x.cmp(y)),
        (Value::Bool(x), Value::Bool(y)) => Ok(x.cmp(y)),
        (Value::Bytes(x), Value::Bytes(y)) => Ok(x.cmp(y)),
        (Value::Duration(x), Value::Duration(y)) => Ok(x.cmp(y)),
        (Value::Timestamp(x), Value::Timestamp(y)) => Ok(x.cmp(y)),
        _ => Err(error(
            function,
            format!("no such overload: {} < {}", a.type_of(), b.type_of()),
        )),
    }
}

fn is_sorted<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (l, _) = list("isSorted", &args)?;
    for pair in l.windows(2) {
        if order("isSorted", &pair[0], &pair[1])? == Ordering::Greater {
            return out(Value::Bool(false));
        }
    }
    out(Value::Bool(true))
}

fn sum<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (l, _) = list("sum", &args)?;
    let overflow = || error("sum", "integer overflow");
    let mut items = l.iter();
    // An empty list sums to int zero, as upstream's does.
    let Some(first) = items.next() else {
        return out(Value::Int(0));
    };
    let mut total = first.clone();
    for v in items {
        total = match (&total, v) {
            (Value::Int(a), Value::Int(b)) => Value::Int(a.checked_add(*b).ok_or_else(overflow)?),
            (Value::UInt(a), Value::UInt(b)) => {
                Value::UInt(a.checked_add(*b).ok_or_else(overflow)?)
            }
            (Value::Float(a), Value::Float(b)) => Value::Float(a + b),
            (Value::Duration(a), Value::Duration(b)) => {
                Value::Duration(a.checked_add(b).ok_or_else(overflow)?)
            }
            _ => {
                return Err(error(
                    "sum",
                    format!("no such overload: {} + {}", total.type_of(), v.type_of()),
                ))
            }
        };
    }
    if !matches!(
        total,
        Value::Int(_) | Value::UInt(_) | Value::Float(_) | Value::Duration(_)
    ) {
        return Err(error(
            "sum",
            format!("no such overload: sum of {}", total.type_of()),
        ));
    }
    out(total)
}

fn extreme<'b, 'v>(
    function: &str,
    args: &[CowVal<'b, 'v>],
    keep: Ordering,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (l, _) = list(function, args)?;
    let mut items = l.iter();
    let Some(mut best) = items.next() else {
        return Err(error(
            function,
            format!("{function}(list) called on empty list"),
        ));
    };
    for v in items {
        if order(function, v, best)? == keep {
            best = v;
        }
    }
    out(best.clone())
}

fn min<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    extreme("min", &args, Ordering::Less)
}

fn max<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    extreme("max", &args, Ordering::Greater)
}

fn index_of<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (l, rest) = list("indexOf", &args)?;
    let at = l.iter().position(|v| Some(v) == rest.first());
    out(Value::Int(at.map_or(-1, |i| i as i64)))
}

fn last_index_of<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (l, rest) = list("lastIndexOf", &args)?;
    let at = l.iter().rposition(|v| Some(v) == rest.first());
    out(Value::Int(at.map_or(-1, |i| i as i64)))
}

/// The receiver string, the pattern compiled, and the limit when given.
fn pattern(
    function: &str,
    args: &[CowVal<'_, '_>],
) -> Result<(Arc<String>, regex::Regex, i64), ExecutionError> {
    let v = values(args)?;
    let (Some(Value::String(s)), Some(Value::String(p))) = (v.first(), v.get(1)) else {
        return Err(error(function, "expected a string and a pattern"));
    };
    let re = regex::Regex::new(p).map_err(|e| error(function, e))?;
    let limit = match v.get(2) {
        Some(Value::Int(n)) => *n,
        _ => -1,
    };
    Ok((s.clone(), re, limit))
}

fn find<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (s, re, _) = pattern("find", &args)?;
    let found = re.find(&s).map_or("", |m| m.as_str());
    out(Value::String(Arc::new(found.to_string())))
}

fn find_all<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (s, re, limit) = pattern("findAll", &args)?;
    // A negative limit is every match, zero none (Go's FindAllString).
    let take = usize::try_from(limit).unwrap_or(usize::MAX);
    let all: Vec<Value> = re
        .find_iter(&s)
        .take(take)
        .map(|m| Value::String(Arc::new(m.as_str().to_string())))
        .collect();
    out(Value::List(Arc::new(all)))
}

fn string_arg(function: &str, args: &[CowVal<'_, '_>]) -> Result<Arc<String>, ExecutionError> {
    match values(args)?.into_iter().next() {
        Some(Value::String(s)) => Ok(s),
        other => Err(error(function, format!("expected a string, got {other:?}"))),
    }
}

/// Upstream's `isIP`: an IPv4 or IPv6 address, no zone, no leading zeros
/// in IPv4 octets (Rust's parser refuses both, as Go's netip does).
fn is_ip<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let s = string_arg("isIP", &args)?;
    out(Value::Bool(s.parse::<std::net::IpAddr>().is_ok()))
}

/// Upstream's `isCIDR`: an address, `/`, and a prefix length within the
/// address's bits (host bits may be set).
fn is_cidr<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let s = string_arg("isCIDR", &args)?;
    let ok = s.split_once('/').is_some_and(|(ip, bits)| {
        let max = match ip.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V4(_)) => 32,
            Ok(std::net::IpAddr::V6(_)) => 128,
            Err(_) => return false,
        };
        // Digits only, no sign or leading zero (Go's ParsePrefix).
        let digits = !bits.is_empty()
            && bits.bytes().all(|b| b.is_ascii_digit())
            && (bits == "0" || !bits.starts_with('0'));
        digits && bits.parse::<u32>().is_ok_and(|b| b <= max)
    });
    out(Value::Bool(ok))
}

#[cfg(test)]
mod tests {
    use super::super::compile::{env, program};
    use cel::{Context, Value};

    fn eval(source: &str) -> Result<Value, String> {
        let p = program(source)?;
        p.execute(&Context::with_env(env()))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn lists() {
        for (rule, want) in [
            ("[1, 2, 2, 5].isSorted()", Value::Bool(true)),
            ("['b', 'a'].isSorted()", Value::Bool(false)),
            ("[].isSorted()", Value::Bool(true)),
            ("[1, 2, 3].sum()", Value::Int(6)),
            ("[1.5, 2.0].sum()", Value::Float(3.5)),
            ("[].sum()", Value::Int(0)),
            ("[3, 1, 2].min()", Value::Int(1)),
            (
                "['a', 'c', 'b'].max()",
                Value::String("c".to_string().into()),
            ),
            ("[1, 2, 1].indexOf(1)", Value::Int(0)),
            ("[1, 2, 1].lastIndexOf(1)", Value::Int(2)),
            ("[1, 2].indexOf(3)", Value::Int(-1)),
            ("'abc'.indexOf('c')", Value::Int(2)),
        ] {
            assert_eq!(eval(rule), Ok(want), "{rule}");
        }
        assert!(eval("[].min()")
            .unwrap_err()
            .contains("min(list) called on empty list"));
        assert!(eval("[1, 'a'].isSorted()").is_err());
        assert!(eval("[9223372036854775807, 1].sum()")
            .unwrap_err()
            .contains("overflow"));
    }

    #[test]
    fn regexes_and_addresses() {
        for (rule, want) in [
            ("'abc 123 def 456'.find('[0-9]+') == '123'", true),
            ("'abc'.find('[0-9]+') == ''", true),
            ("'a1b22c333'.findAll('[0-9]+') == ['1', '22', '333']", true),
            ("'a1b22c333'.findAll('[0-9]+', 2) == ['1', '22']", true),
            ("isIP('10.0.0.1') && isIP('fd00::1')", true),
            (
                "isIP('10.0.0.01') || isIP('fe80::1%eth0') || isIP('nope')",
                false,
            ),
            (
                "isCIDR('10.0.0.0/8') && isCIDR('10.1.2.3/24') && isCIDR('::/0')",
                true,
            ),
            (
                "isCIDR('10.0.0.0/33') || isCIDR('10.0.0.0') || isCIDR('10.0.0.0/08')",
                false,
            ),
        ] {
            assert_eq!(eval(rule), Ok(Value::Bool(want)), "{rule}");
        }
        assert!(eval("'a'.find('(')").is_err());
    }
}
