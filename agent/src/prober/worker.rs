//! One probe worker: a task per (pod, container, probe kind), as the
//! kubelet's `prober/worker.go`. It wakes every `periodSeconds` (the first
//! time at a random point of the period, so a node's probes are spread
//! over time rather than fired in one tick), probes the container it is
//! told about, applies the thresholds and stores the standing result.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Pod, Probe};
use tokio::sync::watch;

use super::results::{Kind, Outcome, Thresholds};
use super::{exec, grpc, http, port, tcp, Context, Error, Timing, Verdict};
use crate::events::WARNING;
use crate::pod::{PodExt, RestartPolicy};

/// Upstream retries a probe that errored (not failed) this many times.
const RETRIES: usize = 3;

/// What the pod worker last saw of the probed container. Sender: the
/// prober manager, on every pod status report; the worker ends when the
/// sender is dropped.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub pod: Arc<Pod>,
    /// The newest container of this name; empty before the first exists.
    pub container_id: String,
    pub running: bool,
    pub exited: bool,
    /// When it started, nanoseconds since the epoch.
    pub started_at_ns: i64,
    pub pod_ip: String,
    /// Its startup probe succeeded, or it has none.
    pub started: bool,
    /// The pod is Succeeded or Failed: probing is over.
    pub terminal: bool,
}

/// A worker's fixed inputs.
pub struct Spec {
    pub uid: String,
    pub container: Container,
    pub kind: Kind,
    pub probe: Probe,
}

/// What a worker remembers between probes; reset for every new container.
#[derive(Default)]
struct State {
    container_id: String,
    thresholds: Thresholds,
    /// Liveness / startup failed: wait for the next container.
    on_hold: bool,
}

pub async fn run(ctx: Arc<Context>, spec: Spec, mut target: watch::Receiver<Target>) {
    let timing = Timing::of(&spec.probe);
    // Spread the node's probes over the period.
    let offset = timing.period.mul_f64(rand::random::<f64>());
    let mut ticker = tokio::time::interval_at((Instant::now() + offset).into(), timing.period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut st = State::default();
    loop {
        let manual = tokio::select! {
            _ = ticker.tick() => false,
            r = target.changed() => {
                if r.is_err() {
                    break;
                }
                true
            }
        };
        let t = target.borrow_and_update().clone();
        // A changed target probes at once only for a running container
        // that is not ready yet (upstream's manual readiness trigger), so
        // a new container turns Ready without waiting a whole period.
        if manual && !triggers(&ctx, &spec, &t) {
            continue;
        }
        if !probe_once(&ctx, &spec, &timing, &mut st, &t).await {
            break;
        }
    }
    if !st.container_id.is_empty() {
        ctx.results.remove(&spec.uid, &st.container_id, spec.kind);
    }
}

fn triggers(ctx: &Context, spec: &Spec, t: &Target) -> bool {
    spec.kind == Kind::Readiness
        && t.running
        && t.started
        && ctx.results.get(&spec.uid, &t.container_id, Kind::Readiness) != Some(Outcome::Success)
}

/// One round of upstream's `doProbe`. Returns whether to keep going.
async fn probe_once(
    ctx: &Context,
    spec: &Spec,
    timing: &Timing,
    st: &mut State,
    t: &Target,
) -> bool {
    let (uid, kind) = (spec.uid.as_str(), spec.kind);
    if t.terminal {
        return false;
    }
    if t.container_id.is_empty() {
        return true;
    }
    if t.container_id != st.container_id {
        if !st.container_id.is_empty() {
            ctx.results.remove(uid, &st.container_id, kind);
        }
        *st = State {
            container_id: t.container_id.clone(),
            ..State::default()
        };
        ctx.results.set_initial(uid, &t.container_id, kind);
    }
    if st.on_hold {
        return true;
    }
    if !t.running {
        if t.exited {
            // Readiness of a dead container is false. (Liveness and
            // startup are left alone: only running containers are killed.)
            if kind == Kind::Readiness {
                ctx.results
                    .set(uid, &t.container_id, kind, Outcome::Failure);
            }
            // Nothing more to probe if it will not run again.
            return t.pod.restart_policy() != RestartPolicy::Never;
        }
        return true;
    }
    if t.pod.is_being_deleted() && kind != Kind::Readiness {
        // A pod shutting down is not restarted for failing probes.
        ctx.results
            .set(uid, &t.container_id, kind, Outcome::Success);
        return false;
    }
    let now_ns = jiff::Timestamp::now().as_nanosecond() as i64;
    let running_for = Duration::from_nanos((now_ns - t.started_at_ns).max(0) as u64);
    if running_for < timing.initial_delay {
        return true;
    }
    // The startup probe holds the others back until it succeeds, and has
    // nothing more to do afterwards.
    let started = spec.container.startup_probe.is_none()
        || ctx.results.get(uid, &t.container_id, Kind::Startup) == Some(Outcome::Success);
    if started == (kind == Kind::Startup) {
        return true;
    }

    let began = Instant::now();
    let mut verdict = run_with_retries(ctx, spec, timing, t).await;
    let took = began.elapsed();
    let pod = t.pod.as_ref();
    let outcome = match &mut verdict {
        Err(e) => {
            crate::metrics::metrics().probe(kind.as_str(), "unknown", took);
            let msg = format!("{kind} probe errored and resulted in unknown state: {e}");
            tracing::debug!(pod = %pod.key(), container = %spec.container.name, "{msg}");
            ctx.recorder.event(pod, WARNING, "Unhealthy", &msg);
            // Upstream throws an errored result away.
            return true;
        }
        Ok(Verdict::Success(_)) => Outcome::Success,
        Ok(Verdict::Warning(out)) => {
            let msg = format!("{kind} probe warning: {out}");
            ctx.recorder.event(pod, WARNING, "ProbeWarning", &msg);
            Outcome::Success
        }
        Ok(Verdict::Failure(out)) => {
            let msg = format!("{kind} probe failed: {}", out.trim_end());
            tracing::debug!(pod = %pod.key(), container = %spec.container.name, "{msg}");
            ctx.recorder.event(pod, WARNING, "Unhealthy", &msg);
            Outcome::Failure
        }
    };
    let label = if outcome == Outcome::Success {
        "successful"
    } else {
        "failed"
    };
    crate::metrics::metrics().probe(kind.as_str(), label, took);

    let Some(standing) = st
        .thresholds
        .observe(outcome, timing.success, timing.failure)
    else {
        return true;
    };
    if ctx.results.set(uid, &t.container_id, kind, standing) {
        tracing::info!(
            pod = %pod.key(),
            container = %spec.container.name,
            probe = kind.as_str(),
            result = ?standing,
            "probe result changed"
        );
    }
    if kind != Kind::Readiness && standing == Outcome::Failure {
        // The container will be restarted: wait for the new one.
        st.on_hold = true;
        st.thresholds.reset();
    }
    true
}

async fn run_with_retries(
    ctx: &Context,
    spec: &Spec,
    timing: &Timing,
    t: &Target,
) -> Result<Verdict, Error> {
    let mut last = Err(Error::NoHandler);
    for _ in 0..RETRIES {
        last = run_handler(ctx, spec, timing, t).await;
        if last.is_ok() {
            break;
        }
    }
    last
}

/// Run the probe's handler once.
async fn run_handler(
    ctx: &Context,
    spec: &Spec,
    timing: &Timing,
    t: &Target,
) -> Result<Verdict, Error> {
    let p = &spec.probe;
    let c = &spec.container;
    if let Some(e) = &p.exec {
        // Exec probes cost the node a runtime exec each: a bounded number
        // run at once, the rest wait their turn.
        let _slot = ctx.exec_slots.acquire().await;
        let cmd = e.command.clone().unwrap_or_default();
        return Ok(exec::probe(&ctx.cri, &t.container_id, &cmd, timing.timeout).await?);
    }
    if let Some(h) = &p.http_get {
        if h.host.as_deref().unwrap_or("").is_empty() && t.pod_ip.is_empty() {
            return Err(Error::NoPodIp);
        }
        let get = http::request(h, c, &t.pod_ip, "probe")?;
        return Ok(http::probe(&get, timing.timeout).await);
    }
    if let Some(s) = &p.tcp_socket {
        let host = s
            .host
            .as_deref()
            .filter(|h| !h.is_empty())
            .unwrap_or(&t.pod_ip);
        if host.is_empty() {
            return Err(Error::NoPodIp);
        }
        let port = port::resolve(&s.port, c)?;
        return Ok(tcp::probe(host, port, timing.timeout).await);
    }
    if let Some(g) = &p.grpc {
        if t.pod_ip.is_empty() {
            return Err(Error::NoPodIp);
        }
        let port = u16::try_from(g.port)
            .ok()
            .filter(|p| *p > 0)
            .ok_or(port::PortError::OutOfRange(i64::from(g.port)))?;
        let service = g.service.as_deref().unwrap_or("");
        return Ok(grpc::probe(&t.pod_ip, port, service, timing.timeout).await);
    }
    Err(Error::NoHandler)
}
