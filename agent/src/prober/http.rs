//! HTTP GET for probes and lifecycle hooks (upstream `probe/http`): to the
//! pod IP unless `host` is set, HTTP or HTTPS without certificate checks,
//! the action's headers, `User-Agent: kube-probe/<major>.<minor>`.
//! Redirects are followed on the same host only (ten at most); a redirect
//! elsewhere ends the request, and its 3xx counts as a success with a
//! warning. 200–399 succeeds; the body (10 KiB at most) is the output.

use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, HTTPGetAction};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, ACCEPT, USER_AGENT};
use reqwest::redirect;

use super::port::{self, PortError};
use super::tcp::go_io_error;
use super::Verdict;

/// Upstream reads at most this much of a probe's response body.
const MAX_BODY: usize = 10 * 1024;

/// One prepared GET.
#[derive(Debug, Clone, PartialEq)]
pub struct Get {
    pub url: String,
    /// `host:port` the request connects to, for error messages.
    pub host_port: String,
    pub headers: HeaderMap,
}

/// `kube-<purpose>/<major>.<minor>` of the Kubernetes version the agent
/// reports (`kube-probe/1.33`, `kube-lifecycle/1.33`).
pub fn user_agent(purpose: &str) -> String {
    let v = crate::node::facts::AGENT_VERSION.trim_start_matches('v');
    let mut parts = v.split(['.', '-']);
    let major = parts.next().unwrap_or("1");
    let minor = parts.next().unwrap_or("0");
    format!("kube-{purpose}/{major}.{minor}")
}

/// The request an `httpGet` action makes for container `c` of a pod at
/// `pod_ip` (upstream `NewRequestForHTTPGetAction`).
///
/// # Errors
/// The port names no port of the container, or is out of range.
pub fn request(
    action: &HTTPGetAction,
    c: &Container,
    pod_ip: &str,
    purpose: &str,
) -> Result<Get, PortError> {
    let scheme = action
        .scheme
        .as_deref()
        .filter(|s| !s.is_empty())
        .unwrap_or("http")
        .to_ascii_lowercase();
    let host = action
        .host
        .as_deref()
        .filter(|h| !h.is_empty())
        .unwrap_or(pod_ip);
    let port = port::resolve(&action.port, c)?;
    let host_port = port::join_host_port(host, port);
    let path = action.path.as_deref().unwrap_or("");
    let slash = if path.starts_with('/') || path.is_empty() {
        ""
    } else {
        "/"
    };
    let url = format!("{scheme}://{host_port}{slash}{path}");
    let mut headers = HeaderMap::new();
    for h in action.http_headers.iter().flatten() {
        match (
            HeaderName::from_bytes(h.name.as_bytes()),
            HeaderValue::from_str(&h.value),
        ) {
            (Ok(n), Ok(v)) => {
                headers.append(n, v);
            }
            _ => tracing::debug!(header = %h.name, "skipping an invalid probe header"),
        }
    }
    if !headers.contains_key(USER_AGENT) {
        if let Ok(v) = HeaderValue::from_str(&user_agent(purpose)) {
            headers.insert(USER_AGENT, v);
        }
    }
    match headers.get(ACCEPT) {
        None => {
            headers.insert(ACCEPT, HeaderValue::from_static("*/*"));
        }
        // Set to empty: the user wants no Accept header at all.
        Some(v) if v.is_empty() => {
            headers.remove(ACCEPT);
        }
        Some(_) => {}
    }
    Ok(Get {
        url,
        host_port,
        headers,
    })
}

/// The client every probe and hook shares: no connection reuse (each
/// probe opens its own connection, as upstream disables keep-alives), no
/// certificate checks, upstream's redirect rule, no proxy.
pub fn client() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        let policy = redirect::Policy::custom(|a| {
            let first = a
                .previous()
                .first()
                .and_then(|u| u.host_str().map(str::to_string));
            if a.url().host_str().map(str::to_string) != first {
                a.stop()
            } else if a.previous().len() >= 10 {
                a.error("stopped after 10 redirects")
            } else {
                a.follow()
            }
        });
        reqwest::Client::builder()
            .redirect(policy)
            .danger_accept_invalid_certs(true)
            .pool_max_idle_per_host(0)
            .no_proxy()
            .build()
            .unwrap_or_else(|e| {
                tracing::error!("cannot build the probe HTTP client, using defaults: {e}");
                reqwest::Client::new()
            })
    })
}

/// Send `get`; the status and up to 10 KiB of body, or Go's wording of
/// what went wrong.
///
/// # Errors
/// The request did not get a response within `timeout`.
pub async fn send(get: &Get, timeout: Option<Duration>) -> Result<(u16, String), String> {
    let mut req = client().get(&get.url).headers(get.headers.clone());
    if let Some(t) = timeout {
        req = req.timeout(t);
    }
    let mut resp = req.send().await.map_err(|e| describe(&e, get))?;
    let status = resp.status().as_u16();
    let mut body = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(chunk)) => {
                body.extend_from_slice(&chunk);
                if body.len() >= MAX_BODY {
                    body.truncate(MAX_BODY);
                    break;
                }
            }
            Ok(None) => break,
            Err(e) => return Err(describe(&e, get)),
        }
    }
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// Run an HTTP probe.
pub async fn probe(get: &Get, timeout: Duration) -> Verdict {
    match send(get, Some(timeout)).await {
        Ok((status, body)) => classify(status, body),
        // Errors are failures, so that timeouts count as failures.
        Err(msg) => Verdict::Failure(msg),
    }
}

/// 200–299 succeeds; 300–399 (a redirect that was not followed) succeeds
/// with a warning; anything else fails.
pub fn classify(status: u16, body: String) -> Verdict {
    match status {
        200..=299 => Verdict::Success(body),
        300..=399 => Verdict::Warning(format!("Probe terminated redirects, Response body: {body}")),
        _ => Verdict::Failure(format!("HTTP probe failed with statuscode: {status}")),
    }
}

/// Go's `Get "url": ...` error text, so messages read as upstream's.
fn describe(e: &reqwest::Error, get: &Get) -> String {
    let url = &get.url;
    if e.is_timeout() {
        return format!(
            "Get {url:?}: context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
        );
    }
    let mut cause: &dyn std::error::Error = e;
    while let Some(s) = cause.source() {
        cause = s;
    }
    if let Some(io) = cause.downcast_ref::<std::io::Error>() {
        if e.is_connect() {
            return format!(
                "Get {url:?}: dial tcp {}: connect: {}",
                get.host_port,
                go_io_error(io)
            );
        }
        return format!("Get {url:?}: {}", go_io_error(io));
    }
    format!("Get {url:?}: {cause}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HOST;

    fn action(yaml: &str) -> HTTPGetAction {
        serde_saphyr::from_str(yaml).unwrap()
    }

    fn c() -> Container {
        serde_saphyr::from_str("{name: web, ports: [{name: http, containerPort: 8080}]}").unwrap()
    }

    #[test]
    fn status_classes() {
        assert_eq!(classify(200, "ok".into()), Verdict::Success("ok".into()));
        assert_eq!(
            classify(204, String::new()),
            Verdict::Success(String::new())
        );
        assert!(matches!(classify(302, String::new()), Verdict::Warning(_)));
        assert_eq!(
            classify(399, String::new()),
            Verdict::Warning("Probe terminated redirects, Response body: ".into())
        );
        assert_eq!(
            classify(400, String::new()),
            Verdict::Failure("HTTP probe failed with statuscode: 400".into())
        );
        assert!(matches!(classify(500, String::new()), Verdict::Failure(_)));
        assert!(matches!(classify(199, String::new()), Verdict::Failure(_)));
    }

    #[test]
    fn request_defaults_to_the_pod_ip_and_named_port() {
        let g = request(
            &action("{port: http, path: healthz}"),
            &c(),
            "198.18.0.9",
            "probe",
        )
        .unwrap();
        assert_eq!(g.url, "http://198.18.0.9:8080/healthz");
        assert_eq!(g.headers[USER_AGENT], "kube-probe/1.33");
        assert_eq!(g.headers[ACCEPT], "*/*");
        let g = request(
            &action("{port: 443, scheme: HTTPS, host: 127.0.0.1, path: '/a?b=c', httpHeaders: [{name: Accept, value: ''}, {name: X-Custom, value: v}, {name: User-Agent, value: me}]}"),
            &c(),
            "198.18.0.9",
            "probe",
        )
        .unwrap();
        assert_eq!(g.url, "https://127.0.0.1:443/a?b=c");
        assert!(
            !g.headers.contains_key(ACCEPT),
            "an empty Accept removes it"
        );
        assert_eq!(g.headers["x-custom"], "v");
        assert_eq!(g.headers[USER_AGENT], "me");
        assert!(!g.headers.contains_key(HOST));
        assert!(request(&action("{port: nope}"), &c(), "198.18.0.9", "probe").is_err());
    }
}
