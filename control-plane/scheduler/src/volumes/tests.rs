//! The volume checks and decisions against hand-built caches; the
//! messages are upstream's, checked word for word.

use super::*;
use crate::filter;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{json, Value};

fn merge(a: &mut Value, b: Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

fn with(mut base: Value, extra: Value) -> Value {
    merge(&mut base, extra);
    base
}

fn node(name: &str) -> NodeInfo {
    let mut n = NodeInfo::new(name);
    n.set_node(
        serde_json::from_value::<Node>(json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "zone": format!("z-{name}")}},
            "status": {"allocatable": {"cpu": "2", "memory": "4Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap(),
    );
    n
}

/// A pod named `name` (uid `uid-NAME`) with one volume per entry:
/// `("vol", json!({"persistentVolumeClaim": {...}}))` and the like.
fn pod(name: &str, volumes: &[(&str, Value)]) -> PodInfo {
    let volumes: Vec<Value> = volumes
        .iter()
        .map(|(n, src)| with(json!({ "name": n }), src.clone()))
        .collect();
    PodInfo::new(
        serde_json::from_value::<Pod>(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
            "spec": {"containers": [{"name": "c", "image": "i"}], "volumes": volumes}
        }))
        .unwrap(),
    )
}

fn pvc_volume(claim: &str) -> Value {
    json!({"persistentVolumeClaim": {"claimName": claim}})
}

fn ephemeral_volume() -> Value {
    json!({"ephemeral": {"volumeClaimTemplate": {"spec": {}}}})
}

fn claim(name: &str, class: Option<&str>, extra: Value) -> Change<PersistentVolumeClaim> {
    let base = json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"), "resourceVersion": "1"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
                 "resources": {"requests": {"storage": "1Gi"}}},
        "status": {"phase": "Pending"}
    });
    Change::Applied(Arc::new(serde_json::from_value(with(base, extra)).unwrap()))
}

fn bound_claim(name: &str, pv: &str) -> Change<PersistentVolumeClaim> {
    claim(
        name,
        Some("manual"),
        json!({"spec": {"volumeName": pv}, "status": {"phase": "Bound"}}),
    )
}

/// A PV of `size` with nodeAffinity to `nodes` (none: any node).
fn volume(
    name: &str,
    class: &str,
    size: &str,
    nodes: &[&str],
    extra: Value,
) -> Change<PersistentVolume> {
    let mut base = json!({
        "metadata": {"name": name, "resourceVersion": "1"},
        "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"],
                 "storageClassName": class, "local": {"path": "/data"}},
        "status": {"phase": "Available"}
    });
    if !nodes.is_empty() {
        base["spec"]["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}]}]}});
    }
    Change::Applied(Arc::new(serde_json::from_value(with(base, extra)).unwrap()))
}

fn class(name: &str, provisioner: &str, mode: &str, extra: Value) -> Change<StorageClass> {
    let base = json!({
        "metadata": {"name": name, "resourceVersion": "1"},
        "provisioner": provisioner, "volumeBindingMode": mode
    });
    Change::Applied(Arc::new(serde_json::from_value(with(base, extra)).unwrap()))
}

/// Listed caches with the `local-path` (WFFC, built-in provisioner),
/// `static` (WFFC, no provisioner) and `fast` (Immediate) classes.
fn volumes() -> Volumes {
    let mut v = Volumes::default();
    for c in [Change::Relisting, Change::Listed] {
        v.claim_changed(c.clone());
    }
    for c in [Change::Relisting, Change::Listed] {
        v.volume_changed(c.clone());
    }
    for c in [
        Change::Relisting,
        class(
            "local-path",
            "skiff.io/local-path",
            "WaitForFirstConsumer",
            json!({}),
        ),
        class("static", NO_PROVISIONER, "WaitForFirstConsumer", json!({})),
        class("manual", NO_PROVISIONER, "WaitForFirstConsumer", json!({})),
        class("fast", "example.com/csi", "Immediate", json!({})),
        Change::Listed,
    ] {
        v.class_changed(c);
    }
    assert!(v.synced());
    v
}

fn prefilter(v: &Volumes, p: &PodInfo) -> Result<PodVolumes, String> {
    v.prefilter(p, &Cache::default())
}

#[test]
fn whole_pod_failures_use_upstreams_messages() {
    let mut v = volumes();
    let p = pod("web", &[("data", pvc_volume("x"))]);
    assert_eq!(
        prefilter(&v, &p).unwrap_err(),
        r#"persistentvolumeclaim "x" not found"#
    );

    let eph = pod("web", &[("scratch", ephemeral_volume())]);
    assert_eq!(
        prefilter(&v, &eph).unwrap_err(),
        r#"waiting for ephemeral volume controller to create the persistentvolumeclaim "web-scratch""#
    );
    // The claim exists but another pod owns it.
    v.claim_changed(claim(
        "web-scratch",
        Some("local-path"),
        json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Pod",
            "name": "web", "uid": "someone-else", "controller": true}]}}),
    ));
    assert_eq!(
        prefilter(&v, &eph).unwrap_err(),
        "PVC ns/web-scratch was not created for pod ns/web (pod is not owner)"
    );
    v.claim_changed(claim(
        "web-scratch",
        Some("local-path"),
        json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Pod",
            "name": "web", "uid": "uid-web", "controller": true}]}}),
    ));
    assert!(prefilter(&v, &eph).is_ok());

    v.claim_changed(claim(
        "x",
        Some("local-path"),
        json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}),
    ));
    assert_eq!(
        prefilter(&v, &p).unwrap_err(),
        r#"persistentvolumeclaim "x" is being deleted"#
    );
    v.claim_changed(claim(
        "x",
        Some("local-path"),
        json!({"spec": {"volumeName": "gone"}, "status": {"phase": "Lost"}}),
    ));
    assert_eq!(
        prefilter(&v, &p).unwrap_err(),
        r#"persistentvolumeclaim "x" bound to non-existent persistentvolume "gone""#
    );
}

#[test]
fn unbound_claims_of_immediate_or_unknown_classes_wait_for_the_pv_controller() {
    let mut v = volumes();
    let p = pod("web", &[("data", pvc_volume("x"))]);
    for c in [None, Some(""), Some("fast"), Some("no-such-class")] {
        v.claim_changed(claim("x", c, json!({})));
        assert_eq!(
            prefilter(&v, &p).unwrap_err(),
            "pod has unbound immediate PersistentVolumeClaims",
            "class {c:?}"
        );
    }
    // Naming its volume makes even a WaitForFirstConsumer claim the PV
    // controller's to bind.
    v.claim_changed(claim(
        "x",
        Some("local-path"),
        json!({"spec": {"volumeName": "pv-1"}}),
    ));
    assert_eq!(
        prefilter(&v, &p).unwrap_err(),
        "pod has unbound immediate PersistentVolumeClaims"
    );
    v.claim_changed(claim("x", Some("local-path"), json!({})));
    assert!(prefilter(&v, &p).is_ok());
}

#[test]
fn missing_persistent_claims_are_reported_before_ephemeral_ones() {
    // VolumeRestrictions runs first and reads only persistentVolumeClaim
    // volumes, whatever the volume order.
    let v = volumes();
    let p = pod(
        "web",
        &[("scratch", ephemeral_volume()), ("data", pvc_volume("x"))],
    );
    assert_eq!(
        prefilter(&v, &p).unwrap_err(),
        r#"persistentvolumeclaim "x" not found"#
    );
}

#[test]
fn bound_volumes_pin_the_pod_to_their_nodes() {
    let mut v = volumes();
    v.claim_changed(bound_claim("x", "pv-b"));
    v.volume_changed(volume("pv-b", "manual", "1Gi", &["b"], json!({})));
    let p = pod("web", &[("data", pvc_volume("x"))]);
    let pv = prefilter(&v, &p).unwrap();
    let conflict = pv.check(&node("a")).unwrap_err();
    assert!(conflict.node_affinity && !conflict.bind && !conflict.missing_volume);
    let plan = pv.check(&node("b")).unwrap();
    assert!(plan.is_empty(), "nothing to write for bound claims");

    // The claim says bound but its volume is not there.
    v.claim_changed(bound_claim("x", "pv-gone"));
    let pv = prefilter(&v, &p).unwrap();
    let conflict = pv.check(&node("b")).unwrap_err();
    assert!(conflict.missing_volume && !conflict.node_affinity);
}

#[test]
fn wait_for_first_consumer_claims_take_the_smallest_free_pv_on_the_node() {
    let mut v = volumes();
    v.claim_changed(claim("small", Some("static"), json!({})));
    v.claim_changed(claim(
        "big",
        Some("static"),
        json!({"spec": {"resources": {"requests": {"storage": "3Gi"}}}}),
    ));
    for c in [
        volume("a-5g", "static", "5Gi", &["a"], json!({})),
        volume("a-1g", "static", "1Gi", &["a"], json!({})),
        volume("a-3g", "static", "3Gi", &["a"], json!({})),
        volume("b-5g", "static", "5Gi", &["b"], json!({})),
        volume("other-class", "fast", "1Gi", &["a"], json!({})),
        volume(
            "taken",
            "static",
            "1Gi",
            &["a"],
            json!({"spec": {"claimRef": {"namespace": "ns", "name": "z", "uid": "z"}}}),
        ),
    ] {
        v.volume_changed(c);
    }
    // "big" comes first in volume order, but the smaller claim picks
    // first: it gets the 1Gi volume, "big" the 3Gi one.
    let p = pod(
        "web",
        &[("b", pvc_volume("big")), ("s", pvc_volume("small"))],
    );
    let pv = prefilter(&v, &p).unwrap();
    let plan = pv.check(&node("a")).unwrap();
    let picked: Vec<(&str, &str)> = plan
        .bindings
        .iter()
        .map(|(c, v)| {
            (
                c.metadata.name.as_deref().unwrap(),
                v.metadata.name.as_deref().unwrap(),
            )
        })
        .collect();
    assert_eq!(picked, [("small", "a-1g"), ("big", "a-3g")]);
    assert!(plan.provisions.is_empty());
    // Node b has one volume for two claims and the class provisions
    // nothing: no.
    assert_eq!(
        pv.check(&node("b")).unwrap_err(),
        Conflicts {
            bind: true,
            ..Conflicts::default()
        }
    );
}

#[test]
fn claims_without_a_volume_are_provisioned_where_the_class_can() {
    let mut v = volumes();
    v.claim_changed(claim("x", Some("local-path"), json!({})));
    v.volume_changed(volume("pv-a", "local-path", "1Gi", &["a"], json!({})));
    let p = pod("web", &[("data", pvc_volume("x"))]);
    let pv = prefilter(&v, &p).unwrap();
    // On a: the free static volume; on b: provisioned.
    let on_a = pv.check(&node("a")).unwrap();
    assert_eq!(on_a.bindings.len(), 1);
    assert!(on_a.provisions.is_empty());
    let on_b = pv.check(&node("b")).unwrap();
    assert!(on_b.bindings.is_empty());
    assert_eq!(on_b.provisions[0].metadata.name.as_deref(), Some("x"));

    // Already provisioning on a: only a will do, from now on.
    v.claim_changed(claim(
        "x",
        Some("local-path"),
        json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": "a"}}}),
    ));
    let pv = prefilter(&v, &p).unwrap();
    assert!(pv.check(&node("b")).unwrap_err().bind);
    let on_a = pv.check(&node("a")).unwrap();
    assert!(on_a.bindings.is_empty() && on_a.provisions.len() == 1);

    // A class's allowedTopologies limit where it provisions.
    v.class_changed(class(
        "local-path",
        "skiff.io/local-path",
        "WaitForFirstConsumer",
        json!({"allowedTopologies": [{"matchLabelExpressions": [{"key": "zone", "values": ["z-b"]}]}]}),
    ));
    v.claim_changed(claim("x", Some("local-path"), json!({})));
    v.volume_changed(Change::Deleted(Arc::new(
        serde_json::from_value(json!({"metadata": {"name": "pv-a"}})).unwrap(),
    )));
    let pv = prefilter(&v, &p).unwrap();
    assert!(pv.check(&node("a")).unwrap_err().bind);
    assert!(pv.check(&node("b")).is_ok());
}

#[test]
fn a_prebound_volume_is_the_only_one_its_claim_may_get() {
    let mut v = volumes();
    v.claim_changed(claim("x", Some("static"), json!({})));
    v.volume_changed(volume(
        "mine",
        "static",
        "1Gi",
        &["a"],
        json!({"spec": {"claimRef": {"namespace": "ns", "name": "x"}}, "status": {"phase": "Available"}}),
    ));
    v.volume_changed(volume("free-b", "static", "1Gi", &["b"], json!({})));
    let p = pod("web", &[("data", pvc_volume("x"))]);
    let pv = prefilter(&v, &p).unwrap();
    assert!(pv.check(&node("b")).unwrap_err().bind);
    let mut plan = pv.check(&node("a")).unwrap();
    assert_eq!(plan.bindings[0].1.metadata.name.as_deref(), Some("mine"));
    // Pre-bound by a user: the write completes the reference with the
    // uid, and does not claim the controller did it.
    v.assume(&mut plan);
    let written = &plan.bindings[0].1;
    let r = written.spec.as_ref().unwrap().claim_ref.as_ref().unwrap();
    assert_eq!(r.uid.as_deref(), Some("uid-x"));
    assert!(written.metadata.annotations.is_none());
}

#[test]
fn assumed_decisions_are_seen_by_the_next_pod_until_the_watch_catches_up() {
    let mut v = volumes();
    v.claim_changed(claim("x", Some("static"), json!({})));
    v.claim_changed(claim("y", Some("static"), json!({})));
    v.volume_changed(volume("pv-a", "static", "1Gi", &["a"], json!({})));
    let first = pod("first", &[("data", pvc_volume("x"))]);
    let second = pod("second", &[("data", pvc_volume("y"))]);
    let mut plan = prefilter(&v, &first).unwrap().check(&node("a")).unwrap();
    v.assume(&mut plan);
    let (_, written) = &plan.bindings[0];
    let spec = written.spec.as_ref().unwrap();
    let r = spec.claim_ref.as_ref().unwrap();
    assert_eq!(
        (
            r.kind.as_deref(),
            r.api_version.as_deref(),
            r.namespace.as_deref(),
            r.name.as_deref(),
            r.uid.as_deref()
        ),
        (
            Some("PersistentVolumeClaim"),
            Some("v1"),
            Some("ns"),
            Some("x"),
            Some("uid-x")
        )
    );
    assert_eq!(
        storage::annotation(
            &written.metadata.annotations,
            storage::BOUND_BY_CONTROLLER_ANNOTATION
        ),
        Some("yes")
    );
    // The PV is taken for x: y finds nothing on a.
    assert!(
        prefilter(&v, &second)
            .unwrap()
            .check(&node("a"))
            .unwrap_err()
            .bind
    );
    // A re-list replaying the old version keeps the assumption...
    v.volume_changed(volume("pv-a", "static", "1Gi", &["a"], json!({})));
    assert!(prefilter(&v, &second).unwrap().check(&node("a")).is_err());
    // ...and a failed write restores what the watch shows.
    v.restore(&plan);
    assert!(prefilter(&v, &second).unwrap().check(&node("a")).is_ok());

    // Assumed again, then the watch shows a newer version: it wins.
    let mut plan = prefilter(&v, &first).unwrap().check(&node("a")).unwrap();
    v.assume(&mut plan);
    v.volume_changed(volume(
        "pv-a",
        "static",
        "1Gi",
        &["a"],
        json!({"metadata": {"resourceVersion": "2"}}),
    ));
    assert!(prefilter(&v, &second).unwrap().check(&node("a")).is_ok());
}

#[test]
fn provisioning_decisions_are_assumed_and_not_rewritten() {
    let mut v = volumes();
    v.claim_changed(claim("x", Some("local-path"), json!({})));
    let p = pod("web", &[("data", pvc_volume("x"))]);
    let mut plan = prefilter(&v, &p).unwrap().check(&node("b")).unwrap();
    v.assume(&mut plan);
    assert_eq!(plan.provisions.len(), 1);
    assert_eq!(
        storage::annotation(
            &plan.provisions[0].metadata.annotations,
            SELECTED_NODE_ANNOTATION
        ),
        Some("b")
    );
    // Another pod sharing the claim now only fits b, and writes nothing.
    let other = pod("other", &[("data", pvc_volume("x"))]);
    let pv = prefilter(&v, &other).unwrap();
    assert!(pv.check(&node("a")).is_err());
    let mut again = pv.check(&node("b")).unwrap();
    v.assume(&mut again);
    assert!(again.is_empty());
}

#[test]
fn read_write_once_pod_claims_in_use_fail_every_node() {
    let mut v = volumes();
    v.claim_changed(claim(
        "x",
        Some("local-path"),
        json!({"spec": {"accessModes": ["ReadWriteOncePod"]}}),
    ));
    let p = pod("web", &[("data", pvc_volume("x"))]);
    let mut cache = Cache::default();
    let pv = v.prefilter(&p, &cache).unwrap();
    assert!(!pv.rwop_conflict);
    let user = Arc::new(pod("user", &[("data", pvc_volume("x"))]));
    cache.set_bound(user, "a");
    let pv = v.prefilter(&p, &cache).unwrap();
    assert!(pv.rwop_conflict);
    let nodes = [node("a"), node("b")];
    assert_eq!(
        filter::fit_error(&p, Some(&pv), &filter::Topology::NONE, nodes.iter()),
        "0/2 nodes are available: 2 node has pod using PersistentVolumeClaim \
         with the same name and ReadWriteOncePod access mode."
    );
    cache.remove_pod("uid-user");
    assert!(!v.prefilter(&p, &cache).unwrap().rwop_conflict);
}

#[test]
fn volume_reasons_join_the_others_in_the_message() {
    let mut v = volumes();
    v.claim_changed(bound_claim("x", "pv-c"));
    v.volume_changed(volume("pv-c", "manual", "1Gi", &["c"], json!({})));
    let p = PodInfo::new(
        serde_json::from_value::<Pod>(json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "uid-web"},
            "spec": {"containers": [{"name": "c", "image": "i",
                        "resources": {"requests": {"cpu": "1"}}}],
                     "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "x"}}]}
        }))
        .unwrap(),
    );
    let mut full = node("a");
    full.add_pod(&pod_requesting("2"));
    let nodes = [full, node("b"), node("d"), node("c")];
    let pv = prefilter(&v, &p).unwrap();
    // Resources are checked before volumes: a full node reports only
    // that, as upstream stops at the first failing filter.
    assert_eq!(
        filter::fit_error(&p, Some(&pv), &filter::Topology::NONE, nodes[..3].iter()),
        "0/3 nodes are available: 1 Insufficient cpu, 2 node(s) had volume node affinity conflict."
    );
    assert!(filter::fits(
        &p,
        Some(&pv),
        &filter::Topology::NONE,
        &nodes[3]
    ));
    assert_eq!(
        filter::prefilter_error(4, "pod has unbound immediate PersistentVolumeClaims"),
        "0/4 nodes are available: pod has unbound immediate PersistentVolumeClaims."
    );
    assert_eq!(
        filter::prefilter_error(0, "whatever"),
        "no nodes available to schedule pods"
    );
}

fn pod_requesting(cpu: &str) -> PodInfo {
    PodInfo::new(
        serde_json::from_value::<Pod>(json!({
            "metadata": {"name": "hog", "namespace": "ns", "uid": "hog"},
            "spec": {"containers": [{"name": "c", "image": "i",
                        "resources": {"requests": {"cpu": cpu}}}]}
        }))
        .unwrap(),
    )
}

#[test]
fn relists_drop_what_is_gone_and_report_sync() {
    let mut v = Volumes::default();
    assert!(!v.synced());
    v.claim_changed(Change::Relisting);
    v.claim_changed(claim("x", Some("local-path"), json!({})));
    assert!(v.claim_changed(Change::Listed), "a completed list may help");
    assert!(v.claim("ns", "x").is_some());
    // Unchanged versions are no news.
    assert!(!v.claim_changed(claim("x", Some("local-path"), json!({}))));
    v.claim_changed(Change::Relisting);
    v.claim_changed(Change::Listed);
    assert!(v.claim("ns", "x").is_none());
    assert!(!v.synced(), "volumes and classes not listed yet");
}
