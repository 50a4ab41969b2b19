//! The scheduler outlives an API server restart: its watches resume (or
//! re-list) and it goes on binding, and changes made after the restart
//! (a node deleted, another added) are seen in order.

use crate::support;

use serde_json::json;
use support::Cluster;

#[tokio::test]
async fn keeps_scheduling_across_an_api_server_restart() {
    let mut c = Cluster::start().await;
    c.node("n1", json!({})).await;
    c.start_scheduler().await;
    c.pod("default", "before", "100m", json!({})).await;
    assert_eq!(c.bound("default", "before").await, "n1");

    c.server.restart().await;
    // The restarted server has new connections; clients reconnect.
    c.admin = c.server.client().await;
    c.nodes()
        .delete("n1", &Default::default())
        .await
        .expect("delete n1");
    c.node(
        "n2",
        json!({"spec": {"taints": [
        {"key": "only", "value": "tolerant", "effect": "NoSchedule"}]}}),
    )
    .await;
    // A pod only n2 can take: bound once the scheduler's node watch has
    // delivered n2, and so the deletion of n1 before it.
    c.pod(
        "default",
        "after",
        "100m",
        json!({"spec": {"nodeSelector": {"kubernetes.io/hostname": "n2"},
            "tolerations": [{"key": "only", "operator": "Exists"}]}}),
    )
    .await;
    assert_eq!(c.bound("default", "after").await, "n2");
    // Only n2 is left, and it needs a toleration: a pod without one is
    // not bound to the deleted n1.
    c.pod("default", "stuck", "100m", json!({})).await;
    assert_eq!(
        c.event_note("default", "stuck", "FailedScheduling").await,
        "0/1 nodes are available: 1 node(s) had untolerated taint {only: tolerant}. preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling.."
    );
    c.stop_scheduler().await;
}
