//! The runtime's sandbox ("pause") image: every pod needs it, so the agent
//! checks at start that it is present or pullable and says so clearly
//! when it is neither (an air-gapped node without it starts no pod, and
//! the runtime's own error only shows per pod, much later). The image
//! collector never removes it.

use cri_proto::{v1, CriClient};

use crate::events::{ApiRecorder, WARNING};
use crate::runtime::credentials::repo_to_pull;

/// The sandbox image the runtime is configured with, from its verbose
/// status (containerd's CRI `config.sandboxImage`); None when the runtime
/// does not say.
pub async fn image_name(cri: &CriClient) -> Option<String> {
    super::runtime_config(cri).await?["sandboxImage"]
        .as_str()
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// `image` with Docker Hub's implicit host and `library/`, and the
/// implicit `latest` tag, filled in, so that names compare.
fn normalized(image: &str) -> String {
    let repo = repo_to_pull(image);
    if let Some((_, digest)) = image.split_once('@') {
        return format!("{repo}@{digest}");
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.split_once(':') {
        Some((_, tag)) => format!("{repo}:{tag}"),
        None => format!("{repo}:latest"),
    }
}

/// Whether one of an image's `names` (tags and digests) is `image`.
pub fn names_match(names: &[String], image: &str) -> bool {
    let wanted = normalized(image);
    names.iter().any(|n| normalized(n) == wanted)
}

/// Check that the sandbox image is present, pulling it when not; when
/// neither works, log an error and record a Warning on the Node naming
/// the image and what to do. Never fails the agent: the image may still
/// be imported later.
pub async fn check(cri: &CriClient, recorder: Option<&ApiRecorder>) {
    let Some(image) = image_name(cri).await else {
        tracing::debug!("the runtime does not name its sandbox image; not checked");
        return;
    };
    let spec = v1::ImageSpec {
        image: image.clone(),
        ..Default::default()
    };
    let status = cri
        .image_status(v1::ImageStatusRequest {
            image: Some(spec.clone()),
            verbose: false,
        })
        .await;
    match status {
        Ok(r) if r.image.is_some() => {
            tracing::debug!(image, "sandbox image present");
            return;
        }
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(image, "cannot check the sandbox image: {e}");
            return;
        }
    }
    tracing::info!(image, "sandbox image absent, pulling it");
    let pulled = cri
        .pull_image(v1::PullImageRequest {
            image: Some(spec),
            auth: None,
            sandbox_config: None,
        })
        .await;
    match pulled {
        Ok(_) => tracing::info!(image, "pulled the sandbox image"),
        Err(e) => {
            let message = format!(
                "sandbox image \"{image}\" is not present and cannot be pulled ({}): no pod can start on this node until it is imported or the runtime's sandbox_image is changed",
                crate::runtime::status_message(&e)
            );
            tracing::error!("{message}");
            if let Some(r) = recorder {
                r.node_event(WARNING, "SandboxImageUnavailable", &message);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_compare_with_docker_hub_defaults_filled_in() {
        let names = vec!["docker.io/library/pause:3.9".to_string()];
        assert!(names_match(&names, "pause:3.9"));
        assert!(names_match(&names, "docker.io/library/pause:3.9"));
        assert!(!names_match(&names, "pause:3.8"));
        let tagless = vec!["registry.k8s.io/pause:latest".to_string()];
        assert!(names_match(&tagless, "registry.k8s.io/pause"));
        let ported = vec!["localhost:5000/pause:1".to_string()];
        assert!(names_match(&ported, "localhost:5000/pause:1"));
        assert!(!names_match(&ported, "localhost:5000/pause"));
        let digest = vec!["k8s.gcr.io/pause@sha256:abc".to_string()];
        assert!(names_match(&digest, "k8s.gcr.io/pause@sha256:abc"));
    }
}
