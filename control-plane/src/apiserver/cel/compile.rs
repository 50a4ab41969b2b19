//! Compiling rules and checking a definition's rules when it is written
//! (upstream's `ValidateCustomResourceDefinitionOpenAPISchema` for
//! `x-kubernetes-validations`), with upstream's messages.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use cel::common::ast::Expr;
use cel::parser::Expression;
use cel::{Env, Program};
use serde_json::Value;

use super::cost::{self, Bounds, Declared, Problem};
use super::{rules, RULE_LIMIT, SCHEMA_LIMIT};
use crate::apiserver::crd::structural::{additional, child, properties};
use crate::apiserver::status::Cause;

/// CEL's standard library, the strings extension and part of
/// Kubernetes' libraries.
static ENV: LazyLock<Arc<Env>> = LazyLock::new(|| {
    let mut env = Env::stdlib();
    cel::extensions::strings(&mut env).expect("the strings extension declares once");
    super::library::register(&mut env).expect("the Kubernetes functions declare once");
    Arc::new(env)
});

pub fn env() -> Arc<Env> {
    ENV.clone()
}

/// Compiled rules, shared by every kind; dropped whole past this many
/// (rules come from definitions, so only many definitions fill it).
const PROGRAM_CACHE: usize = 4096;

static PROGRAMS: Mutex<Option<HashMap<String, Arc<Program>>>> = Mutex::new(None);

/// `source` compiled, or the parser's errors as cel-go prints them.
pub fn program(source: &str) -> Result<Arc<Program>, String> {
    let mut cache = PROGRAMS.lock().expect("program cache lock");
    let cache = cache.get_or_insert_with(HashMap::new);
    if let Some(p) = cache.get(source) {
        return Ok(p.clone());
    }
    let p = Arc::new(ENV.compile(source).map_err(|e| e.to_string())?);
    if cache.len() >= PROGRAM_CACHE {
        cache.clear();
    }
    cache.insert(source.to_string(), p.clone());
    Ok(p)
}

/// A problem found in `program`, where cel-go would point at it.
pub fn located(program: &Program, p: &Problem) -> String {
    let source = &program.source_info().source;
    let offset = program
        .source_info()
        .offset_for(p.id)
        .map_or(0, |(start, _)| start as usize);
    let before: String = source.chars().take(offset).collect();
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    format!("ERROR: <input>:{line}:{column}: {}", p.message)
}

/// Whether a rule reads `oldSelf` (a transition rule).
pub fn reads_old(e: &Expression) -> bool {
    reads(e, "oldSelf")
}

/// Whether `e` names variable `name` anywhere.
pub fn reads(e: &Expression, name: &str) -> bool {
    let r = |x: &Expression| reads(x, name);
    match &e.expr {
        Expr::Ident(n) => n == name,
        Expr::Select(s) => r(&s.operand),
        Expr::Call(c) => c.target.as_deref().is_some_and(r) || c.args.iter().any(r),
        Expr::List(l) => l.elements.iter().any(r),
        Expr::Map(m) => m.entries.iter().any(|en| match &en.expr {
            cel::common::ast::EntryExpr::MapEntry(me) => r(&me.key) || r(&me.value),
            cel::common::ast::EntryExpr::StructField(f) => r(&f.value),
        }),
        Expr::Struct(s) => s.entries.iter().any(|en| match &en.expr {
            cel::common::ast::EntryExpr::MapEntry(me) => r(&me.key) || r(&me.value),
            cel::common::ast::EntryExpr::StructField(f) => r(&f.value),
        }),
        Expr::Comprehension(c) => [
            &c.iter_range,
            &c.accu_init,
            &c.loop_cond,
            &c.loop_step,
            &c.result,
        ]
        .into_iter()
        .any(r),
        Expr::Literal(_) | Expr::Unspecified => false,
    }
}

/// One step of a rule's `fieldPath`: a property, or a key of a map.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    Property(String),
    Key(String),
}

/// A rule's `fieldPath` (`.spec.replicas`, `.labels['app.io/x']`),
/// resolved against the schema of the node the rule sits on.
pub fn field_path(mut schema: &Value, fp: &str) -> Result<Vec<Step>, String> {
    let mut steps = Vec::new();
    let mut rest = fp.trim();
    while !rest.is_empty() {
        let name = if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            rest = &r[end..];
            r[..end].to_string()
        } else if let Some(r) = rest.strip_prefix("['") {
            let end = r.find("']").ok_or("unterminated ['")?;
            rest = &r[end + 2..];
            r[..end].to_string()
        } else {
            return Err(format!("expected [ or . at {rest:?}"));
        };
        if name.is_empty() {
            return Err("empty field name".into());
        }
        if let Some(s) = properties(schema).and_then(|p| p.get(&name)) {
            steps.push(Step::Property(name));
            schema = s;
        } else if let Some(s) = additional(schema) {
            steps.push(Step::Key(name));
            schema = s;
        } else {
            return Err("does not refer to a valid field".into());
        }
    }
    Ok(steps)
}

const REASONS: &[&str] = &[
    "FieldValueDuplicate",
    "FieldValueForbidden",
    "FieldValueInvalid",
    "FieldValueRequired",
];

/// Upstream's `getCostErrorMessage`.
fn over_budget(what: &str, cost: f64, limit: f64) -> String {
    let factor = cost / limit;
    let factor = if factor > 100.0 {
        "more than 100x".to_string()
    } else if factor < 1.5 {
        format!("{factor:.6}x")
    } else {
        format!("{factor:.1}x")
    };
    format!("{what} exceeds budget by factor of {factor} (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)")
}

/// The causes that make the rules of `schema` unusable; `path` is where
/// the schema sits in the definition. Run on structural schemas only.
pub fn check(schema: &Value, path: &str) -> Vec<Cause> {
    let mut w = Walk {
        total: 0.0,
        causes: Vec::new(),
    };
    w.node(schema, path, 1.0, None, 0, true);
    if w.total > SCHEMA_LIMIT {
        w.causes.push(Cause::forbidden(
            path,
            &over_budget(
                "x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema",
                w.total,
                SCHEMA_LIMIT,
            ),
        ));
    }
    w.causes
}

struct Walk {
    total: f64,
    causes: Vec<Cause>,
}

impl Walk {
    /// `cardinality`: how often a rule here can run for one object;
    /// `uncorrelated`: the list above this node whose elements an update
    /// cannot pair with the old ones.
    fn node(
        &mut self,
        schema: &Value,
        path: &str,
        cardinality: f64,
        uncorrelated: Option<&str>,
        depth: usize,
        root: bool,
    ) {
        if depth > crate::apiserver::crd::structural::MAX_DEPTH || !schema.is_object() {
            return;
        }
        match schema.get("x-kubernetes-validations") {
            None | Some(Value::Array(_)) => {}
            Some(other) => self.causes.push(Cause::invalid(
                child(path, "x-kubernetes-validations"),
                &other.to_string(),
                "must be a list of rules",
            )),
        }
        for (i, rule) in rules(schema).iter().enumerate() {
            if !rule.is_object() {
                self.causes.push(Cause::invalid(
                    format!("{path}.x-kubernetes-validations[{i}]"),
                    &rule.to_string(),
                    "must be a rule object",
                ));
                continue;
            }
            let at = format!("{path}.x-kubernetes-validations[{i}]");
            self.rule(schema, rule, &at, cardinality, uncorrelated, root);
        }
        if let Some(props) = properties(schema) {
            for (k, s) in props {
                let p = format!("{path}.properties[{k}]");
                self.node(s, &p, cardinality, uncorrelated, depth + 1, false);
            }
        }
        if let Some(s) = additional(schema) {
            let n = Declared.size(schema).len.max(1.0);
            let p = child(path, "additionalProperties");
            self.node(s, &p, cardinality * n, uncorrelated, depth + 1, false);
        }
        if let Some(s) = schema.get("items") {
            let n = Declared.size(schema).len.max(1.0);
            let correlated =
                schema.get("x-kubernetes-list-type").and_then(Value::as_str) == Some("map");
            let within = if correlated { uncorrelated } else { Some(path) };
            let p = child(path, "items");
            self.node(s, &p, cardinality * n, within, depth + 1, false);
        }
    }

    fn rule(
        &mut self,
        schema: &Value,
        rule: &Value,
        at: &str,
        cardinality: f64,
        uncorrelated: Option<&str>,
        root: bool,
    ) {
        let c = &mut self.causes;
        let text = |k: &str| rule.get(k).and_then(Value::as_str).unwrap_or_default();
        let source = text("rule");
        if source.trim().is_empty() {
            c.push(Cause::required(format!("{at}.rule")));
        } else {
            match program(source) {
                Err(e) => c.push(Cause::invalid(
                    format!("{at}.rule"),
                    source,
                    &format!("compilation failed: {e}"),
                )),
                Ok(p) => match cost::estimate(p.expression(), schema, root, &Declared) {
                    Err(problem) => c.push(Cause::invalid(
                        format!("{at}.rule"),
                        source,
                        &format!("compilation failed: {}", located(&p, &problem)),
                    )),
                    Ok(estimate) => {
                        if reads_old(p.expression()) {
                            if let Some(list) = uncorrelated {
                                c.push(Cause::invalid(
                                    format!("{at}.rule"),
                                    source,
                                    &format!("oldSelf cannot be used on the uncorrelatable portion of the schema within {list}"),
                                ));
                            }
                        }
                        self.cost(at, "rule", estimate, cardinality);
                    }
                },
            }
        }
        let c = &mut self.causes;
        let message = text("message");
        if rule.get("message").is_some() && message.trim().is_empty() {
            c.push(Cause::invalid(
                format!("{at}.message"),
                message,
                "message must be non-empty if specified",
            ));
        }
        if message.contains('\n') {
            c.push(Cause::invalid(
                format!("{at}.message"),
                message,
                "message must not contain line breaks",
            ));
        }
        if source.contains('\n') && message.is_empty() {
            c.push(Cause::required_because(
                format!("{at}.message"),
                "message must be specified if rule contains line breaks",
            ));
        }
        if rule.get("messageExpression").is_some() {
            let me = text("messageExpression");
            if me.trim().is_empty() {
                c.push(Cause::required_because(
                    format!("{at}.messageExpression"),
                    "messageExpression must be non-empty if specified",
                ));
            } else {
                match program(me) {
                    Err(e) => c.push(Cause::invalid(
                        format!("{at}.messageExpression"),
                        me,
                        &format!("messageExpression compilation failed: {e}"),
                    )),
                    Ok(p) => match cost::estimate(p.expression(), schema, root, &Declared) {
                        Err(problem) => c.push(Cause::invalid(
                            format!("{at}.messageExpression"),
                            me,
                            &format!(
                                "messageExpression compilation failed: {}",
                                located(&p, &problem)
                            ),
                        )),
                        Ok(estimate) => self.cost(at, "messageExpression", estimate, cardinality),
                    },
                }
            }
        }
        let c = &mut self.causes;
        if let Some(reason) = rule.get("reason") {
            let r = reason.as_str().unwrap_or_default();
            if !REASONS.contains(&r) {
                c.push(Cause::not_supported(format!("{at}.reason"), r, REASONS));
            }
        }
        if rule.get("fieldPath").is_some() {
            let fp = text("fieldPath");
            let problem = if fp.trim().is_empty() {
                Some("fieldPath must be non-empty if specified".to_string())
            } else if fp.contains('\n') {
                Some("fieldPath must not contain line breaks".to_string())
            } else {
                field_path(schema, fp)
                    .err()
                    .map(|e| format!("fieldPath must be a valid path: {e}"))
            };
            if let Some(p) = problem {
                c.push(Cause::invalid(format!("{at}.fieldPath"), fp, &p));
            }
        }
        if rule.get("optionalOldSelf") == Some(&Value::Bool(true)) {
            // Accepting it and running transition rules on creates without
            // an optional oldSelf would change what the rule means.
            c.push(Cause::forbidden(
                format!("{at}.optionalOldSelf"),
                "optionalOldSelf is not supported by this server yet",
            ));
        }
    }

    fn cost(&mut self, at: &str, what: &str, estimate: f64, cardinality: f64) {
        let field = format!("{at}.{what}");
        if estimate > RULE_LIMIT {
            let name = if what == "rule" {
                "estimated rule cost"
            } else {
                "estimated messageExpression cost"
            };
            self.causes.push(Cause::forbidden(
                field,
                &over_budget(name, estimate, RULE_LIMIT),
            ));
            return;
        }
        let total = estimate * cardinality;
        if total > SCHEMA_LIMIT {
            self.causes.push(Cause::forbidden(
                field,
                "contributed to estimated rule & messageExpression cost total exceeding cost limit for entire OpenAPIv3 schema",
            ));
        }
        self.total += total;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn messages(schema: Value) -> Vec<String> {
        check(&schema, "s").into_iter().map(|c| c.line()).collect()
    }

    fn with_rule(rule: Value) -> Value {
        json!({"type": "object", "properties": {"spec": {"type": "object",
            "properties": {
                "replicas": {"type": "integer"},
                "name": {"type": "string", "maxLength": 63},
                "items": {"type": "array", "maxItems": 10,
                          "items": {"type": "string", "maxLength": 10}},
                "free": {"type": "array", "items": {"type": "string"}}},
            "x-kubernetes-validations": [rule]}}})
    }

    #[test]
    fn good_rules_pass() {
        for r in [
            "self.replicas >= 0",
            "self.name.startsWith('a') && self.items.all(i, i.size() < 5)",
            "has(self.name) ? self.name.matches('^[a-z]+$') : true",
            "self.items.map(i, i + 'x').exists(j, j == 'ax')",
            "self.replicas == oldSelf.replicas",
            "type(self.replicas) == int",
            "self.name.lowerAscii().split('-').size() < 3",
            "self.free.exists(f, f == 'x')",
        ] {
            assert_eq!(
                messages(with_rule(json!({"rule": r}))),
                Vec::<String>::new(),
                "{r}"
            );
        }
    }

    #[test]
    fn bad_rules_are_refused_with_upstreams_messages() {
        let m = messages(with_rule(json!({"rule": "self.replicas >"})));
        assert!(m[0].starts_with("s.properties[spec].x-kubernetes-validations[0].rule: Invalid value: \"self.replicas >\": compilation failed: ERROR: <input>:1:"), "{m:?}");
        assert_eq!(
            messages(with_rule(json!({"rule": "self.replica > 0"}))),
            ["s.properties[spec].x-kubernetes-validations[0].rule: Invalid value: \"self.replica > 0\": compilation failed: ERROR: <input>:1:5: undefined field 'replica'"]
        );
        assert_eq!(
            messages(with_rule(json!({"rule": "isURL(self.name)"}))),
            ["s.properties[spec].x-kubernetes-validations[0].rule: Invalid value: \"isURL(self.name)\": compilation failed: ERROR: <input>:1:6: undeclared reference to 'isURL' (in container '')"]
        );
        assert_eq!(
            messages(with_rule(json!({"rule": "other > 1"}))),
            ["s.properties[spec].x-kubernetes-validations[0].rule: Invalid value: \"other > 1\": compilation failed: ERROR: <input>:1:1: undeclared reference to 'other' (in container '')"]
        );
        assert_eq!(
            messages(with_rule(json!({"rule": "true", "reason": "Nope", "message": " ", "fieldPath": ".nothing"}))),
            [
                "s.properties[spec].x-kubernetes-validations[0].message: Invalid value: \" \": message must be non-empty if specified",
                "s.properties[spec].x-kubernetes-validations[0].reason: Unsupported value: \"Nope\": supported values: \"FieldValueDuplicate\", \"FieldValueForbidden\", \"FieldValueInvalid\", \"FieldValueRequired\"",
                "s.properties[spec].x-kubernetes-validations[0].fieldPath: Invalid value: \".nothing\": fieldPath must be a valid path: does not refer to a valid field",
            ]
        );
        assert_eq!(
            messages(with_rule(json!({"rule": "true", "optionalOldSelf": true}))),
            ["s.properties[spec].x-kubernetes-validations[0].optionalOldSelf: Forbidden: optionalOldSelf is not supported by this server yet"]
        );
    }

    #[test]
    fn costly_rules_are_refused() {
        // Every unbounded string against every other: quadratic.
        let m = messages(with_rule(
            json!({"rule": "self.free.all(a, self.free.all(b, a == b))"}),
        ));
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(
            m[0].contains("Forbidden: estimated rule cost exceeds budget by factor of more than 100x (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)"),
            "{m:?}"
        );
        // Bounded, the same rule is cheap.
        assert_eq!(
            messages(with_rule(
                json!({"rule": "self.items.all(a, self.items.all(b, a == b))"})
            )),
            Vec::<String>::new()
        );
        // A cheap rule on every element of an unbounded list of unbounded
        // lists adds up past the schema's total.
        let nested = json!({"type": "object", "properties": {"rows": {"type": "array",
            "items": {"type": "array", "items": {"type": "string",
                "x-kubernetes-validations": [{"rule": "self.contains('x')"}]}}}}});
        let m = messages(nested);
        assert!(
            m.iter()
                .any(|m| m.contains("exceeding cost limit for entire OpenAPIv3 schema")),
            "{m:?}"
        );
    }

    #[test]
    fn transition_rules_need_correlatable_elements() {
        let schema = json!({"type": "object", "properties": {
            "atomic": {"type": "array", "items": {"type": "object", "properties": {"k": {"type": "string", "maxLength": 5}},
                "x-kubernetes-validations": [{"rule": "self.k == oldSelf.k"}]}},
            "keyed": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["k"],
                "items": {"type": "object", "required": ["k"], "properties": {"k": {"type": "string", "maxLength": 5}},
                "x-kubernetes-validations": [{"rule": "self.k == oldSelf.k"}]}}}});
        assert_eq!(
            messages(schema),
            ["s.properties[atomic].items.x-kubernetes-validations[0].rule: Invalid value: \"self.k == oldSelf.k\": oldSelf cannot be used on the uncorrelatable portion of the schema within s.properties[atomic]"]
        );
    }

    #[test]
    fn field_paths_resolve_against_the_schema() {
        let s = json!({"type": "object", "properties": {"a": {"type": "object", "properties": {"b.c": {"type": "string"}}},
            "m": {"type": "object", "additionalProperties": {"type": "string"}}}});
        assert_eq!(
            field_path(&s, ".a['b.c']"),
            Ok(vec![
                Step::Property("a".into()),
                Step::Property("b.c".into())
            ])
        );
        assert_eq!(
            field_path(&s, ".m['x/y']"),
            Ok(vec![Step::Property("m".into()), Step::Key("x/y".into())])
        );
        assert!(field_path(&s, ".a.x").is_err());
        assert!(field_path(&s, "a").is_err());
    }
}
