//! Registry mirrors, logins and TLS for the node from one file in k3s's
//! `registries.yaml` format (`--registries-config`, default
//! `/etc/skiff/registries.yaml`): mirrors and TLS go into containerd's
//! registry host configuration ([`hosts`]), logins into the pulls
//! ([`auth`]).
//!
//! The file is read at start (an invalid one stops the agent, naming the
//! field) and again whenever it changes; a change that does not read is
//! reported and the settings in effect stay. The host files are written
//! where containerd reads them (its CRI `registry.config_path`); when
//! containerd has no `config_path`, nothing is written and the user is
//! told what to set, since containerd reads that setting only when it
//! starts.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use cri_proto::CriClient;

use crate::events::{ApiRecorder, NORMAL, WARNING};

pub mod auth;
pub mod config;
pub mod hosts;

pub use config::Registries;

/// How often the file is checked for changes.
const CHECK_PERIOD: Duration = Duration::from_secs(5);

/// The registries settings in effect, shared by the watcher (which
/// replaces them) and the image puller (which reads the logins).
#[derive(Debug, Clone, Default)]
pub struct Current(Arc<RwLock<Arc<Registries>>>);

impl Current {
    pub fn new(registries: Registries) -> Current {
        Current(Arc::new(RwLock::new(Arc::new(registries))))
    }

    pub fn get(&self) -> Arc<Registries> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set(&self, registries: Registries) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(registries);
    }
}

/// A file's size and modification time, to notice changes.
type Stamp = Option<(u64, Option<SystemTime>)>;

fn stamp(path: &Path) -> Stamp {
    std::fs::metadata(path)
        .ok()
        .map(|m| (m.len(), m.modified().ok()))
}

/// Keeps containerd's host files and [`Current`] in line with the file.
pub struct Watcher {
    path: PathBuf,
    cri: CriClient,
    current: Current,
    recorder: Option<ApiRecorder>,
}

impl Watcher {
    pub fn new(
        path: PathBuf,
        cri: CriClient,
        current: Current,
        recorder: Option<ApiRecorder>,
    ) -> Watcher {
        Watcher {
            path,
            cri,
            current,
            recorder,
        }
    }

    /// Apply what was loaded at start, then every change, until `shutdown`.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let mut seen = stamp(&self.path);
        self.apply(&self.current.get()).await;
        let mut ticks = crate::ticks::Ticks::new(CHECK_PERIOD, shutdown);
        while ticks.next().await {
            let now = stamp(&self.path);
            if now == seen {
                continue;
            }
            seen = now;
            match config::load(&self.path) {
                Ok(r) if r == *self.current.get() => {}
                Ok(r) => {
                    self.current.set(r);
                    self.apply(&self.current.get()).await;
                }
                Err(e) => self.report(
                    WARNING,
                    "RegistriesConfigInvalid",
                    format!("{e}; the registry settings in effect are kept"),
                ),
            }
        }
    }

    /// Write the host files `registries` needs where containerd reads them.
    async fn apply(&self, registries: &Registries) {
        let files = hosts::render(registries, &self.path);
        let Some(root) = hosts_dir(&self.cri).await else {
            if !files.is_empty() {
                self.report(
                    WARNING,
                    "RegistriesConfigNotApplied",
                    format!(
                        "containerd reads no registry host configuration, so the mirrors and TLS settings of {} are not in effect: set config_path = \"/etc/containerd/certs.d\" under [plugins.\"io.containerd.grpc.v1.cri\".registry] in containerd's config, restart containerd, then restart skiff-agent",
                        self.path.display()
                    ),
                );
            }
            return;
        };
        let problems = hosts::sync(&root, &files);
        for p in &problems {
            self.report(WARNING, "RegistriesConfigNotApplied", p.clone());
        }
        if problems.is_empty() && !files.is_empty() {
            let names: Vec<&str> = files.keys().map(String::as_str).collect();
            self.report(
                NORMAL,
                "RegistriesConfigApplied",
                format!(
                    "Registry host configuration from {} written to {} for {}",
                    self.path.display(),
                    root.display(),
                    names.join(", ")
                ),
            );
        }
    }

    fn report(&self, type_: &str, reason: &str, message: String) {
        crate::events::report_node(self.recorder.as_ref(), type_, reason, &message);
    }
}

/// Where containerd reads registry host files: the first directory of its
/// CRI `registry.configPath`; None when it has none.
async fn hosts_dir(cri: &CriClient) -> Option<PathBuf> {
    let config = crate::images::runtime_config(cri).await?;
    first_dir(config["registry"]["configPath"].as_str()?)
}

/// containerd takes a `:`-separated list and reads the first directory
/// that has a host's file; files are written to the first.
fn first_dir(config_path: &str) -> Option<PathBuf> {
    config_path
        .split(':')
        .find(|p| !p.is_empty())
        .map(PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_configured_directory() {
        assert_eq!(
            first_dir("/etc/containerd/certs.d:/etc/docker/certs.d"),
            Some(PathBuf::from("/etc/containerd/certs.d"))
        );
        assert_eq!(first_dir(""), None);
    }

    #[test]
    fn current_is_replaced_for_later_readers() {
        let current = Current::default();
        let before = current.get();
        let mut r = Registries::default();
        r.configs.insert("r.example".into(), Default::default());
        current.set(r.clone());
        assert_eq!(*current.get(), r);
        assert_eq!(*before, Registries::default());
    }
}
