//! The cluster DNS server the agent serves on the node (CoreDNS's role):
//! the cluster domain from the Service and EndpointSlice stores, every
//! other name forwarded to the node's upstream resolvers.
//!
//! # Layout
//! - [`serve`] / [`DnsServer`] (here): bind, run until shutdown.
//! - [`zone`]: the pure part: a query and the stores in, the answer out.
//! - `handler`: a request to a response (hickory-server's
//!   `RequestHandler`), zone or upstream.
//! - [`upstream`]: resolv.conf, re-read as it changes; forwarding with a
//!   timeout and failover.
//! - [`listen`]: UDP and TCP sockets bound with IP_FREEBIND.
//! - [`gateway`]: the server on a node's pod gateway, following the pod
//!   CIDR.
//!
//! Pods with `dnsPolicy: ClusterFirst` reach it through the nameserver
//! that `--cluster-dns` puts in their resolv.conf (the agent's
//! runtime::sandbox). A crate of its own, run in-process by skiff-agent.
#![forbid(unsafe_code)]

pub mod gateway;
mod handler;
pub mod listen;
pub mod upstream;
pub mod zone;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hickory_server::net::NetError;
use hickory_server::Server;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::Store;
use tokio::task::JoinSet;

pub use zone::{Answer, Local, Zone};

/// A tracing filter directive for the binary's default filter:
/// hickory-server logs every request at info, and the agent logs events,
/// not queries.
pub const LOG_FILTER: &str = "hickory_server=warn";

/// What the DNS server serves, where, and where it forwards to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsConfig {
    /// UDP and TCP on each. On a node: the pod CIDR's gateway address,
    /// port 53 (what `--cluster-dns` tells pods). Port 0 picks a free port
    /// (the same on UDP and TCP), see [`DnsServer::local_addrs`].
    pub listen: Vec<SocketAddr>,
    /// The cluster domain (the kubelet's `--cluster-domain`).
    pub domain: String,
    /// Where the upstream resolvers are named (the kubelet's
    /// `--resolv-conf`).
    pub resolv_conf: PathBuf,
    /// How long one upstream may take before the next is tried.
    pub upstream_timeout: Duration,
    /// How often `resolv_conf` is read again for changes.
    pub resolv_conf_reload: Duration,
    /// How long a TCP client may stay idle before it is disconnected.
    pub tcp_idle_timeout: Duration,
}

impl Default for DnsConfig {
    fn default() -> DnsConfig {
        DnsConfig {
            listen: Vec::new(),
            domain: "cluster.local".into(),
            resolv_conf: "/etc/resolv.conf".into(),
            // CoreDNS's forward plugin reads for 2 s before giving up.
            upstream_timeout: Duration::from_secs(2),
            resolv_conf_reload: Duration::from_secs(10),
            tcp_idle_timeout: Duration::from_secs(10),
        }
    }
}

/// Failures starting or running the DNS server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `domain` is not a domain name.
    #[error(transparent)]
    Zone(#[from] zone::Error),
    /// `listen` is empty.
    #[error("the DNS server has no listen address (set the pod CIDR's gateway address, port 53)")]
    NoListen,
    /// A listen socket could not be bound.
    #[error("DNS server: {0} (is another DNS server on that port?)")]
    Bind(#[from] listen::Error),
    /// A listen socket failed while serving.
    #[error("the DNS server stopped: {0}")]
    Stopped(#[source] NetError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A bound DNS server, not yet serving.
pub struct DnsServer {
    server: Server<handler::Handler>,
    local_addrs: Vec<SocketAddr>,
    /// The resolv.conf watcher and the store-sync waiter; dropping the
    /// set (when [`DnsServer::run`] returns) stops them.
    tasks: JoinSet<()>,
}

impl DnsServer {
    /// Binds UDP and TCP on every `config.listen` address and reads the
    /// upstreams. `services` and `slices` are reflector stores (the ones
    /// the service proxy reads); cluster names are answered SERVFAIL until
    /// both have their first full list.
    ///
    /// # Errors
    /// The domain is invalid, there is no listen address, or one cannot be
    /// bound. An unreadable resolv.conf is not an error: forwarding fails
    /// (SERVFAIL) until it can be read.
    pub async fn bind(
        config: DnsConfig,
        services: Store<Service>,
        slices: Store<EndpointSlice>,
    ) -> Result<DnsServer> {
        if config.listen.is_empty() {
            return Err(Error::NoListen);
        }
        let zone = Zone::new(&config.domain, services.clone(), slices.clone())?;
        let mut sockets = Vec::new();
        for &addr in &config.listen {
            sockets.push(listen::bind(addr)?);
        }
        let local_addrs: Vec<SocketAddr> = sockets
            .iter()
            .filter_map(|(udp, _)| udp.local_addr().ok())
            .collect();

        let mut tasks = JoinSet::new();
        let (forwarder, watch) = upstream::Forwarder::new(
            config.resolv_conf.clone(),
            local_addrs.clone(),
            config.upstream_timeout,
            config.resolv_conf_reload,
        )
        .await;
        tasks.spawn(watch);
        let synced = Arc::new(AtomicBool::new(false));
        tasks.spawn(wait_for_sync(services, slices, synced.clone()));

        let mut server = Server::new(handler::Handler {
            zone,
            forwarder,
            synced,
        });
        for (udp, tcp) in sockets {
            server.register_socket(udp);
            // The response buffer holds whole messages queued per connection.
            server.register_listener(tcp, config.tcp_idle_timeout, 16);
        }
        tracing::info!(listen = ?local_addrs, domain = %config.domain,
            resolv_conf = %config.resolv_conf.display(), "cluster DNS server listening");
        Ok(DnsServer {
            server,
            local_addrs,
            tasks,
        })
    }

    /// The bound addresses (UDP and TCP share each), with the ports
    /// chosen for port 0.
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.local_addrs
    }

    /// Serves until `shutdown` completes, then stops accepting and closes
    /// the sockets.
    ///
    /// # Errors
    /// A socket failed while serving.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<()> {
        let DnsServer {
            mut server,
            local_addrs,
            tasks: _tasks,
        } = self;
        let failed = tokio::select! {
            result = server.block_until_done() => Some(result),
            () = shutdown => None,
        };
        let result = match failed {
            Some(result) => Err(Error::Stopped(
                result
                    .err()
                    .unwrap_or_else(|| NetError::from("the listeners closed")),
            )),
            None => server.shutdown_gracefully().await.map_err(Error::Stopped),
        };
        tracing::info!(listen = ?local_addrs, "cluster DNS server stopped");
        result
    }
}

/// Binds (see [`DnsServer::bind`]) and serves until `shutdown` completes.
///
/// # Errors
/// As [`DnsServer::bind`] and [`DnsServer::run`].
pub async fn serve(
    config: DnsConfig,
    services: Store<Service>,
    slices: Store<EndpointSlice>,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    DnsServer::bind(config, services, slices)
        .await?
        .run(shutdown)
        .await
}

async fn wait_for_sync(
    services: Store<Service>,
    slices: Store<EndpointSlice>,
    synced: Arc<AtomicBool>,
) {
    match tokio::try_join!(services.wait_until_ready(), slices.wait_until_ready()) {
        Ok(_) => {
            synced.store(true, Ordering::Release);
            tracing::info!("cluster DNS answers from the synced Service and EndpointSlice stores");
        }
        Err(error) => {
            tracing::warn!(%error, "cluster DNS: a store's writer went away before it synced; cluster names stay SERVFAIL");
        }
    }
}

/// Compile-only: the agent spawns the server.
#[cfg(test)]
#[allow(dead_code)]
fn serve_is_send(services: Store<Service>, slices: Store<EndpointSlice>) {
    fn spawnable<T: Send + 'static>(_: T) {}
    spawnable(serve(
        DnsConfig::default(),
        services,
        slices,
        std::future::pending(),
    ));
}
