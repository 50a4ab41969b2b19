//! exec and attach over WebSocket, as kubectl 1.30 and later ask for them
//! first: subprotocol `v5.channel.k8s.io` (or `v4.channel.k8s.io`), binary
//! messages whose first byte names the channel (0 stdin, 1 stdout,
//! 2 stderr, 3 error, 4 resize; v5 adds `[255, channel]`, "this channel is
//! closed"). The runtime's streaming server speaks SPDY/3.1 only, so the
//! agent ends the WebSocket here and is itself the remote-command SPDY
//! client towards the runtime (protocol v4.channel.k8s.io: one stream per
//! channel, named by its `streamType` header), as upstream's API server
//! translates for kubelets that cannot speak WebSocket.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::Request;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::{BufMut as _, Bytes, BytesMut};
use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt as _, StreamExt as _};
use hyper_util::rt::TokioIo;
use tokio::io::{
    AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadHalf, WriteHalf,
};
use tokio::sync::{mpsc, Notify};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use super::spdy::{self, Frame};

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
    let upgrade = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    if !upgrade {
        return None;
    }
    let offered = super::upgrade::header_values(headers, "sec-websocket-protocol");
    [V5, V4]
        .into_iter()
        .find(|p| offered.iter().any(|o| o == p))
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
    let Some(key) = req
        .headers()
        .get("sec-websocket-key")
        .and_then(|v| v.to_str().ok())
        .map(|k| derive_accept_key(k.as_bytes()))
    else {
        return (StatusCode::BAD_REQUEST, "missing Sec-WebSocket-Key").into_response();
    };
    let runtime = match super::upgrade::spdy_upgrade(url, SPDY_PROTOCOL).await {
        Ok(io) => io,
        Err(r) => return r,
    };
    let session = match tokio::time::timeout(OPEN_TIMEOUT, Session::open(runtime, streams)).await {
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
    let client = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        match client.await {
            Ok(io) => {
                let ws =
                    WebSocketStream::from_raw_socket(TokioIo::new(io), Role::Server, None).await;
                bridge(ws, session, protocol == V5).await;
            }
            Err(e) => tracing::debug!(error = %e, "remote command websocket upgrade failed"),
        }
    });
    super::upgrade::switching_protocols(&key, protocol)
}

#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error(transparent)]
    Spdy(#[from] spdy::Error),
    #[error("runtime connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("the runtime closed the connection")]
    Closed,
    #[error("the runtime refused stream {0} (status {1})")]
    Refused(u32, u32),
}

/// The incoming half of the SPDY session.
struct Reader<T> {
    rx: ReadHalf<T>,
    buf: BytesMut,
    dec: spdy::Decoder,
}

impl<T: AsyncRead> Reader<T> {
    /// The next frame; None at the end of the connection.
    async fn next(&mut self) -> Result<Option<Frame>, SessionError> {
        loop {
            if let Some(f) = self.dec.decode(&mut self.buf)? {
                return Ok(Some(f));
            }
            if self.buf.capacity() - self.buf.len() < 16 * 1024 {
                self.buf.reserve(64 * 1024);
            }
            if self.rx.read_buf(&mut self.buf).await? == 0 {
                return Ok(None);
            }
        }
    }
}

/// A remote-command SPDY session whose streams the runtime accepted, over
/// the runtime's connection `T`.
struct Session<T> {
    reader: Reader<T>,
    tx: WriteHalf<T>,
    ids: Ids,
    /// Frames read while waiting for the replies, handled later.
    early: Vec<Frame>,
}

impl<T: AsyncRead + AsyncWrite> Session<T> {
    /// Create the streams as upstream's v4 client does (error, then
    /// stdin, stdout, stderr, and resize for a terminal) and wait until
    /// the runtime has replied to each.
    async fn open(io: T, s: Streams) -> Result<Session<T>, SessionError> {
        let (rx, mut tx) = tokio::io::split(io);
        let mut reader = Reader {
            rx,
            buf: BytesMut::with_capacity(64 * 1024),
            dec: spdy::Decoder::new(),
        };
        let mut enc = spdy::Encoder::new()?;
        let mut next_id = 1u32;
        let mut out = BytesMut::new();
        let mut open = |kind: &str, out: &mut BytesMut| -> Result<u32, SessionError> {
            let stream = next_id;
            next_id += 2;
            enc.encode(
                &Frame::SynStream {
                    stream,
                    fin: false,
                    headers: vec![("streamtype".into(), kind.into())],
                },
                out,
            )?;
            Ok(stream)
        };
        let error = open("error", &mut out)?;
        let mut opt =
            |on: bool, kind: &str, out: &mut BytesMut| -> Result<Option<u32>, SessionError> {
                if on {
                    open(kind, out).map(Some)
                } else {
                    Ok(None)
                }
            };
        let stdin = opt(s.stdin, "stdin", &mut out)?;
        let stdout = opt(s.stdout, "stdout", &mut out)?;
        let stderr = opt(s.stderr && !s.tty, "stderr", &mut out)?;
        let resize = opt(s.tty, "resize", &mut out)?;
        let ids = Ids {
            error,
            stdin,
            stdout,
            stderr,
            resize,
        };
        tx.write_all(&out).await?;
        tx.flush().await?;

        let mut waiting: Vec<u32> = [Some(error), stdin, stdout, stderr, resize]
            .into_iter()
            .flatten()
            .collect();
        let mut early = Vec::new();
        while !waiting.is_empty() {
            let frame = reader.next().await?.ok_or(SessionError::Closed)?;
            match frame {
                Frame::SynReply { stream, .. } => waiting.retain(|id| *id != stream),
                Frame::RstStream { stream, status } if waiting.contains(&stream) => {
                    return Err(SessionError::Refused(stream, status))
                }
                Frame::Ping(id) => {
                    let mut b = BytesMut::new();
                    enc.encode(&Frame::Ping(id), &mut b)?;
                    tx.write_all(&b).await?;
                }
                other => early.push(other),
            }
        }
        Ok(Session {
            reader,
            tx,
            ids,
            early,
        })
    }
}

/// The runtime's send window for stdin. The SPDY servers behind
/// Kubernetes runtimes (spdystream) neither send WINDOW_UPDATE nor
/// enforce windows, so it is only enforced once the runtime shows it
/// does flow control (a WINDOW_UPDATE or an initial-window SETTINGS).
struct Window {
    state: Mutex<WindowState>,
    changed: Notify,
}

struct WindowState {
    enforced: bool,
    session: i64,
    stream: i64,
    initial: i64,
    closed: bool,
}

impl Window {
    fn new() -> Window {
        let w = i64::from(spdy::INITIAL_WINDOW);
        Window {
            state: Mutex::new(WindowState {
                enforced: false,
                session: w,
                stream: w,
                initial: w,
                closed: false,
            }),
            changed: Notify::new(),
        }
    }

    fn update(&self, f: impl FnOnce(&mut WindowState)) {
        if let Ok(mut s) = self.state.lock() {
            f(&mut s);
        }
        self.changed.notify_one();
    }

    /// Up to `want` bytes of credit; None once the stream is gone.
    async fn take(&self, want: usize) -> Option<usize> {
        loop {
            {
                let mut s = self.state.lock().ok()?;
                if s.closed {
                    return None;
                }
                if !s.enforced {
                    return Some(want);
                }
                let avail = s.session.min(s.stream);
                if avail > 0 {
                    let n = want.min(avail as usize);
                    s.session -= n as i64;
                    s.stream -= n as i64;
                    return Some(n);
                }
            }
            self.changed.notified().await;
        }
    }
}

/// Relay until the runtime has finished the streams (the status went out
/// on the error channel) or the client is gone.
///
/// The runtime closes its connection as soon as the command has exited,
/// while its last output may still be queued here behind a slow client:
/// failing to write to the runtime (our window updates, stdin nobody
/// reads) therefore ends neither the session nor the output, only the
/// runtime's end decides it.
async fn bridge<C, T>(ws: WebSocketStream<C>, session: Session<T>, v5: bool)
where
    C: AsyncRead + AsyncWrite + Unpin,
    T: AsyncRead + AsyncWrite,
{
    let Session {
        reader,
        mut tx,
        ids,
        early,
    } = session;
    let (ws_tx, ws_rx) = ws.split();
    // Control frames (window updates, pings) never wait behind stdin.
    let (ctl_tx, mut ctl_rx) = mpsc::unbounded_channel::<Frame>();
    let (data_tx, mut data_rx) = mpsc::channel::<Frame>(8);
    let window = Arc::new(Window::new());

    let writer = async move {
        // No header blocks are sent after the session is open: a fresh
        // encoder's compression context is never used.
        let Ok(mut enc) = spdy::Encoder::new() else {
            return;
        };
        let mut buf = BytesMut::new();
        loop {
            let frame = tokio::select! {
                biased;
                Some(f) = ctl_rx.recv() => f,
                Some(f) = data_rx.recv() => f,
                else => break,
            };
            buf.clear();
            if enc.encode(&frame, &mut buf).is_err() || tx.write_all(&buf).await.is_err() {
                break;
            }
        }
        let _ = tx.shutdown().await;
    };
    // Driven beside the others; its end (the runtime stopped reading)
    // leaves them to finish.
    let writer = async {
        writer.await;
        std::future::pending::<()>().await
    };
    let down = down(reader, early, ids, ws_tx, ctl_tx, window.clone());
    let up = up(ws_rx, ids, data_tx, window, v5);
    tokio::pin!(up);
    tokio::select! {
        _ = down => super::upgrade::linger(up).await,
        _ = &mut up => {}
        () = writer => {}
    }
}

/// The runtime's frames: output and status to the client, credit back
/// for what was consumed, pings answered, window changes noted.
async fn down<C: AsyncRead + AsyncWrite + Unpin, T: AsyncRead>(
    mut reader: Reader<T>,
    early: Vec<Frame>,
    ids: Ids,
    mut ws_tx: SplitSink<WebSocketStream<C>, Message>,
    ctl: mpsc::UnboundedSender<Frame>,
    window: Arc<Window>,
) {
    let mut early = early.into_iter();
    // Channels still open on the runtime's side.
    let mut open: Vec<u32> = [Some(ids.error), ids.stdout, ids.stderr]
        .into_iter()
        .flatten()
        .collect();
    // Bytes consumed and not yet credited back, session and per stream.
    let mut unacked_session = 0u32;
    let mut unacked: Vec<(u32, u32)> = Vec::new();
    let half = spdy::INITIAL_WINDOW / 2;
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
        match frame {
            Frame::Data { stream, fin, data } => {
                let len = data.len() as u32;
                if let (Some(ch), true) = (ids.channel(stream), len > 0) {
                    let mut m = BytesMut::with_capacity(1 + data.len());
                    m.put_u8(ch);
                    m.put_slice(&data);
                    if ws_tx.send(Message::Binary(m.freeze())).await.is_err() {
                        return;
                    }
                }
                if len > 0 {
                    unacked_session += len;
                    if unacked_session >= half {
                        let _ = ctl.send(Frame::WindowUpdate {
                            stream: 0,
                            delta: unacked_session,
                        });
                        unacked_session = 0;
                    }
                    if !fin {
                        let i = match unacked.iter().position(|(s, _)| *s == stream) {
                            Some(i) => i,
                            None => {
                                unacked.push((stream, 0));
                                unacked.len() - 1
                            }
                        };
                        unacked[i].1 += len;
                        if unacked[i].1 >= half {
                            let _ = ctl.send(Frame::WindowUpdate {
                                stream,
                                delta: unacked[i].1,
                            });
                            unacked[i].1 = 0;
                        }
                    }
                }
                if fin {
                    open.retain(|id| *id != stream);
                }
            }
            Frame::RstStream { stream, .. } => {
                open.retain(|id| *id != stream);
                if Some(stream) == ids.stdin {
                    window.update(|w| w.closed = true);
                }
            }
            Frame::Ping(id) => {
                let _ = ctl.send(Frame::Ping(id));
            }
            Frame::WindowUpdate { stream, delta } => {
                let delta = i64::from(delta);
                window.update(|w| {
                    w.enforced = true;
                    if stream == 0 {
                        w.session += delta;
                    } else if Some(stream) == ids.stdin {
                        w.stream += delta;
                    }
                });
            }
            Frame::Settings(entries) => {
                for (_, id, value) in entries {
                    if id == spdy::SETTINGS_INITIAL_WINDOW_SIZE {
                        let value = i64::from(value);
                        window.update(|w| {
                            w.enforced = true;
                            w.stream += value - w.initial;
                            w.initial = value;
                        });
                    }
                }
            }
            Frame::SynStream { stream, .. } => {
                // The runtime has no business opening streams here.
                let _ = ctl.send(Frame::RstStream { stream, status: 3 });
            }
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

/// The client's messages: stdin and resize to their SPDY streams, and
/// (v5) stdin's close as a FIN; until the client closes, even once the
/// runtime takes no more (what it sends then is dropped).
async fn up<C: AsyncRead + AsyncWrite + Unpin>(
    mut ws_rx: SplitStream<WebSocketStream<C>>,
    ids: Ids,
    data: mpsc::Sender<Frame>,
    window: Arc<Window>,
    v5: bool,
) {
    let mut stdin_open = ids.stdin.is_some();
    let mut runtime_open = true;
    while let Some(msg) = ws_rx.next().await {
        let b = match msg {
            Ok(Message::Binary(b)) => b,
            Ok(Message::Close(_)) | Err(_) => break,
            Ok(_) => continue,
        };
        let Some((&ch, payload)) = b.split_first() else {
            continue;
        };
        if !runtime_open {
            continue;
        }
        match (ch, ids.stdin, ids.resize) {
            (STDIN, Some(stream), _) if stdin_open => {
                let mut rest = b.slice(1..);
                while !rest.is_empty() {
                    let Some(n) = window.take(rest.len().min(MAX_DATA)).await else {
                        stdin_open = false;
                        break;
                    };
                    let chunk = rest.split_to(n);
                    let f = Frame::Data {
                        stream,
                        fin: false,
                        data: chunk,
                    };
                    if data.send(f).await.is_err() {
                        runtime_open = false;
                        break;
                    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::duplex;

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
        let session = Session::open(agent_rt, streams).await.unwrap();
        runtime.await.unwrap();

        // A narrow pipe to the client: the output queues here.
        let (agent_ws, client) = duplex(4 * 1024);
        let server = WebSocketStream::from_raw_socket(agent_ws, Role::Server, None).await;
        let bridge = tokio::spawn(bridge(server, session, true));
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
