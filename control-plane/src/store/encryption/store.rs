//! [`EncryptedStore`]: a [`Store`] over another, encrypting the values of
//! the configured resources on every write and decrypting them on every
//! read, list, delete and watch event; keys, revisions and the other
//! resources pass through untouched.
//!
//! It sits under the API server's metrics wrapper and over the backend,
//! so SQLite, etcd and snapshots hold ciphertext, and the API, its watch
//! cache and admission see plaintext.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use super::transformer::Transformers;
use crate::store::{Error, Event, KeyValue, ListResult, Result, SnapshotInfo, Store, WatchStream};

const BACKEND: &str = "encryption";

/// The wrapper; cheap to share.
pub struct EncryptedStore {
    inner: Arc<dyn Store>,
    transformers: Arc<Transformers>,
}

impl EncryptedStore {
    pub fn new(inner: Arc<dyn Store>, transformers: Transformers) -> EncryptedStore {
        EncryptedStore {
            inner,
            transformers: Arc::new(transformers),
        }
    }

    /// The store underneath (ciphertext).
    pub fn inner(&self) -> &Arc<dyn Store> {
        &self.inner
    }
}

fn store_err(e: super::Error) -> Error {
    Error::backend_source(BACKEND, e.to_string(), e)
}

/// `kv` with its value in plaintext.
fn decrypt(t: &Transformers, mut kv: KeyValue) -> Result<KeyValue> {
    if let Some(chain) = t.chain_for(&kv.key) {
        let read = chain.read(&kv.key, &kv.value).map_err(store_err)?;
        if let std::borrow::Cow::Owned(plain) = read.plain {
            kv.value = plain;
        }
    }
    Ok(kv)
}

fn decrypt_event(t: &Transformers, ev: Event) -> Result<Event> {
    Ok(match ev {
        Event::Put { kv, prev } => Event::Put {
            kv: decrypt(t, kv)?,
            prev: prev.map(|p| decrypt(t, p)).transpose()?,
        },
        Event::Delete { prev, revision } => Event::Delete {
            prev: decrypt(t, prev)?,
            revision,
        },
    })
}

#[async_trait::async_trait]
impl Store for EncryptedStore {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    async fn current_revision(&self) -> Result<i64> {
        self.inner.current_revision().await
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let kv = self.inner.get(key).await?;
        kv.map(|kv| decrypt(&self.transformers, kv)).transpose()
    }

    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
        revision: Option<i64>,
    ) -> Result<ListResult> {
        let mut res = self
            .inner
            .list(prefix, start_after, limit, revision)
            .await?;
        if self.transformers.touches(prefix) {
            res.kvs = std::mem::take(&mut res.kvs)
                .into_iter()
                .map(|kv| decrypt(&self.transformers, kv))
                .collect::<Result<_>>()?;
        }
        Ok(res)
    }

    async fn create_with_ttl(
        &self,
        key: &str,
        value: Vec<u8>,
        ttl: Option<Duration>,
    ) -> Result<KeyValue> {
        let Some(chain) = self.transformers.chain_for(key) else {
            return self.inner.create_with_ttl(key, value, ttl).await;
        };
        let stored = chain.write(key, &value).map_err(store_err)?;
        let mut kv = self.inner.create_with_ttl(key, stored, ttl).await?;
        kv.value = value;
        Ok(kv)
    }

    /// # Guarantees
    /// The trait's no-op rule holds for the plaintext: an unchanged object
    /// already under the first key writes nothing (a fresh IV would make
    /// every ciphertext differ). An unchanged object that is stale (under
    /// an older key, or plaintext with encryption on) is rewritten, as
    /// upstream's `GuaranteedUpdate` does: this is how `reencrypt` works.
    async fn update_with_ttl(
        &self,
        key: &str,
        value: Vec<u8>,
        expected_revision: i64,
        ttl: Option<Duration>,
    ) -> Result<KeyValue> {
        let Some(chain) = self.transformers.chain_for(key) else {
            return self
                .inner
                .update_with_ttl(key, value, expected_revision, ttl)
                .await;
        };
        if let Some(cur) = self.inner.get(key).await? {
            if cur.mod_revision == expected_revision {
                let read = chain.read(key, &cur.value).map_err(store_err)?;
                if !read.stale && *read.plain == *value {
                    return Ok(KeyValue { value, ..cur });
                }
            }
        }
        let stored = chain.write(key, &value).map_err(store_err)?;
        let mut kv = self
            .inner
            .update_with_ttl(key, stored, expected_revision, ttl)
            .await?;
        kv.value = value;
        Ok(kv)
    }

    async fn delete(&self, key: &str, expected_revision: Option<i64>) -> Result<(KeyValue, i64)> {
        let (kv, rev) = self.inner.delete(key, expected_revision).await?;
        Ok((decrypt(&self.transformers, kv)?, rev))
    }

    async fn watch(&self, prefix: &str, after_revision: i64) -> Result<WatchStream> {
        let stream = self.inner.watch(prefix, after_revision).await?;
        if !self.transformers.touches(prefix) {
            return Ok(stream);
        }
        let t = self.transformers.clone();
        // An event that does not decrypt ends the watch with its error:
        // the client re-lists and sees the same error on the object.
        Ok(Box::pin(
            stream.map(move |ev| ev.and_then(|ev| decrypt_event(&t, ev))),
        ))
    }

    async fn compact(&self, revision: i64) -> Result<()> {
        self.inner.compact(revision).await
    }

    async fn health(&self) -> Result<()> {
        self.inner.health().await
    }

    /// The backend's bytes, as stored: snapshots stay encrypted.
    async fn snapshot_save(&self, path: &Path) -> Result<SnapshotInfo> {
        self.inner.snapshot_save(path).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::encryption::transformer::{Chain, DataKey, Kind, Slot};
    use crate::store::SqliteStore;

    fn transformers(slots: Vec<Slot>) -> Transformers {
        let mut t = Transformers::default();
        t.push(
            vec![("secrets".into(), "/registry/core/secrets/".into())],
            Chain::new(slots),
        );
        t
    }

    fn aescbc(name: &str, b: u8) -> Slot {
        Slot::Key(DataKey::new(Kind::AesCbc, name, vec![b; 32]))
    }

    /// Every path through the wrapper on a real SQLite store: ciphertext
    /// below, plaintext above, other resources untouched, no-op updates
    /// skipped unless stale.
    #[tokio::test]
    async fn plaintext_above_ciphertext_below() {
        let dir = tempfile::tempdir().unwrap();
        let raw: Arc<dyn Store> =
            Arc::new(SqliteStore::open(dir.path().join("s.db")).await.unwrap());
        let enc = EncryptedStore::new(raw.clone(), transformers(vec![aescbc("k1", 1)]));
        let key = "/registry/core/secrets/ns/s";
        let mut watch = enc.watch("/registry/core/", 0).await.unwrap();

        let kv = enc.create(key, b"{\"v\":1}".to_vec()).await.unwrap();
        assert_eq!(kv.value, b"{\"v\":1}");
        let below = raw.get(key).await.unwrap().unwrap();
        assert!(below.value.starts_with(b"k8s:enc:aescbc:v1:k1:"));
        assert_eq!(enc.get(key).await.unwrap().unwrap().value, b"{\"v\":1}");
        enc.create("/registry/core/configmaps/ns/c", b"{}".to_vec())
            .await
            .unwrap();
        assert_eq!(
            raw.get("/registry/core/configmaps/ns/c")
                .await
                .unwrap()
                .unwrap()
                .value,
            b"{}"
        );

        // No-op update: same revision, nothing written.
        let same = enc
            .update(key, b"{\"v\":1}".to_vec(), kv.mod_revision)
            .await
            .unwrap();
        assert_eq!(same.mod_revision, kv.mod_revision);
        assert_eq!(raw.get(key).await.unwrap().unwrap().value, below.value);
        let v2 = enc
            .update(key, b"{\"v\":2}".to_vec(), kv.mod_revision)
            .await
            .unwrap();
        assert!(v2.mod_revision > kv.mod_revision);
        let list = enc.list("/registry/core/", None, 0, None).await.unwrap();
        let values: Vec<_> = list.kvs.iter().map(|kv| kv.value.clone()).collect();
        assert_eq!(values, vec![b"{}".to_vec(), b"{\"v\":2}".to_vec()]);

        let (gone, _) = enc.delete(key, None).await.unwrap();
        assert_eq!(gone.value, b"{\"v\":2}");
        let mut seen = Vec::new();
        for _ in 0..4 {
            let ev = watch.next().await.unwrap().unwrap();
            seen.push(match ev {
                Event::Put { kv, prev } => (kv.value, prev.map(|p| p.value)),
                Event::Delete { prev, .. } => (Vec::new(), Some(prev.value)),
            });
        }
        assert_eq!(seen[0], (b"{\"v\":1}".to_vec(), None));
        assert_eq!(
            seen[2],
            (b"{\"v\":2}".to_vec(), Some(b"{\"v\":1}".to_vec()))
        );
        assert_eq!(seen[3], (Vec::new(), Some(b"{\"v\":2}".to_vec())));

        // A stale value (older key) is rewritten by an unchanged update.
        let kv = enc.create(key, b"{}".to_vec()).await.unwrap();
        let rotated = EncryptedStore::new(
            raw.clone(),
            transformers(vec![aescbc("k2", 2), aescbc("k1", 1)]),
        );
        let re = rotated
            .update(key, b"{}".to_vec(), kv.mod_revision)
            .await
            .unwrap();
        assert!(re.mod_revision > kv.mod_revision);
        let below = raw.get(key).await.unwrap().unwrap();
        assert!(below.value.starts_with(b"k8s:enc:aescbc:v1:k2:"));
        // Without the key it was written with, reads fail naming the key.
        let e = enc.get(key).await.unwrap_err().to_string();
        assert!(e.contains("aescbc:k2") && e.contains(key), "{e}");
    }

    /// What encryption adds to a Secret write: the cipher alone per value
    /// (1 KiB, a typical Secret), and creates on SQLite with and without
    /// the wrapper. Prints, asserts nothing (run with `--ignored
    /// --nocapture`; a release build gives the real figures).
    #[tokio::test]
    #[ignore]
    async fn cost_per_secret() {
        use std::time::Instant;
        let value = vec![b'x'; 1024];
        let key = "/registry/core/secrets/ns/s";
        for slot in [
            aescbc("k", 1),
            Slot::Key(DataKey::new(Kind::AesGcm, "k", vec![1; 32])),
            Slot::Key(DataKey::new(Kind::Secretbox, "k", vec![1; 32])),
        ] {
            let label = slot.label();
            let chain = Chain::new(vec![slot]);
            let n = 10_000;
            let start = Instant::now();
            for _ in 0..n {
                let stored = chain.write(key, &value).unwrap();
                std::hint::black_box(chain.read(key, &stored).unwrap().plain.len());
            }
            println!("{label}: {:?} per 1 KiB seal + open", start.elapsed() / n);
        }
        let dir = tempfile::tempdir().unwrap();
        let n = 300;
        for (label, encrypt) in [
            ("raw", false),
            ("aescbc", true),
            ("raw", false),
            ("aescbc", true),
        ] {
            let raw: Arc<dyn Store> = Arc::new(
                SqliteStore::open(dir.path().join(format!("{label}{encrypt}.db")))
                    .await
                    .unwrap(),
            );
            let store: Arc<dyn Store> = if encrypt {
                Arc::new(EncryptedStore::new(raw, transformers(vec![aescbc("k", 1)])))
            } else {
                raw
            };
            let start = Instant::now();
            for i in 0..n {
                store
                    .create(
                        &format!(
                            "/registry/core/secrets/ns/s{i}-{}",
                            start.elapsed().as_nanos()
                        ),
                        value.clone(),
                    )
                    .await
                    .unwrap();
            }
            println!(
                "{label}: {:?} per create on SQLite (one at a time, fsync each)",
                start.elapsed() / n
            );
        }
    }
}
