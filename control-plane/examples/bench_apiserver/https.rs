//! A light load generator: HTTPS with a kubeconfig's client certificate
//! (or a bearer token), either HTTP/1.1 with one connection per worker or
//! HTTP/2 with every worker multiplexed on one connection (what kubectl
//! and client-go do), bodies serialised before the clock starts. It sends the same API
//! requests a client library would; what it leaves out is the library's
//! own CPU (kube-rs spends about as much per request as the server does,
//! and both share the same cores).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context};
use base64::Engine;
use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// One request to send.
pub struct Call {
    pub method: Method,
    pub path: String,
    pub body: Option<Bytes>,
}

/// A connection of [`Target::connect`]; an HTTP/2 one is shared through
/// [`Conn::share`].
pub struct Conn {
    sender: Sender,
    /// The `Authorization` header of a token target.
    bearer: Option<HeaderValue>,
}

enum Sender {
    Http1(http1::SendRequest<Full<Bytes>>),
    Http2(http2::SendRequest<Full<Bytes>>),
}

impl Conn {
    /// Another handle on the same connection: HTTP/2 only, since an
    /// HTTP/1.1 connection carries one request at a time.
    pub fn share(&self) -> Option<Conn> {
        match &self.sender {
            Sender::Http1(_) => None,
            Sender::Http2(c) => Some(Conn {
                sender: Sender::Http2(c.clone()),
                bearer: self.bearer.clone(),
            }),
        }
    }
}

/// The HTTP version spoken over TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    Http1,
    Http2,
}

/// TLS client settings from a kubeconfig's first cluster and user.
pub struct Target {
    addr: SocketAddr,
    tls: tokio_rustls::TlsConnector,
    version: Version,
    bearer: Option<HeaderValue>,
}

/// `doc[list][0][entry][field]`, base64-decoded (kubeconfig `*-data` fields).
fn kubeconfig_data(
    doc: &serde_json::Value,
    list: &str,
    entry: &str,
    field: &str,
) -> anyhow::Result<Vec<u8>> {
    let b64 = doc[list][0][entry][field]
        .as_str()
        .with_context(|| format!("kubeconfig has no {list}[0].{entry}.{field}"))?;
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .with_context(|| format!("kubeconfig {field} is not base64"))
}

impl Target {
    /// The server and client certificate of `kubeconfig` (as the server
    /// writes `admin.kubeconfig`: embedded PEM data).
    pub fn from_kubeconfig(
        path: &Path,
        addr: SocketAddr,
        version: Version,
    ) -> anyhow::Result<Target> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let doc: serde_json::Value = serde_saphyr::from_str(&text)?;
        let ca = kubeconfig_data(&doc, "clusters", "cluster", "certificate-authority-data")?;
        let cert = kubeconfig_data(&doc, "users", "user", "client-certificate-data")?;
        let key = kubeconfig_data(&doc, "users", "user", "client-key-data")?;
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(&ca) {
            roots.add(c?)?;
        }
        let chain = CertificateDer::pem_slice_iter(&cert).collect::<Result<Vec<_>, _>>()?;
        let key = PrivateKeyDer::from_pem_slice(&key)?;
        let cfg = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)?;
        Ok(Target::new(cfg, addr, version, None))
    }

    /// The server of `kubeconfig`, sending `token` as a bearer token and
    /// no client certificate.
    pub fn with_token(
        path: &Path,
        addr: SocketAddr,
        version: Version,
        token: &str,
    ) -> anyhow::Result<Target> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let doc: serde_json::Value = serde_saphyr::from_str(&text)?;
        let ca = kubeconfig_data(&doc, "clusters", "cluster", "certificate-authority-data")?;
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(&ca) {
            roots.add(c?)?;
        }
        let cfg = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let bearer = HeaderValue::from_str(&format!("Bearer {token}"))?;
        Ok(Target::new(cfg, addr, version, Some(bearer)))
    }

    fn new(
        mut cfg: rustls::ClientConfig,
        addr: SocketAddr,
        version: Version,
        bearer: Option<HeaderValue>,
    ) -> Target {
        cfg.alpn_protocols = vec![match version {
            Version::Http1 => b"http/1.1".to_vec(),
            Version::Http2 => b"h2".to_vec(),
        }];
        Target {
            addr,
            tls: tokio_rustls::TlsConnector::from(Arc::new(cfg)),
            version,
            bearer,
        }
    }

    /// One connection (TLS handshake included).
    pub async fn connect(&self) -> anyhow::Result<Conn> {
        let tcp = tokio::net::TcpStream::connect(self.addr).await?;
        tcp.set_nodelay(true)?;
        let name = ServerName::from(self.addr.ip());
        let tls = self.tls.connect(name, tcp).await?;
        let io = TokioIo::new(tls);
        // A broken connection fails the requests in flight, which report it.
        let sender = match self.version {
            Version::Http1 => {
                let (send, conn) = http1::handshake(io).await?;
                tokio::spawn(conn);
                Sender::Http1(send)
            }
            Version::Http2 => {
                let (send, conn) = http2::handshake(TokioExecutor::new(), io).await?;
                tokio::spawn(conn);
                Sender::Http2(send)
            }
        };
        Ok(Conn {
            sender,
            bearer: self.bearer.clone(),
        })
    }
}

/// One request; the answer's status and whole body.
pub async fn send(conn: &mut Conn, call: Call) -> anyhow::Result<(StatusCode, Bytes)> {
    let mut req = Request::builder()
        .method(call.method)
        .uri(call.path)
        .header(header::HOST, "127.0.0.1")
        .header(header::ACCEPT, "application/json");
    if call.body.is_some() {
        req = req.header(header::CONTENT_TYPE, "application/json");
    }
    if let Some(b) = &conn.bearer {
        req = req.header(header::AUTHORIZATION, b.clone());
    }
    let req = req.body(Full::new(call.body.unwrap_or_default()))?;
    let resp = match &mut conn.sender {
        Sender::Http1(c) => {
            c.ready().await?;
            c.send_request(req).await?
        }
        Sender::Http2(c) => {
            c.ready().await?;
            c.send_request(req).await?
        }
    };
    let status = resp.status();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, body))
}

/// An error unless `status` is `want`, with the server's message.
pub fn expect_status(status: StatusCode, want: u16, body: &[u8]) -> anyhow::Result<()> {
    if status.as_u16() != want {
        bail!(
            "status {status} (want {want}): {}",
            String::from_utf8_lossy(&body[..body.len().min(300)])
        );
    }
    Ok(())
}
