//! Snapshots on a schedule, kept in a directory with a retention, as
//! k3s's `--etcd-snapshot-schedule-cron`, `--etcd-snapshot-retention` and
//! `--etcd-snapshot-dir`, for either backend.
//!
//! Files are named as k3s names them: `PREFIX-NODE-UNIXSECONDS`, the
//! prefix `etcd-snapshot` for scheduled ones and `on-demand` for those
//! saved by hand. A snapshot is written under a `.part` name, read back
//! and its sha256 compared with what the store streamed, and only then
//! renamed into place, so a listed snapshot is always a whole one.
//! Retention counts one prefix of one node's files, so servers sharing a
//! directory (or a restored cluster's old files) never prune each other's.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

use super::snapshot::snapshot_status;
use super::{Error, Result, SnapshotInfo, Store};

/// The prefix of scheduled snapshots (k3s's).
pub const SCHEDULED: &str = "etcd-snapshot";
/// The prefix of snapshots saved by hand (k3s's default `--name`).
pub const ON_DEMAND: &str = "on-demand";

const PART: &str = ".part";

/// A cron schedule: five fields (minute hour day month weekday), or six
/// with seconds first.
#[derive(Debug, Clone)]
pub struct Schedule {
    cron: croner::Cron,
}

// croner's times are chrono's: they stay inside this impl.
#[allow(clippy::disallowed_types)]
impl Schedule {
    /// # Errors
    /// Why `spec` is not a cron schedule.
    pub fn parse(spec: &str) -> std::result::Result<Schedule, String> {
        let cron = croner::Cron::new(spec)
            .with_seconds_optional()
            .parse()
            .map_err(|e| e.to_string())?;
        Ok(Schedule { cron })
    }

    /// The first time the schedule fires after `t` (UTC).
    pub fn next_after(&self, t: jiff::Timestamp) -> Option<jiff::Timestamp> {
        let t = chrono::DateTime::from_timestamp(
            t.as_second(),
            t.subsec_nanosecond().try_into().ok()?,
        )?;
        let next = self.cron.find_next_occurrence(&t, false).ok()?;
        jiff::Timestamp::new(
            next.timestamp(),
            next.timestamp_subsec_nanos().try_into().ok()?,
        )
        .ok()
    }
}

/// The snapshot directory of one server.
#[derive(Debug, Clone)]
pub struct Snapshots {
    pub dir: PathBuf,
    /// This server's name in file names.
    pub node: String,
}

/// One snapshot file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub path: PathBuf,
    pub prefix: String,
    pub node: String,
    /// When it was taken (from its name), seconds since the epoch.
    pub taken: u64,
    pub size: u64,
}

/// `PREFIX-NODE-SECONDS` split up; the prefix is one of the known ones,
/// as node names have dashes too.
fn parse_name(name: &str) -> Option<(&str, &str, u64)> {
    let (rest, secs) = name.rsplit_once('-')?;
    let secs: u64 = secs.parse().ok()?;
    [SCHEDULED, ON_DEMAND]
        .into_iter()
        .chain(std::iter::once(rest.split('-').next()?))
        .find_map(|p| {
            let node = rest.strip_prefix(p)?.strip_prefix('-')?;
            let whole = !node.is_empty() && !node.starts_with('-') && !node.ends_with('-');
            whole.then_some((p, node, secs))
        })
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn io(what: String, e: std::io::Error) -> Error {
    Error::backend_source("snapshot", format!("{what}: {e}"), e)
}

impl Snapshots {
    /// Save a snapshot of `store` as `PREFIX-NODE-NOW`, verified.
    ///
    /// # Errors
    /// The store could not write it, or the file read back does not hash
    /// to what was written (then nothing is left behind).
    pub async fn save(&self, store: &dyn Store, prefix: &str) -> Result<(PathBuf, SnapshotInfo)> {
        create_private_dir(&self.dir)?;
        let mut secs = now_secs();
        // Two saves in one second (a test, a hurried operator) get
        // distinct names.
        while self
            .dir
            .join(format!("{prefix}-{}-{secs}", self.node))
            .exists()
        {
            secs += 1;
        }
        let path = self.dir.join(format!("{prefix}-{}-{secs}", self.node));
        let part = self
            .dir
            .join(format!("{prefix}-{}-{secs}{PART}", self.node));
        let written = async {
            let info = store.snapshot_save(&part).await?;
            let read = snapshot_status(&part).await?;
            if read.hash != info.hash {
                return Err(Error::backend(
                    "snapshot",
                    format!(
                        "snapshot {} reads back with sha256 {}, not the {} written",
                        part.display(),
                        read.hash,
                        info.hash
                    ),
                ));
            }
            std::fs::rename(&part, &path)
                .map_err(|e| io(format!("renaming {} into place", part.display()), e))?;
            Ok(info)
        }
        .await;
        match written {
            Ok(info) => Ok((path, info)),
            Err(e) => {
                let _ = std::fs::remove_file(&part);
                Err(e)
            }
        }
    }

    /// Every snapshot in the directory, oldest first (files not named as
    /// snapshots are not listed).
    ///
    /// # Errors
    /// The directory cannot be read (a missing one holds nothing).
    pub fn list(&self) -> Result<Vec<Entry>> {
        let rd = match std::fs::read_dir(&self.dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(format!("reading {}", self.dir.display()), e)),
        };
        let mut out = Vec::new();
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some((prefix, node, taken)) = parse_name(&name) else {
                continue;
            };
            let Ok(meta) = e.metadata() else { continue };
            if !meta.is_file() {
                continue;
            }
            out.push(Entry {
                path: e.path(),
                prefix: prefix.to_string(),
                node: node.to_string(),
                taken,
                size: meta.len(),
                name,
            });
        }
        out.sort_by(|a, b| (a.taken, &a.name).cmp(&(b.taken, &b.name)));
        Ok(out)
    }

    /// Remove this node's `prefix` snapshots beyond the newest `keep`, and
    /// any leftover `.part` file of this node. Returns what was removed.
    ///
    /// # Errors
    /// The directory cannot be read or a file cannot be removed.
    pub fn prune(&self, prefix: &str, keep: usize) -> Result<Vec<PathBuf>> {
        let mine: Vec<Entry> = self
            .list()?
            .into_iter()
            .filter(|e| e.prefix == prefix && e.node == self.node)
            .collect();
        let mut removed = Vec::new();
        for e in &mine[..mine.len().saturating_sub(keep)] {
            std::fs::remove_file(&e.path)
                .map_err(|err| io(format!("removing {}", e.path.display()), err))?;
            removed.push(e.path.clone());
        }
        Ok(removed)
    }

    /// Remove `.part` files this node left (a save cut short by a stop).
    fn clear_parts(&self) {
        let mark = format!("-{}-", self.node);
        for e in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(PART) && name.contains(&mark) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

fn create_private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| io(format!("creating {}", dir.display()), e))
}

/// Take a snapshot at every time the schedule fires, keeping the newest
/// `retention` scheduled ones, until `shutdown` turns true. A failed save
/// is logged and tried again at the next time.
pub async fn run(
    store: Arc<dyn Store>,
    schedule: Schedule,
    snapshots: Snapshots,
    retention: usize,
    mut shutdown: watch::Receiver<bool>,
) {
    snapshots.clear_parts();
    loop {
        let now = jiff::Timestamp::now();
        let Some(next) = schedule.next_after(now) else {
            tracing::warn!("the snapshot schedule never fires again");
            return;
        };
        let wait = Duration::try_from(next.duration_since(now)).unwrap_or(Duration::ZERO);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
        match snapshots.save(store.as_ref(), SCHEDULED).await {
            Ok((path, info)) => tracing::info!(
                path = %path.display(),
                revision = info.revision,
                size = info.size,
                hash = %info.hash,
                "saved a scheduled snapshot"
            ),
            Err(e) => tracing::warn!("scheduled snapshot failed: {e}"),
        }
        match snapshots.prune(SCHEDULED, retention) {
            Ok(removed) => {
                for p in removed {
                    tracing::info!(path = %p.display(), "removed a snapshot past the retention");
                }
            }
            Err(e) => tracing::warn!("pruning snapshots failed: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_split_with_dashed_nodes() {
        assert_eq!(
            parse_name("etcd-snapshot-node-a-1700000000"),
            Some((SCHEDULED, "node-a", 1_700_000_000))
        );
        assert_eq!(
            parse_name("on-demand-vm-1-12"),
            Some((ON_DEMAND, "vm-1", 12))
        );
        assert_eq!(parse_name("nightly-host-5"), Some(("nightly", "host", 5)));
        assert_eq!(parse_name("etcd-snapshot-node-1700000000.part"), None);
        assert_eq!(parse_name("README"), None);
        assert_eq!(parse_name("etcd-snapshot--5"), None);
    }

    #[test]
    fn schedules_take_five_or_six_fields() {
        let t: jiff::Timestamp = "2026-01-01T05:00:00Z".parse().unwrap();
        let twelve = Schedule::parse("0 */12 * * *").unwrap();
        assert_eq!(
            twelve.next_after(t).unwrap().to_string(),
            "2026-01-01T12:00:00Z"
        );
        let every_2s = Schedule::parse("*/2 * * * * *").unwrap();
        assert_eq!(
            every_2s.next_after(t).unwrap().to_string(),
            "2026-01-01T05:00:02Z"
        );
        assert!(Schedule::parse("every day").is_err());
        assert!(Schedule::parse("61 * * * *").is_err());
    }

    #[test]
    fn retention_keeps_the_newest_of_one_prefix_and_node() {
        let dir = tempfile::tempdir().unwrap();
        let s = Snapshots {
            dir: dir.path().to_path_buf(),
            node: "n1".into(),
        };
        for name in [
            "etcd-snapshot-n1-10",
            "etcd-snapshot-n1-30",
            "etcd-snapshot-n1-20",
            "etcd-snapshot-n2-5",
            "on-demand-n1-1",
            "notes.txt",
        ] {
            std::fs::write(dir.path().join(name), b"x").unwrap();
        }
        let removed = s.prune(SCHEDULED, 2).unwrap();
        assert_eq!(removed, [dir.path().join("etcd-snapshot-n1-10")]);
        let left: Vec<String> = s.list().unwrap().into_iter().map(|e| e.name).collect();
        assert_eq!(
            left,
            [
                "on-demand-n1-1",
                "etcd-snapshot-n2-5",
                "etcd-snapshot-n1-20",
                "etcd-snapshot-n1-30"
            ]
        );
        assert_eq!(s.prune(ON_DEMAND, 0).unwrap().len(), 1);
    }
}
