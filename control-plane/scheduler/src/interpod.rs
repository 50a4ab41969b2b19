//! InterPodAffinity's filter (upstream `plugins/interpodaffinity`): a
//! pod's required pod affinity and anti-affinity terms, and the symmetry
//! of the required anti-affinity of the pods already placed.
//!
//! As upstream's PreFilter, [`State::prefilter`] counts once per attempt
//! the matching pods per topology pair (key, value); the per-node check
//! is then a few map lookups, not a scan of every pod for every node.
//! The counting itself matches each group of pods sharing namespace and
//! labels (or anti-affinity terms) once, from the cache's groups, rather
//! than each pod: the pods of one owner are one group.
//! Pods without these fields, in a cluster without pods with required
//! anti-affinity, get no state at all.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{Pod, PodAffinityTerm};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube_util::selector;

use crate::cache::Cache;
use crate::nodeinfo::NodeInfo;
use crate::podinfo::PodInfo;

type Labels = BTreeMap<String, String>;

/// Matching pods per topology key, then value.
type Counts = HashMap<String, HashMap<String, i64>>;

/// One required term, with its selector and namespaces resolved for the
/// pod that carries it.
#[derive(Debug, Clone, PartialEq)]
pub struct Term {
    /// `None` matches no pod (upstream: a nil selector selects nothing).
    selector: Option<LabelSelector>,
    /// `namespaces`, or the pod's own namespace when the term names none
    /// and has no namespaceSelector.
    namespaces: Vec<String>,
    /// `namespaceSelector: {}`: every namespace. Other namespace
    /// selectors are refused by the API server (no namespace watch here),
    /// and match no namespace.
    all_namespaces: bool,
    pub topology_key: String,
}

impl Term {
    /// The term as the pod in `namespace` with `labels` means it:
    /// `matchLabelKeys` / `mismatchLabelKeys` become `In` / `NotIn`
    /// requirements on the pod's own values, as upstream's admission
    /// merges them into the selector.
    pub fn new(term: &PodAffinityTerm, namespace: &str, labels: Option<&Labels>) -> Term {
        let selector = term.label_selector.as_ref().map(|s| {
            let match_keys = term.match_label_keys.as_deref().unwrap_or(&[]);
            let mismatch_keys = term.mismatch_label_keys.as_deref().unwrap_or(&[]);
            with_label_keys(s, labels, match_keys, mismatch_keys)
        });
        let listed = term.namespaces.clone().unwrap_or_default();
        let (namespaces, all_namespaces) = match &term.namespace_selector {
            None if listed.is_empty() => (vec![namespace.to_string()], false),
            None => (listed, false),
            Some(s) => (listed, selector::is_empty(s)),
        };
        Term {
            selector,
            namespaces,
            all_namespaces,
            topology_key: term.topology_key.clone(),
        }
    }

    /// Whether a pod in `namespace` with `labels` is one this term means.
    pub fn matches(&self, namespace: &str, labels: Option<&Labels>) -> bool {
        (self.all_namespaces || self.namespaces.iter().any(|n| n == namespace))
            && self
                .selector
                .as_ref()
                .is_some_and(|s| selector::matches(s, labels))
    }

    pub(crate) fn matches_pod(&self, pod: &PodInfo) -> bool {
        self.matches(&pod.namespace, pod.labels())
    }
}

/// `sel` with `In` (match) and `NotIn` (mismatch) requirements on the
/// values `labels` have for `match_keys` / `mismatch_keys`; keys the pod
/// does not have add nothing (upstream's merge at admission).
pub(crate) fn with_label_keys(
    sel: &LabelSelector,
    labels: Option<&Labels>,
    match_keys: &[String],
    mismatch_keys: &[String],
) -> LabelSelector {
    let mut out = sel.clone();
    let keyed = [(match_keys, "In"), (mismatch_keys, "NotIn")];
    for (keys, operator) in keyed {
        for key in keys {
            if let Some(value) = labels.and_then(|l| l.get(key)) {
                out.match_expressions
                    .get_or_insert_with(Vec::new)
                    .push(LabelSelectorRequirement {
                        key: key.clone(),
                        operator: operator.to_string(),
                        values: Some(vec![value.clone()]),
                    });
            }
        }
    }
    out
}

/// A pod's required terms.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Terms {
    pub affinity: Vec<Term>,
    pub anti_affinity: Vec<Term>,
    /// Equal for pods whose resolved anti-affinity terms are equal (the
    /// cache groups them by it).
    pub anti_key: String,
}

impl Terms {
    /// The pod's required terms; `None` when it has none (most pods).
    pub fn of(pod: &Pod) -> Option<Box<Terms>> {
        let affinity = pod.spec.as_ref()?.affinity.as_ref()?;
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let labels = pod.metadata.labels.as_ref();
        let resolve = |terms: Option<&Vec<PodAffinityTerm>>| -> Vec<Term> {
            terms
                .into_iter()
                .flatten()
                .map(|t| Term::new(t, namespace, labels))
                .collect()
        };
        let mut terms = Terms {
            anti_key: String::new(),
            affinity: resolve(affinity.pod_affinity.as_ref().and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })),
            anti_affinity: resolve(affinity.pod_anti_affinity.as_ref().and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })),
        };
        if !terms.anti_affinity.is_empty() {
            terms.anti_key = format!("{:?}", terms.anti_affinity);
        }
        (!terms.affinity.is_empty() || !terms.anti_affinity.is_empty()).then(|| Box::new(terms))
    }
}

/// A pod's preferred (weighted) pod affinity and anti-affinity terms,
/// which only the InterPodAffinity score reads.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Preferred {
    pub affinity: Vec<(i64, Term)>,
    pub anti_affinity: Vec<(i64, Term)>,
}

impl Preferred {
    /// The pod's preferred terms; `None` when it has none (most pods).
    pub fn of(pod: &Pod) -> Option<Box<Preferred>> {
        let affinity = pod.spec.as_ref()?.affinity.as_ref()?;
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let labels = pod.metadata.labels.as_ref();
        let resolve = |terms: Option<&Vec<k8s_openapi::api::core::v1::WeightedPodAffinityTerm>>| {
            terms
                .into_iter()
                .flatten()
                .map(|t| {
                    let term = Term::new(&t.pod_affinity_term, namespace, labels);
                    (i64::from(t.weight), term)
                })
                .collect::<Vec<_>>()
        };
        let preferred = Preferred {
            affinity: resolve(affinity.pod_affinity.as_ref().and_then(|a| {
                a.preferred_during_scheduling_ignored_during_execution
                    .as_ref()
            })),
            anti_affinity: resolve(affinity.pod_anti_affinity.as_ref().and_then(|a| {
                a.preferred_during_scheduling_ignored_during_execution
                    .as_ref()
            })),
        };
        (!preferred.affinity.is_empty() || !preferred.anti_affinity.is_empty())
            .then(|| Box::new(preferred))
    }

    /// Every term with its weight, negative for anti-affinity: what the
    /// score adds per matching pod.
    pub fn signed(&self) -> impl Iterator<Item = (i64, &Term)> {
        let affinity = self.affinity.iter().map(|(w, t)| (*w, t));
        affinity.chain(self.anti_affinity.iter().map(|(w, t)| (-*w, t)))
    }
}

/// Which rule a node breaks, in upstream's order of checking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Violation {
    /// A required affinity term finds no matching pod in the node's
    /// domain (or the node lacks the topology key).
    Affinity,
    /// A required anti-affinity term finds a matching pod there.
    AntiAffinity,
    /// A pod there has a required anti-affinity term matching this pod.
    ExistingAntiAffinity,
}

/// What upstream's PreFilter works out for one attempt.
#[derive(Debug, Default)]
pub struct State {
    /// Pods matching all of the incoming pod's affinity terms, counted
    /// under each term's topology pair of their node.
    affinity: Counts,
    /// Pods matching one of its anti-affinity terms, per that term's pair.
    anti_affinity: Counts,
    /// Placed pods with a required anti-affinity term matching the
    /// incoming pod, per that term's pair.
    existing_anti_affinity: Counts,
}

fn add(counts: &mut Counts, key: &str, value: &str, n: i64) {
    let values = match counts.get_mut(key) {
        Some(v) => v,
        None => counts.entry(key.to_string()).or_default(),
    };
    match values.get_mut(value) {
        Some(c) => *c += n,
        None => {
            values.insert(value.to_string(), n);
        }
    }
}

fn count(counts: &Counts, key: &str, value: &str) -> i64 {
    counts
        .get(key)
        .and_then(|v| v.get(value))
        .copied()
        .unwrap_or(0)
}

impl State {
    /// Count what the checks need for `pod` over the pods in `cache`.
    /// `None` when there is nothing to check: no terms of its own and no
    /// placed pod's anti-affinity matches it.
    pub fn prefilter(pod: &PodInfo, cache: &Cache) -> Option<State> {
        let mut state = State::default();
        for group in cache.anti_affinity_groups() {
            for term in group.terms.iter().filter(|t| t.matches_pod(pod)) {
                for (name, n) in &group.nodes {
                    let Some((_, labels)) = cache.node_labels(name) else {
                        continue;
                    };
                    if let Some(value) = labels.get(&term.topology_key) {
                        let n = i64::from(*n);
                        add(
                            &mut state.existing_anti_affinity,
                            &term.topology_key,
                            value,
                            n,
                        );
                    }
                }
            }
        }
        let Some(terms) = pod.terms.as_deref() else {
            return (!state.existing_anti_affinity.is_empty()).then_some(state);
        };
        for group in cache.label_groups() {
            let (ns, labels) = (group.namespace.as_str(), Some(&group.labels));
            let affine =
                !terms.affinity.is_empty() && terms.affinity.iter().all(|t| t.matches(ns, labels));
            let anti: Vec<&Term> = terms
                .anti_affinity
                .iter()
                .filter(|t| t.matches(ns, labels))
                .collect();
            if !affine && anti.is_empty() {
                continue;
            }
            for (name, count) in &group.nodes {
                let Some((_, node_labels)) = cache.node_labels(name) else {
                    continue;
                };
                let n = i64::from(count.pods);
                if affine {
                    for t in &terms.affinity {
                        if let Some(value) = node_labels.get(&t.topology_key) {
                            add(&mut state.affinity, &t.topology_key, value, n);
                        }
                    }
                }
                for t in &anti {
                    if let Some(value) = node_labels.get(&t.topology_key) {
                        add(&mut state.anti_affinity, &t.topology_key, value, n);
                    }
                }
            }
        }
        Some(state)
    }

    /// Upstream's Filter: the incoming pod's affinity, then its
    /// anti-affinity, then the placed pods' anti-affinity.
    pub fn check(&self, pod: &PodInfo, node: &NodeInfo) -> Option<Violation> {
        let labels = node.labels();
        let value = |key: &str| labels.and_then(|l| l.get(key));
        if let Some(terms) = pod.terms.as_deref() {
            if !self.affinity_ok(pod, &terms.affinity, &value) {
                return Some(Violation::Affinity);
            }
            let matched = terms.anti_affinity.iter().any(|t| {
                value(&t.topology_key)
                    .is_some_and(|v| count(&self.anti_affinity, &t.topology_key, v) > 0)
            });
            if matched {
                return Some(Violation::AntiAffinity);
            }
        }
        let blocked = self
            .existing_anti_affinity
            .iter()
            .any(|(key, values)| value(key).is_some_and(|v| values.get(v).is_some_and(|n| *n > 0)));
        blocked.then_some(Violation::ExistingAntiAffinity)
    }

    fn affinity_ok<'a>(
        &self,
        pod: &PodInfo,
        terms: &[Term],
        value: &impl Fn(&str) -> Option<&'a String>,
    ) -> bool {
        let mut pods_exist = true;
        for t in terms {
            // Every topology key must be on the node, whatever the counts.
            let Some(v) = value(&t.topology_key) else {
                return false;
            };
            if count(&self.affinity, &t.topology_key, v) <= 0 {
                pods_exist = false;
            }
        }
        // The first pod of a group with affinity to itself: no pod
        // anywhere matches, but it matches its own terms, so it may go
        // anywhere, or the group would wait forever.
        pods_exist || (self.affinity.is_empty() && terms.iter().all(|t| t.matches_pod(pod)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};
    use std::sync::Arc;

    fn term(v: Value) -> PodAffinityTerm {
        serde_json::from_value(v).unwrap()
    }

    fn labels(kv: &[(&str, &str)]) -> Labels {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn pod(uid: &str, ns: &str, pod_labels: Value, affinity: Value) -> Arc<PodInfo> {
        Arc::new(PodInfo::new(
            serde_json::from_value(json!({
                "metadata": {"name": uid, "namespace": ns, "uid": uid, "labels": pod_labels},
                "spec": {"containers": [{"name": "c"}], "affinity": affinity}
            }))
            .unwrap(),
        ))
    }

    fn anti(key: &str, app: &str) -> Value {
        json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key}]}})
    }

    fn affine(key: &str, app: &str) -> Value {
        json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key}]}})
    }

    fn cache(nodes: &[(&str, &str)]) -> Cache {
        let mut c = Cache::default();
        for (name, zone) in nodes {
            c.upsert_node(
                serde_json::from_value(json!({"metadata": {"name": name, "labels": {
                    "kubernetes.io/hostname": name, "zone": zone}}}))
                .unwrap(),
            );
        }
        c
    }

    fn check(p: &PodInfo, c: &Cache, node: &str) -> Option<Violation> {
        match State::prefilter(p, c) {
            Some(s) => s.check(p, c.node(node).unwrap()),
            None => None,
        }
    }

    #[test]
    fn terms_resolve_namespaces_and_label_keys() {
        let own = Term::new(
            &term(json!({"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "k"})),
            "ns",
            None,
        );
        let web = labels(&[("app", "web")]);
        assert!(own.matches("ns", Some(&web)));
        assert!(
            !own.matches("other", Some(&web)),
            "own namespace by default"
        );
        assert!(!own.matches("ns", Some(&labels(&[("app", "db")]))));

        let listed = Term::new(
            &term(json!({"labelSelector": {}, "namespaces": ["a", "b"], "topologyKey": "k"})),
            "ns",
            None,
        );
        assert!(listed.matches("b", None) && !listed.matches("ns", None));
        let all = Term::new(
            &term(json!({"labelSelector": {}, "namespaceSelector": {}, "topologyKey": "k"})),
            "ns",
            None,
        );
        assert!(all.matches("anything", None));
        let nil = Term::new(&term(json!({"topologyKey": "k"})), "ns", None);
        assert!(
            !nil.matches("ns", Some(&web)),
            "a nil selector selects nothing"
        );

        let mine = labels(&[("app", "web"), ("hash", "h1"), ("tenant", "t1")]);
        let keyed = Term::new(
            &term(
                json!({"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "k",
                "matchLabelKeys": ["hash", "missing"], "mismatchLabelKeys": ["tenant"]}),
            ),
            "ns",
            Some(&mine),
        );
        let with = |h: &str, t: &str| labels(&[("app", "web"), ("hash", h), ("tenant", t)]);
        assert!(keyed.matches("ns", Some(&with("h1", "t2"))));
        assert!(!keyed.matches("ns", Some(&with("h2", "t2"))), "other hash");
        assert!(!keyed.matches("ns", Some(&with("h1", "t1"))), "same tenant");
    }

    #[test]
    fn anti_affinity_keeps_matching_pods_apart() {
        let mut c = cache(&[("a", "z1"), ("b", "z1"), ("c", "z2")]);
        let web = json!({"app": "web"});
        c.set_bound(pod("w1", "ns", web.clone(), json!(null)), "a");
        let by_host = pod(
            "new",
            "ns",
            web.clone(),
            anti("kubernetes.io/hostname", "web"),
        );
        assert_eq!(check(&by_host, &c, "a"), Some(Violation::AntiAffinity));
        assert_eq!(check(&by_host, &c, "b"), None);
        let by_zone = pod("new", "ns", web.clone(), anti("zone", "web"));
        assert_eq!(check(&by_zone, &c, "b"), Some(Violation::AntiAffinity));
        assert_eq!(check(&by_zone, &c, "c"), None);
        // A node without the key is not in the domain.
        let by_rack = pod("new", "ns", web.clone(), anti("rack", "web"));
        assert_eq!(check(&by_rack, &c, "a"), None);
        // Pods of other namespaces do not count.
        let elsewhere = pod("new", "other", web, anti("kubernetes.io/hostname", "web"));
        assert_eq!(check(&elsewhere, &c, "a"), None);
    }

    #[test]
    fn existing_anti_affinity_is_symmetric() {
        let mut c = cache(&[("a", "z1"), ("b", "z1"), ("c", "z2")]);
        c.set_bound(
            pod("db", "ns", json!({"app": "db"}), anti("zone", "web")),
            "a",
        );
        // The incoming web pod has no rules of its own; the db pod's
        // keep it out of zone z1.
        let web = pod("new", "ns", json!({"app": "web"}), json!(null));
        assert_eq!(check(&web, &c, "b"), Some(Violation::ExistingAntiAffinity));
        assert_eq!(check(&web, &c, "c"), None);
        let other = pod("new", "ns", json!({"app": "api"}), json!(null));
        assert!(State::prefilter(&other, &c).is_none(), "nothing to check");
        // Once the db pod is gone, so is the rule.
        c.remove_pod("db");
        assert!(State::prefilter(&web, &c).is_none());
    }

    #[test]
    fn affinity_needs_a_matching_pod_in_the_domain() {
        let mut c = cache(&[("a", "z1"), ("b", "z1"), ("c", "z2")]);
        // The first pod of a self-affine group goes anywhere.
        let first = pod("p1", "ns", json!({"app": "web"}), affine("zone", "web"));
        assert_eq!(check(&first, &c, "c"), None);
        // One that does not match its own terms waits for a match.
        let follower = pod("p2", "ns", json!({"app": "api"}), affine("zone", "web"));
        assert_eq!(check(&follower, &c, "a"), Some(Violation::Affinity));
        c.set_bound(first, "a");
        assert_eq!(check(&follower, &c, "b"), None, "same zone");
        assert_eq!(check(&follower, &c, "c"), Some(Violation::Affinity));
        // A node without the topology key never satisfies affinity.
        let mut c2 = cache(&[("a", "z1")]);
        c2.upsert_node(serde_json::from_value(json!({"metadata": {"name": "bare"}})).unwrap());
        c2.set_bound(pod("w", "ns", json!({"app": "web"}), json!(null)), "a");
        assert_eq!(check(&follower, &c2, "bare"), Some(Violation::Affinity));
        // Once any pod matches, the self-affinity exception is over.
        let second = pod("p3", "ns", json!({"app": "web"}), affine("zone", "web"));
        assert_eq!(check(&second, &c, "c"), Some(Violation::Affinity));
    }
}
