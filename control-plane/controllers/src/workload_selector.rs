//! Matching as the API defines it: label selectors against labels, a pod's
//! node selector and required node affinity against a node, and taints
//! against tolerations (upstream `labels.Selector`,
//! `nodeaffinity.GetRequiredNodeAffinity`, `Toleration.ToleratesTaint`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node, NodeSelectorRequirement, NodeSelectorTerm, PodSpec, Taint, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Whether `labels` match `sel`. An empty selector matches everything (a
/// missing one, nothing: callers handle `None`).
pub fn matches(sel: &LabelSelector, labels: Option<&BTreeMap<String, String>>) -> bool {
    let empty = BTreeMap::new();
    let labels = labels.unwrap_or(&empty);
    let by_labels = sel
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    by_labels
        && sel.match_expressions.iter().flatten().all(|e| {
            let have = labels.get(&e.key);
            let values = e.values.as_deref().unwrap_or_default();
            match e.operator.as_str() {
                "In" => have.is_some_and(|h| values.contains(h)),
                "NotIn" => have.is_none_or(|h| !values.contains(h)),
                "Exists" => have.is_some(),
                "DoesNotExist" => have.is_none(),
                // Validation rejects other operators; match nothing.
                _ => false,
            }
        })
}

/// Whether a selector selects nothing at all or everything: upstream
/// refuses to act on such a controller.
pub fn is_empty(sel: &LabelSelector) -> bool {
    sel.match_labels.as_ref().is_none_or(|m| m.is_empty())
        && sel.match_expressions.as_ref().is_none_or(|e| e.is_empty())
}

/// Whether `node` satisfies the pod's `nodeSelector` and required node
/// affinity (terms ORed; requirements within a term ANDed).
pub fn node_matches(spec: &PodSpec, node: &Node) -> bool {
    let empty = BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    if let Some(sel) = &spec.node_selector {
        if !sel.iter().all(|(k, v)| labels.get(k) == Some(v)) {
            return false;
        }
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|na| {
            na.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    match required {
        None => true,
        Some(ns) => ns.node_selector_terms.iter().any(|t| term_matches(t, node)),
    }
}

fn term_matches(term: &NodeSelectorTerm, node: &Node) -> bool {
    let empty = BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    // An empty term matches no objects (upstream nodeaffinity).
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    let mut node_fields = BTreeMap::new();
    if let Some(n) = &node.metadata.name {
        node_fields.insert("metadata.name".to_string(), n.clone());
    }
    exprs.iter().all(|r| requirement_matches(r, labels))
        && fields.iter().all(|r| requirement_matches(r, &node_fields))
}

fn requirement_matches(r: &NodeSelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    let have = labels.get(&r.key);
    let values = r.values.as_deref().unwrap_or_default();
    match r.operator.as_str() {
        "In" => have.is_some_and(|h| values.contains(h)),
        "NotIn" => have.is_none_or(|h| !values.contains(h)),
        "Exists" => have.is_some(),
        "DoesNotExist" => have.is_none(),
        "Gt" | "Lt" => {
            let (Some(h), Some(v)) = (
                have.and_then(|h| h.parse::<i64>().ok()),
                values.first().and_then(|v| v.parse::<i64>().ok()),
            ) else {
                return false;
            };
            if r.operator == "Gt" {
                h > v
            } else {
                h < v
            }
        }
        _ => false,
    }
}

/// Whether `t` tolerates `taint` (an empty key with `Exists` tolerates
/// every taint; an empty effect, every effect).
pub fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    if t.effect
        .as_deref()
        .is_some_and(|e| !e.is_empty() && e != taint.effect)
    {
        return false;
    }
    if t.key
        .as_deref()
        .is_some_and(|k| !k.is_empty() && k != taint.key)
    {
        return false;
    }
    match t.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" | "" => {
            t.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default()
        }
        _ => false,
    }
}

/// The first taint among those `relevant` that no toleration tolerates.
pub fn untolerated<'a>(
    taints: &'a [Taint],
    tolerations: &[Toleration],
    relevant: impl Fn(&Taint) -> bool,
) -> Option<&'a Taint> {
    taints
        .iter()
        .filter(|t| relevant(t))
        .find(|taint| !tolerations.iter().any(|t| tolerates(t, taint)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Affinity, NodeAffinity, NodeSelector};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelectorRequirement, ObjectMeta};

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn label_selectors() {
        let sel = LabelSelector {
            match_labels: Some(labels(&[("app", "web")])),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "tier".into(),
                operator: "NotIn".into(),
                values: Some(vec!["db".into()]),
            }]),
        };
        assert!(matches(&sel, Some(&labels(&[("app", "web")]))));
        assert!(matches(
            &sel,
            Some(&labels(&[("app", "web"), ("tier", "fe")]))
        ));
        assert!(!matches(
            &sel,
            Some(&labels(&[("app", "web"), ("tier", "db")]))
        ));
        assert!(!matches(&sel, None));
        assert!(matches(&LabelSelector::default(), None));
    }

    #[test]
    fn node_affinity_and_selector() {
        let node = Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                labels: Some(labels(&[("disk", "ssd"), ("cores", "8")])),
                ..Default::default()
            },
            ..Default::default()
        };
        let req = |key: &str, op: &str, v: &[&str]| NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: Some(v.iter().map(|s| s.to_string()).collect()),
        };
        let spec = |terms: Vec<NodeSelectorTerm>| PodSpec {
            affinity: Some(Affinity {
                node_affinity: Some(NodeAffinity {
                    required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                        node_selector_terms: terms,
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let by_name = NodeSelectorTerm {
            match_fields: Some(vec![req("metadata.name", "In", &["n1"])]),
            ..Default::default()
        };
        assert!(node_matches(&spec(vec![by_name]), &node));
        let other = NodeSelectorTerm {
            match_fields: Some(vec![req("metadata.name", "In", &["n2"])]),
            ..Default::default()
        };
        assert!(!node_matches(&spec(vec![other.clone()]), &node));
        let gt = NodeSelectorTerm {
            match_expressions: Some(vec![req("cores", "Gt", &["4"])]),
            ..Default::default()
        };
        assert!(node_matches(&spec(vec![other, gt]), &node));
        let s = PodSpec {
            node_selector: Some(labels(&[("disk", "hdd")])),
            ..Default::default()
        };
        assert!(!node_matches(&s, &node));
    }

    #[test]
    fn taints_and_tolerations() {
        let taint = Taint {
            key: "node.kubernetes.io/not-ready".into(),
            effect: "NoExecute".into(),
            ..Default::default()
        };
        let exists = Toleration {
            key: Some("node.kubernetes.io/not-ready".into()),
            operator: Some("Exists".into()),
            ..Default::default()
        };
        assert!(tolerates(&exists, &taint));
        let wrong_effect = Toleration {
            effect: Some("NoSchedule".into()),
            ..exists.clone()
        };
        assert!(!tolerates(&wrong_effect, &taint));
        let all = Toleration {
            operator: Some("Exists".into()),
            ..Default::default()
        };
        assert!(tolerates(&all, &taint));
        let taints = [taint];
        assert!(untolerated(&taints, &[], |_| true).is_some());
        assert!(untolerated(&taints, &[], |t| t.effect == "NoSchedule").is_none());
        assert!(untolerated(&taints, &[exists], |_| true).is_none());
    }
}
