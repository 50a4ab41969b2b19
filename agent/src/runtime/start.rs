//! Starting a pod in the runtime, the acting half of the kubelet's
//! `kuberuntime` SyncPod: running its sandbox, and creating and starting
//! its containers (image, config, CreateContainer, StartContainer,
//! postStart), each step with the events upstream records.

use std::time::Instant;

use cri_proto::v1;
use k8s_openapi::api::core::v1::{Container, Pod};

use super::container::{container_config, ContainerContext};
use super::sandbox::{pod_log_dir, sandbox_config, SandboxContext};
use super::wait;
pub use super::StartError;
use crate::events::{NORMAL, WARNING};
use crate::plan::{self, Start};
use crate::pod::PodExt;
use crate::shared::Shared;
use crate::status::WaitReason;

/// Run the pod's sandbox (attempt `attempt`) under the runtime `handler`
/// (its RuntimeClass's; "" for the default) and read its IP.
///
/// # Errors
/// RunPodSandbox or PodSandboxStatus failed.
pub async fn create_sandbox(
    shared: &Shared,
    pod: &Pod,
    attempt: u32,
    handler: String,
) -> Result<(String, Option<String>), cri_proto::Error> {
    let cfg = sandbox_config_for(shared, pod, attempt);
    if let Err(e) = std::fs::create_dir_all(&cfg.log_directory) {
        tracing::warn!(pod = %pod.key(), "cannot create log directory {}: {e}", cfg.log_directory);
    }
    let id = shared
        .runtime
        .cri
        .run_pod_sandbox(v1::RunPodSandboxRequest {
            config: Some(cfg),
            runtime_handler: handler,
        })
        .await?
        .pod_sandbox_id;
    // Ready now, so its IPs are final: read through the runtime's cache,
    // which spares the next observation the same status call.
    let ip = shared.runtime.sandbox_ips(&id).await?.into_iter().next();
    tracing::info!(pod = %pod.key(), sandbox = %id, ip = ip.as_deref().unwrap_or(""), "sandbox started");
    Ok((id, ip))
}

/// The sandbox config of `pod`'s attempt `attempt` on this node; the
/// containers are created with the same.
pub fn sandbox_config_for(shared: &Shared, pod: &Pod, attempt: u32) -> v1::PodSandboxConfig {
    let dns = shared.cluster_dns();
    let c = &shared.config;
    let seccomp_root = super::security::seccomp_root(&c.root_dir);
    let ctx = SandboxContext {
        pod_log_dir: &c.pod_log_dir,
        cluster_dns: &dns,
        cluster_domain: &c.cluster_domain,
        node: super::security::NodeSecurity {
            seccomp_root: &seccomp_root,
            apparmor: super::admit::host_apparmor_enabled(),
        },
    };
    sandbox_config(pod, attempt, &ctx)
}

/// The sandbox a container starts in.
pub struct StartCtx<'a> {
    pub sandbox_id: &'a str,
    pub sandbox_cfg: &'a v1::PodSandboxConfig,
    pub pod_ip: &'a str,
}

/// Create (unless `start.existing`) and start one container as the
/// kubelet's `startContainer`: its image, its config, CreateContainer,
/// StartContainer, then its postStart hook. Every step records upstream's
/// events; the crash back-off grows when it is a restart.
///
/// # Errors
/// [`StartError::Wait`] with the reason the container waits with,
/// [`StartError::Runtime`] when the runtime is unavailable.
pub async fn start_container(
    shared: &Shared,
    pod: &Pod,
    start: &Start,
    ctx: &StartCtx<'_>,
) -> Result<(), StartError> {
    let cri = &shared.runtime.cri;
    let ephemeral;
    let spec = match pod.container(&start.name) {
        Some(s) => s,
        None => match pod.ephemeral_container(&start.name) {
            Some(e) => {
                ephemeral = e;
                &ephemeral
            }
            None => return Ok(()),
        },
    };
    let id = match &start.existing {
        Some(id) => id.clone(),
        None => {
            shared
                .images
                .ensure(cri, shared.recorder.as_ref(), pod, spec, ctx.sandbox_cfg)
                .await?;
            let objects = env_objects(shared, pod, spec).await;
            let volumes = shared.volumes.paths(pod);
            let container_dir = shared
                .config
                .root_dir
                .join("pods")
                .join(pod.uid())
                .join("containers")
                .join(&spec.name);
            // The image's user, for runAsNonRoot (the kubelet's
            // getImageUser); only asked for when that check needs it, since
            // containerd applies the image's USER by itself.
            let image_user = if super::security::needs_image_user(pod, spec) {
                super::security::image_user(cri, spec.image.as_deref().unwrap_or_default()).await
            } else {
                Ok(super::security::ImageUser::default())
            };
            let seccomp_root = super::security::seccomp_root(&shared.config.root_dir);
            let cctx = ContainerContext {
                node_name: &shared.config.node_name,
                pod_ip: ctx.pod_ip,
                host_ip: &shared.host_ip,
                container_dir: &container_dir,
                objects: objects.as_ref(),
                volumes: &volumes,
                image_user,
                node: super::security::NodeSecurity {
                    seccomp_root: &seccomp_root,
                    apparmor: super::admit::host_apparmor_enabled(),
                },
            };
            let cfg = match container_config(pod, spec, start.restart_count, &cctx) {
                Ok(c) => with_target(c, start.target_id.as_deref()),
                Err(e) => {
                    let msg = e.to_string();
                    shared
                        .recorder
                        .event(pod, WARNING, "Failed", &format!("Error: {msg}"));
                    // Retried soon: the missing configMap or secret may
                    // appear at any moment (without an API connection it
                    // cannot: then at the sync period).
                    let w = WaitReason {
                        reason: "CreateContainerConfigError".into(),
                        message: msg,
                    };
                    let retry = shared.volumes.objects().map(|_| crate::volumes::RETRY);
                    return Err(StartError::Wait(w, retry));
                }
            };
            let log_dir = pod_log_dir(&shared.config.pod_log_dir, pod).join(&spec.name);
            let _ = std::fs::create_dir_all(&log_dir);
            let req = v1::CreateContainerRequest {
                pod_sandbox_id: ctx.sandbox_id.to_string(),
                config: Some(cfg),
                sandbox_config: Some(ctx.sandbox_cfg.clone()),
            };
            match cri.create_container(req).await {
                Ok(r) => r.container_id,
                Err(e) if e.is_unavailable() => return Err(StartError::Runtime(e)),
                Err(e) => {
                    let msg = super::status_message(&e);
                    shared
                        .recorder
                        .event(pod, WARNING, "Failed", &format!("Error: {msg}"));
                    return Err(wait("CreateContainerError", msg));
                }
            }
        }
    };
    shared.recorder.event(
        pod,
        NORMAL,
        "Created",
        &format!("Created container: {}", spec.name),
    );
    if let Some(ran) = start.previous_run {
        // A restart after a crash: the back-off grows, unless the container
        // had run long enough to count as healthy.
        let key = plan::backoff_key(pod.uid(), &spec.name);
        let mut b = shared
            .crash_backoff
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if ran >= shared.config.backoff_reset {
            b.reset(&key);
        }
        b.next(&key, Instant::now());
    }
    match cri
        .start_container(v1::StartContainerRequest {
            container_id: id.clone(),
        })
        .await
    {
        Ok(_) => {
            shared.recorder.event(
                pod,
                NORMAL,
                "Started",
                &format!("Started container {}", spec.name),
            );
            crate::lifecycle::post_start(shared, pod, spec, &id, ctx.pod_ip)
                .await
                .map_err(|w| StartError::Wait(w, None))
        }
        Err(e) if e.is_unavailable() => Err(StartError::Runtime(e)),
        Err(e) => {
            let msg = super::status_message(&e);
            shared
                .recorder
                .event(pod, WARNING, "Failed", &format!("Error: {msg}"));
            // The created container is left for the next sync to see as
            // exited/created; the failure shows as its waiting reason.
            Err(wait("RunContainerError", msg))
        }
    }
}

/// An ephemeral container with a target joins the target's PID
/// namespace, unless the pod shares one already (hostPID,
/// shareProcessNamespace), as the kubelet's container config.
fn with_target(mut cfg: v1::ContainerConfig, target: Option<&str>) -> v1::ContainerConfig {
    let Some(target) = target else {
        return cfg;
    };
    let ns = cfg
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .and_then(|s| s.namespace_options.as_mut());
    if let Some(ns) = ns.filter(|ns| ns.pid == v1::NamespaceMode::Container as i32) {
        ns.pid = v1::NamespaceMode::Target as i32;
        ns.target_id = target.to_string();
    }
    cfg
}

/// The configMaps and secrets the container's env names; None without an
/// API connection. Skipped envFrom keys are reported as upstream.
async fn env_objects(
    shared: &Shared,
    pod: &Pod,
    c: &Container,
) -> Option<crate::volumes::objects::EnvObjects> {
    let objects = shared
        .volumes
        .objects()?
        .for_container(pod.namespace(), c)
        .await;
    for msg in super::container::env_from_invalid_keys(pod, c, &objects) {
        shared
            .recorder
            .event(pod, WARNING, "InvalidEnvironmentVariableNames", &msg);
    }
    Some(objects)
}
