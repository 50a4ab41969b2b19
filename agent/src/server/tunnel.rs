//! `/tunnel/{ip}/{port}`: a TCP connection from the node to one of its
//! pods, handed to the caller as an HTTP/1.1 upgrade (`Upgrade: tcp`).
//!
//! The API server's pods/proxy and services/proxy go through it: upstream's
//! API server dials pod IPs itself, which needs a route from the control
//! plane into every node's pod network, and a skiff-server that is not
//! a node has none. k3s answers this the same way (its egress selector
//! tunnels the API server's pod traffic through the agent). Only the IPs
//! of pods on this node are reachable, so the node server is no open
//! relay; who may ask is the `nodes/proxy` question every other node server
//! path is authorized by.

use std::net::IpAddr;
use std::time::Duration;

use axum::extract::{Path, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use hyper_util::rt::TokioIo;

use super::readonly::ServerState;

/// How long connecting to the pod may take (the API server's proxy dialer
/// gives up after 30 s).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// The upgrade token of a raw byte stream.
pub const PROTOCOL: &str = "tcp";

pub fn routes(state: ServerState) -> Router {
    Router::new()
        .route("/tunnel/{ip}/{port}", get(tunnel))
        .with_state(state)
}

async fn tunnel(
    State(s): State<ServerState>,
    Path((ip, port)): Path<(String, u16)>,
    mut req: Request,
) -> Response {
    let offered = super::upgrade::header_values(req.headers(), header::UPGRADE.as_str());
    if !offered.iter().any(|p| p.eq_ignore_ascii_case(PROTOCOL)) {
        return (
            StatusCode::BAD_REQUEST,
            format!("a tunnel needs the header \"Upgrade: {PROTOCOL}\""),
        )
            .into_response();
    }
    let Ok(ip) = ip.parse::<IpAddr>() else {
        return (
            StatusCode::BAD_REQUEST,
            format!("{ip:?} is not an IP address"),
        )
            .into_response();
    };
    if !pod_ips(&s).contains(&ip) {
        return (
            StatusCode::NOT_FOUND,
            format!("no pod on this node has the IP {ip}"),
        )
            .into_response();
    }
    // Connected before the 101, so that a refusal is an answer the caller
    // can report, not a stream that closes at once.
    let target = std::net::SocketAddr::new(ip, port);
    let connect = tokio::net::TcpStream::connect(target);
    let pod = match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            return (StatusCode::BAD_GATEWAY, format!("dial tcp {target}: {e}")).into_response()
        }
        Err(_) => {
            return (
                StatusCode::GATEWAY_TIMEOUT,
                format!("dial tcp {target}: i/o timeout"),
            )
                .into_response()
        }
    };
    let _ = pod.set_nodelay(true);
    let Some(upgrade) = req.extensions_mut().remove::<hyper::upgrade::OnUpgrade>() else {
        return (
            StatusCode::BAD_REQUEST,
            "this connection cannot be upgraded",
        )
            .into_response();
    };
    tokio::spawn(async move {
        match upgrade.await {
            Ok(caller) => {
                let (mut caller, mut pod) = (TokioIo::new(caller), pod);
                let _ = tokio::io::copy_bidirectional(&mut caller, &mut pod).await;
            }
            Err(e) => tracing::debug!(error = %e, "tunnel upgrade failed"),
        }
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, PROTOCOL)
        .body(axum::body::Body::empty())
        .unwrap_or_else(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response())
}

/// The IPs of the pods this node runs (a host-network pod's is the node's).
fn pod_ips(s: &ServerState) -> Vec<IpAddr> {
    s.shared
        .statuses
        .list()
        .iter()
        .filter_map(|p| p.status.as_ref())
        .flat_map(|st| {
            let listed = st.pod_ips.iter().flatten().map(|i| i.ip.as_str());
            st.pod_ip.as_deref().into_iter().chain(listed)
        })
        .filter_map(|ip| ip.parse().ok())
        .collect()
}
