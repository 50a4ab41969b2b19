//! Objects every cluster has from its first start: the system namespaces,
//! the default RBAC policy, the `local-path` StorageClass and the system
//! PriorityClasses. Idempotent: existing objects are kept.

use std::sync::Arc;

use serde_json::{json, Value};

use super::handlers::create_value;
use super::resources::lookup;
use super::status::ApiResult;
use super::{ApiServer, Req};
use crate::auth::bootstrap;

pub const NAMESPACES: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];

pub(crate) fn system_req(group: &str, plural: &str, ns: Option<&str>) -> Req {
    let def = lookup(group, "v1", plural).expect("bootstrap kinds are served");
    Req::system(def, "create", ns.map(String::from), None)
}

async fn ensure(api: &ApiServer, r: &Req, obj: Value) -> ApiResult<()> {
    match create_value(api, r, obj).await {
        Ok(_) => Ok(()),
        Err(e) if e.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Create what is missing, and load the allocator with stored services.
///
/// # Errors
/// The store fails.
pub async fn run(api: &Arc<ApiServer>) -> ApiResult<()> {
    let ns_req = system_req("", "namespaces", None);
    for ns in NAMESPACES {
        ensure(
            api,
            &ns_req,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        )
        .await?;
    }
    for obj in bootstrap::cluster_roles() {
        let plural = if obj["kind"] == "ClusterRole" {
            "clusterroles"
        } else {
            "clusterrolebindings"
        };
        ensure(
            api,
            &system_req("rbac.authorization.k8s.io", plural, None),
            obj,
        )
        .await?;
    }
    ensure(
        api,
        &system_req("storage.k8s.io", "storageclasses", None),
        local_path_class(),
    )
    .await?;
    let pc_req = system_req("scheduling.k8s.io", "priorityclasses", None);
    for pc in super::strategy::priorityclass::system_classes() {
        ensure(api, &pc_req, pc).await?;
    }
    let list = api
        .store
        .list("/registry/core/services/", None, 0, None)
        .await?;
    for kv in list.kvs {
        if let Ok(v) = serde_json::from_slice::<Value>(&kv.value) {
            if let Some(ip) = v["spec"]["clusterIP"].as_str() {
                api.ips.mark(ip);
            }
            for p in v["spec"]["ports"].as_array().into_iter().flatten() {
                if let Some(np) = p["nodePort"].as_u64() {
                    api.ips.mark_port(np as u16);
                }
            }
        }
    }
    kubernetes_service(api).await?;
    Ok(())
}

/// The built-in provisioner's class, the default one: claims work out of
/// the box, each on the disk of the node its first pod runs on (hence
/// WaitForFirstConsumer). An administrator's edits (or removal of the
/// default mark) are kept across restarts: it is only created when
/// missing.
fn local_path_class() -> Value {
    use kube_util::storage::{DEFAULT_CLASS_ANNOTATION, LOCAL_PATH_CLASS, LOCAL_PATH_PROVISIONER};
    json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": LOCAL_PATH_CLASS, "annotations": {DEFAULT_CLASS_ANNOTATION: "true"}},
        "provisioner": LOCAL_PATH_PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "WaitForFirstConsumer",
        "allowVolumeExpansion": true,
    })
}

/// The `kubernetes` service in `default` (first ClusterIP of the range),
/// whose endpoints point at the live API servers ([`super::peers`]).
async fn kubernetes_service(api: &Arc<ApiServer>) -> ApiResult<()> {
    let Some((_, port)) = api.advertise else {
        return Ok(());
    };
    let svc = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "kubernetes", "namespace": "default", "labels": {"component": "apiserver", "provider": "kubernetes"}},
        "spec": {"clusterIP": api.ips.first().to_string(), "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": port}]},
    });
    // Only when missing: its ClusterIP is already marked taken otherwise.
    if api
        .store
        .get("/registry/core/services/default/kubernetes")
        .await?
        .is_none()
    {
        ensure(api, &system_req("", "services", Some("default")), svc).await?;
    }
    // Its endpoints: every live server's address.
    super::peers::renew(api).await
}

/// Create `obj` if it is missing; otherwise set `fields` of the stored
/// object to `obj`'s. The address or port may have changed since the last
/// start: the objects must point at this server again (upstream's
/// bootstrap controller reconciles them the same way). A concurrent
/// writer wins; the next start corrects it.
pub(crate) async fn ensure_fields(
    api: &ApiServer,
    r: &Req,
    key: &str,
    obj: Value,
    fields: &[&str],
) -> ApiResult<()> {
    let want: Vec<Value> = fields.iter().map(|f| obj[*f].clone()).collect();
    ensure(api, r, obj).await?;
    let Some(kv) = api.store.get(key).await? else {
        return Ok(());
    };
    let Ok(mut cur) = serde_json::from_slice::<Value>(&kv.value) else {
        return Ok(());
    };
    if fields.iter().zip(&want).all(|(f, w)| cur[*f] == *w) {
        return Ok(());
    }
    for (f, w) in fields.iter().zip(want) {
        cur[*f] = w;
    }
    let bytes = super::objects::encode_for_store(&cur);
    match api.store.update(key, bytes, kv.mod_revision).await {
        Ok(_) | Err(crate::store::Error::Conflict { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}
