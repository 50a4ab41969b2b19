//! Persistent storage end to end, on real nodes (containerd and
//! skiff-agent) with the real kubectl: local-path claims provisioned where
//! their pod runs, data that survives pods, a SIGKILLed agent and a
//! restarted containerd, claims in use protected from deletion, Delete and
//! Retain reclaim touching nothing but their own directory, and local
//! volumes keeping their pods on their node.
//!
//! Each test has a cluster of its own. Data is checked from the host, in
//! the directories the PVs name.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::Api;
use skiff_tests::agent::pods;
use skiff_tests::cluster::{ready_status, wait_for, Cluster, ClusterOptions};
use skiff_tests::TOOLBOX_IMAGE;

/// Time for anything that involves starting or stopping pods.
const T: Duration = Duration::from_secs(90);

/// A claim of `class` (None: the default class) asking for 10Mi.
fn claim(name: &str, class: Option<&str>) -> String {
    let class = class
        .map(|c| format!("  storageClassName: {c}\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: {name}}}\nspec:\n{class}  accessModes: [ReadWriteOnce]\n  resources: {{requests: {{storage: 10Mi}}}}\n"
    )
}

/// What a writer records: its name in `/data/id` the first time, what it
/// found there on later starts in `/data/seen`, and every start in
/// `/data/starts`; and its name in `by` of every volume under /v.
const WRITER_SCRIPT: &str =
    "if [ -f /data/id ]; then cat /data/id > /data/seen; else echo $POD > /data/id; fi; \
    echo $POD >> /data/starts; for d in /v/*; do [ -d $d ] && echo $POD > $d/by; done; \
    trap 'exit 0' TERM; sleep 3600 & wait";

/// The writer's container, indented for a pod spec at `indent`.
fn writer_container(indent: &str, mounts: &str) -> String {
    let body = format!(
        r#"containers:
- name: c
  image: {TOOLBOX_IMAGE}
  imagePullPolicy: IfNotPresent
  command: [sh, -c, "{WRITER_SCRIPT}"]
  env:
  - name: POD
    valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}
  volumeMounts:
{mounts}"#
    );
    body.lines().map(|l| format!("{indent}{l}\n")).collect()
}

/// A writer pod; `volumes` is the YAML list of its volumes, the first one
/// mounted at /data and the others at /v/NAME.
fn writer(name: &str, security: &str, volumes: &[(&str, &str)]) -> String {
    let mounts: String = volumes
        .iter()
        .enumerate()
        .map(|(i, (v, _))| {
            let at = if i == 0 {
                "/data".to_string()
            } else {
                format!("/v/{v}")
            };
            format!("  - {{name: {v}, mountPath: {at}}}\n")
        })
        .collect();
    let vols: String = volumes
        .iter()
        .map(|(v, source)| format!("  - name: {v}\n    {source}\n"))
        .collect();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  securityContext: {security}\n{}  volumes:\n{vols}",
        writer_container("  ", mounts.trim_end())
    )
}

/// A StatefulSet `web` of two non-root writers, each with its own
/// local-path claim `data-web-N` (the default class) at /data.
fn writer_set() -> String {
    format!(
        r#"apiVersion: v1
kind: Service
metadata: {{name: web}}
spec:
  clusterIP: None
  selector: {{app: web}}
  ports: [{{port: 80}}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {{name: web}}
spec:
  serviceName: web
  replicas: 2
  podManagementPolicy: Parallel
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      terminationGracePeriodSeconds: 1
      securityContext: {{runAsUser: 1000, runAsGroup: 1000, fsGroup: 2000}}
{}  volumeClaimTemplates:
  - metadata: {{name: data}}
    spec:
      accessModes: [ReadWriteOnce]
      resources: {{requests: {{storage: 10Mi}}}}
"#,
        writer_container("      ", "  - {name: data, mountPath: /data}")
    )
}

async fn wait_running(cluster: &Cluster, name: &str) -> Result<Pod> {
    let pods_api = Api::<Pod>::namespaced(cluster.client().await?, "default");
    wait_for(&format!("pod {name} Running"), T, || async {
        let p = pods_api.get(name).await?;
        ensure!(
            pods::phase(&p) == "Running" && pods::all_running(&p),
            "phase {}",
            pods::phase(&p)
        );
        Ok(p)
    })
    .await
}

async fn wait_gone<K>(api: &Api<K>, name: &str) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    wait_for(&format!("{name} to be gone"), T, || async {
        ensure!(api.get_opt(name).await?.is_none(), "{name} still exists");
        Ok(())
    })
    .await
}

/// The bound PV of claim `name` and the host directory it names.
async fn volume_of(cluster: &Cluster, name: &str) -> Result<(PersistentVolume, PathBuf)> {
    let client = cluster.client().await?;
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default");
    let volumes = Api::<PersistentVolume>::all(client);
    let pv_name = wait_for(&format!("claim {name} Bound"), T, || async {
        let c = claims.get(name).await?;
        let phase = c.status.as_ref().and_then(|s| s.phase.clone());
        let pv = c.spec.as_ref().and_then(|s| s.volume_name.clone());
        match (phase.as_deref(), pv) {
            (Some("Bound"), Some(pv)) => Ok(pv),
            (phase, _) => anyhow::bail!("phase {phase:?}"),
        }
    })
    .await?;
    let pv = volumes.get(&pv_name).await?;
    let path = pv
        .spec
        .as_ref()
        .and_then(|s| {
            s.local
                .as_ref()
                .map(|l| l.path.clone())
                .or_else(|| s.host_path.as_ref().map(|h| h.path.clone()))
        })
        .context("the PV names no path")?;
    Ok((pv, PathBuf::from(path)))
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

fn pv_phase(pv: &PersistentVolume) -> String {
    pv.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

/// A StatefulSet of two with `volumeClaimTemplates`: each pod finds its
/// own data after the pods are deleted, the agent is SIGKILLed and the
/// node's containerd restarted, and never the other's; the directories are
/// distinct, under the node's root, with the pods' fsGroup. Deleting the
/// set and its claims (Delete reclaim) removes both directories and nothing
/// beside them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_keep_their_data_across_agent_kill_and_containerd_restart() -> Result<()> {
    let mut cluster = Cluster::start(1, ClusterOptions::default()).await?;
    let node = cluster.nodes()[0].name().to_string();
    let root = cluster.nodes()[0].dir().join("root").join("local-path");
    let client = cluster.client().await?;
    let pods_api = Api::<Pod>::namespaced(client.clone(), "default");
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default");
    let volumes = Api::<PersistentVolume>::all(client.clone());

    cluster.apply(&writer_set()).await?;
    let mut uids = Vec::new();
    for p in ["web-0", "web-1"] {
        uids.push(wait_running(&cluster, p).await?.metadata.uid);
    }
    let mut dirs = Vec::new();
    for (pod, claim_name) in [("web-0", "data-web-0"), ("web-1", "data-web-1")] {
        let (pv, dir) = volume_of(&cluster, claim_name).await?;
        ensure!(
            dir.parent() == Some(root.as_path()),
            "{} is not directly under the node's root {}",
            dir.display(),
            root.display()
        );
        let labels = pv.metadata.labels.clone().unwrap_or_default();
        ensure!(
            labels.get("skiff.io/local-path-node") == Some(&node),
            "PV labels {labels:?}"
        );
        wait_for(&format!("{pod}'s id on the host"), T, || async {
            let id = read(&dir.join("id"));
            ensure!(id.trim() == pod, "id {id:?}");
            Ok(())
        })
        .await?;
        let meta = std::fs::metadata(&dir)?;
        ensure!(
            meta.gid() == 2000 && meta.permissions().mode() & 0o7777 == 0o2775,
            "fsGroup directory: gid {} mode {:o}",
            meta.gid(),
            meta.permissions().mode() & 0o7777
        );
        dirs.push(dir);
    }
    ensure!(dirs[0] != dirs[1], "two claims share {}", dirs[0].display());

    // The pods go (the set makes new ones), the agent dies hard, containerd
    // restarts.
    cluster
        .kubectl_ok(&["delete", "pod", "web-0", "web-1", "--wait=false"])
        .await?;
    {
        let n = cluster.node_mut(&node).context("node")?;
        n.kill_agent();
        n.containerd_mut().restart().await?;
        n.start_agent()?;
    }
    cluster.wait_node_ready(&node, T).await?;
    for (p, old) in ["web-0", "web-1"].iter().zip(&uids) {
        wait_for(&format!("a new {p} Running"), T, || async {
            let pod = pods_api.get(p).await?;
            ensure!(pod.metadata.uid != *old, "still the first {p}");
            ensure!(pods::all_running(&pod), "phase {}", pods::phase(&pod));
            Ok(())
        })
        .await?;
    }
    for (pod, dir) in ["web-0", "web-1"].iter().zip(&dirs) {
        wait_for(&format!("{pod}'s second start"), T, || async {
            let seen = read(&dir.join("seen"));
            let starts = read(&dir.join("starts"));
            let lines: Vec<&str> = starts.lines().collect();
            ensure!(
                seen.trim() == *pod && lines.len() >= 2 && lines.iter().all(|l| l == pod),
                "seen {seen:?}, starts {starts:?}"
            );
            Ok(())
        })
        .await?;
    }

    // Delete reclaim: the claims go once the set's pods are gone, then the
    // PVs and the directories, and nothing else under the root.
    let sentinel = root.join("sentinel");
    std::fs::write(&sentinel, "keep")?;
    let pv_names: Vec<String> = dirs
        .iter()
        .map(|d| {
            d.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    cluster
        .kubectl_ok(&["delete", "statefulset", "web", "--wait=false"])
        .await?;
    cluster
        .kubectl_ok(&["delete", "pvc", "data-web-0", "data-web-1", "--wait=false"])
        .await?;
    for c in ["data-web-0", "data-web-1"] {
        wait_gone(&claims, c).await?;
    }
    wait_for("both directories removed", T, || async {
        let left: Vec<&PathBuf> = dirs.iter().filter(|d| d.exists()).collect();
        ensure!(left.is_empty(), "still there: {left:?} ({pv_names:?})");
        Ok(())
    })
    .await?;
    wait_for("both PVs gone", T, || async {
        let left = volumes.list(&Default::default()).await?.items.len();
        ensure!(left == 0, "{left} PVs left");
        Ok(())
    })
    .await?;
    ensure!(
        read(&sentinel) == "keep",
        "the sentinel next to them was touched"
    );
    cluster.finish().await
}

/// A claim in use waits for its pod before it goes; Retain keeps the data
/// (also after the PV is deleted), Delete removes it; an ephemeral volume's
/// claim lives and dies with its pod; a 253-character claim name maps to a
/// safe directory name and a `../` one is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protection_reclaim_policies_and_names() -> Result<()> {
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    let root = cluster.nodes()[0].dir().join("root").join("local-path");
    let client = cluster.client().await?;
    let pods_api = Api::<Pod>::namespaced(client.clone(), "default");
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default");
    let volumes = Api::<PersistentVolume>::all(client.clone());

    // The longest name a claim may have: 253 characters, in DNS labels of
    // at most 63.
    let long = format!(
        "{}.{}.{}.{}",
        "a".repeat(63),
        "b".repeat(63),
        "c".repeat(63),
        "d".repeat(61)
    );
    ensure!(long.len() == 253);
    let keep_class = "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: keep}\nprovisioner: skiff.io/local-path\nreclaimPolicy: Retain\nvolumeBindingMode: WaitForFirstConsumer\n";
    let ephemeral = "ephemeral: {volumeClaimTemplate: {spec: {accessModes: [ReadWriteOnce], storageClassName: local-path, resources: {requests: {storage: 5Mi}}}}}";
    let user = writer(
        "user",
        "{}",
        &[
            ("a", "persistentVolumeClaim: {claimName: a}"),
            ("b", "persistentVolumeClaim: {claimName: b}"),
            (
                "long",
                &format!("persistentVolumeClaim: {{claimName: {long}}}"),
            ),
            ("scratch", ephemeral),
        ],
    );
    cluster
        .apply(&format!(
            "{keep_class}---\n{}---\n{}---\n{}---\n{user}",
            claim("a", Some("local-path")),
            claim("b", Some("keep")),
            claim(&long, None),
        ))
        .await?;
    wait_running(&cluster, "user").await?;
    let (_, dir_a) = volume_of(&cluster, "a").await?;
    let (pv_b, dir_b) = volume_of(&cluster, "b").await?;
    let (_, dir_long) = volume_of(&cluster, &long).await?;
    let (_, dir_scratch) = volume_of(&cluster, "user-scratch").await?;
    let all = [&dir_a, &dir_b, &dir_long, &dir_scratch];
    for d in all {
        ensure!(
            d.parent() == Some(root.as_path()),
            "{} outside {}",
            d.display(),
            root.display()
        );
    }
    let mut unique: Vec<&PathBuf> = all.to_vec();
    unique.sort();
    unique.dedup();
    ensure!(unique.len() == 4, "claims share directories: {all:?}");
    let long_dir = dir_long.file_name().context("name")?.len();
    ensure!(long_dir <= 255, "a {long_dir}-byte directory name");
    wait_for("the pod's writes", T, || async {
        ensure!(
            read(&dir_b.join("by")).trim() == "user",
            "b not written yet"
        );
        Ok(())
    })
    .await?;
    let sentinel = root.join("sentinel");
    std::fs::write(&sentinel, "keep")?;

    // Protection: the claim in use stays (Terminating) while its pod runs.
    cluster
        .kubectl_ok(&["delete", "pvc", "a", "--wait=false"])
        .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let a = claims.get("a").await?;
    ensure!(
        a.metadata.deletion_timestamp.is_some()
            && a.metadata
                .finalizers
                .iter()
                .flatten()
                .any(|f| f == "kubernetes.io/pvc-protection"),
        "claim a: {:?}",
        a.metadata
    );
    let shown = cluster.kubectl_ok(&["get", "pvc", "a"]).await?;
    ensure!(shown.contains("Terminating"), "kubectl get pvc a: {shown}");
    ensure!(dir_a.exists(), "the directory of a claim in use went");

    // The pod goes: the claim, its PV and its directory follow; the
    // ephemeral claim is collected with its pod.
    pods_api.delete("user", &Default::default()).await?;
    wait_gone(&claims, "a").await?;
    wait_gone(&claims, "user-scratch").await?;
    wait_for("a's and scratch's directories removed", T, || async {
        ensure!(
            !dir_a.exists() && !dir_scratch.exists(),
            "a {} scratch {}",
            dir_a.exists(),
            dir_scratch.exists()
        );
        Ok(())
    })
    .await?;

    // Retain: the claim goes, the PV stays Released with the data, and
    // even deleting the PV keeps the directory.
    cluster
        .kubectl_ok(&["delete", "pvc", "b", "--wait=false"])
        .await?;
    wait_gone(&claims, "b").await?;
    let b_name = pv_b.metadata.name.clone().context("pv name")?;
    wait_for("b's PV Released", T, || async {
        let pv = volumes.get(&b_name).await?;
        ensure!(pv_phase(&pv) == "Released", "phase {}", pv_phase(&pv));
        Ok(())
    })
    .await?;
    ensure!(
        read(&dir_b.join("by")).trim() == "user",
        "Retain lost the data"
    );
    cluster
        .kubectl_ok(&["delete", "pv", &b_name, "--wait=false"])
        .await?;
    wait_gone(&volumes, &b_name).await?;
    ensure!(
        read(&dir_b.join("by")).trim() == "user",
        "deleting a Retain PV removed its data"
    );
    ensure!(read(&sentinel) == "keep", "the sentinel was touched");
    ensure!(dir_long.exists(), "an unrelated claim's directory went");

    // A name that tries to leave the root never becomes an object.
    let refused = cluster
        .kubectl_stdin(&["apply", "-f", "-"], Some(&claim("../x", None)))
        .await?;
    ensure!(
        !refused.status.success(),
        "a claim named ../x was accepted: {}",
        String::from_utf8_lossy(&refused.stdout)
    );
    cluster.finish().await
}

/// A pod whose claim is bound to a local PV on node-2 runs there; with
/// node-2 lost, its replacement stays Pending with upstream's reason
/// instead of starting on node-1 without its data, and runs on node-2
/// again once it is back. A fresh local-path claim is provisioned on the
/// node its pod was scheduled to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_volumes_keep_their_pods_on_their_node() -> Result<()> {
    let options = ClusterOptions {
        node_monitor_grace_period: Duration::from_secs(8),
        ..Default::default()
    };
    let mut cluster = Cluster::start(2, options).await?;
    let client = cluster.client().await?;
    let pods_api = Api::<Pod>::namespaced(client.clone(), "default");
    let pinned_dir = cluster.nodes()[1].dir().join("static-volume");
    std::fs::create_dir_all(&pinned_dir)?;
    let node2 = cluster.nodes()[1].name().to_string();
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone());
    let hostname = nodes
        .get(&node2)
        .await?
        .metadata
        .labels
        .unwrap_or_default()
        .get("kubernetes.io/hostname")
        .cloned()
        .unwrap_or_else(|| node2.clone());

    let manual = format!(
        r#"apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {{name: manual}}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
---
apiVersion: v1
kind: PersistentVolume
metadata: {{name: pinned}}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteOnce]
  storageClassName: manual
  local: {{path: {}}}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions:
        - {{key: kubernetes.io/hostname, operator: In, values: [{hostname}]}}
"#,
        pinned_dir.display()
    );
    let pinned = writer(
        "pinned",
        "{}",
        &[("data", "persistentVolumeClaim: {claimName: pinned}")],
    );
    let free = writer(
        "free",
        "{}",
        &[("data", "persistentVolumeClaim: {claimName: free}")],
    );
    cluster
        .apply(&format!(
            "{manual}---\n{}---\n{}---\n{pinned}---\n{free}",
            claim("pinned", Some("manual")),
            claim("free", None)
        ))
        .await?;
    let p = wait_running(&cluster, "pinned").await?;
    let on = p.spec.as_ref().and_then(|s| s.node_name.clone());
    ensure!(
        on.as_deref() == Some(node2.as_str()),
        "pinned ran on {on:?}"
    );
    let (pv, dir) = volume_of(&cluster, "pinned").await?;
    ensure!(pv.metadata.name.as_deref() == Some("pinned") && dir == pinned_dir);
    wait_for("pinned's data on node-2's disk", T, || async {
        ensure!(read(&pinned_dir.join("id")).trim() == "pinned");
        Ok(())
    })
    .await?;

    // The fresh claim was provisioned where its pod went.
    let f = wait_running(&cluster, "free").await?;
    let free_node = f
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    let (free_pv, free_dir) = volume_of(&cluster, "free").await?;
    let owner = free_pv
        .metadata
        .labels
        .unwrap_or_default()
        .get("skiff.io/local-path-node")
        .cloned();
    ensure!(
        owner.as_deref() == Some(free_node.as_str())
            && free_dir.starts_with(cluster.node(&free_node).context("node")?.dir()),
        "free ran on {free_node}, its volume is {owner:?} at {}",
        free_dir.display()
    );

    // node-2 is lost: the pinned pod's replacement waits for it.
    cluster.node_mut(&node2).context("node-2")?.kill_agent();
    wait_for("node-2 to be NotReady", T, || async {
        let n = nodes.get(&node2).await?;
        ensure!(ready_status(&n) != "True", "still Ready");
        Ok(())
    })
    .await?;
    cluster
        .kubectl_ok(&["delete", "pod", "pinned", "--grace-period=0", "--force"])
        .await?;
    wait_for("the old pinned pod gone", T, || async {
        ensure!(pods_api.get_opt("pinned").await?.is_none());
        Ok(())
    })
    .await?;
    cluster.apply(&pinned).await?;
    let message = wait_for("FailedScheduling of the new pinned pod", T, || async {
        let out = cluster
            .kubectl_ok(&[
                "get",
                "events",
                "--field-selector",
                "involvedObject.name=pinned,reason=FailedScheduling",
                "-o",
                "jsonpath={.items[*].message}",
            ])
            .await?;
        ensure!(out.contains("volume node affinity conflict"), "{out:?}");
        Ok(out)
    })
    .await?;
    ensure!(message.contains("0/2 nodes are available"), "{message}");
    let p = pods_api.get("pinned").await?;
    ensure!(
        pods::phase(&p) == "Pending"
            && p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none(),
        "the pinned pod left Pending: {:?}",
        p.status
    );

    // node-2 returns, and so does the pod, with its data.
    cluster.node_mut(&node2).context("node-2")?.start_agent()?;
    cluster.wait_node_ready(&node2, T).await?;
    let p = wait_running(&cluster, "pinned").await?;
    ensure!(p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node2.as_str()));
    wait_for("pinned found its data", T, || async {
        ensure!(read(&pinned_dir.join("seen")).trim() == "pinned");
        Ok(())
    })
    .await?;
    cluster.finish().await
}
