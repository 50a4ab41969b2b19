//! Calling a webhook: one HTTPS POST of the review, trusting only the
//! webhook's `caBundle` (the system's roots without one), within its
//! timeout, reading at most [`MAX_RESPONSE`] bytes of the answer.
//! Connections are pooled per webhook (and per endpoint a service
//! resolves to, the certificate still checked against the service's DNS
//! name).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The most of a webhook's answer that is read: a review carries two
/// objects, a patch of one in base64 at most a third larger.
pub const MAX_RESPONSE: usize = 4 * crate::apiserver::MAX_BODY;

pub struct Client {
    tls: Result<Arc<rustls::ClientConfig>, String>,
    pooled: Mutex<HashMap<Option<SocketAddr>, reqwest::Client>>,
}

impl Client {
    /// A client trusting `ca` (PEM; empty: the system's roots).
    pub fn new(ca: &[u8]) -> Client {
        let ca = (!ca.is_empty()).then_some(ca);
        Client {
            tls: crate::auth::oidc::keys::tls_config(ca),
            pooled: Mutex::default(),
        }
    }

    fn client(&self, resolve: Option<(&str, SocketAddr)>) -> Result<reqwest::Client, String> {
        let tls = self.tls.clone().map_err(|e| format!("caBundle: {e}"))?;
        let mut pooled = self.pooled.lock().expect("webhook clients lock");
        let key = resolve.map(|(_, a)| a);
        if let Some(c) = pooled.get(&key) {
            return Ok(c.clone());
        }
        let mut b = reqwest::Client::builder()
            .use_preconfigured_tls((*tls).clone())
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy();
        if let Some((host, addr)) = resolve {
            b = b.resolve(host, addr);
        }
        let c = b.build().map_err(|e| e.to_string())?;
        // Endpoints come and go: keep the pool from growing without end.
        if pooled.len() > 16 {
            pooled.clear();
        }
        pooled.insert(key, c.clone());
        Ok(c)
    }

    /// POST `body` to `url` (its host resolved to `resolve`'s address when
    /// given); the answer's body when it is a 200.
    ///
    /// # Errors
    /// Upstream's wording: `failed to call webhook: ...` for a call that
    /// did not complete, `received invalid webhook response: ...` for an
    /// answer that cannot be one.
    pub async fn post(
        &self,
        url: &str,
        resolve: Option<(&str, SocketAddr)>,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, String> {
        let url = format!("{url}?timeout={}s", timeout.as_secs());
        let client = self
            .client(resolve)
            .map_err(|e| format!("failed to call webhook: {e}"))?;
        let call = async {
            let mut resp = client
                .post(&url)
                .header(http::header::CONTENT_TYPE, "application/json")
                .header(http::header::ACCEPT, "application/json")
                .body(body)
                .send()
                .await
                .map_err(|e| format!("failed to call webhook: Post {url:?}: {}", chain(&e)))?;
            let status = resp.status();
            let mut out = Vec::new();
            while let Some(chunk) = resp
                .chunk()
                .await
                .map_err(|e| format!("failed to call webhook: Post {url:?}: {}", chain(&e)))?
            {
                if out.len() + chunk.len() > MAX_RESPONSE {
                    return Err(format!(
                        "received invalid webhook response: the response is larger than {MAX_RESPONSE} bytes"
                    ));
                }
                out.extend_from_slice(&chunk);
            }
            if !status.is_success() {
                let text = String::from_utf8_lossy(&out[..out.len().min(1024)]).into_owned();
                return Err(format!(
                    "failed to call webhook: the server responded with the status code {} but did not return more information ({text:?})",
                    status.as_u16()
                ));
            }
            Ok(out)
        };
        match tokio::time::timeout(timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(format!(
                "failed to call webhook: Post {url:?}: context deadline exceeded"
            )),
        }
    }
}

/// An error and its causes, as Go prints wrapped errors.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
