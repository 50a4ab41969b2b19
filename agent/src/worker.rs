//! Pod workers: one task per pod, so operations on a pod are serialised
//! while pods proceed independently (the kubelet's `podWorkers`). A worker
//! syncs when its pod changes, when the PLEG sees its containers change,
//! when a back-off ends, and every `sync_frequency` in any case.
//!
//! A sync observes (CRI lists), plans (`plan::compute`) and acts; it is
//! idempotent and can be interrupted at any line, because the next sync
//! starts again from what the runtime reports.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use tokio::sync::mpsc;

use crate::events::{NORMAL, WARNING};
use crate::plan::{self, Plan};
use crate::pod::PodExt;
use crate::runtime::sandbox::pod_log_dir;
use crate::runtime::start::{self, StartCtx, StartError};
use crate::runtime::state::PodRuntime;
use crate::shared::Shared;
use crate::status::{self, WaitReason};

/// How soon a pod whose RuntimeClass could not be read tries again.
const RUNTIME_CLASS_RETRY: Duration = Duration::from_secs(10);

/// Messages to a worker. Senders: the pod manager. The worker exits when
/// the channel closes (agent shutdown: containers keep running).
#[derive(Debug)]
pub enum Msg {
    /// The desired pod changed (or is first known).
    Update(Box<Pod>),
    /// Something changed in the runtime: sync now.
    Sync,
    /// Stop and remove the pod; `None` grace: the pod's own.
    Terminate { grace: Option<i64> },
    /// Halt the pod (node shutdown, eviction): stop it within `grace`
    /// seconds, report it Failed as `halt` says, never start it again;
    /// `done` fires once it is stopped.
    Halt {
        grace: i64,
        halt: crate::halt::Halt,
        done: tokio::sync::oneshot::Sender<()>,
    },
}

/// Tells the manager a worker finished tearing its pod down.
pub type DoneTx = mpsc::UnboundedSender<String>;

/// What a worker remembers between syncs.
struct PodState {
    waiting: HashMap<String, WaitReason>,
    start_time: Option<Timestamp>,
    previous: Option<PodStatus>,
    /// When this worker first saw a pod it has to start; None once all its
    /// containers ran (or when it adopted a pod already started).
    first_seen: Option<Instant>,
}

/// Run one pod's worker until it has torn the pod down or its channel
/// closes. `pod` is None for an orphan found in the runtime.
pub async fn run(
    shared: Arc<Shared>,
    uid: String,
    mut pod: Option<Pod>,
    mut rx: mpsc::UnboundedReceiver<Msg>,
    done: DoneTx,
) {
    let mut st = PodState {
        waiting: HashMap::new(),
        start_time: None,
        previous: None,
        first_seen: Some(Instant::now()),
    };
    let mut terminate: Option<Option<i64>> = None;
    // A halt (node shutdown, eviction): the grace, why, and who waits;
    // `halted` once stopped.
    let mut halting: Option<(
        i64,
        crate::halt::Halt,
        Option<tokio::sync::oneshot::Sender<()>>,
    )> = None;
    let mut halted = false;
    let mut next = Instant::now();
    let mut error_delay = Duration::from_millis(500);
    loop {
        tokio::select! {
            msg = rx.recv() => {
                let Some(msg) = msg else { return };
                let mut handle = |m: Msg| match m {
                    Msg::Update(p) => pod = Some(*p),
                    Msg::Sync => {}
                    Msg::Terminate { grace } => terminate = Some(grace),
                    Msg::Halt { grace, halt, done } => halting = Some((grace, halt, Some(done))),
                };
                handle(msg);
                while let Ok(m) = rx.try_recv() {
                    handle(m);
                }
            }
            _ = tokio::time::sleep_until(next.into()) => {}
        }
        let result = match (&terminate, &pod) {
            (Some(grace), _) => match teardown(&shared, &uid, pod.as_ref(), *grace).await {
                Ok(()) => {
                    let _ = done.send(uid.clone());
                    return;
                }
                Err(e) => Err(e),
            },
            (None, Some(_)) if halted => Ok(None),
            (None, Some(p)) if halting.is_some() => {
                let (grace, halt) = halting
                    .as_ref()
                    .map(|(g, h, _)| (*g, h.clone()))
                    .unwrap_or((0, crate::shutdown::halt()));
                let r = halt_pod(&shared, p, grace, &halt, &mut st).await;
                if r.is_ok() {
                    halted = true;
                }
                r.map(|()| None)
            }
            (None, Some(p)) => sync(&shared, p, &mut st).await,
            (None, None) => Ok(None),
        };
        if halted || pod.is_none() {
            if let Some(done) = halting.as_mut().and_then(|(_, _, d)| d.take()) {
                let _ = done.send(());
            }
        }
        match result {
            Ok(requeue) => {
                error_delay = Duration::from_millis(500);
                let period = shared.config.sync_frequency;
                next = Instant::now() + requeue.map_or(period, |r| r.min(period));
            }
            Err(e) => {
                let name = pod.as_ref().map(|p| p.key()).unwrap_or_else(|| uid.clone());
                tracing::warn!(pod = %name, "sync failed, retrying in {:?}: {e}", error_delay);
                next = Instant::now() + error_delay;
                error_delay = (error_delay * 2).min(Duration::from_secs(30));
            }
        }
    }
}

type SyncResult = Result<Option<Duration>, cri_proto::Error>;

/// One sync: observe, plan, act, report. Returns when to sync again.
async fn sync(shared: &Shared, pod: &Pod, st: &mut PodState) -> SyncResult {
    let rt = shared.runtime.observe_pod(pod.uid()).await?;
    if pod.is_terminal() {
        // The API records it as finished: nothing runs again. The status
        // manager keeps the API's terminal status.
        if st.previous.is_none() {
            st.start_time = pod
                .status
                .as_ref()
                .and_then(|s| s.start_time.clone())
                .map(|t| t.0);
            report(shared, pod, &rt, st);
        }
        return Ok(None);
    }
    if st.start_time.is_none() {
        // After an agent restart the pod started when its first sandbox did.
        let first = rt.sandboxes.iter().map(|s| s.created_at).min();
        st.start_time = Some(first.map(status::ns_to_time).unwrap_or_else(Timestamp::now));
        if first.is_some() {
            st.first_seen = None;
        }
    }
    // Node admission (sysctls, AppArmor...) before anything is set up.
    if rt.sandboxes.is_empty() {
        let rejected = crate::runtime::admit::reject_if_refused(shared, pod, st.previous.as_ref());
        if let Some(status) = rejected {
            st.previous = Some(status);
            return Ok(None);
        }
    }
    let volumes = setup_volumes(shared, pod).await;
    let now_ns = Timestamp::now().as_nanosecond() as i64;
    let mut plan = {
        let b = shared
            .crash_backoff
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let probes = shared.prober.results(pod.uid());
        plan::compute_probed(pod, &rt, &probes, &b, Instant::now(), now_ns)
    };
    if volumes.blocked() {
        // Containers wait for their volumes (the kubelet's
        // WaitForAttachAndMount); kills and clean-ups still happen.
        plan.start.clear();
        plan.create_sandbox = None;
        let retry = volumes.retry_after();
        let r = plan.requeue_after.map_or(retry, |r| r.min(retry));
        plan.requeue_after = Some(r);
    }
    st.waiting = plan
        .waiting
        .iter()
        .map(|w| {
            let reason = WaitReason {
                reason: w.reason.clone(),
                message: w.message.clone(),
            };
            (w.name.clone(), reason)
        })
        .collect();
    for w in &plan.waiting {
        let spec = pod.container(&w.name);
        let known = st
            .previous
            .as_ref()
            .is_some_and(|p| waiting_reason(p, &w.name) == Some(w.reason.as_str()));
        if spec.is_some() && !known {
            // Upstream's wording, with format.Pod's `name_namespace(uid)`.
            let msg = format!(
                "Back-off restarting failed container {} in pod {}_{}({})",
                w.name,
                pod.name(),
                pod.namespace(),
                pod.uid()
            );
            shared.recorder.event(pod, WARNING, "BackOff", &msg);
        }
    }
    let mut requeue = plan.requeue_after;
    let acted = !plan.start.is_empty() || !plan_is_only_waiting(&plan);
    let rt = if acted {
        if let Some(r) = act(shared, pod, &rt, &plan, st).await? {
            requeue = Some(requeue.map_or(r, |q| q.min(r)));
        }
        shared.runtime.observe_pod(pod.uid()).await?
    } else {
        rt
    };
    report(shared, pod, &rt, st);
    Ok(requeue)
}

fn plan_is_only_waiting(p: &Plan) -> bool {
    p.kill.is_empty()
        && p.stop_sandboxes.is_empty()
        && p.remove_sandboxes.is_empty()
        && p.create_sandbox.is_none()
        && p.remove_containers.is_empty()
}

fn waiting_reason<'a>(s: &'a PodStatus, name: &str) -> Option<&'a str> {
    s.container_statuses
        .iter()
        .flatten()
        .chain(s.init_container_statuses.iter().flatten())
        .find(|c| c.name == name)
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.waiting.as_ref())
        .and_then(|w| w.reason.as_deref())
}

fn report(shared: &Shared, pod: &Pod, rt: &PodRuntime, st: &mut PodState) {
    let now = Timestamp::now();
    let runtime_name = shared.runtime.name();
    let probes = shared.prober.results(pod.uid());
    let status = status::compute(
        pod,
        &status::Inputs {
            rt,
            waiting: &st.waiting,
            previous: st.previous.as_ref(),
            host_ip: &shared.host_ip,
            runtime_name,
            start_time: st.start_time.unwrap_or(now),
            now,
            probes: &probes,
        },
    );
    shared.prober.update(pod, rt, &status, &probes);
    if st.previous.as_ref().map(|p| p.phase.clone()) != Some(status.phase.clone()) {
        tracing::info!(pod = %pod.key(), phase = status.phase.as_deref().unwrap_or(""), "pod phase");
    }
    shared.statuses.set(pod, status.clone());
    observe_pod_start(st, &status);
    st.previous = Some(status);
}

/// `kubelet_pod_start_duration_seconds`: from first seeing the pod to all
/// its containers running, once per pod.
fn observe_pod_start(st: &mut PodState, status: &PodStatus) {
    let Some(seen) = st.first_seen else { return };
    let containers = status.container_statuses.as_deref().unwrap_or_default();
    let all_running = !containers.is_empty()
        && containers
            .iter()
            .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()));
    if all_running {
        crate::metrics::metrics()
            .pod_start
            .observe(seen.elapsed().as_secs_f64());
        st.first_seen = None;
    }
}

/// Carry out a plan. Returns a requeue delay when an image back-off is
/// pending. Errors from starting a container are recorded as its waiting
/// reason, not returned: the other containers still start.
async fn act(
    shared: &Shared,
    pod: &Pod,
    rt: &PodRuntime,
    plan: &Plan,
    st: &mut PodState,
) -> SyncResult {
    let runtime = &shared.runtime;
    let kills = plan.kill.iter().map(|(id, grace, why)| {
        let info = rt.containers.iter().find(|c| &c.id == id);
        let name = info.map(|c| c.name.clone()).unwrap_or_default();
        // The kubelet's messages: a spec change says so, a failed probe
        // says which (its why is that message), any other kill is plain
        // "Stopping container" (the why stays in the log).
        let msg = if why == "container spec changed" {
            format!("Container {name} definition changed, will be restarted")
        } else if plan::is_probe_kill(why) {
            why.clone()
        } else {
            tracing::debug!(pod = %pod.key(), container = %name, "stopping: {why}");
            format!("Stopping container {name}")
        };
        shared.recorder.event(pod, NORMAL, "Killing", &msg);
        async move {
            match info {
                // preStop first, within the grace period.
                Some(c) => crate::lifecycle::stop_container(shared, pod, c, *grace).await,
                None => runtime.stop_container(id, *grace).await,
            }
        }
    });
    for r in futures::future::join_all(kills).await {
        r?;
    }
    for id in &plan.stop_sandboxes {
        runtime.stop_sandbox(id).await?;
    }
    for id in &plan.remove_sandboxes {
        runtime.remove_sandbox(id).await?;
    }
    let mut sandbox = rt
        .current_sandbox()
        .filter(|s| s.ready)
        .map(|s| (s.id.clone(), s.ips.first().cloned()));
    if let Some(attempt) = plan.create_sandbox {
        let failed = |e: &dyn std::fmt::Display| {
            let msg = format!("Failed to create pod sandbox: {e}");
            shared
                .recorder
                .event(pod, WARNING, "FailedCreatePodSandBox", &msg);
        };
        let handler = match shared.runtime_classes.handler(pod).await {
            Ok(h) => h,
            Err(e) => {
                // As the kubelet: no sandbox, and another try later.
                failed(&e);
                return Ok(Some(RUNTIME_CLASS_RETRY));
            }
        };
        match start::create_sandbox(shared, pod, attempt, handler).await {
            Ok(s) => sandbox = Some(s),
            Err(e) => {
                failed(&e);
                return Err(e);
            }
        }
    }
    let mut requeue = None;
    if let Some((sandbox_id, ip)) = &sandbox {
        let sandbox_cfg = start::sandbox_config_for(shared, pod, plan.create_sandbox.unwrap_or(0));
        for start in &plan.start {
            let ctx = StartCtx {
                sandbox_id,
                sandbox_cfg: &sandbox_cfg,
                pod_ip: ip.as_deref().unwrap_or(""),
            };
            match start::start_container(shared, pod, start, &ctx).await {
                Ok(()) => {
                    st.waiting.remove(&start.name);
                }
                Err(StartError::Wait(w, r)) => {
                    st.waiting.insert(start.name.clone(), w);
                    requeue = r.or(requeue);
                    if start.init {
                        break;
                    }
                }
                Err(StartError::Runtime(e)) => return Err(e),
            }
        }
    }
    for id in &plan.remove_containers {
        if let Err(e) = runtime.remove_container(id).await {
            tracing::warn!(pod = %pod.key(), container = %id, "cannot remove dead container: {e}");
            continue;
        }
        // Its logs go with it (the kubelet's log manager Clean).
        if let Some(c) = rt.containers.iter().find(|c| &c.id == id) {
            crate::logs::remove_logs(std::path::Path::new(&c.log_path)).await;
        }
    }
    Ok(requeue)
}

/// Stop the pod's containers within the grace period, remove its sandboxes,
/// logs and state. `pod` is None for an orphan.
async fn teardown(
    shared: &Shared,
    uid: &str,
    pod: Option<&Pod>,
    grace: Option<i64>,
) -> Result<(), cri_proto::Error> {
    // A pod going away is not probed any more (nor restarted for it).
    shared.prober.remove_pod(uid);
    let rt = shared.runtime.observe_pod(uid).await?;
    let grace = grace.or(pod.map(|p| p.grace_period_seconds()));
    if let Some(p) = pod {
        for c in rt.running() {
            let msg = format!("Stopping container {}", c.name);
            shared.recorder.event(p, NORMAL, "Killing", &msg);
        }
        // Each container's preStop hook, then its stop.
        crate::lifecycle::stop_pod(shared, p, &rt, grace).await?;
    }
    shared.runtime.teardown_pod(&rt, grace).await?;
    if let Some(p) = pod {
        let _ = std::fs::remove_dir_all(pod_log_dir(&shared.config.pod_log_dir, p));
    } else {
        remove_log_dirs_of(&shared.config.pod_log_dir, uid);
    }
    if teardown_volumes(shared, uid, pod).await {
        let _ = std::fs::remove_dir_all(shared.config.root_dir.join("pods").join(uid));
    }
    shared.statuses.remove(uid);
    shared
        .crash_backoff
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .forget_prefix(uid);
    shared.images.forget_pod(uid);
    let name = pod
        .map(|p| p.key())
        .unwrap_or_else(|| format!("orphan {uid}"));
    tracing::info!(pod = %name, "pod removed");
    Ok(())
}

/// Halt the pod (preStop hooks, then containers and sandboxes within
/// `grace`), and report it Failed as `halt` says: it stays in the runtime
/// and the API as a finished pod, as the kubelet leaves it.
async fn halt_pod(
    shared: &Shared,
    pod: &Pod,
    grace: i64,
    halt: &crate::halt::Halt,
    st: &mut PodState,
) -> Result<(), cri_proto::Error> {
    shared.prober.remove_pod(pod.uid());
    let rt = shared.runtime.observe_pod(pod.uid()).await?;
    for c in rt.running() {
        let msg = format!("Stopping container {}", c.name);
        shared.recorder.event(pod, NORMAL, "Killing", &msg);
    }
    crate::lifecycle::stop_pod(shared, pod, &rt, Some(grace)).await?;
    for s in &rt.sandboxes {
        shared.runtime.stop_sandbox(&s.id).await?;
    }
    // A finished pod's volumes go, as the kubelet's volume manager drops
    // terminated pods: an evicted pod's emptyDir is what frees the disk.
    teardown_volumes(shared, pod.uid(), Some(pod)).await;
    let rt = shared.runtime.observe_pod(pod.uid()).await?;
    report(shared, pod, &rt, st);
    if let Some(mut status) = st.previous.clone() {
        crate::halt::mark_failed(&mut status, halt);
        shared.statuses.set(pod, status.clone());
        st.previous = Some(status);
    }
    tracing::info!(pod = %pod.key(), grace, reason = halt.reason, "pod halted: {}", halt.message);
    Ok(())
}

/// An orphan's log directory is found by its uid suffix.
pub(crate) fn remove_log_dirs_of(root: &std::path::Path, uid: &str) {
    let suffix = format!("_{uid}");
    for e in std::fs::read_dir(root).into_iter().flatten().flatten() {
        if e.file_name().to_string_lossy().ends_with(&suffix) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Set up (or refresh) the pod's volumes; failures become FailedMount
/// events, paced by the volume manager.
async fn setup_volumes(shared: &Shared, pod: &Pod) -> crate::volumes::Setup {
    let setup = shared.volumes.setup(pod).await;
    for e in setup.errors.iter().filter(|e| e.report) {
        shared
            .recorder
            .event(pod, WARNING, "FailedMount", &e.to_string());
    }
    setup
}

/// Unmount and remove the pod's volumes. A busy mount is detached lazily
/// and reported rather than holding the pod in Terminating. Returns
/// whether the pod's directory may be removed (no mount is left in it).
async fn teardown_volumes(shared: &Shared, uid: &str, pod: Option<&Pod>) -> bool {
    let t = shared.volumes.teardown(uid).await;
    let name = pod.map(|p| p.key()).unwrap_or_else(|| uid.to_string());
    for m in &t.detached {
        let msg = format!(
            "UnmountVolume.TearDown: {} was busy; detached it lazily (it is freed when its last user exits)",
            m.display()
        );
        match pod {
            Some(p) => shared.recorder.event(p, WARNING, "FailedUnmount", &msg),
            None => tracing::warn!(pod = %name, "{msg}"),
        }
    }
    if let Some(f) = &t.failed {
        let msg = format!("UnmountVolume.TearDown failed: {f}; the orphan sweep retries");
        match pod {
            Some(p) => shared.recorder.event(p, WARNING, "FailedUnmount", &msg),
            None => tracing::warn!(pod = %name, "{msg}"),
        }
    }
    t.failed.is_none()
}
