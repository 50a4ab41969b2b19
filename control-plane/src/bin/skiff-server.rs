//! skiff-server: the control plane's command line. Logic lives in the
//! library; this file parses flags and reports errors.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use skiff_control_plane::config::{Config, Settings};
use skiff_control_plane::store::snapshots;
use skiff_control_plane::{components, install, pki, server, store, tokens};
use skiff_daemon::install::SystemctlCommand;

/// mimalloc instead of glibc malloc: the request path allocates a lot
/// (JSON values), and glibc's malloc/free took about a quarter of the
/// server's CPU per create in the API benchmark.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` (index 15 of mimalloc's `mi_option_e`, which
/// libmimalloc-sys does not export as a constant).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Give freed memory back to the OS at once instead of after mimalloc's
/// default 10 ms: with the delay, bursts (big lists, many concurrent
/// requests) kept peak RSS about 30-40 MiB higher for no measurable speed.
/// A `MIMALLOC_PURGE_DELAY` in the environment still wins.
///
/// And no transparent huge pages: mimalloc asks for them on its arenas,
/// and every purged-then-reused range then faulted back in as a whole
/// 2 MiB page zeroed by the kernel. In the API benchmark that cost 7-10 %
/// of the server's CPU per create and 30 MiB of peak RSS.
fn tune_allocator() {
    // SAFETY: called first thing in main, before other threads exist
    // (mi_option_set_default is not thread safe); it only sets an option
    // value.
    unsafe { libmimalloc_sys::mi_option_set_default(MI_OPTION_PURGE_DELAY, 0) };
    if let Err(e) = nix::sys::prctl::set_thp_disable(true) {
        eprintln!("skiff-server: could not turn transparent huge pages off: {e}");
    }
}

#[derive(Parser, Debug)]
#[command(
    name = "skiff-server",
    version,
    about = "Kubernetes-compatible control plane"
)]
struct Cli {
    #[command(flatten)]
    serve: ServeArgs,
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Args, Debug, Clone)]
struct ServeArgs {
    /// State, PKI and kubeconfigs live here.
    #[arg(long, global = true)]
    data_dir: Option<PathBuf>,
    /// Address to serve HTTPS on [default: 127.0.0.1].
    #[arg(long)]
    bind_address: Option<String>,
    /// HTTPS port [default: 6443; 0 picks a free one].
    #[arg(long)]
    secure_port: Option<u16>,
    /// etcd endpoints (http://host:port[,...]); SQLite in --data-dir when unset.
    #[arg(long, global = true)]
    datastore_endpoint: Option<String>,
    /// CA (PEM) the etcd members' certificates chain to (https endpoints).
    #[arg(long, global = true)]
    datastore_cafile: Option<PathBuf>,
    /// Client certificate (PEM) presented to etcd.
    #[arg(long, global = true)]
    datastore_certfile: Option<PathBuf>,
    /// Its key (PEM).
    #[arg(long, global = true)]
    datastore_keyfile: Option<PathBuf>,
    /// Start a cluster whose datastore is an etcd this server runs (the
    /// etcd binary), the first member; more servers join with --server.
    #[arg(long)]
    cluster_init: bool,
    /// Join the cluster of the server at this URL (https://HOST:6443):
    /// run an etcd member of its cluster beside this server.
    #[arg(long)]
    server: Option<String>,
    /// The join token for --server, from `skiff-server token create
    /// --groups system:bootstrappers:skiff:servers` on a server.
    #[arg(long)]
    token: Option<String>,
    /// This server's name (its etcd member's, its snapshots') [default:
    /// the host name].
    #[arg(long, global = true)]
    node_name: Option<String>,
    /// Make this server's etcd member the only one of a new cluster (from
    /// its data, or from --cluster-reset-restore-path), then exit; the
    /// other servers rejoin.
    #[arg(long)]
    cluster_reset: bool,
    /// The etcd snapshot --cluster-reset restores (a path, or a name in
    /// --etcd-snapshot-dir).
    #[arg(long)]
    cluster_reset_restore_path: Option<PathBuf>,
    /// The cluster secret (a copy of DATA_DIR/pki/cluster-secret): with
    /// --cluster-init instead of a new one; with --cluster-reset to take
    /// the cluster's keys from the snapshot into an empty data directory.
    #[arg(long)]
    cluster_secret_file: Option<PathBuf>,
    /// ClusterIP range [default: 10.43.0.0/16].
    #[arg(long)]
    service_cluster_ip_range: Option<String>,
    /// Pod network range [default: 10.42.0.0/16].
    #[arg(long)]
    cluster_cidr: Option<String>,
    /// CSV of token,user,uid,"group1,group2".
    #[arg(long)]
    token_auth_file: Option<PathBuf>,
    /// Extra SANs for the serving certificate (repeatable).
    #[arg(long)]
    tls_san: Vec<String>,
    /// Issuer of ServiceAccount tokens (repeatable: the first signs, all
    /// are accepted) [default: https://kubernetes.default.svc.cluster.local].
    #[arg(long)]
    service_account_issuer: Vec<String>,
    /// Audiences the API accepts in tokens (comma-separated) [default: the
    /// issuers].
    #[arg(long, value_delimiter = ',')]
    api_audiences: Option<Vec<String>>,
    /// ECDSA P-256 key (PKCS#8 PEM) that signs ServiceAccount tokens, made
    /// when missing [default: DATA_DIR/pki/service-account.key].
    #[arg(long)]
    service_account_signing_key_file: Option<PathBuf>,
    /// More keys (PEM, public or private, EC or RSA) whose tokens are
    /// accepted, e.g. the previous signing key (repeatable).
    #[arg(long)]
    service_account_key_file: Vec<PathBuf>,
    /// Longest ServiceAccount token TokenRequest issues, e.g. 48h; longer
    /// requests are cut to it [default: no limit].
    #[arg(long)]
    service_account_max_token_expiration: Option<String>,
    /// YAML file with the same keys as the flags; flags win.
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Do not run the scheduler in this process.
    #[arg(long)]
    disable_scheduler: bool,
    /// The scheduler's KubeSchedulerConfiguration
    /// (kubescheduler.config.k8s.io/v1): profiles, score plugins and
    /// weights, percentageOfNodesToScore.
    #[arg(long)]
    scheduler_config: Option<PathBuf>,
    /// Do not run the controllers in this process.
    #[arg(long)]
    disable_controller_manager: bool,
    /// Run the scheduler and the controllers only while this server holds
    /// their Lease in kube-system (kube-scheduler's and
    /// kube-controller-manager's flag); `--leader-elect=false` for a
    /// server that is sure to be alone [default: true].
    #[arg(long)]
    leader_elect: Option<bool>,
    /// Serve watches from one store watch per resource type and an
    /// in-memory window of recent events (kube-apiserver's flag);
    /// `--watch-cache=false` opens a store watch per client watch
    /// [default: true].
    #[arg(long)]
    watch_cache: Option<bool>,
    /// Controllers to run: '*' for all, a name to enable, '-name' to
    /// disable (deployment, replicaset, daemonset, job, nodelifecycle,
    /// garbagecollector, namespace, endpointslice, nodeipam).
    #[arg(long, value_delimiter = ',')]
    controllers: Option<Vec<String>>,
    /// Size of each node's podCIDR carved from --cluster-cidr [default: 24].
    #[arg(long)]
    node_cidr_mask_size: Option<u8>,
    /// How often node health is checked [default: 5s].
    #[arg(long)]
    node_monitor_period: Option<String>,
    /// A node silent this long is marked NotReady (Unknown) [default: 40s].
    #[arg(long)]
    node_monitor_grace_period: Option<String>,
    /// Seconds a pod tolerates a not-ready node before eviction [default: 300].
    #[arg(long)]
    default_not_ready_toleration_seconds: Option<i64>,
    /// Seconds a pod tolerates an unreachable node before eviction [default: 300].
    #[arg(long)]
    default_unreachable_toleration_seconds: Option<i64>,
    /// Longest certificate the CSR signer issues, e.g. 720h [default: 8760h].
    #[arg(long)]
    cluster_signing_duration: Option<String>,
    /// How often the datastore's history older than this is compacted, for
    /// etcd and SQLite alike; 0 never [default: 5m].
    #[arg(long)]
    etcd_compaction_interval: Option<String>,
    /// When scheduled snapshots of the datastore are taken: cron, five
    /// fields or six with seconds first [default: "0 */12 * * *"].
    #[arg(long)]
    etcd_snapshot_schedule_cron: Option<String>,
    /// Scheduled snapshots kept, the newest [default: 5].
    #[arg(long, global = true)]
    etcd_snapshot_retention: Option<usize>,
    /// Where snapshots are written [default: DATA_DIR/snapshots].
    #[arg(long, global = true)]
    etcd_snapshot_dir: Option<PathBuf>,
    /// Take no scheduled snapshots.
    #[arg(long)]
    etcd_disable_snapshots: bool,
    /// How long events are kept after their last write; 0 forever [default: 1h].
    #[arg(long)]
    event_ttl: Option<String>,
    /// Non-mutating requests served at once, more get 429; 0 no limit
    /// [default: 400].
    #[arg(long)]
    max_requests_inflight: Option<usize>,
    /// Mutating requests served at once, more get 429; 0 no limit
    /// [default: 200].
    #[arg(long)]
    max_mutating_requests_inflight: Option<usize>,
    /// Longest a request other than a watch or stream may take; 0 none
    /// [default: 60s].
    #[arg(long)]
    request_timeout: Option<String>,
    /// Connections held at once, also bounded by the open-files limit
    /// [default: 10000].
    #[arg(long)]
    max_connections: Option<usize>,
    /// Connections held at once from one address; 0 no limit [default: 1000].
    #[arg(long)]
    max_connections_per_source: Option<usize>,
    /// kube-apiserver's EncryptionConfiguration (YAML or JSON): encrypt
    /// the resources it lists (secrets) in the datastore with aescbc,
    /// aesgcm or secretbox keys.
    #[arg(long, global = true)]
    encryption_provider_config: Option<PathBuf>,
    /// kube-apiserver's audit Policy (audit.k8s.io/v1, YAML or JSON):
    /// which requests are logged at which level (needs --audit-log-path).
    #[arg(long)]
    audit_policy_file: Option<PathBuf>,
    /// kube-apiserver's AdmissionConfiguration (apiserver.config.k8s.io/v1):
    /// the PodSecurity plugin's default levels and exemptions.
    #[arg(long)]
    admission_control_config_file: Option<PathBuf>,
    /// Write audit events here as JSON lines; '-' for stdout.
    #[arg(long)]
    audit_log_path: Option<String>,
    /// Days to keep rotated audit logs; 0 forever [default: 0].
    #[arg(long)]
    audit_log_maxage: Option<u64>,
    /// Rotated audit logs to keep; 0 all [default: 0].
    #[arg(long)]
    audit_log_maxbackup: Option<usize>,
    /// Megabytes an audit log grows to before it rotates [default: 100].
    #[arg(long)]
    audit_log_maxsize: Option<u64>,
    /// Trust ID tokens of this OIDC issuer (https) for people.
    #[arg(long)]
    oidc_issuer_url: Option<String>,
    /// The audience (aud) ID tokens must be for.
    #[arg(long)]
    oidc_client_id: Option<String>,
    /// Claim holding the username [default: sub].
    #[arg(long)]
    oidc_username_claim: Option<String>,
    /// Prefix of usernames; '-' for none [default: ISSUER_URL# unless the
    /// claim is email].
    #[arg(long)]
    oidc_username_prefix: Option<String>,
    /// Claim holding the groups (a string or an array of strings).
    #[arg(long)]
    oidc_groups_claim: Option<String>,
    /// Prefix of group names.
    #[arg(long)]
    oidc_groups_prefix: Option<String>,
    /// PEM CA bundle trusted for the issuer [default: the system's roots].
    #[arg(long)]
    oidc_ca_file: Option<PathBuf>,
    /// key=value a token's claim must hold (repeatable or comma-separated).
    #[arg(long, value_delimiter = ',')]
    oidc_required_claim: Vec<String>,
    /// Signing algorithms accepted (comma-separated: RS256, RS384, RS512,
    /// ES256, ES384, PS256, PS384, PS512) [default: RS256].
    #[arg(long, value_delimiter = ',')]
    oidc_signing_algs: Option<Vec<String>>,
    /// kube-apiserver's AuthenticationConfiguration (JWT issuers; no CEL);
    /// exclusive with the --oidc-* flags.
    #[arg(long)]
    authentication_config: Option<PathBuf>,
}

impl ServeArgs {
    fn resolve(&self) -> anyhow::Result<Config> {
        let flags = Settings {
            data_dir: self.data_dir.clone(),
            bind_address: self.bind_address.clone(),
            secure_port: self.secure_port,
            datastore_endpoint: self.datastore_endpoint.clone(),
            datastore_cafile: self.datastore_cafile.clone(),
            datastore_certfile: self.datastore_certfile.clone(),
            datastore_keyfile: self.datastore_keyfile.clone(),
            cluster_init: self.cluster_init.then_some(true),
            server: self.server.clone(),
            token: self.token.clone(),
            node_name: self.node_name.clone(),
            cluster_reset: self.cluster_reset.then_some(true),
            cluster_reset_restore_path: self.cluster_reset_restore_path.clone(),
            cluster_secret_file: self.cluster_secret_file.clone(),
            service_cluster_ip_range: self.service_cluster_ip_range.clone(),
            cluster_cidr: self.cluster_cidr.clone(),
            token_auth_file: self.token_auth_file.clone(),
            service_account_issuer: (!self.service_account_issuer.is_empty())
                .then(|| self.service_account_issuer.clone()),
            api_audiences: self.api_audiences.clone(),
            service_account_signing_key_file: self.service_account_signing_key_file.clone(),
            service_account_key_file: (!self.service_account_key_file.is_empty())
                .then(|| self.service_account_key_file.clone()),
            service_account_max_token_expiration: self.service_account_max_token_expiration.clone(),
            tls_san: (!self.tls_san.is_empty()).then(|| self.tls_san.clone()),
            disable_scheduler: self.disable_scheduler.then_some(true),
            scheduler_config: self.scheduler_config.clone(),
            disable_controller_manager: self.disable_controller_manager.then_some(true),
            leader_elect: self.leader_elect,
            watch_cache: self.watch_cache,
            controllers: self.controllers.clone(),
            node_cidr_mask_size: self.node_cidr_mask_size,
            node_monitor_period: self.node_monitor_period.clone(),
            node_monitor_grace_period: self.node_monitor_grace_period.clone(),
            default_not_ready_toleration_seconds: self.default_not_ready_toleration_seconds,
            default_unreachable_toleration_seconds: self.default_unreachable_toleration_seconds,
            cluster_signing_duration: self.cluster_signing_duration.clone(),
            etcd_compaction_interval: self.etcd_compaction_interval.clone(),
            etcd_snapshot_schedule_cron: self.etcd_snapshot_schedule_cron.clone(),
            etcd_snapshot_retention: self.etcd_snapshot_retention,
            etcd_snapshot_dir: self.etcd_snapshot_dir.clone(),
            etcd_disable_snapshots: self.etcd_disable_snapshots.then_some(true),
            event_ttl: self.event_ttl.clone(),
            max_requests_inflight: self.max_requests_inflight,
            max_mutating_requests_inflight: self.max_mutating_requests_inflight,
            request_timeout: self.request_timeout.clone(),
            max_connections: self.max_connections,
            max_connections_per_source: self.max_connections_per_source,
            encryption_provider_config: self.encryption_provider_config.clone(),
            audit_policy_file: self.audit_policy_file.clone(),
            admission_control_config_file: self.admission_control_config_file.clone(),
            audit_log_path: self.audit_log_path.clone(),
            audit_log_maxage: self.audit_log_maxage,
            audit_log_maxbackup: self.audit_log_maxbackup,
            audit_log_maxsize: self.audit_log_maxsize,
            oidc_issuer_url: self.oidc_issuer_url.clone(),
            oidc_client_id: self.oidc_client_id.clone(),
            oidc_username_claim: self.oidc_username_claim.clone(),
            oidc_username_prefix: self.oidc_username_prefix.clone(),
            oidc_groups_claim: self.oidc_groups_claim.clone(),
            oidc_groups_prefix: self.oidc_groups_prefix.clone(),
            oidc_ca_file: self.oidc_ca_file.clone(),
            oidc_required_claim: (!self.oidc_required_claim.is_empty())
                .then(|| self.oidc_required_claim.clone()),
            oidc_signing_algs: self.oidc_signing_algs.clone(),
            authentication_config: self.authentication_config.clone(),
        };
        Config::resolve(flags, self.config.as_deref()).context("resolving configuration")
    }
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Print a client-certificate kubeconfig signed by the cluster CA.
    Kubeconfig {
        #[arg(long)]
        user: String,
        #[arg(long)]
        group: Vec<String>,
        /// API server URL [default: the server's, as its admin.kubeconfig
        /// says, else from --bind-address and --secure-port].
        #[arg(long)]
        server: Option<String>,
    },
    /// Datastore snapshots.
    #[command(subcommand)]
    Snapshot(SnapshotCmd),
    /// The etcd cluster of --datastore-endpoint.
    #[command(subcommand)]
    Etcd(EtcdCmd),
    /// Join tokens for `skiff-agent join` (bootstrap token Secrets).
    #[command(subcommand)]
    Token(TokenCmd),
    /// Secrets encryption at rest (k3s's secrets-encrypt), with the keys
    /// of --encryption-provider-config.
    #[command(subcommand)]
    SecretsEncrypt(SecretsEncryptCmd),
    /// Install as a systemd service (binary, config, unit; enabled and started).
    Install {
        #[command(flatten)]
        dirs: InstallDirs,
        /// Install this config file (default: bind 0.0.0.0, state in --data-dir).
        #[arg(long)]
        config_from: Option<PathBuf>,
        /// Enable the unit without starting it.
        #[arg(long)]
        no_start: bool,
    },
    /// Stop and remove the service; --purge also removes the data dir (the
    /// cluster's state and CA) and the config.
    Uninstall {
        #[command(flatten)]
        dirs: InstallDirs,
        #[arg(long)]
        purge: bool,
    },
}

#[derive(Args, Debug)]
struct InstallDirs {
    #[arg(long, default_value = skiff_control_plane::install::DEFAULT_CONFIG_DIR)]
    config_dir: PathBuf,
    #[arg(long, default_value = skiff_daemon::install::DEFAULT_BIN_DIR)]
    bin_dir: PathBuf,
    #[arg(long, default_value = skiff_daemon::install::DEFAULT_UNIT_DIR)]
    unit_dir: PathBuf,
}

#[derive(Subcommand, Debug)]
enum TokenCmd {
    /// Create a token and print it as a join token (K10<CA hash>::<id>.<secret>).
    Create {
        /// Lifetime, e.g. 30m, 24h; 0 never expires.
        #[arg(long, default_value = "24h")]
        ttl: String,
        /// What the token is for, shown by `token list`.
        #[arg(long)]
        description: Option<String>,
        /// Extra groups (system:bootstrappers:...) [default: system:bootstrappers:skiff:default-node-token, whose nodes are approved automatically].
        #[arg(long, value_delimiter = ',')]
        groups: Vec<String>,
        #[command(flatten)]
        conn: TokenConn,
    },
    /// List the tokens (ids, not secrets).
    List {
        #[command(flatten)]
        conn: TokenConn,
    },
    /// Delete tokens, named by id, token or join token.
    Delete {
        #[arg(required = true)]
        tokens: Vec<String>,
        #[command(flatten)]
        conn: TokenConn,
    },
}

#[derive(Args, Debug)]
struct TokenConn {
    /// Admin kubeconfig [default: DATA_DIR/admin.kubeconfig].
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
}

impl TokenConn {
    async fn client(&self, cfg: &Config) -> anyhow::Result<kube::Client> {
        let path = self
            .kubeconfig
            .clone()
            .unwrap_or_else(|| cfg.data_dir.join("admin.kubeconfig"));
        let kc = kube::config::Kubeconfig::read_from(&path).with_context(|| {
            format!(
                "reading the admin kubeconfig {} (pass --kubeconfig)",
                path.display()
            )
        })?;
        let c = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .with_context(|| format!("using {}", path.display()))?;
        kube::Client::try_from(c).context("building the API client")
    }
}

#[derive(Subcommand, Debug)]
enum SecretsEncryptCmd {
    /// Whether encryption is on, the key that writes, and how many stored
    /// values each key (or plaintext) holds.
    Status,
    /// Put a new key first in the config file (old keys stay, to read);
    /// restart the server, then run reencrypt.
    Rotate,
    /// Rewrite every stored value of the configured resources with the
    /// first key. With SQLite, stop the server first.
    Reencrypt {
        /// Run although a server seems to serve this data dir (SQLite:
        /// its watchers would miss the rewrites).
        #[arg(long)]
        force: bool,
    },
}

#[derive(Subcommand, Debug)]
enum EtcdCmd {
    /// Every member: leader, raft term and index, database size, version.
    Status,
    /// Remove the member NAME from the cluster (stop its server first).
    Remove { name: String },
}

#[derive(Subcommand, Debug)]
enum SnapshotCmd {
    /// Write a consistent snapshot of the datastore, verified, to FILE
    /// [default: NAME-HOST-SECONDS in --etcd-snapshot-dir].
    Save {
        file: Option<PathBuf>,
        /// The name's prefix when no FILE is given.
        #[arg(long, default_value = snapshots::ON_DEMAND)]
        name: String,
    },
    /// The snapshots in --etcd-snapshot-dir, oldest first.
    #[command(alias = "ls")]
    List,
    /// Remove this host's snapshots named NAME-HOST-* beyond the newest
    /// --etcd-snapshot-retention.
    Prune {
        #[arg(long, default_value = snapshots::ON_DEMAND)]
        name: String,
    },
    /// Print revision, key count, size and hash of FILE.
    Status { file: PathBuf },
    /// Restore FILE (a path, or a name in --etcd-snapshot-dir) into
    /// --data-dir (which must not hold state yet).
    Restore { file: PathBuf },
}

fn main() -> anyhow::Result<()> {
    tune_allocator();
    skiff_daemon::logging::init("info");
    let cli = Cli::parse();
    // The in-process scheduler and controllers use kube's rustls client,
    // which needs the process-wide provider chosen.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = tokio::runtime::Runtime::new().context("starting the tokio runtime")?;
    rt.block_on(run(cli))
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let cfg = cli.serve.resolve()?;
    match cli.cmd {
        None => serve(cfg).await,
        Some(Cmd::Kubeconfig {
            user,
            group,
            server,
        }) => {
            let pki = pki::Pki::load_or_create(&cfg.data_dir).context("loading the cluster CA")?;
            let url = server.unwrap_or_else(|| skiff_control_plane::server::serving_url(&cfg));
            print!(
                "{}",
                pki.kubeconfig(&url, &user, &group)
                    .with_context(|| format!("issuing a certificate for {user}"))?
            );
            Ok(())
        }
        Some(Cmd::Token(cmd)) => token(cmd, &cfg).await,
        Some(Cmd::SecretsEncrypt(cmd)) => secrets_encrypt(cmd, &cfg).await,
        Some(Cmd::Install {
            dirs,
            config_from,
            no_start,
        }) => {
            let o = install::InstallOptions {
                config_dir: dirs.config_dir,
                config_from,
                data_dir: cfg.data_dir.clone(),
                bin_dir: dirs.bin_dir,
                unit_dir: dirs.unit_dir,
                start: !no_start,
            };
            let unit =
                install::install(&o, &SystemctlCommand).context("installing skiff-server")?;
            println!(
                "installed {}; once it serves: skiff-server token create --data-dir {}",
                unit.display(),
                cfg.data_dir.display()
            );
            Ok(())
        }
        Some(Cmd::Uninstall { dirs, purge }) => {
            let o = install::UninstallOptions {
                config_dir: dirs.config_dir,
                bin_dir: dirs.bin_dir,
                unit_dir: dirs.unit_dir,
                purge,
            };
            install::uninstall(&o, &SystemctlCommand).context("uninstalling skiff-server")?;
            println!(
                "uninstalled skiff-server{}",
                if purge { " and removed its state" } else { "" }
            );
            Ok(())
        }
        Some(Cmd::Snapshot(cmd)) => snapshot(cmd, &cfg).await,
        Some(Cmd::Etcd(cmd)) => etcd(cmd, &cfg).await,
    }
}

async fn etcd(cmd: EtcdCmd, cfg: &Config) -> anyhow::Result<()> {
    let endpoints = &cfg.datastore_endpoints;
    if endpoints.is_empty() {
        anyhow::bail!(
            "the datastore is SQLite in {}: there is no etcd cluster (pass --datastore-endpoint)",
            cfg.data_dir.display()
        );
    }
    match cmd {
        EtcdCmd::Status => {
            let members =
                store::etcd_members::status(endpoints, cfg.datastore_tls.as_ref()).await?;
            println!(
                "{:<20} {:<16} {:<28} {:<6} {:>10} {:>12} {:>10} {:<8} ERRORS",
                "NAME",
                "ID",
                "CLIENT URL",
                "LEADER",
                "RAFT TERM",
                "RAFT INDEX",
                "DB SIZE",
                "VERSION"
            );
            for m in members {
                let url = m.client_urls.first().map_or("", String::as_str);
                match &m.status {
                    Ok(s) => println!(
                        "{:<20} {:<16x} {:<28} {:<6} {:>10} {:>12} {:>10} {:<8} {}",
                        m.name,
                        m.id,
                        url,
                        s.leader,
                        s.raft_term,
                        s.raft_index,
                        s.db_size,
                        s.version,
                        s.errors.join("; ")
                    ),
                    Err(e) => println!(
                        "{:<20} {:<16x} {:<28} {:<6} {:>10} {:>12} {:>10} {:<8} {e}",
                        m.name, m.id, url, "-", "-", "-", "-", "-"
                    ),
                }
            }
        }
        EtcdCmd::Remove { name } => {
            let id =
                store::etcd_members::remove(endpoints, cfg.datastore_tls.as_ref(), &name).await?;
            println!("removed etcd member {name} ({id:x})");
        }
    }
    Ok(())
}

async fn snapshot(cmd: SnapshotCmd, cfg: &Config) -> anyhow::Result<()> {
    let dir = server::snapshots(cfg);
    match cmd {
        SnapshotCmd::Save { file, name } => {
            let st = server::open_store(cfg)
                .await
                .context("opening the datastore")?;
            let (path, info) = match file {
                Some(f) => {
                    let info = st
                        .snapshot_save(&f)
                        .await
                        .with_context(|| format!("saving snapshot {}", f.display()))?;
                    (f, info)
                }
                None => dir
                    .save(st.as_ref(), &name)
                    .await
                    .with_context(|| format!("saving a snapshot in {}", dir.dir.display()))?,
            };
            println!(
                "saved {} (revision {}, {} keys, {} bytes, hash {})",
                path.display(),
                info.revision,
                info.keys,
                info.size,
                info.hash
            );
        }
        SnapshotCmd::List => {
            let entries = dir
                .list()
                .with_context(|| format!("listing {}", dir.dir.display()))?;
            println!("{:<48} {:>12} {:<20}", "NAME", "SIZE", "CREATED");
            for e in entries {
                let created = jiff::Timestamp::from_second(i64::try_from(e.taken)?).map_or_else(
                    |_| e.taken.to_string(),
                    |t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
                );
                println!("{:<48} {:>12} {:<20}", e.name, e.size, created);
            }
        }
        SnapshotCmd::Prune { name } => {
            let removed = dir
                .prune(&name, cfg.snapshot_retention)
                .with_context(|| format!("pruning {}", dir.dir.display()))?;
            for p in &removed {
                println!("removed {}", p.display());
            }
            println!(
                "kept the newest {} {name} snapshots of {}",
                cfg.snapshot_retention, dir.node
            );
        }
        SnapshotCmd::Status { file } => {
            let file = named(&dir, file);
            let info = store::snapshot::snapshot_status(&file)
                .await
                .with_context(|| format!("reading snapshot {}", file.display()))?;
            println!(
                "revision: {}\nkeys: {}\nsize: {}\nhash: {}",
                info.revision, info.keys, info.size, info.hash
            );
        }
        SnapshotCmd::Restore { file } => {
            let file = named(&dir, file);
            store::snapshot::snapshot_restore(&file, &cfg.data_dir).with_context(|| {
                format!(
                    "restoring {} into {}",
                    file.display(),
                    cfg.data_dir.display()
                )
            })?;
            println!(
                "restored {} into {}",
                file.display(),
                cfg.data_dir.display()
            );
        }
    }
    Ok(())
}

/// `file` as given, or the snapshot of that name in the snapshot
/// directory when only that exists (as `snapshot list` names them).
fn named(dir: &snapshots::Snapshots, file: PathBuf) -> PathBuf {
    let listed = dir.dir.join(&file);
    if !file.exists() && file.components().count() == 1 && listed.is_file() {
        listed
    } else {
        file
    }
}

async fn serve(cfg: Config) -> anyhow::Result<()> {
    if let (Some(restore), Some(m)) = (&cfg.cluster_reset, &cfg.managed_etcd) {
        let dir = server::snapshots(&cfg);
        let file = restore.clone().map(|f| named(&dir, f));
        let next = store::managed::reset(&cfg, m, file.as_deref())
            .await
            .context("resetting the managed etcd cluster")?;
        println!("{next}");
        return Ok(());
    }
    let member = match &cfg.managed_etcd {
        Some(m) => Some(
            store::managed::start(&cfg, m)
                .await
                .context("starting the managed etcd member")?,
        ),
        None => None,
    };
    let st = server::open_store(&cfg)
        .await
        .context("opening the datastore")?;
    let handle = server::start(&cfg, st.clone())
        .await
        .context("starting skiff-server")?;
    if member.is_some() {
        // Every key exists once the server started (it makes the
        // front-proxy CA and the ServiceAccount key).
        store::managed::bootstrap::publish(&cfg, st.as_ref())
            .await
            .context("keeping the cluster's keys in etcd")?;
    }
    let components = components::start(
        &cfg,
        &cfg.data_dir,
        &handle.url,
        handle.api.components.clone(),
    )
    .await
    .context("starting the scheduler and controllers")?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing SIGTERM handler")?;
    // Serving: systemd may start what waits for the API server. The
    // watchdog pings come from this runtime, so a wedged server stops them.
    skiff_daemon::notify::ready(&format!("serving on {}", handle.url));
    let watchdog = skiff_daemon::notify::spawn_watchdog(|| true);
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupt: shutting down"),
    }
    skiff_daemon::notify::stopping();
    if let Some(w) = watchdog {
        w.abort();
    }
    components.shutdown().await;
    // A second signal forces the exit while the drain runs.
    tokio::select! {
        _ = handle.shutdown() => {}
        _ = term.recv() => tracing::warn!("second SIGTERM: exiting without draining"),
    }
    if let Some(member) = member {
        member.stop().await;
    }
    Ok(())
}

async fn secrets_encrypt(cmd: SecretsEncryptCmd, cfg: &Config) -> anyhow::Result<()> {
    use skiff_control_plane::store::encryption::{admin, EncryptedStore, EncryptionConfiguration};
    let path = cfg.encryption_provider_config.as_deref();
    let loaded = match path {
        Some(p) => Some(EncryptionConfiguration::load(p)?),
        None => None,
    };
    let transformers = match (&loaded, path) {
        (Some(c), Some(p)) => Some(c.transformers(p)?),
        _ => None,
    };
    let need = || {
        anyhow::anyhow!(
            "no --encryption-provider-config: pass the file the server runs with \
             (or set encryption-provider-config in --config)"
        )
    };
    match cmd {
        SecretsEncryptCmd::Status => {
            let raw = server::open_store(cfg)
                .await
                .context("opening the datastore")?;
            let counts = admin::status(raw.as_ref(), transformers.as_ref())
                .await
                .context("counting stored values")?;
            print!("{}", admin::status_text(path, &counts));
        }
        SecretsEncryptCmd::Rotate => {
            let (Some(mut c), Some(p)) = (loaded, path) else {
                return Err(need());
            };
            let added = c.rotate(jiff::Timestamp::now());
            let json = std::fs::read_to_string(p)?.trim_start().starts_with('{');
            c.save(p, json)?;
            println!(
                "added {} first in {} (older keys kept, to read)\n\
                 restart skiff-server to write with it, then run \
                 `skiff-server secrets-encrypt reencrypt`",
                added.join(", "),
                p.display()
            );
        }
        SecretsEncryptCmd::Reencrypt { force } => {
            let (Some(t), Some(_)) = (transformers, path) else {
                return Err(need());
            };
            let url = server::serving_url(cfg);
            if cfg.datastore_endpoints.is_empty() && !force && server::answers(&url) {
                anyhow::bail!(
                    "skiff-server is serving this data dir at {url}: stop it first. SQLite \
                     is written by one server, whose watchers would miss these rewrites \
                     (--force runs anyway; with etcd it runs beside the servers)"
                );
            }
            let raw = server::open_store(cfg)
                .await
                .context("opening the datastore")?;
            let store = EncryptedStore::new(raw, t.clone());
            let event_ttl = cfg.event_ttl;
            let done = admin::reencrypt(&store, &t, |key| {
                event_ttl.filter(|_| key.starts_with("/registry/core/events/"))
            })
            .await
            .context("re-encrypting")?;
            println!(
                "re-encrypted {} values; {} were already under the first key",
                done.rewritten, done.current
            );
        }
    }
    Ok(())
}

async fn token(cmd: TokenCmd, cfg: &Config) -> anyhow::Result<()> {
    match cmd {
        TokenCmd::Create {
            ttl,
            description,
            groups,
            conn,
        } => {
            let ttl = match skiff_control_plane::config::parse_duration(&ttl) {
                Ok(d) if d.is_zero() => None,
                Ok(d) => Some(d),
                Err(_) => {
                    anyhow::bail!("--ttl {ttl:?}: not a duration (use 30m, 24h, or 0 for never)")
                }
            };
            let spec = tokens::TokenSpec {
                ttl,
                description,
                groups,
            };
            let client = conn.client(cfg).await?;
            let join = tokens::create(&client, &spec)
                .await
                .context("creating a join token")?;
            println!("{}", join.expose());
        }
        TokenCmd::List { conn } => {
            let client = conn.client(cfg).await?;
            let all = tokens::list(&client).await.context("listing join tokens")?;
            print!("{}", tokens::table(&all, jiff::Timestamp::now()));
        }
        TokenCmd::Delete { tokens: args, conn } => {
            let client = conn.client(cfg).await?;
            for arg in args {
                let id = tokens::delete(&client, &arg).await?;
                println!("bootstrap token {id:?} deleted");
            }
        }
    }
    Ok(())
}
