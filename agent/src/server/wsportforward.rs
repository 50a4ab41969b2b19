//! Port-forward over WebSocket with the channel protocol
//! (`v4.channel.k8s.io`, as the official Python client and other
//! pre-tunnel clients speak it): the ports come in the query, each gets
//! two channels (data `2i`, error `2i+1`) and each channel opens with a
//! message carrying the port (2 bytes, little-endian), as upstream's
//! kubelet writes them. The runtime speaks SPDY port-forward only, so the
//! agent is the SPDY client towards it: per port an error and a data
//! stream with the `port` and `requestID` headers. A port the pod
//! refuses gets the runtime's message on its error channel; the others
//! keep working.

use std::sync::Arc;

use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt as _, StreamExt as _};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use super::spdy::{Frame, Headers};
use super::spdyclient::{self, Credit, Reader, Session, Windows};
use super::wschannel::{channel_message, client_payload, send_data, Sent};

/// The subprotocol served (upstream's kubelet serves the binary v4
/// channel protocol for port-forward; v5 exists for exec only).
pub const PROTOCOL: &str = "v4.channel.k8s.io";
/// The SPDY stream protocol spoken to the runtime.
const SPDY_PROTOCOL: &str = "portforward.k8s.io";

/// Whether `headers` ask for a WebSocket upgrade offering [`PROTOCOL`].
pub fn wanted(headers: &HeaderMap) -> bool {
    super::upgrade::websocket_protocol(headers, &[PROTOCOL]).is_some()
}

/// The ports asked for: every `port` (upstream's kubelet parameter) and
/// `ports` (the API's, as the API server passes it on) value, each a
/// comma-separated list; the messages are upstream's.
pub fn ports(query: &str) -> Result<Vec<u16>, String> {
    let values: Vec<String> = form_urlencoded::parse(query.as_bytes())
        .filter(|(k, _)| k == "port" || k == "ports")
        .map(|(_, v)| v.into_owned())
        .collect();
    if values.is_empty() {
        return Err("query parameter \"port\" is required".into());
    }
    let mut ports = Vec::new();
    for value in values {
        if value.is_empty() {
            return Err("query parameter \"port\" cannot be empty".into());
        }
        for p in value.split(',') {
            let port: u16 = p
                .parse()
                .map_err(|e| format!("unable to parse {value:?} as a port: {e}"))?;
            if port == 0 {
                return Err(format!("port {value:?} must be > 0"));
            }
            ports.push(port);
        }
    }
    Ok(ports)
}

/// Accept the WebSocket, open two streams per port to the runtime's
/// streaming `url`, and relay between them.
pub async fn serve(url: &str, mut req: Request) -> Response {
    let ports = match ports(req.uri().query().unwrap_or_default()) {
        Ok(p) => p,
        Err(e) => return (StatusCode::BAD_REQUEST, e).into_response(),
    };
    let key = match super::upgrade::accept_key(req.headers()) {
        Ok(k) => k,
        Err(r) => return *r,
    };
    let runtime = match super::upgrade::spdy_upgrade(url, SPDY_PROTOCOL).await {
        Ok(io) => io,
        Err(r) => return r,
    };
    let session = match Session::open(runtime, stream_headers(&ports)).await {
        Ok(s) => s,
        Err(e) => {
            let msg = format!("opening the runtime's port-forward streams: {e}");
            return (StatusCode::BAD_GATEWAY, msg).into_response();
        }
    };
    tracing::info!(?ports, "port-forward over WebSocket {PROTOCOL}");
    super::upgrade::on_websocket(&mut req, "port-forward", move |ws| {
        bridge(ws, session, ports)
    });
    super::upgrade::switching_protocols(&key, PROTOCOL)
}

/// Per port, an error stream and then a data stream, as upstream's
/// port-forward client creates them (the runtime starts forwarding once
/// it has both of a request).
fn stream_headers(ports: &[u16]) -> Vec<Headers> {
    let mut streams = Vec::with_capacity(2 * ports.len());
    for (i, port) in ports.iter().enumerate() {
        for kind in ["error", "data"] {
            streams.push(vec![
                ("streamtype".to_string(), kind.to_string()),
                ("port".to_string(), port.to_string()),
                ("requestid".to_string(), i.to_string()),
            ]);
        }
    }
    streams
}

/// The WebSocket channel of each runtime stream: the session's ids come
/// in the order [`stream_headers`] asked (error, data per port), the
/// channels are data `2i`, error `2i+1`.
fn channel_of(ids: &[u32], stream: u32) -> Option<u8> {
    let at = ids.iter().position(|id| *id == stream)?;
    let (port, error) = (at / 2, at % 2 == 0);
    u8::try_from(2 * port + usize::from(error)).ok()
}

/// Relay until the client closes or the runtime's connection ends.
async fn bridge<C, T>(ws: WebSocketStream<C>, session: Session<T>, ports: Vec<u16>)
where
    C: AsyncRead + AsyncWrite + Unpin,
    T: AsyncRead + AsyncWrite,
{
    let Session {
        reader,
        tx,
        ids,
        early,
    } = session;
    let (mut ws_tx, ws_rx) = ws.split();
    // Every channel opens with its port, data and error alike.
    for (i, port) in ports.iter().enumerate() {
        for ch in [2 * i, 2 * i + 1] {
            let Ok(ch) = u8::try_from(ch) else { continue };
            let msg = channel_message(ch, &port.to_le_bytes());
            if ws_tx.send(Message::Binary(msg)).await.is_err() {
                return;
            }
        }
    }
    let (out, writer) = spdyclient::writer(tx);
    let windows = Arc::new(Windows::default());
    let writer = async {
        writer.await;
        std::future::pending::<()>().await
    };
    let ids = Arc::new(ids);
    let down = down(reader, early, ids.clone(), ws_tx, out.ctl, windows.clone());
    let up = up(ws_rx, ids, out.data, windows);
    tokio::pin!(up);
    tokio::select! {
        _ = down => super::upgrade::linger(up).await,
        _ = &mut up => {}
        () = writer => {}
    }
}

/// The runtime's frames: each stream's data to its channel, credit back
/// for it; the rest as [`spdyclient::control`] does. A port's streams
/// ending leave the others open: the session lasts as long as the
/// runtime's connection.
async fn down<C: AsyncRead + AsyncWrite + Unpin, T: AsyncRead>(
    mut reader: Reader<T>,
    early: Vec<Frame>,
    ids: Arc<Vec<u32>>,
    mut ws_tx: SplitSink<WebSocketStream<C>, Message>,
    ctl: mpsc::UnboundedSender<Frame>,
    windows: Arc<Windows>,
) {
    let mut early = early.into_iter();
    let mut credit = Credit::default();
    loop {
        let frame = match early.next() {
            Some(f) => f,
            None => match reader.next().await {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "runtime port-forward session ended");
                    break;
                }
            },
        };
        if let Some(Frame::Data { stream, fin, data }) = spdyclient::control(frame, &ctl, &windows)
        {
            if let (Some(ch), false) = (channel_of(&ids, stream), data.is_empty()) {
                let msg = Message::Binary(channel_message(ch, &data));
                if ws_tx.send(msg).await.is_err() {
                    return;
                }
            }
            credit.read(stream, data.len() as u32, fin, &ctl);
        }
    }
    let _ = ws_tx.send(Message::Close(None)).await;
    let _ = ws_tx.close().await;
}

/// The client's messages on data channels to their port's data stream
/// (what it writes on error channels means nothing upstream either),
/// until the client closes.
async fn up<C: AsyncRead + AsyncWrite + Unpin>(
    mut ws_rx: SplitStream<WebSocketStream<C>>,
    ids: Arc<Vec<u32>>,
    data: mpsc::Sender<Frame>,
    windows: Arc<Windows>,
) {
    let mut gone: Vec<u32> = Vec::new();
    while let Some(msg) = ws_rx.next().await {
        let b = match client_payload(msg) {
            Some(Some(b)) => b,
            Some(None) => continue,
            None => break,
        };
        let Some(&ch) = b.first() else { continue };
        if ch % 2 == 1 {
            continue;
        }
        // The data stream of port ch/2 is the second of its pair.
        let Some(&stream) = ids.get(usize::from(ch) + 1) else {
            continue;
        };
        if gone.contains(&stream) {
            continue;
        }
        match send_data(&data, &windows, stream, b.slice(1..)).await {
            Sent::All => {}
            Sent::StreamGone => gone.push(stream),
            Sent::RuntimeGone => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_read_as_upstream_reads_them() {
        assert_eq!(ports("ports=80,8080&port=9000"), Ok(vec![80, 8080, 9000]));
        assert_eq!(ports("ports=1234%2C1235"), Ok(vec![1234, 1235]));
        assert_eq!(
            ports("x=1"),
            Err("query parameter \"port\" is required".into())
        );
        assert_eq!(
            ports("port="),
            Err("query parameter \"port\" cannot be empty".into())
        );
        assert!(ports("port=70000")
            .unwrap_err()
            .starts_with("unable to parse \"70000\" as a port"));
        assert_eq!(ports("port=0"), Err("port \"0\" must be > 0".into()));
    }

    #[test]
    fn each_stream_has_its_channel() {
        // Two ports: streams error0, data0, error1, data1.
        let ids = [1, 3, 5, 7];
        assert_eq!(channel_of(&ids, 1), Some(1));
        assert_eq!(channel_of(&ids, 3), Some(0));
        assert_eq!(channel_of(&ids, 5), Some(3));
        assert_eq!(channel_of(&ids, 7), Some(2));
        assert_eq!(channel_of(&ids, 9), None);
        let headers = stream_headers(&[80, 81]);
        assert_eq!(headers[3][0].1, "data");
        assert_eq!(headers[3][1].1, "81");
        assert_eq!(headers[3][2].1, "1");
    }
}
