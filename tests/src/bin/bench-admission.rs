//! Admission webhook benchmark: pod creates through the API with one
//! mutating and one validating webhook (both served by a pod on the
//! node, reached through it) against the same creates with no webhook,
//! in the same run. Rounds alternate (plain, webhooks, ...), each in a
//! namespace of its own (labelled for the webhooks or not); pods are
//! bound to a node that does not exist, so nothing starts. Prints the
//! latency p50/p99 of each side, the added p50/p99, the throughput
//! ratio, and one JSON line.
//!
//! Run: `cargo build --release --workspace --bins && target/release/bench-admission`
//! (`-- --pods N --rounds R --workers W` to change the sizes).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::json;
use skiff_tests::bench::arg;
use skiff_tests::cluster::{Cluster, ClusterOptions};
use skiff_tests::webhooks::{configuration, deploy};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let pods = arg("--pods", 300);
    let rounds = arg("--rounds", 2);
    let workers = arg("--workers", 4);
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    let result = run(&cluster, pods, rounds, workers).await;
    cluster.finish().await?;
    let (plain, hooked) = result?;
    let (p, h) = (Side::of(&plain.0, plain.1), Side::of(&hooked.0, hooked.1));
    let ratio = h.per_second / p.per_second;
    println!("{pods} pod creates per round, {rounds} rounds a side, {workers} at a time:");
    for (name, s) in [("no webhooks", &p), ("1 mutating + 1 validating", &h)] {
        println!(
            "  {name:26} p50 {:6.1} ms   p99 {:6.1} ms   {:7.1} creates/s",
            s.p50, s.p99, s.per_second
        );
    }
    println!(
        "  added per request: p50 {:.1} ms, p99 {:.1} ms; throughput ratio {ratio:.2}",
        h.p50 - p.p50,
        h.p99 - p.p99
    );
    println!(
        "{}",
        json!({"bench": "admission-webhooks", "pods": pods, "rounds": rounds, "workers": workers,
               "plain_p50_ms": p.p50, "plain_p99_ms": p.p99, "plain_per_s": p.per_second,
               "webhooks_p50_ms": h.p50, "webhooks_p99_ms": h.p99, "webhooks_per_s": h.per_second,
               "ratio": ratio})
    );
    Ok(())
}

struct Side {
    p50: f64,
    p99: f64,
    per_second: f64,
}

impl Side {
    fn of(latencies: &[Duration], wall: Duration) -> Side {
        let mut ms: Vec<f64> = latencies.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        let at = |q: f64| ms[((ms.len() as f64 * q) as usize).min(ms.len() - 1)];
        Side {
            p50: at(0.50),
            p99: at(0.99),
            per_second: latencies.len() as f64 / wall.as_secs_f64(),
        }
    }
}

type Samples = (Vec<Duration>, Duration);

async fn run(
    cluster: &Cluster,
    pods: usize,
    rounds: usize,
    workers: usize,
) -> Result<(Samples, Samples)> {
    let ca_bundle = deploy(cluster).await?;
    for (kind, name, path) in [
        (
            "MutatingWebhookConfiguration",
            "label.bench.skiff.io",
            "/mutate",
        ),
        (
            "ValidatingWebhookConfiguration",
            "deny.bench.skiff.io",
            "/validate",
        ),
    ] {
        cluster
            .apply(&configuration(kind, name, path, &ca_bundle, "Fail"))
            .await?;
    }
    let client = cluster.client().await?;
    let mut plain = (Vec::new(), Duration::ZERO);
    let mut hooked = (Vec::new(), Duration::ZERO);
    // A warm-up round on each side (connections, caches, the webhook's
    // configuration seen), not counted.
    for r in 0..=rounds {
        for webhooks in [false, true] {
            let ns = format!("{}-{r}", if webhooks { "hooked" } else { "plain" });
            cluster.kubectl_ok(&["create", "namespace", &ns]).await?;
            if webhooks {
                cluster
                    .kubectl_ok(&["label", "namespace", &ns, "admission=on"])
                    .await?;
            }
            let n = if r == 0 { 20 } else { pods };
            let (lat, wall) = round(&client, &ns, n, workers).await?;
            if r > 0 {
                let side = if webhooks { &mut hooked } else { &mut plain };
                side.0.extend(lat);
                side.1 += wall;
            }
        }
    }
    Ok((plain, hooked))
}

/// Create `n` pods in `ns`, `workers` at a time: each create's latency,
/// and the whole round's time.
async fn round(
    client: &kube::Client,
    ns: &str,
    n: usize,
    workers: usize,
) -> Result<(Vec<Duration>, Duration)> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let (pods, next) = (pods.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    return Ok::<_, anyhow::Error>(lat);
                }
                let pod: Pod = serde_json::from_value(json!({
                    "metadata": {"name": format!("p{i}"), "labels": {"app": "bench"}},
                    "spec": {"nodeName": "nowhere", "containers": [{"name": "c", "image": "busybox"}]}
                }))?;
                let t = Instant::now();
                pods.create(&PostParams::default(), &pod).await?;
                lat.push(t.elapsed());
            }
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    Ok((all, start.elapsed()))
}
