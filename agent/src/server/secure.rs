//! The node server (the kubelet's port 10250): HTTPS with client
//! certificates, every request authenticated and authorized before it
//! reaches a handler. The router is assembled here from the handler
//! modules; each contributes `routes(state) -> Router`.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tower::ServiceExt as _;

use super::auth::{self, Authorizer, Identity};
use super::readonly::{healthz, pods, ServerState};
use super::stream;

/// The identity of a connection's verified client certificate, put into
/// every request's extensions by the accept loop; absent for anonymous
/// callers.
#[derive(Debug, Clone)]
pub struct Peer(pub Option<Identity>);

/// Every route of the node server, behind authentication and
/// authorization.
pub fn router(state: ServerState, authorizer: Arc<Authorizer>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/pods", get(pods))
        .with_state(state.clone())
        .merge(stream::routes(state.clone()))
        // Handlers of other modules plug in here, each `routes(state)`:
        .merge(super::logs::routes(state.clone()))
        .merge(super::stats::routes(state.clone()))
        .layer(middleware::from_fn_with_state(authorizer, guard))
}

/// Refuse anonymous callers (401) and callers the authorizer does not
/// allow (403), as the kubelet words them.
async fn guard(State(authorizer): State<Arc<Authorizer>>, req: Request, next: Next) -> Response {
    let peer = req.extensions().get::<Peer>().and_then(|p| p.0.clone());
    let Some(id) = peer else {
        return (StatusCode::UNAUTHORIZED, "Unauthorized").into_response();
    };
    let question = auth::Request::of(req.method(), req.uri().path());
    match authorizer.authorize(&id, &question).await {
        Ok(()) => next.run(req).await,
        Err(reason) => {
            tracing::info!(user = %id.user, path = %req.uri().path(), "node server request forbidden");
            (StatusCode::FORBIDDEN, reason).into_response()
        }
    }
}

/// Serve `router` over TLS on `listener` until `shutdown` resolves; open
/// connections (streams included) are then given a few seconds.
pub async fn serve(
    listener: TcpListener,
    tls: rustls::ServerConfig,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(address = %addr, "node server listening");
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut conns = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            res = listener.accept() => match res {
                Ok((tcp, peer)) => {
                    let _ = tcp.set_nodelay(true);
                    conns.spawn(serve_conn(tcp, peer, acceptor.clone(), router.clone(), stop_rx.clone()));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "node server accept failed");
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
    if tokio::time::timeout(Duration::from_secs(5), drain)
        .await
        .is_err()
    {
        conns.abort_all();
    }
}

async fn serve_conn(
    tcp: tokio::net::TcpStream,
    addr: SocketAddr,
    acceptor: tokio_rustls::TlsAcceptor,
    router: Router,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let tls = match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::debug!(peer = %addr, error = %e, "node server TLS handshake failed");
            return;
        }
        Err(_) => return,
    };
    let peer = Peer(
        tls.get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .and_then(|c| auth::identity_from_cert(c.as_ref())),
    );
    let svc = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        req.extensions_mut().insert(peer.clone());
        let router = router.clone();
        async move {
            let resp = router.oneshot(req.map(axum::body::Body::new)).await;
            Ok::<_, Infallible>(resp.unwrap_or_else(|e| match e {}))
        }
    });
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), svc);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = async { let _ = stop.wait_for(|s| *s).await; } => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(Duration::from_secs(5), conn).await;
        }
    }
}
