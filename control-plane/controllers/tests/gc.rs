//! Garbage collector against a real API server, driven with real kubectl:
//! `kubectl delete --cascade=background|foreground|orphan`, dangling and
//! shared owners, and collection of what was orphaned while it was down.

use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use skiff_control_plane::testkit::{eventually, ok, TestServer};
use skiff_controllers::Config;
use tokio::sync::oneshot;

const WAIT: Duration = Duration::from_secs(20);

async fn start_gc(server: &TestServer) -> oneshot::Sender<()> {
    let client = server
        .client_for("system:kube-controller-manager", &[])
        .await;
    let cfg = Config {
        controllers: vec!["garbagecollector".into()],
        ..Config::default()
    };
    let (tx, rx) = oneshot::channel::<()>();
    tokio::spawn(skiff_controllers::run(client, cfg, async {
        let _ = rx.await;
    }));
    tx
}

/// A second owner of a dependent: the API allows one controller reference
/// per object, as upstream's ValidateObjectMeta does.
fn plain_owner_ref<K: Resource<DynamicType = ()>>(owner: &K) -> OwnerReference {
    OwnerReference {
        controller: None,
        ..owner_ref(owner)
    }
}

fn owner_ref<K: Resource<DynamicType = ()>>(owner: &K) -> OwnerReference {
    OwnerReference {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        name: owner.name_any(),
        uid: owner.uid().unwrap(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

fn template(app: &str) -> serde_json::Value {
    json!({
        "selector": {"matchLabels": {"app": app}},
        "template": {
            "metadata": {"labels": {"app": app}},
            "spec": {"containers": [{"name": "c", "image": "busybox:1"}]},
        },
    })
}

async fn create_rs(api: &Api<ReplicaSet>, name: &str, owner: Option<OwnerReference>) -> ReplicaSet {
    let mut spec = template(name);
    spec["replicas"] = json!(2);
    let mut rs: ReplicaSet =
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap();
    rs.metadata.owner_references = owner.map(|o| vec![o]);
    api.create(&PostParams::default(), &rs).await.unwrap()
}

/// A pod owned by `owners`; bound to a node (so its deletion is graceful
/// and waits for the node) when `node` is set.
async fn create_pod(api: &Api<Pod>, name: &str, owners: Vec<OwnerReference>, node: Option<&str>) {
    let mut spec = json!({"containers": [{"name": "c", "image": "busybox:1"}]});
    if let Some(n) = node {
        spec["nodeName"] = json!(n);
    }
    let mut pod: Pod =
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap();
    pod.metadata.owner_references = Some(owners);
    api.create(&PostParams::default(), &pod).await.unwrap();
}

async fn gone<K>(api: &Api<K>, name: &str) -> bool
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug + Resource,
{
    eventually(WAIT, || async {
        api.get_opt(name).await.unwrap().is_none()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_deletion_and_dangling_owners() {
    let server = TestServer::start().await;
    let admin = server.client().await;
    let rss: Api<ReplicaSet> = Api::namespaced(admin.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "default");
    let stop = start_gc(&server).await;

    // kubectl delete (background by default): the owner goes at once, the
    // collector takes its dependents.
    let rs = create_rs(&rss, "bg", None).await;
    create_pod(&pods, "bg-1", vec![owner_ref(&rs)], None).await;
    create_pod(&pods, "bg-2", vec![owner_ref(&rs)], None).await;
    // A pod with a second, live owner only loses the reference.
    let keeper = create_rs(&rss, "keeper", None).await;
    create_pod(
        &pods,
        "shared",
        vec![owner_ref(&rs), plain_owner_ref(&keeper)],
        None,
    )
    .await;
    ok(server.kubectl(&["delete", "replicaset", "bg", "--cascade=background"]));
    assert!(
        gone(&pods, "bg-1").await && gone(&pods, "bg-2").await,
        "dependents collected"
    );
    assert!(
        eventually(WAIT, || async {
            let p = pods.get("shared").await.unwrap();
            p.owner_references().len() == 1 && p.owner_references()[0].name == "keeper"
        })
        .await,
        "shared pod keeps its live owner only"
    );

    // An owner that never existed (a uid nobody has): collected too, after
    // a live check (the graph alone cannot tell a late owner from none).
    let ghost = OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: "ghost".into(),
        uid: "00000000-0000-0000-0000-000000000000".into(),
        controller: None,
        block_owner_deletion: None,
    };
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "orphan-of-ghost"}})).unwrap();
    let mut cm = cm;
    cm.metadata.owner_references = Some(vec![ghost]);
    cms.create(&PostParams::default(), &cm).await.unwrap();
    assert!(
        gone(&cms, "orphan-of-ghost").await,
        "dangling dependent collected"
    );
    // An owner created in the same breath as its dependent is no ghost.
    let parent: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "parent"}})).unwrap();
    let parent = cms.create(&PostParams::default(), &parent).await.unwrap();
    let mut child: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "child"}})).unwrap();
    child.metadata.owner_references = Some(vec![owner_ref(&parent)]);
    cms.create(&PostParams::default(), &child).await.unwrap();

    // Owners deleted while the collector is down are caught up on.
    let _ = stop.send(());
    let rs = create_rs(&rss, "while-down", None).await;
    create_pod(&pods, "while-down-1", vec![owner_ref(&rs)], None).await;
    rss.delete("while-down", &DeleteParams::background())
        .await
        .unwrap();
    let _stop = start_gc(&server).await;
    assert!(
        gone(&pods, "while-down-1").await,
        "collected after a restart"
    );
    assert!(
        cms.get_opt("child").await.unwrap().is_some(),
        "child of a live owner kept"
    );
    ok(server.kubectl(&["delete", "configmap", "parent"]));
    assert!(gone(&cms, "child").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreground_deletion_waits_for_blocking_dependents() {
    let server = TestServer::start().await;
    let admin = server.client().await;
    let deploys: Api<Deployment> = Api::namespaced(admin.clone(), "default");
    let rss: Api<ReplicaSet> = Api::namespaced(admin.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let _stop = start_gc(&server).await;

    let d: Deployment =
        serde_json::from_value(json!({"metadata": {"name": "fg"}, "spec": template("fg")}))
            .unwrap();
    let d = deploys.create(&PostParams::default(), &d).await.unwrap();
    let rs = create_rs(&rss, "fg-rs", Some(owner_ref(&d))).await;
    create_pod(&pods, "fg-pending", vec![owner_ref(&rs)], None).await;
    create_pod(&pods, "fg-running", vec![owner_ref(&rs)], Some("node-1")).await;

    ok(server.kubectl(&[
        "delete",
        "deployment",
        "fg",
        "--cascade=foreground",
        "--wait=false",
    ]));
    // The chain is deleted from the bottom: the running pod terminates on
    // its node, and everything above it waits.
    assert!(gone(&pods, "fg-pending").await);
    assert!(
        eventually(WAIT, || async {
            let p = pods.get("fg-running").await.unwrap();
            let rs = rss.get("fg-rs").await.unwrap();
            p.metadata.deletion_timestamp.is_some()
                && rs.metadata.deletion_timestamp.is_some()
                && rs.finalizers().iter().any(|f| f == "foregroundDeletion")
        })
        .await,
        "pod terminating, replicaset waiting in the foreground too"
    );
    let d = deploys.get("fg").await.unwrap();
    assert!(d.metadata.deletion_timestamp.is_some());
    assert_eq!(d.finalizers(), &["foregroundDeletion".to_string()]);

    // The node finishes the pod: the replicaset, then the deployment go.
    pods.delete("fg-running", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    assert!(gone(&rss, "fg-rs").await, "replicaset released");
    assert!(gone(&deploys, "fg").await, "deployment released");

    // kubectl's own wait: it returns once the foreground deletion is done.
    let rs = create_rs(&rss, "fg2", None).await;
    create_pod(&pods, "fg2-1", vec![owner_ref(&rs)], None).await;
    ok(server.kubectl(&[
        "delete",
        "replicaset",
        "fg2",
        "--cascade=foreground",
        "--timeout=20s",
    ]));
    assert!(pods.get_opt("fg2-1").await.unwrap().is_none());
    assert!(rss.get_opt("fg2").await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphan_deletion_keeps_dependents_without_the_owner() {
    let server = TestServer::start().await;
    let admin = server.client().await;
    let rss: Api<ReplicaSet> = Api::namespaced(admin.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let _stop = start_gc(&server).await;

    let rs = create_rs(&rss, "or", None).await;
    let other = create_rs(&rss, "other", None).await;
    create_pod(&pods, "or-1", vec![owner_ref(&rs)], None).await;
    create_pod(
        &pods,
        "or-2",
        vec![owner_ref(&rs), plain_owner_ref(&other)],
        None,
    )
    .await;
    ok(server.kubectl(&[
        "delete",
        "replicaset",
        "or",
        "--cascade=orphan",
        "--timeout=20s",
    ]));
    assert!(rss.get_opt("or").await.unwrap().is_none());
    let p1 = pods.get("or-1").await.unwrap();
    assert!(
        p1.owner_references().is_empty(),
        "{:?}",
        p1.owner_references()
    );
    let p2 = pods.get("or-2").await.unwrap();
    let names: Vec<&str> = p2
        .owner_references()
        .iter()
        .map(|o| o.name.as_str())
        .collect();
    assert_eq!(names, vec!["other"]);
    // Orphans stay orphans: nothing collects them later.
    ok(server.kubectl(&[
        "delete",
        "replicaset",
        "other",
        "--cascade=orphan",
        "--timeout=20s",
    ]));
    assert!(pods.get_opt("or-1").await.unwrap().is_some());
    assert!(pods.get_opt("or-2").await.unwrap().is_some());
}

/// Custom kinds defined after the collector started are collected in both
/// directions once discovery finds them (upstream's 30 s resync).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_resources_are_owners_and_dependents() {
    let server = TestServer::start().await;
    let _stop = start_gc(&server).await;
    ok(server.kubectl_stdin(
        &["apply", "-f", "-"],
        r#"{"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "gizmos.gc.example.com"},
            "spec": {"group": "gc.example.com", "scope": "Namespaced",
                "names": {"plural": "gizmos", "kind": "Gizmo"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object",
                        "x-kubernetes-preserve-unknown-fields": true}}}]}}"#,
    ));
    ok(server.kubectl(&[
        "wait",
        "--for=condition=Established",
        "crd/gizmos.gc.example.com",
        "--timeout=20s",
    ]));
    let client = server.client().await;
    let res = kube::api::ApiResource {
        group: "gc.example.com".into(),
        version: "v1".into(),
        api_version: "gc.example.com/v1".into(),
        kind: "Gizmo".into(),
        plural: "gizmos".into(),
    };
    let gizmos: Api<kube::api::DynamicObject> =
        Api::namespaced_with(client.clone(), "default", &res);
    let maps: Api<ConfigMap> = Api::namespaced(client, "default");
    let gizmo = |name: &str, owner: Option<OwnerReference>| {
        let mut o: kube::api::DynamicObject = serde_json::from_value(
            json!({"apiVersion": "gc.example.com/v1", "kind": "Gizmo", "metadata": {"name": name}}),
        )
        .unwrap();
        o.metadata.owner_references = owner.map(|o| vec![o]);
        o
    };
    let owner = gizmos
        .create(&PostParams::default(), &gizmo("owner", None))
        .await
        .unwrap();
    let mut dep: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "dep"}})).unwrap();
    dep.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "gc.example.com/v1".into(),
        kind: "Gizmo".into(),
        name: "owner".into(),
        uid: owner.uid().unwrap(),
        controller: Some(true),
        block_owner_deletion: None,
    }]);
    maps.create(&PostParams::default(), &dep).await.unwrap();
    let parent: ConfigMap = maps
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "parent"}})).unwrap(),
        )
        .await
        .unwrap();
    gizmos
        .create(
            &PostParams::default(),
            &gizmo("child", Some(plain_owner_ref(&parent))),
        )
        .await
        .unwrap();

    gizmos
        .delete("owner", &DeleteParams::default())
        .await
        .unwrap();
    maps.delete("parent", &DeleteParams::default())
        .await
        .unwrap();
    let within = Duration::from_secs(90);
    assert!(
        eventually(within, || gone(&maps, "dep")).await,
        "the Gizmo's dependent stayed"
    );
    assert!(
        eventually(within, || gone(&gizmos, "child")).await,
        "the ConfigMap's Gizmo stayed"
    );
}
