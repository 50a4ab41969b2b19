//! Admission webhooks served by a pod on a real node: the webhook server
//! (the API server tests' own, in a test image) runs behind a Service
//! with a certificate the test made; the API server reaches it through
//! the node; a mutating webhook labels pods, a validating one denies the
//! pods labelled `deny` with its message, and with the webhook gone
//! `failurePolicy: Fail` refuses writes where `Ignore` lets them through.
//! An aggregated API server served by a pod the same way: its group is
//! proxied to it with the caller's identity and listed by discovery, and
//! with the pod gone only that group fails.
#![allow(clippy::disallowed_methods)] // a test harness: short-lived commands run under the test's own timeout

use std::time::Duration;

use anyhow::{bail, ensure, Result};
use skiff_tests::aggregation::{self, server::GROUP};
use skiff_tests::cluster::{wait_for, Cluster, ClusterOptions};
use skiff_tests::webhooks::{configuration, deploy};

/// Time for anything that involves starting pods.
const T: Duration = Duration::from_secs(120);

/// `kubectl run NAME` in `apps` as a server-side dry run (admission runs,
/// nothing is stored or started): its output or its error.
async fn try_pod(cluster: &Cluster, name: &str, labels: &str) -> Result<Result<String, String>> {
    let out = cluster
        .kubectl(&[
            "run",
            name,
            "-n",
            "apps",
            "--image=busybox",
            "--restart=Never",
            "--labels",
            labels,
            "--dry-run=server",
            "-o",
            "jsonpath={.metadata.labels}",
        ])
        .await?;
    Ok(if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).to_string())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_served_by_a_pod_mutate_and_deny_pods() -> Result<()> {
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    let ca_bundle = deploy(&cluster).await?;
    cluster.kubectl_ok(&["create", "namespace", "apps"]).await?;
    cluster
        .kubectl_ok(&["label", "namespace", "apps", "admission=on"])
        .await?;
    cluster
        .apply(&configuration(
            "MutatingWebhookConfiguration",
            "label.test.skiff.io",
            "/mutate",
            &ca_bundle,
            "Fail",
        ))
        .await?;
    cluster
        .apply(&configuration(
            "ValidatingWebhookConfiguration",
            "deny.test.skiff.io",
            "/validate",
            &ca_bundle,
            "Fail",
        ))
        .await?;

    // The mutating webhook labels pods (once its configuration is seen).
    let mut n = 0;
    let labels = wait_for("a pod labelled by the webhook", T, || {
        n += 1;
        let name = format!("probe-{n}");
        let cluster = &cluster;
        async move {
            match try_pod(cluster, &name, "app=demo").await? {
                Ok(labels) if labels.contains("webhook.test.skiff.io/mutated") => Ok(labels),
                other => bail!("{other:?}"),
            }
        }
    })
    .await?;
    ensure!(labels.contains("\"app\":\"demo\""), "{labels}");

    // The validating webhook denies with its message.
    let denied = try_pod(&cluster, "denied", "deny=yes").await?;
    let Err(err) = denied else {
        bail!("a pod labelled deny was admitted: {denied:?}");
    };
    ensure!(
        err.contains("admission webhook \"deny.test.skiff.io\" denied the request: objects labelled deny are not allowed"),
        "{err}"
    );

    // The webhook gone: Fail refuses, Ignore lets writes through.
    cluster
        .kubectl_ok(&[
            "scale",
            "deployment/webhook",
            "-n",
            "webhook-system",
            "--replicas=0",
        ])
        .await?;
    let err = wait_for("pods refused with the webhook gone", T, || {
        let cluster = &cluster;
        async move {
            match try_pod(cluster, "refused", "app=demo").await? {
                Err(e) if e.contains("failed calling webhook") => Ok(e),
                other => bail!("{other:?}"),
            }
        }
    })
    .await?;
    ensure!(
        err.contains("no endpoints available for service \"webhook\""),
        "{err}"
    );
    for (kind, name) in [
        ("mutatingwebhookconfiguration", "label.test.skiff.io"),
        ("validatingwebhookconfiguration", "deny.test.skiff.io"),
    ] {
        cluster
            .kubectl_ok(&[
                "patch",
                kind,
                name,
                "--type=json",
                "-p",
                r#"[{"op":"replace","path":"/webhooks/0/failurePolicy","value":"Ignore"}]"#,
            ])
            .await?;
    }
    let labels = wait_for("pods admitted with failurePolicy Ignore", T, || {
        let cluster = &cluster;
        async move {
            match try_pod(cluster, "ignored", "app=demo").await? {
                Ok(labels) => Ok(labels),
                Err(e) => bail!("{e}"),
            }
        }
    })
    .await?;
    ensure!(
        !labels.contains("webhook.test.skiff.io/mutated"),
        "{labels}"
    );
    cluster.finish().await
}

/// The `Available` condition of APIService `v1.GROUP`: (status, reason).
async fn availability(cluster: &Cluster) -> Result<String> {
    cluster
        .kubectl_ok(&[
            "get",
            "apiservice",
            &format!("v1.{GROUP}"),
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Available\")].status} {.status.conditions[?(@.type==\"Available\")].reason}",
        ])
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aggregated_api_served_by_a_pod_sees_the_caller() -> Result<()> {
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    let front_proxy_ca = cluster
        .kubectl_ok(&[
            "get",
            "configmap",
            "-n",
            "kube-system",
            "extension-apiserver-authentication",
            "-o",
            "jsonpath={.data.requestheader-client-ca-file}",
        ])
        .await?;
    ensure!(
        front_proxy_ca.contains("BEGIN CERTIFICATE"),
        "front-proxy CA: {front_proxy_ca:?}"
    );
    let ca_bundle = aggregation::deploy(&cluster, &front_proxy_ca).await?;
    cluster
        .apply(&format!(
            "apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {{name: v1.{GROUP}}}
spec:
  group: {GROUP}
  version: v1
  service: {{name: echo, namespace: aggregated}}
  caBundle: {ca_bundle}
  groupPriorityMinimum: 1000
  versionPriority: 15
"
        ))
        .await?;
    wait_for("the APIService Available", T, || async {
        let a = availability(&cluster).await?;
        ensure!(a.starts_with("True"), "Available: {a}");
        Ok(())
    })
    .await?;

    // Through the node to the pod, with the caller's identity and
    // without its credentials.
    let path = format!("/apis/{GROUP}/v1/namespaces/default/echoes/hello");
    let echo: serde_json::Value =
        serde_json::from_str(&cluster.kubectl_ok(&["get", "--raw", &path]).await?)?;
    ensure!(echo["path"] == path.as_str(), "{echo}");
    ensure!(
        echo["groups"]
            .as_array()
            .is_some_and(|g| g.iter().any(|g| g == "system:masters")),
        "{echo}"
    );
    ensure!(echo["authorization"] == serde_json::json!([]), "{echo}");
    let resources = cluster
        .kubectl_ok(&["api-resources", &format!("--api-group={GROUP}")])
        .await?;
    ensure!(
        resources.lines().any(|l| l.starts_with("echoes")),
        "{resources}"
    );

    // The pod gone: the APIService is unavailable, its group answers 503,
    // the rest of the API serves on.
    cluster
        .kubectl_ok(&[
            "scale",
            "deployment/echo",
            "-n",
            "aggregated",
            "--replicas=0",
        ])
        .await?;
    wait_for("the APIService unavailable", T, || async {
        let a = availability(&cluster).await?;
        ensure!(a == "False MissingEndpoints", "Available: {a}");
        Ok(())
    })
    .await?;
    let out = cluster.kubectl(&["get", "--raw", &path]).await?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success() && err.contains("ServiceUnavailable"),
        "{err}"
    );
    cluster.kubectl_ok(&["get", "pods", "-A"]).await?;
    cluster.finish().await
}
