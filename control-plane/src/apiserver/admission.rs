//! The built-in admission plugins, run by the generic verbs around each
//! write (upstream's admission chain: mutating plugins after defaulting,
//! validating ones after the kind's validation). Each plugin decides
//! itself which requests it looks at, by resource and operation, as
//! upstream's do.
//!
//! - NamespaceLifecycle: nothing is created in a namespace that does not
//!   exist or is terminating.
//! - NodeRestriction: a node writes only its own Node, Lease and pods'
//!   status ([`crate::auth::node::admit`]).
//! - DefaultTolerationSeconds: pods tolerate not-ready / unreachable nodes
//!   for a while before the node lifecycle controller evicts them.
//! - ServiceAccount: pods' accounts, pull secrets and token volume
//!   ([`super::serviceaccounts`]).
//! - PodSecurity: namespaces' Pod Security levels ([`super::podsecurity`]),
//!   run by [`validate_warn`] as it may warn.
//! - ResourceQuota: checks and charges new objects against their
//!   namespace's quotas ([`super::quota`]), last, from [`validate_warn`].
//! - LimitRanger: LimitRange defaults and bounds for pods and claims
//!   ([`super::limitranger`]).
//! - Priority: pods' priority from their PriorityClass, one default
//!   class ([`super::priority`]).
//! - RuntimeClass: pods' overhead, node selector and tolerations from
//!   their RuntimeClass ([`super::runtimeclass`]).
//! - The CRD handler's refusal of creates while a definition is being
//!   deleted ([`super::crd::admit_create`]).
//! - DefaultStorageClass, StorageObjectInUseProtection,
//!   PersistentVolumeClaimResize ([`super::storageadmission`]).
//!
//! Checks that belong to one kind (who may ask for which certificate, who
//! may grant which permissions) are that kind's strategy's
//! `authorize_write`.

use serde_json::{json, Value};

use super::objects;
use super::status::{ApiError, ApiResult};
use super::{ApiServer, Req};
use crate::auth::node;

/// Mutating admission of a new object, after its defaults: the built-in
/// plugins, then the mutating webhooks ([`super::webhook`]). Returns the
/// webhooks' warnings.
///
/// # Errors
/// 403 from ServiceAccount admission ([`super::serviceaccounts`]) or
/// DefaultStorageClass ([`super::storageadmission`]); a webhook's denial
/// or failure.
pub(crate) async fn mutate_create(
    api: &ApiServer,
    r: &Req,
    obj: &mut Value,
) -> ApiResult<Vec<String>> {
    if r.is_resource("", "pods") {
        // NamespaceLifecycle runs first upstream: a missing namespace is
        // a 404, not a missing account.
        namespace_lifecycle(api, objects::namespace(obj).unwrap_or_default()).await?;
        super::serviceaccounts::admit(api, obj).await?;
        default_tolerations(obj, &api.default_toleration_seconds);
        super::limitranger::admit_create(api, r, obj).await?;
        super::priority::admit_create(api, r, obj).await?;
        super::runtimeclass::admit_create(api, obj).await?;
    }
    super::storageadmission::mutate_create(api, r, obj).await?;
    Box::pin(super::webhook::mutate(api, r, None, obj)).await
}

/// Mutating admission of an update (the built-in plugins mutate only
/// creates): the mutating webhooks. Returns their warnings.
///
/// # Errors
/// A webhook's denial or failure.
pub(crate) async fn mutate_update(
    api: &ApiServer,
    r: &Req,
    old: &Value,
    new: &mut Value,
) -> ApiResult<Vec<String>> {
    Box::pin(super::webhook::mutate(api, r, Some(old), new)).await
}

/// Admission of a delete: the built-in validating plugins, then the
/// mutating webhooks (asked, not allowed to patch) and the validating
/// ones.
///
/// # Errors
/// As [`validate`]; a webhook's denial or failure.
pub(crate) async fn admit_delete(api: &ApiServer, r: &Req, old: &Value) -> ApiResult<()> {
    validate(api, r, Some(old), None).await?;
    Box::pin(super::webhook::mutate_delete(api, r, old)).await?;
    Box::pin(super::policy::validate(api, r, Some(old), None)).await?;
    Box::pin(super::webhook::validate(api, r, Some(old), None)).await?;
    Ok(())
}

/// Validating admission of a create (`old` None), an update, or a delete
/// (`new` None), after the kind's validation.
///
/// # Errors
/// 403 (or 404 for a missing namespace) naming the plugin's reason.
pub(crate) async fn validate(
    api: &ApiServer,
    r: &Req,
    old: Option<&Value>,
    new: Option<&Value>,
) -> ApiResult<()> {
    if let Some(node) = r.node() {
        node::admit(node, &r.attrs, old, new).map_err(ApiError::forbidden)?;
    }
    super::limitranger::validate(api, r, old, new).await?;
    super::priority::validate(api, r, old, new).await?;
    if let (Some(old), Some(new)) = (old, new) {
        if r.is_resource("", "pods") {
            super::serviceaccounts::validate_update(old, new)?;
        }
        super::storageadmission::validate_update(api, r, old, new).await?;
    }
    let (Some(new), None) = (new, old) else {
        return Ok(());
    };
    super::crd::admit_create(&api.crds, r)?;
    if r.def.namespaced {
        namespace_lifecycle(api, objects::namespace(new).unwrap_or_default()).await?;
    }
    Ok(())
}

/// [`validate`], then the plugins that may also warn (PodSecurity,
/// [`super::podsecurity`], the ValidatingAdmissionPolicies, the
/// validating webhooks); returns their
/// warnings, which the verbs send as `Warning` headers with
/// fieldValidation's.
///
/// # Errors
/// As [`validate`]; 403 for a pod its namespace's Pod Security enforce
/// level refuses, 422 for bad Pod Security labels on a namespace.
pub(crate) async fn validate_warn(
    api: &ApiServer,
    r: &Req,
    old: Option<&Value>,
    new: Option<&Value>,
) -> ApiResult<Vec<String>> {
    validate(api, r, old, new).await?;
    let mut warnings = super::podsecurity::admit(api, r, old, new).await?;
    // Boxed: dynamic admission's futures are large, and kept off the
    // stack of every write.
    warnings.extend(Box::pin(super::policy::validate(api, r, old, new)).await?);
    warnings.extend(Box::pin(super::webhook::validate(api, r, old, new)).await?);
    // ResourceQuota last, as upstream: it charges the object, so every
    // other plugin must have let it through first.
    if let Some(new) = new {
        super::quota::admit(api, r, old, new).await?;
    }
    Ok(warnings)
}

/// Namespace lifecycle admission: the namespace must exist and not be
/// terminating for anything to be created in it.
async fn namespace_lifecycle(api: &ApiServer, ns: &str) -> ApiResult<()> {
    // A namespace seen active within the last second is taken as still
    // active (upstream's lifecycle admission reads an informer cache, which
    // lags the same way); deletes of namespaces clear the entry.
    if api.namespace_recently_active(ns) {
        return Ok(());
    }
    let key = format!("/registry/core/namespaces/{ns}");
    let kv = api.store.get(&key).await.map_err(ApiError::from)?;
    let Some(kv) = kv else {
        return Err(ApiError::not_found("", "namespaces", ns));
    };
    let v: Value = serde_json::from_slice(&kv.value).unwrap_or(Value::Null);
    if objects::has_deletion_timestamp(&v) || v["status"]["phase"] == "Terminating" {
        return Err(ApiError {
            details: Some(
                json!({"name": ns, "kind": "namespaces", "causes": [{"reason": "NamespaceTerminating", "message": format!("namespace {ns} is being terminated"), "field": "metadata.namespace"}]}),
            ),
            ..ApiError::forbidden(format!(
                "unable to create new content in namespace {ns} because it is being terminated"
            ))
        });
    }
    api.note_namespace_active(ns);
    Ok(())
}

/// The DefaultTolerationSeconds admission plugin's settings
/// (`--default-not-ready-toleration-seconds`,
/// `--default-unreachable-toleration-seconds`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DefaultTolerationSeconds {
    pub not_ready: i64,
    pub unreachable: i64,
}

impl Default for DefaultTolerationSeconds {
    /// Upstream's 300 s for both.
    fn default() -> Self {
        DefaultTolerationSeconds {
            not_ready: 300,
            unreachable: 300,
        }
    }
}

pub const TAINT_NOT_READY: &str = "node.kubernetes.io/not-ready";
pub const TAINT_UNREACHABLE: &str = "node.kubernetes.io/unreachable";

/// DefaultTolerationSeconds admission, on pod create: a pod that does not
/// already tolerate the not-ready / unreachable NoExecute taints gets a
/// toleration for each with `tolerationSeconds`, so that the node
/// lifecycle controller evicts it that long after its node fails.
/// A toleration with an empty key or effect counts as tolerating (as
/// upstream's plugin checks).
pub fn default_tolerations(obj: &mut Value, secs: &DefaultTolerationSeconds) {
    let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let tol = spec.entry("tolerations").or_insert_with(|| json!([]));
    if tol.is_null() {
        *tol = json!([]);
    }
    let Some(list) = tol.as_array_mut() else {
        return;
    };
    for (key, seconds) in [
        (TAINT_NOT_READY, secs.not_ready),
        (TAINT_UNREACHABLE, secs.unreachable),
    ] {
        let tolerated = list.iter().any(|t| {
            let k = t.get("key").and_then(Value::as_str).unwrap_or_default();
            let e = t.get("effect").and_then(Value::as_str).unwrap_or_default();
            (k == key || k.is_empty()) && (e == "NoExecute" || e.is_empty())
        });
        if !tolerated {
            list.push(json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": seconds}));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_tolerations_only_where_missing() {
        let secs = DefaultTolerationSeconds {
            not_ready: 7,
            unreachable: 9,
        };
        let mut pod = json!({"spec": {"tolerations": [
            {"key": TAINT_UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 2}
        ]}});
        default_tolerations(&mut pod, &secs);
        assert_eq!(
            pod["spec"]["tolerations"],
            json!([
                {"key": TAINT_UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 2},
                {"key": TAINT_NOT_READY, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 7},
            ])
        );
        // Tolerating everything (empty key, empty effect) needs nothing more.
        let mut all = json!({"spec": {"tolerations": [{"operator": "Exists"}]}});
        default_tolerations(&mut all, &secs);
        assert_eq!(all["spec"]["tolerations"].as_array().unwrap().len(), 1);
        let mut bare = json!({"spec": {}});
        default_tolerations(&mut bare, &secs);
        assert_eq!(bare["spec"]["tolerations"][1]["tolerationSeconds"], 9);
    }
}
