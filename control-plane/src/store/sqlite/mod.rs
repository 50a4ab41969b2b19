//! SQLite backend: a kine-style revision log in one table, WAL with fsync on
//! every commit, one writer thread doing group commit, a small pool of read
//! connections, and an in-process watch hub.
//!
//! # Layout
//! - table `kv`: one row per write. `id` (AUTOINCREMENT) is the revision;
//!   `created`/`deleted` say what the write did; `create_revision` is the
//!   key's creation revision (0 on the creating row itself, which is its own
//!   id); `prev_revision` points at the key's previous row; `value` is the
//!   new value, or on a delete row the value that was deleted (so that a
//!   replayed delete event carries it, like etcd's `prev_kv`).
//! - table `meta`: `compact_rev`, the compaction point.
//! - table `expiry`: keys written with a TTL (see [`expiry`]).
//! - The revision counter is `sqlite_sequence` for `kv`, so it never goes
//!   back even when compaction removes the newest tombstones.
//! - [`checkpoint`]: copying the WAL into the database beside the writer,
//!   and keeping the WAL file bounded.
//! - Space: the database is in `auto_vacuum=INCREMENTAL` mode and hands the
//!   pages a compaction freed back to the file system right after it (a
//!   database made before that mode gets one `VACUUM` when opened).
//!
//! Reading "the store at revision R" is "for each name, its newest row with
//! `id <= R`, unless that row is a delete": this is what makes lists at a
//! revision and watches from a revision work without another index.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{params, Connection, OpenFlags, OptionalExtension, TransactionBehavior};
use tokio::sync::{broadcast, mpsc, oneshot};

use super::{Error, Event, KeyValue, ListResult, Result, SnapshotInfo, Store, WatchStream};

mod checkpoint;
mod expiry;

const BACKEND: &str = "sqlite";

/// The database file name inside the server's data directory.
pub const SQLITE_FILE: &str = "state.db";

/// Most writes folded into one transaction (one fsync).
const MAX_BATCH: usize = 512;
/// Queued write requests before senders wait.
const WRITE_QUEUE: usize = 4096;
/// Commit batches kept for watchers that are behind; past that a watcher
/// re-reads the log (or gets `Compacted`), so memory stays bounded.
const HUB_CAPACITY: usize = 1024;
/// Rows read per step of a watch replay.
const REPLAY_CHUNK: i64 = 512;
/// Read connections: at most this many reads run at once (others wait for
/// a permit), and all of them stay open. Opening a connection per read
/// (re-parsing the schema) and one page cache per concurrent request cost
/// CPU and memory; on a few cores more parallel reads do not go faster.
const MAX_READERS: usize = 8;
/// Rows deleted per statement while compacting.
const COMPACT_CHUNK: i64 = 10_000;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS kv (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL,
    created INTEGER NOT NULL,
    deleted INTEGER NOT NULL,
    create_revision INTEGER NOT NULL,
    prev_revision INTEGER NOT NULL,
    value BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS kv_name_id ON kv (name, id);
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
INSERT OR IGNORE INTO meta (key, value) VALUES ('compact_rev', 0);
";

/// The SQLite store. Cheap to clone; all clones share the writer thread.
///
/// # Guarantees
/// A write is acknowledged only after its transaction committed with
/// `synchronous=FULL` in WAL mode, i.e. after the WAL was fsynced.
/// Concurrent writes are serialised by one writer thread that commits them
/// in groups (one fsync for many writes). Watchers see every committed
/// event exactly once and in revision order.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    /// Write requests. Sent by store methods; received by the writer
    /// thread, which exits when this (the only sender) is dropped.
    writes: mpsc::Sender<WriteRequest>,
    readers: Arc<Readers>,
    /// Committed events, one message per commit. The writer thread holds a
    /// clone and sends after each commit; watchers subscribe.
    hub: broadcast::Sender<Arc<Vec<Event>>>,
    /// Latest committed revision, set by the writer before it broadcasts.
    revision: Arc<AtomicI64>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.inner.path)
            .finish()
    }
}

fn sql_err(context: impl Into<String>) -> impl FnOnce(rusqlite::Error) -> Error {
    let context = context.into();
    move |e| Error::backend_source(BACKEND, format!("{context}: {e}"), e)
}

/// How long a connection waits for a lock another one holds.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

fn configure(conn: &Connection) -> rusqlite::Result<()> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.set_prepared_statement_cache_capacity(32);
    // The bundled SQLite is built with STAT4, which makes a cached
    // statement whose plan might depend on a bound value (`name = ?1`,
    // `name >= ?1`) re-prepare itself whenever that value changes: every
    // key lookup parsed and planned its SQL again (a fifth of the CPU of a
    // get). The query planner stability guarantee keeps one plan per
    // statement; every query here has one right plan anyway (the
    // `(name, id)` index).
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    Ok(())
}

impl SqliteStore {
    /// Open (creating if needed) the database file at `path`, usually
    /// `DATA_DIR/state.db` ([`SQLITE_FILE`]).
    ///
    /// # Errors
    /// `Backend` when the file cannot be opened or is not a skiff database.
    pub async fn open(path: impl AsRef<Path>) -> Result<SqliteStore> {
        let path = path.as_ref().to_path_buf();
        let p = path.clone();
        let (conn, revision) = tokio::task::spawn_blocking(move || open_writer(&p))
            .await
            .map_err(|e| Error::backend(BACKEND, format!("open task failed: {e}")))??;

        let revision = Arc::new(AtomicI64::new(revision));
        let (hub, _) = broadcast::channel(HUB_CAPACITY);
        let (writes, rx) = mpsc::channel(WRITE_QUEUE);
        // The writer's WAL hook holds the only sender: the checkpoint
        // thread stops when the writer's connection closes.
        let (wake, woken) = checkpoint::channel();
        let turn = checkpoint::Turn::default();
        let mut conn = conn;
        let wal =
            checkpoint::WalBound::install(&mut conn, BUSY_TIMEOUT, wake, turn.clone()).map_err(
                sql_err(format!("open {}: set the WAL hook", path.display())),
            )?;
        let cp_path = path.clone();
        std::thread::Builder::new()
            .name("sqlite-checkpoint".into())
            .spawn(move || checkpoint::run(&cp_path, woken, turn))
            .map_err(|e| Error::backend_source(BACKEND, "spawn checkpoint thread", e))?;
        let writer = Writer {
            conn,
            wal,
            hub: hub.clone(),
            revision: revision.clone(),
        };
        std::thread::Builder::new()
            .name("sqlite-writer".into())
            .spawn(move || writer.run(rx))
            .map_err(|e| Error::backend_source(BACKEND, "spawn writer thread", e))?;

        let readers = Arc::new(Readers {
            path: path.clone(),
            idle: Mutex::new(Vec::new()),
            permits: Arc::new(tokio::sync::Semaphore::new(MAX_READERS)),
        });
        let inner = Arc::new(Inner {
            path,
            writes,
            readers,
            hub,
            revision,
        });
        tokio::spawn(expiry::sweeper(Arc::downgrade(&inner)));
        Ok(SqliteStore { inner })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    async fn write(&self, op: Op) -> Result<Done> {
        let (reply, rx) = oneshot::channel();
        self.inner
            .writes
            .send(WriteRequest { op, reply })
            .await
            .map_err(|_| Error::backend(BACKEND, "writer thread stopped"))?;
        rx.await
            .map_err(|_| Error::backend(BACKEND, "writer thread stopped before answering"))?
    }
}

fn open_writer(path: &Path) -> Result<(Connection, i64)> {
    if let Some(dir) = path.parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir).map_err(|e| {
                Error::backend_source(BACKEND, format!("create directory {}", dir.display()), e)
            })?;
        }
    }
    let ctx = format!("open {}", path.display());
    let conn = Connection::open(path).map_err(sql_err(&ctx))?;
    configure(&conn).map_err(sql_err(&ctx))?;
    // Takes effect only on a database without tables yet (a new one); an
    // older one switches with the VACUUM below.
    conn.execute_batch("PRAGMA auto_vacuum=INCREMENTAL")
        .map_err(sql_err(&ctx))?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .map_err(sql_err(&ctx))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(Error::backend(
            BACKEND,
            format!("{ctx}: cannot switch to WAL (got {mode})"),
        ));
    }
    // FULL: the WAL is fsynced at every commit, so an acknowledged write
    // survives power loss (NORMAL would only survive a process crash).
    // No automatic checkpoints on the writer: copying the WAL into the
    // database (and fsyncing it) would stall commits; the checkpoint thread
    // does it beside the writer (and the WAL hook set in `open` replaces
    // SQLite's auto-checkpoint hook anyway). When the WAL is started over
    // after a complete checkpoint, a file grown past the limit is cut back
    // to it.
    conn.execute_batch(&format!(
        "PRAGMA synchronous=FULL; PRAGMA wal_autocheckpoint=0; PRAGMA journal_size_limit={};",
        checkpoint::WAL_LIMIT_BYTES
    ))
    .map_err(sql_err(&ctx))?;
    conn.execute_batch(SCHEMA)
        .map_err(sql_err(format!("{ctx}: create schema")))?;
    conn.execute_batch(expiry::SCHEMA)
        .map_err(sql_err(format!("{ctx}: create schema")))?;
    switch_to_incremental_vacuum(&conn, path).map_err(sql_err(&ctx))?;
    let revision = current_rev(&conn).map_err(sql_err(&ctx))?;
    Ok((conn, revision))
}

/// A database created before `auto_vacuum=INCREMENTAL` (or with it off)
/// changes mode only by being rebuilt: one `VACUUM`, which copies every
/// live page once through the WAL (measured: 0.2 s for a 12 MB database
/// of 20,000 Lease revisions, against 10-30 ms for a normal open, and a
/// WAL of the database's size until the checkpoint right after it) and is
/// never needed again.
fn switch_to_incremental_vacuum(conn: &Connection, path: &Path) -> rusqlite::Result<()> {
    let mode: i64 = conn.query_row("PRAGMA auto_vacuum", [], |r| r.get(0))?;
    if mode == 2 {
        return Ok(());
    }
    let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
    let before = size(path);
    let start = std::time::Instant::now();
    conn.execute_batch("PRAGMA auto_vacuum=INCREMENTAL; VACUUM;")?;
    // The rebuilt database went through the WAL; nobody reads yet, so
    // copy it in and empty the WAL now.
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    tracing::info!(
        path = %path.display(),
        bytes_before = before,
        bytes_after = size(path),
        millis = start.elapsed().as_millis() as u64,
        "sqlite database switched to incremental auto-vacuum (one-time VACUUM)"
    );
    Ok(())
}

fn current_rev(conn: &Connection) -> rusqlite::Result<i64> {
    Ok(conn
        .prepare_cached("SELECT seq FROM sqlite_sequence WHERE name = 'kv'")?
        .query_row([], |r| r.get(0))
        .optional()?
        .unwrap_or(0))
}

fn compact_rev(conn: &Connection) -> rusqlite::Result<i64> {
    Ok(conn
        .prepare_cached("SELECT value FROM meta WHERE key = 'compact_rev'")?
        .query_row([], |r| r.get(0))
        .optional()?
        .unwrap_or(0))
}

/// The smallest string greater than every string starting with `prefix`
/// (`None`: no bound). Byte order of UTF-8 is code point order, so
/// incrementing the last code point works.
pub(crate) fn prefix_end(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let mut next = last as u32 + 1;
        if (0xD800..0xE000).contains(&next) {
            next = 0xE000;
        }
        if let Some(c) = char::from_u32(next) {
            chars.push(c);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

/// Upper bound used in SQL when there is none: keys are far below it.
fn upper(prefix: &str) -> String {
    prefix_end(prefix).unwrap_or_else(|| char::MAX.to_string().repeat(4))
}

// ---------------------------------------------------------------- writer

enum Op {
    Create {
        key: String,
        value: Vec<u8>,
        ttl: Option<Duration>,
    },
    Update {
        key: String,
        value: Vec<u8>,
        expected: i64,
        ttl: Option<Duration>,
    },
    Delete {
        key: String,
        expected: Option<i64>,
    },
    Compact {
        revision: i64,
    },
}

enum Done {
    Kv(KeyValue),
    Deleted(KeyValue, i64),
    Compacted,
}

struct WriteRequest {
    op: Op,
    /// The writer answers after the commit (or failure) of the write's batch.
    reply: oneshot::Sender<Result<Done>>,
}

struct Writer {
    conn: Connection,
    /// Starts the WAL over when the writer's commits made it too big; the
    /// connection's WAL hook wakes the checkpoint thread, and closing the
    /// connection stops that thread.
    wal: checkpoint::WalBound,
    hub: broadcast::Sender<Arc<Vec<Event>>>,
    revision: Arc<AtomicI64>,
}

/// The newest row of one key.
struct Latest {
    id: i64,
    create_revision: i64,
    deleted: bool,
    value: Vec<u8>,
}

impl Latest {
    /// The key's value as this row left it.
    fn into_kv(self, key: &str) -> KeyValue {
        KeyValue {
            key: key.to_string(),
            value: self.value,
            create_revision: self.create_revision,
            mod_revision: self.id,
        }
    }
}

impl Writer {
    fn run(mut self, mut rx: mpsc::Receiver<WriteRequest>) {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        while let Some(first) = rx.blocking_recv() {
            batch.push(first);
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(req) => batch.push(req),
                    Err(_) => break,
                }
            }
            // Compaction runs in its own transaction, in queue order.
            let mut group = Vec::new();
            for req in batch.drain(..) {
                if let Op::Compact { revision } = req.op {
                    self.commit_group(std::mem::take(&mut group));
                    let _ = req
                        .reply
                        .send(self.compact(revision).map(|()| Done::Compacted));
                } else {
                    group.push(req);
                }
            }
            self.commit_group(group);
        }
        tracing::debug!("sqlite writer stopped: store dropped");
    }

    /// Apply a group of writes in one transaction, commit (fsync), then
    /// publish the events and answer.
    fn commit_group(&mut self, group: Vec<WriteRequest>) {
        if group.is_empty() {
            return;
        }
        let mut results = Vec::with_capacity(group.len());
        let mut events = Vec::new();
        let outcome = (|| -> rusqlite::Result<()> {
            let tx = self
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)?;
            for req in &group {
                let r = apply(&tx, &req.op)?;
                if let Ok((_, Some(ev))) = &r {
                    events.push(ev.clone());
                }
                results.push(r.map(|(done, _)| done));
            }
            tx.commit()
        })();
        match outcome {
            Ok(()) => {
                if let Some(last) = events.last() {
                    self.revision.store(last.revision(), Ordering::SeqCst);
                    // No receivers is not an error: nobody watches.
                    let _ = self.hub.send(Arc::new(events));
                }
                for (req, r) in group.into_iter().zip(results) {
                    let _ = req.reply.send(r);
                }
            }
            Err(e) => {
                tracing::error!(error = %e, writes = group.len(), "sqlite commit failed");
                for req in group {
                    let _ = req.reply.send(Err(Error::backend(
                        BACKEND,
                        format!("write {} failed, not committed: {e}", req.op.key()),
                    )));
                }
            }
        }
        // After the answers: the writes of this group do not wait for it.
        self.wal.after_commit(&self.conn);
    }

    fn compact(&mut self, revision: i64) -> Result<()> {
        let current = self.revision.load(Ordering::SeqCst);
        if revision > current {
            return Err(Error::FutureRevision {
                requested: revision,
                current,
            });
        }
        let ctx = format!("compact to revision {revision}");
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql_err(&ctx))?;
        let old = compact_rev(&tx).map_err(sql_err(&ctx))?;
        if revision <= old {
            return Ok(());
        }
        // Walk the compacted range in chunks of ids: drop every row that a
        // newer row of the same key at or below `revision` supersedes, and
        // every tombstone at or below it. What stays is exactly the state at
        // `revision` plus all later history.
        let mut from = old;
        while from < revision {
            let to = (from + COMPACT_CHUNK).min(revision);
            // The rows the last compaction kept (the state at `old`) are
            // superseded by the first newer row of their key, which points
            // at them. This runs before the chunk's own rows go, so the
            // pointer is still there.
            tx.execute(
                "DELETE FROM kv WHERE id IN (SELECT prev_revision FROM kv
                     WHERE id > ?1 AND id <= ?2 AND prev_revision > 0 AND prev_revision <= ?3)",
                params![from, to, old],
            )
            .map_err(sql_err(&ctx))?;
            tx.execute(
                "DELETE FROM kv WHERE id > ?1 AND id <= ?2 AND (deleted = 1 OR EXISTS (
                     SELECT 1 FROM kv AS n WHERE n.name = kv.name AND n.id > kv.id AND n.id <= ?3))",
                params![from, to, revision],
            )
            .map_err(sql_err(&ctx))?;
            from = to;
        }
        tx.execute(
            "UPDATE meta SET value = ?1 WHERE key = 'compact_rev'",
            [revision],
        )
        .map_err(sql_err(&ctx))?;
        tx.commit().map_err(sql_err(&ctx))?;
        // Give the pages the deleted rows freed back to the file system (a
        // no-op in a database without auto_vacuum). Compaction was already
        // committed; a failure here only leaves the space for later writes.
        if let Err(e) = incremental_vacuum(&self.conn) {
            tracing::warn!(error = %e, "sqlite: incremental vacuum after compaction failed");
        }
        self.wal.after_commit(&self.conn);
        tracing::debug!(revision, "sqlite store compacted");
        Ok(())
    }
}

/// Free every page on the free list. The pragma frees one page per row it
/// returns, so it runs to its end.
fn incremental_vacuum(conn: &Connection) -> rusqlite::Result<()> {
    let mut stmt = conn.prepare_cached("PRAGMA incremental_vacuum")?;
    let mut rows = stmt.query([])?;
    while rows.next()?.is_some() {}
    Ok(())
}

impl Op {
    fn key(&self) -> &str {
        match self {
            Op::Create { key, .. } | Op::Update { key, .. } | Op::Delete { key, .. } => key,
            Op::Compact { .. } => "(compaction)",
        }
    }
}

/// The newest row of a key (see [`latest`]).
const LATEST: &str = "SELECT id, CASE WHEN created THEN id ELSE create_revision END, deleted, value
     FROM kv WHERE name = ?1 ORDER BY id DESC LIMIT 1";

fn latest(conn: &Connection, key: &str) -> rusqlite::Result<Option<Latest>> {
    conn.prepare_cached(LATEST)?
        .query_row([key], |r| {
            Ok(Latest {
                id: r.get(0)?,
                create_revision: r.get(1)?,
                deleted: r.get(2)?,
                value: r.get(3)?,
            })
        })
        .optional()
}

fn insert(
    conn: &Connection,
    key: &str,
    created: bool,
    deleted: bool,
    create_revision: i64,
    prev_revision: i64,
    value: &[u8],
) -> rusqlite::Result<i64> {
    conn.prepare_cached(
        "INSERT INTO kv (name, created, deleted, create_revision, prev_revision, value)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params![
        key,
        created,
        deleted,
        create_revision,
        prev_revision,
        value
    ])?;
    Ok(conn.last_insert_rowid())
}

/// One write inside the group's transaction. The outer error is SQLite
/// failing (the whole group fails); the inner one is this write's answer.
#[allow(clippy::type_complexity)]
fn apply(conn: &Connection, op: &Op) -> rusqlite::Result<Result<(Done, Option<Event>)>> {
    Ok(match op {
        Op::Create { key, value, ttl } => match latest(conn, key)? {
            Some(l) if !l.deleted => Err(Error::AlreadyExists { key: key.clone() }),
            prev => {
                let id = insert(conn, key, true, false, 0, prev.map_or(0, |l| l.id), value)?;
                expiry::set(conn, key, *ttl, id)?;
                let kv = KeyValue {
                    key: key.clone(),
                    value: value.clone(),
                    create_revision: id,
                    mod_revision: id,
                };
                Ok((Done::Kv(kv.clone()), Some(Event::Put { kv, prev: None })))
            }
        },
        Op::Update {
            key,
            value,
            expected,
            ttl,
        } => match latest(conn, key)? {
            None => Err(Error::NotFound { key: key.clone() }),
            Some(l) if l.deleted => Err(Error::NotFound { key: key.clone() }),
            Some(l) if l.id != *expected => Err(Error::Conflict {
                key: key.clone(),
                expected: *expected,
                actual: l.id,
            }),
            // The same bytes: nothing to write, nothing to tell watchers
            // (upstream's GuaranteedUpdate short-circuit).
            Some(l) if l.value == *value => Ok((Done::Kv(l.into_kv(key)), None)),
            Some(l) => {
                let id = insert(conn, key, false, false, l.create_revision, l.id, value)?;
                expiry::set(conn, key, *ttl, id)?;
                let kv = KeyValue {
                    key: key.clone(),
                    value: value.clone(),
                    create_revision: l.create_revision,
                    mod_revision: id,
                };
                let prev = l.into_kv(key);
                Ok((
                    Done::Kv(kv.clone()),
                    Some(Event::Put {
                        kv,
                        prev: Some(prev),
                    }),
                ))
            }
        },
        Op::Delete { key, expected } => match latest(conn, key)? {
            None => Err(Error::NotFound { key: key.clone() }),
            Some(l) if l.deleted => Err(Error::NotFound { key: key.clone() }),
            Some(l) if expected.is_some_and(|e| e != l.id) => Err(Error::Conflict {
                key: key.clone(),
                expected: expected.unwrap_or_default(),
                actual: l.id,
            }),
            Some(l) => {
                // The tombstone keeps the deleted value, so that a replayed
                // delete event carries it.
                let id = insert(conn, key, false, true, l.create_revision, l.id, &l.value)?;
                expiry::clear(conn, key)?;
                let prev = l.into_kv(key);
                Ok((
                    Done::Deleted(prev.clone(), id),
                    Some(Event::Delete { prev, revision: id }),
                ))
            }
        },
        Op::Compact { .. } => unreachable!("compaction is not part of a write group"),
    })
}

// ---------------------------------------------------------------- readers

/// A small pool of read-only connections; reads never touch the writer.
struct Readers {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
    /// One permit per connection in use: bounds open connections (and
    /// blocking threads) to `MAX_READERS`.
    permits: Arc<tokio::sync::Semaphore>,
}

impl Readers {
    fn open(&self) -> Result<Connection> {
        let ctx = format!("open {} for reading", self.path.display());
        let conn = Connection::open_with_flags(
            &self.path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(sql_err(&ctx))?;
        configure(&conn).map_err(sql_err(&ctx))?;
        Ok(conn)
    }

    async fn permit(&self) -> Result<tokio::sync::OwnedSemaphorePermit> {
        self.permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| Error::backend(BACKEND, "read pool closed"))
    }

    /// Run `f` on a pooled connection on the blocking thread pool.
    async fn read<R, F>(self: &Arc<Self>, f: F) -> Result<R>
    where
        R: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<R> + Send + 'static,
    {
        let this = self.clone();
        let permit = self.permit().await?;
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            this.with_connection(f)
        })
        .await
        .map_err(|e| Error::backend(BACKEND, format!("read task failed: {e}")))?
    }

    /// Run `f` on a pooled connection on the calling thread: for a lookup
    /// of one key by the name index, which takes a few microseconds, less
    /// than the hand-off to a blocking thread and back (in the API
    /// benchmark a get costs about a quarter less server CPU this way). A
    /// WAL reader does not wait for the writer, so this does not block.
    async fn read_here<R>(&self, f: impl FnOnce(&mut Connection) -> Result<R>) -> Result<R> {
        let _permit = self.permit().await?;
        self.with_connection(f)
    }

    fn with_connection<R>(&self, f: impl FnOnce(&mut Connection) -> Result<R>) -> Result<R> {
        let pooled = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut conn = match pooled {
            Some(c) => c,
            None => self.open()?,
        };
        let r = f(&mut conn);
        // A connection left inside a transaction by a failed read is not
        // reused.
        if conn.is_autocommit() {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            if idle.len() < MAX_READERS {
                idle.push(conn);
            }
        }
        r
    }
}

fn read_txn<'c>(conn: &'c mut Connection, ctx: &str) -> Result<rusqlite::Transaction<'c>> {
    conn.transaction_with_behavior(TransactionBehavior::Deferred)
        .map_err(sql_err(ctx))
}

fn list_at(
    conn: &mut Connection,
    prefix: &str,
    start_after: Option<&str>,
    limit: usize,
    revision: Option<i64>,
) -> Result<ListResult> {
    let ctx = format!("list {prefix}");
    let tx = read_txn(conn, &ctx)?;
    let current = current_rev(&tx).map_err(sql_err(&ctx))?;
    let compacted = compact_rev(&tx).map_err(sql_err(&ctx))?;
    let rev = revision.filter(|r| *r > 0).unwrap_or(current);
    if rev > current {
        return Err(Error::FutureRevision {
            requested: rev,
            current,
        });
    }
    if rev < compacted {
        return Err(Error::Compacted {
            requested: rev,
            compacted,
        });
    }
    let hi = upper(prefix);
    let (op, lo) = match start_after {
        Some(a) if a >= prefix => (">", a),
        _ => (">=", prefix),
    };
    let sql = format!(
        // Walk the (name, id) index in key order and keep, per name, the
        // newest row at or below the revision: the LIMIT stops the walk
        // early, so a page costs its size, not the size of the prefix.
        "SELECT k.id, k.name, CASE WHEN k.created THEN k.id ELSE k.create_revision END, k.value
         FROM kv AS k INDEXED BY kv_name_id
         WHERE k.name {op} ?1 AND k.name < ?2 AND k.id <= ?3
           AND k.id = (SELECT MAX(n.id) FROM kv AS n WHERE n.name = k.name AND n.id <= ?3)
           AND k.deleted = 0
         ORDER BY k.name LIMIT ?4"
    );
    let sql_limit = if limit == 0 { -1 } else { limit as i64 + 1 };
    let mut kvs = {
        let mut stmt = tx.prepare_cached(&sql).map_err(sql_err(&ctx))?;
        let rows = stmt
            .query_map(params![lo, hi, rev, sql_limit], |r| {
                Ok(KeyValue {
                    mod_revision: r.get(0)?,
                    key: r.get(1)?,
                    create_revision: r.get(2)?,
                    value: r.get(3)?,
                })
            })
            .map_err(sql_err(&ctx))?;
        rows.collect::<rusqlite::Result<Vec<_>>>()
            .map_err(sql_err(&ctx))?
    };
    let more = limit > 0 && kvs.len() > limit;
    kvs.truncate(if limit == 0 { kvs.len() } else { limit });
    tx.finish().map_err(sql_err(&ctx))?;
    Ok(ListResult {
        kvs,
        revision: rev,
        more,
    })
}

/// The log after a revision, under a prefix (see [`replay`]). It walks the
/// log in revision order and stops after a chunk: NOT INDEXED keeps the
/// planner, which (planning without the bound values) would rather range
/// over the whole prefix in the name index and sort it, from doing so.
const REPLAY: &str = "SELECT k.id, k.name, k.created, k.deleted,
        CASE WHEN k.created THEN k.id ELSE k.create_revision END,
        k.prev_revision, k.value, p.value
     FROM kv AS k NOT INDEXED LEFT JOIN kv AS p ON p.id = k.prev_revision
     WHERE k.id > ?1 AND k.name >= ?2 AND k.name < ?3
     ORDER BY k.id LIMIT ?4";

/// Events with revision > `after` under `prefix`, at most `REPLAY_CHUNK`;
/// returns them and the revision the read saw (everything up to it that
/// matches has been returned when the chunk is not full).
fn replay(conn: &mut Connection, prefix: &str, after: i64) -> Result<(Vec<Event>, i64, bool)> {
    let ctx = format!("replay watch {prefix} after revision {after}");
    let tx = read_txn(conn, &ctx)?;
    let current = current_rev(&tx).map_err(sql_err(&ctx))?;
    let compacted = compact_rev(&tx).map_err(sql_err(&ctx))?;
    if after < compacted {
        return Err(Error::Compacted {
            requested: after,
            compacted,
        });
    }
    let events = {
        let mut stmt = tx.prepare_cached(REPLAY).map_err(sql_err(&ctx))?;
        let rows = stmt
            .query_map(params![after, prefix, upper(prefix), REPLAY_CHUNK], |r| {
                let id: i64 = r.get(0)?;
                let key: String = r.get(1)?;
                let created: bool = r.get(2)?;
                let deleted: bool = r.get(3)?;
                let create_revision: i64 = r.get(4)?;
                let prev_revision: i64 = r.get(5)?;
                let value: Vec<u8> = r.get(6)?;
                let prev_value: Option<Vec<u8>> = r.get(7)?;
                Ok(if deleted {
                    Event::Delete {
                        prev: KeyValue {
                            key,
                            value,
                            create_revision,
                            mod_revision: prev_revision,
                        },
                        revision: id,
                    }
                } else {
                    let prev = match (created, prev_value) {
                        (false, Some(v)) => Some(KeyValue {
                            key: key.clone(),
                            value: v,
                            create_revision,
                            mod_revision: prev_revision,
                        }),
                        _ => None,
                    };
                    Event::Put {
                        kv: KeyValue {
                            key,
                            value,
                            create_revision,
                            mod_revision: id,
                        },
                        prev,
                    }
                })
            })
            .map_err(sql_err(&ctx))?;
        rows.collect::<rusqlite::Result<Vec<_>>>()
            .map_err(sql_err(&ctx))?
    };
    tx.finish().map_err(sql_err(&ctx))?;
    let complete = (events.len() as i64) < REPLAY_CHUNK;
    let seen = if complete {
        current
    } else {
        events.last().map_or(after, Event::revision)
    };
    Ok((events, seen, complete))
}

// ---------------------------------------------------------------- watch

/// One watcher: replays from the log while it is behind, then follows the
/// hub. It subscribed to the hub before its replay read, so every commit is
/// in the log read or in the hub; `seen` drops the ones in both.
struct Watcher {
    readers: Arc<Readers>,
    /// Commits since subscribing; `Lagged` means the watcher was too slow
    /// and must re-read the log (the hub kept only `HUB_CAPACITY`).
    rx: broadcast::Receiver<Arc<Vec<Event>>>,
    prefix: String,
    /// Every event with revision <= `seen` has been delivered (or did not match).
    seen: i64,
    pending: VecDeque<Event>,
    replaying: bool,
    done: bool,
}

impl Watcher {
    async fn next(&mut self) -> Option<Result<Event>> {
        loop {
            if let Some(ev) = self.pending.pop_front() {
                return Some(Ok(ev));
            }
            if self.done {
                return None;
            }
            if self.replaying {
                let prefix = self.prefix.clone();
                let after = self.seen;
                match self.readers.read(move |c| replay(c, &prefix, after)).await {
                    Ok((events, seen, complete)) => {
                        self.pending.extend(events);
                        self.seen = seen;
                        self.replaying = !complete;
                    }
                    Err(e) => {
                        self.done = true;
                        return Some(Err(e));
                    }
                }
                continue;
            }
            match self.rx.recv().await {
                Ok(batch) => {
                    for ev in batch.iter() {
                        let rev = ev.revision();
                        if rev > self.seen {
                            if event_key(ev).starts_with(&self.prefix) {
                                self.pending.push_back(ev.clone());
                            }
                            self.seen = rev;
                        }
                    }
                }
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::debug!(prefix = %self.prefix, skipped = n, "slow watcher re-reads the log");
                    self.rx = self.rx.resubscribe();
                    self.replaying = true;
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }
}

fn event_key(ev: &Event) -> &str {
    match ev {
        Event::Put { kv, .. } => &kv.key,
        Event::Delete { prev, .. } => &prev.key,
    }
}

// ---------------------------------------------------------------- trait

#[async_trait::async_trait]
impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn current_revision(&self) -> Result<i64> {
        Ok(self.inner.revision.load(Ordering::SeqCst))
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        self.inner
            .readers
            .read_here(|c| {
                let l = latest(c, key).map_err(|e| sql_err(format!("get {key}"))(e))?;
                Ok(l.filter(|l| !l.deleted).map(|l| l.into_kv(key)))
            })
            .await
    }

    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
        revision: Option<i64>,
    ) -> Result<ListResult> {
        let prefix = prefix.to_string();
        let start_after = start_after.map(str::to_string);
        self.inner
            .readers
            .read(move |c| list_at(c, &prefix, start_after.as_deref(), limit, revision))
            .await
    }

    async fn create_with_ttl(
        &self,
        key: &str,
        value: Vec<u8>,
        ttl: Option<Duration>,
    ) -> Result<KeyValue> {
        match self
            .write(Op::Create {
                key: key.to_string(),
                value,
                ttl,
            })
            .await?
        {
            Done::Kv(kv) => Ok(kv),
            _ => unreachable!("create answers with a KeyValue"),
        }
    }

    async fn update_with_ttl(
        &self,
        key: &str,
        value: Vec<u8>,
        expected_revision: i64,
        ttl: Option<Duration>,
    ) -> Result<KeyValue> {
        let op = Op::Update {
            key: key.to_string(),
            value,
            expected: expected_revision,
            ttl,
        };
        match self.write(op).await? {
            Done::Kv(kv) => Ok(kv),
            _ => unreachable!("update answers with a KeyValue"),
        }
    }

    async fn delete(&self, key: &str, expected_revision: Option<i64>) -> Result<(KeyValue, i64)> {
        let op = Op::Delete {
            key: key.to_string(),
            expected: expected_revision,
        };
        match self.write(op).await? {
            Done::Deleted(kv, rev) => Ok((kv, rev)),
            _ => unreachable!("delete answers with the deleted KeyValue"),
        }
    }

    async fn watch(&self, prefix: &str, after_revision: i64) -> Result<WatchStream> {
        // Subscribe before looking at the revision: a commit after this
        // point is in the hub, one before it is in the log.
        let rx = self.inner.hub.subscribe();
        let current = self.inner.revision.load(Ordering::SeqCst);
        let after = after_revision.max(0);
        let readers = self.inner.readers.clone();
        let compacted = readers
            .read(|c| compact_rev(c).map_err(sql_err("read compaction point")))
            .await?;
        if after < compacted {
            return Err(Error::Compacted {
                requested: after,
                compacted,
            });
        }
        let watcher = Watcher {
            readers,
            rx,
            prefix: prefix.to_string(),
            seen: after,
            pending: VecDeque::new(),
            replaying: after < current,
            done: false,
        };
        Ok(Box::pin(futures::stream::unfold(
            watcher,
            |mut w| async move { w.next().await.map(|item| (item, w)) },
        )))
    }

    async fn compact(&self, revision: i64) -> Result<()> {
        self.write(Op::Compact { revision }).await.map(|_| ())
    }

    async fn health(&self) -> Result<()> {
        self.inner
            .readers
            .read(|c| {
                c.query_row("SELECT 1", [], |_| Ok(()))
                    .map_err(sql_err("health check query"))
            })
            .await?;
        if self.inner.writes.is_closed() {
            return Err(Error::backend(BACKEND, "writer thread stopped"));
        }
        Ok(())
    }

    async fn snapshot_save(&self, path: &Path) -> Result<SnapshotInfo> {
        let path = path.to_path_buf();
        let tmp = super::snapshot::temp_path(&path);
        let _ = std::fs::remove_file(&tmp);
        let t = tmp.clone();
        self.inner
            .readers
            .read(move |c| {
                // VACUUM INTO copies one read transaction: a consistent
                // snapshot, with the revision log and the counter.
                let target = t.to_string_lossy().into_owned();
                c.execute("VACUUM INTO ?1", [target])
                    .map(|_| ())
                    .map_err(sql_err(format!("write snapshot to {}", t.display())))
            })
            .await?;
        let p = path.clone();
        tokio::task::spawn_blocking(move || super::snapshot::persist(&tmp, &p))
            .await
            .map_err(|e| Error::backend(BACKEND, format!("snapshot task failed: {e}")))??;
        super::snapshot::snapshot_status(&path).await
    }
}

/// Summary of a SQLite snapshot (or database) file, read without writing to it.
pub(crate) fn sqlite_file_info(path: &Path) -> Result<(i64, u64)> {
    let ctx = format!("read snapshot {}", path.display());
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(sql_err(&ctx))?;
    let revision = current_rev(&conn).map_err(sql_err(&ctx))?;
    let keys: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM kv AS k JOIN (SELECT MAX(id) AS mid FROM kv GROUP BY name) AS m
             ON k.id = m.mid WHERE k.deleted = 0",
            [],
            |r| r.get(0),
        )
        .map_err(sql_err(&ctx))?;
    Ok((revision, keys as u64))
}

/// Check that `path` is an intact skiff SQLite database.
pub(crate) fn sqlite_file_check(path: &Path) -> Result<()> {
    let ctx = format!("check snapshot {}", path.display());
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(sql_err(&ctx))?;
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .map_err(sql_err(&ctx))?;
    if check != "ok" {
        return Err(Error::backend(
            BACKEND,
            format!("{ctx}: integrity check failed: {check}"),
        ));
    }
    let tables: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name IN ('kv', 'meta')",
            [],
            |r| r.get(0),
        )
        .map_err(sql_err(&ctx))?;
    if tables != 2 {
        return Err(Error::backend(
            BACKEND,
            format!("{ctx}: not a skiff store snapshot"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_lookups_keep_their_prepared_plan() {
        let dir = tempfile::tempdir().unwrap();
        let (conn, _) = open_writer(&dir.path().join(SQLITE_FILE)).unwrap();
        for i in 0..20 {
            let key = format!("/registry/pods/default/p{i}");
            assert!(latest(&conn, &key).unwrap().is_none());
            insert(&conn, &key, true, false, 0, 0, b"{}").unwrap();
            assert!(latest(&conn, &key).unwrap().is_some());
        }
        let stmt = conn.prepare_cached(LATEST).unwrap();
        assert_eq!(
            stmt.get_status(rusqlite::StatementStatus::RePrepare),
            0,
            "a new key re-prepared the cached lookup"
        );
    }

    /// The plan SQLite picks for `sql` (bound to plausible values).
    fn plan(conn: &Connection, sql: &str) -> String {
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let n = stmt.parameter_count();
        let values: [rusqlite::types::Value; 4] = [
            7.into(),
            "/registry/pods/".to_string().into(),
            "/registry/pods0".to_string().into(),
            512.into(),
        ];
        let rows = stmt
            .query_map(rusqlite::params_from_iter(&values[..n]), |r| {
                r.get::<_, String>(3)
            })
            .unwrap();
        rows.map(Result::unwrap).collect::<Vec<_>>().join("; ")
    }

    #[test]
    fn replay_walks_the_log_and_lookups_use_the_name_index() {
        let dir = tempfile::tempdir().unwrap();
        let (conn, _) = open_writer(&dir.path().join(SQLITE_FILE)).unwrap();
        let replay = plan(&conn, REPLAY);
        assert!(
            replay.starts_with("SEARCH k USING INTEGER PRIMARY KEY (rowid>?)")
                && !replay.contains("TEMP B-TREE"),
            "{replay}"
        );
        assert!(
            plan(&conn, LATEST).contains("USING INDEX kv_name_id (name=?)"),
            "{}",
            plan(&conn, LATEST)
        );
    }

    #[test]
    fn prefix_end_increments_last_char() {
        assert_eq!(
            prefix_end("/registry/pods/").as_deref(),
            Some("/registry/pods0")
        );
        assert_eq!(prefix_end("a\u{10FFFF}").as_deref(), Some("b"));
        assert_eq!(prefix_end(""), None);
    }
}
