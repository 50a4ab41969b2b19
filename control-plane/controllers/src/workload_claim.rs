//! Ownership through controller references, as upstream's
//! `ControllerRefManager`: a controller keeps what it owns and its selector
//! still matches, adopts matching orphans, and releases what it owns but no
//! longer selects. Writes carry the cached resourceVersion, so a decision
//! made on a stale copy fails with a conflict instead of clobbering.

use std::fmt::Debug;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::workload::{is_not_found, ApiResultExt, Result};

/// The owner reference marked `controller: true`, if any.
pub fn controller_of(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
}

/// The reference a controller puts on what it creates or adopts.
pub fn controller_ref<K: Resource<DynamicType = ()>>(owner: &K) -> OwnerReference {
    OwnerReference {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        name: owner.meta().name.clone().unwrap_or_default(),
        uid: owner.meta().uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// What a controller does with one candidate object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// Ours and selected: manage it.
    Owned,
    /// An orphan we select: take it.
    Adopt,
    /// Ours but no longer selected: let it go.
    Release,
    /// Someone else's, or not for us.
    NotOurs,
}

/// Classify `meta` for the controller with `owner_uid`. `selected` says
/// whether the controller's selector matches the object; `owner_deleting`
/// whether the controller itself is being deleted (then it neither adopts
/// nor releases).
pub fn classify(owner_uid: &str, owner_deleting: bool, selected: bool, meta: &ObjectMeta) -> Claim {
    match controller_of(meta) {
        Some(r) if r.uid != owner_uid => Claim::NotOurs,
        Some(_) if selected => Claim::Owned,
        Some(_) if owner_deleting => Claim::NotOurs,
        Some(_) => Claim::Release,
        None if !selected || owner_deleting || meta.deletion_timestamp.is_some() => Claim::NotOurs,
        None => Claim::Adopt,
    }
}

/// Make `owner` the controller of `obj`, adding `finalizer` if given (the
/// Job controller tracks its pods with one).
///
/// # Errors
/// The patch fails (a conflict when `obj` changed since it was cached).
pub async fn adopt<K>(
    api: &Api<K>,
    obj: &K,
    owner: OwnerReference,
    finalizer: Option<&str>,
) -> Result<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let meta = obj.meta();
    let mut refs: Vec<OwnerReference> = meta.owner_references.clone().unwrap_or_default();
    refs.retain(|r| r.uid != owner.uid);
    let what = format!("{} {}", owner.kind, owner.name);
    refs.push(owner);
    let name = meta.name.clone().unwrap_or_default();
    let mut patch =
        json!({"metadata": {"resourceVersion": meta.resource_version, "ownerReferences": refs}});
    if let Some(f) = finalizer {
        let mut fs = meta.finalizers.clone().unwrap_or_default();
        if !fs.iter().any(|x| x == f) {
            fs.push(f.to_string());
        }
        patch["metadata"]["finalizers"] = json!(fs);
    }
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .ctx(|| format!("adopting {} {name} into {what}", K::kind(&())))
}

/// Drop `owner_uid`'s reference from `obj`. Already gone is fine.
///
/// # Errors
/// The patch fails (a conflict when `obj` changed since it was cached).
pub async fn release<K>(api: &Api<K>, obj: &K, owner_uid: &str) -> Result<()>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let meta = obj.meta();
    let refs: Vec<&OwnerReference> = meta
        .owner_references
        .iter()
        .flatten()
        .filter(|r| r.uid != owner_uid)
        .collect();
    let name = meta.name.clone().unwrap_or_default();
    let patch =
        json!({"metadata": {"resourceVersion": meta.resource_version, "ownerReferences": refs}});
    match api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(e).ctx(|| format!("releasing {} {name}", K::kind(&()))),
    }
}

/// Whether `owner` may adopt: checked against the API, not the cache,
/// because adopting into a controller that is being deleted (or was
/// replaced by a namesake) would hand the orphan to the garbage collector
/// (upstream `RecheckDeletionTimestamp`).
///
/// # Errors
/// The read fails.
pub async fn can_adopt<K>(api: &Api<K>, owner: &K) -> Result<bool>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let name = owner.meta().name.clone().unwrap_or_default();
    let fresh = api
        .get_opt(&name)
        .await
        .ctx(|| format!("reading {} {name} before adopting", K::kind(&())))?;
    Ok(fresh
        .is_some_and(|f| f.meta().uid == owner.meta().uid && f.meta().deletion_timestamp.is_none()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(owner: Option<(&str, bool)>) -> ObjectMeta {
        ObjectMeta {
            owner_references: owner.map(|(uid, controller)| {
                vec![OwnerReference {
                    uid: uid.into(),
                    controller: Some(controller),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        }
    }

    #[test]
    fn claims_follow_controller_ref_manager() {
        assert_eq!(
            classify("a", false, true, &meta(Some(("a", true)))),
            Claim::Owned
        );
        assert_eq!(
            classify("a", false, false, &meta(Some(("a", true)))),
            Claim::Release
        );
        assert_eq!(
            classify("a", true, false, &meta(Some(("a", true)))),
            Claim::NotOurs
        );
        assert_eq!(
            classify("a", false, true, &meta(Some(("b", true)))),
            Claim::NotOurs
        );
        assert_eq!(classify("a", false, true, &meta(None)), Claim::Adopt);
        // A non-controller reference does not make the object owned.
        assert_eq!(
            classify("a", false, true, &meta(Some(("b", false)))),
            Claim::Adopt
        );
        assert_eq!(classify("a", false, false, &meta(None)), Claim::NotOurs);
        assert_eq!(classify("a", true, true, &meta(None)), Claim::NotOurs);
    }
}
