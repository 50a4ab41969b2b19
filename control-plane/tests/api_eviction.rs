//! PodDisruptionBudgets and `pods/eviction` against the API alone (no
//! disruption controller: the tests write the budget's status as it
//! would): validation, the `kubectl get pdb` columns, an eviction within
//! the budget (DisruptionTarget condition, disruptedPods), the 429 that
//! `kubectl drain` retries, 404 for a missing pod, dry runs, a budget
//! not yet observed, and two budgets for one pod.

use crate::api;

use api::{fails, ok, raw, TestServer};
use serde_json::{json, Value};

const PDBS: &str = "/apis/policy/v1/namespaces/default/poddisruptionbudgets";

/// A client that answers 429s as they come: kube-rs retries them by
/// default (with backoff growing to minutes), `kubectl drain` does its own.
async fn no_retry_client(s: &TestServer) -> kube::Client {
    let _ = s.client().await;
    let kc = kube::config::Kubeconfig::read_from(s.admin_kubeconfig()).expect("read kubeconfig");
    let mut cfg =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .expect("kube config");
    cfg.default_retry = false;
    kube::Client::try_from(cfg).expect("kube client")
}

async fn ready_pod(s: &TestServer, c: &kube::Client, name: &str) {
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {"terminationGracePeriodSeconds": 30, "nodeName": "n1",
                 "containers": [{"name": "c", "image": "busybox"}]}});
    ok(s.kubectl_stdin(&["apply", "-f", "-"], &pod.to_string()));
    let status = json!({"status": {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True"}]}});
    let path = format!("/api/v1/namespaces/default/pods/{name}/status");
    let (code, _, v) = raw(
        c,
        "PATCH",
        &path,
        "application/merge-patch+json",
        status.to_string().into(),
    )
    .await;
    assert_eq!(code, 200, "{v}");
}

/// The budget's status, as the disruption controller would write it.
async fn set_budget_status(c: &kube::Client, name: &str, allowed: i64, observed: i64) {
    let status = json!({"status": {"observedGeneration": observed, "disruptionsAllowed": allowed,
        "currentHealthy": 2, "desiredHealthy": 1, "expectedPods": 2}});
    let path = format!("{PDBS}/{name}/status");
    let (code, _, v) = raw(
        c,
        "PATCH",
        &path,
        "application/merge-patch+json",
        status.to_string().into(),
    )
    .await;
    assert_eq!(code, 200, "{v}");
}

async fn evict(c: &kube::Client, pod: &str, query: &str) -> (u16, Value) {
    let body = json!({"apiVersion": "policy/v1", "kind": "Eviction",
                      "metadata": {"name": pod, "namespace": "default"}});
    let path = format!("/api/v1/namespaces/default/pods/{pod}/eviction{query}");
    let (code, _, v) = raw(
        c,
        "POST",
        &path,
        "application/json",
        body.to_string().into(),
    )
    .await;
    (code, v)
}

async fn get(c: &kube::Client, path: &str) -> Value {
    let (code, _, v) = raw(c, "GET", path, "application/json", vec![]).await;
    assert_eq!(code, 200, "{v}");
    v
}

fn budget_yaml(name: &str, bounds: &str) -> String {
    format!(
        "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {{name: {name}}}\n\
         spec:\n  selector: {{matchLabels: {{app: web}}}}\n  {bounds}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgets_are_validated_and_printed() {
    let s = TestServer::start().await;
    let err = fails(s.kubectl_stdin(
        &["apply", "-f", "-"],
        &budget_yaml("both", "minAvailable: 1\n  maxUnavailable: 1"),
    ));
    assert!(
        err.contains("minAvailable and maxUnavailable cannot be both set"),
        "{err}"
    );
    let err = fails(s.kubectl_stdin(
        &["apply", "-f", "-"],
        &budget_yaml("pct", "maxUnavailable: 120%"),
    ));
    assert!(
        err.contains("spec.maxUnavailable: Invalid value: \"120%\": must not be greater than 100%"),
        "{err}"
    );
    let err = fails(s.kubectl_stdin(
        &["apply", "-f", "-"],
        &budget_yaml("neg", "minAvailable: -1"),
    ));
    assert!(err.contains("spec.minAvailable"), "{err}");
    let err = fails(s.kubectl_stdin(
        &["apply", "-f", "-"],
        &budget_yaml("word", "minAvailable: half"),
    ));
    assert!(err.contains("a valid percent string"), "{err}");

    ok(s.kubectl(&[
        "create",
        "pdb",
        "web",
        "--selector=app=web",
        "--min-available=50%",
    ]));
    let out = ok(s.kubectl(&["get", "pdb"]));
    let mut lines = out.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split("  ")
        .filter(|c| !c.is_empty())
        .map(str::trim)
        .collect();
    assert_eq!(
        header,
        [
            "NAME",
            "MIN AVAILABLE",
            "MAX UNAVAILABLE",
            "ALLOWED DISRUPTIONS",
            "AGE"
        ],
        "{out}"
    );
    let row: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(row[..4], ["web", "50%", "N/A", "0"], "{out}");

    // A spec change is a new generation for the controller to observe.
    let c = s.client().await;
    let before = get(&c, &format!("{PDBS}/web")).await["metadata"]["generation"].as_i64();
    ok(s.kubectl(&[
        "patch",
        "pdb",
        "web",
        "--type=merge",
        "-p",
        r#"{"spec":{"minAvailable":2}}"#,
    ]));
    let after = get(&c, &format!("{PDBS}/web")).await["metadata"]["generation"].as_i64();
    assert_eq!(after, before.map(|g| g + 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evictions_respect_the_budget() {
    let s = TestServer::start().await;
    let c = no_retry_client(&s).await;
    for p in ["p1", "p2", "p3"] {
        ready_pod(&s, &c, p).await;
    }

    // No budget yet: a missing pod is a 404.
    let (code, v) = evict(&c, "nope", "").await;
    assert_eq!((code, v["reason"].as_str()), (404, Some("NotFound")), "{v}");

    ok(s.kubectl_stdin(
        &["apply", "-f", "-"],
        &budget_yaml("web", "minAvailable: 1"),
    ));
    // Not yet observed by the controller: retry later.
    let (code, v) = evict(&c, "p1", "").await;
    assert_eq!(code, 429, "{v}");
    assert_eq!(
        v["details"]["causes"][0]["message"],
        "The disruption budget web is still being processed by the server."
    );

    set_budget_status(&c, "web", 1, 1).await;
    // A dry run changes nothing.
    let (code, v) = evict(&c, "p1", "?dryRun=All").await;
    assert_eq!(code, 201, "{v}");
    let p1 = get(&c, "/api/v1/namespaces/default/pods/p1").await;
    assert!(p1["metadata"]["deletionTimestamp"].is_null(), "{p1}");
    let pdb = get(&c, &format!("{PDBS}/web")).await;
    assert_eq!(pdb["status"]["disruptionsAllowed"], 1, "{pdb}");

    let (code, v) = evict(&c, "p1", "").await;
    assert_eq!(code, 201, "{v}");
    let p1 = get(&c, "/api/v1/namespaces/default/pods/p1").await;
    assert!(!p1["metadata"]["deletionTimestamp"].is_null(), "{p1}");
    let target = p1["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "DisruptionTarget")
        .cloned()
        .unwrap_or_default();
    assert_eq!(target["status"], "True", "{p1}");
    assert_eq!(target["reason"], "EvictionByEvictionAPI", "{p1}");
    let pdb = get(&c, &format!("{PDBS}/web")).await;
    assert_eq!(pdb["status"]["disruptionsAllowed"], 0, "{pdb}");
    assert!(pdb["status"]["disruptedPods"]["p1"].is_string(), "{pdb}");

    let (code, v) = evict(&c, "p2", "").await;
    assert_eq!(code, 429, "{v}");
    assert_eq!(v["reason"], "TooManyRequests");
    assert_eq!(
        v["message"],
        "Cannot evict pod as it would violate the pod's disruption budget."
    );
    assert_eq!(v["details"]["causes"][0]["reason"], "DisruptionBudget");
    assert_eq!(
        v["details"]["causes"][0]["message"],
        "The disruption budget web needs 1 healthy pods and has 2 currently"
    );
    let p2 = get(&c, "/api/v1/namespaces/default/pods/p2").await;
    assert!(p2["metadata"]["deletionTimestamp"].is_null(), "{p2}");

    // A pod being deleted already caused its disruption.
    let (code, v) = evict(&c, "p1", "").await;
    assert_eq!(code, 201, "{v}");

    // Two budgets for one pod: the eviction API cannot choose.
    ok(s.kubectl_stdin(
        &["apply", "-f", "-"],
        &budget_yaml("other", "maxUnavailable: 1"),
    ));
    set_budget_status(&c, "web", 1, 1).await;
    set_budget_status(&c, "other", 1, 1).await;
    let (code, v) = evict(&c, "p3", "").await;
    assert_eq!(code, 500, "{v}");
    assert_eq!(
        v["message"],
        "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
    );
}
