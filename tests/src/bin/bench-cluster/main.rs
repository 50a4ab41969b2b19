//! Cluster benchmark: a Deployment of 30 replicas over two nodes, from the
//! create to every pod Ready as seen through a watch, against the raw CRI
//! cost of the same 30 pods measured on the same two containerds in the
//! same run; then scheduler throughput on fake nodes. Prints p50/p99, the
//! ratios, and one JSON line at the end.
//!
//! Run: `cargo build --release --workspace --bins && target/release/bench-cluster`
//! (`-- --skip-startup` or `-- --skip-scheduler` to run one half).

mod scheduler;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::watcher::{self, Event};
use skiff_tests::cluster::{Cluster, ClusterOptions};
use skiff_tests::rawcri::{pct, raw_pod, remove_all};
use skiff_tests::TOOLBOX_IMAGE;

const REPLICAS: usize = 30;
const FAKE_NODES: usize = 100;
const PENDING_PODS: usize = 5000;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let mut json = serde_json::json!({ "bench": "cluster" });
    if !args.iter().any(|a| a == "--skip-startup") {
        let s = startup().await?;
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let (r50, r99) = (pct(&s.raw, 50.0), pct(&s.raw, 99.0));
        let (d50, d99) = (pct(&s.deploy, 50.0), pct(&s.deploy, 99.0));
        let ratio = ms(d99) / ms(r99);
        println!("pod start-up, {REPLICAS} pods at once over 2 nodes (ms from the start):");
        println!("  raw CRI      p50 {:8.1}  p99 {:8.1}", ms(r50), ms(r99));
        println!(
            "  deployment   p50 {:8.1}  p99 {:8.1}   (create -> Ready seen by a watch; aim p99 <= 1000)",
            ms(d50),
            ms(d99)
        );
        println!("  ratio p99 {ratio:.2}   (aim: <= 2)");
        json["replicas"] = REPLICAS.into();
        json["raw_p50_ms"] = ms(r50).into();
        json["raw_p99_ms"] = ms(r99).into();
        json["startup_p50_ms"] = ms(d50).into();
        json["startup_p99_ms"] = ms(d99).into();
        json["startup_ratio_p99"] = ratio.into();
    }
    if !args.iter().any(|a| a == "--skip-scheduler") {
        let f = scheduler::measure(FAKE_NODES, PENDING_PODS).await?;
        println!(
            "scheduler: {} pods on {} fake nodes in {:.2} s: {:.0} pods/s   (aim: >= 1000)",
            f.pods, f.nodes, f.seconds, f.pods_per_second
        );
        json["scheduler"] = serde_json::to_value(&f)?;
    }
    println!("{json}");
    Ok(())
}

struct Startup {
    raw: Vec<Duration>,
    deploy: Vec<Duration>,
}

async fn startup() -> Result<Startup> {
    let cluster = Cluster::start(2, ClusterOptions::default()).await?;
    let result = measure_startup(&cluster).await;
    cluster.finish().await?;
    result
}

async fn measure_startup(cluster: &Cluster) -> Result<Startup> {
    // Raw floor: the same 30 pods, split over the two containerds, all
    // started at once as the Deployment's are.
    let t = Instant::now();
    let raw = (0..REPLICAS).map(|i| {
        let node = &cluster.nodes()[i % 2];
        let cri = node.containerd().client();
        let logs = node.dir().join("raw-logs");
        async move {
            raw_pod(&cri, &format!("raw-{i}"), &logs).await?;
            Ok::<_, anyhow::Error>(t.elapsed())
        }
    });
    let raw: Vec<Duration> = futures::future::try_join_all(raw).await?;
    for n in cluster.nodes() {
        remove_all(&n.containerd().client()).await?;
    }

    let client = cluster.client().await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let deployments: Api<Deployment> = Api::namespaced(client, "default");
    let deploy: Deployment = serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": { "name": "bench" },
        "spec": {
            "replicas": REPLICAS,
            "selector": { "matchLabels": { "app": "bench" } },
            "template": {
                "metadata": { "labels": { "app": "bench" } },
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{
                        "name": "c",
                        "image": TOOLBOX_IMAGE,
                        "imagePullPolicy": "IfNotPresent",
                        "command": ["sleep", "3600"],
                    }],
                },
            },
        },
    }))?;
    let cfg = watcher::Config::default().labels("app=bench");
    let mut events = watcher::watcher(pods.clone(), cfg).boxed();
    // The watch is established (initial list done) before the clock starts.
    while let Some(ev) = events.try_next().await? {
        if matches!(ev, Event::InitDone) {
            break;
        }
    }
    let t = Instant::now();
    deployments.create(&PostParams::default(), &deploy).await?;
    let mut ready: HashMap<String, Duration> = HashMap::new();
    let deadline = t + Duration::from_secs(180);
    while ready.len() < REPLICAS {
        let next = tokio::time::timeout_at(deadline.into(), events.try_next()).await;
        let ev = match next {
            Ok(ev) => ev?,
            Err(_) => bail!("only {} of {REPLICAS} pods Ready after 180 s", ready.len()),
        };
        let Some(Event::Apply(p) | Event::InitApply(p)) = ev else {
            continue;
        };
        if is_ready(&p) {
            let name = p.metadata.name.clone().unwrap_or_default();
            ready.entry(name).or_insert_with(|| t.elapsed());
        }
    }
    deployments
        .delete("bench", &DeleteParams::default())
        .await
        .context("deleting the benchmark deployment")?;
    Ok(Startup {
        raw,
        deploy: ready.into_values().collect(),
    })
}

fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}
