//! DaemonSet controller against a real API server: one pod per eligible
//! node (selector, taints, default daemon tolerations), pinned by node
//! affinity; following nodes as they join, change and leave; replacing
//! failed pods; rolling a new template node by node, with or without
//! surge.

use crate::workloads_support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::DeleteParams;
use kube::{Api, ResourceExt};
use serde_json::json;
use workloads_support::{is_ready, until, Env};

fn ds_yaml(node_selector: &str, image: &str) -> String {
    format!(
        r#"
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: agent
spec:
  selector:
    matchLabels: {{app: agent}}
  template:
    metadata:
      labels: {{app: agent}}
    spec:
      {node_selector}
      containers:
      - name: c
        image: {image}
"#
    )
}

/// The node each active daemon pod is pinned to, by node.
async fn placement(env: &Env) -> BTreeMap<String, String> {
    env.active_pods("app=agent")
        .await
        .iter()
        .map(|p| (target(p), p.name_any()))
        .collect()
}

fn target(p: &Pod) -> String {
    let terms = &p
        .spec
        .as_ref()
        .unwrap()
        .affinity
        .as_ref()
        .unwrap()
        .node_affinity
        .as_ref()
        .unwrap()
        .required_during_scheduling_ignored_during_execution
        .as_ref()
        .unwrap()
        .node_selector_terms;
    assert_eq!(terms.len(), 1, "one term naming the node");
    let f = &terms[0].match_fields.as_ref().unwrap()[0];
    assert_eq!(
        (f.key.as_str(), f.operator.as_str()),
        ("metadata.name", "In")
    );
    f.values.as_ref().unwrap()[0].clone()
}

async fn wait_placement(env: &Env, nodes: &[&str]) {
    let want: Vec<String> = nodes.iter().map(|s| s.to_string()).collect();
    until(&format!("daemon pods on {want:?}"), 20, || async {
        let have: Vec<String> = placement(env).await.into_keys().collect();
        let total = env.active_pods("app=agent").await.len();
        (have == want && total == want.len())
            .then_some(())
            .ok_or(format!("{have:?} ({total} pods)"))
    })
    .await;
}

/// Change the image to busybox:2 and, as the agents would, make each
/// new daemon ready as it comes, until all `nodes` run it and the status
/// says so.
async fn roll_to_busybox_2(env: &Env, nodes: usize) {
    env.kubectl(&["set", "image", "ds/agent", "c=busybox:2"]);
    let n = nodes as i32;
    until("the new template on every node", 60, || async {
        if let Some(p) = env
            .active_pods("app=agent")
            .await
            .iter()
            .find(|p| !is_ready(p))
        {
            env.set_running(&p.name_any(), true).await;
        }
        let s = status(env).await;
        let images = env.active_images("app=agent").await;
        (s == (n, n, n, n, n, 0) && images == vec!["busybox:2"; nodes])
            .then_some(())
            .ok_or(format!("{s:?} {images:?}"))
    })
    .await;
}

async fn status(env: &Env) -> (i32, i32, i32, i32, i32, i32) {
    let ds = Api::<DaemonSet>::default_namespaced(env.client.clone())
        .get("agent")
        .await
        .unwrap();
    let s = ds.status.unwrap_or_default();
    (
        s.desired_number_scheduled,
        s.current_number_scheduled,
        s.number_ready,
        s.number_available.unwrap_or(0),
        s.updated_number_scheduled.unwrap_or(0),
        s.number_misscheduled,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_pod_per_eligible_node_following_the_nodes() {
    let env = Env::start(&["daemonset"]).await;
    let none = json!([]);
    env.add_node("n1", &[("role", "edge")], none.clone()).await;
    env.add_node(
        "n2",
        &[("role", "edge")],
        json!([{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]),
    )
    .await;
    env.add_node("n3", &[], none.clone()).await;
    env.add_node(
        "n4",
        &[("role", "edge")],
        json!([{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]),
    )
    .await;
    env.kubectl_stdin(
        &["apply", "-f", "-"],
        &ds_yaml("nodeSelector: {role: edge}", "busybox:1"),
    );

    // n3 is not selected, n4's taint is not tolerated; n2 is cordoned,
    // which daemons tolerate.
    wait_placement(&env, &["n1", "n2"]).await;
    let pod = &env.active_pods("app=agent").await[0];
    assert!(pod.name_any().starts_with("agent-"));
    assert!(pod.labels().contains_key("controller-revision-hash"));
    assert!(
        pod.spec.as_ref().unwrap().node_name.is_none(),
        "the scheduler binds, not the controller"
    );
    let tolerations: Vec<String> = pod
        .spec
        .as_ref()
        .unwrap()
        .tolerations
        .iter()
        .flatten()
        .filter_map(|t| t.key.clone())
        .collect();
    for key in [
        "not-ready",
        "unreachable",
        "disk-pressure",
        "memory-pressure",
        "pid-pressure",
        "unschedulable",
    ] {
        assert!(
            tolerations.contains(&format!("node.kubernetes.io/{key}")),
            "{key} missing from {tolerations:?}"
        );
    }
    env.all_ready("app=agent").await;
    until("status of 2 ready daemons", 20, || async {
        let s = status(&env).await;
        (s == (2, 2, 2, 2, 2, 0))
            .then_some(())
            .ok_or(format!("{s:?}"))
    })
    .await;

    // Nodes join, change and leave.
    env.add_node("n5", &[("role", "edge")], none.clone()).await;
    wait_placement(&env, &["n1", "n2", "n5"]).await;
    env.kubectl(&["label", "node", "n3", "role=edge"]);
    wait_placement(&env, &["n1", "n2", "n3", "n5"]).await;
    env.kubectl(&["label", "node", "n2", "role-"]);
    wait_placement(&env, &["n1", "n3", "n5"]).await;
    Api::<Node>::all(env.client.clone())
        .delete("n1", &DeleteParams::default())
        .await
        .unwrap();
    wait_placement(&env, &["n3", "n5"]).await;

    // A failed daemon is replaced.
    let failed = placement(&env).await["n3"].clone();
    env.set_finished(&failed, "Failed").await;
    until("the failed daemon replaced", 20, || async {
        let now = placement(&env).await;
        let replaced = now.get("n3").is_some_and(|p| *p != failed);
        let gone = env.pods().get_opt(&failed).await.unwrap().is_none();
        (replaced && gone)
            .then_some(())
            .ok_or(format!("{now:?}, failed pod gone: {gone}"))
    })
    .await;
    let ns_pod = format!("default/{failed}");
    env.wait_event(
        "FailedDaemonPod",
        &format!("Found failed daemon pod {ns_pod} on node n3, will try to kill it"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_update_replaces_one_node_at_a_time() {
    let env = Env::start(&["daemonset"]).await;
    for n in ["n1", "n2", "n3"] {
        env.add_node(n, &[], json!([])).await;
    }
    env.kubectl_stdin(&["apply", "-f", "-"], &ds_yaml("", "busybox:1"));
    wait_placement(&env, &["n1", "n2", "n3"]).await;
    env.all_ready("app=agent").await;
    until("3 available", 20, || async {
        let s = status(&env).await;
        (s.3 == 3).then_some(()).ok_or(format!("{s:?}"))
    })
    .await;

    // maxUnavailable 1 of 3 nodes: never fewer than 2 ready daemons.
    let low = Arc::new(Mutex::new(Vec::new()));
    let l = low.clone();
    let watch = env.watch_pods("app=agent", move |live| {
        let ready = live.iter().filter(|p| is_ready(p)).count();
        if ready < 2 {
            l.lock().unwrap().push(ready);
        }
    });
    roll_to_busybox_2(&env, 3).await;
    watch.abort();
    assert!(
        low.lock().unwrap().is_empty(),
        "too many daemons down at once: {:?}",
        low.lock().unwrap()
    );
    let out = env.kubectl(&["rollout", "status", "ds/agent", "--timeout=20s"]);
    assert!(out.contains("successfully rolled out"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_update_with_max_surge_starts_the_new_daemon_beside_the_old() {
    let env = Env::start(&["daemonset"]).await;
    for n in ["n1", "n2"] {
        env.add_node(n, &[], json!([])).await;
    }
    let yaml = ds_yaml("", "busybox:1").replace(
        "spec:\n  selector:",
        "spec:\n  updateStrategy:\n    rollingUpdate: {maxSurge: 1, maxUnavailable: 0}\n  selector:",
    );
    env.kubectl_stdin(&["apply", "-f", "-"], &yaml);
    wait_placement(&env, &["n1", "n2"]).await;
    env.all_ready("app=agent").await;
    until("2 available", 20, || async {
        let s = status(&env).await;
        (s.3 == 2).then_some(()).ok_or(format!("{s:?}"))
    })
    .await;

    // Every moment of the rollout: how many live daemons, how many ready.
    let seen = Arc::new(Mutex::new((usize::MAX, 0usize)));
    let s = seen.clone();
    let watch = env.watch_pods("app=agent", move |live| {
        let ready = live.iter().filter(|p| is_ready(p)).count();
        let mut s = s.lock().unwrap();
        s.0 = s.0.min(ready);
        s.1 = s.1.max(live.len());
    });
    roll_to_busybox_2(&env, 2).await;
    watch.abort();
    let (fewest_ready, most_live) = *seen.lock().unwrap();
    assert_eq!(fewest_ready, 2, "a node was without a ready daemon");
    assert_eq!(
        most_live, 3,
        "one node (maxSurge 1) ran old and new side by side"
    );
    wait_placement(&env, &["n1", "n2"]).await;
    let out = env.kubectl(&["rollout", "status", "ds/agent", "--timeout=20s"]);
    assert!(out.contains("successfully rolled out"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_revisions_for_rollout_history_and_undo() {
    let env = Env::start(&["daemonset"]).await;
    env.add_node("n1", &[], json!([])).await;
    env.kubectl_stdin(&["apply", "-f", "-"], &ds_yaml("", "busybox:1"));
    wait_placement(&env, &["n1"]).await;
    env.kubectl(&["set", "image", "ds/agent", "c=busybox:2"]);
    let revs: Api<k8s_openapi::api::apps::v1::ControllerRevision> =
        Api::default_namespaced(env.client.clone());
    until("two revisions, the pod on the newest", 30, || async {
        env.all_ready("app=agent").await;
        let list = revs
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?
            .items;
        let pods = env.active_pods("app=agent").await;
        let hashes: Vec<String> = pods
            .iter()
            .filter_map(|p| p.labels().get("controller-revision-hash").cloned())
            .collect();
        let newest = list
            .iter()
            .max_by_key(|r| r.revision)
            .map(|r| r.name_any())
            .unwrap_or_default();
        (list.len() == 2 && hashes.len() == 1 && newest == format!("agent-{}", hashes[0]))
            .then_some(())
            .ok_or(format!(
                "{:?} {hashes:?}",
                list.iter().map(|r| r.name_any()).collect::<Vec<_>>()
            ))
    })
    .await;
    let history = env.kubectl(&["rollout", "history", "ds/agent"]);
    assert!(
        history.contains("1 ") && history.contains("2 "),
        "{history}"
    );
    env.kubectl(&["rollout", "undo", "ds/agent"]);
    until("the old template back", 30, || async {
        env.all_ready("app=agent").await;
        let ds: DaemonSet = Api::default_namespaced(env.client.clone())
            .get("agent")
            .await
            .map_err(|e| e.to_string())?;
        let image = ds.spec.template.spec.unwrap().containers[0]
            .image
            .clone()
            .unwrap_or_default();
        let images = env.active_images("app=agent").await;
        (image == "busybox:1" && images == ["busybox:1"])
            .then_some(())
            .ok_or(format!("{image} {images:?}"))
    })
    .await;
    // The first revision was renumbered, not copied.
    let list = revs
        .list(&Default::default())
        .await
        .expect("revisions")
        .items;
    assert_eq!(list.len(), 2);
}
