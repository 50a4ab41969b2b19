//! Forwarding to an aggregated API server: a ready endpoint of its
//! Service (through its node's server when a pod is behind it, as
//! webhooks are reached), TLS checked against the APIService's caBundle
//! and the service's DNS name, presenting the front-proxy client
//! certificate; the caller's identity in the `X-Remote-*` headers and
//! its credentials left out. Answers, watches and upgrades stream back
//! unchanged.

use std::sync::Arc;

use axum::body::Body;
use http::{request::Parts, HeaderName, HeaderValue, Response};
use rand::Rng as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};

use super::{Backend, EXTRA_PREFIX, GROUP_HEADER, USER_HEADER};
use crate::apiserver::nodeproxy::{self, AnyServer};
use crate::apiserver::status::{ApiError, ApiResult};
use crate::apiserver::{httpproxy, ApiServer};
use crate::auth::Identity;
use crate::pki::CertKey;

/// TLS towards a backend: trusting `ca` (PEM; empty: the system's roots)
/// or, with `insecure`, any certificate; presenting `client`.
///
/// # Errors
/// The bundle does not parse, or the certificate cannot be used.
pub fn tls(
    ca: &[u8],
    insecure: bool,
    client: &CertKey,
) -> Result<Arc<rustls::ClientConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = if insecure {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyServer(provider)))
    } else {
        let ca = (!ca.is_empty()).then_some(ca);
        builder.with_root_certificates(crate::auth::oidc::keys::roots(ca)?)
    };
    let mut cfg = builder
        .with_client_auth_cert(
            vec![CertificateDer::from(client.cert_der.clone())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(client.key_der.clone())),
        )
        .map_err(|e| e.to_string())?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// A TLS connection to a ready endpoint of `b`'s service.
///
/// # Errors
/// Why no endpoint could be reached, as upstream's messages say it.
pub async fn connect(api: &ApiServer, b: &Backend) -> Result<Box<dyn Io>, String> {
    let tls = b.tls.clone()?;
    let port = b.port.to_string();
    let endpoints = httpproxy::service_endpoints(api, &b.namespace, &b.service, Some(&port))
        .await
        .map_err(|e| e.message)?;
    if endpoints.is_empty() {
        return Err(format!(
            "no endpoints available for service {:?}",
            b.service
        ));
    }
    let e = endpoints[rand::rng().random_range(0..endpoints.len())].clone();
    let name = ServerName::try_from(format!("{}.{}.svc", b.service, b.namespace))
        .map_err(|e| e.to_string())?;
    let connector = tokio_rustls::TlsConnector::from(tls);
    Ok(match e.node {
        Some(node) => {
            let io = httpproxy::tunnel(api, &node, &e.ip, e.port)
                .await
                .map_err(|e| e.message)?;
            Box::new(
                connector
                    .connect(name, io)
                    .await
                    .map_err(|e| format!("tls: {e}"))?,
            )
        }
        None => {
            let tcp = tokio::net::TcpStream::connect((e.ip.as_str(), e.port))
                .await
                .map_err(|err| {
                    format!("dial tcp {}: {err}", nodeproxy::authority(&e.ip, e.port))
                })?;
            Box::new(
                connector
                    .connect(name, tcp)
                    .await
                    .map_err(|e| format!("tls: {e}"))?,
            )
        }
    })
}

/// A connection of either kind.
pub trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

/// Put `id` in the `X-Remote-*` headers, dropping any the caller sent.
pub fn identify(headers: &mut http::HeaderMap, id: &Identity) {
    let theirs: Vec<HeaderName> = headers
        .keys()
        .filter(|k| k.as_str().starts_with("x-remote-"))
        .cloned()
        .collect();
    for k in theirs {
        headers.remove(k);
    }
    if let Ok(v) = HeaderValue::from_str(&id.user) {
        headers.insert(USER_HEADER, v);
    }
    for g in &id.groups {
        if let Ok(v) = HeaderValue::from_str(g) {
            headers.append(GROUP_HEADER, v);
        }
    }
    for (key, values) in &id.extra {
        // Upstream escapes extra keys for the header name.
        let escaped: String = url_escape(key);
        let Ok(name) = HeaderName::from_bytes(format!("{EXTRA_PREFIX}{escaped}").as_bytes()) else {
            continue;
        };
        for v in values {
            if let Ok(v) = HeaderValue::from_str(v) {
                headers.append(name.clone(), v);
            }
        }
    }
}

/// Percent-encode what a header name may not hold.
fn url_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// [`forward`], boxed by a plain function: the future is built in this
/// function's frame, so that the request path calling it does not make
/// room for it on every request's stack.
pub fn forward_boxed<'a>(
    api: &'a ApiServer,
    b: Arc<Backend>,
    id: Identity,
    parts: Parts,
    body: Body,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ApiResult<Response<Body>>> + Send + 'a>> {
    Box::pin(async move { forward(api, &b, &id, parts, body).await })
}

/// Forward the caller's request to `b`.
///
/// # Errors
/// 503 when the backend cannot be reached.
pub async fn forward(
    api: &ApiServer,
    b: &Backend,
    id: &Identity,
    mut parts: Parts,
    body: Body,
) -> ApiResult<Response<Body>> {
    let unreachable =
        |e: String| ApiError::unavailable(format!("error trying to reach service: {e}"));
    let io = connect(api, b).await.map_err(unreachable)?;
    identify(&mut parts.headers, id);
    let target = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let authority = format!("{}.{}.svc:{}", b.service, b.namespace, b.port);
    nodeproxy::exchange(io, &authority, &target, parts, body)
        .await
        .map_err(unreachable)
}
