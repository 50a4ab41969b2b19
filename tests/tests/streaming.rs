//! The node server and the streams behind kubectl: the agent's HTTPS port
//! refuses anonymous and unauthorized callers; `kubectl exec` (exit codes,
//! stdin, a terminal), `kubectl attach` and `kubectl port-forward` work
//! through the API server's proxy to the node, with the newest kubectl and
//! with every older one down to 1.27.
#![allow(clippy::disallowed_methods)] // a test harness: sync helpers (Drop, cleanup) may sleep, and short-lived commands run under the test's own timeout

use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use skiff_tests::agent::{insecure_client, pods};
use skiff_tests::cluster::{node_server_address, wait_for, Cluster, ClusterOptions};
use skiff_tests::TOOLBOX_IMAGE;
use tokio::io::{AsyncBufReadExt as _, BufReader};

/// Time for anything that involves starting pods.
const T: Duration = Duration::from_secs(90);

/// Versioned kubectl binaries (1.27 to 1.33).
const KUBECTL_DIR: &str = "/usr/lib/google-cloud-sdk/bin";

/// A pod serving `hello-from-pod` over HTTP on port 80 (busybox httpd).
fn web_pod(name: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: web
    image: {TOOLBOX_IMAGE}
    imagePullPolicy: Never
    command: [sh, -c, "mkdir -p /www && echo hello-from-pod > /www/index.html && exec httpd -f -p 80 -h /www"]
"#
    )
}

/// A pod whose only process echoes its stdin (stdinOnce: the first
/// attach's end of input ends it).
fn echo_pod(name: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: echo
    image: {TOOLBOX_IMAGE}
    imagePullPolicy: Never
    stdin: true
    stdinOnce: true
    command: [cat]
"#
    )
}

async fn wait_running(cluster: &Cluster, name: &str) -> Result<Pod> {
    let api = Api::<Pod>::namespaced(cluster.client().await?, "default");
    wait_for(&format!("pod {name} running"), T, || async {
        let p = api.get(name).await?;
        ensure!(pods::all_running(&p), "not running yet");
        Ok(p)
    })
    .await
}

/// `https://<InternalIP>:<daemonEndpoints port>` of a node.
async fn node_server_url(cluster: &Cluster, node: &str) -> Result<String> {
    let address = node_server_address(&cluster.client().await?, node).await?;
    Ok(format!("https://{address}"))
}

/// HTTP status of GET `path` with `client`.
async fn status_of(client: &kube::Client, path: &str) -> Result<u16> {
    let req = http::Request::get(path).body(kube::client::Body::empty())?;
    match client.send(req).await {
        Ok(r) => Ok(r.status().as_u16()),
        Err(kube::Error::Api(e)) => Ok(e.code),
        Err(e) => Err(e.into()),
    }
}

fn anonymous_kubeconfig(server: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: n\n  cluster:\n    server: {server}\n    insecure-skip-tls-verify: true\nusers:\n- name: anon\n  user: {{}}\ncontexts:\n- name: n\n  context: {{cluster: n, user: anon}}\ncurrent-context: n\n"
    )
}

/// The agent's port 10250 equivalent: no certificate -> 401; a user of
/// the cluster CA without rights -> 403; system:masters -> allowed; a user
/// granted nodes/proxy by RBAC -> allowed for /pods (proxy) but not for
/// /metrics (nodes/metrics), as the kubelet's webhook authorization.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_server_authenticates_and_authorizes() -> Result<()> {
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    cluster
        .kubectl_ok(&[
            "create",
            "clusterrole",
            "node-proxy",
            "--verb=get,create",
            "--resource=nodes/proxy",
        ])
        .await?;
    cluster
        .kubectl_ok(&[
            "create",
            "clusterrolebinding",
            "carol-node-proxy",
            "--clusterrole=node-proxy",
            "--user=carol",
        ])
        .await?;
    let url = node_server_url(&cluster, "node-1").await?;

    let anon = insecure_client(&anonymous_kubeconfig(&url), None).await?;
    assert_eq!(status_of(&anon, "/pods").await?, 401);
    assert_eq!(status_of(&anon, "/healthz").await?, 401);

    let user_client = |user: &str, groups: &[&str]| {
        let path = cluster.kubeconfig_for(user, groups);
        let url = url.clone();
        async move {
            let text = std::fs::read_to_string(path?)?;
            insecure_client(&text, Some(&url)).await
        }
    };
    let bob = user_client("bob", &[]).await?;
    assert_eq!(status_of(&bob, "/pods").await?, 403);
    assert_eq!(
        status_of(&bob, "/exec/default/x/y?command=true").await?,
        403
    );

    let admin = user_client("root-admin", &["system:masters"]).await?;
    assert_eq!(status_of(&admin, "/healthz").await?, 200);
    assert_eq!(status_of(&admin, "/pods").await?, 200);
    // Authorized, then the handler's own answer: no such pod.
    assert_eq!(
        status_of(&admin, "/exec/default/nope/c?command=true&output=1").await?,
        404
    );

    let carol = user_client("carol", &[]).await?;
    wait_for("carol's RoleBinding to take effect", T, || async {
        let s = status_of(&carol, "/pods").await?;
        ensure!(s == 200, "GET /pods as carol: {s}");
        Ok(())
    })
    .await?;
    assert_eq!(status_of(&carol, "/metrics").await?, 403);
    cluster.finish().await
}

/// kubectl with the admin kubeconfig of `cluster`, not waited for.
fn spawn_kubectl(cluster: &Cluster, binary: &str, args: &[&str]) -> Result<tokio::process::Child> {
    tokio::process::Command::new(binary)
        .env("KUBECONFIG", cluster.admin_kubeconfig())
        .env("HOME", cluster.dir())
        .arg(format!(
            "--cache-dir={}",
            cluster.dir().join("kube-cache").display()
        ))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("running {binary}"))
}

/// `kubectl port-forward pod/<pod> :80` with `binary`; one HTTP GET
/// through the forwarded port must return the pod's page.
async fn port_forward_get(cluster: &Cluster, binary: &str, pod: &str) -> Result<String> {
    let target = format!("pod/{pod}");
    let mut child = spawn_kubectl(cluster, binary, &["port-forward", &target, ":80"])?;
    let stdout = child.stdout.take().context("no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    // "Forwarding from 127.0.0.1:40123 -> 80"
    let port = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await? {
            if let Some(rest) = line.strip_prefix("Forwarding from 127.0.0.1:") {
                let port: u16 = rest.split_whitespace().next().unwrap_or("").parse()?;
                return Ok::<_, anyhow::Error>(port);
            }
        }
        bail!("kubectl port-forward ended without forwarding")
    })
    .await;
    let port = match port {
        Ok(Ok(p)) => p,
        other => {
            let _ = child.kill().await;
            let out = child.wait_with_output().await?;
            bail!(
                "{binary} port-forward: {other:?}; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    };
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()?;
    let body = http
        .get(format!("http://127.0.0.1:{port}/"))
        .send()
        .await
        .and_then(|r| r.error_for_status());
    let body = match body {
        Ok(r) => r.text().await?,
        Err(e) => {
            let _ = child.kill().await;
            let out = child.wait_with_output().await?;
            bail!(
                "GET through {binary} port-forward: {e}; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    };
    let _ = child.kill().await;
    Ok(body)
}

/// `kubectl exec` with `binary`: the exit code reaches kubectl's own, and
/// stdin reaches the command and ends at EOF.
async fn exec_checks(cluster: &Cluster, binary: &str, pod: &str) -> Result<()> {
    let out = cluster
        .kubectl_with(
            binary,
            &["exec", pod, "--", "sh", "-c", "echo out; exit 3"],
            None,
        )
        .await?;
    ensure!(
        out.status.code() == Some(3),
        "{binary} exec exit 3: status {:?}, stdout {:?}, stderr {:?}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(String::from_utf8_lossy(&out.stdout) == "out\n");
    let input = "line one\nline two\n";
    let out = cluster
        .kubectl_with(binary, &["exec", "-i", pod, "--", "cat"], Some(input))
        .await?;
    ensure!(
        out.status.success() && String::from_utf8_lossy(&out.stdout) == input,
        "{binary} exec -i cat: status {:?}, stdout {:?}, stderr {:?}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// exec (exit code, stdin, a terminal), attach and port-forward with the
/// default kubectl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_attach_and_port_forward() -> Result<()> {
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    cluster.apply(&web_pod("web")).await?;
    cluster.apply(&echo_pod("echo")).await?;
    wait_running(&cluster, "web").await?;
    wait_running(&cluster, "echo").await?;
    let kubectl = std::env::var("KUBECTL").unwrap_or_else(|_| "/usr/bin/kubectl".into());

    exec_checks(&cluster, &kubectl, "web").await?;

    // A terminal: `script` gives kubectl one, so `-t` is honoured.
    let cmd = format!(
        "{kubectl} --cache-dir={} exec -it web -- sh -c 'tty; exit 4'",
        cluster.dir().join("kube-cache").display()
    );
    let out = tokio::process::Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .env("KUBECONFIG", cluster.admin_kubeconfig())
        .env("HOME", cluster.dir())
        .stdin(Stdio::null())
        .output()
        .await?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        text.contains("/dev/pts/") && out.status.code() == Some(4),
        "exec -it: status {:?}, output {text:?}",
        out.status.code()
    );

    // attach: stdin reaches the container's own process (cat).
    let out = cluster
        .kubectl_stdin(&["attach", "-i", "echo"], Some("attached\n"))
        .await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        stdout.contains("attached"),
        "attach -i: status {:?}, stdout {stdout:?}, stderr {:?}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );

    let body = port_forward_get(&cluster, &kubectl, "web").await?;
    assert_eq!(body, "hello-from-pod\n");

    cluster.finish().await
}

/// The oldest and newest supported kubectl (and each one between):
/// SPDY for 1.27-1.29 (passed through to the runtime); from 1.30 exec
/// asks for WebSocket v5, which the agent serves itself; from 1.31
/// port-forward runs over the WebSocket tunnel the agent ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kubectl_version_execs_and_forwards() -> Result<()> {
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    cluster.apply(&web_pod("web")).await?;
    wait_running(&cluster, "web").await?;
    for minor in 27..=33 {
        let binary = format!("{KUBECTL_DIR}/kubectl.1.{minor}");
        if !std::path::Path::new(&binary).exists() {
            continue;
        }
        exec_checks(&cluster, &binary, "web").await?;
        let body = port_forward_get(&cluster, &binary, "web").await?;
        ensure!(
            body == "hello-from-pod\n",
            "{binary} port-forward: {body:?}"
        );
    }
    ensure!(
        websocket_sessions(&cluster, "v5.channel.k8s.io") > 0,
        "no exec was served over WebSocket v5"
    );
    // kubectl 1.31 and later forward over WebSocket (the SPDY tunnel) rather
    // than falling back to SPDY.
    ensure!(
        cluster.nodes()[0]
            .agent_log()
            .contains("port-forward over a WebSocket tunnel"),
        "no port-forward used the WebSocket tunnel"
    );
    cluster.finish().await
}

/// How many exec/attach sessions the node's agent served over WebSocket
/// `protocol` (it logs each one).
fn websocket_sessions(cluster: &Cluster, protocol: &str) -> usize {
    cluster.nodes()[0]
        .agent_log()
        .matches(&format!("remote command over WebSocket {protocol}"))
        .count()
}

/// kubectl 1.33 execs over WebSocket v5.channel.k8s.io, which the agent
/// speaks itself (translated to SPDY towards the runtime) rather than
/// refusing it into kubectl's SPDY fallback: the exit code, stdin ending
/// at EOF (v5's close signal), stdin and output larger than the SPDY
/// windows (flow control), all whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_execs_over_websocket_v5() -> Result<()> {
    let binary = format!("{KUBECTL_DIR}/kubectl.1.33");
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    cluster.apply(&web_pod("web")).await?;
    wait_running(&cluster, "web").await?;
    let before = websocket_sessions(&cluster, "v5.channel.k8s.io");

    exec_checks(&cluster, &binary, "web").await?;

    let out = cluster
        .kubectl_with(&binary, &["exec", "web", "--", "seq", "1", "60000"], None)
        .await?;
    let want: String = (1..=60000).map(|i| format!("{i}\n")).collect();
    ensure!(
        out.status.success() && out.stdout == want.as_bytes(),
        "exec seq 1 60000: status {:?}, {} bytes of stdout (want {}), stderr {:?}",
        out.status.code(),
        out.stdout.len(),
        want.len(),
        String::from_utf8_lossy(&out.stderr)
    );

    let out = cluster
        .kubectl_with(
            &binary,
            &[
                "exec",
                "web",
                "--",
                "sh",
                "-c",
                "echo to-stderr >&2; exit 7",
            ],
            None,
        )
        .await?;
    ensure!(
        out.status.code() == Some(7) && String::from_utf8_lossy(&out.stderr).contains("to-stderr"),
        "exec stderr, exit 7: status {:?}, stderr {:?}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );

    let input: String = (0..20000).map(|i| format!("input line {i}\n")).collect();
    let out = cluster
        .kubectl_with(&binary, &["exec", "-i", "web", "--", "cat"], Some(&input))
        .await?;
    ensure!(
        out.status.success() && out.stdout == input.as_bytes(),
        "exec -i cat with {} bytes: status {:?}, {} bytes back, stderr {:?}",
        input.len(),
        out.status.code(),
        out.stdout.len(),
        String::from_utf8_lossy(&out.stderr)
    );

    // exec_checks' two, and the three above: each on v5, none refused
    // into a fallback.
    let served = websocket_sessions(&cluster, "v5.channel.k8s.io") - before;
    ensure!(served == 5, "{served} of 5 execs were served over v5");
    cluster.finish().await
}
