//! A bound on what a rule can cost, in upstream's units (one per
//! operation, a tenth per byte traversed), and the checks of its
//! references that upstream's type checker makes: every identifier,
//! function and field a rule names must exist.
//!
//! Sizes come from [`Bounds`]: the schema's `maxLength`, `maxItems` and
//! `maxProperties` when a definition is written ([`Declared`], what is
//! unbounded being bounded by the request size, as upstream does), the
//! sizes an object really has before a rule runs on it ([`Observed`]).
//! Every function's cost and result size is an upper bound in terms of
//! its operands', so the estimate bounds the work the interpreter does.

use std::collections::HashMap;

use cel::common::ast::{EntryExpr, Expr, LiteralValue};
use cel::parser::Expression;
use serde_json::Value;

use super::values::{field_schema, unescape};
use super::MAX_SIZE;
use crate::apiserver::crd::structural::{additional, embedded, flag, properties};

/// Upstream's `StringTraversalCostFactor`.
const TRAVERSAL: f64 = 0.1;
/// Upstream's `RegexStringLengthCostFactor`.
const REGEX: f64 = 0.25;

/// How large a value can be: its length (characters, items or entries)
/// and its serialized size in bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Size {
    pub len: f64,
    pub bytes: f64,
}

/// A number, a bool, a timestamp: one unit, at most a few dozen bytes.
const SCALAR: Size = Size {
    len: 1.0,
    bytes: 32.0,
};

/// The largest a value at a schema node can be.
pub trait Bounds {
    fn size(&self, schema: &Value) -> Size;
}

/// Bounds from the schema itself: the most any valid object can hold.
pub struct Declared;

impl Bounds for Declared {
    fn size(&self, schema: &Value) -> Size {
        declared(schema, 0)
    }
}

fn limit(schema: &Value, key: &str) -> Option<f64> {
    schema.get(key).and_then(Value::as_u64).map(|n| n as f64)
}

fn declared(schema: &Value, depth: usize) -> Size {
    let max = Size {
        len: MAX_SIZE,
        bytes: MAX_SIZE,
    };
    if depth > crate::apiserver::crd::structural::MAX_DEPTH {
        return max;
    }
    let ty = schema
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let size = match ty {
        "string" => {
            let enum_max = schema.get("enum").and_then(Value::as_array).map(|e| {
                e.iter()
                    .filter_map(Value::as_str)
                    .map(|s| s.chars().count() as f64)
                    .fold(0.0, f64::max)
            });
            match limit(schema, "maxLength").or(enum_max) {
                // A character is at most four bytes.
                Some(n) => Size {
                    len: n,
                    bytes: 4.0 * n + 2.0,
                },
                None => max,
            }
        }
        "integer" | "number" | "boolean" => SCALAR,
        "array" => {
            let item = schema.get("items").map(|i| declared(i, depth + 1));
            let len = limit(schema, "maxItems").unwrap_or_else(|| {
                (MAX_SIZE - 2.0) / (schema.get("items").map_or(1.0, min_serialized) + 1.0)
            });
            Size {
                len,
                bytes: item.map_or(MAX_SIZE, |i| len * (i.bytes + 1.0) + 2.0),
            }
        }
        "object" if properties(schema).is_some() => {
            let props = properties(schema).into_iter().flatten();
            let bytes = props
                .map(|(k, s)| declared(s, depth + 1).bytes + k.len() as f64 + 4.0)
                .sum::<f64>()
                + 2.0;
            Size {
                len: properties(schema).map_or(0, |p| p.len()) as f64,
                bytes: if flag(schema, "x-kubernetes-preserve-unknown-fields") || embedded(schema) {
                    MAX_SIZE
                } else {
                    bytes
                },
            }
        }
        "object" => {
            let len = limit(schema, "maxProperties").unwrap_or_else(|| {
                // `"":v,` at the least.
                (MAX_SIZE - 2.0) / (additional(schema).map_or(1.0, min_serialized) + 4.0)
            });
            Size {
                len,
                bytes: MAX_SIZE,
            }
        }
        _ => max,
    };
    Size {
        len: size.len.min(MAX_SIZE),
        bytes: size.bytes.min(MAX_SIZE),
    }
}

/// The fewest bytes a value of the schema serializes to (upstream's
/// `estimateMinSizeJSON`).
fn min_serialized(schema: &Value) -> f64 {
    if flag(schema, "nullable") {
        return 4.0;
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("string") => 2.0,
        Some("boolean") => 4.0,
        Some("array" | "object") => 2.0,
        _ => 1.0,
    }
}

/// Bounds measured on the objects a rule is about to run on: for every
/// schema node, the largest value found there.
#[derive(Default)]
pub struct Observed {
    sizes: HashMap<*const Value, Size>,
}

impl Bounds for Observed {
    fn size(&self, schema: &Value) -> Size {
        self.sizes
            .get(&(schema as *const Value))
            .copied()
            .unwrap_or(Size {
                len: 0.0,
                bytes: 0.0,
            })
    }
}

impl Observed {
    /// Measure `v` under `schema`, keeping the largest size of each node.
    /// Returns `v`'s size.
    pub fn observe(&mut self, schema: Option<&Value>, v: &Value, depth: usize) -> Size {
        let deeper = depth < crate::apiserver::crd::structural::MAX_DEPTH;
        let size = match v {
            Value::String(s) => Size {
                len: s.chars().count() as f64,
                bytes: s.len() as f64 + 2.0,
            },
            Value::Array(items) => {
                let item = schema.and_then(|s| s.get("items"));
                let bytes: f64 = items
                    .iter()
                    .map(|i| self.measure(item, i, depth, deeper) + 1.0)
                    .sum();
                Size {
                    len: items.len() as f64,
                    bytes: bytes + 2.0,
                }
            }
            Value::Object(m) => {
                let bytes: f64 = m
                    .iter()
                    .map(|(k, val)| {
                        let sub = schema.and_then(|s| field_schema(s, k));
                        self.measure(sub, val, depth, deeper) + k.len() as f64 + 4.0
                    })
                    .sum();
                Size {
                    len: m.len() as f64,
                    bytes: bytes + 2.0,
                }
            }
            _ => SCALAR,
        };
        if let Some(s) = schema {
            let e = self.sizes.entry(s as *const Value).or_insert(Size {
                len: 0.0,
                bytes: 0.0,
            });
            e.len = e.len.max(size.len);
            e.bytes = e.bytes.max(size.bytes);
        }
        size
    }

    fn measure(&mut self, schema: Option<&Value>, v: &Value, depth: usize, deeper: bool) -> f64 {
        if deeper {
            self.observe(schema, v, depth + 1).bytes
        } else {
            // Past the depth bound nothing is typed: its text is its size.
            v.to_string().len() as f64
        }
    }
}

/// What a subexpression costs and how large its value can be; `schema`
/// when the value is a typed part of the object.
#[derive(Debug, Clone)]
struct Est<'s> {
    cost: f64,
    size: Size,
    schema: Option<&'s Value>,
    /// The object's root or an embedded resource: `apiVersion`, `kind`
    /// and `metadata` are there whatever the schema declares.
    resource: bool,
}

impl Est<'_> {
    fn value(size: Size) -> Self {
        Est {
            cost: 0.0,
            size,
            schema: None,
            resource: false,
        }
    }
}

/// A rule refused: the expression node at fault and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    pub id: u64,
    pub message: String,
}

/// The functions of the environment ([`super::compile::env`]), by name.
const FUNCTIONS: &[&str] = &[
    "size",
    "contains",
    "startsWith",
    "endsWith",
    "matches",
    "int",
    "uint",
    "double",
    "string",
    "bytes",
    "bool",
    "timestamp",
    "duration",
    "dyn",
    "type",
    "getDate",
    "getDayOfMonth",
    "getDayOfWeek",
    "getDayOfYear",
    "getFullYear",
    "getHours",
    "getMilliseconds",
    "getMinutes",
    "getMonth",
    "getSeconds",
    "charAt",
    "indexOf",
    "isSorted",
    "sum",
    "min",
    "max",
    "find",
    "findAll",
    "isIP",
    "isCIDR",
    "lastIndexOf",
    "join",
    "lowerAscii",
    "upperAscii",
    "trim",
    "replace",
    "split",
    "substring",
    "format",
    "strings.quote",
    "reverse",
    "optional.of",
    "optional.ofNonZeroValue",
    "optional.none",
    "hasValue",
    "value",
    "orValue",
    "or",
];

/// Type names a rule may use as values (`type(self.x) == string`).
const TYPES: &[&str] = &[
    "int",
    "uint",
    "double",
    "bool",
    "string",
    "bytes",
    "list",
    "map",
    "null_type",
    "type",
    "duration",
    "timestamp",
    "dyn",
];

/// The most a rule can cost when `self` is a value of `schema` (`root`:
/// the whole object) and sizes are bounded by `bounds`; or why the rule
/// cannot run at all.
pub fn estimate(
    expr: &Expression,
    schema: &Value,
    root: bool,
    bounds: &dyn Bounds,
) -> Result<f64, Problem> {
    let me = Est {
        cost: 1.0,
        size: bounds.size(schema),
        schema: Some(schema),
        resource: root || embedded(schema),
    };
    let mut e = Estimator {
        bounds,
        scope: vec![("self".into(), me.clone()), ("oldSelf".into(), me)],
    };
    e.expr(expr).map(|est| est.cost)
}

/// The most `expr` can cost over variables of the given sizes, none of
/// them typed by a schema (admission's `object`, `request`, ...); or why
/// it cannot run (an undeclared variable or function).
pub fn estimate_untyped(expr: &Expression, vars: &[(&str, Size)]) -> Result<f64, Problem> {
    let bounds = Observed::default();
    let mut e = Estimator {
        bounds: &bounds,
        scope: vars
            .iter()
            .map(|(name, size)| (name.to_string(), Est::value(*size)))
            .collect(),
    };
    e.expr(expr).map(|est| est.cost)
}

/// Whether `expr` reads only fields the schemas of its variables
/// declare (None: untyped); the first problem found.
pub fn check_typed(expr: &Expression, vars: &[(&str, Option<&Value>)]) -> Result<(), Problem> {
    let bounds = Observed::default();
    let mut e = Estimator {
        bounds: &bounds,
        scope: vars
            .iter()
            .map(|(name, schema)| {
                let est = Est {
                    cost: 0.0,
                    size: SCALAR,
                    schema: *schema,
                    resource: schema.is_some(),
                };
                (name.to_string(), est)
            })
            .collect(),
    };
    e.expr(expr).map(|_| ())
}

struct Estimator<'s, 'b> {
    bounds: &'b dyn Bounds,
    /// Variables in scope, innermost last.
    scope: Vec<(String, Est<'s>)>,
}

impl<'s> Estimator<'s, '_> {
    fn typed(&self, schema: Option<&'s Value>, fallback: Size) -> Est<'s> {
        Est {
            cost: 0.0,
            size: schema.map_or(fallback, |s| self.bounds.size(s)),
            schema,
            resource: schema.is_some_and(embedded),
        }
    }

    fn expr(&mut self, e: &Expression) -> Result<Est<'s>, Problem> {
        let problem = |message: String| Problem { id: e.id, message };
        match &e.expr {
            Expr::Unspecified => Ok(Est::value(SCALAR)),
            Expr::Literal(l) => Ok(Est::value(match l {
                LiteralValue::String(s) => {
                    let n = s.inner().len() as f64;
                    Size {
                        len: n,
                        bytes: n + 2.0,
                    }
                }
                LiteralValue::Bytes(b) => {
                    let n = b.inner().len() as f64;
                    Size { len: n, bytes: n }
                }
                _ => SCALAR,
            })),
            Expr::Ident(name) => {
                if let Some((_, v)) = self.scope.iter().rev().find(|(n, _)| n == name) {
                    return Ok(Est {
                        cost: 1.0,
                        ..v.clone()
                    });
                }
                if TYPES.contains(&name.as_str()) {
                    return Ok(Est {
                        cost: 1.0,
                        ..Est::value(SCALAR)
                    });
                }
                Err(problem(format!(
                    "undeclared reference to '{name}' (in container '')"
                )))
            }
            Expr::Select(sel) => {
                let operand = self.expr(&sel.operand)?;
                let child = self.field(&operand, &sel.field).map_err(problem)?;
                // An untyped field can hold as many items as its
                // parent has bytes.
                let fallback = Size {
                    len: operand.size.bytes,
                    bytes: operand.size.bytes,
                };
                let mut out = self.typed(child, fallback);
                if sel.test {
                    out.size = SCALAR;
                    out.schema = None;
                }
                out.cost = operand.cost + 1.0;
                Ok(out)
            }
            Expr::List(l) => {
                let items = l
                    .elements
                    .iter()
                    .map(|i| self.expr(i))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(collection(&items))
            }
            Expr::Map(m) => {
                let mut items = Vec::new();
                for entry in &m.entries {
                    if let EntryExpr::MapEntry(me) = &entry.expr {
                        items.push(self.expr(&me.key)?);
                        items.push(self.expr(&me.value)?);
                    }
                }
                Ok(collection(&items))
            }
            Expr::Struct(s) => Err(problem(format!(
                "undeclared reference to '{}' (in container '')",
                s.type_name
            ))),
            Expr::Comprehension(c) => self.comprehension(c),
            Expr::Call(call) => {
                let target = match &call.target {
                    Some(t) => Some(self.expr(t)?),
                    None => None,
                };
                let args = call
                    .args
                    .iter()
                    .map(|a| self.expr(a))
                    .collect::<Result<Vec<_>, _>>()?;
                let key = call.args.get(1).and_then(|a| match &a.expr {
                    Expr::Literal(LiteralValue::String(s)) => Some(s.inner().to_string()),
                    _ => None,
                });
                self.call(&call.func_name, target, args, key.as_deref())
                    .map_err(problem)
            }
        }
    }

    /// The schema of `operand.field`; an error for a field the schema
    /// does not have.
    fn field(&self, operand: &Est<'s>, field: &str) -> Result<Option<&'s Value>, String> {
        let Some(schema) = operand.schema else {
            return Ok(None);
        };
        let name = unescape(field);
        if let Some(props) = properties(schema) {
            if let Some(s) = props.get(&name) {
                return Ok(Some(s));
            }
            if operand.resource && ["apiVersion", "kind", "metadata"].contains(&name.as_str()) {
                return Ok(None);
            }
            if flag(schema, "x-kubernetes-preserve-unknown-fields") {
                return Ok(None);
            }
            return Err(format!("undefined field '{field}'"));
        }
        Ok(additional(schema))
    }

    fn comprehension(
        &mut self,
        c: &cel::common::ast::ComprehensionExpr,
    ) -> Result<Est<'s>, Problem> {
        let range = self.expr(&c.iter_range)?;
        let iterations = range.size.len;
        // One element: typed by the schema where it has one, else no
        // larger than the whole.
        let (first, second) = match range.schema {
            Some(s) if s.get("items").is_some() => {
                (Est::value(SCALAR), self.typed(s.get("items"), range.size))
            }
            Some(s) => (
                Est::value(Size {
                    len: range.size.bytes,
                    bytes: range.size.bytes,
                }),
                self.typed(field_schema(s, ""), range.size),
            ),
            None => (Est::value(range.size), Est::value(range.size)),
        };
        let listy = range.schema.is_some_and(|s| s.get("items").is_some());
        let depth = self.scope.len();
        match &c.iter_var2 {
            Some(v2) => {
                self.scope.push((c.iter_var.clone(), first));
                self.scope.push((v2.clone(), second));
            }
            None => self
                .scope
                .push((c.iter_var.clone(), if listy { second } else { first })),
        }
        let init = self.expr(&c.accu_init)?;
        // map() and filter() append to their list in place: each step
        // costs what it adds, and the list grows by that much per step.
        let builds_list = matches!(&c.accu_init.expr, Expr::List(l) if l.elements.is_empty());
        let accu = if builds_list {
            Est::value(Size {
                len: 0.0,
                bytes: 0.0,
            })
        } else {
            Est {
                cost: 1.0,
                ..init.clone()
            }
        };
        self.scope.push((c.accu_var.clone(), accu));
        let cond = self.expr(&c.loop_cond)?;
        let step = self.expr(&c.loop_step)?;
        self.scope.pop();
        let result_accu = if builds_list {
            Est::value(Size {
                len: iterations * step.size.len,
                bytes: iterations * step.size.bytes + 2.0,
            })
        } else {
            init.clone()
        };
        self.scope.push((c.accu_var.clone(), result_accu));
        let result = self.expr(&c.result)?;
        self.scope.truncate(depth);
        Ok(Est {
            cost: range.cost + init.cost + iterations * (cond.cost + step.cost) + result.cost,
            ..result
        })
    }

    fn call(
        &mut self,
        name: &str,
        target: Option<Est<'s>>,
        args: Vec<Est<'s>>,
        key: Option<&str>,
    ) -> Result<Est<'s>, String> {
        let operator =
            name.starts_with('_') || name.starts_with('@') || name == "!_" || name == "-_";
        if !operator && !FUNCTIONS.contains(&name) {
            return Err(format!(
                "undeclared reference to '{name}' (in container '')"
            ));
        }
        let operands_cost: f64 = target.iter().chain(&args).map(|a| a.cost).sum();
        let subject = target.clone().or_else(|| args.first().cloned());
        let s = subject.as_ref().map_or(SCALAR, |e| e.size);
        let other = |i: usize| {
            let i = if target.is_some() { i - 1 } else { i };
            args.get(i).map_or(SCALAR, |e| e.size)
        };
        let traverse = |bytes: f64| 1.0 + (TRAVERSAL * bytes).ceil();
        let (own, size, schema) = match name {
            "_[_]" | "_[?_]" => {
                let from = args.first();
                let child = from.and_then(|f| f.schema).and_then(|sch| {
                    if let Some(items) = sch.get("items") {
                        Some(items)
                    } else if properties(sch).is_some() {
                        key.and_then(|k| properties(sch).and_then(|p| p.get(k)))
                    } else {
                        additional(sch)
                    }
                });
                let fallback = from.map_or(SCALAR, |f| f.size);
                let t = self.typed(child, fallback);
                (1.0, t.size, t.schema)
            }
            "_?._" => {
                let from = args.first().cloned().unwrap_or(Est::value(SCALAR));
                let child = match key {
                    Some(k) => self.field(&from, k)?,
                    None => None,
                };
                let t = self.typed(child, from.size);
                (1.0, t.size, t.schema)
            }
            "_==_" | "_!=_" | "_<_" | "_<=_" | "_>_" | "_>=_" => {
                (traverse(s.bytes.min(other(1).bytes)), SCALAR, None)
            }
            "_+_" => {
                let o = other(1);
                let size = Size {
                    len: s.len + o.len,
                    bytes: s.bytes + o.bytes,
                };
                (traverse(size.bytes), size, None)
            }
            "@in" => {
                let list = other(1);
                (
                    1.0 + list.len + (TRAVERSAL * list.bytes).ceil(),
                    SCALAR,
                    None,
                )
            }
            "_?_:_" => {
                // The condition and the dearer branch.
                let (a, b) = (&args[1], &args[2]);
                let cost = args[0].cost + a.cost.max(b.cost);
                let size = Size {
                    len: a.size.len.max(b.size.len),
                    bytes: a.size.bytes.max(b.size.bytes),
                };
                return Ok(Est {
                    cost,
                    size,
                    schema: if a.schema == b.schema { a.schema } else { None },
                    resource: false,
                });
            }
            "contains" | "startsWith" | "endsWith" | "indexOf" | "lastIndexOf" => {
                (traverse(s.bytes + other(1).bytes), SCALAR, None)
            }
            // Kubernetes' list functions walk the list once, comparing
            // elements; min and max give one, as long as the whole list
            // at most.
            "isSorted" | "sum" | "min" | "max" => {
                let size = match name {
                    "min" | "max" => Size {
                        len: s.bytes,
                        bytes: s.bytes,
                    },
                    _ => SCALAR,
                };
                (1.0 + s.len + traverse(s.bytes), size, None)
            }
            "isIP" | "isCIDR" => (traverse(s.bytes), SCALAR, None),
            // A regex run, as `matches`; the matches are the string's at
            // most (and one empty match per position).
            "find" | "findAll" => {
                let pattern = other(1);
                let cost = 1.0
                    + (TRAVERSAL * s.bytes).ceil().max(1.0)
                        * (REGEX * pattern.bytes).ceil().max(1.0);
                let size = Size {
                    len: s.bytes + 1.0,
                    bytes: s.bytes,
                };
                (cost, size, None)
            }
            "matches" => {
                let pattern = other(1);
                let cost = 1.0
                    + (TRAVERSAL * s.bytes).ceil().max(1.0)
                        * (REGEX * pattern.bytes).ceil().max(1.0);
                (cost, SCALAR, None)
            }
            "size" | "getDate" | "getDayOfMonth" | "getDayOfWeek" | "getDayOfYear"
            | "getFullYear" | "getHours" | "getMilliseconds" | "getMinutes" | "getMonth"
            | "getSeconds" | "hasValue" => (1.0, SCALAR, None),
            "replace" => {
                let new = other(2);
                let bytes = s.bytes + (s.len + 1.0) * new.bytes;
                let size = Size { len: bytes, bytes };
                (traverse(s.bytes + bytes), size, None)
            }
            "split" => {
                let size = Size {
                    len: s.len + 1.0,
                    bytes: 3.0 * s.bytes + 2.0,
                };
                (traverse(s.bytes + size.bytes), size, None)
            }
            "join" => {
                let sep = if args.is_empty() { 0.0 } else { other(1).bytes };
                let bytes = s.bytes + s.len * sep;
                (traverse(bytes), Size { len: bytes, bytes }, None)
            }
            "format" => {
                let bytes = s.bytes * (1.0 + other(1).bytes);
                (traverse(bytes), Size { len: bytes, bytes }, None)
            }
            "strings.quote" => {
                let bytes = 6.0 * s.bytes + 2.0;
                (traverse(bytes), Size { len: bytes, bytes }, None)
            }
            "string"
            | "bytes"
            | "dyn"
            | "lowerAscii"
            | "upperAscii"
            | "trim"
            | "reverse"
            | "substring"
            | "charAt"
            | "value"
            | "orValue"
            | "or"
            | "optional.of"
            | "optional.ofNonZeroValue" => {
                let wider = if name == "string" {
                    s.bytes.max(32.0)
                } else {
                    s.bytes
                };
                let size = Size {
                    len: s.len.max(wider),
                    bytes: wider,
                };
                let keeps = matches!(name, "dyn" | "value" | "optional.of" | "orValue");
                let schema = if keeps {
                    subject.and_then(|e| e.schema)
                } else {
                    None
                };
                (traverse(s.bytes), size, schema)
            }
            // Parsing a string.
            "int" | "uint" | "double" | "bool" | "timestamp" | "duration" => {
                (traverse(s.bytes), SCALAR, None)
            }
            // Logic, arithmetic, optional.none.
            _ => (1.0, SCALAR, None),
        };
        let mut out = self.typed(schema, size);
        out.size = size;
        out.cost = operands_cost + own;
        Ok(out)
    }
}

/// A list or map literal of these items.
fn collection<'s>(items: &[Est<'s>]) -> Est<'s> {
    Est {
        cost: 1.0 + items.iter().map(|i| i.cost).sum::<f64>(),
        size: Size {
            len: items.len() as f64,
            bytes: items.iter().map(|i| i.size.bytes + 1.0).sum::<f64>() + 2.0,
        },
        schema: None,
        resource: false,
    }
}
