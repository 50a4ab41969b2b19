//! Workload benchmark: a StatefulSet of 20 (Parallel pod management) from
//! its create to all 20 pods Ready, as seen through a watch, against a
//! Deployment of 20 in the same run on the same node. Rounds alternate
//! (Deployment, StatefulSet, ...) so neither side gets the warm caches.
//! Prints each round, the ratio of the means, and one JSON line.
//!
//! Run: `cargo build --release --workspace --bins && target/release/bench-workloads`
//! (`-- --replicas N --rounds R` to change the sizes).

use std::time::{Duration, Instant};

use anyhow::Result;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use skiff_tests::bench::{arg, mean_ms, millis, pod_watch, ready, wait_no_pods, wait_pods};
use skiff_tests::cluster::{Cluster, ClusterOptions};
use skiff_tests::TOOLBOX_IMAGE;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let n = arg("--replicas", 20);
    let rounds = arg("--rounds", 2);
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    let result = run(&cluster, n, rounds).await;
    cluster.finish().await?;
    let (deploys, sets) = result?;
    let (d, s) = (mean_ms(&deploys), mean_ms(&sets));
    let ratio = s / d;
    println!("{n} replicas on one node, create -> all pods Ready seen by a watch (ms):");
    println!(
        "  Deployment              mean {d:8.1}   rounds {:?}",
        millis(&deploys)
    );
    println!(
        "  StatefulSet (Parallel)  mean {s:8.1}   rounds {:?}",
        millis(&sets)
    );
    println!("  ratio {ratio:.2}   (aim: <= 1.2)");
    println!(
        "{}",
        json!({"bench": "workloads", "replicas": n, "rounds": rounds,
               "deployment_ms": d, "statefulset_ms": s, "ratio": ratio})
    );
    Ok(())
}

async fn run(cluster: &Cluster, n: usize, rounds: usize) -> Result<(Vec<Duration>, Vec<Duration>)> {
    let client = cluster.client().await?;
    let mut deploys = Vec::new();
    let mut sets = Vec::new();
    for r in 0..rounds {
        deploys.push(round(&client, n, &format!("d{r}"), false).await?);
        sets.push(round(&client, n, &format!("s{r}"), true).await?);
    }
    Ok((deploys, sets))
}

/// The pod template both kinds run: labelled `bench=<tag>`.
fn template(tag: &str) -> serde_json::Value {
    json!({
        "metadata": {"labels": {"bench": tag}},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": TOOLBOX_IMAGE,
                            "imagePullPolicy": "IfNotPresent",
                            "command": ["sleep", "3600"]}],
        }
    })
}

/// One round: a workload of `n` replicas created; the time until the watch
/// saw all of its pods Ready. The workload is deleted afterwards.
async fn round(client: &kube::Client, n: usize, tag: &str, stateful: bool) -> Result<Duration> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let label = format!("bench={tag}");
    let mut events = pod_watch(&pods, &label).await?;
    let spec = json!({
        "replicas": n,
        "selector": {"matchLabels": {"bench": tag}},
        "template": template(tag),
    });
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), "default");
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let t = Instant::now();
    if stateful {
        let mut spec = spec;
        spec["serviceName"] = json!(tag);
        spec["podManagementPolicy"] = json!("Parallel");
        let sts: StatefulSet =
            serde_json::from_value(json!({"metadata": {"name": tag}, "spec": spec}))?;
        sets.create(&PostParams::default(), &sts).await?;
    } else {
        let d: Deployment =
            serde_json::from_value(json!({"metadata": {"name": tag}, "spec": spec}))?;
        deploys.create(&PostParams::default(), &d).await?;
    }
    wait_pods(&mut events, n, &format!("{tag} Ready"), t, ready).await?;
    let took = t.elapsed();
    if stateful {
        sets.delete(tag, &DeleteParams::foreground()).await?;
    } else {
        deploys.delete(tag, &DeleteParams::foreground()).await?;
    }
    wait_no_pods(&pods, &label).await?;
    Ok(took)
}
