//! The eviction manager, as the kubelet's (`pkg/kubelet/eviction`): every
//! monitoring period it reads the node's signals (memory, the node and
//! image file systems, PIDs) from the same figures as the summary API,
//! reports MemoryPressure / DiskPressure / PIDPressure while a threshold
//! is met (and for the transition period after), reclaims unused images
//! first under disk pressure, then evicts one pod: Failed, reason
//! `Evicted`, with the message naming the signal. Pods over their local
//! storage limits are evicted whatever the pressure. While under
//! pressure, admission refuses new pods as upstream's `Admit` does.

pub mod local_storage;
pub mod rank;
pub mod thresholds;
pub mod usage;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;

use crate::config::Config;
use crate::events::{ApiRecorder, WARNING};
use crate::halt::{Halt, StopPods};
use crate::pod::PodExt;
use crate::server::stats::{ContainerStats, NodeStats, PodStats};
use crate::shared::Shared;
use thresholds::{Observation, Signal, Threshold};
use usage::{ContainerUsage, EmptyDirUsage, PodUsage};

/// How often signals are read (the kubelet's fixed 10 s).
const MONITORING_PERIOD: Duration = Duration::from_secs(10);
/// How long an evicted pod may take to stop before the next round.
const POD_CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Upstream's grace for pods evicted for a hard threshold.
const IMMEDIATE_GRACE_SECONDS: i64 = 1;
/// Reason of evicted pods' status and events.
pub const REASON: &str = "Evicted";

/// The eviction settings, checked.
#[derive(Debug, Clone)]
pub struct Settings {
    pub thresholds: Vec<Threshold>,
    pub pressure_transition_period: Duration,
    pub max_pod_grace_period: i64,
}

impl Settings {
    /// # Errors
    /// A bad threshold, grace period or minimum reclaim, in the kubelet's
    /// words.
    pub fn from_config(c: &Config) -> Result<Settings, String> {
        let mut grace = BTreeMap::new();
        for (k, v) in &c.eviction_soft_grace_period {
            let d = crate::config::parse_duration(v)
                .map_err(|e| format!("invalid eviction soft grace period for {k}: {e}"))?;
            grace.insert(k.clone(), d);
        }
        Ok(Settings {
            thresholds: thresholds::parse(
                &c.eviction_hard,
                &c.eviction_soft,
                &grace,
                &c.eviction_minimum_reclaim,
            )?,
            pressure_transition_period: c.eviction_pressure_transition_period,
            max_pod_grace_period: c.eviction_max_pod_grace_period,
        })
    }
}

/// The node's signals from its stats.
pub fn observe(node: &NodeStats) -> HashMap<Signal, Observation> {
    let mut out = HashMap::new();
    if let Some(m) = &node.memory {
        if let (Some(available), Some(working_set)) = (m.available_bytes, m.working_set_bytes) {
            out.insert(
                Signal::MemoryAvailable,
                Observation {
                    available,
                    capacity: available + working_set,
                },
            );
        }
    }
    let mut fs = |bytes: Signal, inodes: Signal, f: Option<&crate::server::stats::FsStats>| {
        let Some(f) = f else { return };
        if let (Some(available), Some(capacity)) = (f.available_bytes, f.capacity_bytes) {
            out.insert(
                bytes,
                Observation {
                    available,
                    capacity,
                },
            );
        }
        if let (Some(available), Some(capacity)) = (f.inodes_free, f.inodes) {
            out.insert(
                inodes,
                Observation {
                    available,
                    capacity,
                },
            );
        }
    };
    fs(
        Signal::NodeFsAvailable,
        Signal::NodeFsInodesFree,
        node.fs.as_ref(),
    );
    fs(
        Signal::ImageFsAvailable,
        Signal::ImageFsInodesFree,
        node.runtime.as_ref().and_then(|r| r.image_fs.as_ref()),
    );
    if let Some(r) = &node.rlimit {
        if let (Some(max), Some(cur)) = (r.maxpid, r.curproc) {
            out.insert(
                Signal::PidAvailable,
                Observation {
                    available: max.saturating_sub(cur),
                    capacity: max,
                },
            );
        }
    }
    out
}

/// Signals in the order their pressure is relieved (memory first, as
/// upstream's `byEvictionPriority`).
fn priority(t: &Threshold) -> u8 {
    match t.signal {
        Signal::MemoryAvailable => 0,
        Signal::NodeFsAvailable | Signal::ImageFsAvailable => 1,
        Signal::NodeFsInodesFree | Signal::ImageFsInodesFree => 2,
        Signal::PidAvailable => 3,
    }
}

/// What `pod` uses by its summary `stats` (none when the runtime has no
/// figures for it yet) and its disk-backed emptyDirs.
fn usage_of(pod: &Pod, stats: Option<&PodStats>, empty_dirs: Vec<EmptyDirUsage>) -> PodUsage {
    let containers: Vec<ContainerUsage> = stats
        .map(|s| s.containers.iter().map(container_usage).collect())
        .unwrap_or_default();
    let empty_dir_bytes: u64 = empty_dirs.iter().map(|d| d.used).sum();
    PodUsage {
        pod: pod.clone(),
        memory: stats
            .and_then(|s| s.memory.as_ref())
            .and_then(|m| m.working_set_bytes)
            .unwrap_or(0),
        storage: containers.iter().map(|c| c.storage).sum::<u64>() + empty_dir_bytes,
        containers,
        empty_dirs,
    }
}

/// A container's working set, and its writable layer plus logs.
fn container_usage(c: &ContainerStats) -> ContainerUsage {
    ContainerUsage {
        name: c.name.clone(),
        memory: c
            .memory
            .as_ref()
            .and_then(|m| m.working_set_bytes)
            .unwrap_or(0),
        storage: [c.rootfs.as_ref(), c.logs.as_ref()]
            .into_iter()
            .flatten()
            .filter_map(|f| f.used_bytes)
            .sum(),
    }
}

/// The manager's loop and what it remembers between rounds.
pub struct Manager {
    shared: Arc<Shared>,
    settings: Settings,
    stops: mpsc::Sender<StopPods>,
    recorder: Option<ApiRecorder>,
    /// When each threshold (by signal and grace) was first seen met.
    first_observed: HashMap<(Signal, Duration), Instant>,
    /// When each pressure condition was last seen.
    condition_last_observed: HashMap<&'static str, Instant>,
    /// The thresholds met last round: they stay met until their minimum
    /// reclaim is back.
    met_last: Vec<Threshold>,
    /// Removes unused images under disk pressure.
    images: crate::images::collector::Collector,
}

impl Manager {
    pub fn new(
        shared: Arc<Shared>,
        settings: Settings,
        stops: mpsc::Sender<StopPods>,
        recorder: Option<ApiRecorder>,
    ) -> Manager {
        let images = crate::images::collector::Collector::new(
            shared.runtime.cri.clone(),
            shared.config.image_gc,
            shared.config.image_gc_period,
            None,
        );
        Manager {
            shared,
            settings,
            stops,
            recorder,
            first_observed: HashMap::new(),
            condition_last_observed: HashMap::new(),
            met_last: Vec::new(),
            images,
        }
    }

    /// Check every monitoring period until `shutdown`.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        tracing::info!(thresholds = ?self.settings.thresholds, "eviction manager");
        let mut ticks = crate::ticks::Ticks::new(MONITORING_PERIOD, shutdown);
        while ticks.next().await {
            if let Err(e) = self.synchronize().await {
                tracing::warn!("eviction manager: cannot read node stats: {e}");
            }
        }
    }

    /// One round (upstream `synchronize`).
    async fn synchronize(&mut self) -> Result<(), cri_proto::Error> {
        let observed = observe(&crate::server::stats::node_only(&self.shared).await);
        // Pods' figures cost a copy of the pods, a CRI stats call and walks
        // of their volumes: taken for the pods with storage limits, and
        // for all running pods only once a threshold is met.
        let limited = self.shared.statuses.list_where(|p, s| {
            !kube_util::podstatus::is_terminal(s) && local_storage::has_limits(p)
        });
        if !limited.is_empty() {
            let usage = self.pod_usage(&limited).await?;
            if self.local_storage_eviction(&usage).await {
                return Ok(());
            }
        }
        let now = Instant::now();
        let mut met = thresholds::met(&self.settings.thresholds, &observed, false);
        for t in thresholds::met(&self.met_last, &observed, true) {
            if !met.contains(&t) {
                met.push(t);
            }
        }
        let keys: HashSet<(Signal, Duration)> =
            met.iter().map(|t| (t.signal, t.grace_period)).collect();
        self.first_observed.retain(|k, _| keys.contains(k));
        for k in &keys {
            self.first_observed.entry(*k).or_insert(now);
        }
        let met: Vec<Threshold> = met
            .into_iter()
            .filter(|t| {
                self.first_observed
                    .get(&(t.signal, t.grace_period))
                    .is_some_and(|first| now.duration_since(*first) >= t.grace_period)
            })
            .collect();
        for t in &met {
            self.condition_last_observed
                .insert(t.signal.condition(), now);
        }
        let period = self.settings.pressure_transition_period;
        self.condition_last_observed
            .retain(|_, seen| now.duration_since(*seen) < period);
        let mut conditions: Vec<&'static str> = ["MemoryPressure", "DiskPressure", "PIDPressure"]
            .into_iter()
            .filter(|c| self.condition_last_observed.contains_key(c))
            .collect();
        conditions.sort_unstable();
        if conditions != self.shared.pressure.conditions() {
            tracing::info!(?conditions, "node pressure conditions changed");
        }
        self.shared.pressure.set(conditions);
        self.met_last = met.clone();
        let Some(threshold) = met.iter().min_by_key(|t| priority(t)).cloned() else {
            return Ok(());
        };
        let resource = threshold.signal.resource();
        crate::events::report_node(
            self.recorder.as_ref(),
            WARNING,
            "EvictionThresholdMet",
            &format!("Attempting to reclaim {resource}"),
        );
        if self.reclaim_node_level(&threshold).await {
            return Ok(());
        }
        let Some(o) = observed.get(&threshold.signal).copied() else {
            return Ok(());
        };
        let active = self.shared.statuses.list_where(|p, s| {
            !kube_util::podstatus::is_terminal(s) && !crate::pod::is_critical(p)
        });
        let mut candidates = self.pod_usage(&active).await?;
        rank::rank(threshold.signal, &mut candidates);
        let Some(victim) = candidates.first() else {
            tracing::warn!(
                signal = threshold.signal.name(),
                "eviction manager: no pod to evict (only critical pods run)"
            );
            return Ok(());
        };
        let message = rank::message(
            threshold.signal,
            threshold.value.amount(o.capacity),
            o.available,
            victim,
        );
        let grace = if threshold.is_hard() {
            IMMEDIATE_GRACE_SECONDS
        } else {
            let own = victim
                .pod
                .spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
                .unwrap_or(30);
            own.min(self.settings.max_pod_grace_period)
        };
        self.evict(&victim.pod, grace, message).await;
        Ok(())
    }

    /// Each running pod's use of memory and storage.
    ///
    /// # Errors
    /// The runtime's container stats could not be listed.
    async fn pod_usage(&self, pods: &[Pod]) -> Result<Vec<PodUsage>, cri_proto::Error> {
        let summary = crate::server::stats::collect(&self.shared).await?;
        let volumes: Vec<(Pod, std::path::PathBuf)> = pods
            .iter()
            .map(|p| (p.clone(), self.shared.volumes.volumes_dir(p.uid())))
            .collect();
        // Walking the volumes is blocking work; a failed walk counts none.
        let empty_dirs: Vec<Vec<EmptyDirUsage>> = tokio::task::spawn_blocking(move || {
            volumes
                .iter()
                .map(|(p, dir)| local_storage::empty_dir_usage(dir, p))
                .collect()
        })
        .await
        .unwrap_or_default();
        let empty_dirs = empty_dirs
            .into_iter()
            .chain(std::iter::repeat_with(Vec::new));
        Ok(pods
            .iter()
            .zip(empty_dirs)
            .map(|(p, empty_dirs)| {
                let stats = summary.pods.iter().find(|s| s.pod_ref.uid == p.uid());
                usage_of(p, stats, empty_dirs)
            })
            .collect())
    }

    /// Evict the pods over their storage limits; whether any was.
    async fn local_storage_eviction(&self, usage: &[PodUsage]) -> bool {
        let mut evicted = false;
        for u in usage {
            if crate::pod::is_critical(&u.pod) {
                continue;
            }
            if let Some(message) = local_storage::violation(&u.pod, &u.containers, &u.empty_dirs) {
                self.evict(&u.pod, 0, message).await;
                evicted = true;
            }
        }
        evicted
    }

    /// Under disk pressure, remove unused images first; whether that
    /// relieved the threshold (minimum reclaim included).
    async fn reclaim_node_level(&mut self, threshold: &Threshold) -> bool {
        if threshold.signal.condition() != "DiskPressure" {
            return false;
        }
        match self.images.delete_unused().await {
            Ok(freed) => tracing::info!(freed, "eviction manager: removed unused images"),
            Err(e) => tracing::warn!("eviction manager: removing unused images failed: {e}"),
        }
        let observed = observe(&crate::server::stats::node_only(&self.shared).await);
        thresholds::met(std::slice::from_ref(threshold), &observed, true).is_empty()
    }

    /// Halt `pod` as evicted: its status and a Warning event say why; wait
    /// until it stopped (or the clean-up timeout passed).
    async fn evict(&self, pod: &Pod, grace: i64, message: String) {
        tracing::info!(pod = %pod.key(), grace, "evicting pod: {message}");
        self.shared.recorder.event(pod, WARNING, REASON, &message);
        let (done, stopped) = tokio::sync::oneshot::channel();
        let cmd = StopPods {
            pods: vec![(pod.uid().to_string(), grace)],
            halt: Halt {
                reason: REASON,
                message,
            },
            done,
        };
        if self.stops.send(cmd).await.is_err() {
            return;
        }
        if tokio::time::timeout(POD_CLEANUP_TIMEOUT, stopped)
            .await
            .is_err()
        {
            tracing::warn!(pod = %pod.key(), "evicted pod did not stop within {POD_CLEANUP_TIMEOUT:?}");
        }
    }
}
