//! Snapshot files of either backend: status (revision, keys, size, hash)
//! and restore into a data directory.
//!
//! A SQLite snapshot is a copy of the whole database (revision log and
//! counter included), made with `VACUUM INTO`. An etcd snapshot is the bbolt
//! file that etcd's maintenance `Snapshot` RPC streams (with its trailing
//! sha256), the same file `etcdctl snapshot save` writes; its status and
//! restore go through Debian's `etcdctl` (package `etcd-client`), as etcd's
//! own tooling is the only reader of that format.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use super::sqlite::{sqlite_file_check, sqlite_file_info, SQLITE_FILE};
use super::{Error, Result, SnapshotInfo};

const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";

/// Which backend wrote a snapshot file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotFormat {
    Sqlite,
    Etcd,
}

/// Tell the format of a snapshot file from its first bytes (a SQLite
/// header, or else an etcd/bbolt file).
///
/// # Errors
/// `Backend` when the file cannot be read or is too short to be either.
pub fn snapshot_format(path: &Path) -> Result<SnapshotFormat> {
    let mut head = [0u8; 16];
    let mut f = std::fs::File::open(path)
        .map_err(|e| io_err("snapshot", format!("open snapshot {}", path.display()), e))?;
    f.read_exact(&mut head).map_err(|e| {
        io_err(
            "snapshot",
            format!(
                "read snapshot {}: too short to be a snapshot",
                path.display()
            ),
            e,
        )
    })?;
    Ok(if &head == SQLITE_MAGIC {
        SnapshotFormat::Sqlite
    } else {
        SnapshotFormat::Etcd
    })
}

fn io_err(backend: &'static str, message: String, e: std::io::Error) -> Error {
    Error::backend_source(backend, format!("{message}: {e}"), e)
}

/// Revision, number of keys, size and sha256 of a snapshot file of either
/// format.
///
/// # Errors
/// `Backend` when the file is unreadable or not a snapshot; for an etcd
/// snapshot also when `etcdctl` is missing or rejects it.
///
/// # Caveats
/// For etcd snapshots `keys` is etcdctl's `totalKey`, which counts every
/// stored revision of every key (etcd's own definition), not only live keys.
pub async fn snapshot_status(path: &Path) -> Result<SnapshotInfo> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || snapshot_status_blocking(&path))
        .await
        .map_err(|e| Error::backend("snapshot", format!("snapshot status task failed: {e}")))?
}

fn snapshot_status_blocking(path: &Path) -> Result<SnapshotInfo> {
    let (size, hash) = size_and_hash(path)?;
    let (revision, keys) = match snapshot_format(path)? {
        SnapshotFormat::Sqlite => sqlite_file_info(path)?,
        SnapshotFormat::Etcd => etcd_file_info(path)?,
    };
    Ok(SnapshotInfo {
        revision,
        keys,
        size,
        hash,
    })
}

fn size_and_hash(path: &Path) -> Result<(u64, String)> {
    let ctx = format!("read snapshot {}", path.display());
    let mut f = std::fs::File::open(path).map_err(|e| io_err("snapshot", ctx.clone(), e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut size = 0u64;
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| io_err("snapshot", ctx.clone(), e))?;
        if n == 0 {
            break;
        }
        size += n as u64;
        hasher.update(&buf[..n]);
    }
    Ok((size, hex::encode(hasher.finalize())))
}

fn etcdctl(args: &[&std::ffi::OsStr], what: &str) -> Result<String> {
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(args)
        .output()
        .map_err(|e| {
            io_err(
                "etcd",
                format!("{what}: cannot run etcdctl (install Debian's etcd-client package)"),
                e,
            )
        })?;
    if !out.status.success() {
        return Err(Error::backend(
            "etcd",
            format!(
                "{what}: etcdctl failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `etcdctl snapshot status -w json` prints
/// `{"hash":..,"revision":..,"totalKey":..,"totalSize":..}`.
fn etcd_file_info(path: &Path) -> Result<(i64, u64)> {
    let what = format!("status of etcd snapshot {}", path.display());
    let out = etcdctl(
        &[
            "snapshot".as_ref(),
            "status".as_ref(),
            path.as_os_str(),
            "-w".as_ref(),
            "json".as_ref(),
        ],
        &what,
    )?;
    let field = |name: &str| -> Result<i64> {
        json_number(&out, name).ok_or_else(|| {
            Error::backend(
                "etcd",
                format!("{what}: no {name} in etcdctl output {out:?}"),
            )
        })
    };
    Ok((field("revision")?, field("totalKey")? as u64))
}

/// The integer value of `"name":` in a flat JSON object.
fn json_number(json: &str, name: &str) -> Option<i64> {
    let at = json.find(&format!("\"{name}\":"))? + name.len() + 3;
    let rest = json[at..].trim_start();
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '-'))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// Restore a snapshot into `data_dir` (blocking; for the CLI).
///
/// - SQLite snapshot: checks it, then installs it as `DATA_DIR/state.db`.
///   The snapshot holds the revision log and the revision counter, so every
///   object comes back at its `mod_revision` and new writes continue after
///   the snapshot's revision.
/// - etcd snapshot: runs `etcdctl snapshot restore FILE --data-dir DATA_DIR`,
///   which makes a fresh single-member etcd data directory (member `default`,
///   peer URL `http://localhost:2380`; see [`snapshot_restore_etcd`] to
///   choose them). Start etcd on it; revisions are preserved.
///
/// # Errors
/// `Backend` when the snapshot is damaged, when `DATA_DIR/state.db` (or, for
/// etcd, `DATA_DIR` itself) already exists — restore never overwrites live
/// state: move it away first — or on I/O failure.
pub fn snapshot_restore(path: &Path, data_dir: &Path) -> Result<()> {
    match snapshot_format(path)? {
        SnapshotFormat::Sqlite => restore_sqlite(path, data_dir),
        SnapshotFormat::Etcd => {
            snapshot_restore_etcd(path, data_dir, "default", "http://localhost:2380")
        }
    }
}

/// Restore an etcd snapshot into a new single-member etcd data directory
/// for member `name` advertising `peer_url` (blocking).
///
/// # Errors
/// `Backend` when `etcdctl` is missing, the snapshot fails its hash check,
/// or `data_dir` exists.
pub fn snapshot_restore_etcd(
    path: &Path,
    data_dir: &Path,
    name: &str,
    peer_url: &str,
) -> Result<()> {
    let what = format!(
        "restore etcd snapshot {} into {}",
        path.display(),
        data_dir.display()
    );
    if data_dir.exists() {
        return Err(Error::backend(
            "etcd",
            format!("{what}: {} exists; move it away first", data_dir.display()),
        ));
    }
    let cluster = format!("{name}={peer_url}");
    etcdctl(
        &[
            "snapshot".as_ref(),
            "restore".as_ref(),
            path.as_os_str(),
            "--data-dir".as_ref(),
            data_dir.as_os_str(),
            "--name".as_ref(),
            name.as_ref(),
            "--initial-cluster".as_ref(),
            cluster.as_ref(),
            "--initial-advertise-peer-urls".as_ref(),
            peer_url.as_ref(),
        ],
        &what,
    )?;
    Ok(())
}

fn restore_sqlite(path: &Path, data_dir: &Path) -> Result<()> {
    let what = format!(
        "restore snapshot {} into {}",
        path.display(),
        data_dir.display()
    );
    sqlite_file_check(path)?;
    let target = data_dir.join(SQLITE_FILE);
    if target.exists() {
        return Err(Error::backend(
            "sqlite",
            format!("{what}: {} exists; move it away first", target.display()),
        ));
    }
    std::fs::create_dir_all(data_dir).map_err(|e| io_err("sqlite", what.clone(), e))?;
    // Leftover WAL files of an old database would be replayed into the
    // restored one: remove them.
    for ext in ["-wal", "-shm"] {
        let mut p = target.clone().into_os_string();
        p.push(ext);
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("sqlite", what.clone(), e)),
        }
    }
    let tmp = temp_path(&target);
    std::fs::copy(path, &tmp).map_err(|e| io_err("sqlite", what.clone(), e))?;
    persist(&tmp, &target)
}

/// `PATH.tmp`, where a file is written before it is renamed into place.
pub(crate) fn temp_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".tmp");
    PathBuf::from(p)
}

/// fsync `tmp`, rename it to `path`, fsync the directory: after this the
/// file is durably in place, and a crash before it leaves no half file.
pub(crate) fn persist(tmp: &Path, path: &Path) -> Result<()> {
    let ctx = format!("write {}", path.display());
    std::fs::File::open(tmp)
        .and_then(|f| f.sync_all())
        .map_err(|e| io_err("snapshot", ctx.clone(), e))?;
    std::fs::rename(tmp, path).map_err(|e| io_err("snapshot", ctx.clone(), e))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(|e| io_err("snapshot", ctx, e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::json_number;

    #[test]
    fn parses_etcdctl_status_json() {
        let out = r#"{"hash":3453283014,"revision":17,"totalKey":21,"totalSize":20480}"#;
        assert_eq!(json_number(out, "revision"), Some(17));
        assert_eq!(json_number(out, "totalKey"), Some(21));
        assert_eq!(json_number(out, "missing"), None);
    }
}
