//! Graceful node shutdown (the kubelet's `nodeshutdown` manager): with
//! `shutdownGracePeriod` set, the agent holds a systemd-logind *delay*
//! inhibitor lock; when logind announces `PrepareForShutdown(true)` the
//! agent reports the node not ready, stops its pods in two phases, sees
//! their final status in the API, and only then releases the lock so the
//! shutdown proceeds.
//!
//! The phases split the grace period as upstream's
//! `shutdownGracePeriodCriticalPods` does: regular pods first, within
//! `shutdownGracePeriod - shutdownGracePeriodCriticalPods`; critical pods
//! (static and mirror pods, priority of at least 2000000000) last, within
//! `shutdownGracePeriodCriticalPods`. Each pod gets the smaller of its
//! phase's period and its own `terminationGracePeriodSeconds`. A stopped
//! pod is reported `Failed`, reason `Terminated`, with a
//! `DisruptionTarget` condition, and is not started again.
//!
//! # Layout
//! - [`logind`]: the real signal source, systemd-logind over D-Bus.
//! - [`Signals`]: the narrow trait it implements (fakes in tests).
//! - [`phases`]: which pods stop when, and within what period.

pub mod logind;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use tokio::sync::{mpsc, oneshot};

use crate::pod::is_critical;
use crate::pod::PodExt;
use crate::status::StatusStore;

/// The status reason and message of a pod stopped for shutdown.
pub const REASON: &str = "Terminated";
pub const MESSAGE: &str = "Pod was terminated in response to imminent node shutdown.";
/// What the node's Ready condition says meanwhile.
pub const NODE_MESSAGE: &str = "node is shutting down";
/// Longest wait for the API to show the stopped pods as Failed.
const REPORT_WAIT: Duration = Duration::from_secs(5);

/// Why graceful shutdown could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("systemd-logind over D-Bus: {0}")]
    Dbus(#[from] zbus::Error),
    #[error("systemd-logind answered unexpectedly: {0}")]
    Logind(String),
}

/// Where shutdown announcements come from: logind, or a test's fake.
pub trait Signals: Send {
    /// Take (again) the delay inhibitor lock.
    fn inhibit(&mut self) -> BoxFuture<'_, Result<(), Error>>;
    /// Release it: the shutdown may go on.
    fn release(&mut self);
    /// The next `PrepareForShutdown`: `true` when a shutdown starts,
    /// `false` when it was cancelled; None when the source is gone.
    fn next(&mut self) -> BoxFuture<'_, Option<bool>>;
}

/// The grace periods (`shutdownGracePeriod`, `...CriticalPods`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Periods {
    pub total: Duration,
    pub critical: Duration,
}

/// One phase of the shutdown: these pods (uid, name, grace seconds), all
/// within `period`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Phase {
    pub period: Duration,
    pub pods: Vec<(String, String, i64)>,
}

/// The phases for `pods`: regular ones, then critical ones; empty phases
/// are left out.
pub fn phases(pods: &[Pod], p: Periods) -> Vec<Phase> {
    let critical = p.critical.min(p.total);
    let regular = p.total - critical;
    let mut out = Vec::new();
    for (want_critical, period) in [(false, regular), (true, critical)] {
        let limit = i64::try_from(period.as_secs()).unwrap_or(i64::MAX);
        let members: Vec<(String, String, i64)> = pods
            .iter()
            .filter(|pod| is_critical(pod) == want_critical)
            .filter(|pod| !pod.is_terminal())
            .map(|pod| {
                let own = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds)
                    .unwrap_or(30);
                (pod.uid().to_string(), pod.key(), own.min(limit).max(0))
            })
            .collect();
        if !members.is_empty() {
            out.push(Phase {
                period,
                pods: members,
            });
        }
    }
    out
}

/// What a pod stopped for the node's shutdown reports.
pub fn halt() -> crate::halt::Halt {
    crate::halt::Halt {
        reason: REASON,
        message: MESSAGE.into(),
    }
}

/// Whether the node is shutting down (read by node status).
#[derive(Debug, Default)]
pub struct ShuttingDown(AtomicBool);

impl ShuttingDown {
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
    fn set(&self, v: bool) {
        self.0.store(v, Ordering::Relaxed);
    }
}

/// The runtime's health as node status sees it, plus "node is shutting
/// down" while a shutdown runs: the node is reported not ready then.
pub struct ReportShutdown {
    pub inner: Arc<dyn crate::node::RuntimeProbe>,
    pub flag: Arc<ShuttingDown>,
}

impl crate::node::RuntimeProbe for ReportShutdown {
    fn images(&self) -> BoxFuture<'_, Option<Vec<k8s_openapi::api::core::v1::ContainerImage>>> {
        self.inner.images()
    }

    fn probe(&self) -> BoxFuture<'_, crate::node::RuntimeHealth> {
        Box::pin(async move {
            let mut h = self.inner.probe().await;
            if self.flag.get() {
                h.errors.push(NODE_MESSAGE.into());
            }
            h
        })
    }
}

/// The manager: holds the lock, and stops the pods when told.
pub struct ShutdownManager<S: Signals> {
    pub signals: S,
    pub periods: Periods,
    pub statuses: Arc<StatusStore>,
    /// Receiver: the pod manager.
    pub commands: mpsc::Sender<crate::halt::StopPods>,
    /// To see the final statuses in the API; None standalone.
    pub client: Option<kube::Client>,
    pub shutting_down: Arc<ShuttingDown>,
}

impl<S: Signals> ShutdownManager<S> {
    /// Hold the lock and wait for shutdowns until `stop` resolves.
    pub async fn run(mut self, stop: impl Future<Output = ()>) {
        tokio::pin!(stop);
        if let Err(e) = self.signals.inhibit().await {
            tracing::warn!("graceful node shutdown is off: taking the inhibitor lock failed: {e}");
            return;
        }
        tracing::info!(grace = ?self.periods.total, critical = ?self.periods.critical, "graceful node shutdown armed: holding a systemd-logind delay lock");
        loop {
            let ev = tokio::select! {
                ev = self.signals.next() => ev,
                _ = &mut stop => return,
            };
            match ev {
                Some(true) => self.shutdown().await,
                Some(false) => {
                    tracing::info!("node shutdown cancelled; taking the inhibitor lock again");
                    self.shutting_down.set(false);
                    if let Err(e) = self.signals.inhibit().await {
                        tracing::warn!("taking the inhibitor lock again failed: {e}");
                    }
                }
                None => {
                    tracing::warn!(
                        "the shutdown signal source went away; graceful node shutdown is off"
                    );
                    return;
                }
            }
        }
    }

    async fn shutdown(&mut self) {
        let began = Instant::now();
        self.shutting_down.set(true);
        let pods = self.statuses.list();
        let phases = phases(&pods, self.periods);
        tracing::info!(
            pods = pods.len(),
            phases = phases.len(),
            "node is shutting down: stopping pods"
        );
        for phase in &phases {
            let (done, finished) = oneshot::channel();
            let cmd = crate::halt::StopPods {
                pods: phase.pods.iter().map(|(u, _, g)| (u.clone(), *g)).collect(),
                halt: halt(),
                done,
            };
            if self.commands.send(cmd).await.is_err() {
                break;
            }
            let names: Vec<&str> = phase.pods.iter().map(|(_, n, _)| n.as_str()).collect();
            match tokio::time::timeout(phase.period, finished).await {
                Ok(_) => tracing::info!(pods = ?names, "stopped for shutdown"),
                Err(_) => {
                    tracing::warn!(pods = ?names, period = ?phase.period, "pods did not stop within their shutdown period")
                }
            }
        }
        let left = self.periods.total.saturating_sub(began.elapsed());
        self.wait_reported(&pods, left.min(REPORT_WAIT)).await;
        tracing::info!(took = ?began.elapsed(), "pods stopped; releasing the inhibitor lock");
        self.signals.release();
    }

    /// Wait (at most `within`) until the API shows every stopped pod
    /// Failed, so that nothing is lost with the machine.
    async fn wait_reported(&self, pods: &[Pod], within: Duration) {
        let Some(client) = &self.client else { return };
        let deadline = Instant::now() + within;
        let mut pending: Vec<&Pod> = pods.iter().filter(|p| !p.is_terminal()).collect();
        while !pending.is_empty() && Instant::now() < deadline {
            let mut still = Vec::new();
            for p in pending {
                let api: Api<Pod> = Api::namespaced(client.clone(), p.namespace());
                let failed = match api.get_opt(p.name()).await {
                    Ok(Some(live)) => live.is_terminal(),
                    Ok(None) => true,
                    Err(_) => false,
                };
                if !failed {
                    still.push(p);
                }
            }
            pending = still;
            if !pending.is_empty() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        if !pending.is_empty() {
            let names: Vec<String> = pending.iter().map(|p| p.key()).collect();
            tracing::warn!(pods = ?names, "shutting down before the API showed these pods' final status");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::CRITICAL_PRIORITY;
    use k8s_openapi::api::core::v1::PodSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(name: &str, priority: Option<i32>, grace: Option<i64>, static_pod: bool) -> Pod {
        let mut annotations = std::collections::BTreeMap::new();
        if static_pod {
            annotations.insert(
                "kubernetes.io/config.source".to_string(),
                "file".to_string(),
            );
        }
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                uid: Some(format!("uid-{name}")),
                annotations: Some(annotations),
                ..Default::default()
            },
            spec: Some(PodSpec {
                priority,
                termination_grace_period_seconds: grace,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn regular_pods_first_then_critical_ones_each_within_its_share() {
        let pods = [
            pod("web", None, Some(60), false),
            pod("quick", None, Some(2), false),
            pod("dns", Some(CRITICAL_PRIORITY), None, false),
            pod("etcd", None, Some(300), true),
        ];
        let p = Periods {
            total: Duration::from_secs(30),
            critical: Duration::from_secs(10),
        };
        let got = phases(&pods, p);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].period, Duration::from_secs(20));
        let g0: Vec<(&str, i64)> = got[0]
            .pods
            .iter()
            .map(|(_, n, g)| (n.as_str(), *g))
            .collect();
        assert_eq!(g0, vec![("default/web", 20), ("default/quick", 2)]);
        assert_eq!(got[1].period, Duration::from_secs(10));
        let g1: Vec<(&str, i64)> = got[1]
            .pods
            .iter()
            .map(|(_, n, g)| (n.as_str(), *g))
            .collect();
        assert_eq!(g1, vec![("default/dns", 10), ("default/etcd", 10)]);
        // A critical share larger than the whole leaves nothing for the rest.
        let all_critical = phases(
            &pods,
            Periods {
                total: Duration::from_secs(5),
                critical: Duration::from_secs(9),
            },
        );
        assert_eq!(all_critical[0].period, Duration::ZERO);
        assert_eq!(all_critical[1].period, Duration::from_secs(5));
    }
}
