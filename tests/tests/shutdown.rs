//! Graceful node shutdown with the real agent, real containerd and the
//! real API, and a fake systemd-logind on a private D-Bus bus (a real
//! dbus-daemon): the agent holds a delay lock, and on PrepareForShutdown
//! stops regular pods first and critical pods last, reports them Failed in
//! the API, then releases the lock; a cancelled shutdown re-takes it.
//!
//! Real logind is exercised in the systemd PID 1 test (tests/systemd.rs).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use cri_proto::v1;
use k8s_openapi::api::core::v1::{Node as NodeObject, Pod};
use kube::Api;
use skiff_tests::cluster::{wait_for, Cluster, ClusterOptions, NodeOptions};
use skiff_tests::logind::FakeLogind;
use skiff_tests::TOOLBOX_IMAGE;

const T: Duration = Duration::from_secs(90);

/// A pod on `node-1` that exits on SIGTERM.
fn pod(name: &str, class: Option<&str>) -> String {
    let priority = class
        .map(|c| format!("  priorityClassName: {c}\n"))
        .unwrap_or_default();
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  labels: {{app: shutdown}}
spec:
  nodeName: node-1
{priority}  terminationGracePeriodSeconds: 30
  containers:
  - name: main
    image: {TOOLBOX_IMAGE}
    imagePullPolicy: IfNotPresent
    command: [sh, -c, "trap 'exit 0' TERM; sleep 3600 & wait"]
"#
    )
}

fn static_pod(name: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: default
spec:
  containers:
  - name: main
    image: {TOOLBOX_IMAGE}
    imagePullPolicy: IfNotPresent
    command: [sh, -c, "trap 'exit 0' TERM; sleep 3600 & wait"]
"#
    )
}

/// Pod name -> (its container's finish time in ns, CRI state).
async fn containers(cluster: &Cluster) -> Result<BTreeMap<String, (i64, i32)>> {
    let node = &cluster.nodes()[0];
    let cri = node.containerd().client();
    let mut out = BTreeMap::new();
    for c in node.containers().await? {
        let pod = c
            .labels
            .get("io.kubernetes.pod.name")
            .cloned()
            .unwrap_or_default();
        let st = cri
            .container_status(v1::ContainerStatusRequest {
                container_id: c.id.clone(),
                verbose: false,
            })
            .await?
            .status
            .context("no container status")?;
        out.insert(pod, (st.finished_at, c.state));
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_shutdown_stops_regular_pods_then_critical_ones_and_reports_them() -> Result<()> {
    let mut cluster = Cluster::start(0, ClusterOptions::default()).await?;
    let logind = FakeLogind::start(&cluster.dir().join("bus")).await?;
    // The agent finds the bus the way every D-Bus client does. This test
    // binary runs only this test, so the variable reaches no other agent.
    #[allow(clippy::disallowed_methods)]
    std::env::set_var("DBUS_SYSTEM_BUS_ADDRESS", logind.address());
    let node = cluster
        .add_node(NodeOptions {
            extra_args: vec![
                "--shutdown-grace-period=20s".into(),
                "--shutdown-grace-period-critical-pods=8s".into(),
            ],
            ..NodeOptions::default()
        })
        .await?;
    std::fs::write(
        node.static_pod_dir().join("static.yaml"),
        static_pod("static"),
    )?;
    wait_for("the agent's inhibitor lock", T, || async {
        let locks = logind.locks();
        let l = locks.first().context("no Inhibit call yet")?;
        ensure!(
            l.what == "shutdown" && l.mode == "delay" && l.who == "skiff-agent",
            "lock {l:?}"
        );
        Ok(())
    })
    .await?;

    for (name, class) in [
        ("regular-a", None),
        ("regular-b", None),
        ("critical", Some("system-cluster-critical")),
    ] {
        cluster.apply(&pod(name, class)).await?;
    }
    let client = cluster.client().await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let names = ["regular-a", "regular-b", "critical", "static-node-1"];
    wait_for("every pod running", T, || async {
        for n in names {
            let p = pods.get(n).await?;
            let phase = p.status.and_then(|s| s.phase).unwrap_or_default();
            ensure!(phase == "Running", "{n} is {phase}");
        }
        Ok(())
    })
    .await?;

    logind.prepare_for_shutdown(true).await?;
    wait_for("the agent to release its lock", T, || async {
        ensure!(
            logind.locks()[0]
                .released
                .load(std::sync::atomic::Ordering::SeqCst),
            "still held"
        );
        Ok(())
    })
    .await?;

    // Reported before the lock went: every pod Failed, as upstream words it.
    for n in names {
        let p = pods.get(n).await?;
        let st = p.status.context("no status")?;
        ensure!(
            st.phase.as_deref() == Some("Failed"),
            "{n}: phase {:?}",
            st.phase
        );
        ensure!(
            st.reason.as_deref() == Some("Terminated"),
            "{n}: reason {:?}",
            st.reason
        );
        ensure!(
            st.message
                .as_deref()
                .is_some_and(|m| m.contains("imminent node shutdown")),
            "{n}: message {:?}",
            st.message
        );
        let dt = st
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "DisruptionTarget" && c.status == "True");
        ensure!(dt, "{n}: no DisruptionTarget condition");
    }
    // Regular pods stopped before critical ones (static pods are critical).
    let c = containers(&cluster).await?;
    let running = v1::ContainerState::ContainerRunning as i32;
    ensure!(
        c.values().all(|(_, s)| *s != running),
        "containers still run: {c:?}"
    );
    let last_regular = c["regular-a"].0.max(c["regular-b"].0);
    let first_critical = c["critical"].0.min(c["static-node-1"].0);
    ensure!(
        last_regular <= first_critical,
        "a critical pod stopped before a regular one: {c:?}"
    );
    wait_for("the node reported shutting down", T, || async {
        let n = Api::<NodeObject>::all(client.clone()).get("node-1").await?;
        let ready = n
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .context("no Ready condition")?;
        ensure!(
            ready.status == "False"
                && ready
                    .message
                    .as_deref()
                    .is_some_and(|m| m.contains("node is shutting down")),
            "Ready: {ready:?}"
        );
        Ok(())
    })
    .await?;

    // A cancelled shutdown: the lock is taken again; stopped pods stay so.
    logind.prepare_for_shutdown(false).await?;
    wait_for("the lock taken again", T, || async {
        ensure!(
            logind.locks().len() >= 2,
            "{} Inhibit calls",
            logind.locks().len()
        );
        Ok(())
    })
    .await?;
    let again = containers(&cluster).await?;
    ensure!(
        again.values().all(|(_, s)| *s != running),
        "a stopped pod started again: {again:?}"
    );
    drop(logind);
    cluster.finish().await
}
