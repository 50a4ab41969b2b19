//! Eviction under pressure, end to end on one real node: the node's root
//! directory is a small tmpfs, so a pod filling an emptyDir meets the
//! `nodefs.available` threshold; it is evicted (Failed, reason Evicted,
//! the signal in the message), the node reports DiskPressure and recovers
//! once the pod's volume is gone. Then a BestEffort pod filling memory is
//! evicted before a Guaranteed one, which keeps running.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use skiff_tests::cluster::{wait_for, Cluster, ClusterOptions};
use skiff_tests::TOOLBOX_IMAGE;

const T: Duration = Duration::from_secs(120);
const GIB: u64 = 1 << 30;

/// A tmpfs mounted for the test, unmounted (lazily, with whatever pods
/// left mounted inside) when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(size: &str) -> Result<Tmpfs> {
        let dir = std::env::temp_dir().join(format!("skiff-evict-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        nix::mount::mount(
            Some("tmpfs"),
            &dir,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some(format!("size={size}").as_str()),
        )
        .context("mounting the test's tmpfs")?;
        Ok(Tmpfs(dir))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What the agent calls available memory: free plus inactive file pages.
fn memory_available() -> Result<u64> {
    let info = std::fs::read_to_string("/proc/meminfo")?;
    let kib = |key: &str| -> Result<u64> {
        info.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .map(|v| v * 1024)
            .with_context(|| format!("{key} not in /proc/meminfo"))
    };
    Ok(kib("MemFree:")? + kib("Inactive(file):")?)
}

fn condition(node: &Node, type_: &str) -> String {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == type_))
        .map(|c| c.status.clone())
        .unwrap_or_default()
}

async fn wait_condition(nodes: &Api<Node>, name: &str, type_: &str, status: &str) -> Result<()> {
    wait_for(&format!("{type_}={status}"), T, || async {
        let node = nodes.get(name).await?;
        let now = condition(&node, type_);
        ensure!(now == status, "{type_} is {now:?}");
        Ok(())
    })
    .await
}

async fn wait_evicted(pods: &Api<Pod>, name: &str, signal: &str) -> Result<Pod> {
    wait_for(&format!("{name} evicted"), T, || async {
        let p = pods.get(name).await?;
        let st = p.status.clone().unwrap_or_default();
        ensure!(
            st.phase.as_deref() == Some("Failed") && st.reason.as_deref() == Some("Evicted"),
            "phase {:?} reason {:?}",
            st.phase,
            st.reason
        );
        let message = st.message.unwrap_or_default();
        ensure!(
            message.starts_with(&format!("The node was low on resource: {signal}. ")),
            "message {message:?}"
        );
        Ok(p)
    })
    .await
}

async fn wait_running(pods: &Api<Pod>, name: &str) -> Result<()> {
    wait_for(&format!("{name} running"), T, || async {
        let p = pods.get(name).await?;
        let phase = p.status.and_then(|s| s.phase).unwrap_or_default();
        ensure!(phase == "Running", "phase {phase}");
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_are_evicted_under_disk_and_memory_pressure() -> Result<()> {
    let root = Tmpfs::mount("64m")?;
    // Met once the memory hog below holds its 3 GiB; other work on the
    // machine moving memory by less than the margin changes nothing.
    let available = memory_available()?;
    ensure!(
        available > 6 * GIB,
        "too little memory for the test: {available}"
    );
    let memory_threshold = (available - 3 * GIB / 2) >> 20;
    let cluster = Cluster::start(
        1,
        ClusterOptions {
            agent_args: vec![
                format!("--root-dir={}", root.0.display()),
                format!(
                    "--eviction-hard=nodefs.available<40%,memory.available<{memory_threshold}Mi"
                ),
                "--eviction-pressure-transition-period=10s".into(),
            ],
            ..Default::default()
        },
    )
    .await?;
    let client = cluster.client().await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let nodes: Api<Node> = Api::all(client);
    let node = cluster.nodes()[0].name().to_string();

    // Disk: 40 MiB of the 64 MiB root directory.
    cluster
        .apply(&format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: filler}}
spec:
  terminationGracePeriodSeconds: 1
  volumes: [{{name: scratch, emptyDir: {{}}}}]
  containers:
  - name: c
    image: {TOOLBOX_IMAGE}
    command: [sh, -c, "dd if=/dev/zero of=/scratch/fill bs=1M count=40 && sleep 3600"]
    volumeMounts: [{{name: scratch, mountPath: /scratch}}]
"#
        ))
        .await?;
    let evicted = wait_evicted(&pods, "filler", "ephemeral-storage").await?;
    let dt = evicted
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "DisruptionTarget");
    ensure!(
        dt.as_ref().and_then(|c| c.reason.as_deref()) == Some("TerminationByKubelet"),
        "DisruptionTarget condition {dt:?}"
    );
    wait_condition(&nodes, &node, "DiskPressure", "True").await?;
    // The evicted pod's emptyDir went with it: the pressure ends.
    wait_condition(&nodes, &node, "DiskPressure", "False").await?;

    // Memory: a Guaranteed pod within its request, and a BestEffort one
    // that fills a memory-backed emptyDir once both run.
    cluster
        .apply(&format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: guaranteed}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: {TOOLBOX_IMAGE}
    command: [sleep, "3600"]
    resources:
      requests: {{cpu: 10m, memory: 64Mi}}
      limits: {{cpu: 10m, memory: 64Mi}}
---
apiVersion: v1
kind: Pod
metadata: {{name: hog}}
spec:
  terminationGracePeriodSeconds: 1
  volumes: [{{name: ram, emptyDir: {{medium: Memory}}}}]
  containers:
  - name: c
    image: {TOOLBOX_IMAGE}
    command: [sh, -c, "sleep 5; dd if=/dev/zero of=/ram/fill bs=1M count=3072; sleep 3600"]
    volumeMounts: [{{name: ram, mountPath: /ram}}]
"#
        ))
        .await?;
    wait_running(&pods, "guaranteed").await?;
    let hog = wait_evicted(&pods, "hog", "memory").await?;
    let message = hog.status.and_then(|s| s.message).unwrap_or_default();
    ensure!(
        message.contains("Container c was using")
            && message.ends_with("has larger consumption of memory. "),
        "message {message:?}"
    );
    let g = pods.get("guaranteed").await?;
    let phase = g.status.and_then(|s| s.phase).unwrap_or_default();
    if phase != "Running" {
        bail!("the Guaranteed pod was evicted too: {phase}");
    }
    wait_condition(&nodes, &node, "MemoryPressure", "False").await?;
    cluster.finish().await?;
    drop(root);
    Ok(())
}
