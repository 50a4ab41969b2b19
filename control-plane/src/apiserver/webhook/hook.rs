//! One webhook of a configuration, read once when the configuration
//! changes: its rules, selectors, compiled match conditions, where to
//! call it and how to trust it (upstream's `webhook.Accessor` and
//! `generic.Matcher`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use cel::{Program, Value as Cel};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::Value;

use super::call::Client;
use crate::apiserver::cel::expression;
use crate::apiserver::strategy::webhookconfig::MATCH_VARIABLES;

/// What a request is, as admission sees it.
pub struct Attributes<'a> {
    pub operation: &'a str,
    pub group: &'a str,
    pub version: &'a str,
    pub resource: &'a str,
    pub subresource: &'a str,
    pub namespaced: bool,
}

/// One rule of `rules`.
#[derive(Debug)]
struct Rule {
    operations: Vec<String>,
    groups: Vec<String>,
    versions: Vec<String>,
    resources: Vec<String>,
    scope: String,
}

fn any_or(list: &[String], v: &str) -> bool {
    list.iter().any(|x| x == "*" || x == v)
}

impl Rule {
    fn matches(&self, a: &Attributes, any_version: bool) -> bool {
        any_or(&self.operations, a.operation)
            && any_or(&self.groups, a.group)
            && (any_version || any_or(&self.versions, a.version))
            && self.resources.iter().any(|r| resource_matches(r, a))
            && match self.scope.as_str() {
                "Cluster" => !a.namespaced,
                "Namespaced" => a.namespaced,
                _ => true,
            }
    }
}

/// `pods`, `pods/status`, `pods/*`, `*`, `*/status`, `*/*`.
fn resource_matches(rule: &str, a: &Attributes) -> bool {
    let (res, sub) = rule.split_once('/').unwrap_or((rule, ""));
    (res == "*" || res == a.resource) && (sub == "*" || sub == a.subresource)
}

/// Where the webhook is called.
#[derive(Debug, Clone)]
pub enum Target {
    Url(String),
    Service {
        namespace: String,
        name: String,
        path: String,
        port: u16,
    },
}

/// A webhook, ready to match and call.
pub struct Hook {
    /// The configuration it belongs to.
    pub config: String,
    pub name: String,
    pub mutating: bool,
    rules: Vec<Rule>,
    equivalent: bool,
    pub ignore_failures: bool,
    namespace_selector: LabelSelector,
    object_selector: LabelSelector,
    conditions: Vec<(String, Arc<Program>)>,
    pub timeout: Duration,
    pub reinvoke: bool,
    pub target: Target,
    pub client: Client,
}

impl Hook {
    /// The webhook `spec` of configuration `config`; None for one its
    /// configuration's validation would have refused.
    pub fn new(config: &str, spec: &Value, mutating: bool) -> Option<Hook> {
        let strings = |v: &Value| -> Vec<String> {
            v.as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        };
        let rules = spec["rules"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| Rule {
                operations: strings(&r["operations"]),
                groups: strings(&r["apiGroups"]),
                versions: strings(&r["apiVersions"]),
                resources: strings(&r["resources"]),
                scope: r["scope"].as_str().unwrap_or("*").to_string(),
            })
            .collect();
        let selector = |k: &str| -> Option<LabelSelector> {
            match spec.get(k) {
                None | Some(Value::Null) => Some(LabelSelector::default()),
                Some(v) => serde_json::from_value(v.clone()).ok(),
            }
        };
        let conditions = spec["matchConditions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                let source = c["expression"].as_str()?;
                let p = expression::compile(source, &MATCH_VARIABLES).ok()?;
                Some((c["name"].as_str()?.to_string(), p))
            })
            .collect::<Option<Vec<_>>>()?;
        let cc = &spec["clientConfig"];
        let target = match cc["url"].as_str() {
            Some(url) => Target::Url(url.to_string()),
            None => Target::Service {
                namespace: cc["service"]["namespace"].as_str()?.to_string(),
                name: cc["service"]["name"].as_str()?.to_string(),
                path: cc["service"]["path"].as_str().unwrap_or("/").to_string(),
                port: u16::try_from(cc["service"]["port"].as_u64().unwrap_or(443)).ok()?,
            },
        };
        let ca = cc["caBundle"]
            .as_str()
            .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
            .unwrap_or_default();
        let timeout = spec["timeoutSeconds"].as_u64().unwrap_or(10).clamp(1, 30);
        Some(Hook {
            config: config.to_string(),
            name: spec["name"].as_str()?.to_string(),
            mutating,
            rules,
            equivalent: spec["matchPolicy"].as_str() != Some("Exact"),
            ignore_failures: spec["failurePolicy"].as_str() == Some("Ignore"),
            namespace_selector: selector("namespaceSelector")?,
            object_selector: selector("objectSelector")?,
            conditions,
            timeout: Duration::from_secs(timeout),
            reinvoke: spec["reinvocationPolicy"].as_str() == Some("IfNeeded"),
            target,
            client: Client::new(&ca),
        })
    }

    /// The version the webhook is asked in: the request's when a rule
    /// names it, else (matchPolicy Equivalent) the first version a rule
    /// of the same group and resource names. None: the rules do not
    /// match.
    pub fn matched_version(&self, a: &Attributes) -> Option<String> {
        if self.rules.iter().any(|r| r.matches(a, false)) {
            return Some(a.version.to_string());
        }
        if !self.equivalent {
            return None;
        }
        self.rules
            .iter()
            .find(|r| r.matches(a, true))
            .and_then(|r| r.versions.first().cloned())
    }

    pub fn wants_namespace(&self) -> bool {
        !is_empty(&self.namespace_selector)
    }

    /// The namespace selector against the namespace's labels.
    pub fn namespace_matches(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        kube_util::selector::matches(&self.namespace_selector, labels)
    }

    /// The object selector against the new or the old object's labels
    /// (either will do, as upstream).
    pub fn object_matches(&self, new: Option<&Value>, old: Option<&Value>) -> bool {
        if is_empty(&self.object_selector) {
            return true;
        }
        [new, old].into_iter().flatten().any(|o| {
            let labels = labels_of(o);
            kube_util::selector::matches(&self.object_selector, Some(&labels))
        })
    }

    /// Whether every match condition holds; the name of the condition
    /// and the error of one that cannot be evaluated.
    pub fn conditions_hold(
        &self,
        vars: &[(&str, &Value)],
        budget: &mut f64,
    ) -> Result<bool, (String, String)> {
        for (name, p) in &self.conditions {
            match expression::evaluate(p, vars, budget) {
                Ok(Cel::Bool(true)) => {}
                Ok(Cel::Bool(false)) => return Ok(false),
                Ok(other) => {
                    return Err((
                        name.clone(),
                        format!(
                            "expression must evaluate to a bool, not {}",
                            other.type_of()
                        ),
                    ))
                }
                Err(e) => return Err((name.clone(), e)),
            }
        }
        Ok(true)
    }
}

fn is_empty(sel: &LabelSelector) -> bool {
    sel.match_labels.as_ref().is_none_or(BTreeMap::is_empty)
        && sel.match_expressions.as_ref().is_none_or(Vec::is_empty)
}

pub fn labels_of(obj: &Value) -> BTreeMap<String, String> {
    obj["metadata"]["labels"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn attrs<'a>(op: &'a str, version: &'a str, resource: &'a str, sub: &'a str) -> Attributes<'a> {
        Attributes {
            operation: op,
            group: "apps",
            version,
            resource,
            subresource: sub,
            namespaced: true,
        }
    }

    fn hook(rules: Value, policy: &str) -> Hook {
        let spec = json!({"name": "a.b.c", "rules": rules, "matchPolicy": policy,
            "clientConfig": {"url": "https://127.0.0.1:1/x"}});
        Hook::new("cfg", &spec, false).unwrap()
    }

    #[test]
    fn rules_match_operations_resources_and_subresources() {
        let h = hook(
            json!([{"operations": ["CREATE"], "apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["deployments", "*/scale"]}]),
            "Exact",
        );
        assert!(h
            .matched_version(&attrs("CREATE", "v1", "deployments", ""))
            .is_some());
        assert!(h
            .matched_version(&attrs("CREATE", "v1", "replicasets", "scale"))
            .is_some());
        assert!(h
            .matched_version(&attrs("CREATE", "v1", "deployments", "status"))
            .is_none());
        assert!(h
            .matched_version(&attrs("UPDATE", "v1", "deployments", ""))
            .is_none());
        assert!(h
            .matched_version(&attrs("CREATE", "v2", "deployments", ""))
            .is_none());
        let all = hook(
            json!([{"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*/*"]}]),
            "Exact",
        );
        assert!(all
            .matched_version(&attrs("DELETE", "v1", "pods", "status"))
            .is_some());
        let main = hook(
            json!([{"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"]}]),
            "Exact",
        );
        assert!(main
            .matched_version(&attrs("DELETE", "v1", "pods", "status"))
            .is_none());
    }

    #[test]
    fn equivalent_policy_matches_other_versions_in_the_rules_version() {
        let rules = json!([{"operations": ["CREATE"], "apiGroups": ["apps"], "apiVersions": ["v1beta1"], "resources": ["deployments"]}]);
        assert_eq!(
            hook(rules.clone(), "Equivalent")
                .matched_version(&attrs("CREATE", "v1", "deployments", ""))
                .as_deref(),
            Some("v1beta1")
        );
        assert!(hook(rules, "Exact")
            .matched_version(&attrs("CREATE", "v1", "deployments", ""))
            .is_none());
    }

    #[test]
    fn object_selector_takes_the_old_or_the_new_labels() {
        let spec = json!({"name": "a.b.c", "objectSelector": {"matchLabels": {"x": "1"}},
            "clientConfig": {"url": "https://127.0.0.1:1/x"}});
        let h = Hook::new("cfg", &spec, false).unwrap();
        let with = json!({"metadata": {"labels": {"x": "1"}}});
        let without = json!({"metadata": {}});
        assert!(h.object_matches(Some(&without), Some(&with)));
        assert!(!h.object_matches(Some(&without), None));
    }
}
