//! skiff-agent: thin binary over the `skiff_agent` library.

mod cli;
mod install;
mod join;
mod pods;

use anyhow::{Context, Result};
use clap::Parser;
use skiff_agent::config::{parse_duration, parse_optional_addr, Config, FileConfig};

fn main() -> Result<()> {
    let cli = cli::Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    match cli.command {
        Some(cli::Command::Pods { address, output }) => rt.block_on(pods::run(&address, &output)),
        None if cli.run.cleanup => {
            init_logging();
            rt.block_on(async {
                use skiff_agent::proxy::{cleanup, Mode};
                cleanup(&[Mode::Nftables, Mode::Iptables])
                    .await
                    .context("removing the service proxy's rules")
            })?;
            tracing::info!("service proxy rules removed");
            Ok(())
        }
        Some(cli::Command::Join(args)) => {
            init_logging();
            rt.block_on(join::run(args))
        }
        Some(cli::Command::Install(args)) => {
            init_logging();
            rt.block_on(install::install(args))
        }
        Some(cli::Command::Uninstall(args)) => {
            init_logging();
            rt.block_on(install::uninstall(args))
        }
        None => {
            init_logging();
            let config = effective_config(cli.run)?;
            rt.block_on(async {
                skiff_agent::run(config, shutdown_signal())
                    .await
                    .context("skiff-agent failed")
            })
        }
    }
}

/// Journald-aware logs; the DNS server's per-query lines held back.
fn init_logging() {
    skiff_daemon::logging::init(&format!("info,{}", skiff_agent::dns::LOG_FILTER));
}

/// Defaults, then the config file, then flags; then what the config
/// directory holds (the joined kubeconfig) and the node name its
/// certificate is for.
fn effective_config(f: cli::RunFlags) -> Result<Config> {
    let mut c = Config::default();
    if let Some(dir) = &f.config_dir {
        c.config_dir = dir.clone();
    }
    let file = f.config.clone().or_else(|| {
        let p = c.config_dir.join(skiff_agent::config::CONFIG_FILE);
        p.exists().then_some(p)
    });
    let mut node_name_given = f.node_name.is_some();
    if let Some(path) = &file {
        let fc = FileConfig::load(path)?;
        node_name_given |= fc.node_name.is_some();
        fc.apply(&mut c).map_err(anyhow::Error::msg)?;
    }
    let dur = |name: &str, v: &Option<String>| -> Result<Option<std::time::Duration>> {
        v.as_deref()
            .map(parse_duration)
            .transpose()
            .map_err(|e| anyhow::anyhow!("--{name}: {e}"))
    };
    if let Some(v) = f.container_runtime_endpoint {
        c.container_runtime_endpoint = v;
    }
    if let Some(v) = f.root_dir {
        c.root_dir = v;
    }
    if let Some(v) = f.static_pod_path {
        c.static_pod_path = Some(v);
    }
    if let Some(v) = f.node_name {
        c.node_name = v.to_lowercase();
    }
    if let Some(v) = f.pod_log_dir {
        c.pod_log_dir = v;
    }
    if let Some(v) = f.status_address {
        c.status_address =
            parse_optional_addr(&v).map_err(|e| anyhow::anyhow!("--status-address: {e}"))?;
    }
    if let Some(v) = dur("pleg-relist-period", &f.pleg_relist_period)? {
        c.pleg_relist_period = v;
    }
    if let Some(v) = dur("runtime-request-timeout", &f.runtime_request_timeout)? {
        c.runtime_request_timeout = v;
    }
    if let Some(v) = dur(
        "crash-loop-back-off-initial",
        &f.crash_loop_back_off_initial,
    )? {
        c.backoff_initial = v;
    }
    if let Some(v) = dur("crash-loop-back-off-max", &f.crash_loop_back_off_max)? {
        c.backoff_max = v;
    }
    if let Some(v) = dur("sync-frequency", &f.sync_frequency)? {
        c.sync_frequency = v;
    }
    if let Some(v) = f.cluster_dns {
        c.cluster_dns = v;
    }
    if let Some(v) = f.cluster_domain {
        c.cluster_domain = v;
    }
    if let Some(v) = f.kubeconfig {
        c.kubeconfig = Some(v);
    }
    if let Some(v) = f.register_node {
        c.register_node = v;
    }
    if let Some(v) = f.node_labels {
        for kv in v {
            let (k, val) = kv
                .split_once('=')
                .ok_or_else(|| anyhow::anyhow!("--node-labels: {kv:?} is not key=value"))?;
            c.node_labels.insert(k.to_string(), val.to_string());
        }
    }
    if let Some(v) = dur(
        "node-status-update-frequency",
        &f.node_status_update_frequency,
    )? {
        c.node_status_update_frequency = v;
    }
    if let Some(v) = dur(
        "node-status-report-frequency",
        &f.node_status_report_frequency,
    )? {
        c.node_status_report_frequency = v;
    }
    if let Some(v) = f.node_lease_duration_seconds {
        c.node_lease_duration_seconds = v;
    }
    if let Some(v) = f.pod_cidr {
        c.pod_cidr = Some(v);
    }
    if let Some(v) = f.cni_conf_dir {
        c.cni_conf_dir = Some(v);
    }
    if let Some(v) = f.cni_bridge {
        c.cni_bridge = v;
    }
    if let Some(v) = f.address {
        c.address = v;
    }
    if let Some(v) = f.port {
        c.port = v;
    }
    if let Some(v) = f.tls_cert_file {
        c.tls_cert_file = Some(v);
    }
    if let Some(v) = f.tls_private_key_file {
        c.tls_private_key_file = Some(v);
    }
    if let Some(v) = f.client_ca_file {
        c.client_ca_file = Some(v);
    }
    if let Some(v) = f.container_log_max_size {
        c.container_log_max_size = skiff_agent::config::parse_log_max_size(&v)
            .map_err(|e| anyhow::anyhow!("--container-log-max-size: {e}"))?;
    }
    if let Some(v) = f.container_log_max_files {
        c.container_log_max_files = skiff_agent::config::check_log_max_files(v)
            .map_err(|e| anyhow::anyhow!("--container-log-max-files: {e}"))?;
    }
    if let Some(v) = dur(
        "container-log-monitor-interval",
        &f.container_log_monitor_interval,
    )? {
        c.container_log_monitor_interval = v;
    }
    if let Some(v) = f.proxy_mode {
        c.proxy_mode = v.parse().context("--proxy-mode")?;
    }
    if let Some(v) = dur("proxy-min-sync-period", &f.proxy_min_sync_period)? {
        c.proxy_min_sync_period = v;
    }
    if let Some(v) = dur("proxy-sync-period", &f.proxy_sync_period)? {
        c.proxy_sync_period = v;
    }
    if let Some(v) = f.proxy_healthz_bind_address {
        c.proxy_healthz_bind_address = parse_optional_addr(&v)
            .map_err(|e| anyhow::anyhow!("--proxy-healthz-bind-address: {e}"))?;
    }
    if let Some(v) = f.proxy_metrics_bind_address {
        c.proxy_metrics_bind_address = parse_optional_addr(&v)
            .map_err(|e| anyhow::anyhow!("--proxy-metrics-bind-address: {e}"))?;
    }
    if let Some(v) = f.serve_cluster_dns {
        c.serve_cluster_dns = v;
    }
    if let Some(v) = f.resolv_conf {
        c.resolv_conf = v;
    }
    if let Some(v) = f.pod_routes {
        c.pod_routes = v;
    }
    if let Some(v) = f.node_ip {
        c.node_ip = Some(v);
    }
    if let Some(v) = f.rotate_certificates {
        c.rotate_certificates = v;
    }
    if let Some(v) = f.rotate_server_certificates {
        c.rotate_server_certificates = v;
    }
    if let Some(v) = dur("shutdown-grace-period", &f.shutdown_grace_period)? {
        c.shutdown_grace_period = v;
    }
    if let Some(v) = dur(
        "shutdown-grace-period-critical-pods",
        &f.shutdown_grace_period_critical_pods,
    )? {
        c.shutdown_grace_period_critical_pods = v;
    }
    if c.kubeconfig.is_none() {
        let joined = skiff_agent::certs::join::kubeconfig_path(&c.config_dir);
        c.kubeconfig = joined.exists().then_some(joined);
    }
    // A node acts as the node its certificate names; a different
    // --node-name would only get every write refused.
    if let Some(node) = c
        .kubeconfig
        .as_deref()
        .and_then(skiff_agent::certs::files::node_name_of)
    {
        if !node_name_given {
            c.node_name = node;
        } else if node != c.node_name {
            anyhow::bail!(
                "--node-name {:?} does not match the kubeconfig's credentials, which are for node {node:?}",
                c.node_name
            );
        }
    }
    Ok(c)
}

/// SIGTERM or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    skiff_daemon::notify::stopping();
    tracing::info!("shutting down");
}
