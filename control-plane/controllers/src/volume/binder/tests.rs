use super::*;
use serde_json::{json, Value};

fn pv(name: &str, v: Value) -> Arc<PersistentVolume> {
    let mut obj = json!({
        "metadata": {"name": name},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "persistentVolumeReclaimPolicy": "Retain"},
    });
    merge(&mut obj, v);
    Arc::new(serde_json::from_value(obj).unwrap())
}

fn pvc(v: Value) -> PersistentVolumeClaim {
    let mut obj = json!({
        "metadata": {"name": "data", "namespace": "app", "uid": "c-1"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                 "resources": {"requests": {"storage": "1Gi"}}},
        "status": {"phase": "Pending"},
    });
    merge(&mut obj, v);
    serde_json::from_value(obj).unwrap()
}

fn class(provisioner: &str, mode: &str) -> StorageClass {
    serde_json::from_value(json!({
        "metadata": {"name": "fast"},
        "provisioner": provisioner,
        "volumeBindingMode": mode,
    }))
    .unwrap()
}

fn merge(base: &mut Value, patch: Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                merge(b.entry(k).or_insert(Value::Null), v);
            }
        }
        (b, p) => *b = p,
    }
}

fn bind(volume: &str, chosen: bool) -> ClaimAction {
    ClaimAction::Bind {
        volume: volume.into(),
        chosen,
    }
}

fn claim_ref(name: &str, uid: Option<&str>) -> Value {
    json!({"spec": {"claimRef": {"kind": "PersistentVolumeClaim", "namespace": "app", "name": name, "uid": uid}}})
}

#[test]
fn an_unbound_claim_binds_to_the_smallest_matching_available_volume() {
    let pvs = vec![
        pv("big", json!({"spec": {"capacity": {"storage": "10Gi"}}})),
        pv("small", json!({"spec": {"capacity": {"storage": "2Gi"}}})),
        pv("tiny", json!({"spec": {"capacity": {"storage": "512Mi"}}})),
        pv("rox", json!({"spec": {"accessModes": ["ReadOnlyMany"]}})),
        pv("other-class", json!({"spec": {"storageClassName": "fast"}})),
        pv("taken", claim_ref("someone-else", Some("x"))),
    ];
    assert_eq!(sync_claim(&pvc(json!({})), &pvs, None), bind("small", true));
}

#[test]
fn a_volume_pre_bound_to_the_claim_wins_over_a_better_fit() {
    let mine = pv("mine", {
        let mut v = claim_ref("data", None);
        merge(&mut v, json!({"spec": {"capacity": {"storage": "5Gi"}}}));
        v
    });
    let pvs = vec![pv("fit", json!({})), mine];
    assert_eq!(sync_claim(&pvc(json!({})), &pvs, None), bind("mine", false));
    // A pre-binding to an older claim of the same name does not count.
    let stale = vec![pv("old", claim_ref("data", Some("c-0")))];
    assert_eq!(
        sync_claim(&pvc(json!({})), &stale, None),
        ClaimAction::Event {
            warning: false,
            reason: "FailedBinding",
            message: "no persistent volumes available for this claim and no storage class is set"
                .into()
        }
    );
}

#[test]
fn a_claim_naming_its_volume_binds_to_it_or_says_why_not() {
    let named = pvc(json!({"spec": {"volumeName": "pv1"}}));
    assert_eq!(
        sync_claim(&named, &[pv("pv1", json!({}))], None),
        bind("pv1", true)
    );
    let too_small = pv("pv1", json!({"spec": {"capacity": {"storage": "1Mi"}}}));
    assert!(matches!(
        sync_claim(&named, &[too_small], None),
        ClaimAction::Event {
            reason: "FailedBinding",
            ..
        }
    ));
    let taken = pv("pv1", claim_ref("other", Some("o")));
    assert_eq!(
        sync_claim(&named, &[taken], None),
        ClaimAction::Event {
            warning: false,
            reason: "FailedBinding",
            message: "volume \"pv1\" already bound to a different claim.".into()
        }
    );
    // Named but not created yet: wait.
    assert_eq!(sync_claim(&named, &[], None), ClaimAction::None);
}

#[test]
fn wait_for_first_consumer_claims_wait_for_a_selected_node() {
    let c = pvc(json!({"spec": {"storageClassName": "fast"}}));
    let wffc = class(LOCAL_PATH_PROVISIONER, "WaitForFirstConsumer");
    let fits = vec![pv("fits", json!({"spec": {"storageClassName": "fast"}}))];
    assert_eq!(
        sync_claim(&c, &fits, Some(&wffc)),
        ClaimAction::Event {
            warning: false,
            reason: "WaitForFirstConsumer",
            message: "waiting for first consumer to be created before binding".into()
        }
    );
    let selected = pvc(json!({"spec": {"storageClassName": "fast"},
        "metadata": {"annotations": {SELECTED_NODE_ANNOTATION: "n1"}}}));
    assert_eq!(
        sync_claim(&selected, &[], Some(&wffc)),
        ClaimAction::Provision
    );
    // The scheduler's choice of a static volume is a pre-binding.
    let chosen = vec![pv("fits", {
        let mut v = claim_ref("data", Some("c-1"));
        merge(&mut v, json!({"spec": {"storageClassName": "fast"}}));
        v
    })];
    assert_eq!(sync_claim(&c, &chosen, Some(&wffc)), bind("fits", false));
}

#[test]
fn classes_decide_who_provisions() {
    let c = pvc(json!({"spec": {"storageClassName": "fast"}}));
    let immediate = class(LOCAL_PATH_PROVISIONER, "Immediate");
    assert_eq!(
        sync_claim(&c, &[], Some(&immediate)),
        ClaimAction::Provision
    );
    // A static volume of the class is used before provisioning.
    let fits = vec![pv("fits", json!({"spec": {"storageClassName": "fast"}}))];
    assert_eq!(sync_claim(&c, &fits, Some(&immediate)), bind("fits", true));
    let ext = class("ebs.csi.aws.com", "Immediate");
    assert_eq!(
        sync_claim(&c, &[], Some(&ext)),
        ClaimAction::External {
            provisioner: "ebs.csi.aws.com".into()
        }
    );
    assert_eq!(
        sync_claim(&c, &[], None),
        ClaimAction::Event {
            warning: true,
            reason: "ProvisioningFailed",
            message: "storageclass.storage.k8s.io \"fast\" not found".into()
        }
    );
}

#[test]
fn bound_claims_whose_volume_is_gone_or_taken_are_lost() {
    let bound = pvc(json!({"spec": {"volumeName": "pv1"}, "status": {"phase": "Bound"}}));
    assert!(matches!(
        sync_claim(&bound, &[], None),
        ClaimAction::Lost {
            reason: "ClaimLost",
            ..
        }
    ));
    let elsewhere = pv("pv1", claim_ref("other", Some("o")));
    assert!(matches!(
        sync_claim(&bound, std::slice::from_ref(&elsewhere), None),
        ClaimAction::Lost {
            reason: "ClaimMisbound",
            ..
        }
    ));
    let lost = pvc(json!({"spec": {"volumeName": "pv1"}, "status": {"phase": "Lost"}}));
    assert_eq!(sync_claim(&lost, &[elsewhere], None), ClaimAction::None);
}

#[test]
fn a_complete_binding_needs_nothing_and_a_half_one_is_completed() {
    let volume = pv("pv1", {
        let mut v = claim_ref("data", Some("c-1"));
        merge(&mut v, json!({"status": {"phase": "Bound"}}));
        v
    });
    let done = pvc(json!({
        "metadata": {"annotations": {BIND_COMPLETED_ANNOTATION: "yes"}},
        "spec": {"volumeName": "pv1"},
        "status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"}},
    }));
    assert!(binding_complete(&volume, &done));
    assert_eq!(
        sync_claim(&done, std::slice::from_ref(&volume), None),
        ClaimAction::None
    );
    let half = pvc(json!({
        "metadata": {"annotations": {BIND_COMPLETED_ANNOTATION: "yes"}},
        "spec": {"volumeName": "pv1"},
    }));
    assert!(!binding_complete(&volume, &half));
    assert_eq!(sync_claim(&half, &[volume], None), bind("pv1", false));
}

#[test]
fn volume_phases_follow_their_claim() {
    let claim = pvc(json!({}));
    assert_eq!(
        sync_volume(&pv("a", json!({})), None),
        VolumeAction::Phase("Available")
    );
    let available = pv("a", json!({"status": {"phase": "Available"}}));
    assert_eq!(sync_volume(&available, None), VolumeAction::None);
    // Pre-bound by name only: Available until the claim takes it.
    assert_eq!(
        sync_volume(&pv("a", claim_ref("data", None)), Some(&claim)),
        VolumeAction::Phase("Available")
    );
    let mine = pv("a", claim_ref("data", Some("c-1")));
    assert_eq!(
        sync_volume(&mine, Some(&claim)),
        VolumeAction::Phase("Bound")
    );
    let bound_claim = pvc(json!({"spec": {"volumeName": "a"}}));
    assert_eq!(
        sync_volume(&mine, Some(&bound_claim)),
        VolumeAction::Phase("Bound")
    );
    // Claim gone, or replaced by a new one of the same name.
    assert_eq!(sync_volume(&mine, None), VolumeAction::Phase("Released"));
    let newer = pvc(json!({"metadata": {"uid": "c-2"}}));
    assert_eq!(
        sync_volume(&mine, Some(&newer)),
        VolumeAction::Phase("Released")
    );
}

#[test]
fn a_volume_the_controller_chose_is_freed_when_its_claim_went_elsewhere() {
    let other = pvc(json!({"spec": {"volumeName": "b"}}));
    let chosen = pv("a", {
        let mut v = claim_ref("data", Some("c-1"));
        merge(
            &mut v,
            json!({"metadata": {"annotations": {BOUND_BY_CONTROLLER_ANNOTATION: "yes"}}}),
        );
        v
    });
    assert_eq!(sync_volume(&chosen, Some(&other)), VolumeAction::Unbind);
    let admins = pv("a", claim_ref("data", Some("c-1")));
    assert_eq!(sync_volume(&admins, Some(&other)), VolumeAction::None);
    let provisioned = pv("a", {
        let mut v = claim_ref("data", Some("c-1"));
        merge(
            &mut v,
            json!({
                "metadata": {"annotations": {PROVISIONED_BY_ANNOTATION: LOCAL_PATH_PROVISIONER}},
                "spec": {"persistentVolumeReclaimPolicy": "Delete"},
            }),
        );
        v
    });
    assert_eq!(
        sync_volume(&provisioned, Some(&other)),
        VolumeAction::Delete
    );
}

#[test]
fn released_volumes_are_reclaimed_by_policy() {
    let released = |policy: &str, local: bool, deleting: bool| {
        let mut v = claim_ref("data", Some("c-1"));
        merge(
            &mut v,
            json!({
                "spec": {"persistentVolumeReclaimPolicy": policy},
                "status": {"phase": "Released"},
            }),
        );
        if local {
            merge(
                &mut v,
                json!({"metadata": {"annotations": {PROVISIONED_BY_ANNOTATION: LOCAL_PATH_PROVISIONER}}}),
            );
        }
        if deleting {
            merge(
                &mut v,
                json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}),
            );
        }
        pv("gone", v)
    };
    assert_eq!(
        sync_volume(&released("Retain", true, false), None),
        VolumeAction::None
    );
    assert_eq!(
        sync_volume(&released("Delete", true, false), None),
        VolumeAction::Delete
    );
    // Deleted already: the finalizers are at work.
    assert_eq!(
        sync_volume(&released("Delete", true, true), None),
        VolumeAction::None
    );
    assert_eq!(
        sync_volume(&released("Delete", false, false), None),
        VolumeAction::Failed {
            reason: "VolumeFailedDelete",
            message: "error getting deleter volume plugin for volume \"gone\": no deletable volume plugin matched".into()
        }
    );
    assert!(matches!(
        sync_volume(&released("Recycle", false, false), None),
        VolumeAction::Failed {
            reason: "VolumeFailedRecycle",
            ..
        }
    ));
    // Failed stays Failed until an administrator steps in.
    let mut failed = (*released("Delete", false, false)).clone();
    failed.status.as_mut().unwrap().phase = Some("Failed".into());
    assert_eq!(sync_volume(&failed, None), VolumeAction::None);
}
