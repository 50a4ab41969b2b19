//! Node lifecycle controller: node health from Leases and status
//! heartbeats, the not-ready / unreachable NoExecute taints, the
//! NoSchedule taints that mirror node conditions and cordons
//! (upstream's TaintNodesByCondition), and taint-based eviction of the
//! pods on tainted nodes.
//!
//! Every `node_monitor_period`: a node whose Lease (in `kube-node-lease`)
//! and Ready heartbeat have not moved for `node_monitor_grace_period`
//! gets its conditions set Unknown ([`health`]), and the pods on nodes
//! whose Ready is Unknown are marked not ready (upstream's
//! MarkPodsNotReady: the agent that would do it is silent). After every
//! change: each node's taints follow its conditions and
//! `spec.unschedulable` (the agent only reports conditions, as the
//! kubelet; the scheduler heeds taints), and pods that
//! do not tolerate their node's NoExecute taints long enough are deleted
//! ([`eviction`]), at the deadline their tolerationSeconds set.

mod eviction;
mod health;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, PodCondition, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Api, ResourceExt};
use kube_util::events::{Recorder, Reporter};
use kube_util::informer::{Informer, Scope};
use serde_json::json;

use crate::{Ctx, Error};
use eviction::Verdict;
pub use health::{
    TAINT_DISK_PRESSURE, TAINT_MEMORY_PRESSURE, TAINT_NETWORK_UNAVAILABLE, TAINT_NOT_READY,
    TAINT_PID_PRESSURE, TAINT_UNREACHABLE,
};

/// Where node agents keep their heartbeat Leases (named after the node).
pub const LEASE_NAMESPACE: &str = "kube-node-lease";
/// How long an eviction is remembered, so one pod gets one delete and
/// one event while the cache catches up.
const EVICTED_MEMORY: Duration = Duration::from_secs(60);

pub async fn run(ctx: Ctx) -> Result<(), Error> {
    let client = ctx.client.clone();
    let nodes = ctx.informers.get::<Node>();
    let leases = ctx
        .informers
        .namespaced::<Lease>(LEASE_NAMESPACE, Scope::default());
    let pods = ctx.informers.get::<Pod>();
    let (mut node_changes, mut pod_changes) = (nodes.subscribe(), pods.subscribe());
    for ready in [
        nodes.ready().await,
        leases.ready().await,
        pods.ready().await,
    ] {
        ready.map_err(|e| Error::Config(e.to_string()))?;
    }
    let mut lc = Lifecycle {
        client: client.clone(),
        events: Recorder::new(client, Reporter::new("node-controller")),
        grace: ctx.config.node_monitor_grace_period,
        health: health::Health::default(),
        first_seen: HashMap::new(),
        evicted: HashMap::new(),
    };
    let mut tick = tokio::time::interval(ctx.config.node_monitor_period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut wake: Option<tokio::time::Instant> = None;
    loop {
        let deadline = async {
            match wake {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tick.tick() => {
                let node_list = nodes.list();
                lc.monitor_health(&node_list, &leases).await;
                lc.mark_pods_not_ready(&node_list, &pods.list()).await;
            }
            _ = node_changes.changed() => {}
            _ = pod_changes.changed() => {}
            _ = deadline => {}
        }
        let node_list = nodes.list();
        lc.sync_taints(&node_list).await;
        wake = lc.evict(&node_list, &pods.list()).await;
    }
}

struct Lifecycle {
    client: kube::Client,
    events: Recorder,
    grace: Duration,
    health: health::Health,
    /// NoExecute taints without timeAdded: when this process first saw
    /// them, by (node, key, effect).
    first_seen: HashMap<(String, String, String), jiff::Timestamp>,
    /// Pods deleted by eviction, by uid, and when.
    evicted: HashMap<String, Instant>,
}

impl Lifecycle {
    /// Mark overdue nodes' conditions Unknown.
    async fn monitor_health(&mut self, nodes: &[Arc<Node>], leases: &Informer<Lease>) {
        let now = Instant::now();
        let names: HashSet<String> = nodes.iter().map(|n| n.name_any()).collect();
        self.health.retain(|n| names.contains(n));
        for node in nodes {
            let name = node.name_any();
            let lease = leases.get(Some(LEASE_NAMESPACE), &name);
            if !self.health.overdue(node, lease.as_deref(), now, self.grace) {
                continue;
            }
            let Some(conds) = health::unknown_conditions(node, jiff::Timestamp::now()) else {
                continue;
            };
            let was_ready = health::ready_status(node) == Some("True");
            let patch = json!({
                "metadata": {"resourceVersion": node.resource_version()},
                "status": {"conditions": conds},
            });
            let api: Api<Node> = Api::all(self.client.clone());
            match api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    tracing::warn!(node = %name, grace = ?self.grace, "node stopped posting status: conditions set Unknown");
                    if was_ready {
                        self.events.normal(
                            &**node,
                            "NodeNotReady",
                            format!("Node {name} status is now: NodeNotReady"),
                        );
                    }
                }
                // 409: the agent wrote meanwhile; the next tick judges again.
                Err(e) => tracing::info!(node = %name, "marking node status Unknown failed: {e}"),
            }
        }
    }

    /// Pods on nodes whose Ready is Unknown: Ready=False (their agent
    /// cannot say so itself).
    async fn mark_pods_not_ready(&mut self, nodes: &[Arc<Node>], pods: &[Arc<Pod>]) {
        let unknown: HashSet<String> = nodes
            .iter()
            .filter(|n| health::ready_status(n) == Some("Unknown"))
            .map(|n| n.name_any())
            .collect();
        if unknown.is_empty() {
            return;
        }
        for pod in pods {
            let on = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
            if !on.is_some_and(|n| unknown.contains(n)) {
                continue;
            }
            let Some(conds) = not_ready(pod) else {
                continue;
            };
            let patch = json!({
                "metadata": {"resourceVersion": pod.resource_version()},
                "status": {"conditions": conds},
            });
            let api: Api<Pod> =
                Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
            match api
                .patch_status(
                    &pod.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
            {
                Ok(_) => {
                    tracing::info!(pod = %pod.name_any(), namespace = ?pod.namespace(), node = ?on, "marked pod not ready: its node is unreachable");
                    self.events
                        .warning(&**pod, "NodeNotReady", "Node is not ready".into());
                }
                Err(e) => {
                    tracing::info!(pod = %pod.name_any(), "marking pod not ready failed: {e}")
                }
            }
        }
    }

    /// Each node's controller-owned taints (NoExecute from Ready,
    /// NoSchedule from every condition and the cordon) to match, in one
    /// patch per node that needs one.
    async fn sync_taints(&mut self, nodes: &[Arc<Node>]) {
        for node in nodes {
            let Some(taints) = health::desired_taints(node, jiff::Timestamp::now()) else {
                continue;
            };
            let name = node.name_any();
            let patch = json!({
                "metadata": {"resourceVersion": node.resource_version()},
                "spec": {"taints": taints},
            });
            let api: Api<Node> = Api::all(self.client.clone());
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    let keys: Vec<String> = taints
                        .iter()
                        .map(|t| format!("{}:{}", t.key, t.effect))
                        .collect();
                    tracing::info!(node = %name, ready = ?health::ready_status(node), taints = ?keys, "node taints updated");
                }
                // A conflict or a failure is tried again on the next pass.
                Err(e) => tracing::info!(node = %name, "updating node taints failed: {e}"),
            }
        }
    }

    /// Delete the pods whose time on a tainted node is up; returns when
    /// the next one is due.
    async fn evict(
        &mut self,
        nodes: &[Arc<Node>],
        pods: &[Arc<Pod>],
    ) -> Option<tokio::time::Instant> {
        let now = jiff::Timestamp::now();
        self.evicted.retain(|_, at| at.elapsed() < EVICTED_MEMORY);
        let mut tainted: HashMap<String, Vec<Taint>> = HashMap::new();
        for n in nodes {
            let noexec: Vec<Taint> = n
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .into_iter()
                .flatten()
                .filter(|t| t.effect == health::NO_EXECUTE)
                .cloned()
                .collect();
            if !noexec.is_empty() {
                tainted.insert(n.name_any(), noexec);
            }
        }
        let live: HashSet<(String, String, String)> = tainted
            .iter()
            .flat_map(|(n, ts)| {
                ts.iter()
                    .map(move |t| (n.clone(), t.key.clone(), t.effect.clone()))
            })
            .collect();
        self.first_seen.retain(|k, _| live.contains(k));
        if tainted.is_empty() {
            return None;
        }
        let mut next: Option<jiff::Timestamp> = None;
        for pod in pods {
            if pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) else {
                continue;
            };
            let Some(taints) = tainted.get(node) else {
                continue;
            };
            let first_seen = &mut self.first_seen;
            for t in taints.iter().filter(|t| t.time_added.is_none()) {
                first_seen
                    .entry((node.to_string(), t.key.clone(), t.effect.clone()))
                    .or_insert(now);
            }
            let added = |t: &Taint| {
                first_seen
                    .get(&(node.to_string(), t.key.clone(), t.effect.clone()))
                    .copied()
                    .unwrap_or(now)
            };
            match eviction::verdict(pod, taints, now, added) {
                Verdict::Keep => {}
                Verdict::EvictAt(at) => next = Some(next.map_or(at, |n| n.min(at))),
                Verdict::EvictNow => self.evict_pod(pod, node).await,
            }
        }
        let at = next?;
        let wait = now.duration_until(at).unsigned_abs();
        // A little late rather than early: the deadline must have passed.
        Some(tokio::time::Instant::now() + wait + Duration::from_millis(10))
    }

    async fn evict_pod(&mut self, pod: &Pod, node: &str) {
        let uid = pod.uid().unwrap_or_default();
        if self.evicted.contains_key(&uid) {
            return;
        }
        let ns = pod.namespace().unwrap_or_default();
        let name = pod.name_any();
        self.events.normal(
            pod,
            "TaintManagerEviction",
            format!("Marking for deletion Pod {ns}/{name}"),
        );
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        };
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        match api.delete(&name, &dp).await {
            Ok(_) => {
                tracing::info!(pod = %name, namespace = %ns, node, "evicted pod from tainted node");
                self.evicted.insert(uid, Instant::now());
            }
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(e) => {
                tracing::warn!(pod = %name, namespace = %ns, node, "evicting pod failed, retrying: {e}")
            }
        }
    }
}

/// The pod's conditions with Ready False, or None if it is not Ready.
fn not_ready(pod: &Pod) -> Option<Vec<PodCondition>> {
    let mut conds = pod.status.as_ref()?.conditions.clone()?;
    let ready = conds
        .iter_mut()
        .find(|c| c.type_ == "Ready" && c.status == "True")?;
    ready.status = "False".into();
    ready.last_transition_time = Some(Time(jiff::Timestamp::now()));
    Some(conds)
}
