//! The cluster's keys kept in etcd (k3s's encrypted bootstrap data), so
//! that a snapshot is enough to bring a cluster back even when every
//! server's data directory is gone: the shared files of [`super::join`]
//! (cluster, front-proxy and etcd CAs, the ServiceAccount key) sealed
//! with AES-256-GCM under a key derived from the cluster secret, at
//! [`KEY`], outside the resources' `/registry/` prefix.
//!
//! The cluster secret (`DATA_DIR/pki/cluster-secret`) is made by
//! `--cluster-init` (or taken from `--cluster-secret-file`) and handed to
//! joining servers; it never goes into etcd. Operators keep a copy of it
//! with their snapshots, as k3s's server token: without it a snapshot's
//! keys stay sealed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::join;
use super::Error;
use crate::config::Config;
use crate::store::encryption::aesgcm;
use crate::store::Store;

/// Where the sealed keys are in etcd.
pub const KEY: &str = "/skiff/bootstrap";

/// The cluster secret's file name under `DATA_DIR/pki`.
pub const SECRET_FILE: &str = "cluster-secret";

/// Characters a cluster secret has at least (a made one has 64).
const SECRET_MIN_LEN: usize = 32;

pub fn secret_path(data_dir: &Path) -> PathBuf {
    data_dir.join("pki").join(SECRET_FILE)
}

/// The cluster secret of `file`, checked for length.
///
/// # Errors
/// It cannot be read or is too short.
pub fn read_secret(file: &Path) -> Result<String, Error> {
    let text = std::fs::read_to_string(file).map_err(|e| {
        Error::Io(format!(
            "reading the cluster secret {}: {e}",
            file.display()
        ))
    })?;
    let secret = text.trim().to_string();
    if secret.len() < SECRET_MIN_LEN {
        return Err(Error::Io(format!(
            "the cluster secret in {} has {} characters; it needs at least {SECRET_MIN_LEN}",
            file.display(),
            secret.len()
        )));
    }
    Ok(secret)
}

/// Make sure this server has the cluster secret: the one it has, else
/// `given` copied in, else a new random one. A `given` secret other than
/// the one it has is refused: the keys in etcd are sealed with that one.
///
/// # Errors
/// A file cannot be read or written, or the secrets differ.
pub fn ensure_secret(data_dir: &Path, given: Option<&Path>) -> Result<(), Error> {
    let path = secret_path(data_dir);
    let given = given.map(read_secret).transpose()?;
    if path.exists() {
        let have = read_secret(&path)?;
        return match given {
            Some(g) if g != have => Err(Error::Io(format!(
                "--cluster-secret-file differs from this server's cluster secret {} (move it aside to use the other one)",
                path.display()
            ))),
            _ => Ok(()),
        };
    }
    let secret = given.unwrap_or_else(|| hex::encode(rand::random::<[u8; 32]>()));
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::Io(format!("creating {}: {e}", dir.display())))?;
    }
    crate::pki::write_file(&path, &format!("{secret}\n"), true)?;
    Ok(())
}

fn cipher_key(secret: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"skiff cluster bootstrap v1\n");
    h.update(secret.as_bytes());
    h.finalize().into()
}

fn seal(secret: &str, files: &BTreeMap<String, String>) -> Result<Vec<u8>, Error> {
    let plain = serde_json::to_vec(files).map_err(|e| Error::Io(e.to_string()))?;
    aesgcm::seal(&cipher_key(secret), &plain, KEY.as_bytes()).map_err(|e| Error::Io(e.to_string()))
}

fn open(secret: &str, sealed: &[u8]) -> Result<BTreeMap<String, String>, Error> {
    let plain = aesgcm::open(&cipher_key(secret), sealed, KEY.as_bytes()).map_err(|_| {
        Error::Io(
            "the cluster keys in etcd do not open with this cluster secret (it is another cluster's, or not this cluster's --cluster-secret-file)"
                .into(),
        )
    })?;
    serde_json::from_slice(&plain).map_err(|e| Error::Io(format!("the cluster keys in etcd: {e}")))
}

/// The shared files but the secret itself.
fn keys(cfg: &Config) -> Result<BTreeMap<String, String>, Error> {
    let mut files = join::read_shared(&cfg.data_dir, &cfg.service_accounts.signing_key_file)
        .map_err(Error::Io)?;
    files.remove(SECRET_FILE);
    Ok(files)
}

/// Keep this server's keys in `store`, sealed, unless they are there
/// already. Every server does it at start, so a cluster made before a
/// server kept them gains them; another cluster's sealed keys (a secret
/// that does not open them) are left alone, and said so.
///
/// # Errors
/// The files or the secret cannot be read, or the store refuses.
pub async fn publish(cfg: &Config, store: &dyn Store) -> Result<(), Error> {
    let secret = read_secret(&secret_path(&cfg.data_dir))?;
    let files = keys(cfg)?;
    let stored = store
        .get(KEY)
        .await
        .map_err(|e| Error::Io(format!("reading {KEY}: {e}")))?;
    let written = match stored {
        None => store.create(KEY, seal(&secret, &files)?).await.map(|_| ()),
        Some(kv) => match open(&secret, &kv.value) {
            Ok(have) if have == files => return Ok(()),
            Ok(_) => store
                .update(KEY, seal(&secret, &files)?, kv.mod_revision)
                .await
                .map(|_| ()),
            Err(e) => {
                tracing::warn!("{e}; they are left as they are");
                return Ok(());
            }
        },
    };
    match written {
        Ok(()) => {
            tracing::info!(key = KEY, "the cluster's keys are kept in etcd, sealed");
            Ok(())
        }
        // Another server wrote them at the same moment: theirs stand.
        Err(crate::store::Error::AlreadyExists { .. } | crate::store::Error::Conflict { .. }) => {
            Ok(())
        }
        Err(e) => Err(Error::Io(format!("writing {KEY}: {e}"))),
    }
}

/// Take the cluster's keys from `store` (a member just restored from a
/// snapshot) into this server's data directory, opened with its cluster
/// secret.
///
/// # Errors
/// The snapshot holds no keys, they do not open, or a file cannot be
/// written.
pub async fn recover(cfg: &Config, store: &dyn Store) -> Result<(), Error> {
    let secret = read_secret(&secret_path(&cfg.data_dir))?;
    let stored = store
        .get(KEY)
        .await
        .map_err(|e| Error::Io(format!("reading {KEY}: {e}")))?
        .ok_or_else(|| {
            Error::Io(format!(
                "the snapshot holds no cluster keys ({KEY}): restore {}/pki from a backup before the reset",
                cfg.data_dir.display()
            ))
        })?;
    let files = open(&secret, &stored.value)?;
    join::write_shared(cfg, &files, Some(SECRET_FILE))?;
    tracing::info!("the cluster's keys taken from the snapshot");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_keys_open_only_with_their_secret() {
        let files = BTreeMap::from([("ca.key".to_string(), "KEY".to_string())]);
        let a = "a".repeat(64);
        let sealed = seal(&a, &files).unwrap();
        assert!(!sealed.windows(3).any(|w| w == b"KEY"));
        assert_eq!(open(&a, &sealed).unwrap(), files);
        let err = open(&"b".repeat(64), &sealed).unwrap_err().to_string();
        assert!(
            err.contains("do not open with this cluster secret"),
            "{err}"
        );
    }

    #[test]
    fn secrets_are_made_once_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        ensure_secret(dir.path(), None).unwrap();
        let made = read_secret(&secret_path(dir.path())).unwrap();
        assert_eq!(made.len(), 64);
        ensure_secret(dir.path(), None).unwrap();
        assert_eq!(read_secret(&secret_path(dir.path())).unwrap(), made);

        let other = dir.path().join("other");
        std::fs::write(&other, "c".repeat(40)).unwrap();
        let err = ensure_secret(dir.path(), Some(&other))
            .unwrap_err()
            .to_string();
        assert!(err.contains("differs"), "{err}");
        let short = dir.path().join("short");
        std::fs::write(&short, "abc").unwrap();
        let fresh = tempfile::tempdir().unwrap();
        let err = ensure_secret(fresh.path(), Some(&short))
            .unwrap_err()
            .to_string();
        assert!(err.contains("at least 32"), "{err}");
        ensure_secret(fresh.path(), Some(&other)).unwrap();
        assert_eq!(
            read_secret(&secret_path(fresh.path())).unwrap(),
            "c".repeat(40)
        );
    }
}
