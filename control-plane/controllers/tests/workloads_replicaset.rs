//! ReplicaSet controller against a real API server: pods from the
//! template with events, status from pod readiness, upstream's choice of
//! victims on scale-down, adoption and release, and a restart.

use crate::workloads_support;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use workloads_support::{until, Env};

const RS: &str = r#"
apiVersion: apps/v1
kind: ReplicaSet
metadata:
  name: web
spec:
  replicas: REPLICAS
  minReadySeconds: 1
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: c
        image: busybox:1
"#;

fn rs_yaml(replicas: i32) -> String {
    RS.replace("REPLICAS", &replicas.to_string())
}

async fn rs_status(env: &Env) -> (i32, i32, i32, i64) {
    let rs = Api::<ReplicaSet>::default_namespaced(env.client.clone())
        .get("web")
        .await
        .expect("get rs");
    let s = rs.status.unwrap_or_default();
    (
        s.replicas,
        s.ready_replicas.unwrap_or(0),
        s.available_replicas.unwrap_or(0),
        s.observed_generation.unwrap_or(0),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_counts_and_scales_down_the_most_expendable_first() {
    let mut env = Env::start(&["replicaset"]).await;
    env.kubectl_stdin(&["apply", "-f", "-"], &rs_yaml(3));
    until("3 pods", 20, || async {
        let n = env.list_pods("app=web").await.len();
        (n == 3).then_some(()).ok_or(format!("{n} pods"))
    })
    .await;
    let rs = Api::<ReplicaSet>::default_namespaced(env.client.clone())
        .get("web")
        .await
        .unwrap();
    let pods = env.list_pods("app=web").await;
    for p in &pods {
        let name = p.name_any();
        assert!(name.starts_with("web-") && name.len() == 9, "{name}");
        let owner = &p.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(owner.uid, rs.uid().unwrap());
        assert_eq!(
            (
                owner.kind.as_str(),
                owner.controller,
                owner.block_owner_deletion
            ),
            ("ReplicaSet", Some(true), Some(true))
        );
    }
    for p in &pods {
        env.wait_event(
            "SuccessfulCreate",
            &format!("Created pod: {}", p.name_any()),
        )
        .await;
    }

    // keep: scheduled, running, ready. unscheduled: ready but not bound.
    // unready: scheduled and running but not ready.
    let (keep, unscheduled, unready) = (pods[0].name_any(), pods[1].name_any(), pods[2].name_any());
    env.bind(&keep, "n1").await;
    env.bind(&unready, "n1").await;
    env.set_running(&keep, true).await;
    env.set_running(&unscheduled, true).await;
    env.set_running(&unready, false).await;
    until(
        "ready and (after minReadySeconds) available counts",
        20,
        || async {
            let s = rs_status(&env).await;
            (s == (3, 2, 2, 1)).then_some(()).ok_or(format!("{s:?}"))
        },
    )
    .await;

    env.kubectl(&["scale", "rs", "web", "--replicas=1"]);
    until("the scheduled ready pod to be the one kept", 20, || async {
        let active: Vec<String> = env
            .active_pods("app=web")
            .await
            .iter()
            .map(|p| p.name_any())
            .collect();
        (active == [keep.clone()])
            .then_some(())
            .ok_or(format!("{active:?}"))
    })
    .await;
    // The unscheduled pod went at once; the bound one waits for its node.
    let gone = env.pods().get_opt(&unscheduled).await.unwrap();
    assert!(gone.is_none(), "unscheduled pod still there");
    let terminating = env.pods().get(&unready).await.unwrap();
    assert!(terminating.metadata.deletion_timestamp.is_some());
    for n in [&unscheduled, &unready] {
        env.wait_event("SuccessfulDelete", &format!("Deleted pod: {n}"))
            .await;
    }
    env.force_delete(&unready).await;
    until("status after scale-down", 20, || async {
        let s = rs_status(&env).await;
        (s == (1, 1, 1, 2)).then_some(()).ok_or(format!("{s:?}"))
    })
    .await;

    // A restarted controller picks up where it was, without doubling up.
    env.stop_controllers().await;
    env.start_controllers(&["replicaset"]).await;
    env.kubectl(&["scale", "rs", "web", "--replicas=4"]);
    until("4 pods after a restart", 20, || async {
        let n = env.active_pods("app=web").await.len();
        let s = rs_status(&env).await;
        (n == 4 && s.0 == 4)
            .then_some(())
            .ok_or(format!("{n} pods, status {s:?}"))
    })
    .await;
    assert_eq!(env.list_pods("app=web").await.len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopts_orphans_and_releases_pods_that_stop_matching() {
    let env = Env::start(&["replicaset"]).await;
    let orphan: Pod = serde_json::from_value(json!({
        "metadata": {"name": "orphan", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "busybox:1"}]},
    }))
    .unwrap();
    env.pods()
        .create(&PostParams::default(), &orphan)
        .await
        .unwrap();
    env.kubectl_stdin(&["apply", "-f", "-"], &rs_yaml(2));
    let rs = Api::<ReplicaSet>::default_namespaced(env.client.clone())
        .get("web")
        .await
        .unwrap();
    until("the orphan adopted and one pod created", 20, || async {
        let pods = env.list_pods("app=web").await;
        let adopted = pods.iter().any(|p| {
            p.name_any() == "orphan"
                && p.owner_references()
                    .iter()
                    .any(|o| o.uid == rs.uid().unwrap() && o.controller == Some(true))
        });
        (adopted && pods.len() == 2)
            .then_some(())
            .ok_or(format!("{} pods, adopted: {adopted}", pods.len()))
    })
    .await;

    // The orphan stops matching: released, and replaced.
    let relabel = json!({"metadata": {"labels": {"app": "other"}}});
    env.pods()
        .patch("orphan", &PatchParams::default(), &Patch::Merge(&relabel))
        .await
        .unwrap();
    until("the pod released and replaced", 20, || async {
        let released = env.pods().get("orphan").await.unwrap();
        let refs = released.owner_references().len();
        let n = env.list_pods("app=web").await.len();
        (refs == 0 && n == 2)
            .then_some(())
            .ok_or(format!("{refs} owner refs, {n} pods"))
    })
    .await;
}
