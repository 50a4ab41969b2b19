//! The container runtime's health as the node's Ready condition reports
//! it: CRI `Version` and `Status` (RuntimeReady, NetworkReady) plus the
//! PLEG's own health, behind a small trait so node status can be tested
//! without a runtime.

use std::sync::Arc;
use std::time::Duration;

use cri_proto::v1;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::ContainerImage;

use crate::pleg::Health;
use crate::runtime::Runtime;

/// A status check never takes longer than this; a runtime that does not
/// answer in time is reported down.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the runtime said about itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeHealth {
    /// `containerd://1.6.20`; empty until the runtime answered once.
    pub version: String,
    /// Why the node cannot run pods, in the kubelet's words; empty when
    /// ready.
    pub errors: Vec<String>,
}

impl RuntimeHealth {
    /// Ok, or the Ready condition's message (errors joined with `,` as
    /// the kubelet does).
    pub fn ready(&self) -> Result<(), String> {
        if self.errors.is_empty() {
            Ok(())
        } else {
            Err(self.errors.join(","))
        }
    }
}

/// Asks the runtime how it is.
pub trait RuntimeProbe: Send + Sync {
    fn probe(&self) -> BoxFuture<'_, RuntimeHealth>;

    /// The images on the node for `status.images`, as the kubelet's
    /// `setNodeStatusImages`; `None`: not known (the status leaves them
    /// out).
    fn images(&self) -> BoxFuture<'_, Option<Vec<ContainerImage>>> {
        Box::pin(async { None })
    }
}

/// Images reported in node status (the kubelet's `nodeStatusMaxImages`),
/// the largest first: the scheduler's ImageLocality weighs by size.
pub const MAX_IMAGES: usize = 50;
/// Names reported per image (the kubelet's `MaxNamesPerImageInNodeStatus`).
pub const MAX_NAMES_PER_IMAGE: usize = 5;

/// Node status images from a CRI image list: the largest
/// [`MAX_IMAGES`], each named by its digests then its tags.
pub fn status_images(mut images: Vec<v1::Image>) -> Vec<ContainerImage> {
    images.sort_by_key(|i| std::cmp::Reverse(i.size));
    images
        .into_iter()
        .filter(|i| !i.repo_digests.is_empty() || !i.repo_tags.is_empty())
        .take(MAX_IMAGES)
        .map(|i| {
            let names: Vec<String> = i
                .repo_digests
                .into_iter()
                .chain(i.repo_tags)
                .take(MAX_NAMES_PER_IMAGE)
                .collect();
            ContainerImage {
                names: Some(names),
                size_bytes: i64::try_from(i.size).ok(),
            }
        })
        .collect()
}

/// The real probe: CRI Version and Status, and the PLEG's health.
pub struct CriProbe {
    runtime: Arc<Runtime>,
    pleg: Option<Arc<Health>>,
}

impl CriProbe {
    /// `pleg`: the PLEG's health, when a PLEG runs (it does in the agent).
    pub fn new(runtime: Arc<Runtime>, pleg: Option<Arc<Health>>) -> CriProbe {
        CriProbe { runtime, pleg }
    }

    async fn check(&self) -> RuntimeHealth {
        let mut h = RuntimeHealth::default();
        let version = self.runtime.version().await;
        let status = self
            .runtime
            .cri
            .status(v1::StatusRequest { verbose: false })
            .await;
        match version {
            Ok(v) => h.version = v,
            Err(e) => h.errors.push(format!("container runtime is down: {e}")),
        }
        match status {
            Ok(s) => {
                let conditions = s.status.map(|s| s.conditions).unwrap_or_default();
                h.errors.extend(condition_errors(&conditions));
            }
            Err(e) if h.errors.is_empty() => {
                h.errors.push(format!("container runtime is down: {e}"))
            }
            Err(_) => {}
        }
        // The PLEG adds its own verdict (relisting stalled); whether the
        // runtime answers was checked just now, more recently than the
        // PLEG's last relist.
        if h.errors.is_empty() {
            if let Some(Err(e)) = self.pleg.as_ref().map(|p| p.ready()) {
                if e.starts_with("PLEG is not healthy") {
                    h.errors.push(e);
                }
            }
        }
        h
    }
}

impl RuntimeProbe for CriProbe {
    fn images(&self) -> BoxFuture<'_, Option<Vec<ContainerImage>>> {
        Box::pin(async move {
            let request = v1::ListImagesRequest { filter: None };
            let listed = tokio::time::timeout(PROBE_TIMEOUT, self.runtime.cri.list_images(request));
            match listed.await {
                Ok(Ok(r)) => Some(status_images(r.images)),
                // Keep what the Node has rather than reporting no images.
                _ => None,
            }
        })
    }

    fn probe(&self) -> BoxFuture<'_, RuntimeHealth> {
        Box::pin(async move {
            match tokio::time::timeout(PROBE_TIMEOUT, self.check()).await {
                Ok(h) => h,
                Err(_) => RuntimeHealth {
                    version: String::new(),
                    errors: vec![format!(
                        "container runtime is down: no answer to Version/Status within {PROBE_TIMEOUT:?}"
                    )],
                },
            }
        })
    }
}

/// The kubelet's errors for the CRI conditions: runtime first, then
/// network (`container runtime network not ready: NetworkReady=false
/// reason:NetworkPluginNotReady message:...`).
pub fn condition_errors(conditions: &[v1::RuntimeCondition]) -> Vec<String> {
    let find = |t: &str| conditions.iter().find(|c| c.r#type == t);
    let show = |t: &str, c: Option<&v1::RuntimeCondition>| match c {
        Some(c) => format!(
            "{}={} reason:{} message:{}",
            c.r#type, c.status, c.reason, c.message
        ),
        None => format!("{t} condition missing"),
    };
    let mut errors = Vec::new();
    let runtime = find("RuntimeReady");
    if !runtime.is_some_and(|c| c.status) {
        errors.push(format!(
            "container runtime not ready: {}",
            show("RuntimeReady", runtime)
        ));
    }
    let network = find("NetworkReady");
    if !network.is_some_and(|c| c.status) {
        errors.push(format!(
            "container runtime network not ready: {}",
            show("NetworkReady", network)
        ));
    }
    errors
}

#[cfg(test)]
mod tests {

    #[test]
    fn status_images_largest_first_digests_then_tags() {
        let image = |id: &str, size: u64, tags: &[&str], digests: &[&str]| v1::Image {
            id: id.into(),
            size,
            repo_tags: tags.iter().map(|t| t.to_string()).collect(),
            repo_digests: digests.iter().map(|t| t.to_string()).collect(),
            ..Default::default()
        };
        let mut listed = vec![
            image("small", 10, &["small:1"], &[]),
            image("big", 1000, &["big:1", "big:latest"], &["big@sha256:a"]),
            image("dangling", 5000, &[], &[]),
        ];
        listed.extend((0..60).map(|_| image("x", 1, &["x:1"], &[])));
        let images = status_images(listed);
        assert_eq!(images.len(), MAX_IMAGES);
        assert_eq!(
            images[0].names.as_deref(),
            Some(
                &[
                    "big@sha256:a".to_string(),
                    "big:1".into(),
                    "big:latest".into()
                ][..]
            )
        );
        assert_eq!(images[0].size_bytes, Some(1000));
        assert_eq!(
            images[1].names.as_deref(),
            Some(&["small:1".to_string()][..])
        );
        let many: Vec<String> = (0..8).map(|i| format!("t:{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let named = status_images(vec![image("m", 1, &many, &[])]);
        assert_eq!(
            named[0].names.as_ref().map(Vec::len),
            Some(MAX_NAMES_PER_IMAGE)
        );
    }
    use super::*;

    #[test]
    fn conditions_in_the_kubelets_words() {
        let c = |t: &str, status: bool| v1::RuntimeCondition {
            r#type: t.into(),
            status,
            reason: if status { "" } else { "NetworkPluginNotReady" }.into(),
            message: if status {
                ""
            } else {
                "Network plugin returns error: cni plugin not initialized"
            }
            .into(),
        };
        assert!(condition_errors(&[c("RuntimeReady", true), c("NetworkReady", true)]).is_empty());
        assert_eq!(
            condition_errors(&[c("RuntimeReady", true), c("NetworkReady", false)]),
            vec!["container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized"]
        );
        assert_eq!(condition_errors(&[]).len(), 2);
    }
}
