//! The compactor: every interval, forget the history older than one
//! interval, as kube-apiserver's etcd compactor does, for either backend.
//!
//! Upstream (`staging/src/k8s.io/apiserver/pkg/storage/etcd3/compact.go`)
//! keeps one key, `compact_rev_key`, whose value is the revision a
//! compactor saw at its last turn. Each turn a server writes the revision
//! it sees now with a compare-and-swap against the key's state it saw at
//! its previous turn; if that succeeds it compacts to the revision it saw
//! at that previous turn (one interval ago), so a watcher less than one
//! interval behind can still resume. If it fails, another server did a
//! turn in between: this one adopts what it reads and tries again one
//! interval later. So several servers on one etcd compact once per
//! interval between them (between one and two intervals when the one that
//! compacted goes away), and the first turn after a start never compacts.
//!
//! Upstream compares the key's `version`; the [`Store`] trait compares
//! `mod_revision`, which changes on every write just the same. The key and
//! its value (the revision in decimal) are upstream's, so skiff servers
//! and kube-apiservers sharing one etcd take turns with each other too.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::{Error, Result, Store};

/// The key the compactors of every server share (upstream's name; it is
/// outside `/registry/`, so no API list or watch sees it).
pub const COMPACT_REV_KEY: &str = "compact_rev_key";

/// One compactor's memory between turns.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Compactor {
    /// The `mod_revision` of [`COMPACT_REV_KEY`] as this compactor last
    /// saw it (0: the key did not exist).
    seen: i64,
    /// The store's revision at this compactor's last turn: what it compacts
    /// to at its next successful turn.
    rev: i64,
}

impl Compactor {
    /// One turn. Returns the revision compacted to, if this turn compacted.
    ///
    /// # Errors
    /// The store failed; the next turn starts from what this one learnt.
    pub async fn turn(&mut self, store: &dyn Store) -> Result<Option<i64>> {
        let value = self.rev.to_string().into_bytes();
        let written = if self.seen == 0 {
            store.create(COMPACT_REV_KEY, value).await
        } else {
            store.update(COMPACT_REV_KEY, value, self.seen).await
        };
        match written {
            Ok(kv) => {
                let target = std::mem::replace(&mut self.rev, kv.mod_revision);
                self.seen = kv.mod_revision;
                if target == 0 {
                    // The first turn after a start only takes note.
                    return Ok(None);
                }
                store.compact(target).await?;
                Ok(Some(target))
            }
            // Another compactor took this turn: start from its state.
            Err(Error::AlreadyExists { .. }) => {
                self.seen = store
                    .get(COMPACT_REV_KEY)
                    .await?
                    .map_or(0, |kv| kv.mod_revision);
                self.rev = store.current_revision().await?;
                Ok(None)
            }
            Err(Error::Conflict { actual, .. }) => {
                self.seen = actual;
                self.rev = store.current_revision().await?;
                Ok(None)
            }
            Err(Error::NotFound { .. }) => {
                self.seen = 0;
                self.rev = store.current_revision().await?;
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

/// Take a turn every `interval` until `shutdown` turns true (or its sender
/// goes away). The first turn is one interval after the start. Stopping
/// in the middle of a turn is safe: the next start begins afresh.
pub async fn run(store: Arc<dyn Store>, interval: Duration, mut shutdown: watch::Receiver<bool>) {
    let mut compactor = Compactor::default();
    let turns = async {
        loop {
            tokio::time::sleep(interval).await;
            match compactor.turn(store.as_ref()).await {
                Ok(Some(revision)) => {
                    tracing::debug!(backend = store.backend(), revision, "store compacted")
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(
                    backend = store.backend(),
                    error = %e,
                    "store compaction failed; trying again in one interval"
                ),
            }
        }
    };
    tokio::select! {
        () = turns => {}
        _ = shutdown.wait_for(|stop| *stop) => {}
    }
}
