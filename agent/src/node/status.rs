//! The node status loop (the kubelet's `syncNodeStatus`): every
//! `node_status_update_frequency` compute the node's status (capacity,
//! allocatable, addresses, nodeInfo, conditions) and patch `nodes/status`
//! when it changed, or at least every `node_status_report_frequency`.
//! The loop also registers the Node (again, if someone deleted it) and
//! follows the stored Node through a watch, for its uid and `podCIDR`.

use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Api;
use tokio::sync::watch;
use tokio::time::Instant;

use super::conditions;
use super::register::{self, initial_node, owned_labels};
use super::{call, Outage, Result, Retry, RuntimeProbe, API_TIMEOUT};
use crate::config::Config;
use crate::events::{ApiRecorder, NORMAL};
use crate::node::Facts;

/// While the node is not Ready, status is recomputed this often, so that
/// it turns Ready soon after the runtime does (the kubelet's fast status
/// update at start-up).
const FAST_UPDATE: Duration = Duration::from_secs(1);

/// Who receives what the loop learns.
pub struct Outputs {
    /// The pod CIDR: `--pod-cidr`, else the Node's `spec.podCIDR`.
    /// Receivers: the CNI writer and whoever else the agent wires.
    pub pod_cidr: watch::Sender<Option<String>>,
    /// The Node's uid, for the Lease's owner reference.
    pub node_uid: watch::Sender<Option<String>>,
}

/// Computes the node's status and decides whether to post it.
pub struct Reporter {
    name: String,
    facts: Arc<Facts>,
    probe: Arc<dyn RuntimeProbe>,
    /// What was last posted, heartbeats and transition times cleared: the
    /// facts half of "did anything change".
    last_sent: Option<NodeStatus>,
    last_report: Option<Instant>,
    report_every: Duration,
    ready: bool,
    /// The eviction manager's pressure conditions; None: never any.
    pressure: Option<Arc<crate::pressure::Pressure>>,
}

impl Reporter {
    pub fn new(
        name: &str,
        facts: Arc<Facts>,
        probe: Arc<dyn RuntimeProbe>,
        report_every: Duration,
    ) -> Reporter {
        Reporter {
            name: name.to_string(),
            facts,
            probe,
            last_sent: None,
            last_report: None,
            report_every,
            ready: false,
            pressure: None,
        }
    }

    /// Report the pressure conditions `pressure` holds.
    pub fn with_pressure(mut self, pressure: Option<Arc<crate::pressure::Pressure>>) -> Reporter {
        self.pressure = pressure;
        self
    }

    /// Whether the last computed status was Ready.
    pub fn ready(&self) -> bool {
        self.ready
    }

    /// Forget what was sent: the next sync posts (a re-created Node).
    pub fn reset(&mut self) {
        self.last_sent = None;
        self.last_report = None;
    }

    /// The status this node would report now, given the stored one.
    pub async fn desired(&self, stored: Option<&NodeStatus>) -> NodeStatus {
        let health = self.probe.probe().await;
        let node = self.facts.node(&self.name, &health.version, health.ready());
        let mut status = node.status.unwrap_or_default();
        status.images = match self.probe.images().await {
            Some(images) => Some(images),
            None => stored.and_then(|s| s.images.clone()),
        };
        let previous = stored
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        if let Some(c) = status.conditions.as_mut() {
            if let Some(p) = &self.pressure {
                p.apply(c);
            }
            conditions::stamp(&previous, c, &Time(jiff::Timestamp::now()));
        }
        status
    }

    /// Post the status if it changed or a report is due. Returns the
    /// patched Node, or None when nothing needed posting. Node events
    /// (NodeReady, NodeHasSufficientMemory ...) go to `recorder` once the
    /// change is stored.
    ///
    /// # Errors
    /// The patch failed; 404 means the Node is gone.
    pub async fn sync(
        &mut self,
        api: &Api<Node>,
        stored: &Node,
        recorder: Option<&ApiRecorder>,
    ) -> Result<Option<Node>> {
        let stored_status = stored.status.as_ref();
        let desired = self.desired(stored_status).await;
        let previous = stored_status
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        let wanted = desired.conditions.clone().unwrap_or_default();
        self.ready = conditions::is_ready(&wanted);
        let facts_changed = self.last_sent.as_ref() != Some(&without_times(&desired));
        let due = self
            .last_report
            .is_none_or(|t| t.elapsed() >= self.report_every);
        if !facts_changed && !due && !conditions::changed(&previous, &wanted) {
            return Ok(None);
        }
        let patch = serde_json::json!({ "status": {
            "capacity": desired.capacity,
            "allocatable": desired.allocatable,
            "addresses": desired.addresses,
            "nodeInfo": desired.node_info,
            "conditions": desired.conditions,
            "daemonEndpoints": desired.daemon_endpoints,
            "images": desired.images,
        }});
        let node = call(
            "updating the status of",
            &format!("node {}", self.name),
            API_TIMEOUT,
            api.patch_status(
                &self.name,
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            ),
        )
        .await?;
        self.last_sent = Some(without_times(&desired));
        self.last_report = Some(Instant::now());
        self.announce(&previous, &node, recorder);
        Ok(Some(node))
    }

    /// Record an event for each condition of `stored` whose status differs
    /// from `previous` (`Node n1 status is now: NodeReady`).
    pub fn announce(
        &self,
        previous: &[NodeCondition],
        stored: &Node,
        recorder: Option<&ApiRecorder>,
    ) {
        let Some(r) = recorder else { return };
        let now = stored
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default();
        for reason in conditions::transitions(previous, now) {
            let msg = format!("Node {} status is now: {reason}", self.name);
            r.node_event(NORMAL, reason, &msg);
        }
    }
}

/// `status` without heartbeat and transition times.
fn without_times(status: &NodeStatus) -> NodeStatus {
    let mut s = status.clone();
    for c in s.conditions.iter_mut().flatten() {
        c.last_heartbeat_time = None;
        c.last_transition_time = None;
    }
    s
}

/// Everything the node loop needs.
pub struct NodeLoop {
    pub client: kube::Client,
    pub config: Arc<Config>,
    pub facts: Arc<Facts>,
    pub probe: Arc<dyn RuntimeProbe>,
    pub recorder: Option<ApiRecorder>,
    pub outputs: Outputs,
    pub pressure: Option<Arc<crate::pressure::Pressure>>,
    /// Set once the `--pod-cidr` / `spec.podCIDR` mismatch was logged.
    pub cidr_warned: AtomicBool,
}

impl NodeLoop {
    /// Register, then report status, until `stop` turns true. API errors
    /// are retried with back-off; nothing here ever gives up.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let name = self.config.node_name.clone();
        let api: Api<Node> = Api::all(self.client.clone());
        let wc = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let mut nodes = pin!(watcher(api.clone(), wc).default_backoff());
        let mut reporter = Reporter::new(
            &name,
            self.facts.clone(),
            self.probe.clone(),
            self.config.node_status_report_frequency,
        )
        .with_pressure(self.pressure.clone());
        let labels = owned_labels(&self.config, &self.facts);
        let mut known: Option<Node> = None;
        // Without --register-node the loop only reports on a Node that
        // someone else created.
        let mut registered = !self.config.register_node;
        let mut listed_self = false;
        let mut retry = Retry::new(Duration::from_millis(100), Duration::from_secs(7));
        let mut outage = Outage::new(format!("node {name}"));
        let mut next = Instant::now();
        self.publish(None);
        loop {
            tokio::select! {
                ev = nodes.next() => {
                    match ev {
                        Some(Ok(watcher::Event::Init)) => listed_self = false,
                        Some(Ok(watcher::Event::InitApply(n))) => {
                            listed_self = true;
                            known = Some(n);
                        }
                        Some(Ok(watcher::Event::InitDone)) if !listed_self && known.is_some() => {
                            // The node vanished while the watch was down.
                            known = None;
                            registered = !self.config.register_node;
                            reporter.reset();
                            next = Instant::now();
                        }
                        Some(Ok(watcher::Event::Apply(n))) => known = Some(n),
                        Some(Ok(watcher::Event::Delete(_))) => {
                            tracing::warn!(node = %name, "Node object was deleted; registering again");
                            known = None;
                            registered = !self.config.register_node;
                            reporter.reset();
                            next = Instant::now();
                        }
                        Some(Ok(watcher::Event::InitDone)) => {}
                        // The watcher backs off and re-lists by itself.
                        Some(Err(e)) => tracing::debug!(node = %name, "watching the Node: {e}"),
                        None => {}
                    }
                    self.publish(known.as_ref());
                    continue;
                }
                () = tokio::time::sleep_until(next) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            if !registered {
                let status = reporter.desired(None).await;
                let node = initial_node(&self.config, &self.facts, Some(status));
                match register::register(&api, &node, &labels).await {
                    Ok((n, created)) => {
                        outage.ok();
                        retry.reset();
                        tracing::info!(node = %name, created, "node registered");
                        if created {
                            // The new Node carries our first status: announce
                            // its conditions as the kubelet does.
                            reporter.announce(&[], &n, self.recorder.as_ref());
                        }
                        known = Some(n);
                        registered = true;
                        reporter.reset();
                        self.publish(known.as_ref());
                    }
                    Err(e) => {
                        outage.failed(&e);
                        next = Instant::now() + retry.next();
                        continue;
                    }
                }
            }
            let Some(stored) = known.as_ref() else {
                // Not registering, and no Node yet: look again later.
                next = Instant::now() + self.config.node_status_update_frequency;
                continue;
            };
            match reporter.sync(&api, stored, self.recorder.as_ref()).await {
                Ok(patched) => {
                    outage.ok();
                    retry.reset();
                    if let Some(n) = patched {
                        known = Some(n);
                        self.publish(known.as_ref());
                    }
                }
                Err(e) if register::is_gone(&e) => {
                    tracing::warn!(node = %name, "Node object is gone; registering again");
                    known = None;
                    registered = !self.config.register_node;
                    reporter.reset();
                }
                Err(e) => outage.failed(&e),
            }
            let every = if reporter.ready() {
                self.config.node_status_update_frequency
            } else {
                FAST_UPDATE.min(self.config.node_status_update_frequency)
            };
            next = Instant::now() + every;
        }
    }

    /// Publish the pod CIDR and the Node's uid from `node`.
    fn publish(&self, node: Option<&Node>) {
        let from_api = node
            .and_then(|n| n.spec.as_ref())
            .and_then(|s| s.pod_cidr.clone())
            .filter(|c| !c.is_empty());
        if let (Some(mine), Some(theirs)) = (&self.config.pod_cidr, &from_api) {
            if mine != theirs && !self.cidr_warned.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    pod_cidr = %mine,
                    node_pod_cidr = %theirs,
                    "--pod-cidr differs from the Node's spec.podCIDR; using --pod-cidr"
                );
            }
        }
        let cidr = self.config.pod_cidr.clone().or(from_api);
        self.outputs.pod_cidr.send_if_modified(|c| {
            let changed = *c != cidr && cidr.is_some();
            if changed {
                tracing::info!(node = %self.config.node_name, pod_cidr = ?cidr, "pod CIDR known");
                *c = cidr.clone();
            }
            changed
        });
        let uid = node.and_then(|n| n.metadata.uid.clone());
        self.outputs.node_uid.send_if_modified(|u| {
            let changed = *u != uid && uid.is_some();
            if changed {
                *u = uid.clone();
            }
            changed
        });
    }
}
