//! ValidatingAdmissionPolicies and their bindings
//! (admissionregistration.k8s.io/v1): defaults and validation as
//! upstream's, every expression compiled when the object is written, and
//! the `kubectl get` columns. Enforcing them is
//! [`crate::apiserver::policy`]'s.

use serde_json::{json, Value};

use super::webhookconfig::{
    match_conditions, one_of, rule_with_operations, FAILURE_POLICIES, MATCH_POLICIES,
};
use super::Strategy;
use crate::apiserver::cel::expression;
use crate::apiserver::defaults::set;
use crate::apiserver::status::Cause;
use crate::apiserver::table::{age_cell, name_cell, Col, AGE, NAME};
use crate::apiserver::validation::{is_qualified_name, label_selector};

pub struct Policy;
pub struct Binding;

/// What a policy's expressions see (upstream's, less `authorizer`).
pub const VARIABLES: [&str; 6] = [
    "object",
    "oldObject",
    "request",
    "params",
    "namespaceObject",
    "variables",
];
pub const REASONS: [&str; 4] = [
    "Forbidden",
    "Invalid",
    "RequestEntityTooLarge",
    "Unauthorized",
];
pub const ACTIONS: [&str; 3] = ["Audit", "Deny", "Warn"];
const NOT_FOUND_ACTIONS: [&str; 2] = ["Allow", "Deny"];

/// Defaults of `matchConstraints` / `matchResources`.
fn default_match(m: &mut Value) {
    let Some(obj) = m.as_object_mut() else {
        return;
    };
    set(obj, "matchPolicy", json!("Equivalent"));
    set(obj, "namespaceSelector", json!({}));
    set(obj, "objectSelector", json!({}));
    for key in ["resourceRules", "excludeResourceRules"] {
        for rule in obj
            .get_mut(key)
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            if let Some(r) = rule.as_object_mut() {
                set(r, "scope", json!("*"));
            }
        }
    }
}

/// `matchConstraints` / `matchResources`: their rules and selectors.
fn validate_match(m: &Value, path: &str, c: &mut Vec<Cause>) {
    for key in ["resourceRules", "excludeResourceRules"] {
        for (i, rule) in m[key].as_array().into_iter().flatten().enumerate() {
            rule_with_operations(rule, &format!("{path}.{key}[{i}]"), c);
        }
    }
    one_of(m, "matchPolicy", &MATCH_POLICIES, path, c);
    for sel in ["namespaceSelector", "objectSelector"] {
        label_selector(&m[sel], &format!("{path}.{sel}"), c);
    }
}

/// An expression at `path`: required, and compiling for `vars`.
fn expression_at(v: &Value, path: &str, vars: &[&str], c: &mut Vec<Cause>) {
    match v.as_str().map(str::trim) {
        None | Some("") => c.push(Cause::required(path)),
        Some(e) => {
            if let Err(err) = expression::compile(e, vars) {
                c.push(Cause::invalid(
                    path,
                    e,
                    &format!("compilation failed: {err}"),
                ));
            }
        }
    }
}

fn is_cel_identifier(s: &str) -> bool {
    s.starts_with(|ch: char| ch.is_ascii_alphabetic() || ch == '_')
        && s.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
}

impl Strategy for Policy {
    fn default(&self, obj: &mut Value) {
        let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
            return;
        };
        set(spec, "failurePolicy", json!("Fail"));
        if let Some(m) = spec.get_mut("matchConstraints") {
            default_match(m);
        }
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        let spec = &obj["spec"];
        let m = &spec["matchConstraints"];
        if m.is_null() {
            c.push(Cause::required("spec.matchConstraints"));
        } else {
            if m["resourceRules"].as_array().is_none_or(Vec::is_empty) {
                c.push(Cause::required("spec.matchConstraints.resourceRules"));
            }
            validate_match(m, "spec.matchConstraints", &mut c);
        }
        one_of(spec, "failurePolicy", &FAILURE_POLICIES, "spec", &mut c);
        if let Some(pk) = spec.get("paramKind").filter(|v| !v.is_null()) {
            for k in ["apiVersion", "kind"] {
                if pk[k].as_str().is_none_or(str::is_empty) {
                    c.push(Cause::required(format!("spec.paramKind.{k}")));
                }
            }
        }
        let validations = spec["validations"]
            .as_array()
            .map_or(&[][..], Vec::as_slice);
        let annotations = spec["auditAnnotations"]
            .as_array()
            .map_or(&[][..], Vec::as_slice);
        if validations.is_empty() && annotations.is_empty() {
            c.push(Cause::required_because(
                "spec.validations",
                "validations or auditAnnotations must contain at least one item",
            ));
        }
        for (i, v) in validations.iter().enumerate() {
            let path = format!("spec.validations[{i}]");
            expression_at(
                &v["expression"],
                &format!("{path}.expression"),
                &VARIABLES,
                &mut c,
            );
            if let Some(m) = v["message"].as_str() {
                if m.contains('\n') {
                    c.push(Cause::invalid(
                        format!("{path}.message"),
                        m,
                        "message must not contain line breaks",
                    ));
                }
            }
            if v.get("messageExpression").is_some_and(|m| !m.is_null()) {
                expression_at(
                    &v["messageExpression"],
                    &format!("{path}.messageExpression"),
                    &VARIABLES,
                    &mut c,
                );
            }
            if let Some(r) = v["reason"].as_str() {
                if !REASONS.contains(&r) {
                    c.push(Cause::not_supported(format!("{path}.reason"), r, &REASONS));
                }
            }
        }
        let mut keys = std::collections::HashSet::new();
        for (i, a) in annotations.iter().enumerate() {
            let path = format!("spec.auditAnnotations[{i}]");
            let key = a["key"].as_str().unwrap_or_default();
            let name = obj["metadata"]["name"].as_str().unwrap_or_default();
            if key.is_empty() {
                c.push(Cause::required(format!("{path}.key")));
            } else if !keys.insert(key) {
                c.push(Cause::duplicate(format!("{path}.key"), key));
            } else if !is_qualified_name(&format!("{name}/{key}")) {
                c.push(Cause::invalid(
                    format!("{path}.key"),
                    key,
                    "must be a valid qualified name when prefixed with the policy's name",
                ));
            }
            expression_at(
                &a["valueExpression"],
                &format!("{path}.valueExpression"),
                &VARIABLES,
                &mut c,
            );
        }
        match_conditions(&spec["matchConditions"], "spec", &VARIABLES, &mut c);
        let mut names = std::collections::HashSet::new();
        for (i, v) in spec["variables"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let path = format!("spec.variables[{i}]");
            let name = v["name"].as_str().unwrap_or_default();
            if name.is_empty() {
                c.push(Cause::required(format!("{path}.name")));
            } else if !is_cel_identifier(name) {
                c.push(Cause::invalid(
                    format!("{path}.name"),
                    name,
                    "name is not a valid CEL identifier",
                ));
            } else if !names.insert(name) {
                c.push(Cause::duplicate(format!("{path}.name"), name));
            }
            expression_at(
                &v["expression"],
                &format!("{path}.expression"),
                &VARIABLES,
                &mut c,
            );
        }
        c
    }

    fn validate_update(&self, _old: &Value, new: &Value) -> Vec<Cause> {
        self.validate(new)
    }

    fn columns(&self) -> Vec<Col> {
        vec![
            NAME,
            (
                "Validations",
                "integer",
                0,
                "Validations is the number of validations in the policy.",
            ),
            (
                "ParamKind",
                "string",
                0,
                "ParamKind is the kind of the policy's parameters.",
            ),
            AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let spec = &obj["spec"];
        let param_kind = match (
            spec["paramKind"]["apiVersion"].as_str(),
            spec["paramKind"]["kind"].as_str(),
        ) {
            (Some(v), Some(k)) => format!("{v}/{k}"),
            _ => "<unset>".into(),
        };
        vec![
            name_cell(obj),
            json!(spec["validations"].as_array().map_or(0, Vec::len)),
            json!(param_kind),
            age_cell(obj),
        ]
    }
}

impl Strategy for Binding {
    fn default(&self, obj: &mut Value) {
        if let Some(m) = obj
            .get_mut("spec")
            .and_then(|s| s.get_mut("matchResources"))
        {
            default_match(m);
        }
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        let spec = &obj["spec"];
        if spec["policyName"].as_str().is_none_or(str::is_empty) {
            c.push(Cause::required("spec.policyName"));
        }
        let actions: Vec<&str> = spec["validationActions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        if actions.is_empty() {
            c.push(Cause::required_because(
                "spec.validationActions",
                "at least one validation action is required",
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for (i, a) in actions.iter().enumerate() {
            if !ACTIONS.contains(a) {
                c.push(Cause::not_supported(
                    format!("spec.validationActions[{i}]"),
                    a,
                    &ACTIONS,
                ));
            } else if !seen.insert(*a) {
                c.push(Cause::duplicate(format!("spec.validationActions[{i}]"), a));
            }
        }
        if seen.contains("Deny") && seen.contains("Warn") {
            c.push(Cause::invalid_json(
                "spec.validationActions",
                &json!(actions),
                "must not contain both Deny and Warn (repeating the same validation failure information in the API response and headers serves no purpose)",
            ));
        }
        if let Some(pr) = spec.get("paramRef").filter(|v| !v.is_null()) {
            let has_name = pr["name"].as_str().is_some_and(|n| !n.is_empty());
            let has_selector = pr.get("selector").is_some_and(|s| !s.is_null());
            if has_name == has_selector {
                c.push(Cause::forbidden(
                    "spec.paramRef",
                    "one of `name` or `selector` must be set",
                ));
            }
            if has_selector {
                label_selector(&pr["selector"], "spec.paramRef.selector", &mut c);
            }
            match pr["parameterNotFoundAction"].as_str() {
                None => c.push(Cause::required("spec.paramRef.parameterNotFoundAction")),
                Some(a) if !NOT_FOUND_ACTIONS.contains(&a) => c.push(Cause::not_supported(
                    "spec.paramRef.parameterNotFoundAction",
                    a,
                    &NOT_FOUND_ACTIONS,
                )),
                Some(_) => {}
            }
        }
        if let Some(m) = spec.get("matchResources").filter(|v| !v.is_null()) {
            validate_match(m, "spec.matchResources", &mut c);
        }
        c
    }

    fn validate_update(&self, _old: &Value, new: &Value) -> Vec<Cause> {
        self.validate(new)
    }

    fn columns(&self) -> Vec<Col> {
        vec![
            NAME,
            (
                "PolicyName",
                "string",
                0,
                "PolicyName is the name of the policy the binding applies.",
            ),
            (
                "ParamRef",
                "string",
                0,
                "ParamRef names the parameters of the binding.",
            ),
            AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let spec = &obj["spec"];
        let pr = &spec["paramRef"];
        let param_ref = match (pr["namespace"].as_str(), pr["name"].as_str()) {
            (Some(ns), Some(n)) => format!("{ns}/{n}"),
            (None, Some(n)) => format!("*/{n}"),
            _ if pr.get("selector").is_some() => "*/*".into(),
            _ => "<unset>".into(),
        };
        vec![
            name_cell(obj),
            json!(spec["policyName"].as_str().unwrap_or_default()),
            json!(param_ref),
            age_cell(obj),
        ]
    }
}
