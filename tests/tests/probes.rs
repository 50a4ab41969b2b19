//! Probes and lifecycle hooks end to end: static pods on a real containerd
//! (the harness's private one), watched through the agent's status
//! endpoint, its log (standalone, events are log lines) and the CRI log
//! files. Each probe kind passing and failing, with Ready transitions and
//! restart counts; startup gating; preStop before SIGTERM; postStart
//! failure.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use cri_proto::v1;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{json, Value};
use skiff_tests::agent::{pods, Agent, AgentOptions};
use skiff_tests::images::{grpc_health, GRPC_HEALTH_IMAGE};
use skiff_tests::{Containerd, TOOLBOX_IMAGE};

const T: Duration = Duration::from_secs(90);

fn options() -> AgentOptions {
    AgentOptions {
        extra_args: vec![
            "--crash-loop-back-off-initial=1s".into(),
            "--crash-loop-back-off-max=2s".into(),
        ],
        ..Default::default()
    }
}

/// A pod manifest with one container `c` (JSON is YAML).
fn manifest(name: &str, container: Value) -> String {
    manifest_with(name, container, json!({}))
}

fn manifest_with(name: &str, container: Value, spec_extra: Value) -> String {
    let mut c = json!({"name": "c", "image": TOOLBOX_IMAGE, "imagePullPolicy": "Never"});
    merge(&mut c, container);
    let mut spec = json!({"terminationGracePeriodSeconds": 5, "containers": [c]});
    merge(&mut spec, spec_extra);
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}).to_string()
}

fn merge(a: &mut Value, b: Value) {
    if let (Some(a), Value::Object(b)) = (a.as_object_mut(), b) {
        for (k, v) in b {
            a.insert(k, v);
        }
    }
}

fn sh(script: &str) -> Value {
    json!(["sh", "-c", script])
}

fn exec_probe(script: &str, extra: Value) -> Value {
    let mut p = json!({"exec": {"command": sh(script)}, "periodSeconds": 1, "failureThreshold": 1});
    merge(&mut p, extra);
    p
}

fn container_ready(p: &Pod) -> bool {
    pods::container(p, "c").is_some_and(|c| c.ready)
}

fn started(p: &Pod) -> Option<bool> {
    pods::container(p, "c").and_then(|c| c.started)
}

fn condition(p: &Pod, type_: &str) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == type_))
        .map(|c| c.status.clone())
        .unwrap_or_default()
}

/// Ready as a whole: the container, and both pod conditions.
fn fully_ready(p: &Pod) -> bool {
    container_ready(p)
        && condition(p, "Ready") == "True"
        && condition(p, "ContainersReady") == "True"
}

fn fully_unready(p: &Pod) -> bool {
    pods::running(p, "c")
        && !container_ready(p)
        && condition(p, "Ready") == "False"
        && condition(p, "ContainersReady") == "False"
}

fn container_id(p: &Pod) -> String {
    pods::container_id(p, "c")
        .trim_start_matches("containerd://")
        .to_string()
}

/// Run a command in the pod's container through CRI (as `kubectl exec`
/// would), to flip what its probes see.
async fn exec(cd: &Containerd, p: &Pod, script: &str) -> Result<()> {
    let r = cd
        .client()
        .exec_sync(v1::ExecSyncRequest {
            container_id: container_id(p),
            cmd: vec!["sh".into(), "-c".into(), script.into()],
            timeout: 10,
        })
        .await?;
    ensure!(
        r.exit_code == 0,
        "exec {script:?} exited {}: {}",
        r.exit_code,
        String::from_utf8_lossy(&r.stderr)
    );
    Ok(())
}

fn agent_log(agent: &Agent) -> String {
    std::fs::read_to_string(agent.dir().join("agent.log")).unwrap_or_default()
}

/// Wait until one line of the agent's log holds every needle.
async fn wait_log(agent: &Agent, needles: &[&str]) -> Result<String> {
    let deadline = Instant::now() + T;
    loop {
        let log = agent_log(agent);
        if let Some(l) = log.lines().find(|l| needles.iter().all(|n| l.contains(n))) {
            return Ok(l.to_string());
        }
        if Instant::now() > deadline {
            bail!(
                "no agent log line with {needles:?}; log tail:\n{}",
                agent.log_tail(40)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn wait(agent: &Agent, name: &str, what: &str, pred: impl Fn(&Pod) -> bool) -> Result<Pod> {
    agent.wait_pod(&agent.pod_name(name), T, what, pred).await
}

async fn start() -> Result<(Containerd, Agent)> {
    let cd = Containerd::start().await?;
    let agent = Agent::start(&cd, options()).await?;
    Ok((cd, agent))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_probes_pass_fail_and_restart() -> Result<()> {
    let (cd, agent) = start().await?;
    // Readiness follows a file the test flips.
    agent.write_manifest(
        "ready.json",
        &manifest(
            "ready",
            json!({"command": sh("touch /tmp/ready; exec sleep 3600"),
                   "readinessProbe": exec_probe("test -f /tmp/ready", json!({}))}),
        ),
    )?;
    // Liveness fails from the start: killed and restarted, again and again.
    agent.write_manifest(
        "dead.json",
        &manifest(
            "dead",
            json!({"command": sh("exec sleep 3600"),
                   "livenessProbe": exec_probe("echo sick; exit 1", json!({"terminationGracePeriodSeconds": 1}))}),
        ),
    )?;
    let p = wait(&agent, "ready", "Ready", fully_ready).await?;
    exec(&cd, &p, "rm /tmp/ready").await?;
    wait(
        &agent,
        "ready",
        "not Ready after the file went",
        fully_unready,
    )
    .await?;
    wait_log(&agent, &["Unhealthy", "Readiness probe failed"]).await?;
    exec(&cd, &p, "touch /tmp/ready").await?;
    let p = wait(&agent, "ready", "Ready again", fully_ready).await?;
    ensure!(pods::restarts(&p, "c") == 0, "readiness never restarts");

    wait(&agent, "dead", "restarted twice", |p| {
        pods::restarts(p, "c") >= 2
    })
    .await?;
    wait_log(&agent, &["Unhealthy", "Liveness probe failed: sick"]).await?;
    wait_log(
        &agent,
        &[
            "Killing",
            "Container c failed liveness probe, will be restarted",
        ],
    )
    .await?;
    drop(agent);
    cd.cleanup().await
}

fn httpd(extra: Value) -> Value {
    let mut c = json!({
        "command": sh("mkdir -p /www && echo ok > /www/healthz && exec httpd -f -p 8080 -h /www"),
        "ports": [{"name": "web", "containerPort": 8080}],
    });
    merge(&mut c, extra);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_and_tcp_probes() -> Result<()> {
    let (cd, agent) = start().await?;
    // httpGet readiness on the named port, with a header.
    agent.write_manifest(
        "web.json",
        &manifest(
            "web",
            httpd(json!({"readinessProbe": {
                "httpGet": {"path": "/healthz", "port": "web", "httpHeaders": [{"name": "X-Probe", "value": "1"}]},
                "periodSeconds": 1, "failureThreshold": 1}})),
        ),
    )?;
    // httpGet liveness on a port nobody serves.
    agent.write_manifest(
        "webdead.json",
        &manifest(
            "webdead",
            httpd(json!({"livenessProbe": {
                "httpGet": {"path": "/healthz", "port": 8081},
                "periodSeconds": 1, "failureThreshold": 2, "terminationGracePeriodSeconds": 1}})),
        ),
    )?;
    // tcpSocket readiness passes on the server's port; liveness fails on
    // another one.
    agent.write_manifest(
        "tcp.json",
        &manifest(
            "tcp",
            httpd(json!({
                "readinessProbe": {"tcpSocket": {"port": "web"}, "periodSeconds": 1},
                "livenessProbe": {"tcpSocket": {"port": 9999}, "periodSeconds": 1,
                                  "failureThreshold": 1, "initialDelaySeconds": 1,
                                  "terminationGracePeriodSeconds": 1}})),
        ),
    )?;
    let p = wait(&agent, "web", "Ready", fully_ready).await?;
    exec(&cd, &p, "rm /www/healthz").await?;
    wait(&agent, "web", "not Ready on 404", fully_unready).await?;
    wait_log(
        &agent,
        &[
            "Unhealthy",
            "Readiness probe failed: HTTP probe failed with statuscode: 404",
        ],
    )
    .await?;
    exec(&cd, &p, "echo ok > /www/healthz").await?;
    wait(&agent, "web", "Ready again", fully_ready).await?;

    wait(&agent, "webdead", "restarted", |p| {
        pods::restarts(p, "c") >= 1
    })
    .await?;
    wait_log(
        &agent,
        &[
            "Liveness probe failed: Get \"http://",
            ":8081/healthz\": dial tcp",
            "connection refused",
        ],
    )
    .await?;

    let p = wait(&agent, "tcp", "restarted by its tcp liveness probe", |p| {
        pods::restarts(p, "c") >= 1
    })
    .await?;
    ensure!(pods::restarts(&p, "c") >= 1);
    wait(&agent, "tcp", "Ready through tcpSocket", fully_ready).await?;
    wait_log(
        &agent,
        &[
            "Liveness probe failed: dial tcp",
            ":9999: connect: connection refused",
        ],
    )
    .await?;
    drop(agent);
    cd.cleanup().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_probes() -> Result<()> {
    let (cd, agent) = start().await?;
    let image = tokio::task::spawn_blocking(grpc_health).await??;
    cd.images().load(&image).await?;
    let server = |extra: Value| {
        let mut c = json!({"image": GRPC_HEALTH_IMAGE,
                           "command": ["grpc-health-server", "9090", "api"]});
        merge(&mut c, extra);
        c
    };
    agent.write_manifest(
        "grpc.json",
        &manifest(
            "grpc",
            server(
                json!({"readinessProbe": {"grpc": {"port": 9090, "service": "api"},
                                             "periodSeconds": 1, "failureThreshold": 1}}),
            ),
        ),
    )?;
    agent.write_manifest(
        "grpcdead.json",
        &manifest(
            "grpcdead",
            server(
                json!({"livenessProbe": {"grpc": {"port": 9090, "service": "nosuch"},
                                            "periodSeconds": 1, "failureThreshold": 2,
                                            "terminationGracePeriodSeconds": 1}}),
            ),
        ),
    )?;
    let p = wait(&agent, "grpc", "Ready", fully_ready).await?;
    exec(&cd, &p, "touch /tmp/unhealthy").await?;
    wait(&agent, "grpc", "not Ready while NOT_SERVING", fully_unready).await?;
    wait_log(
        &agent,
        &["Readiness probe failed: service unhealthy (responded with \"NOT_SERVING\")"],
    )
    .await?;
    exec(&cd, &p, "rm /tmp/unhealthy").await?;
    wait(&agent, "grpc", "Ready again", fully_ready).await?;

    wait(&agent, "grpcdead", "restarted", |p| {
        pods::restarts(p, "c") >= 1
    })
    .await?;
    wait_log(
        &agent,
        &["Liveness probe failed: error: health rpc probe failed"],
    )
    .await?;
    drop(agent);
    cd.cleanup().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_probe_holds_back_liveness_and_readiness() -> Result<()> {
    let (cd, agent) = start().await?;
    // Liveness would kill at once (until /tmp/started exists) and
    // readiness would pass at once, but neither runs until the startup
    // probe passes; once started, liveness fails when the test says so
    // (a liveness failing at once could restart the container before
    // its Ready is seen).
    agent.write_manifest(
        "slow.json",
        &manifest(
            "slow",
            json!({"command": sh("exec sleep 3600"),
                   "startupProbe": exec_probe("test -f /tmp/started", json!({"failureThreshold": 1000})),
                   "livenessProbe": exec_probe("test -f /tmp/started && test ! -f /tmp/kill", json!({"terminationGracePeriodSeconds": 1})),
                   "readinessProbe": exec_probe("true", json!({}))}),
        ),
    )?;
    // A startup probe that never passes restarts the container.
    agent.write_manifest(
        "neverup.json",
        &manifest(
            "neverup",
            json!({"command": sh("exec sleep 3600"),
                   "startupProbe": exec_probe("exit 1", json!({"failureThreshold": 2, "terminationGracePeriodSeconds": 1}))}),
        ),
    )?;
    let p = wait(&agent, "slow", "running, not started", |p| {
        pods::running(p, "c") && started(p) == Some(false)
    })
    .await?;
    ensure!(fully_unready(&p), "not ready before it started");
    // The startup probe is failing meanwhile: that is what it is for.
    wait_log(&agent, &["Startup probe failed"]).await?;
    let p = wait(&agent, "slow", "still unstarted", |p| {
        started(p) == Some(false)
    })
    .await?;
    ensure!(
        pods::restarts(&p, "c") == 0,
        "liveness held back: no restart"
    );
    ensure!(
        !agent_log(&agent).contains("Liveness probe failed"),
        "liveness must not run before the startup probe passes"
    );
    ensure!(!container_ready(&p));

    // Started: readiness passes; then the liveness probe, told to fail, restarts it.
    exec(&cd, &p, "touch /tmp/started").await?;
    let p = wait(&agent, "slow", "started and Ready", |p| {
        started(p) == Some(true) && fully_ready(p)
    })
    .await?;
    exec(&cd, &p, "touch /tmp/kill").await?;
    wait(&agent, "slow", "restarted by liveness once started", |p| {
        pods::restarts(p, "c") >= 1
    })
    .await?;
    wait_log(&agent, &["Liveness probe failed"]).await?;

    wait(&agent, "neverup", "restarted by its startup probe", |p| {
        pods::restarts(p, "c") >= 1
    })
    .await?;
    wait_log(
        &agent,
        &[
            "Killing",
            "Container c failed startup probe, will be restarted",
        ],
    )
    .await?;
    drop(agent);
    cd.cleanup().await
}

/// A container that reports SIGTERM in its log and lingers a moment, with
/// hooks that write to the container's stdout (`/proc/1/fd/1`).
fn hooked(extra: Value) -> Value {
    let mut c = json!({
        "command": sh("trap 'echo got SIGTERM; sleep 1; exit 0' TERM; echo main started; while true; do sleep 0.2; done"),
        "lifecycle": {
            "postStart": {"exec": {"command": sh("echo postStart ran > /proc/1/fd/1")}},
            "preStop": {"exec": {"command": sh("echo preStop ran > /proc/1/fd/1; sleep 1")}},
        },
    });
    merge(&mut c, extra);
    c
}

fn log_path(agent: &Agent, p: &Pod, restart: u32) -> std::path::PathBuf {
    let uid = p.metadata.uid.clone().unwrap_or_default();
    let name = p.metadata.name.clone().unwrap_or_default();
    agent
        .log_dir()
        .join(format!("default_{name}_{uid}"))
        .join(format!("c/{restart}.log"))
}

/// The messages of a CRI log file, in order.
fn log_lines(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.splitn(4, ' ').nth(3).map(str::to_string))
        .collect()
}

fn ordered(lines: &[String], first: &str, then: &str) -> bool {
    let a = lines.iter().position(|l| l == first);
    let b = lines.iter().position(|l| l == then);
    matches!((a, b), (Some(a), Some(b)) if a < b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pre_stop_runs_before_the_stop_signal() -> Result<()> {
    let (cd, agent) = start().await?;
    // A liveness kill: the first container's log stays for `--previous`.
    agent.write_manifest(
        "hooks.json",
        &manifest(
            "hooks",
            hooked(json!({"livenessProbe": exec_probe("test ! -f /tmp/die", json!({}))})),
        ),
    )?;
    let p = wait(&agent, "hooks", "running", |p| pods::running(p, "c")).await?;
    let first = log_path(&agent, &p, 0);
    exec(&cd, &p, "touch /tmp/die").await?;
    wait(&agent, "hooks", "restarted", |p| {
        pods::restarts(p, "c") >= 1 && pods::running(p, "c")
    })
    .await?;
    let lines = log_lines(&first);
    ensure!(
        lines.iter().any(|l| l == "postStart ran"),
        "postStart output in the log: {lines:?}"
    );
    ensure!(
        ordered(&lines, "preStop ran", "got SIGTERM"),
        "preStop before SIGTERM: {lines:?}"
    );

    // Deleting the pod: the hook runs before the stop signal too. The log
    // directory goes with the pod, so read it while the container lingers.
    let p = agent
        .pod(&agent.pod_name("hooks"))
        .await?
        .context("pod listed")?;
    let current = log_path(&agent, &p, pods::restarts(&p, "c") as u32);
    agent.remove_manifest("hooks.json")?;
    let deadline = Instant::now() + T;
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        let lines = log_lines(&current);
        if lines.len() >= seen.len() {
            seen = lines;
        }
        if seen.iter().any(|l| l == "got SIGTERM") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ensure!(
        ordered(&seen, "preStop ran", "got SIGTERM"),
        "preStop before SIGTERM on deletion: {seen:?}"
    );
    agent.wait_pod_gone(&agent.pod_name("hooks"), T).await?;
    drop(agent);
    cd.cleanup().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_post_start_kills_and_restarts() -> Result<()> {
    let (cd, agent) = start().await?;
    agent.write_manifest(
        "badhook.json",
        &manifest(
            "badhook",
            json!({"command": sh("exec sleep 3600"),
                   "lifecycle": {"postStart": {"exec": {"command": sh("echo nope; exit 3")}}}}),
        ),
    )?;
    // An httpGet hook that gets no answer fails too.
    agent.write_manifest(
        "badhttp.json",
        &manifest(
            "badhttp",
            json!({"command": sh("exec sleep 3600"),
                   "lifecycle": {"postStart": {"httpGet": {"path": "/hook", "port": 8089}}}}),
        ),
    )?;
    wait(&agent, "badhook", "restarted after failed postStart", |p| {
        pods::restarts(p, "c") >= 1
    })
    .await?;
    wait_log(&agent, &["FailedPostStartHook", "PostStartHook failed"]).await?;
    wait_log(
        &agent,
        &[
            "postStart hook failed",
            "Exec lifecycle hook ([sh -c echo nope; exit 3])",
            "exited with 3",
        ],
    )
    .await?;
    wait(&agent, "badhook", "waiting with the hook's reason", |p| {
        matches!(
            pods::waiting_reason(p, "c").as_str(),
            "PostStartHookError" | "CrashLoopBackOff"
        )
    })
    .await?;
    wait(
        &agent,
        "badhttp",
        "restarted after failed http postStart",
        |p| pods::restarts(p, "c") >= 1,
    )
    .await?;
    wait_log(
        &agent,
        &["postStart hook failed", "HTTP lifecycle hook (/hook)"],
    )
    .await?;

    // A failing preStop hook is reported, and the stop goes on.
    agent.write_manifest(
        "badstop.json",
        &manifest(
            "badstop",
            json!({"command": sh("exec sleep 3600"),
                   "lifecycle": {"preStop": {"exec": {"command": sh("exit 1")}}}}),
        ),
    )?;
    wait(&agent, "badstop", "running", |p| pods::running(p, "c")).await?;
    agent.remove_manifest("badstop.json")?;
    wait_log(&agent, &["FailedPreStopHook", "PreStopHook failed"]).await?;
    agent.wait_pod_gone(&agent.pod_name("badstop"), T).await?;
    drop(agent);
    cd.cleanup().await
}
