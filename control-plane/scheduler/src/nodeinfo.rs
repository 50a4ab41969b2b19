//! One node as the scheduler sees it: the Node object's facts plus the
//! running total of what the pods bound (or assumed) to it take.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{Node, Taint};
use kube_util::resources::{self, Resources};

use crate::podinfo::{HostPort, PodInfo};

/// The node's Ready condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    Ready,
    /// Ready=False.
    NotReady,
    /// Ready=Unknown, or no Ready condition yet.
    Unknown,
}

fn readiness(node: &Node) -> Readiness {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
    match ready.map(|c| c.status.as_str()) {
        Some("True") => Readiness::Ready,
        Some("False") => Readiness::NotReady,
        _ => Readiness::Unknown,
    }
}

/// A node and the pods on it.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub name: String,
    /// `None` while pods name a node whose Node object is not (or no
    /// longer) known: their usage is kept so that it is right when the
    /// node (re)appears, but nothing is scheduled there.
    pub node: Option<Node>,
    pub readiness: Readiness,
    pub unschedulable: bool,
    pub allocatable: Resources,
    /// Allocatable `pods`.
    pub allowed_pods: i64,
    /// Sum of the requests of the pods here.
    pub requested: Resources,
    /// Sum of the non-zero requests (scoring), millicores and bytes.
    pub non_zero_cpu: i64,
    pub non_zero_memory: i64,
    pub pod_count: i64,
    /// Host ports in use, one entry per pod port.
    pub host_ports: Vec<HostPort>,
    /// Pods here per controlling owner UID (spreading), leaving out
    /// terminating ones as upstream's spreading does.
    owners: HashMap<String, u32>,
    /// Image name -> size in bytes, from `status.images` (ImageLocality;
    /// empty while the node reports none).
    pub images: HashMap<String, i64>,
}

impl NodeInfo {
    /// A node known only by name so far.
    pub fn new(name: &str) -> NodeInfo {
        NodeInfo {
            name: name.to_string(),
            node: None,
            readiness: Readiness::Unknown,
            unschedulable: false,
            allocatable: Resources::default(),
            allowed_pods: 0,
            requested: Resources::default(),
            non_zero_cpu: 0,
            non_zero_memory: 0,
            pod_count: 0,
            host_ports: Vec::new(),
            owners: HashMap::new(),
            images: HashMap::new(),
        }
    }

    /// Take in a new version of the Node object. Returns true when the
    /// change could make a pod fit that did not before (or the node is
    /// new): the caller then retries unschedulable pods. Status
    /// heartbeats that change nothing the filters read return false.
    pub fn set_node(&mut self, node: Node) -> bool {
        let readiness = readiness(&node);
        let unschedulable = node
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false);
        let (allocatable, allowed_pods) = resources::node_allocatable(&node);
        let changed = match &self.node {
            None => true,
            Some(old) => {
                self.readiness != readiness
                    || self.unschedulable != unschedulable
                    || self.allocatable != allocatable
                    || self.allowed_pods != allowed_pods
                    || old.metadata.labels != node.metadata.labels
                    || old.spec.as_ref().and_then(|s| s.taints.as_ref())
                        != node.spec.as_ref().and_then(|s| s.taints.as_ref())
            }
        };
        self.readiness = readiness;
        self.unschedulable = unschedulable;
        self.allocatable = allocatable;
        self.allowed_pods = allowed_pods;
        self.images = node
            .status
            .iter()
            .flat_map(|s| s.images.iter().flatten())
            .flat_map(|i| {
                let size = i.size_bytes.unwrap_or(0);
                i.names.iter().flatten().map(move |n| (n.clone(), size))
            })
            .collect();
        self.node = Some(node);
        changed
    }

    /// Forget the Node object (deleted), keeping the pods' usage.
    pub fn clear_node(&mut self) {
        self.node = None;
    }

    /// True when nothing refers to this entry any more.
    pub fn is_empty(&self) -> bool {
        self.node.is_none() && self.pod_count == 0
    }

    pub fn labels(&self) -> Option<&BTreeMap<String, String>> {
        self.node.as_ref().and_then(|n| n.metadata.labels.as_ref())
    }

    pub fn taints(&self) -> &[Taint] {
        self.node
            .as_ref()
            .and_then(|n| n.spec.as_ref())
            .and_then(|s| s.taints.as_deref())
            .unwrap_or(&[])
    }

    /// Pods here whose controlling owner is `owner`.
    pub fn owner_count(&self, owner: &str) -> u32 {
        self.owners.get(owner).copied().unwrap_or(0)
    }

    pub fn add_pod(&mut self, pod: &PodInfo) {
        self.requested.add(&pod.requests);
        self.non_zero_cpu += pod.non_zero_cpu;
        self.non_zero_memory += pod.non_zero_memory;
        self.pod_count += 1;
        self.host_ports.extend(pod.host_ports.iter().cloned());
        if let Some(o) = pod.owner.as_ref().filter(|_| !pod.terminating) {
            *self.owners.entry(o.clone()).or_default() += 1;
        }
    }

    pub fn remove_pod(&mut self, pod: &PodInfo) {
        self.requested.sub(&pod.requests);
        self.non_zero_cpu -= pod.non_zero_cpu;
        self.non_zero_memory -= pod.non_zero_memory;
        self.pod_count -= 1;
        for hp in &pod.host_ports {
            if let Some(i) = self.host_ports.iter().position(|h| h == hp) {
                self.host_ports.swap_remove(i);
            }
        }
        if let Some(o) = pod.owner.as_ref().filter(|_| !pod.terminating) {
            if let Some(n) = self.owners.get_mut(o) {
                *n -= 1;
                if *n == 0 {
                    self.owners.remove(o);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(ready: &str, cpu: &str) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": {"a": "b"}},
            "status": {"allocatable": {"cpu": cpu, "memory": "1Gi", "pods": "10"},
                       "conditions": [{"type": "Ready", "status": ready}]}
        }))
        .unwrap()
    }

    #[test]
    fn heartbeats_are_not_changes() {
        let mut n = NodeInfo::new("n1");
        assert!(n.set_node(node("True", "2")), "a new node is a change");
        assert_eq!(n.readiness, Readiness::Ready);
        assert_eq!((n.allocatable.cpu, n.allowed_pods), (2000, 10));
        let mut same = node("True", "2");
        same.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].last_heartbeat_time = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()),
        );
        assert!(!n.set_node(same));
        assert!(n.set_node(node("False", "2")));
        assert!(n.set_node(node("False", "4")));
    }

    #[test]
    fn pods_add_and_remove() {
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "uid": "u", "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "rs", "controller": true}]},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "100m"}},
                     "ports": [{"containerPort": 1, "hostPort": 80}]}]}
        }))
        .unwrap();
        let p = PodInfo::new(pod);
        let mut n = NodeInfo::new("n1");
        n.add_pod(&p);
        n.add_pod(&p);
        assert_eq!(
            (n.requested.cpu, n.pod_count, n.owner_count("rs")),
            (200, 2, 2)
        );
        assert_eq!(n.host_ports.len(), 2);
        n.remove_pod(&p);
        n.remove_pod(&p);
        assert_eq!(
            (n.requested.cpu, n.pod_count, n.owner_count("rs")),
            (0, 0, 0)
        );
        assert!(n.host_ports.is_empty());
        assert!(n.is_empty());
    }
}
