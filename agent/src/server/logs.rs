//! `/containerLogs/{namespace}/{pod}/{container}` on the node server: a
//! container's log with the query of `kubectl logs` (follow, tailLines,
//! limitBytes, timestamps, sinceSeconds / sinceTime, previous), streamed
//! as it is read. Which container instance is read, and the errors when
//! there is none, follow the kubelet's `validateContainerLogStatus`.

use std::path::PathBuf;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use cri_proto::{v1, CriClient};
use futures::future::BoxFuture;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodStatus};
use tokio::sync::mpsc;

use super::readonly::ServerState;
use crate::logs::read::{self, Liveness, Options};
use crate::pod::PodExt;

pub fn routes(state: ServerState) -> Router {
    Router::new()
        .route(
            "/containerLogs/{namespace}/{pod}/{container}",
            get(container_logs),
        )
        // The container may be left out when the pod has only one.
        .route("/containerLogs/{namespace}/{pod}", get(only_container_logs))
        .with_state(state)
}

type Params = Query<Vec<(String, String)>>;

async fn container_logs(
    State(s): State<ServerState>,
    Path((namespace, pod, container)): Path<(String, String, String)>,
    Query(query): Params,
) -> Response {
    logs(&s, &namespace, &pod, Some(container), &query)
        .await
        .unwrap_or_else(|e| e.into_response())
}

async fn only_container_logs(
    State(s): State<ServerState>,
    Path((namespace, pod)): Path<(String, String)>,
    Query(query): Params,
) -> Response {
    logs(&s, &namespace, &pod, None, &query)
        .await
        .unwrap_or_else(|e| e.into_response())
}

/// An error response: status and plain-text message.
type Failure = (StatusCode, String);

async fn logs(
    s: &ServerState,
    namespace: &str,
    pod_name: &str,
    container: Option<String>,
    query: &[(String, String)],
) -> Result<Response, Failure> {
    let (opts, previous) = parse_query(query, Timestamp::now())?;
    let pod = s
        .shared
        .statuses
        .list()
        .into_iter()
        .find(|p| p.namespace() == namespace && p.name() == pod_name)
        .ok_or_else(|| {
            (
                StatusCode::NOT_FOUND,
                format!("pod {pod_name:?} does not exist"),
            )
        })?;
    let container = match container.filter(|c| !c.is_empty()) {
        Some(c) => c,
        None => match pod.containers() {
            [only] => only.name.clone(),
            _ => {
                let choices = names(&pod).join(" ");
                let msg = format!(
                    "a container name must be specified for pod {pod_name}, choose one of: [{choices}]"
                );
                return Err((StatusCode::BAD_REQUEST, msg));
            }
        },
    };
    if !names(&pod).contains(&container) {
        return Err((
            StatusCode::NOT_FOUND,
            format!("container {container:?} not found in pod {pod_name:?}"),
        ));
    }
    let status = pod.status.clone().unwrap_or_default();
    let container_id = instance_to_read(pod_name, &status, &container, previous)
        .map_err(|e| (StatusCode::BAD_REQUEST, e))?;
    let id = container_id
        .split_once("://")
        .map_or(container_id.as_str(), |(_, id)| id)
        .to_string();
    let cri = s.shared.runtime.cri.clone();
    let log_path = cri
        .container_status(v1::ContainerStatusRequest {
            container_id: id.clone(),
            verbose: false,
        })
        .await
        .map_err(|e| {
            (
                StatusCode::BAD_REQUEST,
                format!("failed to get container status {container_id:?}: {e}"),
            )
        })?
        .status
        .map(|s| s.log_path)
        .unwrap_or_default();
    let (tx, rx) = mpsc::channel::<Vec<u8>>(8);
    let live = CriLiveness { cri, id };
    let path = PathBuf::from(log_path);
    let pod_key = pod.key();
    tokio::spawn(async move {
        if let Err(e) = read::stream(&path, &opts, &live, tx).await {
            tracing::warn!(pod = %pod_key, container = %container, "reading log: {e}");
        }
    });
    let body = futures::stream::unfold(rx, |mut rx| async move {
        let chunk = rx.recv().await?;
        Some((Ok::<_, std::convert::Infallible>(Bytes::from(chunk)), rx))
    });
    Ok((
        [(header::CONTENT_TYPE, "text/plain")],
        Body::from_stream(body),
    )
        .into_response())
}

fn names(pod: &Pod) -> Vec<String> {
    let ephemeral = pod
        .spec
        .as_ref()
        .and_then(|s| s.ephemeral_containers.as_ref())
        .into_iter()
        .flatten()
        .map(|c| c.name.clone());
    pod.init_containers()
        .iter()
        .chain(pod.containers())
        .map(|c| c.name.clone())
        .chain(ephemeral)
        .collect()
}

/// Whether a followed container still runs, asked of the runtime.
struct CriLiveness {
    cri: CriClient,
    id: String,
}

impl Liveness for CriLiveness {
    fn running(&self) -> BoxFuture<'_, bool> {
        Box::pin(async move {
            match self
                .cri
                .container_status(v1::ContainerStatusRequest {
                    container_id: self.id.clone(),
                    verbose: false,
                })
                .await
            {
                Ok(r) => r
                    .status
                    .is_some_and(|s| s.state == v1::ContainerState::ContainerRunning as i32),
                Err(e) if e.is_not_found() => false,
                // A runtime hiccup does not end the stream.
                Err(_) => true,
            }
        })
    }
}

/// The query of `/containerLogs` (a v1 PodLogOptions), validated as the
/// kubelet does; returns the read options and `previous`.
fn parse_query(query: &[(String, String)], now: Timestamp) -> Result<(Options, bool), Failure> {
    let bad = |what: String| {
        (
            StatusCode::BAD_REQUEST,
            format!("Unable to decode query: {what}"),
        )
    };
    let invalid = |what: &str| {
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("Invalid request: {what}"),
        )
    };
    let mut opts = Options::default();
    let mut previous = false;
    let mut since_seconds = None;
    let mut since_time = None;
    let mut tail = None;
    let mut tail_lines = None;
    let mut limit = None;
    let int = |k: &str, v: &str| {
        v.parse::<i64>()
            .map_err(|_| bad(format!("{k}={v:?} is not a whole number")))
    };
    for (k, v) in query {
        match k.as_str() {
            "follow" => opts.follow = parse_bool(k, v).map_err(bad)?,
            "timestamps" => opts.timestamps = parse_bool(k, v).map_err(bad)?,
            "previous" => previous = parse_bool(k, v).map_err(bad)?,
            "tailLines" => tail_lines = Some(int(k, v)?),
            // The old name; "all" is the same as leaving it out.
            "tail" => tail = Some(v.clone()),
            "limitBytes" => limit = Some(int(k, v)?),
            "sinceSeconds" => since_seconds = Some(int(k, v)?),
            "sinceTime" => {
                let t: Timestamp = v
                    .parse()
                    .map_err(|_| bad(format!("sinceTime={v:?} is not an RFC 3339 time")))?;
                since_time = Some(t);
            }
            _ => {}
        }
    }
    if let Some(t) = tail {
        tail_lines = if t == "all" {
            None
        } else {
            Some(int("tail", &t)?)
        };
    }
    if let Some(n) = tail_lines {
        if n < 0 {
            return Err(invalid("tailLines must be greater than or equal to 0"));
        }
        opts.tail_lines = Some(n as u64);
    }
    if let Some(b) = limit {
        if b < 1 {
            return Err(invalid("limitBytes must be greater than 0"));
        }
        opts.limit_bytes = Some(b as u64);
    }
    if since_seconds.is_some() && since_time.is_some() {
        return Err(invalid(
            "at most one of sinceTime or sinceSeconds may be specified",
        ));
    }
    if let Some(secs) = since_seconds {
        if secs < 1 {
            return Err(invalid("sinceSeconds must be greater than 0"));
        }
        opts.since = now.checked_sub(jiff::SignedDuration::from_secs(secs)).ok();
    }
    if since_time.is_some() {
        opts.since = since_time;
    }
    Ok((opts, previous))
}

/// Go's `strconv.ParseBool`, which decodes the kubelet's query; an
/// empty value (`?follow`) is true.
fn parse_bool(key: &str, v: &str) -> Result<bool, String> {
    match v {
        "" | "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(format!("{key}={v:?} is not a boolean")),
    }
}

/// Which instance's log to read, by container ID, from the pod's status:
/// the kubelet's `validateContainerLogStatus`, with its messages.
fn instance_to_read(
    pod: &str,
    status: &PodStatus,
    container: &str,
    previous: bool,
) -> Result<String, String> {
    let find = |list: &Option<Vec<ContainerStatus>>| {
        list.iter().flatten().find(|c| c.name == container).cloned()
    };
    let Some(cs) = find(&status.container_statuses)
        .or_else(|| find(&status.init_container_statuses))
        .or_else(|| find(&status.ephemeral_container_statuses))
    else {
        return Err(format!(
            "container {container:?} in pod {pod:?} is not available"
        ));
    };
    let last = cs
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .and_then(|t| t.container_id.clone())
        .filter(|id| !id.is_empty());
    let state = cs.state.clone().unwrap_or_default();
    let terminated = || format!("container {container:?} in pod {pod:?} is terminated");
    if previous {
        return last.ok_or_else(|| {
            format!("previous terminated container {container:?} in pod {pod:?} not found")
        });
    }
    if state.running.is_some() {
        return cs.container_id.clone().ok_or_else(terminated);
    }
    if let Some(t) = &state.terminated {
        // When the next instance did not start, the terminated state has
        // no ID: the last one's log is what there is.
        return t
            .container_id
            .clone()
            .filter(|id| !id.is_empty())
            .or(last)
            .ok_or_else(terminated);
    }
    if cs
        .last_state
        .as_ref()
        .is_some_and(|s| s.terminated.is_some())
    {
        return last.ok_or_else(terminated);
    }
    if let Some(w) = &state.waiting {
        let reason = w.reason.clone().unwrap_or_default();
        return Err(match reason.as_str() {
            "ErrImagePull" => format!(
                "container {container:?} in pod {pod:?} is waiting to start: image can't be pulled"
            ),
            "ImagePullBackOff" => format!(
                "container {container:?} in pod {pod:?} is waiting to start: trying and failing to pull image"
            ),
            _ => format!("container {container:?} in pod {pod:?} is waiting to start: {reason}"),
        });
    }
    Err(format!(
        "container {container:?} in pod {pod:?} is waiting to start - no logs yet"
    ))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    };

    use super::*;

    fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn query_as_kubectl_sends_it() {
        let now: Timestamp = "2026-11-30T06:00:00Z".parse().unwrap();
        let (o, prev) = parse_query(
            &q(&[
                ("follow", "true"),
                ("tailLines", "5"),
                ("timestamps", "true"),
                ("limitBytes", "100"),
                ("sinceSeconds", "60"),
                ("previous", "false"),
            ]),
            now,
        )
        .unwrap();
        assert!(o.follow && o.timestamps && !prev);
        assert_eq!(o.tail_lines, Some(5));
        assert_eq!(o.limit_bytes, Some(100));
        assert_eq!(o.since, Some("2026-11-30T05:59:00Z".parse().unwrap()));
        let (o, _) = parse_query(
            &q(&[("sinceTime", "2026-11-30T05:00:00Z"), ("tail", "all")]),
            now,
        )
        .unwrap();
        assert_eq!(o.since, Some("2026-11-30T05:00:00Z".parse().unwrap()));
        assert_eq!(o.tail_lines, None);
        let (o, _) = parse_query(&q(&[("tail", "3")]), now).unwrap();
        assert_eq!(o.tail_lines, Some(3));

        let code = |pairs| parse_query(&q(pairs), now).unwrap_err().0;
        assert_eq!(code(&[("tailLines", "x")]), StatusCode::BAD_REQUEST);
        assert_eq!(code(&[("follow", "yes")]), StatusCode::BAD_REQUEST);
        assert_eq!(
            code(&[("tailLines", "-1")]),
            StatusCode::UNPROCESSABLE_ENTITY
        );
        assert_eq!(
            code(&[("limitBytes", "0")]),
            StatusCode::UNPROCESSABLE_ENTITY
        );
        assert_eq!(
            code(&[("sinceSeconds", "1"), ("sinceTime", "2026-11-30T05:00:00Z")]),
            StatusCode::UNPROCESSABLE_ENTITY
        );
    }

    fn status(cs: ContainerStatus) -> PodStatus {
        PodStatus {
            container_statuses: Some(vec![cs]),
            ..Default::default()
        }
    }

    fn terminated(id: &str) -> ContainerState {
        ContainerState {
            terminated: Some(ContainerStateTerminated {
                container_id: Some(id.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn which_instance_is_read() {
        let running = ContainerStatus {
            name: "c".into(),
            container_id: Some("containerd://new".into()),
            state: Some(ContainerState {
                running: Some(ContainerStateRunning::default()),
                ..Default::default()
            }),
            last_state: Some(terminated("containerd://old")),
            ..Default::default()
        };
        let s = status(running.clone());
        assert_eq!(
            instance_to_read("p", &s, "c", false).unwrap(),
            "containerd://new"
        );
        assert_eq!(
            instance_to_read("p", &s, "c", true).unwrap(),
            "containerd://old"
        );
        assert_eq!(
            instance_to_read("p", &s, "x", false).unwrap_err(),
            "container \"x\" in pod \"p\" is not available"
        );

        let first = ContainerStatus {
            last_state: Some(ContainerState::default()),
            ..running
        };
        assert_eq!(
            instance_to_read("p", &status(first), "c", true).unwrap_err(),
            "previous terminated container \"c\" in pod \"p\" not found"
        );

        let crashing = ContainerStatus {
            name: "c".into(),
            state: Some(ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some("CrashLoopBackOff".into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            last_state: Some(terminated("containerd://old")),
            ..Default::default()
        };
        assert_eq!(
            instance_to_read("p", &status(crashing), "c", false).unwrap(),
            "containerd://old"
        );

        let pulling = ContainerStatus {
            name: "c".into(),
            state: Some(ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some("ImagePullBackOff".into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            instance_to_read("p", &status(pulling), "c", false).unwrap_err(),
            "container \"c\" in pod \"p\" is waiting to start: trying and failing to pull image"
        );
    }
}
