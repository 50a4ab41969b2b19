//! The scheduling loop: observe (watch updates into the cache and the
//! queue), decide (filter and score one pod at a time against the cache,
//! assuming the winner at once), act (bind concurrently, report).
//!
//! Decisions are sequential on one task that owns the caches and the
//! queue, so each sees every earlier decision; only the bindings, which
//! are a POST each (after the volume writes, for a pod whose claims
//! needed deciding on), run concurrently (at most `max_binds_in_flight`).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use crate::budgets::Budgets;
use crate::cache::Cache;
use crate::events::{self, Notice, Notifier};
use crate::informer::{self, Update};
use crate::nodeinfo::NodeInfo;
use crate::podinfo::{self, PodInfo};
use crate::profile::Profile;
use crate::queue::{Backoff, Queue};
use crate::victims::Preemption;
use crate::volumes::{Plan, PodVolumes, Volumes};
use crate::{bind, filter, preempt, score, victims, volumebind, Config};

/// Decisions made per turn of the loop before it looks at updates again.
const BATCH: usize = 64;
/// How often unschedulable pods are checked against their timeout
/// (upstream flushes leftover unschedulable pods every 30 s).
const FLUSH_EVERY: Duration = Duration::from_secs(30);
/// How long in-flight bindings may finish after shutdown.
const DRAIN: Duration = Duration::from_secs(5);

/// What went wrong on the way to a binding.
#[derive(Debug, thiserror::Error)]
enum Failure {
    /// A volume write (upstream's PreBind); the pod was not bound.
    #[error("running PreBind plugin \"VolumeBinding\": {0}")]
    Volumes(#[source] volumebind::Error),
    #[error(transparent)]
    Bind(bind::Error),
}

/// A binding's result, back from its task.
struct Bound {
    pod: Arc<PodInfo>,
    node: String,
    /// Failed attempts before this one.
    attempts: u32,
    /// The volume decisions written (or tried) first.
    plan: Option<Plan>,
    result: Result<(), Failure>,
}

struct Scheduler {
    client: kube::Client,
    config: Config,
    cache: Cache,
    /// Claims, volumes and classes, with the volume decisions assumed.
    volumes: Volumes,
    queue: Queue,
    /// PodDisruptionBudgets, for preemption.
    budgets: Budgets,
    /// Pending pods nominated to a node by their preemption, by UID:
    /// the room their victims free is held for them against pods of
    /// lower priority (upstream's nominator).
    nominated: HashMap<String, (String, Arc<PodInfo>)>,
    rng: SmallRng,
    binds: JoinSet<Bound>,
    /// The profiles by scheduler name, with their event writers.
    profiles: HashMap<String, (Profile, Notifier)>,
    /// Where the next search for feasible nodes starts, when it stops
    /// before the last node (upstream's `nextStartNodeIndex`).
    next_start: usize,
    nodes_synced: bool,
    pods_synced: bool,
    /// Names seen since a node re-list started.
    node_relist: Option<HashSet<String>>,
    /// UIDs seen since a pod re-list started.
    pod_relist: Option<HashSet<String>>,
}

pub(crate) async fn run(client: kube::Client, config: Config, shutdown: impl Future<Output = ()>) {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut notifiers = HashMap::new();
    let mut writers = JoinSet::new();
    for p in &config.profiles {
        let mut stop = stop_rx.clone();
        let (notifier, writer) = events::channel(client.clone(), &p.scheduler_name, async move {
            let _ = stop.wait_for(|s| *s).await;
        });
        writers.spawn(writer);
        notifiers.insert(p.scheduler_name.clone(), notifier);
    }
    let (updates, watches) = informer::start(&client);
    let names: Vec<&str> = config
        .profiles
        .iter()
        .map(|p| p.scheduler_name.as_str())
        .collect();
    info!(profiles = ?names, "scheduler started");
    let mut s = Scheduler::new(client, config, notifiers);
    s.run(updates, shutdown).await;
    for w in &watches {
        w.abort();
    }
    // Let bindings in flight land so that their pods are not left
    // half-decided, then let the event writer flush what it has.
    let drain = async {
        while let Some(done) = s.binds.join_next().await {
            if let Ok(b) = done {
                s.bound(b);
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN, drain).await;
    drop(s);
    let flushed = async { while writers.join_next().await.is_some() {} };
    if tokio::time::timeout(DRAIN, flushed).await.is_err() {
        let _ = stop_tx.send(true);
    }
    info!("scheduler stopped");
}

impl Scheduler {
    fn new(
        client: kube::Client,
        config: Config,
        mut notifiers: HashMap<String, Notifier>,
    ) -> Scheduler {
        let backoff = Backoff {
            initial: config.initial_backoff,
            max: config.max_backoff,
            unschedulable_timeout: config.unschedulable_timeout,
        };
        let profiles = config
            .profiles
            .iter()
            .filter_map(|p| {
                let n = notifiers.remove(&p.scheduler_name)?;
                Some((p.scheduler_name.clone(), (p.clone(), n)))
            })
            .collect();
        Scheduler {
            client,
            profiles,
            next_start: 0,
            queue: Queue::new(backoff),
            config,
            cache: Cache::default(),
            volumes: Volumes::default(),
            budgets: Budgets::default(),
            nominated: HashMap::new(),
            rng: SmallRng::from_os_rng(),
            binds: JoinSet::new(),
            nodes_synced: false,
            pods_synced: false,
            node_relist: None,
            pod_relist: None,
        }
    }

    async fn run(
        &mut self,
        mut updates: mpsc::Receiver<Update>,
        shutdown: impl Future<Output = ()>,
    ) {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut flush = tokio::time::interval(FLUSH_EVERY);
        flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let far = || tokio::time::Instant::now() + Duration::from_secs(3600);
        loop {
            let ready = self.nodes_synced
                && self.pods_synced
                && self.queue.has_active()
                && self.binds.len() < self.config.max_binds_in_flight;
            let due = self.queue.next_backoff_due();
            let wake = due.map_or_else(far, tokio::time::Instant::from_std);
            tokio::select! {
                _ = &mut shutdown => return,
                u = updates.recv() => match u {
                    Some(u) => {
                        self.update(u);
                        // Take in everything already waiting, so that
                        // decisions see the freshest picture.
                        while let Ok(u) = updates.try_recv() {
                            self.update(u);
                        }
                    }
                    None => {
                        warn!("scheduler watches ended; stopping");
                        return;
                    }
                },
                Some(done) = self.binds.join_next(), if !self.binds.is_empty() => match done {
                    Ok(b) => self.bound(b),
                    Err(e) => warn!(error = %e, "a binding task failed"),
                },
                _ = tokio::time::sleep_until(wake), if due.is_some() => self.queue.flush(Instant::now()),
                _ = flush.tick() => self.queue.flush(Instant::now()),
                _ = std::future::ready(()), if ready => self.schedule_batch(),
            }
        }
    }

    /// Take in one watch update.
    fn update(&mut self, u: Update) {
        let now = Instant::now();
        match u {
            Update::NodesRelisting => self.node_relist = Some(HashSet::new()),
            Update::Node(node) => {
                if let (Some(seen), Some(name)) = (&mut self.node_relist, &node.metadata.name) {
                    seen.insert(name.clone());
                }
                if self.cache.upsert_node(node) {
                    self.queue.move_unschedulable(now);
                }
            }
            Update::NodeDeleted(node) => {
                if let Some(name) = &node.metadata.name {
                    self.cache.remove_node(name);
                }
            }
            Update::NodesListed => {
                if let Some(seen) = self.node_relist.take() {
                    for name in self.cache.node_names() {
                        if !seen.contains(&name) {
                            self.cache.remove_node(&name);
                        }
                    }
                }
                self.nodes_synced = true;
                self.queue.move_unschedulable(now);
            }
            Update::PodsRelisting => self.pod_relist = Some(HashSet::new()),
            Update::Pod(pod) => {
                if let Some(seen) = &mut self.pod_relist {
                    seen.insert(pod.uid.clone());
                }
                self.pod(pod, now);
            }
            Update::PodDeleted(pod) => self.pod_gone(&pod.uid, now),
            Update::PodsListed => {
                if let Some(seen) = self.pod_relist.take() {
                    let known = self.cache.pod_uids().into_iter().chain(self.queue.uids());
                    let gone: Vec<String> = known.filter(|uid| !seen.contains(uid)).collect();
                    for uid in gone {
                        self.pod_gone(&uid, now);
                    }
                }
                self.pods_synced = true;
            }
            // Any claim, volume or class change may be what a parked pod
            // with claims waits for (upstream VolumeBinding registers
            // them all); pods without claims stay parked.
            Update::Claim(c) => {
                if self.volumes.claim_changed(c) {
                    self.queue.move_unschedulable_if(now, has_claims);
                }
            }
            Update::Volume(c) => {
                if self.volumes.volume_changed(c) {
                    self.queue.move_unschedulable_if(now, has_claims);
                }
            }
            Update::Class(c) => {
                if self.volumes.class_changed(c) {
                    self.queue.move_unschedulable_if(now, has_claims);
                }
            }
            Update::Budget(c) => self.budgets.apply(c),
        }
    }

    fn pod(&mut self, pod: Arc<PodInfo>, now: Instant) {
        if podinfo::is_terminal(&pod.pod) {
            // Finished: its room on the node is free again.
            self.pod_gone(&pod.uid, now);
            return;
        }
        if let Some(node) = podinfo::node_name(&pod.pod) {
            let node = node.to_string();
            self.queue.remove(&pod.uid);
            self.nominated.remove(&pod.uid);
            // New here, or relabelled: what it now matches may be what a
            // waiting pod's affinity or spreading looks for.
            let changed = self
                .cache
                .pod_labels(&pod.uid)
                .is_none_or(|labels| labels != pod.labels());
            self.cache.set_bound(pod, &node);
            if changed {
                self.pod_placed(now);
            }
            return;
        }
        if self.cache.pod_state(&pod.uid).is_some() {
            // Assumed: this is an older version from before our binding,
            // still on its way through the watch.
            return;
        }
        let ours = self.profiles.contains_key(scheduler_name(&pod));
        // Gated pods wait until whoever added the gates removes them
        // (upstream SchedulingGates); the update that does brings them back.
        if !ours || podinfo::is_terminating(&pod.pod) || podinfo::is_gated(&pod.pod) {
            self.queue.remove(&pod.uid);
            self.nominated.remove(&pod.uid);
            return;
        }
        // A nomination written before a restart still holds the room.
        let nominated = pod
            .pod
            .status
            .as_ref()
            .and_then(|s| s.nominated_node_name.as_deref())
            .filter(|n| !n.is_empty());
        match nominated {
            Some(node) => {
                self.nominated
                    .insert(pod.uid.clone(), (node.to_string(), pod.clone()));
            }
            // Ours may still be on its way through the watch: kept, with
            // the newer pod.
            None => {
                if let Some((_, p)) = self.nominated.get_mut(&pod.uid) {
                    *p = pod.clone();
                }
            }
        }
        self.queue.add_or_update(pod, now);
    }

    /// A pod was counted on a node: a pod waiting for a pod to be
    /// affine to, or for its domain to stop being the most populated, may
    /// fit now (upstream moves pods on AssignedPodAdd for InterPodAffinity
    /// and PodTopologySpread).
    fn pod_placed(&mut self, now: Instant) {
        self.queue
            .move_unschedulable_if(now, PodInfo::has_topology_rules);
    }

    /// A pod was deleted or finished.
    fn pod_gone(&mut self, uid: &str, now: Instant) {
        self.queue.remove(uid);
        self.nominated.remove(uid);
        if self.cache.remove_pod(uid).is_some() {
            self.queue.move_unschedulable(now);
        }
    }

    fn schedule_batch(&mut self) {
        for _ in 0..BATCH {
            if self.binds.len() >= self.config.max_binds_in_flight {
                return;
            }
            let Some(pod) = self.queue.pop() else {
                return;
            };
            self.schedule(pod);
        }
    }

    /// Filter, score, assume and start the binding; or report why no
    /// node fits.
    fn schedule(&mut self, pod: Arc<PodInfo>) {
        let now = Instant::now();
        let volumes = match self.pod_volumes(&pod) {
            Ok(v) => v,
            Err(None) => {
                // The storage caches are not listed yet; their first
                // list brings the pod back.
                self.queue.unschedulable(&pod.uid, now);
                return;
            }
            Err(Some(message)) => {
                let message = filter::prefilter_error(self.cache.node_count(), &message);
                self.unschedulable(&pod, message, now);
                return;
            }
        };
        let topology = filter::Topology::prefilter(&pod, &self.cache);
        let nominated = self.nominated.get(&pod.uid).map(|(n, _)| n.clone());
        // Where it preempted, if it still fits there (upstream's
        // evaluateNominatedNode); else the best of all nodes.
        let on_nominated = nominated
            .as_deref()
            .and_then(|n| self.cache.node(n))
            .filter(|n| n.node.is_some() && self.fits(&pod, volumes.as_ref(), &topology, n))
            .map(|n| n.name.clone());
        let chosen = match on_nominated {
            Some(n) => Some(n),
            None => {
                let Some((profile, _)) = self.profiles.get(scheduler_name(&pod)) else {
                    return;
                };
                let all = self.cache.node_count();
                let wanted = nodes_to_find(profile.percentage_of_nodes_to_score, all);
                // A search that may stop early starts where the last one
                // stopped, so that every node gets its turn.
                let start = if wanted < all {
                    self.next_start % all
                } else {
                    0
                };
                let mut processed = 0;
                let mut feasible: Vec<&NodeInfo> = Vec::new();
                let rotated = self
                    .cache
                    .nodes()
                    .skip(start)
                    .chain(self.cache.nodes().take(start));
                for n in rotated {
                    processed += 1;
                    if self.fits(&pod, volumes.as_ref(), &topology, n) {
                        feasible.push(n);
                        if feasible.len() >= wanted {
                            break;
                        }
                    }
                }
                self.next_start = (start + processed) % all.max(1);
                let prescored =
                    score::State::prescore(&pod, &self.cache, &feasible, &profile.scoring);
                score::select(&pod, &feasible, &prescored, &profile.scoring, &mut self.rng)
                    .map(|n| n.name.clone())
            }
        };
        let Some(node) = chosen else {
            let message = filter::fit_error(&pod, volumes.as_ref(), &topology, self.cache.nodes());
            let message = match self.preempt(&pod, volumes.as_ref(), nominated.as_deref()) {
                Some(why) => format!("{message} preemption: {why}."),
                None => message,
            };
            self.unschedulable(&pod, message, now);
            return;
        };
        self.nominated.remove(&pod.uid);
        // Upstream's Reserve: the volume decisions for the chosen node go
        // into the cache now, so that the next pod does not pick the
        // same PV.
        let plan = volumes.as_ref().and_then(|v| {
            let mut plan = v.check(self.cache.node(&node)?).ok()?;
            self.volumes.assume(&mut plan);
            (!plan.is_empty()).then_some(plan)
        });
        let attempts = self.queue.done(&pod.uid);
        self.cache.assume(pod.clone(), &node);
        self.pod_placed(now);
        let client = self.client.clone();
        self.binds.spawn(async move {
            let result = async {
                if let Some(plan) = &plan {
                    volumebind::write(&client, plan)
                        .await
                        .map_err(Failure::Volumes)?;
                }
                bind::bind(&client, &pod, &node)
                    .await
                    .map_err(Failure::Bind)
            }
            .await;
            Bound {
                pod,
                node,
                attempts,
                plan,
                result,
            }
        });
    }

    /// Whether `pod` fits `node` with the pods nominated there that are at
    /// least as important (upstream's `addNominatedPods`: room freed by a
    /// preemption is not taken by pods of lower priority). The nominated
    /// pods count for resources and ports; spreading and affinity count
    /// the pods bound.
    fn fits(
        &self,
        pod: &PodInfo,
        volumes: Option<&PodVolumes>,
        topology: &filter::Topology,
        node: &NodeInfo,
    ) -> bool {
        let held = || {
            self.nominated.iter().filter(|(uid, (n, p))| {
                *n == node.name && **uid != pod.uid && p.priority >= pod.priority
            })
        };
        if self.nominated.is_empty() || held().next().is_none() {
            return filter::fits(pod, volumes, topology, node);
        }
        let mut with = node.clone();
        for (_, (_, p)) in held() {
            with.add_pod(p);
        }
        filter::fits(pod, volumes, topology, &with)
    }

    /// No node fits `pod`: preempt lower-priority pods if that helps
    /// (upstream's PostFilter). Returns why it did not, for the
    /// FailedScheduling message after "preemption: ".
    fn preempt(
        &mut self,
        pod: &Arc<PodInfo>,
        volumes: Option<&PodVolumes>,
        nominated: Option<&str>,
    ) -> Option<String> {
        if let Some(why) = preempt::ineligible(pod, nominated, &self.cache) {
            return Some(why.to_string());
        }
        let candidate = match preempt::find(pod, volumes, &mut self.cache, &self.budgets) {
            Ok(c) => c,
            Err(why) => {
                self.nominated.remove(&pod.uid);
                return Some(why);
            }
        };
        info!(pod = %format!("{}/{}", pod.namespace, pod.name), node = %candidate.node,
            victims = candidate.victims.len(), "preempting");
        for v in &candidate.victims {
            self.notify(
                pod,
                Notice::Preempted {
                    pod: events::reference(v),
                    by: pod.uid.clone(),
                    node: candidate.node.clone(),
                },
            );
        }
        let denominated: Vec<Arc<PodInfo>> = self
            .nominated
            .values()
            .filter(|(n, p)| *n == candidate.node && p.priority < pod.priority)
            .map(|(_, p)| p.clone())
            .collect();
        for p in &denominated {
            self.nominated.remove(&p.uid);
        }
        self.nominated
            .insert(pod.uid.clone(), (candidate.node.clone(), pod.clone()));
        let preemption = Preemption {
            node: candidate.node,
            victims: candidate.victims,
            denominated,
        };
        let (client, scheduler, preemptor) = (
            self.client.clone(),
            scheduler_name(pod).to_string(),
            pod.clone(),
        );
        tokio::spawn(async move {
            victims::write(&client, &scheduler, &preemptor, &preemption).await;
        });
        None
    }

    /// What the volume checks found for the whole pod: `Ok(None)` for a
    /// pod without claims (nothing to check), `Err(None)` while the
    /// storage caches are not listed, `Err(Some(message))` when no node
    /// can help.
    fn pod_volumes(&self, pod: &PodInfo) -> Result<Option<PodVolumes>, Option<String>> {
        if pod.claims.is_empty() {
            return Ok(None);
        }
        if !self.volumes.synced() {
            return Err(None);
        }
        self.volumes
            .prefilter(pod, &self.cache)
            .map(Some)
            .map_err(Some)
    }

    /// No node fits: park the pod and say why.
    fn unschedulable(&mut self, pod: &PodInfo, message: String, now: Instant) {
        debug!(pod = %format!("{}/{}", pod.namespace, pod.name), %message, "pod is unschedulable");
        self.queue.unschedulable(&pod.uid, now);
        let notice = Notice::FailedScheduling {
            pod: events::reference(pod),
            condition: condition_update(pod, &message),
            message,
        };
        self.notify(pod, notice);
    }

    /// Tell about `pod` through its profile's recorder.
    fn notify(&self, pod: &PodInfo, notice: Notice) {
        if let Some((_, notifier)) = self.profiles.get(scheduler_name(pod)) {
            notifier.send(notice);
        }
    }

    /// A binding finished.
    fn bound(&mut self, b: Bound) {
        match b.result {
            Ok(()) => {
                debug!(pod = %format!("{}/{}", b.pod.namespace, b.pod.name), node = %b.node, "bound");
                self.notify(
                    &b.pod,
                    Notice::Scheduled {
                        pod: events::reference(&b.pod),
                        node: b.node,
                    },
                );
            }
            Err(e) => {
                let now = Instant::now();
                // The volume decisions are undone in the cache (upstream
                // Unreserve); what was written stays written, and the
                // watch brings it.
                if let Some(plan) = &b.plan {
                    self.volumes.restore(plan);
                }
                // Un-assume (unless the watch already showed what
                // happened): the room it took is free again.
                let forgotten = self.cache.forget(&b.pod.uid, &b.node);
                if let Some(pod) = forgotten {
                    self.queue.move_unschedulable(now);
                    if let Failure::Volumes(_) = &e {
                        // Never final: a conflict means the volume or
                        // claim changed, and the next attempt decides
                        // on what it is now.
                        let message = e.to_string();
                        warn!(error = %message, "volume binding failed; retrying the pod after back-off");
                        self.notify(
                            &pod,
                            Notice::FailedScheduling {
                                pod: events::reference(&pod),
                                message,
                                condition: None,
                            },
                        );
                        self.queue.requeue_failed(pod, b.attempts, now);
                    } else if matches!(&e, Failure::Bind(e) if e.is_final()) {
                        debug!(error = %e, "binding refused; the watch will tell what became of the pod");
                    } else {
                        warn!(error = %e, "binding failed; retrying the pod after back-off");
                        self.queue.requeue_failed(pod, b.attempts, now);
                    }
                }
            }
        }
    }
}

/// The profile a pod asks for.
fn scheduler_name(pod: &PodInfo) -> &str {
    pod.spec()
        .and_then(|s| s.scheduler_name.as_deref())
        .unwrap_or("default-scheduler")
}

/// How many feasible nodes to find before scoring (upstream's
/// `numFeasibleNodesToFind`): every node in clusters under 100 nodes;
/// else `percentage` of them (0: 50% less 1% per 125 nodes, at least
/// 5%), but never fewer than 100.
fn nodes_to_find(percentage: u32, all: usize) -> usize {
    const MIN_NODES: usize = 100;
    if all < MIN_NODES || percentage >= 100 {
        return all;
    }
    let percentage = match percentage {
        0 => 50usize.saturating_sub(all / 125).max(5),
        p => p as usize,
    };
    (all * percentage / 100).max(MIN_NODES)
}

fn has_claims(pod: &PodInfo) -> bool {
    !pod.claims.is_empty()
}

/// When PodScheduled should change to False/Unschedulable with `message`:
/// the last transition time to write (kept when it was already False),
/// or `None` when the pod already says exactly this.
fn condition_update(pod: &PodInfo, message: &str) -> Option<Time> {
    let current = pod
        .pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"));
    match current {
        Some(c)
            if c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable")
                && c.message.as_deref() == Some(message) =>
        {
            None
        }
        Some(c) if c.status == "False" => Some(
            c.last_transition_time
                .clone()
                .unwrap_or_else(|| Time(jiff::Timestamp::now())),
        ),
        _ => Some(Time(jiff::Timestamp::now())),
    }
}

#[cfg(test)]
mod tests {
    //! The loop's bookkeeping, driven update by update. The client points
    //! at a closed port: bindings really fail, as against a server that
    //! is down.

    use super::*;
    use crate::cache::PodState;
    use k8s_openapi::api::core::v1::{Node, Pod};
    use serde_json::json;

    fn scheduler() -> Scheduler {
        let cfg = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        let client = kube::Client::try_from(cfg).unwrap();
        let (notifier, _writer) = events::channel(client.clone(), "default-scheduler", async {});
        let notifiers = HashMap::from([("default-scheduler".to_string(), notifier)]);
        Scheduler::new(client, Config::default(), notifiers)
    }

    fn node(name: &str) -> Update {
        Update::Node(
            serde_json::from_value::<Node>(json!({
                "metadata": {"name": name},
                "status": {"allocatable": {"cpu": "1", "memory": "1Gi", "pods": "10"},
                           "conditions": [{"type": "Ready", "status": "True"}]}
            }))
            .unwrap(),
        )
    }

    fn pod(uid: &str, node: Option<&str>) -> Update {
        Update::Pod(Arc::new(PodInfo::new(
            serde_json::from_value::<Pod>(json!({
                "metadata": {"name": uid, "namespace": "ns", "uid": uid},
                "spec": {"nodeName": node, "schedulerName": "default-scheduler",
                         "containers": [{"name": "c", "resources": {"requests": {"cpu": "600m"}}}]}
            }))
            .unwrap(),
        )))
    }

    #[tokio::test]
    async fn gated_other_schedulers_and_terminating_pods_are_not_queued() {
        let mut s = scheduler();
        let with = |extra: serde_json::Value| {
            let mut v = json!({
                "metadata": {"name": "p", "namespace": "ns", "uid": "p"},
                "spec": {"containers": [{"name": "c"}]}
            });
            for (k, x) in extra.as_object().unwrap() {
                for (f, y) in x.as_object().unwrap() {
                    v[k][f] = y.clone();
                }
            }
            Update::Pod(Arc::new(PodInfo::new(serde_json::from_value(v).unwrap())))
        };
        s.update(with(
            json!({"spec": {"schedulingGates": [{"name": "wait"}]}}),
        ));
        assert!(!s.queue.contains("p"));
        s.update(with(json!({"spec": {"schedulerName": "other"}})));
        assert!(!s.queue.contains("p"));
        s.update(with(
            json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}),
        ));
        assert!(!s.queue.contains("p"));
        // The gates removed: now it is ours to schedule.
        s.update(with(json!({"spec": {"schedulingGates": []}})));
        assert!(s.queue.contains("p"));
    }

    #[tokio::test]
    async fn a_relabelled_pod_wakes_pods_waiting_for_its_labels() {
        let mut s = scheduler();
        let labelled = |app: &str| {
            Update::Pod(Arc::new(PodInfo::new(
                serde_json::from_value::<Pod>(json!({
                    "metadata": {"name": "bound", "namespace": "ns", "uid": "bound", "labels": {"app": app}},
                    "spec": {"nodeName": "a", "containers": [{"name": "c"}]}
                }))
                .unwrap(),
            )))
        };
        let follower = Update::Pod(Arc::new(PodInfo::new(
            serde_json::from_value::<Pod>(json!({
                "metadata": {"name": "f", "namespace": "ns", "uid": "f"},
                "spec": {"containers": [{"name": "c"}], "affinity": {"podAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [{
                        "labelSelector": {"matchLabels": {"app": "db"}},
                        "topologyKey": "kubernetes.io/hostname"}]}}}
            }))
            .unwrap(),
        )));
        for u in [
            node("a"),
            Update::NodesListed,
            labelled("web"),
            follower,
            Update::PodsListed,
        ] {
            s.update(u);
        }
        s.schedule_batch();
        assert!(s.queue.contains("f") && !s.queue.has_active(), "parked");
        // Past its back-off, not its unschedulable timeout.
        let later = Instant::now() + Duration::from_secs(60);
        // The same labels again (a status update): still parked.
        s.update(labelled("web"));
        s.queue.flush(later);
        assert!(!s.queue.has_active());
        s.update(labelled("db"));
        s.queue.flush(later);
        assert!(s.queue.has_active(), "the new label is what it waits for");
    }

    #[test]
    fn feasible_nodes_to_find_as_upstream() {
        for (percentage, all, want) in [
            (0, 50, 50),
            (0, 100, 100),
            (0, 1000, 420),
            (0, 5000, 500),
            (0, 10_000, 500),
            (30, 1000, 300),
            (5, 1000, 100),
            (100, 1000, 1000),
        ] {
            assert_eq!(
                nodes_to_find(percentage, all),
                want,
                "{percentage}% of {all}"
            );
        }
    }

    #[tokio::test]
    async fn relists_drop_what_is_gone() {
        let mut s = scheduler();
        for u in [
            Update::NodesRelisting,
            node("a"),
            node("b"),
            Update::NodesListed,
            Update::PodsRelisting,
            pod("bound", Some("a")),
            pod("pending", None),
            Update::PodsListed,
        ] {
            s.update(u);
        }
        assert!(s.nodes_synced && s.pods_synced);
        assert_eq!(s.cache.node_names(), ["a", "b"]);
        assert_eq!(s.cache.pod_state("bound"), Some(PodState::Bound));
        assert!(s.queue.contains("pending"));

        // A re-list (say after a 410) in which node a and both pods are
        // missing: they were deleted while the watch was away.
        for u in [
            Update::NodesRelisting,
            node("b"),
            Update::NodesListed,
            Update::PodsRelisting,
            Update::PodsListed,
        ] {
            s.update(u);
        }
        assert_eq!(s.cache.node_names(), ["b"]);
        assert!(s.cache.node("a").is_none());
        assert_eq!(s.cache.pod_state("bound"), None);
        assert!(s.queue.is_empty());
    }

    fn listed_storage(s: &mut Scheduler) {
        use kube_util::informer::Change;
        let class = serde_json::from_value(json!({
            "metadata": {"name": "local-path", "resourceVersion": "1"},
            "provisioner": "skiff.io/local-path", "volumeBindingMode": "WaitForFirstConsumer"
        }))
        .unwrap();
        for u in [
            Update::Claim(Change::Relisting),
            Update::Claim(Change::Listed),
            Update::Volume(Change::Relisting),
            Update::Volume(Change::Listed),
            Update::Class(Change::Relisting),
            Update::Class(Change::Applied(Arc::new(class))),
            Update::Class(Change::Listed),
        ] {
            s.update(u);
        }
    }

    fn claim_update(name: &str) -> Update {
        Update::Claim(kube_util::informer::Change::Applied(Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "ns", "uid": name, "resourceVersion": "1"},
                "spec": {"storageClassName": "local-path", "accessModes": ["ReadWriteOnce"]}
            }))
            .unwrap(),
        )))
    }

    fn pod_with_claim(uid: &str, claim: &str) -> Update {
        Update::Pod(Arc::new(PodInfo::new(
            serde_json::from_value::<Pod>(json!({
                "metadata": {"name": uid, "namespace": "ns", "uid": uid},
                "spec": {"containers": [{"name": "c"}],
                         "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": claim}}]}
            }))
            .unwrap(),
        )))
    }

    #[tokio::test]
    async fn pods_with_claims_wait_for_the_storage_caches_and_their_claims() {
        let mut s = scheduler();
        for u in [
            node("a"),
            Update::NodesListed,
            pod_with_claim("p", "data"),
            pod("plain", None),
            Update::PodsListed,
        ] {
            s.update(u);
        }
        // Storage not listed yet: the pod without claims is bound, the
        // other parked without a verdict.
        s.schedule_batch();
        assert_eq!(s.cache.pod_state("plain"), Some(PodState::Assumed));
        assert!(s.queue.contains("p") && s.cache.pod_state("p").is_none());
        listed_storage(&mut s);
        s.queue.flush(Instant::now() + Duration::from_secs(60));
        // Listed, but the claim does not exist: unschedulable.
        s.schedule_batch();
        assert!(s.queue.contains("p") && s.cache.pod_state("p").is_none());
        // The claim appears: that moves the pod, which now fits.
        s.update(claim_update("data"));
        s.queue.flush(Instant::now() + Duration::from_secs(60));
        s.schedule_batch();
        assert_eq!(s.cache.pod_state("p"), Some(PodState::Assumed));
    }

    #[tokio::test]
    async fn a_failed_volume_write_restores_the_volumes_and_retries() {
        let mut s = scheduler();
        listed_storage(&mut s);
        for u in [
            node("a"),
            Update::NodesListed,
            claim_update("data"),
            pod_with_claim("p", "data"),
            Update::PodsListed,
        ] {
            s.update(u);
        }
        s.schedule_batch();
        assert_eq!(s.cache.pod_state("p"), Some(PodState::Assumed));
        let done = s.binds.join_next().await.unwrap().unwrap();
        assert!(
            matches!(done.result, Err(Failure::Volumes(_))),
            "nothing listens on port 1"
        );
        let plan = done.plan.clone().expect("a claim to provision");
        assert_eq!(plan.provisions.len(), 1);
        s.bound(done);
        assert_eq!(
            s.cache.pod_state("p"),
            None,
            "not bound without its volumes"
        );
        assert!(s.queue.contains("p") && s.queue.next_backoff_due().is_some());
        // The claim no longer looks annotated: the next attempt may pick
        // any node again.
        let p = match pod_with_claim("p", "data") {
            Update::Pod(p) => p,
            _ => unreachable!(),
        };
        let v = s.volumes.prefilter(&p, &s.cache).unwrap();
        let mut again = v.check(s.cache.node("a").unwrap()).unwrap();
        s.volumes.assume(&mut again);
        assert_eq!(again.provisions.len(), 1, "still to be written");
    }

    #[tokio::test]
    async fn a_failed_binding_un_assumes_and_backs_off() {
        let mut s = scheduler();
        for u in [
            node("a"),
            Update::NodesListed,
            pod("p1", None),
            pod("p2", None),
            Update::PodsListed,
        ] {
            s.update(u);
        }
        s.schedule_batch();
        // p1 took 600m of the node's CPU: p2 no longer fits, even though
        // nothing has been bound yet.
        assert_eq!(s.cache.pod_state("p1"), Some(PodState::Assumed));
        assert_eq!(s.cache.node("a").unwrap().requested.cpu, 600);
        assert!(s.queue.contains("p2") && s.queue.pop().is_none());
        // The watch replaying p1 unbound (from before the binding) does
        // not queue it again.
        s.update(pod("p1", None));
        assert!(!s.queue.contains("p1"));

        let done = s.binds.join_next().await.unwrap().unwrap();
        assert!(done.result.is_err(), "nothing listens on port 1");
        s.bound(done);
        assert_eq!(s.cache.pod_state("p1"), None, "un-assumed");
        assert_eq!(s.cache.node("a").unwrap().requested.cpu, 0);
        // p1 backs off (not straight back to active: no spinning), and
        // p2 moved out of unschedulable since room was freed.
        assert!(s.queue.contains("p1"));
        assert!(s.queue.next_backoff_due().is_some());
    }
}
