//! Filters: can this pod run on this node? Pure functions of the pod's
//! and node's facts, run in upstream's plugin order (NodeUnschedulable,
//! TaintToleration, NodeAffinity, NodePorts, NodeResourcesFit,
//! VolumeRestrictions, VolumeBinding, PodTopologySpread,
//! InterPodAffinity) and stopping at the first that fails, so that each
//! node adds the reasons of one filter to the FailedScheduling message,
//! as upstream's do. The volume filters read what [`crate::volumes`]
//! found for the pod once per attempt, the last two what [`Topology`]
//! counted.
//!
//! The happy path allocates nothing: reasons are borrowed and only
//! formatted when no node fits.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::{PodSpec, Toleration};
use kube_util::nodeaffinity;
use kube_util::taints::{self, tolerates_parts, NO_SCHEDULE};
// The node lifecycle controller puts TAINT_NOT_READY on a node whose
// Ready condition is False (TAINT_UNREACHABLE for Unknown); the filters
// treat a not-ready node as carrying it even before the controller has
// acted, so that only pods tolerating it (DaemonSet pods) land there.
pub use kube_util::taints::{TAINT_NOT_READY, TAINT_UNREACHABLE, TAINT_UNSCHEDULABLE};

use crate::cache::Cache;
use crate::nodeinfo::{NodeInfo, Readiness};
use crate::podinfo::PodInfo;
use crate::volumes::PodVolumes;
use crate::{interpod, spread};

/// Why a node was filtered out. `Display` gives upstream's wording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason<'a> {
    /// `spec.unschedulable` (cordoned) and not tolerated.
    Unschedulable,
    /// The first NoSchedule/NoExecute taint the pod does not tolerate.
    Taint { key: &'a str, value: &'a str },
    /// nodeSelector or required node affinity not met.
    NodeAffinity,
    /// A requested host port is taken.
    HostPorts,
    /// Allocatable pods reached.
    TooManyPods,
    /// Not enough of a resource left.
    Insufficient(&'a str),
    /// A ReadWriteOncePod claim of the pod is in use by another pod
    /// (upstream reports it on every node: preemption might help).
    ReadWriteOncePodConflict,
    /// A bound volume's nodeAffinity excludes the node.
    VolumeNodeAffinity,
    /// An unbound claim finds no volume and cannot be provisioned here.
    VolumeBindConflict,
    /// A bound claim's volume does not exist.
    VolumeMissing,
    /// The node lacks a topology spread constraint's key.
    SpreadMissingLabel,
    /// A topology spread constraint's maxSkew would be exceeded.
    Spread,
    /// A required pod affinity term is not met in the node's domain.
    PodAffinity,
    /// A required pod anti-affinity term is broken in the node's domain.
    PodAntiAffinity,
    /// A pod in the node's domain has a required anti-affinity term
    /// against this pod.
    ExistingPodsAntiAffinity,
}

impl fmt::Display for Reason<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Unschedulable => f.write_str("node(s) were unschedulable"),
            Reason::Taint { key, value } => {
                write!(f, "node(s) had untolerated taint {{{key}: {value}}}")
            }
            Reason::NodeAffinity => {
                f.write_str("node(s) didn't match Pod's node affinity/selector")
            }
            Reason::HostPorts => {
                f.write_str("node(s) didn't have free ports for the requested pod ports")
            }
            Reason::TooManyPods => f.write_str("Too many pods"),
            Reason::Insufficient(r) => write!(f, "Insufficient {r}"),
            Reason::ReadWriteOncePodConflict => f.write_str(
                "node has pod using PersistentVolumeClaim with the same name and ReadWriteOncePod access mode",
            ),
            Reason::VolumeNodeAffinity => f.write_str("node(s) had volume node affinity conflict"),
            Reason::VolumeBindConflict => {
                f.write_str("node(s) didn't find available persistent volumes to bind")
            }
            Reason::VolumeMissing => f.write_str(
                "node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)",
            ),
            Reason::SpreadMissingLabel => f.write_str(
                "node(s) didn't match pod topology spread constraints (missing required label)",
            ),
            Reason::Spread => f.write_str("node(s) didn't match pod topology spread constraints"),
            Reason::PodAffinity => f.write_str("node(s) didn't match pod affinity rules"),
            Reason::PodAntiAffinity => f.write_str("node(s) didn't match pod anti-affinity rules"),
            Reason::ExistingPodsAntiAffinity => {
                f.write_str("node(s) didn't satisfy existing pods anti-affinity rules")
            }
        }
    }
}

/// What the filters that look at other pods counted for one attempt
/// (upstream's PreFilter states of PodTopologySpread and
/// InterPodAffinity). Both are `None` for a pod without such rules in a
/// cluster without pods with required anti-affinity: nothing allocated.
#[derive(Debug, Default)]
pub struct Topology {
    pub spread: Option<spread::State>,
    pub interpod: Option<interpod::State>,
}

impl Topology {
    /// Nothing to check.
    pub const NONE: Topology = Topology {
        spread: None,
        interpod: None,
    };

    /// Count what `pod`'s checks need over the pods in `cache`.
    pub fn prefilter(pod: &PodInfo, cache: &Cache) -> Topology {
        Topology {
            spread: spread::State::prefilter(pod, cache),
            interpod: interpod::State::prefilter(pod, cache),
        }
    }

    fn check(&self, pod: &PodInfo, node: &NodeInfo) -> Option<Reason<'static>> {
        if let Some(v) = self.spread.as_ref().and_then(|s| s.check(pod, node)) {
            return Some(match v {
                spread::Violation::MissingLabel => Reason::SpreadMissingLabel,
                spread::Violation::Skew => Reason::Spread,
            });
        }
        let v = self.interpod.as_ref()?.check(pod, node)?;
        Some(match v {
            interpod::Violation::Affinity => Reason::PodAffinity,
            interpod::Violation::AntiAffinity => Reason::PodAntiAffinity,
            interpod::Violation::ExistingAntiAffinity => Reason::ExistingPodsAntiAffinity,
        })
    }
}

/// Run the filters for `pod` (with `volumes`, what
/// [`crate::volumes::Volumes::prefilter`] found, when it has claims, and
/// `topology`, what the topology spread and inter-pod affinity checks
/// counted for this attempt) on `node`; `report` receives the reasons of
/// the first filter that fails. Returns true when the pod fits.
pub fn check<'a>(
    pod: &'a PodInfo,
    volumes: Option<&PodVolumes>,
    topology: &Topology,
    node: &'a NodeInfo,
    report: &mut impl FnMut(Reason<'a>),
) -> bool {
    let Some(spec) = pod.spec() else {
        return false;
    };
    let tolerations = spec.tolerations.as_deref().unwrap_or(&[]);
    if let Some(r) = unschedulable(tolerations, node) {
        report(r);
        return false;
    }
    if let Some(r) = untolerated_taint(tolerations, node) {
        report(r);
        return false;
    }
    if !node_affinity(spec, node) {
        report(Reason::NodeAffinity);
        return false;
    }
    if !ports_free(pod, node) {
        report(Reason::HostPorts);
        return false;
    }
    if !resources_fit(pod, node, report) {
        return false;
    }
    if let Some(v) = volumes {
        if !volumes_fit(v, node, report) {
            return false;
        }
    }
    match topology.check(pod, node) {
        Some(r) => {
            report(r);
            false
        }
        None => true,
    }
}

/// True when `pod` fits `node`.
pub fn fits(
    pod: &PodInfo,
    volumes: Option<&PodVolumes>,
    topology: &Topology,
    node: &NodeInfo,
) -> bool {
    check(pod, volumes, topology, node, &mut |_| {})
}

/// VolumeRestrictions (ReadWriteOncePod), then VolumeBinding, whose
/// reasons come in upstream's order.
fn volumes_fit<'a>(
    volumes: &PodVolumes,
    node: &NodeInfo,
    report: &mut impl FnMut(Reason<'a>),
) -> bool {
    if volumes.rwop_conflict {
        report(Reason::ReadWriteOncePodConflict);
        return false;
    }
    let Err(c) = volumes.check(node) else {
        return true;
    };
    if c.node_affinity {
        report(Reason::VolumeNodeAffinity);
    }
    if c.bind {
        report(Reason::VolumeBindConflict);
    }
    if c.missing_volume {
        report(Reason::VolumeMissing);
    }
    false
}

fn unschedulable<'a>(tolerations: &[Toleration], node: &NodeInfo) -> Option<Reason<'a>> {
    let tolerated = || {
        tolerations
            .iter()
            .any(|t| tolerates_parts(t, TAINT_UNSCHEDULABLE, "", NO_SCHEDULE))
    };
    (node.unschedulable && !tolerated()).then_some(Reason::Unschedulable)
}

fn untolerated_taint<'a>(tolerations: &[Toleration], node: &'a NodeInfo) -> Option<Reason<'a>> {
    let taints = node.taints();
    if let Some(t) = taints::untolerated_blocking(taints, tolerations) {
        return Some(Reason::Taint {
            key: &t.key,
            value: t.value.as_deref().unwrap_or(""),
        });
    }
    let condition_taint = match node.readiness {
        Readiness::Ready => return None,
        Readiness::NotReady => TAINT_NOT_READY,
        Readiness::Unknown => TAINT_UNREACHABLE,
    };
    // Already tainted NoSchedule (TaintNodesByCondition): judged above.
    // The node lifecycle controller's NoExecute taint alone does not keep
    // new pods away: every pod tolerates it for a while (default
    // tolerations), and upstream's NoSchedule twin is what the scheduler
    // heeds.
    if taints
        .iter()
        .any(|t| t.key == condition_taint && t.effect == NO_SCHEDULE)
    {
        return None;
    }
    let tolerated = tolerations
        .iter()
        .any(|t| tolerates_parts(t, condition_taint, "", NO_SCHEDULE));
    (!tolerated).then_some(Reason::Taint {
        key: condition_taint,
        value: "",
    })
}

/// nodeSelector and required node affinity (upstream NodeAffinity).
pub fn node_affinity(spec: &PodSpec, node: &NodeInfo) -> bool {
    nodeaffinity::pod_matches(spec, node.labels(), &node.name)
}

fn ports_free(pod: &PodInfo, node: &NodeInfo) -> bool {
    pod.host_ports
        .iter()
        .all(|want| !node.host_ports.iter().any(|used| used.conflicts(want)))
}

/// Upstream NodeResourcesFit: pod count, then every resource the pod
/// requests (a resource it does not request never blocks it, even on an
/// overcommitted node). Reports every insufficient resource.
fn resources_fit<'a>(
    pod: &'a PodInfo,
    node: &'a NodeInfo,
    report: &mut impl FnMut(Reason<'a>),
) -> bool {
    let mut ok = true;
    if node.pod_count + 1 > node.allowed_pods {
        report(Reason::TooManyPods);
        ok = false;
    }
    let req = &pod.requests;
    let (alloc, used) = (&node.allocatable, &node.requested);
    if req.cpu > 0 && req.cpu > alloc.cpu - used.cpu {
        report(Reason::Insufficient("cpu"));
        ok = false;
    }
    if req.memory > 0 && req.memory > alloc.memory - used.memory {
        report(Reason::Insufficient("memory"));
        ok = false;
    }
    for (name, want) in &req.scalars {
        if *want > 0 && *want > alloc.scalar(name) - used.scalar(name) {
            report(Reason::Insufficient(name));
            ok = false;
        }
    }
    ok
}

/// Upstream's FailedScheduling message: "0/N nodes are available: " and
/// the histogram of reasons as "COUNT REASON" strings sorted as strings
/// (upstream `FitError.Error`), e.g. "0/3 nodes are available: 1 node(s)
/// had untolerated taint {k: v}, 2 Insufficient cpu."
pub fn fit_error<'a>(
    pod: &'a PodInfo,
    volumes: Option<&PodVolumes>,
    topology: &Topology,
    nodes: impl Iterator<Item = &'a NodeInfo>,
) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let mut total = 0;
    for node in nodes {
        total += 1;
        check(pod, volumes, topology, node, &mut |r| {
            *counts.entry(r.to_string()).or_default() += 1
        });
    }
    unavailable(total, &counts)
}

/// "0/N nodes are available: " and the histogram of `counts` (reason
/// to nodes) as "COUNT REASON" strings sorted as strings (upstream
/// `FitError.Error`).
pub fn unavailable(total: usize, counts: &BTreeMap<String, usize>) -> String {
    if total == 0 {
        return "no nodes available to schedule pods".to_string();
    }
    let mut parts: Vec<String> = counts.iter().map(|(r, n)| format!("{n} {r}")).collect();
    parts.sort();
    format!("0/{total} nodes are available: {}.", parts.join(", "))
}

/// The FailedScheduling message when a check of the whole pod failed
/// before any node was tried (upstream's PreFilter message, which takes
/// the place of the per-node reasons): "0/N nodes are available:
/// MESSAGE."
pub fn prefilter_error(nodes: usize, message: &str) -> String {
    if nodes == 0 {
        return "no nodes available to schedule pods".to_string();
    }
    format!("0/{nodes} nodes are available: {message}.")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Node, Pod};
    use serde_json::{json, Value};

    fn node(name: &str, extra: Value) -> NodeInfo {
        let mut v = json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {},
            "status": {"allocatable": {"cpu": "2", "memory": "4Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}]}
        });
        merge(&mut v, extra);
        let mut n = NodeInfo::new(name);
        n.set_node(serde_json::from_value::<Node>(v).unwrap());
        n
    }

    fn pod(spec: Value) -> PodInfo {
        let mut v = json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"containers": [{"name": "c", "image": "i"}]}
        });
        merge(&mut v, json!({ "spec": spec }));
        PodInfo::new(serde_json::from_value::<Pod>(v).unwrap())
    }

    fn merge(a: &mut Value, b: Value) {
        match (a, b) {
            (Value::Object(a), Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    fn reasons(p: &PodInfo, n: &NodeInfo) -> Vec<String> {
        let mut out = Vec::new();
        check(p, None, &Topology::NONE, n, &mut |r| {
            out.push(r.to_string())
        });
        out
    }

    fn requesting(cpu: &str, memory: &str) -> PodInfo {
        pod(json!({"containers": [{"name": "c", "image": "i",
            "resources": {"requests": {"cpu": cpu, "memory": memory}}}]}))
    }

    #[test]
    fn resources_fit_against_allocatable_minus_requested() {
        let mut n = node("n", json!({}));
        let p = requesting("1500m", "1Gi");
        assert!(fits(&p, None, &Topology::NONE, &n));
        n.add_pod(&p);
        assert_eq!(reasons(&p, &n), ["Insufficient cpu"]);
        let big = requesting("100m", "8Gi");
        assert_eq!(reasons(&big, &n), ["Insufficient memory"]);
        let both = requesting("1", "8Gi");
        assert_eq!(
            reasons(&both, &n),
            ["Insufficient cpu", "Insufficient memory"]
        );
        // A pod requesting nothing fits an overcommitted node.
        assert!(fits(&pod(json!({})), None, &Topology::NONE, &n));
    }

    #[test]
    fn max_pods() {
        let mut n = node("n", json!({"status": {"allocatable": {"pods": "1"}}}));
        let p = pod(json!({}));
        assert!(fits(&p, None, &Topology::NONE, &n));
        n.add_pod(&p);
        assert_eq!(reasons(&p, &n), ["Too many pods"]);
    }

    #[test]
    fn extended_resources() {
        let n = node(
            "n",
            json!({"status": {"allocatable": {"example.com/gpu": "1"}}}),
        );
        let p = pod(json!({"containers": [{"name": "c", "image": "i",
            "resources": {"requests": {"example.com/gpu": "2"}}}]}));
        assert_eq!(reasons(&p, &n), ["Insufficient example.com/gpu"]);
    }

    #[test]
    fn readiness_and_cordon() {
        let p = pod(json!({}));
        let not_ready = node(
            "n",
            json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
        );
        assert_eq!(
            reasons(&p, &not_ready),
            ["node(s) had untolerated taint {node.kubernetes.io/not-ready: }"]
        );
        let unknown = node("n", json!({"status": {"conditions": []}}));
        assert!(!fits(&p, None, &Topology::NONE, &unknown));
        let daemon = pod(json!({"tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoSchedule"}]}));
        assert!(fits(&daemon, None, &Topology::NONE, &not_ready));
        let cordoned = node("n", json!({"spec": {"unschedulable": true}}));
        assert_eq!(reasons(&p, &cordoned), ["node(s) were unschedulable"]);
        let tolerant = pod(
            json!({"tolerations": [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}]}),
        );
        assert!(fits(&tolerant, None, &Topology::NONE, &cordoned));
        // An unreachable node with only the lifecycle controller's NoExecute
        // taint takes no new pods, though every pod tolerates that taint
        // for a while.
        let lost = node(
            "n",
            json!({"spec": {"taints": [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]},
                   "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}),
        );
        let defaulted = pod(json!({"tolerations": [
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]}));
        assert_eq!(
            reasons(&defaulted, &lost),
            ["node(s) had untolerated taint {node.kubernetes.io/unreachable: }"]
        );
    }

    #[test]
    fn taints_and_tolerations() {
        let n = node(
            "n",
            json!({"spec": {"taints": [
            {"key": "soft", "value": "x", "effect": "PreferNoSchedule"},
            {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]}}),
        );
        assert_eq!(
            reasons(&pod(json!({})), &n),
            ["node(s) had untolerated taint {dedicated: gpu}"]
        );
        let cases = [
            (
                json!({"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}),
                true,
            ),
            (json!({"key": "dedicated", "value": "gpu"}), true),
            (json!({"key": "dedicated", "operator": "Exists"}), true),
            (json!({"operator": "Exists"}), true),
            (json!({"key": "dedicated", "value": "cpu"}), false),
            (
                json!({"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}),
                false,
            ),
            (json!({"key": "other", "operator": "Exists"}), false),
        ];
        for (tol, ok) in cases {
            let p = pod(json!({"tolerations": [tol.clone()]}));
            assert_eq!(fits(&p, None, &Topology::NONE, &n), ok, "{tol}");
        }
    }

    #[test]
    fn node_selector_and_affinity() {
        let n = node(
            "n1",
            json!({"metadata": {"labels": {"disk": "ssd", "cores": "8"}}}),
        );
        let sel = |s: Value| pod(json!({"nodeSelector": s}));
        assert!(fits(
            &sel(json!({"disk": "ssd"})),
            None,
            &Topology::NONE,
            &n
        ));
        assert_eq!(
            reasons(&sel(json!({"disk": "hdd"})), &n),
            ["node(s) didn't match Pod's node affinity/selector"]
        );
        let aff = |terms: Value| {
            pod(
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}}),
            )
        };
        // The operators are kube-util's (tested there); here, that the
        // filter applies required terms, the node's name included.
        let cases = [
            (
                aff(
                    json!([{"matchExpressions": [{"key": "disk", "operator": "In", "values": ["hdd"]}]}]),
                ),
                false,
            ),
            (
                aff(
                    json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]),
                ),
                true,
            ),
            // Terms are ORed.
            (
                aff(json!([
                {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["hdd"]}]},
                {"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["4"]}]}])),
                true,
            ),
        ];
        for (i, (p, ok)) in cases.iter().enumerate() {
            assert_eq!(fits(p, None, &Topology::NONE, &n), *ok, "case {i}");
        }
    }

    #[test]
    fn host_ports() {
        let with_port = |port: i64, ip: &str| {
            pod(json!({"containers": [{"name": "c", "image": "i",
                "ports": [{"containerPort": 80, "hostPort": port, "hostIP": ip}]}]}))
        };
        let mut n = node("n", json!({}));
        n.add_pod(&with_port(8080, "127.0.0.1"));
        assert_eq!(
            reasons(&with_port(8080, ""), &n),
            ["node(s) didn't have free ports for the requested pod ports"]
        );
        assert!(fits(
            &with_port(8080, "127.0.0.2"),
            None,
            &Topology::NONE,
            &n
        ));
        assert!(fits(&with_port(8081, ""), None, &Topology::NONE, &n));
    }

    #[test]
    fn message_counts_and_sorts_like_upstream() {
        let mut full = node("a", json!({}));
        full.add_pod(&requesting("2", "0"));
        let mut full2 = node("b", json!({}));
        full2.add_pod(&requesting("2", "0"));
        let tainted = node(
            "c",
            json!({"spec": {"taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}]}}),
        );
        let p = requesting("1", "0");
        let nodes = [full, full2, tainted];
        assert_eq!(
            fit_error(&p, None, &Topology::NONE, nodes.iter()),
            "0/3 nodes are available: 1 node(s) had untolerated taint {k: v}, 2 Insufficient cpu."
        );
        assert_eq!(
            fit_error(&p, None, &Topology::NONE, [].iter()),
            "no nodes available to schedule pods"
        );
    }
}
