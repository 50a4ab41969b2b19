//! Watches of nodes and pods, each in its own task, feeding one channel
//! to the scheduling loop. Decoding (and working out a pod's scheduling
//! facts) happens in these tasks, off the loop.
//!
//! kube-runtime's watcher re-lists after a desync (410 Gone), an API
//! server restart or any error, with back-off; a re-list arrives as
//! `Relisting`, the objects, then `Listed`, after which whatever was not
//! listed is gone.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::warn;

use crate::podinfo::PodInfo;

/// A change seen through a watch.
#[derive(Debug)]
pub enum Update {
    NodesRelisting,
    Node(Node),
    NodeDeleted(Node),
    NodesListed,
    PodsRelisting,
    Pod(Arc<PodInfo>),
    PodDeleted(Arc<PodInfo>),
    PodsListed,
}

/// Updates waiting for the loop; past this the watches wait.
const CAPACITY: usize = 4096;

/// Start both watches. The tasks run until aborted or until the
/// receiver is dropped.
pub fn start(client: &kube::Client) -> (mpsc::Receiver<Update>, Vec<JoinHandle<()>>) {
    let (tx, rx) = mpsc::channel(CAPACITY);
    let nodes = tokio::spawn(forward(
        Api::<Node>::all(client.clone()),
        tx.clone(),
        "nodes",
        |ev| match ev {
            Event::Init => Update::NodesRelisting,
            Event::InitApply(n) | Event::Apply(n) => Update::Node(n),
            Event::Delete(n) => Update::NodeDeleted(n),
            Event::InitDone => Update::NodesListed,
        },
    ));
    let pods = tokio::spawn(forward(
        Api::<Pod>::all(client.clone()),
        tx,
        "pods",
        |ev| match ev {
            Event::Init => Update::PodsRelisting,
            Event::InitApply(p) | Event::Apply(p) => Update::Pod(Arc::new(PodInfo::new(p))),
            Event::Delete(p) => Update::PodDeleted(Arc::new(PodInfo::new(p))),
            Event::InitDone => Update::PodsListed,
        },
    ));
    (rx, vec![nodes, pods])
}

async fn forward<K>(
    api: Api<K>,
    tx: mpsc::Sender<Update>,
    what: &'static str,
    convert: impl Fn(Event<K>) -> Update,
) where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(ev) => {
                if tx.send(convert(ev)).await.is_err() {
                    return;
                }
            }
            Err(e) => warn!(resource = what, error = %e,
                "scheduler watch failed; re-listing with back-off (check the API server and the scheduler's RBAC)"),
        }
    }
}
