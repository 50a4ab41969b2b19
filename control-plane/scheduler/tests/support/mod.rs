//! Shared test helpers: an in-process API server, the scheduler running
//! as `system:kube-scheduler`, and builders for nodes and pods.

#![allow(dead_code)]

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, PostParams};
use serde_json::{json, Value};
use skiff_control_plane::testkit::TestServer;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const WITHIN: Duration = Duration::from_secs(30);

/// A server, an admin client, and the scheduler under test.
pub struct Cluster {
    pub server: TestServer,
    pub admin: kube::Client,
    scheduler: Option<(oneshot::Sender<()>, JoinHandle<()>)>,
}

impl Cluster {
    pub async fn start() -> Cluster {
        let server = TestServer::start().await;
        let admin = server.client().await;
        Cluster {
            server,
            admin,
            scheduler: None,
        }
    }

    /// Run the scheduler with its own identity.
    pub async fn start_scheduler(&mut self) {
        self.start_scheduler_with(skiff_scheduler::Config::default())
            .await;
    }

    /// Run the scheduler with its own identity and `config`.
    pub async fn start_scheduler_with(&mut self, config: skiff_scheduler::Config) {
        let client = self.server.client_for("system:kube-scheduler", &[]).await;
        let (tx, rx) = oneshot::channel();
        let task = tokio::spawn(skiff_scheduler::run(client, config, async {
            let _ = rx.await;
        }));
        self.scheduler = Some((tx, task));
    }

    pub async fn stop_scheduler(&mut self) {
        if let Some((tx, task)) = self.scheduler.take() {
            let _ = tx.send(());
            task.await.expect("scheduler task");
        }
    }

    pub fn pods(&self, ns: &str) -> Api<Pod> {
        Api::namespaced(self.admin.clone(), ns)
    }

    pub fn nodes(&self) -> Api<Node> {
        Api::all(self.admin.clone())
    }

    /// Create a node from `spec` (merged over a Ready node with 4 CPUs,
    /// 8 GiB and 110 pods).
    pub async fn node(&self, name: &str, extra: Value) -> Node {
        let mut v = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {},
            "status": {
                "capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]
            }
        });
        merge(&mut v, extra);
        let node: Node = serde_json::from_value(v.clone()).expect("node json");
        let created = self
            .nodes()
            .create(&PostParams::default(), &node)
            .await
            .expect("create node");
        // Status is the agent's to write: set it through nodes/status in
        // case the create dropped it.
        let status = json!({"status": v["status"]});
        self.nodes()
            .patch_status(name, &Default::default(), &kube::api::Patch::Merge(&status))
            .await
            .expect("node status");
        created
    }

    /// Create a pod in `ns` from `spec` (merged over one busybox
    /// container requesting `cpu`).
    pub async fn pod(&self, ns: &str, name: &str, cpu: &str, extra: Value) -> Pod {
        let mut v = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"containers": [{"name": "c", "image": "busybox",
                "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}]}
        });
        merge(&mut v, extra);
        let pod: Pod = serde_json::from_value(v).expect("pod json");
        self.pods(ns)
            .create(&PostParams::default(), &pod)
            .await
            .expect("create pod")
    }

    pub async fn node_of(&self, ns: &str, name: &str) -> Option<String> {
        let pod = self.pods(ns).get(name).await.ok()?;
        pod.spec?.node_name.filter(|n| !n.is_empty())
    }

    /// Wait until the pod is bound; its node.
    pub async fn bound(&self, ns: &str, name: &str) -> String {
        poll(WITHIN, || self.node_of(ns, name))
            .await
            .unwrap_or_else(|| panic!("pod {ns}/{name} was never bound"))
    }

    /// Events in `ns` about `pod` with `reason`.
    pub async fn events(&self, ns: &str, pod: &str, reason: &str) -> Vec<Event> {
        let api: Api<Event> = Api::namespaced(self.admin.clone(), ns);
        let list = api.list(&ListParams::default()).await.expect("list events");
        list.items
            .into_iter()
            .filter(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(pod)
            })
            .collect()
    }

    /// Wait for an event about `pod` with `reason`; its note.
    pub async fn event_note(&self, ns: &str, pod: &str, reason: &str) -> String {
        poll(WITHIN, || async {
            self.events(ns, pod, reason)
                .await
                .into_iter()
                .find_map(|e| e.note)
        })
        .await
        .unwrap_or_else(|| panic!("no {reason} event for {ns}/{pod}"))
    }

    /// Wait until the pod says PodScheduled=False; (reason, message).
    pub async fn unschedulable_condition(&self, ns: &str, name: &str) -> (String, String) {
        poll(WITHIN, || async {
            let pod = self.pods(ns).get(name).await.ok()?;
            pod.status
                .and_then(|s| s.conditions)
                .into_iter()
                .flatten()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False")
                .map(|c| (c.reason.unwrap_or_default(), c.message.unwrap_or_default()))
        })
        .await
        .unwrap_or_else(|| panic!("pod {ns}/{name} never got PodScheduled=False"))
    }
}

/// Poll `f` every 100 ms until it returns a value or `within` passes
/// (`testkit::eventually` for checks that also return what they found).
pub async fn poll<T, F, Fut>(within: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if std::time::Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Deep-merge `b` into `a` (objects merge, everything else replaces).
pub fn merge(a: &mut Value, b: Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

/// An ownerReference making `owner` the pod's controller.
pub fn owned_by(kind: &str, name: &str, uid: &str) -> Value {
    json!({"metadata": {"ownerReferences": [{
        "apiVersion": "apps/v1", "kind": kind, "name": name, "uid": uid, "controller": true
    }]}})
}
