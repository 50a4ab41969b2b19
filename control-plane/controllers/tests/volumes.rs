//! The volume controllers against a real API server: static binding,
//! WaitForFirstConsumer provisioning of local-path volumes, reclaim by
//! policy, the protection finalizers, ephemeral claims and expansion.
//! Nodes are plain objects carrying the root annotation their agent would
//! write; no agent runs, so the local-path cleanup finalizer stays.

use crate::workloads_support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use kube_util::storage;
use serde_json::{json, Value};
use workloads_support::{until, Env};

const CONTROLLERS: &[&str] = &[
    "persistentvolume-binder",
    "persistentvolume-expander",
    "pvc-protection",
    "pv-protection",
    "ephemeral-volume",
];

fn pvs(env: &Env) -> Api<PersistentVolume> {
    Api::all(env.client.clone())
}

fn pvcs(env: &Env) -> Api<PersistentVolumeClaim> {
    Api::default_namespaced(env.client.clone())
}

async fn create<K>(api: &Api<K>, v: Value) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let obj: K = serde_json::from_value(v).expect("object json");
    api.create(&PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("creating {:?}: {e}", obj.meta().name))
}

async fn class(env: &Env, name: &str, mode: &str, reclaim: &str) {
    create(
        &Api::<StorageClass>::all(env.client.clone()),
        json!({
            "metadata": {"name": name},
            "provisioner": storage::LOCAL_PATH_PROVISIONER,
            "reclaimPolicy": reclaim,
            "volumeBindingMode": mode,
            "allowVolumeExpansion": true,
        }),
    )
    .await;
}

/// A node as its agent registers it: hostname label, local-path root
/// annotation, and (for Immediate provisioning) Ready.
async fn node(env: &Env, name: &str, root: &str) {
    let nodes: Api<Node> = Api::all(env.client.clone());
    create(
        &nodes,
        json!({"metadata": {
            "name": name,
            "labels": {storage::HOSTNAME_LABEL: format!("{name}-host")},
            "annotations": {storage::LOCAL_PATH_ROOT_ANNOTATION: root},
        }}),
    )
    .await;
    let status = json!({"status": {"conditions": [{"type": "Ready", "status": "True",
        "reason": "KubeletReady", "lastHeartbeatTime": "2026-01-01T00:00:00Z",
        "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("node status");
}

fn claim_json(name: &str, class: &str, size: &str) -> Value {
    json!({
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
                 "resources": {"requests": {"storage": size}}},
    })
}

fn claim_phase(c: &PersistentVolumeClaim) -> &str {
    c.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

fn volume_phase(v: &PersistentVolume) -> &str {
    v.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

async fn wait_claim_bound(env: &Env, name: &str) -> PersistentVolumeClaim {
    until(&format!("claim {name} Bound"), 20, || async {
        let c = pvcs(env).get(name).await.map_err(|e| e.to_string())?;
        if storage::claim_bound(&c).is_some() {
            return Ok(());
        }
        Err(format!(
            "{:?} {:?}",
            c.status,
            c.spec.and_then(|s| s.volume_name)
        ))
    })
    .await;
    pvcs(env).get(name).await.expect("bound claim")
}

async fn wait_volume_phase(env: &Env, name: &str, phase: &str) -> PersistentVolume {
    until(&format!("volume {name} {phase}"), 20, || async {
        let v = pvs(env).get(name).await.map_err(|e| e.to_string())?;
        if volume_phase(&v) == phase {
            return Ok(());
        }
        Err(format!("{:?}", v.status))
    })
    .await;
    pvs(env).get(name).await.expect("volume")
}

async fn wait_gone<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    until(&format!("{name} gone"), 20, || async {
        match api.get_opt(name).await {
            Ok(None) => Ok(()),
            Ok(Some(o)) => Err(format!("finalizers {:?}", o.meta().finalizers)),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_volume_binds_and_is_kept_released_with_retain() {
    let env = Env::start(CONTROLLERS).await;
    create(
        &pvs(&env),
        json!({
            "metadata": {"name": "static-1"},
            "spec": {"capacity": {"storage": "2Gi"}, "accessModes": ["ReadWriteOnce"],
                     "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                     "hostPath": {"path": "/srv/static-1"}},
        }),
    )
    .await;
    // Too small: never chosen.
    create(
        &pvs(&env),
        json!({
            "metadata": {"name": "static-small"},
            "spec": {"capacity": {"storage": "100Mi"}, "accessModes": ["ReadWriteOnce"],
                     "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                     "hostPath": {"path": "/srv/static-small"}},
        }),
    )
    .await;
    create(&pvcs(&env), claim_json("db", "", "1Gi")).await;

    let claim = wait_claim_bound(&env, "db").await;
    assert_eq!(storage::claim_bound(&claim), Some("static-1"));
    assert_eq!(
        claim.annotations()[storage::BIND_COMPLETED_ANNOTATION],
        "yes"
    );
    assert_eq!(
        claim.annotations()[storage::BOUND_BY_CONTROLLER_ANNOTATION],
        "yes"
    );
    let status = claim.status.clone().unwrap();
    assert_eq!(status.capacity.unwrap()["storage"].0, "2Gi");
    assert_eq!(
        status.access_modes.unwrap(),
        vec!["ReadWriteOnce".to_string()]
    );
    let pv = wait_volume_phase(&env, "static-1", "Bound").await;
    let r = pv.spec.unwrap().claim_ref.unwrap();
    assert_eq!((r.name.as_deref(), r.uid), (Some("db"), claim.uid()));
    wait_volume_phase(&env, "static-small", "Available").await;

    pvcs(&env)
        .delete("db", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&pvcs(&env), "db").await;
    wait_volume_phase(&env, "static-1", "Released").await;
    // Retain: kept, Released, for an administrator.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pv = pvs(&env).get("static-1").await.unwrap();
    assert_eq!(volume_phase(&pv), "Released");
    assert!(pv.metadata.deletion_timestamp.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_first_consumer_provisions_on_the_selected_node_then_reclaims() {
    let env = Env::start(CONTROLLERS).await;
    class(&env, "lp-wffc", "WaitForFirstConsumer", "Delete").await;
    node(&env, "n1", "/var/lib/lp").await;
    let claim = create(&pvcs(&env), claim_json("data", "lp-wffc", "1Gi")).await;

    env.wait_event(
        "WaitForFirstConsumer",
        "waiting for first consumer to be created before binding",
    )
    .await;
    let now = pvcs(&env).get("data").await.unwrap();
    assert_eq!(claim_phase(&now), "Pending");
    assert!(pvs(&env)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .is_empty());

    // What the scheduler does when it places the claim's first pod.
    let selected = json!({"metadata": {"annotations": {storage::SELECTED_NODE_ANNOTATION: "n1"}}});
    pvcs(&env)
        .patch("data", &PatchParams::default(), &Patch::Merge(&selected))
        .await
        .unwrap();

    let bound = wait_claim_bound(&env, "data").await;
    let pv_name = format!("pvc-{}", claim.uid().unwrap());
    assert_eq!(storage::claim_bound(&bound), Some(pv_name.as_str()));
    assert_eq!(
        bound.annotations()[storage::STORAGE_PROVISIONER_ANNOTATION],
        storage::LOCAL_PATH_PROVISIONER
    );
    assert_eq!(
        bound.annotations()[storage::BETA_STORAGE_PROVISIONER_ANNOTATION],
        storage::LOCAL_PATH_PROVISIONER
    );
    let pv = wait_volume_phase(&env, &pv_name, "Bound").await;
    assert_eq!(pv.labels()[storage::LOCAL_PATH_NODE_LABEL], "n1");
    assert!(storage::is_local_path(&pv));
    assert_eq!(
        pv.annotations()[storage::LOCAL_PATH_ROOT_ANNOTATION],
        "/var/lib/lp"
    );
    for f in [
        storage::PV_PROTECTION_FINALIZER,
        storage::LOCAL_PATH_CLEANUP_FINALIZER,
    ] {
        assert!(
            pv.finalizers().iter().any(|x| x == f),
            "{f} on {:?}",
            pv.finalizers()
        );
    }
    let spec = pv.spec.clone().unwrap();
    assert_eq!(spec.capacity.unwrap()["storage"].0, "1Gi");
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Delete")
    );
    assert_eq!(spec.storage_class_name.as_deref(), Some("lp-wffc"));
    assert_eq!(
        spec.local.unwrap().path,
        format!(
            "/var/lib/lp/{}",
            storage::local_path_dir_name(&pv_name, "default", "data")
        )
    );
    let nodes: Api<Node> = Api::all(env.client.clone());
    let n1 = nodes.get("n1").await.unwrap();
    assert!(storage::volume_allows_node(pv.spec.as_ref().unwrap(), &n1));
    env.wait_event(
        "ProvisioningSucceeded",
        &format!("Successfully provisioned volume {pv_name}"),
    )
    .await;

    // Delete reclaim: the claim goes, the PV is Released and deleted; the
    // agent's cleanup finalizer holds it until the directory is gone.
    pvcs(&env)
        .delete("data", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&pvcs(&env), "data").await;
    until("the volume deleted, waiting for its agent", 20, || async {
        let v = pvs(&env).get(&pv_name).await.map_err(|e| e.to_string())?;
        let pending_cleanup = v.metadata.deletion_timestamp.is_some()
            && v.finalizers() == [storage::LOCAL_PATH_CLEANUP_FINALIZER.to_string()];
        pending_cleanup
            .then_some(())
            .ok_or(format!("{:?} {:?}", v.status, v.finalizers()))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_in_use_is_removed_only_after_its_pod() {
    let env = Env::start(CONTROLLERS).await;
    create(&pvcs(&env), claim_json("shared", "", "1Gi")).await;
    until("the claim protected", 20, || async {
        let c = pvcs(&env).get("shared").await.map_err(|e| e.to_string())?;
        c.finalizers()
            .iter()
            .any(|f| f == storage::PVC_PROTECTION_FINALIZER)
            .then_some(())
            .ok_or(format!("{:?}", c.finalizers()))
    })
    .await;
    create(
        &env.pods(),
        json!({
            "metadata": {"name": "user"},
            "spec": {"containers": [{"name": "c", "image": "busybox:1"}],
                     "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "shared"}}]},
        }),
    )
    .await;

    pvcs(&env)
        .delete("shared", &DeleteParams::default())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let c = pvcs(&env).get("shared").await.expect("kept while in use");
    assert!(c.metadata.deletion_timestamp.is_some());

    env.pods()
        .delete("user", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&env.pods(), "user").await;
    wait_gone(&pvcs(&env), "shared").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ephemeral_volumes_get_a_claim_owned_by_their_pod() {
    let env = Env::start(CONTROLLERS).await;
    let pod: Pod = create(
        &env.pods(),
        json!({
            "metadata": {"name": "web"},
            "spec": {"containers": [{"name": "c", "image": "busybox:1"}],
                     "volumes": [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {
                         "metadata": {"labels": {"tier": "tmp"}},
                         "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                                  "resources": {"requests": {"storage": "1Gi"}}}}}}]},
        }),
    )
    .await;
    until("the ephemeral claim", 20, || async {
        let c = pvcs(&env)
            .get_opt("web-scratch")
            .await
            .map_err(|e| e.to_string())?;
        c.map(|_| ()).ok_or("none yet".into())
    })
    .await;
    let claim = pvcs(&env).get("web-scratch").await.unwrap();
    assert_eq!(claim.labels()["tier"], "tmp");
    let owner = &claim.owner_references()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Pod", "web"));
    assert_eq!(Some(owner.uid.clone()), pod.uid());
    assert_eq!(
        (owner.controller, owner.block_owner_deletion),
        (Some(true), Some(true))
    );
    assert_eq!(storage::ephemeral_claim_not_for_pod(&pod, &claim), None);

    // A claim of that name the pod does not own is reported, not taken.
    create(&pvcs(&env), claim_json("other-scratch", "", "1Gi")).await;
    create(
        &env.pods(),
        json!({
            "metadata": {"name": "other"},
            "spec": {"containers": [{"name": "c", "image": "busybox:1"}],
                     "volumes": [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {
                         "spec": {"accessModes": ["ReadWriteOnce"],
                                  "resources": {"requests": {"storage": "1Gi"}}}}}}]},
        }),
    )
    .await;
    env.wait_event(
        "FailedBinding",
        "PVC default/other-scratch was not created for pod default/other (pod is not owner)",
    )
    .await;
    let c = pvcs(&env).get("other-scratch").await.unwrap();
    assert!(c.owner_references().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_immediate_local_path_claim_is_provisioned_and_expanded() {
    let env = Env::start(CONTROLLERS).await;
    class(&env, "lp-now", "Immediate", "Delete").await;
    node(&env, "n2", "/data/lp").await;
    node(&env, "n1", "/data/lp").await;
    let claim = create(&pvcs(&env), claim_json("grow", "lp-now", "1Gi")).await;
    let bound = wait_claim_bound(&env, "grow").await;
    let pv_name = format!("pvc-{}", claim.uid().unwrap());
    assert_eq!(storage::claim_bound(&bound), Some(pv_name.as_str()));
    // The first Ready node by name.
    let pv = wait_volume_phase(&env, &pv_name, "Bound").await;
    assert_eq!(pv.labels()[storage::LOCAL_PATH_NODE_LABEL], "n1");

    let bigger = json!({"spec": {"resources": {"requests": {"storage": "3Gi"}}}});
    pvcs(&env)
        .patch("grow", &PatchParams::default(), &Patch::Merge(&bigger))
        .await
        .expect("expansion allowed by the class");
    until("the claim grown", 20, || async {
        let c = pvcs(&env).get("grow").await.map_err(|e| e.to_string())?;
        let cap = c
            .status
            .and_then(|s| s.capacity)
            .and_then(|c| c.get("storage").cloned());
        (cap.as_ref().map(|q| q.0.as_str()) == Some("3Gi"))
            .then_some(())
            .ok_or(format!("{cap:?}"))
    })
    .await;
    let pv = pvs(&env).get(&pv_name).await.unwrap();
    assert_eq!(pv.spec.unwrap().capacity.unwrap()["storage"].0, "3Gi");
    env.wait_event(
        "VolumeResizeSuccessful",
        &format!("ExpandVolume succeeded for volume {pv_name}"),
    )
    .await;
    env.wait_event(
        "FileSystemResizeSuccessful",
        &format!("MountVolume.NodeExpandVolume succeeded for volume {pv_name}"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_class_provisions_once_the_node_announces_its_root() {
    let env = Env::start(CONTROLLERS).await;
    let nodes: Api<Node> = Api::all(env.client.clone());
    // Registered, but its agent has not written the root yet.
    create(&nodes, json!({"metadata": {"name": "n1"}})).await;
    // No class named: admission gives it the default, local-path.
    let claim = create(
        &pvcs(&env),
        json!({
            "metadata": {"name": "logs",
                         "annotations": {storage::SELECTED_NODE_ANNOTATION: "n1"}},
            "spec": {"accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": "64Mi"}}},
        }),
    )
    .await;
    assert_eq!(
        storage::claim_class(&claim),
        Some(storage::LOCAL_PATH_CLASS)
    );
    env.wait_event(
        "ProvisioningFailed",
        "node n1 has no skiff.io/local-path-root annotation (is its agent running?)",
    )
    .await;
    let pv_name = format!("pvc-{}", claim.uid().unwrap());
    assert!(pvs(&env).get_opt(&pv_name).await.unwrap().is_none());

    let root =
        json!({"metadata": {"annotations": {storage::LOCAL_PATH_ROOT_ANNOTATION: "/srv/lp"}}});
    nodes
        .patch("n1", &PatchParams::default(), &Patch::Merge(&root))
        .await
        .unwrap();
    let bound = wait_claim_bound(&env, "logs").await;
    assert_eq!(storage::claim_bound(&bound), Some(pv_name.as_str()));
    let pv = wait_volume_phase(&env, &pv_name, "Bound").await;
    let spec = pv.spec.unwrap();
    assert_eq!(
        spec.storage_class_name.as_deref(),
        Some(storage::LOCAL_PATH_CLASS)
    );
    assert!(spec.local.unwrap().path.starts_with("/srv/lp/"));
    // Without a hostname label the node's name is the affinity's value.
    let n1 = nodes.get("n1").await.unwrap();
    let term = &spec
        .node_affinity
        .unwrap()
        .required
        .unwrap()
        .node_selector_terms[0];
    assert_eq!(
        term.match_expressions.as_ref().unwrap()[0]
            .values
            .as_deref(),
        Some(&["n1".to_string()][..])
    );
    assert!(n1.labels().get(storage::HOSTNAME_LABEL).is_none());
}
