//! `kubectl debug` end to end on a one-node cluster: an ephemeral
//! container added to a running pod runs in the pod's sandbox with the
//! target container's PID namespace, is reported in
//! `status.ephemeralContainerStatuses` and has its logs; `kubectl attach`
//! reaches an ephemeral container's stdin and output; a node debugging
//! pod (host namespaces, the node's root at /host) runs to completion.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use skiff_tests::agent::pods;
use skiff_tests::cluster::{wait_for, Cluster, ClusterOptions};
use skiff_tests::TOOLBOX_IMAGE;

const T: Duration = Duration::from_secs(90);

/// A pod whose one container sleeps, with a command line the debugger
/// can recognise among the processes it sees.
fn sleeper() -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: web}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: app\n    image: {TOOLBOX_IMAGE}\n    imagePullPolicy: Never\n    command: [sleep, '3601']\n"
    )
}

/// The exit code of the pod's ephemeral container `name`, once it ended.
fn ephemeral_exit(p: &Pod, name: &str) -> Option<i32> {
    p.status
        .as_ref()?
        .ephemeral_container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == name)?
        .state
        .as_ref()?
        .terminated
        .as_ref()
        .map(|t| t.exit_code)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_debug_pod_and_node() -> Result<()> {
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    let api = Api::<Pod>::namespaced(cluster.client().await?, "default");
    cluster.apply(&sleeper()).await?;
    wait_for("pod web running", T, || async {
        let p = api.get("web").await?;
        ensure!(pods::all_running(&p), "not running yet");
        Ok(())
    })
    .await?;

    // The debugger sees the target's processes: the PID namespace is
    // shared with `app` only (not the pod's, which it does not share).
    cluster
        .kubectl_ok(&[
            "debug",
            "web",
            &format!("--image={TOOLBOX_IMAGE}"),
            "--image-pull-policy=Never",
            "--target=app",
            "-c",
            "debugger",
            "--",
            "ps",
        ])
        .await?;
    let pod = wait_for("the debugger to finish", T, || async {
        let p = api.get("web").await?;
        ensure!(ephemeral_exit(&p, "debugger").is_some(), "not finished yet");
        Ok(p)
    })
    .await?;
    ensure!(
        ephemeral_exit(&pod, "debugger") == Some(0),
        "{:?}",
        pod.status
    );
    let st = &pod.status.as_ref().context("status")?;
    let d = st
        .ephemeral_container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == "debugger")
        .context("debugger status")?;
    ensure!(!d.ready && d.image == TOOLBOX_IMAGE, "{d:?}");
    ensure!(
        d.container_id
            .as_deref()
            .is_some_and(|id| id.starts_with("containerd://")),
        "{d:?}"
    );
    // The pod itself carried on, untouched.
    ensure!(
        pods::all_running(&pod) && pods::restarts(&pod, "app") == 0,
        "{st:?}"
    );
    let logs = cluster
        .kubectl_ok(&["logs", "web", "-c", "debugger"])
        .await?;
    ensure!(
        logs.contains("sleep 3601"),
        "the target's process is not visible:\n{logs}"
    );

    // An ephemeral `cat` left waiting on its stdin, then `kubectl attach`
    // to it: what kubectl reads from its stdin comes back. (The session
    // ends when kubectl's stdin does, as upstream, so kubectl's stdin is
    // held open until the answer is in.)
    cluster
        .kubectl_ok(&[
            "debug",
            "web",
            &format!("--image={TOOLBOX_IMAGE}"),
            "--image-pull-policy=Never",
            "-i",
            "--attach=false",
            "-c",
            "echo",
            "--",
            "cat",
        ])
        .await?;
    wait_for("the ephemeral cat to run", T, || async {
        let p = api.get("web").await?;
        let running = p
            .status
            .as_ref()
            .and_then(|s| s.ephemeral_container_statuses.as_ref())
            .and_then(|all| all.iter().find(|c| c.name == "echo"))
            .and_then(|c| c.state.as_ref())
            .is_some_and(|s| s.running.is_some());
        ensure!(running, "not running yet");
        Ok(())
    })
    .await?;
    let said = cluster
        .kubectl_conversation(
            &["attach", "web", "-c", "echo", "-i"],
            "attached\n",
            "attached",
        )
        .await?;
    ensure!(said.contains("attached"), "attach: {said}");

    // A node debugging pod: host namespaces and the node's / at /host.
    let node = cluster.nodes()[0].name().to_string();
    cluster
        .kubectl_ok(&[
            "debug",
            &format!("node/{node}"),
            &format!("--image={TOOLBOX_IMAGE}"),
            "--image-pull-policy=Never",
            "--",
            "sh",
            "-c",
            "head -1 /host/etc/passwd",
        ])
        .await?;
    let prefix = format!("node-debugger-{node}-");
    let name = wait_for("the node debugger to finish", T, || async {
        let list = api.list(&ListParams::default()).await?;
        let p = list
            .items
            .into_iter()
            .find(|p| {
                p.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with(&prefix))
            })
            .context("no node debugging pod yet")?;
        ensure!(
            pods::phase(&p) == "Succeeded",
            "phase {:?}",
            pods::phase(&p)
        );
        Ok(p.metadata.name.unwrap_or_default())
    })
    .await?;
    let logs = cluster.kubectl_ok(&["logs", &name]).await?;
    ensure!(
        logs.starts_with("root:"),
        "unexpected /host/etc/passwd:\n{logs}"
    );
    cluster.finish().await
}
