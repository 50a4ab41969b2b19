//! Where desired pods come from.
//!
//! Every source sends full snapshots of the pods it wants on this node (the
//! kubelet's `SET` operation): the pod manager diffs them, so a source never
//! has to compute add/update/remove itself and a lost message is repaired by
//! the next one. Today: the static pod directory; the API server watch joins
//! later through the same channel.

pub mod api;
pub mod defaults;
pub mod file;
pub mod validate;

use k8s_openapi::api::core::v1::Pod;

/// Annotation naming the source of a pod, as the kubelet sets it.
pub const CONFIG_SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";
/// Annotation with the hash the kubelet gives static pods.
pub const CONFIG_HASH_ANNOTATION: &str = "kubernetes.io/config.hash";
/// Annotation marking a pod as known to be a mirror of a static pod.
pub const CONFIG_MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Name of the API server source in [`PodUpdate::source`] and in a pod's
/// config.source annotation; here rather than in [`api`] because the pod
/// helpers (`PodExt::is_static`) read it too, and the API source uses them.
pub const API_SOURCE: &str = "api";

/// A full snapshot of one source's pods.
#[derive(Debug, Clone)]
pub struct PodUpdate {
    /// `"file"` or `"api"`.
    pub source: &'static str,
    pub pods: Vec<Pod>,
    /// Manifests the source had to skip, with the reason.
    pub errors: Vec<SourceError>,
}

/// A manifest a source could not use, reported until it is fixed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceError {
    /// The file (or object) at fault.
    pub origin: String,
    pub message: String,
}
