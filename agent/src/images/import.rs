//! The image import directory (k3s's `agent/images`): archives dropped
//! there are imported into the runtime at start and when new files
//! appear, with an event on the Node per import. The directory is
//! scanned, not watched: a file is imported once it has kept its size and
//! time for a whole scan, so a file still being copied in is not read
//! half-written.

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use cri_proto::CriClient;

use super::archive;
use crate::events::{ApiRecorder, NORMAL, WARNING};

/// How often the directory is scanned.
const SCAN_PERIOD: Duration = Duration::from_secs(5);

/// A file's size and modification time: a changed file is imported again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    size: u64,
    modified: Option<SystemTime>,
}

/// Imports the archives of one directory.
pub struct Importer {
    cri: CriClient,
    endpoint: String,
    dir: PathBuf,
    recorder: Option<ApiRecorder>,
    /// What each file looked like at the last scan.
    seen: HashMap<PathBuf, Stamp>,
    /// What each file looked like when it was imported (or failed to).
    done: HashMap<PathBuf, Stamp>,
}

impl Importer {
    pub fn new(
        cri: CriClient,
        endpoint: String,
        dir: PathBuf,
        recorder: Option<ApiRecorder>,
    ) -> Importer {
        Importer {
            cri,
            endpoint,
            dir,
            recorder,
            seen: HashMap::new(),
            done: HashMap::new(),
        }
    }

    /// Import what is there, then what appears, until `shutdown`.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        if let Err(e) = std::fs::create_dir_all(&self.dir) {
            tracing::warn!(dir = %self.dir.display(), "cannot create the image import directory: {e}");
        }
        let mut first = true;
        tokio::pin!(shutdown);
        loop {
            self.scan(first).await;
            first = false;
            tokio::select! {
                _ = tokio::time::sleep(SCAN_PERIOD) => {}
                _ = &mut shutdown => return,
            }
        }
    }

    /// One scan. On the `first`, files are taken as complete (they were
    /// there before the agent started).
    async fn scan(&mut self, first: bool) {
        let listed = tokio::task::spawn_blocking({
            let dir = self.dir.clone();
            move || archives(&dir)
        })
        .await
        .unwrap_or_default();
        let mut ready = Vec::new();
        for (path, stamp) in &listed {
            let stable = first || self.seen.get(path) == Some(stamp);
            if stable && self.done.get(path) != Some(stamp) {
                ready.push((path.clone(), *stamp));
            }
        }
        self.seen = listed.into_iter().collect();
        self.done.retain(|p, _| self.seen.contains_key(p));
        if ready.is_empty() {
            return;
        }
        let snapshotter = super::runtime_config(&self.cri)
            .await
            .and_then(|c| c["containerd"]["snapshotter"].as_str().map(str::to_string));
        for (path, stamp) in ready {
            self.import(&path, snapshotter.clone()).await;
            self.done.insert(path, stamp);
        }
    }

    async fn import(&self, path: &Path, snapshotter: Option<String>) {
        let result = archive::import(&self.endpoint, snapshotter.as_deref(), path).await;
        let (type_, reason, message) = match result {
            Ok(names) => (
                NORMAL,
                "ImagesImported",
                format!("Imported {} from {}", names.join(", "), path.display()),
            ),
            Err(e) => (WARNING, "ImageImportFailed", e.to_string()),
        };
        crate::events::report_node(self.recorder.as_ref(), type_, reason, &message);
    }
}

/// The archives in `dir` and their stamps; nothing when it cannot be read.
fn archives(dir: &Path) -> Vec<(PathBuf, Stamp)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| archive::is_archive(&e.path()))
        .filter_map(|e| {
            let meta = e.metadata().ok().filter(|m| m.is_file())?;
            Some((
                e.path(),
                Stamp {
                    size: meta.len(),
                    modified: meta.modified().ok(),
                },
            ))
        })
        .collect()
}
