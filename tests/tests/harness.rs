//! The harness proves itself: a private containerd runs a real pod through
//! CRI, pulls through the loopback registry, and leaves nothing behind.
//! Needs root, containerd 1.6+, runc and containernetworking-plugins.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use cri_proto::{v1, CriClient};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use skiff_tests::cleanup::{self, netns_from_verbose_info, processes_mentioning, RunRecord};
use skiff_tests::{images, Containerd, Registry, PAUSE_IMAGE, TOOLBOX_IMAGE};
use tokio::io::{AsyncBufReadExt, BufReader};

fn image_spec(name: &str) -> Option<v1::ImageSpec> {
    Some(v1::ImageSpec {
        image: name.to_string(),
        ..Default::default()
    })
}

async fn image_status(client: &CriClient, name: &str) -> Result<Option<v1::Image>> {
    let req = v1::ImageStatusRequest {
        image: image_spec(name),
        verbose: false,
    };
    Ok(client.image_status(req).await?.image)
}

fn sandbox_config(containerd: &Containerd, name: &str) -> v1::PodSandboxConfig {
    v1::PodSandboxConfig {
        metadata: Some(v1::PodSandboxMetadata {
            name: name.to_string(),
            uid: format!("uid-{}-{name}", containerd.id()),
            namespace: "harness".to_string(),
            attempt: 0,
        }),
        hostname: name.to_string(),
        port_mappings: vec![v1::PortMapping {
            protocol: v1::Protocol::Tcp as i32,
            container_port: 8080,
            host_port: i32::from(free_port()),
            host_ip: "127.0.0.1".to_string(),
        }],
        log_directory: containerd
            .dir()
            .join("pods")
            .join(name)
            .display()
            .to_string(),
        linux: Some(v1::LinuxPodSandboxConfig {
            security_context: Some(v1::LinuxSandboxSecurityContext {
                namespace_options: Some(v1::NamespaceOption {
                    network: v1::NamespaceMode::Pod as i32,
                    pid: v1::NamespaceMode::Container as i32,
                    ipc: v1::NamespaceMode::Pod as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
    listener.local_addr().expect("local address").port()
}

fn in_subnet(ip: &str, containerd: &Containerd) -> bool {
    let gw = containerd.gateway().octets();
    ip.parse::<Ipv4Addr>()
        .is_ok_and(|a| a.octets()[..3] == gw[..3] && a != containerd.gateway())
}

async fn wait_for<F, Fut>(what: &str, mut check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if check().await? {
            return Ok(());
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A pod that was started through CRI.
struct Pod {
    container: String,
    ip: String,
    netns: Vec<PathBuf>,
}

async fn container_running(client: CriClient, id: String) -> Result<bool> {
    let status = client
        .container_status(v1::ContainerStatusRequest {
            container_id: id,
            verbose: false,
        })
        .await?;
    Ok(status
        .status
        .is_some_and(|s| s.state == v1::ContainerState::ContainerRunning as i32))
}

/// One sandbox (with a host port, so portmap programs NAT rules) and one
/// toolbox container running `echo hi; sleep 3600`, straight through CRI.
async fn run_pod(containerd: &Containerd, name: &str) -> Result<Pod> {
    let client = containerd.client();
    let config = sandbox_config(containerd, name);
    let sandbox = client
        .run_pod_sandbox(v1::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        })
        .await
        .with_context(|| {
            format!(
                "RunPodSandbox; containerd log:\n{}",
                containerd.log_tail(30)
            )
        })?
        .pod_sandbox_id;
    let status = client
        .pod_sandbox_status(v1::PodSandboxStatusRequest {
            pod_sandbox_id: sandbox.clone(),
            verbose: true,
        })
        .await?;
    let ip = status
        .status
        .as_ref()
        .and_then(|s| s.network.as_ref())
        .map(|n| n.ip.clone())
        .unwrap_or_default();
    ensure!(
        in_subnet(&ip, containerd),
        "sandbox ip {ip:?} not in {}",
        containerd.subnet()
    );
    let netns: Vec<PathBuf> = status
        .info
        .get("info")
        .and_then(|i| netns_from_verbose_info(i))
        .into_iter()
        .collect();
    ensure!(
        netns.len() == 1 && netns[0].exists(),
        "sandbox netns not found: {netns:?}"
    );
    ensure!(
        cleanup::link_exists(containerd.bridge()),
        "bridge {} was not created",
        containerd.bridge()
    );

    let container = client
        .create_container(v1::CreateContainerRequest {
            pod_sandbox_id: sandbox.clone(),
            config: Some(v1::ContainerConfig {
                metadata: Some(v1::ContainerMetadata {
                    name: "toolbox".into(),
                    attempt: 0,
                }),
                image: image_spec(TOOLBOX_IMAGE),
                command: vec!["sh".into(), "-c".into(), "echo hi; sleep 3600".into()],
                log_path: "toolbox.log".into(),
                ..Default::default()
            }),
            sandbox_config: Some(config),
        })
        .await?
        .container_id;
    client
        .start_container(v1::StartContainerRequest {
            container_id: container.clone(),
        })
        .await?;
    wait_for("container running", || {
        container_running(client.clone(), container.clone())
    })
    .await?;
    let log = containerd.dir().join("pods").join(name).join("toolbox.log");
    wait_for("container output", || {
        let log = log.clone();
        async move {
            Ok(std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains(" stdout F hi"))
        }
    })
    .await?;

    // portmap programmed the host port (cleanup must remove it again).
    let rules = String::from_utf8(
        Command::new("iptables-save")
            .args(["-t", "nat"])
            .output()?
            .stdout,
    )?;
    ensure!(
        rules.contains(&format!("{ip}:8080")),
        "no portmap DNAT rule to {ip}:8080 in:\n{rules}"
    );
    Ok(Pod {
        container,
        ip,
        netns,
    })
}

/// Polls [`cleanup::leftovers`] until it is empty (a concurrent sweep of
/// another test may be finishing the job) and fails with the list if not.
async fn assert_nothing_left(record: &RunRecord, netns: &[PathBuf]) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let left = cleanup::leftovers(record, netns);
        if left.is_empty() {
            return Ok(());
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "run {} left behind: {left:#?}",
            record.id
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixture_runs_a_pod_survives_restart_and_leaves_nothing_behind() -> Result<()> {
    let mut containerd = Containerd::start().await?;
    let client = containerd.client();

    // Both side-loaded images are visible through CRI under their names.
    for name in [PAUSE_IMAGE, TOOLBOX_IMAGE] {
        let image = image_status(&client, name)
            .await?
            .with_context(|| format!("{name} not visible via CRI"))?;
        ensure!(
            image.repo_tags.iter().any(|t| t == name),
            "{name} not among tags {:?}",
            image.repo_tags
        );
    }
    let listed = client
        .list_images(v1::ListImagesRequest::default())
        .await?
        .images;
    for name in [PAUSE_IMAGE, TOOLBOX_IMAGE] {
        ensure!(
            listed.iter().any(|i| i.repo_tags.iter().any(|t| t == name)),
            "ListImages lacks {name}"
        );
    }

    let pod = run_pod(&containerd, "harness").await?;
    println!(
        "pod ip {} in {} on {}",
        pod.ip,
        containerd.subnet(),
        containerd.bridge()
    );

    // Restarting containerd keeps the container running.
    let shims = processes_mentioning(&containerd.socket().display().to_string());
    ensure!(
        !shims.is_empty(),
        "no shim process found for {}",
        containerd.socket().display()
    );
    containerd.restart().await?;
    let client = containerd.client();
    wait_for("container running after restart", || {
        container_running(client.clone(), pod.container.clone())
    })
    .await?;

    // Drop tears everything down.
    let record = containerd.record().clone();
    drop(containerd);
    let left = cleanup::leftovers(&record, &pod.netns);
    ensure!(left.is_empty(), "left behind: {left:#?}");
    let shims_alive: Vec<_> = shims.iter().filter(|p| cleanup::is_alive(**p)).collect();
    ensure!(
        shims_alive.is_empty(),
        "shims still running: {shims_alive:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_cleans_up_when_a_test_panics() -> Result<()> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let containerd = Containerd::start().await.expect("fixture starts");
        let pod = run_pod(&containerd, "panics").await.expect("pod runs");
        let _ = tx.send((containerd.record().clone(), pod.netns));
        panic!("a failing test; unwinding drops the fixture");
    });
    let joined = task.await;
    ensure!(
        joined.as_ref().is_err_and(|e| e.is_panic()),
        "the task should have panicked"
    );
    let (record, netns) = rx
        .await
        .context("the task panicked before running its pod")?;
    let left = cleanup::leftovers(&record, &netns);
    ensure!(left.is_empty(), "left behind: {left:#?}");
    Ok(())
}

/// Env var that turns [`sigkill_victim`] on; without it that test is a no-op.
const VICTIM_ENV: &str = "SKIFF_TESTS_SIGKILL_VICTIM";

/// Helper process for [`sweeper_cleans_up_after_a_sigkilled_run`]: starts a
/// fixture with a running pod, prints what it made, then waits to be killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "helper process of sweeper_cleans_up_after_a_sigkilled_run"]
async fn sigkill_victim() -> Result<()> {
    if std::env::var_os(VICTIM_ENV).is_none() {
        return Ok(());
    }
    let containerd = Containerd::start().await?;
    let pod = run_pod(&containerd, "victim").await?;
    let report = serde_json::json!({
        "record": containerd.record(),
        "containerd_pid": containerd.pid(),
        "netns": pod.netns,
    });
    println!("VICTIM {report}");
    // Bounded: the parent kills us long before.
    tokio::time::sleep(Duration::from_secs(120)).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweeper_cleans_up_after_a_sigkilled_run() -> Result<()> {
    let mut victim = tokio::process::Command::new(std::env::current_exe()?)
        .args([
            "sigkill_victim",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(VICTIM_ENV, "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()?;
    let mut lines = BufReader::new(victim.stdout.take().context("victim stdout")?).lines();
    let report = tokio::time::timeout(Duration::from_secs(45), async {
        while let Some(line) = lines.next_line().await? {
            // libtest prints "test sigkill_victim ... " before it, unterminated.
            if let Some((_, json)) = line.split_once("VICTIM ") {
                return Ok(serde_json::from_str::<serde_json::Value>(json)?);
            }
        }
        anyhow::bail!("victim exited without a report")
    })
    .await
    .context("victim did not report within 45 s")??;
    let record: RunRecord = serde_json::from_value(report["record"].clone())?;
    let netns: Vec<PathBuf> = serde_json::from_value(report["netns"].clone())?;
    let containerd_pid = report["containerd_pid"]
        .as_i64()
        .context("containerd pid")?;

    // The worst case: the test process and its containerd both die by
    // SIGKILL, leaving shims, containers, mounts, netns, bridge and NAT rules.
    victim.kill().await?;
    let _ = kill(Pid::from_raw(containerd_pid as i32), Signal::SIGKILL);
    ensure!(
        record.dir.exists() && cleanup::link_exists(&record.bridge),
        "victim's run is not there to sweep"
    );

    let swept = tokio::task::spawn_blocking(cleanup::sweep_stale).await?;
    println!("swept {swept:?}");
    assert_nothing_left(&record, &netns).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pulls_through_the_loopback_registry() -> Result<()> {
    let registry = Registry::start().await?;
    let (one, two) = tokio::task::spawn_blocking(|| {
        Ok::<_, anyhow::Error>((images::toolbox()?, images::toolbox_tag("2.0")?))
    })
    .await??;
    registry.push("skiff/toolbox", "1.0", &one);
    registry.push("skiff/toolbox", "2.0", &two);
    let containerd = Containerd::builder()
        .registry(&registry)
        .without_default_images()
        .start()
        .await?;
    let client = containerd.client();

    // By tag.
    let reference = registry.reference("skiff/toolbox", "1.0");
    let pulled = client
        .pull_image(v1::PullImageRequest {
            image: image_spec(&reference),
            ..Default::default()
        })
        .await
        .with_context(|| {
            format!(
                "PullImage {reference}; containerd log:\n{}",
                containerd.log_tail(30)
            )
        })?;
    ensure!(
        pulled.image_ref == one.config_digest(),
        "pulled {} expected {}",
        pulled.image_ref,
        one.config_digest()
    );
    let image = image_status(&client, &reference)
        .await?
        .context("pulled image not visible")?;
    ensure!(
        image.repo_tags.contains(&reference),
        "tags {:?}",
        image.repo_tags
    );
    let by_digest = format!(
        "{}/skiff/toolbox@{}",
        registry.host(),
        one.manifest_digest()
    );
    ensure!(
        image.repo_digests.contains(&by_digest),
        "digests {:?}, expected {by_digest}",
        image.repo_digests
    );

    // By digest, a second image with its own digest.
    let reference = format!(
        "{}/skiff/toolbox@{}",
        registry.host(),
        two.manifest_digest()
    );
    let pulled = client
        .pull_image(v1::PullImageRequest {
            image: image_spec(&reference),
            ..Default::default()
        })
        .await?;
    ensure!(
        pulled.image_ref == two.config_digest(),
        "pulled {} expected {}",
        pulled.image_ref,
        two.config_digest()
    );

    let requests = registry.requests();
    ensure!(
        requests.iter().any(|r| r.contains("/manifests/1.0 -> 200")),
        "requests: {requests:#?}"
    );
    ensure!(
        requests
            .iter()
            .any(|r| r.contains("/blobs/sha256:") && r.ends_with("-> 200")),
        "requests: {requests:#?}"
    );

    // The explicit, async cleanup path.
    let record = containerd.record().clone();
    containerd.cleanup().await?;
    let left = cleanup::leftovers(&record, &[]);
    ensure!(left.is_empty(), "left behind: {left:#?}");
    registry.shutdown().await;
    Ok(())
}
