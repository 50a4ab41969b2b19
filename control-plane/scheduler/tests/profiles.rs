//! Scheduler profiles from a KubeSchedulerConfiguration: each profile
//! schedules the pods that name it, scores as it says, and reports its
//! events under its own name; pods naming no profile are left alone.

use crate::support;

use std::time::Duration;

use serde_json::json;
use support::{poll, Cluster};

const CONFIG: &str = r#"
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection: {leaderElect: false}
profiles:
- schedulerName: default-scheduler
- schedulerName: bin-packer
  plugins:
    score:
      disabled: [{name: "*"}]
      enabled: [{name: NodeResourcesFit, weight: 1}]
  pluginConfig:
  - name: NodeResourcesFit
    args:
      scoringStrategy: {type: MostAllocated}
"#;

#[tokio::test]
async fn each_profile_schedules_its_own_pods() {
    let mut c = Cluster::start().await;
    let dir = std::env::temp_dir().join(format!("skiff-profiles-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("scheduler.yaml");
    std::fs::write(&path, CONFIG).unwrap();
    let config = skiff_scheduler::Config::from_file(&path).expect("config");
    std::fs::remove_dir_all(&dir).unwrap();
    c.node("busy", json!({})).await;
    c.node("idle", json!({})).await;
    c.start_scheduler_with(config).await;
    // Something on "busy" first, placed by hand.
    c.pod(
        "default",
        "ballast",
        "2",
        json!({"spec": {"nodeName": "busy"}}),
    )
    .await;

    // MostAllocated packs: every bin-packer pod joins the ballast.
    for i in 0..3 {
        let name = format!("packed-{i}");
        c.pod(
            "default",
            &name,
            "200m",
            json!({"spec": {"schedulerName": "bin-packer"}}),
        )
        .await;
        assert_eq!(c.bound("default", &name).await, "busy", "{name}");
    }
    let events = c.events("default", "packed-0", "Scheduled").await;
    assert_eq!(
        events[0].reporting_controller.as_deref(),
        Some("bin-packer"),
        "reported under the profile's name"
    );

    // The default profile spreads: the next pod goes to the idle node.
    c.pod("default", "spread", "200m", json!({})).await;
    assert_eq!(c.bound("default", "spread").await, "idle");

    // No profile by that name: nobody schedules it.
    c.pod(
        "default",
        "orphan",
        "100m",
        json!({"spec": {"schedulerName": "nobody"}}),
    )
    .await;
    let bound = poll(Duration::from_secs(3), || c.node_of("default", "orphan")).await;
    assert_eq!(bound, None);
    c.stop_scheduler().await;
}
