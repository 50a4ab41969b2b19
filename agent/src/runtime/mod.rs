//! The agent's side of CRI (the kubelet's `kuberuntime`): building sandbox
//! and container configs, observing a pod's runtime state, and the few
//! compound operations (stop a container with its grace, tear a pod down).

pub mod admit;
pub mod container;
pub mod credentials;
pub mod downward;
pub mod image;
pub mod labels;
pub mod resources;
pub mod runtimeclass;
pub mod sandbox;
pub mod security;
pub mod service_env;
pub mod start;
pub mod state;

use std::collections::HashMap;
use std::sync::Mutex;

use cri_proto::{v1, CriClient};

use state::{ContainerInfo, PodRuntime, SandboxInfo, State};

/// Errors talking to the runtime; the wrapped CRI error names the call.
pub type Error = cri_proto::Error;
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a container did not start (yet): what [`start`] and [`image`]
/// report to the pod worker.
#[derive(Debug)]
pub enum StartError {
    /// The container waits with this reason; sync again after the delay.
    Wait(crate::status::WaitReason, Option<std::time::Duration>),
    /// The runtime itself failed: the whole sync retries.
    Runtime(Error),
}

/// A wait with upstream's `reason` and `message`, synced again at the
/// sync period.
fn wait(reason: &str, message: String) -> StartError {
    StartError::Wait(
        crate::status::WaitReason {
            reason: reason.into(),
            message,
        },
        None,
    )
}

/// The runtime's own message of a failed call (a gRPC status's message
/// without the code), as upstream puts it in events and waiting reasons.
pub fn status_message(e: &Error) -> String {
    match e {
        cri_proto::Error::Status { status, .. } => status.message().to_string(),
        other => other.to_string(),
    }
}

/// The kubelet never gives a container less than this to stop.
const MIN_GRACE_SECONDS: i64 = 2;

/// A CRI client plus caches of what cannot change: the status of an exited
/// container, and a ready sandbox's IPs. They save a ContainerStatus or
/// PodSandboxStatus call per container per sync.
pub struct Runtime {
    pub cri: CriClient,
    container_cache: Mutex<HashMap<String, v1::ContainerStatus>>,
    sandbox_cache: Mutex<HashMap<String, Vec<String>>>,
    /// `containerd`, `cri-o`...: the prefix of container IDs in statuses.
    name: std::sync::OnceLock<String>,
}

impl Runtime {
    pub fn new(cri: CriClient) -> Runtime {
        Runtime {
            cri,
            container_cache: Mutex::new(HashMap::new()),
            sandbox_cache: Mutex::new(HashMap::new()),
            name: std::sync::OnceLock::new(),
        }
    }

    /// `containerd://1.6.20`, as the Node's containerRuntimeVersion.
    pub async fn version(&self) -> Result<String> {
        let v = self.cri.version(v1::VersionRequest::default()).await?;
        let _ = self.name.set(v.runtime_name.clone());
        Ok(format!("{}://{}", v.runtime_name, v.runtime_version))
    }

    /// The runtime's name once known (`containerd` until then, the
    /// runtime the agent is built and tested against).
    pub fn name(&self) -> &str {
        self.name.get().map(String::as_str).unwrap_or("containerd")
    }

    /// Sandboxes and containers this agent created, all pods at once.
    pub async fn list_managed(&self) -> Result<(Vec<v1::PodSandbox>, Vec<v1::Container>)> {
        let sandboxes = self
            .cri
            .list_pod_sandbox(v1::ListPodSandboxRequest {
                filter: Some(v1::PodSandboxFilter {
                    label_selector: labels::managed_selector(),
                    ..Default::default()
                }),
            })
            .await?
            .items;
        let containers = self
            .cri
            .list_containers(v1::ListContainersRequest {
                filter: Some(v1::ContainerFilter {
                    label_selector: labels::managed_selector(),
                    ..Default::default()
                }),
            })
            .await?
            .containers;
        Ok((sandboxes, containers))
    }

    /// Everything the runtime has for one pod.
    pub async fn observe_pod(&self, uid: &str) -> Result<PodRuntime> {
        let selector = labels::pod_selector(uid);
        let (sandboxes, containers) = tokio::try_join!(
            self.cri.list_pod_sandbox(v1::ListPodSandboxRequest {
                filter: Some(v1::PodSandboxFilter {
                    label_selector: selector.clone(),
                    ..Default::default()
                }),
            }),
            self.cri.list_containers(v1::ListContainersRequest {
                filter: Some(v1::ContainerFilter {
                    label_selector: selector,
                    ..Default::default()
                }),
            })
        )?;
        let mut rt = PodRuntime::default();
        for s in sandboxes.items {
            let ready = s.state == v1::PodSandboxState::SandboxReady as i32;
            let ips = if ready {
                self.sandbox_ips(&s.id).await?
            } else {
                Vec::new()
            };
            rt.sandboxes.push(SandboxInfo {
                id: s.id.clone(),
                attempt: s.metadata.as_ref().map(|m| m.attempt).unwrap_or(0),
                ready,
                created_at: s.created_at,
                ips,
            });
        }
        for c in containers.containers {
            match self.container_status(&c).await {
                Ok(status) => rt
                    .containers
                    .push(ContainerInfo::from_status(&status, &c.pod_sandbox_id)),
                // Removed between the list and the status call.
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        state::sort_newest_first(&mut rt);
        Ok(rt)
    }

    async fn sandbox_ips(&self, id: &str) -> Result<Vec<String>> {
        if let Some(ips) = self
            .sandbox_cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
        {
            return Ok(ips.clone());
        }
        let status = self
            .cri
            .pod_sandbox_status(v1::PodSandboxStatusRequest {
                pod_sandbox_id: id.to_string(),
                verbose: false,
            })
            .await?;
        let ips = status
            .status
            .as_ref()
            .map(state::sandbox_ips)
            .unwrap_or_default();
        self.sandbox_cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.to_string(), ips.clone());
        Ok(ips)
    }

    /// ContainerStatus, from the cache while the listed state is unchanged.
    async fn container_status(&self, c: &v1::Container) -> Result<v1::ContainerStatus> {
        if let Some(s) = self
            .container_cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&c.id)
        {
            if s.state == c.state {
                return Ok(s.clone());
            }
        }
        let status = self
            .cri
            .container_status(v1::ContainerStatusRequest {
                container_id: c.id.clone(),
                verbose: false,
            })
            .await?
            .status
            .unwrap_or_default();
        self.container_cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(c.id.clone(), status.clone());
        Ok(status)
    }

    /// Drop cache entries of containers and sandboxes that no longer exist.
    pub fn prune_caches(&self, containers: &[v1::Container], sandboxes: &[v1::PodSandbox]) {
        let live: std::collections::HashSet<&str> =
            containers.iter().map(|c| c.id.as_str()).collect();
        self.container_cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|id, _| live.contains(id.as_str()));
        let ready: std::collections::HashSet<&str> = sandboxes
            .iter()
            .filter(|s| s.state == v1::PodSandboxState::SandboxReady as i32)
            .map(|s| s.id.as_str())
            .collect();
        self.sandbox_cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|id, _| ready.contains(id.as_str()));
    }

    /// StopContainer with the grace period: SIGTERM (or the image's stop
    /// signal), then SIGKILL at the deadline. The call's own timeout covers
    /// the grace period.
    pub async fn stop_container(&self, id: &str, grace_seconds: i64) -> Result<()> {
        let grace = grace_seconds.max(MIN_GRACE_SECONDS);
        let req = v1::StopContainerRequest {
            container_id: id.to_string(),
            timeout: grace,
        };
        // The client's deadline for StopContainer already adds the
        // request's timeout to the default one.
        match self.cri.stop_container(req).await {
            Err(e) if !e.is_not_found() => Err(e),
            _ => Ok(()),
        }
    }

    /// Stop every running container of the pod in parallel, then stop and
    /// remove its sandboxes (which removes their containers too).
    pub async fn teardown_pod(&self, rt: &PodRuntime, grace_seconds: Option<i64>) -> Result<()> {
        let stops = rt.running().map(|c| {
            let grace = grace_seconds.unwrap_or(c.grace_period);
            self.stop_container(&c.id, grace)
        });
        for r in futures::future::join_all(stops).await {
            r?;
        }
        for s in &rt.sandboxes {
            self.stop_sandbox(&s.id).await?;
            self.remove_sandbox(&s.id).await?;
        }
        Ok(())
    }

    pub async fn stop_sandbox(&self, id: &str) -> Result<()> {
        match self
            .cri
            .stop_pod_sandbox(v1::StopPodSandboxRequest {
                pod_sandbox_id: id.to_string(),
            })
            .await
        {
            Err(e) if !e.is_not_found() => Err(e),
            _ => Ok(()),
        }
    }

    pub async fn remove_sandbox(&self, id: &str) -> Result<()> {
        match self
            .cri
            .remove_pod_sandbox(v1::RemovePodSandboxRequest {
                pod_sandbox_id: id.to_string(),
            })
            .await
        {
            Err(e) if !e.is_not_found() => Err(e),
            _ => Ok(()),
        }
    }

    pub async fn remove_container(&self, id: &str) -> Result<()> {
        match self
            .cri
            .remove_container(v1::RemoveContainerRequest {
                container_id: id.to_string(),
            })
            .await
        {
            Err(e) if !e.is_not_found() => Err(e),
            _ => Ok(()),
        }
    }
}

/// Whether a container is still occupying its slot (not exited).
pub fn is_live(c: &ContainerInfo) -> bool {
    c.state != State::Exited
}
