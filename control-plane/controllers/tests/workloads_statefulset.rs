//! StatefulSet controller against a real API server: pods with stable
//! names created in ordinal order (or all at once), removed in reverse,
//! their claims created first and kept; partitioned rolling updates
//! through ControllerRevisions, rollback the way kubectl does it, and the
//! API's refusals.

use crate::workloads_support;

use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use workloads_support::{is_ready, until, Env};

fn sts_json(replicas: i32, policy: &str, image: &str) -> serde_json::Value {
    json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": replicas,
            "serviceName": "web",
            "podManagementPolicy": policy,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "c", "image": image}]},
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
            }],
        }
    })
}

fn sets(env: &Env) -> Api<StatefulSet> {
    Api::default_namespaced(env.client.clone())
}

async fn create(env: &Env, v: serde_json::Value) -> Result<StatefulSet, kube::Error> {
    let s: StatefulSet = serde_json::from_value(v).expect("statefulset json");
    sets(env).create(&PostParams::default(), &s).await
}

/// As the scheduler and the agent: bind new pods (so deletions are
/// graceful, as on a node), finish deletions, and make every live pod
/// Running and Ready.
async fn agent(env: &Env) {
    for p in env.list_pods("app=web").await {
        if p.spec.as_ref().is_some_and(|s| s.node_name.is_none()) {
            env.bind(&p.name_any(), "n1").await;
        }
        if p.metadata.deletion_timestamp.is_some() {
            env.force_delete(&p.name_any()).await;
        } else if !is_ready(&p) && !is_finished(&p) {
            // The controller may replace the pod meanwhile: a miss is fine.
            let now = jiff::Timestamp::now()
                .strftime("%Y-%m-%dT%H:%M:%SZ")
                .to_string();
            let patch = json!({"status": {"phase": "Running", "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": now},
            ]}});
            let _ = env
                .pods()
                .patch_status(
                    &p.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await;
        }
    }
}

async fn names(env: &Env) -> Vec<String> {
    env.active_pods("app=web")
        .await
        .iter()
        .map(|p| p.name_any())
        .collect()
}

fn is_finished(p: &Pod) -> bool {
    matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Failed" | "Succeeded")
    )
}

fn hash_of(p: &Pod) -> String {
    p.labels()
        .get("controller-revision-hash")
        .cloned()
        .unwrap_or_default()
}

async fn status(env: &Env) -> k8s_openapi::api::apps::v1::StatefulSetStatus {
    sets(env)
        .get_status("web")
        .await
        .expect("get sts")
        .status
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_in_order_scales_down_in_reverse_and_keeps_claims() {
    let env = Env::start(&["statefulset"]).await;
    create(&env, sts_json(3, "OrderedReady", "nginx"))
        .await
        .expect("create");

    // One pod at a time: web-1 waits for web-0 to be Running and Ready.
    until("web-0 alone", 10, || async {
        (names(&env).await == ["web-0"])
            .then_some(())
            .ok_or(format!("{:?}", names(&env).await))
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(names(&env).await, ["web-0"], "web-1 must wait for web-0");
    env.set_running("web-0", true).await;
    until("web-1 after web-0", 10, || async {
        (names(&env).await == ["web-0", "web-1"])
            .then_some(())
            .ok_or(format!("{:?}", names(&env).await))
    })
    .await;
    until("three ready pods", 20, || async {
        agent(&env).await;
        let st = status(&env).await;
        (st.ready_replicas == Some(3))
            .then_some(())
            .ok_or(format!("{st:?}"))
    })
    .await;

    let pod = env.pods().get("web-1").await.expect("web-1");
    let labels = pod.labels();
    assert_eq!(labels["statefulset.kubernetes.io/pod-name"], "web-1");
    assert_eq!(labels["apps.kubernetes.io/pod-index"], "1");
    assert!(!hash_of(&pod).is_empty());
    let spec = pod.spec.as_ref().expect("spec");
    assert_eq!(spec.hostname.as_deref(), Some("web-1"));
    assert_eq!(spec.subdomain.as_deref(), Some("web"));
    let vol = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "data")
        .expect("data volume");
    assert_eq!(
        vol.persistent_volume_claim
            .as_ref()
            .map(|c| c.claim_name.as_str()),
        Some("data-web-1")
    );
    let claims: Api<PersistentVolumeClaim> = Api::default_namespaced(env.client.clone());
    for n in ["data-web-0", "data-web-1", "data-web-2"] {
        let c = claims.get(n).await.expect("claim");
        assert_eq!(c.labels()["app"], "web");
    }
    env.wait_event(
        "SuccessfulCreate",
        "create Pod web-0 in StatefulSet web successful",
    )
    .await;
    env.wait_event(
        "SuccessfulCreate",
        "create Claim data-web-0 Pod web-0 in StatefulSet web success",
    )
    .await;
    let st = status(&env).await;
    assert_eq!(st.current_revision, st.update_revision);
    assert_eq!(st.updated_replicas, Some(3));

    // Scale down: web-2 goes first, and web-1 only once web-2 is gone.
    sets(&env)
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await
        .expect("scale");
    until("web-2 terminating first", 10, || async {
        let all = env.list_pods("app=web").await;
        let terminating: Vec<String> = all
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_some())
            .map(|p| p.name_any())
            .collect();
        (terminating == ["web-2"])
            .then_some(())
            .ok_or(format!("{terminating:?}"))
    })
    .await;
    until("one pod left", 20, || async {
        agent(&env).await;
        let n = env.list_pods("app=web").await.len();
        (n == 1).then_some(()).ok_or(format!("{n} pods"))
    })
    .await;
    assert_eq!(names(&env).await, ["web-0"]);
    // Retain: the claims of the removed pods stay for a scale-up.
    claims.get("data-web-2").await.expect("claim kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_creates_all_at_once_and_recreates_deleted_pods() {
    let env = Env::start(&["statefulset"]).await;
    create(&env, sts_json(3, "Parallel", "nginx"))
        .await
        .expect("create");
    until("three pods without readiness", 10, || async {
        let n = names(&env).await;
        (n == ["web-0", "web-1", "web-2"])
            .then_some(())
            .ok_or(format!("{n:?}"))
    })
    .await;

    // A deleted pod comes back under the same name.
    let old_uid = env.pods().get("web-1").await.expect("web-1").uid();
    env.pods()
        .delete("web-1", &DeleteParams::default())
        .await
        .expect("delete");
    until("web-1 recreated", 20, || async {
        agent(&env).await;
        match env.pods().get_opt("web-1").await {
            Ok(Some(p)) if p.uid() != old_uid && p.metadata.deletion_timestamp.is_none() => Ok(()),
            other => Err(format!("{:?}", other.map(|p| p.map(|p| p.uid())))),
        }
    })
    .await;

    // A failed pod is replaced too.
    let old_uid = env.pods().get("web-2").await.expect("web-2").uid();
    env.set_finished("web-2", "Failed").await;
    until("web-2 replaced", 20, || async {
        agent(&env).await;
        match env.pods().get_opt("web-2").await {
            Ok(Some(p)) if p.uid() != old_uid => Ok(()),
            other => Err(format!("{:?}", other.map(|p| p.map(|p| p.uid())))),
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolls_down_to_the_partition_and_undoes_through_revisions() {
    let env = Env::start(&["statefulset"]).await;
    create(&env, sts_json(3, "OrderedReady", "nginx:1"))
        .await
        .expect("create");
    until("three ready pods", 30, || async {
        agent(&env).await;
        let st = status(&env).await;
        (st.ready_replicas == Some(3))
            .then_some(())
            .ok_or(format!("{st:?}"))
    })
    .await;
    let first = status(&env).await.update_revision.expect("revision");

    // Partition 2: only web-2 moves to the new template.
    sets(&env)
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {
                "updateStrategy": {"rollingUpdate": {"partition": 2}},
                "template": {"spec": {"containers": [{"name": "c", "image": "nginx:2"}]}},
            }})),
        )
        .await
        .expect("update");
    until("web-2 updated, the rest not", 30, || async {
        agent(&env).await;
        let st = status(&env).await;
        let pods = env.active_pods("app=web").await;
        let images: Vec<String> = pods
            .iter()
            .map(|p| {
                p.spec.as_ref().unwrap().containers[0]
                    .image
                    .clone()
                    .unwrap_or_default()
            })
            .collect();
        (images == ["nginx:1", "nginx:1", "nginx:2"]
            && st.updated_replicas == Some(1)
            && st.ready_replicas == Some(3))
        .then_some(())
        .ok_or(format!("{images:?} {st:?}"))
    })
    .await;
    let st = status(&env).await;
    assert_eq!(st.current_revision.as_deref(), Some(first.as_str()));
    assert_ne!(st.update_revision.as_deref(), Some(first.as_str()));
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let web0 = env.pods().get("web-0").await.expect("web-0");
    assert_eq!(
        web0.spec.unwrap().containers[0].image.as_deref(),
        Some("nginx:1"),
        "below the partition nothing moves"
    );

    // Partition 0: the rest follows, and the update revision is current.
    sets(&env)
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"updateStrategy": {"rollingUpdate": {"partition": 0}}}})),
        )
        .await
        .expect("partition 0");
    until("rollout complete", 30, || async {
        agent(&env).await;
        let st = status(&env).await;
        (st.updated_replicas == Some(3)
            && st.ready_replicas == Some(3)
            && st.current_revision == st.update_revision)
            .then_some(())
            .ok_or(format!("{st:?}"))
    })
    .await;

    // History: two revisions; undo sends the old revision's data back as
    // a strategic merge patch, as kubectl rollout undo does.
    let revs: Api<ControllerRevision> = Api::default_namespaced(env.client.clone());
    let list = revs
        .list(&ListParams::default().labels("app=web"))
        .await
        .expect("revisions")
        .items;
    assert_eq!(
        list.len(),
        2,
        "{:?}",
        list.iter().map(|r| r.name_any()).collect::<Vec<_>>()
    );
    let old = revs.get(&first).await.expect("first revision");
    assert_eq!(old.revision, Some(1));
    sets(&env)
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Strategic(old.data.0.clone()),
        )
        .await
        .expect("undo");
    until("back on the first revision", 40, || async {
        agent(&env).await;
        let st = status(&env).await;
        let images = env.active_images("app=web").await;
        (st.update_revision.as_deref() == Some(first.as_str())
            && st.current_revision == st.update_revision
            && images == ["nginx:1", "nginx:1", "nginx:1"])
        .then_some(())
        .ok_or(format!("{images:?} {st:?}"))
    })
    .await;
    // The first revision was reused and renumbered, not copied.
    let reused = revs.get(&first).await.expect("first revision");
    assert_eq!(reused.revision, Some(3));
    let history = env.kubectl(&["rollout", "history", "statefulset/web"]);
    assert!(
        history.contains("2 ") && history.contains("3 "),
        "{history}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_bad_input() {
    let env = Env::start(&[]).await;
    let mut bad = sts_json(1, "OrderedReady", "nginx");
    bad["spec"]["updateStrategy"] =
        json!({"type": "RollingUpdate", "rollingUpdate": {"partition": -1}});
    match create(&env, bad).await {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 422);
            assert!(
                e.message
                    .contains("spec.updateStrategy.rollingUpdate.partition"),
                "{}",
                e.message
            );
        }
        other => panic!("expected 422, got {other:?}"),
    }
    create(&env, sts_json(1, "OrderedReady", "nginx"))
        .await
        .expect("create");
    let err = sets(&env)
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"serviceName": "other"}})),
        )
        .await
        .expect_err("serviceName is fixed");
    match err {
        kube::Error::Api(e) => {
            assert_eq!(e.code, 422);
            assert!(
                e.message
                    .contains("updates to statefulset spec for fields other than"),
                "{}",
                e.message
            );
        }
        e => panic!("expected 422, got {e}"),
    }
    // Replicas may change, through the scale subresource too.
    let out = env.kubectl(&["scale", "statefulset/web", "--replicas=2"]);
    assert!(out.contains("scaled"), "{out}");
    let s = sets(&env).get("web").await.expect("get");
    assert_eq!(s.spec.replicas, Some(2));
    let table = env.kubectl(&["get", "sts", "web"]);
    assert!(table.contains("READY") && table.contains("0/2"), "{table}");
}
