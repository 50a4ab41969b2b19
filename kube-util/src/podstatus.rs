//! The STATUS column of `kubectl get pods` (kubectl's `printPod`):
//! `Running`, `Init:1/2`, `Init:CrashLoopBackOff`, `PodInitializing`,
//! `Completed`, `ExitCode:3`, `Terminating`, `Unknown` for a pod on a
//! lost node, ...
//!
//! Both the API server's Table output and the agent's logs print it, so
//! users see the same word in both.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodStatus};

/// The reason the node lifecycle controller gives pods on a node that
/// stopped reporting (upstream `NodeUnreachablePodReason`).
pub const NODE_LOST: &str = "NodeLost";

/// What `kubectl get pods` shows of a pod besides its name, IP and age.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// The STATUS column.
    pub status: String,
    /// Ready containers (app containers and started sidecars).
    pub ready: usize,
    /// App containers and sidecars (restartable init containers).
    pub total: usize,
    /// The RESTARTS column's count.
    pub restarts: i64,
    /// When the last counted restart's container finished, for
    /// RESTARTS' `(5m ago)`.
    pub last_restart: Option<Timestamp>,
}

/// Whether the pod's phase is Succeeded or Failed: it never runs again.
pub fn is_terminal(status: &PodStatus) -> bool {
    matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"))
}

/// The STATUS column for `pod`, from its own `status`.
pub fn display_status(pod: &Pod) -> String {
    summary(pod).status
}

/// The STATUS column for `pod` as it would be with `status`: for a
/// caller that has just worked out a status and not yet written it (the
/// agent).
pub fn display_status_with(pod: &Pod, status: &PodStatus) -> String {
    summary_with(pod, status).status
}

/// READY, STATUS and RESTARTS for `pod`, from its own `status`.
pub fn summary(pod: &Pod) -> Summary {
    match &pod.status {
        Some(status) => summary_with(pod, status),
        None => summary_with(pod, &PodStatus::default()),
    }
}

/// READY, STATUS and RESTARTS for `pod` with `status`, in one walk over
/// the container statuses, as kubectl's `printPod` makes them.
pub fn summary_with(pod: &Pod, status: &PodStatus) -> Summary {
    let spec = pod.spec.as_ref();
    let init_specs = spec
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default();
    let restartable = |name: &str| {
        init_specs
            .iter()
            .any(|c| c.name == name && c.restart_policy.as_deref() == Some("Always"))
    };
    let conditions = status.conditions.as_deref().unwrap_or_default();
    let condition_true = |ty: &str| {
        conditions
            .iter()
            .any(|c| c.type_ == ty && c.status == "True")
    };
    let mut total = spec.map_or(0, |s| s.containers.len());
    total += init_specs
        .iter()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"))
        .count();
    let mut ready = 0;

    let mut reason = status.phase.clone().unwrap_or_default();
    if let Some(r) = status.reason.as_deref().filter(|r| !r.is_empty()) {
        reason = r.to_string();
    }
    if conditions
        .iter()
        .any(|c| c.type_ == "PodScheduled" && c.reason.as_deref() == Some("SchedulingGated"))
    {
        reason = "SchedulingGated".into();
    }

    // Restarts of every init container walked, and separately of the
    // sidecars, which alone count once initialisation is over.
    let mut restarts = Restarts::default();
    let mut sidecar_restarts = Restarts::default();
    let mut initializing = false;
    let inits = status
        .init_container_statuses
        .as_deref()
        .unwrap_or_default();
    for (i, c) in inits.iter().enumerate() {
        restarts.add(c);
        if restartable(&c.name) {
            sidecar_restarts.add(c);
        }
        let state = c.state.as_ref();
        let terminated = state.and_then(|s| s.terminated.as_ref());
        let waiting_reason = state
            .and_then(|s| s.waiting.as_ref())
            .and_then(|w| w.reason.as_deref())
            .filter(|r| !r.is_empty());
        if terminated.is_some_and(|t| t.exit_code == 0) {
            continue;
        }
        // A started sidecar runs beside the rest: initialisation goes on.
        if restartable(&c.name) && c.started == Some(true) {
            if c.ready {
                ready += 1;
            }
            continue;
        }
        reason = if let Some(t) = terminated {
            match t.reason.as_deref().filter(|r| !r.is_empty()) {
                Some(r) => format!("Init:{r}"),
                None if t.signal.is_some_and(|s| s != 0) => {
                    format!("Init:Signal:{}", t.signal.unwrap_or_default())
                }
                None => format!("Init:ExitCode:{}", t.exit_code),
            }
        } else if let Some(r) = waiting_reason.filter(|r| *r != "PodInitializing") {
            format!("Init:{r}")
        } else {
            format!("Init:{i}/{}", init_specs.len())
        };
        initializing = true;
        break;
    }

    if !initializing || condition_true("Initialized") {
        restarts = sidecar_restarts;
        let mut has_running = false;
        let statuses = status.container_statuses.as_deref().unwrap_or_default();
        for c in statuses.iter().rev() {
            restarts.add(c);
            if let Some(r) = container_reason(c) {
                reason = r;
            } else if c.ready && c.state.as_ref().is_some_and(|s| s.running.is_some()) {
                has_running = true;
                ready += 1;
            }
        }
        // Some containers finished, one still runs: the pod runs.
        if reason == "Completed" && has_running {
            reason = if condition_true("Ready") {
                "Running".into()
            } else {
                "NotReady".into()
            };
        }
    }

    let terminal = is_terminal(status);
    if pod.metadata.deletion_timestamp.is_some() {
        if status.reason.as_deref() == Some(NODE_LOST) {
            reason = "Unknown".into();
        } else if !terminal {
            reason = "Terminating".into();
        }
    }
    Summary {
        status: reason,
        ready,
        total,
        restarts: restarts.count,
        last_restart: restarts.last,
    }
}

/// A running count of restarts and the latest time a counted container
/// last finished.
#[derive(Default, Clone, Copy)]
struct Restarts {
    count: i64,
    last: Option<Timestamp>,
}

impl Restarts {
    fn add(&mut self, c: &ContainerStatus) {
        self.count += i64::from(c.restart_count);
        let finished = c
            .last_state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .and_then(|t| t.finished_at.as_ref())
            .map(|t| t.0);
        if let Some(t) = finished {
            if self.last.is_none_or(|l| t > l) {
                self.last = Some(t);
            }
        }
    }
}

/// What an app container that is not simply running says: its waiting
/// reason, its terminated reason, or the signal or exit code it ended by.
fn container_reason(c: &ContainerStatus) -> Option<String> {
    let state = c.state.as_ref()?;
    if let Some(r) = state
        .waiting
        .as_ref()
        .and_then(|w| w.reason.as_deref())
        .filter(|r| !r.is_empty())
    {
        return Some(r.to_string());
    }
    let t = state.terminated.as_ref()?;
    Some(match t.reason.as_deref().filter(|r| !r.is_empty()) {
        Some(r) => r.to_string(),
        None => match t.signal.filter(|s| *s != 0) {
            Some(s) => format!("Signal:{s}"),
            None => format!("ExitCode:{}", t.exit_code),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn pod(spec: Value, status: Value) -> Pod {
        let mut spec = spec;
        if spec.get("containers").is_none() {
            spec["containers"] = json!([{"name": "a"}]);
        }
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec, "status": status}))
            .unwrap()
    }

    fn running(name: &str, ready: bool) -> Value {
        json!({"name": name, "image": "i", "imageID": "", "restartCount": 0, "ready": ready,
               "state": {"running": {"startedAt": "2024-01-01T00:00:00Z"}}})
    }

    fn waiting(name: &str, reason: &str) -> Value {
        json!({"name": name, "image": "i", "imageID": "", "restartCount": 0, "ready": false,
               "state": {"waiting": {"reason": reason}}})
    }

    fn terminated(name: &str, code: i32, reason: Option<&str>, signal: Option<i32>) -> Value {
        json!({"name": name, "image": "i", "imageID": "", "restartCount": 0, "ready": false,
               "state": {"terminated": {"exitCode": code, "reason": reason, "signal": signal}}})
    }

    #[test]
    fn phases_and_app_containers() {
        assert_eq!(
            display_status(&pod(json!({}), json!({"phase": "Pending"}))),
            "Pending"
        );
        let p = pod(
            json!({}),
            json!({"phase": "Running", "containerStatuses": [running("a", true)]}),
        );
        assert_eq!(display_status(&p), "Running");
        let p = pod(
            json!({}),
            json!({"phase": "Running", "containerStatuses": [waiting("a", "CrashLoopBackOff")]}),
        );
        assert_eq!(display_status(&p), "CrashLoopBackOff");
        let p = pod(
            json!({}),
            json!({"phase": "Pending", "containerStatuses": [waiting("a", "ImagePullBackOff")]}),
        );
        assert_eq!(display_status(&p), "ImagePullBackOff");
        let p = pod(
            json!({}),
            json!({"phase": "Succeeded", "containerStatuses": [terminated("a", 0, Some("Completed"), None)]}),
        );
        assert_eq!(display_status(&p), "Completed");
        let p = pod(
            json!({}),
            json!({"phase": "Failed", "containerStatuses": [terminated("a", 3, None, None)]}),
        );
        assert_eq!(display_status(&p), "ExitCode:3");
        let p = pod(
            json!({}),
            json!({"phase": "Failed", "containerStatuses": [terminated("a", 137, None, Some(9))]}),
        );
        assert_eq!(display_status(&p), "Signal:9");
        // No status at all.
        let bare: Pod = serde_json::from_value(json!({"metadata": {"name": "p"}})).unwrap();
        assert_eq!(display_status(&bare), "");
        // status.reason wins over the phase (Evicted, NodeAffinity, ...).
        let p = pod(json!({}), json!({"phase": "Failed", "reason": "Evicted"}));
        assert_eq!(display_status(&p), "Evicted");
    }

    #[test]
    fn completed_with_one_still_running() {
        let two = json!({"containers": [{"name": "a"}, {"name": "b"}]});
        let st = |ready: &str| {
            json!({"phase": "Running",
            "conditions": [{"type": "Ready", "status": ready}],
            "containerStatuses": [terminated("a", 0, Some("Completed"), None), running("b", true)]})
        };
        assert_eq!(display_status(&pod(two.clone(), st("True"))), "Running");
        assert_eq!(display_status(&pod(two, st("False"))), "NotReady");
    }

    #[test]
    fn init_containers() {
        let spec = json!({"initContainers": [{"name": "i1"}, {"name": "i2"}]});
        let with = |inits: Value| {
            pod(
                spec.clone(),
                json!({"phase": "Pending", "initContainerStatuses": inits,
            "containerStatuses": [waiting("a", "PodInitializing")]}),
            )
        };
        assert_eq!(
            display_status(&with(json!([
                waiting("i1", "PodInitializing"),
                waiting("i2", "PodInitializing")
            ]))),
            "Init:0/2"
        );
        assert_eq!(
            display_status(&with(json!([
                terminated("i1", 0, Some("Completed"), None),
                running("i2", false)
            ]))),
            "Init:1/2"
        );
        assert_eq!(
            display_status(&with(json!([waiting("i1", "CrashLoopBackOff")]))),
            "Init:CrashLoopBackOff"
        );
        assert_eq!(
            display_status(&with(json!([terminated("i1", 1, Some("Error"), None)]))),
            "Init:Error"
        );
        assert_eq!(
            display_status(&with(json!([terminated("i1", 2, None, None)]))),
            "Init:ExitCode:2"
        );
        assert_eq!(
            display_status(&with(json!([terminated("i1", 143, None, Some(15))]))),
            "Init:Signal:15"
        );
        // All done: the app containers speak.
        let done = json!([
            terminated("i1", 0, Some("Completed"), None),
            terminated("i2", 0, Some("Completed"), None)
        ]);
        assert_eq!(display_status(&with(done)), "PodInitializing");
    }

    #[test]
    fn sidecars_do_not_hold_initialisation() {
        let spec = json!({"initContainers": [{"name": "side", "restartPolicy": "Always"}, {"name": "i2"}]});
        let mut side = running("side", true);
        side["started"] = json!(true);
        let p = pod(
            spec.clone(),
            json!({"phase": "Pending",
            "initContainerStatuses": [side.clone(), waiting("i2", "PodInitializing")]}),
        );
        assert_eq!(display_status(&p), "Init:1/2");
        let p = pod(
            spec,
            json!({"phase": "Running",
            "conditions": [{"type": "Initialized", "status": "True"}],
            "initContainerStatuses": [side, terminated("i2", 0, Some("Completed"), None)],
            "containerStatuses": [running("a", true)]}),
        );
        assert_eq!(display_status(&p), "Running");
    }

    #[test]
    fn gated_terminating_and_lost() {
        let p = pod(
            json!({}),
            json!({"phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]}),
        );
        assert_eq!(display_status(&p), "SchedulingGated");
        let deleting = |status: Value| {
            let mut p = pod(json!({}), status);
            p.metadata.deletion_timestamp = Some(
                k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH),
            );
            p
        };
        assert_eq!(
            display_status(&deleting(
                json!({"phase": "Running", "containerStatuses": [running("a", true)]})
            )),
            "Terminating"
        );
        assert_eq!(
            display_status(&deleting(json!({"phase": "Running", "reason": "NodeLost"}))),
            "Unknown"
        );
        // A finished pod being deleted keeps its final word.
        assert_eq!(
            display_status(&deleting(
                json!({"phase": "Succeeded", "containerStatuses": [terminated("a", 0, Some("Completed"), None)]})
            )),
            "Completed"
        );
    }

    #[test]
    fn ready_and_restarts() {
        let spec = json!({"initContainers": [{"name": "side", "restartPolicy": "Always"}, {"name": "i"}],
            "containers": [{"name": "a"}, {"name": "b"}]});
        let restarted = |mut c: Value, n: i32, at: &str| {
            c["restartCount"] = json!(n);
            c["lastState"] = json!({"terminated": {"exitCode": 1, "finishedAt": at}});
            c
        };
        let mut side = restarted(running("side", true), 2, "2024-01-01T00:00:05Z");
        side["started"] = json!(true);
        let p = pod(
            spec,
            json!({"phase": "Running",
            "conditions": [{"type": "Initialized", "status": "True"}],
            "initContainerStatuses": [side, restarted(terminated("i", 0, Some("Completed"), None), 4, "2024-01-01T00:00:09Z")],
            "containerStatuses": [restarted(running("a", true), 1, "2024-01-01T00:00:07Z"), running("b", false)]}),
        );
        let s = summary(&p);
        assert_eq!((s.ready, s.total), (2, 3));
        // Once initialised, only sidecars' and app containers' restarts
        // count: not the finished init container's four.
        assert_eq!(s.restarts, 3);
        assert_eq!(
            s.last_restart,
            Some("2024-01-01T00:00:07Z".parse().unwrap())
        );
    }

    #[test]
    fn with_a_status_not_yet_written() {
        let p = pod(json!({}), json!({"phase": "Pending"}));
        let st: PodStatus = serde_json::from_value(json!({"phase": "Running",
            "containerStatuses": [running("a", true)]}))
        .unwrap();
        assert_eq!(display_status_with(&p, &st), "Running");
    }
}
