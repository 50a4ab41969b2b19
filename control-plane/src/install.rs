//! `skiff-server install` and `skiff-server uninstall`: the control plane
//! as a systemd service.
//!
//! Install copies the running binary to the bin dir, writes
//! `CONFIG_DIR/config.yaml` (given, or a default serving on every address
//! with state in the data dir), and writes, enables and starts the unit.
//! Uninstall stops, disables and removes the unit and the binary; with
//! `--purge` it also removes the data dir (the datastore and the cluster
//! CA: the cluster is gone) and the config dir.

use std::path::{Path, PathBuf};

pub use skiff_daemon::install::UninstallOptions;
use skiff_daemon::install::{self as unit, Systemctl, Unit};

use crate::config::Settings;

/// The server's unit name.
pub const UNIT: &str = "skiff-server.service";
/// The config directory the shipped unit names.
pub const DEFAULT_CONFIG_DIR: &str = "/etc/skiff/server";
/// The config file in it.
pub const CONFIG_FILE: &str = "config.yaml";

/// Why installing or uninstalling failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Unit(#[from] unit::Error),
    #[error(transparent)]
    Config(#[from] crate::config::Error),
}

/// What `install` does.
#[derive(Debug, Clone)]
pub struct InstallOptions {
    pub config_dir: PathBuf,
    /// A config file to install instead of the default one.
    pub config_from: Option<PathBuf>,
    /// The default config's `data-dir`.
    pub data_dir: PathBuf,
    pub bin_dir: PathBuf,
    pub unit_dir: PathBuf,
    pub start: bool,
}

/// The config file `install` writes when none is given: every address, so
/// that workers can join (the serving certificate names this host's
/// addresses; add `tls-san` for others).
pub fn default_config(data_dir: &Path) -> String {
    format!(
        "# Written by `skiff-server install`; flags in the unit win over it.\n\
         data-dir: {}\n\
         bind-address: 0.0.0.0\n",
        data_dir.display()
    )
}

/// Install and start; returns the unit file's path.
///
/// # Errors
/// Any step; the ones done stay done.
pub fn install(o: &InstallOptions, systemctl: &dyn Systemctl) -> Result<PathBuf, Error> {
    let binary = o.bin_dir.join("skiff-server");
    unit::install_self(&binary)?;
    let config = o.config_dir.join(CONFIG_FILE);
    unit::install_config(
        &config,
        o.config_from.as_deref(),
        &default_config(&o.data_dir),
        |p| Settings::from_file(p).map(drop).map_err(|e| e.to_string()),
    )?;
    let u = Unit {
        name: UNIT,
        template: unit::SERVER_UNIT,
        binary,
        paths: vec![(
            format!("{DEFAULT_CONFIG_DIR}/{CONFIG_FILE}"),
            config.display().to_string(),
        )],
    };
    Ok(unit::install_unit(&u, &o.unit_dir, systemctl, o.start)?)
}

/// Stop and remove the unit and binary; with `purge`, the state too.
///
/// # Errors
/// A step failed; the ones before it are done.
pub fn uninstall(o: &UninstallOptions, systemctl: &dyn Systemctl) -> Result<(), Error> {
    unit::uninstall_unit(UNIT, &o.unit_dir, systemctl)?;
    unit::remove_path(&o.bin_dir.join("skiff-server"))?;
    if o.purge {
        let config = o.config_dir.join(CONFIG_FILE);
        let data_dir = if config.exists() {
            Settings::from_file(&config)?.data_dir
        } else {
            None
        };
        unit::remove_path(&data_dir.unwrap_or_else(|| crate::config::DEFAULT_DATA_DIR.into()))?;
        unit::remove_path(&o.config_dir)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_config_is_one_the_server_reads() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join(CONFIG_FILE);
        std::fs::write(&f, default_config(Path::new("/var/lib/skiff-server"))).unwrap();
        let c = crate::config::Config::resolve(Settings::default(), Some(&f)).unwrap();
        assert_eq!(c.bind_address.to_string(), "0.0.0.0");
        assert_eq!(c.data_dir, Path::new("/var/lib/skiff-server"));
    }
}
