//! ResourceQuota controller against a real API server: `status.hard`
//! follows `spec.hard`, `status.used` counts what is there, deleted and
//! finished pods are given back (so that admission lets new ones in), and
//! a periodic resync repairs a status written wrong.

use crate::workloads_support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;
use serde_json::json;
use workloads_support::{until, Env};

fn pod(name: &str, cpu: &str) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"containers": [
        {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}]}}))
    .unwrap()
}

/// `status.used` of quota `name`, as `resource=amount` sorted, and
/// `status.hard` the same way.
async fn status(quotas: &Api<ResourceQuota>, name: &str) -> (String, String) {
    let q = quotas.get(name).await.unwrap();
    let show = |l: Option<
        &std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
    >| {
        l.into_iter()
            .flatten()
            .map(|(k, v)| format!("{k}={}", v.0))
            .collect::<Vec<_>>()
            .join(",")
    };
    let st = q.status.unwrap_or_default();
    (show(st.used.as_ref()), show(st.hard.as_ref()))
}

async fn wait_used(quotas: &Api<ResourceQuota>, name: &str, want: &str) {
    until(&format!("used {want}"), 30, || async {
        let (used, _) = status(quotas, name).await;
        if used == want {
            Ok(())
        } else {
            Err(used)
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn used_follows_creates_deletes_and_finished_pods() {
    let env = Env::start(&["resourcequota"]).await;
    let quotas: Api<ResourceQuota> = Api::namespaced(env.client.clone(), "default");
    let pp = PostParams::default();
    let q: ResourceQuota = serde_json::from_value(json!({"metadata": {"name": "q"},
        "spec": {"hard": {"pods": "3", "requests.cpu": "2", "count/configmaps": "5"}}}))
    .unwrap();
    quotas.create(&pp, &q).await.unwrap();
    // kube-root-ca.crt is the namespace's one ConfigMap.
    wait_used(&quotas, "q", "count/configmaps=1,pods=0,requests.cpu=0").await;
    assert_eq!(
        status(&quotas, "q").await.1,
        "count/configmaps=5,pods=3,requests.cpu=2"
    );
    for name in ["a", "b", "c"] {
        env.pods().create(&pp, &pod(name, "500m")).await.unwrap();
    }
    wait_used(&quotas, "q", "count/configmaps=1,pods=3,requests.cpu=1500m").await;
    let refused = env.pods().create(&pp, &pod("d", "500m")).await.unwrap_err();
    assert!(
        refused.to_string().contains("exceeded quota: q"),
        "{refused}"
    );

    env.force_delete("a").await;
    wait_used(&quotas, "q", "count/configmaps=1,pods=2,requests.cpu=1").await;
    env.set_finished("b", "Succeeded").await;
    wait_used(&quotas, "q", "count/configmaps=1,pods=1,requests.cpu=500m").await;
    // What they held is there for new pods.
    env.pods().create(&pp, &pod("d", "1")).await.unwrap();
    env.pods().create(&pp, &pod("e", "500m")).await.unwrap();
    wait_used(&quotas, "q", "count/configmaps=1,pods=3,requests.cpu=2").await;

    // A new hard limit shows in the status.
    let patch = json!({"spec": {"hard": {"pods": "10"}}});
    quotas
        .patch("q", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    until("status.hard follows spec.hard", 30, || async {
        let (_, hard) = status(&quotas, "q").await;
        if hard == "count/configmaps=5,pods=10,requests.cpu=2" {
            Ok(())
        } else {
            Err(hard)
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn resync_repairs_a_wrong_status() {
    let env = Env::start(&[]).await;
    let ctx = env.controller_ctx().await;
    let controller = tokio::spawn(async move {
        if let Err(e) =
            skiff_controllers::resourcequota::run_with(ctx, Duration::from_secs(2)).await
        {
            panic!("resourcequota controller: {e}");
        }
    });
    let quotas: Api<ResourceQuota> = Api::namespaced(env.client.clone(), "default");
    let q: ResourceQuota =
        serde_json::from_value(json!({"metadata": {"name": "q"}, "spec": {"hard": {"pods": "3"}}}))
            .unwrap();
    quotas.create(&PostParams::default(), &q).await.unwrap();
    env.pods()
        .create(&PostParams::default(), &pod("a", "100m"))
        .await
        .unwrap();
    wait_used(&quotas, "q", "pods=1").await;
    // A status written wrong (hard unchanged: no event would sync it).
    let patch = json!({"status": {"used": {"pods": "3"}}});
    quotas
        .patch_status("q", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    assert_eq!(status(&quotas, "q").await.0, "pods=3");
    wait_used(&quotas, "q", "pods=1").await;
    controller.abort();
}
