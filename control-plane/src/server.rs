//! The HTTPS front: TLS with optional client certificates verified against
//! the cluster CA, HTTP/1.1 and HTTP/2, and a shutdown that drains.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::apiserver::{status::ApiError, ApiConfig, ApiServer};
use crate::auth::{authn, Authenticator};
use crate::config::Config;
use crate::metrics::{MeteredStore, Metrics};
use crate::pki::{self, Pki};
use crate::store::{self, Store};

/// Start-up errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Pki(#[from] pki::Error),
    #[error(transparent)]
    Auth(#[from] authn::Error),
    #[error("binding {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS configuration: {0}")]
    Tls(String),
    #[error("opening the datastore: {0}")]
    Store(#[from] store::Error),
    #[error("bootstrapping the API: {0}")]
    Bootstrap(#[from] ApiError),
    #[error("creating {path}: {source}")]
    DataDir {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// A running server.
pub struct ServerHandle {
    /// Where it listens (the real port when 0 was asked).
    pub addr: SocketAddr,
    /// `DATA_DIR/admin.kubeconfig`.
    pub admin_kubeconfig: PathBuf,
    /// `https://host:port`.
    pub url: String,
    pub api: Arc<ApiServer>,
    /// Sender side of the shutdown signal; the accept loop, connections and
    /// watch streams hold receivers.
    shutdown: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl ServerHandle {
    /// Stop accepting, end watches, let in-flight requests finish (up to
    /// 5 s), then return.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = self.task.await;
    }
}

/// Open the configured datastore: etcd when endpoints are given, else
/// SQLite in the data dir.
///
/// # Errors
/// The store cannot be opened.
pub async fn open_store(cfg: &Config) -> Result<Arc<dyn Store>, Error> {
    if cfg.datastore_endpoints.is_empty() {
        std::fs::create_dir_all(&cfg.data_dir).map_err(|source| Error::DataDir {
            path: cfg.data_dir.display().to_string(),
            source,
        })?;
        let s = store::SqliteStore::open(cfg.data_dir.join(store::SQLITE_FILE)).await?;
        Ok(Arc::new(s))
    } else {
        let s = store::etcd::EtcdStore::connect(&cfg.datastore_endpoints).await?;
        Ok(Arc::new(s))
    }
}

/// The address other hosts reach this server on: the bind address, or the
/// host's first non-loopback IPv4 when bound to all addresses.
fn advertise_ip(cfg: &Config) -> std::net::IpAddr {
    if !cfg.bind_address.is_unspecified() {
        return cfg.bind_address;
    }
    std::net::UdpSocket::bind("0.0.0.0:0")
        .ok()
        .and_then(|s| {
            // connect() on UDP sends nothing; it only picks the route's source.
            s.connect("198.18.0.1:9").ok()?;
            s.local_addr().ok().map(|a| a.ip())
        })
        .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST))
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Start serving `store` as configured.
///
/// # Errors
/// PKI, bind, TLS or bootstrap failures.
pub async fn start(cfg: &Config, store: Arc<dyn Store>) -> Result<ServerHandle, Error> {
    std::fs::create_dir_all(&cfg.data_dir).map_err(|source| Error::DataDir {
        path: cfg.data_dir.display().to_string(),
        source,
    })?;
    let pki = Pki::load_or_create(&cfg.data_dir)?;
    let addr = SocketAddr::new(cfg.bind_address, cfg.secure_port);
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })?;
    let addr = listener
        .local_addr()
        .map_err(|source| Error::Bind { addr, source })?;

    let mut sans = vec!["127.0.0.1".to_string(), "localhost".to_string(), hostname()];
    if !cfg.bind_address.is_unspecified() {
        sans.push(cfg.bind_address.to_string());
    } else {
        // Joining nodes reach a server bound to every address on the one
        // it advertises: the certificate must name it.
        sans.push(advertise_ip(cfg).to_string());
    }
    sans.extend(cfg.extra_sans.iter().cloned());
    let serving = pki.serving_cert(&sans)?;
    let tls = tls_config(&pki, &serving)?;

    let host = if cfg.bind_address.is_unspecified() {
        "127.0.0.1".to_string()
    } else {
        cfg.bind_address.to_string()
    };
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host
    };
    let url = format!("https://{host}:{}", addr.port());
    let admin_kubeconfig = pki.write_admin_kubeconfig(&cfg.data_dir, &url)?;

    let authn = match &cfg.token_auth_file {
        Some(p) => Authenticator::from_token_file(p)?,
        None => Authenticator::default(),
    };
    let metrics = Arc::new(Metrics::default());
    let store: Arc<dyn Store> = Arc::new(MeteredStore::new(store, metrics.clone()));
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let api = ApiServer::new(
        store,
        ApiConfig {
            service_cidr: cfg.service_cidr,
            advertise: Some((advertise_ip(cfg), addr.port())),
            default_toleration_seconds: crate::apiserver::defaults::DefaultTolerationSeconds {
                not_ready: cfg.default_not_ready_toleration_seconds,
                unreachable: cfg.default_unreachable_toleration_seconds,
            },
        },
        authn,
        metrics,
        shutdown_rx.clone(),
    );
    api.set_kubelet_client(&pki.kubelet_client_cert()?)
        .map_err(Error::Tls)?;
    api.set_cluster_ca(pki.ca_pem());
    api.start_background().await?;

    tracing::info!(
        url = %url,
        admin_kubeconfig = %admin_kubeconfig.display(),
        "skiff-server listening; admin kubeconfig at {}",
        admin_kubeconfig.display()
    );
    let task = tokio::spawn(accept_loop(
        listener,
        tokio_rustls::TlsAcceptor::from(Arc::new(tls)),
        api.clone(),
        shutdown_rx,
    ));
    Ok(ServerHandle {
        addr,
        admin_kubeconfig,
        url,
        api,
        shutdown: shutdown_tx,
        task,
    })
}

fn tls_config(pki: &Pki, serving: &pki::CertKey) -> Result<rustls::ServerConfig, Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from(pki.ca_der()))
        .map_err(|e| Error::Tls(format!("loading the CA: {e}")))?;
    // Client certificates are optional (tokens and anonymous health checks
    // need none) but, when presented, must chain to the cluster CA.
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()
    .map_err(|e| Error::Tls(e.to_string()))?;
    let chain = vec![
        CertificateDer::from(serving.cert_der.clone()),
        CertificateDer::from(pki.ca_der()),
    ];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(serving.key_der.clone()));
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| Error::Tls(e.to_string()))?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    api: Arc<ApiServer>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            res = listener.accept() => match res {
                Ok((tcp, _peer)) => {
                    let _ = tcp.set_nodelay(true);
                    conns.spawn(serve_conn(tcp, acceptor.clone(), api.clone(), shutdown.clone()));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            _ = shutdown.changed() => break,
        }
    }
    drop(listener);
    // Connections drain on their own (graceful HTTP shutdown); give up on
    // stragglers after a grace period.
    let drain = async { while conns.join_next().await.is_some() {} };
    if tokio::time::timeout(Duration::from_secs(5), drain)
        .await
        .is_err()
    {
        conns.abort_all();
    }
    tracing::info!("skiff-server stopped serving");
}

async fn serve_conn(
    tcp: tokio::net::TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    api: Arc<ApiServer>,
    mut shutdown: watch::Receiver<bool>,
) {
    let tls = match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => return,
    };
    let peer = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .and_then(|c| authn::identity_from_cert(c.as_ref()));
    let svc = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let api = api.clone();
        let peer = peer.clone();
        async move { Ok::<_, Infallible>(api.handle(req.map(Body::new), peer).await) }
    });
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), svc);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = shutdown.changed() => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(Duration::from_secs(5), conn).await;
        }
    }
}
