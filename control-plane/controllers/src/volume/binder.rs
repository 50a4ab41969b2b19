//! The PV binder ("persistentvolume-binder", upstream's
//! `persistentvolume.PersistentVolumeController`): binds pending claims
//! to matching volumes (or provisions local-path ones), keeps every
//! volume's phase true to its claim, reclaims released volumes, and
//! marks claims whose volume is gone Lost.
//!
//! [`sync_volume`] and [`sync_claim`] decide; [`run`] writes. A binding is
//! written volume first (claimRef, then phase), claim second (volumeName
//! and annotations, then status), as upstream: a crash half-way leaves a
//! volume pointing at its claim, which the next pass completes.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, ResourceExt};
use kube_util::events::{Recorder, Reporter};
use kube_util::informer::Informer;
use kube_util::storage::{
    self, BETA_STORAGE_PROVISIONER_ANNOTATION, BIND_COMPLETED_ANNOTATION,
    BOUND_BY_CONTROLLER_ANNOTATION, LOCAL_PATH_PROVISIONER, PROVISIONED_BY_ANNOTATION,
    SELECTED_NODE_ANNOTATION, STORAGE_PROVISIONER_ANNOTATION,
};
use serde_json::json;

use super::provision::{self, NoNode};
use super::{log_write, next_pass, ready, resync, stale, trigger};
use crate::{Ctx, Error};

/// What a volume needs, judged from it and the claim its claimRef names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeAction {
    None,
    /// Set `status.phase` (clearing any message).
    Phase(&'static str),
    /// The controller bound it to a claim that went elsewhere: clear the
    /// claimRef, make it Available again.
    Unbind,
    /// Delete the PV object (local-path, policy Delete): its finalizers
    /// have the agent remove the directory.
    Delete,
    /// Phase Failed with `message`, and a Warning event `reason`.
    Failed {
        reason: &'static str,
        message: String,
    },
}

fn phase(pv: &PersistentVolume) -> Option<&str> {
    pv.status.as_ref().and_then(|s| s.phase.as_deref())
}

fn claim_phase(pvc: &PersistentVolumeClaim) -> Option<&str> {
    pvc.status.as_ref().and_then(|s| s.phase.as_deref())
}

fn volume_name_of(pvc: &PersistentVolumeClaim) -> &str {
    pvc.spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .unwrap_or_default()
}

fn has_annotation(meta: &kube::api::ObjectMeta, key: &str) -> bool {
    meta.annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(key))
}

/// What a volume whose claim is gone becomes, by its reclaim policy.
pub fn reclaim(pv: &PersistentVolume) -> VolumeAction {
    let policy = pv
        .spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
        .unwrap_or("Retain");
    match policy {
        // Upstream: kept Released, no event; an administrator reuses it.
        "Retain" => VolumeAction::None,
        "Delete" if storage::is_local_path(pv) => {
            if pv.metadata.deletion_timestamp.is_some() {
                VolumeAction::None
            } else {
                VolumeAction::Delete
            }
        }
        "Delete" => VolumeAction::Failed {
            reason: "VolumeFailedDelete",
            message: format!(
                "error getting deleter volume plugin for volume \"{}\": no deletable volume plugin matched",
                pv.name_any()
            ),
        },
        "Recycle" => VolumeAction::Failed {
            reason: "VolumeFailedRecycle",
            message: format!(
                "recycling volume \"{}\" is not supported (the Recycle reclaim policy is deprecated): \
                 remove its data and clear spec.claimRef to reuse it",
                pv.name_any()
            ),
        },
        _ => VolumeAction::Failed {
            reason: "VolumeUnknownReclaimPolicy",
            message: "Volume has unrecognized PersistentVolumeReclaimPolicy".into(),
        },
    }
}

/// Upstream's `syncVolume`: `claim` is the claim in the cache at the
/// namespace/name the volume's claimRef names, if any.
pub fn sync_volume(pv: &PersistentVolume, claim: Option<&PersistentVolumeClaim>) -> VolumeAction {
    let set = |p: &'static str| {
        if phase(pv) == Some(p) {
            VolumeAction::None
        } else {
            VolumeAction::Phase(p)
        }
    };
    let Some(r) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return set("Available");
    };
    let Some(uid) = r.uid.as_deref().filter(|u| !u.is_empty()) else {
        // Pre-bound by name only: offered to that claim when it comes.
        return set("Available");
    };
    match claim {
        Some(c) if c.metadata.uid.as_deref() == Some(uid) => {
            let vol = volume_name_of(c);
            if vol.is_empty() || vol == pv.name_any() {
                // Bound, or binding in progress: the claim's sync completes it.
                return set("Bound");
            }
            // The claim went to another volume.
            let deletes = pv
                .spec
                .as_ref()
                .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
                == Some("Delete");
            if has_annotation(&pv.metadata, PROVISIONED_BY_ANNOTATION) && deletes {
                // Provisioned for this claim and not needed: reclaim it.
                return reclaim(pv);
            }
            if has_annotation(&pv.metadata, BOUND_BY_CONTROLLER_ANNOTATION) {
                return VolumeAction::Unbind;
            }
            // An administrator's pre-binding: theirs to fix.
            VolumeAction::None
        }
        _ => match phase(pv) {
            Some("Failed") => VolumeAction::None,
            Some("Released") => reclaim(pv),
            _ => VolumeAction::Phase("Released"),
        },
    }
}

/// What a claim needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimAction {
    None,
    /// Bind to volume `volume` (or complete that binding); `chosen`: the
    /// controller picked it (the volume gets bound-by-controller).
    Bind {
        volume: String,
        chosen: bool,
    },
    /// Provision a local-path volume for it.
    Provision,
    /// Another provisioner's claim: annotate it and wait.
    External {
        provisioner: String,
    },
    /// Phase Lost, with a Warning event.
    Lost {
        reason: &'static str,
        message: String,
    },
    /// Stay as is, telling why.
    Event {
        warning: bool,
        reason: &'static str,
        message: String,
    },
}

/// Whether the binding of `pvc` to `pv` is written in full.
pub fn binding_complete(pv: &PersistentVolume, pvc: &PersistentVolumeClaim) -> bool {
    let pv_ok = storage::claim_ref_names(pv, pvc)
        && pv
            .spec
            .as_ref()
            .and_then(|s| s.claim_ref.as_ref())
            .and_then(|r| r.uid.as_deref())
            .is_some_and(|u| !u.is_empty())
        && phase(pv) == Some("Bound");
    let status = pvc.status.as_ref();
    let pv_modes = pv.spec.as_ref().and_then(|s| s.access_modes.as_ref());
    pv_ok
        && volume_name_of(pvc) == pv.name_any()
        && storage::annotation(&pvc.metadata.annotations, BIND_COMPLETED_ANNOTATION) == Some("yes")
        && claim_phase(pvc) == Some("Bound")
        // Only present: once bound, growing it is the expander's job.
        && status.and_then(|s| s.capacity.as_ref()).is_some()
        && status.and_then(|s| s.access_modes.as_ref()) == pv_modes
}

/// The smallest Available volume that can serve `pvc` (ties by name, so
/// every pass picks the same one).
pub fn best_match(pvc: &PersistentVolumeClaim, pvs: &[Arc<PersistentVolume>]) -> Option<String> {
    pvs.iter()
        .filter(|pv| {
            pv.spec
                .as_ref()
                .and_then(|s| s.claim_ref.as_ref())
                .is_none()
        })
        .filter(|pv| storage::volume_matches_claim(pv, pvc))
        .min_by_key(|pv| (storage::volume_capacity(pv), pv.name_any()))
        .map(|pv| pv.name_any())
}

/// Upstream's `syncClaim`. `class` is the claim's StorageClass from the
/// cache (None when it names none or one that does not exist).
pub fn sync_claim(
    pvc: &PersistentVolumeClaim,
    pvs: &[Arc<PersistentVolume>],
    class: Option<&StorageClass>,
) -> ClaimAction {
    let wanted = volume_name_of(pvc);
    if !wanted.is_empty() {
        return sync_named_claim(pvc, wanted, pvs);
    }
    if pvc.metadata.deletion_timestamp.is_some() {
        return ClaimAction::None;
    }
    // A volume pre-bound to this claim (by an administrator, by the
    // scheduler, or provisioned for it) comes first.
    let mut prebound: Vec<&Arc<PersistentVolume>> = pvs
        .iter()
        .filter(|pv| storage::claim_ref_names(pv, pvc) && storage::volume_matches_claim(pv, pvc))
        .collect();
    prebound.sort_by_key(|pv| pv.name_any());
    if let Some(pv) = prebound.first() {
        return ClaimAction::Bind {
            volume: pv.name_any(),
            chosen: false,
        };
    }
    let class_name = storage::claim_class(pvc).unwrap_or_default();
    let delayed =
        class.and_then(|c| c.volume_binding_mode.as_deref()) == Some("WaitForFirstConsumer");
    if delayed {
        if !has_annotation(&pvc.metadata, SELECTED_NODE_ANNOTATION) {
            return ClaimAction::Event {
                warning: false,
                reason: "WaitForFirstConsumer",
                message: "waiting for first consumer to be created before binding".into(),
            };
        }
    } else if let Some(volume) = best_match(pvc, pvs) {
        return ClaimAction::Bind {
            volume,
            chosen: true,
        };
    }
    if class_name.is_empty() {
        return ClaimAction::Event {
            warning: false,
            reason: "FailedBinding",
            message: "no persistent volumes available for this claim and no storage class is set"
                .into(),
        };
    }
    match class {
        None => ClaimAction::Event {
            warning: true,
            reason: "ProvisioningFailed",
            message: format!("storageclass.storage.k8s.io \"{class_name}\" not found"),
        },
        Some(c) if c.provisioner == LOCAL_PATH_PROVISIONER => ClaimAction::Provision,
        Some(c) => ClaimAction::External {
            provisioner: c.provisioner.clone(),
        },
    }
}

/// A claim that names its volume (bound, or asking for that one).
fn sync_named_claim(
    pvc: &PersistentVolumeClaim,
    wanted: &str,
    pvs: &[Arc<PersistentVolume>],
) -> ClaimAction {
    let was_bound = matches!(claim_phase(pvc), Some("Bound" | "Lost"));
    let Some(pv) = pvs.iter().find(|pv| pv.name_any() == wanted) else {
        return if claim_phase(pvc) == Some("Bound") {
            ClaimAction::Lost {
                reason: "ClaimLost",
                message: "Bound claim has lost reference to PersistentVolume. Data on the volume is lost!".into(),
            }
        } else {
            // Pending for a volume that may yet be created (upstream waits).
            ClaimAction::None
        };
    };
    let claim_ref = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
    if claim_ref.is_some() && !storage::claim_ref_names(pv, pvc) {
        return if was_bound {
            if claim_phase(pvc) == Some("Lost") {
                ClaimAction::None
            } else {
                ClaimAction::Lost {
                    reason: "ClaimMisbound",
                    message:
                        "Two claims are bound to the same volume, this one is bound incorrectly"
                            .into(),
                }
            }
        } else {
            ClaimAction::Event {
                warning: false,
                reason: "FailedBinding",
                message: format!("volume \"{wanted}\" already bound to a different claim."),
            }
        };
    }
    if !was_bound && claim_ref.is_none() && !storage::volume_matches_claim(pv, pvc) {
        return ClaimAction::Event {
            warning: true,
            reason: "FailedBinding",
            message: format!(
                "Cannot bind to requested volume \"{wanted}\": it does not satisfy the claim \
                 (class, capacity, access modes, volume mode or selector)"
            ),
        };
    }
    if binding_complete(pv, pvc) {
        return ClaimAction::None;
    }
    ClaimAction::Bind {
        volume: wanted.to_string(),
        chosen: claim_ref.is_none(),
    }
}

pub async fn run(ctx: Ctx) -> Result<(), Error> {
    let pvs = ctx.informers.get::<PersistentVolume>();
    let pvcs = ctx.informers.get::<PersistentVolumeClaim>();
    let classes = ctx.informers.get::<StorageClass>();
    let nodes = ctx.informers.get::<Node>();
    let mut triggers = futures::stream::select_all([
        trigger(&pvs),
        trigger(&pvcs),
        trigger(&classes),
        trigger(&nodes),
    ]);
    ready(&pvs).await?;
    ready(&pvcs).await?;
    ready(&classes).await?;
    ready(&nodes).await?;
    let b = Binder {
        client: ctx.client.clone(),
        events: Recorder::new(
            ctx.client.clone(),
            Reporter::new("persistentvolume-controller"),
        ),
        pvs,
        pvcs,
        classes,
        nodes,
    };
    let mut tick = resync();
    while next_pass(&mut triggers, &mut tick).await {
        b.pass().await;
    }
    Ok(())
}

struct Binder {
    client: kube::Client,
    events: Recorder,
    pvs: Informer<PersistentVolume>,
    pvcs: Informer<PersistentVolumeClaim>,
    classes: Informer<StorageClass>,
    nodes: Informer<Node>,
}

impl Binder {
    async fn pass(&self) {
        for pv in self.pvs.list() {
            let claim = pv
                .spec
                .as_ref()
                .and_then(|s| s.claim_ref.as_ref())
                .and_then(|r| self.pvcs.get(r.namespace.as_deref(), r.name.as_deref()?));
            let action = sync_volume(&pv, claim.as_deref());
            self.apply_volume(&pv, action).await;
        }
        let pvs = self.pvs.list();
        for pvc in self.pvcs.list() {
            let class = storage::claim_class(&pvc)
                .filter(|c| !c.is_empty())
                .and_then(|c| self.classes.get(None, c));
            let action = sync_claim(&pvc, &pvs, class.as_deref());
            self.apply_claim(&pvc, class.as_deref(), action).await;
        }
    }

    fn pv_api(&self) -> Api<PersistentVolume> {
        Api::all(self.client.clone())
    }

    fn pvc_api(&self, pvc: &PersistentVolumeClaim) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), &pvc.namespace().unwrap_or_default())
    }

    async fn apply_volume(&self, pv: &PersistentVolume, action: VolumeAction) {
        let name = pv.name_any();
        let api = self.pv_api();
        let res = match action {
            VolumeAction::None => return,
            VolumeAction::Phase("Released") => {
                // The cache may lag a claim just created: ask the API
                // before declaring the data unclaimed.
                if self.claim_still_there(pv).await {
                    return;
                }
                set_volume_phase(&api, pv, "Released", None)
                    .await
                    .map(|_| ())
            }
            VolumeAction::Phase(p) => set_volume_phase(&api, pv, p, None).await.map(|_| ()),
            VolumeAction::Unbind => {
                let patch = json!({
                    "metadata": {
                        "resourceVersion": pv.resource_version(),
                        "annotations": {BOUND_BY_CONTROLLER_ANNOTATION: null},
                    },
                    "spec": {"claimRef": null},
                });
                match api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(pv) => set_volume_phase(&api, &pv, "Available", None)
                        .await
                        .map(|_| ()),
                    Err(e) => Err(e),
                }
            }
            VolumeAction::Delete => {
                let dp = DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: pv.uid(),
                        resource_version: None,
                    }),
                    ..DeleteParams::default()
                };
                let res = api.delete(&name, &dp).await.map(|_| ());
                if res.is_ok() {
                    tracing::info!(volume = %name, "deleted released local-path volume");
                }
                res
            }
            VolumeAction::Failed { reason, message } => {
                let res = set_volume_phase(&api, pv, "Failed", Some(&message)).await;
                if res.is_ok() {
                    self.events.warning(pv, reason, message);
                }
                res.map(|_| ())
            }
        };
        if let Err(e) = res {
            log_write("syncing volume", &name, &e);
        }
    }

    /// Whether the claim a volume's claimRef names (same uid) exists.
    async fn claim_still_there(&self, pv: &PersistentVolume) -> bool {
        let Some(r) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
            return false;
        };
        let api: Api<PersistentVolumeClaim> = Api::namespaced(
            self.client.clone(),
            r.namespace.as_deref().unwrap_or_default(),
        );
        match api.get_opt(r.name.as_deref().unwrap_or_default()).await {
            Ok(Some(c)) => c.metadata.uid == r.uid,
            Ok(None) => false,
            // Unsure: decide next pass.
            Err(_) => true,
        }
    }

    async fn apply_claim(
        &self,
        pvc: &PersistentVolumeClaim,
        class: Option<&StorageClass>,
        action: ClaimAction,
    ) {
        let res = match action {
            ClaimAction::None => Ok(()),
            ClaimAction::Event {
                warning,
                reason,
                message,
            } => {
                self.event(pvc, warning, reason, message);
                Ok(())
            }
            ClaimAction::Bind { volume, chosen } => match self.pvs.get(None, &volume) {
                Some(pv) => self.bind(&pv, pvc, chosen).await,
                None => Ok(()),
            },
            ClaimAction::Lost { reason, message } => {
                let res =
                    super::patch_status_at(&self.pvc_api(pvc), pvc, json!({"phase": "Lost"})).await;
                if res.is_ok() {
                    self.events.warning(pvc, reason, message);
                }
                res.map(|_| ())
            }
            ClaimAction::External { provisioner } => {
                let res = self.annotate_provisioner(pvc, &provisioner).await;
                if res.is_ok() {
                    self.events.normal(
                        pvc,
                        "ExternalProvisioning",
                        format!(
                            "Waiting for a volume to be created either by the external provisioner '{provisioner}' \
                             or manually by the system administrator. If volume creation is delayed, please \
                             verify that the provisioner is running and correctly registered."
                        ),
                    );
                }
                res.map(|_| ())
            }
            ClaimAction::Provision => match class {
                Some(class) => self.provision(pvc, class).await,
                None => Ok(()),
            },
        };
        if let Err(e) = res {
            log_write("syncing claim", &pvc.name_any(), &e);
        }
    }

    fn event(&self, pvc: &PersistentVolumeClaim, warning: bool, reason: &str, message: String) {
        if warning {
            self.events.warning(pvc, reason, message);
        } else {
            self.events.normal(pvc, reason, message);
        }
    }

    /// Upstream sets both provisioner annotations on the claim before
    /// provisioning starts: they tell who is expected to act.
    async fn annotate_provisioner(
        &self,
        pvc: &PersistentVolumeClaim,
        provisioner: &str,
    ) -> Result<PersistentVolumeClaim, kube::Error> {
        let has = |k| storage::annotation(&pvc.metadata.annotations, k) == Some(provisioner);
        if has(STORAGE_PROVISIONER_ANNOTATION) && has(BETA_STORAGE_PROVISIONER_ANNOTATION) {
            return Ok(pvc.clone());
        }
        let patch = json!({"metadata": {
            "resourceVersion": pvc.resource_version(),
            "annotations": {
                STORAGE_PROVISIONER_ANNOTATION: provisioner,
                BETA_STORAGE_PROVISIONER_ANNOTATION: provisioner,
            },
        }});
        self.pvc_api(pvc)
            .patch(
                &pvc.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
    }

    async fn provision(
        &self,
        pvc: &PersistentVolumeClaim,
        class: &StorageClass,
    ) -> Result<(), kube::Error> {
        let Some(name) = provision::volume_name(pvc) else {
            return Ok(());
        };
        // Created already (the cache lags our own create): bound next pass.
        if self.pvs.get(None, &name).is_some() {
            return Ok(());
        }
        let node = match provision::pick_node(pvc, &self.nodes.list()) {
            Ok(n) => n,
            Err(why) => {
                let message = match why {
                    NoNode::Missing(n) => format!("node \"{n}\" selected for the claim not found"),
                    NoNode::NoneReady => {
                        "no Ready schedulable node to provision a local-path volume on".into()
                    }
                };
                self.events.warning(pvc, "ProvisioningFailed", message);
                return Ok(());
            }
        };
        let root = match provision::volume_root(class, &node) {
            Ok(r) => r,
            Err(message) => {
                self.events.warning(pvc, "ProvisioningFailed", message);
                return Ok(());
            }
        };
        let pvc = self
            .annotate_provisioner(pvc, LOCAL_PATH_PROVISIONER)
            .await?;
        let Some(pv) = provision::provisioned_volume(&pvc, class, &node, &root) else {
            self.events.warning(
                &pvc,
                "ProvisioningFailed",
                "the claim has no resources.requests.storage".into(),
            );
            return Ok(());
        };
        match self.pv_api().create(&PostParams::default(), &pv).await {
            Ok(_) => {
                tracing::info!(volume = %name, node = %node.name_any(), "provisioned local-path volume");
                self.events.normal(
                    &pvc,
                    "ProvisioningSucceeded",
                    format!("Successfully provisioned volume {name}"),
                );
                Ok(())
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
            Err(e) => {
                if !stale(&e) {
                    self.events.warning(
                        &pvc,
                        "ProvisioningFailed",
                        format!("creating volume {name} failed: {e}"),
                    );
                }
                Err(e)
            }
        }
    }

    /// Write the binding of `pvc` to `pv`, each step only when missing.
    async fn bind(
        &self,
        pv: &PersistentVolume,
        pvc: &PersistentVolumeClaim,
        chosen: bool,
    ) -> Result<(), kube::Error> {
        let api = self.pv_api();
        let pv_name = pv.name_any();
        let mut pv = pv.clone();
        let uid_set = pv
            .spec
            .as_ref()
            .and_then(|s| s.claim_ref.as_ref())
            .and_then(|r| r.uid.as_deref())
            .is_some_and(|u| u == pvc.uid().unwrap_or_default());
        if !uid_set {
            let mut meta = json!({"resourceVersion": pv.resource_version()});
            if chosen {
                meta["annotations"] = json!({BOUND_BY_CONTROLLER_ANNOTATION: "yes"});
            }
            let patch = json!({
                "metadata": meta,
                "spec": {"claimRef": {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "namespace": pvc.namespace(),
                    "name": pvc.name_any(),
                    "uid": pvc.uid(),
                    "resourceVersion": pvc.resource_version(),
                }},
            });
            pv = api
                .patch(&pv_name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        if phase(&pv) != Some("Bound") {
            pv = set_volume_phase(&api, &pv, "Bound", None).await?;
        }
        let claims = self.pvc_api(pvc);
        let mut pvc = pvc.clone();
        let named = volume_name_of(&pvc) == pv_name;
        if !named
            || storage::annotation(&pvc.metadata.annotations, BIND_COMPLETED_ANNOTATION)
                != Some("yes")
        {
            let mut annotations = BTreeMap::from([(BIND_COMPLETED_ANNOTATION, "yes")]);
            if !named {
                annotations.insert(BOUND_BY_CONTROLLER_ANNOTATION, "yes");
            }
            let patch = json!({
                "metadata": {"resourceVersion": pvc.resource_version(), "annotations": annotations},
                "spec": {"volumeName": pv_name},
            });
            pvc = claims
                .patch(
                    &pvc.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await?;
        }
        if !binding_complete(&pv, &pvc) {
            let spec = pv.spec.as_ref();
            // Keep a capacity the expander already raised.
            let capacity = pvc
                .status
                .as_ref()
                .and_then(|s| s.capacity.clone())
                .filter(|_| claim_phase(&pvc) == Some("Bound"))
                .or_else(|| spec.and_then(|s| s.capacity.clone()));
            let status = json!({
                "phase": "Bound",
                "accessModes": spec.and_then(|s| s.access_modes.clone()),
                "capacity": capacity,
            });
            super::patch_status_at(&claims, &pvc, status).await?;
            tracing::info!(claim = %pvc.name_any(), namespace = ?pvc.namespace(), volume = %pv_name, "bound claim");
        }
        Ok(())
    }
}

async fn set_volume_phase(
    api: &Api<PersistentVolume>,
    pv: &PersistentVolume,
    phase: &str,
    message: Option<&str>,
) -> Result<PersistentVolume, kube::Error> {
    super::patch_status_at(api, pv, json!({"phase": phase, "message": message})).await
}

#[cfg(test)]
mod tests;
