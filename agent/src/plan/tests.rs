use super::*;
use crate::runtime::state::SandboxInfo;

const SEC: i64 = 1_000_000_000;

fn pod(yaml: &str) -> Pod {
    serde_saphyr::from_str(yaml).unwrap()
}

fn two_containers(policy: &str) -> Pod {
    pod(&format!(
        "metadata: {{name: p, uid: u}}\nspec:\n  restartPolicy: {policy}\n  containers: [{{name: a, image: i}}, {{name: b, image: i}}]\n"
    ))
}

fn sandbox(id: &str, ready: bool, created: i64) -> SandboxInfo {
    SandboxInfo {
        id: id.into(),
        attempt: 0,
        ready,
        created_at: created,
        ips: vec!["198.18.0.2".into()],
    }
}

fn container(pod: &Pod, name: &str, state: State, restarts: u32, exit: i32) -> ContainerInfo {
    ContainerInfo::fake(pod, name, state, restarts, exit, 10 * SEC)
}

fn backoff() -> Backoff {
    Backoff::new(Duration::from_secs(10), Duration::from_secs(300))
}

fn names(plan: &Plan) -> Vec<&str> {
    plan.start.iter().map(|s| s.name.as_str()).collect()
}

#[test]
fn new_pod_creates_sandbox_and_starts_all() {
    let p = two_containers("Always");
    let plan = compute(
        &p,
        &PodRuntime::default(),
        &backoff(),
        Instant::now(),
        100 * SEC,
    );
    assert_eq!(plan.create_sandbox, Some(0));
    assert_eq!(names(&plan), vec!["a", "b"]);
}

#[test]
fn adopted_running_pod_needs_nothing() {
    let p = two_containers("Always");
    let rt = PodRuntime {
        sandboxes: vec![sandbox("s1", true, SEC)],
        containers: vec![
            container(&p, "a", State::Running, 3, 0),
            container(&p, "b", State::Running, 0, 0),
        ],
    };
    let plan = compute(&p, &rt, &backoff(), Instant::now(), 100 * SEC);
    assert_eq!(plan, Plan::default());
}

#[test]
fn changed_spec_restarts_only_that_container() {
    let p = two_containers("Always");
    let mut a = container(&p, "a", State::Running, 0, 0);
    a.hash = "old".into();
    let rt = PodRuntime {
        sandboxes: vec![sandbox("s1", true, SEC)],
        containers: vec![a, container(&p, "b", State::Running, 0, 0)],
    };
    let plan = compute(&p, &rt, &backoff(), Instant::now(), 100 * SEC);
    assert_eq!(plan.kill.len(), 1);
    assert_eq!(names(&plan), vec!["a"]);
    assert_eq!(plan.start[0].restart_count, 1);
}

#[test]
fn init_containers_run_in_order() {
    let p = pod("metadata: {name: p, uid: u}\nspec:\n  initContainers: [{name: i1, image: i}, {name: i2, image: i}]\n  containers: [{name: a, image: i}]\n");
    let s = sandbox("s1", true, SEC);
    let mut rt = PodRuntime {
        sandboxes: vec![s],
        containers: vec![container(&p, "i1", State::Running, 0, 0)],
    };
    let plan = compute(&p, &rt, &backoff(), Instant::now(), 100 * SEC);
    assert!(plan.start.is_empty(), "waits for i1: {plan:?}");
    rt.containers = vec![container(&p, "i1", State::Exited, 0, 0)];
    let plan = compute(&p, &rt, &backoff(), Instant::now(), 100 * SEC);
    assert_eq!(names(&plan), vec!["i2"]);
    rt.containers.push(container(&p, "i2", State::Exited, 0, 0));
    let plan = compute(&p, &rt, &backoff(), Instant::now(), 100 * SEC);
    assert_eq!(names(&plan), vec!["a"]);
    assert!(!plan.start[0].init);
}

#[test]
fn failed_init_under_never_ends_the_pod() {
    let p = pod("metadata: {name: p, uid: u}\nspec:\n  restartPolicy: Never\n  initContainers: [{name: i1, image: i}]\n  containers: [{name: a, image: i}]\n");
    let rt = PodRuntime {
        sandboxes: vec![sandbox("s1", true, SEC)],
        containers: vec![container(&p, "i1", State::Exited, 0, 1)],
    };
    let plan = compute(&p, &rt, &backoff(), Instant::now(), 100 * SEC);
    assert!(plan.terminal);
    assert!(plan.start.is_empty());
}

#[test]
fn restart_policies_on_failure_and_success() {
    for (policy, exit, restarts) in [
        ("Always", 0, true),
        ("Always", 1, true),
        ("OnFailure", 0, false),
        ("OnFailure", 1, true),
        ("Never", 1, false),
    ] {
        let p = pod(&format!(
            "metadata: {{name: p, uid: u}}\nspec:\n  restartPolicy: {policy}\n  containers: [{{name: a, image: i}}]\n"
        ));
        let rt = PodRuntime {
            sandboxes: vec![sandbox("s1", true, SEC)],
            containers: vec![container(&p, "a", State::Exited, 0, exit)],
        };
        let plan = compute(&p, &rt, &backoff(), Instant::now(), 100 * SEC);
        assert_eq!(!plan.start.is_empty(), restarts, "{policy} exit {exit}");
        assert_eq!(plan.terminal, !restarts, "{policy} exit {exit}");
    }
}

#[test]
fn crash_loop_waits_for_backoff() {
    let p = two_containers("Always");
    let rt = PodRuntime {
        sandboxes: vec![sandbox("s1", true, SEC)],
        containers: vec![
            container(&p, "a", State::Exited, 1, 1),
            container(&p, "b", State::Running, 0, 0),
        ],
    };
    let mut b = backoff();
    let now = Instant::now();
    b.next(&backoff_key("u", "a"), now);
    // Finished at 20 s, now 24 s: 6 s of the 10 s back-off left.
    let plan = compute(&p, &rt, &b, now, 24 * SEC);
    assert!(plan.start.is_empty());
    assert_eq!(plan.waiting[0].reason, "CrashLoopBackOff");
    assert!(plan.waiting[0]
        .message
        .starts_with("back-off 10s restarting failed container=a pod=p_default(u)"));
    assert_eq!(plan.requeue_after, Some(Duration::from_secs(6)));
    let plan = compute(&p, &rt, &b, now, 31 * SEC);
    assert_eq!(names(&plan), vec!["a"]);
    assert_eq!(plan.start[0].restart_count, 2);
}

#[test]
fn dead_sandbox_is_replaced_unless_pod_is_over() {
    let p = two_containers("Always");
    let rt = PodRuntime {
        sandboxes: vec![sandbox("s1", false, SEC)],
        containers: vec![
            container(&p, "a", State::Exited, 0, 137),
            container(&p, "b", State::Exited, 0, 137),
        ],
    };
    let plan = compute(&p, &rt, &backoff(), Instant::now(), 100 * SEC);
    assert_eq!(plan.create_sandbox, Some(1));
    assert_eq!(
        plan.start
            .iter()
            .map(|s| s.restart_count)
            .collect::<Vec<_>>(),
        vec![1, 1]
    );
    let p = two_containers("Never");
    let plan = compute(&p, &rt, &backoff(), Instant::now(), 100 * SEC);
    assert_eq!(plan.create_sandbox, None);
    assert!(plan.terminal);
}

#[test]
fn gc_keeps_newest_dead_container_per_name() {
    let p = two_containers("Always");
    let mut old = container(&p, "a", State::Exited, 0, 1);
    old.id = "a-old".into();
    let rt = PodRuntime {
        sandboxes: vec![sandbox("s1", true, SEC)],
        containers: vec![
            container(&p, "a", State::Running, 2, 0),
            container(&p, "a", State::Exited, 1, 1),
            old,
            container(&p, "b", State::Running, 0, 0),
        ],
    };
    let plan = compute(&p, &rt, &backoff(), Instant::now(), 100 * SEC);
    assert_eq!(plan.remove_containers, vec!["a-old"]);
}

#[test]
fn duplicate_sandbox_is_stopped() {
    let p = two_containers("Always");
    let rt = PodRuntime {
        sandboxes: vec![sandbox("s2", true, 2 * SEC), sandbox("s1", true, SEC)],
        containers: vec![],
    };
    let plan = compute(&p, &rt, &backoff(), Instant::now(), 100 * SEC);
    assert_eq!(plan.stop_sandboxes, vec!["s1"]);
    assert_eq!(plan.remove_sandboxes, vec!["s1"]);
}

fn probed(policy: &str) -> Pod {
    pod(&format!(
        "metadata: {{name: p, uid: u}}\nspec:\n  restartPolicy: {policy}\n  terminationGracePeriodSeconds: 30\n  containers:\n  - {{name: a, image: i, livenessProbe: {{exec: {{command: [x]}}, terminationGracePeriodSeconds: 3}}, startupProbe: {{exec: {{command: [x]}}}}}}\n"
    ))
}

#[test]
fn failed_liveness_kills_and_restarts_with_the_probe_grace() {
    use crate::prober::{Kind, Outcome, PodProbes};
    let p = probed("Always");
    let rt = PodRuntime {
        sandboxes: vec![sandbox("s1", true, SEC)],
        containers: vec![container(&p, "a", State::Running, 0, 0)],
    };
    let id = rt.containers[0].id.clone();
    let ok = PodProbes::from_results([(id.clone(), Kind::Liveness, Outcome::Success)]);
    let plan = compute_probed(&p, &rt, &ok, &backoff(), Instant::now(), 100 * SEC);
    assert!(plan.kill.is_empty() && plan.start.is_empty());

    let failed = PodProbes::from_results([(id.clone(), Kind::Liveness, Outcome::Failure)]);
    let plan = compute_probed(&p, &rt, &failed, &backoff(), Instant::now(), 100 * SEC);
    assert_eq!(
        plan.kill,
        vec![(
            id.clone(),
            3,
            "Container a failed liveness probe, will be restarted".to_string()
        )]
    );
    assert!(is_probe_kill(&plan.kill[0].2));
    assert_eq!(names(&plan), vec!["a"]);
    assert_eq!(plan.start[0].restart_count, 1);

    // A failed startup probe: the pod's grace (the probe sets none).
    let failed = PodProbes::from_results([(id.clone(), Kind::Startup, Outcome::Failure)]);
    let plan = compute_probed(&p, &rt, &failed, &backoff(), Instant::now(), 100 * SEC);
    assert_eq!(plan.kill[0].1, 30);
    assert_eq!(
        plan.kill[0].2,
        "Container a failed startup probe, will be restarted"
    );

    // Never: killed, not restarted.
    let p = probed("Never");
    let failed = PodProbes::from_results([(id.clone(), Kind::Liveness, Outcome::Failure)]);
    let plan = compute_probed(&p, &rt, &failed, &backoff(), Instant::now(), 100 * SEC);
    assert_eq!(plan.kill[0].2, "Container a failed liveness probe");
    assert!(plan.start.is_empty());
}

fn with_debugger(target: &str) -> Pod {
    pod(&format!(
        "metadata: {{name: p, uid: u}}\nspec:\n  restartPolicy: Always\n  containers: [{{name: a, image: i}}, {{name: b, image: i}}]\n  ephemeralContainers: [{{name: dbg, image: i, targetContainerName: '{target}'}}]\n"
    ))
}

#[test]
fn ephemeral_container_starts_once_in_the_target_pid_namespace() {
    let p = with_debugger("a");
    let mut rt = PodRuntime {
        sandboxes: vec![sandbox("s1", true, SEC)],
        containers: vec![
            container(&p, "a", State::Running, 0, 0),
            container(&p, "b", State::Running, 0, 0),
        ],
    };
    let plan = compute(&p, &rt, &backoff(), Instant::now(), 100 * SEC);
    assert_eq!(names(&plan), vec!["dbg"]);
    assert_eq!(plan.start[0].target_id.as_deref(), Some("a-0"));
    assert!(plan.kill.is_empty());
    // Running, then exited: never killed as unknown, never restarted.
    rt.containers
        .push(container(&p, "dbg", State::Running, 0, 0));
    let plan = compute(&p, &rt, &backoff(), Instant::now(), 100 * SEC);
    assert_eq!(plan, Plan::default());
    rt.containers.pop();
    rt.containers
        .push(container(&p, "dbg", State::Exited, 0, 1));
    let plan = compute(&p, &rt, &backoff(), Instant::now(), 100 * SEC);
    assert_eq!(plan, Plan::default());
}

#[test]
fn ephemeral_container_waits_for_its_target_and_not_for_a_new_sandbox() {
    let p = with_debugger("a");
    let rt = PodRuntime {
        sandboxes: vec![sandbox("s1", true, SEC)],
        containers: vec![
            container(&p, "a", State::Created, 0, 0),
            container(&p, "b", State::Running, 0, 0),
        ],
    };
    let plan = compute(&p, &rt, &backoff(), Instant::now(), 100 * SEC);
    assert_eq!(names(&plan), vec!["a"]);
    // A new sandbox starts the pod's own containers only.
    let rt = PodRuntime::default();
    let plan = compute(&p, &rt, &backoff(), Instant::now(), 100 * SEC);
    assert_eq!(names(&plan), vec!["a", "b"]);
}
