//! The official client libraries against a real node, where they differ
//! from kubectl: the Python client's watch (from a resourceVersion, with
//! bookmarks), followed logs, exec (stdin as text and as binary
//! messages, the v5 close channel), its port-forward (the WebSocket
//! channel protocol, several ports in one request, a refused one among
//! them, 10 MB each way compared by hash), and its models decoding every
//! kind the server lists (required fields present, types exact); a
//! node's refusal reaching kube-rs as a Status and an error body byte for
//! byte as upstream's; and the pods, services and nodes proxies.
#![allow(clippy::disallowed_methods)] // a test harness: short-lived commands run under the test's own timeout

use std::time::Duration;

use anyhow::{bail, ensure, Result};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use skiff_tests::agent::pods;
use skiff_tests::cluster::{wait_for, Cluster, ClusterOptions};
use skiff_tests::{python, TOOLBOX_IMAGE};

/// Time for anything that involves starting pods.
const T: Duration = Duration::from_secs(90);

/// A pod with echo servers on ports 1234 and 1235, nothing on 1236, and
/// a web server on 8080 (its first declared port) answering `served by
/// NAME`.
fn echo_servers(name: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  labels: {{app: echo}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: echo
    image: {TOOLBOX_IMAGE}
    imagePullPolicy: Never
    command: [sh, -c, "mkdir -p /www && echo served by $(hostname) > /www/index.html && httpd -p 8080 -h /www && nc -ll -p 1234 -e cat & nc -ll -p 1235 -e cat & exec sleep 3600"]
    ports: [{{name: http, containerPort: 8080}}]
    readinessProbe:
      tcpSocket: {{port: 1235}}
      periodSeconds: 1
"#
    )
}

/// One object of each kind a user creates that a bare cluster lacks; the
/// controllers write the statuses, the others come with the cluster.
fn one_of_each() -> String {
    let sleeper = format!(
        r#"spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: c
        image: {TOOLBOX_IMAGE}
        imagePullPolicy: Never
        command: [sleep, "3600"]"#
    );
    format!(
        r#"apiVersion: v1
kind: ConfigMap
metadata: {{name: cm}}
data: {{k: v}}
---
apiVersion: v1
kind: Secret
metadata: {{name: s}}
stringData: {{k: v}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {{name: robot}}
---
apiVersion: v1
kind: Service
metadata: {{name: echo}}
spec:
  selector: {{app: echo}}
  ports: [{{name: http, port: 80, targetPort: http}}, {{name: echo, port: 1234}}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: d}}
spec:
  replicas: 0
  selector: {{matchLabels: {{app: d}}}}
  template:
    metadata: {{labels: {{app: d}}}}
    {sleeper}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {{name: ds}}
spec:
  selector: {{matchLabels: {{app: ds}}}}
  template:
    metadata: {{labels: {{app: ds}}}}
    {sleeper}
---
apiVersion: batch/v1
kind: Job
metadata: {{name: j}}
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: c
        image: {TOOLBOX_IMAGE}
        imagePullPolicy: Never
        command: ["true"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: r}}
rules: [{{apiGroups: [""], resources: [pods], verbs: [get]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: r}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: r}}
subjects: [{{kind: ServiceAccount, name: robot, namespace: default}}]
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_reads_execs_and_forwards() -> Result<()> {
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    cluster.apply(&echo_servers("echo")).await?;
    cluster.apply(&one_of_each()).await?;
    let api = Api::<Pod>::namespaced(cluster.client().await?, "default");
    wait_for("pod echo ready", T, || async {
        let p = api.get("echo").await?;
        ensure!(pods::ready(&p), "not ready yet");
        Ok(())
    })
    .await?;

    proxies(&cluster).await?;
    error_body_as_upstream(&cluster).await?;

    // A node's refusal reaches kube-rs as a Status it can parse.
    let waiting = "apiVersion: v1\nkind: Pod\nmetadata: {name: waiting}\nspec:\n  containers:\n  - name: c\n    image: skiff.test/absent:1\n    imagePullPolicy: Never\n";
    cluster.apply(waiting).await?;
    let refusal = wait_for("pods/log of a waiting container refused", T, || async {
        match api.logs("waiting", &Default::default()).await {
            Err(kube::Error::Api(s)) if s.message.contains("is waiting to start") => Ok(s),
            other => bail!("not refused as waiting yet: {other:?}"),
        }
    })
    .await?;
    ensure!(
        refusal.code == 400 && refusal.reason == "BadRequest",
        "{refusal:?}"
    );

    let ticker = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: ticker}}\nspec:\n  restartPolicy: Never\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {TOOLBOX_IMAGE}\n    imagePullPolicy: Never\n    command: [sh, -c, 'for i in 1 2 3 4 5; do echo tick $i; sleep 1; done']\n"
    );
    cluster.apply(&ticker).await?;
    wait_for("pod ticker started", T, || async {
        let p = api.get("ticker").await?;
        ensure!(pods::phase(&p) != "Pending", "pending");
        Ok(())
    })
    .await?;
    let args = ["default", "ticker", "5"];
    let out = python::run_ok(&cluster, "watch_and_logs.py", &args).await?;
    ensure!(
        out.contains("watch and logs ok"),
        "watch_and_logs.py: {out}"
    );

    let out = python::run_ok(&cluster, "exec_stdin.py", &["default", "echo"]).await?;
    ensure!(out.contains("exec ok"), "exec_stdin.py: {out}");
    let args = ["default", "echo", "1234", "1235", "1236"];
    let out = python::run_ok(&cluster, "port_forward.py", &args).await?;
    ensure!(out.contains("port-forward ok"), "port_forward.py: {out}");

    // Decoded once the controllers have written the statuses they own.
    let ds = Api::<DaemonSet>::namespaced(cluster.client().await?, "default");
    wait_for("daemon set ds counted", T, || async {
        let d = ds.get("ds").await?;
        let scheduled = d.status.map_or(0, |s| s.desired_number_scheduled);
        ensure!(scheduled == 1, "desiredNumberScheduled {scheduled}");
        Ok(())
    })
    .await?;
    let out = python::run_ok(&cluster, "models.py", &[]).await?;
    ensure!(
        out.contains("/apis/apps/v1/daemonsets: 1 V1DaemonSetList items decoded"),
        "models.py: {out}"
    );

    cluster.finish().await
}

/// `kubectl get --raw` through pods/proxy, services/proxy (by port name
/// and number) and nodes/proxy (configz, stats, metrics, the node's logs).
async fn proxies(cluster: &Cluster) -> Result<()> {
    for path in [
        "/api/v1/namespaces/default/pods/echo:8080/proxy/",
        "/api/v1/namespaces/default/pods/echo/proxy/index.html",
        "/api/v1/namespaces/default/pods/http:echo:http/proxy/",
    ] {
        let body = wait_for(path, T, || raw(cluster, path)).await?;
        ensure!(body.trim() == "served by echo", "{path}: {body:?}");
    }
    for path in [
        "/api/v1/namespaces/default/services/echo:http/proxy/",
        "/api/v1/namespaces/default/services/echo:80/proxy/",
    ] {
        let body = wait_for(path, T, || raw(cluster, path)).await?;
        ensure!(body.trim() == "served by echo", "{path}: {body:?}");
    }
    let refused = cluster
        .kubectl(&[
            "get",
            "--raw",
            "/api/v1/namespaces/default/pods/echo:1236/proxy/",
        ])
        .await?;
    let err = String::from_utf8_lossy(&refused.stderr);
    ensure!(
        !refused.status.success() && err.contains("error trying to reach service"),
        "a refused pod port: {err}"
    );

    let configz: serde_json::Value =
        serde_json::from_str(&raw(cluster, "/api/v1/nodes/node-1/proxy/configz").await?)?;
    ensure!(
        configz["kubeletconfig"]["kind"] == "KubeletConfiguration",
        "{configz}"
    );
    let summary: serde_json::Value =
        serde_json::from_str(&raw(cluster, "/api/v1/nodes/node-1/proxy/stats/summary").await?)?;
    ensure!(summary["node"]["nodeName"] == "node-1", "{summary}");
    let metrics = raw(cluster, "/api/v1/nodes/node-1/proxy/metrics").await?;
    ensure!(metrics.contains("# TYPE "), "{metrics}");

    // The node's /var/log: this machine's, the node sharing its files.
    let listing = raw(cluster, "/api/v1/nodes/node-1/proxy/logs/").await?;
    ensure!(listing.contains("<pre>"), "{listing}");
    let Some(file) = listing
        .lines()
        .filter_map(|l| l.strip_prefix("<a href=\"")?.split('"').next())
        .find(|f| f.ends_with(".log"))
    else {
        bail!("no .log file in the node's /var/log listing: {listing}")
    };
    let path = format!("/api/v1/nodes/node-1/proxy/logs/{file}");
    let served = raw(cluster, &path).await?;
    let local = std::fs::read_to_string(format!("/var/log/{file}"))?;
    ensure!(
        local.starts_with(&served),
        "{path} differs from /var/log/{file}"
    );
    Ok(())
}

async fn raw(cluster: &Cluster, path: &str) -> Result<String> {
    cluster.kubectl_ok(&["get", "--raw", path]).await
}

/// An error body byte for byte as upstream writes it: Status fields in Go
/// struct order, `group` left out when empty, a newline after.
async fn error_body_as_upstream(cluster: &Cluster) -> Result<()> {
    let client = cluster.client().await?;
    let req = http::Request::get("/api/v1/namespaces/default/pods/missing")
        .body(kube::client::Body::empty())?;
    let resp = client.send(req).await?;
    ensure!(resp.status() == 404, "{}", resp.status());
    let body = resp.into_body().collect_bytes().await?;
    let want = concat!(
        r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","#,
        r#""message":"pods \"missing\" not found","reason":"NotFound","#,
        r#""details":{"name":"missing","kind":"pods"},"code":404}"#,
        "\n"
    );
    ensure!(
        body == want.as_bytes(),
        "error body {:?}, upstream writes {want:?}",
        String::from_utf8_lossy(&body)
    );
    Ok(())
}
