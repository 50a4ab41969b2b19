//! Running a schema's rules on an object (upstream's CEL `Validator`):
//! every node with rules, with `oldSelf` where an update pairs the node
//! with the old object's (properties, map keys, `map` lists by their
//! keys), each rule's cost bounded before it runs.

use cel::{Context, Value as Cel};
use serde_json::Value;

use super::compile::{env, field_path, located, program, reads_old, Step};
use super::cost::{self, Observed};
use super::values::to_cel;
use super::{rules, CALL_LIMIT, REQUEST_BUDGET};
use crate::apiserver::crd::structural::{additional, child, index, properties, type_name};
use crate::apiserver::status::Cause;

/// The causes that make `new` (a whole custom object) break its schema's
/// rules; `old` on updates, for transition rules.
pub fn validate(schema: &Value, new: &Value, old: Option<&Value>) -> Vec<Cause> {
    if !has_rules(schema, 0) {
        return Vec::new();
    }
    let mut bounds = Observed::default();
    bounds.observe(Some(schema), new, 0);
    if let Some(o) = old {
        bounds.observe(Some(schema), o, 0);
    }
    let mut run = Run {
        bounds,
        budget: REQUEST_BUDGET,
        causes: Vec::new(),
        stopped: false,
    };
    run.node(schema, new, old, "", 0, true);
    run.causes
}

fn has_rules(schema: &Value, depth: usize) -> bool {
    if depth > crate::apiserver::crd::structural::MAX_DEPTH {
        return false;
    }
    !rules(schema).is_empty()
        || properties(schema).is_some_and(|p| p.values().any(|s| has_rules(s, depth + 1)))
        || additional(schema).is_some_and(|s| has_rules(s, depth + 1))
        || schema.get("items").is_some_and(|s| has_rules(s, depth + 1))
}

struct Run {
    bounds: Observed,
    budget: f64,
    causes: Vec<Cause>,
    /// A rule went over its limit or the budget ran out: nothing more runs.
    stopped: bool,
}

/// How upstream names a field path; the object's root is a nil path.
fn shown(path: &str) -> &str {
    if path.is_empty() {
        "<nil>"
    } else {
        path
    }
}

/// What a rule is called in messages: its message, else its text.
fn rule_name(rule: &Value) -> &str {
    let text = |k: &str| {
        rule.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .trim()
    };
    if text("message").is_empty() {
        text("rule")
    } else {
        text("message")
    }
}

impl Run {
    fn node(
        &mut self,
        schema: &Value,
        v: &Value,
        old: Option<&Value>,
        path: &str,
        depth: usize,
        root: bool,
    ) {
        if self.stopped || v.is_null() || depth > crate::apiserver::crd::structural::MAX_DEPTH {
            return;
        }
        let rules = rules(schema);
        if !rules.is_empty() {
            let me = to_cel(Some(schema), v, root);
            let was = old
                .filter(|o| !o.is_null())
                .map(|o| to_cel(Some(schema), o, root));
            let ty = schema
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or_else(|| type_name(v));
            for rule in rules {
                self.rule(schema, rule, &me, was.as_ref(), path, ty, root);
                if self.stopped {
                    return;
                }
            }
        }
        if let (Some(props), Some(m)) = (properties(schema), v.as_object()) {
            for (k, s) in props {
                if let Some(val) = m.get(k) {
                    let before = old.and_then(|o| o.get(k));
                    self.node(s, val, before, &child(path, k), depth + 1, false);
                }
            }
        } else if let (Some(s), Some(m)) = (additional(schema), v.as_object()) {
            for (k, val) in m {
                let before = old.and_then(|o| o.get(k));
                self.node(s, val, before, &format!("{path}[{k}]"), depth + 1, false);
            }
        }
        if let (Some(s), Some(items)) = (schema.get("items"), v.as_array()) {
            let keys: Vec<&str> = match schema.get("x-kubernetes-list-type").and_then(Value::as_str)
            {
                Some("map") => schema
                    .get("x-kubernetes-list-map-keys")
                    .and_then(Value::as_array)
                    .map(|k| k.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default(),
                _ => Vec::new(),
            };
            let olds = old.and_then(Value::as_array);
            for (i, item) in items.iter().enumerate() {
                // Only keyed lists pair their elements across an update.
                let before = olds.filter(|_| !keys.is_empty()).and_then(|olds| {
                    olds.iter()
                        .find(|o| keys.iter().all(|k| o.get(*k) == item.get(*k)))
                });
                self.node(s, item, before, &index(path, i), depth + 1, false);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn rule(
        &mut self,
        schema: &Value,
        rule: &Value,
        me: &Cel,
        old: Option<&Cel>,
        path: &str,
        ty: &str,
        root: bool,
    ) {
        let source = rule.get("rule").and_then(Value::as_str).unwrap_or_default();
        let invalid = |detail: &str| Cause::invalid(shown(path), ty, detail);
        let p = match program(source) {
            Ok(p) => p,
            Err(e) => {
                self.causes
                    .push(invalid(&format!("compilation failed: {e}")));
                return;
            }
        };
        let transition = reads_old(p.expression());
        if transition && old.is_none() {
            return;
        }
        if !self.afford(&p, schema, root, path, ty, rule) {
            return;
        }
        let mut ctx = Context::with_env(env());
        ctx.add_variable_from_value("self", me.clone());
        if let Some(o) = old {
            ctx.add_variable_from_value("oldSelf", o.clone());
        }
        match p.execute(&ctx) {
            Ok(Cel::Bool(true)) => {}
            Ok(Cel::Bool(false)) => {
                let message = self.message(schema, rule, &ctx, root, path, ty);
                let at = self.at(schema, rule, path);
                let at = shown(&at);
                self.causes
                    .push(match rule.get("reason").and_then(Value::as_str) {
                        Some("FieldValueForbidden") => Cause::forbidden(at, &message),
                        Some("FieldValueRequired") => Cause::required_because(at, &message),
                        Some("FieldValueDuplicate") => Cause::duplicate(at, ty),
                        _ => Cause::invalid(at, ty, &message),
                    });
            }
            Ok(other) => self.causes.push(invalid(&format!(
                "rule evaluated to {}, not a bool, for rule: {}",
                other.type_of(),
                rule_name(rule)
            ))),
            Err(e) => self.causes.push(invalid(&format!(
                "{e} evaluating rule: {}",
                rule_name(rule)
            ))),
        }
    }

    /// Charge the rule's bound on this object to the request's budget;
    /// false (with the cause) when it cannot be afforded.
    fn afford(
        &mut self,
        p: &cel::Program,
        schema: &Value,
        root: bool,
        path: &str,
        ty: &str,
        rule: &Value,
    ) -> bool {
        let cost = match cost::estimate(p.expression(), schema, root, &self.bounds) {
            Ok(c) => c,
            Err(problem) => {
                self.causes.push(Cause::invalid(
                    shown(path),
                    ty,
                    &format!("compilation failed: {}", located(p, &problem)),
                ));
                return false;
            }
        };
        if cost > CALL_LIMIT {
            self.causes.push(Cause::invalid(shown(path), ty, &format!(
                "'operation cancelled: actual cost limit exceeded': no further validation rules will be run due to call cost exceeds limit for rule: {}",
                rule_name(rule)
            )));
            self.stopped = true;
            return false;
        }
        if cost > self.budget {
            self.causes.push(Cause::invalid(
                shown(path),
                ty,
                "validation failed due to running out of cost budget, no further validation rules will be run",
            ));
            self.stopped = true;
            return false;
        }
        self.budget -= cost;
        true
    }

    /// A failed rule's message: its messageExpression's when that gives
    /// one line of text, else its message, else `failed rule: RULE`.
    fn message(
        &mut self,
        schema: &Value,
        rule: &Value,
        ctx: &Context,
        root: bool,
        path: &str,
        ty: &str,
    ) -> String {
        if let Some(me) = rule.get("messageExpression").and_then(Value::as_str) {
            if let Ok(p) = program(me) {
                if self.afford(&p, schema, root, path, ty, rule) {
                    if let Ok(Cel::String(s)) = p.execute(ctx) {
                        if !s.trim().is_empty() && !s.contains('\n') {
                            return s.to_string();
                        }
                    }
                }
            }
        }
        match rule.get("message").and_then(Value::as_str).map(str::trim) {
            Some(m) if !m.is_empty() => m.to_string(),
            _ => format!("failed rule: {}", rule_name(rule)),
        }
    }

    /// Where a failed rule points: its node, or its `fieldPath` below it.
    fn at(&self, schema: &Value, rule: &Value, path: &str) -> String {
        let Some(fp) = rule.get("fieldPath").and_then(Value::as_str) else {
            return path.to_string();
        };
        let mut at = path.to_string();
        for step in field_path(schema, fp).unwrap_or_default() {
            at = match step {
                Step::Property(p) => child(&at, &p),
                Step::Key(k) => format!("{at}[{k}]"),
            };
        }
        at
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn messages(schema: &Value, new: Value, old: Option<Value>) -> Vec<String> {
        validate(schema, &new, old.as_ref())
            .into_iter()
            .map(|c| c.line())
            .collect()
    }

    fn schema() -> Value {
        json!({"type": "object",
            "x-kubernetes-validations": [{"rule": "self.metadata.name.startsWith('w')", "message": "names start with w"}],
            "properties": {"spec": {"type": "object",
            "x-kubernetes-validations": [
                {"rule": "self.min <= self.max", "messageExpression": "'min ' + string(self.min) + ' is above max ' + string(self.max)"},
                {"rule": "self.mode == oldSelf.mode", "message": "mode is immutable", "reason": "FieldValueForbidden", "fieldPath": ".mode"},
                {"rule": "!has(self.tags) || self.tags.all(t, t.size() <= 3)"}],
            "properties": {
                "min": {"type": "integer"}, "max": {"type": "integer"},
                "mode": {"type": "string", "maxLength": 10},
                "tags": {"type": "array", "maxItems": 5, "items": {"type": "string", "maxLength": 20}},
                "ports": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                    "items": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 5}, "port": {"type": "integer"}},
                        "x-kubernetes-validations": [{"rule": "self.port >= oldSelf.port", "message": "ports only grow"}]}}}}}})
    }

    #[test]
    fn rules_run_with_upstreams_messages() {
        let s = schema();
        let ok = json!({"metadata": {"name": "w1"}, "spec": {"min": 1, "max": 2, "mode": "a", "tags": ["x"]}});
        assert_eq!(messages(&s, ok.clone(), None), Vec::<String>::new());
        let bad = json!({"metadata": {"name": "x1"}, "spec": {"min": 3, "max": 2, "mode": "a", "tags": ["long"]}});
        assert_eq!(
            messages(&s, bad, None),
            [
                "<nil>: Invalid value: \"object\": names start with w",
                "spec: Invalid value: \"object\": min 3 is above max 2",
                "spec: Invalid value: \"object\": failed rule: !has(self.tags) || self.tags.all(t, t.size() <= 3)",
            ]
        );
    }

    #[test]
    fn transition_rules_see_the_old_object() {
        let s = schema();
        let old = json!({"metadata": {"name": "w"}, "spec": {"min": 1, "max": 2, "mode": "a",
            "ports": [{"name": "a", "port": 80}, {"name": "b", "port": 90}]}});
        let new = json!({"metadata": {"name": "w"}, "spec": {"min": 1, "max": 2, "mode": "b",
            "ports": [{"name": "b", "port": 85}, {"name": "c", "port": 1}]}});
        assert_eq!(
            messages(&s, new.clone(), Some(old)),
            [
                "spec.mode: Forbidden: mode is immutable",
                "spec.ports[0]: Invalid value: \"object\": ports only grow",
            ]
        );
        // On create there is no old object: transition rules do not run.
        assert_eq!(messages(&s, new, None), Vec::<String>::new());
    }

    #[test]
    fn errors_in_rules_are_reported_not_raised() {
        let s = json!({"type": "object", "properties": {"spec": {"type": "object",
            "properties": {"a": {"type": "integer"}},
            "x-kubernetes-validations": [{"rule": "self.a / 0 == 1"}, {"rule": "self.a > 0"}]}}});
        let m = messages(&s, json!({"spec": {}}), None);
        assert_eq!(m.len(), 2, "{m:?}");
        assert!(
            m.iter()
                .all(|m| m.starts_with("spec: Invalid value: \"object\": ")
                    && m.contains("evaluating rule: ")),
            "{m:?}"
        );
    }

    #[test]
    fn the_budget_stops_costly_objects() {
        // Accepted (400 strings of 63 characters, compared pairwise),
        // but a big enough object is stopped before the rule runs.
        let s = json!({"type": "object", "properties": {"spec": {"type": "object",
            "properties": {"l": {"type": "array", "maxItems": 400, "items": {"type": "string", "maxLength": 63}}},
            "x-kubernetes-validations": [{"rule": "self.l.all(a, self.l.exists_one(b, a == b))"}]}}});
        assert!(
            super::super::check(&s, "s").is_empty(),
            "{:?}",
            super::super::check(&s, "s")
        );
        let small: Vec<String> = (0..10).map(|i| format!("s{i}")).collect();
        assert_eq!(
            messages(&s, json!({"spec": {"l": small}}), None),
            Vec::<String>::new()
        );
        let big: Vec<String> = (0..400).map(|i| format!("{i:0>60}")).collect();
        let m = messages(&s, json!({"spec": {"l": big}}), None);
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(
            m[0].contains(
                "no further validation rules will be run due to call cost exceeds limit for rule"
            ),
            "{m:?}"
        );
    }
}
