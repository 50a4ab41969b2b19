//! Image pulls as the kubelet's `images.imageManager`: a container's image
//! is pulled (or found present) as its imagePullPolicy says, with the
//! events upstream records, with the credentials of the pod's image pull
//! secrets, and failed pulls wait out ImagePullBackOff.

use std::sync::Mutex;
use std::time::Instant;

use cri_proto::{v1, CriClient};
use k8s_openapi::api::core::v1::{Container, Pod};

use super::credentials::{self, Keyring};
use super::{wait, StartError};
use crate::backoff::Backoff;
use crate::events::{Recorder, NORMAL, WARNING};
use crate::pod::PodExt;
use crate::registries::auth::logins_for;
use crate::status::WaitReason;

/// Pulls images, holding the ImagePullBackOff delays (keyed
/// `uid/image/<image>`, so a pod's delays go with it).
pub struct ImagePuller {
    backoff: Mutex<Backoff>,
    /// Reads the pods' image pull secrets; None without an API connection.
    client: Option<kube::Client>,
    /// The node's logins from the registries file.
    registries: crate::registries::Current,
}

impl ImagePuller {
    pub fn new(backoff: Backoff) -> ImagePuller {
        ImagePuller {
            backoff: Mutex::new(backoff),
            client: None,
            registries: Default::default(),
        }
    }

    /// Log in with the registries file's logins too.
    pub fn with_registries(mut self, registries: crate::registries::Current) -> ImagePuller {
        self.registries = registries;
        self
    }

    /// Read image pull secrets through `client`.
    pub fn with_client(mut self, client: Option<kube::Client>) -> ImagePuller {
        self.client = client;
        self
    }

    fn backoff(&self) -> std::sync::MutexGuard<'_, Backoff> {
        self.backoff.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forget the delays of a pod that is gone.
    pub fn forget_pod(&self, uid: &str) {
        self.backoff().forget_prefix(uid);
    }

    /// Drop delays that have long expired.
    pub fn gc(&self, now: Instant) {
        self.backoff().gc(now);
    }

    /// Pull `c`'s image as its imagePullPolicy says, with ImagePullBackOff.
    ///
    /// # Errors
    /// [`StartError::Wait`] when the container has to wait for its image
    /// (ErrImagePull, ImagePullBackOff, ...), [`StartError::Runtime`] when
    /// the runtime is unavailable.
    pub async fn ensure(
        &self,
        cri: &CriClient,
        recorder: &dyn Recorder,
        pod: &Pod,
        c: &Container,
        sandbox: &v1::PodSandboxConfig,
    ) -> Result<(), StartError> {
        let image = c.image.clone().unwrap_or_default();
        let policy = c
            .image_pull_policy
            .clone()
            .unwrap_or_else(|| crate::source::defaults::default_pull_policy(&image).to_string());
        let spec = v1::ImageSpec {
            image: image.clone(),
            ..Default::default()
        };
        let present = match cri
            .image_status(v1::ImageStatusRequest {
                image: Some(spec.clone()),
                verbose: false,
            })
            .await
        {
            Ok(r) => r.image.is_some(),
            Err(e) if e.is_unavailable() => return Err(StartError::Runtime(e)),
            Err(e) => return Err(wait("InvalidImageName", super::status_message(&e))),
        };
        let already_present = || {
            let msg = format!("Container image \"{image}\" already present on machine");
            recorder.event(pod, NORMAL, "Pulled", &msg);
        };
        if policy == "Never" {
            if present {
                already_present();
                return Ok(());
            }
            let msg =
                format!("Container image \"{image}\" is not present with pull policy of Never");
            recorder.event(pod, WARNING, "ErrImageNeverPull", &msg);
            return Err(wait("ErrImageNeverPull", msg));
        }
        if present && policy == "IfNotPresent" {
            already_present();
            return Ok(());
        }
        let key = format!("{}/image/{image}", pod.uid());
        let left = self.backoff().remaining_since_update(&key, Instant::now());
        if let Some(left) = left {
            let msg = format!("Back-off pulling image \"{image}\"");
            return Err(StartError::Wait(
                WaitReason {
                    reason: "ImagePullBackOff".into(),
                    message: msg,
                },
                Some(left),
            ));
        }
        recorder.event(
            pod,
            NORMAL,
            "Pulling",
            &format!("Pulling image \"{image}\""),
        );
        let started = Instant::now();
        match self.pull(cri, recorder, pod, spec, sandbox).await {
            Ok(image_ref) => {
                let took = started.elapsed();
                self.backoff().reset(&key);
                // The kubelet reports the pulled image's size from ImageStatus.
                let size = cri
                    .image_status(v1::ImageStatusRequest {
                        image: Some(v1::ImageSpec {
                            image: image_ref,
                            ..Default::default()
                        }),
                        verbose: false,
                    })
                    .await
                    .ok()
                    .and_then(|r| r.image)
                    .map_or(0, |i| i.size);
                // No pull queue here: the wait is the pull itself.
                let took = kube_util::duration::format_go_millis(took);
                let msg = format!(
                    "Successfully pulled image \"{image}\" in {took} ({took} including waiting). Image size: {size} bytes."
                );
                recorder.event(pod, NORMAL, "Pulled", &msg);
                Ok(())
            }
            Err(e) => {
                let delay = self.backoff().next(&key, Instant::now());
                let msg = format!("Failed to pull image \"{image}\": {e}");
                recorder.event(pod, WARNING, "Failed", &msg);
                Err(StartError::Wait(
                    WaitReason {
                        reason: "ErrImagePull".into(),
                        message: msg,
                    },
                    Some(delay),
                ))
            }
        }
    }

    /// PullImage as the kubelet's `PullImage`: without credentials when
    /// no login matches the image, else with each matching one in turn
    /// until one works: the pod's pull secrets first, then the node's
    /// (the registries file). The secrets are read for this pull only; a
    /// secret that cannot be read is skipped with upstream's warning event.
    ///
    /// # Errors
    /// The runtime's message (several: upstream's aggregate `[a, b]`), or
    /// a pull secret that does not decode.
    async fn pull(
        &self,
        cri: &CriClient,
        recorder: &dyn Recorder,
        pod: &Pod,
        spec: v1::ImageSpec,
        sandbox: &v1::PodSandboxConfig,
    ) -> Result<String, String> {
        let creds = match &self.client {
            Some(client) => {
                let (secrets, failed) = credentials::pull_secrets(client, pod).await;
                if !failed.is_empty() {
                    let msg = format!(
                        "Unable to retrieve some image pull secrets ({}); attempting to pull the image may not succeed.",
                        failed.join(", ")
                    );
                    recorder.event(pod, WARNING, "FailedToRetrieveImagePullSecret", &msg);
                }
                let ring = Keyring::from_secrets(&secrets).map_err(|e| e.to_string())?;
                ring.lookup(&credentials::repo_to_pull(&spec.image))
            }
            None => Vec::new(),
        };
        let node_logins = logins_for(&self.registries.get(), &spec.image);
        let mut auths: Vec<Option<v1::AuthConfig>> = creds
            .iter()
            .map(|c| Some(c.to_cri()))
            .chain(node_logins.into_iter().map(Some))
            .collect();
        if auths.is_empty() {
            auths.push(None);
        }
        let mut errors = Vec::new();
        for auth in auths {
            let req = v1::PullImageRequest {
                image: Some(spec.clone()),
                auth,
                sandbox_config: Some(sandbox.clone()),
            };
            match cri.pull_image(req).await {
                Ok(pulled) => return Ok(pulled.image_ref),
                Err(e) => errors.push(super::status_message(&e)),
            }
        }
        Err(aggregate(errors))
    }
}

/// Several failures in one message, as upstream's `errors.NewAggregate`
/// prints them: one alone as is, more as `[a, b]`.
fn aggregate(mut errors: Vec<String>) -> String {
    match errors.len() {
        1 => errors.remove(0),
        _ => format!("[{}]", errors.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn aggregate_reads_as_upstream() {
        assert_eq!(super::aggregate(vec!["a: 401".into()]), "a: 401");
        assert_eq!(
            super::aggregate(vec!["a: 401".into(), "b: 403".into()]),
            "[a: 401, b: 403]"
        );
    }
}
