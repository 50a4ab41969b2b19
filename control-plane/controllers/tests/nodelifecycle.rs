//! Node lifecycle against a real API server, with the node agents
//! simulated (Nodes, Lease renewals and status posts by the admin):
//! a silent node goes Unknown and gets the unreachable taint, its pods
//! are evicted by their tolerations (the server's default ones included),
//! pods on it are marked not ready, and recovery removes the taint;
//! pressure conditions and cordons become NoSchedule taints.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Pod, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::Api;
use serde_json::{json, Value};
use skiff_control_plane::testkit::{eventually, TestServer};
use skiff_controllers::Config;

const WAIT: Duration = Duration::from_secs(20);
const UNREACHABLE: &str = "node.kubernetes.io/unreachable";
const NOT_READY: &str = "node.kubernetes.io/not-ready";

async fn start_controllers(server: &TestServer) -> tokio::sync::oneshot::Sender<()> {
    let client = server
        .client_for("system:kube-controller-manager", &[])
        .await;
    let cfg = Config {
        controllers: vec!["nodelifecycle".into()],
        node_monitor_period: Duration::from_millis(200),
        // Long enough that a renewing test agent on a loaded machine is
        // never late.
        node_monitor_grace_period: Duration::from_secs(3),
        ..Config::default()
    };
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(skiff_controllers::run(client, cfg, async {
        let _ = rx.await;
    }));
    tx
}

fn now() -> String {
    jiff::Timestamp::now().to_string()
}

/// Node status as an agent posts it.
fn status(ready: &str) -> Value {
    let cond = |ty: &str, st: &str| json!({"type": ty, "status": st, "reason": "Agent", "lastHeartbeatTime": now(), "lastTransitionTime": now()});
    json!({"conditions": [
        cond("Ready", ready),
        cond("MemoryPressure", "False"),
        cond("DiskPressure", "False"),
        cond("PIDPressure", "False"),
    ]})
}

async fn create_node(nodes: &Api<Node>, leases: &Api<Lease>, name: &str) {
    let n: Node = serde_json::from_value(json!({
        "metadata": {"name": name}, "spec": {}, "status": status("True"),
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &n).await.unwrap();
    let l: Lease = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": 40},
    }))
    .unwrap();
    leases.create(&PostParams::default(), &l).await.unwrap();
    renew(leases, name).await;
}

async fn renew(leases: &Api<Lease>, name: &str) {
    let t = serde_json::to_value(MicroTime(jiff::Timestamp::now())).unwrap();
    let p = json!({"spec": {"renewTime": t}});
    leases
        .patch(name, &PatchParams::default(), &Patch::Merge(&p))
        .await
        .unwrap();
}

/// An agent that renews `name`'s Lease until the handle is dropped.
fn keep_renewing(leases: Api<Lease>, name: &'static str) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            renew(&leases, name).await;
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
}

async fn post_status(nodes: &Api<Node>, name: &str, ready: &str) {
    let p = json!({"status": status(ready)});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&p))
        .await
        .unwrap();
}

async fn create_pod(pods: &Api<Pod>, name: &str, node: &str, tolerations: Value) -> Pod {
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"nodeName": node, "tolerations": tolerations,
                 "containers": [{"name": "c", "image": "busybox:1"}]},
    }))
    .unwrap();
    let p = pods.create(&PostParams::default(), &p).await.unwrap();
    let st = json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&st))
        .await
        .unwrap();
    p
}

fn toleration_seconds(pod: &Pod, key: &str) -> Vec<Option<i64>> {
    pod.spec
        .as_ref()
        .unwrap()
        .tolerations
        .iter()
        .flatten()
        .filter(|t| t.key.as_deref() == Some(key))
        .map(|t| t.toleration_seconds)
        .collect()
}

fn taint<'a>(node: &'a Node, key: &str) -> Option<&'a Taint> {
    node.spec
        .as_ref()?
        .taints
        .as_ref()?
        .iter()
        .find(|t| t.key == key && t.effect == "NoExecute")
}

async fn terminating(pods: &Api<Pod>, name: &str) -> bool {
    pods.get(name)
        .await
        .map(|p| p.metadata.deletion_timestamp.is_some())
        .unwrap_or(true)
}

async fn has_event(events: &Api<Event>, object: &str, reason: &str, message: &str) -> bool {
    let evs = events.list(&ListParams::default()).await.unwrap();
    evs.items.iter().any(|e| {
        e.involved_object.name.as_deref() == Some(object)
            && e.reason.as_deref() == Some(reason)
            && e.message.as_deref() == Some(message)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_node_is_tainted_its_pods_evicted_and_recovery_untaints() {
    // DefaultTolerationSeconds, shortened by the server's flags: pods
    // without their own toleration leave an unreachable node at once.
    let mut server = TestServer::start().await;
    server.cfg.default_unreachable_toleration_seconds = 0;
    server.cfg.default_not_ready_toleration_seconds = 60;
    server.restart().await;
    let admin = server.client().await;
    let nodes: Api<Node> = Api::all(admin.clone());
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-node-lease");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let events: Api<Event> = Api::all(admin.clone());

    create_node(&nodes, &leases, "n1").await;
    create_node(&nodes, &leases, "n2").await;
    let _n2_agent = keep_renewing(leases.clone(), "n2");
    let default = create_pod(&pods, "evict-now", "n1", json!([])).await;
    assert_eq!(toleration_seconds(&default, UNREACHABLE), vec![Some(0)]);
    assert_eq!(toleration_seconds(&default, NOT_READY), vec![Some(60)]);
    let two = create_pod(
        &pods,
        "tolerates-2s",
        "n1",
        json!([{"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 2}]),
    )
    .await;
    assert_eq!(
        toleration_seconds(&two, UNREACHABLE),
        vec![Some(2)],
        "own toleration kept, no default added"
    );
    create_pod(
        &pods,
        "tolerates-forever",
        "n1",
        json!([{"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute"}]),
    )
    .await;
    create_pod(&pods, "n2-plain", "n2", json!([])).await;
    create_pod(
        &pods,
        "n2-tolerant",
        "n2",
        json!([{"key": "example.com/maintenance", "operator": "Exists", "effect": "NoExecute"}]),
    )
    .await;
    let stop = start_controllers(&server).await;

    // n1 stops: after the grace period it is Unknown and tainted.
    assert!(
        eventually(WAIT, || async {
            let n = nodes.get("n1").await.unwrap();
            let conds = n.status.unwrap().conditions.unwrap();
            conds.len() == 4
                && conds.iter().all(|c| {
                    c.status == "Unknown"
                        && c.reason.as_deref() == Some("NodeStatusUnknown")
                        && c.message.as_deref() == Some("Kubelet stopped posting node status.")
                })
        })
        .await,
        "n1 conditions Unknown: {:?}",
        nodes.get("n1").await.unwrap().status
    );
    assert!(
        eventually(WAIT, || async {
            taint(&nodes.get("n1").await.unwrap(), UNREACHABLE).is_some()
        })
        .await,
        "n1 gets the unreachable NoExecute taint"
    );
    let n2 = nodes.get("n2").await.unwrap();
    assert!(
        taint(&n2, UNREACHABLE).is_none() && taint(&n2, NOT_READY).is_none(),
        "renewing n2 stays untainted"
    );
    assert!(
        eventually(WAIT, || has_event(
            &events,
            "n1",
            "NodeNotReady",
            "Node n1 status is now: NodeNotReady"
        ))
        .await,
        "NodeNotReady event on n1"
    );

    // Pods: the one with 0 s goes at once, the 2 s one two seconds after
    // the taint, the one tolerating forever stays but is not ready.
    assert!(eventually(WAIT, || terminating(&pods, "evict-now")).await);
    assert!(
        eventually(WAIT, || has_event(
            &events,
            "evict-now",
            "TaintManagerEviction",
            "Marking for deletion Pod default/evict-now"
        ))
        .await,
        "TaintManagerEviction event"
    );
    assert!(eventually(WAIT, || terminating(&pods, "tolerates-2s")).await);
    let added = taint(&nodes.get("n1").await.unwrap(), UNREACHABLE)
        .unwrap()
        .time_added
        .clone()
        .unwrap()
        .0;
    let p = pods.get("tolerates-2s").await.unwrap();
    // deletionTimestamp = time of the delete + the 30 s grace period.
    let deleted_at = p.metadata.deletion_timestamp.unwrap().0 - jiff::SignedDuration::from_secs(30);
    assert!(
        deleted_at >= added + jiff::SignedDuration::from_secs(2),
        "evicted at {deleted_at}, before taint time {added} + 2s"
    );
    assert!(
        eventually(WAIT, || async {
            let p = pods.get("tolerates-forever").await.unwrap();
            p.status
                .unwrap()
                .conditions
                .unwrap()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "False")
        })
        .await,
        "pods on the unreachable node are marked not ready"
    );
    assert!(!terminating(&pods, "tolerates-forever").await);

    // Any NoExecute taint evicts what does not tolerate it: an admin's too.
    let t =
        json!({"spec": {"taints": [{"key": "example.com/maintenance", "effect": "NoExecute"}]}});
    nodes
        .patch("n2", &PatchParams::default(), &Patch::Merge(&t))
        .await
        .unwrap();
    assert!(eventually(WAIT, || terminating(&pods, "n2-plain")).await);
    assert!(!terminating(&pods, "n2-tolerant").await);

    // The controller restarts (state is all in the API), then n1's agent
    // comes back: the taint goes.
    let _ = stop.send(());
    let _stop = start_controllers(&server).await;
    let _n1_agent = keep_renewing(leases.clone(), "n1");
    post_status(&nodes, "n1", "True").await;
    assert!(
        eventually(WAIT, || async {
            taint(&nodes.get("n1").await.unwrap(), UNREACHABLE).is_none()
        })
        .await,
        "recovered n1 untainted"
    );
    let n1 = nodes.get("n1").await.unwrap();
    let ready = n1.status.unwrap().conditions.unwrap();
    assert!(ready
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True"));

    // A live agent saying NotReady: the not-ready taint, removed on Ready.
    post_status(&nodes, "n2", "False").await;
    assert!(
        eventually(WAIT, || async {
            let n = nodes.get("n2").await.unwrap();
            taint(&n, NOT_READY).is_some() && taint(&n, "example.com/maintenance").is_some()
        })
        .await,
        "not-ready taint beside the admin's"
    );
    post_status(&nodes, "n2", "True").await;
    assert!(
        eventually(WAIT, || async {
            let n = nodes.get("n2").await.unwrap();
            taint(&n, NOT_READY).is_none() && taint(&n, "example.com/maintenance").is_some()
        })
        .await,
        "not-ready taint removed, the admin's kept"
    );
}

fn no_schedule_keys(node: &Node) -> Vec<String> {
    let mut keys: Vec<String> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter(|t| t.effect == "NoSchedule")
        .map(|t| t.key.clone())
        .collect();
    keys.sort();
    keys
}

/// TaintNodesByCondition: the agent only reports DiskPressure; the
/// controller adds and removes the NoSchedule taint the scheduler heeds,
/// and the cordon's, beside an admin's taint it leaves alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pressure_conditions_and_cordon_become_no_schedule_taints() {
    const DISK: &str = "node.kubernetes.io/disk-pressure";
    const CORDON: &str = "node.kubernetes.io/unschedulable";
    let server = TestServer::start().await;
    let admin = server.client().await;
    let nodes: Api<Node> = Api::all(admin.clone());
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-node-lease");
    create_node(&nodes, &leases, "p1").await;
    let _agent = keep_renewing(leases.clone(), "p1");
    let t = json!({"spec": {"taints": [{"key": "example.com/dedicated", "effect": "NoSchedule"}]}});
    nodes
        .patch("p1", &PatchParams::default(), &Patch::Merge(&t))
        .await
        .unwrap();
    let _stop = start_controllers(&server).await;

    let disk = |pressure: &str| {
        let mut st = status("True");
        for c in st["conditions"].as_array_mut().unwrap() {
            if c["type"] == "DiskPressure" {
                c["status"] = json!(pressure);
            }
        }
        json!({"status": st})
    };
    let keys = || async { no_schedule_keys(&nodes.get("p1").await.unwrap()) };
    nodes
        .patch_status("p1", &PatchParams::default(), &Patch::Merge(&disk("True")))
        .await
        .unwrap();
    assert!(
        eventually(WAIT, || async {
            keys().await == vec!["example.com/dedicated".to_string(), DISK.into()]
        })
        .await,
        "disk-pressure NoSchedule taint added: {:?}",
        keys().await
    );
    let n = nodes.get("p1").await.unwrap();
    let added = n.spec.unwrap().taints.unwrap();
    let added = added.iter().find(|t| t.key == DISK).unwrap();
    assert!(
        added.time_added.is_none() && added.value.is_none(),
        "as upstream: {added:?}"
    );

    // Cordon while under pressure: both taints, in one or more patches.
    let cordon = json!({"spec": {"unschedulable": true}});
    nodes
        .patch("p1", &PatchParams::default(), &Patch::Merge(&cordon))
        .await
        .unwrap();
    assert!(
        eventually(WAIT, || async {
            keys().await
                == vec![
                    "example.com/dedicated".to_string(),
                    DISK.into(),
                    CORDON.into(),
                ]
        })
        .await,
        "unschedulable taint added: {:?}",
        keys().await
    );

    // Pressure over and uncordoned: both go, the admin's stays.
    nodes
        .patch_status("p1", &PatchParams::default(), &Patch::Merge(&disk("False")))
        .await
        .unwrap();
    let uncordon = json!({"spec": {"unschedulable": false}});
    nodes
        .patch("p1", &PatchParams::default(), &Patch::Merge(&uncordon))
        .await
        .unwrap();
    assert!(
        eventually(WAIT, || async {
            keys().await == vec!["example.com/dedicated".to_string()]
        })
        .await,
        "condition taints removed: {:?}",
        keys().await
    );
    let n = nodes.get("p1").await.unwrap();
    assert!(
        n.spec
            .unwrap()
            .taints
            .unwrap()
            .iter()
            .all(|t| t.effect == "NoSchedule"),
        "a Ready node gets no NoExecute taint"
    );
}
