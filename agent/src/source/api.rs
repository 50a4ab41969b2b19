//! The API server source: pods bound to this node (`spec.nodeName=NAME`),
//! from a list-then-watch that resumes on its own after errors and
//! server restarts.
//!
//! Mirror pods (the API's copies of static pods) are never run: they go to
//! the mirror manager instead of the pod manager.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;
use tokio::sync::{mpsc, watch};

use super::PodUpdate;
pub use super::API_SOURCE as SOURCE;
use crate::pod::PodExt;

/// Mirror pods in the API, by `namespace/name`.
pub type MirrorPods = HashMap<String, Pod>;

/// Bursts of watch events (a Deployment scaled up) coalesce into one
/// snapshot per this interval.
const COALESCE: Duration = Duration::from_millis(20);

pub struct ApiSource {
    api: Api<Pod>,
    node_name: String,
}

impl ApiSource {
    pub fn new(client: kube::Client, node_name: &str) -> Self {
        ApiSource {
            api: Api::all(client),
            node_name: node_name.to_string(),
        }
    }

    /// Send snapshots to `tx` and mirror pods to `mirrors` until `tx`
    /// closes. The first snapshot is sent once the initial list is in:
    /// until then the pod manager keeps orphans alive.
    pub async fn run(self, tx: mpsc::Sender<PodUpdate>, mirrors: watch::Sender<MirrorPods>) {
        let cfg = watcher::Config::default().fields(&format!("spec.nodeName={}", self.node_name));
        let mut events = watcher::watcher(self.api, cfg).default_backoff().boxed();
        let mut pods: HashMap<String, Pod> = HashMap::new();
        let mut initial: Option<HashMap<String, Pod>> = None;
        let mut synced = false;
        let mut dirty = false;
        loop {
            let ev = if dirty {
                match tokio::time::timeout(COALESCE, events.next()).await {
                    Ok(ev) => ev,
                    Err(_) => {
                        dirty = false;
                        if !send(&tx, &mirrors, &pods).await {
                            return;
                        }
                        continue;
                    }
                }
            } else {
                tokio::select! {
                    ev = events.next() => ev,
                    _ = tx.closed() => return,
                }
            };
            match ev {
                None => return,
                Some(Err(e)) => {
                    tracing::warn!("watching this node's pods failed, retrying: {e}");
                }
                Some(Ok(Event::Init)) => initial = Some(HashMap::new()),
                Some(Ok(Event::InitApply(p))) => {
                    if let Some(m) = initial.as_mut() {
                        m.insert(p.uid().to_string(), p);
                    }
                }
                Some(Ok(Event::InitDone)) => {
                    pods = initial.take().unwrap_or_default();
                    if !synced {
                        tracing::info!(pods = pods.len(), "API pod source synced");
                        synced = true;
                    }
                    dirty = true;
                }
                Some(Ok(Event::Apply(p))) => {
                    pods.insert(p.uid().to_string(), p);
                    dirty = synced;
                }
                Some(Ok(Event::Delete(p))) => {
                    pods.remove(p.uid());
                    dirty = synced;
                }
            }
        }
    }
}

async fn send(
    tx: &mpsc::Sender<PodUpdate>,
    mirrors: &watch::Sender<MirrorPods>,
    pods: &HashMap<String, Pod>,
) -> bool {
    let (mirror, run): (Vec<&Pod>, Vec<&Pod>) = pods.values().partition(|p| p.is_mirror());
    mirrors.send_replace(mirror.into_iter().map(|p| (p.key(), p.clone())).collect());
    let update = PodUpdate {
        source: SOURCE,
        pods: run.into_iter().cloned().collect(),
        errors: Vec::new(),
    };
    tx.send(update).await.is_ok()
}
