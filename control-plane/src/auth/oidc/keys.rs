//! An issuer's signing keys: its discovery document, then its JWKS, fetched
//! over HTTPS and cached; fetched again when a token names a key we do not
//! know (rotation), at most once per [`REFRESH_MIN_INTERVAL`], and never
//! for longer than [`FETCH_TIMEOUT`] while a request waits.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper_util::rt::TokioIo;
use jsonwebtoken::{Algorithm, DecodingKey};
use rustls::pki_types::ServerName;
use serde_json::Value;

/// Longest a discovery or JWKS fetch may take (a request waiting on it
/// fails after this).
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// Fetches triggered by tokens are at least this far apart, so tokens
/// naming made-up key ids cannot hammer the issuer.
pub const REFRESH_MIN_INTERVAL: Duration = Duration::from_secs(5);
/// Largest discovery document or JWKS read.
const MAX_DOCUMENT: usize = 1024 * 1024;

/// The family a key belongs to, for matching a token's `alg`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    Rsa,
    P256,
    P384,
}

/// One verification key from the JWKS.
pub struct Key {
    pub kid: Option<String>,
    family: Family,
    /// The JWK's `alg`, when it names one.
    alg: Option<Algorithm>,
    pub key: DecodingKey,
}

impl Key {
    /// Whether this key may verify a token signed with `alg`.
    pub fn fits(&self, alg: Algorithm) -> bool {
        let family = match alg {
            Algorithm::RS256
            | Algorithm::RS384
            | Algorithm::RS512
            | Algorithm::PS256
            | Algorithm::PS384
            | Algorithm::PS512 => Family::Rsa,
            Algorithm::ES256 => Family::P256,
            Algorithm::ES384 => Family::P384,
            _ => return false,
        };
        family == self.family && self.alg.is_none_or(|a| a == alg)
    }
}

/// The usable signature keys of a JWKS document; keys of other types or
/// uses (`enc`, symmetric `oct`) are skipped, as are malformed ones.
pub fn parse_jwks(doc: &Value) -> Vec<Key> {
    let b64 = |v: &Value| -> Option<Vec<u8>> { URL_SAFE_NO_PAD.decode(v.as_str()?).ok() };
    let mut out = Vec::new();
    for k in doc["keys"].as_array().into_iter().flatten() {
        if k.get("use").is_some_and(|u| u != "sig") {
            continue;
        }
        let alg = match k["alg"].as_str() {
            None => None,
            Some(name) => match super::super::authconfig::ASYMMETRIC
                .iter()
                .find(|a| format!("{a:?}") == name)
            {
                Some(a) => Some(*a),
                // A key for an algorithm we never accept.
                None => continue,
            },
        };
        let kid = k["kid"].as_str().map(String::from);
        let parsed = match k["kty"].as_str() {
            Some("RSA") => match (k["n"].as_str(), k["e"].as_str()) {
                (Some(n), Some(e)) => DecodingKey::from_rsa_components(n, e)
                    .ok()
                    .map(|d| (Family::Rsa, d)),
                _ => None,
            },
            Some("EC") => {
                let family = match k["crv"].as_str() {
                    Some("P-256") => Family::P256,
                    Some("P-384") => Family::P384,
                    _ => continue,
                };
                let size = if family == Family::P256 { 32 } else { 48 };
                match (b64(&k["x"]), b64(&k["y"])) {
                    (Some(x), Some(y)) if x.len() == size && y.len() == size => {
                        DecodingKey::from_ec_components(
                            k["x"].as_str().unwrap_or_default(),
                            k["y"].as_str().unwrap_or_default(),
                        )
                        .ok()
                        .map(|d| (family, d))
                    }
                    _ => None,
                }
            }
            _ => None,
        };
        if let Some((family, key)) = parsed {
            out.push(Key {
                kid,
                family,
                alg,
                key,
            });
        }
    }
    out
}

/// Where and how an issuer's keys are fetched.
pub struct Source {
    /// The `issuer` the discovery document must state.
    pub issuer: String,
    /// The discovery document's URL.
    pub discovery: String,
    pub tls: Arc<rustls::ClientConfig>,
}

impl Source {
    /// Discovery, then the JWKS it points at.
    ///
    /// # Errors
    /// Unreachable, a non-200 answer, a bad document, an issuer mismatch,
    /// or no usable key; the message says which.
    pub async fn fetch(&self) -> Result<Vec<Key>, String> {
        let doc = get_json(&self.tls, &self.discovery).await?;
        let issuer = doc["issuer"].as_str().unwrap_or_default();
        if issuer != self.issuer {
            return Err(format!(
                "discovery document {} names issuer {issuer:?}, expected {:?}",
                self.discovery, self.issuer
            ));
        }
        let jwks_uri = doc["jwks_uri"]
            .as_str()
            .ok_or_else(|| format!("discovery document {} has no jwks_uri", self.discovery))?;
        let jwks = get_json(&self.tls, jwks_uri).await?;
        let keys = parse_jwks(&jwks);
        if keys.is_empty() {
            return Err(format!("JWKS {jwks_uri} holds no usable signature key"));
        }
        Ok(keys)
    }
}

/// The keys of one issuer and when they were last fetched.
#[derive(Default)]
pub struct Cache {
    pub keys: Arc<Vec<Arc<Key>>>,
    /// The last fetch attempt, successful or not.
    pub last_attempt: Option<Instant>,
    /// Why the last fetch failed.
    pub last_error: Option<String>,
}

/// GET `url` (https) and parse its JSON body, within [`FETCH_TIMEOUT`].
///
/// # Errors
/// Any failure, as a message naming the URL.
pub async fn get_json(tls: &Arc<rustls::ClientConfig>, url: &str) -> Result<Value, String> {
    match tokio::time::timeout(FETCH_TIMEOUT, get_json_inner(tls, url)).await {
        Ok(r) => r.map_err(|e| format!("GET {url}: {e}")),
        Err(_) => Err(format!("GET {url}: timed out after {FETCH_TIMEOUT:?}")),
    }
}

async fn get_json_inner(tls: &Arc<rustls::ClientConfig>, url: &str) -> Result<Value, String> {
    let uri: http::Uri = url.parse().map_err(|e| format!("bad URL: {e}"))?;
    if uri.scheme_str() != Some("https") {
        return Err("only https URLs are fetched".into());
    }
    let authority = uri.authority().ok_or("URL has no host")?.clone();
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = authority.port_u16().unwrap_or(443);
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from(host.clone()).map_err(|e| e.to_string())?;
    let io = tokio_rustls::TlsConnector::from(tls.clone())
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| e.to_string())?;
    // The connection ends when `sender` is dropped, at the end of this fetch.
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let req = http::Request::get(path)
        .header(http::header::HOST, authority.as_str())
        .header(http::header::ACCEPT, "application/json")
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    if resp.status() != http::StatusCode::OK {
        return Err(format!("answered {}", resp.status()));
    }
    let body = Limited::new(resp.into_body(), MAX_DOCUMENT)
        .collect()
        .await
        .map_err(|e| format!("reading the body: {e}"))?
        .to_bytes();
    serde_json::from_slice(&body).map_err(|e| format!("not JSON: {e}"))
}

/// TLS towards an issuer: `ca_pem` when given, else the system's roots.
///
/// # Errors
/// The bundle does not parse, or no system roots are found.
pub fn tls_config(ca_pem: Option<&[u8]>) -> Result<Arc<rustls::ClientConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots(ca_pem)?)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// The certificates of `ca_pem` when given, else the system's roots.
///
/// # Errors
/// The bundle does not parse, or no system roots are found.
pub fn roots(ca_pem: Option<&[u8]>) -> Result<rustls::RootCertStore, String> {
    use rustls::pki_types::{pem::PemObject as _, CertificateDer};
    let mut roots = rustls::RootCertStore::empty();
    match ca_pem {
        Some(pem) => {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| format!("CA bundle: {e:?}"))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("CA bundle certificate: {e}"))?;
            }
        }
        None => {
            for cert in system_roots() {
                let _ = roots.add(cert);
            }
            if roots.is_empty() {
                return Err(
                    "no system CA certificates found (SSL_CERT_FILE or /etc/ssl/certs); give the issuer's CA"
                        .into(),
                );
            }
        }
    }
    Ok(roots)
}

/// The host's trusted roots: `SSL_CERT_FILE`, else the usual bundle paths.
fn system_roots() -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::{pem::PemObject as _, CertificateDer};
    let mut paths: Vec<std::path::PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("SSL_CERT_FILE") {
        paths.push(p.into());
    }
    paths.extend(
        [
            "/etc/ssl/certs/ca-certificates.crt",
            "/etc/pki/tls/certs/ca-bundle.crt",
            "/etc/ssl/ca-bundle.pem",
            "/etc/ssl/cert.pem",
        ]
        .map(std::path::PathBuf::from),
    );
    for p in paths {
        if let Ok(pem) = std::fs::read(&p) {
            let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem)
                .filter_map(Result::ok)
                .collect();
            if !certs.is_empty() {
                return certs;
            }
        }
    }
    Vec::new()
}
