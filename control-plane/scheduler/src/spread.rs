//! PodTopologySpread's filter (upstream `plugins/podtopologyspread`):
//! `whenUnsatisfiable: DoNotSchedule` constraints.
//!
//! A node passes a constraint when placing the pod there leaves its
//! domain (the node's value of `topologyKey`) at most `maxSkew` matching
//! pods above the least populated domain. Domains are the values of the
//! nodes that have every constraint's key and pass the node inclusion
//! policies; the pods counted are those in the pod's namespace that
//! match the selector and are not terminating. [`State::prefilter`]
//! counts once per attempt, as upstream's PreFilter.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{Pod, TopologySpreadConstraint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube_util::{nodeaffinity, selector, taints};

use crate::cache::Cache;
use crate::interpod::with_label_keys;
use crate::nodeinfo::NodeInfo;
use crate::podinfo::PodInfo;

type Labels = BTreeMap<String, String>;

/// One DoNotSchedule constraint, with `matchLabelKeys` merged into the
/// selector from the pod's labels.
#[derive(Debug, Clone, PartialEq)]
pub struct Constraint {
    pub max_skew: i64,
    pub topology_key: String,
    /// `None` matches no pod (a nil selector).
    selector: Option<LabelSelector>,
    /// Below this many domains, the global minimum counts as 0.
    pub min_domains: i64,
    /// `nodeAffinityPolicy: Honor` (the default): only nodes the pod's
    /// nodeSelector and required node affinity admit are domains.
    honor_node_affinity: bool,
    /// `nodeTaintsPolicy: Honor` (default Ignore): only nodes whose
    /// NoSchedule/NoExecute taints the pod tolerates are domains.
    honor_taints: bool,
}

impl Constraint {
    pub(crate) fn new(c: &TopologySpreadConstraint, labels: Option<&Labels>) -> Constraint {
        let selector = c
            .label_selector
            .as_ref()
            .map(|s| with_label_keys(s, labels, c.match_label_keys.as_deref().unwrap_or(&[]), &[]));
        Constraint {
            max_skew: i64::from(c.max_skew),
            topology_key: c.topology_key.clone(),
            selector,
            min_domains: i64::from(c.min_domains.unwrap_or(1)),
            honor_node_affinity: c.node_affinity_policy.as_deref() != Some("Ignore"),
            honor_taints: c.node_taints_policy.as_deref() == Some("Honor"),
        }
    }

    pub(crate) fn matches(&self, labels: Option<&Labels>) -> bool {
        self.selector
            .as_ref()
            .is_some_and(|s| selector::matches(s, labels))
    }

    /// Whether `node` is a domain of this constraint for `pod`.
    pub(crate) fn includes(&self, pod: &Pod, node: &NodeInfo) -> bool {
        let Some(spec) = pod.spec.as_ref() else {
            return false;
        };
        if self.honor_node_affinity && !nodeaffinity::pod_matches(spec, node.labels(), &node.name) {
            return false;
        }
        let tolerations = spec.tolerations.as_deref().unwrap_or(&[]);
        !self.honor_taints || taints::untolerated_blocking(node.taints(), tolerations).is_none()
    }
}

/// The pod's DoNotSchedule constraints (empty for most pods; the
/// ScheduleAnyway ones are preferences, not filters).
pub fn constraints(pod: &Pod) -> Vec<Constraint> {
    let labels = pod.metadata.labels.as_ref();
    pod.spec
        .iter()
        .flat_map(|s| s.topology_spread_constraints.iter().flatten())
        .filter(|c| c.when_unsatisfiable == "DoNotSchedule")
        .map(|c| Constraint::new(c, labels))
        .collect()
}

/// The pod's ScheduleAnyway constraints (the PodTopologySpread score's).
pub fn soft_constraints(pod: &Pod) -> Vec<Constraint> {
    let labels = pod.metadata.labels.as_ref();
    pod.spec
        .iter()
        .flat_map(|s| s.topology_spread_constraints.iter().flatten())
        .filter(|c| c.when_unsatisfiable == "ScheduleAnyway")
        .map(|c| Constraint::new(c, labels))
        .collect()
}

/// Why a node fails a constraint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Violation {
    /// The node lacks a constraint's topology key.
    MissingLabel,
    /// Placing the pod there would exceed a maxSkew.
    Skew,
}

/// Matching pods per domain, and the minimum that skew is measured from.
#[derive(Debug)]
struct Domains {
    counts: HashMap<String, i64>,
    min: i64,
}

/// What upstream's PreFilter works out for one attempt.
#[derive(Debug)]
pub struct State {
    /// One per constraint of the pod, in order.
    domains: Vec<Domains>,
}

impl State {
    /// Count the matching pods per domain; `None` for a pod without
    /// DoNotSchedule constraints.
    pub fn prefilter(pod: &PodInfo, cache: &Cache) -> Option<State> {
        let constraints = &pod.spread;
        if constraints.is_empty() {
            return None;
        }
        let mut domains: Vec<Domains> = constraints
            .iter()
            .map(|_| Domains {
                counts: HashMap::new(),
                min: 0,
            })
            .collect();
        // Per node that has every key: which constraints it is a domain of.
        let mut included: HashMap<&str, Vec<bool>> = HashMap::new();
        for node in cache.nodes() {
            let Some(labels) = node.labels() else {
                continue;
            };
            if !constraints
                .iter()
                .all(|c| labels.contains_key(&c.topology_key))
            {
                continue;
            }
            let flags: Vec<bool> = constraints
                .iter()
                .map(|c| c.includes(&pod.pod, node))
                .collect();
            for ((c, d), on) in constraints.iter().zip(&mut domains).zip(&flags) {
                if *on {
                    if let Some(value) = labels.get(&c.topology_key) {
                        d.counts.entry(value.clone()).or_insert(0);
                    }
                }
            }
            included.insert(node.name.as_str(), flags);
        }
        for group in cache.label_groups() {
            if group.namespace != pod.namespace {
                continue;
            }
            let matching: Vec<bool> = constraints
                .iter()
                .map(|c| c.matches(Some(&group.labels)))
                .collect();
            if !matching.contains(&true) {
                continue;
            }
            for (name, count) in &group.nodes {
                let n = i64::from(count.pods - count.terminating);
                let (Some(flags), Some((_, labels))) =
                    (included.get(name.as_str()), cache.node_labels(name))
                else {
                    continue;
                };
                let per = constraints
                    .iter()
                    .zip(&mut domains)
                    .zip(flags)
                    .zip(&matching);
                for (((c, d), on), matches) in per {
                    if !*on || !*matches {
                        continue;
                    }
                    if let Some(v) = labels
                        .get(&c.topology_key)
                        .and_then(|v| d.counts.get_mut(v))
                    {
                        *v += n;
                    }
                }
            }
        }
        for (c, d) in constraints.iter().zip(&mut domains) {
            d.min = global_min(&d.counts, c.min_domains);
        }
        Some(State { domains })
    }

    /// Upstream's Filter, constraint by constraint.
    pub fn check(&self, pod: &PodInfo, node: &NodeInfo) -> Option<Violation> {
        let labels = node.labels();
        for (c, d) in pod.spread.iter().zip(&self.domains) {
            let Some(value) = labels.and_then(|l| l.get(&c.topology_key)) else {
                return Some(Violation::MissingLabel);
            };
            let own = i64::from(c.matches(pod.labels()));
            let here = d.counts.get(value).copied().unwrap_or(0);
            if skew(here, own, d.min) > c.max_skew {
                return Some(Violation::Skew);
            }
        }
        None
    }
}

/// The least populated domain's count; 0 while there are fewer domains
/// than `min_domains` (the pods may still go to domains yet to come).
/// Without any domain, nothing is skewed (upstream starts from MaxInt32).
fn global_min(counts: &HashMap<String, i64>, min_domains: i64) -> i64 {
    if (counts.len() as i64) < min_domains {
        return 0;
    }
    counts
        .values()
        .copied()
        .min()
        .unwrap_or(i64::from(i32::MAX))
}

/// The skew the domain would have with the pod placed in it.
fn skew(here: i64, own: i64, min: i64) -> i64 {
    here + own - min
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};
    use std::sync::Arc;

    fn pod(uid: &str, labels: Value, spec: Value) -> Arc<PodInfo> {
        let mut v = json!({
            "metadata": {"name": uid, "namespace": "ns", "uid": uid, "labels": labels},
            "spec": {"containers": [{"name": "c"}]}
        });
        for (k, x) in spec.as_object().unwrap() {
            v["spec"][k] = x.clone();
        }
        Arc::new(PodInfo::new(serde_json::from_value(v).unwrap()))
    }

    fn spread(key: &str, max_skew: i32, extra: Value) -> Value {
        let mut c = json!({"maxSkew": max_skew, "topologyKey": key,
            "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}});
        for (k, x) in extra.as_object().unwrap() {
            c[k] = x.clone();
        }
        json!({"topologySpreadConstraints": [c]})
    }

    fn cache(nodes: &[(&str, Value)]) -> Cache {
        let mut c = Cache::default();
        for (name, node) in nodes {
            let mut v = node.clone();
            v["metadata"]["name"] = json!(name);
            c.upsert_node(serde_json::from_value(v).unwrap());
        }
        c
    }

    fn zone(z: &str) -> Value {
        json!({"metadata": {"labels": {"zone": z}}})
    }

    fn check(p: &PodInfo, c: &Cache, node: &str) -> Option<Violation> {
        State::prefilter(p, c)?.check(p, c.node(node).unwrap())
    }

    fn web(uid: &str) -> Arc<PodInfo> {
        pod(uid, json!({"app": "web"}), json!({}))
    }

    #[test]
    fn skew_arithmetic() {
        let counts: HashMap<String, i64> = [("a".to_string(), 2), ("b".to_string(), 1)].into();
        assert_eq!(global_min(&counts, 1), 1);
        assert_eq!(global_min(&counts, 3), 0, "fewer domains than minDomains");
        assert_eq!(global_min(&HashMap::new(), 1), 0);
        assert_eq!(global_min(&HashMap::new(), 0), i64::from(i32::MAX));
        assert_eq!(skew(2, 1, 1), 2);
        assert_eq!(skew(1, 0, 1), 0);
    }

    #[test]
    fn max_skew_over_zones() {
        let mut c = cache(&[("a", zone("z1")), ("b", zone("z2")), ("bare", json!({}))]);
        c.set_bound(web("w1"), "a");
        let p = pod("new", json!({"app": "web"}), spread("zone", 1, json!({})));
        assert_eq!(check(&p, &c, "a"), Some(Violation::Skew));
        assert_eq!(check(&p, &c, "b"), None);
        assert_eq!(check(&p, &c, "bare"), Some(Violation::MissingLabel));
        // A pod the selector does not match adds nothing to its domain.
        let other = pod("new", json!({"app": "api"}), spread("zone", 1, json!({})));
        assert_eq!(check(&other, &c, "a"), None);
        // Terminating pods and other namespaces' pods are not counted.
        let mut c2 = cache(&[("a", zone("z1")), ("b", zone("z2"))]);
        c2.set_bound(
            Arc::new(PodInfo::new(
                serde_json::from_value(
                    json!({"metadata": {"name": "t", "namespace": "ns", "uid": "t",
                    "labels": {"app": "web"}, "deletionTimestamp": "2026-01-01T00:00:00Z"},
                    "spec": {"containers": [{"name": "c"}]}}),
                )
                .unwrap(),
            )),
            "a",
        );
        c2.set_bound(
            Arc::new(PodInfo::new(
                serde_json::from_value(
                    json!({"metadata": {"name": "o", "namespace": "other", "uid": "o",
                    "labels": {"app": "web"}}, "spec": {"containers": [{"name": "c"}]}}),
                )
                .unwrap(),
            )),
            "a",
        );
        assert_eq!(check(&p, &c2, "a"), None);
    }

    #[test]
    fn min_domains_holds_the_minimum_at_zero() {
        let mut c = cache(&[("a", zone("z1")), ("b", zone("z2"))]);
        c.set_bound(web("w1"), "a");
        c.set_bound(web("w2"), "b");
        let loose = pod("new", json!({"app": "web"}), spread("zone", 1, json!({})));
        assert_eq!(check(&loose, &c, "a"), None);
        // Three domains wanted, two exist: the minimum is 0, and a third
        // pod in z1 would be a skew of 2.
        let strict = pod(
            "new",
            json!({"app": "web"}),
            spread("zone", 1, json!({"minDomains": 3})),
        );
        assert_eq!(check(&strict, &c, "a"), Some(Violation::Skew));
        assert_eq!(check(&strict, &c, "b"), Some(Violation::Skew));
    }

    #[test]
    fn node_inclusion_policies() {
        let tainted = json!({"metadata": {"labels": {"zone": "z3"}},
            "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}});
        let mut c = cache(&[("a", zone("z1")), ("b", zone("z2")), ("t", tainted)]);
        c.set_bound(web("w1"), "a");
        c.set_bound(web("w2"), "b");
        // Taints ignored (default): the empty tainted zone is the minimum.
        let p = pod("new", json!({"app": "web"}), spread("zone", 1, json!({})));
        assert_eq!(check(&p, &c, "a"), Some(Violation::Skew));
        let honor = pod(
            "new",
            json!({"app": "web"}),
            spread("zone", 1, json!({"nodeTaintsPolicy": "Honor"})),
        );
        assert_eq!(check(&honor, &c, "a"), None);
        // Node affinity honoured (default): a zone the pod may not go to
        // is not a domain; with Ignore it is.
        let mut sel = spread("zone", 1, json!({}));
        sel["nodeSelector"] = json!({"zone": "z1"});
        let mut c2 = cache(&[("a", zone("z1")), ("b", zone("z2"))]);
        c2.set_bound(web("w1"), "a");
        let pinned = pod("new", json!({"app": "web"}), sel.clone());
        assert_eq!(check(&pinned, &c2, "a"), None);
        sel["topologySpreadConstraints"][0]["nodeAffinityPolicy"] = json!("Ignore");
        let ignoring = pod("new", json!({"app": "web"}), sel);
        assert_eq!(check(&ignoring, &c2, "a"), Some(Violation::Skew));
    }

    #[test]
    fn match_label_keys_narrow_the_selector() {
        let mut c = cache(&[("a", zone("z1")), ("b", zone("z2"))]);
        let old = pod("old", json!({"app": "web", "hash": "h1"}), json!({}));
        c.set_bound(old, "a");
        let new = pod(
            "new",
            json!({"app": "web", "hash": "h2"}),
            spread("zone", 1, json!({"matchLabelKeys": ["hash"]})),
        );
        // The old revision's pod is not counted: z1 is as empty as z2.
        assert_eq!(check(&new, &c, "a"), None);
        let schedule_anyway = pod(
            "x",
            json!({"app": "web"}),
            json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone",
                "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {}}]}),
        );
        assert!(schedule_anyway.spread.is_empty());
    }
}
