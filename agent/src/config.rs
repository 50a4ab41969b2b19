//! Agent configuration: a YAML file (`--config`) overlaid by flags.
//!
//! Field names follow the kubelet's KubeletConfiguration where one exists
//! (`staticPodPath`, `containerRuntimeEndpoint`, ...), so an operator's
//! muscle memory carries over.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// Errors loading the configuration file.
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
        source: serde_yaml::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The effective configuration of a running agent.
#[derive(Debug, Clone)]
pub struct Config {
    pub node_name: String,
    pub container_runtime_endpoint: String,
    pub root_dir: PathBuf,
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
    pub address: std::net::IpAddr,
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
    /// The service proxy: nftables (default), iptables or none.
    pub proxy_mode: crate::proxy::Mode,
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
    pub node_ip: Option<std::net::IpAddr>,
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

/// The default config directory.
pub const DEFAULT_CONFIG_DIR: &str = "/etc/skiff/agent";
/// The config file `install` writes there.
pub const CONFIG_FILE: &str = "config.yaml";

impl Default for Config {
    fn default() -> Self {
        Config {
            node_name: default_node_name(),
            container_runtime_endpoint: "unix:///run/containerd/containerd.sock".into(),
            root_dir: "/var/lib/skiff-agent".into(),
            pod_log_dir: "/var/log/pods".into(),
            static_pod_path: None,
            pleg_relist_period: Duration::from_secs(1),
            runtime_request_timeout: Duration::from_secs(120),
            image_pull_timeout: Duration::from_secs(300),
            backoff_initial: Duration::from_secs(10),
            backoff_max: Duration::from_secs(300),
            backoff_reset: Duration::from_secs(600),
            status_address: Some(SocketAddr::from(([127, 0, 0, 1], 10255))),
            cluster_dns: Vec::new(),
            cluster_domain: "cluster.local".into(),
            max_pods: 110,
            sync_frequency: Duration::from_secs(10),
            kubeconfig: None,
            register_node: true,
            node_labels: BTreeMap::new(),
            node_status_update_frequency: Duration::from_secs(10),
            node_status_report_frequency: Duration::from_secs(300),
            node_lease_duration_seconds: 40,
            pod_cidr: None,
            cni_conf_dir: None,
            cni_bridge: "skiff0".into(),
            address: std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            port: 10250,
            tls_cert_file: None,
            tls_private_key_file: None,
            client_ca_file: None,
            container_log_max_size: Some(10 << 20),
            container_log_max_files: 5,
            container_log_monitor_interval: Duration::from_secs(10),
            proxy_mode: crate::proxy::Mode::Nftables,
            proxy_min_sync_period: Duration::from_millis(100),
            proxy_sync_period: Duration::from_secs(3600),
            proxy_healthz_bind_address: Some(SocketAddr::from(([0, 0, 0, 0], 10256))),
            proxy_metrics_bind_address: Some(SocketAddr::from(([127, 0, 0, 1], 10249))),
            serve_cluster_dns: true,
            resolv_conf: "/etc/resolv.conf".into(),
            pod_routes: true,
            node_ip: None,
            config_dir: DEFAULT_CONFIG_DIR.into(),
            rotate_certificates: true,
            rotate_server_certificates: false,
            shutdown_grace_period: Duration::ZERO,
            shutdown_grace_period_critical_pods: Duration::ZERO,
        }
    }
}

/// The YAML file: every field optional, durations as `10s`, `5m`, `1h`, or
/// plain seconds.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileConfig {
    pub node_name: Option<String>,
    pub container_runtime_endpoint: Option<String>,
    pub root_dir: Option<PathBuf>,
    pub pod_log_dir: Option<PathBuf>,
    pub static_pod_path: Option<PathBuf>,
    pub pleg_relist_period: Option<DurationStr>,
    pub runtime_request_timeout: Option<DurationStr>,
    pub image_pull_timeout: Option<DurationStr>,
    pub crash_loop_back_off_initial: Option<DurationStr>,
    pub crash_loop_back_off_max: Option<DurationStr>,
    pub crash_loop_back_off_reset: Option<DurationStr>,
    pub status_address: Option<String>,
    #[serde(rename = "clusterDNS")]
    pub cluster_dns: Option<Vec<String>>,
    pub cluster_domain: Option<String>,
    pub max_pods: Option<u32>,
    pub sync_frequency: Option<DurationStr>,
    pub kubeconfig: Option<PathBuf>,
    pub register_node: Option<bool>,
    pub node_labels: Option<BTreeMap<String, String>>,
    pub node_status_update_frequency: Option<DurationStr>,
    pub node_status_report_frequency: Option<DurationStr>,
    pub node_lease_duration_seconds: Option<u32>,
    #[serde(rename = "podCIDR")]
    pub pod_cidr: Option<String>,
    pub cni_conf_dir: Option<PathBuf>,
    pub cni_bridge: Option<String>,
    pub address: Option<std::net::IpAddr>,
    pub port: Option<u16>,
    pub tls_cert_file: Option<PathBuf>,
    pub tls_private_key_file: Option<PathBuf>,
    /// KubeletConfiguration's `authentication.x509.clientCAFile`, flat.
    #[serde(rename = "clientCAFile")]
    pub client_ca_file: Option<PathBuf>,
    pub container_log_max_size: Option<String>,
    pub container_log_max_files: Option<u32>,
    pub container_log_monitor_interval: Option<DurationStr>,
    pub proxy_mode: Option<String>,
    pub proxy_min_sync_period: Option<DurationStr>,
    pub proxy_sync_period: Option<DurationStr>,
    pub proxy_healthz_bind_address: Option<String>,
    pub proxy_metrics_bind_address: Option<String>,
    #[serde(rename = "serveClusterDNS")]
    pub serve_cluster_dns: Option<bool>,
    pub resolv_conf: Option<PathBuf>,
    pub pod_routes: Option<bool>,
    #[serde(rename = "nodeIP")]
    pub node_ip: Option<std::net::IpAddr>,
    pub rotate_certificates: Option<bool>,
    #[serde(rename = "serverTLSBootstrap")]
    pub server_tls_bootstrap: Option<bool>,
    pub shutdown_grace_period: Option<DurationStr>,
    pub shutdown_grace_period_critical_pods: Option<DurationStr>,
}

impl FileConfig {
    pub fn load(path: &Path) -> Result<FileConfig> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.to_owned(),
            source,
        })?;
        serde_yaml::from_str(&text).map_err(|source| Error::Parse {
            path: path.to_owned(),
            source,
        })
    }

    /// Apply the file's values over the defaults.
    pub fn apply(self, c: &mut Config) -> std::result::Result<(), String> {
        macro_rules! set {
            ($field:ident, $src:expr) => {
                if let Some(v) = $src {
                    c.$field = v;
                }
            };
        }
        set!(node_name, self.node_name);
        set!(container_runtime_endpoint, self.container_runtime_endpoint);
        set!(root_dir, self.root_dir);
        set!(pod_log_dir, self.pod_log_dir);
        c.static_pod_path = self.static_pod_path.or(c.static_pod_path.take());
        set!(pleg_relist_period, self.pleg_relist_period.map(|d| d.0));
        set!(
            runtime_request_timeout,
            self.runtime_request_timeout.map(|d| d.0)
        );
        set!(image_pull_timeout, self.image_pull_timeout.map(|d| d.0));
        set!(
            backoff_initial,
            self.crash_loop_back_off_initial.map(|d| d.0)
        );
        set!(backoff_max, self.crash_loop_back_off_max.map(|d| d.0));
        set!(backoff_reset, self.crash_loop_back_off_reset.map(|d| d.0));
        set!(cluster_dns, self.cluster_dns);
        set!(cluster_domain, self.cluster_domain);
        set!(max_pods, self.max_pods);
        set!(sync_frequency, self.sync_frequency.map(|d| d.0));
        c.kubeconfig = self.kubeconfig.or(c.kubeconfig.take());
        set!(register_node, self.register_node);
        set!(node_labels, self.node_labels);
        set!(
            node_status_update_frequency,
            self.node_status_update_frequency.map(|d| d.0)
        );
        set!(
            node_status_report_frequency,
            self.node_status_report_frequency.map(|d| d.0)
        );
        set!(
            node_lease_duration_seconds,
            self.node_lease_duration_seconds
        );
        c.pod_cidr = self.pod_cidr.or(c.pod_cidr.take());
        c.cni_conf_dir = self.cni_conf_dir.or(c.cni_conf_dir.take());
        set!(cni_bridge, self.cni_bridge);
        set!(address, self.address);
        set!(port, self.port);
        c.tls_cert_file = self.tls_cert_file.or(c.tls_cert_file.take());
        c.tls_private_key_file = self.tls_private_key_file.or(c.tls_private_key_file.take());
        c.client_ca_file = self.client_ca_file.or(c.client_ca_file.take());
        if let Some(size) = self.container_log_max_size {
            c.container_log_max_size = parse_log_max_size(&size)?;
        }
        if let Some(n) = self.container_log_max_files {
            c.container_log_max_files = check_log_max_files(n)?;
        }
        set!(
            container_log_monitor_interval,
            self.container_log_monitor_interval.map(|d| d.0)
        );
        if let Some(addr) = self.status_address {
            c.status_address = parse_optional_addr(&addr)?;
        }
        if let Some(mode) = self.proxy_mode {
            c.proxy_mode = mode.parse().map_err(|e| format!("proxyMode: {e}"))?;
        }
        set!(
            proxy_min_sync_period,
            self.proxy_min_sync_period.map(|d| d.0)
        );
        set!(proxy_sync_period, self.proxy_sync_period.map(|d| d.0));
        if let Some(addr) = self.proxy_healthz_bind_address {
            c.proxy_healthz_bind_address = parse_optional_addr(&addr)?;
        }
        if let Some(addr) = self.proxy_metrics_bind_address {
            c.proxy_metrics_bind_address = parse_optional_addr(&addr)?;
        }
        set!(serve_cluster_dns, self.serve_cluster_dns);
        set!(resolv_conf, self.resolv_conf);
        set!(pod_routes, self.pod_routes);
        c.node_ip = self.node_ip.or(c.node_ip.take());
        set!(rotate_certificates, self.rotate_certificates);
        set!(rotate_server_certificates, self.server_tls_bootstrap);
        set!(
            shutdown_grace_period,
            self.shutdown_grace_period.map(|d| d.0)
        );
        set!(
            shutdown_grace_period_critical_pods,
            self.shutdown_grace_period_critical_pods.map(|d| d.0)
        );
        Ok(())
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

/// A duration written the Kubernetes way (`300ms`, `10s`, `5m`, `1h30m`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurationStr(pub Duration);

impl<'de> Deserialize<'de> for DurationStr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Secs(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Secs(s) => Ok(DurationStr(Duration::from_secs(s))),
            Raw::Text(t) => parse_duration(&t)
                .map(DurationStr)
                .map_err(serde::de::Error::custom),
        }
    }
}

/// Parse `1h2m3s`, `500ms`, `10s`; a bare number is seconds.
pub fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    let s = s.trim();
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let mut total = Duration::ZERO;
    let mut num = String::new();
    let mut chars = s.chars().peekable();
    let mut seen_unit = false;
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() || c == '.' {
            num.push(c);
            continue;
        }
        let mut unit = c.to_string();
        if c == 'm' && chars.peek() == Some(&'s') {
            unit.push(chars.next().unwrap_or('s'));
        }
        let value: f64 = num
            .parse()
            .map_err(|_| format!("invalid duration {s:?}: expected e.g. 10s, 5m, 1h"))?;
        let secs = match unit.as_str() {
            "ms" => value / 1000.0,
            "s" => value,
            "m" => value * 60.0,
            "h" => value * 3600.0,
            _ => return Err(format!("invalid duration {s:?}: unknown unit {unit:?}")),
        };
        total += Duration::from_secs_f64(secs);
        num.clear();
        seen_unit = true;
    }
    if !num.is_empty() || !seen_unit {
        return Err(format!("invalid duration {s:?}: expected e.g. 10s, 5m, 1h"));
    }
    Ok(total)
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
    use super::*;

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
        let f: FileConfig = serde_yaml::from_str(
            "staticPodPath: /etc/pods\ncrashLoopBackOffInitial: 1s\nstatusAddress: none\n",
        )
        .unwrap();
        let mut c = Config::default();
        f.apply(&mut c).unwrap();
        assert_eq!(c.static_pod_path.as_deref(), Some(Path::new("/etc/pods")));
        assert_eq!(c.backoff_initial, Duration::from_secs(1));
        assert_eq!(c.status_address, None);
        assert!(serde_yaml::from_str::<FileConfig>("staticPodPth: x").is_err());
    }

    #[test]
    fn proxy_dns_and_network_settings() {
        let f: FileConfig = serde_yaml::from_str(
            "proxyMode: iptables\nproxyMinSyncPeriod: 1s\nproxyHealthzBindAddress: none\nproxyMetricsBindAddress: 0.0.0.0:9249\nserveClusterDNS: false\nresolvConf: /run/resolv.conf\npodRoutes: false\nnodeIP: 198.18.0.9\n",
        )
        .unwrap();
        let mut c = Config::default();
        assert_eq!(c.proxy_mode, crate::proxy::Mode::Nftables);
        assert_eq!(
            c.proxy_healthz_bind_address,
            Some(SocketAddr::from(([0, 0, 0, 0], 10256)))
        );
        f.apply(&mut c).unwrap();
        assert_eq!(c.proxy_mode, crate::proxy::Mode::Iptables);
        assert_eq!(c.proxy_min_sync_period, Duration::from_secs(1));
        assert_eq!(c.proxy_healthz_bind_address, None);
        assert_eq!(
            c.proxy_metrics_bind_address,
            Some(SocketAddr::from(([0, 0, 0, 0], 9249)))
        );
        assert!(!c.serve_cluster_dns && !c.pod_routes);
        assert_eq!(c.resolv_conf, Path::new("/run/resolv.conf"));
        assert_eq!(c.node_ip, Some("198.18.0.9".parse().unwrap()));
        let bad: FileConfig = serde_yaml::from_str("proxyMode: ipvs").unwrap();
        let err = bad.apply(&mut Config::default()).unwrap_err();
        assert!(err.contains("nftables, iptables or none"), "{err}");
    }

    #[test]
    fn container_log_rotation_settings() {
        let f: FileConfig = serde_yaml::from_str(
            "containerLogMaxSize: 4Ki\ncontainerLogMaxFiles: 3\ncontainerLogMonitorInterval: 1s\n",
        )
        .unwrap();
        let mut c = Config::default();
        assert_eq!(c.container_log_max_size, Some(10 << 20));
        f.apply(&mut c).unwrap();
        assert_eq!(c.container_log_max_size, Some(4096));
        assert_eq!(c.container_log_max_files, 3);
        assert_eq!(c.container_log_monitor_interval, Duration::from_secs(1));
        assert_eq!(parse_log_max_size("10Mi"), Ok(Some(10 << 20)));
        assert_eq!(parse_log_max_size("1G"), Ok(Some(1_000_000_000)));
        assert_eq!(parse_log_max_size("-1"), Ok(None));
        assert!(parse_log_max_size("10MB").is_err());
        assert!(check_log_max_files(1).is_err());
    }
}
