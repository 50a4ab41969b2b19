//! Reading a container's log the way `kubectl logs` asks for it (the
//! kubelet's `kuberuntime/logs.ReadLogs`), over the rotated files as well
//! as the current one:
//!
//! - `tail`: start so that exactly that many complete lines follow, counted
//!   from the end across files (a line split into partial records counts
//!   once);
//! - `since`: skip records older than a time (by their CRI timestamp);
//! - `timestamps`: prefix each line with its CRI timestamp;
//! - `limit_bytes`: stop after that many bytes of output;
//! - `follow`: at the end of the file wait for more, switch to the new file
//!   after a rotation (reading the old one to its end first, so nothing is
//!   lost), and stop once the container has exited and everything it wrote
//!   has been read.

use std::collections::VecDeque;
use std::io::{Cursor, Read, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use jiff::Timestamp;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncSeekExt, BufReader};
use tokio::sync::mpsc;

use super::cri;

/// How often a follower looks for new output. Polling (rather than
/// inotify) keeps a follower to one timer and a stat; 200 ms is below what
/// a person watching `kubectl logs -f` notices.
const POLL: Duration = Duration::from_millis(200);
/// How often a follower asks whether the container still runs (the
/// kubelet's `stateCheckPeriod`).
const STATE_CHECK: Duration = Duration::from_secs(1);
/// Output is sent in chunks of about this size.
const CHUNK: usize = 32 * 1024;

/// What to read; the query of `/containerLogs`, validated.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Options {
    pub follow: bool,
    /// Complete lines from the end; None: everything.
    pub tail_lines: Option<u64>,
    /// Stop after this many bytes of output.
    pub limit_bytes: Option<u64>,
    pub timestamps: bool,
    /// Skip records older than this.
    pub since: Option<Timestamp>,
}

/// Whether the container whose log is followed still runs. A follower
/// stops once this says no and the file has been read to its end.
pub trait Liveness: Send + Sync {
    fn running(&self) -> BoxFuture<'_, bool>;
}

/// Errors reading a log. Once output has started they can only end it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A log file exists but cannot be read.
    #[error("cannot read log file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Stream the log whose current file is `current` into `out`, in chunks,
/// until done (or, when following, until the container exits or `out` is
/// closed by the receiver).
///
/// # Errors
/// [`Error::Read`] when a file fails mid-way; missing files are skipped
/// (they were rotated away or removed meanwhile).
pub async fn stream(
    current: &Path,
    opts: &Options,
    live: &dyn Liveness,
    out: mpsc::Sender<Vec<u8>>,
) -> Result<()> {
    let files = {
        let current = current.to_path_buf();
        tokio::task::spawn_blocking(move || super::all_files(&current))
            .await
            .unwrap_or_default()
    };
    let last = files.len().saturating_sub(1);
    let (first, offset) = match opts.tail_lines {
        Some(n) => tail_start(&files, n).await?,
        None => (0, 0),
    };
    let mut w = Writer::new(opts, out);
    if w.done() {
        return Ok(());
    }
    for (i, path) in files.iter().enumerate().take(last).skip(first) {
        let at = if i == first { offset } else { 0 };
        let Some(mut src) = open_rotated(path, at).await? else {
            continue;
        };
        if pump(&mut src, path, &mut w).await? == Flow::Stop {
            w.flush().await;
            return Ok(());
        }
    }
    let at = if first == last { offset } else { 0 };
    read_current(current, at, opts.follow, live, &mut w).await
}

/// A source of lines: a plain file, or a decompressed rotated one.
type Source = Box<dyn AsyncBufRead + Unpin + Send>;

/// Open `path` at byte `offset` (of its decompressed content for `.gz`).
async fn open(path: &Path, offset: u64) -> std::io::Result<Source> {
    if path.to_string_lossy().ends_with(super::GZ_SUFFIX) {
        // A compressed file holds at most containerLogMaxSize of text.
        let p = path.to_path_buf();
        let data = tokio::task::spawn_blocking(move || -> std::io::Result<Vec<u8>> {
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(std::fs::File::open(p)?).read_to_end(&mut out)?;
            Ok(out)
        })
        .await
        .map_err(std::io::Error::other)??;
        let mut c = Cursor::new(data);
        c.set_position(offset);
        return Ok(Box::new(c));
    }
    let mut f = tokio::fs::File::open(path).await?;
    if offset > 0 {
        f.seek(SeekFrom::Start(offset)).await?;
    }
    Ok(Box::new(BufReader::with_capacity(64 * 1024, f)))
}

/// A rotated file, or its compressed form when it was compressed since it
/// was listed; None when it is gone.
async fn open_rotated(path: &Path, offset: u64) -> Result<Option<Source>> {
    let gz = PathBuf::from(format!("{}{}", path.display(), super::GZ_SUFFIX));
    for p in [path, gz.as_path()] {
        match open(p, offset).await {
            Ok(s) => return Ok(Some(s)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(Error::Read {
                    path: p.to_path_buf(),
                    source,
                })
            }
        }
    }
    Ok(None)
}

/// Where to start so that `n` complete lines follow: (file index, byte
/// offset). Files are scanned newest first, each counting its full
/// records; the file that holds the n-th line from the end is where
/// reading starts.
async fn tail_start(files: &[PathBuf], n: u64) -> Result<(usize, u64)> {
    let mut need = n;
    for (i, path) in files.iter().enumerate().rev() {
        let mut src = match open_rotated(path, 0).await? {
            Some(s) => s,
            None => continue,
        };
        let (count, ends) = count_lines(&mut src, path, need).await?;
        if count > need {
            // `ends` holds the ends of the last need+1 full records: the
            // first of them is where the last `need` lines begin.
            return Ok((i, ends[0]));
        }
        need -= count;
        if need == 0 {
            return Ok((i, 0));
        }
    }
    Ok((0, 0))
}

/// Count the full records of a source, keeping the end offsets of the last
/// `keep + 1` of them.
async fn count_lines(src: &mut Source, path: &Path, keep: u64) -> Result<(u64, VecDeque<u64>)> {
    let keep = usize::try_from(keep)
        .unwrap_or(usize::MAX)
        .saturating_add(1);
    let mut ends = VecDeque::new();
    let mut count = 0u64;
    let mut pos = 0u64;
    let mut line = Vec::new();
    loop {
        let n = next_line(src, path, &mut line).await?;
        if n == 0 {
            break;
        }
        pos += n as u64;
        if line.ends_with(b"\n") && cri::is_full(&line) {
            count += 1;
            if ends.len() == keep {
                ends.pop_front();
            }
            ends.push_back(pos);
        }
    }
    Ok((count, ends))
}

/// Replace `line` with the next line of `src` (its newline kept; the last
/// one may lack it); 0 at the end.
async fn next_line(src: &mut Source, path: &Path, line: &mut Vec<u8>) -> Result<usize> {
    line.clear();
    src.read_until(b'\n', line)
        .await
        .map_err(|source| Error::Read {
            path: path.to_path_buf(),
            source,
        })
}

/// Copy a whole (rotated) source through the writer.
async fn pump(src: &mut Source, path: &Path, w: &mut Writer<'_>) -> Result<Flow> {
    let mut line = Vec::new();
    loop {
        let n = next_line(src, path, &mut line).await?;
        if n == 0 {
            return Ok(Flow::Go);
        }
        if w.line(&line) == Flow::Stop {
            return Ok(Flow::Stop);
        }
        if !w.send_if_full().await {
            return Ok(Flow::Stop);
        }
    }
}

/// Which file a path names right now: (device, inode).
async fn identity(path: &Path) -> Option<(u64, u64)> {
    tokio::fs::metadata(path)
        .await
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// The current file opened at `offset`, with the identity of what was
/// opened (taken from the open file, so a rotation in between cannot
/// mislead the follower); None when there is no file yet.
async fn open_current(path: &Path, offset: u64) -> std::io::Result<Option<(Source, (u64, u64))>> {
    let mut f = match tokio::fs::File::open(path).await {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let m = f.metadata().await?;
    if offset > 0 {
        f.seek(SeekFrom::Start(offset)).await?;
    }
    let src: Source = Box::new(BufReader::with_capacity(64 * 1024, f));
    Ok(Some((src, (m.dev(), m.ino()))))
}

/// Read the current file from `offset`; when following, keep reading as
/// it grows and across rotations until the container has exited.
async fn read_current(
    path: &Path,
    offset: u64,
    follow: bool,
    live: &dyn Liveness,
    w: &mut Writer<'_>,
) -> Result<()> {
    let read_err = |source| Error::Read {
        path: path.to_path_buf(),
        source,
    };
    let (mut reader, mut ident) = match open_current(path, offset).await.map_err(read_err)? {
        Some((r, id)) => (Some(r), Some(id)),
        None => (None, None),
    };
    // Bytes of a line whose end has not been written yet.
    let mut line = Vec::new();
    let mut exited = false;
    let mut rotated = false;
    let mut checked: Option<Instant> = None;
    loop {
        if let Some(r) = reader.as_mut() {
            r.read_until(b'\n', &mut line).await.map_err(read_err)?;
            if line.ends_with(b"\n") {
                let flow = w.line(&line);
                line.clear();
                if flow == Flow::Stop || !w.send_if_full().await {
                    break;
                }
                continue;
            }
        }
        // At the end of what has been written so far.
        if !follow || exited {
            if !line.is_empty() {
                // The kubelet passes on an unterminated last line as is.
                w.line(&line);
            }
            break;
        }
        if !w.flush().await {
            return Ok(());
        }
        let now = identity(path).await;
        if now.is_some() && now != ident {
            if rotated || reader.is_none() {
                // The old file is read to its end: go on with the new one.
                if !line.is_empty() {
                    w.line(&line);
                    line.clear();
                }
                (reader, ident) = match open_current(path, 0).await.map_err(read_err)? {
                    Some((r, id)) => (Some(r), Some(id)),
                    None => (None, None),
                };
                rotated = false;
            } else {
                // Renamed away and reopened by the runtime: the old file
                // may have grown after the last read; read it once more.
                rotated = true;
            }
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep(POLL) => {}
            _ = w.out.closed() => return Ok(()),
        }
        if checked.is_none_or(|t| t.elapsed() >= STATE_CHECK) {
            checked = Some(Instant::now());
            exited = !live.running().await;
        }
    }
    w.flush().await;
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Go,
    Stop,
}

/// Turns records into output, applying since, timestamps, the byte limit
/// and (when not following) the tail's line count.
struct Writer<'a> {
    opts: &'a Options,
    /// Bytes still allowed by limit_bytes.
    remain: Option<u64>,
    /// Complete lines still to write when a tail is read without follow
    /// (lines appended while reading are not part of the tail).
    lines_left: Option<u64>,
    /// The previous record ended a line: the next one starts one.
    at_line_start: bool,
    pending: Vec<u8>,
    /// Receiver: the HTTP response body; closed when the client goes.
    out: mpsc::Sender<Vec<u8>>,
}

impl<'a> Writer<'a> {
    fn new(opts: &'a Options, out: mpsc::Sender<Vec<u8>>) -> Writer<'a> {
        Writer {
            opts,
            remain: opts.limit_bytes,
            lines_left: opts.tail_lines.filter(|_| !opts.follow),
            at_line_start: true,
            pending: Vec::new(),
            out,
        }
    }

    fn done(&self) -> bool {
        self.remain == Some(0) || self.lines_left == Some(0)
    }

    /// Take one line of the file.
    fn line(&mut self, raw: &[u8]) -> Flow {
        let rec = match cri::parse(raw) {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!("skipping log line: {e}");
                return Flow::Go;
            }
        };
        let starts_line = self.at_line_start;
        self.at_line_start = !rec.partial;
        if self.opts.since.is_none_or(|s| rec.time >= s) {
            let before = self.pending.len();
            if self.opts.timestamps && starts_line {
                self.pending
                    .extend_from_slice(cri::format_time(rec.time).as_bytes());
                self.pending.push(b' ');
            }
            self.pending.extend_from_slice(rec.message);
            let wrote = (self.pending.len() - before) as u64;
            if let Some(remain) = self.remain.as_mut() {
                if wrote >= *remain {
                    self.pending.truncate(before + *remain as usize);
                    *remain = 0;
                    return Flow::Stop;
                }
                *remain -= wrote;
            }
        }
        if !rec.partial {
            if let Some(left) = self.lines_left.as_mut() {
                *left = left.saturating_sub(1);
                if *left == 0 {
                    return Flow::Stop;
                }
            }
        }
        Flow::Go
    }

    /// Send what is pending once it makes a chunk; false when the
    /// receiver is gone.
    async fn send_if_full(&mut self) -> bool {
        if self.pending.len() < CHUNK {
            return true;
        }
        self.flush().await
    }

    /// Send what is pending; false when the receiver is gone.
    async fn flush(&mut self) -> bool {
        if self.pending.is_empty() {
            return !self.out.is_closed();
        }
        self.out
            .send(std::mem::take(&mut self.pending))
            .await
            .is_ok()
    }
}

#[cfg(test)]
mod tests;
