//! Pod lifecycle event generator: notices containers changing state in the
//! runtime and wakes the affected pods' workers. It relists every
//! `pleg_relist_period` (1 s); where the runtime streams container events
//! (`GetContainerEvents`, containerd >= 1.7) those wake workers at once
//! and the relist stays as the safety net. Containerd 1.6 answers
//! Unimplemented, and relisting alone does the job.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cri_proto::v1;
use tokio::sync::mpsc;

use crate::runtime::labels;
use crate::runtime::Runtime;

/// What a relist found. Receiver: the pod manager.
#[derive(Debug, Clone, Default)]
pub struct Relist {
    /// Pods whose sandboxes or containers changed since the last relist.
    pub changed: HashSet<String>,
    /// Every pod uid the runtime holds (for orphan detection).
    pub present: HashSet<String>,
}

/// Runtime health, as the node's Ready condition and `/healthz` report it.
#[derive(Debug, Default)]
pub struct Health {
    ready: AtomicBool,
    last_relist: Mutex<Option<Instant>>,
    last_error: Mutex<Option<String>>,
    version: Mutex<String>,
}

impl Health {
    /// Ready when the last relist succeeded and happened within 3 minutes
    /// (the kubelet's PLEG health threshold).
    pub fn ready(&self) -> Result<(), String> {
        let last = *self.last_relist.lock().unwrap_or_else(|e| e.into_inner());
        if !self.ready.load(Ordering::Relaxed) {
            let err = self
                .last_error
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            return Err(format!(
                "container runtime is down: {}",
                err.unwrap_or_else(|| "not yet contacted".into())
            ));
        }
        match last {
            Some(t) if t.elapsed() < Duration::from_secs(180) => Ok(()),
            _ => Err("PLEG is not healthy: pleg was last seen active more than 3m0s ago".into()),
        }
    }
    /// `containerd://1.6.20`, once known.
    pub fn version(&self) -> String {
        self.version
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

type Snapshot = HashMap<String, (String, i32)>;

pub struct Pleg {
    runtime: Arc<Runtime>,
    period: Duration,
    health: Arc<Health>,
    /// Sender to the manager; the PLEG stops when it closes.
    tx: mpsc::Sender<Relist>,
    /// Wakes from the event stream.
    wake: mpsc::UnboundedSender<String>,
}

impl Pleg {
    pub fn new(
        runtime: Arc<Runtime>,
        period: Duration,
        health: Arc<Health>,
        tx: mpsc::Sender<Relist>,
        wake: mpsc::UnboundedSender<String>,
    ) -> Pleg {
        Pleg {
            runtime,
            period,
            health,
            tx,
            wake,
        }
    }

    pub async fn run(self) {
        let events = tokio::spawn(stream_events(self.runtime.clone(), self.wake.clone()));
        let mut previous: Option<Snapshot> = None;
        let mut interval = tokio::time::interval(self.period);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = interval.tick() => {}
                _ = self.tx.closed() => break,
            }
            let started = Instant::now();
            let relisted = self.relist(&mut previous).await;
            crate::metrics::metrics()
                .pleg_relist
                .observe(started.elapsed().as_secs_f64());
            match relisted {
                Ok(r) => {
                    if self.tx.send(r).await.is_err() {
                        break;
                    }
                }
                Err(e) => {
                    if self.health.ready.swap(false, Ordering::Relaxed) || previous.is_none() {
                        tracing::warn!("container runtime not ready, retrying: {e}");
                    }
                    *self
                        .health
                        .last_error
                        .lock()
                        .unwrap_or_else(|e| e.into_inner()) = Some(e.to_string());
                    // Everything must be re-examined when it comes back.
                    previous = None;
                }
            }
        }
        events.abort();
    }

    async fn relist(&self, previous: &mut Option<Snapshot>) -> Result<Relist, cri_proto::Error> {
        if self.health.version().is_empty() || !self.health.ready.load(Ordering::Relaxed) {
            let v = self.runtime.version().await?;
            *self
                .health
                .version
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = v;
        }
        let (sandboxes, containers) = self.runtime.list_managed().await?;
        self.runtime.prune_caches(&containers, &sandboxes);
        let mut now: Snapshot = HashMap::new();
        for s in &sandboxes {
            if let Some(uid) = s.labels.get(labels::POD_UID) {
                now.insert(s.id.clone(), (uid.clone(), s.state));
            }
        }
        for c in &containers {
            if let Some(uid) = c.labels.get(labels::POD_UID) {
                now.insert(c.id.clone(), (uid.clone(), c.state));
            }
        }
        let mut out = Relist {
            present: now.values().map(|(u, _)| u.clone()).collect(),
            ..Default::default()
        };
        match previous {
            None => out.changed = out.present.clone(),
            Some(prev) => {
                for (id, (uid, state)) in &now {
                    if prev.get(id).map(|(_, s)| s) != Some(state) {
                        out.changed.insert(uid.clone());
                    }
                }
                for (id, (uid, _)) in prev.iter() {
                    if !now.contains_key(id) {
                        out.changed.insert(uid.clone());
                    }
                }
            }
        }
        if !self.health.ready.swap(true, Ordering::Relaxed) {
            tracing::info!(runtime = %self.health.version(), "container runtime ready");
        }
        *self
            .health
            .last_relist
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        *previous = Some(now);
        Ok(out)
    }
}

/// Follow CRI container events while the runtime offers them.
async fn stream_events(runtime: Arc<Runtime>, wake: mpsc::UnboundedSender<String>) {
    loop {
        match runtime
            .cri
            .get_container_events(v1::GetEventsRequest::default())
            .await
        {
            Ok(mut stream) => {
                tracing::info!("following CRI container events");
                while let Ok(Some(ev)) = stream.message().await {
                    let uid = ev
                        .pod_sandbox_status
                        .as_ref()
                        .and_then(|s| s.labels.get(labels::POD_UID).cloned());
                    if let Some(uid) = uid {
                        if wake.send(uid).is_err() {
                            return;
                        }
                    }
                }
            }
            Err(e) if e.is_unimplemented() => {
                tracing::debug!("runtime has no container event stream; relisting only");
                return;
            }
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}
