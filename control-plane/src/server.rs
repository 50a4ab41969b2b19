//! The HTTPS front: TLS with optional client certificates verified against
//! the cluster CA, HTTP/1.1 and HTTP/2, and a shutdown that drains.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Body;
use hyper::body::Incoming;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use skiff_daemon::{limits, serve};
use tokio::net::TcpListener;
use tokio::sync::watch;

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
    /// A ServiceAccount key cannot be read, made or parsed.
    #[error(transparent)]
    ServiceAccountKeys(#[from] crate::auth::satoken::Error),
    #[error("opening the datastore: {0}")]
    Store(#[from] store::Error),
    /// `--encryption-provider-config` is unreadable or refused.
    #[error("{0}")]
    Encryption(#[from] store::encryption::Error),
    /// `--audit-policy-file` is unreadable or refused, or the audit log
    /// cannot be opened.
    #[error("{0}")]
    Audit(#[from] crate::apiserver::audit::Error),
    /// `--admission-control-config-file` is unreadable or refused.
    #[error("admission control config: {0}")]
    Admission(#[from] crate::apiserver::podsecurity::config::Error),
    /// The OIDC flags or `--authentication-config` are refused.
    #[error(transparent)]
    Oidc(#[from] crate::auth::oidc::Error),
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
    /// The store compactor (when `--etcd-compaction-interval` is not 0).
    compactor: Option<tokio::task::JoinHandle<()>>,
    /// Scheduled snapshots (unless `--etcd-disable-snapshots`).
    snapshotter: Option<tokio::task::JoinHandle<()>>,
    /// This server's endpoint lease: removed on shutdown.
    peers: tokio::task::JoinHandle<()>,
}

impl ServerHandle {
    /// Stop accepting, end watches, let in-flight requests finish (up to
    /// 5 s), write out the audit log, then return.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = self.task.await;
        self.api.audit.flush().await;
        let tasks = [self.compactor, self.snapshotter, Some(self.peers)];
        for task in tasks.into_iter().flatten() {
            let _ = task.await;
        }
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
        let s = store::etcd::EtcdStore::connect_tls(
            &cfg.datastore_endpoints,
            cfg.datastore_tls.as_ref(),
        )
        .await?;
        Ok(Arc::new(s))
    }
}

/// `store` with `--encryption-provider-config` applied (as it is without
/// one). Metrics wrap this, so store latencies include the ciphers.
///
/// # Errors
/// The config file is unreadable or refused; the message names the field.
pub fn encrypted(cfg: &Config, store: Arc<dyn Store>) -> Result<Arc<dyn Store>, Error> {
    let Some(path) = &cfg.encryption_provider_config else {
        return Ok(store);
    };
    let t = store::encryption::EncryptionConfiguration::load(path)?.transformers(path)?;
    for rule in t.rules() {
        tracing::info!(
            resource = %rule.resource,
            provider = %t.chain(rule).active().label(),
            "encrypting at rest"
        );
    }
    Ok(Arc::new(store::encryption::EncryptedStore::new(store, t)))
}

/// The address other hosts reach this server on: the bind address, or the
/// host's first non-loopback IPv4 when bound to all addresses.
pub(crate) fn advertise_ip(cfg: &Config) -> std::net::IpAddr {
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

/// This server's snapshot directory; files carry its host name.
pub fn snapshots(cfg: &Config) -> store::snapshots::Snapshots {
    store::snapshots::Snapshots {
        dir: cfg.snapshot_dir.clone(),
        node: if cfg.node_name.is_empty() {
            "skiff-server".into()
        } else {
            cfg.node_name.clone()
        },
    }
}

pub(crate) fn hostname() -> String {
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
    // A bad encryption config or audit policy refuses to start before
    // anything listens.
    let store = encrypted(cfg, store)?;
    let metrics = Arc::new(Metrics::default());
    let audit = crate::apiserver::audit::Auditor::start(cfg.audit.as_ref(), metrics.audit())?;
    let pod_security = match &cfg.admission_control_config_file {
        Some(p) => crate::apiserver::podsecurity::Config::load(p)?,
        None => Default::default(),
    };
    let oidc = oidc_authenticator(cfg)?;
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
    // Pods reach the API server as the `kubernetes` Service: by its
    // ClusterIP and DNS names (upstream's kube-apiserver names them all).
    // The certificate is issued anew at every start, so older ones gain them.
    sans.extend(
        [
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ]
        .map(String::from),
    );
    sans.push(
        crate::apiserver::ipalloc::Allocator::new(cfg.service_cidr)
            .first()
            .to_string(),
    );
    let serving = pki.serving_cert(&sans)?;
    let tls = tls_config(&pki, &serving)?;

    let url = local_url(cfg.bind_address, addr.port());
    let admin_kubeconfig = pki.write_admin_kubeconfig(&cfg.data_dir, &url)?;

    let authn = match &cfg.token_auth_file {
        Some(p) => Authenticator::from_token_file(p)?,
        None => Authenticator::default(),
    };
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let store: Arc<dyn Store> = Arc::new(MeteredStore::new(store, metrics.clone()));
    let store: Arc<dyn Store> = if cfg.watch_cache {
        Arc::new(store::watchcache::WatchCache::new(
            store,
            shutdown_rx.clone(),
        ))
    } else {
        store
    };
    let api = ApiServer::new(
        store,
        ApiConfig {
            service_cidr: cfg.service_cidr,
            advertise: Some((advertise_ip(cfg), addr.port())),
            default_toleration_seconds: crate::apiserver::admission::DefaultTolerationSeconds {
                not_ready: cfg.default_not_ready_toleration_seconds,
                unreachable: cfg.default_unreachable_toleration_seconds,
            },
            event_ttl: cfg.event_ttl,
            inflight: crate::apiserver::inflight::Inflight::new(
                cfg.max_requests_inflight,
                cfg.max_mutating_requests_inflight,
                cfg.request_timeout,
            ),
            audit,
        },
        authn,
        metrics,
        shutdown_rx.clone(),
    );
    api.set_kubelet_client(&pki.kubelet_client_cert()?)
        .map_err(|e| Error::Tls(format!("kubelet client certificate: {e}")))?;
    api.set_cluster_ca(pki.ca_pem());
    if let Some(etcd) = store::managed::Etcd::of(cfg) {
        api.set_server_join(store::managed::join::Source {
            data_dir: cfg.data_dir.clone(),
            service_account_key: cfg.service_accounts.signing_key_file.clone(),
            etcd,
        });
    }
    let front_proxy = Pki::front_proxy(&cfg.data_dir)?;
    api.aggregator.set_front_proxy(
        front_proxy.ca_pem(),
        front_proxy.client_cert(crate::apiserver::aggregator::FRONT_PROXY_CLIENT, &[])?,
    );
    api.set_pod_security(pod_security);
    let sa_tokens = Arc::new(crate::auth::satoken::Tokens::load(&cfg.service_accounts)?);
    api.set_service_account_tokens(sa_tokens);
    if let Some(oidc) = oidc {
        oidc.start();
        api.set_oidc(oidc);
    }
    api.start_background().await?;
    let compactor = cfg.compaction_interval.map(|interval| {
        tokio::spawn(store::compactor::run(
            api.store().clone(),
            interval,
            shutdown_rx.clone(),
        ))
    });
    let peers = tokio::spawn(crate::apiserver::peers::run(api.clone()));
    let snapshotter = cfg.snapshot_schedule.clone().map(|schedule| {
        tokio::spawn(store::snapshots::run(
            api.store().clone(),
            schedule,
            snapshots(cfg),
            cfg.snapshot_retention,
            shutdown_rx.clone(),
        ))
    });

    tracing::info!(
        url = %url,
        admin_kubeconfig = %admin_kubeconfig.display(),
        "skiff-server listening; admin kubeconfig at {}",
        admin_kubeconfig.display()
    );
    let fd_limit = limits::raise_fd_limit().unwrap_or_else(|e| {
        tracing::warn!("could not raise the open-files limit: {e}");
        1024
    });
    let conns = limits::ConnectionLimits::new(
        limits::connection_cap(cfg.max_connections, fd_limit),
        cfg.max_connections_per_source,
    );
    let task = tokio::spawn(accept_loop(
        listener,
        tokio_rustls::TlsAcceptor::from(Arc::new(tls)),
        api.clone(),
        conns,
        shutdown_rx,
    ));
    Ok(ServerHandle {
        addr,
        admin_kubeconfig,
        url,
        api,
        shutdown: shutdown_tx,
        task,
        compactor,
        snapshotter,
        peers,
    })
}

/// The OIDC issuers trusted for people, if any (checked before anything
/// listens). They may not claim a ServiceAccount issuer.
fn oidc_authenticator(cfg: &Config) -> Result<Option<Arc<crate::auth::oidc::Oidc>>, Error> {
    let mut sa_issuers = cfg.service_accounts.issuers.clone();
    if sa_issuers.is_empty() {
        sa_issuers.push(crate::auth::satoken::DEFAULT_ISSUER.into());
    }
    let oidc = crate::auth::oidc::Oidc::from_options(&cfg.oidc, &sa_issuers)?;
    Ok((!oidc.is_empty()).then(|| Arc::new(oidc)))
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
    limits: Arc<limits::ConnectionLimits>,
    mut shutdown: watch::Receiver<bool>,
) {
    let make = move |cert: Option<&[u8]>| {
        let peer = cert.and_then(authn::identity_from_cert);
        let api = api.clone();
        move |req: hyper::Request<Incoming>| {
            let api = api.clone();
            let peer = peer.clone();
            async move { api.handle(req.map(Body::new), peer).await }
        }
    };
    let stopped = async move {
        let _ = shutdown.wait_for(|s| *s).await;
    };
    serve::serve(listener, acceptor, limits, make, stopped).await;
    tracing::info!("skiff-server stopped serving");
}

/// The URL a client on this machine reaches a server bound to `bind` on
/// `port` at (loopback when it binds every address).
pub fn local_url(bind: std::net::IpAddr, port: u16) -> String {
    let host = if bind.is_unspecified() {
        "127.0.0.1".to_string()
    } else if bind.is_ipv6() {
        format!("[{bind}]")
    } else {
        bind.to_string()
    };
    format!("https://{host}:{port}")
}

/// Whether something accepts connections at `url`'s address (a server
/// serving the data dir, when `url` is [`serving_url`]'s).
pub fn answers(url: &str) -> bool {
    use std::net::ToSocketAddrs;
    let hostport = url.trim_start_matches("https://").trim_end_matches('/');
    let Ok(addrs) = hostport.to_socket_addrs() else {
        return false;
    };
    addrs.into_iter().any(|a| {
        std::net::TcpStream::connect_timeout(&a, std::time::Duration::from_secs(1)).is_ok()
    })
}

/// The URL the server running on `cfg`'s data dir serves at, as it wrote
/// it into `admin.kubeconfig` (the port it really got, when it asked for
/// any); from the configuration when it has not run yet.
pub fn serving_url(cfg: &Config) -> String {
    let written = kube::config::Kubeconfig::read_from(cfg.data_dir.join("admin.kubeconfig"))
        .ok()
        .and_then(|kc| kc.clusters.into_iter().next())
        .and_then(|c| c.cluster)
        .and_then(|c| c.server);
    written.unwrap_or_else(|| local_url(cfg.bind_address, cfg.secure_port))
}
