//! The HTTP upgrade plumbing the WebSocket relays ([`super::wschannel`],
//! [`super::wsportforward`], [`super::wstunnel`]) and the streaming routes
//! ([`super::stream`]) share: reading offered protocols, the 101 that
//! accepts a WebSocket, taking the client's WebSocket over once upgraded,
//! the SPDY/3.1 upgrade to the runtime's streaming server, and lingering
//! for the client's close. Kept apart so that the relays need neither each
//! other nor the routes that call them.

use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::WebSocketStream;

/// How long a client has to answer our close with its own.
const CLOSE_LINGER: Duration = Duration::from_secs(5);

/// The values of a possibly repeated, comma-separated header.
pub fn header_values(h: &HeaderMap, name: &str) -> Vec<String> {
    h.get_all(name)
        .iter()
        .filter_map(|v: &HeaderValue| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// The first of `protocols` that `headers` offer on a WebSocket upgrade;
/// None for other upgrades (SPDY) and other subprotocols.
pub fn websocket_protocol(headers: &HeaderMap, protocols: &[&'static str]) -> Option<&'static str> {
    let websocket = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    if !websocket {
        return None;
    }
    let offered = header_values(headers, "sec-websocket-protocol");
    protocols
        .iter()
        .copied()
        .find(|p| offered.iter().any(|o| o == p))
}

/// The Sec-WebSocket-Accept for the request's key, or the 400 that a
/// request without one gets.
pub fn accept_key(headers: &HeaderMap) -> Result<String, Box<Response>> {
    headers
        .get("sec-websocket-key")
        .and_then(|v| v.to_str().ok())
        .map(|k| derive_accept_key(k.as_bytes()))
        .ok_or_else(|| {
            Box::new((StatusCode::BAD_REQUEST, "missing Sec-WebSocket-Key").into_response())
        })
}

/// Once the client's upgrade of `req` completes, `relay` the WebSocket
/// (server side); `what` names the stream in the log when it does not.
pub fn on_websocket<F, Fut>(req: &mut Request, what: &'static str, relay: F)
where
    F: FnOnce(WebSocketStream<Upgraded>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let client = hyper::upgrade::on(req);
    tokio::spawn(async move {
        match client.await {
            Ok(io) => {
                let ws =
                    WebSocketStream::from_raw_socket(TokioIo::new(io), Role::Server, None).await;
                relay(ws).await;
            }
            Err(e) => tracing::debug!(error = %e, "{what} websocket upgrade failed"),
        }
    });
}

/// The 101 that accepts a WebSocket upgrade with `protocol`; `key` is the
/// computed Sec-WebSocket-Accept.
pub fn switching_protocols(key: &str, protocol: &str) -> Response {
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "websocket")
        .header("sec-websocket-accept", key)
        .header("sec-websocket-protocol", protocol)
        .body(Body::empty())
        .unwrap_or_else(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response())
}

pub type Upgraded = TokioIo<hyper::upgrade::Upgraded>;

/// A SPDY/3.1 upgrade to the runtime's streaming server, asking for the
/// stream `protocol`.
pub async fn spdy_upgrade(url: &str, protocol: &str) -> Result<Upgraded, Response> {
    let bad = |code: StatusCode, msg: String| (code, msg).into_response();
    let target: http::Uri = url.parse().map_err(|e| {
        bad(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("runtime streaming URL {url:?}: {e}"),
        )
    })?;
    let authority = target.authority().cloned().ok_or_else(|| {
        bad(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("runtime streaming URL {url:?} has no host"),
        )
    })?;
    let tcp = tokio::net::TcpStream::connect(authority.as_str())
        .await
        .map_err(|e| {
            bad(
                StatusCode::BAD_GATEWAY,
                format!("connecting to the runtime's streaming server: {e}"),
            )
        })?;
    let _ = tcp.set_nodelay(true);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| bad(StatusCode::BAD_GATEWAY, e.to_string()))?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let req = http::Request::post(target.path_and_query().map(|p| p.as_str()).unwrap_or("/"))
        .header(header::HOST, authority.as_str())
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "SPDY/3.1")
        .header("x-stream-protocol-version", protocol)
        .body(Empty::<bytes::Bytes>::new())
        .map_err(|e| bad(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| bad(StatusCode::BAD_GATEWAY, e.to_string()))?;
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        let status = resp.status();
        return Err(bad(
            StatusCode::BAD_GATEWAY,
            format!("the runtime refused the {protocol} stream ({status})"),
        ));
    }
    hyper::upgrade::on(resp)
        .await
        .map(TokioIo::new)
        .map_err(|e| bad(StatusCode::BAD_GATEWAY, e.to_string()))
}

/// After our close, read on until the client's (`up` returns on it).
/// Closing the socket with the client's bytes unread would send a TCP
/// reset, and a reset discards what we wrote and the client has not yet
/// received: the end of the output, and the close itself.
pub async fn linger(up: impl std::future::Future<Output = ()>) {
    if tokio::time::timeout(CLOSE_LINGER, up).await.is_err() {
        tracing::debug!("the client did not answer the close in time");
    }
}
