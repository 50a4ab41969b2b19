//! The writes that carry out a preemption (upstream's
//! `prepareCandidate`): each victim gets the `DisruptionTarget`
//! condition and a graceful delete, lower-priority pods nominated to the
//! same node lose their nomination, and the preemptor is nominated to the
//! node through `status.nominatedNodeName`. Run off the scheduling loop;
//! a failure is logged and the next attempt decides again on what the
//! watch then shows.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use serde_json::json;
use tracing::{debug, warn};

use crate::bind::is_gone;
use crate::podinfo::PodInfo;

/// One preemption to write.
#[derive(Debug)]
pub struct Preemption {
    pub node: String,
    pub victims: Vec<std::sync::Arc<PodInfo>>,
    /// Nominated to `node` with a lower priority than the preemptor.
    pub denominated: Vec<std::sync::Arc<PodInfo>>,
}

/// Write `p` for `preemptor`, whose scheduler is `scheduler`.
pub async fn write(client: &kube::Client, scheduler: &str, preemptor: &PodInfo, p: &Preemption) {
    let victims = p.victims.iter().map(|v| remove(client, scheduler, v));
    futures::future::join_all(victims).await;
    for pod in &p.denominated {
        nominate(client, pod, None).await;
    }
    nominate(client, preemptor, Some(&p.node)).await;
}

async fn remove(client: &kube::Client, scheduler: &str, victim: &PodInfo) {
    let api: Api<Pod> = Api::namespaced(client.clone(), &victim.namespace);
    let condition = json!({"status": {"conditions": [{
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "PreemptionByScheduler",
        "message": format!("{scheduler}: preempting to accommodate a higher priority pod"),
        "lastTransitionTime": jiff::Timestamp::now(),
    }]}});
    if let Err(e) = api
        .patch_status(
            &victim.name,
            &PatchParams::default(),
            &Patch::Strategic(&condition),
        )
        .await
    {
        if !is_gone(&e) {
            warn!(pod = %format!("{}/{}", victim.namespace, victim.name), error = %e,
                "could not mark a preemption victim; deleting it anyway");
        }
    }
    // The UID precondition keeps a pod re-created under the same name
    // from being deleted for a decision about the old one.
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(victim.uid.clone()),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(&victim.name, &params).await {
        Ok(_) => debug!(pod = %format!("{}/{}", victim.namespace, victim.name), "preempted"),
        Err(e) if is_gone(&e) => {}
        Err(e) => warn!(pod = %format!("{}/{}", victim.namespace, victim.name), error = %e,
            "could not delete a preemption victim"),
    }
}

/// Set (or with `None` clear) a pod's `status.nominatedNodeName`.
async fn nominate(client: &kube::Client, pod: &PodInfo, node: Option<&str>) {
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace);
    let patch = json!({"status": {"nominatedNodeName": node}});
    if let Err(e) = api
        .patch_status(&pod.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        if !is_gone(&e) {
            warn!(pod = %format!("{}/{}", pod.namespace, pod.name), error = %e,
                "could not write the nominated node");
        }
    }
}
