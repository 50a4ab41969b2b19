//! The built-in local-path provisioner's decisions: which node a claim's
//! volume goes to, under which root directory, and the PV that describes
//! it (the shape every component relies on: see `kube_util::storage`).
//! The directory itself is made by that node's agent on first mount.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    LocalVolumeSource, Node, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeSpec,
    VolumeNodeAffinity,
};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::ObjectMeta;
use kube::ResourceExt;
use kube_util::storage::{
    self, HOSTNAME_LABEL, LOCAL_PATH_CLEANUP_FINALIZER, LOCAL_PATH_NODE_LABEL,
    LOCAL_PATH_PROVISIONER, LOCAL_PATH_ROOT_ANNOTATION, PROVISIONED_BY_ANNOTATION,
    PV_PROTECTION_FINALIZER, ROOT_PARAMETER, SELECTED_NODE_ANNOTATION,
};

/// The name of the volume provisioned for a claim: one per claim uid, so
/// a create repeated after a lost answer finds the first one.
pub fn volume_name(pvc: &PersistentVolumeClaim) -> Option<String> {
    pvc.metadata
        .uid
        .as_deref()
        .filter(|u| !u.is_empty())
        .map(|u| format!("pvc-{u}"))
}

/// Whether a node takes new volumes: Ready and not cordoned.
pub fn node_usable(node: &Node) -> bool {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let cordoned = node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
    ready && !cordoned
}

/// Why a claim's volume has no node yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoNode {
    /// `volume.kubernetes.io/selected-node` names a node that does not exist.
    Missing(String),
    /// An Immediate claim, and no Ready schedulable node.
    NoneReady,
}

/// The node a claim's local-path volume goes to: the one the scheduler
/// selected for it, else (Immediate binding) the first usable node by
/// name, so repeated passes pick the same one.
pub fn pick_node(pvc: &PersistentVolumeClaim, nodes: &[Arc<Node>]) -> Result<Arc<Node>, NoNode> {
    if let Some(sel) = storage::annotation(&pvc.metadata.annotations, SELECTED_NODE_ANNOTATION) {
        return nodes
            .iter()
            .find(|n| n.name_any() == sel)
            .cloned()
            .ok_or_else(|| NoNode::Missing(sel.to_string()));
    }
    let mut usable: Vec<&Arc<Node>> = nodes.iter().filter(|n| node_usable(n)).collect();
    usable.sort_by_key(|n| n.name_any());
    usable
        .first()
        .map(|n| Arc::clone(n))
        .ok_or(NoNode::NoneReady)
}

/// The directory a class's volumes on `node` live under: the class's
/// `root` parameter, else the root the node's agent announced.
///
/// # Errors
/// The upstream-style event message when there is none, or it is not
/// absolute (a relative root would depend on the agent's working
/// directory).
pub fn volume_root(class: &StorageClass, node: &Node) -> Result<String, String> {
    let from_class = class
        .parameters
        .as_ref()
        .and_then(|p| p.get(ROOT_PARAMETER))
        .filter(|r| !r.is_empty());
    let root = match from_class {
        Some(r) => r.clone(),
        None => storage::annotation(&node.metadata.annotations, LOCAL_PATH_ROOT_ANNOTATION)
            .filter(|r| !r.is_empty())
            .ok_or_else(|| {
                format!(
                    "node {} has no {LOCAL_PATH_ROOT_ANNOTATION} annotation (is its agent running?)",
                    node.name_any()
                )
            })?
            .to_string(),
    };
    if !root.starts_with('/') {
        return Err(format!(
            "local-path root {root:?} for node {} is not an absolute path",
            node.name_any()
        ));
    }
    Ok(root)
}

/// The PV the local-path provisioner makes for `pvc` on `node` under
/// `root`, pre-bound to the claim; `None` when the claim has no uid yet.
pub fn provisioned_volume(
    pvc: &PersistentVolumeClaim,
    class: &StorageClass,
    node: &Node,
    root: &str,
) -> Option<PersistentVolume> {
    let name = volume_name(pvc)?;
    let namespace = pvc.namespace().unwrap_or_default();
    let claim = pvc.name_any();
    let node_name = node.name_any();
    // The agent matches the term against its node's labels: use the
    // hostname label the node really carries.
    let hostname = node
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(HOSTNAME_LABEL))
        .cloned()
        .unwrap_or_else(|| node_name.clone());
    let spec = pvc.spec.clone().unwrap_or_default();
    let capacity = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .cloned()?;
    let dir = storage::local_path_dir_name(&name, &namespace, &claim);
    let root = root.trim_end_matches('/');
    Some(PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name),
            labels: Some(BTreeMap::from([(LOCAL_PATH_NODE_LABEL.into(), node_name)])),
            annotations: Some(BTreeMap::from([
                (
                    PROVISIONED_BY_ANNOTATION.into(),
                    LOCAL_PATH_PROVISIONER.into(),
                ),
                (LOCAL_PATH_ROOT_ANNOTATION.into(), root.to_string()),
            ])),
            finalizers: Some(vec![
                PV_PROTECTION_FINALIZER.into(),
                LOCAL_PATH_CLEANUP_FINALIZER.into(),
            ]),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            capacity: Some(BTreeMap::from([("storage".into(), capacity)])),
            access_modes: spec.access_modes.clone(),
            persistent_volume_reclaim_policy: Some(
                class
                    .reclaim_policy
                    .clone()
                    .unwrap_or_else(|| "Delete".into()),
            ),
            storage_class_name: class.metadata.name.clone(),
            volume_mode: Some("Filesystem".into()),
            local: Some(LocalVolumeSource {
                path: format!("{root}/{dir}"),
                fs_type: None,
            }),
            node_affinity: Some(VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![NodeSelectorRequirement {
                            key: HOSTNAME_LABEL.into(),
                            operator: "In".into(),
                            values: Some(vec![hostname]),
                        }]),
                        match_fields: None,
                    }],
                }),
            }),
            claim_ref: Some(ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("PersistentVolumeClaim".into()),
                namespace: Some(namespace),
                name: Some(claim),
                uid: pvc.metadata.uid.clone(),
                ..ObjectReference::default()
            }),
            ..PersistentVolumeSpec::default()
        }),
        status: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(annotations: serde_json::Value) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "app", "uid": "u-1", "annotations": annotations},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local-path",
                     "resources": {"requests": {"storage": "1Gi"}}},
        }))
        .unwrap()
    }

    fn class(params: serde_json::Value, reclaim: Option<&str>) -> StorageClass {
        serde_json::from_value(json!({
            "metadata": {"name": "local-path"},
            "provisioner": LOCAL_PATH_PROVISIONER,
            "parameters": params,
            "reclaimPolicy": reclaim,
        }))
        .unwrap()
    }

    fn node(name: &str, ready: bool, annotations: serde_json::Value) -> Arc<Node> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "annotations": annotations,
                             "labels": {HOSTNAME_LABEL: format!("host-{name}")}},
                "status": {"conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]},
            }))
            .unwrap(),
        )
    }

    #[test]
    fn the_selected_node_wins_else_the_first_ready_one_by_name() {
        let nodes = vec![
            node("c", true, json!({})),
            node("a", false, json!({})),
            node("b", true, json!({})),
        ];
        assert_eq!(
            pick_node(&claim(json!({})), &nodes).unwrap().name_any(),
            "b"
        );
        let sel = claim(json!({SELECTED_NODE_ANNOTATION: "a"}));
        assert_eq!(pick_node(&sel, &nodes).unwrap().name_any(), "a");
        let gone = claim(json!({SELECTED_NODE_ANNOTATION: "z"}));
        assert_eq!(pick_node(&gone, &nodes), Err(NoNode::Missing("z".into())));
        assert_eq!(
            pick_node(&claim(json!({})), &[node("a", false, json!({}))]),
            Err(NoNode::NoneReady)
        );
    }

    #[test]
    fn the_class_root_overrides_the_node_root() {
        let n = node(
            "n1",
            true,
            json!({LOCAL_PATH_ROOT_ANNOTATION: "/var/lib/skiff/lp"}),
        );
        assert_eq!(
            volume_root(&class(json!({}), None), &n).unwrap(),
            "/var/lib/skiff/lp"
        );
        assert_eq!(
            volume_root(&class(json!({"root": "/data"}), None), &n).unwrap(),
            "/data"
        );
        let bare = node("n2", true, json!({}));
        assert_eq!(
            volume_root(&class(json!({}), None), &bare).unwrap_err(),
            "node n2 has no skiff.io/local-path-root annotation (is its agent running?)"
        );
        assert!(volume_root(&class(json!({"root": "rel"}), None), &n).is_err());
    }

    #[test]
    fn provisioned_volumes_follow_the_contract() {
        let pvc = claim(json!({}));
        let n = node("n1", true, json!({}));
        let pv = provisioned_volume(&pvc, &class(json!({}), Some("Retain")), &n, "/lp/").unwrap();
        assert_eq!(pv.metadata.name.as_deref(), Some("pvc-u-1"));
        assert_eq!(pv.labels()[LOCAL_PATH_NODE_LABEL], "n1");
        assert_eq!(
            pv.annotations()[PROVISIONED_BY_ANNOTATION],
            LOCAL_PATH_PROVISIONER
        );
        assert_eq!(pv.annotations()[LOCAL_PATH_ROOT_ANNOTATION], "/lp");
        assert_eq!(
            pv.finalizers(),
            &[
                PV_PROTECTION_FINALIZER.to_string(),
                LOCAL_PATH_CLEANUP_FINALIZER.to_string()
            ]
        );
        let spec = pv.spec.as_ref().unwrap();
        assert_eq!(spec.capacity.as_ref().unwrap()["storage"].0, "1Gi");
        assert_eq!(
            spec.access_modes.as_deref(),
            Some(&["ReadWriteOnce".to_string()][..])
        );
        assert_eq!(
            spec.persistent_volume_reclaim_policy.as_deref(),
            Some("Retain")
        );
        assert_eq!(spec.storage_class_name.as_deref(), Some("local-path"));
        assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
        assert_eq!(
            spec.local.as_ref().unwrap().path,
            format!(
                "/lp/{}",
                storage::local_path_dir_name("pvc-u-1", "app", "data")
            )
        );
        let term = &spec
            .node_affinity
            .as_ref()
            .unwrap()
            .required
            .as_ref()
            .unwrap()
            .node_selector_terms[0];
        let req = &term.match_expressions.as_ref().unwrap()[0];
        assert_eq!(
            (req.key.as_str(), req.operator.as_str()),
            (HOSTNAME_LABEL, "In")
        );
        assert_eq!(req.values.as_deref(), Some(&["host-n1".to_string()][..]));
        let r = spec.claim_ref.as_ref().unwrap();
        assert_eq!(
            (
                r.kind.as_deref(),
                r.namespace.as_deref(),
                r.name.as_deref(),
                r.uid.as_deref()
            ),
            (
                Some("PersistentVolumeClaim"),
                Some("app"),
                Some("data"),
                Some("u-1")
            )
        );
        assert!(storage::is_local_path(&pv));
        assert!(storage::volume_matches_claim(&pv, &pvc));
        // Reclaim policy defaults to Delete, as a class's does.
        let pv = provisioned_volume(&pvc, &class(json!({}), None), &n, "/lp").unwrap();
        assert_eq!(
            pv.spec.unwrap().persistent_volume_reclaim_policy.as_deref(),
            Some("Delete")
        );
    }
}
