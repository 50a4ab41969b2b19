//! An aggregated API server for the aggregation tests: serves `echoes` in
//! [`GROUP`]`/v1`, answering each GET with the identity the front-proxy
//! headers carry (and any credentials that reached it, which must be
//! none); it trusts only clients with a certificate of the front-proxy
//! CA. Run in-process by the API server tests and, as the test image's
//! `aggregated-api` binary (which includes this file), in a pod.
#![allow(dead_code)]

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::json;

pub const GROUP: &str = "metrics.test.skiff.io";

/// TLS serving `cert_pem` with `key_pem` to clients with a certificate of
/// `client_ca_pem` only.
pub fn server_config(cert_pem: &str, key_pem: &str, client_ca_pem: &str) -> rustls::ServerConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(client_ca_pem.as_bytes()) {
        roots.add(c.expect("client CA PEM")).expect("client CA");
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .expect("client verifier");
    let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .expect("certificate PEM");
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).expect("key PEM");
    rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .expect("certificate and key match")
}

/// The answer to a GET of `path`: the group version's resource list, or
/// an Echo of what the request carried.
fn answer(path: &str, headers: &http::HeaderMap) -> serde_json::Value {
    if path == format!("/apis/{GROUP}/v1") {
        return json!({"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": format!("{GROUP}/v1"),
            "resources": [{"name": "echoes", "singularName": "echo", "namespaced": true,
                "kind": "Echo", "verbs": ["get", "list"]}]});
    }
    let h = |n: &str| -> Vec<String> {
        headers
            .get_all(n)
            .iter()
            .filter_map(|v| v.to_str().ok().map(String::from))
            .collect()
    };
    json!({"kind": "Echo", "apiVersion": format!("{GROUP}/v1"),
        "metadata": {"name": path.rsplit('/').next().unwrap_or_default()},
        "path": path, "user": h("x-remote-user"), "groups": h("x-remote-group"),
        "authorization": h("authorization")})
}

/// Serve on `listener` with `tls` until the task is dropped.
pub async fn spawn(listener: tokio::net::TcpListener, tls: rustls::ServerConfig) {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            return;
        };
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let Ok(io) = acceptor.accept(tcp).await else {
                return;
            };
            let svc = hyper::service::service_fn(
                |req: hyper::Request<hyper::body::Incoming>| async move {
                    let body = answer(req.uri().path(), req.headers());
                    let mut resp = hyper::Response::new(Full::new(Bytes::from(body.to_string())));
                    resp.headers_mut().insert(
                        "content-type",
                        http::HeaderValue::from_static("application/json"),
                    );
                    Ok::<_, std::convert::Infallible>(resp)
                },
            );
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(io), svc)
                .await;
        });
    }
}
