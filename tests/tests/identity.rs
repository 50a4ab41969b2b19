//! Workload identity end to end, one node on real containerd: a pod running
//! as ServiceAccount `robot` talks to the API server with the real kubectl
//! and in-cluster configuration — the `KUBERNETES_SERVICE_*` variables the
//! agent injects, the token the agent requested through TokenRequest and
//! projected, the cluster's CA from `kube-root-ca.crt`:
//!
//! - `kubectl get pods` is forbidden for `robot` until a RoleBinding grants
//!   it, then works through the ClusterIP and through
//!   `https://kubernetes.default.svc` (cluster DNS), the server's
//!   certificate naming both;
//! - the token file is mode 0644 behind the atomic writer's `..data`
//!   link, so a refresh swaps it whole (the refresh timing itself is
//!   unit-tested in the agent: waiting 480 s here is not worth it);
//! - the token is bound to the pod: once the pod is deleted, the copy
//!   taken out of it no longer authenticates (401).
#![allow(clippy::disallowed_methods)] // a test harness: short-lived commands run under the test's own timeout

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use skiff_tests::cluster::{wait_for, Cluster, ClusterOptions};
use skiff_tests::images::{kubectl, KUBECTL_IMAGE};

const WAIT: Duration = Duration::from_secs(90);
const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Progress on stderr, so a slow stage shows in the test's output.
fn stage(start: Instant, what: &str) {
    eprintln!("[{:>6.1}s] {what}", start.elapsed().as_secs_f64());
}

/// The first address of the test clusters' service range: the ClusterIP
/// of `default/kubernetes`.
fn master_cluster_ip() -> String {
    let base = skiff_tests::netns::SERVICE_RANGE
        .split('/')
        .next()
        .unwrap_or_default();
    let mut octets: Vec<u8> = base.split('.').filter_map(|o| o.parse().ok()).collect();
    if let Some(last) = octets.last_mut() {
        *last += 1;
    }
    octets
        .iter()
        .map(u8::to_string)
        .collect::<Vec<_>>()
        .join(".")
}

/// `kubectl exec robot -- sh -c SCRIPT`: (success, stdout + stderr).
async fn in_pod(cluster: &Cluster, script: &str) -> Result<(bool, String)> {
    let out = cluster
        .kubectl(&["exec", "robot", "-c", "c", "--", "sh", "-c", script])
        .await?;
    Ok((
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    ))
}

/// The HTTP status of listing pods with `token` as bearer, from the host.
async fn status_with_token(cluster: &Cluster, token: &str) -> Result<String> {
    let out = tokio::process::Command::new("curl")
        .args(["-sk", "-o", "/dev/null", "-w", "%{http_code}", "-H"])
        .arg(format!("Authorization: Bearer {token}"))
        .arg(format!(
            "{}/api/v1/namespaces/default/pods",
            cluster.server_url()
        ))
        .output()
        .await
        .context("running curl")?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_account_tokens_in_cluster() -> Result<()> {
    let t0 = Instant::now();
    let ip = master_cluster_ip();
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    stage(t0, "cluster up");
    let image = tokio::task::spawn_blocking(kubectl).await??;
    cluster.nodes()[0]
        .containerd()
        .images()
        .load(&image)
        .await?;
    stage(t0, "kubectl image loaded");

    let svc_ip = cluster
        .kubectl_ok(&[
            "get",
            "service",
            "kubernetes",
            "-n",
            "default",
            "-o",
            "jsonpath={.spec.clusterIP}",
        ])
        .await?;
    ensure!(
        svc_ip == ip,
        "default/kubernetes is {svc_ip}, expected {ip}"
    );

    cluster
        .apply(&format!(
            r#"
apiVersion: v1
kind: ServiceAccount
metadata: {{name: robot, namespace: default}}
---
apiVersion: v1
kind: Pod
metadata: {{name: robot, namespace: default}}
spec:
  serviceAccountName: robot
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: {KUBECTL_IMAGE}
    command: [sleep, "3600"]
"#
        ))
        .await?;
    cluster
        .kubectl_ok(&[
            "wait",
            "--for=condition=Ready",
            "pod/robot",
            "--timeout=90s",
        ])
        .await?;
    stage(t0, "robot running");

    // The agent's environment and files.
    let (ok, env) = in_pod(&cluster, "env").await?;
    ensure!(ok, "env: {env}");
    for want in [
        format!("KUBERNETES_SERVICE_HOST={ip}"),
        "KUBERNETES_SERVICE_PORT=443".into(),
        format!("KUBERNETES_PORT=tcp://{ip}:443"),
    ] {
        ensure!(
            env.lines().any(|l| l == want),
            "{want} missing from the pod's env:\n{env}"
        );
    }
    let (ok, files) = in_pod(
        &cluster,
        &format!(
            "cd {SA_DIR} && ls -A && stat -L -c '%a' token && readlink ..data && cat namespace"
        ),
    )
    .await?;
    ensure!(ok, "listing {SA_DIR}: {files}");
    let lines: Vec<&str> = files.lines().collect();
    for f in ["..data", "ca.crt", "namespace", "token"] {
        ensure!(lines.contains(&f), "{f} missing from {SA_DIR}: {files}");
    }
    ensure!(
        lines.contains(&"644"),
        "token file mode is not 0644: {files}"
    );
    ensure!(lines.last() == Some(&"default"), "namespace file: {files}");
    let (ok, token) = in_pod(&cluster, &format!("cat {SA_DIR}/token")).await?;
    ensure!(
        ok && token.split('.').count() == 3,
        "token is no JWT: {token}"
    );
    stage(t0, "env and projected files checked");

    // In-cluster config: no kubeconfig, the ClusterIP from the env.
    let (ok, out) = in_pod(&cluster, "kubectl get pods").await?;
    ensure!(
        !ok && out.contains("forbidden") && out.contains("system:serviceaccount:default:robot"),
        "robot listed pods without a grant (or failed otherwise): {out}"
    );
    cluster
        .apply(
            r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: pod-reader, namespace: default}
rules:
- {apiGroups: [""], resources: [pods], verbs: [get, list]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: robot-reads-pods, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: pod-reader}
subjects:
- {kind: ServiceAccount, name: robot, namespace: default}
"#,
        )
        .await?;
    wait_for("robot to list pods through the ClusterIP", WAIT, || async {
        let (ok, out) = in_pod(&cluster, "kubectl get pods -o name").await?;
        ensure!(ok && out.contains("pod/robot"), "{out}");
        Ok(())
    })
    .await?;
    stage(t0, "robot lists pods through the ClusterIP");
    wait_for("robot to list pods through kubernetes.default.svc", WAIT, || async {
        let (ok, out) = in_pod(
            &cluster,
            &format!(
                "kubectl --server=https://kubernetes.default.svc --token=\"$(cat {SA_DIR}/token)\" --certificate-authority={SA_DIR}/ca.crt -n default get pods -o name"
            ),
        )
        .await?;
        ensure!(ok && out.contains("pod/robot"), "{out}");
        Ok(())
    })
    .await?;
    stage(t0, "robot lists pods through kubernetes.default.svc");

    // The token dies with its pod.
    let token = token.trim().to_string();
    let before = status_with_token(&cluster, &token).await?;
    ensure!(
        before == "200",
        "the pod's token from the host: HTTP {before}"
    );
    cluster
        .kubectl_ok(&["delete", "pod", "robot", "--wait=true", "--timeout=60s"])
        .await?;
    wait_for("the deleted pod's token to be refused", WAIT, || async {
        let after = status_with_token(&cluster, &token).await?;
        ensure!(after == "401", "HTTP {after}");
        Ok(())
    })
    .await?;
    stage(t0, "the deleted pod's token is refused");

    cluster
        .kubectl_ok(&[
            "delete",
            "rolebinding/robot-reads-pods",
            "role/pod-reader",
            "serviceaccount/robot",
        ])
        .await?;
    cluster.finish().await
}
