//! The aggregated API server as a cluster workload, for the aggregation
//! test: the API server tests' own ([`server`], also the `aggregated-api`
//! binary of the test image) in a Deployment behind a Service, with a
//! serving certificate made for it and the front-proxy CA it trusts.

#[path = "../../control-plane/tests/support/aggregated_server.rs"]
pub mod server;

use anyhow::Result;
use base64::Engine as _;

use crate::cluster::Cluster;
use crate::images::{aggregated_api, AGGREGATED_API_IMAGE};
use crate::webhooks::server::certificate;

/// Load the image on the first node, deploy the server in namespace
/// `aggregated` trusting clients of `front_proxy_ca` (PEM) and wait for
/// it; returns the `caBundle` that trusts it.
///
/// # Errors
/// The image cannot be built or loaded, or the rollout fails.
pub async fn deploy(cluster: &Cluster, front_proxy_ca: &str) -> Result<String> {
    let image = tokio::task::spawn_blocking(aggregated_api).await??;
    cluster.nodes()[0]
        .containerd()
        .images()
        .load(&image)
        .await?;
    let (ca, cert, key) = certificate(&["echo.aggregated.svc"]);
    cluster
        .apply(&manifests(&cert, &key, front_proxy_ca))
        .await?;
    cluster
        .kubectl_ok(&[
            "rollout",
            "status",
            "deployment/echo",
            "-n",
            "aggregated",
            "--timeout=120s",
        ])
        .await?;
    Ok(base64::engine::general_purpose::STANDARD.encode(ca))
}

fn indent(pem: &str) -> String {
    pem.lines().map(|l| format!("    {l}\n")).collect()
}

/// The server: its namespace, certificates, Deployment and Service.
fn manifests(cert: &str, key: &str, client_ca: &str) -> String {
    format!(
        "apiVersion: v1
kind: Namespace
metadata: {{name: aggregated}}
---
apiVersion: v1
kind: Secret
metadata: {{name: echo-tls, namespace: aggregated}}
stringData:
  tls.crt: |
{cert}  tls.key: |
{key}  client-ca.crt: |
{client_ca}---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: echo, namespace: aggregated}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: echo}}}}
  template:
    metadata: {{labels: {{app: echo}}}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: echo
        image: {AGGREGATED_API_IMAGE}
        imagePullPolicy: Never
        command: [aggregated-api, '8443', /certs/tls.crt, /certs/tls.key, /certs/client-ca.crt]
        ports: [{{name: https, containerPort: 8443}}]
        readinessProbe: {{tcpSocket: {{port: 8443}}, periodSeconds: 1}}
        volumeMounts: [{{name: certs, mountPath: /certs}}]
      volumes: [{{name: certs, secret: {{secretName: echo-tls}}}}]
---
apiVersion: v1
kind: Service
metadata: {{name: echo, namespace: aggregated}}
spec:
  selector: {{app: echo}}
  ports: [{{name: https, port: 443, targetPort: https}}]
",
        cert = indent(cert),
        key = indent(key),
        client_ca = indent(client_ca),
    )
}
