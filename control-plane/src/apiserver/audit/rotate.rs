//! A log file that rotates by size, as the lumberjack logger under
//! kube-apiserver's `--audit-log-path` does: past `--audit-log-maxsize`
//! MB the file is renamed to `<name>-<UTC time>.<ext>`
//! (`audit-2026-12-02T18-04-05.123.log`) and a new one started; backups
//! beyond `--audit-log-maxbackup`, or older than `--audit-log-maxage`
//! days by the time in their name, are removed.
//!
//! Written here rather than taken from a crate: the rotation crates seen
//! (file-rotate, rolling-file, tracing-appender) name backups by
//! appending to the whole file name or rotate by time, and existing tools
//! that read upstream's audit backups expect lumberjack's names.
//!
//! # Caveats
//! Synchronous: it runs on the audit writer's own thread, never on the
//! async runtime. Unlike lumberjack it never compresses backups.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use jiff::Timestamp;

/// lumberjack's size when none is given (upstream passes its 0 through).
pub const DEFAULT_MAX_SIZE_MB: u64 = 100;
const MB: u64 = 1024 * 1024;

/// How the file rotates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub path: PathBuf,
    /// Megabytes (MiB) before a rotation; 0: [`DEFAULT_MAX_SIZE_MB`].
    pub max_size_mb: u64,
    /// Backups kept; 0: all.
    pub max_backups: usize,
    /// Days a backup is kept; 0: forever.
    pub max_age_days: u64,
}

/// The open log file.
pub struct RotatingFile {
    opts: Options,
    max_size: u64,
    out: BufWriter<File>,
    /// Bytes in the current file.
    size: u64,
    /// The clock (tests set it).
    now: fn() -> Timestamp,
}

impl std::fmt::Debug for RotatingFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RotatingFile")
            .field("opts", &self.opts)
            .field("size", &self.size)
            .finish()
    }
}

impl RotatingFile {
    /// Open (creating, as upstream: directory 0700, file 0600) and append.
    ///
    /// # Errors
    /// The directory or file cannot be created or opened.
    pub fn open(opts: Options) -> io::Result<RotatingFile> {
        Self::open_with_clock(opts, Timestamp::now)
    }

    fn open_with_clock(opts: Options, now: fn() -> Timestamp) -> io::Result<RotatingFile> {
        if let Some(dir) = opts.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)?;
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&opts.path)?;
        let size = file.metadata()?.len();
        let max_size = if opts.max_size_mb == 0 {
            DEFAULT_MAX_SIZE_MB
        } else {
            opts.max_size_mb
        }
        .saturating_mul(MB);
        let f = RotatingFile {
            opts,
            max_size,
            out: BufWriter::new(file),
            size,
            now,
        };
        f.remove_old();
        Ok(f)
    }

    /// Append one line, rotating first when it would not fit.
    ///
    /// # Errors
    /// The line alone is larger than the maximum size (lumberjack refuses
    /// those too), or the disk refused.
    pub fn write_line(&mut self, line: &[u8]) -> io::Result<()> {
        let n = line.len() as u64;
        if n > self.max_size {
            return Err(io::Error::other(format!(
                "an event of {n} bytes exceeds the maximum file size {}",
                self.max_size
            )));
        }
        if self.size + n > self.max_size {
            self.rotate()?;
        }
        self.out.write_all(line)?;
        self.size += n;
        Ok(())
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    fn rotate(&mut self) -> io::Result<()> {
        self.out.flush()?;
        let mode = std::fs::metadata(&self.opts.path)
            .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777)
            .unwrap_or(0o600);
        let backup = self.free_backup_name();
        std::fs::rename(&self.opts.path, &backup)?;
        let file = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(mode)
            .open(&self.opts.path)?;
        self.out = BufWriter::new(file);
        self.size = 0;
        self.remove_old();
        Ok(())
    }

    /// The backup name for now; a millisecond later while that one exists
    /// (lumberjack would overwrite a backup made in the same millisecond).
    fn free_backup_name(&self) -> PathBuf {
        let mut t = (self.now)();
        loop {
            let p = backup_name(&self.opts.path, t);
            if !p.exists() {
                return p;
            }
            t = t
                .checked_add(jiff::SignedDuration::from_millis(1))
                .unwrap_or(t);
        }
    }

    /// Remove backups past the count and the age; failures are logged
    /// and left for the next rotation.
    fn remove_old(&self) {
        if self.opts.max_backups == 0 && self.opts.max_age_days == 0 {
            return;
        }
        let mut backups = match backups(&self.opts.path) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, "listing audit log backups");
                return;
            }
        };
        // Newest first.
        backups.sort_by_key(|b| std::cmp::Reverse(b.0));
        let cutoff = (self.opts.max_age_days > 0).then(|| {
            let age = Duration::from_secs(self.opts.max_age_days.saturating_mul(24 * 3600));
            (self.now)()
                .checked_sub(
                    jiff::SignedDuration::try_from(age).unwrap_or(jiff::SignedDuration::MAX),
                )
                .unwrap_or(Timestamp::MIN)
        });
        for (i, (t, p)) in backups.iter().enumerate() {
            let surplus = self.opts.max_backups > 0 && i >= self.opts.max_backups;
            let expired = cutoff.is_some_and(|c| *t < c);
            if surplus || expired {
                if let Err(e) = std::fs::remove_file(p) {
                    tracing::warn!(file = %p.display(), error = %e, "removing an old audit log");
                }
            }
        }
    }
}

/// `dir/audit.log` -> (`dir`, `audit`, `.log`).
fn split(path: &Path) -> (PathBuf, String, String) {
    let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match name.rfind('.').filter(|&i| i > 0) {
        Some(i) => (dir, name[..i].to_string(), name[i..].to_string()),
        None => (dir, name, String::new()),
    }
}

/// lumberjack's `2006-01-02T15-04-05.000`, in UTC.
const STAMP_LEN: usize = 23;

fn stamp(t: Timestamp) -> String {
    let d = t.to_zoned(jiff::tz::TimeZone::UTC).datetime();
    format!(
        "{:04}-{:02}-{:02}T{:02}-{:02}-{:02}.{:03}",
        d.year(),
        d.month(),
        d.day(),
        d.hour(),
        d.minute(),
        d.second(),
        d.subsec_nanosecond() / 1_000_000
    )
}

fn parse_stamp(s: &str) -> Option<Timestamp> {
    if s.len() != STAMP_LEN || !s.is_ascii() {
        return None;
    }
    let (date, time) = s.split_once('T')?;
    let rfc3339 = format!("{date}T{}Z", time.replacen('-', ":", 2));
    rfc3339.parse().ok()
}

pub fn backup_name(path: &Path, t: Timestamp) -> PathBuf {
    let (dir, stem, ext) = split(path);
    dir.join(format!("{stem}-{}{ext}", stamp(t)))
}

/// The backups of `path` beside it, with the times in their names.
pub fn backups(path: &Path) -> io::Result<Vec<(Timestamp, PathBuf)>> {
    let (dir, stem, ext) = split(path);
    let dir = if dir.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        dir
    };
    let prefix = format!("{stem}-");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let t = name
            .strip_prefix(&prefix)
            .and_then(|rest| rest.strip_suffix(ext.as_str()))
            .and_then(parse_stamp);
        if let Some(t) = t {
            out.push((t, entry.path()));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(dir: &Path, backups: usize, age: u64) -> Options {
        Options {
            path: dir.join("logs").join("audit.log"),
            max_size_mb: 1,
            max_backups: backups,
            max_age_days: age,
        }
    }

    #[test]
    fn names_as_lumberjack() {
        let t: Timestamp = "2026-12-02T18:04:05.123456Z".parse().unwrap();
        assert_eq!(
            backup_name(Path::new("/var/log/audit.log"), t),
            Path::new("/var/log/audit-2026-12-02T18-04-05.123.log")
        );
        assert_eq!(
            backup_name(Path::new("/var/log/audit"), t),
            Path::new("/var/log/audit-2026-12-02T18-04-05.123")
        );
        assert_eq!(
            parse_stamp("2026-12-02T18-04-05.123"),
            Some("2026-12-02T18:04:05.123Z".parse().unwrap())
        );
        assert_eq!(parse_stamp("2026-12-02"), None);
    }

    #[test]
    fn rotates_past_the_size_and_keeps_max_backups() {
        let dir = tempfile::tempdir().unwrap();
        let o = opts(dir.path(), 2, 0);
        let mut f = RotatingFile::open(o.clone()).unwrap();
        let line = vec![b'x'; 300 * 1024];
        for _ in 0..12 {
            f.write_line(&line).unwrap();
        }
        f.flush().unwrap();
        let b = backups(&o.path).unwrap();
        assert_eq!(b.len(), 2, "{b:?}");
        for (_, p) in &b {
            assert_eq!(std::fs::metadata(p).unwrap().len(), 3 * 300 * 1024);
        }
        assert!(std::fs::metadata(&o.path).unwrap().len() <= MB);
        let mode = std::fs::metadata(&o.path).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
        // A single line larger than the file may be is refused.
        assert!(f.write_line(&vec![b'y'; 2 * MB as usize]).is_err());
    }

    #[test]
    fn removes_backups_older_than_max_age() {
        let dir = tempfile::tempdir().unwrap();
        let o = opts(dir.path(), 0, 3);
        std::fs::create_dir_all(o.path.parent().unwrap()).unwrap();
        fn now() -> Timestamp {
            "2026-06-10T00:00:00Z".parse().unwrap()
        }
        let old = backup_name(&o.path, "2026-06-01T00:00:00Z".parse().unwrap());
        let recent = backup_name(&o.path, "2026-06-08T00:00:00Z".parse().unwrap());
        let unrelated = o.path.with_file_name("other-2026-06-01T00-00-00.000.log");
        for p in [&old, &recent, &unrelated] {
            std::fs::write(p, b"x").unwrap();
        }
        let _f = RotatingFile::open_with_clock(o, now).unwrap();
        assert!(!old.exists());
        assert!(recent.exists() && unrelated.exists());
    }
}
