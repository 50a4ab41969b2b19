//! Registration: create this node's Node object, or adopt the one that
//! exists (a restarted agent, or a node an operator pre-created) and bring
//! the labels the agent owns up to date, as the kubelet's
//! `tryRegisterWithAPIServer` does.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;

use super::{call, Error, Facts, Result, API_TIMEOUT};
use crate::config::Config;

/// The labels the agent sets and keeps: the well-known ones the kubelet
/// sets (with their beta twins, which some workloads still select on) and
/// the operator's `--node-labels`.
pub fn owned_labels(config: &Config, facts: &Facts) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        ("kubernetes.io/hostname".into(), config.node_name.clone()),
        ("kubernetes.io/os".into(), "linux".into()),
        ("kubernetes.io/arch".into(), facts.architecture.clone()),
        ("beta.kubernetes.io/os".into(), "linux".into()),
        ("beta.kubernetes.io/arch".into(), facts.architecture.clone()),
    ]);
    labels.extend(config.node_labels.clone());
    labels
}

/// The annotations the agent sets and keeps: where its local-path volumes
/// live, for the PV controller that provisions them.
pub fn owned_annotations(config: &Config) -> BTreeMap<String, String> {
    BTreeMap::from([(
        kube_util::storage::LOCAL_PATH_ROOT_ANNOTATION.into(),
        config.local_path_root.display().to_string(),
    )])
}

/// The Node as first created: our labels and annotations, `spec.podCIDR` when configured
/// by hand, and the status we would report (the API keeps a node's status
/// on create, so `kubectl get nodes` is right from the start).
pub fn initial_node(config: &Config, facts: &Facts, status: Option<NodeStatus>) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(config.node_name.clone()),
            labels: Some(owned_labels(config, facts)),
            annotations: Some(owned_annotations(config)),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            pod_cidr: config.pod_cidr.clone(),
            pod_cidrs: config.pod_cidr.clone().map(|c| vec![c]),
            ..Default::default()
        }),
        status,
    }
}

/// Create `node`, or adopt the existing one: patch the labels in `labels`
/// and the annotations of `node` that are missing or differ. Returns the
/// Node as stored.
///
/// # Errors
/// The API refused or did not answer; the caller retries with back-off.
pub async fn register(
    api: &Api<Node>,
    node: &Node,
    labels: &BTreeMap<String, String>,
) -> Result<(Node, bool)> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let object = format!("node {name}");
    match call(
        "registering",
        &object,
        API_TIMEOUT,
        api.create(&PostParams::default(), node),
    )
    .await
    {
        Ok(created) => return Ok((created, true)),
        Err(e) if e.code() == Some(409) => {}
        Err(e) => return Err(e),
    }
    let existing = call("reading", &object, API_TIMEOUT, api.get(&name)).await?;
    let have = existing.metadata.labels.clone().unwrap_or_default();
    let stale: BTreeMap<&String, &String> = labels
        .iter()
        .filter(|(k, v)| have.get(*k) != Some(*v))
        .collect();
    let have = existing.metadata.annotations.clone().unwrap_or_default();
    let stale_annotations: BTreeMap<&String, &String> = node
        .metadata
        .annotations
        .iter()
        .flatten()
        .filter(|(k, v)| have.get(*k) != Some(*v))
        .collect();
    if stale.is_empty() && stale_annotations.is_empty() {
        return Ok((existing, false));
    }
    let patch = serde_json::json!({
        "metadata": { "labels": stale, "annotations": stale_annotations }
    });
    let patched = call(
        "updating the labels of",
        &object,
        API_TIMEOUT,
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)),
    )
    .await?;
    Ok((patched, false))
}

/// Whether `e` means the Node is gone (deleted by an operator).
pub fn is_gone(e: &Error) -> bool {
    e.code() == Some(404)
}
