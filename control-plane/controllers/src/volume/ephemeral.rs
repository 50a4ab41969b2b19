//! The ephemeral volume controller ("ephemeral-volume", upstream's
//! `ephemeral.ephemeralController`): each generic ephemeral volume of a
//! pod gets its claim `<pod>-<volume>`, owned by the pod, so the garbage
//! collector removes the claim with the pod.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, ResourceExt};
use kube_util::events::{Recorder, Reporter};
use kube_util::informer::Informer;
use kube_util::storage;

use super::{log_write, next_pass, ready, resync, trigger};
use crate::{Ctx, Error};

/// What one ephemeral volume of a pod needs.
#[derive(Debug, Clone, PartialEq)]
pub enum Need {
    /// Create this claim.
    Create(Box<PersistentVolumeClaim>),
    /// A claim of that name exists and is not the pod's: the pod cannot
    /// start with it (the message says why).
    Conflict(String),
}

/// The claims a pod's ephemeral volumes need, given the existing claims
/// (by name in the pod's namespace). Pods being deleted need none.
pub fn needs(
    pod: &Pod,
    existing: impl Fn(&str) -> Option<Arc<PersistentVolumeClaim>>,
) -> Vec<Need> {
    if pod.metadata.deletion_timestamp.is_some() {
        return Vec::new();
    }
    let (Some(uid), Some(spec)) = (pod.metadata.uid.as_deref(), pod.spec.as_ref()) else {
        return Vec::new();
    };
    let pod_name = pod.name_any();
    let mut out = Vec::new();
    for volume in spec.volumes.iter().flatten() {
        let Some(template) = volume
            .ephemeral
            .as_ref()
            .and_then(|e| e.volume_claim_template.as_ref())
        else {
            continue;
        };
        let name = storage::ephemeral_claim_name(&pod_name, &volume.name);
        if let Some(pvc) = existing(&name) {
            if let Some(why) = storage::ephemeral_claim_not_for_pod(pod, &pvc) {
                out.push(Need::Conflict(why));
            }
            continue;
        }
        let meta = template.metadata.clone().unwrap_or_default();
        out.push(Need::Create(Box::new(PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: pod.metadata.namespace.clone(),
                labels: meta.labels,
                annotations: meta.annotations,
                owner_references: Some(vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Pod".into(),
                    name: pod_name.clone(),
                    uid: uid.to_string(),
                    controller: Some(true),
                    block_owner_deletion: Some(true),
                }]),
                ..ObjectMeta::default()
            },
            spec: Some(template.spec.clone()),
            status: None,
        })));
    }
    out
}

pub async fn run(ctx: Ctx) -> Result<(), Error> {
    let pods = ctx.informers.get::<Pod>();
    let pvcs = ctx.informers.get::<PersistentVolumeClaim>();
    let mut triggers = futures::stream::select_all([trigger(&pods), trigger(&pvcs)]);
    ready(&pods).await?;
    ready(&pvcs).await?;
    let events = Recorder::new(ctx.client.clone(), Reporter::new("ephemeral_volume"));
    let mut tick = resync();
    while next_pass(&mut triggers, &mut tick).await {
        for pod in pods.list() {
            sync_pod(&ctx.client, &events, &pvcs, &pod).await;
        }
    }
    Ok(())
}

async fn sync_pod(
    client: &kube::Client,
    events: &Recorder,
    pvcs: &Informer<PersistentVolumeClaim>,
    pod: &Pod,
) {
    let ns = pod.namespace().unwrap_or_default();
    for need in needs(pod, |name| pvcs.get(Some(&ns), name)) {
        match need {
            Need::Conflict(why) => events.warning(pod, "FailedBinding", why),
            Need::Create(pvc) => {
                let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
                match api.create(&PostParams::default(), &pvc).await {
                    Ok(_) => tracing::info!(pod = %pod.name_any(), namespace = %ns,
                        claim = %pvc.name_any(), "created ephemeral volume claim"),
                    // Created meanwhile (by us, before the cache caught
                    // up): ownership is judged next pass.
                    Err(kube::Error::Api(e)) if e.code == 409 => {}
                    Err(e) => {
                        events.warning(
                            pod,
                            "FailedBinding",
                            format!("PVC {ns}/{} creation failed: {e}", pvc.name_any()),
                        );
                        log_write("creating ephemeral claim", &pvc.name_any(), &e);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "app", "uid": "pod-uid"},
            "spec": {"containers": [], "volumes": [
                {"name": "cache", "emptyDir": {}},
                {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {
                    "metadata": {"labels": {"tier": "tmp"}, "annotations": {"a": "b"}},
                    "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local-path",
                             "resources": {"requests": {"storage": "1Gi"}}},
                }}},
            ]},
        }))
        .unwrap()
    }

    #[test]
    fn missing_ephemeral_claims_are_created_owned_by_the_pod() {
        let got = needs(&pod(), |_| None);
        let [Need::Create(pvc)] = got.as_slice() else {
            panic!("one claim wanted, got {got:?}");
        };
        assert_eq!(pvc.metadata.name.as_deref(), Some("web-scratch"));
        assert_eq!(pvc.metadata.namespace.as_deref(), Some("app"));
        assert_eq!(pvc.labels()["tier"], "tmp");
        assert_eq!(pvc.annotations()["a"], "b");
        let owner = &pvc.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("Pod", "web", "pod-uid")
        );
        assert_eq!(
            (owner.controller, owner.block_owner_deletion),
            (Some(true), Some(true))
        );
        let spec = pvc.spec.as_ref().unwrap();
        assert_eq!(spec.storage_class_name.as_deref(), Some("local-path"));
        assert_eq!(storage::claim_request(pvc), 1 << 30);
    }

    #[test]
    fn existing_claims_are_left_alone_and_foreign_ones_reported() {
        let Need::Create(mine) = needs(&pod(), |_| None).remove(0) else {
            panic!("create wanted");
        };
        let mine = Arc::new(*mine);
        assert!(needs(&pod(), |_| Some(mine.clone())).is_empty());
        let mut foreign = (*mine).clone();
        foreign.metadata.owner_references = None;
        let got = needs(&pod(), |_| Some(Arc::new(foreign.clone())));
        assert_eq!(
            got,
            vec![Need::Conflict(
                "PVC app/web-scratch was not created for pod app/web (pod is not owner)".into()
            )]
        );
    }

    #[test]
    fn pods_being_deleted_get_no_claims() {
        let mut p = pod();
        p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::now(),
        ));
        assert!(needs(&p, |_| None).is_empty());
    }
}
