//! Scheduling end to end, on three real nodes in three zones with the
//! real kubectl: required anti-affinity leaves the pods that cannot be
//! placed Pending with upstream's message, a zone spread constraint
//! places 2/2/2 and 3/3/3, preferred pod affinity pulls pods next to a
//! labelled pod, a high-priority pod preempts a lower one (which gets
//! the Preempted event and terminates gracefully) while a
//! `preemptionPolicy: Never` pod waits, and a namespace's ResourceQuota
//! and LimitRange apply to pods created at once.
//!
//! One cluster for all of it (three nodes are the expensive part); the
//! parts run one after another, each cleaning up its pods.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::ListParams;
use kube::Api;
use skiff_tests::bench::ready;
use skiff_tests::cluster::{wait_for, Cluster, ClusterOptions};
use skiff_tests::TOOLBOX_IMAGE;

/// Time for anything that involves starting or stopping pods.
const T: Duration = Duration::from_secs(120);
const ZONE: &str = "topology.kubernetes.io/zone";

/// A Deployment of `replicas` toolbox pods labelled `app: NAME`, with
/// `spec` (YAML flow mapping entries) added to the pod spec.
fn deployment(name: &str, replicas: u32, spec: &str) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec: {{terminationGracePeriodSeconds: 1, {spec}
      containers: [{{name: c, image: {TOOLBOX_IMAGE}, imagePullPolicy: IfNotPresent,
        command: [sh, -c, "trap 'exit 0' TERM; sleep 3600 & wait"]}}]}}
"#
    )
}

/// The pods labelled `app=APP`, by phase-ish state: (node or "", ready).
async fn placed(pods: &Api<Pod>, app: &str) -> Result<Vec<(String, bool, Pod)>> {
    let list = pods
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await?;
    Ok(list
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            let node = p
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default();
            (node, ready(&p), p)
        })
        .collect())
}

/// The PodScheduled=False message of `p`.
fn unschedulable_message(p: &Pod) -> Option<String> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")?
        .message
        .clone()
}

/// Ready pods of `app` per zone, once `total` are Ready and none pending.
async fn per_zone(
    pods: &Api<Pod>,
    app: &str,
    total: usize,
    zones: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, usize>> {
    wait_for(&format!("{total} {app} pods Ready"), T, || async {
        let now = placed(pods, app).await?;
        ensure!(
            now.len() == total && now.iter().all(|(_, r, _)| *r),
            "{:?}",
            now.iter().map(|(n, r, _)| (n, r)).collect::<Vec<_>>()
        );
        let mut counts = BTreeMap::new();
        for (node, _, _) in &now {
            *counts
                .entry(zones.get(node).cloned().unwrap_or_default())
                .or_default() += 1;
        }
        Ok(counts)
    })
    .await
}

async fn delete_app(cluster: &Cluster, pods: &Api<Pod>, kind: &str, name: &str) -> Result<()> {
    cluster
        .kubectl_ok(&["delete", kind, name, "--wait=false"])
        .await?;
    wait_for(&format!("{name}'s pods gone"), T, || async {
        let left = pods
            .list(&ListParams::default().labels(&format!("app={name}")))
            .await?;
        ensure!(left.items.is_empty(), "{} left", left.items.len());
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn affinity_spread_priorities_and_quotas() -> Result<()> {
    let cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let client = cluster.client().await?;
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    let nodes = Api::<Node>::all(client.clone());
    let names: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| n.name().to_string())
        .collect();
    let mut zones = BTreeMap::new();
    for (i, n) in names.iter().enumerate() {
        let zone = format!("zone-{i}");
        cluster
            .kubectl_ok(&["label", "node", n, &format!("{ZONE}={zone}")])
            .await?;
        zones.insert(n.clone(), zone);
    }

    // Required anti-affinity on hostname: one per node, the rest wait
    // with upstream's message (no pod of lower priority to preempt).
    cluster
        .apply(&deployment(
            "solo",
            6,
            "affinity: {podAntiAffinity: {requiredDuringSchedulingIgnoredDuringExecution: [{labelSelector: {matchLabels: {app: solo}}, topologyKey: kubernetes.io/hostname}]}},",
        ))
        .await?;
    wait_for("3 solo pods Ready and 3 unschedulable", T, || async {
        let now = placed(&pods, "solo").await?;
        let running: Vec<_> = now.iter().filter(|(n, r, _)| !n.is_empty() && *r).collect();
        let pending: Vec<_> = now.iter().filter(|(n, _, _)| n.is_empty()).collect();
        ensure!(running.len() == 3 && pending.len() == 3, "{} running, {} pending", running.len(), pending.len());
        let mut hosts: Vec<_> = running.iter().map(|(n, _, _)| n.clone()).collect();
        hosts.dedup();
        ensure!(hosts.len() == 3, "two on one node: {hosts:?}");
        for (_, _, p) in pending {
            let m = unschedulable_message(p).unwrap_or_default();
            ensure!(
                m == "0/3 nodes are available: 3 node(s) didn't match pod anti-affinity rules. preemption: 0/3 nodes are available: 3 No preemption victims found for incoming pod..",
                "message: {m}"
            );
        }
        Ok(())
    })
    .await?;
    delete_app(&cluster, &pods, "deployment", "solo").await?;

    // Spread over zones, maxSkew 1: 2/2/2, and 3/3/3 after a scale-up.
    cluster
        .apply(&deployment(
            "spread",
            6,
            &format!("topologySpreadConstraints: [{{maxSkew: 1, topologyKey: {ZONE}, whenUnsatisfiable: DoNotSchedule, labelSelector: {{matchLabels: {{app: spread}}}}}}],"),
        ))
        .await?;
    let counts = per_zone(&pods, "spread", 6, &zones).await?;
    ensure!(
        counts.values().all(|c| *c == 2) && counts.len() == 3,
        "{counts:?}"
    );
    cluster
        .kubectl_ok(&["scale", "deployment", "spread", "--replicas=9"])
        .await?;
    let counts = per_zone(&pods, "spread", 9, &zones).await?;
    ensure!(
        counts.values().all(|c| *c == 3) && counts.len() == 3,
        "{counts:?}"
    );
    delete_app(&cluster, &pods, "deployment", "spread").await?;

    // Preferred affinity: pods go next to the labelled pod.
    let magnet_node = &names[2];
    cluster
        .apply(&format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: magnet, labels: {{app: magnet}}}}
spec:
  nodeName: {magnet_node}
  terminationGracePeriodSeconds: 1
  containers: [{{name: c, image: {TOOLBOX_IMAGE}, imagePullPolicy: IfNotPresent, command: [sleep, "3600"]}}]
"#
        ))
        .await?;
    for i in 0..2 {
        cluster
            .apply(&format!(
                r#"apiVersion: v1
kind: Pod
metadata: {{name: follower-{i}, labels: {{app: follower}}}}
spec:
  terminationGracePeriodSeconds: 1
  affinity:
    podAffinity:
      preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm: {{labelSelector: {{matchLabels: {{app: magnet}}}}, topologyKey: kubernetes.io/hostname}}
  containers: [{{name: c, image: {TOOLBOX_IMAGE}, imagePullPolicy: IfNotPresent, command: [sleep, "3600"]}}]
"#
            ))
            .await?;
    }
    let followers = wait_for("followers placed", T, || async {
        let now = placed(&pods, "follower").await?;
        ensure!(
            now.len() == 2 && now.iter().all(|(n, _, _)| !n.is_empty()),
            "not yet"
        );
        Ok(now.into_iter().map(|(n, _, _)| n).collect::<Vec<_>>())
    })
    .await?;
    ensure!(
        followers.iter().all(|n| n == magnet_node),
        "followers on {followers:?}, magnet on {magnet_node}"
    );
    cluster
        .kubectl_ok(&[
            "delete",
            "pod",
            "magnet",
            "follower-0",
            "follower-1",
            "--wait=false",
        ])
        .await?;

    // Priorities: fill every node with low-priority pods, then a
    // high-priority pod preempts one of them; a Never pod only waits.
    let cpu = {
        let n = nodes.get(&names[0]).await?;
        let alloc = n
            .status
            .and_then(|s| s.allocatable)
            .and_then(|a| a.get("cpu").cloned())
            .context("allocatable cpu")?;
        kube_util::quantity::milli_value(&alloc.0)?
    };
    // More than half a node: two never fit on one.
    let request = format!("{}m", cpu * 6 / 10);
    cluster
        .apply(
            r#"apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: low}
value: 100
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: high}
value: 1000
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: high-never}
value: 1000
preemptionPolicy: Never
"#,
        )
        .await?;
    cluster
        .apply(&deployment(
            "filler",
            3,
            "priorityClassName: low, affinity: {podAntiAffinity: {requiredDuringSchedulingIgnoredDuringExecution: [{labelSelector: {matchLabels: {app: filler}}, topologyKey: kubernetes.io/hostname}]}}, ",
        )
        .replace(
            "imagePullPolicy: IfNotPresent,",
            &format!("imagePullPolicy: IfNotPresent, resources: {{requests: {{cpu: {request}}}}},"),
        ))
        .await?;
    let fillers = per_zone(&pods, "filler", 3, &zones).await?;
    ensure!(fillers.len() == 3, "{fillers:?}");
    let before: Vec<Pod> = placed(&pods, "filler")
        .await?
        .into_iter()
        .map(|(_, _, p)| p)
        .collect();
    let single = |name: &str, class: &str| {
        format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, labels: {{app: {name}}}}}
spec:
  priorityClassName: {class}
  terminationGracePeriodSeconds: 1
  containers: [{{name: c, image: {TOOLBOX_IMAGE}, imagePullPolicy: IfNotPresent, command: [sleep, "3600"], resources: {{requests: {{cpu: {request}}}}}}}]
"#
        )
    };
    cluster.apply(&single("vip", "high")).await?;
    let vip = wait_for("vip Ready", T, || async {
        let p = pods.get("vip").await?;
        ensure!(ready(&p), "not yet");
        Ok(p)
    })
    .await?;
    ensure!(
        vip.spec.as_ref().and_then(|s| s.priority) == Some(1000),
        "priority resolved from the class"
    );
    let vip_uid = vip.metadata.uid.clone().unwrap_or_default();
    let vip_node = vip.spec.and_then(|s| s.node_name).unwrap_or_default();
    let victim = before
        .iter()
        .find(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(vip_node.as_str()))
        .and_then(|p| p.metadata.name.clone())
        .context("a filler on vip's node")?;
    let events = Api::<Event>::namespaced(client.clone(), "default");
    wait_for("the Preempted event", T, || async {
        let list = events
            .list(&ListParams::default().fields(&format!("involvedObject.name={victim}")))
            .await?;
        let want = format!("Preempted by pod {vip_uid} on node {vip_node}");
        ensure!(
            list.items
                .iter()
                .any(|e| e.reason.as_deref() == Some("Preempted")
                    && e.message.as_deref() == Some(&want)),
            "events: {:?}",
            list.items
                .iter()
                .map(|e| (&e.reason, &e.message))
                .collect::<Vec<_>>()
        );
        Ok(())
    })
    .await?;
    // The victim's replacement has no one to preempt; the Never pod
    // would have, but only waits.
    cluster.apply(&single("patient", "high-never")).await?;
    wait_for("patient unschedulable without preempting", T, || async {
        let p = pods.get("patient").await?;
        let m = unschedulable_message(&p).unwrap_or_default();
        ensure!(
            m.ends_with("preemption: not eligible due to preemptionPolicy=Never.."),
            "message: {m}"
        );
        Ok(())
    })
    .await?;
    let fillers_ready = placed(&pods, "filler")
        .await?
        .iter()
        .filter(|(_, r, _)| *r)
        .count();
    ensure!(fillers_ready == 2, "{fillers_ready} fillers Ready");
    cluster
        .kubectl_ok(&["delete", "pod", "vip", "patient", "--wait=false"])
        .await?;
    delete_app(&cluster, &pods, "deployment", "filler").await?;

    // Quota and limits in a namespace: four pods created at once against
    // a quota of two; the two admitted got the LimitRange's defaults.
    cluster
        .apply(
            r#"apiVersion: v1
kind: Namespace
metadata: {name: team}
---
apiVersion: v1
kind: ResourceQuota
metadata: {name: q1, namespace: team}
spec: {hard: {pods: "2", requests.cpu: "1"}}
---
apiVersion: v1
kind: LimitRange
metadata: {name: defaults, namespace: team}
spec:
  limits:
  - type: Container
    default: {cpu: 200m, memory: 64Mi}
    defaultRequest: {cpu: 100m, memory: 32Mi}
"#,
        )
        .await?;
    let creates = (0..4).map(|i| {
        let pod = format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: q-{i}, namespace: team}}
spec:
  terminationGracePeriodSeconds: 1
  containers: [{{name: c, image: {TOOLBOX_IMAGE}, imagePullPolicy: IfNotPresent, command: [sleep, "3600"]}}]
"#
        );
        let cluster = &cluster;
        async move { cluster.kubectl_stdin(&["create", "-f", "-"], Some(&pod)).await }
    });
    let outcomes = futures::future::join_all(creates).await;
    let mut created = 0;
    for o in outcomes {
        let o = o?;
        if o.status.success() {
            created += 1;
        } else {
            let err = String::from_utf8_lossy(&o.stderr);
            ensure!(
                err.contains("exceeded quota: q1") && err.contains("limited: pods=2"),
                "refusal: {err}"
            );
        }
    }
    ensure!(created == 2, "{created} pods created against a quota of 2");
    let team = Api::<Pod>::namespaced(client.clone(), "team");
    for p in team.list(&ListParams::default()).await?.items {
        let c = &p.spec.as_ref().context("spec")?.containers[0];
        let r = c.resources.as_ref().context("resources")?;
        let get = |m: &Option<BTreeMap<String, _>>, k: &str| {
            m.as_ref().and_then(
                |m: &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
                    m.get(k).map(|q| q.0.clone())
                },
            )
        };
        ensure!(
            get(&r.requests, "cpu").as_deref() == Some("100m")
                && get(&r.limits, "memory").as_deref() == Some("64Mi"),
            "defaults on {:?}: {r:?}",
            p.metadata.name
        );
    }
    let describe = cluster
        .kubectl_ok(&["describe", "quota", "q1", "-n", "team"])
        .await?;
    ensure!(
        describe
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["pods", "2", "2"])
            && describe
                .lines()
                .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["requests.cpu", "200m", "1"]),
        "describe quota:\n{describe}"
    );
    cluster.finish().await
}
