//! Small accessors on k8s-openapi's Pod, so the rest of the agent reads
//! `pod.uid()` instead of unwrapping options everywhere.

use k8s_openapi::api::core::v1::{Container, EphemeralContainer, Pod};

/// Restart policy of a pod (`spec.restartPolicy`, default Always).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartPolicy {
    Always,
    OnFailure,
    Never,
}

impl RestartPolicy {
    /// Whether a container that exited with `exit_code` runs again.
    pub fn restarts(self, exit_code: i32) -> bool {
        match self {
            RestartPolicy::Always => true,
            RestartPolicy::OnFailure => exit_code != 0,
            RestartPolicy::Never => false,
        }
    }
}

pub trait PodExt {
    fn name(&self) -> &str;
    fn namespace(&self) -> &str;
    fn uid(&self) -> &str;
    /// `namespace/name` for logs and messages.
    fn key(&self) -> String;
    fn restart_policy(&self) -> RestartPolicy;
    /// The grace period for stopping: deletionGracePeriodSeconds when the
    /// pod is being deleted, else terminationGracePeriodSeconds (30).
    fn grace_period_seconds(&self) -> i64;
    fn containers(&self) -> &[Container];
    fn init_containers(&self) -> &[Container];
    /// The container (or init container) named `name`.
    fn container(&self, name: &str) -> Option<&Container> {
        self.containers()
            .iter()
            .chain(self.init_containers())
            .find(|c| c.name == name)
    }
    /// `spec.ephemeralContainers`: debugging containers, started once each
    /// in the running sandbox and never restarted.
    fn ephemeral_containers(&self) -> &[EphemeralContainer];
    /// The ephemeral container named `name`, as the Container it runs as.
    fn ephemeral_container(&self, name: &str) -> Option<Container> {
        self.ephemeral_containers()
            .iter()
            .find(|c| c.name == name)
            .map(as_container)
    }
    /// The API server has set a deletionTimestamp: stop it, then let the
    /// API delete it.
    fn is_being_deleted(&self) -> bool;
    /// The API already records the pod as Succeeded or Failed: it never
    /// runs again.
    fn is_terminal(&self) -> bool;
    /// A mirror pod: the API's copy of a static pod, never run itself.
    fn is_mirror(&self) -> bool;
    /// A static pod: from a manifest on this node, not from the API.
    fn is_static(&self) -> bool;
}

impl PodExt for Pod {
    fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or("")
    }
    fn namespace(&self) -> &str {
        self.metadata.namespace.as_deref().unwrap_or("default")
    }
    fn uid(&self) -> &str {
        self.metadata.uid.as_deref().unwrap_or("")
    }
    fn key(&self) -> String {
        format!("{}/{}", self.namespace(), self.name())
    }
    fn restart_policy(&self) -> RestartPolicy {
        match self.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) {
            Some("Never") => RestartPolicy::Never,
            Some("OnFailure") => RestartPolicy::OnFailure,
            _ => RestartPolicy::Always,
        }
    }
    fn grace_period_seconds(&self) -> i64 {
        self.metadata
            .deletion_grace_period_seconds
            .or_else(|| {
                self.spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds)
            })
            .unwrap_or(30)
            .max(0)
    }
    fn containers(&self) -> &[Container] {
        self.spec
            .as_ref()
            .map(|s| &s.containers[..])
            .unwrap_or_default()
    }
    fn init_containers(&self) -> &[Container] {
        self.spec
            .as_ref()
            .and_then(|s| s.init_containers.as_deref())
            .unwrap_or_default()
    }
    fn ephemeral_containers(&self) -> &[EphemeralContainer] {
        self.spec
            .as_ref()
            .and_then(|s| s.ephemeral_containers.as_deref())
            .unwrap_or_default()
    }
    fn is_being_deleted(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }
    fn is_terminal(&self) -> bool {
        self.status
            .as_ref()
            .is_some_and(kube_util::podstatus::is_terminal)
    }
    fn is_mirror(&self) -> bool {
        self.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(crate::source::CONFIG_MIRROR_ANNOTATION))
    }
    fn is_static(&self) -> bool {
        self.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(crate::source::CONFIG_SOURCE_ANNOTATION))
            .is_some_and(|s| s != crate::source::API_SOURCE)
    }
}

/// An ephemeral container as a Container: the same fields, less the
/// target, which only decides its PID namespace.
pub fn as_container(e: &EphemeralContainer) -> Container {
    Container {
        name: e.name.clone(),
        image: e.image.clone(),
        image_pull_policy: e.image_pull_policy.clone(),
        command: e.command.clone(),
        args: e.args.clone(),
        working_dir: e.working_dir.clone(),
        env: e.env.clone(),
        env_from: e.env_from.clone(),
        volume_mounts: e.volume_mounts.clone(),
        volume_devices: e.volume_devices.clone(),
        security_context: e.security_context.clone(),
        stdin: e.stdin,
        stdin_once: e.stdin_once,
        tty: e.tty,
        termination_message_path: e.termination_message_path.clone(),
        termination_message_policy: e.termination_message_policy.clone(),
        ..Container::default()
    }
}

/// Upstream's `SystemCriticalPriority`.
pub const CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// Whether the pod is critical (upstream's `IsCriticalPod`).
pub fn is_critical(pod: &Pod) -> bool {
    pod.is_static()
        || pod.is_mirror()
        || pod
            .spec
            .as_ref()
            .and_then(|s| s.priority)
            .is_some_and(|p| p >= CRITICAL_PRIORITY)
}
