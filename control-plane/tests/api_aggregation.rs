//! API aggregation through the real `kubectl`: every served group version
//! has its `Local` APIService (definitions' too, removed with them); a
//! registered APIService's group is served by its backend (an HTTPS
//! server here, behind a Service) that sees the caller's identity in the
//! front-proxy headers and the front-proxy client certificate the
//! `extension-apiserver-authentication` ConfigMap names; discovery lists
//! it; when the backend goes, only its group fails.

use crate::aggregated_server;
use crate::api;
use crate::webhook_server;

use std::time::Duration;

use aggregated_server::GROUP;
use api::{eventually, ok, TestServer};
use base64::Engine as _;
use serde_json::{json, Value};

/// The aggregated API server on loopback, trusting `front_proxy_ca`:
/// (port, its caBundle, the task serving it).
async fn backend(front_proxy_ca: &str) -> (u16, String, tokio::task::JoinHandle<()>) {
    let (ca, cert, key) = webhook_server::certificate(&["echo.aggregated.svc"]);
    let tls = aggregated_server::server_config(&cert, &key, front_proxy_ca);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(aggregated_server::spawn(listener, tls));
    (
        port,
        base64::engine::general_purpose::STANDARD.encode(ca),
        task,
    )
}

fn json_of(out: String) -> Value {
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn aggregated_apis_are_proxied_with_the_callers_identity() {
    let s = TestServer::start().await;
    // Local APIServices, available.
    let mut table = String::new();
    let listed = eventually(Duration::from_secs(15), || {
        table = ok(s.kubectl(&["get", "apiservices"]));
        let done = table.lines().any(|l| {
            l.split_whitespace()
                .take(3)
                .eq(["v1.apps", "Local", "True"])
        });
        async move { done }
    })
    .await;
    assert!(listed, "{table}");
    assert!(
        table.lines().next().unwrap().split_whitespace().eq([
            "NAME",
            "SERVICE",
            "AVAILABLE",
            "AGE"
        ]),
        "{table}"
    );
    assert!(table.lines().any(|l| l.starts_with("v1. ")), "{table}");

    // The ConfigMap aggregated servers read.
    let cm = json_of(ok(s.kubectl(&[
        "get",
        "configmap",
        "-n",
        "kube-system",
        "extension-apiserver-authentication",
        "-o",
        "json",
    ])));
    assert_eq!(
        cm["data"]["requestheader-username-headers"],
        r#"["X-Remote-User"]"#
    );
    assert_eq!(
        cm["data"]["requestheader-allowed-names"],
        r#"["front-proxy-client"]"#
    );
    let front_proxy_ca = cm["data"]["requestheader-client-ca-file"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(front_proxy_ca.contains("BEGIN CERTIFICATE"));

    // A registered group version behind a Service.
    let (port, ca_bundle, task) = backend(&front_proxy_ca).await;
    ok(s.kubectl(&["create", "namespace", "aggregated"]));
    ok(s.kubectl_stdin(
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: v1
kind: Service
metadata: {{name: echo, namespace: aggregated}}
spec:
  ports: [{{name: https, port: 443}}]
---
apiVersion: v1
kind: Endpoints
metadata: {{name: echo, namespace: aggregated}}
subsets:
- addresses: [{{ip: 127.0.0.1}}]
  ports: [{{name: https, port: {port}}}]
---
apiVersion: apiregistration.k8s.io/v1
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
        ),
    ));
    let available = eventually(Duration::from_secs(20), || {
        table = ok(s.kubectl(&["get", "apiservice", &format!("v1.{GROUP}")]));
        let done = table.contains("aggregated/echo") && table.contains("True");
        async move { done }
    })
    .await;
    assert!(available, "{table}");
    // Proxied with the caller's identity, without its credentials.
    let echo = json_of(ok(s.kubectl(&[
        "get",
        "--raw",
        &format!("/apis/{GROUP}/v1/namespaces/default/echoes/hello"),
    ])));
    assert_eq!(
        echo["path"],
        format!("/apis/{GROUP}/v1/namespaces/default/echoes/hello"),
        "{echo}"
    );
    assert!(
        echo["groups"]
            .as_array()
            .unwrap()
            .contains(&json!("system:masters")),
        "{echo}"
    );
    assert_eq!(echo["user"].as_array().map(Vec::len), Some(1), "{echo}");
    assert_eq!(echo["authorization"], json!([]), "{echo}");
    // Discovery: plain and aggregated (kubectl api-resources, kubectl get).
    let resources = ok(s.kubectl(&["api-resources", &format!("--api-group={GROUP}")]));
    assert!(
        resources.lines().any(|l| l.starts_with("echoes")),
        "{resources}"
    );
    let got = ok(s.kubectl(&["get", &format!("echoes.{GROUP}"), "hello", "-o", "json"]));
    assert!(got.contains("\"Echo\""), "{got}");

    // The backend gone: its APIService is unavailable and its group
    // answers 503, the rest of the API serves on.
    task.abort();
    let down = eventually(Duration::from_secs(20), || {
        table = ok(s.kubectl(&["get", "apiservice", &format!("v1.{GROUP}")]));
        let done = table.contains("False (FailedDiscoveryCheck)");
        async move { done }
    })
    .await;
    assert!(down, "{table}");
    let out = s.kubectl(&[
        "get",
        "--raw",
        &format!("/apis/{GROUP}/v1/namespaces/default/echoes/hello"),
    ]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success() && err.contains("ServiceUnavailable"),
        "{err}"
    );
    ok(s.kubectl(&["get", "configmaps", "-A"]));
    ok(s.kubectl(&["get", "--raw", "/apis"]));

    // Definitions' group versions get (and lose) their APIService.
    ok(s.kubectl_stdin(
        &["apply", "-f", "-"],
        "
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: gadgets.example.com}
spec:
  group: example.com
  scope: Namespaced
  names: {plural: gadgets, singular: gadget, kind: Gadget}
  versions:
  - name: v1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
",
    ));
    let registered = eventually(Duration::from_secs(15), || {
        let out = s.kubectl(&[
            "get",
            "apiservice",
            "v1.example.com",
            "-o",
            "jsonpath={.metadata.labels}",
        ]);
        let done = String::from_utf8_lossy(&out.stdout)
            .contains("\"kube-aggregator.kubernetes.io/automanaged\":\"true\"");
        async move { done }
    })
    .await;
    assert!(
        registered,
        "no APIService for the definition's group version"
    );
    ok(s.kubectl(&["delete", "crd", "gadgets.example.com"]));
    let gone = eventually(Duration::from_secs(15), || {
        let out = s.kubectl(&["get", "apiservice", "v1.example.com"]);
        async move { !out.status.success() }
    })
    .await;
    assert!(gone, "the definition's APIService stayed");
}
