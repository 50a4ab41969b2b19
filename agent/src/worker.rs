//! Pod workers: one task per pod, so operations on a pod are serialised
//! while pods proceed independently (the kubelet's `podWorkers`). A worker
//! syncs when its pod changes, when the PLEG sees its containers change,
//! when a back-off ends, and every `sync_frequency` in any case.
//!
//! A sync observes (CRI lists), plans (`plan::compute`) and acts; it is
//! idempotent and can be interrupted at any line, because the next sync
//! starts again from what the runtime reports.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cri_proto::v1;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Container, Pod, PodStatus};
use tokio::sync::mpsc;

use crate::backoff::Backoff;
use crate::config::Config;
use crate::events::{Recorder, NORMAL, WARNING};
use crate::plan::{self, Plan, Start};
use crate::pod::PodExt;
use crate::runtime::container::{container_config, ContainerContext};
use crate::runtime::sandbox::{pod_log_dir, sandbox_config, SandboxContext};
use crate::runtime::state::PodRuntime;
use crate::runtime::Runtime;
use crate::status::{self, WaitReason};

/// What the whole node's workers share.
pub struct Shared {
    pub config: Config,
    /// Shared with the PLEG, which prunes its caches on every relist.
    pub runtime: Arc<Runtime>,
    pub recorder: Box<dyn Recorder>,
    pub statuses: Arc<StatusStore>,
    /// CrashLoopBackOff delays, keyed `uid/container`.
    pub crash_backoff: Mutex<Backoff>,
    /// ImagePullBackOff delays, keyed `uid/image/<image>`.
    pub image_backoff: Mutex<Backoff>,
    pub host_ip: String,
    /// Liveness / readiness / startup probe workers and their results.
    pub prober: crate::prober::Prober,
    /// The pods' volumes, and the API objects they and env project.
    pub volumes: crate::volumes::VolumeManager,
    /// Set when the agent serves the cluster DNS itself, on the pod
    /// network's gateway: the node's pod CIDR (sender: the node agent).
    pub served_dns: Option<tokio::sync::watch::Receiver<Option<String>>>,
}

impl Shared {
    /// The nameservers of ClusterFirst pods: `--cluster-dns`, else the
    /// agent's own DNS server on the pod CIDR's gateway (known before any
    /// pod can have a network: the CNI configuration needs the CIDR too).
    pub fn cluster_dns(&self) -> Vec<String> {
        if !self.config.cluster_dns.is_empty() {
            return self.config.cluster_dns.clone();
        }
        let Some(cidr) = &self.served_dns else {
            return Vec::new();
        };
        let cidr = cidr.borrow().clone();
        cidr.as_deref()
            .and_then(crate::network::gateway)
            .map(|ip| vec![ip.to_string()])
            .unwrap_or_default()
    }
}

/// The latest pod and status of every pod the agent runs; read by the
/// status endpoint, and by the status manager, which it wakes on changes.
#[derive(Default)]
pub struct StatusStore {
    inner: std::sync::RwLock<HashMap<String, (Pod, PodStatus)>>,
    /// Pods whose status changed since the status manager last looked.
    dirty: Mutex<HashSet<String>>,
    changed: tokio::sync::Notify,
}

impl StatusStore {
    pub fn set(&self, pod: &Pod, status: PodStatus) {
        let uid = pod.uid().to_string();
        let mut m = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let same = m.get(&uid).is_some_and(|(_, s)| *s == status);
        m.insert(uid.clone(), (pod.clone(), status));
        drop(m);
        if !same {
            self.mark_dirty(uid);
        }
    }
    pub fn remove(&self, uid: &str) {
        self.inner
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
    }
    pub fn get(&self, uid: &str) -> Option<(Pod, PodStatus)> {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(uid)
            .cloned()
    }
    /// Every pod with its status, sorted by namespace and name.
    pub fn list(&self) -> Vec<Pod> {
        let m = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let mut pods: Vec<Pod> = m
            .values()
            .map(|(p, s)| {
                let mut p = p.clone();
                p.status = Some(s.clone());
                p
            })
            .collect();
        pods.sort_by(|a, b| (a.namespace(), a.name()).cmp(&(b.namespace(), b.name())));
        pods
    }
    /// Ask the status manager to look at `uid` again.
    pub fn mark_dirty(&self, uid: String) {
        self.dirty
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(uid);
        self.changed.notify_one();
    }
    /// Wait until some status changed, then take the changed pods' uids.
    pub async fn take_dirty(&self) -> HashSet<String> {
        loop {
            let taken = std::mem::take(&mut *self.dirty.lock().unwrap_or_else(|e| e.into_inner()));
            if !taken.is_empty() {
                return taken;
            }
            self.changed.notified().await;
        }
    }
    /// Every pod's uid.
    pub fn uids(&self) -> Vec<String> {
        let m = self.inner.read().unwrap_or_else(|e| e.into_inner());
        m.keys().cloned().collect()
    }
}

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
    /// The node shuts down: stop the pod within `grace` seconds, report it
    /// Failed, never start it again; `done` fires once it is stopped.
    Shutdown {
        grace: i64,
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
    // Node shutdown: the grace and who waits; `halted` once stopped.
    let mut shutdown: Option<(i64, Option<tokio::sync::oneshot::Sender<()>>)> = None;
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
                    Msg::Shutdown { grace, done } => shutdown = Some((grace, Some(done))),
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
            (None, Some(p)) if shutdown.is_some() => {
                let grace = shutdown.as_ref().map_or(0, |(g, _)| *g);
                let r = stop_for_shutdown(&shared, p, grace, &mut st).await;
                if r.is_ok() {
                    halted = true;
                }
                r.map(|()| None)
            }
            (None, Some(p)) => sync(&shared, p, &mut st).await,
            (None, None) => Ok(None),
        };
        if halted || pod.is_none() {
            if let Some(done) = shutdown.as_mut().and_then(|(_, d)| d.take()) {
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
        let r = plan
            .requeue_after
            .map_or(VOLUME_RETRY, |r| r.min(VOLUME_RETRY));
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
        let spec = find_container(pod, &w.name);
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

fn find_container<'a>(pod: &'a Pod, name: &str) -> Option<&'a Container> {
    pod.containers()
        .iter()
        .chain(pod.init_containers())
        .find(|c| c.name == name)
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
        match create_sandbox(shared, pod, attempt).await {
            Ok(s) => sandbox = Some(s),
            Err(e) => {
                let msg = format!("Failed to create pod sandbox: {e}");
                shared
                    .recorder
                    .event(pod, WARNING, "FailedCreatePodSandBox", &msg);
                return Err(e);
            }
        }
    }
    let mut requeue = None;
    if let Some((sandbox_id, ip)) = &sandbox {
        let dns = shared.cluster_dns();
        let sandbox_cfg = sandbox_config(
            pod,
            plan.create_sandbox.unwrap_or(0),
            &sandbox_ctx(&shared.config, &dns),
        );
        for start in &plan.start {
            let ctx = StartCtx {
                sandbox_id,
                sandbox_cfg: &sandbox_cfg,
                pod_ip: ip.as_deref().unwrap_or(""),
            };
            match start_container(shared, pod, start, &ctx).await {
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

async fn create_sandbox(
    shared: &Shared,
    pod: &Pod,
    attempt: u32,
) -> Result<(String, Option<String>), cri_proto::Error> {
    let dns = shared.cluster_dns();
    let cfg = sandbox_config(pod, attempt, &sandbox_ctx(&shared.config, &dns));
    if let Err(e) = std::fs::create_dir_all(&cfg.log_directory) {
        tracing::warn!(pod = %pod.key(), "cannot create log directory {}: {e}", cfg.log_directory);
    }
    let handler = pod
        .spec
        .as_ref()
        .and_then(|s| s.runtime_class_name.clone())
        .unwrap_or_default();
    let id = shared
        .runtime
        .cri
        .run_pod_sandbox(v1::RunPodSandboxRequest {
            config: Some(cfg),
            runtime_handler: handler,
        })
        .await?
        .pod_sandbox_id;
    let status = shared
        .runtime
        .cri
        .pod_sandbox_status(v1::PodSandboxStatusRequest {
            pod_sandbox_id: id.clone(),
            verbose: false,
        })
        .await?;
    let ip = status
        .status
        .as_ref()
        .and_then(|s| crate::runtime::state::sandbox_ips(s).into_iter().next());
    tracing::info!(pod = %pod.key(), sandbox = %id, ip = ip.as_deref().unwrap_or(""), "sandbox started");
    Ok((id, ip))
}

fn sandbox_ctx<'a>(c: &'a Config, cluster_dns: &'a [String]) -> SandboxContext<'a> {
    SandboxContext {
        pod_log_dir: &c.pod_log_dir,
        cluster_dns,
        cluster_domain: &c.cluster_domain,
    }
}

struct StartCtx<'a> {
    sandbox_id: &'a str,
    sandbox_cfg: &'a v1::PodSandboxConfig,
    pod_ip: &'a str,
}

enum StartError {
    /// The container waits with this reason; sync again after the delay.
    Wait(WaitReason, Option<Duration>),
    /// The runtime itself failed: the whole sync retries.
    Runtime(cri_proto::Error),
}

fn wait(reason: &str, message: String) -> StartError {
    StartError::Wait(
        WaitReason {
            reason: reason.into(),
            message,
        },
        None,
    )
}

async fn start_container(
    shared: &Shared,
    pod: &Pod,
    start: &Start,
    ctx: &StartCtx<'_>,
) -> Result<(), StartError> {
    let cri = &shared.runtime.cri;
    let Some(spec) = find_container(pod, &start.name) else {
        return Ok(());
    };
    let id = match &start.existing {
        Some(id) => id.clone(),
        None => {
            ensure_image(shared, pod, spec, ctx.sandbox_cfg).await?;
            let objects = env_objects(shared, pod, spec).await;
            let volumes = shared.volumes.paths(pod);
            let container_dir = shared
                .config
                .root_dir
                .join("pods")
                .join(pod.uid())
                .join("containers")
                .join(&spec.name);
            let cctx = ContainerContext {
                node_name: &shared.config.node_name,
                pod_ip: ctx.pod_ip,
                host_ip: &shared.host_ip,
                container_dir: &container_dir,
                objects: objects.as_ref(),
                volumes: &volumes,
            };
            let cfg = match container_config(pod, spec, start.restart_count, &cctx) {
                Ok(c) => c,
                Err(e) => {
                    let msg = e.to_string();
                    shared
                        .recorder
                        .event(pod, WARNING, "Failed", &format!("Error: {msg}"));
                    // Retried soon: the missing configMap or secret may
                    // appear at any moment (without an API connection it
                    // cannot: then at the sync period).
                    let w = WaitReason {
                        reason: "CreateContainerConfigError".into(),
                        message: msg,
                    };
                    let retry = shared.volumes.objects().map(|_| VOLUME_RETRY);
                    return Err(StartError::Wait(w, retry));
                }
            };
            let log_dir = pod_log_dir(&shared.config.pod_log_dir, pod).join(&spec.name);
            let _ = std::fs::create_dir_all(&log_dir);
            let req = v1::CreateContainerRequest {
                pod_sandbox_id: ctx.sandbox_id.to_string(),
                config: Some(cfg),
                sandbox_config: Some(ctx.sandbox_cfg.clone()),
            };
            match cri.create_container(req).await {
                Ok(r) => r.container_id,
                Err(e) if e.is_unavailable() => return Err(StartError::Runtime(e)),
                Err(e) => {
                    let msg = status_message(&e);
                    shared
                        .recorder
                        .event(pod, WARNING, "Failed", &format!("Error: {msg}"));
                    return Err(wait("CreateContainerError", msg));
                }
            }
        }
    };
    shared.recorder.event(
        pod,
        NORMAL,
        "Created",
        &format!("Created container: {}", spec.name),
    );
    if let Some(ran) = start.previous_run {
        // A restart after a crash: the back-off grows, unless the container
        // had run long enough to count as healthy.
        let key = plan::backoff_key(pod.uid(), &spec.name);
        let mut b = shared
            .crash_backoff
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if ran >= shared.config.backoff_reset {
            b.reset(&key);
        }
        b.next(&key, Instant::now());
    }
    match cri
        .start_container(v1::StartContainerRequest {
            container_id: id.clone(),
        })
        .await
    {
        Ok(_) => {
            shared.recorder.event(
                pod,
                NORMAL,
                "Started",
                &format!("Started container {}", spec.name),
            );
            crate::lifecycle::post_start(shared, pod, spec, &id, ctx.pod_ip)
                .await
                .map_err(|w| StartError::Wait(w, None))
        }
        Err(e) if e.is_unavailable() => Err(StartError::Runtime(e)),
        Err(e) => {
            let msg = status_message(&e);
            shared
                .recorder
                .event(pod, WARNING, "Failed", &format!("Error: {msg}"));
            // The created container is left for the next sync to see as
            // exited/created; the failure shows as its waiting reason.
            Err(wait("RunContainerError", msg))
        }
    }
}

fn status_message(e: &cri_proto::Error) -> String {
    match e {
        cri_proto::Error::Status { status, .. } => status.message().to_string(),
        other => other.to_string(),
    }
}

/// Pull the image as imagePullPolicy says, with ImagePullBackOff.
async fn ensure_image(
    shared: &Shared,
    pod: &Pod,
    c: &Container,
    sandbox: &v1::PodSandboxConfig,
) -> Result<(), StartError> {
    let image = c.image.clone().unwrap_or_default();
    let policy = c
        .image_pull_policy
        .clone()
        .unwrap_or_else(|| crate::source::defaults::default_pull_policy(&image).to_string());
    let cri = &shared.runtime.cri;
    let spec = v1::ImageSpec {
        image: image.clone(),
        ..Default::default()
    };
    let present = match cri
        .image_status(v1::ImageStatusRequest {
            image: Some(spec.clone()),
            verbose: false,
        })
        .await
    {
        Ok(r) => r.image.is_some(),
        Err(e) if e.is_unavailable() => return Err(StartError::Runtime(e)),
        Err(e) => return Err(wait("InvalidImageName", status_message(&e))),
    };
    let already_present = || {
        let msg = format!("Container image \"{image}\" already present on machine");
        shared.recorder.event(pod, NORMAL, "Pulled", &msg);
    };
    if policy == "Never" {
        if present {
            already_present();
            return Ok(());
        }
        let msg = format!("Container image \"{image}\" is not present with pull policy of Never");
        shared
            .recorder
            .event(pod, WARNING, "ErrImageNeverPull", &msg);
        return Err(wait("ErrImageNeverPull", msg));
    }
    if present && policy == "IfNotPresent" {
        already_present();
        return Ok(());
    }
    let key = format!("{}/image/{image}", pod.uid());
    let left = shared
        .image_backoff
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remaining_since_update(&key, Instant::now());
    if let Some(left) = left {
        let msg = format!("Back-off pulling image \"{image}\"");
        return Err(StartError::Wait(
            WaitReason {
                reason: "ImagePullBackOff".into(),
                message: msg,
            },
            Some(left),
        ));
    }
    shared.recorder.event(
        pod,
        NORMAL,
        "Pulling",
        &format!("Pulling image \"{image}\""),
    );
    let started = Instant::now();
    let req = v1::PullImageRequest {
        image: Some(spec),
        auth: None,
        sandbox_config: Some(sandbox.clone()),
    };
    match cri.pull_image(req).await {
        Ok(pulled) => {
            let took = started.elapsed();
            shared
                .image_backoff
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .reset(&key);
            // The kubelet reports the pulled image's size from ImageStatus.
            let size = cri
                .image_status(v1::ImageStatusRequest {
                    image: Some(v1::ImageSpec {
                        image: pulled.image_ref,
                        ..Default::default()
                    }),
                    verbose: false,
                })
                .await
                .ok()
                .and_then(|r| r.image)
                .map_or(0, |i| i.size);
            // No pull queue here: the wait is the pull itself.
            let took = crate::events::go_duration(took);
            let msg = format!(
                "Successfully pulled image \"{image}\" in {took} ({took} including waiting). Image size: {size} bytes."
            );
            shared.recorder.event(pod, NORMAL, "Pulled", &msg);
            Ok(())
        }
        Err(e) => {
            let delay = shared
                .image_backoff
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .next(&key, Instant::now());
            let msg = format!("Failed to pull image \"{image}\": {}", status_message(&e));
            shared.recorder.event(pod, WARNING, "Failed", &msg);
            Err(StartError::Wait(
                WaitReason {
                    reason: "ErrImagePull".into(),
                    message: msg,
                },
                Some(delay),
            ))
        }
    }
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
    shared
        .image_backoff
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .forget_prefix(uid);
    let name = pod
        .map(|p| p.key())
        .unwrap_or_else(|| format!("orphan {uid}"));
    tracing::info!(pod = %name, "pod removed");
    Ok(())
}

/// Stop the pod for the node's shutdown (preStop hooks, then containers
/// and sandboxes within `grace`), and report it Failed: it stays in the
/// runtime and the API as a finished pod, as the kubelet leaves it.
async fn stop_for_shutdown(
    shared: &Shared,
    pod: &Pod,
    grace: i64,
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
    let rt = shared.runtime.observe_pod(pod.uid()).await?;
    report(shared, pod, &rt, st);
    if let Some(mut status) = st.previous.clone() {
        crate::shutdown::mark_terminated(&mut status);
        shared.statuses.set(pod, status.clone());
        st.previous = Some(status);
    }
    tracing::info!(pod = %pod.key(), grace, "pod stopped for the node's shutdown");
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

/// How soon a pod waiting for a volume or an env object tries again.
const VOLUME_RETRY: Duration = Duration::from_secs(1);

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

/// The configMaps and secrets the container's env names; None without an
/// API connection. Skipped envFrom keys are reported as upstream.
async fn env_objects(
    shared: &Shared,
    pod: &Pod,
    c: &Container,
) -> Option<crate::volumes::objects::EnvObjects> {
    let objects = shared
        .volumes
        .objects()?
        .for_container(pod.namespace(), c)
        .await;
    for msg in crate::runtime::container::env_from_invalid_keys(pod, c, &objects) {
        shared
            .recorder
            .event(pod, WARNING, "InvalidEnvironmentVariableNames", &msg);
    }
    Some(objects)
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
