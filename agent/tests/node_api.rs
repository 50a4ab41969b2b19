//! The node side of joining the API, against a real skiff-server (in
//! process) with the node's own identity (`system:node:n1` in
//! `system:nodes`), so the Node authorizer and NodeRestriction apply as in
//! production. The container runtime is a fake behind `RuntimeProbe`: no
//! containerd is needed to test registration, status, Lease and events.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, NodeCondition, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::Api;
use skiff_agent::events::{api_recorder, Recorder, NORMAL};
use skiff_agent::network::CONFLIST_FILE;
use skiff_agent::node::{Facts, NodeAgent, RuntimeHealth, RuntimeProbe, AGENT_VERSION};
use skiff_agent::Config;
use skiff_control_plane::testkit::{eventually, ok, TestServer};
use tokio::sync::oneshot;

const NODE: &str = "n1";
const RUNTIME: &str = "containerd://1.6.20";
const WAIT: Duration = Duration::from_secs(15);
const NETWORK_DOWN: &str = "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized";

/// A runtime whose health the test sets.
#[derive(Clone)]
struct FakeRuntime(Arc<Mutex<RuntimeHealth>>);

impl FakeRuntime {
    fn new(errors: &[&str]) -> FakeRuntime {
        let f = FakeRuntime(Arc::new(Mutex::new(RuntimeHealth::default())));
        f.set(errors);
        f
    }

    fn set(&self, errors: &[&str]) {
        *self.0.lock().unwrap() = RuntimeHealth {
            version: RUNTIME.into(),
            errors: errors.iter().map(|e| e.to_string()).collect(),
        };
    }
}

impl RuntimeProbe for FakeRuntime {
    fn probe(&self) -> BoxFuture<'_, RuntimeHealth> {
        let h = self.0.lock().unwrap().clone();
        Box::pin(async move { h })
    }
}

/// A running NodeAgent; dropping `stop` stops it.
struct Running {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    pod_cidr: tokio::sync::watch::Receiver<Option<String>>,
    _root: tempfile::TempDir,
    conf_dir: std::path::PathBuf,
}

impl Running {
    async fn stop(mut self) {
        let _ = self.stop.take().map(|s| s.send(()));
        tokio::time::timeout(WAIT, &mut self.task)
            .await
            .expect("node agent stops on shutdown")
            .expect("node agent task");
    }
}

fn config(root: &std::path::Path) -> Config {
    Config {
        node_name: NODE.into(),
        root_dir: root.join("root"),
        node_labels: BTreeMap::from([("example.com/pool".into(), "test".into())]),
        node_status_update_frequency: Duration::from_millis(200),
        node_status_report_frequency: Duration::from_secs(1),
        node_lease_duration_seconds: 2,
        cni_conf_dir: Some(root.join("net.d")),
        cni_bridge: "skiff-t0".into(),
        // These agents run in the host's network namespace: its routes,
        // masquerade table and ip_forward are not theirs to change.
        pod_routes: false,
        ..Default::default()
    }
}

async fn start(
    server: &TestServer,
    runtime: &FakeRuntime,
    tweak: impl FnOnce(&mut Config),
) -> Running {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let root = tempfile::tempdir().unwrap();
    let mut cfg = config(root.path());
    tweak(&mut cfg);
    let conf_dir = cfg.cni_conf_dir.clone().unwrap();
    let client = server
        .client_for(&format!("system:node:{NODE}"), &["system:nodes"])
        .await;
    let facts = Arc::new(Facts::gather(root.path(), cfg.max_pods));
    let recorder = api_recorder(client.clone(), NODE);
    let agent = NodeAgent::new(
        client,
        Arc::new(cfg),
        facts,
        Arc::new(runtime.clone()),
        Some(recorder),
    );
    let pod_cidr = agent.pod_cidr();
    let (tx, rx) = oneshot::channel();
    let task = tokio::spawn(agent.run(async {
        let _ = rx.await;
    }));
    Running {
        stop: Some(tx),
        task,
        pod_cidr,
        _root: root,
        conf_dir,
    }
}

fn condition<'a>(node: &'a Node, type_: &str) -> Option<&'a NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

async fn get_node(api: &Api<Node>) -> Option<Node> {
    api.get_opt(NODE).await.ok().flatten()
}

/// Poll `f` until it yields a value; fail the test naming `what` after
/// [`WAIT`].
async fn until<T, Fut: std::future::Future<Output = Option<T>>>(
    what: &str,
    mut f: impl FnMut() -> Fut,
) -> T {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_node(api: &Api<Node>, what: &str, f: impl Fn(&Node) -> bool) -> Node {
    let found = until(what, || async { get_node(api).await.filter(|n| f(n)) });
    match tokio::time::timeout(WAIT + Duration::from_secs(1), found).await {
        Ok(n) => n,
        Err(_) => panic!("{what}; last seen: {:#?}", get_node(api).await),
    }
}

async fn node_events(client: &kube::Client) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(client.clone(), "default");
    api.list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| {
            e.involved_object.kind.as_deref() == Some("Node")
                && e.involved_object.name.as_deref() == Some(NODE)
        })
        .collect()
}

fn renew_time(l: &Lease) -> Option<jiff::Timestamp> {
    l.spec.as_ref()?.renew_time.as_ref().map(|t| t.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_reports_status_renews_lease_and_records_node_events() {
    let server = TestServer::start().await;
    let admin = server.client().await;
    let runtime = FakeRuntime::new(&[]);
    let agent = start(&server, &runtime, |_| {}).await;
    let nodes: Api<Node> = Api::all(admin.clone());

    let node = wait_node(&nodes, "node registers and turns Ready", |n| {
        condition(n, "Ready").is_some_and(|c| c.status == "True")
    })
    .await;
    let labels = node.metadata.labels.clone().unwrap_or_default();
    for (k, v) in [
        ("kubernetes.io/hostname", NODE),
        ("kubernetes.io/os", "linux"),
        ("example.com/pool", "test"),
    ] {
        assert_eq!(labels.get(k).map(String::as_str), Some(v), "label {k}");
    }
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    assert_eq!(
        labels.get("kubernetes.io/arch").map(String::as_str),
        Some(arch)
    );
    let status = node.status.clone().unwrap();
    let ready = condition(&node, "Ready").unwrap();
    assert_eq!(ready.reason.as_deref(), Some("KubeletReady"));
    assert_eq!(
        ready.message.as_deref(),
        Some("kubelet is posting ready status")
    );
    for (t, reason) in [
        ("MemoryPressure", "KubeletHasSufficientMemory"),
        ("DiskPressure", "KubeletHasNoDiskPressure"),
        ("PIDPressure", "KubeletHasSufficientPID"),
    ] {
        let c = condition(&node, t).unwrap_or_else(|| panic!("condition {t}"));
        assert_eq!(
            (c.status.as_str(), c.reason.as_deref()),
            ("False", Some(reason))
        );
    }
    let info = status.node_info.unwrap();
    assert_eq!(info.kubelet_version, AGENT_VERSION);
    assert_eq!(info.container_runtime_version, RUNTIME);
    assert_eq!(info.operating_system, "linux");
    assert_eq!(status.capacity.unwrap()["pods"].0, "110");
    assert!(status.allocatable.unwrap().contains_key("memory"));
    assert!(status
        .addresses
        .unwrap()
        .iter()
        .any(|a| a.type_ == "Hostname"));

    // Real kubectl sees a Ready node with our version.
    let out = ok(server.kubectl(&["get", "nodes", "--no-headers"]));
    assert!(
        out.contains(NODE) && out.contains(" Ready ") && out.contains(AGENT_VERSION),
        "{out}"
    );

    // The Lease: held by the node, owned by the Node, renewed.
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-node-lease");
    let uid = node.metadata.uid.clone().unwrap();
    let first = until("lease held by the node, owned by the Node", || {
        let leases = leases.clone();
        let uid = uid.clone();
        async move {
            let l = leases.get_opt(NODE).await.ok().flatten()?;
            let spec = l.spec.clone().unwrap_or_default();
            let owned = l
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.kind == "Node" && o.uid == uid);
            let ok = spec.holder_identity.as_deref() == Some(NODE)
                && spec.lease_duration_seconds == Some(2)
                && owned;
            if ok {
                renew_time(&l)
            } else {
                None
            }
        }
    })
    .await;
    assert!(
        eventually(WAIT, || {
            let leases = leases.clone();
            async move {
                let Ok(Some(l)) = leases.get_opt(NODE).await else {
                    return false;
                };
                renew_time(&l).is_some_and(|t| t > first)
            }
        })
        .await,
        "lease renewed"
    );

    // Heartbeats go on while the transition time stays put.
    let ready_since = ready.last_transition_time.clone();
    let beat = ready.last_heartbeat_time.clone().unwrap().0;
    let later = wait_node(&nodes, "status reported again", |n| {
        condition(n, "Ready")
            .and_then(|c| c.last_heartbeat_time.as_ref())
            .is_some_and(|t| t.0 > beat)
    })
    .await;
    assert_eq!(
        condition(&later, "Ready").unwrap().last_transition_time,
        ready_since
    );

    // Node events from the kubelet on this host.
    let events = until(
        "node events Starting, NodeReady, NodeHasSufficientMemory",
        || {
            let admin = admin.clone();
            async move {
                let events = node_events(&admin).await;
                ["Starting", "NodeReady", "NodeHasSufficientMemory"]
                    .iter()
                    .all(|r| events.iter().any(|e| e.reason.as_deref() == Some(r)))
                    .then_some(events)
            }
        },
    )
    .await;
    let ready_ev = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("NodeReady"))
        .unwrap();
    assert_eq!(
        ready_ev.message.as_deref(),
        Some("Node n1 status is now: NodeReady")
    );
    let src = ready_ev.source.clone().unwrap();
    assert_eq!(src.component.as_deref(), Some("kubelet"));
    assert_eq!(src.host.as_deref(), Some(NODE));
    assert_eq!(ready_ev.reporting_component.as_deref(), Some("kubelet"));

    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_ready_while_the_runtime_network_is_down() {
    let server = TestServer::start().await;
    let admin = server.client().await;
    let runtime = FakeRuntime::new(&[NETWORK_DOWN]);
    let agent = start(&server, &runtime, |_| {}).await;
    let nodes: Api<Node> = Api::all(admin.clone());

    let node = wait_node(
        &nodes,
        "node reports NotReady with the runtime's reason",
        |n| {
            condition(n, "Ready").is_some_and(|c| {
                c.status == "False"
                    && c.reason.as_deref() == Some("KubeletNotReady")
                    && c.message.as_deref() == Some(NETWORK_DOWN)
            })
        },
    )
    .await;
    let not_ready_since = condition(&node, "Ready")
        .unwrap()
        .last_transition_time
        .clone()
        .expect("transition time set");
    // Times are stored to the second: let the NotReady state outlive the
    // second it began in (heartbeats go on meanwhile, transition stays).
    let still = wait_node(&nodes, "a later NotReady heartbeat", |n| {
        condition(n, "Ready").is_some_and(|c| {
            c.last_heartbeat_time
                .as_ref()
                .is_some_and(|t| t.0 > not_ready_since.0)
        })
    })
    .await;
    let c = condition(&still, "Ready").unwrap();
    assert_eq!(c.status, "False");
    assert_eq!(c.last_transition_time.as_ref(), Some(&not_ready_since));

    runtime.set(&[]);
    let node = wait_node(&nodes, "node turns Ready once the network is", |n| {
        condition(n, "Ready").is_some_and(|c| c.status == "True")
    })
    .await;
    let ready = condition(&node, "Ready").unwrap();
    assert!(
        ready
            .last_transition_time
            .as_ref()
            .is_some_and(|t| t.0 > not_ready_since.0),
        "Ready moved its transition time"
    );
    assert_eq!(ready.reason.as_deref(), Some("KubeletReady"));
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopts_an_existing_node_and_writes_cni_config_for_its_pod_cidr() {
    let server = TestServer::start().await;
    let admin = server.client().await;
    let nodes: Api<Node> = Api::all(admin.clone());
    // Pre-created (by an operator, or a previous run) with a stale label
    // and the pod CIDR the control plane's IPAM would assign.
    let pre: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": NODE, "labels": {"kubernetes.io/os": "plan9", "keep": "me"}},
        "spec": {"podCIDR": "198.18.7.0/24", "podCIDRs": ["198.18.7.0/24"]}
    }))
    .unwrap();
    let created = nodes.create(&PostParams::default(), &pre).await.unwrap();

    let runtime = FakeRuntime::new(&[]);
    let mut agent = start(&server, &runtime, |_| {}).await;
    let node = wait_node(&nodes, "labels brought up to date", |n| {
        let l = n.metadata.labels.clone().unwrap_or_default();
        l.get("kubernetes.io/os").map(String::as_str) == Some("linux")
            && l.get("example.com/pool").map(String::as_str) == Some("test")
    })
    .await;
    assert_eq!(
        node.metadata.uid, created.metadata.uid,
        "adopted, not re-created"
    );
    assert_eq!(
        node.metadata
            .labels
            .unwrap()
            .get("keep")
            .map(String::as_str),
        Some("me"),
        "labels the agent does not own are left alone"
    );

    let cidr = tokio::time::timeout(WAIT, agent.pod_cidr.wait_for(|c| c.is_some()))
        .await
        .expect("pod CIDR published")
        .unwrap()
        .clone();
    assert_eq!(cidr.as_deref(), Some("198.18.7.0/24"));
    let path = agent.conf_dir.join(CONFLIST_FILE);
    assert!(
        eventually(WAIT, || {
            let path = path.clone();
            async move { path.exists() }
        })
        .await,
        "CNI configuration written to {}",
        path.display()
    );
    let conf: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(conf["name"], "skiff-t0");
    let bridge = &conf["plugins"][0];
    assert_eq!(bridge["type"], "bridge");
    assert_eq!(bridge["bridge"], "skiff-t0");
    let range = &bridge["ipam"]["ranges"][0][0];
    assert_eq!(range["subnet"], "198.18.7.0/24");
    assert_eq!(range["gateway"], "198.18.7.1");
    assert!(bridge["ipam"]["dataDir"]
        .as_str()
        .unwrap()
        .ends_with("root/cni/networks"));
    assert_eq!(conf["plugins"][1]["type"], "portmap");
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_pod_cidr_is_registered_and_used() {
    let server = TestServer::start().await;
    let admin = server.client().await;
    let runtime = FakeRuntime::new(&[]);
    let mut agent = start(&server, &runtime, |c| {
        c.pod_cidr = Some("198.18.9.0/24".into())
    })
    .await;
    // Known at once, before the API is even asked.
    assert_eq!(
        agent.pod_cidr.borrow_and_update().as_deref(),
        Some("198.18.9.0/24")
    );
    let nodes: Api<Node> = Api::all(admin.clone());
    let node = wait_node(&nodes, "node registered", |_| true).await;
    assert_eq!(
        node.spec.and_then(|s| s.pod_cidr).as_deref(),
        Some("198.18.9.0/24")
    );
    let path = agent.conf_dir.join(CONFLIST_FILE);
    assert!(
        eventually(WAIT, || {
            let path = path.clone();
            async move { std::fs::read_to_string(&path).is_ok_and(|t| t.contains("198.18.9.1")) }
        })
        .await
    );
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_a_pod_cidr_assigned_after_registration() {
    let server = TestServer::start().await;
    let admin = server.client().await;
    let runtime = FakeRuntime::new(&[]);
    let mut agent = start(&server, &runtime, |_| {}).await;
    let nodes: Api<Node> = Api::all(admin.clone());
    wait_node(&nodes, "node registered", |_| true).await;
    assert_eq!(*agent.pod_cidr.borrow_and_update(), None);
    // The control plane's IPAM assigns the CIDR after registration.
    let p =
        serde_json::json!({"spec": {"podCIDR": "198.18.11.0/24", "podCIDRs": ["198.18.11.0/24"]}});
    nodes
        .patch(NODE, &PatchParams::default(), &Patch::Merge(&p))
        .await
        .unwrap();
    let cidr = tokio::time::timeout(WAIT, agent.pod_cidr.wait_for(|c| c.is_some()))
        .await
        .expect("pod CIDR followed from the Node")
        .unwrap()
        .clone();
    assert_eq!(cidr.as_deref(), Some("198.18.11.0/24"));
    let path = agent.conf_dir.join(CONFLIST_FILE);
    until("CNI configuration for the assigned CIDR", || {
        let path = path.clone();
        async move {
            std::fs::read_to_string(&path)
                .ok()
                .filter(|t| t.contains("198.18.11.1"))
        }
    })
    .await;
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survives_an_api_restart_and_a_deleted_node() {
    let mut server = TestServer::start().await;
    let runtime = FakeRuntime::new(&[]);
    let agent = start(&server, &runtime, |_| {}).await;
    let admin = server.client().await;
    let nodes: Api<Node> = Api::all(admin.clone());
    let node = wait_node(&nodes, "node Ready", |n| {
        condition(n, "Ready").is_some_and(|c| c.status == "True")
    })
    .await;

    // The API goes away and comes back on the same address and data.
    server.stop().await;
    let stopped_at = jiff::Timestamp::now();
    // Long enough for several lease renewals and status reports to fail.
    tokio::time::sleep(Duration::from_secs(2)).await;
    server.restart().await;
    let admin = server.client().await;
    let nodes: Api<Node> = Api::all(admin.clone());
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-node-lease");
    assert!(
        eventually(WAIT, || {
            let leases = leases.clone();
            async move {
                let Ok(Some(l)) = leases.get_opt(NODE).await else {
                    return false;
                };
                renew_time(&l).is_some_and(|t| t > stopped_at)
            }
        })
        .await,
        "lease renewed after the outage"
    );
    wait_node(&nodes, "status reported after the outage", |n| {
        condition(n, "Ready")
            .and_then(|c| c.last_heartbeat_time.as_ref())
            .is_some_and(|t| t.0 > stopped_at)
    })
    .await;

    // An operator deletes the Node: the agent registers it again.
    nodes.delete(NODE, &DeleteParams::default()).await.unwrap();
    let again = wait_node(&nodes, "node registered again", |n| {
        n.metadata.uid != node.metadata.uid
            && condition(n, "Ready").is_some_and(|c| c.status == "True")
    })
    .await;
    // And the Lease follows the new Node as its owner.
    let uid = again.metadata.uid.clone().unwrap();
    assert!(
        eventually(WAIT, || {
            let leases = leases.clone();
            let uid = uid.clone();
            async move {
                leases.get_opt(NODE).await.ok().flatten().is_some_and(|l| {
                    l.metadata
                        .owner_references
                        .iter()
                        .flatten()
                        .any(|o| o.uid == uid)
                })
            }
        })
        .await,
        "lease owned by the re-created Node"
    );
    agent.stop().await;
}

fn pod(name: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        },
        ..Default::default()
    }
}

async fn pod_events(client: &kube::Client, pod: &str) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(client.clone(), "default");
    api.list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(pod))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_events_are_aggregated_and_rate_limited_per_object() {
    let server = TestServer::start().await;
    let admin = server.client().await;
    let client = server
        .client_for(&format!("system:node:{NODE}"), &["system:nodes"])
        .await;
    let recorder = api_recorder(client, NODE);

    // The same event three times: one Event with count 3.
    let p = pod("web");
    for _ in 0..3 {
        recorder.event(
            &p,
            NORMAL,
            "Pulled",
            "Container image \"busybox\" already present on machine",
        );
    }
    recorder.event(&p, NORMAL, "Created", "Created container: app");
    // The writer is one ordered queue: once the last one is stored, the
    // others have been handled.
    let events = until("pod events written", || {
        let admin = admin.clone();
        async move {
            let events = pod_events(&admin, "web").await;
            events
                .iter()
                .any(|e| e.reason.as_deref() == Some("Created"))
                .then_some(events)
        }
    })
    .await;
    let pulled: Vec<_> = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some("Pulled"))
        .collect();
    assert_eq!(pulled.len(), 1, "repeats fold into one Event: {events:#?}");
    assert_eq!(pulled[0].count, Some(3));
    assert!(pulled[0].last_timestamp >= pulled[0].first_timestamp);
    let o = &pulled[0].involved_object;
    assert_eq!(
        (o.kind.as_deref(), o.uid.as_deref(), o.namespace.as_deref()),
        (Some("Pod"), Some("uid-web"), Some("default"))
    );
    assert_eq!(
        pulled[0].source.as_ref().and_then(|s| s.host.as_deref()),
        Some(NODE)
    );

    // A flood about one object: the first 25 get through, the rest are
    // dropped; another object is not affected.
    let noisy = pod("noisy");
    for i in 0..40 {
        recorder.event(
            &noisy,
            NORMAL,
            "Started",
            &format!("Started container c{i}"),
        );
    }
    let quiet = pod("quiet");
    recorder.event(&quiet, NORMAL, "Started", "Started container app");
    assert!(
        eventually(WAIT, || {
            let admin = admin.clone();
            async move { !pod_events(&admin, "quiet").await.is_empty() }
        })
        .await,
        "another object's event written"
    );
    assert_eq!(pod_events(&admin, "noisy").await.len(), 25);

    // kubectl shows them with the kubelet as the source.
    let out = ok(server.kubectl(&[
        "get",
        "events",
        "-n",
        "default",
        "--field-selector",
        "involvedObject.name=web",
    ]));
    assert!(
        out.contains("Pulled") && out.contains("already present on machine"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_patches_are_skipped_when_nothing_changed() {
    // A long report interval: only a change may cause a patch.
    let server = TestServer::start().await;
    let admin = server.client().await;
    let runtime = FakeRuntime::new(&[]);
    let agent = start(&server, &runtime, |c| {
        c.node_status_report_frequency = Duration::from_secs(3600)
    })
    .await;
    let nodes: Api<Node> = Api::all(admin.clone());
    let node = wait_node(&nodes, "node Ready", |n| {
        condition(n, "Ready").is_some_and(|c| c.status == "True")
    })
    .await;
    let beat = condition(&node, "Ready")
        .unwrap()
        .last_heartbeat_time
        .clone();
    // A change elsewhere in the Node moves its resourceVersion; our own
    // status must not move for ten update periods.
    let p = serde_json::json!({"metadata": {"annotations": {"touched": "yes"}}});
    nodes
        .patch(NODE, &PatchParams::default(), &Patch::Merge(&p))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let now = get_node(&nodes).await.unwrap();
    assert_eq!(
        condition(&now, "Ready").unwrap().last_heartbeat_time,
        beat,
        "no status patch without a change"
    );
    // A change is reported at once, with its own heartbeat.
    runtime.set(&[NETWORK_DOWN]);
    wait_node(&nodes, "change reported", |n| {
        condition(n, "Ready").is_some_and(|c| c.status == "False")
    })
    .await;
    agent.stop().await;
}
