//! RuntimeClasses end to end: a pod naming the `crun` class gets the
//! class's overhead and scheduling from admission and runs under crun, a
//! second real OCI runtime configured as a containerd handler (crun's own
//! state lists its container, runc's does not); a pod naming no class runs
//! under runc; a class that does not exist is refused at admission, and a
//! class whose handler the runtime lacks leaves the pod without a sandbox
//! and says why.
//!
//! crun 1.8 refuses these machines' hybrid cgroup layout, so containerd
//! runs it through scripts/crun-hybrid (see `skiff_tests::containerd::CRUN`).

use std::time::Duration;

use anyhow::{anyhow, ensure, Context, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use skiff_tests::cluster::{Cluster, ClusterOptions};
use skiff_tests::containerd::CRUN;
use skiff_tests::TOOLBOX_IMAGE;

const T: Duration = Duration::from_secs(90);

fn pod(name: &str, class: Option<&str>) -> String {
    let class = class
        .map(|c| format!("  runtimeClassName: {c}\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\nspec:\n{class}  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {TOOLBOX_IMAGE}\n    command: [sleep, \"3600\"]\n"
    )
}

/// The ids of the containers an OCI runtime's state root lists.
fn runtime_list(binary: &str, root: &std::path::Path) -> Result<String> {
    let out = std::process::Command::new(binary)
        .arg("--root")
        .arg(root)
        .arg("list")
        .output()
        .with_context(|| format!("running {binary} list"))?;
    ensure!(
        out.status.success(),
        "{binary} list: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

async fn container_id(pods: &Api<Pod>, name: &str) -> Result<String> {
    let pod = pods.get(name).await?;
    let id = pod
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|c| c.into_iter().next())
        .and_then(|c| c.container_id)
        .ok_or_else(|| anyhow!("pod {name} has no container id"))?;
    Ok(id.trim_start_matches("containerd://").to_string())
}

#[tokio::test]
async fn runtime_classes_pick_the_oci_runtime() -> Result<()> {
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    cluster
        .apply(
            "apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata: {name: crun}\nhandler: crun\noverhead:\n  podFixed: {cpu: 50m, memory: 16Mi}\nscheduling:\n  nodeSelector: {kubernetes.io/os: linux}\n---\napiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata: {name: absent}\nhandler: nosuch\n",
        )
        .await?;
    cluster
        .apply(&[pod("crun", Some("crun")), pod("plain", None)].join("---\n"))
        .await?;
    for name in ["crun", "plain"] {
        cluster
            .kubectl_ok(&[
                "wait",
                "--for=condition=Ready",
                &format!("pod/{name}"),
                "--timeout=90s",
            ])
            .await
            .with_context(|| {
                format!(
                    "pod {name} did not run:\n{}",
                    cluster.nodes()[0].agent_log_tail(30)
                )
            })?;
    }
    let client = cluster.client().await?;
    let pods: Api<Pod> = Api::namespaced(client, "default");

    // Admission gave the pod the class's overhead and node selector.
    let spec = pods.get("crun").await?.spec.unwrap_or_default();
    let overhead = spec.overhead.unwrap_or_default();
    ensure!(
        overhead.get("cpu").map(|q| q.0.as_str()) == Some("50m")
            && overhead.get("memory").map(|q| q.0.as_str()) == Some("16Mi"),
        "overhead: {overhead:?}"
    );
    ensure!(
        spec.node_selector
            .unwrap_or_default()
            .get("kubernetes.io/os")
            == Some(&"linux".into()),
        "the class's node selector was not merged"
    );

    // Which runtime holds each container: crun's state, or runc's.
    let containerd = cluster.nodes()[0].containerd();
    let crun_state = runtime_list(CRUN, &containerd.crun_root().join("k8s.io"))?;
    let runc_state = runtime_list("runc", &containerd.record().runc_root.join("k8s.io"))?;
    let under_crun = container_id(&pods, "crun").await?;
    let under_runc = container_id(&pods, "plain").await?;
    ensure!(
        crun_state.contains(&under_crun) && !runc_state.contains(&under_crun),
        "the crun pod's container {under_crun} is not crun's:\ncrun: {crun_state}\nrunc: {runc_state}"
    );
    ensure!(
        runc_state.contains(&under_runc) && !crun_state.contains(&under_runc),
        "the plain pod's container {under_runc} is not runc's"
    );

    // A class that does not exist: refused with upstream's message.
    let out = cluster
        .kubectl_stdin(&["apply", "-f", "-"], Some(&pod("missing", Some("nope"))))
        .await?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success()
            && stderr.contains(
                "pods \"missing\" is forbidden: pod rejected: RuntimeClass \"nope\" not found"
            ),
        "missing class: {stderr}"
    );

    // A handler the runtime lacks: no sandbox, and the runtime's reason.
    cluster.apply(&pod("unhandled", Some("absent"))).await?;
    let message = cluster
        .wait_event("default", "unhandled", "FailedCreatePodSandBox", T)
        .await?;
    ensure!(
        message.starts_with("Failed to create pod sandbox: ") && message.contains("nosuch"),
        "{message}"
    );
    let phase = pods.get("unhandled").await?.status.and_then(|s| s.phase);
    ensure!(phase.as_deref() == Some("Pending"), "phase {phase:?}");

    cluster.finish().await
}
