//! The labels and annotations the kubelet puts on CRI sandboxes and
//! containers. Keeping the upstream keys means crictl, log shippers and
//! anything else that reads them keep working; they are also how a
//! restarted agent finds its pods again.

use std::collections::HashMap;

pub const POD_NAME: &str = "io.kubernetes.pod.name";
pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const POD_UID: &str = "io.kubernetes.pod.uid";
pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";
pub const CONTAINER_HASH: &str = "io.kubernetes.container.hash";
pub const CONTAINER_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
pub const TERMINATION_MESSAGE_PATH: &str = "io.kubernetes.container.terminationMessagePath";
pub const TERMINATION_MESSAGE_POLICY: &str = "io.kubernetes.container.terminationMessagePolicy";
pub const CONTAINER_PORTS: &str = "io.kubernetes.container.ports";
pub const POD_GRACE_PERIOD: &str = "io.kubernetes.pod.terminationGracePeriod";
/// Ours: marks what this agent created, so it never touches sandboxes
/// that someone else started in the same containerd namespace.
pub const MANAGED_BY: &str = "skiff.io/managed-by";
pub const MANAGED_BY_VALUE: &str = "skiff-agent";
/// Ours: the host path of the container's termination message file.
pub const TERMINATION_MESSAGE_FILE: &str = "skiff.io/termination-message-file";

/// The label selector that lists everything this agent created.
pub fn managed_selector() -> HashMap<String, String> {
    HashMap::from([(MANAGED_BY.to_string(), MANAGED_BY_VALUE.to_string())])
}

/// The label selector for one pod's sandboxes and containers.
pub fn pod_selector(uid: &str) -> HashMap<String, String> {
    let mut m = managed_selector();
    m.insert(POD_UID.into(), uid.into());
    m
}

/// Parse an integer annotation, 0 when absent or garbled.
pub fn int_annotation(annotations: &HashMap<String, String>, key: &str) -> i64 {
    annotations
        .get(key)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}
