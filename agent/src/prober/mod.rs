//! Container probes (the kubelet's `prober`): liveness, readiness and
//! startup, each of kind exec, httpGet, tcpSocket or grpc.
//!
//! # Layout
//! - [`Prober`] (here): keeps one worker task per (pod, container, probe
//!   kind), told by the pod worker what the container is doing on every
//!   status report, and stopped when the pod goes away.
//! - `worker`: the probe loop, with jitter, thresholds and events.
//! - [`results`]: the standing results by container id; changes wake the
//!   pod's worker, which reads a [`PodProbes`] snapshot to plan (kill a
//!   container whose liveness or startup probe failed) and report (`ready`,
//!   `started`, the pod's Ready condition).
//! - [`exec`], [`http`], [`tcp`], [`grpc`]: one probe of each kind;
//!   [`port`] resolves named ports. `http` also serves lifecycle hooks.
//!
//! Exec probes go through a semaphore: each is a runtime exec (a runc
//! process and a shim round trip), the one probe kind whose node cost
//! grows with the pod count, so only a bounded number run at once.

pub mod exec;
pub mod grpc;
pub mod http;
pub mod port;
pub mod results;
pub mod tcp;
mod worker;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cri_proto::CriClient;
use k8s_openapi::api::core::v1::{Pod, PodStatus, Probe};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinHandle;

pub use results::{Kind, Outcome, PodProbes, Results};

use crate::events::Recorder;
use crate::pod::PodExt;
use crate::runtime::state::{PodRuntime, State};
use worker::{Spec, Target};

/// What one run of a probe handler found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// With the output (body, command output).
    Success(String),
    /// A success that deserves a `ProbeWarning` event (an HTTP redirect
    /// that was not followed).
    Warning(String),
    /// With the output that says why.
    Failure(String),
}

/// A probe could not be run at all: its result is unknown, not failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The probe names a port the container does not have.
    #[error(transparent)]
    Port(#[from] port::PortError),
    /// The runtime could not exec the command.
    #[error("{0}")]
    Runtime(#[from] cri_proto::Error),
    /// The pod has no IP (yet) to connect to.
    #[error("the pod has no IP address yet")]
    NoPodIp,
    /// None of exec, httpGet, tcpSocket, grpc is set.
    #[error("missing probe handler: set one of exec, httpGet, tcpSocket or grpc")]
    NoHandler,
}

/// A probe's timing and thresholds with upstream's defaults for unset
/// fields (period 10 s, timeout 1 s, success 1, failure 3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timing {
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success: u32,
    pub failure: u32,
}

impl Timing {
    pub fn of(p: &Probe) -> Timing {
        let secs = |v: Option<i32>, default: u64, min: u64| {
            Duration::from_secs(v.map_or(default, |s| (s.max(0) as u64).max(min)))
        };
        let count = |v: Option<i32>, default: u32| v.map_or(default, |n| n.max(1) as u32);
        Timing {
            initial_delay: secs(p.initial_delay_seconds, 0, 0),
            period: secs(p.period_seconds, 10, 1),
            timeout: secs(p.timeout_seconds, 1, 1),
            success: count(p.success_threshold, 1),
            failure: count(p.failure_threshold, 3),
        }
    }
}

/// How many exec probes may run at once on the node. Each is a runc exec
/// (fork, namespaces, a shim round trip): beyond a few per core they only
/// queue in the runtime and slow each other down.
fn exec_slots() -> usize {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    (cores * 4).clamp(4, 64)
}

/// What the workers share.
pub(crate) struct Context {
    cri: CriClient,
    recorder: Arc<dyn Recorder>,
    results: Results,
    exec_slots: Semaphore,
}

type Key = (String, String, Kind);

struct Handle {
    probe: Probe,
    target: watch::Sender<Target>,
    task: JoinHandle<()>,
}

/// The probe manager (upstream `prober_manager.go`).
pub struct Prober {
    ctx: Arc<Context>,
    workers: Mutex<HashMap<Key, Handle>>,
}

impl Prober {
    /// `wake` receives a pod uid whenever one of its results changes (the
    /// pod manager routes it to the pod's worker).
    pub fn new(
        cri: CriClient,
        recorder: Arc<dyn Recorder>,
        wake: mpsc::UnboundedSender<String>,
    ) -> Prober {
        Prober {
            ctx: Arc::new(Context {
                cri,
                recorder,
                results: Results::new(wake),
                exec_slots: Semaphore::new(exec_slots()),
            }),
            workers: Mutex::new(HashMap::new()),
        }
    }

    /// A snapshot of one pod's results.
    pub fn results(&self, uid: &str) -> PodProbes {
        self.ctx.results.pod(uid)
    }

    /// Tell the workers of `pod` what its containers are doing, starting
    /// workers for probes not yet watched and stopping those whose
    /// container or probe left the spec. Called on every status report.
    /// Must be called from within the tokio runtime (it spawns).
    pub fn update(&self, pod: &Pod, rt: &PodRuntime, status: &PodStatus, probes: &PodProbes) {
        let uid = pod.uid();
        let has_probes = pod
            .containers()
            .iter()
            .any(|c| Kind::ALL.iter().any(|k| k.of(c).is_some()));
        let mut workers = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        if !has_probes && !workers.keys().any(|k| k.0 == uid) {
            return;
        }
        let shared_pod = Arc::new(pod.clone());
        let terminal = kube_util::podstatus::is_terminal(status);
        let pod_ip = status.pod_ip.clone().unwrap_or_default();
        let mut wanted = HashSet::new();
        for c in pod.containers() {
            let latest = rt.latest(&c.name);
            for kind in Kind::ALL {
                let Some(probe) = kind.of(c) else { continue };
                wanted.insert((c.name.clone(), kind));
                let target = Target {
                    pod: shared_pod.clone(),
                    container_id: latest.map(|l| l.id.clone()).unwrap_or_default(),
                    running: latest.is_some_and(|l| l.state == State::Running),
                    exited: latest.is_some_and(|l| l.state == State::Exited),
                    started_at_ns: latest.map_or(0, |l| l.started_at),
                    pod_ip: pod_ip.clone(),
                    started: latest.is_some_and(|l| probes.started(c, &l.id)),
                    terminal,
                };
                let key = (uid.to_string(), c.name.clone(), kind);
                match workers.get(&key) {
                    Some(h) if h.probe == *probe => {
                        h.target.send_if_modified(|t| {
                            let changed = *t != target;
                            if changed {
                                *t = target;
                            }
                            changed
                        });
                    }
                    _ => {
                        if let Some(old) = workers.remove(&key) {
                            self.stop(&key, old);
                        }
                        let (tx, rx) = watch::channel(target);
                        let spec = Spec {
                            uid: uid.to_string(),
                            container: c.clone(),
                            kind,
                            probe: probe.clone(),
                        };
                        let task = tokio::spawn(worker::run(self.ctx.clone(), spec, rx));
                        tracing::debug!(pod = %pod.key(), container = %c.name, probe = kind.as_str(), "probe worker started");
                        workers.insert(
                            key,
                            Handle {
                                probe: probe.clone(),
                                target: tx,
                                task,
                            },
                        );
                    }
                }
            }
        }
        let gone: Vec<Key> = workers
            .keys()
            .filter(|k| k.0 == uid && !wanted.contains(&(k.1.clone(), k.2)))
            .cloned()
            .collect();
        for k in gone {
            if let Some(h) = workers.remove(&k) {
                self.stop(&k, h);
            }
        }
    }

    /// Stop every worker of a pod and forget its results (the pod is gone).
    pub fn remove_pod(&self, uid: &str) {
        let mut workers = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        let keys: Vec<Key> = workers.keys().filter(|k| k.0 == uid).cloned().collect();
        for k in keys {
            if let Some(h) = workers.remove(&k) {
                h.task.abort();
            }
        }
        self.ctx.results.remove_pod(uid);
    }

    fn stop(&self, key: &Key, h: Handle) {
        h.task.abort();
        let id = h.target.borrow().container_id.clone();
        if !id.is_empty() {
            self.ctx.results.remove(&key.0, &id, key.2);
        }
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        for h in self
            .workers
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .values()
        {
            h.task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timing_defaults_as_upstream() {
        let t = Timing::of(&Probe::default());
        assert_eq!(t.period, Duration::from_secs(10));
        assert_eq!(t.timeout, Duration::from_secs(1));
        assert_eq!((t.success, t.failure), (1, 3));
        assert_eq!(t.initial_delay, Duration::ZERO);
        let p: Probe = serde_saphyr::from_str(
            "{periodSeconds: 0, timeoutSeconds: 5, failureThreshold: 1, initialDelaySeconds: 7}",
        )
        .unwrap();
        let t = Timing::of(&p);
        assert_eq!(t.period, Duration::from_secs(1), "a zero period would spin");
        assert_eq!(t.timeout, Duration::from_secs(5));
        assert_eq!(t.failure, 1);
        assert_eq!(t.initial_delay, Duration::from_secs(7));
    }
}
