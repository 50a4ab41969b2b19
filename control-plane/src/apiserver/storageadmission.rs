//! The storage admission plugins (upstream's `plugin/pkg/admission/storage`),
//! called from [`super::admission`]:
//!
//! - DefaultStorageClass: a new claim that names no class gets the default
//!   one, so that it can be provisioned.
//! - StorageObjectInUseProtection: new claims and volumes carry the
//!   protection finalizers, so that deleting one in use waits for its pods
//!   (the protection controllers remove them).
//! - PersistentVolumeClaimResize: a claim grows only when bound and its
//!   class allows expansion.

use serde_json::{json, Value};

use super::objects::{self, meta_mut};
use super::resources::lookup;
use super::status::{ApiError, ApiResult};
use super::strategy::storage::class::is_default;
use super::strategy::storage::BETA_CLASS_ANNOTATION;
use super::{ApiServer, Req};
use kube_util::storage::{PVC_PROTECTION_FINALIZER, PV_PROTECTION_FINALIZER};

/// Mutating admission of a new claim or volume.
///
/// # Errors
/// 403 when the classes cannot be read (upstream's DefaultStorageClass
/// refuses rather than leave a claim without the class it should get).
pub(crate) async fn mutate_create(api: &ApiServer, r: &Req, obj: &mut Value) -> ApiResult<()> {
    if r.is_resource("", "persistentvolumeclaims") {
        default_class(api, r, obj).await?;
        add_finalizer(obj, PVC_PROTECTION_FINALIZER);
    } else if r.is_resource("", "persistentvolumes") {
        add_finalizer(obj, PV_PROTECTION_FINALIZER);
    }
    Ok(())
}

/// Validating admission of an update of a claim (PersistentVolumeClaimResize).
///
/// # Errors
/// 403 for a growing claim that is not bound, or whose class does not allow
/// expansion.
pub(crate) async fn validate_update(
    api: &ApiServer,
    r: &Req,
    old: &Value,
    new: &Value,
) -> ApiResult<()> {
    if !r.is_resource("", "persistentvolumeclaims") {
        return Ok(());
    }
    let size = |v: &Value| {
        v["spec"]["resources"]["requests"]["storage"]
            .as_str()
            .and_then(|q| kube_util::quantity::scaled(q, -3).ok())
            .unwrap_or(0)
    };
    if size(new) <= size(old) {
        return Ok(());
    }
    let name = objects::name(new).unwrap_or_default();
    let forbidden = |why: &str| {
        ApiError::forbidden(format!(
            "persistentvolumeclaims {name:?} is forbidden: {why}"
        ))
    };
    if old["status"]["phase"] != "Bound" {
        return Err(forbidden(
            "Only bound persistent volume claims can be expanded",
        ));
    }
    let (class, old_class) = (claim_class(new), claim_class(old));
    let allowed = !class.is_empty()
        && class == old_class
        && read_class(api, &class)
            .await?
            .is_some_and(|sc| sc["allowVolumeExpansion"] == true);
    if !allowed {
        return Err(forbidden(
            "only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize",
        ));
    }
    Ok(())
}

/// A claim's class as upstream's helper reads it: the beta annotation
/// first, then the field.
fn claim_class(pvc: &Value) -> String {
    pvc["metadata"]["annotations"][BETA_CLASS_ANNOTATION]
        .as_str()
        .or_else(|| pvc["spec"]["storageClassName"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// Append `finalizer` unless the object has it already.
fn add_finalizer(obj: &mut Value, finalizer: &str) {
    let mut finalizers = objects::finalizers(obj);
    if !finalizers.iter().any(|f| f == finalizer) {
        finalizers.push(finalizer.to_string());
        meta_mut(obj).insert("finalizers".into(), json!(finalizers));
    }
}

/// DefaultStorageClass: a claim with no `storageClassName` at all (an
/// empty one asks for no class) and no beta annotation gets the default
/// class, if there is one.
async fn default_class(api: &ApiServer, r: &Req, obj: &mut Value) -> ApiResult<()> {
    let has_class = !obj["spec"]["storageClassName"].is_null()
        || obj["metadata"]["annotations"][BETA_CLASS_ANNOTATION].is_string();
    if has_class {
        return Ok(());
    }
    let classes = list_classes(api).await.map_err(|e| {
        let name = objects::name(obj).unwrap_or_default();
        ApiError::forbidden(format!(
            "{} {name:?} is forbidden: {}",
            r.attrs.resource, e.message
        ))
    })?;
    if let Some(name) = pick_default(&classes) {
        if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
            spec.insert("storageClassName".into(), json!(name));
        }
    }
    Ok(())
}

/// The default class among `classes`: with several marked default, the
/// newest, then the first by name (upstream since 1.28, so that adding a
/// new default before removing the old one switches cleanly).
fn pick_default(classes: &[Value]) -> Option<String> {
    let created = |c: &Value| {
        objects::meta_str(c, "creationTimestamp")
            .and_then(objects::parse_time)
            .map(|t| t.as_second())
            .unwrap_or(0)
    };
    let name = |c: &Value| objects::name(c).unwrap_or_default().to_string();
    classes
        .iter()
        .filter(|c| is_default(c))
        .min_by(|a, b| {
            created(b)
                .cmp(&created(a))
                .then_with(|| name(a).cmp(&name(b)))
        })
        .map(name)
}

fn class_resource() -> ApiResult<&'static super::resources::ResourceDef> {
    lookup("storage.k8s.io", "v1", "storageclasses")
        .ok_or_else(|| ApiError::internal("storageclasses are not served"))
}

async fn list_classes(api: &ApiServer) -> ApiResult<Vec<Value>> {
    let prefix = class_resource()?.prefix(None);
    let list = api.store.list(&prefix, None, 0, None).await?;
    Ok(list
        .kvs
        .iter()
        .filter_map(|kv| objects::decode_stored(&kv.value, kv.mod_revision))
        .collect())
}

async fn read_class(api: &ApiServer, name: &str) -> ApiResult<Option<Value>> {
    let key = class_resource()?.key(None, name);
    Ok(api
        .store
        .get(&key)
        .await?
        .and_then(|kv| objects::decode_stored(&kv.value, kv.mod_revision)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube_util::storage::DEFAULT_CLASS_ANNOTATION;

    fn class(name: &str, created: &str, default: bool) -> Value {
        let mut c =
            json!({"metadata": {"name": name, "creationTimestamp": created}, "provisioner": "p"});
        if default {
            c["metadata"]["annotations"] = json!({DEFAULT_CLASS_ANNOTATION: "true"});
        }
        c
    }

    #[test]
    fn the_newest_default_wins() {
        let classes = [
            class("old", "2024-01-01T00:00:00Z", true),
            class("b-new", "2024-06-01T00:00:00Z", true),
            class("a-new", "2024-06-01T00:00:00Z", true),
            class("newest", "2025-01-01T00:00:00Z", false),
        ];
        assert_eq!(pick_default(&classes).as_deref(), Some("a-new"));
        assert_eq!(pick_default(&classes[3..]), None);
    }

    #[test]
    fn finalizers_are_added_once() {
        let mut pvc = json!({"metadata": {"finalizers": ["x"]}});
        add_finalizer(&mut pvc, PVC_PROTECTION_FINALIZER);
        add_finalizer(&mut pvc, PVC_PROTECTION_FINALIZER);
        assert_eq!(
            pvc["metadata"]["finalizers"],
            json!(["x", PVC_PROTECTION_FINALIZER])
        );
    }

    #[test]
    fn the_class_comes_from_the_annotation_first() {
        let pvc = json!({"metadata": {"annotations": {BETA_CLASS_ANNOTATION: "a"}},
            "spec": {"storageClassName": "b"}});
        assert_eq!(claim_class(&pvc), "a");
        assert_eq!(claim_class(&json!({"spec": {}})), "");
    }
}
