//! The workload kinds end to end, on real nodes (containerd and skiff-agent)
//! with the real kubectl: a StatefulSet's ordered start, stable names,
//! claims and per-pod DNS names, its partitioned rollout, undo and ordered
//! scale-down; a CronJob's runs; an Indexed Job's pods with their index
//! and hostname; a pod failure policy that ignores one exit code and fails
//! the Job on another; `kubectl drain` held back by a
//! PodDisruptionBudget.
//!
//! Each test has a cluster of its own; pods run the toolbox image.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::ListParams;
use kube::runtime::watcher::{self, Event};
use kube::Api;
use skiff_tests::bench::ready;
use skiff_tests::cluster::{wait_for, Cluster, ClusterOptions};
use skiff_tests::TOOLBOX_IMAGE;
use tokio::task::JoinHandle;

/// Time for anything that involves starting or stopping pods.
const T: Duration = Duration::from_secs(120);

fn statefulset(replicas: u32) -> String {
    format!(
        r#"apiVersion: v1
kind: Service
metadata: {{name: web}}
spec:
  clusterIP: None
  publishNotReadyAddresses: true
  selector: {{app: web}}
  ports: [{{port: 80}}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {{name: web}}
spec:
  serviceName: web
  replicas: {replicas}
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: c
        image: {TOOLBOX_IMAGE}
        imagePullPolicy: IfNotPresent
        command: [sh, -c, "[ -f /data/id ] || hostname > /data/id; trap 'exit 0' TERM; sleep 3600 & wait"]
        volumeMounts: [{{name: data, mountPath: /data}}]
  volumeClaimTemplates:
  - metadata: {{name: data}}
    spec:
      accessModes: [ReadWriteOnce]
      resources: {{requests: {{storage: 10Mi}}}}
"#
    )
}

/// What a watch of pods `app=web` saw, in order: (event, pod, ready).
type Seen = Vec<(&'static str, String, bool)>;

/// Records every change of the `app=web` pods until aborted.
fn record(pods: Api<Pod>, seen: std::sync::Arc<std::sync::Mutex<Seen>>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let cfg = watcher::Config::default().labels("app=web");
        let mut events = watcher::watcher(pods, cfg).boxed();
        while let Ok(Some(ev)) = events.try_next().await {
            let (kind, p) = match ev {
                Event::Apply(p) | Event::InitApply(p) => ("apply", p),
                Event::Delete(p) => ("delete", p),
                _ => continue,
            };
            let name = p.metadata.name.clone().unwrap_or_default();
            if let Ok(mut s) = seen.lock() {
                s.push((kind, name, ready(&p)));
            }
        }
    })
}

/// The pods of `seen` in the order they first appeared.
fn first_seen(seen: &Seen) -> Vec<String> {
    let mut order = Vec::new();
    for (_, name, _) in seen {
        if !order.contains(name) {
            order.push(name.clone());
        }
    }
    order
}

/// Runs `script` in `pod`'s container.
async fn sh(cluster: &Cluster, pod: &str, script: &str) -> Result<String> {
    cluster
        .kubectl_ok(&["exec", pod, "--", "sh", "-c", script])
        .await
}

fn revision_of(p: &Pod) -> String {
    p.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("controller-revision-hash").cloned())
        .unwrap_or_default()
}

/// A StatefulSet of 3 behind a headless Service: started in order, each
/// after the previous one is Ready; stable hostnames, DNS names and claims;
/// a deleted pod comes back with its name and its data; a partitioned
/// rolling update touches only the ordinals at or above the partition,
/// `rollout undo` takes them back; scaling down removes the highest
/// ordinals first and keeps their claims.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statefulset_keeps_order_identity_and_claims() -> Result<()> {
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    let client = cluster.client().await?;
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    let sets = Api::<StatefulSet>::namespaced(client.clone(), "default");
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default");
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Seen::new()));
    let recorder = record(pods.clone(), seen.clone());

    cluster.apply(&statefulset(3)).await?;
    cluster
        .kubectl_ok(&["rollout", "status", "sts/web", "--timeout=120s"])
        .await?;
    let log = seen.lock().map(|s| s.clone()).unwrap_or_default();
    ensure!(
        first_seen(&log) == ["web-0", "web-1", "web-2"],
        "creation order: {log:?}"
    );
    // OrderedReady: web-N appears only after web-(N-1) was seen Ready.
    for (n, prev) in [("web-1", "web-0"), ("web-2", "web-1")] {
        let born = log.iter().position(|(_, p, _)| p == n).context("born")?;
        ensure!(
            log[..born].iter().any(|(_, p, r)| p == prev && *r),
            "{n} created before {prev} was Ready: {log:?}"
        );
    }

    // Identity: hostname, labels, DNS name, one claim each.
    let p1 = pods.get("web-1").await?;
    let labels = p1.metadata.labels.clone().unwrap_or_default();
    ensure!(
        labels
            .get("statefulset.kubernetes.io/pod-name")
            .map(String::as_str)
            == Some("web-1")
            && labels
                .get("apps.kubernetes.io/pod-index")
                .map(String::as_str)
                == Some("1"),
        "labels {labels:?}"
    );
    ensure!(sh(&cluster, "web-1", "hostname").await?.trim() == "web-1");
    let ip0 = pods
        .get("web-0")
        .await?
        .status
        .and_then(|s| s.pod_ip)
        .context("web-0 IP")?;
    let lookup = sh(
        &cluster,
        "web-1",
        "nslookup web-0.web.default.svc.cluster.local",
    )
    .await?;
    ensure!(lookup.contains(&ip0), "web-0's DNS name: {lookup}");
    for i in 0..3 {
        let c = claims.get(&format!("data-web-{i}")).await?;
        let phase = c.status.and_then(|s| s.phase).unwrap_or_default();
        ensure!(phase == "Bound", "data-web-{i} is {phase}");
    }

    // A deleted pod comes back with its name, its claim and its data.
    let uid = p1.metadata.uid.clone();
    cluster.kubectl_ok(&["delete", "pod", "web-1"]).await?;
    wait_for("web-1 back and Ready", T, || async {
        let p = pods.get("web-1").await?;
        ensure!(p.metadata.uid != uid && ready(&p), "not yet");
        Ok(())
    })
    .await?;
    ensure!(sh(&cluster, "web-1", "cat /data/id").await?.trim() == "web-1");

    // Partitioned rolling update: only web-2 moves to the new revision.
    let before = revision_of(&pods.get("web-0").await?);
    cluster
        .kubectl_ok(&[
            "patch",
            "sts",
            "web",
            "-p",
            r#"{"spec":{"updateStrategy":{"rollingUpdate":{"partition":2}},"template":{"metadata":{"annotations":{"v":"2"}}}}}"#,
        ])
        .await?;
    let updated = wait_for("web-2 on the new revision", T, || async {
        let s = sets.get("web").await?;
        let st = s.status.context("status")?;
        let update = st.update_revision.clone().unwrap_or_default();
        let p2 = pods.get("web-2").await?;
        ensure!(
            update != before && revision_of(&p2) == update && ready(&p2),
            "status {st:?}"
        );
        ensure!(st.updated_replicas == Some(1), "updatedReplicas {st:?}");
        Ok(update)
    })
    .await?;
    for p in ["web-0", "web-1"] {
        ensure!(
            revision_of(&pods.get(p).await?) == before,
            "{p} left its revision"
        );
    }
    let history = cluster
        .kubectl_ok(&["rollout", "history", "sts/web"])
        .await?;
    ensure!(
        history.contains('1') && history.contains('2'),
        "history: {history}"
    );
    cluster.kubectl_ok(&["rollout", "undo", "sts/web"]).await?;
    wait_for("web-2 back on the first template", T, || async {
        let p2 = pods.get("web-2").await?;
        let annotations = p2.metadata.annotations.clone().unwrap_or_default();
        ensure!(
            !annotations.contains_key("v") && revision_of(&p2) != updated && ready(&p2),
            "web-2 {annotations:?} {}",
            revision_of(&p2)
        );
        Ok(())
    })
    .await?;

    // Scale down: web-2 goes before web-1; their claims stay.
    seen.lock().map(|mut s| s.clear()).ok();
    cluster
        .kubectl_ok(&["scale", "sts", "web", "--replicas=1"])
        .await?;
    wait_for("web-1 and web-2 gone", T, || async {
        let names: BTreeSet<String> = pods
            .list(&ListParams::default().labels("app=web"))
            .await?
            .items
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect();
        ensure!(names == BTreeSet::from(["web-0".to_string()]), "{names:?}");
        Ok(())
    })
    .await?;
    let log = seen.lock().map(|s| s.clone()).unwrap_or_default();
    let gone = |n: &str| log.iter().position(|(k, p, _)| *k == "delete" && p == n);
    ensure!(
        matches!((gone("web-2"), gone("web-1")), (Some(a), Some(b)) if a < b),
        "scale-down order: {log:?}"
    );
    for i in 1..3 {
        ensure!(claims.get_opt(&format!("data-web-{i}")).await?.is_some());
    }
    recorder.abort();
    cluster.finish().await
}

fn job_condition(j: &Job, type_: &str) -> Option<String> {
    j.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_ && c.status == "True")
        .map(|c| c.reason.clone().unwrap_or_default())
}

/// Jobs the drain test runs beside it: an Indexed Job of 5 (parallelism
/// 2) whose pods print their index and hostname, and a Job whose first
/// pod exits 42 (ignored by its policy) and whose second exits 3 (which
/// fails the Job). The second pod knows it is second from a marker in a
/// host directory.
fn jobs_manifest(marker_dir: &str) -> String {
    format!(
        r#"apiVersion: batch/v1
kind: Job
metadata: {{name: indexed}}
spec:
  completionMode: Indexed
  completions: 5
  parallelism: 2
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: c
        image: {TOOLBOX_IMAGE}
        imagePullPolicy: IfNotPresent
        command: [sh, -c, 'echo "$JOB_COMPLETION_INDEX $(hostname)"']
---
apiVersion: batch/v1
kind: Job
metadata: {{name: judged}}
spec:
  backoffLimit: 0
  podFailurePolicy:
    rules:
    - action: Ignore
      onExitCodes: {{operator: In, values: [42]}}
    - action: FailJob
      onExitCodes: {{containerName: c, operator: In, values: [3]}}
  template:
    spec:
      restartPolicy: Never
      volumes: [{{name: marker, hostPath: {{path: {marker_dir}, type: DirectoryOrCreate}}}}]
      containers:
      - name: c
        image: {TOOLBOX_IMAGE}
        imagePullPolicy: IfNotPresent
        volumeMounts: [{{name: marker, mountPath: /marker}}]
        command: [sh, -c, 'if mkdir /marker/ran 2>/dev/null; then exit 42; else exit 3; fi']
"#
    )
}

/// Removes the judged Job's host directory, however the test ends.
struct RemoveDir(String);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Each index ran once, in a pod that saw its index and hostname; the
/// judged Job failed by its policy with the ignored failure uncounted.
async fn check_jobs(cluster: &Cluster, jobs: &Api<Job>, pods: &Api<Pod>) -> Result<()> {
    wait_for("the indexed job Complete", T, || async {
        let j = jobs.get("indexed").await?;
        ensure!(job_condition(&j, "Complete").is_some(), "{:?}", j.status);
        let st = j.status.unwrap_or_default();
        ensure!(st.completed_indexes.as_deref() == Some("0-4"), "{st:?}");
        Ok(())
    })
    .await?;
    let mut seen = BTreeSet::new();
    for p in pods
        .list(&ListParams::default().labels("batch.kubernetes.io/job-name=indexed"))
        .await?
        .items
    {
        let name = p.metadata.name.clone().unwrap_or_default();
        let index = p
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("batch.kubernetes.io/job-completion-index"))
            .cloned()
            .context("no index annotation")?;
        let said = cluster.kubectl_ok(&["logs", &name]).await?;
        ensure!(
            said.trim() == format!("{index} indexed-{index}"),
            "pod {name} said {said:?}"
        );
        ensure!(seen.insert(index.clone()), "index {index} ran twice");
    }
    ensure!(seen.len() == 5, "indexes {seen:?}");

    wait_for("the judged job Failed", T, || async {
        let j = jobs.get("judged").await?;
        ensure!(
            job_condition(&j, "Failed").as_deref() == Some("PodFailurePolicy"),
            "{:?}",
            j.status
        );
        let failed = j.status.and_then(|s| s.failed);
        ensure!(failed == Some(1), "failed {failed:?}: the exit 42 counted");
        Ok(())
    })
    .await?;
    let message = cluster
        .kubectl_ok(&[
            "get",
            "job",
            "judged",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Failed\")].message}",
        ])
        .await?;
    ensure!(
        message.contains("failed with exit code 3 matching FailJob rule at index 1"),
        "{message}"
    );
    Ok(())
}

/// Three replicas over two nodes with a budget of minAvailable 2: `kubectl
/// drain` of the node holding two of them evicts one, is refused the
/// other with the budget's 429 until the replacement is Ready elsewhere,
/// then completes. Meanwhile on the same cluster a CronJob made by
/// `kubectl create cronjob` runs on its schedule, `kubectl create job
/// --from=cronjob/...` runs it by hand, and the Jobs of [`jobs_manifest`]
/// run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_waits_for_the_budget_while_jobs_run() -> Result<()> {
    let cluster = Cluster::start(2, ClusterOptions::default()).await?;
    let client = cluster.client().await?;
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    let jobs = Api::<Job>::namespaced(client.clone(), "default");
    let crons = Api::<CronJob>::namespaced(client.clone(), "default");
    let marker = RemoveDir(format!(
        "/tmp/skiff-e2e-judged-{}-{}",
        std::process::id(),
        jiff::Timestamp::now().as_millisecond()
    ));
    cluster.apply(&jobs_manifest(&marker.0)).await?;
    cluster
        .kubectl_ok(&[
            "create",
            "cronjob",
            "tick",
            &format!("--image={TOOLBOX_IMAGE}"),
            "--schedule=* * * * *",
            "--",
            "echo",
            "tick",
        ])
        .await?;
    cluster
        .apply(&format!(
            r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: app}}
spec:
  replicas: 3
  selector: {{matchLabels: {{app: app}}}}
  template:
    metadata: {{labels: {{app: app}}}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: c
        image: {TOOLBOX_IMAGE}
        imagePullPolicy: IfNotPresent
        command: [sh, -c, "trap 'exit 0' TERM; sleep 3600 & wait"]
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {{name: app}}
spec:
  minAvailable: 2
  selector: {{matchLabels: {{app: app}}}}
"#
        ))
        .await?;
    cluster
        .kubectl_ok(&["rollout", "status", "deploy/app", "--timeout=120s"])
        .await?;
    // Before the drain, which removes the finished pods on its node.
    check_jobs(&cluster, &jobs, &pods).await?;
    let by_node = wait_for("the budget to allow one disruption", T, || async {
        let out = cluster
            .kubectl_ok(&[
                "get",
                "pdb",
                "app",
                "-o",
                "jsonpath={.status.disruptionsAllowed}",
            ])
            .await?;
        ensure!(out.trim() == "1", "disruptionsAllowed {out:?}");
        let mut by_node: BTreeMap<String, usize> = BTreeMap::new();
        for p in pods
            .list(&ListParams::default().labels("app=app"))
            .await?
            .items
        {
            let node = p.spec.and_then(|s| s.node_name).unwrap_or_default();
            *by_node.entry(node).or_default() += 1;
        }
        Ok(by_node)
    })
    .await?;
    let (busiest, count) = by_node
        .iter()
        .max_by_key(|(_, n)| **n)
        .map(|(n, c)| (n.clone(), *c))
        .context("no pods")?;
    ensure!(count >= 2, "3 pods over 2 nodes: {by_node:?}");
    // The budget's refusals go to stderr, "drained" to stdout.
    let drain = cluster
        .kubectl(&[
            "drain",
            &busiest,
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=150s",
        ])
        .await?;
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&drain.stdout),
        String::from_utf8_lossy(&drain.stderr)
    );
    ensure!(drain.status.success(), "drain failed: {out}");
    ensure!(
        out.contains("would violate the pod's disruption budget") && out.contains("drained"),
        "drain output: {out}"
    );
    let left: Vec<Pod> = pods
        .list(&ListParams::default().labels("app=app"))
        .await?
        .items;
    ensure!(
        left.iter().all(|p| p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            != Some(busiest.as_str())),
        "pods left on the drained node"
    );

    // The CronJob: a run on the next minute, and one made by hand from it.
    wait_for(
        "a successful scheduled run",
        Duration::from_secs(150),
        || async {
            let c = crons.get("tick").await?;
            ensure!(
                c.status.and_then(|s| s.last_successful_time).is_some(),
                "no successful run yet"
            );
            Ok(())
        },
    )
    .await?;
    cluster
        .kubectl_ok(&["create", "job", "by-hand", "--from=cronjob/tick"])
        .await?;
    wait_for("job by-hand Complete", T, || async {
        let j = jobs.get("by-hand").await?;
        ensure!(job_condition(&j, "Complete").is_some(), "{:?}", j.status);
        Ok(())
    })
    .await?;
    cluster.finish().await
}
