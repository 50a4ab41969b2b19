//! Storage benchmark: 20 pods each with a fresh local-path claim, from the
//! creates to every pod Running as seen through a watch, against 20 pods
//! with an emptyDir on the same node in the same run. Rounds alternate
//! (emptyDir, claims, emptyDir, claims) so neither side gets the warm
//! caches. Prints each round, the ratio of the means, and one JSON line.
//!
//! Run: `cargo build --release --workspace --bins && target/release/bench-storage`
//! (`-- --pods N --rounds R` to change the sizes).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::watcher::{self, Event};
use serde_json::json;
use skiff_tests::cluster::{Cluster, ClusterOptions};
use skiff_tests::TOOLBOX_IMAGE;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let n = arg("--pods", 20);
    let rounds = arg("--rounds", 2);
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    let result = run(&cluster, n, rounds).await;
    cluster.finish().await?;
    let (empty, claims) = result?;
    let mean = |v: &[Duration]| v.iter().map(Duration::as_secs_f64).sum::<f64>() / v.len() as f64;
    let (e, c) = (mean(&empty) * 1000.0, mean(&claims) * 1000.0);
    let ratio = c / e;
    println!("{n} pods at once on one node, create -> all Running seen by a watch (ms):");
    println!("  emptyDir          mean {e:8.1}   rounds {:?}", ms(&empty));
    println!(
        "  local-path claim  mean {c:8.1}   rounds {:?}",
        ms(&claims)
    );
    println!("  ratio {ratio:.2}   (aim: <= 1.5)");
    println!(
        "{}",
        json!({"bench": "storage", "pods": n, "rounds": rounds, "empty_dir_ms": e,
               "local_path_ms": c, "ratio": ratio})
    );
    Ok(())
}

fn ms(v: &[Duration]) -> Vec<u64> {
    v.iter().map(|d| d.as_millis() as u64).collect()
}

async fn run(cluster: &Cluster, n: usize, rounds: usize) -> Result<(Vec<Duration>, Vec<Duration>)> {
    let client = cluster.client().await?;
    let mut empty = Vec::new();
    let mut claims = Vec::new();
    for r in 0..rounds {
        empty.push(round(&client, n, &format!("e{r}"), false).await?);
        claims.push(round(&client, n, &format!("c{r}"), true).await?);
    }
    Ok((empty, claims))
}

/// One round: `n` pods (and their claims) created at once; the time until
/// the watch saw all of them Running. Everything is deleted afterwards.
async fn round(client: &kube::Client, n: usize, tag: &str, with_claims: bool) -> Result<Duration> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let label = format!("bench={tag}");
    let mut events =
        watcher::watcher(pods.clone(), watcher::Config::default().labels(&label)).boxed();
    while let Some(ev) = events.try_next().await? {
        if matches!(ev, Event::InitDone) {
            break;
        }
    }
    let t = Instant::now();
    let creates = (0..n).map(|i| {
        let (pods, pvcs) = (pods.clone(), pvcs.clone());
        let name = format!("{tag}-{i}");
        async move {
            let volume = if with_claims {
                let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
                    "metadata": {"name": name},
                    "spec": {"accessModes": ["ReadWriteOnce"],
                             "resources": {"requests": {"storage": "1Mi"}}}
                }))?;
                pvcs.create(&PostParams::default(), &pvc).await?;
                json!({"name": "data", "persistentVolumeClaim": {"claimName": name}})
            } else {
                json!({"name": "data", "emptyDir": {}})
            };
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {"bench": tag}},
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "c", "image": TOOLBOX_IMAGE,
                                    "imagePullPolicy": "IfNotPresent",
                                    "command": ["sleep", "3600"],
                                    "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                    "volumes": [volume],
                }
            }))?;
            pods.create(&PostParams::default(), &pod).await?;
            Ok::<_, anyhow::Error>(())
        }
    });
    futures::future::try_join_all(creates).await?;
    let mut running = HashSet::new();
    let deadline = t + Duration::from_secs(180);
    while running.len() < n {
        let ev = match tokio::time::timeout_at(deadline.into(), events.try_next()).await {
            Ok(ev) => ev?,
            Err(_) => bail!(
                "{tag}: only {} of {n} pods Running after 180 s",
                running.len()
            ),
        };
        let Some(Event::Apply(p) | Event::InitApply(p)) = ev else {
            continue;
        };
        if p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
            running.insert(p.metadata.name.clone().unwrap_or_default());
        }
    }
    let took = t.elapsed();
    pods.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels(&label),
    )
    .await?;
    wait_empty(&pods, &label).await?;
    if with_claims {
        for i in 0..n {
            pvcs.delete(&format!("{tag}-{i}"), &DeleteParams::default())
                .await?;
        }
        let pvs: Api<PersistentVolume> = Api::all(client.clone());
        let deadline = Instant::now() + Duration::from_secs(120);
        while !pvs.list(&ListParams::default()).await?.items.is_empty() {
            if Instant::now() > deadline {
                bail!("{tag}: PVs still there after 120 s");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(took)
}

async fn wait_empty(pods: &Api<Pod>, label: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !pods
        .list(&ListParams::default().labels(label))
        .await?
        .items
        .is_empty()
    {
        if Instant::now() > deadline {
            bail!("pods {label} still there after 120 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}
