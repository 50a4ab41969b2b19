//! The container log manager (the kubelet's `ContainerLogManager`): every
//! monitor interval (10 s) the log of each running container that has
//! reached containerLogMaxSize is rotated: leftovers of an interrupted
//! rotation are removed, the oldest rotated files beyond
//! containerLogMaxFiles are removed, the older rotated files are gzipped,
//! and the current file is renamed to `<file>.<YYYYMMDD-HHMMSS>` before the
//! runtime is told to reopen it (CRI ReopenContainerLog), so the runtime
//! starts a new file and nothing written is lost.
//!
//! The newest rotated file stays uncompressed: the runtime may write to it
//! until the reopen, and followers read it to its end.

use std::future::Future;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cri_proto::{v1, CriClient};
use jiff::Timestamp;

use super::{classify_rotated, dir_names, GZ_SUFFIX, TMP_SUFFIX};

/// Errors rotating one container's log. The manager logs them and tries
/// again on the next round.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The runtime could not be asked about the container.
    #[error("cannot get the status of container {id}: {source}")]
    Status {
        id: String,
        #[source]
        source: cri_proto::Error,
    },
    /// Removing, compressing or renaming files failed.
    #[error("cannot rotate {path}: {source}")]
    Files {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// ReopenContainerLog failed; the rotated file was renamed back, so the
    /// next round tries again with nothing lost.
    #[error("runtime cannot reopen the log {path}: {source}")]
    Reopen {
        path: PathBuf,
        #[source]
        source: cri_proto::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// containerLogMaxSize and containerLogMaxFiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Rotate a log once it has this many bytes.
    pub max_size: u64,
    /// Files per container log, the current one included (>= 2).
    pub max_files: u32,
}

/// Rotates the logs of the runtime's running containers.
pub struct LogManager {
    cri: CriClient,
    policy: Policy,
    period: Duration,
}

impl LogManager {
    pub fn new(cri: CriClient, policy: Policy, period: Duration) -> LogManager {
        LogManager {
            cri,
            policy,
            period,
        }
    }

    /// Check every `period` until `shutdown` resolves.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        tracing::info!(
            max_size = self.policy.max_size,
            max_files = self.policy.max_files,
            period = ?self.period,
            "container log rotation"
        );
        let mut ticks = crate::ticks::Ticks::new(self.period, shutdown);
        while ticks.next().await {
            if let Err(e) = self.rotate_all().await {
                tracing::warn!("cannot list containers for log rotation: {e}");
            }
        }
    }

    /// One round over every running container (only those write; a
    /// stopped container's log stays as it is). Returns how many logs
    /// were rotated.
    ///
    /// # Errors
    /// Listing the containers failed; a single container's failure is
    /// logged and does not stop the round.
    pub async fn rotate_all(&self) -> Result<usize, cri_proto::Error> {
        let running = v1::ContainerFilter {
            state: Some(v1::ContainerStateValue {
                state: v1::ContainerState::ContainerRunning as i32,
            }),
            ..Default::default()
        };
        let containers = self
            .cri
            .list_containers(v1::ListContainersRequest {
                filter: Some(running),
            })
            .await?
            .containers;
        let mut rotated = 0;
        for c in containers {
            match self.rotate_container(&c.id).await {
                Ok(true) => rotated += 1,
                Ok(false) => {}
                Err(e) => tracing::warn!(container = %c.id, "log rotation failed: {e}"),
            }
        }
        Ok(rotated)
    }

    async fn rotate_container(&self, id: &str) -> Result<bool> {
        let status_err = |source| Error::Status {
            id: id.to_string(),
            source,
        };
        let status = self
            .cri
            .container_status(v1::ContainerStatusRequest {
                container_id: id.to_string(),
                verbose: false,
            })
            .await
            .map_err(status_err)?;
        let path = status.status.map(|s| s.log_path).unwrap_or_default();
        if path.is_empty() {
            return Ok(false);
        }
        let path = PathBuf::from(path);
        let reopen = || async {
            self.cri
                .reopen_container_log(v1::ReopenContainerLogRequest {
                    container_id: id.to_string(),
                })
                .await
                .map(|_| ())
        };
        let size = match tokio::fs::metadata(&path).await {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // Renamed by a rotation whose reopen never happened (the
                // agent died in between): have the runtime start a file.
                reopen().await.map_err(|source| Error::Reopen {
                    path: path.clone(),
                    source,
                })?;
                return Ok(false);
            }
            Err(source) => return Err(Error::Files { path, source }),
        };
        if size < self.policy.max_size {
            return Ok(false);
        }
        let rotated = rotate(&path, self.policy.max_files, Timestamp::now(), reopen).await?;
        if rotated {
            tracing::debug!(container = %id, path = %path.display(), size, "log rotated");
        }
        Ok(rotated)
    }
}

/// The name a log rotated at `now` gets (the kubelet's format, UTC).
pub fn rotated_name(current: &Path, now: Timestamp) -> PathBuf {
    let stamp = now.strftime("%Y%m%d-%H%M%S");
    PathBuf::from(format!("{}.{stamp}", current.display()))
}

/// Rotate the log at `current` now: make room for it among at most
/// `max_files` files, rename it, and have the runtime reopen it with
/// `reopen`. Returns false when a file rotated in the same second exists
/// (the next round rotates).
///
/// # Errors
/// [`Error::Files`] for file operations; [`Error::Reopen`] when the
/// runtime cannot reopen, after the file was renamed back.
pub async fn rotate<F, Fut>(
    current: &Path,
    max_files: u32,
    now: Timestamp,
    reopen: F,
) -> Result<bool>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<(), cri_proto::Error>>,
{
    let rotated = rotated_name(current, now);
    let gz = PathBuf::from(format!("{}{GZ_SUFFIX}", rotated.display()));
    if rotated.exists() || gz.exists() {
        return Ok(false);
    }
    let p = current.to_path_buf();
    tokio::task::spawn_blocking(move || make_room(&p, max_files))
        .await
        .map_err(|e| Error::Files {
            path: current.to_path_buf(),
            source: std::io::Error::other(e),
        })??;
    tokio::fs::rename(current, &rotated)
        .await
        .map_err(|source| Error::Files {
            path: current.to_path_buf(),
            source,
        })?;
    if let Err(source) = reopen().await {
        // Put it back so the next round retries. Lines the runtime wrote
        // in between went to the same file, so they are kept.
        if let Err(e) = tokio::fs::rename(&rotated, current).await {
            tracing::error!(path = %current.display(), "cannot rename rotated log back: {e}");
        }
        return Err(Error::Reopen {
            path: current.to_path_buf(),
            source,
        });
    }
    Ok(true)
}

/// Remove leftovers and the oldest rotated files so that, with the
/// current file and the one about to be rotated, at most `max_files`
/// remain; compress the rest.
fn make_room(current: &Path, max_files: u32) -> Result<()> {
    let dir = current.parent().unwrap_or(Path::new("."));
    let (in_use, unused) = classify_rotated(current, &dir_names(dir));
    let files_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Files { path, source }
    };
    for f in &unused {
        remove(f).map_err(files_err(f))?;
    }
    let keep = (max_files as usize).saturating_sub(2);
    let excess = in_use.len().saturating_sub(keep);
    // Oldest first, so a reader going through them in order keeps going.
    for f in &in_use[..excess] {
        remove(f).map_err(files_err(f))?;
    }
    for f in &in_use[excess..] {
        if !f.to_string_lossy().ends_with(GZ_SUFFIX) {
            compress(f).map_err(files_err(f))?;
        }
    }
    Ok(())
}

fn remove(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// `f` -> `f.gz`, through `f.tmp` so that a crash leaves no torn archive.
fn compress(path: &Path) -> std::io::Result<()> {
    let tmp = PathBuf::from(format!("{}{TMP_SUFFIX}", path.display()));
    let done = PathBuf::from(format!("{}{GZ_SUFFIX}", path.display()));
    let mut src = std::fs::File::open(path)?;
    let perms = src.metadata()?.permissions();
    let result = (|| {
        let out = std::fs::File::create(&tmp)?;
        out.set_permissions(perms)?;
        let mut gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
        std::io::copy(&mut src, &mut gz)?;
        gz.finish()?.flush()?;
        std::fs::rename(&tmp, &done)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result?;
    std::fs::remove_file(path)
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut n = dir_names(dir);
        n.sort();
        n
    }

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[tokio::test]
    async fn rotation_keeps_at_most_max_files_oldest_removed_older_compressed() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        let reopen = |text: &'static str| {
            let log = log.clone();
            move || async move {
                std::fs::write(&log, text).unwrap();
                Ok(())
            }
        };
        std::fs::write(&log, "one\n").unwrap();
        assert!(rotate(&log, 3, at("2026-11-30T06:00:01Z"), reopen("two\n"))
            .await
            .unwrap());
        assert_eq!(names(dir.path()), ["0.log", "0.log.20261130-060001"]);
        assert!(
            rotate(&log, 3, at("2026-11-30T06:00:02Z"), reopen("three\n"))
                .await
                .unwrap()
        );
        assert_eq!(
            names(dir.path()),
            ["0.log", "0.log.20261130-060001.gz", "0.log.20261130-060002"]
        );
        let mut text = String::new();
        flate2::read::GzDecoder::new(
            std::fs::File::open(dir.path().join("0.log.20261130-060001.gz")).unwrap(),
        )
        .read_to_string(&mut text)
        .unwrap();
        assert_eq!(text, "one\n");
        assert!(
            rotate(&log, 3, at("2026-11-30T06:00:03Z"), reopen("four\n"))
                .await
                .unwrap()
        );
        assert_eq!(
            names(dir.path()),
            ["0.log", "0.log.20261130-060002.gz", "0.log.20261130-060003"]
        );
        // Twice in one second: the second waits for the next round.
        assert!(!rotate(&log, 3, at("2026-11-30T06:00:03Z"), reopen("x"))
            .await
            .unwrap());
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "four\n");
        // What the reader sees: every kept line in order.
        let files = super::super::all_files(&log);
        assert_eq!(files.len(), 3);
    }

    #[tokio::test]
    async fn failed_reopen_renames_back_and_leftovers_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        std::fs::write(&log, "kept\n").unwrap();
        std::fs::write(dir.path().join("0.log.20261130-050000.tmp"), "torn").unwrap();
        let err = rotate(&log, 5, at("2026-11-30T06:00:01Z"), || async {
            Err(cri_proto::Error::InvalidEndpoint {
                endpoint: "test".into(),
            })
        })
        .await
        .unwrap_err();
        assert!(matches!(err, Error::Reopen { .. }), "{err}");
        assert_eq!(names(dir.path()), ["0.log"]);
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "kept\n");
    }
}
