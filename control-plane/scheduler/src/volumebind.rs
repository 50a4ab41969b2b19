//! The volume writes made before a pod is bound (upstream VolumeBinding's
//! PreBind): each chosen static PV gets its claimRef, each claim to
//! provision gets `volume.kubernetes.io/selected-node`. Both are merge
//! patches carrying the resourceVersion the decision was made on, so a
//! volume or claim changed meanwhile (say, bound to someone else) is not
//! overwritten: the write fails with a conflict and the pod is tried
//! again.
//!
//! Unlike upstream, nothing here waits for the PV controller to complete
//! the binding: the pod is bound at once, and the node's agent waits
//! (FailedMount) until its claims are Bound.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, Patch, PatchParams};
use kube_util::storage::{BOUND_BY_CONTROLLER_ANNOTATION, SELECTED_NODE_ANNOTATION};
use serde_json::json;

use crate::volumes::Plan;

/// A failed volume write.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Setting a PV's claimRef was refused or did not arrive.
    #[error("binding volume {volume} to claim {namespace}/{claim}: {source}")]
    Volume {
        volume: String,
        namespace: String,
        claim: String,
        #[source]
        source: kube::Error,
    },
    /// Annotating a claim with the selected node was refused or did not
    /// arrive.
    #[error("selecting node {node} for claim {namespace}/{claim}: {source}")]
    Claim {
        node: String,
        namespace: String,
        claim: String,
        #[source]
        source: kube::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Make the writes of `plan` (after `Volumes::assume`): PVs first, then
/// claims, as upstream's `BindPodVolumes`.
///
/// # Errors
///
/// The first write that fails; the ones before it stay made (the PV
/// controller binds, or a later attempt finds them done).
pub async fn write(client: &kube::Client, plan: &Plan) -> Result<()> {
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    for (pvc, pv) in &plan.bindings {
        let name = pv.metadata.name.as_deref().unwrap_or_default();
        let claim_ref = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
        let mut patch = json!({
            "metadata": {"resourceVersion": pv.metadata.resource_version},
            "spec": {"claimRef": claim_ref},
        });
        if let Some(v) = pv
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(BOUND_BY_CONTROLLER_ANNOTATION))
        {
            patch["metadata"]["annotations"] = json!({ BOUND_BY_CONTROLLER_ANNOTATION: v });
        }
        volumes
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|source| Error::Volume {
                volume: name.to_string(),
                namespace: pvc.metadata.namespace.clone().unwrap_or_default(),
                claim: pvc.metadata.name.clone().unwrap_or_default(),
                source,
            })?;
    }
    for pvc in &plan.provisions {
        let namespace = pvc.metadata.namespace.as_deref().unwrap_or_default();
        let name = pvc.metadata.name.as_deref().unwrap_or_default();
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
        let patch = json!({
            "metadata": {
                "resourceVersion": pvc.metadata.resource_version,
                "annotations": {SELECTED_NODE_ANNOTATION: plan.node},
            }
        });
        claims
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|source| Error::Claim {
                node: plan.node.clone(),
                namespace: namespace.to_string(),
                claim: name.to_string(),
                source,
            })?;
    }
    Ok(())
}
