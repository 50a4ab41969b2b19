//! The scheduler's picture of the cluster: every node with the pods bound
//! to it, including the ones this scheduler has just decided on but the
//! watch has not shown bound yet ("assumed" pods, as upstream's cache
//! has). Counting assumed pods is what keeps a burst of decisions from
//! overcommitting a node before the API catches up.
//!
//! Owned by the scheduling loop alone: no locks.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;

use crate::interpod::Term;
use crate::nodeinfo::NodeInfo;
use crate::podinfo::PodInfo;

/// Why a pod is counted on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodState {
    /// This scheduler chose the node; the binding is in flight or done
    /// but not yet seen through the watch.
    Assumed,
    /// The watch showed the pod bound to the node.
    Bound,
}

#[derive(Debug)]
struct PodEntry {
    info: Arc<PodInfo>,
    node: String,
    state: PodState,
}

/// Nodes and the pods that take room on them.
#[derive(Debug, Default)]
pub struct Cache {
    /// By name; a BTreeMap so that iteration order is stable.
    nodes: BTreeMap<String, NodeInfo>,
    /// Pods counted on some node, by UID.
    pods: HashMap<String, PodEntry>,
    /// How many of those pods use each claim, by `namespace/claim`
    /// (upstream's `IsPVCUsedByPods`, for ReadWriteOncePod).
    claim_users: HashMap<String, u32>,
    /// The counted pods grouped by namespace and labels, with how many
    /// are on each node. The filters that match other pods against a
    /// selector (inter-pod affinity, topology spread) match once per
    /// group: the pods of one owner share their labels, so a cluster has
    /// far fewer groups than pods.
    groups: HashMap<GroupKey, LabelGroup>,
    /// The counted pods with required anti-affinity terms, grouped by
    /// those terms (upstream's `PodsWithRequiredAntiAffinity`), whose
    /// rules every incoming pod is checked against.
    anti_groups: HashMap<String, AntiGroup>,
    /// UIDs of the counted pods with affinity terms that score incoming
    /// pods (required affinity, preferred affinity or anti-affinity):
    /// few, and otherwise found only by a pass over every pod.
    with_affinity: HashSet<String>,
}

type GroupKey = (String, BTreeMap<String, String>);

/// A pod taken out of the counts by [`Cache::lift`].
#[derive(Debug)]
pub struct Lifted {
    pub info: Arc<PodInfo>,
    node: String,
    state: PodState,
}

/// Pods sharing a namespace and labels.
#[derive(Debug)]
pub struct LabelGroup {
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    /// Per node name.
    pub nodes: HashMap<String, NodeCount>,
}

/// How many pods of a group are on one node.
#[derive(Debug, Default, Clone, Copy)]
pub struct NodeCount {
    pub pods: u32,
    /// Of which terminating (spreading does not count them).
    pub terminating: u32,
}

/// Pods with the same required anti-affinity terms.
#[derive(Debug)]
pub struct AntiGroup {
    pub terms: Vec<Term>,
    /// Pods per node name.
    pub nodes: HashMap<String, u32>,
}

impl Cache {
    /// Add or update a node. Returns true when the change may let pods
    /// fit that did not before.
    pub fn upsert_node(&mut self, node: Node) -> bool {
        let name = node.metadata.name.clone().unwrap_or_default();
        self.nodes
            .entry(name.clone())
            .or_insert_with(|| NodeInfo::new(&name))
            .set_node(node)
    }

    /// The Node object is gone; its pods stay counted until they go too.
    pub fn remove_node(&mut self, name: &str) {
        if let Some(n) = self.nodes.get_mut(name) {
            n.clear_node();
            if n.is_empty() {
                self.nodes.remove(name);
            }
        }
    }

    /// Names of the nodes whose Node object is known.
    pub fn node_names(&self) -> Vec<String> {
        self.nodes().map(|n| n.name.clone()).collect()
    }

    /// Nodes whose Node object is known: the candidates.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeInfo> {
        self.nodes.values().filter(|n| n.node.is_some())
    }

    pub fn node(&self, name: &str) -> Option<&NodeInfo> {
        self.nodes.get(name)
    }

    /// How many candidate nodes there are.
    pub fn node_count(&self) -> usize {
        self.nodes().count()
    }

    /// Count `pod` on `node` before the binding is confirmed.
    pub fn assume(&mut self, pod: Arc<PodInfo>, node: &str) {
        self.place(pod, node, PodState::Assumed);
    }

    /// Undo [`Cache::assume`] after a failed binding, unless the watch
    /// has meanwhile shown the pod bound (somewhere) or deleted. Returns
    /// the pod's info when it was un-assumed.
    pub fn forget(&mut self, uid: &str, node: &str) -> Option<Arc<PodInfo>> {
        match self.pods.get(uid) {
            Some(e) if e.state == PodState::Assumed && e.node == node => self.remove_pod(uid),
            _ => None,
        }
    }

    /// The labels of a pod this cache counts, if it does.
    pub fn pod_labels(&self, uid: &str) -> Option<Option<&BTreeMap<String, String>>> {
        self.pods.get(uid).map(|e| e.info.labels())
    }

    /// The state of a pod this cache counts, if it does.
    pub fn pod_state(&self, uid: &str) -> Option<PodState> {
        self.pods.get(uid).map(|e| e.state)
    }

    /// The watch shows `pod` bound to `node`: count it there (replacing
    /// an assumed or older entry).
    pub fn set_bound(&mut self, pod: Arc<PodInfo>, node: &str) {
        self.place(pod, node, PodState::Bound);
    }

    fn place(&mut self, pod: Arc<PodInfo>, node: &str, state: PodState) {
        self.remove_pod(&pod.uid);
        self.nodes
            .entry(node.to_string())
            .or_insert_with(|| NodeInfo::new(node))
            .add_pod(&pod);
        for c in &pod.claims {
            *self
                .claim_users
                .entry(claim_key(&pod.namespace, &c.claim))
                .or_default() += 1;
        }
        self.group(&pod, node, 1);
        if scores_others(&pod) {
            self.with_affinity.insert(pod.uid.clone());
        }
        self.pods.insert(
            pod.uid.clone(),
            PodEntry {
                info: pod,
                node: node.to_string(),
                state,
            },
        );
    }

    /// Stop counting a pod (deleted, or finished). Returns its info when
    /// it was counted.
    pub fn remove_pod(&mut self, uid: &str) -> Option<Arc<PodInfo>> {
        let e = self.pods.remove(uid)?;
        self.group(&e.info, &e.node, -1);
        self.with_affinity.remove(uid);
        for c in &e.info.claims {
            let key = claim_key(&e.info.namespace, &c.claim);
            if let Some(n) = self.claim_users.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    self.claim_users.remove(&key);
                }
            }
        }
        if let Some(n) = self.nodes.get_mut(&e.node) {
            n.remove_pod(&e.info);
            if n.is_empty() {
                self.nodes.remove(&e.node);
            }
        }
        Some(e.info)
    }

    /// The counted pods, grouped by namespace and labels.
    pub fn label_groups(&self) -> impl Iterator<Item = &LabelGroup> {
        self.groups.values()
    }

    /// The counted pods with required anti-affinity, grouped by terms.
    pub fn anti_affinity_groups(&self) -> impl Iterator<Item = &AntiGroup> {
        self.anti_groups.values()
    }

    /// A node whose Node object is known, with its labels.
    pub fn node_labels(&self, name: &str) -> Option<(&NodeInfo, &BTreeMap<String, String>)> {
        let node = self.nodes.get(name)?;
        Some((node, node.labels()?))
    }

    /// Count `pod` on `node` in its groups (`delta` 1), or stop (-1).
    fn group(&mut self, pod: &PodInfo, node: &str, delta: i32) {
        let key = (
            pod.namespace.clone(),
            pod.labels().cloned().unwrap_or_default(),
        );
        let terminating = u32::from(pod.terminating);
        if delta > 0 {
            let g = self
                .groups
                .entry(key)
                .or_insert_with_key(|(ns, labels)| LabelGroup {
                    namespace: ns.clone(),
                    labels: labels.clone(),
                    nodes: HashMap::new(),
                });
            let c = g.nodes.entry(node.to_string()).or_default();
            c.pods += 1;
            c.terminating += terminating;
        } else if let Some(g) = self.groups.get_mut(&key) {
            if let Some(c) = g.nodes.get_mut(node) {
                c.pods = c.pods.saturating_sub(1);
                c.terminating = c.terminating.saturating_sub(terminating);
                if c.pods == 0 {
                    g.nodes.remove(node);
                }
            }
            if g.nodes.is_empty() {
                self.groups.remove(&key);
            }
        }
        let Some(terms) = pod.terms.as_deref().filter(|t| !t.anti_affinity.is_empty()) else {
            return;
        };
        if delta > 0 {
            let g = self
                .anti_groups
                .entry(terms.anti_key.clone())
                .or_insert_with(|| AntiGroup {
                    terms: terms.anti_affinity.clone(),
                    nodes: HashMap::new(),
                });
            *g.nodes.entry(node.to_string()).or_default() += 1;
        } else if let Some(g) = self.anti_groups.get_mut(&terms.anti_key) {
            if let Some(n) = g.nodes.get_mut(node) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    g.nodes.remove(node);
                }
            }
            if g.nodes.is_empty() {
                self.anti_groups.remove(&terms.anti_key);
            }
        }
    }

    /// Every counted pod with its node.
    pub fn pods(&self) -> impl Iterator<Item = (&Arc<PodInfo>, &str)> {
        self.pods.values().map(|e| (&e.info, e.node.as_str()))
    }

    /// The counted pods whose affinity terms score incoming pods, with
    /// their nodes.
    pub fn pods_with_affinity(&self) -> impl Iterator<Item = (&Arc<PodInfo>, &str)> {
        self.with_affinity
            .iter()
            .filter_map(|uid| self.pods.get(uid))
            .map(|e| (&e.info, e.node.as_str()))
    }

    /// Stop counting a pod for a what-if (preemption's dry run); give
    /// the result to [`Cache::restore`] to count it again as it was.
    pub fn lift(&mut self, uid: &str) -> Option<Lifted> {
        let (node, state) = self.pods.get(uid).map(|e| (e.node.clone(), e.state))?;
        let info = self.remove_pod(uid)?;
        Some(Lifted { info, node, state })
    }

    /// Count a lifted pod again.
    pub fn restore(&mut self, lifted: Lifted) {
        self.place(lifted.info, &lifted.node, lifted.state);
    }

    /// UIDs of every counted pod (for reconciling after a re-list).
    pub fn pod_uids(&self) -> Vec<String> {
        self.pods.keys().cloned().collect()
    }

    /// Whether a pod bound or assumed anywhere uses claim `name` of
    /// `namespace`. Finished pods are not counted: they hold nothing.
    pub fn claim_in_use(&self, namespace: &str, name: &str) -> bool {
        !self.claim_users.is_empty() && self.claim_users.contains_key(&claim_key(namespace, name))
    }
}

/// Whether `pod`'s terms score other pods (InterPodAffinity's
/// existing-pod side).
fn scores_others(pod: &PodInfo) -> bool {
    pod.preferred.is_some() || pod.terms.as_deref().is_some_and(|t| !t.affinity.is_empty())
}

fn claim_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(uid: &str, cpu: &str) -> Arc<PodInfo> {
        Arc::new(PodInfo::new(
            serde_json::from_value(json!({
                "metadata": {"name": uid, "namespace": "ns", "uid": uid},
                "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}
            }))
            .unwrap(),
        ))
    }

    fn node(name: &str) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()
    }

    #[test]
    fn assume_confirm_and_forget() {
        let mut c = Cache::default();
        c.upsert_node(node("a"));
        c.upsert_node(node("b"));
        c.assume(pod("p1", "1"), "a");
        c.assume(pod("p2", "1"), "a");
        assert_eq!(c.node("a").unwrap().requested.cpu, 2000);
        // The watch shows p1 bound to b (another scheduler won): moved.
        c.set_bound(pod("p1", "1"), "b");
        assert_eq!(c.node("a").unwrap().requested.cpu, 1000);
        assert_eq!(c.node("b").unwrap().requested.cpu, 1000);
        // A late bind failure for p1 on a must not undo the bound entry.
        assert!(c.forget("p1", "a").is_none());
        assert_eq!(c.pod_state("p1"), Some(PodState::Bound));
        assert!(c.forget("p2", "a").is_some());
        assert_eq!(c.node("a").unwrap().requested.cpu, 0);
    }

    #[test]
    fn groups_follow_pods_in_and_out() {
        let mut c = Cache::default();
        c.upsert_node(node("a"));
        let labelled = |uid: &str, deleting: bool| {
            let mut v = json!({
                "metadata": {"name": uid, "namespace": "ns", "uid": uid, "labels": {"app": "web"}},
                "spec": {"containers": [{"name": "c"}], "affinity": {"podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "k"}]}}}
            });
            if deleting {
                v["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            }
            Arc::new(PodInfo::new(serde_json::from_value(v).unwrap()))
        };
        c.assume(labelled("p1", false), "a");
        c.set_bound(labelled("p2", false), "a");
        // An update of p2 (now terminating) replaces its count.
        c.set_bound(labelled("p2", true), "a");
        let groups: Vec<&LabelGroup> = c.label_groups().collect();
        assert_eq!(groups.len(), 1, "one owner, one group");
        let n = groups[0].nodes["a"];
        assert_eq!((n.pods, n.terminating), (2, 1));
        let anti: Vec<&AntiGroup> = c.anti_affinity_groups().collect();
        assert_eq!((anti.len(), anti[0].nodes["a"]), (1, 2));
        c.remove_pod("p1");
        c.remove_pod("p2");
        assert_eq!(c.label_groups().count(), 0);
        assert_eq!(c.anti_affinity_groups().count(), 0);
    }

    #[test]
    fn pods_on_unknown_nodes_are_kept_but_not_candidates() {
        let mut c = Cache::default();
        c.set_bound(pod("p1", "1"), "ghost");
        assert_eq!(c.node_count(), 0);
        c.upsert_node(node("ghost"));
        assert_eq!(c.node_count(), 1);
        assert_eq!(c.node("ghost").unwrap().requested.cpu, 1000);
        c.remove_node("ghost");
        assert_eq!(c.node_count(), 0);
        assert!(c.node("ghost").is_some(), "its pod is still counted");
        c.remove_pod("p1");
        assert!(c.node("ghost").is_none());
    }
}
