//! The read-only status endpoint (the kubelet's read-only port, 10255 by
//! default, loopback only): `/healthz`, `/pods` (a PodList with live
//! statuses), `/node` (this node as a Node object), `/metrics`. It is how a user
//! inspects a node before it has joined an API server.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::List;

use crate::node::Facts;
use crate::pleg::Health;
use crate::shared::Shared;

#[derive(Clone)]
pub struct ServerState {
    pub shared: Arc<Shared>,
    pub health: Arc<Health>,
    pub facts: Arc<Facts>,
}

pub fn router(state: ServerState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/pods", get(pods))
        .route("/node", get(node))
        .route("/metrics", get(metrics))
        .with_state(state)
}

/// Serve until `shutdown` resolves.
///
/// # Errors
/// The address cannot be bound (in use, or not local).
pub async fn serve(
    addr: SocketAddr,
    state: ServerState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(address = %listener.local_addr()?, "status endpoint listening");
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}

/// Shared with the node server, which serves the same answers.
pub(super) async fn healthz(State(s): State<ServerState>) -> Response {
    match s.health.ready() {
        Ok(()) => (StatusCode::OK, "ok").into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e).into_response(),
    }
}

pub(super) async fn pods(State(s): State<ServerState>) -> Json<List<Pod>> {
    Json(List {
        items: s.shared.statuses.list(),
        metadata: Default::default(),
    })
}

async fn node(State(s): State<ServerState>) -> Response {
    let node = s.facts.node(
        &s.shared.config.node_name,
        &s.health.version(),
        s.health.ready(),
    );
    Json(node).into_response()
}

/// The agent's Prometheus metrics, as on the node server: loopback only,
/// like the rest of this endpoint.
async fn metrics() -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        crate::metrics::metrics().render(),
    )
        .into_response()
}
