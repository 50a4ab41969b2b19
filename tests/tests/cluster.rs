//! The whole system end to end: `skiff-server` (API, scheduler,
//! controllers) and two nodes (a containerd and a `skiff-agent` each, pod
//! subnets from the server's node IPAM), driven with the real kubectl.
//!
//! Each test has a cluster of its own, so a failure belongs to one
//! scenario; a failing test prints the cluster's state and log tails.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use futures::TryStreamExt as _;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node as NodeObject, Pod};
use kube::api::ListParams;
use kube::runtime::watcher;
use kube::Api;
use skiff_tests::agent::{pods, workspace_binary};
use skiff_tests::cluster::{
    ip_in_cidr, node_ready, ready_status, wait_for, Cluster, ClusterOptions, NodeOptions,
};
use skiff_tests::TOOLBOX_IMAGE;

/// Time for anything that involves starting or stopping pods.
const T: Duration = Duration::from_secs(90);

/// A container that exits at once on SIGTERM (a shell as PID 1 ignores
/// it otherwise, and every deletion would wait the whole grace period).
const SLEEPER: &str = "trap 'exit 0' TERM; sleep 3600 & wait";

/// A Deployment of the toolbox image running [`SLEEPER`].
fn deployment(name: &str, replicas: u32, image: &str, surge: u32, unavailable: u32) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: {name}
spec:
  replicas: {replicas}
  selector:
    matchLabels: {{app: {name}}}
  strategy:
    type: RollingUpdate
    rollingUpdate: {{maxSurge: {surge}, maxUnavailable: {unavailable}}}
  template:
    metadata:
      labels: {{app: {name}}}
    spec:
      terminationGracePeriodSeconds: 5
      containers:
      - name: main
        image: {image}
        imagePullPolicy: IfNotPresent
        command: [sh, -c, "{SLEEPER}"]
"#
    )
}

async fn list_pods(client: &kube::Client, selector: &str) -> Result<Vec<Pod>> {
    let api = Api::<Pod>::namespaced(client.clone(), "default");
    Ok(api
        .list(&ListParams::default().labels(selector))
        .await?
        .items)
}

fn terminating(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_some()
}

fn node_of(p: &Pod) -> String {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}

fn uid(p: &Pod) -> String {
    p.metadata.uid.clone().unwrap_or_default()
}

fn name(p: &Pod) -> String {
    p.metadata.name.clone().unwrap_or_default()
}

fn image(p: &Pod) -> String {
    p.spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.image.clone())
        .unwrap_or_default()
}

/// One line per pod: name, node, phase, ready, terminating.
fn describe(pods: &[Pod]) -> String {
    let lines: Vec<String> = pods
        .iter()
        .map(|p| {
            format!(
                "{} node={} phase={} ready={} terminating={}",
                name(p),
                node_of(p),
                pods::phase(p),
                pods::ready(p),
                terminating(p)
            )
        })
        .collect();
    format!("[{}]", lines.join("; "))
}

/// Waits until exactly `n` pods match `selector`, none terminating, all
/// Running and Ready; returns them.
async fn wait_ready_pods(cluster: &Cluster, selector: &str, n: usize) -> Result<Vec<Pod>> {
    let client = cluster.client().await?;
    wait_for(&format!("{n} Ready pods {selector}"), T, || async {
        let pods = list_pods(&client, selector).await?;
        let ok = pods.len() == n
            && pods
                .iter()
                .all(|p| !terminating(p) && pods::phase(p) == "Running" && pods::ready(p));
        ensure!(ok, "pods: {}", describe(&pods));
        Ok(pods)
    })
    .await
}

/// The nodes' podCIDRs by node name.
async fn pod_cidrs(client: &kube::Client) -> Result<HashMap<String, String>> {
    let nodes = Api::<NodeObject>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    Ok(nodes
        .items
        .into_iter()
        .filter_map(|n| {
            let cidr = n.spec.as_ref()?.pod_cidr.clone()?;
            Some((n.metadata.name?, cidr))
        })
        .collect())
}

/// A running container seen through CRI: node, pod uid, container name, id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Running {
    node: String,
    pod_uid: String,
    container: String,
    id: String,
}

/// Every running container on every node.
async fn running_containers(cluster: &Cluster) -> Result<Vec<Running>> {
    let mut out = Vec::new();
    for node in cluster.nodes() {
        for c in node.running_containers().await? {
            let label = |k: &str| c.labels.get(k).cloned().unwrap_or_default();
            out.push(Running {
                node: node.name().to_string(),
                pod_uid: label("io.kubernetes.pod.uid"),
                container: label("io.kubernetes.container.name"),
                id: c.id.clone(),
            });
        }
    }
    out.sort();
    Ok(out)
}

/// Containers (any state) and sandboxes of `uids`, on any node.
async fn leftovers_of(cluster: &Cluster, uids: &BTreeSet<String>) -> Result<Vec<String>> {
    let mut left = Vec::new();
    for node in cluster.nodes() {
        for c in node.containers().await? {
            let uid = c.labels.get("io.kubernetes.pod.uid").cloned();
            if uid.is_some_and(|u| uids.contains(&u)) {
                left.push(format!(
                    "{}: container {} ({:?})",
                    node.name(),
                    c.id,
                    c.labels
                ));
            }
        }
        for s in node.sandboxes().await? {
            let uid = s.metadata.as_ref().map(|m| m.uid.clone());
            if uid.is_some_and(|u| uids.contains(&u)) {
                left.push(format!("{}: sandbox {}", node.name(), s.id));
            }
        }
    }
    Ok(left)
}

/// The reasons of the events in `default` (through kubectl).
async fn event_reasons(cluster: &Cluster) -> Result<BTreeSet<String>> {
    let out = cluster
        .kubectl_ok(&["get", "events", "-n", "default", "-o", "json"])
        .await?;
    let v: serde_json::Value = serde_json::from_str(&out)?;
    Ok(v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["reason"].as_str().map(str::to_string))
        .collect())
}

/// The messages of `reason` events about pod `pod`.
async fn pod_events(cluster: &Cluster, pod: &str, reason: &str) -> Result<Vec<String>> {
    let selector = format!("involvedObject.name={pod},reason={reason}");
    let out = cluster
        .kubectl_ok(&[
            "get",
            "events",
            "-n",
            "default",
            "--field-selector",
            &selector,
            "-o",
            "json",
        ])
        .await?;
    let v: serde_json::Value = serde_json::from_str(&out)?;
    Ok(v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["message"].as_str().map(str::to_string))
        .collect())
}

/// The seed scenario: `kubectl apply` of a Deployment runs one pod on each
/// node, every step shows as an event, and deleting the Deployment
/// removes its ReplicaSet, pods and containers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployment_runs_pods_on_both_nodes_and_deletes_them() -> Result<()> {
    let cluster = Cluster::start(2, ClusterOptions::default()).await?;
    let client = cluster.client().await?;
    cluster
        .apply(&deployment("web", 2, TOOLBOX_IMAGE, 1, 0))
        .await?;
    let pods = wait_ready_pods(&cluster, "app=web", 2).await?;

    // Spread: one pod per node, each IP from its node's podCIDR.
    let nodes: BTreeSet<String> = pods.iter().map(node_of).collect();
    ensure!(
        nodes.len() == 2,
        "pods not spread over both nodes: {}",
        describe(&pods)
    );
    let cidrs = pod_cidrs(&client).await?;
    ensure!(
        cidrs.values().collect::<BTreeSet<_>>().len() == 2,
        "nodes share a podCIDR: {cidrs:?}"
    );
    for p in &pods {
        let ip = p
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .with_context(|| format!("pod {} has no IP", name(p)))?;
        let cidr = &cidrs[&node_of(p)];
        ensure!(
            ip_in_cidr(&ip, cidr),
            "pod {} on {} has IP {ip} outside the node's podCIDR {cidr}",
            name(p),
            node_of(p)
        );
    }

    // Each pod's container runs on its node, once.
    let running = running_containers(&cluster).await?;
    for p in &pods {
        let mine: Vec<&Running> = running.iter().filter(|r| r.pod_uid == uid(p)).collect();
        ensure!(
            mine.len() == 1 && mine[0].node == node_of(p) && mine[0].container == "main",
            "pod {} on {}: running containers {mine:?}",
            name(p),
            node_of(p)
        );
    }

    // Every step of the chain is an event.
    let wanted = [
        "ScalingReplicaSet",
        "SuccessfulCreate",
        "Scheduled",
        "Created",
        "Started",
    ];
    wait_for("the events of every step", T, || async {
        let reasons = event_reasons(&cluster).await?;
        let missing: Vec<&str> = wanted
            .iter()
            .copied()
            .filter(|r| !reasons.contains(*r))
            .collect();
        let pulled = reasons.contains("Pulled") || reasons.contains("Pulling");
        ensure!(
            missing.is_empty() && pulled,
            "missing {missing:?}{} in {reasons:?}",
            if pulled { "" } else { " and Pulled/Pulling" }
        );
        Ok(())
    })
    .await?;
    let table = cluster.kubectl_ok(&["get", "events"]).await?;
    ensure!(table.contains("Scheduled"), "kubectl get events:\n{table}");

    let deploy = Api::<Deployment>::namespaced(client.clone(), "default");
    wait_for("Deployment status 2/2 available", T, || async {
        let d = deploy.get("web").await?;
        let s = d.status.unwrap_or_default();
        ensure!(
            s.ready_replicas == Some(2) && s.available_replicas == Some(2),
            "status {s:?}"
        );
        Ok(())
    })
    .await?;

    // Deletion cascades to the ReplicaSet, the pods and their containers.
    let uids: BTreeSet<String> = pods.iter().map(uid).collect();
    cluster
        .kubectl_ok(&["delete", "deployment", "web", "--wait=false"])
        .await?;
    let rs = Api::<ReplicaSet>::namespaced(client.clone(), "default");
    wait_for("ReplicaSet, pods and containers gone", T, || async {
        let sets = rs.list(&ListParams::default().labels("app=web")).await?;
        ensure!(
            sets.items.is_empty(),
            "{} ReplicaSets left",
            sets.items.len()
        );
        let left = list_pods(&client, "app=web").await?;
        ensure!(left.is_empty(), "pods left: {}", describe(&left));
        let left = leftovers_of(&cluster, &uids).await?;
        ensure!(left.is_empty(), "on the nodes: {left:?}");
        Ok(())
    })
    .await?;
    cluster.finish().await
}

/// Watches the pods of `selector` and records, after every change, how
/// many are available (Ready, not terminating) and how many exist (not
/// terminating).
struct PodCounter {
    /// (fewest available, state then), (most existing, state then), events.
    seen: Arc<Mutex<Counts>>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Debug, Default)]
struct Counts {
    min_available: Option<(usize, String)>,
    max_existing: Option<(usize, String)>,
    images: BTreeSet<String>,
}

impl PodCounter {
    fn start(client: kube::Client, selector: &str) -> PodCounter {
        let api = Api::<Pod>::namespaced(client, "default");
        let seen = Arc::new(Mutex::new(Counts::default()));
        let counts = seen.clone();
        let config = watcher::Config::default().labels(selector);
        let task = tokio::spawn(async move {
            let mut pods: BTreeMap<String, Pod> = BTreeMap::new();
            let mut fresh: BTreeMap<String, Pod> = BTreeMap::new();
            // Counted only from a complete list on: not during (re-)lists.
            let mut listing = true;
            let mut stream = std::pin::pin!(watcher(api, config));
            while let Ok(Some(event)) = stream.try_next().await {
                match event {
                    watcher::Event::Apply(p) => {
                        pods.insert(uid(&p), p);
                    }
                    watcher::Event::Delete(p) => {
                        pods.remove(&uid(&p));
                    }
                    watcher::Event::Init => {
                        listing = true;
                        fresh.clear();
                    }
                    watcher::Event::InitApply(p) => {
                        fresh.insert(uid(&p), p);
                    }
                    watcher::Event::InitDone => {
                        listing = false;
                        pods = std::mem::take(&mut fresh);
                    }
                }
                if listing {
                    continue;
                }
                let active: Vec<Pod> = pods.values().filter(|p| !terminating(p)).cloned().collect();
                let available = active.iter().filter(|p| pods::ready(p)).count();
                let state = describe(&pods.values().cloned().collect::<Vec<_>>());
                let mut c = counts.lock().unwrap_or_else(|e| e.into_inner());
                if c.min_available.as_ref().is_none_or(|(m, _)| available < *m) {
                    c.min_available = Some((available, state.clone()));
                }
                if c.max_existing
                    .as_ref()
                    .is_none_or(|(m, _)| active.len() > *m)
                {
                    c.max_existing = Some((active.len(), state));
                }
                c.images.extend(active.iter().map(image));
            }
        });
        PodCounter { seen, task }
    }

    fn stop(self) -> Counts {
        self.task.abort();
        let mut c = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut *c)
    }
}

async fn wait_deployment_available(cluster: &Cluster, name: &str, n: i32) -> Result<Deployment> {
    let api = Api::<Deployment>::namespaced(cluster.client().await?, "default");
    wait_for(
        &format!("deployment {name} {n}/{n} updated and available"),
        T,
        || async {
            let d = api.get(name).await?;
            let s = d.status.clone().unwrap_or_default();
            let generation = d.metadata.generation;
            ensure!(
                s.observed_generation == generation
                    && s.replicas == Some(n)
                    && s.updated_replicas == Some(n)
                    && s.available_replicas == Some(n),
                "generation {generation:?}, status {s:?}"
            );
            Ok(d)
        },
    )
    .await
}

/// `kubectl scale` 2 -> 6 -> 1, then a rolling update to another image
/// tag that keeps at least replicas - maxUnavailable pods available and
/// at most replicas + maxSurge pods, and `kubectl rollout undo`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_rolling_update_and_undo() -> Result<()> {
    let cluster = Cluster::start(2, ClusterOptions::default()).await?;
    let client = cluster.client().await?;
    for node in cluster.nodes() {
        node.containerd().images().load_toolbox_tag("2.0").await?;
    }
    let v2 = "skiff.test/toolbox:2.0";
    cluster
        .apply(&deployment("roll", 2, TOOLBOX_IMAGE, 1, 1))
        .await?;
    wait_ready_pods(&cluster, "app=roll", 2).await?;
    for n in [6, 1, 3] {
        cluster
            .kubectl_ok(&["scale", "deployment/roll", &format!("--replicas={n}")])
            .await?;
        wait_ready_pods(&cluster, "app=roll", n).await?;
        wait_deployment_available(&cluster, "roll", n as i32).await?;
    }
    let rs = Api::<ReplicaSet>::namespaced(client.clone(), "default");
    let first_rs: Vec<String> = rs
        .list(&ListParams::default().labels("app=roll"))
        .await?
        .items
        .into_iter()
        .filter_map(|r| r.metadata.name)
        .collect();
    ensure!(
        first_rs.len() == 1,
        "one ReplicaSet before the update: {first_rs:?}"
    );

    // Rolling update: 3 replicas, maxSurge 1, maxUnavailable 1.
    let counter = PodCounter::start(client.clone(), "app=roll");
    cluster
        .kubectl_ok(&["set", "image", "deployment/roll", &format!("main={v2}")])
        .await?;
    cluster
        .kubectl_ok(&["rollout", "status", "deployment/roll", "--timeout=90s"])
        .await?;
    let pods = wait_ready_pods(&cluster, "app=roll", 3).await?;
    ensure!(
        pods.iter().all(|p| image(p) == v2),
        "after the rollout: {:?}",
        pods.iter().map(image).collect::<Vec<_>>()
    );
    let counts = counter.stop();
    let (min, at) = counts.min_available.context("the watch saw no pods")?;
    ensure!(
        min >= 2,
        "only {min} pods available during the rollout (maxUnavailable 1 of 3): {at}"
    );
    let (max, at) = counts.max_existing.context("the watch saw no pods")?;
    ensure!(
        max <= 4,
        "{max} pods at once during the rollout (maxSurge 1 over 3): {at}"
    );
    ensure!(
        counts.images.contains(TOOLBOX_IMAGE) && counts.images.contains(v2),
        "the watch did not see the rollout: images {:?}",
        counts.images
    );

    // Undo brings the first template back, in its own ReplicaSet.
    cluster
        .kubectl_ok(&["rollout", "undo", "deployment/roll"])
        .await?;
    cluster
        .kubectl_ok(&["rollout", "status", "deployment/roll", "--timeout=90s"])
        .await?;
    let pods = wait_ready_pods(&cluster, "app=roll", 3).await?;
    ensure!(
        pods.iter().all(|p| image(p) == TOOLBOX_IMAGE),
        "after undo: {:?}",
        pods.iter().map(image).collect::<Vec<_>>()
    );
    wait_for("the first ReplicaSet to own the pods again", T, || async {
        let sets = rs.list(&ListParams::default().labels("app=roll")).await?;
        let scaled: Vec<(String, i32)> = sets
            .items
            .iter()
            .map(|r| {
                let n = r.spec.replicas.unwrap_or(0);
                (r.metadata.name.clone().unwrap_or_default(), n)
            })
            .collect();
        let active: Vec<&(String, i32)> = scaled.iter().filter(|(_, n)| *n > 0).collect();
        ensure!(
            active.len() == 1 && first_rs.contains(&active[0].0) && active[0].1 == 3,
            "ReplicaSets (name, replicas): {scaled:?}"
        );
        Ok(())
    })
    .await?;

    // The nodes run exactly the pods the API has.
    wait_for("only the 3 pods' containers to run", T, || async {
        let pods = list_pods(&client, "app=roll").await?;
        let uids: BTreeSet<String> = pods.iter().map(uid).collect();
        let running = running_containers(&cluster).await?;
        let ours: BTreeSet<String> = running.iter().map(|r| r.pod_uid.clone()).collect();
        ensure!(
            running.len() == 3 && ours == uids,
            "running {running:?}, pods {}",
            describe(&pods)
        );
        Ok(())
    })
    .await?;
    cluster.finish().await
}

/// Millicores of a CPU quantity (`2`, `1.5`, `1500m`).
fn millicores(q: &str) -> Option<i64> {
    match q.strip_suffix('m') {
        Some(m) => m.parse().ok(),
        None => q.parse::<f64>().ok().map(|c| (c * 1000.0) as i64),
    }
}

/// A bare pod of the toolbox with `extra` spec lines and a CPU request.
fn pod_with(name: &str, extra: &str, cpu_millis: i64) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 1\n{extra}  containers:\n  - name: main\n    image: {TOOLBOX_IMAGE}\n    imagePullPolicy: Never\n    command: [sh, -c, \"{SLEEPER}\"]\n    resources:\n      requests: {{cpu: {cpu_millis}m}}\n"
    )
}

/// Pods that fit no node stay Pending with a FailedScheduling event that
/// says why (no room: the nodes are filled up first; a label no node
/// has), and are scheduled when a node that has room and the label joins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unschedulable_pods_wait_for_a_node_that_fits() -> Result<()> {
    let mut cluster = Cluster::start(2, ClusterOptions::default()).await?;
    let client = cluster.client().await?;
    let api = Api::<Pod>::namespaced(client.clone(), "default");
    let node = Api::<NodeObject>::all(client.clone()).get("node-1").await?;
    let allocatable = node
        .status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .and_then(|a| a.get("cpu"))
        .and_then(|q| millicores(&q.0))
        .context("node-1 has no allocatable cpu")?;
    // 60% each: two never share a node, so each node is left without room.
    let big = allocatable * 6 / 10;
    for name in ["filler-1", "filler-2"] {
        cluster.apply(&pod_with(name, "", big)).await?;
    }
    wait_for("the fillers to run on both nodes", T, || async {
        let pods = [api.get("filler-1").await?, api.get("filler-2").await?];
        let nodes: BTreeSet<String> = pods.iter().map(node_of).collect();
        ensure!(
            nodes.len() == 2 && pods.iter().all(|p| pods::phase(p) == "Running"),
            "fillers: {}",
            describe(&pods)
        );
        Ok(())
    })
    .await?;
    cluster.apply(&pod_with("roomy", "", big)).await?;
    cluster
        .apply(&pod_with("picky", "  nodeSelector: {disk: big}\n", 10))
        .await?;
    for (pod, reason) in [
        ("roomy", "2 Insufficient cpu"),
        (
            "picky",
            "2 node(s) didn't match Pod's node affinity/selector",
        ),
    ] {
        wait_for(&format!("FailedScheduling of {pod}"), T, || async {
            let messages = pod_events(&cluster, pod, "FailedScheduling").await?;
            ensure!(
                messages
                    .iter()
                    .any(|m| m.contains("0/2 nodes are available") && m.contains(reason)),
                "FailedScheduling messages: {messages:?}"
            );
            let p = api.get(pod).await?;
            let cond = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"))
                .cloned();
            ensure!(
                cond.as_ref().is_some_and(
                    |c| c.status == "False" && c.reason.as_deref() == Some("Unschedulable")
                ),
                "PodScheduled condition {cond:?}"
            );
            ensure!(
                node_of(&p).is_empty() && pods::phase(&p) == "Pending",
                "{}",
                describe(&[p])
            );
            Ok(())
        })
        .await?;
    }

    let labels = vec![("disk".to_string(), "big".to_string())];
    let new_node = cluster
        .add_node(NodeOptions {
            labels,
            ..Default::default()
        })
        .await?
        .name()
        .to_string();
    let pods = wait_for("roomy and picky to run on the new node", T, || async {
        let pods = [api.get("roomy").await?, api.get("picky").await?];
        ensure!(
            pods.iter()
                .all(|p| node_of(p) == new_node && pods::phase(p) == "Running" && pods::ready(p)),
            "{}",
            describe(&pods)
        );
        Ok(pods)
    })
    .await?;
    let running = running_containers(&cluster).await?;
    for p in &pods {
        ensure!(
            running
                .iter()
                .any(|r| r.pod_uid == uid(p) && r.node == new_node),
            "{}'s container is not running on {new_node}: {running:?}",
            name(p)
        );
    }
    cluster.finish().await
}

/// An agent killed: its node goes Unknown after the grace period, its
/// pods are evicted and replaced on the other node; when the agent comes
/// back it removes the evicted pods' containers, and no pod's container
/// ever runs on two nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_of_a_lost_node_move_and_never_run_twice() -> Result<()> {
    let options = ClusterOptions {
        node_monitor_grace_period: Duration::from_secs(8),
        not_ready_toleration_seconds: Some(5),
        unreachable_toleration_seconds: Some(5),
        ..Default::default()
    };
    let mut cluster = Cluster::start(2, options).await?;
    let client = cluster.client().await?;
    cluster
        .apply(&deployment("move", 2, TOOLBOX_IMAGE, 1, 0))
        .await?;
    let pods = wait_ready_pods(&cluster, "app=move", 2).await?;
    let lost = "node-2".to_string();
    let victims: Vec<Pod> = pods
        .iter()
        .filter(|p| node_of(p) == lost)
        .cloned()
        .collect();
    ensure!(!victims.is_empty(), "no pod on {lost}: {}", describe(&pods));
    let victim_uids: BTreeSet<String> = victims.iter().map(uid).collect();

    cluster.node_mut(&lost).context("node-2")?.kill_agent();
    let nodes = Api::<NodeObject>::all(client.clone());
    wait_for(
        &format!("{lost} to go Unknown and be tainted"),
        T,
        || async {
            let n = nodes.get(&lost).await?;
            let taints: Vec<String> = n
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default()
                .into_iter()
                .map(|t| format!("{}:{}", t.key, t.effect))
                .collect();
            ensure!(
                ready_status(&n) == "Unknown"
                    && taints.contains(&"node.kubernetes.io/unreachable:NoExecute".to_string()),
                "Ready={}, taints {taints:?}",
                ready_status(&n)
            );
            Ok(())
        },
    )
    .await?;

    // Evicted (deleting, or already gone) and replaced on the other node.
    let api = Api::<Pod>::namespaced(client.clone(), "default");
    wait_for("the pods to move off the lost node", T, || async {
        for u in &victim_uids {
            let still = list_pods(&client, "app=move")
                .await?
                .into_iter()
                .find(|p| &uid(p) == u);
            if let Some(p) = still {
                ensure!(terminating(&p), "{} not evicted yet", name(&p));
            }
        }
        let all = list_pods(&client, "app=move").await?;
        let active: Vec<&Pod> = all.iter().filter(|p| !terminating(p)).collect();
        ensure!(
            active.len() == 2
                && active
                    .iter()
                    .all(|p| node_of(p) != lost && pods::phase(p) == "Running" && pods::ready(p)),
            "pods: {}",
            describe(&all)
        );
        Ok(())
    })
    .await?;

    // The agent returns: the evicted pods' containers stop, their objects
    // go, and every pod runs on one node only.
    let node = cluster.node_mut(&lost).context("node-2")?;
    node.start_agent()?;
    cluster.wait_node_ready(&lost, T).await?;
    wait_for("the evicted pods to be cleaned up", T, || async {
        for u in &victim_uids {
            let left = api
                .list(&ListParams::default().labels("app=move"))
                .await?
                .items
                .into_iter()
                .filter(|p| &uid(p) == u)
                .count();
            ensure!(left == 0, "evicted pod {u} still in the API");
        }
        let left = leftovers_of(&cluster, &victim_uids).await?;
        ensure!(left.is_empty(), "evicted pods' containers left: {left:?}");
        Ok(())
    })
    .await?;
    let pods = list_pods(&client, "app=move").await?;
    let running = running_containers(&cluster).await?;
    let mut per_pod: HashMap<String, Vec<&Running>> = HashMap::new();
    for r in &running {
        per_pod.entry(r.pod_uid.clone()).or_default().push(r);
    }
    for p in &pods {
        let mine = per_pod.get(&uid(p)).cloned().unwrap_or_default();
        ensure!(
            mine.len() == 1 && mine[0].node == node_of(p),
            "pod {} (on {}) has running containers {mine:?}",
            name(p),
            node_of(p)
        );
    }
    ensure!(
        per_pod.len() == pods.len(),
        "containers of pods the API does not have: {running:?} vs {}",
        describe(&pods)
    );
    let n = nodes.get(&lost).await?;
    ensure!(node_ready(&n), "{lost} Ready={}", ready_status(&n));
    cluster.finish().await
}

/// A Job runs to completion; a DaemonSet runs one pod on each node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_completes_and_daemonset_covers_every_node() -> Result<()> {
    let cluster = Cluster::start(2, ClusterOptions::default()).await?;
    let client = cluster.client().await?;
    cluster
        .apply(&format!(
            r#"apiVersion: batch/v1
kind: Job
metadata: {{name: once}}
spec:
  completions: 3
  parallelism: 2
  backoffLimit: 2
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: main
        image: {TOOLBOX_IMAGE}
        imagePullPolicy: IfNotPresent
        command: [sh, -c, "echo done"]
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {{name: every}}
spec:
  selector:
    matchLabels: {{app: every}}
  template:
    metadata:
      labels: {{app: every}}
    spec:
      terminationGracePeriodSeconds: 5
      containers:
      - name: main
        image: {TOOLBOX_IMAGE}
        imagePullPolicy: IfNotPresent
        command: [sh, -c, "{SLEEPER}"]
"#
        ))
        .await?;
    cluster
        .kubectl_ok(&[
            "wait",
            "--for=condition=complete",
            "job/once",
            "--timeout=90s",
        ])
        .await?;
    let job = Api::<Job>::namespaced(client.clone(), "default")
        .get("once")
        .await?;
    let s = job.status.unwrap_or_default();
    ensure!(
        s.succeeded == Some(3) && s.failed.unwrap_or(0) == 0,
        "job status {s:?}"
    );
    let job_pods = list_pods(&client, "job-name=once").await?;
    let succeeded = job_pods
        .iter()
        .filter(|p| pods::phase(p) == "Succeeded")
        .count();
    ensure!(succeeded == 3, "job pods: {}", describe(&job_pods));

    let pods = wait_ready_pods(&cluster, "app=every", 2).await?;
    let nodes: BTreeSet<String> = pods.iter().map(node_of).collect();
    let all: BTreeSet<String> = cluster
        .nodes()
        .iter()
        .map(|n| n.name().to_string())
        .collect();
    ensure!(nodes == all, "daemon pods on {nodes:?}, nodes {all:?}");
    cluster
        .kubectl_ok(&["rollout", "status", "daemonset/every", "--timeout=60s"])
        .await?;
    let ds = Api::<DaemonSet>::namespaced(client.clone(), "default")
        .get("every")
        .await?;
    let s = ds.status.unwrap_or_default();
    ensure!(
        s.desired_number_scheduled == 2 && s.number_ready == 2,
        "daemonset status {s:?}"
    );
    cluster.finish().await
}

/// The API server restarts under running agents: pods keep running (the
/// same containers), and what happened during the outage (a container
/// that exited) is reported once the server is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_survive_an_api_server_restart() -> Result<()> {
    let mut cluster = Cluster::start(2, ClusterOptions::default()).await?;
    cluster
        .apply(&deployment("stay", 2, TOOLBOX_IMAGE, 1, 0))
        .await?;
    // Exits with 3 once /tmp/stop exists: the test decides when.
    cluster
        .apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: trigger, labels: {{app: trigger}}}}\nspec:\n  restartPolicy: Never\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: {TOOLBOX_IMAGE}\n    imagePullPolicy: IfNotPresent\n    command: [sh, -c, \"while [ ! -e /tmp/stop ]; do sleep 0.2; done; exit 3\"]\n"
        ))
        .await?;
    let before = wait_ready_pods(&cluster, "app=stay", 2).await?;
    let trigger = wait_ready_pods(&cluster, "app=trigger", 1).await?.remove(0);
    let ids_before: BTreeMap<String, String> = before
        .iter()
        .map(|p| (name(p), pods::container_id(p, "main")))
        .collect();
    let running_before = running_containers(&cluster).await?;

    cluster.stop_server().await?;
    // During the outage: the trigger's container exits.
    let node = cluster.node(&node_of(&trigger)).context("trigger's node")?;
    let cri = node.containerd().client();
    let trigger_container = running_before
        .iter()
        .find(|r| r.pod_uid == uid(&trigger))
        .context("trigger's container")?
        .id
        .clone();
    cri.exec_sync(cri_proto::v1::ExecSyncRequest {
        container_id: trigger_container.clone(),
        cmd: vec!["touch".into(), "/tmp/stop".into()],
        timeout: 10,
    })
    .await?;
    wait_for("the trigger container to exit", T, || async {
        let s = cri
            .container_status(cri_proto::v1::ContainerStatusRequest {
                container_id: trigger_container.clone(),
                verbose: false,
            })
            .await?;
        let state = s.status.map(|s| s.state).unwrap_or_default();
        ensure!(
            state == cri_proto::v1::ContainerState::ContainerExited as i32,
            "state {state}"
        );
        Ok(())
    })
    .await?;
    // Long enough for the agents to notice (PLEG, failed lease renewals).
    tokio::time::sleep(Duration::from_secs(3)).await;
    for node in cluster.nodes() {
        ensure!(
            node.agent_running(),
            "{}'s agent died while the server was down:\n{}",
            node.name(),
            node.agent_log_tail(20)
        );
    }
    cluster.start_server().await?;

    let client = cluster.client().await?;
    let api = Api::<Pod>::namespaced(client.clone(), "default");
    wait_for("the outage's exit to be reported", T, || async {
        let p = api.get("trigger").await?;
        ensure!(
            pods::phase(&p) == "Failed" && pods::terminated_exit(&p, "main") == Some(3),
            "phase {}, main exit {:?}",
            pods::phase(&p),
            pods::terminated_exit(&p, "main")
        );
        Ok(())
    })
    .await?;
    for node in cluster.nodes() {
        cluster.wait_node_ready(node.name(), T).await?;
    }
    let after = wait_ready_pods(&cluster, "app=stay", 2).await?;
    let ids_after: BTreeMap<String, String> = after
        .iter()
        .map(|p| (name(p), pods::container_id(p, "main")))
        .collect();
    ensure!(
        ids_after == ids_before,
        "containers changed over the restart: before {ids_before:?}, after {ids_after:?}"
    );
    for p in &after {
        ensure!(pods::restarts(p, "main") == 0, "{} restarted", name(p));
    }
    let running_after = running_containers(&cluster).await?;
    let stay_before: Vec<&Running> = running_before
        .iter()
        .filter(|r| r.pod_uid != uid(&trigger))
        .collect();
    let stay_after: Vec<&Running> = running_after.iter().collect();
    if stay_before != stay_after {
        bail!("running containers changed: before {stay_before:?}, after {stay_after:?}");
    }
    cluster.finish().await
}

/// Env var that turns [`cluster_victim`] on; without it that test is a no-op.
const VICTIM_ENV: &str = "SKIFF_TESTS_CLUSTER_VICTIM";

/// Helper process for [`a_sigkilled_clusters_leftovers_are_swept`]: starts
/// a one-node cluster with a running static pod, prints what it made,
/// then waits to be killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "helper process of a_sigkilled_clusters_leftovers_are_swept"]
async fn cluster_victim() -> Result<()> {
    if std::env::var_os(VICTIM_ENV).is_none() {
        return Ok(());
    }
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    let node = &cluster.nodes()[0];
    std::fs::write(
        node.static_pod_dir().join("victim.yaml"),
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: victim}}\nspec:\n  containers:\n  - name: main\n    image: {TOOLBOX_IMAGE}\n    command: [sh, -c, \"{SLEEPER}\"]\n"
        ),
    )?;
    wait_for("the static pod's container", T, || async {
        ensure!(!node.running_containers().await?.is_empty(), "none yet");
        Ok(())
    })
    .await?;
    let report = serde_json::json!({
        "dir": cluster.dir(),
        "record": node.containerd().record(),
        "pids": [cluster.server_pid(), node.agent_pid(), node.containerd().pid()],
    });
    println!("VICTIM {report}");
    // Bounded: the parent kills us long before.
    tokio::time::sleep(Duration::from_secs(120)).await;
    Ok(())
}

/// A test process killed with SIGKILL leaves its cluster running; the
/// next fixture start sweeps it: processes, containers, bridge, run
/// directories and subnet leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_clusters_leftovers_are_swept() -> Result<()> {
    use skiff_tests::cleanup::{self, RunRecord};
    use tokio::io::AsyncBufReadExt as _;
    // Built here, so that the victim's deadline does not include a build.
    let (server, agent) = tokio::task::spawn_blocking(|| {
        Ok::<_, anyhow::Error>((
            workspace_binary("skiff-control-plane", "skiff-server")?,
            workspace_binary("skiff-agent", "skiff-agent")?,
        ))
    })
    .await??;
    let mut victim = tokio::process::Command::new(std::env::current_exe()?)
        .args([
            "cluster_victim",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(VICTIM_ENV, "1")
        .env("SKIFF_SERVER_BIN", server)
        .env("SKIFF_AGENT_BIN", agent)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = victim.stdout.take().context("victim stdout")?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let report = tokio::time::timeout(T, async {
        while let Some(line) = lines.next_line().await? {
            // libtest prints "test cluster_victim ... " before it, unterminated.
            if let Some((_, json)) = line.split_once("VICTIM ") {
                return Ok(serde_json::from_str::<serde_json::Value>(json)?);
            }
        }
        bail!("victim exited without a report")
    })
    .await
    .context("victim did not report in time")??;
    let dir: std::path::PathBuf = serde_json::from_value(report["dir"].clone())?;
    let record: RunRecord = serde_json::from_value(report["record"].clone())?;
    let pids: Vec<i32> = serde_json::from_value::<Vec<Option<i32>>>(report["pids"].clone())?
        .into_iter()
        .flatten()
        .collect();
    ensure!(pids.len() == 3, "victim's pids: {pids:?}");

    victim.kill().await?;
    let alive = |pid: i32| cleanup::is_alive(nix::unistd::Pid::from_raw(pid));
    ensure!(
        dir.exists() && pids.iter().all(|p| alive(*p)),
        "the victim's cluster is not there to sweep"
    );
    let swept = tokio::task::spawn_blocking(cleanup::sweep_stale).await?;
    let id = dir
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    ensure!(
        swept.contains(&id) && swept.contains(&record.id),
        "swept {swept:?}, expected {id} and {}",
        record.id
    );
    let mut left = cleanup::leftovers(&record, &[]);
    for pid in pids.into_iter().filter(|p| alive(*p)) {
        left.push(format!("process {pid}"));
    }
    for p in cleanup::processes_mentioning(&dir.to_string_lossy()) {
        left.push(format!("process {p} naming {}", dir.display()));
    }
    if dir.exists() {
        left.push(format!("directory {}", dir.display()));
    }
    for lease in std::fs::read_dir(cleanup::SUBNET_DIR)?.flatten() {
        if std::fs::read_to_string(lease.path()).is_ok_and(|o| o.trim() == id) {
            left.push(format!("subnet lease {}", lease.path().display()));
        }
    }
    ensure!(left.is_empty(), "left behind: {left:#?}");
    Ok(())
}
