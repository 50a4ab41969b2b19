//! Node selection as upstream's `component-helpers/.../nodeaffinity`
//! does it: a `NodeSelector`'s terms are ORed, the requirements of one
//! term (its `matchExpressions` on labels and its `matchFields` on
//! `metadata.name`) ANDed; a pod's `spec.nodeSelector` and required node
//! affinity must both hold (`GetRequiredNodeAffinity(pod).Match(node)`,
//! which the scheduler's NodeAffinity filter and the DaemonSet
//! controller both call).
//!
//! Hand-written rather than kube-core's `Selector`: node selectors have
//! the Gt and Lt operators and field requirements, which it has not.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PodSpec,
};

use crate::selector;

/// The only field a node selector term can match on.
pub const FIELD_NAME: &str = "metadata.name";

/// Whether the node with `labels` and `name` satisfies `ns`: some term
/// matches. An empty list of terms matches nothing.
pub fn selector_matches(
    ns: &NodeSelector,
    labels: Option<&BTreeMap<String, String>>,
    name: &str,
) -> bool {
    ns.node_selector_terms
        .iter()
        .any(|t| term_matches(t, labels, name))
}

/// One term: every expression and every field requirement holds. A term
/// with neither matches nothing, and so does a term with an invalid
/// requirement (upstream drops terms that do not parse).
pub fn term_matches(
    term: &NodeSelectorTerm,
    labels: Option<&BTreeMap<String, String>>,
    name: &str,
) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    exprs
        .iter()
        .all(|r| expression_matches(r, labels.and_then(|l| l.get(&r.key)).map(String::as_str)))
        && fields.iter().all(|r| field_matches(r, name))
}

/// One `matchExpressions` requirement against the value of its label
/// (`None`: the node does not have it), as upstream's
/// `labels.Requirement`: In/NotIn need values, Exists/DoesNotExist take
/// none, Gt/Lt take exactly one integer and compare it with the label
/// read as an integer (a label that is not one never matches).
pub fn expression_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let int_cmp = |want: std::cmp::Ordering| {
        let (Some(v), [bound]) = (value, values) else {
            return false;
        };
        match (v.parse::<i64>(), bound.parse::<i64>()) {
            (Ok(v), Ok(b)) => v.cmp(&b) == want,
            _ => false,
        }
    };
    match r.operator.as_str() {
        "In" => !values.is_empty() && value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => !values.is_empty() && value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => values.is_empty() && value.is_some(),
        "DoesNotExist" => values.is_empty() && value.is_none(),
        "Gt" => int_cmp(std::cmp::Ordering::Greater),
        "Lt" => int_cmp(std::cmp::Ordering::Less),
        _ => false,
    }
}

/// One `matchFields` requirement against a node named `name`, as
/// upstream's field selector: only In and NotIn, each with exactly one
/// value; the node's only field is `metadata.name`, and any other field
/// reads as empty (validation refuses other keys on stored objects).
pub fn field_matches(r: &NodeSelectorRequirement, name: &str) -> bool {
    let field = if r.key == FIELD_NAME { name } else { "" };
    match (r.operator.as_str(), r.values.as_deref().unwrap_or_default()) {
        ("In", [v]) => field == v,
        ("NotIn", [v]) => field != v,
        _ => false,
    }
}

/// Whether a node with `labels` and `name` satisfies the pod's
/// `spec.nodeSelector` and its required node affinity. For callers that
/// keep a node's facts rather than the Node (the scheduler's cache).
pub fn pod_matches(spec: &PodSpec, labels: Option<&BTreeMap<String, String>>, name: &str) -> bool {
    if let Some(sel) = &spec.node_selector {
        if !selector::map_matches(sel, labels) {
            return false;
        }
    }
    match required(spec) {
        Some(ns) => selector_matches(ns, labels, name),
        None => true,
    }
}

/// [`pod_matches`] against a Node.
pub fn pod_matches_node(spec: &PodSpec, node: &Node) -> bool {
    pod_matches(
        spec,
        node.metadata.labels.as_ref(),
        node.metadata.name.as_deref().unwrap_or_default(),
    )
}

/// The pod's required node affinity, if it has one.
pub fn required(spec: &PodSpec) -> Option<&NodeSelector> {
    spec.affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn node(name: &str, labels: Value) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
    }

    fn spec(v: Value) -> PodSpec {
        let mut v = v;
        v["containers"] = json!([]);
        serde_json::from_value(v).unwrap()
    }

    fn affinity(terms: Value) -> PodSpec {
        spec(json!({"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}}))
    }

    fn expr(key: &str, op: &str, values: Value) -> PodSpec {
        affinity(json!([{"matchExpressions": [{"key": key, "operator": op, "values": values}]}]))
    }

    fn field(key: &str, op: &str, values: Value) -> PodSpec {
        affinity(json!([{"matchFields": [{"key": key, "operator": op, "values": values}]}]))
    }

    #[test]
    fn expressions() {
        let n = node("n1", json!({"disk": "ssd", "cores": "8"}));
        let cases = [
            (expr("disk", "In", json!(["ssd", "nvme"])), true),
            (expr("disk", "In", json!(["hdd"])), false),
            (expr("disk", "NotIn", json!(["hdd"])), true),
            (expr("missing", "NotIn", json!(["x"])), true),
            (expr("disk", "NotIn", json!(["ssd"])), false),
            (expr("disk", "Exists", json!(null)), true),
            (expr("missing", "Exists", json!(null)), false),
            (expr("missing", "DoesNotExist", json!(null)), true),
            (expr("disk", "DoesNotExist", json!(null)), false),
            (expr("cores", "Gt", json!(["4"])), true),
            (expr("cores", "Gt", json!(["8"])), false),
            (expr("cores", "Lt", json!(["16"])), true),
            (expr("cores", "Lt", json!(["8"])), false),
            (expr("cores", "Gt", json!(["+7"])), true),
            // Not integers, or not exactly one bound: no match.
            (expr("disk", "Gt", json!(["1"])), false),
            (expr("cores", "Gt", json!(["x"])), false),
            (expr("cores", "Gt", json!(["1", "2"])), false),
            (expr("missing", "Lt", json!(["1"])), false),
            // Invalid requirements: the term is dropped.
            (expr("disk", "In", json!([])), false),
            (expr("missing", "NotIn", json!([])), false),
            (expr("disk", "Exists", json!(["ssd"])), false),
            (expr("disk", "Bogus", json!(["ssd"])), false),
        ];
        for (i, (s, want)) in cases.iter().enumerate() {
            assert_eq!(pod_matches_node(s, &n), *want, "case {i}");
        }
    }

    /// The scheduler's and the DaemonSet controller's copies disagreed
    /// here: one took any operator on metadata.name, the other only In /
    /// NotIn and any number of values. Upstream: In / NotIn with one value.
    #[test]
    fn match_fields_as_upstream() {
        let n = node("n1", json!({}));
        let cases = [
            (field("metadata.name", "In", json!(["n1"])), true),
            (field("metadata.name", "In", json!(["n2"])), false),
            (field("metadata.name", "NotIn", json!(["n1"])), false),
            (field("metadata.name", "NotIn", json!(["n2"])), true),
            // Only In / NotIn with exactly one value.
            (field("metadata.name", "Exists", json!(null)), false),
            (field("metadata.name", "DoesNotExist", json!(null)), false),
            (field("metadata.name", "In", json!(["n1", "n2"])), false),
            (field("metadata.name", "In", json!([])), false),
            (field("metadata.name", "Gt", json!(["1"])), false),
            // Other fields read as empty.
            (field("metadata.uid", "In", json!(["n1"])), false),
            (field("metadata.uid", "NotIn", json!(["n1"])), true),
        ];
        for (i, (s, want)) in cases.iter().enumerate() {
            assert_eq!(pod_matches_node(s, &n), *want, "case {i}");
        }
        // Fields and expressions in one term are ANDed.
        let both = affinity(json!([{
            "matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}],
            "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]));
        assert!(pod_matches_node(&both, &n));
        assert!(!pod_matches_node(&both, &node("n1", json!({"zone": "a"}))));
        assert!(!pod_matches_node(&both, &node("n2", json!({}))));
    }

    #[test]
    fn terms_are_ored_and_empty_terms_match_nothing() {
        let n = node("n1", json!({"disk": "ssd", "cores": "8"}));
        let ored = affinity(json!([
            {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["hdd"]}]},
            {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}]));
        assert!(pod_matches_node(&ored, &n));
        let anded = affinity(json!([{"matchExpressions": [
            {"key": "disk", "operator": "In", "values": ["ssd"]},
            {"key": "cores", "operator": "In", "values": ["4"]}]}]));
        assert!(!pod_matches_node(&anded, &n));
        assert!(!pod_matches_node(&affinity(json!([{}])), &n));
        assert!(!pod_matches_node(&affinity(json!([])), &n));
        // An invalid term does not spoil a valid one.
        let mixed = affinity(json!([
            {"matchExpressions": [{"key": "disk", "operator": "Exists", "values": ["x"]}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]));
        assert!(pod_matches_node(&mixed, &n));
    }

    #[test]
    fn node_selector_map_and_affinity_both_hold() {
        let n = node("n1", json!({"disk": "ssd"}));
        assert!(pod_matches_node(&spec(json!({})), &n));
        assert!(pod_matches_node(
            &spec(json!({"nodeSelector": {"disk": "ssd"}})),
            &n
        ));
        assert!(!pod_matches_node(
            &spec(json!({"nodeSelector": {"disk": "hdd"}})),
            &n
        ));
        let mut both = field("metadata.name", "In", json!(["n1"]));
        assert!(pod_matches_node(&both, &n));
        both.node_selector = Some([("disk".to_string(), "hdd".to_string())].into());
        assert!(!pod_matches_node(&both, &n));
        // A node known by name only (no labels) still matches by name.
        let by_name = field("metadata.name", "In", json!(["n1"]));
        assert!(pod_matches(&by_name, None, "n1"));
        assert!(!pod_matches(
            &spec(json!({"nodeSelector": {"a": "b"}})),
            None,
            "n1"
        ));
    }
}
