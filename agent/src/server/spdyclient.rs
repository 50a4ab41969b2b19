//! The client side of a SPDY/3.1 stream session with the runtime's
//! streaming server, shared by the WebSocket relays that end here
//! (exec/attach in [`super::wschannel`], port-forward channels in
//! [`super::wsportforward`]): opening streams and waiting for the
//! replies, reading frames, one writer that puts control frames before
//! data, the runtime's send windows, and credit back for what was read.

use std::future::Future;
use std::sync::Mutex;

use bytes::BytesMut;
use tokio::io::{
    AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadHalf, WriteHalf,
};
use tokio::sync::{mpsc, Notify};

use super::spdy::{self, Frame, Headers};

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Spdy(#[from] spdy::Error),
    #[error("runtime connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("the runtime closed the connection")]
    Closed,
    #[error("the runtime refused stream {0} (status {1})")]
    Refused(u32, u32),
}

/// The incoming half of the session.
pub struct Reader<T> {
    rx: ReadHalf<T>,
    buf: BytesMut,
    dec: spdy::Decoder,
}

impl<T: AsyncRead> Reader<T> {
    /// The next frame; None at the end of the connection.
    pub async fn next(&mut self) -> Result<Option<Frame>, SessionError> {
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

/// A session whose streams the runtime accepted, over its connection `T`.
pub struct Session<T> {
    pub reader: Reader<T>,
    pub tx: WriteHalf<T>,
    /// The id of each stream asked for, in the order asked.
    pub ids: Vec<u32>,
    /// Frames read while waiting for the replies, to handle first.
    pub early: Vec<Frame>,
}

impl<T: AsyncRead + AsyncWrite> Session<T> {
    /// Create one stream per header block, in order, and wait until the
    /// runtime has replied to each.
    pub async fn open(io: T, streams: Vec<Headers>) -> Result<Session<T>, SessionError> {
        let (rx, mut tx) = tokio::io::split(io);
        let mut reader = Reader {
            rx,
            buf: BytesMut::with_capacity(64 * 1024),
            dec: spdy::Decoder::new(),
        };
        let mut enc = spdy::Encoder::new()?;
        let mut out = BytesMut::new();
        let mut ids = Vec::with_capacity(streams.len());
        for (i, headers) in streams.into_iter().enumerate() {
            // Client-initiated streams have odd ids.
            let stream = 2 * i as u32 + 1;
            let syn = Frame::SynStream {
                stream,
                fin: false,
                headers,
            };
            enc.encode(&syn, &mut out)?;
            ids.push(stream);
        }
        tx.write_all(&out).await?;
        tx.flush().await?;

        let mut waiting = ids.clone();
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

/// The two queues of frames to the runtime: control frames (window
/// updates, pings) never wait behind data.
pub struct Outgoing {
    pub ctl: mpsc::UnboundedSender<Frame>,
    pub data: mpsc::Sender<Frame>,
}

/// The queues to the runtime and the task that writes them to `tx`; it
/// ends when both queues are dropped or the runtime stops reading.
pub fn writer<T: AsyncWrite>(mut tx: WriteHalf<T>) -> (Outgoing, impl Future<Output = ()>) {
    let (ctl, mut ctl_rx) = mpsc::unbounded_channel::<Frame>();
    let (data, mut data_rx) = mpsc::channel::<Frame>(8);
    let task = async move {
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
    (Outgoing { ctl, data }, task)
}

/// The runtime's send windows for the streams we write. The SPDY
/// servers behind Kubernetes runtimes (spdystream) neither send
/// WINDOW_UPDATE nor enforce windows, so they are only enforced once the
/// runtime shows it does flow control (a WINDOW_UPDATE or an
/// initial-window SETTINGS).
pub struct Windows {
    state: Mutex<WindowState>,
    changed: Notify,
}

struct WindowState {
    enforced: bool,
    session: i64,
    initial: i64,
    /// Each written stream's window; None once the runtime reset it.
    streams: Vec<(u32, Option<i64>)>,
}

impl WindowState {
    fn stream(&mut self, id: u32) -> &mut Option<i64> {
        let i = match self.streams.iter().position(|(s, _)| *s == id) {
            Some(i) => i,
            None => {
                self.streams.push((id, Some(self.initial)));
                self.streams.len() - 1
            }
        };
        &mut self.streams[i].1
    }
}

impl Default for Windows {
    /// Every window at SPDY/3.1's initial size, not yet enforced.
    fn default() -> Windows {
        let w = i64::from(spdy::INITIAL_WINDOW);
        Windows {
            state: Mutex::new(WindowState {
                enforced: false,
                session: w,
                initial: w,
                streams: Vec::new(),
            }),
            changed: Notify::new(),
        }
    }
}

impl Windows {
    fn update(&self, f: impl FnOnce(&mut WindowState)) {
        if let Ok(mut s) = self.state.lock() {
            f(&mut s);
        }
        self.changed.notify_waiters();
    }

    /// Up to `want` bytes of credit on `stream`; None once it is gone.
    pub async fn take(&self, stream: u32, want: usize) -> Option<usize> {
        loop {
            let changed = self.changed.notified();
            {
                let mut s = self.state.lock().ok()?;
                let enforced = s.enforced;
                let session = s.session;
                let window = s.stream(stream).as_mut()?;
                if !enforced {
                    return Some(want);
                }
                let avail = session.min(*window);
                if avail > 0 {
                    let n = want.min(avail as usize);
                    *window -= n as i64;
                    s.session -= n as i64;
                    return Some(n);
                }
            }
            changed.await;
        }
    }

    /// The runtime reset `stream`: nothing more is written to it.
    pub fn close(&self, stream: u32) {
        self.update(|s| *s.stream(stream) = None);
    }

    /// A control frame about our windows: WINDOW_UPDATE and SETTINGS.
    /// Any other frame is handed back.
    pub fn note(&self, frame: Frame) -> Option<Frame> {
        match frame {
            Frame::WindowUpdate { stream, delta } => {
                let delta = i64::from(delta);
                self.update(|s| {
                    s.enforced = true;
                    if stream == 0 {
                        s.session += delta;
                    } else if let Some(w) = s.stream(stream) {
                        *w += delta;
                    }
                });
                None
            }
            Frame::Settings(entries) => {
                for (_, id, value) in entries {
                    if id == spdy::SETTINGS_INITIAL_WINDOW_SIZE {
                        let value = i64::from(value);
                        self.update(|s| {
                            s.enforced = true;
                            let change = value - s.initial;
                            for (_, w) in &mut s.streams {
                                if let Some(w) = w {
                                    *w += change;
                                }
                            }
                            s.initial = value;
                        });
                    }
                }
                None
            }
            other => Some(other),
        }
    }
}

/// Credit back to the runtime for the data read from it: a WINDOW_UPDATE
/// per half window consumed, for the session and for each stream.
#[derive(Default)]
pub struct Credit {
    session: u32,
    streams: Vec<(u32, u32)>,
}

impl Credit {
    /// `len` bytes were read from `stream` (`fin`: its last).
    pub fn read(&mut self, stream: u32, len: u32, fin: bool, ctl: &mpsc::UnboundedSender<Frame>) {
        if len == 0 {
            return;
        }
        let half = spdy::INITIAL_WINDOW / 2;
        self.session += len;
        if self.session >= half {
            let _ = ctl.send(Frame::WindowUpdate {
                stream: 0,
                delta: self.session,
            });
            self.session = 0;
        }
        if fin {
            self.streams.retain(|(s, _)| *s != stream);
            return;
        }
        let i = match self.streams.iter().position(|(s, _)| *s == stream) {
            Some(i) => i,
            None => {
                self.streams.push((stream, 0));
                self.streams.len() - 1
            }
        };
        self.streams[i].1 += len;
        if self.streams[i].1 >= half {
            let _ = ctl.send(Frame::WindowUpdate {
                stream,
                delta: self.streams[i].1,
            });
            self.streams[i].1 = 0;
        }
    }
}

/// The frames a relay handles alike whatever it carries: pings answered,
/// window changes noted, streams the runtime opens refused, a reset
/// stream's window closed (the reset itself is handed back too). Data,
/// resets and GOAWAY are handed back.
pub fn control(
    frame: Frame,
    ctl: &mpsc::UnboundedSender<Frame>,
    windows: &Windows,
) -> Option<Frame> {
    match windows.note(frame)? {
        Frame::Ping(id) => {
            let _ = ctl.send(Frame::Ping(id));
            None
        }
        Frame::SynStream { stream, .. } => {
            // The runtime has no business opening streams here.
            let _ = ctl.send(Frame::RstStream { stream, status: 3 });
            None
        }
        Frame::RstStream { stream, status } => {
            windows.close(stream);
            Some(Frame::RstStream { stream, status })
        }
        other => Some(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn windows_are_enforced_only_once_the_runtime_uses_them() {
        let w = Windows::default();
        assert_eq!(w.take(1, 1 << 20).await, Some(1 << 20));
        assert!(w
            .note(Frame::WindowUpdate {
                stream: 1,
                delta: 10
            })
            .is_none());
        // Enforced now: the session window (64 KiB, minus nothing taken
        // while unenforced) bounds the stream's 64 KiB + 10.
        assert_eq!(w.take(1, 1 << 20).await, Some(64 * 1024));
        w.close(1);
        assert_eq!(w.take(1, 1).await, None);
        // Another stream has its own window, the session's is spent.
        let waiting = w.take(3, 5);
        tokio::pin!(waiting);
        assert!(futures::poll!(&mut waiting).is_pending());
        w.note(Frame::WindowUpdate {
            stream: 0,
            delta: 5,
        });
        assert_eq!(waiting.await, Some(5));
    }

    #[test]
    fn credit_is_given_back_per_half_window() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut c = Credit::default();
        c.read(1, 20 * 1024, false, &tx);
        assert!(rx.try_recv().is_err());
        c.read(1, 20 * 1024, false, &tx);
        assert_eq!(
            rx.try_recv().unwrap(),
            Frame::WindowUpdate {
                stream: 0,
                delta: 40 * 1024
            }
        );
        assert_eq!(
            rx.try_recv().unwrap(),
            Frame::WindowUpdate {
                stream: 1,
                delta: 40 * 1024
            }
        );
        // A stream's last data earns the session credit only.
        c.read(3, 40 * 1024, true, &tx);
        assert_eq!(
            rx.try_recv().unwrap(),
            Frame::WindowUpdate {
                stream: 0,
                delta: 40 * 1024
            }
        );
        assert!(rx.try_recv().is_err());
    }
}
