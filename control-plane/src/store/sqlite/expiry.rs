//! Keys with a TTL in the SQLite store (etcd's leases, for one process):
//! table `expiry` holds, for each key that has one, when it is due and
//! the revision that set it; the writer keeps it in step with every write
//! in the same transaction, and a sweeper deletes what is due.
//!
//! Deadlines are wall-clock milliseconds, so a key written before a restart
//! still goes at its time after it. Expired keys go with a normal delete
//! that expects the revision that set the TTL: watchers see DELETED, and a
//! key rewritten meanwhile (which set or cleared its own expiry) stays.

use std::sync::Weak;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection};

use super::{sql_err, Inner, SqliteStore};
use crate::store::{Error, Result, Store};

pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS expiry (
    name TEXT PRIMARY KEY,
    at INTEGER NOT NULL,
    revision INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS expiry_at ON expiry (at);
";

/// How often the sweeper looks for due keys (etcd's lessor checks twice a
/// second; events live an hour by default).
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Keys deleted per step; their deletes are committed together.
const SWEEP_BATCH: usize = 512;

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Record the expiry the write at `revision` gave `key`: due `ttl` from
/// now, or none (a write without a TTL ends the key's expiry, as a put
/// without a lease does in etcd).
pub(super) fn set(
    conn: &Connection,
    key: &str,
    ttl: Option<Duration>,
    revision: i64,
) -> rusqlite::Result<()> {
    match ttl {
        Some(ttl) => {
            let at = now_ms().saturating_add(ttl.as_millis().min(i64::MAX as u128) as i64);
            conn.prepare_cached(
                "INSERT OR REPLACE INTO expiry (name, at, revision) VALUES (?1, ?2, ?3)",
            )?
            .execute(params![key, at, revision])?;
        }
        None => clear(conn, key)?,
    }
    Ok(())
}

/// Forget `key`'s expiry (it was deleted, or rewritten without a TTL).
pub(super) fn clear(conn: &Connection, key: &str) -> rusqlite::Result<()> {
    conn.prepare_cached("DELETE FROM expiry WHERE name = ?1")?
        .execute([key])?;
    Ok(())
}

/// Up to `limit` keys due at `now`, soonest first, with the revision that
/// set their expiry.
fn due(conn: &Connection, now: i64, limit: usize) -> rusqlite::Result<Vec<(String, i64)>> {
    let mut stmt = conn
        .prepare_cached("SELECT name, revision FROM expiry WHERE at <= ?1 ORDER BY at LIMIT ?2")?;
    let rows = stmt.query_map(params![now, limit as i64], |r| Ok((r.get(0)?, r.get(1)?)))?;
    rows.collect()
}

impl SqliteStore {
    /// Delete every key due at `now`; returns how many went.
    ///
    /// # Errors
    /// A read or a delete failed (not: a key already gone or rewritten).
    pub(super) async fn sweep_expired(&self, now: i64) -> Result<usize> {
        let mut deleted = 0;
        loop {
            let batch = self
                .inner
                .readers
                .read(move |c| due(c, now, SWEEP_BATCH).map_err(sql_err("read expired keys")))
                .await?;
            // Sent together, the deletes share one commit.
            let results = futures::future::join_all(
                batch
                    .iter()
                    .map(|(key, revision)| self.delete(key, Some(*revision))),
            )
            .await;
            let before = deleted;
            for r in results {
                match r {
                    Ok(_) => deleted += 1,
                    // Rewritten or deleted since it was read: its own write
                    // took care of its expiry.
                    Err(Error::Conflict { .. } | Error::NotFound { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            // A full batch may have more behind it; one that deleted
            // nothing is left to the next sweep.
            if batch.len() < SWEEP_BATCH || deleted == before {
                return Ok(deleted);
            }
        }
    }
}

/// Sweep once a second for as long as the store exists.
pub(super) async fn sweeper(inner: Weak<Inner>) {
    loop {
        tokio::time::sleep(SWEEP_EVERY).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let store = SqliteStore { inner };
        match store.sweep_expired(now_ms()).await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(keys = n, "sqlite store: expired keys deleted"),
            Err(e) => tracing::warn!(error = %e, "sqlite store: deleting expired keys failed"),
        }
    }
}
