//! `skiff-agent install` and `skiff-agent uninstall`.

use anyhow::{Context, Result};
use skiff_agent::install::{self, InstallOptions, UninstallOptions};
use skiff_daemon::install::SystemctlCommand;

use crate::cli::{InstallArgs, UninstallArgs};

pub async fn install(a: InstallArgs) -> Result<()> {
    let o = InstallOptions {
        join: crate::join::options(a.join)?,
        config_from: a.config_from,
        bin_dir: a.bin_dir,
        unit_dir: a.unit_dir,
        start: !a.no_start,
    };
    let unit = install::install(&o, &SystemctlCommand)
        .await
        .context("installing skiff-agent")?;
    println!("installed {}; node {:?}", unit.display(), o.join.node_name);
    Ok(())
}

pub async fn uninstall(a: UninstallArgs) -> Result<()> {
    let o = UninstallOptions {
        config_dir: a.config_dir,
        bin_dir: a.bin_dir,
        unit_dir: a.unit_dir,
        purge: a.purge,
    };
    install::uninstall(&o, &SystemctlCommand)
        .await
        .context("uninstalling skiff-agent")?;
    println!(
        "uninstalled skiff-agent{}",
        if o.purge {
            " and purged its pods and state"
        } else {
            ""
        }
    );
    Ok(())
}
