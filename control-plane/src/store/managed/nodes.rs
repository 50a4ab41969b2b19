//! Servers' Nodes and their etcd members (k3s's etcd member handling):
//! a server whose machine also runs an agent under the same name marks
//! that Node as a control-plane and etcd node and holds it with a
//! finalizer; when the Node is deleted (`kubectl delete node`), a server
//! removes its etcd member, then lets the Node go. So a cluster shrinks
//! the way it is shrunk for workers.
//!
//! Every server runs this. Removing a member twice or dropping the
//! finalizer twice is harmless (a missing member is taken as removed,
//! a stale write conflicts and is read again).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use kube_util::informer::{Change, Informer};
use serde_json::json;
use tokio::sync::watch;

use super::Etcd;
use crate::store::etcd_members::{self, Removal};

/// Held on a server's Node until its member is removed.
pub const FINALIZER: &str = "etcd.skiff.dev/member";
/// The member a Node stands for.
pub const MEMBER_ANNOTATION: &str = "etcd.skiff.dev/member-name";
/// Upstream's role labels (kubectl's ROLES column), as k3s sets them.
pub const ROLE_LABELS: [&str; 2] = [
    "node-role.kubernetes.io/control-plane",
    "node-role.kubernetes.io/etcd",
];

/// Why a Node could not be handled (it is tried again).
#[derive(Debug, thiserror::Error)]
enum Error {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error(transparent)]
    Etcd(#[from] crate::store::Error),
}

/// How often every Node is looked at again, for work that failed.
const RESYNC: Duration = Duration::from_secs(10);

/// Mark this server's Node (`own`) and remove the members of deleted
/// ones, until `stop`.
pub async fn run(client: kube::Client, own: String, etcd: Etcd, mut stop: watch::Receiver<bool>) {
    let api: Api<Node> = Api::all(client);
    let informer = Informer::start(api.clone(), watcher::Config::default());
    let mut changes = informer.subscribe();
    let mut resync = tokio::time::interval(RESYNC);
    loop {
        let nodes = tokio::select! {
            _ = crate::leader::stopped(&mut stop) => return,
            change = changes.recv() => match change {
                Some(Change::Applied(node)) => vec![node],
                Some(_) => continue,
                None => return,
            },
            _ = resync.tick() => informer.list(),
        };
        for node in nodes {
            if let Err(e) = handle(&api, &own, &etcd, &node).await {
                tracing::warn!(node = %node.name_any(), "control-plane node: {e}");
            }
        }
    }
}

async fn handle(api: &Api<Node>, own: &str, etcd: &Etcd, node: &Node) -> Result<(), Error> {
    let held = node.finalizers().iter().any(|f| f == FINALIZER);
    if node.metadata.deletion_timestamp.is_some() {
        if held {
            remove_member(etcd, node).await?;
            release(api, node).await?;
        }
        return Ok(());
    }
    if node.name_any() == own && !marked(node, own) {
        mark(api, node, own).await?;
        tracing::info!(
            node = own,
            "this server's Node marked as control plane and etcd"
        );
    }
    Ok(())
}

fn marked(node: &Node, own: &str) -> bool {
    node.finalizers().iter().any(|f| f == FINALIZER)
        && node
            .annotations()
            .get(MEMBER_ANNOTATION)
            .map(String::as_str)
            == Some(own)
        && ROLE_LABELS
            .iter()
            .all(|l| node.labels().get(*l).map(String::as_str) == Some("true"))
}

/// The patch carries the resourceVersion read, so a finalizer list
/// someone changed meanwhile is not overwritten.
async fn mark(api: &Api<Node>, node: &Node, own: &str) -> Result<(), Error> {
    let mut finalizers = node.finalizers().to_vec();
    if !finalizers.iter().any(|f| f == FINALIZER) {
        finalizers.push(FINALIZER.into());
    }
    let labels: BTreeMap<&str, &str> = ROLE_LABELS.iter().map(|l| (*l, "true")).collect();
    let patch = json!({"metadata": {
        "resourceVersion": node.resource_version(),
        "labels": labels,
        "annotations": {MEMBER_ANNOTATION: own},
        "finalizers": finalizers,
    }});
    api.patch(
        &node.name_any(),
        &PatchParams::default(),
        &Patch::Merge(patch),
    )
    .await?;
    Ok(())
}

async fn remove_member(etcd: &Etcd, node: &Node) -> Result<(), Error> {
    let name = node
        .annotations()
        .get(MEMBER_ANNOTATION)
        .cloned()
        .unwrap_or_else(|| node.name_any());
    match etcd_members::try_remove(&etcd.endpoints, Some(&etcd.tls), &name).await? {
        Removal::Removed(_) => {
            tracing::info!(member = %name, "etcd member removed: its Node was deleted");
        }
        Removal::LastMember => {
            tracing::warn!(member = %name, "the Node of the cluster's only etcd member is deleted; the member stays");
        }
        // Removed already (by another server, or by hand).
        Removal::NoSuchMember(_) => {}
    }
    Ok(())
}

async fn release(api: &Api<Node>, node: &Node) -> Result<(), Error> {
    let finalizers: Vec<&String> = node
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .collect();
    let patch = json!({"metadata": {
        "resourceVersion": node.resource_version(),
        "finalizers": finalizers,
    }});
    match api
        .patch(
            &node.name_any(),
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await
    {
        // Gone already, or changed since: the next look decides.
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        other => other.map(|_| ()).map_err(Error::from),
    }
}
