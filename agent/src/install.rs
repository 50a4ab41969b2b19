//! `skiff-agent install` and `skiff-agent uninstall`: the agent as a
//! systemd service on a fresh worker.
//!
//! Install: the running binary is copied to the bin dir, the config file
//! `CONFIG_DIR/config.yaml` is written (given, or a default with both
//! certificate rotations on), the node joins (unless it already has), and
//! the unit is written, enabled and started. Each step is idempotent, so a
//! failed install can be run again.
//!
//! Uninstall: the unit is stopped, disabled and removed, and the binary
//! with it. With `--purge` the node's pods are torn down through CRI, the
//! mounts under its root dir undone, the service proxy's rules, pod routes
//! and masquerade table removed, and its root dir, pod logs and config
//! directory (credentials included) removed.

use std::path::PathBuf;
use std::time::Duration;

pub use skiff_daemon::install::UninstallOptions;
use skiff_daemon::install::{self as unit, Systemctl, Unit};

use crate::certs::join::{self, JoinOptions};
use crate::config::{Settings, CONFIG_FILE, DEFAULT_CONFIG_DIR};

/// The agent's unit name.
pub const UNIT: &str = "skiff-agent.service";
/// How long pods get to stop when purged.
const PURGE_GRACE_SECONDS: i64 = 10;

/// Why installing or uninstalling failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Join(#[from] join::Error),
    #[error(transparent)]
    Unit(#[from] unit::Error),
    #[error(transparent)]
    Config(#[from] crate::config::Error),
    #[error("purging pods through {endpoint}: {source}")]
    Runtime {
        endpoint: String,
        #[source]
        source: cri_proto::Error,
    },
    #[error("unmounting under {path}: {why}")]
    Unmount {
        path: PathBuf,
        why: crate::volumes::Error,
    },
    #[error("removing the node's network rules and routes: {0:#}")]
    Network(anyhow::Error),
}

/// What `install` does.
#[derive(Debug, Clone)]
pub struct InstallOptions {
    /// The join (its config dir is where everything goes).
    pub join: JoinOptions,
    /// A config file to install instead of the default one.
    pub config_from: Option<PathBuf>,
    pub bin_dir: PathBuf,
    pub unit_dir: PathBuf,
    /// Start the unit (else only enable it).
    pub start: bool,
}

/// The config file `install` writes when none is given.
pub fn default_config(node_name: Option<&str>) -> String {
    let mut text = String::from(
        "# Written by `skiff-agent install`; flags in the unit win over it.\n\
         containerRuntimeEndpoint: unix:///run/containerd/containerd.sock\n\
         rotateCertificates: true\n\
         serverTLSBootstrap: true\n",
    );
    if let Some(n) = node_name {
        text.push_str(&format!("nodeName: {n}\n"));
    }
    text
}

/// Install, join and start; returns the unit file's path.
///
/// # Errors
/// Any step; the ones done stay done (run it again, or uninstall).
pub async fn install(o: &InstallOptions, systemctl: &dyn Systemctl) -> Result<PathBuf, Error> {
    let dir = &o.join.config_dir;
    let binary = o.bin_dir.join("skiff-agent");
    unit::install_self(&binary)?;
    // Refuse a file the agent would refuse at start.
    unit::install_config(
        &dir.join(CONFIG_FILE),
        o.config_from.as_deref(),
        &default_config(Some(&o.join.node_name)),
        |p| Settings::from_file(p).map(drop).map_err(|e| e.to_string()),
    )?;
    match join::join(&o.join).await {
        Ok(j) => tracing::info!(node = %j.node_name, "joined"),
        Err(join::Error::AlreadyJoined { node, .. }) => {
            tracing::info!(node, "already joined: keeping its credentials");
        }
        Err(e) => return Err(e.into()),
    }
    let u = Unit {
        name: UNIT,
        template: skiff_daemon::install::AGENT_UNIT,
        binary,
        paths: vec![(DEFAULT_CONFIG_DIR.into(), dir.display().to_string())],
    };
    Ok(unit::install_unit(&u, &o.unit_dir, systemctl, o.start)?)
}

/// Stop and remove the unit and binary; with `purge`, the node's pods and
/// state too.
///
/// # Errors
/// A step failed; the ones before it are done.
pub async fn uninstall(o: &UninstallOptions, systemctl: &dyn Systemctl) -> Result<(), Error> {
    unit::uninstall_unit(UNIT, &o.unit_dir, systemctl)?;
    unit::remove_path(&o.bin_dir.join("skiff-agent"))?;
    if !o.purge {
        return Ok(());
    }
    let mut settings = Settings {
        config_dir: Some(o.config_dir.clone()),
        ..Settings::default()
    };
    let file = o.config_dir.join(CONFIG_FILE);
    if file.exists() {
        settings = settings.or(Settings::from_file(&file)?);
    }
    let config = settings.resolve();
    remove_pods(&config.container_runtime_endpoint, &config.pod_log_dir).await?;
    // The proxy's rules and the pod routes outlive the agent by design (a
    // restart must not cut connections); a node leaving drops them.
    skiff_proxy::cleanup(&[skiff_proxy::Mode::Nftables, skiff_proxy::Mode::Iptables])
        .await
        .map_err(|e| Error::Network(e.into()))?;
    crate::network::cleanup().await.map_err(Error::Network)?;
    crate::volumes::mounts::unmount_all(&config.root_dir).map_err(|why| Error::Unmount {
        path: config.root_dir.clone(),
        why,
    })?;
    unit::remove_path(&config.root_dir)?;
    unit::remove_path(&o.config_dir)?;
    Ok(())
}

/// Stop and remove every pod this agent created, and their log
/// directories: `uninstall --purge`, and `skiff-agent remove-pods` after the
/// agent has stopped (a sandbox left behind keeps its network namespace).
/// A runtime that is not there has nothing to remove.
///
/// # Errors
/// The runtime answered a stop or remove with an error.
pub async fn remove_pods(endpoint: &str, pod_log_dir: &std::path::Path) -> Result<(), Error> {
    let endpoint = endpoint.to_string();
    let rt_err = |source| Error::Runtime {
        endpoint: endpoint.clone(),
        source,
    };
    let cri = cri_proto::CriClient::connect_lazy(endpoint.clone(), Duration::from_secs(30))
        .map_err(rt_err)?;
    let runtime = crate::runtime::Runtime::new(cri);
    let (sandboxes, _) = match runtime.list_managed().await {
        Ok(x) => x,
        Err(e) => {
            tracing::warn!(
                endpoint,
                "container runtime not reachable, no pods to purge: {e}"
            );
            return Ok(());
        }
    };
    let mut uids: Vec<String> = sandboxes
        .iter()
        .filter_map(|s| s.labels.get(crate::runtime::labels::POD_UID).cloned())
        .collect();
    uids.sort();
    uids.dedup();
    for uid in uids {
        let pod = runtime.observe_pod(&uid).await.map_err(rt_err)?;
        runtime
            .teardown_pod(&pod, Some(PURGE_GRACE_SECONDS))
            .await
            .map_err(rt_err)?;
        crate::worker::remove_log_dirs_of(pod_log_dir, &uid);
        tracing::info!(uid, "purged pod");
    }
    Ok(())
}
