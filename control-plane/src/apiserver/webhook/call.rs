//! Calling a webhook: one HTTPS POST of the review, trusting only the
//! webhook's `caBundle` (the system's roots without one), within its
//! timeout, reading at most [`MAX_RESPONSE`] bytes of the answer.
//! Connections are kept for the next call (a few per webhook and
//! endpoint): a call is then one request, not a dial and a handshake or
//! two.
//!
//! A `url` is dialled from here. A service's endpoint is reached through
//! the server of the node its pod runs on (the tunnel pods/proxy uses,
//! [`crate::apiserver::httpproxy::tunnel`]), or dialled from here when no
//! pod is behind it; either way the certificate is checked against the
//! service's DNS name, `NAME.NAMESPACE.svc`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::apiserver::{httpproxy, ApiServer};

/// The most of a webhook's answer that is read: a review carries two
/// objects, a patch of one in base64 at most a third larger.
pub const MAX_RESPONSE: usize = 4 * crate::apiserver::MAX_BODY;

/// Idle connections kept per webhook and endpoint.
const IDLE_PER_ENDPOINT: usize = 8;

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// Where the connection goes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Dial {
    /// `host:port`, from this server.
    Direct(String, u16),
    /// `ip:port`, through node `node`'s server.
    Tunnel { node: String, ip: String, port: u16 },
}

/// One call: where to connect, whom to expect there, what to ask.
pub struct Post {
    pub dial: Dial,
    /// The name the certificate must carry.
    pub server_name: String,
    /// `https://HOST:PORT/PATH`, for the Host header and messages.
    pub url: String,
    pub body: Vec<u8>,
    pub timeout: Duration,
}

pub struct Client {
    tls: Result<Arc<rustls::ClientConfig>, String>,
    idle: Mutex<HashMap<Dial, Vec<Sender>>>,
}

impl Client {
    /// A client trusting `ca` (PEM; empty: the system's roots).
    pub fn new(ca: &[u8]) -> Client {
        let ca = (!ca.is_empty()).then_some(ca);
        Client {
            tls: crate::auth::oidc::keys::tls_config(ca),
            idle: Mutex::default(),
        }
    }

    /// Make the call; the answer's body when it is a 2xx.
    ///
    /// # Errors
    /// Upstream's wording: `failed to call webhook: ...` for a call that
    /// did not complete, `received invalid webhook response: ...` for an
    /// answer that cannot be one.
    pub async fn post(&self, api: &ApiServer, post: Post) -> Result<Vec<u8>, String> {
        let url = format!("{}?timeout={}s", post.url, post.timeout.as_secs());
        let failed = |e: String| format!("failed to call webhook: Post {url:?}: {e}");
        let tls = self
            .tls
            .clone()
            .map_err(|e| format!("failed to call webhook: caBundle: {e}"))?;
        let name =
            ServerName::try_from(post.server_name.clone()).map_err(|e| failed(e.to_string()))?;
        let uri: http::Uri = url.parse().map_err(|e| failed(format!("{e}")))?;
        let req = http::Request::post(uri.path_and_query().map_or("/", |p| p.as_str()))
            .header(
                http::header::HOST,
                uri.authority().map_or("", |a| a.as_str()),
            )
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::ACCEPT, "application/json")
            .body(Full::new(Bytes::from(post.body)))
            .map_err(|e| failed(e.to_string()))?;
        let call = async {
            // A kept connection the webhook closed meanwhile fails at
            // once: then once more on a new one (the call has no side
            // effects, sideEffects is None or NoneOnDryRun).
            if let Some(sender) = self.take_idle(&post.dial) {
                match self.send(&post.dial, sender, req.clone()).await {
                    Err(Failure::Call(_)) => {}
                    done => return done.map_err(|e| e.message(&failed)),
                }
            }
            let sender = match &post.dial {
                Dial::Direct(host, port) => {
                    let tcp = tokio::net::TcpStream::connect((host.as_str(), *port))
                        .await
                        .map_err(|e| failed(format!("dial tcp {host}:{port}: {e}")))?;
                    let _ = tcp.set_nodelay(true);
                    connect(tls, name, tcp).await
                }
                Dial::Tunnel { node, ip, port } => {
                    let io = httpproxy::tunnel(api, node, ip, *port)
                        .await
                        .map_err(|e| failed(e.message))?;
                    connect(tls, name, io).await
                }
            }
            .map_err(|e| e.message(&failed))?;
            self.send(&post.dial, sender, req)
                .await
                .map_err(|e| e.message(&failed))
        };
        match tokio::time::timeout(post.timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(failed("context deadline exceeded".into())),
        }
    }
}

/// Why an exchange failed.
enum Failure {
    /// The call did not complete.
    Call(String),
    /// It did, and the answer is not one.
    Answer(String),
}

impl Failure {
    fn message(self, failed: &impl Fn(String) -> String) -> String {
        match self {
            Failure::Call(e) => failed(e),
            Failure::Answer(e) => e,
        }
    }
}

/// TLS over `io`, then an HTTP/1.1 connection on it.
async fn connect<T>(
    tls: Arc<rustls::ClientConfig>,
    name: ServerName<'static>,
    io: T,
) -> Result<Sender, Failure>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io = tokio_rustls::TlsConnector::from(tls)
        .connect(name, io)
        .await
        .map_err(|e| Failure::Call(format!("tls: {e}")))?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| Failure::Call(e.to_string()))?;
    // The connection ends when its last sender is dropped.
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

impl Client {
    fn take_idle(&self, dial: &Dial) -> Option<Sender> {
        let mut idle = self.idle.lock().expect("webhook connections lock");
        let list = idle.get_mut(dial)?;
        while let Some(s) = list.pop() {
            if !s.is_closed() {
                return Some(s);
            }
        }
        None
    }

    fn keep(&self, dial: &Dial, sender: Sender) {
        let mut idle = self.idle.lock().expect("webhook connections lock");
        // Endpoints come and go: forget those not called lately.
        if idle.len() > 16 && !idle.contains_key(dial) {
            idle.clear();
        }
        let list = idle.entry(dial.clone()).or_default();
        if list.len() < IDLE_PER_ENDPOINT {
            list.push(sender);
        }
    }

    /// Send `req` on `sender`; the body of a 2xx answer. The connection
    /// is kept when the answer was read whole.
    async fn send(
        &self,
        dial: &Dial,
        mut sender: Sender,
        req: http::Request<Full<Bytes>>,
    ) -> Result<Vec<u8>, Failure> {
        sender
            .ready()
            .await
            .map_err(|e| Failure::Call(e.to_string()))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| Failure::Call(e.to_string()))?;
        let status = resp.status();
        let body = Limited::new(resp.into_body(), MAX_RESPONSE)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    Failure::Answer(format!(
                        "received invalid webhook response: the response is larger than {MAX_RESPONSE} bytes"
                    ))
                } else {
                    Failure::Call(e.to_string())
                }
            })?
            .to_bytes();
        self.keep(dial, sender);
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body[..body.len().min(1024)]).into_owned();
            return Err(Failure::Answer(format!(
                "failed to call webhook: the server responded with the status code {} ({text:?})",
                status.as_u16()
            )));
        }
        Ok(body.to_vec())
    }
}
