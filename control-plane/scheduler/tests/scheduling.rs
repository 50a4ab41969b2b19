//! The scheduler against a real (in-process) API server: bindings,
//! spreading, FailedScheduling, retries, taints, affinity, host ports.

use crate::support;

use std::collections::HashMap;
use std::time::Duration;

use kube::api::DeleteParams;
use serde_json::json;
use skiff_control_plane::testkit::eventually;
use support::{owned_by, poll, Cluster, WITHIN};

#[tokio::test]
async fn binds_pods_spreads_a_replicaset_and_records_scheduled() {
    let mut c = Cluster::start().await;
    c.node("n1", json!({})).await;
    c.node("n2", json!({})).await;
    // Created before the scheduler starts: picked up by the initial list.
    c.pod("default", "lone", "100m", json!({})).await;
    c.start_scheduler().await;
    for i in 0..4 {
        c.pod(
            "default",
            &format!("web-{i}"),
            "100m",
            owned_by("ReplicaSet", "web", "rs-web-uid"),
        )
        .await;
    }
    let lone = c.bound("default", "lone").await;
    assert!(lone == "n1" || lone == "n2");
    let mut per_node: HashMap<String, usize> = HashMap::new();
    for i in 0..4 {
        *per_node
            .entry(c.bound("default", &format!("web-{i}")).await)
            .or_default() += 1;
    }
    assert_eq!(
        per_node,
        HashMap::from([("n1".to_string(), 2), ("n2".to_string(), 2)]),
        "a ReplicaSet's pods spread over both nodes"
    );
    let note = c.event_note("default", "web-0", "Scheduled").await;
    let node = c.node_of("default", "web-0").await.expect("bound");
    assert_eq!(
        note,
        format!("Successfully assigned default/web-0 to {node}")
    );
    let ev = c.events("default", "web-0", "Scheduled").await.remove(0);
    assert_eq!(
        ev.reporting_controller.as_deref(),
        Some("default-scheduler")
    );
    assert_eq!(ev.type_.as_deref(), Some("Normal"));
    c.stop_scheduler().await;
}

#[tokio::test]
async fn a_pod_that_fits_nowhere_says_why_and_is_bound_when_room_appears() {
    let mut c = Cluster::start().await;
    let small = json!({"metadata": {"labels": {"zone": "a"}},
        "status": {"allocatable": {"cpu": "1"}, "capacity": {"cpu": "1"}}});
    c.node("small-1", small.clone()).await;
    c.node("small-2", small).await;
    c.node(
        "tainted",
        json!({"metadata": {"labels": {"zone": "a"}},
            "spec": {"taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]}}),
    )
    .await;
    c.node("elsewhere", json!({"metadata": {"labels": {"zone": "b"}}}))
        .await;
    c.start_scheduler().await;
    c.pod(
        "default",
        "big",
        "2",
        json!({"spec": {"nodeSelector": {"zone": "a"}}}),
    )
    .await;
    let expected = "0/4 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, \
                    1 node(s) had untolerated taint {dedicated: gpu}, 2 Insufficient cpu. \
                    preemption: 0/4 nodes are available: 2 No preemption victims found for incoming pod, \
                    2 Preemption is not helpful for scheduling..";
    let note = c.event_note("default", "big", "FailedScheduling").await;
    assert_eq!(note, expected);
    let ev = c
        .events("default", "big", "FailedScheduling")
        .await
        .remove(0);
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    let (reason, message) = c.unschedulable_condition("default", "big").await;
    assert_eq!(reason, "Unschedulable");
    assert_eq!(message, expected);
    assert_eq!(c.node_of("default", "big").await, None);

    // A node with room joins: the pod is retried without waiting out a
    // long back-off, and bound there.
    c.node("roomy", json!({"metadata": {"labels": {"zone": "a"}}}))
        .await;
    assert_eq!(c.bound("default", "big").await, "roomy");
    c.stop_scheduler().await;
}

#[tokio::test]
async fn a_burst_does_not_overcommit_and_deleting_a_pod_makes_room() {
    let mut c = Cluster::start().await;
    let two_cpus = json!({"status": {"allocatable": {"cpu": "2"}, "capacity": {"cpu": "2"}}});
    c.node("n1", two_cpus.clone()).await;
    c.node("n2", two_cpus).await;
    // Six pods of one CPU for four CPUs, all pending at once: decisions
    // are made faster than the watch shows bindings, so only the assumed
    // pods keep the count right.
    for i in 0..6 {
        c.pod("default", &format!("p{i}"), "1", json!({})).await;
    }
    c.start_scheduler().await;
    let names: Vec<String> = (0..6).map(|i| format!("p{i}")).collect();
    let placed: HashMap<String, String> = poll(WITHIN, || async {
        let mut placed = HashMap::new();
        for n in &names {
            if let Some(node) = c.node_of("default", n).await {
                placed.insert(n.clone(), node);
            }
        }
        (placed.len() == 4).then_some(placed)
    })
    .await
    .expect("four pods bound");
    let pending: Vec<&String> = names.iter().filter(|n| !placed.contains_key(*n)).collect();
    for p in &pending {
        let (_, message) = c.unschedulable_condition("default", p).await;
        assert_eq!(message, "0/2 nodes are available: 2 Insufficient cpu. preemption: 0/2 nodes are available: 2 No preemption victims found for incoming pod..");
    }
    // Still four after a while: nothing is bound over capacity.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for p in &pending {
        assert_eq!(c.node_of("default", p).await, None);
    }
    let per_node = placed.values().fold(HashMap::new(), |mut m, n| {
        *m.entry(n.clone()).or_insert(0) += 1;
        m
    });
    assert!(per_node.values().all(|n| *n == 2), "{per_node:?}");

    // Deleting a bound pod frees a CPU: one pending pod gets it.
    let victim = placed.keys().next().expect("a bound pod").clone();
    c.pods("default")
        .delete(&victim, &DeleteParams::default().grace_period(0))
        .await
        .expect("delete");
    let ok = eventually(WITHIN, || async {
        let mut bound = 0;
        for p in &pending {
            bound += usize::from(c.node_of("default", p).await.is_some());
        }
        bound == 1
    })
    .await;
    assert!(ok, "one of {pending:?} took the freed CPU");
    c.stop_scheduler().await;
}

#[tokio::test]
async fn taints_tolerations_and_node_readiness() {
    let mut c = Cluster::start().await;
    let gpu_taint = json!({"spec": {"taints": [
        {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]}});
    c.node("gpu", gpu_taint).await;
    c.node(
        "down",
        json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
    )
    .await;
    c.node("cordoned", json!({"spec": {"unschedulable": true}}))
        .await;
    c.start_scheduler().await;

    c.pod("default", "plain", "100m", json!({})).await;
    let expected = "0/3 nodes are available: 1 node(s) had untolerated taint {dedicated: gpu}, \
                    1 node(s) had untolerated taint {node.kubernetes.io/not-ready: }, \
                    1 node(s) were unschedulable. \
                    preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling..";
    assert_eq!(
        c.event_note("default", "plain", "FailedScheduling").await,
        expected
    );

    let tolerating = |tol: serde_json::Value| json!({"spec": {"tolerations": [tol]}});
    c.pod(
        "default",
        "equal",
        "100m",
        tolerating(json!({"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"})),
    )
    .await;
    assert_eq!(c.bound("default", "equal").await, "gpu");
    // An empty key with Exists tolerates every taint, the cordon's
    // `node.kubernetes.io/unschedulable` included (upstream's
    // NodeUnschedulable filter checks tolerations), so any node will do.
    c.pod(
        "default",
        "anything",
        "100m",
        tolerating(json!({"operator": "Exists"})),
    )
    .await;
    let node = c.bound("default", "anything").await;
    assert!(
        ["gpu", "down", "cordoned"].contains(&node.as_str()),
        "{node}"
    );

    // The node becomes Ready: the plain pod is retried and still refused
    // by the taint and the cordon, and goes there.
    let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
    c.nodes()
        .patch_status(
            "down",
            &Default::default(),
            &kube::api::Patch::Merge(&ready),
        )
        .await
        .expect("node ready");
    assert_eq!(c.bound("default", "plain").await, "down");
    c.stop_scheduler().await;
}

#[tokio::test]
async fn node_affinity_and_selectors() {
    let mut c = Cluster::start().await;
    c.node(
        "small",
        json!({"metadata": {"labels": {"disk": "hdd", "cores": "4"}}}),
    )
    .await;
    c.node(
        "big",
        json!({"metadata": {"labels": {"disk": "ssd", "cores": "64"}}}),
    )
    .await;
    c.start_scheduler().await;
    let affinity = |terms: serde_json::Value| {
        json!({"spec": {"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}}})
    };
    let cases = [
        (
            "selector",
            json!({"spec": {"nodeSelector": {"disk": "ssd"}}}),
            "big",
        ),
        (
            "in",
            affinity(
                json!([{"matchExpressions": [{"key": "disk", "operator": "In", "values": ["hdd"]}]}]),
            ),
            "small",
        ),
        (
            "notin",
            affinity(
                json!([{"matchExpressions": [{"key": "disk", "operator": "NotIn", "values": ["hdd"]}]}]),
            ),
            "big",
        ),
        (
            "gt",
            affinity(
                json!([{"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["8"]}]}]),
            ),
            "big",
        ),
        (
            "lt",
            affinity(
                json!([{"matchExpressions": [{"key": "cores", "operator": "Lt", "values": ["8"]}]}]),
            ),
            "small",
        ),
        (
            "exists-and-field",
            affinity(
                json!([{"matchExpressions": [{"key": "disk", "operator": "Exists"}],
                             "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["small"]}]}]),
            ),
            "small",
        ),
        (
            "ored-terms",
            affinity(json!([
                {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["nvme"]}]},
                {"matchExpressions": [{"key": "disk", "operator": "DoesNotExist"}]},
                {"matchExpressions": [{"key": "cores", "operator": "In", "values": ["64"]}]}])),
            "big",
        ),
    ];
    for (name, spec, _) in &cases {
        c.pod("default", name, "100m", spec.clone()).await;
    }
    for (name, _, want) in &cases {
        assert_eq!(&c.bound("default", name).await, want, "pod {name}");
    }
    c.pod(
        "default",
        "nowhere",
        "100m",
        affinity(
            json!([{"matchExpressions": [{"key": "disk", "operator": "In", "values": ["tape"]}]}]),
        ),
    )
    .await;
    assert_eq!(
        c.event_note("default", "nowhere", "FailedScheduling").await,
        "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector. preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling.."
    );
    c.stop_scheduler().await;
}

#[tokio::test]
async fn host_ports_and_other_schedulers() {
    let mut c = Cluster::start().await;
    c.node("n1", json!({})).await;
    c.node("n2", json!({})).await;
    c.start_scheduler().await;
    let with_port = |port: i64, protocol: &str| {
        json!({"spec": {"containers": [{"name": "c", "image": "busybox",
            "ports": [{"containerPort": 80, "hostPort": port, "protocol": protocol}]}]}})
    };
    c.pod("default", "a", "100m", with_port(8080, "TCP")).await;
    c.pod("default", "b", "100m", with_port(8080, "TCP")).await;
    let (a, b) = (c.bound("default", "a").await, c.bound("default", "b").await);
    assert_ne!(a, b, "one host port 8080/TCP per node");
    // UDP is another port; a third TCP one fits nowhere.
    c.pod("default", "udp", "100m", with_port(8080, "UDP"))
        .await;
    c.bound("default", "udp").await;
    c.pod("default", "c", "100m", with_port(8080, "TCP")).await;
    assert_eq!(
        c.event_note("default", "c", "FailedScheduling").await,
        "0/2 nodes are available: 2 node(s) didn't have free ports for the requested pod ports. preemption: 0/2 nodes are available: 2 No preemption victims found for incoming pod.."
    );

    // A pod for another scheduler is left alone.
    c.pod(
        "default",
        "theirs",
        "100m",
        json!({"spec": {"schedulerName": "someone-else"}}),
    )
    .await;
    c.pod("default", "ours", "100m", json!({})).await;
    c.bound("default", "ours").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(c.node_of("default", "theirs").await, None);
    assert!(c
        .events("default", "theirs", "FailedScheduling")
        .await
        .is_empty());
    c.stop_scheduler().await;
}
