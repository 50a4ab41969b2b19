//! skiff-agent end to end: static pods through a real containerd (the
//! harness's private one), observed through the agent's status endpoint
//! and directly through CRI.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use cri_proto::{v1, CriClient};
use skiff_tests::agent::{pods, Agent, AgentOptions};
use skiff_tests::{Containerd, TOOLBOX_IMAGE};

const T: Duration = Duration::from_secs(60);

fn pod_yaml(name: &str, policy: &str, grace: u32, containers: &[(&str, &str)]) -> String {
    let mut y = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  labels: {{app: {name}}}\nspec:\n  restartPolicy: {policy}\n  terminationGracePeriodSeconds: {grace}\n  containers:\n"
    );
    for (c, script) in containers {
        y += &format!(
            "  - name: {c}\n    image: {TOOLBOX_IMAGE}\n    command: [sh, -c, {script:?}]\n"
        );
    }
    y
}

fn fast_backoff() -> AgentOptions {
    AgentOptions {
        extra_args: vec![
            "--crash-loop-back-off-initial=1s".into(),
            "--crash-loop-back-off-max=2s".into(),
        ],
        ..Default::default()
    }
}

/// The kubelet label selector for one pod's sandboxes and containers.
fn uid_selector(uid: &str) -> HashMap<String, String> {
    HashMap::from([("io.kubernetes.pod.uid".to_string(), uid.to_string())])
}

async fn sandboxes_of(cri: &CriClient, uid: &str) -> Result<Vec<v1::PodSandbox>> {
    let filter = v1::PodSandboxFilter {
        label_selector: uid_selector(uid),
        ..Default::default()
    };
    Ok(cri
        .list_pod_sandbox(v1::ListPodSandboxRequest {
            filter: Some(filter),
        })
        .await?
        .items)
}

async fn containers_of(cri: &CriClient, uid: &str) -> Result<Vec<v1::Container>> {
    let filter = v1::ContainerFilter {
        label_selector: uid_selector(uid),
        ..Default::default()
    };
    Ok(cri
        .list_containers(v1::ListContainersRequest {
            filter: Some(filter),
        })
        .await?
        .containers)
}

fn uid(p: &k8s_openapi::api::core::v1::Pod) -> String {
    p.metadata.uid.clone().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_lifecycle_end_to_end() -> Result<()> {
    let cd = Containerd::start().await?;
    let agent = Agent::start(&cd, AgentOptions::default()).await?;
    agent.write_manifest(
        "web.yaml",
        &pod_yaml(
            "web",
            "Always",
            5,
            &[("main", "echo hello from web; exec sleep 3600")],
        ),
    )?;
    let name = agent.pod_name("web");
    let pod = agent
        .wait_pod(&name, T, "Running and Ready", |p| {
            pods::phase(p) == "Running" && pods::ready(p)
        })
        .await?;
    let status = pod.status.clone().unwrap();
    let ip = status.pod_ip.clone().context("pod IP")?;
    let prefix = cd
        .subnet()
        .rsplit_once('.')
        .map(|(p, _)| p.to_string())
        .unwrap();
    ensure!(
        ip.starts_with(&prefix),
        "pod IP {ip} not in {}",
        cd.subnet()
    );
    let cs = pods::container(&pod, "main").unwrap();
    ensure!(cs
        .container_id
        .as_deref()
        .unwrap_or("")
        .starts_with("containerd://"));
    ensure!(!cs.image_id.is_empty(), "imageID set");
    ensure!(status.start_time.is_some() && status.host_ip.is_some());

    // kubelet-compatible labels on the sandbox and container.
    let cri = cd.client();
    let sbs = sandboxes_of(&cri, &uid(&pod)).await?;
    ensure!(sbs.len() == 1, "one sandbox, got {}", sbs.len());
    let l = &sbs[0].labels;
    ensure!(l["io.kubernetes.pod.name"] == name && l["io.kubernetes.pod.namespace"] == "default");
    ensure!(l["app"] == "web", "pod labels carried to the sandbox");
    let cs = containers_of(&cri, &uid(&pod)).await?;
    ensure!(cs.len() == 1 && cs[0].labels["io.kubernetes.container.name"] == "main");

    // Logs at the upstream path, in the CRI format.
    let log = agent
        .log_dir()
        .join(format!("default_{name}_{}", uid(&pod)))
        .join("main/0.log");
    let deadline = Instant::now() + T;
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("hello from web") || Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let line = text.lines().next().context("log line")?;
    let parts: Vec<&str> = line.splitn(4, ' ').collect();
    ensure!(
        parts.len() == 4 && parts[1] == "stdout" && parts[2] == "F" && parts[3] == "hello from web",
        "CRI log line: {line:?}"
    );

    // The read-only endpoint answers like a kubelet's read-only port.
    let node: serde_json::Value = reqwest::get(format!("http://{}/node", agent.status_address()))
        .await?
        .json()
        .await?;
    ensure!(node["status"]["nodeInfo"]["containerRuntimeVersion"]
        .as_str()
        .unwrap_or("")
        .starts_with("containerd://"));
    ensure!(node["status"]["capacity"]["pods"] == "110");

    // Removing the manifest removes the pod, its sandbox and its logs.
    agent.remove_manifest("web.yaml")?;
    agent.wait_pod_gone(&name, T).await?;
    ensure!(
        sandboxes_of(&cri, &uid(&pod)).await?.is_empty(),
        "sandbox removed"
    );
    ensure!(
        containers_of(&cri, &uid(&pod)).await?.is_empty(),
        "containers removed"
    );
    ensure!(
        !log.parent().unwrap().parent().unwrap().exists(),
        "pod log directory removed"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_containers_run_in_order_before_app_containers() -> Result<()> {
    let cd = Containerd::start().await?;
    let agent = Agent::start(&cd, AgentOptions::default()).await?;
    let manifest = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: ordered}}\nspec:\n  initContainers:\n  - {{name: init-a, image: {TOOLBOX_IMAGE}, command: [sh, -c, 'sleep 1']}}\n  - {{name: init-b, image: {TOOLBOX_IMAGE}, command: [sh, -c, 'sleep 1']}}\n  containers:\n  - {{name: app, image: {TOOLBOX_IMAGE}, command: [sleep, '3600']}}\n  - {{name: sidecar, image: {TOOLBOX_IMAGE}, command: [sleep, '3600']}}\n"
    );
    agent.write_manifest("ordered.yaml", &manifest)?;
    let name = agent.pod_name("ordered");
    // While init-a runs, the pod is initializing and no app container exists.
    let p = agent
        .wait_pod(&name, T, "init-a running", |p| pods::running(p, "init-a"))
        .await?;
    ensure!(pods::phase(&p) == "Pending");
    ensure!(pods::waiting_reason(&p, "app") == "PodInitializing");
    let p = agent
        .wait_pod(&name, T, "all running", pods::all_running)
        .await?;
    ensure!(pods::phase(&p) == "Running");
    ensure!(
        pods::terminated_exit(&p, "init-a") == Some(0)
            && pods::terminated_exit(&p, "init-b") == Some(0)
    );

    // The runtime's own timestamps prove the order.
    let cri = cd.client();
    let mut times = HashMap::new();
    for c in containers_of(&cri, &uid(&p)).await? {
        let s = cri
            .container_status(v1::ContainerStatusRequest {
                container_id: c.id.clone(),
                verbose: false,
            })
            .await?
            .status
            .unwrap();
        times.insert(s.metadata.unwrap().name, (s.started_at, s.finished_at));
    }
    ensure!(
        times["init-a"].1 <= times["init-b"].0,
        "init-b started after init-a finished: {times:?}"
    );
    ensure!(
        times["init-b"].1 <= times["app"].0,
        "app started after init-b finished: {times:?}"
    );
    ensure!(
        times["init-b"].1 <= times["sidecar"].0,
        "sidecar started after init-b finished"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_policies_with_failing_containers() -> Result<()> {
    let cd = Containerd::start().await?;
    let agent = Agent::start(&cd, fast_backoff()).await?;
    agent.write_manifest(
        "always.yaml",
        &pod_yaml("always", "Always", 1, &[("c", "echo crash; exit 1")]),
    )?;
    agent.write_manifest(
        "onfailure-bad.yaml",
        &pod_yaml("onfailure-bad", "OnFailure", 1, &[("c", "exit 3")]),
    )?;
    agent.write_manifest(
        "onfailure-ok.yaml",
        &pod_yaml("onfailure-ok", "OnFailure", 1, &[("c", "exit 0")]),
    )?;
    agent.write_manifest(
        "never.yaml",
        &pod_yaml("never", "Never", 1, &[("c", "exit 2")]),
    )?;

    let p = agent
        .wait_pod(&agent.pod_name("never"), T, "Failed", |p| {
            pods::phase(p) == "Failed"
        })
        .await?;
    ensure!(pods::restarts(&p, "c") == 0 && pods::terminated_exit(&p, "c") == Some(2));
    let t = pods::container(&p, "c")
        .unwrap()
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    ensure!(
        t.reason.as_deref() == Some("Error"),
        "reason {:?}",
        t.reason
    );

    let p = agent
        .wait_pod(&agent.pod_name("onfailure-ok"), T, "Succeeded", |p| {
            pods::phase(p) == "Succeeded"
        })
        .await?;
    ensure!(pods::restarts(&p, "c") == 0);
    let t = pods::container(&p, "c")
        .unwrap()
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    ensure!(t.reason.as_deref() == Some("Completed"));

    // Crash loops: restarted with back-off, CrashLoopBackOff in between,
    // the last exit in lastState.
    for name in ["always", "onfailure-bad"] {
        let pod_name = agent.pod_name(name);
        let p = agent
            .wait_pod(&pod_name, T, "CrashLoopBackOff after 2 restarts", |p| {
                pods::restarts(p, "c") >= 2 && pods::waiting_reason(p, "c") == "CrashLoopBackOff"
            })
            .await?;
        ensure!(
            pods::phase(&p) == "Running",
            "{name}: a restarting pod is Running, got {}",
            pods::phase(&p)
        );
        let last = pods::container(&p, "c")
            .unwrap()
            .last_state
            .clone()
            .unwrap()
            .terminated
            .context("lastState")?;
        ensure!(last.exit_code == if name == "always" { 1 } else { 3 });
        // Only the newest dead container is kept (for --previous logs).
        let dead = containers_of(&cd.client(), &uid(&p)).await?;
        ensure!(
            dead.len() <= 2,
            "{name}: old dead containers are collected, {} left",
            dead.len()
        );
    }
    Ok(())
}

/// Poll a container through CRI until it is gone, returning the last
/// state seen and when it exited.
async fn watch_exit(cri: CriClient, id: String) -> Option<(i32, Instant)> {
    let mut seen = None;
    loop {
        match cri
            .container_status(v1::ContainerStatusRequest {
                container_id: id.clone(),
                verbose: false,
            })
            .await
        {
            Ok(r) => {
                let s = r.status.unwrap_or_default();
                if s.state == v1::ContainerState::ContainerExited as i32 && seen.is_none() {
                    seen = Some((s.exit_code, Instant::now()));
                }
            }
            Err(_) => return seen,
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn termination_honours_the_grace_period() -> Result<()> {
    let cd = Containerd::start().await?;
    let agent = Agent::start(&cd, AgentOptions::default()).await?;
    let grace = 4;
    agent.write_manifest(
        "polite.yaml",
        &pod_yaml(
            "polite",
            "Always",
            grace,
            &[(
                "c",
                "trap 'echo bye; exit 0' TERM; while true; do sleep 0.1; done",
            )],
        ),
    )?;
    agent.write_manifest(
        "stubborn.yaml",
        &pod_yaml(
            "stubborn",
            "Always",
            grace,
            &[("c", "trap '' TERM; while true; do sleep 0.1; done")],
        ),
    )?;
    let mut watchers = Vec::new();
    for name in ["polite", "stubborn"] {
        let p = agent
            .wait_pod(&agent.pod_name(name), T, "running", pods::all_running)
            .await?;
        let id = pods::container_id(&p, "c")
            .trim_start_matches("containerd://")
            .to_string();
        watchers.push(tokio::spawn(watch_exit(cd.client(), id)));
    }
    // Let the shells install their traps.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let removed = Instant::now();
    agent.remove_manifest("polite.yaml")?;
    agent.remove_manifest("stubborn.yaml")?;
    let polite = watchers.remove(0).await?.context("saw polite exit")?;
    let stubborn = watchers.remove(0).await?.context("saw stubborn exit")?;
    // TERM reached the polite one, which exited cleanly in its own time.
    ensure!(polite.0 == 0, "polite container exit code {}", polite.0);
    ensure!(
        polite.1 < removed + Duration::from_secs(grace as u64),
        "polite container got TERM before its deadline"
    );
    // The stubborn one kept running through its grace period, then SIGKILL.
    ensure!(
        stubborn.0 == 137,
        "stubborn container exit code {}",
        stubborn.0
    );
    ensure!(
        stubborn.1 >= removed + Duration::from_secs(grace as u64 - 1),
        "stubborn container was killed only at the end of its grace period"
    );
    agent.wait_pod_gone(&agent.pod_name("stubborn"), T).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_sigkill_and_restart_restarts_no_container() -> Result<()> {
    let cd = Containerd::start().await?;
    let mut agent = Agent::start(&cd, AgentOptions::default()).await?;
    let n = 10;
    for i in 0..n {
        agent.write_manifest(
            &format!("p{i}.yaml"),
            &pod_yaml(&format!("p{i}"), "Always", 1, &[("c", "exec sleep 3600")]),
        )?;
    }
    let mut before = HashMap::new();
    for i in 0..n {
        let p = agent
            .wait_pod(
                &agent.pod_name(&format!("p{i}")),
                T,
                "running",
                pods::all_running,
            )
            .await?;
        before.insert(
            i,
            (
                pods::container_id(&p, "c"),
                pods::restarts(&p, "c"),
                p.status.unwrap().pod_ip,
            ),
        );
    }
    let cri = cd.client();
    let sandboxes_before = cri
        .list_pod_sandbox(v1::ListPodSandboxRequest::default())
        .await?
        .items
        .len();

    agent.kill();
    agent.restart().await?;
    for i in 0..n {
        let p = agent
            .wait_pod(
                &agent.pod_name(&format!("p{i}")),
                T,
                "running",
                pods::all_running,
            )
            .await?;
        let now = (
            pods::container_id(&p, "c"),
            pods::restarts(&p, "c"),
            p.status.unwrap().pod_ip,
        );
        ensure!(
            now == before[&i],
            "pod p{i} changed across the agent restart: {:?} -> {now:?}",
            before[&i]
        );
    }
    // Give the restarted agent a few relists to do anything it would do.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for i in 0..n {
        let p = agent
            .pod(&agent.pod_name(&format!("p{i}")))
            .await?
            .context("pod listed")?;
        ensure!(pods::container_id(&p, "c") == before[&i].0 && pods::restarts(&p, "c") == 0);
    }
    let sandboxes_after = cri
        .list_pod_sandbox(v1::ListPodSandboxRequest::default())
        .await?
        .items;
    ensure!(
        sandboxes_after.len() == sandboxes_before,
        "no sandbox created or lost"
    );
    let all_ready = sandboxes_after
        .iter()
        .all(|s| s.state == v1::PodSandboxState::SandboxReady as i32);
    ensure!(all_ready, "every sandbox still ready");

    // A manifest removed while the agent was down is torn down when it is back.
    agent.kill();
    agent.remove_manifest("p0.yaml")?;
    agent.restart().await?;
    let uid0 = {
        let sbs = cri
            .list_pod_sandbox(v1::ListPodSandboxRequest::default())
            .await?
            .items;
        sbs.into_iter()
            .find(|s| s.labels.get("io.kubernetes.pod.name") == Some(&agent.pod_name("p0")))
            .map(|s| s.labels["io.kubernetes.pod.uid"].clone())
    };
    if let Some(uid0) = uid0 {
        let deadline = Instant::now() + T;
        while !sandboxes_of(&cri, &uid0).await?.is_empty() {
            ensure!(
                Instant::now() < deadline,
                "orphan pod p0 not torn down:\n{}",
                agent.log_tail(30)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let p1 = agent
        .wait_pod(&agent.pod_name("p1"), T, "running", pods::all_running)
        .await?;
    ensure!(pods::container_id(&p1, "c") == before[&1].0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_manifests_are_reported_and_do_not_disturb_others() -> Result<()> {
    let cd = Containerd::start().await?;
    let agent = Agent::start(&cd, AgentOptions::default()).await?;
    agent.write_manifest(
        "good.yaml",
        &pod_yaml("good", "Always", 1, &[("c", "exec sleep 3600")]),
    )?;
    agent.write_manifest(
        "broken.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: broken\nspec: [",
    )?;
    agent.write_manifest(
        "invalid.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: invalid}\nspec:\n  containers:\n  - {name: c, image: ''}\n",
    )?;
    agent.write_manifest(
        "wrongtype.json",
        r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"wt"},"spec":{"containers":[{"name":"c","image":"i","ports":[{"containerPort":"eighty"}]}]}}"#,
    )?;
    agent
        .wait_pod(&agent.pod_name("good"), T, "running", pods::all_running)
        .await?;
    let deadline = Instant::now() + T;
    loop {
        let log = agent.log_tail(200);
        let ok = log.contains("broken.yaml")
            && log.contains("invalid.yaml")
            && log.contains("spec.containers[0].image: Required value")
            && log.contains("wrongtype.json")
            && log.contains("spec.containers[0].ports[0].containerPort");
        if ok {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "bad manifests not reported clearly:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ensure!(agent.pods().await?.len() == 1, "only the good pod runs");
    // Fixing a manifest starts its pod.
    agent.write_manifest(
        "invalid.yaml",
        &pod_yaml("invalid", "Always", 1, &[("c", "exec sleep 3600")]),
    )?;
    agent
        .wait_pod(&agent.pod_name("invalid"), T, "running", pods::all_running)
        .await?;
    let good = agent
        .pod(&agent.pod_name("good"))
        .await?
        .context("good pod")?;
    ensure!(pods::restarts(&good, "c") == 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unpullable_image_backs_off_without_affecting_others() -> Result<()> {
    let cd = Containerd::start().await?;
    let agent = Agent::start(&cd, fast_backoff()).await?;
    // Port 1 on loopback: refused at once, and never leaves the machine.
    agent.write_manifest(
        "nope.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: nope}\nspec:\n  containers:\n  - {name: c, image: '127.0.0.1:1/skiff/nope:1.0'}\n",
    )?;
    agent.write_manifest(
        "fine.yaml",
        &pod_yaml("fine", "Always", 1, &[("c", "exec sleep 3600")]),
    )?;
    let name = agent.pod_name("nope");
    agent
        .wait_pod(&name, T, "ErrImagePull", |p| {
            pods::waiting_reason(p, "c") == "ErrImagePull"
        })
        .await?;
    let p = agent
        .wait_pod(&name, T, "ImagePullBackOff", |p| {
            pods::waiting_reason(p, "c") == "ImagePullBackOff"
        })
        .await?;
    ensure!(pods::phase(&p) == "Pending");
    agent
        .wait_pod(&agent.pod_name("fine"), T, "running", pods::all_running)
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerd_restart_under_a_running_agent() -> Result<()> {
    let mut cd = Containerd::start().await?;
    let agent = Agent::start(&cd, AgentOptions::default()).await?;
    agent.write_manifest(
        "steady.yaml",
        &pod_yaml("steady", "Always", 1, &[("c", "exec sleep 3600")]),
    )?;
    let p = agent
        .wait_pod(&agent.pod_name("steady"), T, "running", pods::all_running)
        .await?;
    let id = pods::container_id(&p, "c");
    let health = format!("http://{}/healthz", agent.status_address());

    cd.stop().await?;
    // The agent stays up and says the runtime is down.
    let deadline = Instant::now() + T;
    loop {
        let r = reqwest::get(&health).await?;
        if r.status() == 503 {
            let body = r.text().await?;
            ensure!(
                body.contains("container runtime is down"),
                "healthz body: {body}"
            );
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "agent never reported the runtime down"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A pod added during the outage starts once containerd is back.
    agent.write_manifest(
        "late.yaml",
        &pod_yaml("late", "Always", 1, &[("c", "exec sleep 3600")]),
    )?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    cd.start_again().await?;
    agent
        .wait_pod(&agent.pod_name("late"), T, "running", pods::all_running)
        .await?;
    let deadline = Instant::now() + T;
    while reqwest::get(&health).await?.status() != 200 {
        ensure!(
            Instant::now() < deadline,
            "agent never reported the runtime back"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let p = agent
        .pod(&agent.pod_name("steady"))
        .await?
        .context("steady pod")?;
    ensure!(
        pods::container_id(&p, "c") == id && pods::restarts(&p, "c") == 0,
        "steady pod untouched"
    );
    // No duplicate sandboxes.
    let cri = cd.client();
    for name in ["steady", "late"] {
        let p = agent.pod(&agent.pod_name(name)).await?.context("pod")?;
        let n = sandboxes_of(&cri, &uid(&p)).await?.len();
        ensure!(n == 1, "{name}: {n} sandboxes");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_pull_policies_through_a_real_registry() -> Result<()> {
    let registry = skiff_tests::Registry::start().await?;
    registry.push(
        "skiff/web",
        "1.0",
        &skiff_tests::images::toolbox_tag("web-1.0")?,
    );
    let cd = Containerd::builder().registry(&registry).start().await?;
    let agent = Agent::start(&cd, fast_backoff()).await?;
    let image = registry.reference("skiff/web", "1.0");
    // Always pulls even though the tag is not `latest`.
    agent.write_manifest(
        "pulled.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: pulled}}\nspec:\n  containers:\n  - {{name: c, image: '{image}', imagePullPolicy: Always, command: [sleep, '3600']}}\n"
        ),
    )?;
    // Never with an image that is not there: ErrImageNeverPull, no request.
    let absent = registry.reference("skiff/absent", "1.0");
    agent.write_manifest(
        "never.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: never}}\nspec:\n  containers:\n  - {{name: c, image: '{absent}', imagePullPolicy: Never}}\n"
        ),
    )?;
    let p = agent
        .wait_pod(&agent.pod_name("pulled"), T, "running", pods::all_running)
        .await?;
    let image_id = pods::container(&p, "c").unwrap().image_id.clone();
    // A pulled image is reported by its repo digest, as the kubelet shows it.
    ensure!(
        image_id.starts_with(&format!("{}/skiff/web@sha256:", registry.host())),
        "imageID {image_id}"
    );
    ensure!(
        registry
            .requests()
            .iter()
            .any(|r| r.contains("/v2/skiff/web/manifests/")),
        "the image came from the registry: {:?}",
        registry.requests()
    );
    agent
        .wait_pod(&agent.pod_name("never"), T, "ErrImageNeverPull", |p| {
            pods::waiting_reason(p, "c") == "ErrImageNeverPull"
        })
        .await?;
    ensure!(
        !registry
            .requests()
            .iter()
            .any(|r| r.contains("skiff/absent")),
        "Never does not pull"
    );

    // `skiff-agent pods` prints the table a kubectl user expects.
    let bin = skiff_tests::agent::workspace_binary("skiff-agent", "skiff-agent")?;
    let out = std::process::Command::new(bin)
        .args(["pods", "--address", &agent.status_address().to_string()])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success() && text.starts_with("NAMESPACE"),
        "pods output: {text}"
    );
    let row = text
        .lines()
        .find(|l| l.contains(&agent.pod_name("pulled")))
        .context("pulled row")?;
    ensure!(row.contains("1/1") && row.contains("Running"), "row: {row}");
    let row = text
        .lines()
        .find(|l| l.contains(&agent.pod_name("never")))
        .context("never row")?;
    ensure!(
        row.contains("0/1") && row.contains("ErrImageNeverPull"),
        "row: {row}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_config_reaches_the_process() -> Result<()> {
    let cd = Containerd::start().await?;
    let agent = Agent::start(&cd, AgentOptions::default()).await?;
    // The container reports what it sees through its termination message.
    let script = "echo \"uid=$(id -u) gid=$(id -g) mem=$(cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes) cpu=$(cat /sys/fs/cgroup/cpu.max 2>/dev/null || cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us) greeting=$GREETING pod=$POD_NAME args=$0,$1 cwd=$(pwd)\" > /dev/termination-log; touch /probe 2>/dev/null && echo rw >> /dev/termination-log || echo ro >> /dev/termination-log";
    let manifest = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: cfg}}\nspec:\n  restartPolicy: Never\n  containers:\n  - name: c\n    image: {TOOLBOX_IMAGE}\n    command: [sh, -c, {script:?}]\n    args: [first, $(GREETING)]\n    workingDir: /tmp\n    env:\n    - {{name: GREETING, value: hi}}\n    - name: POD_NAME\n      valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}\n    resources: {{limits: {{cpu: 250m, memory: 64Mi}}}}\n    securityContext: {{runAsUser: 1000, runAsGroup: 3000, readOnlyRootFilesystem: true}}\n"
    );
    agent.write_manifest("cfg.yaml", &manifest)?;
    let name = agent.pod_name("cfg");
    let p = agent
        .wait_pod(&name, T, "Succeeded", |p| pods::phase(p) == "Succeeded")
        .await?;
    let t = pods::container(&p, "c")
        .unwrap()
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    let msg = t.message.unwrap_or_default();
    // cgroup v2 prints "25000 100000" for cpu.max, v1 "25000" for the quota.
    let cpu = if msg.contains("cpu=25000 100000") {
        "25000 100000"
    } else {
        "25000"
    };
    let expected = format!(
        "uid=1000 gid=3000 mem=67108864 cpu={cpu} greeting=hi pod={name} args=first,hi cwd=/tmp\nro\n"
    );
    ensure!(
        msg == expected,
        "termination message {msg:?}, expected {expected:?}"
    );
    Ok(())
}

/// The README's standalone example passes no client CA: the agent runs its
/// static pods without a node server and says so once, instead of exiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_agent_without_client_ca_runs_static_pods() -> Result<()> {
    let cd = Containerd::start().await?;
    let agent = Agent::start(
        &cd,
        AgentOptions {
            no_client_ca: true,
            ..Default::default()
        },
    )
    .await?;
    agent.write_manifest(
        "solo.yaml",
        &pod_yaml("solo", "Always", 1, &[("main", "exec sleep 3600")]),
    )?;
    agent
        .wait_pod(&agent.pod_name("solo"), T, "Running", |p| {
            pods::running(p, "main")
        })
        .await?;
    let log = agent.log_tail(200);
    ensure!(
        log.matches("node server off: no client CA").count() == 1,
        "expected one line saying the node server is off; log:\n{log}"
    );
    ensure!(
        tokio::net::TcpStream::connect(("127.0.0.1", agent.node_port()))
            .await
            .is_err(),
        "the node server listens without a client CA"
    );
    Ok(())
}

/// What `scripts/down.sh` runs once the agent is gone: every sandbox the
/// agent left on the runtime is stopped and removed (with it goes its
/// network namespace), and its logs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remove_pods_leaves_no_sandbox_behind() -> Result<()> {
    let cd = Containerd::start().await?;
    let mut agent = Agent::start(&cd, AgentOptions::default()).await?;
    agent.write_manifest(
        "left.yaml",
        &pod_yaml("left", "Always", 1, &[("main", "exec sleep 3600")]),
    )?;
    let pod = agent
        .wait_pod(&agent.pod_name("left"), T, "Running", |p| {
            pods::running(p, "main")
        })
        .await?;
    agent.kill();
    let cri = cd.client();
    ensure!(!sandboxes_of(&cri, &uid(&pod)).await?.is_empty());

    let status = std::process::Command::new(skiff_tests::agent::workspace_binary(
        "skiff-agent",
        "skiff-agent",
    )?)
    .arg("remove-pods")
    .arg(format!("--container-runtime-endpoint={}", cd.endpoint()))
    .arg(format!("--pod-log-dir={}", agent.log_dir().display()))
    .status()?;
    ensure!(status.success(), "remove-pods: {status}");
    let left = sandboxes_of(&cri, &uid(&pod)).await?;
    ensure!(left.is_empty(), "sandboxes left: {left:?}");
    let logs = std::fs::read_dir(agent.log_dir())?.count();
    ensure!(logs == 0, "{logs} pod log directories left");
    Ok(())
}
