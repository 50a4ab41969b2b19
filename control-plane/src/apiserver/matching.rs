//! Which requests an admission rule applies to, shared by webhooks and
//! policies (upstream's `admission/plugin/webhook/predicates` and the
//! match constraints of policies): operations, groups, versions,
//! resources with subresources, resource names, scope, and the
//! namespace and object selectors.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::Value;

/// What a request is, as admission sees it.
pub struct Attributes<'a> {
    pub operation: &'a str,
    pub group: &'a str,
    pub version: &'a str,
    pub resource: &'a str,
    pub subresource: &'a str,
    pub name: &'a str,
    pub namespaced: bool,
}

/// One rule: `rules[]` of a webhook, `resourceRules[]` of a policy.
#[derive(Debug)]
pub struct Rule {
    operations: Vec<String>,
    groups: Vec<String>,
    versions: Vec<String>,
    resources: Vec<String>,
    /// Empty: any name.
    names: Vec<String>,
    scope: String,
}

/// The strings of a JSON list (others skipped).
pub fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(String::from)
        .collect()
}

fn any_or(list: &[String], v: &str) -> bool {
    list.iter().any(|x| x == "*" || x == v)
}

impl Rule {
    pub fn from_json(r: &Value) -> Rule {
        Rule {
            operations: strings(&r["operations"]),
            groups: strings(&r["apiGroups"]),
            versions: strings(&r["apiVersions"]),
            resources: strings(&r["resources"]),
            names: strings(&r["resourceNames"]),
            scope: r["scope"].as_str().unwrap_or("*").to_string(),
        }
    }

    pub fn matches(&self, a: &Attributes, any_version: bool) -> bool {
        any_or(&self.operations, a.operation)
            && any_or(&self.groups, a.group)
            && (any_version || any_or(&self.versions, a.version))
            && self.resources.iter().any(|r| resource_matches(r, a))
            && (self.names.is_empty() || self.names.iter().any(|n| n == a.name))
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

/// Rules, exclusions, selectors and match policy together (a webhook's,
/// a policy's `matchConstraints`, a binding's `matchResources`).
#[derive(Debug, Default)]
pub struct Constraints {
    rules: Vec<Rule>,
    exclude: Vec<Rule>,
    equivalent: bool,
    /// No rules means every request (a binding's `matchResources`).
    all_without_rules: bool,
    namespace_selector: LabelSelector,
    object_selector: LabelSelector,
}

impl Constraints {
    /// From an object holding `rules_key` (`rules`, `resourceRules`),
    /// `excludeResourceRules`, `matchPolicy` and the two selectors. None
    /// for a selector that cannot be read (validation refuses those).
    pub fn from_json(v: &Value, rules_key: &str) -> Option<Constraints> {
        let selector = |k: &str| -> Option<LabelSelector> {
            match v.get(k) {
                None | Some(Value::Null) => Some(LabelSelector::default()),
                Some(s) => serde_json::from_value(s.clone()).ok(),
            }
        };
        let rules = |k: &str| -> Vec<Rule> {
            v[k].as_array()
                .into_iter()
                .flatten()
                .map(Rule::from_json)
                .collect()
        };
        Some(Constraints {
            rules: rules(rules_key),
            exclude: rules("excludeResourceRules"),
            equivalent: v["matchPolicy"].as_str() != Some("Exact"),
            all_without_rules: false,
            namespace_selector: selector("namespaceSelector")?,
            object_selector: selector("objectSelector")?,
        })
    }

    /// These constraints with no rules matching every request (a
    /// binding's `matchResources` that only selects).
    pub fn or_all(self) -> Self {
        Constraints {
            all_without_rules: true,
            ..self
        }
    }

    /// The version the request is seen in: the request's when a rule
    /// names it, else (matchPolicy Equivalent) the first version a rule
    /// of the same group and resource names. None: no rule matches, or
    /// an exclusion does.
    pub fn matched_version(&self, a: &Attributes) -> Option<String> {
        if self.exclude.iter().any(|r| r.matches(a, false)) {
            return None;
        }
        if self.rules.is_empty() && self.all_without_rules {
            return Some(a.version.to_string());
        }
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
}

pub fn is_empty(sel: &LabelSelector) -> bool {
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
            name: "web",
            namespaced: true,
        }
    }

    fn constraints(rules: Value, policy: &str) -> Constraints {
        Constraints::from_json(&json!({"rules": rules, "matchPolicy": policy}), "rules").unwrap()
    }

    #[test]
    fn rules_match_operations_resources_and_subresources() {
        let c = constraints(
            json!([{"operations": ["CREATE"], "apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["deployments", "*/scale"]}]),
            "Exact",
        );
        assert!(c
            .matched_version(&attrs("CREATE", "v1", "deployments", ""))
            .is_some());
        assert!(c
            .matched_version(&attrs("CREATE", "v1", "replicasets", "scale"))
            .is_some());
        assert!(c
            .matched_version(&attrs("CREATE", "v1", "deployments", "status"))
            .is_none());
        assert!(c
            .matched_version(&attrs("UPDATE", "v1", "deployments", ""))
            .is_none());
        assert!(c
            .matched_version(&attrs("CREATE", "v2", "deployments", ""))
            .is_none());
        let all = constraints(
            json!([{"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*/*"]}]),
            "Exact",
        );
        assert!(all
            .matched_version(&attrs("DELETE", "v1", "pods", "status"))
            .is_some());
        let main = constraints(
            json!([{"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"]}]),
            "Exact",
        );
        assert!(main
            .matched_version(&attrs("DELETE", "v1", "pods", "status"))
            .is_none());
        let named = constraints(
            json!([{"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"], "resourceNames": ["other"]}]),
            "Exact",
        );
        assert!(named
            .matched_version(&attrs("DELETE", "v1", "pods", ""))
            .is_none());
    }

    #[test]
    fn exclusions_win() {
        let c = Constraints::from_json(&json!({
            "resourceRules": [{"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"]}],
            "excludeResourceRules": [{"operations": ["*"], "apiGroups": ["apps"], "apiVersions": ["*"], "resources": ["deployments"], "resourceNames": ["web"]}]
        }), "resourceRules").unwrap();
        assert!(c
            .matched_version(&attrs("CREATE", "v1", "deployments", ""))
            .is_none());
        assert!(c
            .matched_version(&attrs("CREATE", "v1", "replicasets", ""))
            .is_some());
    }

    #[test]
    fn equivalent_policy_matches_other_versions_in_the_rules_version() {
        let rules = json!([{"operations": ["CREATE"], "apiGroups": ["apps"], "apiVersions": ["v1beta1"], "resources": ["deployments"]}]);
        assert_eq!(
            constraints(rules.clone(), "Equivalent")
                .matched_version(&attrs("CREATE", "v1", "deployments", ""))
                .as_deref(),
            Some("v1beta1")
        );
        assert!(constraints(rules, "Exact")
            .matched_version(&attrs("CREATE", "v1", "deployments", ""))
            .is_none());
    }

    #[test]
    fn object_selector_takes_the_old_or_the_new_labels() {
        let c = Constraints::from_json(
            &json!({"objectSelector": {"matchLabels": {"x": "1"}}}),
            "rules",
        )
        .unwrap();
        let with = json!({"metadata": {"labels": {"x": "1"}}});
        let without = json!({"metadata": {}});
        assert!(c.object_matches(Some(&without), Some(&with)));
        assert!(!c.object_matches(Some(&without), None));
    }
}
