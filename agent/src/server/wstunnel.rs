//! Port-forward over WebSocket, as kubectl 1.31 and later ask for it first:
//! subprotocol `SPDY/3.1+portforward.k8s.io`, the SPDY/3.1 port-forward
//! session carried as the payload of binary messages. The runtime's
//! streaming server speaks SPDY only, so the agent ends the WebSocket
//! here and opens a SPDY upgrade to the runtime; the SPDY bytes pass
//! through unchanged, unwrapped from (and wrapped into) messages, with no
//! SPDY parsing (upstream's API server tunnels the same way).

use axum::extract::Request;
use axum::http::HeaderMap;
use axum::response::Response;
use futures::{SinkExt as _, StreamExt as _};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use super::upgrade::{
    accept_key, linger, on_websocket, spdy_upgrade, switching_protocols, websocket_protocol,
    Upgraded,
};

/// The WebSocket subprotocol of a tunnelled port-forward.
pub const PROTOCOL: &str = "SPDY/3.1+portforward.k8s.io";
/// The SPDY stream protocol inside it.
const SPDY_PROTOCOL: &str = "portforward.k8s.io";

/// Whether `headers` ask for a WebSocket upgrade offering [`PROTOCOL`].
pub fn wanted(headers: &HeaderMap) -> bool {
    websocket_protocol(headers, &[PROTOCOL]).is_some()
}

/// Accept the WebSocket, open a SPDY upgrade to the runtime's streaming
/// `url`, and relay between them.
pub async fn serve(url: &str, mut req: Request) -> Response {
    let key = match accept_key(req.headers()) {
        Ok(k) => k,
        Err(r) => return *r,
    };
    let runtime = match spdy_upgrade(url, SPDY_PROTOCOL).await {
        Ok(io) => io,
        Err(r) => return r,
    };
    tracing::info!("port-forward over a WebSocket tunnel");
    on_websocket(&mut req, "port-forward", move |ws| relay(ws, runtime));
    switching_protocols(&key, PROTOCOL)
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
