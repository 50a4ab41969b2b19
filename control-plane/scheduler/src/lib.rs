//! The scheduler: for each pod without a node, filter the nodes, score the
//! ones left, and bind through pods/binding.
//!
//! # Layout
//!
//! - [`podinfo`], [`nodeinfo`]: a pod's and a node's scheduling facts.
//! - [`cache`]: nodes with the pods bound or assumed on them.
//! - [`filter`], [`score`]: the pure decision functions, and the
//!   FailedScheduling message.
//! - [`interpod`], [`spread`]: required pod (anti-)affinity and topology
//!   spread constraints, counted once per attempt for the filters.
//! - [`queue`]: pending pods, back-off and unschedulable parking.
//! - [`preempt`]: which lower-priority pods to remove when no node fits,
//!   with the PodDisruptionBudgets of [`budgets`]; [`victims`]: the
//!   writes that remove them.
//! - [`volumes`]: claims, volumes and classes; the volume checks and
//!   the volume decisions made with the node.
//! - [`volumebind`]: the volume writes made before binding.
//! - [`bind`]: the pods/binding write.
//! - [`events`]: events and the PodScheduled condition.
//! - `informer`: the node, pod and storage watches, fed to the loop.
//!
//! Quantities, a pod's requests, taints and node affinity are
//! `kube_util`'s, shared with the controllers.
//! - `scheduler`: the loop that ties them together.

#![forbid(unsafe_code)]

use std::future::Future;
use std::time::Duration;

pub mod bind;
pub mod budgets;
pub mod cache;
pub mod events;
pub mod filter;
mod informer;
pub mod interpod;
pub mod nodeinfo;
pub mod podinfo;
pub mod preempt;
pub mod profile;
pub mod queue;
mod scheduler;
pub mod score;
pub mod spread;
pub mod victims;
pub mod volumebind;
pub mod volumes;

/// Scheduler settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// The profiles: pods whose `spec.schedulerName` is one of theirs
    /// are ours, scored as that profile says; each name is also the
    /// reporting controller of its pods' events.
    pub profiles: Vec<profile::Profile>,
    /// Bindings (one POST each) in flight at once. Decisions stay
    /// sequential; this only overlaps the round trips.
    pub max_binds_in_flight: usize,
    /// Back-off after the first failed attempt; doubles per attempt
    /// (upstream podInitialBackoff, 1 s).
    pub initial_backoff: Duration,
    /// Back-off cap (upstream podMaxBackoff, 10 s).
    pub max_backoff: Duration,
    /// How long an unschedulable pod waits for a node or pod change
    /// before it is tried again anyway (upstream
    /// podMaxInUnschedulablePodsDuration, 5 minutes).
    pub unschedulable_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            profiles: vec![profile::Profile::default_scheduler()],
            max_binds_in_flight: 32,
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(10),
            unschedulable_timeout: Duration::from_secs(300),
        }
    }
}

impl Config {
    /// The defaults with what a `KubeSchedulerConfiguration` file at
    /// `path` sets (kube-scheduler's `--config`).
    ///
    /// # Errors
    /// The file cannot be read, decoded, or sets what is not supported.
    pub fn from_file(path: &std::path::Path) -> Result<Config, profile::Error> {
        let file = profile::load(path)?;
        Ok(Config {
            profiles: file.profiles,
            initial_backoff: file.initial_backoff,
            max_backoff: file.max_backoff,
            ..Config::default()
        })
    }
}

/// Schedule pods until `shutdown` resolves.
///
/// Watches nodes, pods, claims, volumes and storage classes with
/// `client` (which should act as `system:kube-scheduler`, with the
/// volume scheduler's rights), binds every pending pod whose
/// `spec.schedulerName` names one of `config.profiles` to a node that fits,
/// and records `Scheduled` / `FailedScheduling` events.
///
/// # Guarantees
///
/// API errors never end it: watches re-list with back-off, failed
/// bindings are retried with back-off. On shutdown, bindings already in
/// flight get a few seconds to land. Pods without claims never wait for
/// the storage watches; pods with claims wait until those have listed.
///
/// # Caveats
///
/// A pod whose WaitForFirstConsumer claims needed a decision is bound
/// right after the decision is written (a PV's claimRef, or the claim's
/// `volume.kubernetes.io/selected-node`), without waiting for the PV
/// controller to complete the binding as upstream's PreBind does: the
/// node's agent waits until the claims are Bound before it mounts.
pub async fn run(client: kube::Client, config: Config, shutdown: impl Future<Output = ()>) {
    scheduler::run(client, config, shutdown).await;
}
