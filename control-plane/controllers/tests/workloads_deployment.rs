//! Deployment controller (with the ReplicaSet controller) against a real
//! API server, driven by real kubectl: apply, scale, rolling updates that
//! stay within maxSurge / maxUnavailable at every observed moment, rollout
//! status / undo / restart / history, Recreate, pause and the progress
//! deadline.

use crate::workloads_support;

use std::sync::{Arc, Mutex};

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use skiff_control_plane::testkit::fails;
use workloads_support::{is_ready, until, Env};

fn deployment_yaml(replicas: i32, strategy: &str, extra_spec: &str) -> String {
    format!(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: {replicas}
  {extra_spec}
  strategy:
    {strategy}
  selector:
    matchLabels: {{app: web}}
  template:
    metadata:
      labels: {{app: web}}
    spec:
      containers:
      - name: c
        image: busybox:1
"#
    )
}

const ROLLING: &str = "type: RollingUpdate\n    rollingUpdate: {maxSurge: 1, maxUnavailable: 1}";

async fn deployment(env: &Env) -> Deployment {
    Api::<Deployment>::default_namespaced(env.client.clone())
        .get("web")
        .await
        .expect("get deployment")
}

async fn replicasets(env: &Env) -> Vec<ReplicaSet> {
    let mut v = Api::<ReplicaSet>::default_namespaced(env.client.clone())
        .list(&ListParams::default())
        .await
        .expect("list replica sets")
        .items;
    v.sort_by_key(revision);
    v
}

fn revision(rs: &ReplicaSet) -> i64 {
    rs.annotations()
        .get("deployment.kubernetes.io/revision")
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

fn image(t: Option<&k8s_openapi::api::core::v1::PodSpec>) -> String {
    t.and_then(|s| s.containers.first())
        .and_then(|c| c.image.clone())
        .unwrap_or_default()
}

/// Status counters: (replicas, updated, ready, available).
fn counts(d: &Deployment) -> (i32, i32, i32, i32) {
    let s = d.status.clone().unwrap_or_default();
    (
        s.replicas.unwrap_or(0),
        s.updated_replicas.unwrap_or(0),
        s.ready_replicas.unwrap_or(0),
        s.available_replicas.unwrap_or(0),
    )
}

fn condition(d: &Deployment, type_: &str) -> (String, String) {
    d.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_.as_deref() == Some(type_)))
        .map(|c| {
            (
                c.status.clone().unwrap_or_default(),
                c.reason.clone().unwrap_or_default(),
            )
        })
        .unwrap_or_default()
}

/// Play the node agents until the rollout is complete: each poll makes one
/// more pod Running and Ready.
async fn drive_rollout(env: &Env, replicas: i32) {
    until("the rollout to complete", 60, || async {
        if let Some(p) = env
            .active_pods("app=web")
            .await
            .iter()
            .find(|p| !is_ready(p))
        {
            env.set_running(&p.name_any(), true).await;
        }
        let d = deployment(env).await;
        let c = counts(&d);
        let observed =
            d.status.as_ref().and_then(|s| s.observed_generation) >= d.metadata.generation;
        (observed && c == (replicas, replicas, replicas, replicas))
            .then_some(())
            .ok_or(format!("{c:?}"))
    })
    .await;
}

/// Watches the pods and records every moment at which more than `max`
/// pods were active or fewer than `min_ready` active pods were ready.
struct Bounds {
    violations: Arc<Mutex<Vec<String>>>,
    seen: Arc<Mutex<usize>>,
    task: tokio::task::JoinHandle<()>,
}

impl Bounds {
    fn watch(env: &Env, max: usize, min_ready: usize) -> Bounds {
        let violations = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::new(Mutex::new(0));
        let (v, n) = (violations.clone(), seen.clone());
        let task = env.watch_pods("app=web", move |active| {
            let ready = active.iter().filter(|p| is_ready(p)).count();
            *n.lock().unwrap() += 1;
            if active.len() > max || ready < min_ready {
                v.lock()
                    .unwrap()
                    .push(format!("{} active, {ready} ready", active.len()));
            }
        });
        Bounds {
            violations,
            seen,
            task,
        }
    }

    fn check(self) {
        self.task.abort();
        let v = self.violations.lock().unwrap().clone();
        assert!(v.is_empty(), "rollout left its bounds: {v:?}");
        assert!(*self.seen.lock().unwrap() > 1, "the pod watch saw nothing");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_scale_and_rollout_status() {
    let env = Env::start(&["deployment", "replicaset"]).await;
    env.kubectl_stdin(&["apply", "-f", "-"], &deployment_yaml(2, ROLLING, ""));
    until("a replica set with 2 pods", 20, || async {
        let n = env.list_pods("app=web").await.len();
        (n == 2).then_some(()).ok_or(format!("{n} pods"))
    })
    .await;
    let d = deployment(&env).await;
    let rss = replicasets(&env).await;
    assert_eq!(rss.len(), 1);
    let rs = &rss[0];
    let hash = rs
        .labels()
        .get("pod-template-hash")
        .cloned()
        .expect("hash label");
    assert_eq!(rs.name_any(), format!("web-{hash}"));
    assert_eq!(
        rs.spec
            .selector
            .match_labels
            .as_ref()
            .unwrap()
            .get("pod-template-hash"),
        Some(&hash)
    );
    let owner = &rs.owner_references()[0];
    assert_eq!(
        (
            owner.uid.as_str(),
            owner.controller,
            owner.block_owner_deletion
        ),
        (d.uid().unwrap().as_str(), Some(true), Some(true))
    );
    let ann = rs.annotations();
    assert_eq!(
        ann.get("deployment.kubernetes.io/revision")
            .map(String::as_str),
        Some("1")
    );
    assert_eq!(
        ann.get("deployment.kubernetes.io/desired-replicas")
            .map(String::as_str),
        Some("2")
    );
    assert_eq!(
        ann.get("deployment.kubernetes.io/max-replicas")
            .map(String::as_str),
        Some("3")
    );
    until("the revision on the deployment", 10, || async {
        let d = deployment(&env).await;
        let rev = d
            .annotations()
            .get("deployment.kubernetes.io/revision")
            .cloned();
        (rev.as_deref() == Some("1"))
            .then_some(())
            .ok_or(format!("{rev:?}"))
    })
    .await;
    env.wait_event(
        "ScalingReplicaSet",
        &format!("Scaled up replica set web-{hash} from 0 to 2"),
    )
    .await;

    drive_rollout(&env, 2).await;
    let out = env.kubectl(&["rollout", "status", "deployment/web", "--timeout=30s"]);
    assert!(out.contains("successfully rolled out"), "{out}");
    let d = deployment(&env).await;
    assert_eq!(
        condition(&d, "Available"),
        ("True".into(), "MinimumReplicasAvailable".into())
    );
    assert_eq!(
        condition(&d, "Progressing"),
        ("True".into(), "NewReplicaSetAvailable".into())
    );

    env.kubectl(&["scale", "deployment/web", "--replicas=6"]);
    drive_rollout(&env, 6).await;
    assert_eq!(env.active_pods("app=web").await.len(), 6);
    env.kubectl(&["scale", "deployment/web", "--replicas=1"]);
    drive_rollout(&env, 1).await;
    until("1 pod left", 20, || async {
        let n = env.active_pods("app=web").await.len();
        (n == 1).then_some(()).ok_or(format!("{n} pods"))
    })
    .await;
    for msg in [
        format!("Scaled up replica set web-{hash} from 2 to 6"),
        format!("Scaled down replica set web-{hash} from 6 to 1"),
    ] {
        env.wait_event("ScalingReplicaSet", &msg).await;
    }
    assert_eq!(
        replicasets(&env).await.len(),
        1,
        "scaling made no new revision"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_update_undo_and_restart_stay_within_bounds() {
    let env = Env::start(&["deployment", "replicaset"]).await;
    env.kubectl_stdin(
        &["apply", "-f", "-"],
        &deployment_yaml(4, ROLLING, "revisionHistoryLimit: 1"),
    );
    drive_rollout(&env, 4).await;

    // replicas 4, maxSurge 1, maxUnavailable 1: at most 5 pods, at least 3
    // ready, at every moment the pod watch shows.
    let bounds = Bounds::watch(&env, 5, 3);
    env.kubectl(&["set", "image", "deployment/web", "c=busybox:2"]);
    drive_rollout(&env, 4).await;
    let out = env.kubectl(&["rollout", "status", "deployment/web", "--timeout=30s"]);
    assert!(out.contains("successfully rolled out"), "{out}");
    let rss = replicasets(&env).await;
    assert_eq!(rss.iter().map(revision).collect::<Vec<_>>(), [1, 2]);
    assert_eq!(
        rss.iter()
            .map(|rs| rs.spec.replicas.unwrap())
            .collect::<Vec<_>>(),
        [0, 4]
    );
    assert_eq!(
        image(rss[1].spec.template.as_ref().and_then(|t| t.spec.as_ref())),
        "busybox:2"
    );

    // Undo: kubectl copies revision 1's template back; its ReplicaSet is
    // reused as revision 3.
    env.kubectl(&["rollout", "undo", "deployment/web"]);
    drive_rollout(&env, 4).await;
    let d = deployment(&env).await;
    assert_eq!(image(d.spec.template.spec.as_ref()), "busybox:1");
    let rss = replicasets(&env).await;
    assert_eq!(rss.iter().map(revision).collect::<Vec<_>>(), [2, 3]);
    assert_eq!(
        rss[1]
            .annotations()
            .get("deployment.kubernetes.io/revision-history")
            .map(String::as_str),
        Some("1")
    );
    for p in env.active_pods("app=web").await {
        assert_eq!(image(p.spec.as_ref()), "busybox:1");
    }
    let history = env.kubectl(&["rollout", "history", "deployment/web"]);
    assert!(history.contains('2') && history.contains('3'), "{history}");

    // Restart: a new template annotation, so a new ReplicaSet; the history
    // limit of 1 removes revision 2.
    env.kubectl(&["rollout", "restart", "deployment/web"]);
    drive_rollout(&env, 4).await;
    until("old revisions beyond the limit removed", 20, || async {
        let revs: Vec<i64> = replicasets(&env).await.iter().map(revision).collect();
        (revs == [3, 4]).then_some(()).ok_or(format!("{revs:?}"))
    })
    .await;
    bounds.check();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recreate_stops_old_pods_before_starting_new_ones() {
    let env = Env::start(&["deployment", "replicaset"]).await;
    env.kubectl_stdin(
        &["apply", "-f", "-"],
        &deployment_yaml(3, "type: Recreate", ""),
    );
    drive_rollout(&env, 3).await;
    let old_hash = replicasets(&env).await[0].labels()["pod-template-hash"].clone();

    // Record every moment old and new pods were both active.
    let mixed = Arc::new(Mutex::new(Vec::new()));
    let m = mixed.clone();
    let watch = env.watch_pods("app=web", move |live| {
        let hashes: std::collections::BTreeSet<String> = live
            .iter()
            .map(|p| p.labels()["pod-template-hash"].clone())
            .collect();
        if hashes.len() > 1 {
            m.lock().unwrap().push(format!("{hashes:?}"));
        }
    });
    env.kubectl(&["set", "image", "deployment/web", "c=busybox:2"]);
    drive_rollout(&env, 3).await;
    watch.abort();
    assert!(
        mixed.lock().unwrap().is_empty(),
        "old and new pods ran together: {:?}",
        mixed.lock().unwrap()
    );
    for p in env.active_pods("app=web").await {
        assert_ne!(p.labels()["pod-template-hash"], old_hash);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_resume_and_progress_deadline() {
    let env = Env::start(&["deployment", "replicaset"]).await;
    env.kubectl_stdin(
        &["apply", "-f", "-"],
        &deployment_yaml(2, ROLLING, "progressDeadlineSeconds: 3"),
    );
    drive_rollout(&env, 2).await;

    env.kubectl(&["rollout", "pause", "deployment/web"]);
    env.kubectl(&["set", "image", "deployment/web", "c=busybox:2"]);
    until("the paused condition", 20, || async {
        let c = condition(&deployment(&env).await, "Progressing");
        (c == ("Unknown".into(), "DeploymentPaused".into()))
            .then_some(())
            .ok_or(format!("{c:?}"))
    })
    .await;
    assert_eq!(
        replicasets(&env).await.len(),
        1,
        "a paused deployment rolled out"
    );

    // Resumed, the new pods never become ready: the deadline passes.
    env.kubectl(&["rollout", "resume", "deployment/web"]);
    until("the progress deadline to be exceeded", 30, || async {
        let c = condition(&deployment(&env).await, "Progressing");
        (c == ("False".into(), "ProgressDeadlineExceeded".into()))
            .then_some(())
            .ok_or(format!("{c:?}"))
    })
    .await;
    assert_eq!(replicasets(&env).await.len(), 2);
    let err = fails(
        env.server
            .kubectl(&["rollout", "status", "deployment/web", "--timeout=20s"]),
    );
    assert!(err.contains("exceeded its progress deadline"), "{err}");
}
