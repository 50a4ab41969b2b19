//! pods/proxy, services/proxy and nodes/proxy: an HTTP request (or an
//! upgrade) forwarded to a pod's port, to a ready endpoint of a service's
//! port, or to a node's server, with the answer relayed unchanged, as
//! upstream's `ResourceLocation` of each kind picks the backend.
//!
//! The name may carry a scheme and a port, `[http:|https:]NAME[:PORT]`;
//! the path after `/proxy` and the query go to the backend.
//!
//! Pods and service endpoints are reached through their node's server
//! (`/tunnel/IP/PORT`, an `Upgrade: tcp` connection that the node opens
//! to its own pod) rather than dialled from here: the API server needs
//! no route into the pod networks, the way k3s's egress selector does it.
//! HTTPS backends are not verified, as upstream's proxy transport does
//! not verify them either.
//!
//! # Caveats
//! Upstream rewrites links in proxied HTML pages to stay under the proxy
//! path; this relays every body unchanged.

use std::sync::Arc;

use axum::body::Body;
use http::{header, request::Parts, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rand::Rng as _;
use rustls::pki_types::ServerName;
use serde_json::Value;

use super::nodeproxy::{self, authority, exchange, read};
use super::resources::{self, ResourceDef};
use super::status::{ApiError, ApiResult};
use super::ApiServer;

/// Where a proxied request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Backend {
    https: bool,
    ip: String,
    port: u16,
    /// The node whose server reaches `ip`.
    node: String,
}

/// Serve `<resource>/<id>/proxy/...` of `ns`.
pub(crate) async fn proxy(
    api: &Arc<ApiServer>,
    def: &ResourceDef,
    ns: &str,
    id: &str,
    parts: Parts,
    body: Body,
) -> ApiResult<Response<Body>> {
    let (scheme, name, port) = split_scheme_name_port(id).ok_or_else(|| {
        ApiError::bad_request(format!("invalid {} request {id:?}", singular(def.plural)))
    })?;
    let target = target(parts.uri.path(), id, parts.uri.query());
    let backend = match def.plural {
        "pods" => pod_backend(api, ns, name, scheme, port).await?,
        "services" => service_backend(api, ns, name, scheme, port).await?,
        "nodes" => return node(api, name, scheme, port, &target, parts, body).await,
        other => return Err(ApiError::not_found_path(&format!("{other}/proxy"))),
    };
    tracing::debug!(?backend, target, "proxying");
    let tunnel = tunnel(api, &backend.node, &backend.ip, backend.port).await?;
    let authority = authority(&backend.ip, backend.port);
    let answer = if backend.https {
        let tls = tls_to(&backend.ip, tunnel).await?;
        exchange(tls, &authority, &target, parts, body).await
    } else {
        exchange(tunnel, &authority, &target, parts, body).await
    };
    answer.map_err(unreachable)
}

/// nodes/proxy: the node server itself (kubelet port, client certificate),
/// or another port of the node dialled directly.
async fn node(
    api: &Arc<ApiServer>,
    name: &str,
    scheme: &str,
    port: Option<&str>,
    target: &str,
    parts: Parts,
    body: Body,
) -> ApiResult<Response<Body>> {
    let (host, kubelet_port) = nodeproxy::node_server(api, name).await?;
    let port = match port {
        None => kubelet_port,
        Some(p) => p
            .parse::<u16>()
            .map_err(|_| ApiError::bad_request(format!("invalid port {p:?} for node {name}")))?,
    };
    if port == kubelet_port && scheme != "http" {
        let tls = nodeproxy::kubelet_tls(api)?;
        return nodeproxy::forward(tls, &host, port, target, parts, body)
            .await
            .map_err(unreachable);
    }
    let authority = authority(&host, port);
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| unreachable(format!("dial tcp {authority}: {e}")))?;
    let answer = if scheme == "https" {
        let tls = tls_to(&host, tcp).await?;
        exchange(tls, &authority, target, parts, body).await
    } else {
        exchange(tcp, &authority, target, parts, body).await
    };
    answer.map_err(unreachable)
}

/// upstream's `SplitSchemeNamePort`: `name`, `name:port` or
/// `scheme:name:port`, the scheme `http` or `https`.
fn split_scheme_name_port(id: &str) -> Option<(&str, &str, Option<&str>)> {
    let parts: Vec<&str> = id.split(':').collect();
    let (scheme, name, port) = match parts.as_slice() {
        [name] => ("", *name, ""),
        [name, port] => ("", *name, *port),
        [scheme, name, port] => (*scheme, *name, *port),
        _ => return None,
    };
    let valid = !name.is_empty() && matches!(scheme, "" | "http" | "https");
    valid.then_some((scheme, name, Some(port).filter(|p| !p.is_empty())))
}

/// The backend's request target: the path after `/<id>/proxy` (`/` when
/// there is none) and the query.
fn target(path: &str, id: &str, query: Option<&str>) -> String {
    let marker = format!("/{id}/proxy");
    let rest = path
        .find(&marker)
        .map(|i| &path[i + marker.len()..])
        .filter(|rest| rest.is_empty() || rest.starts_with('/'))
        .unwrap_or_default();
    let rest = if rest.is_empty() { "/" } else { rest };
    match query {
        Some(q) if !q.is_empty() => format!("{rest}?{q}"),
        _ => rest.to_string(),
    }
}

fn singular(plural: &str) -> &str {
    plural.strip_suffix('s').unwrap_or(plural)
}

/// upstream's pod `ResourceLocation`: the pod's IP and the port asked
/// for, else its first declared container port (a port name is looked up
/// among the containers' ports).
async fn pod_backend(
    api: &ApiServer,
    ns: &str,
    name: &str,
    scheme: &str,
    port: Option<&str>,
) -> ApiResult<Backend> {
    let pod = get(api, "pods", ns, name).await?;
    let ip = pod["status"]["podIP"].as_str().unwrap_or_default();
    if ip.is_empty() {
        return Err(ApiError::bad_request(format!(
            "pod {name} has no IP address yet"
        )));
    }
    let node = pod["spec"]["nodeName"].as_str().unwrap_or_default();
    if node.is_empty() {
        return Err(ApiError::bad_request(format!(
            "pod {name} does not have a host assigned"
        )));
    }
    let port = pod_port(&pod, port, scheme)
        .ok_or_else(|| ApiError::bad_request(format!("invalid port {port:?} for pod {name}")))?;
    Ok(Backend {
        https: scheme == "https",
        ip: ip.to_string(),
        port,
        node: node.to_string(),
    })
}

fn pod_port(pod: &Value, port: Option<&str>, scheme: &str) -> Option<u16> {
    let container_ports = || {
        pod["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|c| c["ports"].as_array().into_iter().flatten())
    };
    let number = |p: &Value| {
        p["containerPort"]
            .as_u64()
            .and_then(|n| u16::try_from(n).ok())
    };
    match port {
        Some(p) => p.parse().ok().or_else(|| {
            container_ports()
                .find(|cp| cp["name"].as_str() == Some(p))
                .and_then(number)
        }),
        None => container_ports()
            .next()
            .and_then(number)
            .or(Some(if scheme == "https" { 443 } else { 80 })),
    }
}

/// upstream's service `ResourceLocation`: the service port by number or
/// name, then a ready address of the Endpoints for it that a node can
/// reach, picked at random.
async fn service_backend(
    api: &ApiServer,
    ns: &str,
    name: &str,
    scheme: &str,
    port: Option<&str>,
) -> ApiResult<Backend> {
    let mut routable: Vec<Backend> = service_endpoints(api, ns, name, port)
        .await?
        .into_iter()
        .filter_map(|e| {
            Some(Backend {
                https: scheme == "https",
                ip: e.ip,
                port: e.port,
                node: e.node?,
            })
        })
        .collect();
    if routable.is_empty() {
        return Err(ApiError::unavailable(format!(
            "no endpoints available for service {name:?}"
        )));
    }
    let pick = rand::rng().random_range(0..routable.len());
    Ok(routable.swap_remove(pick))
}

/// A ready address of a service port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    pub ip: String,
    pub port: u16,
    /// The node whose server reaches `ip`, when a pod is behind it.
    pub node: Option<String>,
}

/// The ready addresses of service `ns/name` for its port `port` (number
/// or name; None: the unnamed one), from its Endpoints.
///
/// # Errors
/// 404 for a missing service, 503 for a port it does not have.
pub(crate) async fn service_endpoints(
    api: &ApiServer,
    ns: &str,
    name: &str,
    port: Option<&str>,
) -> ApiResult<Vec<Endpoint>> {
    let svc = get(api, "services", ns, name).await?;
    let mut port_name = port.unwrap_or_default().to_string();
    if let Ok(number) = port_name.parse::<i64>() {
        let declared = svc["spec"]["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["port"].as_i64() == Some(number));
        let Some(declared) = declared else {
            return Err(ApiError::unavailable(format!(
                "no service port {number} found for service {name:?}"
            )));
        };
        port_name = declared["name"].as_str().unwrap_or_default().to_string();
    }
    let endpoints = get(api, "endpoints", ns, name).await.ok();
    let candidates = endpoints
        .as_ref()
        .map(|e| candidates(e, &port_name))
        .unwrap_or_default();
    let mut out = Vec::new();
    for (ip, port, node, pod) in candidates {
        let node = match (node, pod) {
            (Some(node), _) => Some(node),
            // No nodeName written: the pod says where it runs.
            (None, Some(pod)) => get(api, "pods", ns, &pod)
                .await
                .ok()
                .and_then(|p| p["spec"]["nodeName"].as_str().map(String::from)),
            (None, None) => None,
        };
        out.push(Endpoint {
            ip,
            port,
            node: node.filter(|n| !n.is_empty()),
        });
    }
    Ok(out)
}

/// The ready addresses of `endpoints` that serve the port named
/// `port_name`: (IP, port, nodeName, pod name).
fn candidates(
    endpoints: &Value,
    port_name: &str,
) -> Vec<(String, u16, Option<String>, Option<String>)> {
    let mut out = Vec::new();
    for subset in endpoints["subsets"].as_array().into_iter().flatten() {
        let port = subset["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"].as_str().unwrap_or_default() == port_name)
            .and_then(|p| p["port"].as_u64())
            .and_then(|p| u16::try_from(p).ok());
        let Some(port) = port else { continue };
        for addr in subset["addresses"].as_array().into_iter().flatten() {
            let Some(ip) = addr["ip"].as_str() else {
                continue;
            };
            let node = addr["nodeName"].as_str().map(String::from);
            let pod = (addr["targetRef"]["kind"] == "Pod")
                .then(|| addr["targetRef"]["name"].as_str().map(String::from))
                .flatten();
            out.push((ip.to_string(), port, node, pod));
        }
    }
    out
}

async fn get(api: &ApiServer, plural: &str, ns: &str, name: &str) -> ApiResult<Value> {
    let def = resources::lookup("", "v1", plural)
        .ok_or_else(|| ApiError::internal(format!("{plural} are not served")))?;
    read(api, &def.key(Some(ns), name))
        .await?
        .ok_or_else(|| ApiError::not_found("", plural, name))
}

/// A connection to `ip:port`, opened by the server of `node` (the API
/// server needs no route into the pod networks).
///
/// # Errors
/// 503 when the node or the address cannot be reached.
pub(crate) async fn tunnel(
    api: &ApiServer,
    node: &str,
    ip: &str,
    port: u16,
) -> ApiResult<TokioIo<hyper::upgrade::Upgraded>> {
    let (host, node_port) = nodeproxy::node_server(api, node).await?;
    let tls = nodeproxy::kubelet_tls(api)?;
    let backend = (ip, port);
    let (host, port) = (host.as_str(), node_port);
    let io = nodeproxy::connect(tls, host, port)
        .await
        .map_err(|e| unreachable(format!("node {node}: {e}")))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let req = http::Request::get(format!("/tunnel/{}/{}", backend.0, backend.1))
        .header(header::HOST, authority(host, port))
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "tcp")
        .body(Body::empty())
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        let text = axum::body::to_bytes(Body::new(resp.into_body()), 50_000)
            .await
            .map(|b| String::from_utf8_lossy(&b).trim_end().to_string())
            .unwrap_or_default();
        return Err(unreachable(text));
    }
    hyper::upgrade::on(resp)
        .await
        .map(TokioIo::new)
        .map_err(|e| unreachable(e.to_string()))
}

/// TLS over `io` towards `host`, unverified (see the module doc).
async fn tls_to<T>(host: &str, io: T) -> ApiResult<tokio_rustls::client::TlsStream<T>>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let cfg = nodeproxy::insecure_tls().map_err(|e| ApiError::internal(e.to_string()))?;
    let name =
        ServerName::try_from(host.to_string()).map_err(|e| ApiError::bad_request(e.to_string()))?;
    tokio_rustls::TlsConnector::from(cfg)
        .connect(name, io)
        .await
        .map_err(|e| unreachable(format!("TLS: {e}")))
}

/// upstream's answer when the backend cannot be reached.
fn unreachable(e: String) -> ApiError {
    ApiError::unavailable(format!("error trying to reach service: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ids_split_as_upstream() {
        assert_eq!(split_scheme_name_port("web"), Some(("", "web", None)));
        assert_eq!(
            split_scheme_name_port("web:8080"),
            Some(("", "web", Some("8080")))
        );
        assert_eq!(
            split_scheme_name_port("https:web:443"),
            Some(("https", "web", Some("443")))
        );
        assert_eq!(
            split_scheme_name_port("https:web:"),
            Some(("https", "web", None))
        );
        assert_eq!(split_scheme_name_port("ftp:web:21"), None);
        assert_eq!(split_scheme_name_port(":80"), None);
        assert_eq!(split_scheme_name_port("a:b:c:d"), None);
    }

    #[test]
    fn target_is_the_rest_of_the_path() {
        let p = "/api/v1/namespaces/d/pods/web:80/proxy/a/b/";
        assert_eq!(target(p, "web:80", Some("x=1")), "/a/b/?x=1");
        assert_eq!(target("/api/v1/nodes/n/proxy", "n", None), "/");
        assert_eq!(target("/api/v1/nodes/n/proxy/", "n", Some("")), "/");
        assert_eq!(target("/api/v1/nodes/n/proxy/logs/", "n", None), "/logs/");
    }

    #[test]
    fn pod_ports() {
        let pod = json!({"spec": {"containers": [
            {"name": "a"},
            {"name": "b", "ports": [{"name": "http", "containerPort": 8080}, {"containerPort": 9090}]}]}});
        assert_eq!(pod_port(&pod, None, ""), Some(8080));
        assert_eq!(pod_port(&pod, Some("9090"), ""), Some(9090));
        assert_eq!(pod_port(&pod, Some("http"), ""), Some(8080));
        assert_eq!(pod_port(&pod, Some("nope"), ""), None);
        let bare = json!({"spec": {"containers": [{"name": "a"}]}});
        assert_eq!(pod_port(&bare, None, "https"), Some(443));
        assert_eq!(pod_port(&bare, None, "http"), Some(80));
    }

    #[test]
    fn endpoint_candidates_by_port_name() {
        let e = json!({"subsets": [
            {"addresses": [{"ip": "198.18.1.2", "nodeName": "n1", "targetRef": {"kind": "Pod", "name": "p"}}],
             "notReadyAddresses": [{"ip": "198.18.1.3", "nodeName": "n1"}],
             "ports": [{"name": "http", "port": 8080}, {"name": "metrics", "port": 9090}]},
            {"addresses": [{"ip": "198.18.2.2"}], "ports": [{"name": "http", "port": 8081}]}]});
        assert_eq!(
            candidates(&e, "http"),
            vec![
                (
                    "198.18.1.2".into(),
                    8080,
                    Some("n1".into()),
                    Some("p".into())
                ),
                ("198.18.2.2".into(), 8081, None, None),
            ]
        );
        assert_eq!(candidates(&e, "metrics").len(), 1);
        assert!(candidates(&e, "").is_empty());
    }
}
