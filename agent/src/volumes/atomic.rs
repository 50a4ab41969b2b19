//! The atomic writer behind configMap, secret, downwardAPI and projected
//! volumes (upstream `pkg/volume/util/atomic_writer.go`): every version of
//! the payload goes into a fresh hidden `..<timestamp>` directory, the
//! `..data` symlink is swapped to it with one rename, and the user-visible
//! names are symlinks through `..data`. A reader therefore sees either the
//! old or the new version of a file, never half of one; a reader that
//! resolves `..data` once sees one version of every file.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Component, Path, PathBuf};

/// The symlink naming the current version's directory.
pub const DATA_DIR: &str = "..data";
const DATA_DIR_TMP: &str = "..data_tmp";

/// One file of a payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileProjection {
    pub data: Vec<u8>,
    /// Permission bits (e.g. 0o644).
    pub mode: u32,
}

/// Relative path -> content: everything the volume should hold.
pub type Payload = BTreeMap<String, FileProjection>;

/// Why a payload could not be written.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A payload path is absolute, empty, or climbs out with `..`.
    #[error("invalid path {0:?} in volume payload: it must be relative and must not contain '..'")]
    InvalidPath(String),
    /// A filesystem operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> Error + 'a {
    move |source| Error::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Check a payload path as upstream's `validatePath`.
pub fn validate_path(p: &str) -> Result<()> {
    let path = Path::new(p);
    let ok = !p.is_empty()
        && path.components().all(|c| matches!(c, Component::Normal(_)))
        && !p.starts_with("..");
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidPath(p.to_string()))
    }
}

/// Whether `dir` already holds a written payload.
pub fn is_populated(dir: &Path) -> bool {
    fs::symlink_metadata(dir.join(DATA_DIR)).is_ok()
}

/// Make `dir` hold exactly `payload`. Returns whether anything changed.
///
/// # Guarantees
/// A concurrent reader of `dir/<path>` sees the old or the new file whole;
/// one that reads through the target of `dir/..data` sees one version of
/// every file. Idempotent: an unchanged payload writes nothing.
///
/// `gid`: the pod's fsGroup, given as the files' group (their modes carry
/// the group bits already).
///
/// # Errors
/// Invalid payload paths; filesystem failures (the old version then stays
/// in place).
pub fn write(dir: &Path, payload: &Payload, gid: Option<u32>) -> Result<bool> {
    for p in payload.keys() {
        validate_path(p)?;
    }
    fs::create_dir_all(dir).map_err(io_err("creating", dir))?;
    let data_link = dir.join(DATA_DIR);
    let old = fs::read_link(&data_link).ok();
    if let Some(old) = &old {
        if same_content(&dir.join(old), payload) {
            return Ok(false);
        }
    }

    let ts_dir = new_version_dir(dir)?;
    let ts_name = ts_dir.file_name().map(PathBuf::from).unwrap_or_default();
    if let Err(e) = write_files(&ts_dir, payload, gid) {
        let _ = fs::remove_dir_all(&ts_dir);
        return Err(e);
    }

    // The swap: a new symlink renamed over `..data` replaces it atomically.
    let tmp = dir.join(DATA_DIR_TMP);
    let _ = fs::remove_file(&tmp);
    symlink(&ts_name, &tmp).map_err(io_err("linking", &tmp))?;
    fs::rename(&tmp, &data_link).map_err(io_err("renaming", &tmp))?;

    // User-visible names point through `..data`; stale ones go.
    let visible: std::collections::BTreeSet<String> = payload
        .keys()
        .filter_map(|p| Path::new(p).components().next())
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    for name in &visible {
        let link = dir.join(name);
        let want = Path::new(DATA_DIR).join(name);
        if fs::read_link(&link).ok().as_deref() != Some(want.as_path()) {
            let _ = fs::remove_file(&link);
            symlink(&want, &link).map_err(io_err("linking", &link))?;
        }
    }
    for e in fs::read_dir(dir).map_err(io_err("reading", dir))?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("..") {
            // Older versions (and leftovers of an interrupted write).
            if name != DATA_DIR && Path::new(&name) != ts_name {
                let _ = fs::remove_dir_all(e.path()).or_else(|_| fs::remove_file(e.path()));
            }
        } else if !visible.contains(&name) {
            let _ = fs::remove_file(e.path()).or_else(|_| fs::remove_dir_all(e.path()));
        }
    }
    Ok(true)
}

/// `..YYYY_MM_DD_HH_MM_SS.<random>`, as upstream names its versions (in
/// UTC: the name only has to be unique, and reading the local zone would
/// load a time zone database into every agent).
fn new_version_dir(dir: &Path) -> Result<PathBuf> {
    let now = jiff::Timestamp::now();
    let stamp = now.strftime("%Y_%m_%d_%H_%M_%S");
    loop {
        let suffix: u32 = rand::random();
        let p = dir.join(format!("..{stamp}.{suffix:09}"));
        match fs::create_dir(&p) {
            Ok(()) => {
                fs::set_permissions(&p, fs::Permissions::from_mode(0o755))
                    .map_err(io_err("chmod", &p))?;
                return Ok(p);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io_err("creating", &p)(e)),
        }
    }
}

fn write_files(root: &Path, payload: &Payload, gid: Option<u32>) -> Result<()> {
    for (rel, f) in payload {
        let path = root.join(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(io_err("creating", parent))?;
        }
        fs::write(&path, &f.data).map_err(io_err("writing", &path))?;
        if gid.is_some() {
            std::os::unix::fs::chown(&path, None, gid).map_err(io_err("chown", &path))?;
        }
        // Explicitly: the umask must not narrow the requested mode.
        fs::set_permissions(&path, fs::Permissions::from_mode(f.mode))
            .map_err(io_err("chmod", &path))?;
    }
    Ok(())
}

/// Whether the version directory `dir` holds exactly `payload`.
fn same_content(dir: &Path, payload: &Payload) -> bool {
    let mut found = 0usize;
    if !walk_same(dir, dir, payload, &mut found) {
        return false;
    }
    found == payload.len()
}

fn walk_same(root: &Path, dir: &Path, payload: &Payload, found: &mut usize) -> bool {
    let Ok(entries) = fs::read_dir(dir) else {
        return false;
    };
    for e in entries.flatten() {
        let path = e.path();
        let Ok(meta) = fs::symlink_metadata(&path) else {
            return false;
        };
        if meta.is_dir() {
            if !walk_same(root, &path, payload, found) {
                return false;
            }
            continue;
        }
        let rel = path
            .strip_prefix(root)
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        let Some(want) = payload.get(&rel) else {
            return false;
        };
        if meta.permissions().mode() & 0o7777 != want.mode {
            return false;
        }
        match fs::read(&path) {
            Ok(data) if data == want.data => *found += 1,
            _ => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    fn payload(pairs: &[(&str, &str, u32)]) -> Payload {
        pairs
            .iter()
            .map(|(p, d, m)| {
                (
                    p.to_string(),
                    FileProjection {
                        data: d.as_bytes().to_vec(),
                        mode: *m,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn writes_links_and_modes() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("v");
        let p = payload(&[("a", "1", 0o644), ("sub/b", "2", 0o400)]);
        assert!(write(&dir, &p, None).unwrap());
        assert_eq!(fs::read_to_string(dir.join("a")).unwrap(), "1");
        assert_eq!(fs::read_to_string(dir.join("sub/b")).unwrap(), "2");
        assert_eq!(fs::read_link(dir.join("a")).unwrap(), Path::new("..data/a"));
        let mode = fs::metadata(dir.join("sub/b"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o400);
        // Same payload: nothing changes.
        let before = fs::read_link(dir.join(DATA_DIR)).unwrap();
        assert!(!write(&dir, &p, None).unwrap());
        assert_eq!(fs::read_link(dir.join(DATA_DIR)).unwrap(), before);
        // A mode change alone is a change.
        let p2 = payload(&[("a", "1", 0o600), ("sub/b", "2", 0o400)]);
        assert!(write(&dir, &p2, None).unwrap());
        // A removed key loses its visible link; old versions are removed.
        let p3 = payload(&[("c", "3", 0o644)]);
        assert!(write(&dir, &p3, None).unwrap());
        assert!(fs::symlink_metadata(dir.join("a")).is_err());
        assert!(fs::symlink_metadata(dir.join("sub")).is_err());
        let hidden: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("..") && n != DATA_DIR)
            .collect();
        assert_eq!(hidden.len(), 1, "{hidden:?}");
    }

    #[test]
    fn files_get_the_fs_group() {
        use std::os::unix::fs::MetadataExt;
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let t = tempfile::tempdir().unwrap();
        write(t.path(), &payload(&[("a", "1", 0o440)]), Some(2345)).unwrap();
        let m = fs::metadata(t.path().join("a")).unwrap();
        assert_eq!((m.gid(), m.mode() & 0o777), (2345, 0o440));
    }

    #[test]
    fn rejects_escaping_paths() {
        let t = tempfile::tempdir().unwrap();
        for bad in ["../x", "/etc/x", "a/../../x", "", "..data/x"] {
            assert!(
                write(t.path(), &payload(&[(bad, "1", 0o644)]), None).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn concurrent_reader_never_sees_a_mix() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().to_path_buf();
        let version = |n: u32| {
            let v = format!("v{n}");
            payload(&[("one", &v, 0o644), ("two", &v, 0o644)])
        };
        write(&dir, &version(0), None).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let (dir, stop) = (dir.clone(), stop.clone());
            std::thread::spawn(move || {
                let (mut reads, mut torn) = (0u32, Vec::new());
                while !stop.load(Ordering::Relaxed) {
                    // Resolve `..data` once, as a consistent reader does; the
                    // version may be removed under it (then read again).
                    let Ok(v) = fs::read_link(dir.join(DATA_DIR)) else {
                        continue;
                    };
                    let (Ok(a), Ok(b)) = (
                        fs::read_to_string(dir.join(&v).join("one")),
                        fs::read_to_string(dir.join(&v).join("two")),
                    ) else {
                        continue;
                    };
                    reads += 1;
                    if a != b || a.is_empty() {
                        torn.push((a, b));
                    }
                    // Each visible file on its own is whole, too.
                    if let Ok(a) = fs::read_to_string(dir.join("one")) {
                        if !a.starts_with('v') {
                            torn.push((a, "visible".into()));
                        }
                    }
                }
                (reads, torn)
            })
        };
        for n in 1..300 {
            write(&dir, &version(n), None).unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        let (reads, torn) = reader.join().unwrap();
        assert!(torn.is_empty(), "torn reads: {torn:?}");
        assert!(reads > 0);
        assert_eq!(fs::read_to_string(dir.join("two")).unwrap(), "v299");
    }
}
