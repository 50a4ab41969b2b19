//! Container logs end to end: rotation against a real containerd (with
//! CRI ReopenContainerLog), `/containerLogs` on the node server (follow
//! across rotations, tail, limit, previous), `/stats/summary` and
//! `/metrics`, and `kubectl logs` through the API server.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use futures::{AsyncBufReadExt, TryStreamExt};
use skiff_tests::agent::{pods, Agent, AgentOptions};
use skiff_tests::cluster::{Cluster, ClusterOptions};
use skiff_tests::{Containerd, TOOLBOX_IMAGE};

const T: Duration = Duration::from_secs(60);

/// Rotation small and frequent enough to happen many times in a test.
fn rotating(max_files: u32) -> AgentOptions {
    AgentOptions {
        extra_args: vec![
            "--container-log-max-size=8Ki".into(),
            format!("--container-log-max-files={max_files}"),
            "--container-log-monitor-interval=1s".into(),
        ],
        ..Default::default()
    }
}

/// A pod whose container waits `delay` seconds, writes `n` numbered lines
/// in bursts of 100 (about 9 KiB) every 0.3 s, then `done`, and exits.
fn chatty(name: &str, delay: u32, n: u32) -> String {
    let script = format!(
        "sleep {delay}; i=0; while [ $i -lt {n} ]; do echo \"line $i ----------------------------------------\"; i=$((i+1)); if [ $((i % 100)) -eq 0 ]; then sleep 0.3; fi; done; echo done"
    );
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  restartPolicy: Never\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {TOOLBOX_IMAGE}\n    command: [sh, -c, {script:?}]\n"
    )
}

fn expected_line(i: u32) -> String {
    format!("line {i} ----------------------------------------")
}

/// The messages of a CRI log text (full records only, as the test writes
/// short lines).
fn messages(cri: &str) -> Vec<String> {
    cri.lines()
        .filter_map(|l| l.splitn(4, ' ').nth(3).map(str::to_string))
        .collect()
}

/// Files of a container's log in use: rotated ones (oldest first) then
/// the current one; leftovers of a compression in progress are skipped.
fn log_files(dir: &Path) -> Vec<PathBuf> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with("0.log"))
        .collect();
    let all = names.clone();
    // An uncompressed file whose .gz exists is being compressed away.
    let compressed = |n: &String| n != "0.log" && all.contains(&format!("{n}.gz"));
    names.retain(|n| !n.ends_with(".tmp") && !compressed(n));
    names.sort_by_key(|n| (n == "0.log", n.clone()));
    names.into_iter().map(|n| dir.join(n)).collect()
}

fn read_log_file(path: &Path) -> Result<String> {
    let mut text = String::new();
    let f = std::fs::File::open(path)?;
    if path.extension().is_some_and(|e| e == "gz") {
        flate2::read::GzDecoder::new(f).read_to_string(&mut text)?;
    } else {
        std::io::BufReader::new(f).read_to_string(&mut text)?;
    }
    Ok(text)
}

fn container_log_dir(agent: &Agent, pod: &k8s_openapi::api::core::v1::Pod) -> PathBuf {
    let m = &pod.metadata;
    agent
        .log_dir()
        .join(format!(
            "default_{}_{}",
            m.name.as_deref().unwrap_or_default(),
            m.uid.as_deref().unwrap_or_default()
        ))
        .join("c")
}

/// The log is rotated many times with at most `max_files` files at any
/// moment; the runtime keeps writing to the reopened file, and the kept
/// files hold an unbroken run of the newest lines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_bounds_the_files_and_loses_no_line() -> Result<()> {
    let cd = Containerd::start().await?;
    let agent = Agent::start(&cd, rotating(3)).await?;
    agent.write_manifest("chatty.yaml", &chatty("chatty", 0, 3000))?;
    let name = agent.pod_name("chatty");
    let pod = agent
        .wait_pod(&name, T, "started", |p| {
            pods::running(p, "c") || pods::terminated_exit(p, "c").is_some()
        })
        .await?;
    let dir = container_log_dir(&agent, &pod);
    let deadline = Instant::now() + T;
    let mut most = 0;
    let mut rotated_names = std::collections::BTreeSet::new();
    loop {
        let files = log_files(&dir);
        most = most.max(files.len());
        for f in &files {
            rotated_names.insert(f.file_name().unwrap().to_string_lossy().replace(".gz", ""));
        }
        ensure!(
            files.len() <= 3,
            "more than containerLogMaxFiles=3 files: {files:?}"
        );
        let p = agent.pod(&name).await?.context("pod listed")?;
        if pods::terminated_exit(&p, "c") == Some(0) {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "container did not finish\n{}",
            agent.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Rotated several times: more files were seen than are kept.
    ensure!(
        rotated_names.len() >= 4 && most == 3,
        "rotations seen: {rotated_names:?}, most files at once: {most}"
    );
    let files = log_files(&dir);
    ensure!(
        files.iter().any(|f| f.to_string_lossy().ends_with(".gz")),
        "older rotated files are compressed: {files:?}"
    );
    let mut lines = Vec::new();
    for f in &files {
        lines.extend(messages(&read_log_file(f)?));
    }
    ensure!(
        lines.last().map(String::as_str) == Some("done"),
        "ends with done"
    );
    // The runtime wrote its last lines to the file it reopened.
    let current = messages(&read_log_file(&dir.join("0.log"))?);
    ensure!(current.last().map(String::as_str) == Some("done"));
    let first: u32 = lines[0]
        .split(' ')
        .nth(1)
        .and_then(|n| n.parse().ok())
        .context("first kept line")?;
    ensure!(first > 0, "the oldest lines were removed");
    let want: Vec<String> = (first..3000)
        .map(expected_line)
        .chain(["done".to_string()])
        .collect();
    ensure!(
        lines == want,
        "kept lines are not an unbroken run from {first}"
    );
    Ok(())
}

/// GET a node server path as a cluster admin; the body, or the error.
async fn node_get(client: &kube::Client, path: &str) -> Result<String, kube::Error> {
    let req = http::Request::get(path).body(Vec::new()).unwrap();
    client.request_text(req).await
}

fn api_message(e: kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} {}", s.code, s.message),
        other => other.to_string(),
    }
}

/// `/containerLogs` on the node server: a follower started before the
/// output reads every line across many rotations and ends when the
/// container exits; then tail, timestamps, limit and the errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_server_streams_logs_across_rotations() -> Result<()> {
    let cd = Containerd::start().await?;
    let agent = Agent::start(&cd, rotating(3)).await?;
    agent.write_manifest("chatty.yaml", &chatty("chatty", 4, 3000))?;
    let name = agent.pod_name("chatty");
    agent
        .wait_pod(&name, T, "running", |p| pods::running(p, "c"))
        .await?;
    let client = agent.node_client("admin", &["system:masters"]).await?;

    let path = format!("/containerLogs/default/{name}/c?follow=true");
    let req = http::Request::get(&path).body(Vec::new())?;
    let body = client.request_stream(req).await?;
    let follow = async {
        let lines: Vec<String> = body.lines().try_collect().await?;
        anyhow::Ok(lines)
    };
    let lines = tokio::time::timeout(Duration::from_secs(90), follow)
        .await
        .context("follow did not end after the container exited")??;
    let want: Vec<String> = (0..3000)
        .map(expected_line)
        .chain(["done".to_string()])
        .collect();
    if lines != want {
        let first_bad = lines.iter().zip(&want).position(|(a, b)| a != b);
        bail!(
            "followed {} lines, want {}; first difference at {first_bad:?}",
            lines.len(),
            want.len()
        );
    }
    agent
        .wait_pod(&name, T, "container exited", |p| {
            pods::terminated_exit(p, "c") == Some(0)
        })
        .await?;

    // The finished container's log, read back.
    let tail = node_get(
        &client,
        &format!("/containerLogs/default/{name}/c?tailLines=3"),
    )
    .await?;
    ensure!(
        tail == format!("{}\n{}\ndone\n", expected_line(2998), expected_line(2999)),
        "tail: {tail:?}"
    );
    let stamped = node_get(
        &client,
        &format!("/containerLogs/default/{name}/c?tailLines=2&timestamps=true"),
    )
    .await?;
    let stamped: Vec<&str> = stamped.lines().collect();
    ensure!(
        stamped.len() == 2 && stamped[1].ends_with("Z done"),
        "{stamped:?}"
    );
    let ts = stamped[1].split(' ').next().unwrap_or_default();
    ensure!(
        ts.len() == "2026-11-30T06:00:00.000000000Z".len() && ts.parse::<jiff::Timestamp>().is_ok(),
        "RFC 3339 with nine digits: {ts}"
    );
    let cut = node_get(
        &client,
        &format!("/containerLogs/default/{name}/c?tailLines=1&limitBytes=3"),
    )
    .await?;
    ensure!(cut == "don", "limitBytes: {cut:?}");
    // The container may be omitted when the pod has only one.
    let only = node_get(
        &client,
        &format!("/containerLogs/default/{name}?tailLines=1"),
    )
    .await?;
    ensure!(only == "done\n", "{only:?}");

    let err = node_get(
        &client,
        &format!("/containerLogs/default/{name}/c?previous=true"),
    )
    .await
    .map_err(api_message)
    .unwrap_err();
    ensure!(
        err.contains(&format!(
            "previous terminated container \"c\" in pod \"{name}\" not found"
        )),
        "{err}"
    );
    let err = node_get(&client, &format!("/containerLogs/default/{name}/x"))
        .await
        .map_err(api_message)
        .unwrap_err();
    ensure!(
        err.contains("404") && err.contains("container \"x\" not found"),
        "{err}"
    );
    let err = node_get(&client, "/containerLogs/default/nope/c")
        .await
        .map_err(api_message)
        .unwrap_err();
    ensure!(
        err.contains("404") && err.contains("pod \"nope\" does not exist"),
        "{err}"
    );
    Ok(())
}

/// `/stats/summary` in the kubelet's shape, from /proc and CRI stats, and
/// `/metrics` with the agent's families.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_summary_and_metrics() -> Result<()> {
    let cd = Containerd::start().await?;
    let agent = Agent::start(&cd, AgentOptions::default()).await?;
    let manifest = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: idle}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {TOOLBOX_IMAGE}\n    command: [sh, -c, 'echo hello; exec sleep 3600']\n"
    );
    agent.write_manifest("idle.yaml", &manifest)?;
    let name = agent.pod_name("idle");
    agent
        .wait_pod(&name, T, "running", |p| pods::running(p, "c"))
        .await?;
    let client = agent.node_client("admin", &["system:masters"]).await?;

    // containerd reports a new container's stats after its first sample.
    let deadline = Instant::now() + T;
    let summary = loop {
        let text = node_get(&client, "/stats/summary").await?;
        let s: serde_json::Value = serde_json::from_str(&text)?;
        let pod = s["pods"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["podRef"]["name"] == name.as_str()))
            .cloned();
        let ready = pod.as_ref().is_some_and(|p| {
            p["containers"][0]["memory"]["workingSetBytes"]
                .as_u64()
                .is_some()
        });
        if ready {
            break s;
        }
        ensure!(Instant::now() < deadline, "no container stats: {text}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let node = &summary["node"];
    ensure!(node["nodeName"] == agent.node_name(), "{node}");
    ensure!(
        node["cpu"]["usageCoreNanoSeconds"].as_u64() > Some(0),
        "{node}"
    );
    ensure!(node["cpu"]["usageNanoCores"].as_u64().is_some(), "{node}");
    ensure!(
        node["memory"]["workingSetBytes"].as_u64() > Some(0),
        "{node}"
    );
    ensure!(
        node["memory"]["availableBytes"].as_u64() > Some(0),
        "{node}"
    );
    ensure!(node["fs"]["capacityBytes"].as_u64() > Some(0), "{node}");
    ensure!(node["fs"]["availableBytes"].as_u64().is_some(), "{node}");
    let pod = summary["pods"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["podRef"]["name"] == name.as_str()))
        .context("pod in summary")?;
    ensure!(pod["podRef"]["namespace"] == "default", "{pod}");
    let c = &pod["containers"][0];
    ensure!(c["name"] == "c", "{pod}");
    ensure!(c["cpu"]["usageCoreNanoSeconds"].as_u64().is_some(), "{pod}");
    ensure!(
        c["logs"]["usedBytes"].as_u64() > Some(0),
        "the log holds hello: {pod}"
    );
    ensure!(pod["memory"]["workingSetBytes"].as_u64() > Some(0), "{pod}");
    ensure!(
        pod["cpu"]["usageCoreNanoSeconds"].as_u64().is_some(),
        "{pod}"
    );

    let metrics = node_get(&client, "/metrics").await?;
    for family in [
        "kubelet_pod_start_duration_seconds_count 1",
        "kubelet_pleg_relist_duration_seconds_count",
        "kubelet_runtime_operations_duration_seconds_count{operation_type=\"ListContainers\"}",
        "kubelet_runtime_operations_duration_seconds_count{operation_type=\"RunPodSandbox\"}",
    ] {
        ensure!(metrics.contains(family), "{family} missing:\n{metrics}");
    }
    Ok(())
}

/// `kubectl logs` through the API server to the node: -f sees new lines
/// and ends when the container exits; --previous after a restart;
/// --tail with --timestamps; --since-time; --limit-bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_logs_through_the_api_server() -> Result<()> {
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    let result = kubectl_logs(&cluster).await;
    if result.is_err() {
        eprintln!("{}", cluster.diagnostics());
    }
    cluster.finish().await?;
    result
}

async fn kubectl_logs(cluster: &Cluster) -> Result<()> {
    // A ticker that exits: -f follows it to its end.
    cluster
        .apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: ticker}}\nspec:\n  restartPolicy: Never\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {TOOLBOX_IMAGE}\n    command: [sh, -c, 'for i in 1 2 3 4 5 6; do echo tick $i; sleep 1; done']\n"
        ))
        .await?;
    // A container that restarts, each instance printing its own id.
    cluster
        .apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: restarter}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {TOOLBOX_IMAGE}\n    command: [sh, -c, 'echo instance $(cat /proc/sys/kernel/random/uuid); sleep 2; exit 1']\n"
        ))
        .await?;
    // Twenty lines, a pause, and two more.
    cluster
        .apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: counter}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {TOOLBOX_IMAGE}\n    command: [sh, -c, 'i=1; while [ $i -le 20 ]; do echo count $i; i=$((i+1)); done; sleep 3; echo later 1; echo later 2; exec sleep 3600']\n"
        ))
        .await?;
    cluster
        .kubectl_ok(&[
            "wait",
            "--for=condition=Ready",
            "pod/ticker",
            "--timeout=60s",
        ])
        .await?;

    let followed = cluster.kubectl(&["logs", "-f", "ticker"]).await?;
    let out = String::from_utf8_lossy(&followed.stdout);
    ensure!(
        followed.status.success(),
        "kubectl logs -f: {}",
        String::from_utf8_lossy(&followed.stderr)
    );
    let want: String = (1..=6).map(|i| format!("tick {i}\n")).collect();
    ensure!(out == want, "kubectl logs -f ended with {out:?}");

    // --previous: an error until the first restart, then the previous
    // instance's output, which differs from the current one's.
    let early = cluster
        .kubectl(&["logs", "--previous", "restarter"])
        .await?;
    let early_err = String::from_utf8_lossy(&early.stderr).to_string();
    let deadline = Instant::now() + T;
    let restarted = loop {
        let out = cluster
            .kubectl_ok(&[
                "get",
                "pod",
                "restarter",
                "-o",
                "jsonpath={.status.containerStatuses[0].restartCount}",
            ])
            .await?;
        if out.trim().parse::<u32>().unwrap_or(0) >= 1 {
            break true;
        }
        ensure!(Instant::now() < deadline, "restarter never restarted");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    ensure!(restarted);
    if !early.status.success() {
        ensure!(
            early_err
                .contains("previous terminated container \"c\" in pod \"restarter\" not found"),
            "kubectl logs --previous before a restart: {early_err}"
        );
    }
    let previous = cluster
        .kubectl_ok(&["logs", "--previous", "restarter"])
        .await?;
    ensure!(previous.starts_with("instance "), "{previous:?}");

    cluster
        .kubectl_ok(&[
            "wait",
            "--for=condition=Ready",
            "pod/counter",
            "--timeout=60s",
        ])
        .await?;
    let deadline = Instant::now() + T;
    loop {
        let all = cluster.kubectl_ok(&["logs", "counter"]).await?;
        if all.contains("later 2") {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "counter never wrote its last lines: {all:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let tail = cluster
        .kubectl_ok(&["logs", "--tail=5", "--timestamps", "counter"])
        .await?;
    let lines: Vec<&str> = tail.lines().collect();
    let texts: Vec<&str> = lines
        .iter()
        .map(|l| l.split_once(' ').map_or("", |(_, t)| t))
        .collect();
    ensure!(
        texts == ["count 18", "count 19", "count 20", "later 1", "later 2"],
        "--tail=5 --timestamps: {tail:?}"
    );
    let stamp = |l: &str| -> Result<jiff::Timestamp> {
        Ok(l.split(' ').next().unwrap_or_default().parse()?)
    };
    for l in &lines {
        stamp(l).with_context(|| format!("timestamp of {l:?}"))?;
    }
    // --since-time between the counts and the later lines (3 s apart).
    let last_count = stamp(lines[2])?;
    let since = (last_count + jiff::SignedDuration::from_millis(1500)).to_string();
    let recent = cluster
        .kubectl_ok(&["logs", &format!("--since-time={since}"), "counter"])
        .await?;
    ensure!(
        recent == "later 1\nlater 2\n",
        "--since-time={since}: {recent:?}"
    );
    let cut = cluster
        .kubectl_ok(&["logs", "--limit-bytes=10", "counter"])
        .await?;
    ensure!(cut == "count 1\nco", "--limit-bytes=10: {cut:?}");
    Ok(())
}
