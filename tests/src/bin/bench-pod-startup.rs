//! Pod start-up latency: skiff-agent against the raw CRI calls, same run,
//! same containerd (the harness's private one), same pods.
//!
//! - raw: RunPodSandbox + CreateContainer + StartContainer issued directly;
//! - agent: from the manifest appearing in the static pod directory to the
//!   container running as CRI reports it.
//!
//! 30 pods one after another, then a burst of 50. Prints p50/p99 of each,
//! the ratios, the agent's peak RSS, and one JSON line at the end.
//!
//! Run: `cargo run --release -p skiff-tests --bin bench-pod-startup`

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use cri_proto::{v1, CriClient};
use skiff_tests::agent::{Agent, AgentOptions};
use skiff_tests::rawcri::{pct, raw_pod, remove_all};
use skiff_tests::{Containerd, TOOLBOX_IMAGE};

const SEQUENTIAL: usize = 30;
const BURST: usize = 50;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let cd = Containerd::start().await.context("starting containerd")?;
    let cri = cd.client();
    let logs = cd.dir().join("raw-logs");

    // Raw CRI, sequential then burst; removed before the agent runs.
    let mut raw_seq = Vec::new();
    for i in 0..SEQUENTIAL {
        let t = Instant::now();
        raw_pod(&cri, &format!("raw-seq-{i}"), &logs).await?;
        raw_seq.push(t.elapsed());
    }
    let t = Instant::now();
    let burst = (0..BURST).map(|i| {
        let cri = cri.clone();
        let logs = logs.clone();
        async move {
            raw_pod(&cri, &format!("raw-burst-{i}"), &logs).await?;
            Ok::<_, anyhow::Error>(t.elapsed())
        }
    });
    let raw_burst: Vec<Duration> = futures_join(burst).await?;
    let raw_burst_total = t.elapsed();
    remove_all(&cri).await?;

    // The agent.
    let agent = Agent::start(&cd, AgentOptions::default()).await?;
    let mut agent_seq = Vec::new();
    for i in 0..SEQUENTIAL {
        let name = format!("seq-{i}");
        let t = Instant::now();
        agent.write_manifest(&format!("{name}.yaml"), &manifest(&name))?;
        let running = wait_running(&cri, &[agent.pod_name(&name)], t).await?;
        agent_seq.push(running[0]);
    }
    let names: Vec<String> = (0..BURST).map(|i| format!("burst-{i}")).collect();
    let t = Instant::now();
    for n in &names {
        agent.write_manifest(&format!("{n}.yaml"), &manifest(n))?;
    }
    let pod_names: Vec<String> = names.iter().map(|n| agent.pod_name(n)).collect();
    let agent_burst = wait_running(&cri, &pod_names, t).await?;
    let agent_burst_total = agent_burst.iter().max().copied().unwrap_or_default();
    let pid = agent.pid().context("agent pid")?;
    let rss_kib = peak_rss_kib(pid)?;
    let rss_now = rss_parts(pid)?;
    let pods_running = SEQUENTIAL + BURST;

    let (rs50, rs99) = (pct(&raw_seq, 50.0), pct(&raw_seq, 99.0));
    let (as50, as99) = (pct(&agent_seq, 50.0), pct(&agent_seq, 99.0));
    let (rb50, rb99) = (pct(&raw_burst, 50.0), pct(&raw_burst, 99.0));
    let (ab50, ab99) = (pct(&agent_burst, 50.0), pct(&agent_burst, 99.0));
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let seq_ratio = ms(as50) / ms(rs50);
    let burst_ratio = ms(agent_burst_total) / ms(raw_burst_total);
    println!("pod start-up, {SEQUENTIAL} pods one after another (ms):");
    println!("  raw CRI   p50 {:8.1}  p99 {:8.1}", ms(rs50), ms(rs99));
    println!("  agent     p50 {:8.1}  p99 {:8.1}", ms(as50), ms(as99));
    println!(
        "  ratio     p50 {:8.2}  p99 {:8.2}   (aim: p50 <= 1.3)",
        seq_ratio,
        ms(as99) / ms(rs99)
    );
    println!("burst of {BURST} pods (ms from the burst's start):");
    println!(
        "  raw CRI   p50 {:8.1}  p99 {:8.1}  all running {:8.1}",
        ms(rb50),
        ms(rb99),
        ms(raw_burst_total)
    );
    println!(
        "  agent     p50 {:8.1}  p99 {:8.1}  all running {:8.1}",
        ms(ab50),
        ms(ab99),
        ms(agent_burst_total)
    );
    println!("  ratio (all running) {burst_ratio:.2}   (aim: <= 2)");
    println!(
        "agent peak RSS with {pods_running} pods: {:.1} MiB   (aim: <= 30 MiB with 50)",
        rss_kib as f64 / 1024.0
    );
    println!("  now: {rss_now}");
    let json = serde_json::json!({
        "bench": "pod-startup",
        "sequential_pods": SEQUENTIAL,
        "burst_pods": BURST,
        "raw_seq_p50_ms": ms(rs50), "raw_seq_p99_ms": ms(rs99),
        "agent_seq_p50_ms": ms(as50), "agent_seq_p99_ms": ms(as99),
        "seq_p50_ratio": seq_ratio,
        "raw_burst_total_ms": ms(raw_burst_total), "agent_burst_total_ms": ms(agent_burst_total),
        "raw_burst_p50_ms": ms(rb50), "raw_burst_p99_ms": ms(rb99),
        "agent_burst_p50_ms": ms(ab50), "agent_burst_p99_ms": ms(ab99),
        "burst_ratio": burst_ratio,
        "agent_peak_rss_mib": rss_kib as f64 / 1024.0,
        "pods_running": pods_running,
    });
    println!("{json}");
    drop(agent);
    cd.cleanup().await?;
    Ok(())
}

fn manifest(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: c, image: {TOOLBOX_IMAGE}, command: [sleep, '3600']}}\n"
    )
}

/// Poll CRI until a running container exists for each pod name; returns,
/// per pod, the time from `start` it was first seen running.
async fn wait_running(cri: &CriClient, names: &[String], start: Instant) -> Result<Vec<Duration>> {
    let mut seen: HashMap<&str, Duration> = HashMap::new();
    let deadline = start + Duration::from_secs(300);
    let running = v1::ContainerStateValue {
        state: v1::ContainerState::ContainerRunning as i32,
    };
    while seen.len() < names.len() {
        let list = cri
            .list_containers(v1::ListContainersRequest {
                filter: Some(v1::ContainerFilter {
                    state: Some(running),
                    ..Default::default()
                }),
            })
            .await?;
        let now = start.elapsed();
        for c in list.containers {
            if let Some(n) = c.labels.get("io.kubernetes.pod.name") {
                if let Some(name) = names.iter().find(|x| *x == n) {
                    seen.entry(name.as_str()).or_insert(now);
                }
            }
        }
        if Instant::now() > deadline {
            bail!(
                "only {} of {} pods running after 300s",
                seen.len(),
                names.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(names.iter().map(|n| seen[n.as_str()]).collect())
}

async fn futures_join<F: std::future::Future<Output = Result<Duration>>>(
    it: impl Iterator<Item = F>,
) -> Result<Vec<Duration>> {
    let handles: Vec<_> = it.collect();
    let mut out = Vec::new();
    for r in futures::future::join_all(handles).await {
        out.push(r?);
    }
    Ok(out)
}

/// The RSS now, by kind: heap and stacks (anon), the binary and other
/// mapped files (file), shared memory.
fn rss_parts(pid: u32) -> Result<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let parts: Vec<String> = status
        .lines()
        .filter(|l| {
            ["RssAnon:", "RssFile:", "RssShmem:"]
                .iter()
                .any(|k| l.starts_with(k))
        })
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    Ok(parts.join(", "))
}

fn peak_rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .context("VmHWM")
}
