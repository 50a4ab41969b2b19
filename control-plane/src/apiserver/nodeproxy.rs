//! pods/log, pods/exec, pods/attach and pods/portforward: proxied to the
//! node server of the pod's node (`https://<InternalIP>:<daemonEndpoints
//! port>`), authenticated with the API server's kubelet-client certificate.
//!
//! Logs stream through as a plain response. Exec, attach and port-forward
//! are HTTP/1.1 upgrades (SPDY/3.1 or WebSocket): the request's upgrade
//! headers go to the node, and once the node answers 101 the two
//! connections are spliced byte for byte, so every stream protocol the
//! node speaks reaches the client unchanged.
//!
//! # Caveats
//! The node's serving certificate is not verified: agents serve a
//! self-signed one by default, as kubelets do, and upstream's API server
//! without `--kubelet-certificate-authority` does not verify either.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{header, request::Parts, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use serde_json::Value;

use super::resources::ResourceDef;
use super::status::{ApiError, ApiResult};
use super::ApiServer;
use crate::pki::CertKey;

/// How long connecting to a node (TCP and TLS) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The kubelet's port when a Node reports none.
const DEFAULT_PORT: i64 = 10250;

impl ApiServer {
    /// Use `ck` (the kubelet-client certificate) towards node servers.
    ///
    /// # Errors
    /// The certificate or key cannot be used by TLS.
    pub fn set_kubelet_client(&self, ck: &CertKey) -> Result<(), rustls::Error> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let cfg = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyServer(provider)))
            .with_client_auth_cert(
                vec![CertificateDer::from(ck.cert_der.clone())],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(ck.key_der.clone())),
            )?;
        let _ = self.node_tls.set(Arc::new(cfg));
        Ok(())
    }
}

/// Serve `pods/<sub>` of pod `ns/name` by proxying to its node.
pub(crate) async fn proxy(
    api: &Arc<ApiServer>,
    def: &ResourceDef,
    ns: &str,
    name: &str,
    parts: Parts,
    body: Body,
) -> ApiResult<Response<Body>> {
    let sub = parts.uri.path().rsplit('/').next().unwrap_or_default();
    let pod = read(api, &def.key(Some(ns), name))
        .await?
        .ok_or_else(|| ApiError::not_found("", "pods", name))?;
    let node_name = pod["spec"]["nodeName"].as_str().unwrap_or_default();
    if node_name.is_empty() {
        return Err(ApiError::bad_request(format!(
            "pod {name} does not have a host assigned"
        )));
    }
    let (host, port) = node_server(api, node_name).await?;

    let mut query: Vec<(String, String)> =
        form_urlencoded::parse(parts.uri.query().unwrap_or("").as_bytes())
            .into_owned()
            .collect();
    let path = match sub {
        "portforward" => format!("/portForward/{ns}/{name}"),
        _ => {
            let wanted = query
                .iter()
                .find(|(k, _)| k == "container")
                .map(|(_, v)| v.clone())
                .filter(|v| !v.is_empty());
            let container = pick_container(&pod, name, wanted)?;
            query.retain(|(k, _)| k != "container");
            let what = match sub {
                "log" => "containerLogs",
                other => other,
            };
            format!("/{what}/{ns}/{name}/{container}")
        }
    };
    let mut target = path;
    if !query.is_empty() {
        let q = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(&query)
            .finish();
        target = format!("{target}?{q}");
    }
    tracing::debug!(pod = %format!("{ns}/{name}"), node = node_name, %host, port, target, "proxying to node");
    let tls = kubelet_tls(api)?;
    let resource = format!("pods/{sub}");
    let resp = forward(tls, &host, port, &target, parts, body)
        .await
        .map_err(|e| {
            ApiError::new(
                500,
                "InternalError",
                format!("error dialing backend: node {node_name:?} ({host}:{port}): {e}"),
            )
        })?;
    let code = resp.status().as_u16();
    if code == 101 || (200..=206).contains(&code) {
        return Ok(resp);
    }
    // Upstream's GenericHttpResponseChecker caps what it reads alike.
    let text = axum::body::to_bytes(resp.into_body(), 50_000)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim_end().to_string())
        .unwrap_or_default();
    Err(node_refusal(code, &resource, name, text))
}

/// A node's refusal as the Status upstream's API server makes of it
/// (GenericHttpResponseChecker): the node answers in plain text, clients
/// parse every error body as a Status.
fn node_refusal(code: u16, resource: &str, name: &str, text: String) -> ApiError {
    let reason = match code {
        400 => return ApiError::bad_request(text),
        500 => return ApiError::internal(text),
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        406 => "NotAcceptable",
        409 => "Conflict",
        410 => "Gone",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ if code >= 500 => "InternalError",
        _ => "",
    };
    ApiError {
        details: Some(serde_json::json!({"name": name, "kind": resource,
            "causes": [{"reason": "UnexpectedServerResponse", "message": text}]})),
        ..ApiError::new(code, reason, text.clone())
    }
}

/// The node server of node `name`: its host and port.
pub(super) async fn node_server(api: &ApiServer, name: &str) -> ApiResult<(String, u16)> {
    let node = read(api, &format!("/registry/core/nodes/{name}"))
        .await?
        .ok_or_else(|| ApiError::not_found("", "nodes", name))?;
    node_address(&node)
        .ok_or_else(|| ApiError::unavailable(format!("node {name:?} reports no address")))
}

/// The TLS client towards node servers, with the kubelet-client
/// certificate.
pub(super) fn kubelet_tls(api: &ApiServer) -> ApiResult<Arc<rustls::ClientConfig>> {
    api.node_tls
        .get()
        .cloned()
        .ok_or_else(|| ApiError::unavailable("the API server has no kubelet client certificate"))
}

pub(super) async fn read(api: &ApiServer, key: &str) -> ApiResult<Option<Value>> {
    let kv = api
        .store
        .get(key)
        .await
        .map_err(|e| ApiError::internal(format!("reading {key}: {e}")))?;
    Ok(kv.and_then(|kv| serde_json::from_slice(&kv.value).ok()))
}

/// The node server's host and port: InternalIP first, then Hostname and
/// ExternalIP (upstream's default `--kubelet-preferred-address-types`
/// order, minus the DNS kinds).
pub(super) fn node_address(node: &Value) -> Option<(String, u16)> {
    let addrs = node["status"]["addresses"].as_array()?;
    let host = ["InternalIP", "Hostname", "ExternalIP"]
        .iter()
        .find_map(|t| {
            addrs
                .iter()
                .find(|a| a["type"] == *t)
                .and_then(|a| a["address"].as_str())
                .filter(|a| !a.is_empty())
        })?
        .to_string();
    // `Port`, capitalised: the wire name of DaemonEndpoint's one field.
    let endpoint = &node["status"]["daemonEndpoints"]["kubeletEndpoint"];
    let port = endpoint["Port"]
        .as_i64()
        .or_else(|| endpoint["port"].as_i64())
        .filter(|p| *p > 0)
        .unwrap_or(DEFAULT_PORT);
    Some((host, u16::try_from(port).ok()?))
}

/// The container a request names, or the pod's only one; as upstream, a
/// pod with several containers needs the name.
fn pick_container(pod: &Value, pod_name: &str, wanted: Option<String>) -> ApiResult<String> {
    let names = |key: &str| -> Vec<String> {
        pod["spec"][key]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["name"].as_str().map(String::from))
            .collect()
    };
    let containers = names("containers");
    let mut all = containers.clone();
    all.extend(names("initContainers"));
    all.extend(names("ephemeralContainers"));
    match wanted {
        Some(c) if all.contains(&c) => Ok(c),
        Some(c) => Err(ApiError::bad_request(format!(
            "container {c} is not valid for pod {pod_name}"
        ))),
        None if containers.len() == 1 => Ok(containers[0].clone()),
        None => Err(ApiError::bad_request(format!(
            "a container name must be specified for pod {pod_name}, choose one of: [{}]",
            containers.join(" ")
        ))),
    }
}

/// Headers that stay on this hop: the caller's credentials and host.
fn forwarded(name: &header::HeaderName) -> bool {
    !matches!(
        name.as_str(),
        "host"
            | "authorization"
            | "proxy-authorization"
            | "cookie"
            | "impersonate-user"
            | "impersonate-group"
    )
}

/// Send the request to `https://host:port/target` and relay the answer; a
/// 101 splices the two upgraded connections.
pub(super) async fn forward(
    tls: Arc<rustls::ClientConfig>,
    host: &str,
    port: u16,
    target: &str,
    parts: Parts,
    body: Body,
) -> Result<Response<Body>, String> {
    let stream = connect(tls, host, port).await?;
    exchange(stream, &authority(host, port), target, parts, body).await
}

/// `host:port`, with an IPv6 address in brackets.
pub(crate) fn authority(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// A TLS connection to `host:port`, within [`CONNECT_TIMEOUT`].
pub(super) async fn connect(
    tls: Arc<rustls::ClientConfig>,
    host: &str,
    port: u16,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
    let server_name = ServerName::try_from(host.to_string()).map_err(|e| e.to_string())?;
    let connect = async {
        let tcp = tokio::net::TcpStream::connect((host, port))
            .await
            .map_err(|e| format!("dial tcp {}: {e}", authority(host, port)))?;
        let _ = tcp.set_nodelay(true);
        tokio_rustls::TlsConnector::from(tls)
            .connect(server_name, tcp)
            .await
            .map_err(|e| format!("TLS: {e}"))
    };
    tokio::time::timeout(CONNECT_TIMEOUT, connect)
        .await
        .map_err(|_| format!("no connection in {CONNECT_TIMEOUT:?}"))?
}

/// Send the request for `target` over `io` and relay the answer; a 101
/// splices the caller's upgraded connection with `io`'s.
pub(crate) async fn exchange<T>(
    io: T,
    authority: &str,
    target: &str,
    mut parts: Parts,
    body: Body,
) -> Result<Response<Body>, String>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "proxied connection ended");
        }
    });
    let mut out = http::Request::builder()
        .method(parts.method.clone())
        .uri(target)
        .header(header::HOST, authority);
    for (k, v) in &parts.headers {
        if forwarded(k) {
            out = out.header(k, v);
        }
    }
    let client_upgrade = parts.extensions.remove::<hyper::upgrade::OnUpgrade>();
    let out = out.body(body).map_err(|e| e.to_string())?;
    let resp = sender.send_request(out).await.map_err(|e| e.to_string())?;
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        return Ok(resp.map(Body::new));
    }
    let Some(client_upgrade) = client_upgrade else {
        return Err("the backend switched protocols on a request that cannot be upgraded".into());
    };
    let mut back = Response::builder().status(StatusCode::SWITCHING_PROTOCOLS);
    for (k, v) in resp.headers() {
        back = back.header(k, v);
    }
    let backend_upgrade = hyper::upgrade::on(resp);
    tokio::spawn(async move {
        match tokio::join!(client_upgrade, backend_upgrade) {
            (Ok(c), Ok(b)) => {
                let (mut c, mut b) = (TokioIo::new(c), TokioIo::new(b));
                let _ = tokio::io::copy_bidirectional(&mut c, &mut b).await;
            }
            (c, b) => {
                tracing::debug!(client = ?c.err(), backend = ?b.err(), "stream upgrade failed")
            }
        }
    });
    back.body(Body::empty()).map_err(|e| e.to_string())
}

/// A TLS client that checks no server certificate (see the module's
/// caveats) and presents none: upstream's proxy transport towards pods
/// and services skips verification alike.
pub(super) fn insecure_tls() -> Result<Arc<rustls::ClientConfig>, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer(provider)))
        .with_no_client_auth();
    Ok(Arc::new(cfg))
}

/// Accepts any server certificate (see the module's caveats); signatures
/// are still checked so that the handshake itself is sound.
#[derive(Debug)]
pub(super) struct AnyServer(pub(super) Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn node_refusals_become_statuses() {
        let e = node_refusal(400, "pods/log", "p", "container \"c\" is waiting".into());
        assert_eq!((e.code, e.reason), (400, "BadRequest"));
        assert_eq!(e.message, "container \"c\" is waiting");
        let e = node_refusal(500, "pods/exec", "p", "boom".into());
        assert_eq!((e.code, e.reason), (500, "InternalError"));
        assert_eq!(e.message, "Internal error occurred: boom");
        let e = node_refusal(404, "pods/portforward", "p", "pod does not exist".into());
        let status = e.to_status();
        assert_eq!(
            (status["code"].as_u64(), status["reason"].as_str()),
            (Some(404), Some("NotFound"))
        );
        assert_eq!(status["details"]["kind"], "pods/portforward");
        assert_eq!(
            node_refusal(502, "pods/log", "p", "x".into()).reason,
            "InternalError"
        );
    }

    #[test]
    fn address_and_container_choice() {
        let node = json!({"status": {"addresses": [
            {"type": "Hostname", "address": "n1"},
            {"type": "InternalIP", "address": "192.0.2.9"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 4321}}}});
        assert_eq!(node_address(&node), Some(("192.0.2.9".into(), 4321)));
        let bare = json!({"status": {"addresses": [{"type": "Hostname", "address": "n1"}]}});
        assert_eq!(node_address(&bare), Some(("n1".into(), 10250)));
        let one = json!({"spec": {"containers": [{"name": "a"}]}});
        assert_eq!(pick_container(&one, "p", None).unwrap(), "a");
        let two = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}], "initContainers": [{"name": "i"}]}});
        assert!(pick_container(&two, "p", None).is_err());
        assert_eq!(pick_container(&two, "p", Some("i".into())).unwrap(), "i");
        assert!(pick_container(&two, "p", Some("z".into())).is_err());
    }
}
