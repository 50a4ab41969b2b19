//! The proxy's `/healthz` (kube-proxy's port 10256) and `/metrics`
//! (10249). Healthy means the rules are current: a first sync happened,
//! and no change has been waiting longer than the timeout.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use super::{Error, Result, Status};

/// A change still unapplied after this long makes the proxy unhealthy.
const PENDING_TIMEOUT: Duration = Duration::from_secs(60);

/// The health endpoint's view of the sync loop.
#[derive(Clone)]
pub struct Health {
    status: Arc<Mutex<Status>>,
    /// The `/metrics` body ([`crate::ProxyConfig::render_metrics`]).
    render: fn() -> String,
}

/// A bound listener with its routes, ready to serve.
pub struct Server {
    listener: tokio::net::TcpListener,
    router: Router,
}

impl Server {
    pub async fn serve(self, stop: impl std::future::Future<Output = ()> + Send + 'static) {
        let addr = self.listener.local_addr().ok();
        if let Err(e) = axum::serve(self.listener, self.router)
            .with_graceful_shutdown(stop)
            .await
        {
            tracing::error!(?addr, "proxy health endpoint failed: {e}");
        }
    }
}

fn rfc3339(t: SystemTime) -> String {
    jiff::Timestamp::try_from(t)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

impl Health {
    pub fn new(status: Arc<Mutex<Status>>, render: fn() -> String) -> Health {
        Health { status, render }
    }

    /// Whether the rules are current, and the JSON body kube-proxy sends.
    pub fn check(&self) -> (bool, String) {
        let st = self.status.lock().unwrap_or_else(|p| p.into_inner());
        let now = SystemTime::now();
        let stale = st
            .oldest_pending
            .and_then(|t| now.duration_since(t).ok())
            .is_some_and(|d| d > PENDING_TIMEOUT);
        let healthy = st.last_sync.is_some() && !stale;
        let body = serde_json::json!({
            "lastUpdated": st.last_sync.map(rfc3339).unwrap_or_default(),
            "currentTime": rfc3339(now),
            "nodeEligible": true,
        });
        (healthy, body.to_string())
    }

    /// Bind the health and metrics listeners (the same one when both
    /// addresses are equal).
    ///
    /// # Errors
    /// An address cannot be bound.
    pub async fn bind(
        &self,
        healthz: Option<SocketAddr>,
        metrics: Option<SocketAddr>,
    ) -> Result<Vec<Server>> {
        let health_routes = Router::new()
            .route("/healthz", get(healthz_handler))
            .route("/livez", get(healthz_handler))
            .with_state(self.clone());
        let metrics_routes = Router::new()
            .route("/metrics", get(metrics_handler))
            .with_state(self.clone());
        let mut servers = Vec::new();
        let bind = |what, address: SocketAddr| async move {
            tokio::net::TcpListener::bind(address)
                .await
                .map_err(|source| Error::Listen {
                    what,
                    address,
                    source,
                })
        };
        match (healthz, metrics) {
            (Some(h), Some(m)) if h == m => servers.push(Server {
                listener: bind("health and metrics endpoint", h).await?,
                router: health_routes.merge(metrics_routes),
            }),
            (h, m) => {
                if let Some(h) = h {
                    servers.push(Server {
                        listener: bind("health endpoint", h).await?,
                        router: health_routes,
                    });
                }
                if let Some(m) = m {
                    servers.push(Server {
                        listener: bind("metrics endpoint", m).await?,
                        router: metrics_routes,
                    });
                }
            }
        }
        Ok(servers)
    }
}

async fn healthz_handler(State(h): State<Health>) -> impl IntoResponse {
    let (healthy, body) = h.check();
    let code = if healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, [("content-type", "application/json")], body)
}

async fn metrics_handler(State(h): State<Health>) -> impl IntoResponse {
    (
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        (h.render)(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthy_once_synced_and_current() {
        let status = Arc::new(Mutex::new(Status::default()));
        let h = Health::new(status.clone(), crate::metrics::render);
        assert!(!h.check().0, "not before the first sync");
        status.lock().unwrap().last_sync = Some(SystemTime::now());
        let (ok, body) = h.check();
        assert!(ok);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(v["lastUpdated"].as_str().unwrap().ends_with('Z'));
        status.lock().unwrap().oldest_pending =
            Some(SystemTime::now() - PENDING_TIMEOUT - Duration::from_secs(1));
        assert!(!h.check().0, "a change pending too long");
    }
}
