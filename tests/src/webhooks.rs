//! The admission webhook server as a cluster workload, for the admission
//! tests and benchmark: the API server tests' webhook server
//! ([`server`], also the `admission-webhook` binary of the test image)
//! in a Deployment behind a Service, with a certificate made for it.

#[path = "../../control-plane/tests/support/webhook_server.rs"]
pub mod server;

use anyhow::Result;
use base64::Engine as _;

use crate::cluster::Cluster;
use crate::images::{admission_webhook, ADMISSION_WEBHOOK_IMAGE};

/// Load the image on the first node, deploy the server in namespace
/// `webhook-system` and wait for it; returns the `caBundle` that trusts
/// it.
///
/// # Errors
/// The image cannot be built or loaded, or the rollout fails.
pub async fn deploy(cluster: &Cluster) -> Result<String> {
    let image = tokio::task::spawn_blocking(admission_webhook).await??;
    cluster.nodes()[0]
        .containerd()
        .images()
        .load(&image)
        .await?;
    let (ca, cert, key) = server::certificate(&["webhook.webhook-system.svc"]);
    cluster.apply(&manifests(&cert, &key)).await?;
    cluster
        .kubectl_ok(&[
            "rollout",
            "status",
            "deployment/webhook",
            "-n",
            "webhook-system",
            "--timeout=120s",
        ])
        .await?;
    Ok(base64::engine::general_purpose::STANDARD.encode(ca))
}

fn indent(pem: &str) -> String {
    pem.lines().map(|l| format!("    {l}\n")).collect()
}

/// The webhook server: its namespace, certificate, Deployment and Service.
fn manifests(cert: &str, key: &str) -> String {
    format!(
        "apiVersion: v1
kind: Namespace
metadata: {{name: webhook-system}}
---
apiVersion: v1
kind: Secret
metadata: {{name: webhook-tls, namespace: webhook-system}}
type: kubernetes.io/tls
stringData:
  tls.crt: |
{cert}  tls.key: |
{key}---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: webhook, namespace: webhook-system}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: webhook}}}}
  template:
    metadata: {{labels: {{app: webhook}}}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: webhook
        image: {ADMISSION_WEBHOOK_IMAGE}
        imagePullPolicy: Never
        command: [admission-webhook, '8443', /certs/tls.crt, /certs/tls.key]
        ports: [{{name: https, containerPort: 8443}}]
        readinessProbe: {{tcpSocket: {{port: 8443}}, periodSeconds: 1}}
        volumeMounts: [{{name: certs, mountPath: /certs}}]
      volumes: [{{name: certs, secret: {{secretName: webhook-tls}}}}]
---
apiVersion: v1
kind: Service
metadata: {{name: webhook, namespace: webhook-system}}
spec:
  selector: {{app: webhook}}
  ports: [{{name: https, port: 443, targetPort: https}}]
",
        cert = indent(cert),
        key = indent(key),
    )
}

/// A webhook of `kind` at `path` of the service, for pods in namespaces
/// labelled `admission: on`.
pub fn configuration(kind: &str, name: &str, path: &str, ca_bundle: &str, policy: &str) -> String {
    format!(
        "apiVersion: admissionregistration.k8s.io/v1
kind: {kind}
metadata: {{name: {name}}}
webhooks:
- name: {name}
  clientConfig:
    service: {{name: webhook, namespace: webhook-system, path: {path}}}
    caBundle: {ca_bundle}
  rules:
  - {{operations: [CREATE], apiGroups: [''], apiVersions: [v1], resources: [pods]}}
  namespaceSelector: {{matchLabels: {{admission: 'on'}}}}
  failurePolicy: {policy}
  sideEffects: None
  admissionReviewVersions: [v1]
"
    )
}
