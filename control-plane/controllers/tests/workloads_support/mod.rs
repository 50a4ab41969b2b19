//! What the workload controller tests share: a test API server with the
//! chosen controllers running in-process under their own identity, and a
//! stand-in for the node agent that moves pods through their phases by
//! writing pod status, as the kubelet would.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::{Api, ResourceExt};
use serde_json::json;
use skiff_control_plane::testkit::{eventually, TestServer};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub struct Env {
    pub server: TestServer,
    /// Admin client (plays the user and the node agents).
    pub client: kube::Client,
    stop: Option<oneshot::Sender<()>>,
    manager: Option<JoinHandle<()>>,
}

impl Env {
    /// A fresh server with `controllers` running.
    pub async fn start(controllers: &[&str]) -> Env {
        let server = TestServer::start().await;
        let client = server.client().await;
        let mut env = Env {
            server,
            client,
            stop: None,
            manager: None,
        };
        env.start_controllers(controllers).await;
        env
    }

    /// Start the controller manager (as `system:kube-controller-manager`).
    pub async fn start_controllers(&mut self, controllers: &[&str]) {
        let c = self
            .server
            .client_for("system:kube-controller-manager", &[])
            .await;
        let config = skiff_controllers::Config {
            controllers: controllers.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        let (tx, rx) = oneshot::channel();
        self.stop = Some(tx);
        self.manager = Some(tokio::spawn(skiff_controllers::run(c, config, async {
            let _ = rx.await;
        })));
    }

    /// What one controller run by hand (`run_with` a test clock or
    /// period) gets: the controller manager's identity and informers.
    pub async fn controller_ctx(&self) -> skiff_controllers::Ctx {
        let client = self
            .server
            .client_for("system:kube-controller-manager", &[])
            .await;
        skiff_controllers::Ctx {
            informers: kube_util::Factory::new(client.clone()),
            client,
            config: std::sync::Arc::new(skiff_controllers::Config::default()),
        }
    }

    /// Stop the controller manager and wait until it has.
    pub async fn stop_controllers(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(h) = self.manager.take() {
            let _ = h.await;
        }
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::default_namespaced(self.client.clone())
    }

    /// kubectl (as admin); panics with its stderr on failure.
    pub fn kubectl(&self, args: &[&str]) -> String {
        skiff_control_plane::testkit::ok(self.server.kubectl(args))
    }

    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> String {
        skiff_control_plane::testkit::ok(self.server.kubectl_stdin(args, stdin))
    }

    /// Pods in `default` with `selector`, sorted by name.
    pub async fn list_pods(&self, selector: &str) -> Vec<Pod> {
        let mut v = self
            .pods()
            .list(&ListParams::default().labels(selector))
            .await
            .expect("list pods")
            .items;
        v.sort_by_key(|p| p.name_any());
        v
    }

    /// Active pods (not terminating, not finished) with `selector`.
    pub async fn active_pods(&self, selector: &str) -> Vec<Pod> {
        self.list_pods(selector)
            .await
            .into_iter()
            .filter(|p| {
                p.metadata.deletion_timestamp.is_none()
                    && !matches!(
                        p.status.as_ref().and_then(|s| s.phase.as_deref()),
                        Some("Succeeded" | "Failed")
                    )
            })
            .collect()
    }

    /// The first container's image of each active pod `selector` selects,
    /// in list order: which template a rollout left the pods on.
    pub async fn active_images(&self, selector: &str) -> Vec<String> {
        self.active_pods(selector)
            .await
            .iter()
            .map(|p| {
                p.spec.as_ref().unwrap().containers[0]
                    .image
                    .clone()
                    .unwrap_or_default()
            })
            .collect()
    }

    /// As the agent: the pod runs, Ready (or not).
    pub async fn set_running(&self, name: &str, ready: bool) {
        self.try_set_running(name, ready)
            .await
            .unwrap_or_else(|e| panic!("setting pod {name} running: {e}"));
    }

    async fn try_set_running(&self, name: &str, ready: bool) -> Result<Pod, kube::Error> {
        let now = jiff::Timestamp::now()
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        let st = if ready { "True" } else { "False" };
        let patch = json!({"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": st, "lastTransitionTime": now},
            {"type": "ContainersReady", "status": st, "lastTransitionTime": now},
        ]}});
        self.pods()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
    }

    /// As the agent: the pod ended in `phase` (Succeeded or Failed).
    pub async fn set_finished(&self, name: &str, phase: &str) {
        let patch = json!({"status": {"phase": phase, "conditions": [
            {"type": "Ready", "status": "False"},
        ]}});
        self.pods()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap_or_else(|e| panic!("setting pod {name} {phase}: {e}"));
    }

    /// As the scheduler: bind pod `name` to `node`.
    pub async fn bind(&self, name: &str, node: &str) {
        let body = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}});
        self.pods()
            .create_subresource::<_, serde_json::Value>(
                "binding",
                name,
                &PostParams::default(),
                &body,
            )
            .await
            .unwrap_or_else(|e| panic!("binding pod {name} to {node}: {e}"));
    }

    /// As the agent: finish the deletion of a terminating pod.
    pub async fn force_delete(&self, name: &str) {
        let dp = kube::api::DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        };
        let _ = self.pods().delete(name, &dp).await;
    }

    /// Call `moment` with the live pods (not being deleted) matching
    /// `selector` at every moment the pod watch shows a complete store,
    /// until the returned task is aborted: what a rollout test asserts
    /// about every state the cluster passed through.
    pub fn watch_pods(
        &self,
        selector: &str,
        mut moment: impl FnMut(&[Arc<Pod>]) + Send + 'static,
    ) -> JoinHandle<()> {
        let (store, writer) = reflector::store::<Pod>();
        let api: Api<Pod> = Api::default_namespaced(self.client.clone());
        let config = watcher::Config::default().labels(selector);
        tokio::spawn(async move {
            let mut events = std::pin::pin!(watcher(api, config).default_backoff().reflect(writer));
            while let Some(ev) = events.next().await {
                // Only a complete store is a moment of the cluster.
                if !matches!(
                    ev,
                    Ok(watcher::Event::Apply(_)
                        | watcher::Event::Delete(_)
                        | watcher::Event::InitDone)
                ) {
                    continue;
                }
                let live: Vec<Arc<Pod>> = store
                    .state()
                    .into_iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .collect();
                moment(&live);
            }
        })
    }

    /// Make every active pod with `selector` Running and Ready.
    pub async fn all_ready(&self, selector: &str) {
        for p in self.active_pods(selector).await {
            if is_ready(&p) {
                continue;
            }
            // A rollout may delete a pod between the list and the patch.
            match self.try_set_running(&p.name_any(), true).await {
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                r => {
                    r.unwrap_or_else(|e| panic!("setting pod {} running: {e}", p.name_any()));
                }
            }
        }
    }

    /// Register a node (as its agent would) with `labels` and `taints`.
    pub async fn add_node(&self, name: &str, labels: &[(&str, &str)], taints: serde_json::Value) {
        let labels: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .chain([("kubernetes.io/hostname".to_string(), name.to_string())])
            .collect();
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels},
            "spec": {"taints": taints},
        }))
        .expect("node json");
        Api::<Node>::all(self.client.clone())
            .create(&PostParams::default(), &node)
            .await
            .unwrap_or_else(|e| panic!("creating node {name}: {e}"));
    }

    /// Event notes (core/v1 `message`) with `reason`.
    pub async fn events(&self, reason: &str) -> Vec<String> {
        let evs: Api<k8s_openapi::api::core::v1::Event> =
            Api::default_namespaced(self.client.clone());
        evs.list(&ListParams::default())
            .await
            .expect("list events")
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .filter_map(|e| e.message)
            .collect()
    }
}

impl Env {
    /// Wait for an event with `reason` and `note` (events are written after
    /// the action they report, so a test can see the action first).
    pub async fn wait_event(&self, reason: &str, note: &str) {
        until(&format!("a {reason} event \"{note}\""), 10, || async {
            let notes = self.events(reason).await;
            notes
                .iter()
                .any(|n| n == note)
                .then_some(())
                .ok_or(format!("{notes:?}"))
        })
        .await;
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

pub fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// Wait up to `secs` for `f`, failing the test with `what` (and the last
/// state `f` describes) when it never holds.
pub async fn until<F, Fut>(what: &str, secs: u64, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let last = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let ok = eventually(Duration::from_secs(secs), || {
        let fut = f();
        let last = last.clone();
        async move {
            match fut.await {
                Ok(()) => true,
                Err(s) => {
                    *last.lock().unwrap() = s;
                    false
                }
            }
        }
    })
    .await;
    let last = last.lock().unwrap().clone();
    assert!(ok, "timed out waiting for {what}; last seen: {last}");
}

/// The cronjob controller alone, on its own informers and a test clock,
/// so a test can stop it and start it again (a controller restart).
pub struct CronJobController(JoinHandle<()>);

impl CronJobController {
    pub async fn start(env: &Env, clock: skiff_controllers::cronjob::Clock) -> Self {
        let ctx = env.controller_ctx().await;
        CronJobController(tokio::spawn(async move {
            if let Err(e) = skiff_controllers::cronjob::run_with(ctx, clock).await {
                panic!("cronjob controller: {e}");
            }
        }))
    }

    pub async fn stop(self) {
        self.0.abort();
        let _ = self.0.await;
    }
}
