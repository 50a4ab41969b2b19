//! Container lifecycle hooks (the kubelet's `lifecycle/handlers.go` and the
//! hook steps of `kuberuntime_container.go`): postStart runs right after
//! StartContainer, and a failure kills the container (FailedPostStartHook);
//! preStop runs before the stop signal, within the grace period, and the
//! stop gets what is left of it (a failure is reported, the stop goes on).
//! Handlers: exec (CRI ExecSync), httpGet (status codes are not checked,
//! as upstream: only a request that gets no response fails) and sleep.

use std::time::{Duration, Instant};

use cri_proto::v1;
use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod};

use crate::events::{NORMAL, WARNING};
use crate::pod::PodExt;
use crate::prober::http;
use crate::runtime::state::{ContainerInfo, PodRuntime, State};
use crate::shared::Shared;
use crate::status::WaitReason;

/// Run postStart for the just started container `id` of `c`. On failure
/// the container has been killed, and the returned reason is what it
/// waits with (`PostStartHookError`) until it is restarted per policy.
///
/// # Errors
/// The hook failed; the reason carries upstream's message.
pub async fn post_start(
    shared: &Shared,
    pod: &Pod,
    c: &Container,
    id: &str,
    pod_ip: &str,
) -> Result<(), WaitReason> {
    let Some(hook) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) else {
        return Ok(());
    };
    let ip = if pod_ip.is_empty() {
        shared.host_ip.as_str()
    } else {
        pod_ip
    };
    let Err(msg) = run(shared, pod, c, id, hook, ip, 0).await else {
        return Ok(());
    };
    tracing::warn!(pod = %pod.key(), container = %c.name, "postStart hook failed: {msg}");
    // Upstream keeps the handler's output out of the event (it may hold
    // secrets); the container's waiting message carries it.
    shared
        .recorder
        .event(pod, WARNING, "FailedPostStartHook", "PostStartHook failed");
    shared
        .recorder
        .event(pod, NORMAL, "Killing", "FailedPostStartHook");
    let grace = pod.grace_period_seconds();
    if let Err(e) = stop(shared, pod, &c.name, id, true, grace).await {
        tracing::warn!(pod = %pod.key(), container = %c.name, "cannot kill the container after its postStart hook failed: {e}");
    }
    Err(WaitReason {
        reason: "PostStartHookError".into(),
        message: msg,
    })
}

/// Stop container `c` of `pod` as the kubelet's `killContainer`: its
/// preStop hook first (when it is running), then StopContainer with the
/// grace left. The caller has recorded the Killing event.
///
/// # Errors
/// StopContainer failed.
pub async fn stop_container(
    shared: &Shared,
    pod: &Pod,
    c: &ContainerInfo,
    grace: i64,
) -> Result<(), cri_proto::Error> {
    let running = c.state == State::Running;
    stop(shared, pod, &c.name, &c.id, running, grace).await
}

/// Stop every live container of a pod in parallel, each after its preStop
/// hook; `grace` overrides each container's own.
///
/// # Errors
/// The first StopContainer that failed.
pub async fn stop_pod(
    shared: &Shared,
    pod: &Pod,
    rt: &PodRuntime,
    grace: Option<i64>,
) -> Result<(), cri_proto::Error> {
    let stops = rt
        .running()
        .map(|c| stop_container(shared, pod, c, grace.unwrap_or(c.grace_period)));
    for r in futures::future::join_all(stops).await {
        r?;
    }
    Ok(())
}

async fn stop(
    shared: &Shared,
    pod: &Pod,
    name: &str,
    id: &str,
    running: bool,
    grace: i64,
) -> Result<(), cri_proto::Error> {
    let spec = pod.containers().iter().find(|c| c.name == name);
    let hook = spec.and_then(|c| c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()));
    let mut grace = grace;
    if let (Some(spec), Some(hook), true, true) = (spec, hook, running, grace > 0) {
        let began = Instant::now();
        let ip = shared
            .statuses
            .get(pod.uid())
            .and_then(|(_, s)| s.pod_ip)
            .unwrap_or_else(|| shared.host_ip.clone());
        let limit = Duration::from_secs(grace as u64);
        match tokio::time::timeout(limit, run(shared, pod, spec, id, hook, &ip, grace)).await {
            Ok(Ok(())) => {
                tracing::debug!(pod = %pod.key(), container = %name, "preStop hook completed")
            }
            Ok(Err(msg)) => {
                tracing::warn!(pod = %pod.key(), container = %name, "preStop hook failed: {msg}");
                shared
                    .recorder
                    .event(pod, WARNING, "FailedPreStopHook", "PreStopHook failed");
            }
            Err(_) => {
                tracing::info!(pod = %pod.key(), container = %name, "preStop hook not completed in the grace period ({grace}s)")
            }
        }
        grace -= began.elapsed().as_secs() as i64;
    }
    shared.runtime.stop_container(id, grace).await
}

/// `name_namespace(uid)`, upstream's `format.Pod`.
fn pod_desc(pod: &Pod) -> String {
    format!("{}_{}({})", pod.name(), pod.namespace(), pod.uid())
}

/// Run one handler; the error is upstream's message for its failure.
/// `exec_timeout`: seconds the runtime gives an exec handler (0: none but
/// the runtime request timeout).
async fn run(
    shared: &Shared,
    pod: &Pod,
    c: &Container,
    id: &str,
    h: &LifecycleHandler,
    pod_ip: &str,
    exec_timeout: i64,
) -> Result<(), String> {
    if let Some(e) = &h.exec {
        let cmd = e.command.clone().unwrap_or_default();
        let req = v1::ExecSyncRequest {
            container_id: id.to_string(),
            cmd: cmd.clone(),
            timeout: exec_timeout,
        };
        let fail = |error: String, output: &str| {
            format!(
                "Exec lifecycle hook ([{}]) for Container {:?} in Pod {:?} failed - error: {error}, message: {output:?}",
                cmd.join(" "),
                c.name,
                pod_desc(pod)
            )
        };
        return match shared.runtime.cri.exec_sync(req).await {
            Ok(r) if r.exit_code == 0 => Ok(()),
            Ok(r) => {
                let stderr = String::from_utf8_lossy(&r.stderr).into_owned();
                let mut all = r.stdout.clone();
                all.extend_from_slice(&r.stderr);
                let error = format!(
                    "command '{}' exited with {}: {stderr}",
                    cmd.join(" "),
                    r.exit_code
                );
                Err(fail(error, &String::from_utf8_lossy(&all)))
            }
            Err(e) => Err(fail(e.to_string(), "")),
        };
    }
    if let Some(g) = &h.http_get {
        let fail = |error: String| {
            format!(
                "HTTP lifecycle hook ({}) for Container {:?} in Pod {:?} failed - error: {error}",
                g.path.as_deref().unwrap_or(""),
                c.name,
                pod_desc(pod)
            )
        };
        let get = http::request(g, c, pod_ip, "lifecycle").map_err(|e| fail(e.to_string()))?;
        // Any response will do: upstream does not look at the status.
        let limit = shared.config.runtime_request_timeout;
        return http::send(&get, Some(limit))
            .await
            .map(|_| ())
            .map_err(fail);
    }
    if let Some(s) = &h.sleep {
        tokio::time::sleep(Duration::from_secs(s.seconds.max(0) as u64)).await;
        return Ok(());
    }
    Err(format!(
        "Cannot run handler: invalid handler for container {:?} in pod {:?}: set one of exec, httpGet or sleep",
        c.name,
        pod_desc(pod)
    ))
}
