//! exec and attach over WebSocket, as kubectl 1.30 and later ask for them
//! first: subprotocol `v5.channel.k8s.io` (or `v4.channel.k8s.io`), binary
//! messages whose first byte names the channel (0 stdin, 1 stdout,
//! 2 stderr, 3 error, 4 resize; v5 adds `[255, channel]`, "this channel is
//! closed"). The runtime's streaming server speaks SPDY/3.1 only, so the
//! agent ends the WebSocket here and is itself the remote-command SPDY
//! client towards the runtime (protocol v4.channel.k8s.io: one stream per
//! channel, named by its `streamType` header), as upstream's API server
//! translates for kubelets that cannot speak WebSocket.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::{BufMut as _, Bytes, BytesMut};
use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt as _, StreamExt as _};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

use super::spdy::Frame;
use super::spdyclient::{self, Credit, Reader, Session, SessionError, Windows};

/// The WebSocket subprotocols served here, most preferred first.
pub const V5: &str = "v5.channel.k8s.io";
pub const V4: &str = "v4.channel.k8s.io";
/// The SPDY remote-command protocol spoken to the runtime.
const SPDY_PROTOCOL: &str = "v4.channel.k8s.io";

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
const RESIZE: u8 = 4;
/// v5: `[CLOSE, channel]` says the sender closed that channel.
const CLOSE: u8 = 255;

/// The largest stdin DATA frame sent to the runtime.
const MAX_DATA: usize = 32 * 1024;
/// How long the runtime has to accept the streams.
const OPEN_TIMEOUT: Duration = Duration::from_secs(30);

/// The subprotocol to serve, if `headers` ask for a WebSocket upgrade
/// offering one this module speaks; other upgrades (SPDY, older
/// WebSocket protocols) are not taken over.
pub fn wanted(headers: &HeaderMap) -> Option<&'static str> {
    super::upgrade::websocket_protocol(headers, &[V5, V4])
}

/// The streams the runtime expects: what Exec/Attach were asked for.
#[derive(Debug, Clone, Copy)]
pub struct Streams {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

/// The SPDY stream id of each channel in use.
#[derive(Debug, Clone, Copy)]
struct Ids {
    error: u32,
    stdin: Option<u32>,
    stdout: Option<u32>,
    stderr: Option<u32>,
    resize: Option<u32>,
}

impl Ids {
    fn channel(&self, stream: u32) -> Option<u8> {
        [
            (Some(self.error), ERROR),
            (self.stdout, STDOUT),
            (self.stderr, STDERR),
        ]
        .into_iter()
        .find(|(id, _)| *id == Some(stream))
        .map(|(_, ch)| ch)
    }
}

/// Accept the WebSocket with `protocol`, open the remote-command SPDY
/// session to the runtime's streaming `url`, and relay between them.
pub async fn serve(
    url: &str,
    protocol: &'static str,
    streams: Streams,
    mut req: Request,
) -> Response {
    let key = match super::upgrade::accept_key(req.headers()) {
        Ok(k) => k,
        Err(r) => return *r,
    };
    let runtime = match super::upgrade::spdy_upgrade(url, SPDY_PROTOCOL).await {
        Ok(io) => io,
        Err(r) => return r,
    };
    let (session, ids) = match tokio::time::timeout(OPEN_TIMEOUT, open(runtime, streams)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            return (
                StatusCode::BAD_GATEWAY,
                format!("opening the runtime's streams: {e}"),
            )
                .into_response()
        }
        Err(_) => {
            return (
                StatusCode::GATEWAY_TIMEOUT,
                "the runtime did not accept the streams in time",
            )
                .into_response()
        }
    };
    tracing::info!(protocol, "remote command over WebSocket {protocol}");
    super::upgrade::on_websocket(&mut req, "remote command", move |ws| {
        bridge(ws, session, ids, protocol == V5)
    });
    super::upgrade::switching_protocols(&key, protocol)
}

/// Open the remote-command streams as upstream's v4 client does (error,
/// then stdin, stdout, stderr, and resize for a terminal).
async fn open<T: AsyncRead + AsyncWrite>(
    io: T,
    s: Streams,
) -> Result<(Session<T>, Ids), SessionError> {
    let wanted = [
        ("error", true),
        ("stdin", s.stdin),
        ("stdout", s.stdout),
        ("stderr", s.stderr && !s.tty),
        ("resize", s.tty),
    ];
    let headers = wanted
        .iter()
        .filter(|(_, on)| *on)
        .map(|(kind, _)| vec![("streamtype".to_string(), kind.to_string())])
        .collect();
    let session = Session::open(io, headers).await?;
    let mut ids = session.ids.iter().copied();
    let mut next = |on: bool| if on { ids.next() } else { None };
    let error = next(true).ok_or(SessionError::Closed)?;
    let ids = Ids {
        error,
        stdin: next(s.stdin),
        stdout: next(s.stdout),
        stderr: next(s.stderr && !s.tty),
        resize: next(s.tty),
    };
    Ok((session, ids))
}

/// Relay until the runtime has finished the streams (the status went out
/// on the error channel) or the client is gone.
///
/// The runtime closes its connection as soon as the command has exited,
/// while its last output may still be queued here behind a slow client:
/// failing to write to the runtime (our window updates, stdin nobody
/// reads) therefore ends neither the session nor the output, only the
/// runtime's end decides it.
async fn bridge<C, T>(ws: WebSocketStream<C>, session: Session<T>, ids: Ids, v5: bool)
where
    C: AsyncRead + AsyncWrite + Unpin,
    T: AsyncRead + AsyncWrite,
{
    let Session {
        reader, tx, early, ..
    } = session;
    let (ws_tx, ws_rx) = ws.split();
    let (out, writer) = spdyclient::writer(tx);
    let windows = Arc::new(Windows::default());
    // Driven beside the others; its end (the runtime stopped reading)
    // leaves them to finish.
    let writer = async {
        writer.await;
        std::future::pending::<()>().await
    };
    let down = down(reader, early, ids, ws_tx, out.ctl, windows.clone());
    let up = up(ws_rx, ids, out.data, windows, v5);
    tokio::pin!(up);
    tokio::select! {
        _ = down => super::upgrade::linger(up).await,
        _ = &mut up => {}
        () = writer => {}
    }
}

/// The runtime's frames: output and status to the client, credit back
/// for what was consumed; the rest as [`spdyclient::control`] does.
async fn down<C: AsyncRead + AsyncWrite + Unpin, T: AsyncRead>(
    mut reader: Reader<T>,
    early: Vec<Frame>,
    ids: Ids,
    mut ws_tx: SplitSink<WebSocketStream<C>, Message>,
    ctl: mpsc::UnboundedSender<Frame>,
    windows: Arc<Windows>,
) {
    let mut early = early.into_iter();
    // Channels still open on the runtime's side.
    let mut open: Vec<u32> = [Some(ids.error), ids.stdout, ids.stderr]
        .into_iter()
        .flatten()
        .collect();
    let mut credit = Credit::default();
    while !open.is_empty() {
        let frame = match early.next() {
            Some(f) => f,
            None => match reader.next().await {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "runtime stream session ended");
                    break;
                }
            },
        };
        match spdyclient::control(frame, &ctl, &windows) {
            Some(Frame::Data { stream, fin, data }) => {
                if let (Some(ch), false) = (ids.channel(stream), data.is_empty()) {
                    if ws_tx
                        .send(Message::Binary(channel_message(ch, &data)))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                credit.read(stream, data.len() as u32, fin, &ctl);
                if fin {
                    open.retain(|id| *id != stream);
                }
            }
            Some(Frame::RstStream { stream, .. }) => open.retain(|id| *id != stream),
            // GOAWAY: no new streams; the open ones still finish.
            _ => {}
        }
    }
    // The status (if any) went out on the error channel: end normally.
    let _ = ws_tx
        .send(Message::Close(Some(CloseFrame {
            code: CloseCode::Normal,
            reason: "".into(),
        })))
        .await;
    let _ = ws_tx.close().await;
}

/// A message of channel `ch` carrying `data`.
pub(super) fn channel_message(ch: u8, data: &[u8]) -> Bytes {
    let mut m = BytesMut::with_capacity(1 + data.len());
    m.put_u8(ch);
    m.put_slice(data);
    m.freeze()
}

/// The payload of a client's message: binary and text messages alike (the
/// Python client writes stdin as text), the first byte naming the
/// channel; None when the client is gone.
pub(super) fn client_payload(msg: Result<Message, WsError>) -> Option<Option<Bytes>> {
    match msg {
        Ok(Message::Binary(b)) => Some(Some(b)),
        Ok(Message::Text(t)) => Some(Some(Bytes::from(t))),
        Ok(Message::Close(_)) | Err(_) => None,
        Ok(_) => Some(None),
    }
}

/// The client's messages: stdin and resize to their SPDY streams, and
/// (v5) stdin's close as a FIN; until the client closes, even once the
/// runtime takes no more (what it sends then is dropped).
async fn up<C: AsyncRead + AsyncWrite + Unpin>(
    mut ws_rx: SplitStream<WebSocketStream<C>>,
    ids: Ids,
    data: mpsc::Sender<Frame>,
    windows: Arc<Windows>,
    v5: bool,
) {
    let mut stdin_open = ids.stdin.is_some();
    let mut runtime_open = true;
    while let Some(msg) = ws_rx.next().await {
        let b = match client_payload(msg) {
            Some(Some(b)) => b,
            Some(None) => continue,
            None => break,
        };
        let Some((&ch, payload)) = b.split_first() else {
            continue;
        };
        if !runtime_open {
            continue;
        }
        match (ch, ids.stdin, ids.resize) {
            (STDIN, Some(stream), _) if stdin_open => {
                match send_data(&data, &windows, stream, b.slice(1..)).await {
                    Sent::All => {}
                    Sent::StreamGone => stdin_open = false,
                    Sent::RuntimeGone => runtime_open = false,
                }
            }
            (RESIZE, _, Some(stream)) => {
                let f = Frame::Data {
                    stream,
                    fin: false,
                    data: Bytes::copy_from_slice(payload),
                };
                runtime_open = data.send(f).await.is_ok();
            }
            (CLOSE, Some(stream), _) if v5 && payload.first() == Some(&STDIN) && stdin_open => {
                stdin_open = false;
                let f = Frame::Data {
                    stream,
                    fin: true,
                    data: Bytes::new(),
                };
                runtime_open = data.send(f).await.is_ok();
            }
            _ => {}
        }
    }
}

/// How far [`send_data`] got.
pub(super) enum Sent {
    All,
    /// The runtime reset the stream.
    StreamGone,
    /// The runtime stopped reading.
    RuntimeGone,
}

/// `rest` to `stream` in frames the runtime's window allows.
pub(super) async fn send_data(
    data: &mpsc::Sender<Frame>,
    windows: &Windows,
    stream: u32,
    mut rest: Bytes,
) -> Sent {
    while !rest.is_empty() {
        let Some(n) = windows.take(stream, rest.len().min(MAX_DATA)).await else {
            return Sent::StreamGone;
        };
        let f = Frame::Data {
            stream,
            fin: false,
            data: rest.split_to(n),
        };
        if data.send(f).await.is_err() {
            return Sent::RuntimeGone;
        }
    }
    Sent::All
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::spdy;
    use axum::http::header;
    use tokio::io::{duplex, AsyncReadExt as _, AsyncWriteExt as _};
    use tokio_tungstenite::tungstenite::protocol::Role;

    /// A runtime that accepts the streams, writes `output` on stdout and
    /// an exit status on the error stream, and hangs up at once, as
    /// containerd does when the command exits: nothing it was sent after
    /// that can be written any more.
    async fn runtime_that_hangs_up(mut io: tokio::io::DuplexStream, output: Vec<u8>) {
        let mut dec = spdy::Decoder::new();
        let mut buf = BytesMut::new();
        let mut streams = Vec::new();
        while streams.len() < 4 {
            match dec.decode(&mut buf).unwrap() {
                Some(Frame::SynStream { stream, .. }) => streams.push(stream),
                Some(_) => {}
                None => assert_ne!(io.read_buf(&mut buf).await.unwrap(), 0),
            }
        }
        let (error, stdout, stderr) = (streams[0], streams[2], streams[3]);
        let mut enc = spdy::Encoder::new().unwrap();
        let mut out = BytesMut::new();
        for &stream in &streams {
            let reply = Frame::SynReply {
                stream,
                fin: false,
                headers: vec![],
            };
            enc.encode(&reply, &mut out).unwrap();
        }
        for chunk in output.chunks(16 * 1024) {
            let data = Bytes::copy_from_slice(chunk);
            let frame = Frame::Data {
                stream: stdout,
                fin: false,
                data,
            };
            enc.encode(&frame, &mut out).unwrap();
        }
        let status = Bytes::from_static(br#"{"status":"Success"}"#);
        for (stream, data) in [
            (stdout, Bytes::new()),
            (stderr, Bytes::new()),
            (error, status),
        ] {
            let frame = Frame::Data {
                stream,
                fin: true,
                data,
            };
            enc.encode(&frame, &mut out).unwrap();
        }
        io.write_all(&out).await.unwrap();
    }

    /// The command's whole output and status reach a client slower than
    /// the runtime, which hung up meanwhile: our window updates then fail
    /// to reach it, and that must not cut the output short.
    #[tokio::test]
    async fn output_outlives_the_runtimes_hang_up() {
        let output: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let (agent_rt, rt) = duplex(1 << 20);
        let runtime = tokio::spawn(runtime_that_hangs_up(rt, output.clone()));
        let streams = Streams {
            stdin: true,
            stdout: true,
            stderr: true,
            tty: false,
        };
        let (session, ids) = open(agent_rt, streams).await.unwrap();
        runtime.await.unwrap();

        // A narrow pipe to the client: the output queues here.
        let (agent_ws, client) = duplex(4 * 1024);
        let server = WebSocketStream::from_raw_socket(agent_ws, Role::Server, None).await;
        let bridge = tokio::spawn(bridge(server, session, ids, true));
        let mut client = WebSocketStream::from_raw_socket(client, Role::Client, None).await;
        client
            .send(Message::Binary(Bytes::from_static(b"\x00some stdin")))
            .await
            .unwrap();
        let (mut stdout, mut status, mut closed) = (Vec::new(), Vec::new(), None);
        while let Some(msg) = client.next().await {
            let msg = msg.unwrap_or_else(|e| {
                panic!("the session broke off after {} bytes: {e}", stdout.len())
            });
            match msg {
                Message::Binary(b) if b[0] == STDOUT => stdout.extend_from_slice(&b[1..]),
                Message::Binary(b) if b[0] == ERROR => status.extend_from_slice(&b[1..]),
                Message::Close(c) => closed = c.map(|c| c.code),
                _ => {}
            }
        }
        bridge.await.unwrap();
        assert_eq!(stdout.len(), output.len());
        assert!(stdout == output, "the output arrived altered");
        assert_eq!(status, br#"{"status":"Success"}"#);
        assert_eq!(closed, Some(CloseCode::Normal));
    }

    fn headers(upgrade: &str, protocols: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::UPGRADE, upgrade.parse().unwrap());
        h.insert("sec-websocket-protocol", protocols.parse().unwrap());
        h
    }

    #[test]
    fn takes_over_only_v5_and_v4_websockets() {
        assert_eq!(wanted(&headers("websocket", "v5.channel.k8s.io")), Some(V5));
        assert_eq!(
            wanted(&headers(
                "websocket",
                "v4.channel.k8s.io, v5.channel.k8s.io"
            )),
            Some(V5)
        );
        assert_eq!(
            wanted(&headers("WebSocket", "channel.k8s.io, v4.channel.k8s.io")),
            Some(V4)
        );
        assert_eq!(wanted(&headers("websocket", "base64.channel.k8s.io")), None);
        assert_eq!(wanted(&headers("SPDY/3.1", "v5.channel.k8s.io")), None);
    }
}
