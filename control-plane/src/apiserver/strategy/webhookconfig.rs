//! MutatingWebhookConfigurations and ValidatingWebhookConfigurations
//! (admissionregistration.k8s.io/v1): defaults and validation as
//! upstream's `pkg/apis/admissionregistration` (v1 defaults, validation),
//! and the `kubectl get` columns. Calling the webhooks is
//! [`crate::apiserver::webhook`]'s.
//!
//! `CONNECT` is refused in rules: exec, attach and port-forward do not
//! go through admission webhooks here, and a rule asking for them would
//! be silently skipped.

use serde_json::{json, Value};

use super::Strategy;
use crate::apiserver::cel::expression;
use crate::apiserver::defaults::set;
use crate::apiserver::status::Cause;
use crate::apiserver::table::{age_cell, name_cell, Col, AGE, NAME};
use crate::apiserver::validation::{is_dns_label, is_qualified_name, label_selector};

/// Which of the two kinds; they differ in `reinvocationPolicy`.
pub struct WebhookConfiguration {
    pub mutating: bool,
}

pub const MUTATING: WebhookConfiguration = WebhookConfiguration { mutating: true };
pub const VALIDATING: WebhookConfiguration = WebhookConfiguration { mutating: false };

pub const OPERATIONS: [&str; 4] = ["*", "CREATE", "DELETE", "UPDATE"];
const SCOPES: [&str; 3] = ["*", "Cluster", "Namespaced"];
pub(crate) const FAILURE_POLICIES: [&str; 2] = ["Fail", "Ignore"];
pub(crate) const MATCH_POLICIES: [&str; 2] = ["Equivalent", "Exact"];
const SIDE_EFFECTS: [&str; 2] = ["None", "NoneOnDryRun"];
const REINVOCATION: [&str; 2] = ["IfNeeded", "Never"];
/// Upstream's limit on `matchConditions` per webhook.
const MAX_MATCH_CONDITIONS: usize = 64;
/// The variables a match condition sees (upstream's, less `authorizer`).
pub const MATCH_VARIABLES: [&str; 3] = ["object", "oldObject", "request"];

impl Strategy for WebhookConfiguration {
    fn default(&self, obj: &mut Value) {
        for hook in obj["webhooks"].as_array_mut().into_iter().flatten() {
            let Some(m) = hook.as_object_mut() else {
                continue;
            };
            set(m, "failurePolicy", json!("Fail"));
            set(m, "matchPolicy", json!("Equivalent"));
            set(m, "namespaceSelector", json!({}));
            set(m, "objectSelector", json!({}));
            set(m, "timeoutSeconds", json!(10));
            if self.mutating {
                set(m, "reinvocationPolicy", json!("Never"));
            }
            for rule in m
                .get_mut("rules")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                if let Some(r) = rule.as_object_mut() {
                    set(r, "scope", json!("*"));
                }
            }
            if let Some(svc) = m
                .get_mut("clientConfig")
                .and_then(|c| c.get_mut("service"))
                .and_then(Value::as_object_mut)
            {
                set(svc, "port", json!(443));
            }
        }
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        let mut names = std::collections::HashSet::new();
        for (i, hook) in obj["webhooks"].as_array().into_iter().flatten().enumerate() {
            let path = format!("webhooks[{i}]");
            let name = hook["name"].as_str().unwrap_or_default();
            if name.is_empty() {
                c.push(Cause::required(format!("{path}.name")));
            } else if !names.insert(name) {
                c.push(Cause::duplicate(format!("{path}.name"), name));
            } else if name.split('.').count() < 3 || !name.split('.').all(is_dns_label) {
                c.push(Cause::invalid(
                    format!("{path}.name"),
                    name,
                    "should be a domain with at least three segments separated by dots",
                ));
            }
            self.webhook(hook, &path, &mut c);
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
                "Webhooks",
                "integer",
                0,
                "Webhooks indicates the number of webhooks registered in this configuration.",
            ),
            AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let n = obj["webhooks"].as_array().map_or(0, Vec::len);
        vec![name_cell(obj), json!(n), age_cell(obj)]
    }
}

impl WebhookConfiguration {
    fn webhook(&self, hook: &Value, path: &str, c: &mut Vec<Cause>) {
        for (j, rule) in hook["rules"].as_array().into_iter().flatten().enumerate() {
            rule_with_operations(rule, &format!("{path}.rules[{j}]"), c);
        }
        one_of(hook, "failurePolicy", &FAILURE_POLICIES, path, c);
        one_of(hook, "matchPolicy", &MATCH_POLICIES, path, c);
        if self.mutating {
            one_of(hook, "reinvocationPolicy", &REINVOCATION, path, c);
        }
        match hook["sideEffects"].as_str() {
            None => c.push(Cause::required_because(
                format!("{path}.sideEffects"),
                &format!("must specify one of {}", quoted(&SIDE_EFFECTS)),
            )),
            Some(s) if !SIDE_EFFECTS.contains(&s) => c.push(Cause::not_supported(
                format!("{path}.sideEffects"),
                s,
                &SIDE_EFFECTS,
            )),
            Some(_) => {}
        }
        let versions: Vec<&str> = hook["admissionReviewVersions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        if versions.is_empty() {
            c.push(Cause::required_because(
                format!("{path}.admissionReviewVersions"),
                "must specify one of v1",
            ));
        } else if !versions.contains(&"v1") {
            c.push(Cause::invalid(
                format!("{path}.admissionReviewVersions"),
                &format!("{versions:?}"),
                "must include at least one of v1",
            ));
        }
        if let Some(t) = hook["timeoutSeconds"].as_i64() {
            if !(1..=30).contains(&t) {
                c.push(Cause::invalid_json(
                    format!("{path}.timeoutSeconds"),
                    &json!(t),
                    "the timeout value must be between 1 and 30 seconds",
                ));
            }
        }
        for sel in ["namespaceSelector", "objectSelector"] {
            label_selector(&hook[sel], &format!("{path}.{sel}"), c);
        }
        client_config(&hook["clientConfig"], &format!("{path}.clientConfig"), c);
        match_conditions(&hook["matchConditions"], path, &MATCH_VARIABLES, c);
    }
}

fn quoted(values: &[&str]) -> String {
    values
        .iter()
        .map(|v| format!("{v:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

pub(crate) fn one_of(hook: &Value, field: &str, allowed: &[&str], path: &str, c: &mut Vec<Cause>) {
    if let Some(v) = hook[field].as_str() {
        if !allowed.contains(&v) {
            c.push(Cause::not_supported(format!("{path}.{field}"), v, allowed));
        }
    }
}

/// A rule: operations, apiGroups, apiVersions, resources, scope.
pub(crate) fn rule_with_operations(rule: &Value, path: &str, c: &mut Vec<Cause>) {
    let list = |k: &str| -> Vec<&str> {
        rule[k]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect()
    };
    let operations = list("operations");
    if operations.is_empty() {
        c.push(Cause::required(format!("{path}.operations")));
    }
    for (k, op) in operations.iter().enumerate() {
        if !OPERATIONS.contains(op) {
            c.push(Cause::not_supported(
                format!("{path}.operations[{k}]"),
                op,
                &OPERATIONS,
            ));
        }
    }
    if operations.len() > 1 && operations.contains(&"*") {
        c.push(Cause::invalid(
            format!("{path}.operations"),
            &format!("{operations:?}"),
            "if '*' is present, must not specify other operations",
        ));
    }
    for k in ["apiGroups", "apiVersions"] {
        let v = list(k);
        if v.is_empty() {
            c.push(Cause::required(format!("{path}.{k}")));
        }
        if v.len() > 1 && v.contains(&"*") {
            c.push(Cause::invalid(
                format!("{path}.{k}"),
                &format!("{v:?}"),
                "if '*' is present, must not specify other API groups",
            ));
        }
    }
    let resources = list("resources");
    if resources.is_empty() {
        c.push(Cause::required(format!("{path}.resources")));
    }
    for (k, r) in resources.iter().enumerate() {
        if r.is_empty() {
            c.push(Cause::required(format!("{path}.resources[{k}]")));
        } else if r.split('/').count() > 2 {
            c.push(Cause::invalid(
                format!("{path}.resources[{k}]"),
                r,
                "resource and subresource names may not contain '/' beyond the one separating them",
            ));
        }
    }
    if let Some(s) = rule["scope"].as_str() {
        if !SCOPES.contains(&s) {
            c.push(Cause::not_supported(format!("{path}.scope"), s, &SCOPES));
        }
    }
}

/// Exactly one of `url` (https, no user, query or fragment) and
/// `service` (name, namespace, a path starting with `/`, a port).
pub(crate) fn client_config(cc: &Value, path: &str, c: &mut Vec<Cause>) {
    match (cc.get("url").and_then(Value::as_str), cc.get("service")) {
        (Some(_), Some(s)) if !s.is_null() => c.push(Cause::required_because(
            path,
            "exactly one of url or service is required",
        )),
        (None, None) | (None, Some(Value::Null)) => c.push(Cause::required_because(
            path,
            "exactly one of url or service is required",
        )),
        (Some(url), _) => webhook_url(url, &format!("{path}.url"), c),
        (None, Some(svc)) => {
            let path = format!("{path}.service");
            for k in ["name", "namespace"] {
                if svc[k].as_str().is_none_or(str::is_empty) {
                    c.push(Cause::required(format!("{path}.{k}")));
                }
            }
            if let Some(p) = svc["path"].as_str() {
                if !p.starts_with('/') {
                    c.push(Cause::invalid(
                        format!("{path}.path"),
                        p,
                        "must start with a '/'",
                    ));
                }
            }
            if let Some(port) = svc["port"].as_i64() {
                if !(1..=65535).contains(&port) {
                    c.push(Cause::invalid_json(
                        format!("{path}.port"),
                        &json!(port),
                        "port is not valid: must be between 1 and 65535, inclusive",
                    ));
                }
            }
        }
    }
}

fn webhook_url(url: &str, path: &str, c: &mut Vec<Cause>) {
    let Ok(uri) = url.parse::<http::Uri>() else {
        c.push(Cause::invalid(path, url, "must be a valid URL"));
        return;
    };
    if uri.scheme_str() != Some("https") {
        c.push(Cause::invalid(
            path,
            url,
            "'https' is the only allowed URL scheme",
        ));
    }
    if uri.host().is_none_or(str::is_empty) {
        c.push(Cause::invalid(path, url, "host must be specified"));
    }
    if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
        c.push(Cause::invalid(
            path,
            url,
            "user information is not permitted in the URL",
        ));
    }
    if url.contains('#') {
        c.push(Cause::invalid(
            path,
            url,
            "fragments are not permitted in the URL",
        ));
    }
    if uri.query().is_some() {
        c.push(Cause::invalid(
            path,
            url,
            "query parameters are not permitted in the URL",
        ));
    }
}

/// `matchConditions`: unique qualified names, expressions that compile
/// for `vars`.
pub(crate) fn match_conditions(list: &Value, path: &str, vars: &[&str], c: &mut Vec<Cause>) {
    let conds = list.as_array().map_or(&[][..], Vec::as_slice);
    if conds.len() > MAX_MATCH_CONDITIONS {
        c.push(Cause::too_many(
            format!("{path}.matchConditions"),
            conds.len(),
            MAX_MATCH_CONDITIONS,
        ));
    }
    let mut names = std::collections::HashSet::new();
    for (i, cond) in conds.iter().enumerate() {
        let path = format!("{path}.matchConditions[{i}]");
        let name = cond["name"].as_str().unwrap_or_default();
        if name.is_empty() {
            c.push(Cause::required(format!("{path}.name")));
        } else if !names.insert(name) {
            c.push(Cause::duplicate(format!("{path}.name"), name));
        } else if !is_qualified_name(name) {
            c.push(Cause::invalid(
                format!("{path}.name"),
                name,
                "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
            ));
        }
        match cond["expression"].as_str().map(str::trim) {
            None | Some("") => c.push(Cause::required(format!("{path}.expression"))),
            Some(e) => {
                if let Err(err) = expression::compile(e, vars) {
                    c.push(Cause::invalid(
                        format!("{path}.expression"),
                        e,
                        &format!("compilation failed: {err}"),
                    ));
                }
            }
        }
    }
}
