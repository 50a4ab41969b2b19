//! The HTTPS accept loop and connections of both skiff servers (the API
//! server and the node server), within kube-apiserver's bounds: connection
//! caps, a 10 s TLS handshake, 32 s to send request headers, 90 s idle with
//! nothing in progress; HTTP/1.1 and HTTP/2 with upgrades (exec, attach,
//! port-forward).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_rustls::server::TlsStream;

use crate::limits::{idle_expired, Activity, ConnectionLimits, Guarded, TrackedIo};

pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(32);
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// How long open connections get to finish once the server stops.
const DRAIN: Duration = Duration::from_secs(5);

/// The address of the connection a request came on, in the request's
/// extensions (the API server's audit log lists it in `sourceIPs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteAddr(pub SocketAddr);

/// Accept on `listener` until `shutdown` resolves, each connection within
/// `limits`, its requests answered by the handler `make` returns for its
/// client certificate (DER; `None` for anonymous callers), each request
/// carrying its connection's [`RemoteAddr`] in its extensions. Open
/// connections, streams included, then get a few seconds.
pub async fn serve<M, H, F, B>(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    limits: Arc<ConnectionLimits>,
    make: M,
    shutdown: impl Future<Output = ()>,
) where
    M: Fn(Option<&[u8]>) -> H + Send + Sync + 'static,
    H: Fn(Request<Incoming>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: http_body::Body + Unpin + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let make = Arc::new(make);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            res = listener.accept() => match res {
                Ok((tcp, peer)) => {
                    // Over a cap the connection is closed unread: it costs
                    // one accept, never a handshake or a descriptor held.
                    let Some(permit) = limits.admit(peer.ip()) else {
                        tracing::debug!(%peer, "connection refused: connection limit reached");
                        continue;
                    };
                    let _ = tcp.set_nodelay(true);
                    let (acceptor, make, stop) = (acceptor.clone(), make.clone(), stop_rx.clone());
                    conns.spawn(async move {
                        let _permit = permit;
                        let Some(tls) = handshake(&acceptor, tcp).await else {
                            return;
                        };
                        let handler = make(client_cert(&tls));
                        let handler = move |mut req: Request<Incoming>| {
                            req.extensions_mut().insert(RemoteAddr(peer));
                            handler(req)
                        };
                        connection(tls, handler, stop).await;
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            _ = &mut shutdown => break,
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let drain = async { while conns.join_next().await.is_some() {} };
    if tokio::time::timeout(DRAIN, drain).await.is_err() {
        conns.abort_all();
    }
}

/// The TLS handshake, bounded; `None` when it fails or takes too long.
pub async fn handshake(
    acceptor: &tokio_rustls::TlsAcceptor,
    tcp: TcpStream,
) -> Option<TlsStream<TcpStream>> {
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(s)) => Some(s),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "TLS handshake failed");
            None
        }
        Err(_) => None,
    }
}

/// The DER of the client certificate a TLS connection presented.
pub fn client_cert(tls: &TlsStream<TcpStream>) -> Option<&[u8]> {
    tls.get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.as_ref())
}

/// Serve requests on `io` with `handler` until the client leaves, the
/// connection idles out, or `stop` turns true (then in-flight requests get
/// a few seconds).
pub async fn connection<I, H, F, B>(io: I, handler: H, mut stop: watch::Receiver<bool>)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Fn(Request<Incoming>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: http_body::Body + Unpin + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let activity = Arc::new(Activity::default());
    let busy = activity.clone();
    let handler = Arc::new(handler);
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let guard = busy.begin();
        let answer = handler(req);
        // A streamed answer (a watch, a followed log) keeps the connection
        // busy until its last byte.
        async move { Ok::<_, Infallible>(answer.await.map(|b| Guarded::new(b, guard))) }
    });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let io = TokioIo::new(TrackedIo::new(io, activity.clone()));
    let conn = builder.serve_connection_with_upgrades(io, svc);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = idle_expired(&activity, IDLE_TIMEOUT) => {
            tracing::debug!("closing an idle connection");
        }
        _ = async { let _ = stop.wait_for(|s| *s).await; } => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(DRAIN, conn).await;
        }
    }
}
