//! High-availability benchmark: three skiff-servers on managed etcd, each
//! in a network namespace of its own (the `ha` fixture).
//!
//! - Create throughput: ConfigMap creates at a fixed concurrency, all
//!   through one server, then spread round-robin over the three, rounds
//!   alternating; both sides write the same etcd cluster in the same run.
//!   Prints the rate of each and the ratio spread / one.
//! - Leader failover: the server holding the `kube-scheduler` Lease is
//!   SIGKILLed with its etcd member (the machine is gone) and a pod is
//!   created through another server; the time from the kill until the
//!   pod is bound to the cluster's node (a real agent) by the new
//!   scheduler. Repeated, the killed server started again between kills;
//!   prints each and the p50. The Lease lasts 15 s, as upstream's, which
//!   bounds it from below.
//! - Write outage: in the same kills, the time from the kill until the
//!   first write through a surviving server succeeds (the etcd members
//!   electing a leader when the killed one led); the aim is well under
//!   the Lease's 15 s. Prints each and the longest.
//!
//! Run: `cargo build --release --workspace --bins &&
//! SKIFF_SERVER_BIN=target/release/skiff-server target/release/bench-ha`
//! (`-- --creates N --concurrency C --rounds R --kills K`).

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures::{stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, PostParams};
use serde_json::json;
use skiff_tests::bench::arg;
use skiff_tests::cluster::client_from;
use skiff_tests::ha::{lease_holder, HaCluster};
use skiff_tests::TOOLBOX_IMAGE;

const SERVERS: usize = 3;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let creates = arg("--creates", 2000);
    let concurrency = arg("--concurrency", 16);
    let rounds = arg("--rounds", 2);
    let kills = arg("--kills", 5);
    let mut cluster = HaCluster::start(SERVERS).await?;
    let result = run(&mut cluster, creates, concurrency, rounds, kills).await;
    let (one, spread, kills) = cluster.report(result)?;
    let failovers: Vec<Duration> = kills.iter().map(|k| k.bound).collect();
    let outages: Vec<Duration> = kills.iter().map(|k| k.written).collect();
    let longest = outages.iter().max().copied().unwrap_or_default();
    let (one_rate, spread_rate) = (mean(&one), mean(&spread));
    let ratio = spread_rate / one_rate;
    let mut sorted = failovers.clone();
    sorted.sort();
    let p50 = sorted[sorted.len() / 2];
    println!("{creates} ConfigMap creates per round, concurrency {concurrency}, {SERVERS} servers on managed etcd:");
    println!(
        "  through one server    {one_rate:8.0}/s   rounds {:?}",
        rates(&one)
    );
    println!(
        "  spread over {SERVERS}        {spread_rate:8.0}/s   rounds {:?}",
        rates(&spread)
    );
    println!("  ratio spread/one {ratio:.2}");
    println!(
        "leader failover, kill of the scheduler's leader -> first bind by the new one (lease 15 s): p50 {:.1} s   each {:?}",
        p50.as_secs_f64(),
        secs(&failovers)
    );
    println!(
        "write outage, kill -> first write through a survivor: longest {:.1} s ({:.2} of the 15 s lease)   each {:?}",
        longest.as_secs_f64(),
        longest.as_secs_f64() / 15.0,
        secs(&outages)
    );
    println!(
        "{}",
        json!({"bench": "ha", "creates": creates, "concurrency": concurrency,
               "one_server_per_s": one_rate, "spread_per_s": spread_rate, "ratio": ratio,
               "failover_bind_p50_s": p50.as_secs_f64(),
               "failovers_s": failovers.iter().map(Duration::as_secs_f64).collect::<Vec<_>>(),
               "write_outage_max_s": longest.as_secs_f64()})
    );
    Ok(())
}

/// Create rates through one server and spread, and what each kill cost.
type Outcome = (Vec<f64>, Vec<f64>, Vec<Kill>);

/// Times from a kill of the scheduler's leader.
struct Kill {
    /// Until the first write through another server succeeded.
    written: Duration,
    /// Until the pod written was bound by the new scheduler.
    bound: Duration,
}

async fn run(
    c: &mut HaCluster,
    creates: usize,
    concurrency: usize,
    rounds: usize,
    kills: usize,
) -> Result<Outcome> {
    let mut clients = Vec::new();
    for s in c.servers() {
        clients.push(client_from(&s.admin_kubeconfig()).await?);
    }
    let (mut one, mut spread) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        one.push(create_round(&clients[..1], creates, concurrency, &format!("one{r}")).await?);
        spread.push(create_round(&clients, creates, concurrency, &format!("spread{r}")).await?);
    }
    // One real node for the pods to be bound to; it talks to the last
    // server and moves when that one goes.
    c.add_agent(SERVERS - 1).await?;
    let mut failovers = Vec::new();
    for k in 0..kills {
        failovers.push(failover(c, &clients, k).await?);
    }
    Ok((one, spread, failovers))
}

/// Creates per second: `n` ConfigMaps, `concurrency` at a time, the
/// i-th through `clients[i % len]`.
async fn create_round(
    clients: &[kube::Client],
    n: usize,
    concurrency: usize,
    tag: &str,
) -> Result<f64> {
    let apis: Vec<Api<ConfigMap>> = clients
        .iter()
        .map(|c| Api::namespaced(c.clone(), "default"))
        .collect();
    let t = Instant::now();
    stream::iter(0..n)
        .map(|i| {
            let api = apis[i % apis.len()].clone();
            async move {
                let cm: ConfigMap = serde_json::from_value(json!({
                    "metadata": {"name": format!("{tag}-{i}")},
                    "data": {"k": "v"}
                }))?;
                api.create(&PostParams::default(), &cm).await?;
                Ok::<_, anyhow::Error>(())
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(n as f64 / t.elapsed().as_secs_f64())
}

/// Kill the scheduler's leader and create a pod through another server:
/// the times until the create succeeds and until the pod is bound. The
/// killed server is started again (and waited for) afterwards.
async fn failover(c: &mut HaCluster, clients: &[kube::Client], k: usize) -> Result<Kill> {
    let mut leader = None;
    for client in clients {
        if let Ok(l) = lease_holder(client, "kube-scheduler").await {
            leader = Some(l);
            break;
        }
    }
    let leader = leader.context("nobody holds kube-scheduler's Lease")?;
    let other = &clients[(leader + 1) % clients.len()];
    let pods: Api<Pod> = Api::namespaced(other.clone(), "default");
    let name = format!("failover-{k}");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"terminationGracePeriodSeconds": 0, "containers": [{"name": "main",
            "image": TOOLBOX_IMAGE, "imagePullPolicy": "IfNotPresent",
            "command": ["sleep", "3600"]}]}
    }))?;
    c.server_mut(leader).kill();
    let killed = Instant::now();
    // The killed server may have led etcd too: a write can fail while
    // the members elect another leader.
    let mut written = None;
    let bound = loop {
        if killed.elapsed() > Duration::from_secs(120) {
            bail!("no bind within 120 s after killing s{leader}");
        }
        if written.is_none() {
            if pods.create(&PostParams::default(), &pod).await.is_ok() {
                written = Some(killed.elapsed());
            }
        } else if let Ok(p) = pods.get(&name).await {
            if p.spec.and_then(|s| s.node_name).is_some() {
                break killed.elapsed();
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    pods.delete(&name, &Default::default()).await?;
    c.restart(leader, &[]).await?;
    Ok(Kill {
        written: written.unwrap_or(bound),
        bound,
    })
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

fn rates(v: &[f64]) -> Vec<String> {
    v.iter().map(|r| format!("{r:.0}")).collect()
}

fn secs(v: &[Duration]) -> Vec<String> {
    v.iter()
        .map(|d| format!("{:.1}", d.as_secs_f64()))
        .collect()
}
