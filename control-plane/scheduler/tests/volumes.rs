//! Volume-aware scheduling against a real (in-process) API server: bound
//! local volumes pin their pods, WaitForFirstConsumer claims get a node
//! (a static PV's claimRef, or the selected-node annotation), a missing
//! claim says so and is waited for. No PV controller runs here: the
//! tests bind claims by hand where they need them bound, and check the
//! scheduler's own writes.

use crate::support;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{json, Value};
use support::{poll, Cluster, WITHIN};

const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";

fn claims(c: &Cluster) -> Api<PersistentVolumeClaim> {
    Api::namespaced(c.admin.clone(), "default")
}

fn volumes(c: &Cluster) -> Api<PersistentVolume> {
    Api::all(c.admin.clone())
}

/// A StorageClass, unless one of that name exists (the server makes
/// `local-path` itself).
async fn class(c: &Cluster, name: &str, provisioner: &str, mode: &str) {
    let api: Api<StorageClass> = Api::all(c.admin.clone());
    let sc: StorageClass = serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": name},
        "provisioner": provisioner, "volumeBindingMode": mode, "reclaimPolicy": "Delete"
    }))
    .expect("class json");
    match api.create(&PostParams::default(), &sc).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("create class {name}: {e}"),
    }
}

async fn claim(c: &Cluster, name: &str, class: &str, extra: Value) -> PersistentVolumeClaim {
    let mut v = json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
                 "resources": {"requests": {"storage": "1Gi"}}}
    });
    support::merge(&mut v, extra);
    let pvc: PersistentVolumeClaim = serde_json::from_value(v).expect("claim json");
    claims(c)
        .create(&PostParams::default(), &pvc)
        .await
        .expect("create claim")
}

/// A local PV of 1Gi whose nodeAffinity allows only `node`.
async fn local_volume(c: &Cluster, name: &str, class: &str, node: &str, extra: Value) {
    let mut v = json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "persistentVolumeReclaimPolicy": "Retain", "storageClassName": class,
                 "local": {"path": format!("/mnt/{name}")},
                 "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                     {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}}
    });
    support::merge(&mut v, extra);
    let pv: PersistentVolume = serde_json::from_value(v).expect("pv json");
    volumes(c)
        .create(&PostParams::default(), &pv)
        .await
        .expect("create pv");
}

fn with_claim(claim: &str) -> Value {
    json!({"spec": {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]}})
}

#[tokio::test]
async fn a_bound_local_volume_pins_its_pods_to_its_node() {
    let mut c = Cluster::start().await;
    c.node("a", json!({})).await;
    c.node("b", json!({})).await;
    class(&c, "manual", "kubernetes.io/no-provisioner", "Immediate").await;
    // Bound as the PV controller would leave it.
    let pvc = claim(
        &c,
        "data",
        "manual",
        json!({"spec": {"volumeName": "pv-b"}}),
    )
    .await;
    local_volume(
        &c,
        "pv-b",
        "manual",
        "b",
        json!({"spec": {"claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "namespace": "default", "name": "data", "uid": pvc.metadata.uid}}}),
    )
    .await;
    let bound = json!({"status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"],
        "capacity": {"storage": "1Gi"}}});
    claims(&c)
        .patch_status("data", &PatchParams::default(), &Patch::Merge(&bound))
        .await
        .expect("claim status");
    volumes(&c)
        .patch_status(
            "pv-b",
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"phase": "Bound"}})),
        )
        .await
        .expect("pv status");
    c.start_scheduler().await;
    // Three pods, each free to land on either node but for the volume:
    // all on b.
    for i in 0..3 {
        c.pod("default", &format!("user-{i}"), "100m", with_claim("data"))
            .await;
    }
    for i in 0..3 {
        assert_eq!(c.bound("default", &format!("user-{i}")).await, "b");
    }

    // b cordoned: nowhere to go, and the message says why for each node.
    c.nodes()
        .patch(
            "b",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"unschedulable": true}})),
        )
        .await
        .expect("cordon b");
    c.pod("default", "late", "100m", with_claim("data")).await;
    assert_eq!(
        c.event_note("default", "late", "FailedScheduling").await,
        "0/2 nodes are available: 1 node(s) had volume node affinity conflict, \
         1 node(s) were unschedulable. \
         preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling.."
    );
    c.stop_scheduler().await;
}

#[tokio::test]
async fn a_wait_for_first_consumer_claim_is_provisioned_where_its_pod_goes() {
    let mut c = Cluster::start().await;
    c.node("a", json!({})).await;
    c.node("b", json!({})).await;
    class(
        &c,
        "local-path",
        "skiff.io/local-path",
        "WaitForFirstConsumer",
    )
    .await;
    claim(&c, "scratch", "local-path", json!({})).await;
    c.start_scheduler().await;
    c.pod("default", "web", "100m", with_claim("scratch")).await;
    let node = c.bound("default", "web").await;
    let selected = poll(WITHIN, || async {
        let pvc = claims(&c).get("scratch").await.ok()?;
        pvc.metadata.annotations?.get(SELECTED_NODE).cloned()
    })
    .await
    .expect("the claim names its node");
    assert_eq!(selected, node);
    c.stop_scheduler().await;
}

#[tokio::test]
async fn a_static_wait_for_first_consumer_volume_takes_its_pod_to_its_node() {
    let mut c = Cluster::start().await;
    c.node("a", json!({})).await;
    c.node("b", json!({})).await;
    class(
        &c,
        "local-static",
        "kubernetes.io/no-provisioner",
        "WaitForFirstConsumer",
    )
    .await;
    local_volume(&c, "pv-a", "local-static", "a", json!({})).await;
    let pvc = claim(&c, "db", "local-static", json!({})).await;
    c.start_scheduler().await;
    c.pod("default", "db-0", "100m", with_claim("db")).await;
    assert_eq!(c.bound("default", "db-0").await, "a");
    let pv = volumes(&c).get("pv-a").await.expect("pv-a");
    let r = pv.spec.and_then(|s| s.claim_ref).expect("claimRef set");
    assert_eq!(
        (
            r.kind.as_deref(),
            r.api_version.as_deref(),
            r.namespace.as_deref(),
            r.name.as_deref(),
            r.uid
        ),
        (
            Some("PersistentVolumeClaim"),
            Some("v1"),
            Some("default"),
            Some("db"),
            pvc.metadata.uid
        )
    );
    // The claim itself is left for the PV controller.
    let pvc = claims(&c).get("db").await.expect("claim");
    let annotations = pvc.metadata.annotations.unwrap_or_default();
    assert!(!annotations.contains_key(SELECTED_NODE));

    // A second claim of the class finds no other volume, and nothing
    // provisions it.
    claim(&c, "db2", "local-static", json!({})).await;
    c.pod("default", "db-1", "100m", with_claim("db2")).await;
    assert_eq!(
        c.event_note("default", "db-1", "FailedScheduling").await,
        "0/2 nodes are available: 2 node(s) didn't find available persistent volumes to bind. preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling.."
    );
    c.stop_scheduler().await;
}

#[tokio::test]
async fn a_missing_claim_is_reported_then_waited_for() {
    let mut c = Cluster::start().await;
    c.node("a", json!({})).await;
    c.node("b", json!({})).await;
    class(
        &c,
        "local-path",
        "skiff.io/local-path",
        "WaitForFirstConsumer",
    )
    .await;
    c.start_scheduler().await;
    c.pod("default", "web", "100m", with_claim("x")).await;
    let expected = r#"0/2 nodes are available: persistentvolumeclaim "x" not found."#;
    assert_eq!(
        c.event_note("default", "web", "FailedScheduling").await,
        expected
    );
    let (reason, message) = c.unschedulable_condition("default", "web").await;
    assert_eq!(
        (reason.as_str(), message.as_str()),
        ("Unschedulable", expected)
    );
    // The claim's creation brings the pod back without waiting out the
    // unschedulable timeout.
    claim(&c, "x", "local-path", json!({})).await;
    c.bound("default", "web").await;
    c.stop_scheduler().await;
}
