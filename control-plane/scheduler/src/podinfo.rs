//! What the scheduler needs to know of a pod, worked out once when the
//! pod is seen rather than on every node it is tried against.

use k8s_openapi::api::core::v1::Pod;

use kube_util::resources::{self, Resources};
use kube_util::storage::{self, PodClaim};

use crate::interpod::{Preferred, Terms};
use crate::spread::{self, Constraint};

/// A host port a container asks for. Two pods conflict on a node when
/// protocol and port match and either address is the wildcard or both
/// are the same (upstream `HostPortInfo.CheckConflict`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPort {
    /// `0.0.0.0` when the container gives no hostIP.
    pub ip: String,
    /// `TCP` when the container gives no protocol.
    pub protocol: String,
    pub port: i32,
}

impl HostPort {
    const WILDCARD: &'static str = "0.0.0.0";

    /// True when `self` and `other` cannot both be bound on one node.
    pub fn conflicts(&self, other: &HostPort) -> bool {
        self.port == other.port
            && self.protocol == other.protocol
            && (self.ip == other.ip || self.ip == Self::WILDCARD || other.ip == Self::WILDCARD)
    }
}

/// A pod with its scheduling facts.
#[derive(Debug, Clone)]
pub struct PodInfo {
    pub pod: Pod,
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// What it takes of a node's allocatable (fit check).
    pub requests: Resources,
    /// Requests with the non-zero defaults (scoring): millicores, bytes.
    pub non_zero_cpu: i64,
    pub non_zero_memory: i64,
    /// Host ports of its containers and sidecars.
    pub host_ports: Vec<HostPort>,
    /// UID of its controlling owner (the ReplicaSet, Job, ...), whose
    /// pods are spread across nodes.
    pub owner: Option<String>,
    /// `spec.priority` (admission fills it from the priority class).
    pub priority: i32,
    /// The claims its volumes use (empty for most pods, which then skip
    /// every volume check).
    pub claims: Vec<PodClaim>,
    /// Required pod affinity and anti-affinity terms (`None` for most
    /// pods, which then skip InterPodAffinity's own checks).
    pub terms: Option<Box<Terms>>,
    /// DoNotSchedule topology spread constraints (usually none).
    pub spread: Vec<Constraint>,
    /// Preferred pod affinity and anti-affinity terms (scoring; `None`
    /// for most pods).
    pub preferred: Option<Box<Preferred>>,
    /// ScheduleAnyway topology spread constraints (scoring).
    pub soft_spread: Vec<Constraint>,
    /// Whether the spec has topology spread constraints of either kind:
    /// only a pod without any gets the default ones.
    pub has_spread_constraints: bool,
    /// The images of its init and app containers, one per container,
    /// with the `:latest` a bare name means (ImageLocality).
    pub images: Vec<String>,
    /// Has a deletionTimestamp (spreading does not count it).
    pub terminating: bool,
}

impl PodInfo {
    pub fn new(pod: Pod) -> PodInfo {
        let meta = &pod.metadata;
        let uid = meta.uid.clone().unwrap_or_default();
        let namespace = meta.namespace.clone().unwrap_or_default();
        let name = meta.name.clone().unwrap_or_default();
        let owner = meta
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
            .map(|o| o.uid.clone());
        let (requests, non_zero, host_ports, priority) = match &pod.spec {
            Some(spec) => {
                let nz = resources::pod_requests(spec, true);
                (
                    resources::pod_requests(spec, false),
                    (nz.cpu, nz.memory),
                    host_ports(spec),
                    spec.priority.unwrap_or(0),
                )
            }
            None => (Resources::default(), (0, 0), Vec::new(), 0),
        };
        let claims = storage::pod_claims(&pod);
        let terms = Terms::of(&pod);
        let spread = spread::constraints(&pod);
        let preferred = Preferred::of(&pod);
        let soft_spread = spread::soft_constraints(&pod);
        let has_spread_constraints = pod
            .spec
            .as_ref()
            .and_then(|s| s.topology_spread_constraints.as_ref())
            .is_some_and(|c| !c.is_empty());
        let images = pod
            .spec
            .iter()
            .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
            .filter_map(|c| c.image.as_deref())
            .map(normalized_image)
            .collect();
        let terminating = is_terminating(&pod);
        PodInfo {
            terms,
            spread,
            preferred,
            soft_spread,
            has_spread_constraints,
            images,
            terminating,
            claims,
            pod,
            uid,
            namespace,
            name,
            requests,
            non_zero_cpu: non_zero.0,
            non_zero_memory: non_zero.1,
            host_ports,
            owner,
            priority,
        }
    }

    /// What other pods' selectors are matched against.
    pub fn labels(&self) -> Option<&std::collections::BTreeMap<String, String>> {
        self.pod.metadata.labels.as_ref()
    }

    /// Whether other pods' placement matters to this one: it has
    /// required pod affinity or anti-affinity, or spread constraints.
    pub fn has_topology_rules(&self) -> bool {
        self.terms.is_some() || !self.spread.is_empty()
    }

    /// The spec (always present on pods from the API; empty otherwise).
    pub fn spec(&self) -> Option<&k8s_openapi::api::core::v1::PodSpec> {
        self.pod.spec.as_ref()
    }
}

/// Host ports of the app containers and of sidecars (restartable init
/// containers), which run for the pod's whole life; plain init containers
/// are done before the app starts and hold no ports (upstream
/// `GetContainerPorts`).
fn host_ports(spec: &k8s_openapi::api::core::v1::PodSpec) -> Vec<HostPort> {
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"));
    spec.containers
        .iter()
        .chain(sidecars)
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let port = p.host_port.filter(|h| *h > 0)?;
            Some(HostPort {
                ip: p
                    .host_ip
                    .clone()
                    .filter(|s| !s.is_empty())
                    .unwrap_or_else(|| HostPort::WILDCARD.to_string()),
                protocol: p
                    .protocol
                    .clone()
                    .filter(|s| !s.is_empty())
                    .unwrap_or_else(|| "TCP".to_string()),
                port,
            })
        })
        .collect()
}

/// An image name as node status lists it: a name without a tag means
/// `:latest` (upstream ImageLocality's `normalizedImageName`).
pub fn normalized_image(name: &str) -> String {
    let colon = name.rfind(':');
    let slash = name.rfind('/');
    if colon.is_none_or(|c| slash.is_some_and(|s| c <= s)) {
        format!("{name}:latest")
    } else {
        name.to_string()
    }
}

/// The node a pod is bound to, if any.
pub fn node_name(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

/// Succeeded or Failed: the pod holds no resources any more.
pub fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Has `spec.schedulingGates`: not to be scheduled yet.
pub fn is_gated(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|g| !g.is_empty())
}

/// Being deleted: not worth scheduling.
pub fn is_terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hp(ip: &str, proto: &str, port: i32) -> HostPort {
        HostPort {
            ip: ip.into(),
            protocol: proto.into(),
            port,
        }
    }

    #[test]
    fn host_port_conflicts() {
        let any = hp("0.0.0.0", "TCP", 80);
        assert!(any.conflicts(&hp("10.0.0.1", "TCP", 80)));
        assert!(hp("10.0.0.1", "TCP", 80).conflicts(&any));
        assert!(hp("10.0.0.1", "TCP", 80).conflicts(&hp("10.0.0.1", "TCP", 80)));
        assert!(!hp("10.0.0.1", "TCP", 80).conflicts(&hp("10.0.0.2", "TCP", 80)));
        assert!(!any.conflicts(&hp("0.0.0.0", "UDP", 80)));
        assert!(!any.conflicts(&hp("0.0.0.0", "TCP", 81)));
    }

    #[test]
    fn pod_facts() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1",
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "X", "name": "x", "uid": "other"},
                    {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "rs-uid", "controller": true}]},
            "spec": {"priority": 7, "containers": [{"name": "c", "image": "i",
                "ports": [{"containerPort": 80, "hostPort": 8080}, {"containerPort": 81}]}]}
        }))
        .unwrap();
        let info = PodInfo::new(pod);
        assert_eq!(info.owner.as_deref(), Some("rs-uid"));
        assert_eq!(info.priority, 7);
        assert_eq!(info.host_ports, vec![hp("0.0.0.0", "TCP", 8080)]);
        assert_eq!(info.non_zero_cpu, resources::DEFAULT_MILLI_CPU_REQUEST);
        assert!(info.requests.is_zero());
    }
}
