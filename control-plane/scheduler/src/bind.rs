//! Binding: the one write that assigns a pod to a node, a POST of a
//! Binding to `pods/NAME/binding` (upstream DefaultBinder). The pod's UID
//! rides along so that a pod deleted and re-created under the same name
//! is not bound by a decision made for the old one.

use k8s_openapi::api::core::v1::{Binding, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};

use crate::podinfo::PodInfo;

/// A failed binding.
#[derive(Debug, thiserror::Error)]
#[error("binding pod {namespace}/{name} to node {node} failed: {source}")]
pub struct Error {
    pub namespace: String,
    pub name: String,
    pub node: String,
    #[source]
    pub source: kube::Error,
}

impl Error {
    /// True when retrying cannot help: the pod is gone, already bound,
    /// being deleted, or was re-created (409/404 from the API server).
    /// The watch brings whatever is true now.
    pub fn is_final(&self) -> bool {
        is_gone(&self.source)
    }
}

/// A 404 or 409 for a write about a pod: it is gone, or no longer the
/// pod the write was meant for.
pub fn is_gone(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404 || s.code == 409)
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Bind `pod` to `node`.
///
/// # Errors
///
/// The API's refusal or a transport failure, naming the pod and node.
pub async fn bind(client: &kube::Client, pod: &PodInfo, node: &str) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace);
    let binding = Binding {
        metadata: ObjectMeta {
            name: Some(pod.name.clone()),
            namespace: Some(pod.namespace.clone()),
            uid: Some(pod.uid.clone()),
            ..Default::default()
        },
        target: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.to_string()),
            ..Default::default()
        },
    };
    api.create_subresource::<_, serde::de::IgnoredAny>(
        "binding",
        &pod.name,
        &PostParams::default(),
        &binding,
    )
    .await
    .map(|_| ())
    .map_err(|source| Error {
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        node: node.to_string(),
        source,
    })
}
