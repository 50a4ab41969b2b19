//! The cluster's memory: a key-value store with revisions, compare-and-swap
//! and watches, behind one trait with SQLite (default) and etcd backends.
//!
//! Keys look like `/registry/<group>/<resource>/<namespace>/<name>` (etcd's
//! layout for Kubernetes), values are the objects' JSON. Revisions are the
//! store's global, strictly increasing write counter; an object's
//! `metadata.resourceVersion` is its `mod_revision`.
//!
//! # Layout
//! - [`sqlite`]: the embedded default. A kine-style revision log in one
//!   table; WAL with fsync per commit, kept to a few MiB; one writer thread
//!   that group-commits concurrent writes; a pool of read connections; an
//!   in-process watch hub; an expiry table it sweeps for TTLs.
//!   `SqliteStore::open(DATA_DIR/state.db)`.
//! - [`etcd`]: etcd v3 through `etcd-client`; `EtcdStore::connect(endpoints)`.
//! - [`snapshot`]: `snapshot_status` and `snapshot_restore` for files of
//!   either backend (`Store::snapshot_save` writes them). etcd snapshot
//!   status/restore run Debian's `etcdctl` (package `etcd-client`).
//! - [`compactor`]: compaction on a schedule for either backend, taking
//!   turns with other servers through upstream's `compact_rev_key`.
//! - [`encryption`]: secrets at rest (`--encryption-provider-config`), a
//!   wrapper that encrypts the configured resources' values on the way
//!   down and decrypts them on the way up.
//! - [`bench`](mod@bench): raw write benchmark, the baseline for the API benchmark.
//!
//! Both backends skip a no-op update (the same bytes as stored: nothing is
//! written, no event, the revision stays), as upstream's storage layer does
//! in `GuaranteedUpdate`, and both expire keys written with a TTL with a
//! normal delete (etcd through leases, SQLite through an expiry it sweeps).

use std::path::Path;
use std::pin::Pin;
use std::time::Duration;

use futures::Stream;

pub mod bench;
pub mod compactor;
pub mod encryption;
pub mod etcd;
pub mod etcd_members;
pub mod follow;
mod leases;
pub mod managed;
pub mod snapshot;
pub mod snapshots;
pub mod sqlite;
pub mod watchcache;

pub use etcd::EtcdStore;
pub use snapshot::{snapshot_restore, snapshot_status};
pub use sqlite::{SqliteStore, SQLITE_FILE};

/// One stored key at one revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
    /// Revision of the write that created this key (in its current life).
    pub create_revision: i64,
    /// Revision of the last write to this key.
    pub mod_revision: i64,
}

/// A change seen by a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Created or updated; `prev` is the value before, when there was one.
    Put {
        kv: KeyValue,
        prev: Option<KeyValue>,
    },
    /// Deleted; `prev` is the last value, `revision` the revision of the delete.
    Delete { prev: KeyValue, revision: i64 },
}

impl Event {
    pub fn revision(&self) -> i64 {
        match self {
            Event::Put { kv, .. } => kv.mod_revision,
            Event::Delete { revision, .. } => *revision,
        }
    }
}

/// A page of a range read.
#[derive(Debug, Clone, Default)]
pub struct ListResult {
    pub kvs: Vec<KeyValue>,
    /// The revision the list was read at (pass it back to continue a paginated
    /// list at the same revision, and to start a watch right after it).
    pub revision: i64,
    /// More keys follow the last one returned.
    pub more: bool,
}

/// What `snapshot status` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    pub revision: i64,
    pub keys: u64,
    pub size: u64,
    pub hash: String,
}

/// Store errors; every message names the key or the backend.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Create of a key that exists.
    #[error("key {key} already exists")]
    AlreadyExists { key: String },
    /// Update or delete of a key that does not exist.
    #[error("key {key} not found")]
    NotFound { key: String },
    /// Compare-and-swap lost: the key's mod_revision is not the expected one.
    #[error("conflict on {key}: expected revision {expected}, found {actual}")]
    Conflict {
        key: String,
        expected: i64,
        actual: i64,
    },
    /// A read or watch asked for a revision older than the compaction point.
    /// The API turns this into 410 Gone ("too old resource version").
    #[error("revision {requested} has been compacted (oldest available {compacted})")]
    Compacted { requested: i64, compacted: i64 },
    /// A read asked for a revision the store has not reached yet.
    #[error("revision {requested} is in the future (current {current})")]
    FutureRevision { requested: i64, current: i64 },
    /// The backend failed (I/O, connection, corruption).
    #[error("{backend} store: {message}")]
    Backend {
        backend: &'static str,
        message: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Watch events in revision order; an `Err` ends the stream (for example
/// `Compacted` when a slow watcher fell behind compaction).
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<Event>> + Send>>;

/// The store the API server uses. Implementations must be safe to share
/// between tasks; every acknowledged write is durable.
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// `"sqlite"` or `"etcd"`: used in `/readyz?verbose` and metrics.
    fn backend(&self) -> &'static str;

    /// The latest revision of the store.
    async fn current_revision(&self) -> Result<i64>;

    /// The current value of one key.
    async fn get(&self, key: &str) -> Result<Option<KeyValue>>;

    /// Keys with `prefix`, in key order, strictly after `start_after` when
    /// given, at most `limit` (0 = no limit), read at `revision` (None = now).
    ///
    /// # Errors
    /// `Compacted` when `revision` is older than the compaction point.
    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
        revision: Option<i64>,
    ) -> Result<ListResult>;

    /// Create `key`; returns the new KeyValue (its mod_revision is the write's revision).
    async fn create(&self, key: &str, value: Vec<u8>) -> Result<KeyValue> {
        self.create_with_ttl(key, value, None).await
    }

    /// Create `key`, deleted again `ttl` after this write when given (a
    /// normal delete: watchers see it).
    ///
    /// # Caveats
    /// The etcd backend counts whole seconds and may keep the key up to a
    /// minute longer (leases are shared, see `leases`); SQLite sweeps
    /// expired keys once a second.
    async fn create_with_ttl(
        &self,
        key: &str,
        value: Vec<u8>,
        ttl: Option<Duration>,
    ) -> Result<KeyValue>;

    /// Replace `key` if its mod_revision is still `expected_revision`.
    async fn update(&self, key: &str, value: Vec<u8>, expected_revision: i64) -> Result<KeyValue> {
        self.update_with_ttl(key, value, expected_revision, None)
            .await
    }

    /// Replace `key` if its mod_revision is still `expected_revision`; with
    /// a `ttl` the key is deleted that long after this write, without one
    /// it no longer expires.
    ///
    /// # Guarantees
    /// A value byte-identical to the stored one writes nothing: the answer
    /// is the stored KeyValue (same mod_revision), there is no watch event,
    /// and the key's expiry stays as it was (upstream does not renew the
    /// lease of an unchanged object either).
    async fn update_with_ttl(
        &self,
        key: &str,
        value: Vec<u8>,
        expected_revision: i64,
        ttl: Option<Duration>,
    ) -> Result<KeyValue>;

    /// Delete `key`, if `expected_revision` is given only when it still matches.
    /// Returns the deleted value and the delete's revision.
    async fn delete(&self, key: &str, expected_revision: Option<i64>) -> Result<(KeyValue, i64)>;

    /// Events on keys under `prefix` with revision > `after_revision`, first
    /// replaying history from the log, then live.
    ///
    /// # Errors
    /// `Compacted` when `after_revision` is older than the compaction point.
    async fn watch(&self, prefix: &str, after_revision: i64) -> Result<WatchStream>;

    /// Forget history up to `revision` (keeps current values).
    async fn compact(&self, revision: i64) -> Result<()>;

    /// A cheap liveness check for `/readyz`.
    async fn health(&self) -> Result<()>;

    /// Write a consistent snapshot of the whole store to `path`.
    async fn snapshot_save(&self, path: &Path) -> Result<SnapshotInfo>;
}

impl Error {
    /// A `Backend` error without an underlying source.
    pub(crate) fn backend(backend: &'static str, message: impl Into<String>) -> Error {
        Error::Backend {
            backend,
            message: message.into(),
            source: None,
        }
    }

    /// A `Backend` error that keeps its cause.
    pub(crate) fn backend_source(
        backend: &'static str,
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Error {
        Error::Backend {
            backend,
            message: message.into(),
            source: Some(Box::new(source)),
        }
    }
}
