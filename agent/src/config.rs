//! Agent configuration, in one layer as the kubelet's
//! KubeletConfiguration with flags on top: every setting is declared once,
//! in [`Settings`], which both the flags (clap) and the YAML file
//! (`--config`, serde) decode into. Flags are layered over the file with
//! [`Settings::or`] (flags win), and [`Settings::resolve`] fills in the
//! defaults to give the [`Config`] the agent runs with.
//!
//! YAML keys follow the kubelet's KubeletConfiguration where one exists
//! (`staticPodPath`, `containerRuntimeEndpoint`, ...), flags the kubelet's
//! flag names, so an operator's muscle memory carries over. Values are
//! checked as they are decoded, so a bad one names its flag or its key.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// Errors loading the configuration.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid YAML for the agent's configuration.
    #[error(
        "config file {path} is invalid: {source} (see `skiff-agent --help` for the field names)"
    )]
    Parse {
        path: PathBuf,
        #[source]
        source: Box<serde_saphyr::Error>,
    },
    /// `--node-name` names another node than the credentials do.
    #[error("--node-name {given:?} does not match the kubeconfig's credentials, which are for node {credentials:?}")]
    NodeName { given: String, credentials: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The default config directory.
pub const DEFAULT_CONFIG_DIR: &str = "/etc/skiff/agent";
/// containerd's CRI socket where Debian's package puts it.
pub const DEFAULT_RUNTIME_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";
/// Where the kubelet writes container logs.
pub const DEFAULT_POD_LOG_DIR: &str = "/var/log/pods";
/// k3s reads its `registries.yaml` from its own /etc directory too.
pub const DEFAULT_REGISTRIES_CONFIG: &str = "/etc/skiff/registries.yaml";
/// The config file `install` writes there.
pub const CONFIG_FILE: &str = "config.yaml";

/// How a flag's value layers over the file's: a given flag replaces the
/// file's value, except where a setting says otherwise ([`Labels`]).
pub trait Layer {
    fn or(self, under: Self) -> Self;
}

impl<T> Layer for Option<T> {
    fn or(self, under: Self) -> Self {
        Option::or(self, under)
    }
}

/// Declares [`Settings`] and its [`Settings::or`] from one field list, so
/// that adding a setting is adding one field.
macro_rules! settings {
    ($(#[$sm:meta])* pub struct Settings { $( $(#[$m:meta])* pub $field:ident: $ty:ty, )* }) => {
        $(#[$sm])*
        pub struct Settings { $( $(#[$m])* pub $field: $ty, )* }

        impl Settings {
            /// `self` layered over `under`: flags over the file.
            pub fn or(self, under: Settings) -> Settings {
                Settings { $( $field: Layer::or(self.$field, under.$field), )* }
            }
        }
    };
}

settings! {
    /// Every setting, each optional: what the flags and the YAML file say.
    /// The doc comment of a field is its flag's help; YAML-only settings
    /// have no flag (`arg(skip)`), flag-only ones no key (`serde(skip)`).
    #[derive(Debug, Clone, Default, clap::Args, Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    pub struct Settings {
        /// Where `join` and `install` put the kubeconfig and config file; used
        /// when --kubeconfig / --config are not given.
        #[arg(long)]
        #[serde(skip)]
        pub config_dir: Option<PathBuf>,
        /// Renew the client certificate through CSRs before it expires (true).
        #[arg(long)]
        pub rotate_certificates: Option<bool>,
        /// Obtain and renew the node server's certificate through CSRs.
        #[arg(long, num_args = 0..=1, default_missing_value = "true")]
        #[serde(rename = "serverTLSBootstrap")]
        pub rotate_server_certificates: Option<bool>,
        /// Graceful node shutdown: delay shutdown this long to stop pods, e.g. 30s.
        #[arg(long, value_parser = parse_duration)]
        #[serde(default, deserialize_with = "duration")]
        pub shutdown_grace_period: Option<Duration>,
        /// The part of it kept for critical pods, which stop last, e.g. 10s.
        #[arg(long, value_parser = parse_duration)]
        #[serde(default, deserialize_with = "duration")]
        pub shutdown_grace_period_critical_pods: Option<Duration>,
        /// CRI endpoint, e.g. unix:///run/containerd/containerd.sock.
        #[arg(long)]
        pub container_runtime_endpoint: Option<String>,
        /// Directory for the agent's state.
        #[arg(long)]
        pub root_dir: Option<PathBuf>,
        /// Directory of the local-path volumes on this node, an absolute
        /// path (ROOT_DIR/local-path).
        #[arg(long, value_parser = absolute_path)]
        #[serde(default, deserialize_with = "absolute")]
        pub local_path_root: Option<PathBuf>,
        /// Directory of static pod manifests (YAML or JSON Pods).
        #[arg(long)]
        pub static_pod_path: Option<PathBuf>,
        /// This node's name (default: the hostname).
        #[arg(long, value_parser = lowercase)]
        pub node_name: Option<String>,
        /// Root of container logs (/var/log/pods).
        #[arg(long)]
        pub pod_log_dir: Option<PathBuf>,
        /// Read-only status endpoint address, or "none".
        #[arg(long)]
        #[serde(default, deserialize_with = "from_str")]
        pub status_address: Option<OptionalAddr>,
        /// PLEG relist period, e.g. 1s.
        #[arg(long, value_parser = parse_duration)]
        #[serde(default, deserialize_with = "duration")]
        pub pleg_relist_period: Option<Duration>,
        /// Timeout of every CRI call but image pulls, e.g. 2m.
        #[arg(long, value_parser = parse_duration)]
        #[serde(default, deserialize_with = "duration")]
        pub runtime_request_timeout: Option<Duration>,
        /// Timeout of an image pull.
        #[arg(skip)]
        #[serde(default, deserialize_with = "duration")]
        pub image_pull_timeout: Option<Duration>,
        /// First CrashLoopBackOff / ImagePullBackOff delay, e.g. 10s.
        #[arg(long = "crash-loop-back-off-initial", value_name = "CRASH_LOOP_BACK_OFF_INITIAL", value_parser = parse_duration)]
        #[serde(rename = "crashLoopBackOffInitial", default, deserialize_with = "duration")]
        pub backoff_initial: Option<Duration>,
        /// Longest back-off delay, e.g. 5m.
        #[arg(long = "crash-loop-back-off-max", value_name = "CRASH_LOOP_BACK_OFF_MAX", value_parser = parse_duration)]
        #[serde(rename = "crashLoopBackOffMax", default, deserialize_with = "duration")]
        pub backoff_max: Option<Duration>,
        /// A container that ran this long without failing resets its back-off.
        #[arg(skip)]
        #[serde(rename = "crashLoopBackOffReset", default, deserialize_with = "duration")]
        pub backoff_reset: Option<Duration>,
        /// Cluster DNS server IPs for ClusterFirst pods.
        #[arg(long, value_delimiter = ',')]
        #[serde(rename = "clusterDNS")]
        pub cluster_dns: Option<Vec<String>>,
        /// Unsafe sysctls (names or prefixes ending in `*`) pods may set, comma-separated.
        #[arg(long, value_delimiter = ',')]
        pub allowed_unsafe_sysctls: Option<Vec<String>>,
        /// Cluster domain (cluster.local).
        #[arg(long)]
        pub cluster_domain: Option<String>,
        /// Most pods the node runs.
        #[arg(skip)]
        pub max_pods: Option<u32>,
        /// How often every pod is re-synced without an event, e.g. 10s.
        #[arg(long, value_parser = parse_duration)]
        #[serde(default, deserialize_with = "duration")]
        pub sync_frequency: Option<Duration>,
        /// Kubeconfig with this node's credentials (system:node:NAME) [default:
        /// CONFIG_DIR/kubeconfig when it exists]; without one the agent runs
        /// standalone.
        #[arg(long)]
        pub kubeconfig: Option<PathBuf>,
        /// Register the Node object (true).
        #[arg(long)]
        pub register_node: Option<bool>,
        /// Labels for the Node at registration: key=value,...
        #[arg(long, default_value = "", hide_default_value = true)]
        #[serde(default)]
        pub node_labels: Labels,
        /// How often node status is checked and posted on change, e.g. 10s.
        #[arg(long, value_parser = parse_duration)]
        #[serde(default, deserialize_with = "duration")]
        pub node_status_update_frequency: Option<Duration>,
        /// Node status is posted at least this often, e.g. 5m.
        #[arg(long, value_parser = parse_duration)]
        #[serde(default, deserialize_with = "duration")]
        pub node_status_report_frequency: Option<Duration>,
        /// Node Lease duration in seconds (40); renewed every quarter of it.
        #[arg(long)]
        pub node_lease_duration_seconds: Option<u32>,
        /// This node's pod CIDR, when not assigned by the control plane.
        #[arg(long)]
        #[serde(rename = "podCIDR")]
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
        pub address: Option<IpAddr>,
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
        #[serde(rename = "clientCAFile")]
        pub client_ca_file: Option<PathBuf>,
        /// Rotate a container's log at this size, e.g. 10Mi (negative: never).
        #[arg(long, allow_hyphen_values = true)]
        #[serde(default, deserialize_with = "from_str")]
        pub container_log_max_size: Option<LogMaxSize>,
        /// Log files kept per container, the current one included (5).
        #[arg(long)]
        #[serde(default, deserialize_with = "log_max_files")]
        pub container_log_max_files: Option<LogMaxFiles>,
        /// How often container logs are checked for rotation, e.g. 10s.
        #[arg(long, value_parser = parse_duration)]
        #[serde(default, deserialize_with = "duration")]
        pub container_log_monitor_interval: Option<Duration>,
        /// Hard eviction thresholds, e.g. memory.available<100Mi,nodefs.available<10%
        /// (upstream's defaults; empty: none).
        #[arg(long)]
        pub eviction_hard: Option<SignalMap>,
        /// Soft eviction thresholds, e.g. memory.available<1Gi (each with a grace period).
        #[arg(long)]
        pub eviction_soft: Option<SignalMap>,
        /// How long each soft threshold must hold, e.g. memory.available=1m30s.
        #[arg(long)]
        pub eviction_soft_grace_period: Option<SignalMap>,
        /// Reclaimed beyond a threshold before pressure ends, e.g. nodefs.available=500Mi.
        #[arg(long)]
        pub eviction_minimum_reclaim: Option<SignalMap>,
        /// How long a pressure condition stays after its threshold is no longer met (5m).
        #[arg(long, value_parser = parse_duration)]
        #[serde(default, deserialize_with = "duration")]
        pub eviction_pressure_transition_period: Option<Duration>,
        /// Longest grace period (seconds) given to pods evicted for a soft threshold.
        #[arg(long, allow_hyphen_values = true)]
        pub eviction_max_pod_grace_period: Option<i64>,
        /// Image file system usage (percent) at which unused images are
        /// removed (85; 100: never by usage).
        #[arg(long = "image-gc-high-threshold")]
        #[serde(rename = "imageGCHighThresholdPercent")]
        pub image_gc_high_threshold_percent: Option<u8>,
        /// Usage (percent) that image garbage collection frees down to (80).
        #[arg(long = "image-gc-low-threshold")]
        #[serde(rename = "imageGCLowThresholdPercent")]
        pub image_gc_low_threshold_percent: Option<u8>,
        /// An image is never removed before it was seen this long, e.g. 2m.
        #[arg(long, value_parser = parse_duration)]
        #[serde(default, rename = "imageMinimumGCAge", deserialize_with = "duration")]
        pub image_minimum_gc_age: Option<Duration>,
        /// Remove images unused this long whatever the usage (0: off).
        #[arg(long, value_parser = parse_duration)]
        #[serde(default, rename = "imageMaximumGCAge", deserialize_with = "duration")]
        pub image_maximum_gc_age: Option<Duration>,
        /// Image archives (tar, .tar.gz, .tar.zst) dropped here are imported
        /// into the runtime (ROOT_DIR/images).
        #[arg(long)]
        pub image_import_dir: Option<PathBuf>,
        /// Registry mirrors, logins and TLS in k3s's registries.yaml
        /// format (/etc/skiff/registries.yaml; empty: none).
        #[arg(long, value_parser = path_or_empty)]
        pub registries_config: Option<PathBuf>,
        /// How often images are collected (5m, the kubelet's fixed period).
        #[arg(long, value_parser = parse_duration)]
        #[serde(default, rename = "imageGCPeriod", deserialize_with = "duration")]
        pub image_gc_period: Option<Duration>,
        /// Service proxy: nftables (default), iptables or none.
        #[arg(long)]
        #[serde(default, deserialize_with = "from_str")]
        pub proxy_mode: Option<skiff_proxy::Mode>,
        /// Proxy changes closer together than this share one sync (100ms).
        #[arg(long, value_parser = parse_duration)]
        #[serde(default, deserialize_with = "duration")]
        pub proxy_min_sync_period: Option<Duration>,
        /// How often the proxy rewrites all its rules (1h).
        #[arg(long, value_parser = parse_duration)]
        #[serde(default, deserialize_with = "duration")]
        pub proxy_sync_period: Option<Duration>,
        /// The proxy's /healthz address (0.0.0.0:10256), or "none".
        #[arg(long)]
        #[serde(default, deserialize_with = "from_str")]
        pub proxy_healthz_bind_address: Option<OptionalAddr>,
        /// The proxy's /metrics address (127.0.0.1:10249), or "none".
        #[arg(long)]
        #[serde(default, deserialize_with = "from_str")]
        pub proxy_metrics_bind_address: Option<OptionalAddr>,
        /// Serve cluster DNS on the pod network's gateway when --cluster-dns
        /// is not given (true).
        #[arg(long)]
        #[serde(rename = "serveClusterDNS")]
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
        #[serde(rename = "nodeIP")]
        pub node_ip: Option<IpAddr>,
    }
}

impl Settings {
    /// Read a YAML config file.
    ///
    /// # Errors
    /// Unreadable file, bad YAML, unknown keys or a bad value.
    pub fn from_file(path: &Path) -> Result<Settings> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.to_owned(),
            source,
        })?;
        serde_saphyr::from_str(&text).map_err(|e| Error::Parse {
            path: path.to_owned(),
            source: Box::new(e),
        })
    }

    /// The configuration these settings give, defaults filled in: the one
    /// place defaults are written.
    pub fn resolve(self) -> Config {
        let secs = Duration::from_secs;
        let addr = |a: Option<OptionalAddr>, default: SocketAddr| a.map_or(Some(default), |a| a.0);
        let root_dir: PathBuf = self
            .root_dir
            .unwrap_or_else(|| "/var/lib/skiff-agent".into());
        let image_import_dir = self
            .image_import_dir
            .unwrap_or_else(|| root_dir.join("images"));
        Config {
            image_import_dir,
            registries_config: match self.registries_config {
                None => Some(DEFAULT_REGISTRIES_CONFIG.into()),
                Some(p) if p.as_os_str().is_empty() => None,
                Some(p) => Some(p),
            },
            node_name: self.node_name.unwrap_or_else(default_node_name),
            local_path_root: self.local_path_root.unwrap_or_else(|| {
                // Announced to the control plane, which joins volume
                // paths under it: always absolute.
                std::path::absolute(&root_dir)
                    .unwrap_or_else(|_| root_dir.clone())
                    .join("local-path")
            }),
            container_runtime_endpoint: self
                .container_runtime_endpoint
                .unwrap_or_else(|| DEFAULT_RUNTIME_ENDPOINT.into()),
            root_dir,
            pod_log_dir: self
                .pod_log_dir
                .unwrap_or_else(|| DEFAULT_POD_LOG_DIR.into()),
            static_pod_path: self.static_pod_path,
            pleg_relist_period: self.pleg_relist_period.unwrap_or(secs(1)),
            runtime_request_timeout: self.runtime_request_timeout.unwrap_or(secs(120)),
            image_pull_timeout: self.image_pull_timeout.unwrap_or(secs(300)),
            backoff_initial: self.backoff_initial.unwrap_or(secs(10)),
            backoff_max: self.backoff_max.unwrap_or(secs(300)),
            backoff_reset: self.backoff_reset.unwrap_or(secs(600)),
            status_address: addr(self.status_address, ([127, 0, 0, 1], 10255).into()),
            cluster_dns: self.cluster_dns.unwrap_or_default(),
            allowed_unsafe_sysctls: self.allowed_unsafe_sysctls.unwrap_or_default(),
            cluster_domain: self
                .cluster_domain
                .unwrap_or_else(|| "cluster.local".into()),
            max_pods: self.max_pods.unwrap_or(110),
            sync_frequency: self.sync_frequency.unwrap_or(secs(10)),
            kubeconfig: self.kubeconfig,
            register_node: self.register_node.unwrap_or(true),
            node_labels: self.node_labels.0,
            node_status_update_frequency: self.node_status_update_frequency.unwrap_or(secs(10)),
            node_status_report_frequency: self.node_status_report_frequency.unwrap_or(secs(300)),
            node_lease_duration_seconds: self.node_lease_duration_seconds.unwrap_or(40),
            pod_cidr: self.pod_cidr,
            cni_conf_dir: self.cni_conf_dir,
            cni_bridge: self.cni_bridge.unwrap_or_else(|| "skiff0".into()),
            address: self.address.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
            port: self.port.unwrap_or(10250),
            tls_cert_file: self.tls_cert_file,
            tls_private_key_file: self.tls_private_key_file,
            client_ca_file: self.client_ca_file,
            container_log_max_size: self.container_log_max_size.map_or(Some(10 << 20), |s| s.0),
            container_log_max_files: self.container_log_max_files.map_or(5, |n| n.0),
            container_log_monitor_interval: self.container_log_monitor_interval.unwrap_or(secs(10)),
            image_gc: {
                let d = crate::images::gc::Policy::default();
                crate::images::gc::Policy {
                    high_threshold_percent: self
                        .image_gc_high_threshold_percent
                        .unwrap_or(d.high_threshold_percent),
                    low_threshold_percent: self
                        .image_gc_low_threshold_percent
                        .unwrap_or(d.low_threshold_percent),
                    min_age: self.image_minimum_gc_age.unwrap_or(d.min_age),
                    max_age: self.image_maximum_gc_age.unwrap_or(d.max_age),
                }
            },
            image_gc_period: self.image_gc_period.unwrap_or(secs(300)),
            eviction_hard: self
                .eviction_hard
                .map_or_else(crate::eviction::thresholds::default_hard, |m| m.0),
            eviction_soft: self.eviction_soft.map(|m| m.0).unwrap_or_default(),
            eviction_soft_grace_period: self
                .eviction_soft_grace_period
                .map(|m| m.0)
                .unwrap_or_default(),
            eviction_minimum_reclaim: self
                .eviction_minimum_reclaim
                .map(|m| m.0)
                .unwrap_or_default(),
            eviction_pressure_transition_period: self
                .eviction_pressure_transition_period
                .unwrap_or(secs(300)),
            eviction_max_pod_grace_period: self.eviction_max_pod_grace_period.unwrap_or(0),
            proxy_mode: self.proxy_mode.unwrap_or(skiff_proxy::Mode::Nftables),
            proxy_min_sync_period: self
                .proxy_min_sync_period
                .unwrap_or(Duration::from_millis(100)),
            proxy_sync_period: self.proxy_sync_period.unwrap_or(secs(3600)),
            proxy_healthz_bind_address: addr(
                self.proxy_healthz_bind_address,
                ([0, 0, 0, 0], 10256).into(),
            ),
            proxy_metrics_bind_address: addr(
                self.proxy_metrics_bind_address,
                ([127, 0, 0, 1], 10249).into(),
            ),
            serve_cluster_dns: self.serve_cluster_dns.unwrap_or(true),
            resolv_conf: self
                .resolv_conf
                .unwrap_or_else(|| "/etc/resolv.conf".into()),
            pod_routes: self.pod_routes.unwrap_or(true),
            node_ip: self.node_ip,
            config_dir: self.config_dir.unwrap_or_else(|| DEFAULT_CONFIG_DIR.into()),
            rotate_certificates: self.rotate_certificates.unwrap_or(true),
            rotate_server_certificates: self.rotate_server_certificates.unwrap_or(false),
            shutdown_grace_period: self.shutdown_grace_period.unwrap_or_default(),
            shutdown_grace_period_critical_pods: self
                .shutdown_grace_period_critical_pods
                .unwrap_or_default(),
        }
    }
}

/// The effective configuration of a running agent (see [`Settings`] for
/// what each setting means to an operator).
#[derive(Debug, Clone)]
pub struct Config {
    pub node_name: String,
    pub container_runtime_endpoint: String,
    pub root_dir: PathBuf,
    /// Where local-path volumes live on this node (announced on the Node
    /// as `skiff.io/local-path-root`); absolute.
    pub local_path_root: PathBuf,
    pub pod_log_dir: PathBuf,
    pub static_pod_path: Option<PathBuf>,
    /// How often the PLEG relists the runtime when no event stream exists.
    pub pleg_relist_period: Duration,
    /// Timeout for every CRI call except image pulls.
    pub runtime_request_timeout: Duration,
    pub image_pull_timeout: Duration,
    /// CrashLoopBackOff / ImagePullBackOff: first delay, doubling up to max.
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// A container that ran this long without failing resets its back-off.
    pub backoff_reset: Duration,
    /// Read-only status endpoint (`/pods`, `/node`, `/healthz`), the
    /// kubelet's read-only port.
    pub status_address: Option<SocketAddr>,
    pub cluster_dns: Vec<String>,
    /// Sysctls outside the safe set that pods may still set (the kubelet's
    /// `--allowed-unsafe-sysctls`); others are refused at admission.
    pub allowed_unsafe_sysctls: Vec<String>,
    pub cluster_domain: String,
    pub max_pods: u32,
    /// How often every pod is re-synced even without an event.
    pub sync_frequency: Duration,
    /// Credentials of `system:node:NAME`; without one the agent runs
    /// standalone (static pods only).
    pub kubeconfig: Option<PathBuf>,
    /// Register the Node object when joined to an API server.
    pub register_node: bool,
    /// Extra labels for the Node at registration.
    pub node_labels: BTreeMap<String, String>,
    /// How often node status is computed and posted when it changed.
    pub node_status_update_frequency: Duration,
    /// Node status is posted at least this often even when unchanged.
    pub node_status_report_frequency: Duration,
    /// The Lease's duration; it is renewed every quarter of it (10 s).
    pub node_lease_duration_seconds: u32,
    /// This node's pod CIDR when set by hand (`--pod-cidr`); otherwise the
    /// Node's `spec.podCIDR` from the API.
    pub pod_cidr: Option<String>,
    /// When set, the agent writes the node's CNI configuration (a bridge
    /// over its pod CIDR) into this directory.
    pub cni_conf_dir: Option<PathBuf>,
    /// Bridge name for that CNI configuration.
    pub cni_bridge: String,
    /// The node server (logs, exec, attach, port-forward, metrics, stats;
    /// HTTPS with client certificates): its address and port. Port 0
    /// turns it off.
    pub address: IpAddr,
    pub port: u16,
    /// The serving certificate and key; when unset, a self-signed pair is
    /// generated once under `root_dir/pki` (as the kubelet does).
    pub tls_cert_file: Option<PathBuf>,
    pub tls_private_key_file: Option<PathBuf>,
    /// CA bundle that client certificates must chain to; defaults to the
    /// CA of the kubeconfig's cluster.
    pub client_ca_file: Option<PathBuf>,
    /// A container's log is rotated once it reaches this many bytes
    /// (containerLogMaxSize, 10Mi); None (a negative size) never rotates.
    pub container_log_max_size: Option<u64>,
    /// Log files kept per container, the current one included
    /// (containerLogMaxFiles, 5; at least 2).
    pub container_log_max_files: u32,
    /// How often logs are checked for rotation
    /// (containerLogMonitorInterval, 10s).
    pub container_log_monitor_interval: Duration,
    /// When unused images are removed (checked at start).
    pub image_gc: crate::images::gc::Policy,
    /// How often the image collector runs.
    pub image_gc_period: Duration,
    /// Archives here are imported into the runtime.
    pub image_import_dir: PathBuf,
    /// The registries file (mirrors, logins, TLS); None: not read.
    pub registries_config: Option<PathBuf>,
    /// Eviction thresholds by signal name (`evictionHard`...), parsed and
    /// checked by [`crate::eviction::Settings::from_config`] at start.
    pub eviction_hard: BTreeMap<String, String>,
    pub eviction_soft: BTreeMap<String, String>,
    pub eviction_soft_grace_period: BTreeMap<String, String>,
    pub eviction_minimum_reclaim: BTreeMap<String, String>,
    pub eviction_pressure_transition_period: Duration,
    pub eviction_max_pod_grace_period: i64,
    /// The service proxy: nftables (default), iptables or none.
    pub proxy_mode: skiff_proxy::Mode,
    /// Changes closer together than this share one proxy sync.
    pub proxy_min_sync_period: Duration,
    /// How often the proxy rewrites everything, repairing tampering.
    pub proxy_sync_period: Duration,
    /// The proxy's `/healthz` (kube-proxy's 0.0.0.0:10256); None: off.
    pub proxy_healthz_bind_address: Option<SocketAddr>,
    /// The proxy's `/metrics` (kube-proxy's 127.0.0.1:10249); None: off.
    pub proxy_metrics_bind_address: Option<SocketAddr>,
    /// Serve the cluster DNS on the pod network's gateway address, and
    /// point ClusterFirst pods at it, when `cluster_dns` is not set.
    pub serve_cluster_dns: bool,
    /// The node's resolv.conf (the kubelet's `--resolv-conf`): upstream
    /// resolvers for names outside the cluster domain.
    pub resolv_conf: PathBuf,
    /// Route the other nodes' pod CIDRs through their addresses (when the
    /// agent writes the CNI configuration).
    pub pod_routes: bool,
    /// The node's InternalIP (the kubelet's `--node-ip`); by default the
    /// address of the interface the default route leaves by.
    pub node_ip: Option<IpAddr>,
    /// Where `skiff-agent join` put the kubeconfig (and `install` the
    /// config file): used when `--kubeconfig` / `--config` are not given.
    pub config_dir: PathBuf,
    /// Renew the client certificate through CSRs before it expires
    /// (rotateCertificates), when the kubeconfig names it as one file.
    pub rotate_certificates: bool,
    /// Obtain and renew the node server's serving certificate through CSRs
    /// (serverTLSBootstrap) instead of a self-signed one.
    pub rotate_server_certificates: bool,
    /// Graceful node shutdown (shutdownGracePeriod): how long shutdown is
    /// delayed to stop pods; zero turns it off.
    pub shutdown_grace_period: Duration,
    /// The part of it reserved for critical pods, which stop last
    /// (shutdownGracePeriodCriticalPods).
    pub shutdown_grace_period_critical_pods: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Settings::default().resolve()
    }
}

impl Config {
    /// The agent's configuration from its flags: the config file
    /// (`config`, else `CONFIG_DIR/config.yaml` when it exists) under the
    /// flags, defaults under both; then what the config directory holds
    /// (the joined kubeconfig) and the node name its certificate is for.
    ///
    /// # Errors
    /// The file cannot be read or has a bad value, or `--node-name` names
    /// another node than the credentials.
    pub fn load(flags: Settings, config: Option<&Path>) -> Result<Config> {
        let dir = flags
            .config_dir
            .clone()
            .unwrap_or_else(|| DEFAULT_CONFIG_DIR.into());
        let file = config.map(Path::to_path_buf).or_else(|| {
            let p = dir.join(CONFIG_FILE);
            p.exists().then_some(p)
        });
        let settings = match &file {
            Some(path) => flags.or(Settings::from_file(path)?),
            None => flags,
        };
        let node_name_given = settings.node_name.is_some();
        let mut c = settings.resolve();
        if c.kubeconfig.is_none() {
            let joined = crate::certs::join::kubeconfig_path(&c.config_dir);
            c.kubeconfig = joined.exists().then_some(joined);
        }
        // A node acts as the node its certificate names; a different
        // --node-name would only get every write refused.
        if let Some(node) = c
            .kubeconfig
            .as_deref()
            .and_then(crate::certs::files::node_name_of)
        {
            if !node_name_given {
                c.node_name = node;
            } else if node != c.node_name {
                return Err(Error::NodeName {
                    given: c.node_name,
                    credentials: node,
                });
            }
        }
        Ok(c)
    }
}

/// An address, or none: `""` or `none` disables the endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionalAddr(pub Option<SocketAddr>);

impl FromStr for OptionalAddr {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        parse_optional_addr(s).map(OptionalAddr)
    }
}

/// containerLogMaxSize in bytes; None (a negative size) never rotates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogMaxSize(pub Option<u64>);

impl FromStr for LogMaxSize {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        parse_log_max_size(s).map(LogMaxSize)
    }
}

/// containerLogMaxFiles, checked to be at least 2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogMaxFiles(pub u32);

impl FromStr for LogMaxFiles {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let n: u32 = s
            .parse()
            .map_err(|e| format!("invalid container log max files {s:?}: {e}"))?;
        check_log_max_files(n).map(LogMaxFiles)
    }
}

/// Values by eviction signal: a YAML map, or on the command line
/// `signal<value,...` (thresholds) or `signal=value,...` (grace periods,
/// minimum reclaims); empty is none.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct SignalMap(pub BTreeMap<String, String>);

impl FromStr for SignalMap {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let mut out = BTreeMap::new();
        for kv in s.split(',').map(str::trim).filter(|kv| !kv.is_empty()) {
            let (k, v) = kv
                .split_once('<')
                .or_else(|| kv.split_once('='))
                .ok_or_else(|| format!("{kv:?} is not signal<value or signal=value"))?;
            out.insert(k.trim().to_string(), v.trim().to_string());
        }
        Ok(SignalMap(out))
    }
}

/// The Node's extra labels. A flag's labels are added to the file's (and
/// win for the same key) rather than replacing them all.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Labels(pub BTreeMap<String, String>);

impl FromStr for Labels {
    type Err = String;
    /// `key=value,...`; empty is none.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let mut out = BTreeMap::new();
        for kv in s.split(',').filter(|kv| !kv.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("{kv:?} is not key=value"))?;
            out.insert(k.to_string(), v.to_string());
        }
        Ok(Labels(out))
    }
}

impl Layer for Labels {
    fn or(self, under: Self) -> Self {
        let mut all = under.0;
        all.extend(self.0);
        Labels(all)
    }
}

/// `--local-path-root`: the control plane joins volume paths under it,
/// so a relative one would mean another directory on every node.
fn absolute_path(s: &str) -> std::result::Result<PathBuf, String> {
    let p = PathBuf::from(s);
    if p.is_absolute() {
        Ok(p)
    } else {
        Err(format!("{s:?} is not an absolute path"))
    }
}

/// localPathRoot in the config file: absolute, as the flag.
fn absolute<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Option<PathBuf>, D::Error> {
    match Option::<String>::deserialize(d)? {
        Some(s) => absolute_path(&s)
            .map(Some)
            .map_err(serde::de::Error::custom),
        None => Ok(None),
    }
}

/// `--node-name` as the kubelet takes it: lowercased.
fn lowercase(s: &str) -> std::result::Result<String, std::convert::Infallible> {
    Ok(s.to_lowercase())
}

/// A YAML string decoded with the type's `FromStr`.
fn from_str<'de, D, T>(d: D) -> std::result::Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr,
    T::Err: std::fmt::Display,
{
    match Option::<String>::deserialize(d)? {
        Some(s) => s.parse().map(Some).map_err(serde::de::Error::custom),
        None => Ok(None),
    }
}

/// containerLogMaxFiles is a YAML number.
fn log_max_files<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<LogMaxFiles>, D::Error> {
    match Option::<u32>::deserialize(d)? {
        Some(n) => check_log_max_files(n)
            .map(|n| Some(LogMaxFiles(n)))
            .map_err(serde::de::Error::custom),
        None => Ok(None),
    }
}

/// A duration written the Kubernetes way (`300ms`, `10s`, `5m`, `1h30m`),
/// or plain seconds.
fn duration<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Option<Duration>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Secs(u64),
        Text(String),
    }
    match Option::<Raw>::deserialize(d)? {
        None => Ok(None),
        Some(Raw::Secs(s)) => Ok(Some(Duration::from_secs(s))),
        Some(Raw::Text(t)) => parse_duration(&t)
            .map(Some)
            .map_err(serde::de::Error::custom),
    }
}

/// containerLogMaxSize: a quantity (`10Mi`, `500Ki`, `1G`, `4096`); a
/// negative one turns rotation off, as in the kubelet.
pub fn parse_log_max_size(s: &str) -> std::result::Result<Option<u64>, String> {
    let s = s.trim();
    if s.starts_with('-') {
        return Ok(None);
    }
    let invalid = || format!("invalid container log max size {s:?}: expected e.g. 10Mi, 500Ki, 1G");
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let mult: u64 = match suffix {
        "" => 1,
        "k" => 1000,
        "M" => 1000_u64.pow(2),
        "G" => 1000_u64.pow(3),
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        _ => return Err(invalid()),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .map(Some)
        .ok_or_else(invalid)
}

/// containerLogMaxFiles must leave room for the current and one rotated file.
pub fn check_log_max_files(n: u32) -> std::result::Result<u32, String> {
    if n < 2 {
        return Err(format!(
            "invalid container log max files {n}: must be at least 2"
        ));
    }
    Ok(n)
}

/// `""` or `none` disables the endpoint.
pub fn parse_optional_addr(s: &str) -> std::result::Result<Option<SocketAddr>, String> {
    if s.is_empty() || s == "none" {
        return Ok(None);
    }
    s.parse()
        .map(Some)
        .map_err(|e| format!("invalid address {s:?}: {e} (expected HOST:PORT, or none)"))
}

/// A path where an empty value means "none" (clap's own path parser
/// refuses an empty value).
fn path_or_empty(s: &str) -> std::result::Result<PathBuf, std::convert::Infallible> {
    Ok(PathBuf::from(s))
}

/// A Go duration (`10s`, `1h30m`, `250ms`) or plain seconds, as the
/// kubelet's flags and KubeletConfiguration take them (clap wants the error
/// as text).
pub fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    kube_util::duration::parse_duration_or_seconds(s).map_err(|e| e.to_string())
}

/// The kubelet's default node name: the hostname, lowercased.
pub fn default_node_name() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".into())
        .to_lowercase()
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn file(yaml: &str) -> Settings {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        settings: Settings,
    }

    fn flags(args: &[&str]) -> Settings {
        let argv = std::iter::once("skiff-agent").chain(args.iter().copied());
        Flags::try_parse_from(argv).unwrap().settings
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("7").unwrap(), Duration::from_secs(7));
        assert!(parse_duration("10x").is_err());
        assert!(parse_duration("s").is_err());
    }

    #[test]
    fn file_overlays_defaults_and_rejects_unknown_fields() {
        let c = file("staticPodPath: /etc/pods\ncrashLoopBackOffInitial: 1s\nstatusAddress: none\nsyncFrequency: 3\n")
            .resolve();
        assert_eq!(c.static_pod_path.as_deref(), Some(Path::new("/etc/pods")));
        assert_eq!(c.backoff_initial, Duration::from_secs(1));
        assert_eq!(c.sync_frequency, Duration::from_secs(3));
        assert_eq!(c.status_address, None);
        assert!(serde_saphyr::from_str::<Settings>("staticPodPth: x").is_err());
        // Flag-only settings are no keys.
        assert!(serde_saphyr::from_str::<Settings>("configDir: /x").is_err());
    }

    #[test]
    fn proxy_dns_and_network_settings() {
        let c = Config::default();
        assert_eq!(c.proxy_mode, skiff_proxy::Mode::Nftables);
        assert_eq!(
            c.proxy_healthz_bind_address,
            Some(SocketAddr::from(([0, 0, 0, 0], 10256)))
        );
        let c = file(
            "proxyMode: iptables\nproxyMinSyncPeriod: 1s\nproxyHealthzBindAddress: none\nproxyMetricsBindAddress: 0.0.0.0:9249\nserveClusterDNS: false\nresolvConf: /run/resolv.conf\npodRoutes: false\nnodeIP: 198.18.0.9\n",
        )
        .resolve();
        assert_eq!(c.proxy_mode, skiff_proxy::Mode::Iptables);
        assert_eq!(c.proxy_min_sync_period, Duration::from_secs(1));
        assert_eq!(c.proxy_healthz_bind_address, None);
        assert_eq!(
            c.proxy_metrics_bind_address,
            Some(SocketAddr::from(([0, 0, 0, 0], 9249)))
        );
        assert!(!c.serve_cluster_dns && !c.pod_routes);
        assert_eq!(c.resolv_conf, Path::new("/run/resolv.conf"));
        assert_eq!(c.node_ip, Some("198.18.0.9".parse().unwrap()));
        let err = serde_saphyr::from_str::<Settings>("proxyMode: ipvs").unwrap_err();
        assert!(
            err.to_string().contains("nftables, iptables or none"),
            "{err}"
        );
    }

    #[test]
    fn container_log_rotation_settings() {
        assert_eq!(Config::default().container_log_max_size, Some(10 << 20));
        let c = file(
            "containerLogMaxSize: 4Ki\ncontainerLogMaxFiles: 3\ncontainerLogMonitorInterval: 1s\n",
        )
        .resolve();
        assert_eq!(c.container_log_max_size, Some(4096));
        assert_eq!(c.container_log_max_files, 3);
        assert_eq!(c.container_log_monitor_interval, Duration::from_secs(1));
        assert_eq!(parse_log_max_size("10Mi"), Ok(Some(10 << 20)));
        assert_eq!(parse_log_max_size("1G"), Ok(Some(1_000_000_000)));
        assert_eq!(parse_log_max_size("-1"), Ok(None));
        assert!(parse_log_max_size("10MB").is_err());
        assert!(check_log_max_files(1).is_err());
        assert!(serde_saphyr::from_str::<Settings>("containerLogMaxFiles: 1").is_err());
        let c = flags(&["--container-log-max-size", "-1"]).resolve();
        assert_eq!(c.container_log_max_size, None);
        let argv = ["skiff-agent", "--container-log-max-files", "1"];
        assert!(Flags::try_parse_from(argv).is_err());
    }

    #[test]
    fn image_gc_settings_use_the_kubelet_names_and_defaults() {
        let c = Settings::default().resolve();
        assert_eq!(c.image_gc, crate::images::gc::Policy::default());
        assert_eq!(c.image_gc_period, Duration::from_secs(300));
        let f = file("imageGCHighThresholdPercent: 90\nimageGCLowThresholdPercent: 70\nimageMinimumGCAge: 1m\nimageMaximumGCAge: 1h\n");
        let c = flags(&["--image-gc-low-threshold", "60", "--image-gc-period", "30s"])
            .or(f)
            .resolve();
        assert_eq!(c.image_gc.high_threshold_percent, 90);
        assert_eq!(c.image_gc.low_threshold_percent, 60);
        assert_eq!(c.image_gc.min_age, Duration::from_secs(60));
        assert_eq!(c.image_gc.max_age, Duration::from_secs(3600));
        assert_eq!(c.image_gc_period, Duration::from_secs(30));
    }

    #[test]
    fn registries_file_defaults_and_can_be_turned_off() {
        let c = Settings::default().resolve();
        assert_eq!(
            c.registries_config,
            Some(PathBuf::from("/etc/skiff/registries.yaml"))
        );
        assert_eq!(
            flags(&["--registries-config="]).resolve().registries_config,
            None
        );
        let c = flags(&[])
            .or(file(
                "registriesConfig: /r.yaml
",
            ))
            .resolve();
        assert_eq!(c.registries_config, Some(PathBuf::from("/r.yaml")));
    }

    #[test]
    fn eviction_settings_from_flags_and_file() {
        let c = Settings::default().resolve();
        assert_eq!(c.eviction_hard, crate::eviction::thresholds::default_hard());
        let s = crate::eviction::Settings::from_config(&c).unwrap();
        assert_eq!(s.thresholds.len(), 5);
        assert_eq!(s.pressure_transition_period, Duration::from_secs(300));
        // Empty: no thresholds at all.
        let none = flags(&["--eviction-hard="]).resolve();
        assert!(none.eviction_hard.is_empty());
        let f = file("evictionSoft:\n  memory.available: 1Gi\nevictionSoftGracePeriod:\n  memory.available: 1m30s\nevictionMinimumReclaim:\n  nodefs.available: 500Mi\n");
        let c = flags(&[
            "--eviction-hard",
            "memory.available<200Mi,nodefs.available<5%",
            "--eviction-pressure-transition-period",
            "30s",
        ])
        .or(f)
        .resolve();
        let s = crate::eviction::Settings::from_config(&c).unwrap();
        assert_eq!(s.thresholds.len(), 3);
        let soft = s.thresholds.iter().find(|t| !t.is_hard()).unwrap();
        assert_eq!(soft.grace_period, Duration::from_secs(90));
        assert_eq!(s.pressure_transition_period, Duration::from_secs(30));
        let bad = flags(&["--eviction-soft", "memory.available<1Gi"]).resolve();
        assert!(crate::eviction::Settings::from_config(&bad)
            .unwrap_err()
            .contains("must have grace period"));
        assert!("memory.available".parse::<SignalMap>().is_err());
    }

    #[test]
    fn flags_win_over_the_file() {
        let f = file("syncFrequency: 5s\nnodeName: FromFile\nclusterDomain: file.local\nnodeLabels:\n  a: file\n  b: file\nserverTLSBootstrap: true\n");
        let c = flags(&[
            "--sync-frequency",
            "7s",
            "--node-labels",
            "b=flag,c=flag",
            "--rotate-server-certificates=false",
        ])
        .or(f.clone())
        .resolve();
        assert_eq!(c.sync_frequency, Duration::from_secs(7));
        // What no flag sets comes from the file, as written there.
        assert_eq!(c.cluster_domain, "file.local");
        assert_eq!(c.node_name, "FromFile");
        assert!(!c.rotate_server_certificates);
        // Labels from flags are added to the file's.
        let labels: Vec<(&str, &str)> = c
            .node_labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(labels, [("a", "file"), ("b", "flag"), ("c", "flag")]);
        // --node-name is lowercased as the kubelet does.
        let c = flags(&["--node-name", "Node-A"]).or(f).resolve();
        assert_eq!(c.node_name, "node-a");
        assert!(flags(&["--rotate-server-certificates"]).rotate_server_certificates == Some(true));
    }

    #[test]
    fn every_flag_keeps_its_name() {
        let s = flags(&[
            "--config-dir=/c",
            "--rotate-certificates=false",
            "--rotate-server-certificates",
            "--shutdown-grace-period=30s",
            "--shutdown-grace-period-critical-pods=10s",
            "--container-runtime-endpoint=unix:///x.sock",
            "--root-dir=/r",
            "--static-pod-path=/s",
            "--node-name=n",
            "--pod-log-dir=/l",
            "--status-address=none",
            "--pleg-relist-period=2s",
            "--runtime-request-timeout=1m",
            "--crash-loop-back-off-initial=1s",
            "--crash-loop-back-off-max=2s",
            "--cluster-dns=198.19.0.10,198.19.0.11",
            "--cluster-domain=c.local",
            "--sync-frequency=3s",
            "--kubeconfig=/k",
            "--register-node=false",
            "--node-labels=a=b",
            "--node-status-update-frequency=4s",
            "--node-status-report-frequency=5m",
            "--node-lease-duration-seconds=20",
            "--pod-cidr=198.18.1.0/24",
            "--cni-conf-dir=/cni",
            "--cni-bridge=br9",
            "--address=127.0.0.1",
            "--port=0",
            "--tls-cert-file=/t.crt",
            "--tls-private-key-file=/t.key",
            "--client-ca-file=/ca.crt",
            "--container-log-max-size=1Mi",
            "--container-log-max-files=3",
            "--container-log-monitor-interval=2s",
            "--proxy-mode=none",
            "--proxy-min-sync-period=1s",
            "--proxy-sync-period=2h",
            "--proxy-healthz-bind-address=none",
            "--proxy-metrics-bind-address=127.0.0.1:1",
            "--serve-cluster-dns=false",
            "--resolv-conf=/rc",
            "--pod-routes=false",
            "--node-ip=198.18.0.1",
        ]);
        let c = s.resolve();
        assert_eq!(c.config_dir, Path::new("/c"));
        assert_eq!(c.cluster_dns, ["198.19.0.10", "198.19.0.11"]);
        assert_eq!(c.backoff_max, Duration::from_secs(2));
        assert_eq!(c.node_lease_duration_seconds, 20);
        assert_eq!(c.proxy_mode, skiff_proxy::Mode::None);
        assert_eq!(c.proxy_sync_period, Duration::from_secs(7200));
        assert_eq!(
            c.shutdown_grace_period_critical_pods,
            Duration::from_secs(10)
        );
        assert!(c.rotate_server_certificates && !c.rotate_certificates);
        assert_eq!(c.port, 0);
        // YAML-only settings have no flag.
        let argv = ["skiff-agent", "--max-pods=3"];
        assert!(Flags::try_parse_from(argv).is_err());
    }

    #[test]
    fn local_path_root_is_absolute_and_under_the_root_dir_by_default() {
        assert_eq!(
            Config::default().local_path_root,
            Path::new("/var/lib/skiff-agent/local-path")
        );
        let c = flags(&["--root-dir=/r"]).resolve();
        assert_eq!(c.local_path_root, Path::new("/r/local-path"));
        let c = flags(&["--local-path-root=/data/lp"]).or(file("localPathRoot: /f\n"));
        assert_eq!(c.resolve().local_path_root, Path::new("/data/lp"));
        assert_eq!(
            file("localPathRoot: /f\n").resolve().local_path_root,
            Path::new("/f")
        );
        let argv = ["skiff-agent", "--local-path-root=rel"];
        assert!(Flags::try_parse_from(argv).is_err());
        assert!(serde_saphyr::from_str::<Settings>("localPathRoot: rel\n").is_err());
    }

    #[test]
    fn a_given_flag_taken_twice_keeps_the_last() {
        #[derive(Parser)]
        #[command(args_override_self = true)]
        struct Cli {
            #[command(flatten)]
            settings: Settings,
        }
        let argv = [
            "a",
            "--node-labels=a=1",
            "--node-labels=b=2",
            "--port=1",
            "--port=2",
        ];
        let s = Cli::try_parse_from(argv).unwrap().settings;
        assert_eq!(s.port, Some(2));
        assert_eq!(s.node_labels.0.len(), 1);
    }
}
