//! Server configuration: flags, a YAML file (`--config`), and defaults, in
//! that order of precedence.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// Configuration errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading config file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing config file {path}: {source}")]
    Parse {
        path: String,
        #[source]
        source: Box<serde_saphyr::Error>,
    },
    #[error("--scheduler-config: {0}")]
    Scheduler(#[from] skiff_scheduler::profile::Error),
    #[error("invalid {field} {value:?}: {why}")]
    Invalid {
        field: &'static str,
        value: String,
        why: String,
    },
}

/// Every setting as optional, for layering (the file uses the flag names).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Settings {
    pub data_dir: Option<PathBuf>,
    pub bind_address: Option<String>,
    pub secure_port: Option<u16>,
    /// `http://host:port[,...]`: use etcd instead of the embedded SQLite.
    pub datastore_endpoint: Option<String>,
    pub datastore_cafile: Option<PathBuf>,
    pub datastore_certfile: Option<PathBuf>,
    pub datastore_keyfile: Option<PathBuf>,
    /// Start a managed etcd cluster with this server as its first member.
    pub cluster_init: Option<bool>,
    /// Join the managed etcd cluster of the server at this URL.
    pub server: Option<String>,
    /// The join token (`K10...`) for `server`.
    pub token: Option<String>,
    /// This server's name (its etcd member's, its snapshots').
    pub node_name: Option<String>,
    /// Reset the managed etcd cluster to this server's member, then exit.
    pub cluster_reset: Option<bool>,
    /// The snapshot the reset starts from.
    pub cluster_reset_restore_path: Option<PathBuf>,
    /// The cluster secret (`DATA_DIR/pki/cluster-secret` of a server of
    /// the cluster): the key to the cluster's keys kept in etcd.
    pub cluster_secret_file: Option<PathBuf>,
    pub service_cluster_ip_range: Option<String>,
    pub cluster_cidr: Option<String>,
    pub token_auth_file: Option<PathBuf>,
    /// ServiceAccount tokens: issuers (the first signs), the audiences the
    /// API accepts (default the issuers), the signing key, more keys that
    /// verify, and the longest token TokenRequest issues (`48h`).
    pub service_account_issuer: Option<Vec<String>>,
    pub api_audiences: Option<Vec<String>>,
    pub service_account_signing_key_file: Option<PathBuf>,
    pub service_account_key_file: Option<Vec<PathBuf>>,
    pub service_account_max_token_expiration: Option<String>,
    /// Extra names or addresses for the serving certificate.
    pub tls_san: Option<Vec<String>>,
    /// Do not run the scheduler in this process (k3s's flag).
    pub disable_scheduler: Option<bool>,
    /// kube-scheduler's `--config`: a `KubeSchedulerConfiguration` with
    /// the profiles (checked when the server starts).
    pub scheduler_config: Option<PathBuf>,
    /// Do not run the controllers in this process (k3s's flag).
    pub disable_controller_manager: Option<bool>,
    /// Run the scheduler and controllers only while holding their Leases.
    pub leader_elect: Option<bool>,
    /// Watches served from one store watch per resource type.
    pub watch_cache: Option<bool>,
    /// Controllers to run: `*`, names, `-name` (kube-controller-manager's).
    pub controllers: Option<Vec<String>>,
    pub node_cidr_mask_size: Option<u8>,
    /// Durations as `5s`, `40s`, `2m`.
    pub node_monitor_period: Option<String>,
    pub node_monitor_grace_period: Option<String>,
    /// Seconds pods tolerate a not-ready / unreachable node before
    /// eviction (the DefaultTolerationSeconds admission plugin's flags).
    pub default_not_ready_toleration_seconds: Option<i64>,
    pub default_unreachable_toleration_seconds: Option<i64>,
    /// The longest certificate the CSR signer issues (`8760h`, a year).
    pub cluster_signing_duration: Option<String>,
    /// How often the store's history is compacted (`5m`; `0` never).
    pub etcd_compaction_interval: Option<String>,
    /// Snapshots on a schedule (k3s's flags): a cron schedule (five
    /// fields, or six with seconds first), how many scheduled snapshots
    /// are kept, where, and a switch to take none.
    pub etcd_snapshot_schedule_cron: Option<String>,
    pub etcd_snapshot_retention: Option<usize>,
    pub etcd_snapshot_dir: Option<PathBuf>,
    pub etcd_disable_snapshots: Option<bool>,
    /// How long events are kept (`1h`; `0` forever).
    pub event_ttl: Option<String>,
    /// Non-mutating requests served at once; more get 429 (`0` no limit).
    pub max_requests_inflight: Option<usize>,
    /// Mutating requests served at once; more get 429 (`0` no limit).
    pub max_mutating_requests_inflight: Option<usize>,
    /// Longest a non-long-running request may take (`60s`; `0` none).
    pub request_timeout: Option<String>,
    /// Connections held at once, in all (also bounded by the fd limit).
    pub max_connections: Option<usize>,
    /// Connections held at once from one source address (`0` no limit).
    pub max_connections_per_source: Option<usize>,
    /// kube-apiserver's `EncryptionConfiguration` file: encrypt the listed
    /// resources (Secrets) in the store.
    pub encryption_provider_config: Option<PathBuf>,
    /// kube-apiserver's audit `Policy` (`audit.k8s.io/v1`): which requests
    /// are logged, at which level.
    pub audit_policy_file: Option<PathBuf>,
    /// kube-apiserver's `AdmissionConfiguration`: the PodSecurity plugin's
    /// defaults and exemptions (checked when the server starts).
    pub admission_control_config_file: Option<PathBuf>,
    /// Where audit events go, one JSON line each; `-` is stdout.
    pub audit_log_path: Option<String>,
    /// Days a rotated audit log is kept (`0` forever).
    pub audit_log_maxage: Option<u64>,
    /// Rotated audit logs kept (`0` all).
    pub audit_log_maxbackup: Option<usize>,
    /// Megabytes before the audit log rotates (`0`: 100, upstream's).
    pub audit_log_maxsize: Option<u64>,
    /// OIDC authentication of people (kube-apiserver's flags; see
    /// `auth::authconfig`). `oidc-required-claim` entries are `key=value`.
    pub oidc_issuer_url: Option<String>,
    pub oidc_client_id: Option<String>,
    pub oidc_username_claim: Option<String>,
    pub oidc_username_prefix: Option<String>,
    pub oidc_groups_claim: Option<String>,
    pub oidc_groups_prefix: Option<String>,
    pub oidc_ca_file: Option<PathBuf>,
    pub oidc_required_claim: Option<Vec<String>>,
    pub oidc_signing_algs: Option<Vec<String>>,
    /// kube-apiserver's structured `AuthenticationConfiguration` (JWT
    /// issuers); exclusive with the `oidc-*` settings.
    pub authentication_config: Option<PathBuf>,
}

impl Settings {
    /// `self` where set, else `other`.
    pub fn or(self, other: Settings) -> Settings {
        Settings {
            data_dir: self.data_dir.or(other.data_dir),
            bind_address: self.bind_address.or(other.bind_address),
            secure_port: self.secure_port.or(other.secure_port),
            datastore_endpoint: self.datastore_endpoint.or(other.datastore_endpoint),
            datastore_cafile: self.datastore_cafile.or(other.datastore_cafile),
            datastore_certfile: self.datastore_certfile.or(other.datastore_certfile),
            datastore_keyfile: self.datastore_keyfile.or(other.datastore_keyfile),
            cluster_init: self.cluster_init.or(other.cluster_init),
            server: self.server.or(other.server),
            token: self.token.or(other.token),
            node_name: self.node_name.or(other.node_name),
            cluster_reset: self.cluster_reset.or(other.cluster_reset),
            cluster_reset_restore_path: self
                .cluster_reset_restore_path
                .or(other.cluster_reset_restore_path),
            cluster_secret_file: self.cluster_secret_file.or(other.cluster_secret_file),
            service_cluster_ip_range: self
                .service_cluster_ip_range
                .or(other.service_cluster_ip_range),
            cluster_cidr: self.cluster_cidr.or(other.cluster_cidr),
            token_auth_file: self.token_auth_file.or(other.token_auth_file),
            service_account_issuer: self.service_account_issuer.or(other.service_account_issuer),
            api_audiences: self.api_audiences.or(other.api_audiences),
            service_account_signing_key_file: self
                .service_account_signing_key_file
                .or(other.service_account_signing_key_file),
            service_account_key_file: self
                .service_account_key_file
                .or(other.service_account_key_file),
            service_account_max_token_expiration: self
                .service_account_max_token_expiration
                .or(other.service_account_max_token_expiration),
            tls_san: self.tls_san.or(other.tls_san),
            disable_scheduler: self.disable_scheduler.or(other.disable_scheduler),
            scheduler_config: self.scheduler_config.or(other.scheduler_config),
            disable_controller_manager: self
                .disable_controller_manager
                .or(other.disable_controller_manager),
            leader_elect: self.leader_elect.or(other.leader_elect),
            watch_cache: self.watch_cache.or(other.watch_cache),
            controllers: self.controllers.or(other.controllers),
            node_cidr_mask_size: self.node_cidr_mask_size.or(other.node_cidr_mask_size),
            node_monitor_period: self.node_monitor_period.or(other.node_monitor_period),
            node_monitor_grace_period: self
                .node_monitor_grace_period
                .or(other.node_monitor_grace_period),
            default_not_ready_toleration_seconds: self
                .default_not_ready_toleration_seconds
                .or(other.default_not_ready_toleration_seconds),
            default_unreachable_toleration_seconds: self
                .default_unreachable_toleration_seconds
                .or(other.default_unreachable_toleration_seconds),
            cluster_signing_duration: self
                .cluster_signing_duration
                .or(other.cluster_signing_duration),
            etcd_compaction_interval: self
                .etcd_compaction_interval
                .or(other.etcd_compaction_interval),
            etcd_snapshot_schedule_cron: self
                .etcd_snapshot_schedule_cron
                .or(other.etcd_snapshot_schedule_cron),
            etcd_snapshot_retention: self
                .etcd_snapshot_retention
                .or(other.etcd_snapshot_retention),
            etcd_snapshot_dir: self.etcd_snapshot_dir.or(other.etcd_snapshot_dir),
            etcd_disable_snapshots: self.etcd_disable_snapshots.or(other.etcd_disable_snapshots),
            event_ttl: self.event_ttl.or(other.event_ttl),
            max_requests_inflight: self.max_requests_inflight.or(other.max_requests_inflight),
            max_mutating_requests_inflight: self
                .max_mutating_requests_inflight
                .or(other.max_mutating_requests_inflight),
            request_timeout: self.request_timeout.or(other.request_timeout),
            max_connections: self.max_connections.or(other.max_connections),
            max_connections_per_source: self
                .max_connections_per_source
                .or(other.max_connections_per_source),
            encryption_provider_config: self
                .encryption_provider_config
                .or(other.encryption_provider_config),
            audit_policy_file: self.audit_policy_file.or(other.audit_policy_file),
            admission_control_config_file: self
                .admission_control_config_file
                .or(other.admission_control_config_file),
            audit_log_path: self.audit_log_path.or(other.audit_log_path),
            audit_log_maxage: self.audit_log_maxage.or(other.audit_log_maxage),
            audit_log_maxbackup: self.audit_log_maxbackup.or(other.audit_log_maxbackup),
            audit_log_maxsize: self.audit_log_maxsize.or(other.audit_log_maxsize),
            oidc_issuer_url: self.oidc_issuer_url.or(other.oidc_issuer_url),
            oidc_client_id: self.oidc_client_id.or(other.oidc_client_id),
            oidc_username_claim: self.oidc_username_claim.or(other.oidc_username_claim),
            oidc_username_prefix: self.oidc_username_prefix.or(other.oidc_username_prefix),
            oidc_groups_claim: self.oidc_groups_claim.or(other.oidc_groups_claim),
            oidc_groups_prefix: self.oidc_groups_prefix.or(other.oidc_groups_prefix),
            oidc_ca_file: self.oidc_ca_file.or(other.oidc_ca_file),
            oidc_required_claim: self.oidc_required_claim.or(other.oidc_required_claim),
            oidc_signing_algs: self.oidc_signing_algs.or(other.oidc_signing_algs),
            authentication_config: self.authentication_config.or(other.authentication_config),
        }
    }

    /// Read a YAML config file.
    ///
    /// # Errors
    /// Unreadable file, bad YAML, or unknown keys.
    pub fn from_file(path: &Path) -> Result<Settings, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.display().to_string(),
            source,
        })?;
        serde_saphyr::from_str(&text).map_err(|e| Error::Parse {
            path: path.display().to_string(),
            source: Box::new(e),
        })
    }
}

/// A managed etcd member (`--cluster-init`, `--server`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagedEtcd {
    /// The member's name.
    pub name: String,
    pub client_port: u16,
    pub peer_port: u16,
    /// Join through this server the first time (no member in the data
    /// directory yet); None: start the cluster.
    pub join: Option<Join>,
    /// `--cluster-secret-file`: the cluster secret to use rather than a
    /// new one (`--cluster-init`), or to open the keys a snapshot holds
    /// (`--cluster-reset`).
    pub secret_file: Option<PathBuf>,
}

/// `--server` and `--token`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Join {
    pub server: String,
    pub token: String,
}

/// etcd's client and peer ports.
pub const ETCD_CLIENT_PORT: u16 = 2379;
pub const ETCD_PEER_PORT: u16 = 2380;

/// The resolved configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub data_dir: PathBuf,
    pub bind_address: IpAddr,
    /// 0 picks a free port (tests).
    pub secure_port: u16,
    /// Empty: SQLite in `data_dir`.
    pub datastore_endpoints: Vec<String>,
    /// Client TLS towards etcd.
    pub datastore_tls: Option<crate::store::etcd::Tls>,
    /// This server runs a member of the cluster's etcd.
    pub managed_etcd: Option<ManagedEtcd>,
    /// This server's name: its etcd member's, its snapshots'.
    pub node_name: String,
    /// `--cluster-reset`: reset the managed etcd cluster (from this
    /// snapshot, when given) and exit.
    pub cluster_reset: Option<Option<PathBuf>>,
    pub service_cidr: crate::apiserver::ipalloc::Cidr,
    pub cluster_cidr: String,
    pub token_auth_file: Option<PathBuf>,
    pub service_accounts: crate::auth::satoken::Settings,
    pub extra_sans: Vec<String>,
    pub disable_scheduler: bool,
    /// The scheduler's profiles and queue settings.
    pub scheduler: skiff_scheduler::Config,
    pub disable_controller_manager: bool,
    /// The scheduler and controllers elect a leader through Leases.
    pub leader_elect: bool,
    /// Client watches share one store watch per resource type.
    pub watch_cache: bool,
    pub controllers: Vec<String>,
    pub node_cidr_mask_size: u8,
    pub node_monitor_period: Duration,
    pub node_monitor_grace_period: Duration,
    pub default_not_ready_toleration_seconds: i64,
    pub default_unreachable_toleration_seconds: i64,
    pub cluster_signing_duration: Duration,
    /// Compact the store's history older than this, this often
    /// (kube-apiserver's `--etcd-compaction-interval`); `None`: never.
    pub compaction_interval: Option<Duration>,
    /// When scheduled snapshots are taken; `None`: never.
    pub snapshot_schedule: Option<crate::store::snapshots::Schedule>,
    /// Scheduled snapshots kept (the newest).
    pub snapshot_retention: usize,
    /// Where snapshots go (`DATA_DIR/snapshots` unless set).
    pub snapshot_dir: PathBuf,
    /// Events are deleted this long after their last write
    /// (kube-apiserver's `--event-ttl`); `None`: kept until deleted.
    pub event_ttl: Option<Duration>,
    pub max_requests_inflight: usize,
    pub max_mutating_requests_inflight: usize,
    /// Zero: no deadline.
    pub request_timeout: Duration,
    pub max_connections: usize,
    /// Zero: no per-source cap.
    pub max_connections_per_source: usize,
    /// Encrypt resources at rest as this file says (checked when the
    /// server starts); `None`: everything is stored as plaintext.
    pub encryption_provider_config: Option<PathBuf>,
    /// The audit log (policy checked when the server starts); `None`: off.
    pub audit: Option<crate::apiserver::audit::Options>,
    /// The `AdmissionConfiguration` file (`--admission-control-config-file`).
    pub admission_control_config_file: Option<PathBuf>,
    /// OIDC issuers trusted for people (checked when the server starts).
    pub oidc: crate::auth::authconfig::Options,
}

pub const DEFAULT_DATA_DIR: &str = "/var/lib/skiff-server";
pub const DEFAULT_SERVICE_CIDR: &str = "10.43.0.0/16";
pub const DEFAULT_CLUSTER_CIDR: &str = "10.42.0.0/16";

impl Config {
    /// Resolve flags over the file over defaults.
    ///
    /// # Errors
    /// A value does not parse.
    pub fn resolve(flags: Settings, file: Option<&Path>) -> Result<Config, Error> {
        let s = match file {
            Some(f) => flags.or(Settings::from_file(f)?),
            None => flags,
        };
        let audit = audit_options(&s)?;
        let mut datastore_endpoints: Vec<String> = s
            .datastore_endpoint
            .clone()
            .map(|e| {
                e.split(',')
                    .map(|x| x.trim().to_string())
                    .filter(|x| !x.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        let data_dir: PathBuf = s
            .data_dir
            .clone()
            .unwrap_or_else(|| DEFAULT_DATA_DIR.into());
        let node_name = s
            .node_name
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(crate::server::hostname);
        let managed_etcd = managed_etcd(&s, &data_dir, &node_name)?;
        let cluster_reset = match (
            s.cluster_reset.unwrap_or(false),
            &s.cluster_reset_restore_path,
        ) {
            (true, path) => Some(path.clone()),
            (false, None) => None,
            (false, Some(p)) => {
                return Err(Error::Invalid {
                    field: "cluster-reset-restore-path",
                    value: p.display().to_string(),
                    why: "a restore path is for --cluster-reset".into(),
                })
            }
        };
        let mut datastore_tls = datastore_tls(&s)?;
        if let Some(m) = &managed_etcd {
            let layout = crate::store::managed::Layout::new(&data_dir, m.client_port);
            datastore_endpoints = vec![layout.local_client_url()];
            datastore_tls = Some(layout.tls());
        }
        let bind = s.bind_address.unwrap_or_else(|| "127.0.0.1".into());
        let bind_address = bind.parse().map_err(|_| Error::Invalid {
            field: "bind-address",
            value: bind.clone(),
            why: "not an IP address".into(),
        })?;
        let svc = s
            .service_cluster_ip_range
            .unwrap_or_else(|| DEFAULT_SERVICE_CIDR.into());
        let service_cidr =
            crate::apiserver::ipalloc::Cidr::parse(&svc).map_err(|e| Error::Invalid {
                field: "service-cluster-ip-range",
                value: svc.clone(),
                why: e.to_string(),
            })?;
        let cluster_cidr = s
            .cluster_cidr
            .unwrap_or_else(|| DEFAULT_CLUSTER_CIDR.into());
        crate::apiserver::ipalloc::Cidr::parse(&cluster_cidr).map_err(|e| Error::Invalid {
            field: "cluster-cidr",
            value: cluster_cidr.clone(),
            why: e.to_string(),
        })?;
        let duration = |field: &'static str, v: Option<String>, default: u64| match v {
            None => Ok(Duration::from_secs(default)),
            Some(v) => parse_duration(&v).map_err(|_| Error::Invalid {
                field,
                value: v,
                why: "not a duration (use 500ms, 40s, 5m, 1h)".into(),
            }),
        };
        let node_cidr_mask_size = s.node_cidr_mask_size.unwrap_or(24);
        if !(8..=30).contains(&node_cidr_mask_size) {
            return Err(Error::Invalid {
                field: "node-cidr-mask-size",
                value: node_cidr_mask_size.to_string(),
                why: "must be between 8 and 30".into(),
            });
        }
        let service_accounts = crate::auth::satoken::Settings {
            issuers: s.service_account_issuer.clone().unwrap_or_default(),
            api_audiences: s.api_audiences.clone().unwrap_or_default(),
            signing_key_file: s
                .service_account_signing_key_file
                .clone()
                .unwrap_or_else(|| data_dir.join("pki").join("service-account.key")),
            key_files: s.service_account_key_file.clone().unwrap_or_default(),
            max_expiration: s
                .service_account_max_token_expiration
                .clone()
                .map(|v| duration("service-account-max-token-expiration", Some(v), 0))
                .transpose()?
                .filter(|d| !d.is_zero()),
        };
        let snapshot_schedule = if s.etcd_disable_snapshots.unwrap_or(false) {
            None
        } else {
            // k3s's default: twice a day.
            let spec = s
                .etcd_snapshot_schedule_cron
                .clone()
                .unwrap_or_else(|| "0 */12 * * *".into());
            Some(
                crate::store::snapshots::Schedule::parse(&spec).map_err(|why| Error::Invalid {
                    field: "etcd-snapshot-schedule-cron",
                    value: spec.clone(),
                    why,
                })?,
            )
        };
        let oidc = crate::auth::authconfig::Options {
            issuer_url: s.oidc_issuer_url.clone(),
            client_id: s.oidc_client_id.clone(),
            username_claim: s.oidc_username_claim.clone(),
            username_prefix: s.oidc_username_prefix.clone(),
            groups_claim: s.oidc_groups_claim.clone(),
            groups_prefix: s.oidc_groups_prefix.clone(),
            ca_file: s.oidc_ca_file.clone(),
            required_claims: s.oidc_required_claim.clone().unwrap_or_default(),
            signing_algs: s.oidc_signing_algs.clone().unwrap_or_default(),
            authentication_config: s.authentication_config.clone(),
        };
        Ok(Config {
            audit,
            admission_control_config_file: s.admission_control_config_file.clone(),
            oidc,
            service_accounts,
            node_monitor_period: duration("node-monitor-period", s.node_monitor_period, 5)?,
            node_monitor_grace_period: duration(
                "node-monitor-grace-period",
                s.node_monitor_grace_period,
                40,
            )?,
            node_cidr_mask_size,
            cluster_signing_duration: duration(
                "cluster-signing-duration",
                s.cluster_signing_duration,
                365 * 24 * 3600,
            )?,
            // Upstream's defaults; 0 turns each off, as upstream.
            compaction_interval: Some(duration(
                "etcd-compaction-interval",
                s.etcd_compaction_interval,
                5 * 60,
            )?)
            .filter(|d| !d.is_zero()),
            snapshot_schedule,
            snapshot_retention: s.etcd_snapshot_retention.unwrap_or(5),
            snapshot_dir: s
                .etcd_snapshot_dir
                .clone()
                .unwrap_or_else(|| data_dir.join("snapshots")),
            event_ttl: Some(duration("event-ttl", s.event_ttl, 3600)?).filter(|d| !d.is_zero()),
            // kube-apiserver's defaults for the first three.
            max_requests_inflight: s.max_requests_inflight.unwrap_or(400),
            max_mutating_requests_inflight: s.max_mutating_requests_inflight.unwrap_or(200),
            request_timeout: duration("request-timeout", s.request_timeout, 60)?,
            max_connections: s.max_connections.unwrap_or(10_000),
            max_connections_per_source: s.max_connections_per_source.unwrap_or(1000),
            disable_scheduler: s.disable_scheduler.unwrap_or(false),
            scheduler: match &s.scheduler_config {
                Some(path) => skiff_scheduler::Config::from_file(path)?,
                None => skiff_scheduler::Config::default(),
            },
            disable_controller_manager: s.disable_controller_manager.unwrap_or(false),
            leader_elect: s.leader_elect.unwrap_or(true),
            watch_cache: s.watch_cache.unwrap_or(true),
            controllers: s.controllers.unwrap_or_else(|| vec!["*".into()]),
            default_not_ready_toleration_seconds: s
                .default_not_ready_toleration_seconds
                .unwrap_or(300),
            default_unreachable_toleration_seconds: s
                .default_unreachable_toleration_seconds
                .unwrap_or(300),
            data_dir,
            bind_address,
            secure_port: s.secure_port.unwrap_or(6443),
            datastore_endpoints,
            datastore_tls,
            managed_etcd,
            node_name,
            cluster_reset,
            service_cidr,
            cluster_cidr,
            token_auth_file: s.token_auth_file,
            extra_sans: s.tls_san.unwrap_or_default(),
            encryption_provider_config: s.encryption_provider_config,
        })
    }
}

/// The audit flags together: a policy and a log path, or neither; the
/// rotation flags only with a file to rotate.
fn audit_options(s: &Settings) -> Result<Option<crate::apiserver::audit::Options>, Error> {
    use crate::apiserver::audit::{rotate, Destination, Options};
    let rotation = [
        (
            "audit-log-maxage",
            s.audit_log_maxage.map(|v| v.to_string()),
        ),
        (
            "audit-log-maxbackup",
            s.audit_log_maxbackup.map(|v| v.to_string()),
        ),
        (
            "audit-log-maxsize",
            s.audit_log_maxsize.map(|v| v.to_string()),
        ),
    ];
    let rotation_set = rotation
        .iter()
        .find_map(|(f, v)| v.clone().map(|v| (*f, v)));
    match (&s.audit_policy_file, &s.audit_log_path) {
        (None, None) => match rotation_set {
            None => Ok(None),
            Some((field, value)) => Err(Error::Invalid {
                field,
                value,
                why: "rotates the audit log: set audit-log-path (and audit-policy-file) too".into(),
            }),
        },
        (Some(p), None) => Err(Error::Invalid {
            field: "audit-policy-file",
            value: p.display().to_string(),
            why: "no audit-log-path: set where the events go (a file, or - for stdout)".into(),
        }),
        (None, Some(l)) => Err(Error::Invalid {
            field: "audit-log-path",
            value: l.clone(),
            why: "no audit-policy-file: without a policy nothing is logged".into(),
        }),
        (Some(_), Some(l)) if l.is_empty() => Err(Error::Invalid {
            field: "audit-log-path",
            value: l.clone(),
            why: "empty: name a file, or - for stdout".into(),
        }),
        (Some(p), Some(l)) if l == "-" => match rotation_set {
            Some((field, value)) => Err(Error::Invalid {
                field,
                value,
                why: "the audit log goes to stdout (audit-log-path -), which does not rotate"
                    .into(),
            }),
            None => Ok(Some(Options {
                policy_file: p.clone(),
                log: Destination::Stdout,
            })),
        },
        (Some(p), Some(l)) => Ok(Some(Options {
            policy_file: p.clone(),
            log: Destination::File(rotate::Options {
                path: PathBuf::from(l),
                max_size_mb: s.audit_log_maxsize.unwrap_or(0),
                max_backups: s.audit_log_maxbackup.unwrap_or(0),
                max_age_days: s.audit_log_maxage.unwrap_or(0),
            }),
        })),
    }
}

/// A Go duration (`500ms`, `40s`, `1m30s`, `1h`) or plain seconds, as
/// every duration flag takes.
pub use kube_util::duration::parse_duration_or_seconds as parse_duration;

/// Managed etcd from `--cluster-init`, `--server` and `--token`, or from
/// a member already in the data directory (a restart needs no flags).
fn managed_etcd(s: &Settings, data_dir: &Path, name: &str) -> Result<Option<ManagedEtcd>, Error> {
    let init = s.cluster_init.unwrap_or(false);
    let server = s.server.clone().filter(|v| !v.is_empty());
    let invalid = |field: &'static str, value: &str, why: &str| Error::Invalid {
        field,
        value: value.to_string(),
        why: why.to_string(),
    };
    if let (true, Some(url)) = (init, &server) {
        return Err(invalid(
            "server",
            url,
            "--cluster-init starts a cluster and --server joins one: pass one of them",
        ));
    }
    let existing = crate::store::managed::Layout::new(data_dir, ETCD_CLIENT_PORT).has_member();
    let reset = s.cluster_reset.unwrap_or(false);
    if !(init || server.is_some() || existing || reset) {
        if let Some(file) = &s.cluster_secret_file {
            return Err(invalid(
                "cluster-secret-file",
                &file.display().to_string(),
                "a cluster secret is for servers on managed etcd (--cluster-init, --cluster-reset)",
            ));
        }
        return Ok(None);
    }
    if let Some(e) = &s.datastore_endpoint {
        return Err(invalid(
            "datastore-endpoint",
            e,
            "this server runs a managed etcd member (--cluster-init, --server, or one in --data-dir): the datastore is that etcd",
        ));
    }
    let join = match server {
        None => None,
        Some(url) => {
            let token = s.token.clone().filter(|t| !t.is_empty()).ok_or_else(|| {
                invalid("token", "", "--server needs --token (skiff-server token create --groups system:bootstrappers:skiff:servers on the first server)")
            })?;
            Some(Join { server: url, token })
        }
    };
    if let (Some(file), Some(_)) = (&s.cluster_secret_file, &join) {
        if !existing {
            return Err(invalid(
                "cluster-secret-file",
                &file.display().to_string(),
                "a joining server takes the cluster secret from the server it joins",
            ));
        }
    }
    if name.is_empty() {
        return Err(invalid(
            "node-name",
            name,
            "the host has no name: pass --node-name",
        ));
    }
    Ok(Some(ManagedEtcd {
        name: name.to_string(),
        client_port: ETCD_CLIENT_PORT,
        peer_port: ETCD_PEER_PORT,
        join,
        secret_file: s.cluster_secret_file.clone(),
    }))
}

/// `--datastore-cafile`, `--datastore-certfile`, `--datastore-keyfile`:
/// all three or none.
fn datastore_tls(s: &Settings) -> Result<Option<crate::store::etcd::Tls>, Error> {
    match (
        &s.datastore_cafile,
        &s.datastore_certfile,
        &s.datastore_keyfile,
    ) {
        (None, None, None) => Ok(None),
        (Some(ca), Some(cert), Some(key)) => Ok(Some(crate::store::etcd::Tls {
            ca: ca.clone(),
            cert: cert.clone(),
            key: key.clone(),
        })),
        _ => Err(Error::Invalid {
            field: "datastore-cafile",
            value: String::new(),
            why: "--datastore-cafile, --datastore-certfile and --datastore-keyfile go together"
                .into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn managed_etcd_settings() {
        let dir = tempfile::tempdir().unwrap();
        let base = || Settings {
            data_dir: Some(dir.path().to_path_buf()),
            node_name: Some("a".into()),
            ..Default::default()
        };
        let plain = Config::resolve(base(), None).unwrap();
        assert!(plain.managed_etcd.is_none() && plain.datastore_endpoints.is_empty());
        let init = Config::resolve(
            Settings {
                cluster_init: Some(true),
                ..base()
            },
            None,
        )
        .unwrap();
        assert_eq!(init.datastore_endpoints, ["https://127.0.0.1:2379"]);
        assert_eq!(
            init.datastore_tls.unwrap().ca,
            dir.path().join("pki/etcd-ca.crt")
        );
        assert_eq!(init.managed_etcd.unwrap().join, None);
        let refused = |s: Settings| Config::resolve(s, None).unwrap_err().to_string();
        assert!(refused(Settings {
            cluster_init: Some(true),
            server: Some("https://h:6443".into()),
            ..base()
        })
        .contains("pass one of them"));
        assert!(refused(Settings {
            server: Some("https://h:6443".into()),
            ..base()
        })
        .contains("--server needs --token"));
        assert!(refused(Settings {
            cluster_init: Some(true),
            datastore_endpoint: Some("http://e:2379".into()),
            ..base()
        })
        .contains("the datastore is that etcd"));
        assert!(refused(Settings {
            datastore_cafile: Some("/ca".into()),
            ..base()
        })
        .contains("go together"));
        assert!(refused(Settings {
            cluster_secret_file: Some("/secret".into()),
            ..base()
        })
        .contains("servers on managed etcd"));
        assert!(refused(Settings {
            server: Some("https://h:6443".into()),
            token: Some("K10x::a.b".into()),
            cluster_secret_file: Some("/secret".into()),
            ..base()
        })
        .contains("takes the cluster secret from the server it joins"));
        // A restart needs no flag: the member in the data dir says it.
        std::fs::create_dir_all(dir.path().join("etcd/member")).unwrap();
        assert!(Config::resolve(base(), None)
            .unwrap()
            .managed_etcd
            .is_some());
    }

    #[test]
    fn flags_win_over_file() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.yaml");
        std::fs::write(
            &f,
            "secure-port: 7000\nbind-address: 0.0.0.0\nservice-cluster-ip-range: 198.19.0.0/16\n",
        )
        .unwrap();
        let flags = Settings {
            secure_port: Some(8000),
            ..Default::default()
        };
        let c = Config::resolve(flags, Some(&f)).unwrap();
        assert_eq!(c.secure_port, 8000);
        assert_eq!(c.bind_address.to_string(), "0.0.0.0");
        assert_eq!(c.service_cidr.to_string(), "198.19.0.0/16");
        std::fs::write(&f, "bogus: 1\n").unwrap();
        assert!(Config::resolve(Settings::default(), Some(&f)).is_err());
    }

    #[test]
    fn controller_settings_parse_from_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.yaml");
        std::fs::write(
            &f,
            "node-monitor-grace-period: 8s\ncontrollers: ['*', '-job']\ndisable-scheduler: true\n",
        )
        .unwrap();
        let c = Config::resolve(Settings::default(), Some(&f)).unwrap();
        assert_eq!(c.node_monitor_grace_period, Duration::from_secs(8));
        assert_eq!(c.node_monitor_period, Duration::from_secs(5));
        assert_eq!(c.controllers, vec!["*", "-job"]);
        assert!(c.disable_scheduler && !c.disable_controller_manager);
        assert_eq!(c.compaction_interval, Some(Duration::from_secs(300)));
        assert_eq!(c.event_ttl, Some(Duration::from_secs(3600)));
        std::fs::write(&f, "etcd-compaction-interval: 0\nevent-ttl: 90s\n").unwrap();
        let c = Config::resolve(Settings::default(), Some(&f)).unwrap();
        assert_eq!(c.compaction_interval, None);
        assert_eq!(c.event_ttl, Some(Duration::from_secs(90)));
        std::fs::write(&f, "node-monitor-period: soon\n").unwrap();
        let e = Config::resolve(Settings::default(), Some(&f)).unwrap_err();
        assert!(e.to_string().contains("node-monitor-period"), "{e}");
    }

    #[test]
    fn snapshots_default_to_twice_a_day_in_the_data_dir() {
        let c = Config::resolve(Settings::default(), None).unwrap();
        assert!(c.snapshot_schedule.is_some());
        assert_eq!(c.snapshot_retention, 5);
        assert_eq!(
            c.snapshot_dir,
            Path::new(DEFAULT_DATA_DIR).join("snapshots")
        );
        let off = Settings {
            etcd_disable_snapshots: Some(true),
            etcd_snapshot_schedule_cron: Some("not checked".into()),
            ..Default::default()
        };
        assert!(Config::resolve(off, None)
            .unwrap()
            .snapshot_schedule
            .is_none());
        let bad = Settings {
            etcd_snapshot_schedule_cron: Some("every day".into()),
            ..Default::default()
        };
        let e = Config::resolve(bad, None).unwrap_err();
        assert!(
            e.to_string()
                .contains("invalid etcd-snapshot-schedule-cron \"every day\""),
            "{e}"
        );
    }

    #[test]
    fn the_scheduler_config_is_checked_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let sched = dir.path().join("scheduler.yaml");
        let f = dir.path().join("c.yaml");
        std::fs::write(&f, format!("scheduler-config: {}\n", sched.display())).unwrap();
        std::fs::write(
            &sched,
            "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nprofiles:\n- schedulerName: a\n- schedulerName: b\n",
        )
        .unwrap();
        let c = Config::resolve(Settings::default(), Some(&f)).unwrap();
        let names: Vec<_> = c
            .scheduler
            .profiles
            .iter()
            .map(|p| p.scheduler_name.as_str())
            .collect();
        assert_eq!(names, ["a", "b"]);
        std::fs::write(&sched, "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nextenders: []\n").unwrap();
        let e = Config::resolve(Settings::default(), Some(&f))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--scheduler-config: ") && e.contains("extenders"),
            "{e}"
        );
    }

    #[test]
    fn audit_flags_go_together() {
        use crate::apiserver::audit::{rotate, Destination};
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.yaml");
        std::fs::write(
            &f,
            "audit-policy-file: /etc/skiff/audit.yaml\naudit-log-path: /var/log/audit.log\n\
             audit-log-maxsize: 10\naudit-log-maxbackup: 3\n",
        )
        .unwrap();
        let flags = Settings {
            audit_log_maxage: Some(7),
            ..Default::default()
        };
        let c = Config::resolve(flags, Some(&f)).unwrap();
        let a = c.audit.unwrap();
        assert_eq!(a.policy_file, PathBuf::from("/etc/skiff/audit.yaml"));
        assert_eq!(
            a.log,
            Destination::File(rotate::Options {
                path: "/var/log/audit.log".into(),
                max_size_mb: 10,
                max_backups: 3,
                max_age_days: 7,
            })
        );
        let refused = |s: Settings| Config::resolve(s, None).unwrap_err().to_string();
        let e = refused(Settings {
            audit_log_path: Some("/x.log".into()),
            ..Default::default()
        });
        assert!(e.contains("audit-policy-file"), "{e}");
        let e = refused(Settings {
            audit_policy_file: Some("/p.yaml".into()),
            ..Default::default()
        });
        assert!(e.contains("audit-log-path"), "{e}");
        let e = refused(Settings {
            audit_log_maxbackup: Some(2),
            ..Default::default()
        });
        assert!(e.contains("audit-log-maxbackup"), "{e}");
        let e = refused(Settings {
            audit_policy_file: Some("/p.yaml".into()),
            audit_log_path: Some("-".into()),
            audit_log_maxsize: Some(1),
            ..Default::default()
        });
        assert!(e.contains("stdout"), "{e}");
        assert!(Config::resolve(Settings::default(), None)
            .unwrap()
            .audit
            .is_none());
    }

    #[test]
    fn durations() {
        assert_eq!(
            parse_duration("500ms").ok(),
            Some(Duration::from_millis(500))
        );
        assert_eq!(parse_duration("40s").ok(), Some(Duration::from_secs(40)));
        assert_eq!(parse_duration("2m").ok(), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("7").ok(), Some(Duration::from_secs(7)));
        assert!(parse_duration("1d").is_err());
        assert!(parse_duration("s").is_err());
    }
}
