//! Installing a daemon as a systemd service, and removing it: the binary
//! copied into place, the unit file rendered for the paths in use and
//! written, `systemctl daemon-reload`, `enable --now`; and the reverse.
//!
//! systemctl is behind [`Systemctl`], so the steps can be checked with a
//! recording fake; the real one runs the `systemctl` binary.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The agent's unit file as shipped in `systemd/`.
pub const AGENT_UNIT: &str = include_str!("../../systemd/skiff-agent.service");
/// The server's unit file as shipped in `systemd/`.
pub const SERVER_UNIT: &str = include_str!("../../systemd/skiff-server.service");
/// Where the shipped units expect the binaries.
pub const DEFAULT_BIN_DIR: &str = "/usr/local/bin";
/// Where units installed by an administrator live.
pub const DEFAULT_UNIT_DIR: &str = "/etc/systemd/system";

/// Installation errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be written, copied or removed.
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The config file to install is one the daemon would refuse.
    #[error("config file {path}: {why}")]
    Config { path: PathBuf, why: String },
    /// systemctl could not be run, or failed.
    #[error("systemctl {args}: {why}")]
    Systemctl { args: String, why: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_owned();
    move |source| Error::Io { what, path, source }
}

/// The service manager, as far as installation needs it.
pub trait Systemctl {
    /// Run `systemctl <args>`.
    ///
    /// # Errors
    /// It cannot be run or exits non-zero.
    fn run(&self, args: &[&str]) -> Result<()>;
}

/// The real `systemctl`.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemctlCommand;

impl Systemctl for SystemctlCommand {
    fn run(&self, args: &[&str]) -> Result<()> {
        let err = |why: String| Error::Systemctl {
            args: args.join(" "),
            why,
        };
        let out = Command::new("systemctl")
            .args(args)
            .output()
            .map_err(|e| err(format!("cannot run systemctl: {e}")))?;
        if !out.status.success() {
            return Err(err(format!(
                "{} {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    }
}

/// What `uninstall` does, for either daemon.
#[derive(Debug, Clone)]
pub struct UninstallOptions {
    pub config_dir: PathBuf,
    pub bin_dir: PathBuf,
    pub unit_dir: PathBuf,
    /// Also remove the daemon's state: the agent's pods, rules, state and
    /// credentials; the server's data dir (datastore, CA) and config.
    pub purge: bool,
}

/// A daemon's unit as installed.
#[derive(Debug, Clone)]
pub struct Unit {
    /// `skiff-agent.service`.
    pub name: &'static str,
    /// The shipped unit file.
    pub template: &'static str,
    /// Where the binary is installed (`ExecStart`).
    pub binary: PathBuf,
    /// (shipped path, path in use) pairs for the config paths.
    pub paths: Vec<(String, String)>,
}

impl Unit {
    /// The unit file for the paths in use.
    pub fn render(&self) -> String {
        let exe = self.name.trim_end_matches(".service").to_string();
        let mut text = self.template.replace(
            &format!("{DEFAULT_BIN_DIR}/{exe}"),
            &self.binary.display().to_string(),
        );
        for (from, to) in &self.paths {
            text = text.replace(from.as_str(), to.as_str());
        }
        text
    }
}

/// Copy the running executable to `dst` (see [`install_binary`]).
///
/// # Errors
/// The executable cannot be found, or copying fails.
pub fn install_self(dst: &Path) -> Result<()> {
    let exe = std::env::current_exe().map_err(io("finding", Path::new("the running binary")))?;
    install_binary(&exe, dst)
}

/// Copy `src` (normally the running executable) to `dst` (mode 0755,
/// replaced atomically); nothing to do when they are the same file.
///
/// # Errors
/// Copying fails.
pub fn install_binary(src: &Path, dst: &Path) -> Result<()> {
    let same = match (std::fs::canonicalize(src), std::fs::canonicalize(dst)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if same {
        return Ok(());
    }
    if let Some(dir) = dst.parent() {
        std::fs::create_dir_all(dir).map_err(io("creating", dir))?;
    }
    let tmp = dst.with_extension("new");
    std::fs::copy(src, &tmp).map_err(io("copying the binary to", &tmp))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
        .map_err(io("making executable", &tmp))?;
    std::fs::rename(&tmp, dst).map_err(io("installing", dst))
}

/// Put the daemon's config file at `path`: a copy of `from` (after
/// `check` accepts it), or else `default` unless a file is already there
/// (a re-run keeps what an operator edited).
///
/// # Errors
/// `check` refuses the file (its message), or reading or writing fails.
pub fn install_config(
    path: &Path,
    from: Option<&Path>,
    default: &str,
    check: impl FnOnce(&Path) -> std::result::Result<(), String>,
) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io("creating", dir))?;
    }
    match from {
        Some(src) => {
            check(src).map_err(|why| Error::Config {
                path: src.to_owned(),
                why,
            })?;
            std::fs::copy(src, path).map_err(io("writing", path))?;
        }
        None if !path.exists() => std::fs::write(path, default).map_err(io("writing", path))?,
        None => {}
    }
    Ok(())
}

/// Write the unit into `unit_dir`, reload systemd, and enable and start it.
///
/// # Errors
/// Writing or systemctl failed.
pub fn install_unit(
    unit: &Unit,
    unit_dir: &Path,
    systemctl: &dyn Systemctl,
    start: bool,
) -> Result<PathBuf> {
    std::fs::create_dir_all(unit_dir).map_err(io("creating", unit_dir))?;
    let path = unit_dir.join(unit.name);
    std::fs::write(&path, unit.render()).map_err(io("writing", &path))?;
    systemctl.run(&["daemon-reload"])?;
    if start {
        systemctl.run(&["enable", "--now", unit.name])?;
    } else {
        systemctl.run(&["enable", unit.name])?;
    }
    Ok(path)
}

/// Stop and disable the unit, remove its file and reload systemd. A unit
/// that is not there is not an error.
///
/// # Errors
/// Removing the file or reloading failed.
pub fn uninstall_unit(name: &str, unit_dir: &Path, systemctl: &dyn Systemctl) -> Result<()> {
    let path = unit_dir.join(name);
    if path.exists() {
        // Already stopped or never enabled: the removal below still goes on.
        if let Err(e) = systemctl.run(&["disable", "--now", name]) {
            tracing::warn!("{e}");
        }
        std::fs::remove_file(&path).map_err(io("removing", &path))?;
        systemctl.run(&["daemon-reload"])?;
    }
    Ok(())
}

/// Remove `path` if it exists.
///
/// # Errors
/// It exists and cannot be removed.
pub fn remove_path(path: &Path) -> Result<()> {
    let r = if path.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    };
    match r {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io("removing", path)(e)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Recorder(Mutex<Vec<String>>);

    impl Systemctl for Recorder {
        fn run(&self, args: &[&str]) -> Result<()> {
            self.0.lock().unwrap().push(args.join(" "));
            Ok(())
        }
    }

    #[test]
    fn units_are_rendered_written_enabled_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let unit = Unit {
            name: "skiff-agent.service",
            template: AGENT_UNIT,
            binary: dir.path().join("bin/skiff-agent"),
            paths: vec![("/etc/skiff/agent".into(), "/srv/agent".into())],
        };
        let text = unit.render();
        assert!(text.contains(&format!(
            "ExecStart={} --config-dir /srv/agent",
            unit.binary.display()
        )));
        assert!(text.contains("Type=notify") && text.contains("KillMode=process"));
        let sys = Recorder::default();
        let path = install_unit(&unit, dir.path(), &sys, true).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
        uninstall_unit(unit.name, dir.path(), &sys).unwrap();
        assert!(!path.exists());
        uninstall_unit(unit.name, dir.path(), &sys).unwrap();
        assert_eq!(
            *sys.0.lock().unwrap(),
            vec![
                "daemon-reload",
                "enable --now skiff-agent.service",
                "disable --now skiff-agent.service",
                "daemon-reload"
            ]
        );
    }

    #[test]
    fn binaries_are_copied_once() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("a");
        std::fs::write(&src, b"#!/bin/sh\n").unwrap();
        let dst = dir.path().join("bin/a");
        install_binary(&src, &dst).unwrap();
        install_binary(&dst, &dst).unwrap();
        assert_eq!(std::fs::read(&dst).unwrap(), b"#!/bin/sh\n");
    }
}
