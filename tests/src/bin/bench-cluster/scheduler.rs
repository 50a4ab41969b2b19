//! Scheduler throughput: `nodes` fake Node objects (no agents) and `pods`
//! pending pods, all created before the scheduler starts, then timed from
//! the scheduler's start until a watch has seen every pod bound. Each
//! binding is a real POST through the in-process API server.
//!
//! The floor measured in the same run is the API server's own write
//! rate: creating the same pods with the same client concurrency. A
//! scheduler cannot bind faster than the server takes one write per pod.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event};
use serde_json::json;
use skiff_control_plane::testkit::TestServer;

/// Client requests in flight while creating nodes and pods.
const CREATE_CONCURRENCY: usize = 32;
/// Pods per owner: the bench pods come in ReplicaSet-sized groups so
/// that the spreading score has owners to count.
const PODS_PER_OWNER: usize = 100;
/// Give up after this long.
const DEADLINE: Duration = Duration::from_secs(300);
const NAMESPACE: &str = "default";

#[derive(Debug, serde::Serialize)]
pub struct SchedulerFigures {
    pub nodes: usize,
    pub pods: usize,
    /// From the scheduler's start to the last pod seen bound.
    pub seconds: f64,
    pub pods_per_second: f64,
    /// Seconds until the first pod was seen bound (start-up: the
    /// scheduler's initial lists).
    pub first_bound_seconds: f64,
    /// Median and 99th percentile of the time from the scheduler's start
    /// to each pod being seen bound.
    pub bound_p50_seconds: f64,
    pub bound_p99_seconds: f64,
    /// The floor: pod creates per second through the same API server and
    /// client concurrency.
    pub api_creates_per_second: f64,
    /// api_creates_per_second / pods_per_second (1.0: binding as fast as
    /// the server takes writes).
    pub ratio_vs_api_creates: f64,
    /// Most pods bound to one node, and the fewest (spread).
    pub max_pods_per_node: usize,
    pub min_pods_per_node: usize,
}

/// Measure scheduling `pods` pending pods onto `nodes` fake nodes.
///
/// # Errors
///
/// The API refusing a create, the watch failing, or the pods not all
/// bound within five minutes.
pub async fn measure(nodes: usize, pods: usize) -> Result<SchedulerFigures> {
    let server = TestServer::start().await;
    let admin = server.client().await;
    create_nodes(&admin, nodes).await?;
    let t = Instant::now();
    create_pods(&admin, pods).await?;
    let create_seconds = t.elapsed().as_secs_f64();

    // Watch first, so that nothing the scheduler does goes unseen.
    let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel();
    let (listed_tx, listed_rx) = tokio::sync::oneshot::channel();
    let watch = tokio::spawn(watch_bindings(admin.clone(), seen_tx, listed_tx));
    listed_rx.await.context("the pod watch never listed")?;

    let client = server.client_for("system:kube-scheduler", &[]).await;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let start = Instant::now();
    let scheduler = tokio::spawn(skiff_scheduler::run(
        client,
        skiff_scheduler::Config::default(),
        async {
            let _ = stop_rx.await;
        },
    ));

    let mut bound_at: Vec<Duration> = Vec::with_capacity(pods);
    let mut per_node = std::collections::HashMap::<String, usize>::new();
    let mut uids = HashSet::with_capacity(pods);
    while bound_at.len() < pods {
        let left = DEADLINE.saturating_sub(start.elapsed());
        match tokio::time::timeout(left, seen_rx.recv()).await {
            Ok(Some((uid, node))) => {
                if uids.insert(uid) {
                    bound_at.push(start.elapsed());
                    *per_node.entry(node).or_default() += 1;
                }
            }
            Ok(None) => bail!("the pod watch ended"),
            Err(_) => bail!(
                "only {} of {pods} pods bound after {DEADLINE:?}",
                bound_at.len()
            ),
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let _ = stop_tx.send(());
    scheduler.await.context("scheduler task")?;
    watch.abort();

    bound_at.sort();
    let pct = |p: f64| {
        let i = ((bound_at.len() as f64 * p / 100.0).ceil() as usize).clamp(1, bound_at.len());
        bound_at[i - 1].as_secs_f64()
    };
    let pods_per_second = pods as f64 / seconds;
    let api_creates_per_second = pods as f64 / create_seconds;
    Ok(SchedulerFigures {
        nodes,
        pods,
        seconds,
        pods_per_second,
        first_bound_seconds: bound_at.first().map_or(0.0, Duration::as_secs_f64),
        bound_p50_seconds: pct(50.0),
        bound_p99_seconds: pct(99.0),
        api_creates_per_second,
        ratio_vs_api_creates: api_creates_per_second / pods_per_second,
        max_pods_per_node: per_node.values().copied().max().unwrap_or(0),
        min_pods_per_node: if per_node.len() < nodes {
            0
        } else {
            per_node.values().copied().min().unwrap_or(0)
        },
    })
}

async fn create_nodes(admin: &kube::Client, n: usize) -> Result<()> {
    let api: Api<Node> = Api::all(admin.clone());
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                let name = format!("fake-node-{i:03}");
                let status = json!({
                    "capacity": {"cpu": "16", "memory": "64Gi", "pods": "110"},
                    "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"},
                    "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]
                });
                let node: Node = serde_json::from_value(json!({
                    "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
                    "status": status,
                }))?;
                api.create(&PostParams::default(), &node)
                    .await
                    .with_context(|| format!("creating node {name}"))?;
                // Status belongs to nodes/status; set it there in case
                // the create dropped it.
                api.patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "status": status })),
                )
                .await
                .with_context(|| format!("setting the status of node {name}"))?;
                Ok::<_, anyhow::Error>(())
            }
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .try_collect::<()>()
        .await
}

async fn create_pods(admin: &kube::Client, n: usize) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(admin.clone(), NAMESPACE);
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                let owner = i / PODS_PER_OWNER;
                let pod: Pod = serde_json::from_value(json!({
                    "metadata": {
                        "name": format!("bench-{i:05}"),
                        "labels": {"app": format!("bench-{owner}")},
                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                            "name": format!("bench-{owner}"), "uid": format!("bench-owner-{owner}"),
                            "controller": true}],
                    },
                    "spec": {"containers": [{"name": "c", "image": "busybox",
                        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}
                }))?;
                api.create(&PostParams::default(), &pod)
                    .await
                    .with_context(|| format!("creating pod bench-{i:05}"))?;
                Ok::<_, anyhow::Error>(())
            }
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .try_collect::<()>()
        .await
}

/// Send (uid, node) for every pod seen bound; `listed` fires once the
/// initial list is in.
async fn watch_bindings(
    admin: kube::Client,
    seen: tokio::sync::mpsc::UnboundedSender<(String, String)>,
    listed: tokio::sync::oneshot::Sender<()>,
) {
    let api: Api<Pod> = Api::namespaced(admin, NAMESPACE);
    let mut listed = Some(listed);
    let mut stream = std::pin::pin!(watcher::watcher(api, watcher::Config::default()));
    while let Some(ev) = stream.next().await {
        let pod = match ev {
            Ok(Event::Apply(p) | Event::InitApply(p)) => p,
            Ok(Event::InitDone) => {
                if let Some(l) = listed.take() {
                    let _ = l.send(());
                }
                continue;
            }
            Ok(_) => continue,
            Err(e) => {
                eprintln!("bench pod watch: {e}; re-listing");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let node = pod.spec.and_then(|s| s.node_name).filter(|n| !n.is_empty());
        if let (Some(node), Some(uid)) = (node, pod.metadata.uid) {
            if seen.send((uid, node)).is_err() {
                return;
            }
        }
    }
}
