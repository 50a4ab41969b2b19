//! What `skiff-server secrets-encrypt` does (k3s's command): count stored
//! values by the key that wrote them (`status`), and rewrite every value
//! of the configured resources with the first key (`reencrypt`). Rotation
//! itself is [`EncryptionConfiguration::rotate`](super::config::EncryptionConfiguration::rotate).

use std::collections::BTreeMap;
use std::time::Duration;

use super::store::EncryptedStore;
use super::transformer::{stored_under, Transformers};
use crate::store::{Error, Result, Store};

/// Keys read per page.
const PAGE: usize = 500;
/// Tries per key when a concurrent writer wins the compare-and-swap.
const TRIES: usize = 5;

/// The values under one configured resource, by what wrote them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceCount {
    /// As configured (`secrets`, `*.apps`).
    pub resource: String,
    /// The provider that writes now: `aescbc:key1`, or `identity`.
    pub active: String,
    /// `aescbc:key1` (or `identity` for plaintext) -> number of values.
    pub by_key: BTreeMap<String, u64>,
}

/// Count the stored values of every configured resource by the key that
/// wrote them, reading the raw store (`raw` must not decrypt). Without a
/// config, Secrets are counted (all plaintext, one hopes).
///
/// # Errors
/// The store cannot be listed.
pub async fn status(raw: &dyn Store, t: Option<&Transformers>) -> Result<Vec<ResourceCount>> {
    let Some(t) = t else {
        let by_key = count(raw, "/registry/core/secrets/", |_| true).await?;
        return Ok(vec![ResourceCount {
            resource: "secrets".into(),
            active: "identity".into(),
            by_key,
        }]);
    };
    let mut out = Vec::new();
    for rule in t.rules() {
        // A key counts for the first rule that holds it, as it is written.
        let mine = |key: &str| t.rule_for(key).is_some_and(|r| r.prefix == rule.prefix);
        out.push(ResourceCount {
            resource: rule.resource.clone(),
            active: t.chain(rule).active().label(),
            by_key: count(raw, &rule.prefix, mine).await?,
        });
    }
    Ok(out)
}

/// `status`'s report: on or off, then per resource the key that writes
/// and how many values each key holds.
pub fn status_text(config: Option<&std::path::Path>, counts: &[ResourceCount]) -> String {
    use std::fmt::Write;
    let on = counts.iter().any(|c| c.active != "identity");
    let mut out = match config {
        None => "Encryption Status: Disabled (no --encryption-provider-config)\n".to_string(),
        Some(p) if on => format!("Encryption Status: Enabled ({})\n", p.display()),
        Some(p) => format!(
            "Encryption Status: Disabled (identity writes in {})\n",
            p.display()
        ),
    };
    for c in counts {
        let _ = writeln!(out, "{}: active key {}", c.resource, c.active);
        if c.by_key.is_empty() {
            let _ = writeln!(out, "  (none stored)");
        }
        for (key, n) in &c.by_key {
            let what = if key == "identity" {
                "identity (plaintext)"
            } else {
                key
            };
            let _ = writeln!(out, "  {what}: {n}");
        }
    }
    out
}

async fn count(
    raw: &dyn Store,
    prefix: &str,
    mine: impl Fn(&str) -> bool,
) -> Result<BTreeMap<String, u64>> {
    let mut by_key = BTreeMap::new();
    let mut after: Option<String> = None;
    let mut revision = None;
    loop {
        let page = raw.list(prefix, after.as_deref(), PAGE, revision).await?;
        revision = Some(page.revision);
        for kv in &page.kvs {
            if mine(&kv.key) {
                *by_key.entry(stored_under(&kv.value)).or_insert(0) += 1;
            }
        }
        match (page.more, page.kvs.last()) {
            (true, Some(last)) => after = Some(last.key.clone()),
            _ => return Ok(by_key),
        }
    }
}

/// What `reencrypt` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reencrypted {
    /// Values written again with the first key.
    pub rewritten: u64,
    /// Values already under the first key (left alone).
    pub current: u64,
}

/// Rewrite every value of the configured resources that is not under the
/// first key (plaintext, or an older key), through `store`, as an update
/// of the unchanged object: revisions move and watchers see MODIFIED, as
/// with k3s's `secrets-encrypt reencrypt`. `ttl_for` gives the TTL to
/// write a key with (Events keep expiring, counted again from now).
///
/// # Errors
/// A store failure, or a value no configured key decrypts (the message
/// names it): fix the config and run it again; it resumes where the
/// values are still stale.
pub async fn reencrypt(
    store: &EncryptedStore,
    t: &Transformers,
    ttl_for: impl Fn(&str) -> Option<Duration>,
) -> Result<Reencrypted> {
    let mut done = Reencrypted::default();
    for rule in t.rules() {
        let mut after: Option<String> = None;
        loop {
            let page = store
                .list(&rule.prefix, after.as_deref(), PAGE, None)
                .await?;
            for kv in &page.kvs {
                if t.rule_for(&kv.key).is_some_and(|r| r.prefix == rule.prefix) {
                    rewrite(store, kv.clone(), ttl_for(&kv.key), &mut done).await?;
                }
            }
            match (page.more, page.kvs.last()) {
                (true, Some(last)) => after = Some(last.key.clone()),
                _ => break,
            }
        }
    }
    Ok(done)
}

async fn rewrite(
    store: &EncryptedStore,
    mut kv: crate::store::KeyValue,
    ttl: Option<Duration>,
    done: &mut Reencrypted,
) -> Result<()> {
    for _ in 0..TRIES {
        match store
            .update_with_ttl(&kv.key, kv.value.clone(), kv.mod_revision, ttl)
            .await
        {
            Ok(new) => {
                if new.mod_revision == kv.mod_revision {
                    done.current += 1;
                } else {
                    done.rewritten += 1;
                }
                return Ok(());
            }
            // Someone else wrote it: that write used the first key, but
            // read it again to be sure (their server may run an older config).
            Err(Error::Conflict { .. }) => match store.get(&kv.key).await? {
                Some(fresh) => kv = fresh,
                None => return Ok(()),
            },
            Err(Error::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    Err(Error::Conflict {
        key: kv.key.clone(),
        expected: kv.mod_revision,
        actual: kv.mod_revision,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::encryption::transformer::{Chain, DataKey, Kind, Slot};
    use crate::store::SqliteStore;

    fn secrets(slots: Vec<Slot>) -> Transformers {
        let mut t = Transformers::default();
        t.push(
            vec![("secrets".into(), "/registry/core/secrets/".into())],
            Chain::new(slots),
        );
        t
    }

    fn key(name: &str, b: u8) -> Slot {
        Slot::Key(DataKey::new(Kind::Secretbox, name, vec![b; 32]))
    }

    #[tokio::test]
    async fn status_counts_and_reencrypt_moves_everything_to_the_first_key() {
        let dir = tempfile::tempdir().unwrap();
        let raw: Arc<dyn Store> =
            Arc::new(SqliteStore::open(dir.path().join("s.db")).await.unwrap());
        // Two plaintext secrets from before encryption, one under k1.
        raw.create("/registry/core/secrets/a/p1", b"{}".to_vec())
            .await
            .unwrap();
        raw.create("/registry/core/secrets/a/p2", b"{}".to_vec())
            .await
            .unwrap();
        raw.create("/registry/core/configmaps/a/c", b"{}".to_vec())
            .await
            .unwrap();
        let t1 = secrets(vec![key("k1", 1)]);
        let enc1 = EncryptedStore::new(raw.clone(), t1.clone());
        enc1.create("/registry/core/secrets/a/s", b"{\"x\":1}".to_vec())
            .await
            .unwrap();
        let st = status(raw.as_ref(), Some(&t1)).await.unwrap();
        assert_eq!(st[0].active, "secretbox:k1");
        assert_eq!(
            st[0].by_key,
            BTreeMap::from([("identity".into(), 2), ("secretbox:k1".into(), 1)])
        );

        let t2 = secrets(vec![key("k2", 2), key("k1", 1)]);
        let enc2 = EncryptedStore::new(raw.clone(), t2.clone());
        let r = reencrypt(&enc2, &t2, |_| None).await.unwrap();
        assert_eq!(
            r,
            Reencrypted {
                rewritten: 3,
                current: 0
            }
        );
        let st = status(raw.as_ref(), Some(&t2)).await.unwrap();
        assert_eq!(st[0].by_key, BTreeMap::from([("secretbox:k2".into(), 3)]));
        // Again: nothing left to do.
        let r = reencrypt(&enc2, &t2, |_| None).await.unwrap();
        assert_eq!(
            r,
            Reencrypted {
                rewritten: 0,
                current: 3
            }
        );
        let s = enc2
            .get("/registry/core/secrets/a/s")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(s.value, b"{\"x\":1}");
        assert_eq!(
            raw.get("/registry/core/configmaps/a/c")
                .await
                .unwrap()
                .unwrap()
                .value,
            b"{}"
        );
    }
}
