use super::*;
use crate::runtime::state::SandboxInfo;
use kube_util::podstatus::display_status_with;

const SEC: i64 = 1_000_000_000;

fn pod(yaml: &str) -> Pod {
    serde_saphyr::from_str(yaml).unwrap()
}

fn c(pod: &Pod, name: &str, state: State, restarts: u32, exit: i32) -> ContainerInfo {
    ContainerInfo {
        id: format!("{name}{restarts}"),
        sandbox_id: "s".into(),
        image_ref: "sha256:abc".into(),
        ..ContainerInfo::fake(pod, name, state, restarts, exit, 2 * SEC)
    }
}

fn rt(containers: Vec<ContainerInfo>, ready: bool) -> PodRuntime {
    PodRuntime {
        sandboxes: vec![SandboxInfo {
            id: "s".into(),
            attempt: 0,
            ready,
            created_at: SEC,
            ips: vec!["198.18.0.7".into()],
        }],
        containers,
    }
}

fn run(p: &Pod, rt: &PodRuntime, waiting: &HashMap<String, WaitReason>) -> PodStatus {
    let now = Timestamp::now();
    compute(
        p,
        &Inputs {
            rt,
            waiting,
            previous: None,
            host_ip: "198.18.0.1",
            runtime_name: "containerd",
            start_time: now,
            now,
            probes: &Default::default(),
        },
    )
}

fn cond<'a>(s: &'a PodStatus, t: &str) -> &'a PodCondition {
    s.conditions
        .as_ref()
        .unwrap()
        .iter()
        .find(|c| c.type_ == t)
        .unwrap()
}

#[test]
fn running_pod_is_ready() {
    let p =
        pod("metadata: {name: p, uid: u}\nspec:\n  containers: [{name: a, image: toolbox:1}]\n");
    let s = run(
        &p,
        &rt(vec![c(&p, "a", State::Running, 0, 0)], true),
        &HashMap::new(),
    );
    assert_eq!(s.phase.as_deref(), Some("Running"));
    assert_eq!(s.pod_ip.as_deref(), Some("198.18.0.7"));
    assert_eq!(cond(&s, "Ready").status, "True");
    assert_eq!(cond(&s, "PodReadyToStartContainers").status, "True");
    let cs = &s.container_statuses.as_ref().unwrap()[0];
    assert!(cs.ready);
    assert_eq!(cs.container_id.as_deref(), Some("containerd://a0"));
    assert_eq!(cs.image_id, "sha256:abc");
    assert_eq!(s.qos_class.as_deref(), Some("BestEffort"));
    assert_eq!(display_status_with(&p, &s), "Running");
}

#[test]
fn crash_loop_shows_waiting_and_last_state() {
    let p = pod("metadata: {name: p, uid: u}\nspec:\n  containers: [{name: a, image: i}]\n");
    let waiting = HashMap::from([(
        "a".to_string(),
        WaitReason {
            reason: "CrashLoopBackOff".into(),
            message: "back-off 10s".into(),
        },
    )]);
    let s = run(
        &p,
        &rt(vec![c(&p, "a", State::Exited, 2, 1)], true),
        &waiting,
    );
    assert_eq!(s.phase.as_deref(), Some("Running"));
    let cs = &s.container_statuses.as_ref().unwrap()[0];
    assert_eq!(cs.restart_count, 2);
    let w = cs.state.as_ref().unwrap().waiting.as_ref().unwrap();
    assert_eq!(w.reason.as_deref(), Some("CrashLoopBackOff"));
    let t = cs.last_state.as_ref().unwrap().terminated.as_ref().unwrap();
    assert_eq!((t.exit_code, t.reason.as_deref()), (1, Some("Error")));
    assert_eq!(
        cond(&s, "Ready").reason.as_deref(),
        Some("ContainersNotReady")
    );
    assert_eq!(display_status_with(&p, &s), "CrashLoopBackOff");
}

#[test]
fn terminal_phases() {
    let never = pod("metadata: {name: p, uid: u}\nspec:\n  restartPolicy: Never\n  containers: [{name: a, image: i}, {name: b, image: i}]\n");
    let s = run(
        &never,
        &rt(
            vec![
                c(&never, "a", State::Exited, 0, 0),
                c(&never, "b", State::Exited, 0, 0),
            ],
            false,
        ),
        &HashMap::new(),
    );
    assert_eq!(s.phase.as_deref(), Some("Succeeded"));
    assert_eq!(cond(&s, "Ready").reason.as_deref(), Some("PodCompleted"));
    assert_eq!(display_status_with(&never, &s), "Completed");
    // kubectl reports the first container's reason.
    let s = run(
        &never,
        &rt(
            vec![
                c(&never, "a", State::Exited, 0, 2),
                c(&never, "b", State::Exited, 0, 0),
            ],
            false,
        ),
        &HashMap::new(),
    );
    assert_eq!(s.phase.as_deref(), Some("Failed"));
    assert_eq!(display_status_with(&never, &s), "Error");
}

#[test]
fn initializing_pod_is_pending() {
    let p = pod("metadata: {name: p, uid: u}\nspec:\n  initContainers: [{name: i1, image: i}]\n  containers: [{name: a, image: i}]\n");
    let s = run(
        &p,
        &rt(vec![c(&p, "i1", State::Running, 0, 0)], true),
        &HashMap::new(),
    );
    assert_eq!(s.phase.as_deref(), Some("Pending"));
    assert_eq!(cond(&s, "Initialized").status, "False");
    let a = &s.container_statuses.as_ref().unwrap()[0];
    assert_eq!(
        a.state
            .as_ref()
            .unwrap()
            .waiting
            .as_ref()
            .unwrap()
            .reason
            .as_deref(),
        Some("PodInitializing")
    );
    assert_eq!(display_status_with(&p, &s), "Init:0/1");
}

#[test]
fn image_pull_error_is_pending() {
    let p = pod("metadata: {name: p, uid: u}\nspec:\n  containers: [{name: a, image: nope:1}]\n");
    let waiting = HashMap::from([(
        "a".to_string(),
        WaitReason {
            reason: "ImagePullBackOff".into(),
            message: "Back-off pulling image \"nope:1\"".into(),
        },
    )]);
    let s = run(&p, &rt(vec![], true), &waiting);
    assert_eq!(s.phase.as_deref(), Some("Pending"));
    assert_eq!(display_status_with(&p, &s), "ImagePullBackOff");
}

#[test]
fn probes_drive_started_ready_and_conditions() {
    use crate::prober::{Kind, Outcome, PodProbes};
    let p = pod("metadata: {name: p, uid: u}\nspec:\n  containers:\n  - {name: a, image: toolbox:1, readinessProbe: {exec: {command: [x]}}, startupProbe: {exec: {command: [x]}}}\n");
    let rt = rt(vec![c(&p, "a", State::Running, 0, 0)], true);
    let id = rt.containers[0].id.clone();
    let with = |probes: &PodProbes| {
        let now = Timestamp::now();
        compute(
            &p,
            &Inputs {
                rt: &rt,
                waiting: &HashMap::new(),
                previous: None,
                host_ip: "198.18.0.1",
                runtime_name: "containerd",
                start_time: now,
                now,
                probes,
            },
        )
    };
    // Nothing probed yet: not started, not ready.
    let s = with(&PodProbes::default());
    let cs = &s.container_statuses.as_ref().unwrap()[0];
    assert_eq!((cs.started, cs.ready), (Some(false), false));
    assert_eq!(cond(&s, "Ready").status, "False");
    assert_eq!(
        cond(&s, "ContainersReady").message.as_deref(),
        Some("containers with unready status: [a]")
    );
    // Started, readiness not yet passed.
    let s = with(&PodProbes::from_results([(
        id.clone(),
        Kind::Startup,
        Outcome::Success,
    )]));
    let cs = &s.container_statuses.as_ref().unwrap()[0];
    assert_eq!((cs.started, cs.ready), (Some(true), false));
    // Readiness passed too, but it only counts once started.
    let s = with(&PodProbes::from_results([(
        id.clone(),
        Kind::Readiness,
        Outcome::Success,
    )]));
    assert!(!s.container_statuses.as_ref().unwrap()[0].ready);
    let s = with(&PodProbes::from_results([
        (id.clone(), Kind::Startup, Outcome::Success),
        (id.clone(), Kind::Readiness, Outcome::Success),
    ]));
    assert!(s.container_statuses.as_ref().unwrap()[0].ready);
    assert_eq!(cond(&s, "Ready").status, "True");
    assert_eq!(cond(&s, "ContainersReady").status, "True");
}

#[test]
fn ephemeral_containers_are_reported_never_ready_and_apart() {
    let p = pod("metadata: {name: p, uid: u}\nspec:\n  containers: [{name: a, image: i}]\n  ephemeralContainers: [{name: dbg, image: busybox}, {name: later, image: busybox}]\n");
    let s = run(
        &p,
        &rt(
            vec![
                c(&p, "a", State::Running, 0, 0),
                c(&p, "dbg", State::Exited, 0, 0),
            ],
            true,
        ),
        &HashMap::new(),
    );
    assert_eq!(s.phase.as_deref(), Some("Running"));
    assert_eq!(cond(&s, "Ready").status, "True");
    let e = s.ephemeral_container_statuses.as_ref().unwrap();
    assert_eq!(e.len(), 2);
    assert_eq!(e[0].name, "dbg");
    assert_eq!(e[0].image, "busybox");
    assert_eq!(e[0].container_id.as_deref(), Some("containerd://dbg0"));
    assert_eq!(e[0].image_id, "sha256:abc");
    assert!(!e[0].ready);
    let t = e[0].state.as_ref().unwrap().terminated.as_ref().unwrap();
    assert_eq!((t.exit_code, t.reason.as_deref()), (0, Some("Completed")));
    let w = e[1].state.as_ref().unwrap().waiting.as_ref().unwrap();
    assert_eq!(w.reason.as_deref(), Some("ContainerCreating"));
}

#[test]
fn conditions_of_other_writers_are_kept() {
    let p = pod("metadata: {name: p, uid: u}\nspec:\n  containers: [{name: a, image: toolbox:1}]\nstatus:\n  conditions:\n  - {type: DisruptionTarget, status: 'True', reason: EvictionByEvictionAPI}\n  - {type: Ready, status: 'True'}\n  - {type: example.com/gate, status: 'False'}\n");
    let s = run(
        &p,
        &rt(vec![c(&p, "a", State::Exited, 0, 137)], false),
        &HashMap::new(),
    );
    assert_eq!(
        cond(&s, "DisruptionTarget").reason.as_deref(),
        Some("EvictionByEvictionAPI")
    );
    assert_eq!(cond(&s, "example.com/gate").status, "False");
    // What the agent owns is its own: one Ready, and it says not ready.
    let ready: Vec<_> = s
        .conditions
        .iter()
        .flatten()
        .filter(|c| c.type_ == "Ready")
        .collect();
    assert_eq!(ready.len(), 1);
    assert_eq!(ready[0].status, "False");
}

#[test]
fn readiness_gates_hold_ready_back_until_true() {
    let yaml = |gate: &str| {
        format!("metadata: {{name: p, uid: u}}\nspec:\n  readinessGates: [{{conditionType: example.com/lb}}]\n  containers: [{{name: a, image: toolbox:1}}]\nstatus:\n  conditions: [{gate}]\n")
    };
    let run_with = |gate: &str| {
        let p = pod(&yaml(gate));
        run(
            &p,
            &rt(vec![c(&p, "a", State::Running, 0, 0)], true),
            &HashMap::new(),
        )
    };
    let s = run_with("");
    assert_eq!(cond(&s, "ContainersReady").status, "True");
    let ready = cond(&s, "Ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_deref()),
        ("False", Some("ReadinessGatesNotReady"))
    );
    assert_eq!(
        ready.message.as_deref(),
        Some("corresponding condition of pod readiness gate \"example.com/lb\" does not exist.")
    );
    let s = run_with("{type: example.com/lb, status: 'False'}");
    assert!(cond(&s, "Ready")
        .message
        .as_deref()
        .unwrap()
        .contains("is not \"True\", but False"));
    let s = run_with("{type: example.com/lb, status: 'True'}");
    assert_eq!(cond(&s, "Ready").status, "True");
}
