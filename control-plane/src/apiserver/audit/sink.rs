//! Where events go: a queue bounded in bytes, drained by one writer
//! thread into the log file (rotating) or stdout.
//!
//! # Guarantees
//! The request path never waits for the disk: [`Sink::send`] only queues.
//! Events reach the file in the order they were sent.
//!
//! # Caveats
//! When [`QUEUE_BYTES`] of events are waiting (the disk stalls or cannot
//! keep up), further events are dropped, counted in
//! `apiserver_audit_error_total{plugin="log"}` and reported in the server
//! log, as upstream's buffered (batch) mode does with a full buffer.
//! Upstream's default blocking mode would hold every request instead,
//! which turns a slow disk into an unavailable API server.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

use super::rotate::{self, RotatingFile};
use super::{Error, Result};

/// Bytes of encoded events that may wait for the writer.
pub const QUEUE_BYTES: usize = 64 * 1024 * 1024;

/// Where the log is written (`--audit-log-path`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// `-`
    Stdout,
    File(rotate::Options),
}

/// Counters the sink keeps (registered by the server's metrics).
#[derive(Debug, Clone, Default)]
pub struct Counters {
    /// `apiserver_audit_event_total`: events handed to the log.
    pub events: Counter,
    /// `apiserver_audit_error_total{plugin="log"}`: events lost.
    pub errors: Counter,
}

enum Msg {
    /// One encoded event, holding its share of the queue until written.
    Line(Vec<u8>, OwnedSemaphorePermit),
    /// Flush what came before, then answer.
    Flush(oneshot::Sender<()>),
}

/// The sending side, shared by every request.
#[derive(Debug, Clone)]
pub struct Sink {
    /// Sent to by requests; received by the writer thread, which ends
    /// when every clone of the sink is gone.
    tx: mpsc::UnboundedSender<Msg>,
    /// Free bytes of the queue.
    room: Arc<Semaphore>,
    counters: Counters,
    /// Set while events are being dropped (to log once, not per event).
    dropping: Arc<AtomicBool>,
}

trait Output: Send {
    fn write_line(&mut self, line: &[u8]) -> std::io::Result<()>;
    fn flush(&mut self) -> std::io::Result<()>;
}

impl Output for RotatingFile {
    fn write_line(&mut self, line: &[u8]) -> std::io::Result<()> {
        RotatingFile::write_line(self, line)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        RotatingFile::flush(self)
    }
}

struct Stdout;

impl Output for Stdout {
    fn write_line(&mut self, line: &[u8]) -> std::io::Result<()> {
        std::io::stdout().lock().write_all(line)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stdout().lock().flush()
    }
}

impl Sink {
    /// Open the destination and start the writer thread.
    ///
    /// # Errors
    /// The log file cannot be created or opened (the server refuses to
    /// start rather than run without its audit log).
    pub fn open(dest: &Destination, counters: Counters) -> Result<Sink> {
        let out: Box<dyn Output> = match dest {
            Destination::Stdout => Box::new(Stdout),
            Destination::File(o) => {
                Box::new(RotatingFile::open(o.clone()).map_err(|source| Error::Open {
                    path: o.path.display().to_string(),
                    source,
                })?)
            }
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let errors = counters.errors.clone();
        std::thread::Builder::new()
            .name("audit-log".into())
            .spawn(move || write_loop(rx, out, errors))
            .map_err(|source| Error::Open {
                path: "the audit writer thread".into(),
                source,
            })?;
        Ok(Sink {
            tx,
            room: Arc::new(Semaphore::new(QUEUE_BYTES)),
            counters,
            dropping: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Queue one encoded event (a line, newline included); drops it when
    /// the queue is full. Never waits.
    pub fn send(&self, line: Vec<u8>) {
        self.counters.events.inc();
        let permit = u32::try_from(line.len())
            .ok()
            .and_then(|n| self.room.clone().try_acquire_many_owned(n).ok());
        let Some(permit) = permit else {
            self.counters.errors.inc();
            if !self.dropping.swap(true, Ordering::Relaxed) {
                tracing::error!(
                    queued_bytes = QUEUE_BYTES,
                    "audit log queue full: dropping audit events until the writer catches up"
                );
            }
            return;
        };
        if self.dropping.swap(false, Ordering::Relaxed) {
            tracing::warn!("audit log queue has room again");
        }
        if self.tx.send(Msg::Line(line, permit)).is_err() {
            self.counters.errors.inc();
        }
    }

    /// Wait until everything sent before is written out.
    pub async fn flush(&self) {
        let (done, wait) = oneshot::channel();
        if self.tx.send(Msg::Flush(done)).is_ok() {
            let _ = wait.await;
        }
    }
}

/// The writer thread: write, flush when nothing more waits.
fn write_loop(mut rx: mpsc::UnboundedReceiver<Msg>, mut out: Box<dyn Output>, errors: Counter) {
    let mut failing = false;
    while let Some(msg) = rx.blocking_recv() {
        match msg {
            Msg::Line(line, permit) => {
                let res = out.write_line(&line);
                drop(permit);
                match res {
                    Ok(()) if failing => {
                        failing = false;
                        tracing::warn!("writing the audit log works again");
                    }
                    Ok(()) => {}
                    Err(e) => {
                        errors.inc();
                        if !failing {
                            failing = true;
                            tracing::error!(error = %e, "writing the audit log failed: events are lost");
                        }
                    }
                }
            }
            Msg::Flush(done) => {
                let _ = out.flush();
                let _ = done.send(());
            }
        }
        if rx.is_empty() {
            if let Err(e) = out.flush() {
                errors.inc();
                tracing::error!(error = %e, "flushing the audit log failed");
            }
        }
    }
    let _ = out.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_arrive_in_order_and_flush_waits_for_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let counters = Counters::default();
        let sink = Sink::open(
            &Destination::File(rotate::Options {
                path: path.clone(),
                max_size_mb: 0,
                max_backups: 0,
                max_age_days: 0,
            }),
            counters.clone(),
        )
        .unwrap();
        for i in 0..100 {
            sink.send(format!("{i}\n").into_bytes());
        }
        sink.flush().await;
        let text = std::fs::read_to_string(&path).unwrap();
        let want: String = (0..100).map(|i| format!("{i}\n")).collect();
        assert_eq!(text, want);
        assert_eq!((counters.events.get(), counters.errors.get()), (100, 0));
    }

    #[test]
    fn an_unopenable_log_refuses_to_start() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, b"").unwrap();
        let e = Sink::open(
            &Destination::File(rotate::Options {
                path: blocker.join("audit.log"),
                max_size_mb: 0,
                max_backups: 0,
                max_age_days: 0,
            }),
            Counters::default(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("audit.log"), "{e}");
    }
}
