//! The heart of a pod sync: from the desired pod and what the runtime has,
//! decide what to do (the kubelet's `computePodActions`). Pure, so every
//! rule here is unit-tested without a runtime.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::backoff::Backoff;
use crate::pod::{PodExt, RestartPolicy};
use crate::prober::{Kind, PodProbes};
use crate::runtime::container::container_hash;
use crate::runtime::state::{ContainerInfo, PodRuntime, State};

/// A container to start.
#[derive(Debug, Clone, PartialEq)]
pub struct Start {
    pub name: String,
    pub init: bool,
    pub restart_count: u32,
    /// A container created but never started (the agent died in between):
    /// start it rather than create another.
    pub existing: Option<String>,
    /// The previous run of this container, if it crashed: (ran for, key).
    pub previous_run: Option<Duration>,
    /// An ephemeral container's target: the running container whose PID
    /// namespace it joins.
    pub target_id: Option<String>,
}

/// A container waiting on its back-off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    pub name: String,
    pub reason: String,
    pub message: String,
}

/// What a sync must do, in order: kill, stop/remove sandboxes, create the
/// sandbox, start containers, remove dead containers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// Containers to stop: (id, grace seconds, why).
    pub kill: Vec<(String, i64, String)>,
    /// Sandboxes to stop (their containers are in `kill`).
    pub stop_sandboxes: Vec<String>,
    /// Sandboxes to remove entirely.
    pub remove_sandboxes: Vec<String>,
    /// Create a new sandbox with this attempt number.
    pub create_sandbox: Option<u32>,
    pub start: Vec<Start>,
    pub waiting: Vec<Waiting>,
    /// Dead containers beyond the last one per name.
    pub remove_containers: Vec<String>,
    /// Sync again after this long (a back-off ends).
    pub requeue_after: Option<Duration>,
    /// Nothing will run again: the pod is Succeeded or Failed.
    pub terminal: bool,
}

/// Back-off key of a container of a pod.
pub fn backoff_key(uid: &str, name: &str) -> String {
    format!("{uid}/{name}")
}

/// `now_ns`: wall clock in nanoseconds since the epoch, to compare with
/// CRI timestamps; `now`: the monotonic clock the back-off uses.
pub fn compute(pod: &Pod, rt: &PodRuntime, backoff: &Backoff, now: Instant, now_ns: i64) -> Plan {
    compute_probed(pod, rt, &PodProbes::default(), backoff, now, now_ns)
}

/// [`compute`], with the probes' results: a running container whose
/// liveness or startup probe failed is killed, and restarted unless the
/// policy is Never (upstream restarts it in the same sync, as here).
pub fn compute_probed(
    pod: &Pod,
    rt: &PodRuntime,
    probes: &PodProbes,
    backoff: &Backoff,
    now: Instant,
    now_ns: i64,
) -> Plan {
    let mut plan = Plan::default();
    let policy = pod.restart_policy();
    let grace = pod.grace_period_seconds();
    let current = rt.current_sandbox();

    // Extra sandboxes (an older one, or a duplicate left by a RunPodSandbox
    // that timed out but succeeded): stop them and their containers.
    for s in rt.sandboxes.iter().skip(1) {
        if s.ready {
            plan.stop_sandboxes.push(s.id.clone());
        }
        for c in rt
            .containers
            .iter()
            .filter(|c| c.sandbox_id == s.id && c.state != State::Exited)
        {
            plan.kill
                .push((c.id.clone(), grace, "sandbox replaced".into()));
        }
    }

    let needs_sandbox = current.is_none_or(|s| !s.ready);
    if needs_sandbox {
        let ran_before = !rt.containers.is_empty();
        let done = ran_before && pod_finished(pod, rt, policy);
        if done || (ran_before && policy == RestartPolicy::Never) {
            // The kubelet does not recreate the sandbox of a pod that must
            // not restart: it is over.
            plan.terminal = true;
        } else {
            if let Some(s) = current {
                for c in rt
                    .containers
                    .iter()
                    .filter(|c| c.sandbox_id == s.id && c.state != State::Exited)
                {
                    plan.kill.push((c.id.clone(), grace, "sandbox died".into()));
                }
            }
            plan.create_sandbox = Some(current.map(|s| s.attempt + 1).unwrap_or(0));
            // A new sandbox starts over from the first init container.
            match pod.init_containers().first() {
                Some(first) => plan.start.push(start_of(first, true, rt, None)),
                None => {
                    for c in pod.containers() {
                        plan.start.push(start_of(c, false, rt, None));
                    }
                }
            }
        }
        gc_containers(rt, &mut plan);
        return plan;
    }
    let sandbox = current.expect("checked above");

    // Containers the spec no longer has: kill.
    for c in rt.running().filter(|c| c.sandbox_id == sandbox.id) {
        let known = pod
            .containers()
            .iter()
            .chain(pod.init_containers())
            .any(|s| s.name == c.name)
            || pod.ephemeral_containers().iter().any(|e| e.name == c.name);
        if !known {
            plan.kill
                .push((c.id.clone(), grace, "not in the pod spec".into()));
        }
    }

    ephemeral(pod, rt, &sandbox.id, &mut plan);

    // Init containers, one at a time, in order.
    for spec in pod.init_containers() {
        match rt.latest_in(&spec.name, &sandbox.id) {
            None => {
                plan.start.push(start_of(spec, true, rt, None));
                gc_containers(rt, &mut plan);
                return plan;
            }
            Some(c) if c.state == State::Exited && c.exit_code == 0 => continue,
            Some(c) if c.state == State::Exited => {
                if policy == RestartPolicy::Never {
                    plan.terminal = true;
                } else {
                    restart_or_wait(pod, spec, c, true, rt, backoff, now, now_ns, &mut plan);
                }
                gc_containers(rt, &mut plan);
                return plan;
            }
            Some(c) => {
                if c.state == State::Created {
                    plan.start.push(start_of(spec, true, rt, Some(c)));
                } else if c.state == State::Unknown {
                    plan.kill
                        .push((c.id.clone(), grace, "unknown state".into()));
                    plan.start.push(start_of(spec, true, rt, None));
                }
                // Running: wait for it to finish.
                gc_containers(rt, &mut plan);
                return plan;
            }
        }
    }

    // App containers.
    for spec in pod.containers() {
        let Some(c) = rt.latest_in(&spec.name, &sandbox.id) else {
            plan.start.push(start_of(spec, false, rt, None));
            continue;
        };
        match c.state {
            State::Running => {
                if !c.hash.is_empty() && c.hash != container_hash(spec) {
                    plan.kill
                        .push((c.id.clone(), grace, "container spec changed".into()));
                    plan.start.push(start_of(spec, false, rt, None));
                } else if let Some(kind) = probes.failed(&c.id) {
                    let (why, grace) = probe_kill(pod, spec, kind, grace);
                    plan.kill.push((c.id.clone(), grace, why));
                    if policy != RestartPolicy::Never {
                        plan.start.push(start_of(spec, false, rt, None));
                    }
                }
            }
            State::Created => plan.start.push(start_of(spec, false, rt, Some(c))),
            State::Unknown => {
                plan.kill
                    .push((c.id.clone(), grace, "unknown state".into()));
                plan.start.push(start_of(spec, false, rt, None));
            }
            State::Exited => {
                if policy.restarts(c.exit_code) {
                    restart_or_wait(pod, spec, c, false, rt, backoff, now, now_ns, &mut plan);
                }
            }
        }
    }
    if plan.start.is_empty() && plan.waiting.is_empty() && pod_finished(pod, rt, policy) {
        plan.terminal = true;
        if sandbox.ready {
            plan.stop_sandboxes.push(sandbox.id.clone());
        }
    }
    gc_containers(rt, &mut plan);
    plan
}

/// Ephemeral containers never run so far, each started once in the
/// running sandbox whatever the pod's state (the kubelet's
/// `EphemeralContainersToStart`); one with a target waits for the target
/// to run, whose PID namespace it joins.
fn ephemeral(pod: &Pod, rt: &PodRuntime, sandbox: &str, plan: &mut Plan) {
    for e in pod.ephemeral_containers() {
        let existing = match rt.latest(&e.name) {
            None => None,
            // Created, never started (the agent died in between).
            Some(c) if c.state == State::Created && c.sandbox_id == sandbox => Some(c),
            Some(_) => continue,
        };
        let target_id = match e.target_container_name.as_deref().filter(|t| !t.is_empty()) {
            None => None,
            Some(t) => match rt
                .latest_in(t, sandbox)
                .filter(|c| c.state == State::Running)
            {
                Some(c) => Some(c.id.clone()),
                None => continue,
            },
        };
        plan.start.push(Start {
            name: e.name.clone(),
            init: false,
            restart_count: 0,
            existing: existing.map(|c| c.id.clone()),
            previous_run: None,
            target_id,
        });
    }
}

/// The Killing message (upstream's wording, which is also the kill's
/// `why`) and grace period of a kill for a failed liveness / startup
/// probe: the probe's own terminationGracePeriodSeconds when set, unless
/// the pod is being deleted with its own grace.
fn probe_kill(pod: &Pod, spec: &Container, kind: Kind, pod_grace: i64) -> (String, i64) {
    let what = match kind {
        Kind::Startup => "startup",
        _ => "liveness",
    };
    let mut why = format!("Container {} failed {what} probe", spec.name);
    if pod.restart_policy() != RestartPolicy::Never {
        why.push_str(", will be restarted");
    }
    let probe_grace = kind
        .of(spec)
        .and_then(|p| p.termination_grace_period_seconds)
        .filter(|_| pod.metadata.deletion_grace_period_seconds.is_none());
    (why, probe_grace.unwrap_or(pod_grace).max(0))
}

/// Whether a kill's `why` is a probe failure's Killing message.
pub fn is_probe_kill(why: &str) -> bool {
    why.starts_with("Container ")
        && (why.contains(" failed liveness probe") || why.contains(" failed startup probe"))
}

#[allow(clippy::too_many_arguments)]
fn restart_or_wait(
    pod: &Pod,
    spec: &Container,
    c: &ContainerInfo,
    init: bool,
    rt: &PodRuntime,
    backoff: &Backoff,
    now: Instant,
    now_ns: i64,
    plan: &mut Plan,
) {
    let key = backoff_key(pod.uid(), &spec.name);
    let since_finish = Duration::from_nanos((now_ns - c.finished_at).max(0) as u64);
    let finished = now.checked_sub(since_finish).unwrap_or(now);
    match backoff.remaining(&key, finished, now) {
        Some(left) => {
            let delay = backoff.delay(&key).unwrap_or_default();
            plan.waiting.push(Waiting {
                name: spec.name.clone(),
                reason: "CrashLoopBackOff".into(),
                message: format!(
                    "back-off {} restarting failed container={} pod={}_{}({})",
                    kube_util::duration::format_go(delay),
                    spec.name,
                    pod.name(),
                    pod.namespace(),
                    pod.uid()
                ),
            });
            plan.requeue_after = Some(plan.requeue_after.map_or(left, |r| r.min(left)));
        }
        None => {
            let ran = Duration::from_nanos((c.finished_at - c.started_at).max(0) as u64);
            plan.start.push(Start {
                previous_run: Some(ran),
                ..start_of(spec, init, rt, None)
            });
        }
    }
}

fn start_of(
    spec: &Container,
    init: bool,
    rt: &PodRuntime,
    existing: Option<&ContainerInfo>,
) -> Start {
    let restart_count = match existing {
        Some(c) => c.restart_count,
        None => rt
            .latest(&spec.name)
            .map(|c| c.restart_count + 1)
            .unwrap_or(0),
    };
    Start {
        name: spec.name.clone(),
        init,
        restart_count,
        existing: existing.map(|c| c.id.clone()),
        previous_run: None,
        target_id: None,
    }
}

/// All app containers exited and none will run again under the policy;
/// or an init container failed under Never.
fn pod_finished(pod: &Pod, rt: &PodRuntime, policy: RestartPolicy) -> bool {
    if policy == RestartPolicy::Never {
        let init_failed = pod.init_containers().iter().any(|s| {
            rt.latest(&s.name)
                .is_some_and(|c| c.state == State::Exited && c.exit_code != 0)
        });
        if init_failed {
            return true;
        }
    }
    !pod.containers().is_empty()
        && pod.containers().iter().all(|s| match rt.latest(&s.name) {
            Some(c) => c.state == State::Exited && !policy.restarts(c.exit_code),
            None => false,
        })
}

/// Keep the newest dead container per name (for `logs --previous` and
/// lastState); remove older ones. Old not-ready sandboxes whose containers
/// are all gone are removed too.
fn gc_containers(rt: &PodRuntime, plan: &mut Plan) {
    let mut kept_dead: std::collections::HashSet<&str> = std::collections::HashSet::new();
    let mut keep_sandboxes: std::collections::HashSet<&str> = std::collections::HashSet::new();
    if let Some(s) = rt.current_sandbox() {
        keep_sandboxes.insert(&s.id);
    }
    for c in &rt.containers {
        if c.state != State::Exited {
            keep_sandboxes.insert(&c.sandbox_id);
            continue;
        }
        if kept_dead.insert(&c.name) {
            keep_sandboxes.insert(&c.sandbox_id);
        } else {
            plan.remove_containers.push(c.id.clone());
        }
    }
    for s in rt.sandboxes.iter().skip(1) {
        if !keep_sandboxes.contains(s.id.as_str()) {
            plan.remove_sandboxes.push(s.id.clone());
        }
    }
}

#[cfg(test)]
mod tests;
