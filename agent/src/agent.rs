//! Wiring: the runtime client, the PLEG, the sources, the pod manager and
//! the status endpoint, started together and stopped together.

use std::future::Future;
use std::sync::{Arc, Mutex};

use cri_proto::CriClient;
use tokio::sync::{mpsc, watch};

use crate::backoff::Backoff;
use crate::certs::rotate::Rotator;
use crate::config::Config;
use crate::events::LogRecorder;
use crate::manager::Manager;
use crate::mirror::MirrorManager;
use crate::node::{CriProbe, Facts, NodeAgent};
use crate::pleg::{Health, Pleg};
use crate::runtime::Runtime;
use crate::server::{self, ServerState};
use crate::shared::Shared;
use crate::source::api::{self, ApiSource, MirrorPods};
use crate::source::file::FileSource;
use crate::source::PodUpdate;
use crate::status::manager::StatusManager;
use crate::status::StatusStore;
use crate::volumes::objects::ObjectSource;

/// How long a read configMap or secret is reused: only bursts of pod syncs
/// share a read, so updates reach pods within the sync period.
const OBJECT_TTL: std::time::Duration = std::time::Duration::from_secs(1);

/// Errors that stop the agent from starting.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Config(String),
    #[error("invalid container runtime endpoint {endpoint}: {source}")]
    Endpoint {
        endpoint: String,
        #[source]
        source: cri_proto::Error,
    },
    #[error("cannot create directory {path}: {source}")]
    Dir {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    ApiClient(#[from] crate::apiclient::Error),
    #[error("registries file: {0}")]
    Registries(#[from] crate::registries::config::Error),
    #[error("node server: {0}")]
    NodeServerTls(#[from] crate::server::tls::Error),
    #[error("cannot listen on {address} for the node server: {source} (change --address / --port, or --port=0 to turn it off)")]
    NodeServerListen {
        address: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot listen on {address} for the status endpoint: {source} (change --status-address, or set it to none)")]
    Listen {
        address: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Run the agent until `shutdown` resolves. Containers are left running:
/// a restarted agent adopts them.
///
/// # Errors
/// Only start-up failures; once running, runtime outages are retried.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
    config.image_gc.validate().map_err(Error::Config)?;
    let eviction = crate::eviction::Settings::from_config(&config).map_err(Error::Config)?;
    if config.image_gc_period.is_zero() {
        return Err(Error::Config(
            "invalid configuration: imageGCPeriod must be greater than 0".into(),
        ));
    }
    for dir in [&config.root_dir, &config.pod_log_dir] {
        std::fs::create_dir_all(dir).map_err(|source| Error::Dir {
            path: dir.display().to_string(),
            source,
        })?;
    }
    let cri = CriClient::connect_lazy(
        config.container_runtime_endpoint.clone(),
        config.runtime_request_timeout,
    )
    .map_err(|source| Error::Endpoint {
        endpoint: config.container_runtime_endpoint.clone(),
        source,
    })?
    .with_pull_timeout(config.image_pull_timeout)
    .with_observer(cri_proto::Observer::new(|method, took, failed| {
        crate::metrics::metrics().cri_call(method, took, failed)
    }));
    let runtime = Arc::new(Runtime::new(cri));
    // A bad kubeconfig is a start-up error; an unreachable API is not (the
    // joined loops retry, and static pods run meanwhile).
    let api = match &config.kubeconfig {
        Some(path) => Some(crate::apiclient::from_kubeconfig(path).await?),
        None => None,
    };
    let client = api.as_ref().map(|a| a.client.clone());
    let mut facts = Facts::gather(&config.root_dir, config.max_pods);
    if config.node_ip.is_some() {
        facts.internal_ip = config.node_ip;
    }
    // Raised once for the process (Go does this for every Go program), so
    // that connections and pods share the hard limit.
    let fd_limit = skiff_daemon::limits::raise_fd_limit().unwrap_or_else(|e| {
        tracing::warn!("could not raise the open-files limit: {e}");
        1024
    });
    // A standalone agent (static pods, no API server) has no CA to
    // authenticate callers with: it runs without its node server, as the
    // kubelet's standalone mode does, instead of failing. Decided before
    // binding, so that no port is held that nothing serves.
    let client_ca = if config.port == 0 {
        None
    } else {
        match server::tls::client_ca(&config) {
            Err(server::tls::Error::NoClientCa) => {
                tracing::warn!(
                    "node server off: no client CA (--client-ca-file or a --kubeconfig naming its CA); logs, exec and port-forward are not served"
                );
                None
            }
            ca => Some(ca?),
        }
    };
    // Bound before the Node is reported, so that its daemonEndpoints port
    // is one that answers.
    let node_listener = if client_ca.is_some() {
        let addr = std::net::SocketAddr::new(config.address, config.port);
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| Error::NodeServerListen {
                address: addr,
                source,
            })?;
        facts.kubelet_port = l.local_addr().map(|a| a.port()).unwrap_or(config.port);
        Some(l)
    } else {
        None
    };
    let facts = Arc::new(facts);
    let host_ip = facts.internal_ip.map(|i| i.to_string()).unwrap_or_default();
    tracing::info!(
        node = %config.node_name,
        runtime = %config.container_runtime_endpoint,
        static_pods = %config.static_pod_path.as_deref().map(|p| p.display().to_string()).unwrap_or_default(),
        "skiff-agent starting"
    );
    let registries = crate::registries::Current::new(match &config.registries_config {
        Some(path) => crate::registries::config::load(path)?,
        None => Default::default(),
    });
    let statuses = Arc::new(StatusStore::default());
    // Receiver: the pod manager, which routes wake-ups by pod uid. Senders:
    // the PLEG's event stream and the prober (a probe result changed).
    let (wake_tx, wake_rx) = mpsc::unbounded_channel();
    // Pod workers and probe workers record through one queue.
    let (recorder, probe_recorder): (
        Box<dyn crate::events::Recorder>,
        Arc<dyn crate::events::Recorder>,
    ) = match &client {
        Some(c) => {
            let r = crate::events::api_recorder(c.clone(), &config.node_name);
            (Box::new(r.clone()), Arc::new(r))
        }
        None => (Box::new(LogRecorder), Arc::new(LogRecorder)),
    };
    let prober = crate::prober::Prober::new(runtime.cri.clone(), probe_recorder, wake_tx.clone());
    // Sender: the node agent, once the control plane assigned the CIDR.
    let (pod_cidr_tx, pod_cidr) = watch::channel(config.pod_cidr.clone());
    let serve_dns = client.is_some() && config.serve_cluster_dns && config.cluster_dns.is_empty();
    let shared = Arc::new(Shared {
        crash_backoff: Mutex::new(Backoff::new(config.backoff_initial, config.backoff_max)),
        images: crate::runtime::image::ImagePuller::new(Backoff::new(
            config.backoff_initial,
            config.backoff_max,
        ))
        .with_client(client.clone())
        .with_registries(registries.clone()),
        runtime_classes: crate::runtime::runtimeclass::Lookup::new(client.clone()),
        config: config.clone(),
        runtime: runtime.clone(),
        pressure: Arc::new(crate::pressure::Pressure::default()),
        recorder,
        statuses: statuses.clone(),
        host_ip,
        prober,
        volumes: crate::volumes::VolumeManager::new(
            &config.root_dir,
            client
                .clone()
                .map(|c| Arc::new(ObjectSource::new(c, OBJECT_TTL))),
        )
        .with_tokens(client.clone().map(crate::volumes::token::TokenManager::new))
        .with_claims(client.clone().map(|c| {
            Arc::new(crate::volumes::claim::ClaimSource::new(
                c,
                &config.node_name,
                OBJECT_TTL,
            ))
        })),
        served_dns: serve_dns.then(|| pod_cidr.clone()),
    });
    let health = Arc::new(Health::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };

    if let Some(addr) = config.status_address {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Listen {
                address: addr,
                source,
            })?;
        drop(listener);
        let state = ServerState {
            shared: shared.clone(),
            health: health.clone(),
            facts: facts.clone(),
        };
        let stop = stopped();
        tokio::spawn(async move {
            if let Err(e) = server::serve(addr, state, stop).await {
                tracing::error!("status endpoint failed: {e}");
            }
        });
    }

    let mut serving_cert = None;
    if let (Some(listener), Some(client_ca)) = (node_listener, client_ca) {
        let cert = server::tls::ReloadingCert::new(server::tls::serving_cert(
            &config,
            &facts.hostname,
            facts.internal_ip.as_slice(),
        )?)?;
        serving_cert = Some(cert.clone());
        let tls = server::tls::server_config(cert, client_ca)?;
        let state = ServerState {
            shared: shared.clone(),
            health: health.clone(),
            facts: facts.clone(),
        };
        let authorizer = Arc::new(server::auth::Authorizer::new(
            client.clone(),
            &config.node_name,
        ));
        let router = server::secure::router(state, authorizer);
        tokio::spawn(server::secure::serve(
            listener,
            tls,
            router,
            fd_limit,
            stopped(),
        ));
    }

    let (relist_tx, relist_rx) = mpsc::channel(4);
    let runtime_for_node = runtime.clone();
    let pleg = Pleg::new(
        runtime,
        config.pleg_relist_period,
        health.clone(),
        relist_tx,
        wake_tx,
    );
    let pleg_task = tokio::spawn(pleg.run());
    if let Some(max_size) = config.container_log_max_size {
        let policy = crate::logs::rotate::Policy {
            max_size,
            max_files: config.container_log_max_files,
        };
        let logs = crate::logs::rotate::LogManager::new(
            runtime_for_node.cri.clone(),
            policy,
            config.container_log_monitor_interval,
        );
        tokio::spawn(logs.run(stopped()));
    }
    let node_recorder = client
        .as_ref()
        .map(|c| crate::events::api_recorder(c.clone(), &config.node_name));
    crate::images::spawn(
        &config,
        &runtime_for_node.cri,
        node_recorder.as_ref(),
        &stopped,
    );
    if let Some(path) = &config.registries_config {
        let watcher = crate::registries::Watcher::new(
            path.clone(),
            runtime_for_node.cri.clone(),
            registries.clone(),
            node_recorder.clone(),
        );
        tokio::spawn(watcher.run(stopped()));
    }
    let mut node_task = None;
    let shutting_down = Arc::new(crate::shutdown::ShuttingDown::default());
    if let (Some(c), Some(recorder)) = (&client, node_recorder.clone()) {
        let probe = Arc::new(crate::shutdown::ReportShutdown {
            inner: Arc::new(CriProbe::new(runtime_for_node, Some(health.clone()))),
            flag: shutting_down.clone(),
        });
        let node = NodeAgent::new(
            c.clone(),
            Arc::new(config.clone()),
            facts.clone(),
            probe,
            Some(recorder),
        )
        .with_pod_cidr(pod_cidr_tx)
        .with_pressure(shared.pressure.clone());
        node_task = Some(tokio::spawn(node.run(stopped())));
        tokio::spawn(crate::volumes::reclaim::run(
            c.clone(),
            config.node_name.clone(),
            stopped(),
        ));
        start_services(&config, c, pod_cidr, serve_dns, &stopped);
    }
    if let Some(api) = &api {
        for rotator in rotators(&config, api, serving_cert, &facts) {
            tokio::spawn(rotator.run(stopped()));
        }
    }

    let (src_tx, src_rx) = mpsc::channel(16);
    let mut sources = Vec::new();
    let (statics_tx, statics_rx) = watch::channel(Vec::new());
    if let Some(dir) = &config.static_pod_path {
        sources.push("file");
        tokio::spawn(tee_static_pods(
            FileSource::new(dir, &config.node_name),
            src_tx.clone(),
            statics_tx,
        ));
    }
    let (stops_tx, stops_rx) = mpsc::channel(2);
    let evictions =
        crate::eviction::Manager::new(shared.clone(), eviction, stops_tx.clone(), node_recorder);
    tokio::spawn(evictions.run(stopped()));
    let mut manager = Manager::new(shared, &[]).with_stops(stops_rx);
    if !config.shutdown_grace_period.is_zero() {
        match crate::shutdown::logind::Logind::connect(config.shutdown_grace_period).await {
            Ok(logind) => {
                let tx = stops_tx.clone();
                let m = crate::shutdown::ShutdownManager {
                    signals: logind,
                    periods: crate::shutdown::Periods {
                        total: config.shutdown_grace_period,
                        critical: config.shutdown_grace_period_critical_pods,
                    },
                    statuses: statuses.clone(),
                    commands: tx,
                    client: client.clone(),
                    shutting_down,
                };
                tokio::spawn(m.run(stopped()));
            }
            Err(e) => {
                tracing::warn!("graceful node shutdown is off: cannot reach systemd-logind: {e}")
            }
        }
    }
    if let Some(client) = client {
        sources.push(api::SOURCE);
        let (mirrors_tx, mirrors_rx) = watch::channel(MirrorPods::default());
        tokio::spawn(
            ApiSource::new(client.clone(), &config.node_name).run(src_tx.clone(), mirrors_tx),
        );
        if config.static_pod_path.is_some() {
            let mirrors = MirrorManager::new(
                client.clone(),
                &config.node_name,
                statics_rx,
                mirrors_rx.clone(),
            );
            tokio::spawn(mirrors.run());
        }
        let (deleted_tx, deleted_rx) = mpsc::unbounded_channel();
        tokio::spawn(StatusManager::new(client.clone(), statuses, mirrors_rx, deleted_rx).run());
        manager = manager.with_deleted(deleted_tx);
    }
    drop(src_tx);

    // Everything is started: systemd may consider the agent up.
    skiff_daemon::notify::ready(&format!("node {} running", config.node_name));
    let watchdog = skiff_daemon::notify::spawn_watchdog(|| true);
    manager
        .expect_sources(&sources)
        .run(src_rx, relist_rx, wake_rx, shutdown)
        .await;
    let _ = stop_tx.send(true);
    if let Some(w) = watchdog {
        w.abort();
    }
    pleg_task.abort();
    if let Some(t) = node_task {
        let _ = t.await;
    }
    tracing::info!("skiff-agent stopped; containers keep running");
    Ok(())
}

/// The Service and EndpointSlice watch, and what reads it: the service
/// proxy and the cluster DNS.
fn start_services<S, F>(
    config: &Config,
    client: &kube::Client,
    pod_cidr: watch::Receiver<Option<String>>,
    serve_dns: bool,
    stopped: &S,
) where
    S: Fn() -> F,
    F: Future<Output = ()> + Send + 'static,
{
    use skiff_proxy::{self as proxy, Mode, ProxyConfig};
    let (source, stores) = proxy::source::new(&config.node_name);
    tokio::spawn(source.run(client.clone(), stopped()));
    if config.proxy_mode != Mode::None {
        let proxy_config = ProxyConfig {
            mode: config.proxy_mode,
            node_name: config.node_name.clone(),
            min_sync_period: config.proxy_min_sync_period,
            sync_period: config.proxy_sync_period,
            healthz_bind_address: config.proxy_healthz_bind_address,
            metrics_bind_address: config.proxy_metrics_bind_address,
            // kube-proxy's /metrics serves its process's metrics: here the
            // agent's whole registry, the proxy's own among them.
            render_metrics: || crate::metrics::metrics().render(),
        };
        tokio::spawn(proxy::run(
            proxy_config,
            stores.clone(),
            pod_cidr.clone(),
            stopped(),
        ));
    }
    if serve_dns {
        let dns = skiff_dns::DnsConfig {
            domain: config.cluster_domain.clone(),
            resolv_conf: config.resolv_conf.clone(),
            ..Default::default()
        };
        tokio::spawn(skiff_dns::gateway::serve(
            dns,
            stores.services,
            stores.slices,
            pod_cidr,
            crate::network::gateway,
            stopped(),
        ));
    }
}

/// The certificate rotations this configuration asks for: the client
/// certificate when the kubeconfig names it as one file, the serving
/// certificate with `--rotate-server-certificates` (unless files are given).
fn rotators(
    config: &Config,
    api: &crate::apiclient::ApiClient,
    serving: Option<Arc<server::tls::ReloadingCert>>,
    facts: &Facts,
) -> Vec<Rotator> {
    use crate::certs::rotate::Kind;
    let mut out = Vec::new();
    let kubeconfig = api.reloader.kubeconfig();
    if config.rotate_certificates {
        match crate::certs::files::rotatable_client_file(kubeconfig) {
            Some(file) => out.push(Rotator::new(
                api.client.clone(),
                &config.node_name,
                file,
                Kind::Client(api.reloader.clone()),
            )),
            None => tracing::info!(
                kubeconfig = %kubeconfig.display(),
                "client certificate rotation off: the kubeconfig's credentials are inline or in separate files"
            ),
        }
    }
    if let (true, None, Some(cert)) = (
        config.rotate_server_certificates,
        &config.tls_cert_file,
        serving,
    ) {
        let mut dns = vec![config.node_name.clone()];
        if facts.hostname != config.node_name && !facts.hostname.is_empty() {
            dns.push(facts.hostname.clone());
        }
        out.push(Rotator::new(
            api.client.clone(),
            &config.node_name,
            server::tls::issued_serving_path(config),
            Kind::Serving {
                cert,
                dns,
                ips: facts.internal_ip.into_iter().collect(),
            },
        ));
    }
    out
}

/// Forward the file source's snapshots to the pod manager, keeping the
/// latest set of static pods for the mirror manager.
async fn tee_static_pods(
    source: FileSource,
    to_manager: mpsc::Sender<PodUpdate>,
    statics: watch::Sender<Vec<k8s_openapi::api::core::v1::Pod>>,
) {
    let (tx, mut rx) = mpsc::channel(4);
    tokio::spawn(source.run(tx));
    while let Some(update) = rx.recv().await {
        statics.send_replace(update.pods.clone());
        if to_manager.send(update).await.is_err() {
            return;
        }
    }
}
