//! The expander ("persistentvolume-expander", upstream's
//! `expand.expandController` plus the kubelet's filesystem step): a bound
//! claim asking for more than it has gets it. A local-path volume is a
//! directory with no size of its own, so growing it is only writing the
//! new size down, on the volume and then on the claim. Volumes of other
//! provisioners are theirs to expand.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use kube_util::events::{Recorder, Reporter};
use kube_util::{quantity, storage};
use serde_json::json;

use super::{log_write, next_pass, ready, resync, trigger};
use crate::{Ctx, Error};

/// Conditions that say a resize is under way; gone once it is done.
const RESIZE_CONDITIONS: &[&str] = &["Resizing", "FileSystemResizePending"];

/// What a claim needs.
#[derive(Debug, Clone, PartialEq)]
pub enum Expansion {
    None,
    /// Grow the local-path volume `volume` (and then the claim) to `size`.
    Grow {
        volume: String,
        size: Quantity,
    },
    /// Not ours to grow: wait for the external resizer.
    External,
}

/// A quantity in bytes (0 when malformed).
fn quantity_bytes(q: &Quantity) -> i128 {
    quantity::scaled(&q.0, 0).unwrap_or(0)
}

/// `status.capacity.storage` of a claim, in bytes (0 when unknown).
fn claim_capacity(pvc: &PersistentVolumeClaim) -> i128 {
    pvc.status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .map(quantity_bytes)
        .unwrap_or(0)
}

/// Whether claim `pvc`, bound to `pv`, asks for more than it has.
pub fn decide(pvc: &PersistentVolumeClaim, pv: Option<&PersistentVolume>) -> Expansion {
    let Some(volume) = storage::claim_bound(pvc) else {
        return Expansion::None;
    };
    let Some(pv) = pv.filter(|pv| pv.name_any() == volume) else {
        return Expansion::None;
    };
    let Some(size) = pvc
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .cloned()
    else {
        return Expansion::None;
    };
    let request = storage::claim_request(pvc);
    // Before the first status is written the binder owns capacity.
    if claim_capacity(pvc) == 0 || request <= claim_capacity(pvc) {
        return Expansion::None;
    }
    if storage::is_local_path(pv) {
        Expansion::Grow {
            volume: volume.to_string(),
            size,
        }
    } else {
        Expansion::External
    }
}

pub async fn run(ctx: Ctx) -> Result<(), Error> {
    let pvs = ctx.informers.get::<PersistentVolume>();
    let pvcs = ctx.informers.get::<PersistentVolumeClaim>();
    let mut triggers = futures::stream::select_all([trigger(&pvs), trigger(&pvcs)]);
    ready(&pvs).await?;
    ready(&pvcs).await?;
    let events = Recorder::new(ctx.client.clone(), Reporter::new("volume_expand"));
    let mut tick = resync();
    while next_pass(&mut triggers, &mut tick).await {
        for pvc in pvcs.list() {
            let pv = storage::claim_bound(&pvc).and_then(|v| pvs.get(None, v));
            match decide(&pvc, pv.as_deref()) {
                Expansion::None => {}
                // Upstream warns here when no in-tree plugin matches the
                // volume, which is always the case for a non-local-path one.
                Expansion::External => events.warning(
                    &*pvc,
                    "ExternalExpanding",
                    "waiting for an external controller to expand this PVC".into(),
                ),
                Expansion::Grow { volume, size } => {
                    if let Some(pv) = pv {
                        if let Err(e) = grow(&ctx.client, &events, &pv, &pvc, &volume, &size).await
                        {
                            log_write("expanding claim", &pvc.name_any(), &e);
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

async fn grow(
    client: &kube::Client,
    events: &Recorder,
    pv: &PersistentVolume,
    pvc: &PersistentVolumeClaim,
    volume: &str,
    size: &Quantity,
) -> Result<(), kube::Error> {
    if storage::volume_capacity(pv) < quantity_bytes(size) {
        let patch = json!({
            "metadata": {"resourceVersion": pv.resource_version()},
            "spec": {"capacity": {"storage": size}},
        });
        let pvs: Api<PersistentVolume> = Api::all(client.clone());
        pvs.patch(volume, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        events.normal(
            pvc,
            "VolumeResizeSuccessful",
            format!("ExpandVolume succeeded for volume {volume}"),
        );
    }
    // A directory has no filesystem of its own to grow: the node step is
    // done as soon as the volume is, so the claim is finished at once.
    let conditions: Vec<_> = pvc
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|c| !RESIZE_CONDITIONS.contains(&c.type_.as_str()))
        .collect();
    let claims: Api<PersistentVolumeClaim> =
        Api::namespaced(client.clone(), &pvc.namespace().unwrap_or_default());
    let status = json!({"capacity": {"storage": size}, "conditions": conditions});
    super::patch_status_at(&claims, pvc, status).await?;
    events.normal(
        pvc,
        "FileSystemResizeSuccessful",
        format!("MountVolume.NodeExpandVolume succeeded for volume {volume}"),
    );
    tracing::info!(claim = %pvc.name_any(), volume, size = %size.0, "expanded local-path volume");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(request: &str, capacity: Option<&str>) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "app", "uid": "u"},
            "spec": {"volumeName": "pv1", "resources": {"requests": {"storage": request}}},
            "status": {"phase": "Bound", "capacity": capacity.map(|c| json!({"storage": c}))},
        }))
        .unwrap()
    }

    fn volume(local: bool) -> PersistentVolume {
        let ann = if local {
            json!({"pv.kubernetes.io/provisioned-by": "skiff.io/local-path"})
        } else {
            json!({})
        };
        serde_json::from_value(json!({
            "metadata": {"name": "pv1", "annotations": ann},
            "spec": {"capacity": {"storage": "1Gi"}},
        }))
        .unwrap()
    }

    #[test]
    fn local_path_claims_asking_for_more_grow() {
        let got = decide(&claim("2Gi", Some("1Gi")), Some(&volume(true)));
        assert_eq!(
            got,
            Expansion::Grow {
                volume: "pv1".into(),
                size: Quantity("2Gi".into())
            }
        );
        assert_eq!(
            decide(&claim("2Gi", Some("1Gi")), Some(&volume(false))),
            Expansion::External
        );
    }

    #[test]
    fn satisfied_unbound_or_fresh_claims_are_left_alone() {
        assert_eq!(
            decide(&claim("1Gi", Some("1Gi")), Some(&volume(true))),
            Expansion::None
        );
        assert_eq!(
            decide(&claim("1024Mi", Some("1Gi")), Some(&volume(true))),
            Expansion::None
        );
        assert_eq!(
            decide(&claim("2Gi", None), Some(&volume(true))),
            Expansion::None
        );
        assert_eq!(decide(&claim("2Gi", Some("1Gi")), None), Expansion::None);
        let mut pending = claim("2Gi", Some("1Gi"));
        pending.status.as_mut().unwrap().phase = Some("Pending".into());
        assert_eq!(decide(&pending, Some(&volume(true))), Expansion::None);
    }
}
