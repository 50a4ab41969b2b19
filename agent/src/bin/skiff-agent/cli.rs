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
    /// Stop and remove every pod sandbox the agent made on the container
    /// runtime, with its network namespace and logs: for after the agent
    /// has stopped (`scripts/down.sh` runs it before stopping containerd).
    RemovePods {
        #[arg(long, default_value = skiff_agent::config::DEFAULT_RUNTIME_ENDPOINT)]
        container_runtime_endpoint: String,
        #[arg(long, default_value = skiff_agent::config::DEFAULT_POD_LOG_DIR)]
        pod_log_dir: PathBuf,
    },
    /// The node's images, through the container runtime (as crictl).
    Images {
        #[arg(long, default_value = skiff_agent::config::DEFAULT_RUNTIME_ENDPOINT)]
        container_runtime_endpoint: String,
        #[command(subcommand)]
        command: ImagesCommand,
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

#[derive(Debug, Subcommand)]
pub enum ImagesCommand {
    /// List images: IMAGE, TAG, IMAGE ID, SIZE.
    #[command(visible_alias = "ls")]
    List,
    /// Import image archives (OCI or docker-archive tars, optionally
    /// gzip or zstd compressed) through containerd's `ctr`.
    Import {
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Remove images by reference or ID.
    #[command(visible_alias = "rmi")]
    Rm {
        #[arg(required = true)]
        references: Vec<String>,
    },
}

#[derive(Debug, clap::Args)]
pub struct JoinArgs {
    /// The API server, https://HOST:PORT; several, comma-separated, are
    /// tried in turn (the agent learns the others once joined).
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
    // Every setting, declared once in the library with its flag and key.
    #[command(flatten)]
    pub settings: skiff_agent::config::Settings,
    /// Remove the service proxy's rules (both modes) and exit, as
    /// kube-proxy --cleanup.
    #[arg(long)]
    pub cleanup: bool,
}
