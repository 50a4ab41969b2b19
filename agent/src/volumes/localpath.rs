//! local-path volumes on disk: the directory of a PV made by the built-in
//! provisioner, created when a pod first mounts it and removed when the PV
//! is deleted with reclaim policy Delete.
//!
//! The path comes from the API (the PV's `local.path` and its
//! `skiff.io/local-path-root` annotation), so before anything is created,
//! chowned or removed it must be exactly one safe name under that root,
//! and a symlink planted at that name is never followed: whoever can write
//! the root must not be able to point the agent (root) at another
//! directory.

use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use super::Error;

/// A new directory without fsGroup: anyone may write (k3s's mode, as the
/// containers may run as any user).
pub const MODE: u32 = 0o777;
/// A new directory owned by root and the pod's fsGroup; setgid so that new
/// files inherit the group.
pub const GROUP_MODE: u32 = 0o2775;

/// Check that `path` is one safe directory name right under `root`.
///
/// # Errors
/// [`Error::LocalPathUnsafe`] naming what is wrong.
pub fn check_path(path: &Path, root: &str) -> Result<(), Error> {
    let unsafe_ = |reason: &'static str| Error::LocalPathUnsafe {
        path: path.to_path_buf(),
        reason,
    };
    let root = Path::new(root);
    if !root.is_absolute() {
        return Err(unsafe_("its root is not an absolute path"));
    }
    if path.parent() != Some(root) {
        return Err(unsafe_("it is not directly under its root"));
    }
    // Path::file_name hides a trailing `..` and `.`: compare the text.
    let name = path
        .to_str()
        .and_then(|p| p.rsplit('/').next())
        .unwrap_or_default();
    if !kube_util::storage::safe_dir_name(name)
        || path.file_name().and_then(|n| n.to_str()) != Some(name)
    {
        return Err(unsafe_("its name is not a single directory name"));
    }
    Ok(())
}

/// Blocking: make sure the volume's directory exists (creating it, and
/// its root, when missing), then give it to the pod's fsGroup as the
/// kubelet does for local volumes.
///
/// # Errors
/// An unsafe path, something other than a directory at the path (a
/// symlink included), or a failed filesystem call.
pub fn ensure(
    path: &Path,
    root: &str,
    gid: Option<u32>,
    policy: Option<&str>,
) -> Result<(), Error> {
    check_path(path, root)?;
    let root = Path::new(root);
    fs::create_dir_all(root).map_err(Error::io("creating local-path root", root))?;
    let created = match fs::DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => true,
        Err(e) if e.kind() == ErrorKind::AlreadyExists => false,
        Err(e) => return Err(Error::io("creating", path)(e)),
    };
    // O_NOFOLLOW: a symlink swapped in after the check fails here instead
    // of being chowned through.
    let dir = fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_DIRECTORY)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(nix::libc::ELOOP | nix::libc::ENOTDIR) => {
                Error::LocalPathNotDir(path.to_path_buf())
            }
            _ => Error::io("opening", path)(e),
        })?;
    if created {
        let mode = match gid {
            Some(g) => {
                std::os::unix::fs::fchown(&dir, Some(0), Some(g))
                    .map_err(Error::io("chown", path))?;
                GROUP_MODE
            }
            None => MODE,
        };
        // Set explicitly: the umask trimmed what mkdir made.
        return dir
            .set_permissions(fs::Permissions::from_mode(mode))
            .map_err(Error::io("chmod", path));
    }
    let Some(gid) = gid else { return Ok(()) };
    let meta = dir.metadata().map_err(Error::io("stat", path))?;
    if policy == Some("OnRootMismatch") && meta.gid() == gid {
        return Ok(());
    }
    set_group(path, gid)
}

/// The kubelet's `SetVolumeOwnership`: every entry gets group `gid`,
/// directories g+rwx and setgid, other files g+rw. Symlinks are chowned
/// themselves (lchown) and never followed.
fn set_group(path: &Path, gid: u32) -> Result<(), Error> {
    let meta = fs::symlink_metadata(path).map_err(Error::io("stat", path))?;
    std::os::unix::fs::lchown(path, None, Some(gid)).map_err(Error::io("chown", path))?;
    let ft = meta.file_type();
    if ft.is_symlink() {
        return Ok(());
    }
    let add = if ft.is_dir() { 0o2770 } else { 0o660 };
    let mode = meta.permissions().mode() & 0o7777;
    if mode | add != mode {
        fs::set_permissions(path, fs::Permissions::from_mode(mode | add))
            .map_err(Error::io("chmod", path))?;
    }
    if ft.is_dir() {
        for entry in fs::read_dir(path).map_err(Error::io("reading", path))? {
            let entry = entry.map_err(Error::io("reading", path))?;
            set_group(&entry.path(), gid)?;
        }
    }
    Ok(())
}

/// What [`remove`] found at the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removed {
    Directory,
    /// A symlink (only the link went) or another non-directory.
    Other,
    Missing,
}

/// Blocking: remove a local-path volume's directory and everything in it.
/// A symlink at the path is unlinked, its target left alone
/// (`remove_dir_all` itself never follows symlinks inside).
///
/// # Errors
/// An unsafe path or a failed removal.
pub fn remove(path: &Path, root: &str) -> Result<Removed, Error> {
    check_path(path, root)?;
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Removed::Missing),
        Err(e) => return Err(Error::io("stat", path)(e)),
    };
    if meta.is_dir() {
        fs::remove_dir_all(path).map_err(Error::io("removing", path))?;
        Ok(Removed::Directory)
    } else {
        fs::remove_file(path).map_err(Error::io("removing", path))?;
        Ok(Removed::Other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root(t: &tempfile::TempDir) -> String {
        t.path().join("lp").to_str().unwrap().to_string()
    }

    #[test]
    fn paths_must_be_one_name_under_the_root() {
        let ok = |p: &str| check_path(Path::new(p), "/r").is_ok();
        assert!(ok("/r/pvc-1_ns_c"));
        assert!(!ok("/r/.."));
        assert!(!ok("/r/."));
        assert!(!ok("/r/a/b"));
        assert!(!ok("/other/a"));
        assert!(!ok("/r"));
        assert!(!ok("/r/"));
        assert!(check_path(Path::new("r/a"), "r").is_err(), "relative root");
        let e = check_path(Path::new("/r/../etc"), "/r").unwrap_err();
        assert!(e.to_string().contains("not directly under its root"), "{e}");
    }

    #[test]
    fn created_world_writable_or_for_the_group() {
        let t = tempfile::tempdir().unwrap();
        let r = root(&t);
        let p = Path::new(&r).join("v1");
        ensure(&p, &r, None, None).unwrap();
        let m = fs::metadata(&p).unwrap();
        assert!(m.is_dir());
        assert_eq!(m.permissions().mode() & 0o7777, 0o777);

        let g = Path::new(&r).join("v2");
        ensure(&g, &r, Some(4321), None).unwrap();
        let m = fs::metadata(&g).unwrap();
        assert_eq!(m.permissions().mode() & 0o7777, 0o2775);
        assert_eq!((m.uid(), m.gid()), (0, 4321));
        // Idempotent, and the content is left as it is.
        fs::write(g.join("f"), b"x").unwrap();
        ensure(&g, &r, Some(4321), Some("OnRootMismatch")).unwrap();
        assert_eq!(fs::read(g.join("f")).unwrap(), b"x");
    }

    #[test]
    fn fs_group_on_later_mounts_follows_the_policy() {
        let t = tempfile::tempdir().unwrap();
        let r = root(&t);
        let p = Path::new(&r).join("v");
        ensure(&p, &r, None, None).unwrap();
        fs::create_dir(p.join("d")).unwrap();
        fs::write(p.join("d/f"), b"x").unwrap();
        fs::set_permissions(p.join("d/f"), fs::Permissions::from_mode(0o600)).unwrap();
        let outside = t.path().join("outside");
        fs::write(&outside, b"o").unwrap();
        std::os::unix::fs::symlink(&outside, p.join("link")).unwrap();

        // Root's group already matches: OnRootMismatch changes nothing.
        std::os::unix::fs::chown(&p, None, Some(77)).unwrap();
        ensure(&p, &r, Some(77), Some("OnRootMismatch")).unwrap();
        assert_eq!(fs::metadata(p.join("d/f")).unwrap().gid(), 0);

        ensure(&p, &r, Some(77), None).unwrap();
        let f = fs::metadata(p.join("d/f")).unwrap();
        assert_eq!(f.gid(), 77);
        assert_eq!(f.permissions().mode() & 0o777, 0o660);
        let d = fs::metadata(p.join("d")).unwrap();
        assert_eq!(d.permissions().mode() & 0o2000, 0o2000);
        assert_eq!(fs::symlink_metadata(p.join("link")).unwrap().gid(), 77);
        assert_eq!(
            fs::metadata(&outside).unwrap().gid(),
            0,
            "symlink not followed"
        );

        // A mismatched root group makes OnRootMismatch walk too.
        ensure(&p, &r, Some(88), Some("OnRootMismatch")).unwrap();
        assert_eq!(fs::metadata(p.join("d/f")).unwrap().gid(), 88);
    }

    #[test]
    fn a_symlink_or_file_at_the_path_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let r = root(&t);
        fs::create_dir_all(&r).unwrap();
        let target = t.path().join("target");
        fs::create_dir(&target).unwrap();
        let link = Path::new(&r).join("v");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = ensure(&link, &r, Some(5), None).unwrap_err();
        assert!(matches!(e, Error::LocalPathNotDir(_)), "{e}");
        assert_eq!(fs::metadata(&target).unwrap().gid(), 0);
        let file = Path::new(&r).join("f");
        fs::write(&file, b"x").unwrap();
        assert!(matches!(
            ensure(&file, &r, None, None),
            Err(Error::LocalPathNotDir(_))
        ));
        assert!(ensure(&Path::new(&r).join(".."), &r, None, None).is_err());
    }

    #[test]
    fn removal_takes_only_the_directory() {
        let t = tempfile::tempdir().unwrap();
        let r = root(&t);
        let p = Path::new(&r).join("v");
        let sibling = Path::new(&r).join("w");
        ensure(&p, &r, None, None).unwrap();
        ensure(&sibling, &r, None, None).unwrap();
        fs::write(p.join("data"), b"x").unwrap();
        let outside = t.path().join("outside");
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("keep"), b"k").unwrap();
        std::os::unix::fs::symlink(&outside, p.join("escape")).unwrap();

        assert_eq!(remove(&p, &r).unwrap(), Removed::Directory);
        assert!(!p.exists());
        assert!(sibling.is_dir());
        assert!(outside.join("keep").exists());
        assert_eq!(remove(&p, &r).unwrap(), Removed::Missing);

        // A symlink at the path: the link goes, the target stays.
        std::os::unix::fs::symlink(&outside, &p).unwrap();
        assert_eq!(remove(&p, &r).unwrap(), Removed::Other);
        assert!(fs::symlink_metadata(&p).is_err());
        assert!(outside.join("keep").exists());
        assert!(remove(&Path::new(&r).join(".."), &r).is_err());
        assert!(Path::new(&r).is_dir());
    }
}
