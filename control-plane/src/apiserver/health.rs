//! `/healthz`, `/livez`, `/readyz`: `ok`, or with `?verbose` one line per
//! check (`[+]sqlite ok`), as upstream formats them; and the health of the
//! components the server runs beside it (`componentstatuses`).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use http::Response;

use super::request::Query;
use super::{text_response, ApiServer};

pub(crate) async fn check(api: &ApiServer, path: &str, query: &Query) -> Response<Body> {
    let endpoint = path
        .trim_matches('/')
        .split('/')
        .next()
        .unwrap_or("healthz")
        .to_string();
    let backend = api.store.backend();
    let mut checks: Vec<(String, Result<(), String>)> = vec![("ping".into(), Ok(()))];
    // Liveness must not depend on the datastore (a slow etcd would get a
    // healthy server restarted); readiness and healthz do.
    if endpoint != "livez" {
        let r = tokio::time::timeout(std::time::Duration::from_secs(5), api.store.health()).await;
        let r = match r {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("timed out".into()),
        };
        checks.push((backend.to_string(), r.clone()));
        // Upstream's readiness has its own etcd check (a shorter timeout
        // there); ours asks the store once and reports it under both names.
        if endpoint == "readyz" && backend == "etcd" {
            checks.push(("etcd-readiness".into(), r));
        }
    }
    if endpoint == "readyz" && *api.shutdown.borrow() {
        checks.push(("shutdown".into(), Err("the server is shutting down".into())));
    }
    // `/readyz/sqlite` checks one thing.
    if let Some(one) = path.trim_matches('/').split('/').nth(1) {
        checks.retain(|(n, _)| n == one);
        if checks.is_empty() {
            return text_response(
                404,
                format!("no such check {one:?}\n"),
                "text/plain; charset=utf-8",
            );
        }
    }
    let failed = checks.iter().any(|(_, r)| r.is_err());
    let code = if failed { 500 } else { 200 };
    if !failed && !query.0.contains_key("verbose") {
        return text_response(code, "ok".into(), "text/plain; charset=utf-8");
    }
    let mut out = String::new();
    for (name, r) in &checks {
        match r {
            Ok(()) => out.push_str(&format!("[+]{name} ok\n")),
            Err(_) => out.push_str(&format!("[-]{name} failed: reason withheld\n")),
        }
    }
    for (name, r) in &checks {
        if let Err(e) = r {
            tracing::warn!(check = %name, error = %e, "{endpoint} check failed");
        }
    }
    if failed {
        out.push_str(&format!("{endpoint} check failed\n"));
    } else {
        out.push_str(&format!("{endpoint} check passed\n"));
    }
    text_response(code, out, "text/plain; charset=utf-8")
}

/// Whether each component running beside the server (scheduler,
/// controller manager) is up: set by whoever starts them, read by
/// `componentstatuses`.
#[derive(Debug, Default)]
pub struct ComponentHealth(Mutex<BTreeMap<&'static str, Result<(), String>>>);

impl ComponentHealth {
    pub fn set(&self, name: &'static str, health: Result<(), String>) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name, health);
    }

    /// `component`, reported healthy while it runs and not once it ended.
    pub fn track<F: Future<Output = ()>>(
        self: &Arc<Self>,
        name: &'static str,
        component: F,
    ) -> impl Future<Output = ()> {
        let me = self.clone();
        me.set(name, Ok(()));
        async move {
            component.await;
            me.set(name, Err(format!("{name} stopped")));
        }
    }

    /// Every known component and its health, by name.
    pub fn all(&self) -> Vec<(&'static str, Result<(), String>)> {
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.iter().map(|(k, v)| (*k, v.clone())).collect()
    }
}
