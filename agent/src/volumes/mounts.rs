//! The agent's own mounts (tmpfs for memory-backed emptyDirs, secrets and
//! projected volumes) and their removal. Blocking: call from
//! `spawn_blocking`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use nix::mount::{mount, umount2, MntFlags, MsFlags};

use super::Error;

/// How often a busy mount is retried before it is detached lazily.
const BUSY_RETRIES: u32 = 5;
const BUSY_WAIT: Duration = Duration::from_millis(200);

/// Mount points at or under `prefix` in this process's mount namespace,
/// from /proc/self/mountinfo.
pub fn mounts_under(prefix: &Path) -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape(p)))
        .filter(|p| p.starts_with(prefix))
        .collect()
}

/// Whether `path` is itself a mount point.
pub fn is_mount_point(path: &Path) -> bool {
    mounts_under(path).iter().any(|p| p == path)
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Mount a tmpfs on `path` unless one is there already; `size` in bytes
/// (None: the kernel's default, half of RAM).
///
/// # Errors
/// The mount(2) failure, as text for the volume's event.
pub fn ensure_tmpfs(path: &Path, size: Option<u64>) -> Result<(), Error> {
    if is_mount_point(path) {
        return Ok(());
    }
    let data = size.map(|s| format!("size={s}"));
    mount(
        Some("tmpfs"),
        path,
        Some("tmpfs"),
        MsFlags::empty(),
        data.as_deref(),
    )
    .map_err(Error::mount("mount tmpfs on", path))
}

/// Unmount everything at or under `prefix`, deepest first. A busy mount is
/// retried, then detached lazily (MNT_DETACH: gone from the namespace now,
/// freed when its last user lets go) so that a pod never stays stuck.
/// Returns the mount points that had to be detached.
///
/// # Errors
/// A mount that could not be removed even lazily.
pub fn unmount_all(prefix: &Path) -> Result<Vec<PathBuf>, Error> {
    let mut points = mounts_under(prefix);
    // Deepest first; a path mounted twice is unmounted twice.
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    let mut detached = Vec::new();
    for p in points {
        let mut tries = 0;
        loop {
            match umount2(&p, MntFlags::empty()) {
                Ok(()) | Err(Errno::EINVAL) | Err(Errno::ENOENT) => break,
                Err(Errno::EBUSY) if tries < BUSY_RETRIES => {
                    tries += 1;
                    // Blocking by contract: the pod workers run this on a
                    // blocking thread, uninstall in a one-shot command.
                    #[allow(clippy::disallowed_methods)]
                    std::thread::sleep(BUSY_WAIT);
                }
                Err(Errno::EBUSY) => {
                    umount2(&p, MntFlags::MNT_DETACH)
                        .map_err(Error::mount("detaching busy mount", &p))?;
                    detached.push(p.clone());
                    break;
                }
                Err(e) => return Err(Error::mount("unmounting", &p)(e)),
            }
        }
    }
    Ok(detached)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape(r"/a\040b\134c"), r"/a b\c");
        assert_eq!(unescape("/plain"), "/plain");
    }

    /// Needs root (mount(2)); skipped otherwise.
    #[test]
    fn busy_tmpfs_is_detached_not_waited_on() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let vols = t.path().join("volumes");
        let a = vols.join("a");
        let b = vols.join("b");
        for p in [&a, &b] {
            std::fs::create_dir_all(p).unwrap();
            ensure_tmpfs(p, Some(1 << 20)).unwrap();
            // Idempotent: a second call mounts nothing more.
            ensure_tmpfs(p, Some(1 << 20)).unwrap();
        }
        assert_eq!(mounts_under(&vols).len(), 2);
        // An open file keeps `a` busy.
        let busy = std::fs::File::create(a.join("held")).unwrap();
        let detached = unmount_all(&vols).unwrap();
        assert_eq!(detached, vec![a.clone()]);
        assert!(mounts_under(&vols).is_empty());
        drop(busy);
        std::fs::remove_dir_all(&vols).unwrap();
    }

    #[test]
    fn root_is_a_mount_point() {
        assert!(is_mount_point(Path::new("/")));
        assert!(!mounts_under(Path::new("/")).is_empty());
    }
}
