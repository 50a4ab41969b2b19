//! Persistent volumes as every component sees them: the well-known names
//! (annotations, finalizers, the built-in provisioner), which claims a pod
//! uses, which PV can serve which claim, and where a local-path volume
//! lives on its node. The API server, the PV controller, the scheduler and
//! the agent all decide with these, so they never disagree.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node, PersistentVolume, PersistentVolumeClaim, PersistentVolumeSpec, Pod,
};

use crate::{nodeaffinity, quantity, selector};

/// The built-in provisioner of the `local-path` StorageClass.
pub const LOCAL_PATH_PROVISIONER: &str = "skiff.io/local-path";
/// The StorageClass the server creates at first start (k3s's default).
pub const LOCAL_PATH_CLASS: &str = "local-path";
/// On a Node: the absolute directory its agent keeps local-path volumes
/// in (`--local-path-root`).
pub const LOCAL_PATH_ROOT_ANNOTATION: &str = "skiff.io/local-path-root";
/// On a local-path PV: the node whose agent owns its directory (a label,
/// so that agent can watch just its own volumes).
pub const LOCAL_PATH_NODE_LABEL: &str = "skiff.io/local-path-node";
/// On a local-path PV: held until its node's agent has removed the
/// directory (reclaim policy Delete) or left it (Retain).
pub const LOCAL_PATH_CLEANUP_FINALIZER: &str = "skiff.io/local-path-cleanup";
/// A StorageClass parameter: the root directory for this class's volumes,
/// instead of the node's.
pub const ROOT_PARAMETER: &str = "root";

pub const DEFAULT_CLASS_ANNOTATION: &str = "storageclass.kubernetes.io/is-default-class";
pub const BETA_DEFAULT_CLASS_ANNOTATION: &str = "storageclass.beta.kubernetes.io/is-default-class";
pub const SELECTED_NODE_ANNOTATION: &str = "volume.kubernetes.io/selected-node";
pub const STORAGE_PROVISIONER_ANNOTATION: &str = "volume.kubernetes.io/storage-provisioner";
pub const BETA_STORAGE_PROVISIONER_ANNOTATION: &str =
    "volume.beta.kubernetes.io/storage-provisioner";
pub const PROVISIONED_BY_ANNOTATION: &str = "pv.kubernetes.io/provisioned-by";
pub const BIND_COMPLETED_ANNOTATION: &str = "pv.kubernetes.io/bind-completed";
pub const BOUND_BY_CONTROLLER_ANNOTATION: &str = "pv.kubernetes.io/bound-by-controller";
pub const PVC_PROTECTION_FINALIZER: &str = "kubernetes.io/pvc-protection";
pub const PV_PROTECTION_FINALIZER: &str = "kubernetes.io/pv-protection";
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// One claim a pod's volume uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodClaim {
    /// The pod's volume name.
    pub volume: String,
    /// The claim's name (in the pod's namespace).
    pub claim: String,
    /// From `ephemeral.volumeClaimTemplate`: the claim is the pod's own,
    /// created for it (and owned by it) by the ephemeral volume controller.
    pub ephemeral: bool,
    /// `persistentVolumeClaim.readOnly`.
    pub read_only: bool,
}

/// The claims of a pod's volumes, in volume order.
pub fn pod_claims(pod: &Pod) -> Vec<PodClaim> {
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| {
            if let Some(c) = &v.persistent_volume_claim {
                Some(PodClaim {
                    volume: v.name.clone(),
                    claim: c.claim_name.clone(),
                    ephemeral: false,
                    read_only: c.read_only.unwrap_or(false),
                })
            } else {
                v.ephemeral.as_ref().map(|_| PodClaim {
                    volume: v.name.clone(),
                    claim: ephemeral_claim_name(pod_name, &v.name),
                    ephemeral: true,
                    read_only: false,
                })
            }
        })
        .collect()
}

/// The claim of a pod's generic ephemeral volume (upstream's
/// `ephemeral.VolumeClaimName`).
pub fn ephemeral_claim_name(pod: &str, volume: &str) -> String {
    format!("{pod}-{volume}")
}

/// Why an ephemeral volume's claim cannot be used by `pod`: upstream's
/// `ephemeral.VolumeIsForPod` message; None when the pod owns it.
pub fn ephemeral_claim_not_for_pod(pod: &Pod, pvc: &PersistentVolumeClaim) -> Option<String> {
    let uid = pod.metadata.uid.as_deref()?;
    let owned = pvc
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.uid == uid && o.controller == Some(true));
    (!owned).then(|| {
        format!(
            "PVC {}/{} was not created for pod {}/{} (pod is not owner)",
            pvc.metadata.namespace.as_deref().unwrap_or_default(),
            pvc.metadata.name.as_deref().unwrap_or_default(),
            pod.metadata.namespace.as_deref().unwrap_or_default(),
            pod.metadata.name.as_deref().unwrap_or_default(),
        )
    })
}

/// Whether a pod is done with its volumes (Succeeded or Failed).
pub fn pod_terminated(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .is_some_and(crate::podstatus::is_terminal)
}

/// Whether a live (not terminated) pod uses claim `name` of `namespace`.
pub fn pod_uses_claim(pod: &Pod, namespace: &str, name: &str) -> bool {
    pod.metadata.namespace.as_deref() == Some(namespace)
        && !pod_terminated(pod)
        && pod_claims(pod).iter().any(|c| c.claim == name)
}

/// The class a claim asks for: `spec.storageClassName`, or the beta
/// annotation older manifests use. `Some("")` asks for no class.
pub fn claim_class(pvc: &PersistentVolumeClaim) -> Option<&str> {
    pvc.spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .or_else(|| {
            pvc.metadata
                .annotations
                .as_ref()?
                .get("volume.beta.kubernetes.io/storage-class")
                .map(String::as_str)
        })
}

/// A PV's class (empty: none).
pub fn volume_class(pv: &PersistentVolume) -> &str {
    pv.spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .unwrap_or_default()
}

/// Whether a claim is bound (phase Bound with a volume name).
pub fn claim_bound(pvc: &PersistentVolumeClaim) -> Option<&str> {
    let bound = pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    pvc.spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .filter(|n| bound && !n.is_empty())
}

/// A claim's `requests.storage` in bytes (0 when absent or malformed).
pub fn claim_request(pvc: &PersistentVolumeClaim) -> i128 {
    pvc.spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .and_then(|q| quantity::scaled(&q.0, 0).ok())
        .unwrap_or(0)
}

/// A PV's `capacity.storage` in bytes (0 when absent or malformed).
pub fn volume_capacity(pv: &PersistentVolume) -> i128 {
    pv.spec
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .and_then(|q| quantity::scaled(&q.0, 0).ok())
        .unwrap_or(0)
}

/// Whether PV `pv` can serve claim `pvc` (upstream's `FindMatchingVolume`
/// checks, minus node affinity): same class, enough capacity, every
/// access mode asked for, same volume mode, the claim's selector, and not
/// bound or pre-bound to another claim. A PV pre-bound to this claim (by
/// name and namespace, and uid when set) matches regardless of the
/// selector, as upstream.
pub fn volume_matches_claim(pv: &PersistentVolume, pvc: &PersistentVolumeClaim) -> bool {
    let (Some(ps), Some(cs)) = (pv.spec.as_ref(), pvc.spec.as_ref()) else {
        return false;
    };
    if pv.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let prebound = ps.claim_ref.is_some();
    if prebound && !claim_ref_names(pv, pvc) {
        return false;
    }
    let phase = pv.status.as_ref().and_then(|s| s.phase.as_deref());
    if !prebound && !matches!(phase, None | Some("Available" | "Pending")) {
        return false;
    }
    if claim_class(pvc).unwrap_or_default() != volume_class(pv) {
        return false;
    }
    if volume_capacity(pv) < claim_request(pvc) {
        return false;
    }
    let modes = ps.access_modes.as_deref().unwrap_or_default();
    if !cs.access_modes.iter().flatten().all(|m| modes.contains(m)) {
        return false;
    }
    let mode = |m: Option<&String>| m.map_or("Filesystem", |s| s.as_str()).to_string();
    if mode(ps.volume_mode.as_ref()) != mode(cs.volume_mode.as_ref()) {
        return false;
    }
    if !prebound {
        if let Some(sel) = &cs.selector {
            if !selector::matches(sel, pv.metadata.labels.as_ref()) {
                return false;
            }
        }
    }
    true
}

/// Whether `pv`'s claimRef names `pvc`: same name and namespace, and the
/// same uid once the ref has one (an empty uid pre-binds by name, as
/// upstream).
pub fn claim_ref_names(pv: &PersistentVolume, pvc: &PersistentVolumeClaim) -> bool {
    let Some(r) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return false;
    };
    r.name.as_deref() == pvc.metadata.name.as_deref()
        && r.namespace.as_deref() == pvc.metadata.namespace.as_deref()
        && r.uid
            .as_deref()
            .filter(|u| !u.is_empty())
            .is_none_or(|u| Some(u) == pvc.metadata.uid.as_deref())
}

/// Whether a PV's `nodeAffinity` allows `node` (no affinity: every node).
pub fn volume_allows_node(spec: &PersistentVolumeSpec, node: &Node) -> bool {
    let Some(req) = spec
        .node_affinity
        .as_ref()
        .and_then(|a| a.required.as_ref())
    else {
        return true;
    };
    nodeaffinity::selector_matches(
        req,
        node.metadata.labels.as_ref(),
        node.metadata.name.as_deref().unwrap_or_default(),
    )
}

/// The directory name of a local-path volume under its root:
/// `<pv>_<namespace>_<claim>`, cut to 255 bytes (a filename's limit).
/// Made only of the PV name and the claim's namespace and name, which
/// the API validates as DNS names: no `/`, never `.` or `..`.
pub fn local_path_dir_name(pv: &str, namespace: &str, claim: &str) -> String {
    let mut name = format!("{pv}_{namespace}_{claim}");
    if name.len() > 255 {
        let mut end = 255;
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        name.truncate(end);
    }
    name
}

/// Whether `dir_name` is safe as one directory under a root: a single
/// normal path component.
pub fn safe_dir_name(dir_name: &str) -> bool {
    !dir_name.is_empty()
        && dir_name.len() <= 255
        && dir_name != "."
        && dir_name != ".."
        && !dir_name.contains('/')
        && !dir_name.contains('\0')
}

/// Whether a PV was made by the built-in local-path provisioner.
pub fn is_local_path(pv: &PersistentVolume) -> bool {
    annotation(&pv.metadata.annotations, PROVISIONED_BY_ANNOTATION) == Some(LOCAL_PATH_PROVISIONER)
}

/// An annotation's value.
pub fn annotation<'a>(
    annotations: &'a Option<BTreeMap<String, String>>,
    key: &str,
) -> Option<&'a str> {
    annotations.as_ref()?.get(key).map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pv(v: serde_json::Value) -> PersistentVolume {
        serde_json::from_value(v).unwrap()
    }
    fn pvc(v: serde_json::Value) -> PersistentVolumeClaim {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn pod_claims_include_ephemeral_ones_by_derived_name() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns"},
            "spec": {"containers": [], "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "d", "readOnly": true}},
                {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
                {"name": "e", "emptyDir": {}},
            ]}
        }))
        .unwrap();
        let c = pod_claims(&pod);
        assert_eq!(c.len(), 2);
        assert_eq!((c[0].claim.as_str(), c[0].read_only), ("d", true));
        assert_eq!((c[1].claim.as_str(), c[1].ephemeral), ("web-scratch", true));
        assert!(pod_uses_claim(&pod, "ns", "web-scratch"));
        assert!(!pod_uses_claim(&pod, "other", "d"));
    }

    #[test]
    fn matching_checks_class_size_modes_selector_and_prebinding() {
        let claim = pvc(json!({
            "metadata": {"name": "c", "namespace": "ns", "uid": "u1"},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
                     "resources": {"requests": {"storage": "1Gi"}},
                     "selector": {"matchLabels": {"tier": "db"}}}
        }));
        let base = json!({
            "metadata": {"name": "v", "labels": {"tier": "db"}},
            "spec": {"capacity": {"storage": "2Gi"}, "accessModes": ["ReadWriteOnce", "ReadOnlyMany"],
                     "storageClassName": "fast", "hostPath": {"path": "/x"}},
            "status": {"phase": "Available"}
        });
        assert!(volume_matches_claim(&pv(base.clone()), &claim));
        let mut small = base.clone();
        small["spec"]["capacity"]["storage"] = json!("512Mi");
        assert!(!volume_matches_claim(&pv(small), &claim));
        let mut other_class = base.clone();
        other_class["spec"]["storageClassName"] = json!("slow");
        assert!(!volume_matches_claim(&pv(other_class), &claim));
        let mut unlabelled = base.clone();
        unlabelled["metadata"]["labels"] = json!({});
        assert!(!volume_matches_claim(&pv(unlabelled.clone()), &claim));
        unlabelled["spec"]["claimRef"] = json!({"name": "c", "namespace": "ns"});
        assert!(
            volume_matches_claim(&pv(unlabelled), &claim),
            "pre-bound ignores the selector"
        );
        let mut taken = base.clone();
        taken["spec"]["claimRef"] = json!({"name": "c", "namespace": "ns", "uid": "u0"});
        assert!(
            !volume_matches_claim(&pv(taken), &claim),
            "bound to an older claim of the same name"
        );
        let mut bound = base;
        bound["status"]["phase"] = json!("Released");
        assert!(!volume_matches_claim(&pv(bound), &claim));
    }

    #[test]
    fn dir_names_stay_one_component_of_at_most_255_bytes() {
        let long = "a".repeat(253);
        let n = local_path_dir_name("pvc-1234", "ns", &long);
        assert_eq!(n.len(), 255);
        assert!(safe_dir_name(&n));
        assert!(!safe_dir_name(".."));
        assert!(!safe_dir_name("a/b"));
        assert!(!safe_dir_name(""));
    }
}
