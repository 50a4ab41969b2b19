//! The agent joined to the API, pod side, on one real node: mirror pods of
//! static pods, status written back, graceful deletion finished by the
//! agent, and the kubelet's events, all seen through real kubectl.

use std::time::Duration;

use anyhow::{bail, Result};
use serde_json::Value;
use skiff_tests::cluster::{Cluster, ClusterOptions};
use skiff_tests::TOOLBOX_IMAGE;

/// Poll `f` every 200 ms until it returns `Some`, or fail after `secs`.
async fn until<T, F, Fut>(secs: u64, what: &str, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await? {
            return Ok(v);
        }
        if std::time::Instant::now() > deadline {
            bail!("timed out after {secs}s waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn pod_json(c: &Cluster, name: &str) -> Result<Option<Value>> {
    let out = c.kubectl(&["get", "pod", name, "-o", "json"]).await?;
    if !out.status.success() {
        return Ok(None);
    }
    Ok(Some(serde_json::from_slice(&out.stdout)?))
}

fn phase(p: &Value) -> &str {
    p["status"]["phase"].as_str().unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_writes_pods_back_to_the_api() -> Result<()> {
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    let node = cluster.nodes()[0].name().to_string();

    // A static pod gets a mirror pod showing its status.
    let manifest = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: web, namespace: default}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: c, image: {TOOLBOX_IMAGE}, command: [sleep, '3600']}}\n"
    );
    let manifests = cluster.nodes()[0].dir().join("manifests");
    std::fs::create_dir_all(&manifests)?;
    std::fs::write(manifests.join("web.yaml"), &manifest)?;
    let mirror = format!("web-{node}");
    let first = until(60, "the mirror pod Running", || async {
        Ok(pod_json(&cluster, &mirror)
            .await?
            .filter(|p| phase(p) == "Running"))
    })
    .await?;
    assert!(
        first["metadata"]["annotations"]["kubernetes.io/config.mirror"].is_string(),
        "{first}"
    );
    assert_eq!(first["metadata"]["ownerReferences"][0]["kind"], "Node");
    let container_id = first["status"]["containerStatuses"][0]["containerID"].clone();
    assert!(container_id.is_string(), "{first}");

    // Deleting the mirror recreates it; the static pod keeps running.
    cluster
        .kubectl_ok(&["delete", "pod", &mirror, "--wait=false"])
        .await?;
    let old_uid = first["metadata"]["uid"].clone();
    let second = until(60, "a new mirror pod with status", || async {
        Ok(pod_json(&cluster, &mirror).await?.filter(|p| {
            p["metadata"]["uid"] != old_uid
                && p["metadata"]["deletionTimestamp"].is_null()
                && phase(p) == "Running"
        }))
    })
    .await?;
    assert_eq!(
        second["status"]["containerStatuses"][0]["containerID"], container_id,
        "the static pod's container must not restart: {second}"
    );

    // Removing the manifest removes the mirror.
    std::fs::remove_file(manifests.join("web.yaml"))?;
    until(60, "the mirror pod gone", || async {
        Ok(pod_json(&cluster, &mirror).await?.is_none().then_some(()))
    })
    .await?;

    // A pod that fails: the API gets phase Failed and the exit code, and
    // the kubelet's events.
    cluster
        .apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: fails}}\nspec:\n  restartPolicy: Never\n  containers:\n  - {{name: c, image: {TOOLBOX_IMAGE}, imagePullPolicy: IfNotPresent, command: [sh, -c, 'exit 3']}}\n"
        ))
        .await?;
    let failed = until(60, "pod fails to be Failed", || async {
        Ok(pod_json(&cluster, "fails")
            .await?
            .filter(|p| phase(p) == "Failed"))
    })
    .await?;
    let term = &failed["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(term["exitCode"], 3, "{failed}");
    assert_eq!(term["reason"], "Error", "{failed}");
    let events = cluster
        .kubectl_ok(&[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=fails",
            "-o",
            "custom-columns=REASON:.reason,FROM:.source.component,MESSAGE:.message",
        ])
        .await?;
    for reason in ["Scheduled", "Pulled", "Created", "Started"] {
        assert!(events.contains(reason), "no {reason} event:\n{events}");
    }
    // The agent's status writes are recorded as the kubelet's.
    let managers = cluster
        .kubectl_ok(&[
            "get",
            "pod",
            "fails",
            "--show-managed-fields",
            "-o",
            "jsonpath={range .metadata.managedFields[*]}{.manager}/{.subresource};{end}",
        ])
        .await?;
    assert!(managers.contains("kubelet/status;"), "{managers}");

    // Graceful deletion: a container that ignores SIGTERM is killed at the
    // end of its grace period, then the agent deletes the object; a pod
    // that exits on SIGTERM goes at once.
    cluster
        .apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: stubborn}}\nspec:\n  terminationGracePeriodSeconds: 3\n  containers:\n  - {{name: c, image: {TOOLBOX_IMAGE}, imagePullPolicy: IfNotPresent, command: [sh, -c, 'trap \"\" TERM; while true; do sleep 1; done']}}\n"
        ))
        .await?;
    until(60, "stubborn Running", || async {
        Ok(pod_json(&cluster, "stubborn")
            .await?
            .filter(|p| phase(p) == "Running"))
    })
    .await?;
    let start = std::time::Instant::now();
    cluster
        .kubectl_ok(&["delete", "pod", "stubborn", "--wait=false"])
        .await?;
    let during = pod_json(&cluster, "stubborn").await?;
    assert!(
        during.is_some_and(|p| p["metadata"]["deletionTimestamp"].is_string()),
        "the pod must stay, terminating, while its container stops"
    );
    until(60, "stubborn deleted", || async {
        Ok(pod_json(&cluster, "stubborn")
            .await?
            .is_none()
            .then_some(()))
    })
    .await?;
    assert!(
        start.elapsed() >= Duration::from_secs(2),
        "deleted before the grace period ended: {:?}",
        start.elapsed()
    );
    let left: Vec<_> = cluster.nodes()[0]
        .containers()
        .await?
        .into_iter()
        .filter(|c| c.labels.get("io.kubernetes.pod.name").map(String::as_str) == Some("stubborn"))
        .collect();
    assert!(left.is_empty(), "containers left behind: {left:?}");
    cluster.finish().await
}
