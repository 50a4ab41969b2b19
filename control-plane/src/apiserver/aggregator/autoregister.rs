//! The `Local` APIServices (upstream's autoregister and CRD registration
//! controllers): one for every group version this server serves, built
//! in (labelled `kube-aggregator.kubernetes.io/automanaged: onstart`) or
//! defined by a CustomResourceDefinition (`automanaged: true`, removed
//! with the definition); and the `extension-apiserver-authentication`
//! ConfigMap that tells aggregated servers whom to trust.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::{json, Value};

use super::{def, EXTRA_PREFIX, FRONT_PROXY_CLIENT, GROUP_HEADER, USER_HEADER};
use crate::apiserver::handlers::{create_value, delete_one, DeleteOptions};
use crate::apiserver::resources::{self, RESOURCES};
use crate::apiserver::{ApiServer, Req};
use crate::store::follow::follow;

const AUTOMANAGED: &str = "kube-aggregator.kubernetes.io/automanaged";

fn local(
    group: &str,
    version: &str,
    group_priority: i64,
    version_priority: i64,
    managed: &str,
) -> Value {
    json!({
        "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": format!("{version}.{group}"), "labels": {AUTOMANAGED: managed}},
        "spec": {"group": group, "version": version,
            "groupPriorityMinimum": group_priority, "versionPriority": version_priority},
    })
}

/// The built-in group versions' APIServices: core first, then the groups
/// in discovery order, each a step lower.
fn built_in() -> Vec<Value> {
    let mut out = vec![local("", "v1", 18000, 1, "onstart")];
    for (i, group) in resources::groups().into_iter().enumerate() {
        let priority = (17900 - 100 * i as i64).max(100);
        let mut versions: Vec<&str> = RESOURCES
            .iter()
            .filter(|r| r.group == group)
            .map(|r| r.version)
            .collect();
        versions.dedup();
        for v in versions {
            out.push(local(group, v, priority, 15, "onstart"));
        }
    }
    out
}

async fn create(api: &ApiServer, obj: Value) {
    let r = Req::system(def(), "create", None, None);
    match create_value(api, &r, obj).await {
        Ok(_) => {}
        Err(e) if e.code == 409 => {}
        Err(e) => tracing::warn!(error = %e.message, "autoregister: creating an APIService failed"),
    }
}

pub async fn run(api: Arc<ApiServer>) {
    authentication_config_map(&api).await;
    for obj in built_in() {
        create(&api, obj).await;
    }
    let crd_prefix = resources::lookup("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        .expect("definitions are served")
        .prefix(None);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<BTreeSet<(String, String)>>();
    let mut crds: std::collections::BTreeMap<String, Value> = Default::default();
    let watch = follow(
        api.store.as_ref(),
        &crd_prefix,
        api.shutdown.clone(),
        "apiservice registration",
        |change| {
            change.apply_to(&mut crds, |v| serde_json::from_slice::<Value>(v).ok());
            let wanted = crds
                .values()
                .flat_map(|crd| {
                    let group = crd["spec"]["group"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string();
                    crd["spec"]["versions"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter(|v| v["served"] == true)
                        .filter_map(|v| Some((group.clone(), v["name"].as_str()?.to_string())))
                        .collect::<Vec<_>>()
                })
                .collect();
            let _ = tx.send(wanted);
        },
    );
    let reconcile = async {
        while let Some(mut wanted) = rx.recv().await {
            // Only the latest set matters.
            while let Ok(newer) = rx.try_recv() {
                wanted = newer;
            }
            sync_custom(&api, &wanted).await;
        }
    };
    tokio::select! {
        _ = watch => {}
        _ = reconcile => {}
    }
}

/// Create the definitions' APIServices that are missing, delete those
/// whose group version is no longer served.
async fn sync_custom(api: &ApiServer, wanted: &BTreeSet<(String, String)>) {
    let Ok(list) = api.store.list(&def().prefix(None), None, 0, None).await else {
        return;
    };
    let mut have = BTreeSet::new();
    for kv in list.kvs {
        let Ok(obj) = serde_json::from_slice::<Value>(&kv.value) else {
            continue;
        };
        if obj["metadata"]["labels"][AUTOMANAGED] != "true" {
            continue;
        }
        let gv = (
            obj["spec"]["group"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            obj["spec"]["version"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        );
        if wanted.contains(&gv) {
            have.insert(gv);
            continue;
        }
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let r = Req::system(def(), "delete", None, Some(name));
        if let Err(e) = delete_one(api, &r, &DeleteOptions::default()).await {
            if e.code != 404 {
                tracing::warn!(error = %e.message, "autoregister: deleting an APIService failed");
            }
        }
    }
    for (group, version) in wanted.difference(&have) {
        create(api, local(group, version, 1000, 100, "true")).await;
    }
}

/// `kube-system/extension-apiserver-authentication`: the CA of client
/// certificates, and the front-proxy CA, allowed name and header names
/// of proxied requests (upstream's keys, their lists as JSON).
async fn authentication_config_map(api: &ApiServer) {
    let Some(front_proxy_ca) = api.aggregator.front_proxy_ca() else {
        return;
    };
    let client_ca = api.cluster_ca.get().cloned().unwrap_or_default();
    let cm = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "extension-apiserver-authentication", "namespace": "kube-system"},
        "data": {
            "client-ca-file": client_ca,
            "requestheader-client-ca-file": front_proxy_ca,
            "requestheader-allowed-names": json!([FRONT_PROXY_CLIENT]).to_string(),
            "requestheader-username-headers": json!([USER_HEADER]).to_string(),
            "requestheader-group-headers": json!([GROUP_HEADER]).to_string(),
            "requestheader-extra-headers-prefix": json!([EXTRA_PREFIX]).to_string(),
        },
    });
    let r = crate::apiserver::bootstrap::system_req("", "configmaps", Some("kube-system"));
    let key = "/registry/core/configmaps/kube-system/extension-apiserver-authentication";
    if let Err(e) = crate::apiserver::bootstrap::ensure_fields(api, &r, key, cm, &["data"]).await {
        tracing::warn!(error = %e.message, "writing extension-apiserver-authentication failed");
    }
}
