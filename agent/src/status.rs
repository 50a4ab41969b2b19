//! PodStatus computed like the kubelet's `generateAPIPodStatus`: phase,
//! conditions, container statuses with state / lastState / restartCount,
//! pod IPs. Pure: inputs are the pod, what the runtime has, and the
//! reasons the last sync recorded (image pull errors, back-offs).

use std::collections::HashMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::pod::{PodExt, RestartPolicy};
use crate::runtime::state::{ContainerInfo, PodRuntime, State};

/// A reason a container is waiting, recorded by the sync that found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitReason {
    pub reason: String,
    pub message: String,
}

/// Everything `compute` needs besides the pod.
pub struct Inputs<'a> {
    pub rt: &'a PodRuntime,
    pub waiting: &'a HashMap<String, WaitReason>,
    pub previous: Option<&'a PodStatus>,
    pub host_ip: &'a str,
    /// `containerd`, for `containerd://<id>` container IDs.
    pub runtime_name: &'a str,
    pub start_time: Timestamp,
    pub now: Timestamp,
    /// The probes' results: `started` and `ready` of running containers.
    pub probes: &'a crate::prober::PodProbes,
}

pub fn compute(pod: &Pod, i: &Inputs) -> PodStatus {
    let init_statuses: Vec<ContainerStatus> = pod
        .init_containers()
        .iter()
        .map(|c| container_status(c, true, false, i))
        .collect();
    let initialized = init_statuses.iter().all(terminated_ok);
    let statuses: Vec<ContainerStatus> = pod
        .containers()
        .iter()
        .map(|c| container_status(c, false, !initialized, i))
        .collect();
    let phase = phase(pod, &init_statuses, &statuses);
    // Ephemeral containers are reported as the kubelet does, like init
    // containers: never ready, and no part of the pod's phase or
    // conditions.
    let ephemeral_statuses: Vec<ContainerStatus> = pod
        .ephemeral_containers()
        .iter()
        .map(|e| ContainerStatus {
            ready: false,
            ..container_status(&crate::pod::as_container(e), true, false, i)
        })
        .collect();

    let sandbox = i.rt.current_sandbox();
    let mut ips: Vec<String> = sandbox
        .filter(|s| s.ready)
        .map(|s| s.ips.clone())
        .unwrap_or_default();
    if ips.is_empty() {
        // A finished pod keeps the IP it had (the kubelet does the same).
        ips = i
            .previous
            .and_then(|p| p.pod_ips.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|p| p.ip)
            .collect();
    }
    let host_network = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    if host_network && !i.host_ip.is_empty() {
        ips = vec![i.host_ip.to_string()];
    }

    let not_ready: Vec<&str> = statuses
        .iter()
        .filter(|s| !s.ready)
        .map(|s| s.name.as_str())
        .collect();
    let incomplete: Vec<&str> = init_statuses
        .iter()
        .filter(|s| !terminated_ok(s))
        .map(|s| s.name.as_str())
        .collect();
    let done = phase == "Succeeded";
    let cond = |type_: &str, ok: bool, reason: &str, message: String| {
        let status = if ok { "True" } else { "False" };
        let prev = i
            .previous
            .and_then(|p| p.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == type_));
        let since = match prev {
            Some(p) if p.status == status => p.last_transition_time.clone(),
            _ => Some(Time(i.now)),
        };
        PodCondition {
            type_: type_.into(),
            status: status.into(),
            last_transition_time: since,
            reason: (!ok && !reason.is_empty()).then(|| reason.to_string()),
            message: (!ok && !message.is_empty()).then_some(message),
            ..Default::default()
        }
    };
    let ready_reason = if done {
        "PodCompleted"
    } else {
        "ContainersNotReady"
    };
    let ready_msg = if done {
        String::new()
    } else {
        format!("containers with unready status: [{}]", not_ready.join(" "))
    };
    let sandbox_ready = sandbox.is_some_and(|s| s.ready);
    let init_reason = if done {
        "PodCompleted"
    } else {
        "ContainersNotInitialized"
    };
    let mut conditions = vec![
        cond(
            "PodReadyToStartContainers",
            sandbox_ready,
            "",
            String::new(),
        ),
        cond(
            "Initialized",
            initialized,
            init_reason,
            format!(
                "containers with incomplete status: [{}]",
                incomplete.join(" ")
            ),
        ),
        match (not_ready.is_empty(), unready_gates(pod)) {
            (true, Some(why)) => cond("Ready", false, "ReadinessGatesNotReady", why),
            (ok, _) => cond("Ready", ok, ready_reason, ready_msg.clone()),
        },
        cond(
            "ContainersReady",
            not_ready.is_empty(),
            ready_reason,
            ready_msg,
        ),
        cond("PodScheduled", true, "", String::new()),
    ];
    // Conditions other writers own (an eviction's DisruptionTarget, a
    // readiness gate's) stay as the API has them: the kubelet's status
    // merge keeps every condition it does not own.
    conditions.extend(
        pod.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .filter(|c| !conditions_owned(&c.type_))
            .cloned(),
    );

    PodStatus {
        phase: Some(phase.into()),
        conditions: Some(conditions),
        host_ip: (!i.host_ip.is_empty()).then(|| i.host_ip.to_string()),
        host_ips: (!i.host_ip.is_empty()).then(|| {
            vec![HostIP {
                ip: i.host_ip.to_string(),
            }]
        }),
        pod_ip: ips.first().cloned(),
        pod_ips: (!ips.is_empty()).then(|| ips.iter().map(|ip| PodIP { ip: ip.clone() }).collect()),
        start_time: Some(Time(i.start_time)),
        init_container_statuses: (!init_statuses.is_empty()).then_some(init_statuses),
        container_statuses: Some(statuses),
        ephemeral_container_statuses: (!ephemeral_statuses.is_empty())
            .then_some(ephemeral_statuses),
        qos_class: Some(kube_util::qos::qos_class(pod).as_str().into()),
        ..Default::default()
    }
}

fn terminated_ok(s: &ContainerStatus) -> bool {
    s.state
        .as_ref()
        .and_then(|st| st.terminated.as_ref())
        .is_some_and(|t| t.exit_code == 0)
}

fn container_status(
    spec: &Container,
    init: bool,
    initializing: bool,
    i: &Inputs,
) -> ContainerStatus {
    let latest = i.rt.latest(&spec.name);
    let id_of = |c: &ContainerInfo| format!("{}://{}", i.runtime_name, c.id);
    let mut st = ContainerStatus {
        name: spec.name.clone(),
        image: spec.image.clone().unwrap_or_default(),
        image_id: latest.map(|c| c.image_ref.clone()).unwrap_or_default(),
        container_id: latest.map(id_of),
        restart_count: latest.map(|c| c.restart_count as i32).unwrap_or(0),
        ready: false,
        started: Some(false),
        ..Default::default()
    };
    let waiting = |reason: &str, message: &str| ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.into()),
            message: (!message.is_empty()).then(|| message.to_string()),
        }),
        ..Default::default()
    };
    let recorded = i.waiting.get(&spec.name);
    let last_terminated = |except: &str| {
        i.rt.previous_terminated(&spec.name, except)
            .map(|c| terminated(c, i))
    };
    match (recorded, latest) {
        (Some(w), Some(c)) if c.state == State::Exited => {
            st.state = Some(waiting(&w.reason, &w.message));
            st.last_state = Some(terminated(c, i));
        }
        (Some(w), latest) => {
            st.state = Some(waiting(&w.reason, &w.message));
            st.last_state = latest.and_then(|c| last_terminated(&c.id));
        }
        (None, Some(c)) => match c.state {
            State::Running => {
                st.state = Some(ContainerState {
                    running: Some(ContainerStateRunning {
                        started_at: Some(Time(ns_to_time(c.started_at))),
                    }),
                    ..Default::default()
                });
                // Started once the startup probe passed (or there is
                // none); ready once started and the readiness probe
                // passed (or there is none), as upstream's
                // UpdatePodStatus.
                let started = init || i.probes.started(spec, &c.id);
                st.started = Some(started);
                st.ready = !init && started && i.probes.ready(spec, &c.id);
                st.last_state = last_terminated(&c.id);
            }
            State::Exited => {
                st.state = Some(terminated(c, i));
                st.ready = init && c.exit_code == 0;
                st.last_state = last_terminated(&c.id);
            }
            State::Created | State::Unknown => {
                st.state = Some(waiting("ContainerCreating", ""));
                st.last_state = last_terminated(&c.id);
            }
        },
        (None, None) => {
            let reason = if initializing {
                "PodInitializing"
            } else {
                "ContainerCreating"
            };
            st.state = Some(waiting(reason, ""));
        }
    }
    if st.last_state.is_none() {
        st.last_state = Some(ContainerState::default());
    }
    st
}

fn terminated(c: &ContainerInfo, i: &Inputs) -> ContainerState {
    let reason = if c.reason == "OOMKilled" {
        "OOMKilled".to_string()
    } else if c.exit_code == 0 {
        "Completed".to_string()
    } else {
        "Error".to_string()
    };
    let message = termination_message(c);
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: c.exit_code,
            reason: Some(reason),
            message: (!message.is_empty()).then_some(message),
            started_at: (c.started_at > 0).then(|| Time(ns_to_time(c.started_at))),
            finished_at: (c.finished_at > 0).then(|| Time(ns_to_time(c.finished_at))),
            container_id: Some(format!("{}://{}", i.runtime_name, c.id)),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The container's termination message file, or with
/// FallbackToLogsOnError the tail of its log (80 lines, 2 KiB), as upstream.
fn termination_message(c: &ContainerInfo) -> String {
    let mut msg = c
        .termination_message_file
        .as_deref()
        .and_then(|p| std::fs::read(p).ok())
        .map(|b| String::from_utf8_lossy(&b[..b.len().min(4096)]).into_owned())
        .unwrap_or_default();
    if msg.is_empty() && c.exit_code != 0 && c.termination_message_policy == "FallbackToLogsOnError"
    {
        if let Ok(text) = std::fs::read_to_string(&c.log_path) {
            let lines: Vec<&str> = text.lines().collect();
            let tail: Vec<String> = lines[lines.len().saturating_sub(80)..]
                .iter()
                .map(|l| l.splitn(4, ' ').nth(3).unwrap_or("").to_string())
                .collect();
            let joined = tail.join("\n");
            msg = joined[joined.len().saturating_sub(2048)..].to_string();
        }
    }
    msg
}

/// The kubelet's `getPhase`.
fn phase(pod: &Pod, init: &[ContainerStatus], app: &[ContainerStatus]) -> &'static str {
    let policy = pod.restart_policy();
    let (mut pending_init, mut failed_init) = (0, 0);
    for s in init {
        let st = s.state.clone().unwrap_or_default();
        let last = s.last_state.as_ref().and_then(|l| l.terminated.as_ref());
        if let Some(t) = st.terminated {
            if t.exit_code != 0 {
                failed_init += 1;
            }
        } else if st.waiting.is_some() && last.is_some() {
            if last.is_some_and(|t| t.exit_code != 0) {
                failed_init += 1;
            }
        } else {
            pending_init += 1;
        }
    }
    let (mut unknown, mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0, 0);
    for s in app {
        let st = s.state.clone().unwrap_or_default();
        let last = s.last_state.as_ref().and_then(|l| l.terminated.as_ref());
        if st.running.is_some() {
            running += 1;
        } else if let Some(t) = st.terminated {
            stopped += 1;
            if t.exit_code == 0 {
                succeeded += 1;
            }
        } else if st.waiting.is_some() {
            if last.is_some() {
                stopped += 1;
            } else {
                waiting += 1;
            }
        } else {
            unknown += 1;
        }
    }
    if failed_init > 0 && policy == RestartPolicy::Never {
        return "Failed";
    }
    if pending_init > 0 || failed_init > 0 {
        return "Pending";
    }
    if waiting > 0 {
        return "Pending";
    }
    if running > 0 && unknown == 0 {
        return "Running";
    }
    if running == 0 && stopped > 0 && unknown == 0 {
        if policy == RestartPolicy::Always {
            return "Running";
        }
        if stopped == succeeded {
            return "Succeeded";
        }
        if policy == RestartPolicy::Never {
            return "Failed";
        }
        return "Running";
    }
    "Pending"
}

/// Why the pod's readiness gates hold it back, if they do (upstream
/// `GeneratePodReadyCondition`'s wording): each gate's condition, set by
/// another writer, must be True.
fn unready_gates(pod: &Pod) -> Option<String> {
    let gates = pod.spec.as_ref()?.readiness_gates.as_ref()?;
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_deref());
    let why: Vec<String> = gates
        .iter()
        .filter_map(|g| {
            let t = &g.condition_type;
            match conditions.into_iter().flatten().find(|c| &c.type_ == t) {
                None => Some(format!(
                    "corresponding condition of pod readiness gate {t:?} does not exist."
                )),
                Some(c) if c.status != "True" => Some(format!(
                    "the status of pod readiness gate {t:?} is not \"True\", but {}",
                    c.status
                )),
                Some(_) => None,
            }
        })
        .collect();
    (!why.is_empty()).then(|| why.join(", "))
}

/// The pod conditions the kubelet sets (upstream `PodConditionsByKubelet`).
fn conditions_owned(type_: &str) -> bool {
    matches!(
        type_,
        "PodScheduled" | "Ready" | "Initialized" | "ContainersReady" | "PodReadyToStartContainers"
    )
}

pub fn ns_to_time(ns: i64) -> Timestamp {
    Timestamp::from_nanosecond(ns as i128).unwrap_or(Timestamp::UNIX_EPOCH)
}

pub mod manager;
pub mod store;

pub use store::StatusStore;

#[cfg(test)]
mod tests;
