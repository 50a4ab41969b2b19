//! `/exec`, `/attach` and `/portForward`: the CRI streaming calls (Exec,
//! Attach, PortForward return the URL of the runtime's streaming server),
//! with the caller's HTTP upgrade (SPDY/3.1, or WebSocket) passed through to
//! that URL byte for byte, as the kubelet does when it does not redirect.
//! The stream protocol itself is spoken between the caller and the runtime;
//! the exit code travels in it. Two upgrades the runtime cannot serve end
//! here instead: exec/attach over WebSocket v5/v4.channel.k8s.io
//! ([`super::wschannel`]) and port-forward over WebSocket, tunnelled SPDY
//! ([`super::wstunnel`]) or channels ([`super::wsportforward`]).

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use cri_proto::v1;
use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;

use super::readonly::ServerState;
use crate::runtime::state::State as CState;

pub fn routes(state: ServerState) -> Router {
    Router::new()
        .route("/exec/{ns}/{pod}/{container}", get(exec).post(exec))
        .route("/exec/{ns}/{pod}/{uid}/{container}", get(exec).post(exec))
        .route("/attach/{ns}/{pod}/{container}", get(attach).post(attach))
        .route(
            "/attach/{ns}/{pod}/{uid}/{container}",
            get(attach).post(attach),
        )
        .route(
            "/portForward/{ns}/{pod}",
            get(port_forward).post(port_forward),
        )
        .route(
            "/portForward/{ns}/{pod}/{uid}",
            get(port_forward).post(port_forward),
        )
        .with_state(state)
}

/// A refusal, boxed: a Response is large to carry in every Result.
type Refused = Box<Response>;

/// An error answer with a plain message, as the kubelet writes them
/// (kubectl prints the body after "unable to upgrade connection:").
fn fail(status: StatusCode, msg: impl Into<String>) -> Response {
    (status, msg.into()).into_response()
}

/// What to stream, from the query (`input`/`output`/`error`, as the API
/// server sends them to kubelets, or `stdin`/`stdout`/`stderr`; `1` or
/// `true`).
#[derive(Debug, Default, PartialEq)]
struct Params {
    command: Vec<String>,
    stdin: bool,
    stdout: bool,
    stderr: bool,
    tty: bool,
}

impl Params {
    fn parse(q: &[(String, String)]) -> Params {
        let on = |v: &str| v == "1" || v.eq_ignore_ascii_case("true");
        let mut p = Params::default();
        for (k, v) in q {
            match k.as_str() {
                "command" => p.command.push(v.clone()),
                "input" | "stdin" => p.stdin = on(v),
                "output" | "stdout" => p.stdout = on(v),
                "error" | "stderr" => p.stderr = on(v),
                "tty" => p.tty = on(v),
                _ => {}
            }
        }
        // A terminal merges stderr into stdout (upstream drops stderr too).
        if p.tty {
            p.stderr = false;
        }
        p
    }

    fn streams(&self) -> super::wschannel::Streams {
        super::wschannel::Streams {
            stdin: self.stdin,
            stdout: self.stdout,
            stderr: self.stderr,
            tty: self.tty,
        }
    }

    fn check(&self) -> Result<(), Refused> {
        if !(self.stdin || self.stdout || self.stderr) {
            return Err(Box::new(fail(
                StatusCode::BAD_REQUEST,
                "you must specify at least 1 of stdin, stdout, stderr",
            )));
        }
        Ok(())
    }
}

type Q = Query<Vec<(String, String)>>;
/// `{ns}`, `{pod}`, optionally `{uid}`, and `{container}`: one handler
/// serves the routes with and without the uid segment.
type PathParams = Path<HashMap<String, String>>;

/// Which CRI streaming call a remote command goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Remote {
    Exec,
    Attach,
}

async fn exec(
    State(s): State<ServerState>,
    Path(at): PathParams,
    Query(q): Q,
    req: Request,
) -> Response {
    remote(s, Remote::Exec, at, q, req).await
}

async fn attach(
    State(s): State<ServerState>,
    Path(at): PathParams,
    Query(q): Q,
    req: Request,
) -> Response {
    remote(s, Remote::Attach, at, q, req).await
}

async fn remote(
    s: ServerState,
    kind: Remote,
    at: HashMap<String, String>,
    q: Vec<(String, String)>,
    req: Request,
) -> Response {
    let part = |k: &str| at.get(k).cloned().unwrap_or_default();
    let (ns, pod, container) = (part("ns"), part("pod"), part("container"));
    let p = Params::parse(&q);
    if let Err(r) = p.check() {
        return *r;
    }
    if kind == Remote::Exec && p.command.is_empty() {
        return fail(StatusCode::BAD_REQUEST, "you must specify a command");
    }
    let uid = at.get("uid").map(String::as_str);
    let id = match container_id(&s, &ns, &pod, uid, &container).await {
        Ok(id) => id,
        Err(r) => return *r,
    };
    let streams = p.streams();
    let cri = &s.shared.runtime.cri;
    let url = match kind {
        Remote::Exec => {
            tracing::info!(pod = %format!("{ns}/{pod}"), container = %container, command = ?p.command, tty = p.tty, stdin = p.stdin, "exec");
            let req = v1::ExecRequest {
                container_id: id,
                cmd: p.command,
                tty: p.tty,
                stdin: p.stdin,
                stdout: p.stdout,
                stderr: p.stderr,
            };
            cri.exec(req).await.map(|r| r.url)
        }
        Remote::Attach => {
            tracing::info!(pod = %format!("{ns}/{pod}"), container = %container, tty = p.tty, stdin = p.stdin, "attach");
            let req = v1::AttachRequest {
                container_id: id,
                stdin: p.stdin,
                tty: p.tty,
                stdout: p.stdout,
                stderr: p.stderr,
            };
            cri.attach(req).await.map(|r| r.url)
        }
    };
    match url {
        Ok(url) => remote_command(&url, streams, req).await,
        Err(e) => fail(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn port_forward(
    State(s): State<ServerState>,
    Path(at): PathParams,
    req: Request,
) -> Response {
    let part = |k: &str| at.get(k).cloned().unwrap_or_default();
    forward_to(s, part("ns"), part("pod"), at.get("uid").cloned(), req).await
}

async fn forward_to(
    s: ServerState,
    ns: String,
    pod: String,
    uid: Option<String>,
    req: Request,
) -> Response {
    let p = match find_pod(&s, &ns, &pod, uid.as_deref()) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let uid = p.metadata.uid.clone().unwrap_or_default();
    let rt = match s.shared.runtime.observe_pod(&uid).await {
        Ok(rt) => rt,
        Err(e) => return fail(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let Some(sandbox) = rt.current_sandbox().filter(|s| s.ready) else {
        return fail(
            StatusCode::NOT_FOUND,
            format!("pod {ns}/{pod} has no running sandbox"),
        );
    };
    tracing::info!(pod = %format!("{ns}/{pod}"), "port-forward");
    // Ports travel in the stream's headers (protocol v2 and later); the
    // runtime takes none here.
    let call = s.shared.runtime.cri.port_forward(v1::PortForwardRequest {
        pod_sandbox_id: sandbox.id.clone(),
        port: Vec::new(),
    });
    match call.await {
        Ok(r) if super::wstunnel::wanted(req.headers()) => {
            super::wstunnel::serve(&r.url, req).await
        }
        Ok(r) if super::wsportforward::wanted(req.headers()) => {
            super::wsportforward::serve(&r.url, req).await
        }
        Ok(r) => pass_through(&r.url, req).await,
        Err(e) => fail(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// exec/attach: WebSocket v5/v4.channel.k8s.io is spoken here (the
/// runtime has SPDY only); every other upgrade passes through.
async fn remote_command(url: &str, streams: super::wschannel::Streams, req: Request) -> Response {
    match super::wschannel::wanted(req.headers()) {
        Some(protocol) => super::wschannel::serve(url, protocol, streams, req).await,
        None => pass_through(url, req).await,
    }
}

fn find_pod(s: &ServerState, ns: &str, name: &str, uid: Option<&str>) -> Result<Pod, Refused> {
    s.shared
        .statuses
        .list()
        .into_iter()
        .find(|p| {
            p.metadata.namespace.as_deref() == Some(ns)
                && p.metadata.name.as_deref() == Some(name)
                && uid.is_none_or(|u| p.metadata.uid.as_deref() == Some(u))
        })
        .ok_or_else(|| Box::new(fail(StatusCode::NOT_FOUND, "pod does not exist")))
}

/// The id of the named container, running in the pod's current sandbox.
async fn container_id(
    s: &ServerState,
    ns: &str,
    pod: &str,
    uid: Option<&str>,
    container: &str,
) -> Result<String, Refused> {
    let p = find_pod(s, ns, pod, uid)?;
    let uid = p.metadata.uid.clone().unwrap_or_default();
    let rt = s
        .shared
        .runtime
        .observe_pod(&uid)
        .await
        .map_err(|e| Box::new(fail(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())))?;
    let sandbox = rt
        .current_sandbox()
        .map(|s| s.id.clone())
        .unwrap_or_default();
    rt.latest_in(container, &sandbox)
        .filter(|c| c.state == CState::Running)
        .map(|c| c.id.clone())
        .ok_or_else(|| {
            Box::new(fail(
                StatusCode::NOT_FOUND,
                format!("container not found ({container:?})"),
            ))
        })
}

/// Headers not forwarded to the runtime: this hop's credentials and host.
fn forwarded(name: &header::HeaderName) -> bool {
    !matches!(
        name.as_str(),
        "host" | "authorization" | "proxy-authorization" | "cookie"
    )
}

/// Send `req`'s method and headers to the runtime's streaming `url`; on
/// 101, answer 101 with the runtime's headers and splice the two upgraded
/// connections together; otherwise pass the runtime's answer on.
pub async fn pass_through(url: &str, mut req: Request) -> Response {
    let target: http::Uri = match url.parse() {
        Ok(u) => u,
        Err(e) => {
            return fail(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("runtime streaming URL {url:?}: {e}"),
            )
        }
    };
    let Some(authority) = target.authority().cloned() else {
        return fail(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("runtime streaming URL {url:?} has no host"),
        );
    };
    let tcp = match tokio::net::TcpStream::connect(authority.as_str()).await {
        Ok(t) => t,
        Err(e) => {
            return fail(
                StatusCode::BAD_GATEWAY,
                format!("connecting to the runtime's streaming server {authority}: {e}"),
            )
        }
    };
    let _ = tcp.set_nodelay(true);
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await {
        Ok(x) => x,
        Err(e) => return fail(StatusCode::BAD_GATEWAY, e.to_string()),
    };
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "runtime streaming connection ended");
        }
    });
    let path = target.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let mut out = http::Request::builder()
        .method(req.method().clone())
        .uri(path)
        .header(header::HOST, authority.as_str());
    for (k, v) in req.headers() {
        if forwarded(k) {
            out = out.header(k, v);
        }
    }
    let out = match out.body(Empty::<bytes::Bytes>::new()) {
        Ok(o) => o,
        Err(e) => return fail(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let client_upgrade = hyper::upgrade::on(&mut req);
    let resp = match sender.send_request(out).await {
        Ok(r) => r,
        Err(e) => {
            return fail(
                StatusCode::BAD_GATEWAY,
                format!("runtime streaming server: {e}"),
            )
        }
    };
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        return resp.map(Body::new);
    }
    let mut back = Response::builder().status(StatusCode::SWITCHING_PROTOCOLS);
    for (k, v) in resp.headers() {
        back = back.header(k, v);
    }
    let runtime_upgrade = hyper::upgrade::on(resp);
    tokio::spawn(async move {
        let (client, runtime) = tokio::join!(client_upgrade, runtime_upgrade);
        match (client, runtime) {
            (Ok(c), Ok(r)) => {
                let (mut c, mut r) = (TokioIo::new(c), TokioIo::new(r));
                let _ = tokio::io::copy_bidirectional(&mut c, &mut r).await;
            }
            (c, r) => {
                tracing::debug!(client = ?c.err(), runtime = ?r.err(), "stream upgrade failed")
            }
        }
    });
    back.body(Body::empty())
        .unwrap_or_else(|e| fail(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn params_accept_both_spellings() {
        let p = Params::parse(&q(&[
            ("command", "sh"),
            ("command", "-c"),
            ("input", "1"),
            ("stdout", "true"),
            ("error", "1"),
        ]));
        assert_eq!(p.command, ["sh", "-c"]);
        assert!(p.stdin && p.stdout && p.stderr && !p.tty);
        let t = Params::parse(&q(&[("tty", "true"), ("stderr", "true")]));
        assert!(t.tty && !t.stderr);
        assert!(Params::parse(&q(&[("command", "x")])).check().is_err());
    }
}
