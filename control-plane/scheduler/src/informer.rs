//! The node, pod, claim, volume, storage class and PodDisruptionBudget
//! informers (`kube_util`'s, the same machinery as the controllers'),
//! each subscription forwarded by its own task into one channel to the
//! scheduling loop. Working out a pod's scheduling facts
//! happens in these tasks, off the loop.
//!
//! A (re-)list arrives as `Relisting`, the objects, then `Listed`; the
//! informer reports objects that vanished while its watch was away as
//! deleted before `Listed`, and the loop also drops whatever the list did
//! not show.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::Api;
use kube::runtime::watcher;
use kube_util::informer::{Change, Informer, Object, Subscription};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

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
    /// Claims, volumes and classes: taken in as they come, re-lists
    /// included, by `crate::volumes`.
    Claim(Change<PersistentVolumeClaim>),
    Volume(Change<PersistentVolume>),
    Class(Change<StorageClass>),
    /// PodDisruptionBudgets, for preemption ([`crate::budgets`]).
    Budget(Change<PodDisruptionBudget>),
}

/// Updates waiting for the loop; past this the forwarding tasks wait
/// (the informers' own queues take up the slack).
const CAPACITY: usize = 4096;

/// Start the informers and their forwarding tasks. The tasks, which
/// keep the informers alive, run until aborted or until the receiver is
/// dropped.
pub fn start(client: &kube::Client) -> (mpsc::Receiver<Update>, Vec<JoinHandle<()>>) {
    let (tx, rx) = mpsc::channel(CAPACITY);
    let nodes = Informer::<Node>::start(Api::all(client.clone()), watcher::Config::default());
    let pods = Informer::<Pod>::start(Api::all(client.clone()), watcher::Config::default());
    let nodes = tokio::spawn(forward(nodes.subscribe(), tx.clone(), |c| match c {
        Change::Relisting => Update::NodesRelisting,
        Change::Applied(n) => Update::Node(Arc::unwrap_or_clone(n)),
        Change::Deleted(n) => Update::NodeDeleted(Arc::unwrap_or_clone(n)),
        Change::Listed => Update::NodesListed,
    }));
    let claims = Informer::<PersistentVolumeClaim>::start(
        Api::all(client.clone()),
        watcher::Config::default(),
    );
    let volumes =
        Informer::<PersistentVolume>::start(Api::all(client.clone()), watcher::Config::default());
    let classes =
        Informer::<StorageClass>::start(Api::all(client.clone()), watcher::Config::default());
    let claims = tokio::spawn(forward(claims.subscribe(), tx.clone(), Update::Claim));
    let volumes = tokio::spawn(forward(volumes.subscribe(), tx.clone(), Update::Volume));
    let classes = tokio::spawn(forward(classes.subscribe(), tx.clone(), Update::Class));
    let budgets = Informer::<PodDisruptionBudget>::start(
        Api::all(client.clone()),
        watcher::Config::default(),
    );
    let budgets = tokio::spawn(forward(budgets.subscribe(), tx.clone(), Update::Budget));
    let pods = tokio::spawn(forward(pods.subscribe(), tx, |c| match c {
        Change::Relisting => Update::PodsRelisting,
        Change::Applied(p) => Update::Pod(Arc::new(PodInfo::new(Arc::unwrap_or_clone(p)))),
        Change::Deleted(p) => Update::PodDeleted(Arc::new(PodInfo::new(Arc::unwrap_or_clone(p)))),
        Change::Listed => Update::PodsListed,
    }));
    (rx, vec![nodes, pods, claims, volumes, classes, budgets])
}

async fn forward<K: Object>(
    mut changes: Subscription<K>,
    tx: mpsc::Sender<Update>,
    convert: impl Fn(Change<K>) -> Update,
) {
    while let Some(c) = changes.recv().await {
        if tx.send(convert(c)).await.is_err() {
            return;
        }
    }
}
