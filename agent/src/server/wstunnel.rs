//! Port-forward over WebSocket, as kubectl 1.31 and later ask for it first:
//! subprotocol `SPDY/3.1+portforward.k8s.io`, the SPDY/3.1 port-forward
//! session carried as the payload of binary messages. The runtime's
//! streaming server speaks SPDY only, so the agent ends the WebSocket
//! here and opens a SPDY upgrade to the runtime; the SPDY bytes pass
//! through unchanged, unwrapped from (and wrapped into) messages, with no
//! SPDY parsing (upstream's API server tunnels the same way).

use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::{SinkExt as _, StreamExt as _};
use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

/// The WebSocket subprotocol of a tunnelled port-forward.
pub const PROTOCOL: &str = "SPDY/3.1+portforward.k8s.io";
/// The SPDY stream protocol inside it.
const SPDY_PROTOCOL: &str = "portforward.k8s.io";
/// How long a client has to answer our close with its own.
const CLOSE_LINGER: Duration = Duration::from_secs(5);

/// Whether `headers` ask for a WebSocket upgrade offering [`PROTOCOL`].
pub fn wanted(headers: &HeaderMap) -> bool {
    let upgrade = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    upgrade
        && super::stream::header_values(headers, "sec-websocket-protocol")
            .iter()
            .any(|p| p == PROTOCOL)
}

/// Accept the WebSocket, open a SPDY upgrade to the runtime's streaming
/// `url`, and relay between them.
pub async fn serve(url: &str, mut req: Request) -> Response {
    let Some(key) = req
        .headers()
        .get("sec-websocket-key")
        .and_then(|v| v.to_str().ok())
        .map(|k| derive_accept_key(k.as_bytes()))
    else {
        return (StatusCode::BAD_REQUEST, "missing Sec-WebSocket-Key").into_response();
    };
    let runtime = match spdy_upgrade(url, SPDY_PROTOCOL).await {
        Ok(io) => io,
        Err(r) => return r,
    };
    tracing::info!("port-forward over a WebSocket tunnel");
    let client = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        match client.await {
            Ok(io) => {
                let ws =
                    WebSocketStream::from_raw_socket(TokioIo::new(io), Role::Server, None).await;
                relay(ws, runtime).await;
            }
            Err(e) => tracing::debug!(error = %e, "port-forward websocket upgrade failed"),
        }
    });
    switching_protocols(&key, PROTOCOL)
}

/// The 101 that accepts a WebSocket upgrade with `protocol`; `key` is the
/// computed Sec-WebSocket-Accept.
pub(super) fn switching_protocols(key: &str, protocol: &str) -> Response {
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "websocket")
        .header("sec-websocket-accept", key)
        .header("sec-websocket-protocol", protocol)
        .body(Body::empty())
        .unwrap_or_else(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response())
}

pub(super) type Upgraded = TokioIo<hyper::upgrade::Upgraded>;

/// A SPDY/3.1 upgrade to the runtime's streaming server, asking for the
/// stream `protocol`.
pub(super) async fn spdy_upgrade(url: &str, protocol: &str) -> Result<Upgraded, Response> {
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

/// Binary messages' payloads to the runtime, the runtime's bytes back as
/// binary messages, until either side closes. A runtime that stops
/// reading has not necessarily finished writing: only its end of output,
/// or the client's close, ends the session.
async fn relay(ws: WebSocketStream<Upgraded>, runtime: Upgraded) {
    let (mut ws_tx, mut ws_rx) = ws.split();
    let (mut rt_rx, mut rt_tx) = tokio::io::split(runtime);
    let up = async {
        let mut runtime_open = true;
        while let Some(msg) = ws_rx.next().await {
            match msg {
                Ok(Message::Binary(b)) if runtime_open => {
                    runtime_open = rt_tx.write_all(&b).await.is_ok();
                }
                Ok(Message::Close(_)) | Err(_) => break,
                Ok(_) => {}
            }
        }
        let _ = rt_tx.shutdown().await;
    };
    let down = async {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match rt_rx.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let msg = Message::Binary(buf[..n].to_vec().into());
                    if ws_tx.send(msg).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = ws_tx.send(Message::Close(None)).await;
    };
    // Either side's end ends the session: a port-forward has no half-close
    // at this level (SPDY streams carry their own).
    tokio::pin!(up);
    tokio::select! {
        _ = &mut up => {}
        _ = down => linger(up).await,
    }
}

/// After our close, read on until the client's (`up` returns on it).
/// Closing the socket with the client's bytes unread would send a TCP
/// reset, and a reset discards what we wrote and the client has not yet
/// received: the end of the output, and the close itself.
pub(super) async fn linger(up: impl std::future::Future<Output = ()>) {
    if tokio::time::timeout(CLOSE_LINGER, up).await.is_err() {
        tracing::debug!("the client did not answer the close in time");
    }
}
