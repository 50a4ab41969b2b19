//! What the runtime holds for one pod, read through CRI: its sandboxes and
//! containers with the details the planner and the status need.

use std::collections::HashMap;

use cri_proto::v1;

use super::labels;

/// One pod sandbox as observed.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxInfo {
    pub id: String,
    pub attempt: u32,
    pub ready: bool,
    /// Nanoseconds since the epoch.
    pub created_at: i64,
    /// Pod IPs, primary first; empty for host-network pods or not ready ones.
    pub ips: Vec<String>,
}

/// State of a container, CRI's enum as a Rust one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Created,
    Running,
    Exited,
    Unknown,
}

impl State {
    pub fn from_cri(s: i32) -> State {
        match v1::ContainerState::try_from(s) {
            Ok(v1::ContainerState::ContainerCreated) => State::Created,
            Ok(v1::ContainerState::ContainerRunning) => State::Running,
            Ok(v1::ContainerState::ContainerExited) => State::Exited,
            _ => State::Unknown,
        }
    }
}

/// One container as observed.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerInfo {
    pub id: String,
    pub sandbox_id: String,
    pub name: String,
    pub state: State,
    pub restart_count: u32,
    pub hash: String,
    /// Nanoseconds since the epoch; 0 when not reached.
    pub created_at: i64,
    pub started_at: i64,
    pub finished_at: i64,
    pub exit_code: i32,
    /// The runtime's reason (`OOMKilled`, `Completed`, `Error`).
    pub reason: String,
    pub message: String,
    pub image: String,
    pub image_ref: String,
    pub grace_period: i64,
    /// Host path of the termination message file, when one was mounted.
    pub termination_message_file: Option<String>,
    pub termination_message_policy: String,
    pub log_path: String,
}

impl ContainerInfo {
    /// A container of `pod` as tests need one: created and started at
    /// `started_ns`, finished 10 s later when exited.
    #[cfg(test)]
    pub fn fake(
        pod: &k8s_openapi::api::core::v1::Pod,
        name: &str,
        state: State,
        restarts: u32,
        exit: i32,
        started_ns: i64,
    ) -> ContainerInfo {
        use crate::pod::PodExt;
        let spec = pod
            .containers()
            .iter()
            .chain(pod.init_containers())
            .find(|c| c.name == name);
        ContainerInfo {
            id: format!("{name}-{restarts}"),
            sandbox_id: "s1".into(),
            name: name.into(),
            state,
            restart_count: restarts,
            hash: spec
                .map(crate::runtime::container::container_hash)
                .unwrap_or_default(),
            created_at: started_ns,
            started_at: started_ns,
            finished_at: if state == State::Exited {
                started_ns + 10_000_000_000
            } else {
                0
            },
            exit_code: exit,
            reason: String::new(),
            message: String::new(),
            image: "i".into(),
            image_ref: "sha256:1".into(),
            grace_period: 30,
            termination_message_file: None,
            termination_message_policy: "File".into(),
            log_path: String::new(),
        }
    }

    pub fn from_status(s: &v1::ContainerStatus, sandbox_id: &str) -> ContainerInfo {
        let a = &s.annotations;
        ContainerInfo {
            id: s.id.clone(),
            sandbox_id: sandbox_id.to_string(),
            name: s
                .metadata
                .as_ref()
                .map(|m| m.name.clone())
                .or_else(|| s.labels.get(labels::CONTAINER_NAME).cloned())
                .unwrap_or_default(),
            state: State::from_cri(s.state),
            restart_count: labels::int_annotation(a, labels::CONTAINER_RESTART_COUNT).max(0) as u32,
            hash: a.get(labels::CONTAINER_HASH).cloned().unwrap_or_default(),
            created_at: s.created_at,
            started_at: s.started_at,
            finished_at: s.finished_at,
            exit_code: s.exit_code,
            reason: s.reason.clone(),
            message: s.message.clone(),
            image: s
                .image
                .as_ref()
                .map(|i| i.image.clone())
                .unwrap_or_default(),
            image_ref: s.image_ref.clone(),
            grace_period: labels::int_annotation(a, labels::POD_GRACE_PERIOD),
            termination_message_file: a.get(labels::TERMINATION_MESSAGE_FILE).cloned(),
            termination_message_policy: a
                .get(labels::TERMINATION_MESSAGE_POLICY)
                .cloned()
                .unwrap_or_default(),
            log_path: s.log_path.clone(),
        }
    }
}

/// Everything the runtime has for one pod uid.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodRuntime {
    /// Newest first.
    pub sandboxes: Vec<SandboxInfo>,
    /// Newest first.
    pub containers: Vec<ContainerInfo>,
}

impl PodRuntime {
    /// The newest sandbox, which is the one containers run in.
    pub fn current_sandbox(&self) -> Option<&SandboxInfo> {
        self.sandboxes.first()
    }

    /// Newest container with this name, in any sandbox.
    pub fn latest(&self, name: &str) -> Option<&ContainerInfo> {
        self.containers.iter().find(|c| c.name == name)
    }

    /// Newest container with this name in the given sandbox.
    pub fn latest_in(&self, name: &str, sandbox_id: &str) -> Option<&ContainerInfo> {
        self.containers
            .iter()
            .find(|c| c.name == name && c.sandbox_id == sandbox_id)
    }

    /// The newest terminated container with this name other than `except`.
    pub fn previous_terminated(&self, name: &str, except: &str) -> Option<&ContainerInfo> {
        self.containers
            .iter()
            .find(|c| c.name == name && c.id != except && c.state == State::Exited)
    }

    pub fn running(&self) -> impl Iterator<Item = &ContainerInfo> {
        self.containers
            .iter()
            .filter(|c| matches!(c.state, State::Running | State::Created | State::Unknown))
    }

    pub fn is_empty(&self) -> bool {
        self.sandboxes.is_empty() && self.containers.is_empty()
    }
}

/// Group sandbox IPs from a PodSandboxStatus, primary first.
pub fn sandbox_ips(status: &v1::PodSandboxStatus) -> Vec<String> {
    let Some(net) = &status.network else {
        return Vec::new();
    };
    let mut ips = Vec::new();
    if !net.ip.is_empty() {
        ips.push(net.ip.clone());
    }
    ips.extend(
        net.additional_ips
            .iter()
            .map(|i| i.ip.clone())
            .filter(|i| !i.is_empty()),
    );
    ips
}

/// Sort newest first by creation time, then id for a stable order.
pub fn sort_newest_first(rt: &mut PodRuntime) {
    rt.sandboxes
        .sort_by(|a, b| b.created_at.cmp(&a.created_at).then(b.id.cmp(&a.id)));
    rt.containers.sort_by(|a, b| {
        b.restart_count
            .cmp(&a.restart_count)
            .then(b.created_at.cmp(&a.created_at))
            .then(b.id.cmp(&a.id))
    });
}

/// Labels of a pod, as a map a sandbox carries them.
pub fn uid_of(labels_map: &HashMap<String, String>) -> Option<&str> {
    labels_map.get(labels::POD_UID).map(String::as_str)
}
