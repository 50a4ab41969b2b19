//! Storage benchmark: 20 pods each with a fresh local-path claim, from the
//! creates to every pod Running as seen through a watch, against 20 pods
//! with an emptyDir on the same node in the same run. Rounds alternate
//! (emptyDir, claims, emptyDir, claims) so neither side gets the warm
//! caches. Prints each round, the ratio of the means, and one JSON line.
//!
//! Run: `cargo build --release --workspace --bins && target/release/bench-storage`
//! (`-- --pods N --rounds R` to change the sizes).

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;
use skiff_tests::bench::{arg, mean_ms, millis, pod_watch, running, wait_no_pods, wait_pods};
use skiff_tests::cluster::{Cluster, ClusterOptions};
use skiff_tests::TOOLBOX_IMAGE;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let n = arg("--pods", 20);
    let rounds = arg("--rounds", 2);
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    let result = run(&cluster, n, rounds).await;
    cluster.finish().await?;
    let (empty, claims) = result?;
    let (e, c) = (mean_ms(&empty), mean_ms(&claims));
    let ratio = c / e;
    println!("{n} pods at once on one node, create -> all Running seen by a watch (ms):");
    println!(
        "  emptyDir          mean {e:8.1}   rounds {:?}",
        millis(&empty)
    );
    println!(
        "  local-path claim  mean {c:8.1}   rounds {:?}",
        millis(&claims)
    );
    println!("  ratio {ratio:.2}   (aim: <= 1.5)");
    println!(
        "{}",
        json!({"bench": "storage", "pods": n, "rounds": rounds, "empty_dir_ms": e,
               "local_path_ms": c, "ratio": ratio})
    );
    Ok(())
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
    let mut events = pod_watch(&pods, &label).await?;
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
    wait_pods(&mut events, n, &format!("{tag} Running"), t, running).await?;
    let took = t.elapsed();
    pods.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels(&label),
    )
    .await?;
    wait_no_pods(&pods, &label).await?;
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
