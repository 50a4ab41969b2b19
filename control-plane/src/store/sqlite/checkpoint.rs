//! Checkpoints: copying the WAL into the database beside the writer, and
//! keeping the WAL file bounded.
//!
//! The writer does not auto-checkpoint (copying pages and fsyncing the
//! database on the commit path would stall commits). A thread beside it
//! runs PASSIVE checkpoints, which copy what they can without blocking
//! anyone: once a second, and at once when the writer's WAL hook sees the
//! WAL past half its limit. That alone does not bound the WAL: SQLite only
//! starts the WAL over when a commit finds every frame already copied,
//! which a steady stream of commits never lets happen (20,000 back-to-back
//! Lease updates left a 168 MB WAL beside a 12 MB database). So after a
//! commit that leaves more than [`WAL_LIMIT_FRAMES`] in the WAL, the
//! writer itself runs a RESTART checkpoint: it is the only writer and
//! between transactions, so it does not wait for the write lock; it waits
//! up to [`RESTART_WAIT`] for readers to finish with the WAL, copies the
//! frames the PASSIVE ones left (the early wake-up keeps those few),
//! fsyncs the database, and has the next commit write the WAL from its
//! start again. `journal_size_limit` (set on the writer) then cuts the
//! file back to the limit. Commits queue meanwhile. When readers do not
//! let go in time it tries again after [`RESTART_BACKOFF`], so a heavy
//! read load cannot stall commits back to back.
//!
//! RESTART rather than TRUNCATE: a WAL emptied to zero bytes makes every
//! following commit extend the file, so each fsync also writes the file's
//! new size; in the store benchmark (`tests/store_bench.rs`, medians of
//! eight interleaved runs) TRUNCATE cost 31 % of the raw creates per
//! second, while RESTART, which overwrites the WAL in place, stayed within
//! the (large) run-to-run noise of the machine.
//!
//! Durability does not change: a checkpoint fsyncs the database before it
//! lets the WAL be reused, and every commit still fsyncs the WAL
//! (`synchronous=FULL`).

use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::Connection;

/// How often the checkpoint thread runs a PASSIVE checkpoint unasked.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);

/// WAL frames (pages, 4 KiB each) above which the writer starts the WAL
/// over: 4 MiB, the point where SQLite's own auto-checkpoint would run.
pub(super) const WAL_LIMIT_FRAMES: i32 = 1000;

/// The WAL file is cut back to this when it starts over.
pub(super) const WAL_LIMIT_BYTES: i64 = WAL_LIMIT_FRAMES as i64 * 4096;

/// How long a RESTART checkpoint waits for readers (the writer's usual
/// busy timeout is restored after it).
const RESTART_WAIT: Duration = Duration::from_millis(50);

/// After a RESTART that readers kept from finishing, this long before the
/// writer tries again.
const RESTART_BACKOFF: Duration = Duration::from_secs(1);

/// What one `PRAGMA wal_checkpoint` reported.
#[derive(Debug, Clone, Copy)]
struct Outcome {
    /// Could not finish (the writer or readers held on).
    busy: bool,
    /// Frames in the WAL.
    frames: i32,
}

fn checkpoint(conn: &Connection, mode: &str) -> rusqlite::Result<Outcome> {
    conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
        Ok(Outcome {
            busy: r.get::<_, i32>(0)? != 0,
            frames: r.get(1)?,
        })
    })
}

/// Held while a checkpoint runs, by the checkpoint thread and the writer.
/// SQLite lets one checkpoint run at a time and fails a second one at once
/// (without its busy handler); taking turns here instead means a RESTART
/// waits for a PASSIVE to finish rather than failing and waiting a whole
/// [`RESTART_BACKOFF`] while the WAL grows.
pub(super) type Turn = Arc<Mutex<()>>;

/// The writer's side: its WAL hook records the WAL's size after each
/// commit and wakes the checkpoint thread early; [`WalBound::after_commit`]
/// starts the WAL over when it is too big.
pub(super) struct WalBound {
    /// Frames in the WAL after the writer's last commit (set by its hook).
    frames: Arc<AtomicI32>,
    /// The writer's normal busy timeout, restored after a RESTART.
    busy_timeout: Duration,
    /// No RESTART before this (after one that readers held up).
    next_try: Instant,
    turn: Turn,
}

impl WalBound {
    /// Install the WAL hook on the writer's connection (which replaces
    /// SQLite's auto-checkpoint hook, off anyway). `wake` reaches the
    /// checkpoint thread; dropping the hook with the connection stops it.
    pub(super) fn install(
        conn: &mut Connection,
        busy_timeout: Duration,
        wake: SyncSender<()>,
        turn: Turn,
    ) -> rusqlite::Result<Self> {
        let frames = Arc::new(AtomicI32::new(0));
        let seen = frames.clone();
        conn.wal_hook(Some(move |_: &mut rusqlite::hooks::Wal, n| {
            // Once per WAL cycle, when it passes half the limit: the
            // PASSIVE copies that half while the writer goes on.
            let before = seen.swap(n, Ordering::Relaxed);
            if before < WAL_LIMIT_FRAMES / 2 && n >= WAL_LIMIT_FRAMES / 2 {
                // Full: a wake-up is pending already.
                let _ = wake.try_send(());
            }
            Ok(())
        }))?;
        Ok(WalBound {
            frames,
            busy_timeout,
            next_try: Instant::now(),
            turn,
        })
    }

    /// Call between transactions on the writer's connection.
    pub(super) fn after_commit(&mut self, conn: &Connection) {
        if self.frames.load(Ordering::Relaxed) < WAL_LIMIT_FRAMES || Instant::now() < self.next_try
        {
            return;
        }
        let outcome = {
            let _turn = self.turn.lock().unwrap_or_else(|p| p.into_inner());
            conn.busy_timeout(RESTART_WAIT)
                .and_then(|()| checkpoint(conn, "RESTART"))
        };
        if let Err(e) = conn.busy_timeout(self.busy_timeout) {
            tracing::warn!(error = %e, "sqlite: restoring the writer's busy timeout failed");
        }
        match outcome {
            Ok(o) if !o.busy => self.frames.store(0, Ordering::Relaxed),
            Ok(o) => {
                tracing::debug!(
                    frames = o.frames,
                    "sqlite WAL not restarted: readers held on; trying again later"
                );
                self.next_try = Instant::now() + RESTART_BACKOFF;
            }
            Err(e) => {
                tracing::warn!(error = %e, "sqlite WAL restart checkpoint failed");
                self.next_try = Instant::now() + RESTART_BACKOFF;
            }
        }
    }
}

/// A channel from the writer's WAL hook to [`run`]: one pending wake-up is enough.
pub(super) fn channel() -> (SyncSender<()>, Receiver<()>) {
    std::sync::mpsc::sync_channel(1)
}

/// PASSIVE checkpoints, once a second or when woken, until the writer's
/// connection (holding the only sender) closes.
pub(super) fn run(path: &Path, wake: Receiver<()>, turn: Turn) {
    let conn = match Connection::open(path).and_then(|c| super::configure(&c).map(|()| c)) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e, "sqlite checkpoint thread cannot open the database; the writer alone keeps the WAL bounded");
            return;
        }
    };
    loop {
        match wake.recv_timeout(CHECKPOINT_EVERY) {
            Ok(()) | Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        let _turn = turn.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = checkpoint(&conn, "PASSIVE") {
            tracing::warn!(path = %path.display(), error = %e, "sqlite checkpoint failed");
        }
    }
}
