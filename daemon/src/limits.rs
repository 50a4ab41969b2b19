//! Bounds on what one network server holds for its callers: file
//! descriptors, connections (in all and per source address), and how long a
//! connection may sit idle.
//!
//! Go's `http.Server` in kube-apiserver and the kubelet bounds a connection
//! by its header-read and idle timeouts; a TLS server that only bounds the
//! handshake can be held open by anyone who completes one and then says
//! nothing, until the process runs out of descriptors and stops accepting
//! at all. These pieces are what both skiff servers use instead.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// Descriptors kept back from the connection cap for the process's own
/// files (store, logs, CRI and etcd clients, certificates being reloaded).
const RESERVED_FDS: u64 = 128;

/// Raise the soft limit on open files to the hard limit, as Go's runtime
/// has done for every Go program since 1.19; returns the new soft limit.
///
/// # Errors
/// The limits could not be read or set.
pub fn raise_fd_limit() -> io::Result<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(io::Error::from)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).map_err(io::Error::from)?;
    }
    Ok(hard)
}

/// The most connections a process with `fd_limit` descriptors may hold
/// without starving itself, and no more than `wanted`.
pub fn connection_cap(wanted: usize, fd_limit: u64) -> usize {
    let room = fd_limit.saturating_sub(RESERVED_FDS).max(1);
    wanted.min(usize::try_from(room).unwrap_or(usize::MAX))
}

/// Connections admitted so far, in all and by source address.
#[derive(Debug)]
pub struct ConnectionLimits {
    total: usize,
    per_source: usize,
    open: Mutex<HashMap<IpAddr, usize>>,
    count: AtomicUsize,
}

impl ConnectionLimits {
    /// At most `total` connections, at most `per_source` from one address
    /// (0: no per-source cap). A per-source cap never exceeds half the
    /// total: with a low descriptor limit the total shrinks below the
    /// configured per-source figure, and one flooding address would
    /// otherwise hold every place.
    pub fn new(total: usize, per_source: usize) -> Arc<Self> {
        let per_source = if per_source == 0 {
            0
        } else {
            per_source.min((total / 2).max(1))
        };
        Arc::new(ConnectionLimits {
            total,
            per_source,
            open: Mutex::new(HashMap::new()),
            count: AtomicUsize::new(0),
        })
    }

    /// A permit for one more connection from `source`, held for as long as
    /// the connection; `None` when a cap is reached (the caller closes it
    /// at once, before reading anything).
    pub fn admit(self: &Arc<Self>, source: IpAddr) -> Option<ConnectionPermit> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if self.count.load(Ordering::Relaxed) >= self.total {
            return None;
        }
        let n = open.entry(source).or_default();
        if self.per_source != 0 && *n >= self.per_source {
            return None;
        }
        *n += 1;
        self.count.fetch_add(1, Ordering::Relaxed);
        Some(ConnectionPermit {
            limits: self.clone(),
            source,
        })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }
}

/// One admitted connection; dropping it frees its place.
#[derive(Debug)]
pub struct ConnectionPermit {
    limits: Arc<ConnectionLimits>,
    source: IpAddr,
}

impl Drop for ConnectionPermit {
    fn drop(&mut self) {
        let mut open = self.limits.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.source);
            }
        }
        self.limits.count.fetch_sub(1, Ordering::Relaxed);
    }
}

/// When a connection last moved bytes and how many of its requests are
/// still being answered (a watch is busy for as long as it streams).
#[derive(Debug)]
pub struct Activity {
    start: Instant,
    last_ms: AtomicU64,
    busy: AtomicUsize,
}

impl Default for Activity {
    fn default() -> Self {
        Activity {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
            busy: AtomicUsize::new(0),
        }
    }
}

impl Activity {
    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// Mark one request as being answered until the guard is dropped.
    pub fn begin(self: &Arc<Self>) -> BusyGuard {
        self.busy.fetch_add(1, Ordering::Relaxed);
        BusyGuard(self.clone())
    }

    /// Whether the connection has had no request in progress and no bytes
    /// either way for `idle`: Go's `IdleTimeout`.
    pub fn idle_for(&self, idle: Duration) -> bool {
        if self.busy.load(Ordering::Relaxed) > 0 {
            return false;
        }
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.start.elapsed().saturating_sub(last) >= idle
    }
}

/// A request in progress on a connection (see [`Activity::begin`]).
#[derive(Debug)]
pub struct BusyGuard(Arc<Activity>);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::Relaxed);
        self.0.touch();
    }
}

/// A response body that keeps its request counted as in progress until
/// the body has been sent or dropped.
#[derive(Debug)]
pub struct Guarded<B> {
    inner: B,
    _guard: BusyGuard,
}

impl<B> Guarded<B> {
    pub fn new(inner: B, guard: BusyGuard) -> Self {
        Guarded {
            inner,
            _guard: guard,
        }
    }
}

impl<B: http_body::Body + Unpin> http_body::Body for Guarded<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A connection's byte stream that records its [`Activity`].
#[derive(Debug)]
pub struct TrackedIo<T> {
    inner: T,
    activity: Arc<Activity>,
}

impl<T> TrackedIo<T> {
    pub fn new(inner: T, activity: Arc<Activity>) -> Self {
        activity.touch();
        TrackedIo { inner, activity }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for TrackedIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for TrackedIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Resolves once the connection has been idle for `idle` (checked a few
/// times per period); the caller then drops the connection.
pub async fn idle_expired(activity: &Activity, idle: Duration) {
    let tick = (idle / 4).max(Duration::from_millis(100));
    loop {
        tokio::time::sleep(tick).await;
        if activity.idle_for(idle) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_total_and_per_source_and_frees_on_drop() {
        let limits = ConnectionLimits::new(5, 2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let c: IpAddr = "10.0.0.3".parse().unwrap();
        let a1 = limits.admit(a).unwrap();
        let _a2 = limits.admit(a).unwrap();
        assert!(limits.admit(a).is_none(), "third from one source");
        let _b1 = limits.admit(b).unwrap();
        let _b2 = limits.admit(b).unwrap();
        let _c1 = limits.admit(c).unwrap();
        assert!(limits.admit(c).is_none(), "sixth in all");
        drop(a1);
        let _c2 = limits.admit(c).expect("a place came free");
        assert_eq!(limits.open(), 5);
    }

    #[test]
    fn one_source_never_takes_more_than_half() {
        // A hard descriptor limit of 1024 leaves 896 places, fewer than
        // the configured 1000 per source.
        let limits = ConnectionLimits::new(connection_cap(10_000, 1024), 1000);
        let flood: IpAddr = "127.0.0.2".parse().unwrap();
        let held: Vec<_> = std::iter::from_fn(|| limits.admit(flood)).collect();
        assert_eq!(held.len(), 448);
        let client: IpAddr = "127.0.0.1".parse().unwrap();
        assert!(
            limits.admit(client).is_some(),
            "another source still gets in"
        );
    }

    #[test]
    fn the_cap_leaves_descriptors_for_the_process() {
        assert_eq!(connection_cap(10_000, 1024), 896);
        assert_eq!(connection_cap(500, 1_048_576), 500);
        assert_eq!(connection_cap(500, 10), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_connection_is_never_idle() {
        let activity = Arc::new(Activity::default());
        let guard = activity.begin();
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!activity.idle_for(Duration::from_secs(1)));
        drop(guard);
        assert!(!activity.idle_for(Duration::from_secs(1)));
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(activity.idle_for(Duration::from_secs(1)));
    }
}
