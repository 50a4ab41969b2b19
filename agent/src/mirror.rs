//! Mirror pods: for every static pod, a copy in the API so that
//! `kubectl get pods` shows it (the kubelet's mirror client). The API's
//! copy carries `kubernetes.io/config.mirror` with the static pod's hash
//! and is owned by the Node; it is recreated when a user deletes it,
//! replaced when the manifest changes, and deleted with the manifest.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::Api;
use tokio::sync::watch;

use crate::pod::PodExt;
use crate::source::api::MirrorPods;
use crate::source::{CONFIG_HASH_ANNOTATION, CONFIG_MIRROR_ANNOTATION};

/// Mirrors are checked again this often even without a change, so a
/// failed create (namespace missing, API down) is retried.
const RESYNC: Duration = Duration::from_secs(10);

pub struct MirrorManager {
    client: kube::Client,
    node_name: String,
    /// The static pods, as the file source last reported them.
    statics: watch::Receiver<Vec<Pod>>,
    /// The mirror pods the API has, from the API source.
    mirrors: watch::Receiver<MirrorPods>,
}

fn hash(p: &Pod) -> Option<&str> {
    p.metadata
        .annotations
        .as_ref()?
        .get(CONFIG_HASH_ANNOTATION)
        .map(String::as_str)
}

fn mirror_of(p: &Pod) -> Option<&str> {
    p.metadata
        .annotations
        .as_ref()?
        .get(CONFIG_MIRROR_ANNOTATION)
        .map(String::as_str)
}

impl MirrorManager {
    pub fn new(
        client: kube::Client,
        node_name: &str,
        statics: watch::Receiver<Vec<Pod>>,
        mirrors: watch::Receiver<MirrorPods>,
    ) -> Self {
        MirrorManager {
            client,
            node_name: node_name.to_string(),
            statics,
            mirrors,
        }
    }

    /// Run until the static pod sender goes away.
    pub async fn run(mut self) {
        loop {
            self.sync().await;
            tokio::select! {
                r = self.statics.changed() => if r.is_err() { return },
                r = self.mirrors.changed() => if r.is_err() { return },
                _ = tokio::time::sleep(RESYNC) => {}
            }
        }
    }

    async fn sync(&self) {
        let statics: HashMap<String, Pod> = self
            .statics
            .borrow()
            .iter()
            .map(|p| (p.key(), p.clone()))
            .collect();
        let mirrors = self.mirrors.borrow().clone();
        for (key, mirror) in &mirrors {
            // A mirror a user deleted is removed at once and made again
            // (its grace period would otherwise never end: nothing runs it).
            let wanted = statics.get(key).and_then(hash);
            if wanted.is_none() || wanted != mirror_of(mirror) || mirror.is_being_deleted() {
                self.delete(mirror).await;
            }
        }
        for (key, pod) in &statics {
            let current = mirrors.get(key);
            if current.is_none_or(|m| mirror_of(m) != hash(pod) || m.is_being_deleted()) {
                self.create(pod).await;
            }
        }
    }

    async fn delete(&self, mirror: &Pod) {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), mirror.namespace());
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(mirror.uid().to_string()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(mirror.name(), &dp).await {
            Ok(_) => tracing::info!(pod = %mirror.key(), "deleted mirror pod"),
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(e) => {
                tracing::warn!(pod = %mirror.key(), "deleting mirror pod failed, will retry: {e}")
            }
        }
    }

    async fn create(&self, pod: &Pod) {
        let Some(hash) = hash(pod) else { return };
        let mut annotations = pod.metadata.annotations.clone().unwrap_or_default();
        annotations.insert(CONFIG_MIRROR_ANNOTATION.into(), hash.to_string());
        let owner = match Api::<Node>::all(self.client.clone())
            .get(&self.node_name)
            .await
        {
            Ok(n) => n.metadata.uid.map(|uid| OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: self.node_name.clone(),
                uid,
                controller: Some(true),
                block_owner_deletion: None,
            }),
            // Not registered yet: the next resync tries again.
            Err(_) => return,
        };
        let mirror = Pod {
            metadata: ObjectMeta {
                name: pod.metadata.name.clone(),
                namespace: pod.metadata.namespace.clone(),
                labels: pod.metadata.labels.clone(),
                annotations: Some(annotations),
                owner_references: owner.map(|o| vec![o]),
                ..ObjectMeta::default()
            },
            spec: pod.spec.clone(),
            status: None,
        };
        let api: Api<Pod> = Api::namespaced(self.client.clone(), pod.namespace());
        match api.create(&PostParams::default(), &mirror).await {
            Ok(_) => tracing::info!(pod = %pod.key(), "created mirror pod"),
            // The old mirror is still being deleted: retried on the next change.
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => {
                tracing::warn!(pod = %pod.key(), "creating mirror pod failed, will retry: {e}")
            }
        }
    }
}
