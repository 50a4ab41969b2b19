//! Services end to end: two nodes as network namespaces, each with its own
//! containerd and agent (proxy, routes, cluster DNS), real kubectl. The
//! same scenario runs with the nftables proxy and again after the agents
//! restart in iptables mode:
//!
//! - a ClusterIP (by DNS name, from a pod on the other node) balances over
//!   three server pods on both nodes; pod-to-pod and node-to-service work
//!   across nodes;
//! - a node port answers from the host on every node;
//! - session affinity pins a client; a service without endpoints refuses
//!   at once; a pod reaches itself through its own service (hairpin);
//! - a pod resolves a service name and a headless name, with the
//!   kubelet's resolv.conf;
//! - traffic policies Local: a node port answers only on nodes with
//!   endpoints, a ClusterIP only for clients on such nodes;
//! - the proxy's /healthz and /metrics answer;
//! - a pod that turns unready stops receiving new connections;
//! - an agent restart keeps an established connection;
//!
//! and once: a hostPort, and `skiff-agent --cleanup` removing the proxy's
//! rules and nothing else.
#![allow(clippy::disallowed_methods)] // a test harness: sync helpers (Drop, cleanup) may sleep, and short-lived commands run under the test's own timeout

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::Api;
use skiff_tests::cluster::{wait_for, Cluster, ClusterOptions};
use skiff_tests::TOOLBOX_IMAGE;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const WAIT: Duration = Duration::from_secs(90);

/// A web server answering with its pod name; ready while /tmp/ready exists.
fn web(name: &str, node: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  labels: {{app: web, name: {name}, node: {node}}}
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
  containers:
  - name: web
    image: {TOOLBOX_IMAGE}
    command: [sh, -c, "mkdir -p /www && hostname > /www/index.html && touch /tmp/ready && exec httpd -f -p 8080 -h /www"]
    ports: [{{name: http, containerPort: 8080}}]
    readinessProbe:
      exec: {{command: [test, -f, /tmp/ready]}}
      periodSeconds: 1
      failureThreshold: 1
  - name: echo
    image: {TOOLBOX_IMAGE}
    command: [nc, -ll, -p, "9000", -e, /bin/cat]
---
"#
    )
}

fn manifests() -> String {
    let mut m = String::new();
    for (name, node) in [
        ("web-1", "node-1"),
        ("web-2", "node-2"),
        ("web-3", "node-2"),
    ] {
        m.push_str(&web(name, node));
    }
    m.push_str(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: client}}
spec:
  nodeName: node-1
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: {TOOLBOX_IMAGE}
    command: [sleep, "3600"]
---
apiVersion: v1
kind: Pod
metadata: {{name: hostport}}
spec:
  nodeName: node-2
  terminationGracePeriodSeconds: 1
  containers:
  - name: web
    image: {TOOLBOX_IMAGE}
    command: [sh, -c, "mkdir -p /www && echo hostport > /www/index.html && exec httpd -f -p 8080 -h /www"]
    ports: [{{containerPort: 8080, hostPort: 18080}}]
---
apiVersion: v1
kind: Service
metadata: {{name: web}}
spec:
  type: NodePort
  selector: {{app: web}}
  ports:
  - {{name: http, port: 80, targetPort: http, nodePort: 30080}}
  - {{name: echo, port: 9000, targetPort: 9000, nodePort: 30090}}
---
apiVersion: v1
kind: Service
metadata: {{name: web-headless}}
spec:
  clusterIP: None
  selector: {{app: web}}
  ports: [{{name: http, port: 8080}}]
---
apiVersion: v1
kind: Service
metadata: {{name: web-sticky}}
spec:
  selector: {{app: web}}
  sessionAffinity: ClientIP
  ports: [{{port: 80, targetPort: 8080}}]
---
apiVersion: v1
kind: Service
metadata: {{name: web-2-self}}
spec:
  selector: {{name: web-2}}
  ports: [{{port: 80, targetPort: 8080}}]
---
apiVersion: v1
kind: Service
metadata: {{name: web-local}}
spec:
  type: NodePort
  externalTrafficPolicy: Local
  selector: {{app: web, node: node-2}}
  ports: [{{port: 80, targetPort: 8080, nodePort: 30081}}]
---
apiVersion: v1
kind: Service
metadata: {{name: web-itp}}
spec:
  internalTrafficPolicy: Local
  selector: {{app: web, node: node-2}}
  ports: [{{port: 80, targetPort: 8080}}]
---
apiVersion: v1
kind: Service
metadata: {{name: empty}}
spec:
  selector: {{app: nothing}}
  ports: [{{port: 80}}]
"#
    ));
    m
}

/// `kubectl exec POD -- sh -c SCRIPT`, stdout.
async fn sh(cluster: &Cluster, pod: &str, script: &str) -> Result<String> {
    let container = if pod.starts_with("web-") { "web" } else { "" };
    let mut args = vec!["exec", pod];
    if !container.is_empty() {
        args.extend(["-c", container]);
    }
    args.extend(["--", "sh", "-c", script]);
    cluster.kubectl_ok(&args).await
}

/// Which pods answer `n` requests to `url` from `pod`.
async fn answers(cluster: &Cluster, pod: &str, url: &str, n: usize) -> Result<Vec<String>> {
    // busybox 1.35's wget crashes on its own -T timeout: timeout(1) instead.
    let script =
        format!("for i in $(seq {n}); do timeout 5 wget -q -O - {url} || echo FAILED; done");
    let out = sh(cluster, pod, &script).await?;
    Ok(out.lines().map(str::to_string).collect())
}

fn distinct(v: &[String]) -> BTreeSet<String> {
    v.iter().cloned().collect()
}

async fn http_get(addr: &str) -> Result<String> {
    let url = format!("http://{addr}/");
    let body = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .no_proxy()
        .build()?
        .get(&url)
        .send()
        .await
        .with_context(|| format!("GET {url}"))?
        .text()
        .await?;
    Ok(body.trim().to_string())
}

/// `url` fetched from inside a node's network namespace (the host's
/// busybox: nothing of the node but its network).
async fn node_get(cluster: &Cluster, node: &str, url: &str) -> Result<String> {
    let out = cluster
        .node(node)
        .context("no such node")?
        .netns()
        .tokio_command("busybox")
        .args(["timeout", "5", "busybox", "wget", "-q", "-O", "-", url])
        .output()
        .await?;
    ensure!(out.status.success(), "{url} from {node}: {out:?}");
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The scenario that must hold in every proxy mode.
async fn scenario(cluster: &mut Cluster, mode: &str) -> Result<()> {
    let client = cluster.client().await?;
    let svc = Api::<Service>::default_namespaced(client.clone())
        .get("web")
        .await?;
    let cluster_ip = svc
        .spec
        .and_then(|s| s.cluster_ip)
        .context("web has no ClusterIP")?;

    // Balanced over all three, from a pod on node-1, two of them on node-2.
    let all: BTreeSet<String> = ["web-1", "web-2", "web-3"].map(String::from).into();
    let seen = wait_for(
        &format!("[{mode}] web to answer from all pods"),
        WAIT,
        || async {
            let got = answers(
                cluster,
                "client",
                "http://web.default.svc.cluster.local/",
                30,
            )
            .await?;
            ensure!(distinct(&got) == all, "answers: {:?}", distinct(&got));
            Ok(got)
        },
    )
    .await?;
    eprintln!(
        "[{mode}] ClusterIP by name balanced over {:?}",
        distinct(&seen)
    );
    // Short name through the search path, and node-to-service.
    let short = answers(cluster, "client", "http://web/", 3).await?;
    ensure!(
        short.iter().all(|a| all.contains(a)),
        "short name: {short:?}"
    );
    let body = node_get(cluster, "node-2", &format!("http://{cluster_ip}/")).await?;
    ensure!(all.contains(&body), "node-2 to the ClusterIP: {body:?}");

    // Node ports from the host, on both nodes.
    for node in ["node-1", "node-2"] {
        let ip = cluster.node(node).context("node")?.ip();
        let body = wait_for(&format!("[{mode}] node port on {node}"), WAIT, || async {
            http_get(&format!("{ip}:30080")).await
        })
        .await?;
        ensure!(all.contains(&body), "node port {node}: {body:?}");
    }

    // externalTrafficPolicy Local: only node-2 has endpoints.
    let ip1 = cluster.node("node-1").context("node-1")?.ip();
    let ip2 = cluster.node("node-2").context("node-2")?.ip();
    let local = http_get(&format!("{ip2}:30081")).await?;
    ensure!(
        ["web-2", "web-3"].contains(&local.as_str()),
        "[{mode}] eTP Local on node-2: {local:?}"
    );
    ensure!(
        http_get(&format!("{ip1}:30081")).await.is_err(),
        "[{mode}] eTP Local answered on node-1, which has no endpoint"
    );
    // internalTrafficPolicy Local: node-1's client has no local endpoint.
    let from1 = answers(cluster, "client", "http://web-itp/", 1).await?;
    ensure!(
        from1 == ["FAILED"],
        "[{mode}] iTP Local from node-1: {from1:?}"
    );
    let from2 = sh(cluster, "web-2", "timeout 5 wget -q -O - http://web-itp/").await?;
    ensure!(
        ["web-2", "web-3"].contains(&from2.trim()),
        "[{mode}] iTP Local from node-2: {from2:?}"
    );

    // The proxy's health and metrics endpoints.
    let health = reqwest::get(format!("http://{ip1}:10256/healthz")).await?;
    ensure!(
        health.status() == 200,
        "[{mode}] /healthz: {}",
        health.status()
    );
    let body = health.text().await?;
    ensure!(
        body.contains("lastUpdated"),
        "[{mode}] /healthz body: {body}"
    );
    let metrics = node_get(cluster, "node-1", "http://127.0.0.1:10249/metrics").await?;
    ensure!(
        metrics.contains("kubeproxy_sync_proxy_rules_duration_seconds_count")
            && metrics.contains("skiff_proxy_rules_programmed"),
        "[{mode}] /metrics: {metrics}"
    );

    // Session affinity: one client, one backend.
    let sticky = answers(cluster, "client", "http://web-sticky/", 20).await?;
    ensure!(
        distinct(&sticky).len() == 1 && !sticky.contains(&"FAILED".to_string()),
        "[{mode}] affinity: {sticky:?}"
    );

    // No endpoints: refused at once, not a timeout.
    let refused = sh(
        cluster,
        "client",
        "timeout 20 wget -q -O - http://empty/ 2>&1 || true",
    )
    .await?;
    ensure!(
        refused.contains("Connection refused"),
        "[{mode}] a service without endpoints: {refused:?}"
    );

    // Hairpin: web-2 through a service whose only endpoint is itself.
    let me = sh(
        cluster,
        "web-2",
        "timeout 5 wget -q -O - http://web-2-self/",
    )
    .await?;
    ensure!(me.trim() == "web-2", "[{mode}] hairpin: {me:?}");

    // DNS: the pod's resolv.conf, a headless name, a missing name.
    let resolv = sh(cluster, "client", "cat /etc/resolv.conf").await?;
    ensure!(
        resolv.contains("search default.svc.cluster.local svc.cluster.local cluster.local")
            && resolv.contains("ndots:5"),
        "resolv.conf: {resolv}"
    );
    let pods = Api::<Pod>::default_namespaced(client.clone());
    let mut ips = BTreeSet::new();
    for p in ["web-1", "web-2", "web-3"] {
        ips.insert(
            pods.get(p)
                .await?
                .status
                .and_then(|s| s.pod_ip)
                .context("pod IP")?,
        );
    }
    let lookup = sh(
        cluster,
        "client",
        "nslookup web-headless.default.svc.cluster.local",
    )
    .await?;
    for ip in &ips {
        ensure!(
            lookup.contains(ip.as_str()),
            "headless lookup lacks {ip}: {lookup}"
        );
    }
    let lookup = sh(cluster, "client", "nslookup web.default.svc.cluster.local").await?;
    ensure!(lookup.contains(&cluster_ip), "service lookup: {lookup}");
    let missing = sh(
        cluster,
        "client",
        "nslookup nope.default.svc.cluster.local 2>&1 || true",
    )
    .await?;
    ensure!(
        missing.contains("NXDOMAIN") || missing.contains("can't find"),
        "missing name: {missing}"
    );
    // The API server (on the host, outside the pod network) through the
    // kubernetes Service: DNAT to its EndpointSlice, masquerade on the way
    // out of the pod network.
    let api = sh(
        cluster,
        "client",
        "echo | timeout 5 nc -w 3 kubernetes.default.svc.cluster.local 443 && echo open || echo closed",
    )
    .await?;
    ensure!(
        api.trim().ends_with("open"),
        "[{mode}] the kubernetes service: {api:?}"
    );

    // Pod to pod across nodes, directly.
    let web2_ip = pods
        .get("web-2")
        .await?
        .status
        .and_then(|s| s.pod_ip)
        .context("ip")?;
    let direct = answers(cluster, "client", &format!("http://{web2_ip}:8080/"), 1).await?;
    ensure!(direct == ["web-2"], "pod to pod across nodes: {direct:?}");

    // web-3 turns unready: no new connections reach it.
    sh(cluster, "web-3", "rm /tmp/ready").await?;
    wait_for(
        &format!("[{mode}] web-3 to leave the rotation"),
        WAIT,
        || async {
            let got = answers(cluster, "client", "http://web/", 30).await?;
            ensure!(
                !got.contains(&"web-3".to_string()) && !got.contains(&"FAILED".to_string()),
                "answers: {got:?}"
            );
            Ok(())
        },
    )
    .await?;
    sh(cluster, "web-3", "touch /tmp/ready").await?;

    // An established connection (host -> node port -> echo container)
    // survives an agent restart and the full resync that follows it.
    let ip = cluster.node("node-1").context("node-1")?.ip();
    let stream = tokio::net::TcpStream::connect((ip, 30090)).await?;
    let (r, mut w) = stream.into_split();
    let mut lines = BufReader::new(r).lines();
    w.write_all(b"before\n").await?;
    ensure!(lines.next_line().await?.as_deref() == Some("before"));
    let node1 = cluster.node_mut("node-1").context("node-1")?;
    node1.kill_agent();
    node1.start_agent()?;
    cluster.wait_node_ready("node-1", WAIT).await?;
    // The restarted proxy has synced once node ports answer again.
    wait_for("node-1's proxy to sync after the restart", WAIT, || async {
        http_get(&format!("{ip}:30080")).await
    })
    .await?;
    w.write_all(b"after\n").await?;
    let again = tokio::time::timeout(Duration::from_secs(10), lines.next_line()).await;
    match again {
        Ok(Ok(Some(l))) if l == "after" => {}
        other => bail!("[{mode}] established connection after an agent restart: {other:?}"),
    }
    eprintln!("[{mode}] scenario passed");
    Ok(())
}

/// The node's ruleset (nftables, which also shows iptables-nft's rules).
async fn ruleset(cluster: &Cluster, node: &str) -> Result<String> {
    let n = cluster.node(node).context("node")?;
    let out = n
        .netns()
        .tokio_command("nft")
        .args(["list", "ruleset"])
        .output()
        .await?;
    ensure!(out.status.success(), "nft list ruleset: {out:?}");
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The ruleset without what the proxy owns: its table, the `SKIFF-`
/// chains of iptables-nft's tables and the rules jumping to them. Blank
/// lines are dropped, as their placement follows what was removed.
fn without_proxy(ruleset: &str) -> String {
    let mut out = Vec::new();
    // The closing line of the block being skipped.
    let mut skip_until: Option<&str> = None;
    for line in ruleset.lines() {
        if let Some(end) = skip_until {
            if line == end {
                skip_until = None;
            }
            continue;
        }
        if line.starts_with("table ip skiff-proxy") {
            skip_until = Some("}");
            continue;
        }
        if line.trim_start().starts_with("chain SKIFF-") {
            skip_until = Some("\t}");
            continue;
        }
        if !line.contains("SKIFF-") && !line.trim().is_empty() {
            out.push(line);
        }
    }
    out.join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_work_in_both_proxy_modes() -> Result<()> {
    let mut cluster = Cluster::start(2, ClusterOptions::default()).await?;
    cluster.apply(&manifests()).await?;
    let pods = Api::<Pod>::default_namespaced(cluster.client().await?);
    wait_for("every pod Running and Ready", WAIT, || async {
        for p in ["web-1", "web-2", "web-3", "client", "hostport"] {
            let pod = pods.get(p).await?;
            let ready = pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            ensure!(ready, "{p} is not Ready yet");
        }
        Ok(())
    })
    .await?;

    // hostPort, from the host.
    let ip2 = cluster.node("node-2").context("node-2")?.ip();
    let body = wait_for("hostPort 18080 on node-2", WAIT, || async {
        http_get(&format!("{ip2}:18080")).await
    })
    .await?;
    ensure!(body == "hostport", "hostPort answered {body:?}");

    scenario(&mut cluster, "nftables").await?;
    let nft = ruleset(&cluster, "node-1").await?;
    ensure!(
        nft.contains("table ip skiff-proxy"),
        "no nftables table:\n{nft}"
    );
    ensure!(
        !nft.contains("SKIFF-"),
        "iptables rules in nftables mode:\n{nft}"
    );

    for node in ["node-1", "node-2"] {
        let n = cluster.node_mut(node).context("node")?;
        n.kill_agent();
        n.set_agent_flag("proxy-mode", "iptables");
        n.start_agent()?;
    }
    for node in ["node-1", "node-2"] {
        cluster.wait_node_ready(node, WAIT).await?;
    }
    scenario(&mut cluster, "iptables").await?;
    let ipt = ruleset(&cluster, "node-1").await?;
    ensure!(ipt.contains("SKIFF-SERVICES"), "no iptables chains:\n{ipt}");
    ensure!(
        !ipt.contains("table ip skiff-proxy"),
        "the nftables table outlived the switch to iptables:\n{ipt}"
    );

    // --cleanup removes the proxy's rules, and nothing else.
    let node = cluster.node_mut("node-2").context("node-2")?;
    node.kill_agent();
    let before = ruleset(&cluster, "node-2").await?;
    let agent = skiff_tests::agent::workspace_binary("skiff-agent", "skiff-agent")?;
    let out = cluster
        .node("node-2")
        .context("node-2")?
        .netns()
        .tokio_command(agent)
        .arg("--cleanup")
        .output()
        .await?;
    ensure!(out.status.success(), "skiff-agent --cleanup: {out:?}");
    let after = ruleset(&cluster, "node-2").await?;
    ensure!(
        !after.contains("SKIFF-") && !after.contains("skiff-proxy"),
        "proxy rules left after --cleanup:\n{after}"
    );
    ensure!(
        without_proxy(&after) == without_proxy(&before),
        "--cleanup changed rules that are not the proxy's:\nbefore:\n{before}\nafter:\n{after}"
    );
    cluster
        .node_mut("node-2")
        .context("node-2")?
        .start_agent()?;
    cluster.finish().await
}
