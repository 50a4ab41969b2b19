//! Disruption controller against a real API server: a budget's status
//! for the pods of a 3-replica ReplicaSet (integer minAvailable,
//! percentages, maxUnavailable), its change with pod readiness, and an
//! eviction taking the last allowed disruption.

use crate::workloads_support;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{EvictParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use workloads_support::{until, Env};

const RS: &str = r#"
apiVersion: apps/v1
kind: ReplicaSet
metadata:
  name: web
spec:
  replicas: 3
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

/// (expectedPods, desiredHealthy, currentHealthy, disruptionsAllowed,
/// observedGeneration == generation, DisruptionAllowed reason).
type Seen = (i32, i32, i32, i32, bool, String);

async fn seen(env: &Env) -> Seen {
    let pdb = Api::<PodDisruptionBudget>::default_namespaced(env.client.clone())
        .get("budget")
        .await
        .expect("get pdb");
    let s = pdb.status.clone().unwrap_or_default();
    let reason = s
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "DisruptionAllowed")
        .map(|c| c.reason.clone())
        .unwrap_or_default();
    (
        s.expected_pods.unwrap_or(0),
        s.desired_healthy.unwrap_or(0),
        s.current_healthy.unwrap_or(0),
        s.disruptions_allowed.unwrap_or(0),
        s.observed_generation == pdb.metadata.generation,
        reason,
    )
}

async fn expect(env: &Env, what: &str, want: (i32, i32, i32, i32, &str)) {
    let want: Seen = (want.0, want.1, want.2, want.3, true, want.4.to_string());
    until(what, 20, || {
        let want = want.clone();
        async move {
            let got = seen(env).await;
            (got == want).then_some(()).ok_or(format!("{got:?}"))
        }
    })
    .await;
}

async fn set_bounds(env: &Env, spec: serde_json::Value) {
    Api::<PodDisruptionBudget>::default_namespaced(env.client.clone())
        .patch(
            "budget",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": spec})),
        )
        .await
        .expect("patch pdb");
}

async fn three_ready_pods(env: &Env) -> Vec<Pod> {
    env.kubectl_stdin(&["apply", "-f", "-"], RS);
    until("3 pods", 20, || async {
        let n = env.list_pods("app=web").await.len();
        (n == 3).then_some(()).ok_or(format!("{n} pods"))
    })
    .await;
    env.all_ready("app=web").await;
    env.list_pods("app=web").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_follows_bounds_and_readiness() {
    let env = Env::start(&["replicaset", "disruption"]).await;
    let pods = three_ready_pods(&env).await;
    env.kubectl(&[
        "create",
        "pdb",
        "budget",
        "--selector=app=web",
        "--min-available=2",
    ]);
    expect(&env, "minAvailable 2", (3, 2, 3, 1, "SufficientPods")).await;

    env.set_running(&pods[0].name_any(), false).await;
    expect(&env, "one pod not ready", (3, 2, 2, 0, "InsufficientPods")).await;
    env.set_running(&pods[0].name_any(), true).await;
    expect(&env, "ready again", (3, 2, 3, 1, "SufficientPods")).await;

    // Percentages count the ReplicaSet's replicas, rounding up.
    set_bounds(&env, json!({"minAvailable": "50%"})).await;
    expect(&env, "minAvailable 50%", (3, 2, 3, 1, "SufficientPods")).await;
    set_bounds(&env, json!({"minAvailable": "100%"})).await;
    expect(&env, "minAvailable 100%", (3, 3, 3, 0, "InsufficientPods")).await;
    set_bounds(&env, json!({"minAvailable": null, "maxUnavailable": "34%"})).await;
    expect(&env, "maxUnavailable 34%", (3, 1, 3, 2, "SufficientPods")).await;
    set_bounds(&env, json!({"maxUnavailable": 1})).await;
    expect(&env, "maxUnavailable 1", (3, 2, 3, 1, "SufficientPods")).await;

    let out = env.kubectl(&["get", "pdb", "budget"]);
    let row: Vec<&str> = out
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(row[..4], ["budget", "N/A", "1", "1"], "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eviction_takes_the_allowed_disruption() {
    let env = Env::start(&["replicaset", "disruption"]).await;
    let pods = three_ready_pods(&env).await;
    env.kubectl(&[
        "create",
        "pdb",
        "budget",
        "--selector=app=web",
        "--min-available=2",
    ]);
    expect(&env, "minAvailable 2", (3, 2, 3, 1, "SufficientPods")).await;

    let first = pods[0].name_any();
    env.pods()
        .evict(&first, &EvictParams::default())
        .await
        .expect("first eviction is within the budget");
    let evicted = env.pods().get_opt(&first).await.expect("get pod");
    assert!(
        evicted.is_none_or(|p| p.metadata.deletion_timestamp.is_some()),
        "evicted pod still running"
    );
    let kc =
        kube::config::Kubeconfig::read_from(env.server.admin_kubeconfig()).expect("kubeconfig");
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("kube config");
    // kube-rs retries 429s itself by default, for minutes.
    cfg.default_retry = false;
    let no_retry = kube::Client::try_from(cfg).expect("kube client");
    let second = Api::<Pod>::default_namespaced(no_retry)
        .evict(&pods[1].name_any(), &EvictParams::default())
        .await
        .expect_err("second eviction must wait for the replacement");
    match second {
        kube::Error::Api(s) => assert_eq!(
            (s.code, s.message.as_str()),
            (
                429,
                "Cannot evict pod as it would violate the pod's disruption budget."
            )
        ),
        e => panic!("unexpected error {e}"),
    }

    // The ReplicaSet's replacement becomes Ready: the budget allows one
    // disruption again.
    until("a replacement pod", 20, || async {
        let n = env.active_pods("app=web").await.len();
        (n == 3).then_some(()).ok_or(format!("{n} active pods"))
    })
    .await;
    env.all_ready("app=web").await;
    expect(&env, "replacement ready", (3, 2, 3, 1, "SufficientPods")).await;
}
