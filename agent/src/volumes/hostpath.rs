//! hostPath volumes: the host's own path, checked against the volume's
//! `type` as upstream's `checkType` does (and created for the *OrCreate
//! types).

use std::fs;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;

use super::Error;

/// Check (or create) `path` for hostPath type `type_`. `""` (unset)
/// checks nothing.
///
/// # Errors
/// Upstream's messages: `hostPath type check failed: PATH is not a directory`
/// and so on; an unknown type; a failed create.
pub fn check(path: &Path, type_: &str) -> Result<(), Error> {
    let meta = fs::metadata(path).ok();
    let ft = meta.as_ref().map(|m| m.file_type());
    let fail = |what: &'static str| {
        Err(Error::HostPathType {
            path: path.to_path_buf(),
            what,
        })
    };
    match type_ {
        "" => Ok(()),
        "DirectoryOrCreate" if meta.is_none() => {
            fs::create_dir_all(path).map_err(Error::io("creating hostPath", path))?;
            fs::set_permissions(path, fs::Permissions::from_mode(0o755))
                .map_err(Error::io("chmod hostPath", path))
        }
        "DirectoryOrCreate" | "Directory" => match ft {
            Some(t) if t.is_dir() => Ok(()),
            _ => fail("a directory"),
        },
        "FileOrCreate" if meta.is_none() => fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map(drop)
            .map_err(Error::io("creating hostPath", path)),
        "FileOrCreate" | "File" => match ft {
            Some(t) if t.is_file() => Ok(()),
            _ => fail("a file"),
        },
        "Socket" => match ft {
            Some(t) if t.is_socket() => Ok(()),
            _ => fail("a socket file"),
        },
        "CharDevice" => match ft {
            Some(t) if t.is_char_device() => Ok(()),
            _ => fail("a character device"),
        },
        "BlockDevice" => match ft {
            Some(t) if t.is_block_device() => Ok(()),
            _ => fail("a block device"),
        },
        other => Err(Error::HostPathUnknownType(other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_checks() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path();
        let file = dir.join("f");
        fs::write(&file, b"x").unwrap();
        assert!(check(dir, "Directory").is_ok());
        assert!(check(&file, "File").is_ok());
        assert!(check(&dir.join("nope"), "").is_ok());
        assert_eq!(
            check(&file, "Directory").unwrap_err().to_string(),
            format!(
                "hostPath type check failed: {} is not a directory",
                file.display()
            )
        );
        assert!(check(dir, "File")
            .unwrap_err()
            .to_string()
            .ends_with("is not a file"));
        assert!(check(&dir.join("nope"), "Directory").is_err());
        assert!(check(&file, "Socket")
            .unwrap_err()
            .to_string()
            .ends_with("is not a socket file"));
        assert!(check(Path::new("/dev/null"), "CharDevice").is_ok());
        assert!(check(&file, "BlockDevice")
            .unwrap_err()
            .to_string()
            .ends_with("is not a block device"));
        assert!(check(&file, "Weird").is_err());

        let made = dir.join("a/b");
        check(&made, "DirectoryOrCreate").unwrap();
        assert!(made.is_dir());
        assert!(check(&file, "DirectoryOrCreate").is_err());
        let f2 = dir.join("g");
        check(&f2, "FileOrCreate").unwrap();
        assert!(f2.is_file());
        assert!(check(dir, "FileOrCreate").is_err());

        let sock = dir.join("s");
        let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        assert!(check(&sock, "Socket").is_ok());
    }
}
