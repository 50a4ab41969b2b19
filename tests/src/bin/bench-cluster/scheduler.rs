//! Scheduler throughput: `nodes` fake Node objects (no agents) and `pods`
//! pending pods, all created before the scheduler starts, then timed from
//! the scheduler's start until a watch has seen every pod bound. Each
//! binding is a real POST through the in-process API server.
//!
//! The floor measured in the same run is the API server's own write
//! rate: creating the same pods with the same client concurrency. A
//! scheduler cannot bind faster than the server takes one write per pod.
//!
//! Then the same again on a fresh server with scheduling rules on every
//! pod: one required anti-affinity term (no two pods of an owner on one
//! node) and one DoNotSchedule spread constraint (maxSkew 1 over ten
//! zones), the filters that look at other pods. Both rates are printed
//! with their ratio, and the placements checked against the rules.

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
    /// The same pods with an anti-affinity term and a spread constraint.
    pub with_rules: RulesFigures,
    /// pods_per_second / with_rules.pods_per_second (what the rules cost).
    pub ratio_plain_vs_rules: f64,
}

#[derive(Debug, serde::Serialize)]
pub struct RulesFigures {
    pub seconds: f64,
    pub pods_per_second: f64,
    pub bound_p50_seconds: f64,
    pub bound_p99_seconds: f64,
    /// Pods sharing a node with another pod of their owner (must be 0).
    pub anti_affinity_violations: usize,
    /// Largest difference between an owner's most and least populated
    /// zones (must be <= 1).
    pub max_zone_skew: usize,
}

/// Zones the nodes are spread over (node i is in zone i % ZONES).
const ZONES: usize = 10;

/// One timed run.
struct Run {
    seconds: f64,
    create_seconds: f64,
    /// Sorted times from the scheduler's start to each pod seen bound.
    bound_at: Vec<Duration>,
    /// Pods per node.
    per_node: std::collections::HashMap<String, usize>,
    /// (owner, node) of every pod.
    placements: Vec<(String, String)>,
}

impl Run {
    fn pct(&self, p: f64) -> f64 {
        let n = self.bound_at.len();
        let i = ((n as f64 * p / 100.0).ceil() as usize).clamp(1, n.max(1));
        self.bound_at.get(i - 1).map_or(0.0, Duration::as_secs_f64)
    }
}

/// Measure scheduling `pods` pending pods onto `nodes` fake nodes, once
/// plain and once with the scheduling rules (printing that line itself).
///
/// # Errors
///
/// The API refusing a create, the watch failing, or the pods not all
/// bound within five minutes.
pub async fn measure(nodes: usize, pods: usize) -> Result<SchedulerFigures> {
    let plain = run(nodes, pods, false).await?;
    let rules = run(nodes, pods, true).await?;
    let pods_per_second = pods as f64 / plain.seconds;
    let api_creates_per_second = pods as f64 / plain.create_seconds;
    let with_rules = RulesFigures {
        seconds: rules.seconds,
        pods_per_second: pods as f64 / rules.seconds,
        bound_p50_seconds: rules.pct(50.0),
        bound_p99_seconds: rules.pct(99.0),
        anti_affinity_violations: anti_affinity_violations(&rules.placements),
        max_zone_skew: max_zone_skew(&rules.placements),
    };
    let ratio_plain_vs_rules = pods_per_second / with_rules.pods_per_second;
    println!(
        "scheduler with rules (1 required anti-affinity term + 1 spread constraint per pod): \
         {:.0} pods/s (aim: >= 500); plain {:.0} pods/s; ratio plain/rules {:.2}; \
         {} anti-affinity violations, max zone skew {}",
        with_rules.pods_per_second,
        pods_per_second,
        ratio_plain_vs_rules,
        with_rules.anti_affinity_violations,
        with_rules.max_zone_skew
    );
    Ok(SchedulerFigures {
        nodes,
        pods,
        seconds: plain.seconds,
        pods_per_second,
        first_bound_seconds: plain.bound_at.first().map_or(0.0, Duration::as_secs_f64),
        bound_p50_seconds: plain.pct(50.0),
        bound_p99_seconds: plain.pct(99.0),
        api_creates_per_second,
        ratio_vs_api_creates: api_creates_per_second / pods_per_second,
        max_pods_per_node: plain.per_node.values().copied().max().unwrap_or(0),
        min_pods_per_node: if plain.per_node.len() < nodes {
            0
        } else {
            plain.per_node.values().copied().min().unwrap_or(0)
        },
        with_rules,
        ratio_plain_vs_rules,
    })
}

/// Create the nodes and pods on a fresh server, then time the scheduler
/// until every pod is seen bound.
async fn run(nodes: usize, pods: usize, rules: bool) -> Result<Run> {
    let server = TestServer::start().await;
    let admin = server.client().await;
    create_nodes(&admin, nodes).await?;
    let t = Instant::now();
    create_pods(&admin, pods, rules).await?;
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
    let mut placements = Vec::with_capacity(pods);
    let mut uids = HashSet::with_capacity(pods);
    while bound_at.len() < pods {
        let left = DEADLINE.saturating_sub(start.elapsed());
        match tokio::time::timeout(left, seen_rx.recv()).await {
            Ok(Some(seen)) => {
                if uids.insert(seen.uid) {
                    bound_at.push(start.elapsed());
                    *per_node.entry(seen.node.clone()).or_default() += 1;
                    placements.push((seen.owner, seen.node));
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
    Ok(Run {
        seconds,
        create_seconds,
        bound_at,
        per_node,
        placements,
    })
}

/// Pods beyond the first of their owner on a node.
fn anti_affinity_violations(placements: &[(String, String)]) -> usize {
    let mut seen = HashSet::new();
    placements
        .iter()
        .filter(|(owner, node)| !seen.insert((owner, node)))
        .count()
}

/// The largest (most - least) pods of one owner per zone.
fn max_zone_skew(placements: &[(String, String)]) -> usize {
    let mut per_owner: std::collections::HashMap<&str, [usize; ZONES]> = Default::default();
    for (owner, node) in placements {
        let zone = node_index(node).map_or(0, |i| i % ZONES);
        per_owner.entry(owner).or_insert([0; ZONES])[zone] += 1;
    }
    per_owner
        .values()
        .map(|z| z.iter().max().unwrap_or(&0) - z.iter().min().unwrap_or(&0))
        .max()
        .unwrap_or(0)
}

fn node_index(name: &str) -> Option<usize> {
    name.strip_prefix("fake-node-")?.parse().ok()
}

async fn create_nodes(admin: &kube::Client, n: usize) -> Result<()> {
    let api: Api<Node> = Api::all(admin.clone());
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                let name = format!("fake-node-{i:03}");
                let zone = format!("zone-{}", i % ZONES);
                let status = json!({
                    "capacity": {"cpu": "16", "memory": "64Gi", "pods": "110"},
                    "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"},
                    "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]
                });
                let node: Node = serde_json::from_value(json!({
                    "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                        "topology.kubernetes.io/zone": zone}},
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

/// `n` pods in owners of [`PODS_PER_OWNER`]; with `rules`, each keeps
/// away from its owner's other pods by hostname and spreads over zones.
async fn create_pods(admin: &kube::Client, n: usize, rules: bool) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(admin.clone(), NAMESPACE);
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                let owner = i / PODS_PER_OWNER;
                let app = format!("bench-{owner}");
                let spec_rules = if rules {
                    json!({
                        "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                            {"labelSelector": {"matchLabels": {"app": app}},
                             "topologyKey": "kubernetes.io/hostname"}]}},
                        "topologySpreadConstraints": [{"maxSkew": 1,
                            "topologyKey": "topology.kubernetes.io/zone",
                            "whenUnsatisfiable": "DoNotSchedule",
                            "labelSelector": {"matchLabels": {"app": app}}}],
                    })
                } else {
                    json!({})
                };
                let mut pod = json!({
                    "metadata": {
                        "name": format!("bench-{i:05}"),
                        "labels": {"app": app},
                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                            "name": format!("bench-{owner}"), "uid": format!("bench-owner-{owner}"),
                            "controller": true}],
                    },
                    "spec": {"containers": [{"name": "c", "image": "busybox",
                        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}
                });
                if let (Some(spec), Some(extra)) =
                    (pod["spec"].as_object_mut(), spec_rules.as_object())
                {
                    spec.extend(extra.clone());
                }
                let pod: Pod = serde_json::from_value(pod)?;
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

/// A pod seen bound.
struct Seen {
    uid: String,
    node: String,
    /// Its `app` label: the owner.
    owner: String,
}

/// Send every pod seen bound; `listed` fires once the initial list is in.
async fn watch_bindings(
    admin: kube::Client,
    seen: tokio::sync::mpsc::UnboundedSender<Seen>,
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
        let owner = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("app"))
            .cloned()
            .unwrap_or_default();
        let node = pod.spec.and_then(|s| s.node_name).filter(|n| !n.is_empty());
        if let (Some(node), Some(uid)) = (node, pod.metadata.uid) {
            if seen.send(Seen { uid, node, owner }).is_err() {
                return;
            }
        }
    }
}
