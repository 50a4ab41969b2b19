//! The node server (the kubelet's port 10250): HTTPS with client
//! certificates, every request authenticated and authorized before it
//! reaches a handler. The router is assembled here from the handler
//! modules; each contributes `routes(state) -> Router`.

use std::future::Future;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use hyper::body::Incoming;
use tokio::net::TcpListener;
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
        .merge(super::configz::routes(state.clone()))
        .merge(super::tunnel::routes(state.clone()))
        .merge(super::syslogs::routes())
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
/// connections (streams included) are then given a few seconds. Connections
/// are capped below `fd_limit`, the process's open-files limit.
pub async fn serve(
    listener: TcpListener,
    tls: rustls::ServerConfig,
    router: Router,
    fd_limit: u64,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(address = %addr, "node server listening");
    }
    let make = move |cert: Option<&[u8]>| {
        let peer = Peer(cert.and_then(auth::identity_from_cert));
        let router = router.clone();
        move |mut req: hyper::Request<Incoming>| {
            req.extensions_mut().insert(peer.clone());
            let router = router.clone();
            async move {
                let resp = router.oneshot(req.map(axum::body::Body::new)).await;
                resp.unwrap_or_else(|e| match e {})
            }
        }
    };
    skiff_daemon::serve::serve(
        listener,
        acceptor,
        connection_limits(fd_limit),
        make,
        shutdown,
    )
    .await;
}

/// The node server's caps: every caller is the API server, an
/// administrator or a monitoring agent, so a few hundred connections are
/// plenty; beyond, a flood of idle connections must not starve the agent
/// of descriptors.
fn connection_limits(fd_limit: u64) -> Arc<skiff_daemon::limits::ConnectionLimits> {
    use skiff_daemon::limits;
    limits::ConnectionLimits::new(limits::connection_cap(1000, fd_limit), 250)
}
