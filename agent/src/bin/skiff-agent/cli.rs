//! Command-line flags; kubelet names where a kubelet flag exists.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "skiff-agent",
    version,
    about = "skiff node agent: runs pods through containerd's CRI",
    // A flag given twice takes its last value, as the kubelet's do (a
    // unit's ExecStart plus a drop-in's extra flags).
    args_override_self = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub run: RunFlags,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List this node's pods and their status (from the status endpoint).
    Pods {
        /// The agent's status endpoint.
        #[arg(long, default_value = "127.0.0.1:10255")]
        address: String,
        /// Output format: table or json.
        #[arg(short, long, default_value = "table")]
        output: String,
    },
    /// Join a cluster: check its CA against the token, make this node's
    /// key, and obtain its client certificate through a CSR.
    Join(JoinArgs),
    /// Install the agent as a systemd service: binary, config, join, unit
    /// (enabled and started).
    Install(InstallArgs),
    /// Stop and remove the service; --purge also removes the node's pods,
    /// state and credentials.
    Uninstall(UninstallArgs),
}

#[derive(Debug, clap::Args)]
pub struct JoinArgs {
    /// The API server, https://HOST:PORT.
    #[arg(long)]
    pub server: String,
    /// The join token from `skiff-server token create`.
    #[arg(long, env = "SKIFF_JOIN_TOKEN", hide_env_values = true)]
    pub token: String,
    /// This node's name (default: the hostname).
    #[arg(long)]
    pub node_name: Option<String>,
    /// Where the kubeconfig and the client certificate go.
    #[arg(long, default_value = skiff_agent::config::DEFAULT_CONFIG_DIR)]
    pub config_dir: PathBuf,
    /// Longest wait for the server and for the approval, e.g. 2m.
    #[arg(long, default_value = "5m")]
    pub timeout: String,
}

#[derive(Debug, clap::Args)]
pub struct InstallArgs {
    #[command(flatten)]
    pub join: JoinArgs,
    /// Install this config file as CONFIG_DIR/config.yaml (default: one
    /// with the containerd socket and both certificate rotations on).
    #[arg(long)]
    pub config_from: Option<PathBuf>,
    /// Where the binary is installed.
    #[arg(long, default_value = skiff_daemon::install::DEFAULT_BIN_DIR)]
    pub bin_dir: PathBuf,
    /// Where the unit file is installed.
    #[arg(long, default_value = skiff_daemon::install::DEFAULT_UNIT_DIR)]
    pub unit_dir: PathBuf,
    /// Enable the unit without starting it.
    #[arg(long)]
    pub no_start: bool,
}

#[derive(Debug, clap::Args)]
pub struct UninstallArgs {
    #[arg(long, default_value = skiff_agent::config::DEFAULT_CONFIG_DIR)]
    pub config_dir: PathBuf,
    #[arg(long, default_value = skiff_daemon::install::DEFAULT_BIN_DIR)]
    pub bin_dir: PathBuf,
    #[arg(long, default_value = skiff_daemon::install::DEFAULT_UNIT_DIR)]
    pub unit_dir: PathBuf,
    /// Also remove the node's pods and containers, its state and its
    /// credentials.
    #[arg(long)]
    pub purge: bool,
}

/// Flags of the agent itself; each overrides the config file.
#[derive(Debug, clap::Args)]
pub struct RunFlags {
    /// YAML config file (KubeletConfiguration-style field names) [default:
    /// CONFIG_DIR/config.yaml when it exists].
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Where `join` and `install` put the kubeconfig and config file; used
    /// when --kubeconfig / --config are not given.
    #[arg(long)]
    pub config_dir: Option<PathBuf>,
    /// Renew the client certificate through CSRs before it expires (true).
    #[arg(long)]
    pub rotate_certificates: Option<bool>,
    /// Obtain and renew the node server's certificate through CSRs.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub rotate_server_certificates: Option<bool>,
    /// Graceful node shutdown: delay shutdown this long to stop pods, e.g. 30s.
    #[arg(long)]
    pub shutdown_grace_period: Option<String>,
    /// The part of it kept for critical pods, which stop last, e.g. 10s.
    #[arg(long)]
    pub shutdown_grace_period_critical_pods: Option<String>,
    /// CRI endpoint, e.g. unix:///run/containerd/containerd.sock.
    #[arg(long)]
    pub container_runtime_endpoint: Option<String>,
    /// Directory for the agent's state.
    #[arg(long)]
    pub root_dir: Option<PathBuf>,
    /// Directory of static pod manifests (YAML or JSON Pods).
    #[arg(long)]
    pub static_pod_path: Option<PathBuf>,
    /// This node's name (default: the hostname).
    #[arg(long)]
    pub node_name: Option<String>,
    /// Root of container logs (/var/log/pods).
    #[arg(long)]
    pub pod_log_dir: Option<PathBuf>,
    /// Read-only status endpoint address, or "none".
    #[arg(long)]
    pub status_address: Option<String>,
    /// PLEG relist period, e.g. 1s.
    #[arg(long)]
    pub pleg_relist_period: Option<String>,
    /// Timeout of every CRI call but image pulls, e.g. 2m.
    #[arg(long)]
    pub runtime_request_timeout: Option<String>,
    /// First CrashLoopBackOff / ImagePullBackOff delay, e.g. 10s.
    #[arg(long)]
    pub crash_loop_back_off_initial: Option<String>,
    /// Longest back-off delay, e.g. 5m.
    #[arg(long)]
    pub crash_loop_back_off_max: Option<String>,
    /// Cluster DNS server IPs for ClusterFirst pods.
    #[arg(long, value_delimiter = ',')]
    pub cluster_dns: Option<Vec<String>>,
    /// Cluster domain (cluster.local).
    #[arg(long)]
    pub cluster_domain: Option<String>,
    /// How often every pod is re-synced without an event, e.g. 10s.
    #[arg(long)]
    pub sync_frequency: Option<String>,
    /// Kubeconfig with this node's credentials (system:node:NAME) [default:
    /// CONFIG_DIR/kubeconfig when it exists]; without one the agent runs
    /// standalone.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Register the Node object (true).
    #[arg(long)]
    pub register_node: Option<bool>,
    /// Labels for the Node at registration: key=value,...
    #[arg(long, value_delimiter = ',')]
    pub node_labels: Option<Vec<String>>,
    /// How often node status is checked and posted on change, e.g. 10s.
    #[arg(long)]
    pub node_status_update_frequency: Option<String>,
    /// Node status is posted at least this often, e.g. 5m.
    #[arg(long)]
    pub node_status_report_frequency: Option<String>,
    /// Node Lease duration in seconds (40); renewed every quarter of it.
    #[arg(long)]
    pub node_lease_duration_seconds: Option<u32>,
    /// This node's pod CIDR, when not assigned by the control plane.
    #[arg(long)]
    pub pod_cidr: Option<String>,
    /// Write the node's CNI configuration (bridge over the pod CIDR) here.
    #[arg(long)]
    pub cni_conf_dir: Option<PathBuf>,
    /// Bridge name for that CNI configuration (skiff0).
    #[arg(long)]
    pub cni_bridge: Option<String>,
    /// Address of the node server (HTTPS: logs, exec, port-forward,
    /// metrics, stats), 0.0.0.0 by default.
    #[arg(long)]
    pub address: Option<std::net::IpAddr>,
    /// Port of the node server (10250); 0 turns it off.
    #[arg(long)]
    pub port: Option<u16>,
    /// Serving certificate of the node server (PEM); self-signed under
    /// the root dir when unset.
    #[arg(long)]
    pub tls_cert_file: Option<PathBuf>,
    /// Private key of --tls-cert-file (PEM).
    #[arg(long)]
    pub tls_private_key_file: Option<PathBuf>,
    /// CA bundle that client certificates must chain to (defaults to the
    /// kubeconfig's cluster CA).
    #[arg(long)]
    pub client_ca_file: Option<PathBuf>,
    /// Rotate a container's log at this size, e.g. 10Mi (negative: never).
    #[arg(long, allow_hyphen_values = true)]
    pub container_log_max_size: Option<String>,
    /// Log files kept per container, the current one included (5).
    #[arg(long)]
    pub container_log_max_files: Option<u32>,
    /// How often container logs are checked for rotation, e.g. 10s.
    #[arg(long)]
    pub container_log_monitor_interval: Option<String>,
    /// Service proxy: nftables (default), iptables or none.
    #[arg(long)]
    pub proxy_mode: Option<String>,
    /// Proxy changes closer together than this share one sync (100ms).
    #[arg(long)]
    pub proxy_min_sync_period: Option<String>,
    /// How often the proxy rewrites all its rules (1h).
    #[arg(long)]
    pub proxy_sync_period: Option<String>,
    /// The proxy's /healthz address (0.0.0.0:10256), or "none".
    #[arg(long)]
    pub proxy_healthz_bind_address: Option<String>,
    /// The proxy's /metrics address (127.0.0.1:10249), or "none".
    #[arg(long)]
    pub proxy_metrics_bind_address: Option<String>,
    /// Serve cluster DNS on the pod network's gateway when --cluster-dns
    /// is not given (true).
    #[arg(long)]
    pub serve_cluster_dns: Option<bool>,
    /// The node's resolv.conf, whose nameservers answer names outside the
    /// cluster domain (/etc/resolv.conf).
    #[arg(long)]
    pub resolv_conf: Option<PathBuf>,
    /// Route other nodes' pod CIDRs through their addresses (true; only
    /// with --cni-conf-dir).
    #[arg(long)]
    pub pod_routes: Option<bool>,
    /// The node's InternalIP (default: the address the default route uses).
    #[arg(long)]
    pub node_ip: Option<std::net::IpAddr>,
    /// Remove the service proxy's rules (both modes) and exit, as
    /// kube-proxy --cleanup.
    #[arg(long)]
    pub cleanup: bool,
}
