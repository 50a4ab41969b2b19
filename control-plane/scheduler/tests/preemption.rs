//! Preemption against a real (in-process) API server: the fewest,
//! least important victims get the DisruptionTarget condition, a
//! graceful delete and the Preempted event; the preemptor is nominated
//! and then bound where they were; a `preemptionPolicy: Never` pod only
//! waits, with upstream's message.

use crate::support;

use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use support::{poll, Cluster, WITHIN};

async fn class(c: &Cluster, name: &str, value: i32, policy: &str) {
    let pc: PriorityClass = serde_json::from_value(json!({
        "metadata": {"name": name}, "value": value, "preemptionPolicy": policy
    }))
    .unwrap();
    Api::<PriorityClass>::all(c.admin.clone())
        .create(&PostParams::default(), &pc)
        .await
        .expect("create priority class");
}

/// Act as the node's agent: finish the graceful deletion of `name`.
async fn finish_deletion(c: &Cluster, name: &str) {
    let pods = c.pods("default");
    poll(WITHIN, || async {
        let p = pods.get(name).await.ok()?;
        p.metadata.deletion_timestamp.map(|_| ())
    })
    .await
    .unwrap_or_else(|| panic!("{name} was never deleted"));
    pods.delete(name, &DeleteParams::default().grace_period(0))
        .await
        .expect("final delete");
}

#[tokio::test]
async fn the_least_important_pods_make_room() {
    let mut c = Cluster::start().await;
    c.node("n1", json!({})).await;
    for (name, value) in [("p1", 1), ("p2", 2), ("p3", 3), ("p4", 4), ("high", 100)] {
        class(&c, name, value, "PreemptLowerPriority").await;
    }
    class(&c, "high-never", 100, "Never").await;
    c.start_scheduler().await;
    // Four pods of 1 CPU fill the node's 4.
    for p in ["p1", "p2", "p3", "p4"] {
        c.pod("default", p, "1", json!({"spec": {"priorityClassName": p}}))
            .await;
        c.bound("default", p).await;
    }

    // A Never pod needing 2 waits and preempts nobody.
    c.pod(
        "default",
        "patient",
        "2",
        json!({"spec": {"priorityClassName": "high-never"}}),
    )
    .await;
    let (reason, message) = c.unschedulable_condition("default", "patient").await;
    assert_eq!(reason, "Unschedulable");
    assert_eq!(
        message,
        "0/1 nodes are available: 1 Insufficient cpu. preemption: not eligible due to preemptionPolicy=Never.."
    );
    c.pods("default")
        .delete("patient", &DeleteParams::default())
        .await
        .unwrap();

    // A pod needing 2 takes the room of the two lowest.
    let high = c
        .pod(
            "default",
            "high",
            "2",
            json!({"spec": {"priorityClassName": "high"}}),
        )
        .await;
    assert_eq!(high.spec.as_ref().and_then(|s| s.priority), Some(100));
    let uid = high.metadata.uid.clone().unwrap();
    let nominated = poll(WITHIN, || async {
        let p = c.pods("default").get("high").await.ok()?;
        p.status?.nominated_node_name
    })
    .await;
    assert_eq!(nominated.as_deref(), Some("n1"));
    for victim in ["p1", "p2"] {
        let note = c.event_note("default", victim, "Preempted").await;
        assert_eq!(note, format!("Preempted by pod {uid} on node n1"));
        let p = c.pods("default").get(victim).await.unwrap();
        let condition = p
            .status
            .and_then(|s| s.conditions)
            .into_iter()
            .flatten()
            .find(|c| c.type_ == "DisruptionTarget")
            .expect("DisruptionTarget");
        assert_eq!(
            (condition.status.as_str(), condition.reason.as_deref()),
            ("True", Some("PreemptionByScheduler"))
        );
        assert!(p.metadata.deletion_timestamp.is_some(), "graceful delete");
    }
    for survivor in ["p3", "p4"] {
        let p = c.pods("default").get(survivor).await.unwrap();
        assert!(p.metadata.deletion_timestamp.is_none(), "{survivor} kept");
    }
    // While the victims terminate the preemptor waits for them.
    assert_eq!(c.node_of("default", "high").await, None);
    finish_deletion(&c, "p1").await;
    finish_deletion(&c, "p2").await;
    assert_eq!(c.bound("default", "high").await, "n1");
    c.stop_scheduler().await;
}
