//! The pod manager: merges the sources' snapshots into the desired set,
//! starts a worker per desired pod, tells workers to terminate pods that
//! are no longer desired, routes PLEG wake-ups, and tears down orphans
//! (pods in the runtime that no source wants) once every source has
//! reported, so that a restarted agent never kills a pod it simply has not
//! read yet.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::pleg::Relist;
use crate::pod::PodExt;
use crate::shared::Shared;
use crate::source::PodUpdate;
use crate::worker::{self, Msg};

struct Handle {
    tx: mpsc::UnboundedSender<Msg>,
    join: JoinHandle<()>,
    terminating: bool,
}

pub struct Manager {
    shared: Arc<Shared>,
    /// Desired pods per source, by uid.
    desired: HashMap<&'static str, HashMap<String, Pod>>,
    /// Sources that must report once before orphans may be removed.
    expected_sources: HashSet<&'static str>,
    workers: HashMap<String, Handle>,
    done_tx: worker::DoneTx,
    done_rx: mpsc::UnboundedReceiver<String>,
    /// Pods stopped because the API is deleting them, for the status
    /// manager to delete from the API. None when running standalone.
    deleted: Option<mpsc::UnboundedSender<Pod>>,
    /// Requests to halt pods; senders: the shutdown manager (when
    /// graceful shutdown is on) and the eviction manager.
    stops: Option<mpsc::Receiver<crate::halt::StopPods>>,
}

impl Manager {
    pub fn new(shared: Arc<Shared>, expected_sources: &[&'static str]) -> Manager {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        Manager {
            shared,
            desired: HashMap::new(),
            expected_sources: expected_sources.iter().copied().collect(),
            workers: HashMap::new(),
            done_tx,
            done_rx,
            deleted: None,
            stops: None,
        }
    }

    /// Halt pods when `rx` says so.
    pub fn with_stops(mut self, rx: mpsc::Receiver<crate::halt::StopPods>) -> Self {
        self.stops = Some(rx);
        self
    }

    /// Sources that must report once before orphans are removed.
    pub fn expect_sources(mut self, sources: &[&'static str]) -> Self {
        self.expected_sources = sources.iter().copied().collect();
        self
    }

    /// Report pods finished for graceful deletion on `tx`.
    pub fn with_deleted(mut self, tx: mpsc::UnboundedSender<Pod>) -> Self {
        self.deleted = Some(tx);
        self
    }

    fn sources_ready(&self) -> bool {
        self.expected_sources
            .iter()
            .all(|s| self.desired.contains_key(s))
    }

    fn desired_pod(&self, uid: &str) -> Option<&Pod> {
        self.desired.values().find_map(|m| m.get(uid))
    }

    /// Run until `shutdown` resolves. Receivers: source snapshots, PLEG
    /// relists, and event-stream wake-ups; each closes when its sender ends.
    pub async fn run(
        mut self,
        mut sources: mpsc::Receiver<PodUpdate>,
        mut relists: mpsc::Receiver<Relist>,
        mut wakes: mpsc::UnboundedReceiver<String>,
        shutdown: impl Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        let mut housekeeping = tokio::time::interval(Duration::from_secs(60));
        let mut stops = self.stops.take();
        loop {
            let next_stop = async {
                match stops.as_mut() {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                Some(cmd) = next_stop => self.halt(cmd),
                Some(update) = sources.recv() => self.apply(update),
                Some(relist) = relists.recv() => self.on_relist(relist),
                Some(uid) = wakes.recv() => self.wake(&uid),
                Some(uid) = self.done_rx.recv() => self.on_done(&uid),
                _ = housekeeping.tick() => {
                    let now = Instant::now();
                    self.shared.crash_backoff.lock().unwrap_or_else(|e| e.into_inner()).gc(now);
                    self.shared.images.gc(now);
                    self.sweep_volumes();
                }
                _ = &mut shutdown => break,
            }
        }
        self.stop().await;
    }

    /// Agent shutdown: workers stop where they are; containers keep running.
    async fn stop(self) {
        let mut joins = Vec::new();
        for (_, h) in self.workers {
            drop(h.tx);
            joins.push(h.join);
        }
        let all = futures::future::join_all(joins.iter_mut());
        if tokio::time::timeout(Duration::from_secs(5), all)
            .await
            .is_err()
        {
            for j in &joins {
                j.abort();
            }
        }
    }

    fn apply(&mut self, update: PodUpdate) {
        let was_ready = self.sources_ready();
        let new: HashMap<String, Pod> = update
            .pods
            .into_iter()
            .map(|p| (p.uid().to_string(), p))
            .collect();
        let old = self
            .desired
            .insert(update.source, new.clone())
            .unwrap_or_default();
        for (uid, pod) in &new {
            match old.get(uid) {
                Some(prev) if same_desired(prev, pod) => {}
                _ if pod.is_being_deleted() => {
                    if !self.workers.contains_key(uid) {
                        self.spawn(uid, Some(pod.clone()));
                    }
                    if self.workers.get(uid).is_some_and(|h| !h.terminating) {
                        tracing::info!(pod = %pod.key(), "pod is being deleted, stopping it");
                        self.terminate(uid, Some(pod.grace_period_seconds()));
                    }
                }
                _ => self.ensure_worker(uid, pod.clone()),
            }
        }
        for (uid, pod) in old {
            if !new.contains_key(&uid) && self.desired_pod(&uid).is_none() {
                tracing::info!(pod = %pod.key(), "pod removed from {}, stopping it", update.source);
                self.terminate(&uid, None);
            }
        }
        if !was_ready {
            // At start-up, once every pod has its worker: directories of
            // pods no one runs any more (a crash mid-teardown) go.
            self.sweep_volumes();
        }
    }

    /// Remove the volume directories and mounts of pods without a worker.
    fn sweep_volumes(&self) {
        if self.sources_ready() {
            self.shared
                .volumes
                .sweep_orphans(self.workers.keys().cloned().collect());
        }
    }

    fn ensure_worker(&mut self, uid: &str, pod: Pod) {
        if let Some(h) = self.workers.get(uid) {
            if !h.terminating {
                let _ = h.tx.send(Msg::Update(Box::new(pod)));
            }
            // A terminating worker finishes first; `on_done` restarts it.
            return;
        }
        tracing::info!(pod = %pod.key(), uid, "pod added");
        self.spawn(uid, Some(pod));
    }

    fn spawn(&mut self, uid: &str, pod: Option<Pod>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let join = tokio::spawn(worker::run(
            self.shared.clone(),
            uid.to_string(),
            pod,
            rx,
            self.done_tx.clone(),
        ));
        self.workers.insert(
            uid.to_string(),
            Handle {
                tx,
                join,
                terminating: false,
            },
        );
    }

    fn terminate(&mut self, uid: &str, grace: Option<i64>) {
        if !self.workers.contains_key(uid) {
            self.spawn(uid, None);
        }
        if let Some(h) = self.workers.get_mut(uid) {
            h.terminating = true;
            let _ = h.tx.send(Msg::Terminate { grace });
        }
    }

    /// Tell each pod's worker to halt it; the request's `done` fires once
    /// all have.
    fn halt(&self, cmd: crate::halt::StopPods) {
        let mut stopped = Vec::new();
        for (uid, grace) in cmd.pods {
            if let Some(h) = self.workers.get(&uid) {
                let (done, rx) = tokio::sync::oneshot::channel();
                let halt = cmd.halt.clone();
                if h.tx.send(Msg::Halt { grace, halt, done }).is_ok() {
                    stopped.push(rx);
                }
            }
        }
        tokio::spawn(async move {
            futures::future::join_all(stopped).await;
            let _ = cmd.done.send(());
        });
    }

    fn on_done(&mut self, uid: &str) {
        self.workers.remove(uid);
        if let Some(pod) = self.desired_pod(uid).cloned() {
            if pod.is_being_deleted() {
                if let Some(tx) = &self.deleted {
                    let _ = tx.send(pod);
                }
                return;
            }
            // Re-added while it was being torn down.
            self.spawn(uid, Some(pod));
        }
    }

    fn wake(&self, uid: &str) {
        if let Some(h) = self.workers.get(uid) {
            let _ = h.tx.send(Msg::Sync);
        }
    }

    fn on_relist(&mut self, relist: Relist) {
        for uid in &relist.changed {
            self.wake(uid);
        }
        if !self.sources_ready() {
            return;
        }
        for uid in relist.present {
            if !self.workers.contains_key(&uid) && self.desired_pod(&uid).is_none() {
                tracing::info!(uid, "found pod no source wants, removing it");
                self.terminate(&uid, None);
            }
        }
    }
}

/// Whether two versions of a pod want the same thing: status and
/// resourceVersion changes (the agent's own status writes coming back
/// through the watch) do not wake the worker.
fn same_desired(a: &Pod, b: &Pod) -> bool {
    let strip = |p: &Pod| {
        let mut m = p.metadata.clone();
        m.resource_version = None;
        m.managed_fields = None;
        m
    };
    a.spec == b.spec && strip(a) == strip(b)
}
