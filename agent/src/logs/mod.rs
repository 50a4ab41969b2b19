//! Container logs as the kubelet keeps them: the CRI log files the runtime
//! writes under `<pod_log_dir>/<ns>_<name>_<uid>/<container>/<restart>.log`,
//! rotated into `<restart>.log.<YYYYMMDD-HHMMSS>` (older ones gzipped) by
//! the log manager, and read back for `/containerLogs`.
//!
//! - [`cri`]: the CRI log line format, partial lines included.
//! - [`read`]: follow, tail, since, limit and timestamps over the current
//!   and rotated files.
//! - [`rotate`]: containerLogMaxSize / containerLogMaxFiles, with CRI
//!   ReopenContainerLog.

pub mod cri;
pub mod read;
pub mod rotate;

use std::path::{Path, PathBuf};

/// Suffix of a rotated file once compressed.
pub const GZ_SUFFIX: &str = ".gz";
/// Suffix of a compression in progress; such files are leftovers of a
/// crash and are removed.
pub const TMP_SUFFIX: &str = ".tmp";

/// The rotated files of the log at `current`, split into those in use
/// (oldest first) and leftovers to remove: `.tmp` files of an interrupted
/// compression, and uncompressed files whose `.gz` is complete (the
/// compression was interrupted before the original was removed).
/// `names` are the file names in the log's directory.
pub fn classify_rotated(current: &Path, names: &[String]) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let Some(base) = current.file_name().and_then(|b| b.to_str()) else {
        return (Vec::new(), Vec::new());
    };
    let dir = current.parent().unwrap_or(Path::new("."));
    let prefix = format!("{base}.");
    let rotated: Vec<&String> = names.iter().filter(|n| n.starts_with(&prefix)).collect();
    let mut in_use = Vec::new();
    let mut unused = Vec::new();
    for name in &rotated {
        let compressed_exists = || rotated.iter().any(|o| **o == format!("{name}{GZ_SUFFIX}"));
        if name.ends_with(TMP_SUFFIX) || (!name.ends_with(GZ_SUFFIX) && compressed_exists()) {
            unused.push(dir.join(name));
        } else {
            in_use.push(name.as_str());
        }
    }
    // The timestamp suffix sorts in time order, compressed or not.
    in_use.sort_unstable();
    (in_use.into_iter().map(|n| dir.join(n)).collect(), unused)
}

/// The names of the files in `dir` (none when it cannot be read).
pub fn dir_names(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .collect()
}

/// Remove the log at `current` with its rotated files, once its container
/// is removed (the kubelet's `ContainerLogManager.Clean`).
pub async fn remove_logs(current: &Path) {
    if current.as_os_str().is_empty() {
        return;
    }
    let current = current.to_path_buf();
    let _ = tokio::task::spawn_blocking(move || {
        let dir = current.parent().unwrap_or(Path::new("."));
        let (rotated, leftovers) = classify_rotated(&current, &dir_names(dir));
        for f in rotated.iter().chain(&leftovers).chain([&current]) {
            if let Err(e) = std::fs::remove_file(f) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(path = %f.display(), "cannot remove container log: {e}");
                }
            }
        }
    })
    .await;
}

/// Every file of the log at `current`, oldest first, ending with `current`.
pub fn all_files(current: &Path) -> Vec<PathBuf> {
    let dir = current.parent().unwrap_or(Path::new("."));
    let (mut files, _) = classify_rotated(current, &dir_names(dir));
    files.push(current.to_path_buf());
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn removing_a_log_takes_its_rotated_files_only() {
        let dir = tempfile::tempdir().unwrap();
        for f in [
            "0.log",
            "0.log.20261130-060000.gz",
            "0.log.20261130-060001",
            "1.log",
        ] {
            std::fs::write(dir.path().join(f), "x").unwrap();
        }
        remove_logs(&dir.path().join("0.log")).await;
        assert_eq!(dir_names(dir.path()), ["1.log"]);
    }

    #[test]
    fn rotated_files_in_order_and_leftovers() {
        let names: Vec<String> = [
            "0.log",
            "0.log.20261130-060010",
            "0.log.20261130-060000.gz",
            "0.log.20261130-055950",
            "0.log.20261130-055950.gz",
            "0.log.20261130-060005.gz.tmp",
            "1.log",
            "1.log.20261130-060000",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let (in_use, unused) = classify_rotated(Path::new("/l/c/0.log"), &names);
        assert_eq!(
            in_use,
            [
                "/l/c/0.log.20261130-055950.gz",
                "/l/c/0.log.20261130-060000.gz",
                "/l/c/0.log.20261130-060010"
            ]
            .map(PathBuf::from)
        );
        let mut unused = unused;
        unused.sort();
        assert_eq!(
            unused,
            [
                "/l/c/0.log.20261130-055950",
                "/l/c/0.log.20261130-060005.gz.tmp"
            ]
            .map(PathBuf::from)
        );
    }
}
