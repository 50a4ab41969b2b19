//! The protection finalizers ("pvc-protection", "pv-protection"): a
//! claim in use by a pod, and a volume bound to a claim, are not removed
//! under it. Deleting one only sets its deletionTimestamp; the finalizer
//! goes (and the object with it) once nothing uses it any more. Objects
//! not being deleted get the finalizer, as upstream's controllers add it.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use kube_util::storage::{self, PVC_PROTECTION_FINALIZER, PV_PROTECTION_FINALIZER};

use super::{log_write, next_pass, ready, resync, set_finalizers, trigger};
use super::{with_finalizer, without_finalizer};
use crate::{Ctx, Error};

/// What an object's finalizer list should become, if it changes.
pub type NewFinalizers = Option<Vec<String>>;

/// Whether a live pod of `pods` uses the claim.
fn in_use(pvc: &PersistentVolumeClaim, pods: &[Arc<Pod>]) -> bool {
    let ns = pvc.namespace().unwrap_or_default();
    let name = pvc.name_any();
    pods.iter().any(|p| storage::pod_uses_claim(p, &ns, &name))
}

/// pvc-protection's decision. A pod being deleted still counts: its
/// containers may still write until it is gone.
pub fn claim_finalizers(pvc: &PersistentVolumeClaim, pods: &[Arc<Pod>]) -> NewFinalizers {
    if pvc.metadata.deletion_timestamp.is_none() {
        return with_finalizer(&pvc.metadata, PVC_PROTECTION_FINALIZER);
    }
    if in_use(pvc, pods) {
        return None;
    }
    without_finalizer(&pvc.metadata, PVC_PROTECTION_FINALIZER)
}

/// pv-protection's decision: a volume is in use while Bound.
pub fn volume_finalizers(pv: &PersistentVolume) -> NewFinalizers {
    if pv.metadata.deletion_timestamp.is_none() {
        return with_finalizer(&pv.metadata, PV_PROTECTION_FINALIZER);
    }
    let bound = pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    if bound {
        return None;
    }
    without_finalizer(&pv.metadata, PV_PROTECTION_FINALIZER)
}

pub async fn run_pvc(ctx: Ctx) -> Result<(), Error> {
    let pvcs = ctx.informers.get::<PersistentVolumeClaim>();
    let pods = ctx.informers.get::<Pod>();
    let mut triggers = futures::stream::select_all([trigger(&pvcs), trigger(&pods)]);
    ready(&pvcs).await?;
    ready(&pods).await?;
    let mut tick = resync();
    while next_pass(&mut triggers, &mut tick).await {
        let pod_list = pods.list();
        for pvc in pvcs.list() {
            let Some(finalizers) = claim_finalizers(&pvc, &pod_list) else {
                continue;
            };
            let api: Api<PersistentVolumeClaim> =
                Api::namespaced(ctx.client.clone(), &pvc.namespace().unwrap_or_default());
            let removing = finalizers.len() < pvc.finalizers().len();
            // A pod created a moment ago may not be cached yet: ask the
            // API before letting the claim go (upstream does the same).
            if removing && used_live(&ctx.client, &pvc).await {
                continue;
            }
            match set_finalizers(&api, &*pvc, finalizers).await {
                Ok(_) if removing => tracing::info!(claim = %pvc.name_any(),
                    namespace = ?pvc.namespace(), "claim no longer in use: protection removed"),
                Ok(_) => {}
                Err(e) => log_write("pvc protection", &pvc.name_any(), &e),
            }
        }
    }
    Ok(())
}

/// Whether a pod uses the claim, by a live list; true when unsure.
async fn used_live(client: &kube::Client, pvc: &PersistentVolumeClaim) -> bool {
    let api: Api<Pod> = Api::namespaced(client.clone(), &pvc.namespace().unwrap_or_default());
    match api.list(&ListParams::default()).await {
        Ok(list) => {
            let pods: Vec<Arc<Pod>> = list.items.into_iter().map(Arc::new).collect();
            in_use(pvc, &pods)
        }
        Err(e) => {
            tracing::debug!("listing pods for pvc protection failed: {e}");
            true
        }
    }
}

pub async fn run_pv(ctx: Ctx) -> Result<(), Error> {
    let pvs = ctx.informers.get::<PersistentVolume>();
    let mut triggers = futures::stream::select_all([trigger(&pvs)]);
    ready(&pvs).await?;
    let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let mut tick = resync();
    while next_pass(&mut triggers, &mut tick).await {
        for pv in pvs.list() {
            let Some(finalizers) = volume_finalizers(&pv) else {
                continue;
            };
            if let Err(e) = set_finalizers(&api, &*pv, finalizers).await {
                log_write("pv protection", &pv.name_any(), &e);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(deleting: bool, finalizers: &[&str]) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "app", "finalizers": finalizers,
                         "deletionTimestamp": deleting.then_some("2026-01-01T00:00:00Z")},
        }))
        .unwrap()
    }

    fn pod(ns: &str, claim: &str, phase: &str, deleting: bool) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": "p", "namespace": ns,
                             "deletionTimestamp": deleting.then_some("2026-01-01T00:00:00Z")},
                "spec": {"containers": [], "volumes": [
                    {"name": "v", "persistentVolumeClaim": {"claimName": claim}}]},
                "status": {"phase": phase},
            }))
            .unwrap(),
        )
    }

    #[test]
    fn a_deleted_claim_keeps_its_finalizer_while_a_live_pod_uses_it() {
        let c = claim(true, &[PVC_PROTECTION_FINALIZER, "other"]);
        assert_eq!(
            claim_finalizers(&c, &[pod("app", "data", "Running", false)]),
            None
        );
        // Being deleted is not gone yet.
        assert_eq!(
            claim_finalizers(&c, &[pod("app", "data", "Running", true)]),
            None
        );
        let released = Some(vec!["other".to_string()]);
        assert_eq!(claim_finalizers(&c, &[]), released);
        assert_eq!(
            claim_finalizers(&c, &[pod("app", "data", "Succeeded", false)]),
            released
        );
        assert_eq!(
            claim_finalizers(&c, &[pod("other", "data", "Running", false)]),
            released
        );
        assert_eq!(
            claim_finalizers(&c, &[pod("app", "logs", "Running", false)]),
            released
        );
        assert_eq!(claim_finalizers(&claim(true, &["other"]), &[]), None);
    }

    #[test]
    fn live_claims_get_the_finalizer_once() {
        assert_eq!(
            claim_finalizers(&claim(false, &[]), &[]),
            Some(vec![PVC_PROTECTION_FINALIZER.to_string()])
        );
        assert_eq!(
            claim_finalizers(&claim(false, &[PVC_PROTECTION_FINALIZER]), &[]),
            None
        );
    }

    #[test]
    fn a_deleted_volume_keeps_its_finalizer_while_bound() {
        let pv = |phase: &str, deleting: bool| -> PersistentVolume {
            serde_json::from_value(json!({
                "metadata": {"name": "pv", "finalizers": [PV_PROTECTION_FINALIZER, "skiff.io/local-path-cleanup"],
                             "deletionTimestamp": deleting.then_some("2026-01-01T00:00:00Z")},
                "status": {"phase": phase},
            }))
            .unwrap()
        };
        assert_eq!(volume_finalizers(&pv("Bound", true)), None);
        assert_eq!(
            volume_finalizers(&pv("Released", true)),
            Some(vec!["skiff.io/local-path-cleanup".to_string()])
        );
        assert_eq!(volume_finalizers(&pv("Bound", false)), None);
        let bare: PersistentVolume =
            serde_json::from_value(json!({"metadata": {"name": "pv"}})).unwrap();
        assert_eq!(
            volume_finalizers(&bare),
            Some(vec![PV_PROTECTION_FINALIZER.to_string()])
        );
    }
}
