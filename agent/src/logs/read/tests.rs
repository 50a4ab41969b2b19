use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::*;

struct Flag(Arc<AtomicBool>);

impl Liveness for Flag {
    fn running(&self) -> BoxFuture<'_, bool> {
        let r = self.0.load(Ordering::SeqCst);
        Box::pin(async move { r })
    }
}

fn exited() -> Flag {
    Flag(Arc::new(AtomicBool::new(false)))
}

/// A CRI record at second `s` of the test's day.
fn rec(s: u32, tag: &str, msg: &str) -> String {
    format!("2026-11-30T06:00:{s:02}.000000001Z stdout {tag} {msg}\n")
}

fn lines(range: std::ops::RangeInclusive<u32>) -> String {
    range.map(|i| rec(i, "F", &format!("line {i}"))).collect()
}

fn write_gz(path: &Path, text: &str) {
    let f = std::fs::File::create(path).unwrap();
    let mut gz = flate2::write::GzEncoder::new(f, flate2::Compression::fast());
    gz.write_all(text.as_bytes()).unwrap();
    gz.finish().unwrap();
}

async fn read_all(path: &Path, opts: Options) -> String {
    let (tx, mut rx) = mpsc::channel(4);
    let path = path.to_path_buf();
    let task = tokio::spawn(async move { stream(&path, &opts, &exited(), tx).await });
    let mut out = Vec::new();
    while let Some(chunk) = rx.recv().await {
        out.extend(chunk);
    }
    task.await.unwrap().unwrap();
    String::from_utf8(out).unwrap()
}

fn opts() -> Options {
    Options::default()
}

/// A log with two rotated files (the older compressed) and a current one:
/// lines 1-3, 4-6, 7-8.
fn rotated_log(dir: &Path) -> PathBuf {
    write_gz(&dir.join("0.log.20261130-060003.gz"), &lines(1..=3));
    std::fs::write(dir.join("0.log.20261130-060006"), lines(4..=6)).unwrap();
    std::fs::write(dir.join("0.log"), lines(7..=8)).unwrap();
    // Another instance's log is not part of this one.
    std::fs::write(dir.join("1.log"), lines(20..=21)).unwrap();
    dir.join("0.log")
}

fn expect(range: std::ops::RangeInclusive<u32>) -> String {
    range.map(|i| format!("line {i}\n")).collect()
}

#[tokio::test]
async fn reads_rotated_files_oldest_first() {
    let dir = tempfile::tempdir().unwrap();
    let log = rotated_log(dir.path());
    assert_eq!(read_all(&log, opts()).await, expect(1..=8));
}

#[tokio::test]
async fn tail_counts_complete_lines_across_files() {
    let dir = tempfile::tempdir().unwrap();
    let log = rotated_log(dir.path());
    let tail = |n| Options {
        tail_lines: Some(n),
        ..opts()
    };
    assert_eq!(read_all(&log, tail(0)).await, "");
    assert_eq!(read_all(&log, tail(1)).await, expect(8..=8));
    assert_eq!(read_all(&log, tail(2)).await, expect(7..=8));
    assert_eq!(read_all(&log, tail(4)).await, expect(5..=8));
    assert_eq!(read_all(&log, tail(6)).await, expect(3..=8));
    assert_eq!(read_all(&log, tail(100)).await, expect(1..=8));
}

#[tokio::test]
async fn partial_records_join_into_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("0.log");
    let text = [
        rec(1, "F", "first"),
        rec(2, "P", "sec"),
        rec(3, "P", "o"),
        rec(4, "F", "nd"),
        rec(5, "F", "third"),
    ]
    .concat();
    std::fs::write(&log, text).unwrap();
    assert_eq!(read_all(&log, opts()).await, "first\nsecond\nthird\n");
    // A split line counts once for the tail.
    let tail2 = Options {
        tail_lines: Some(2),
        ..opts()
    };
    assert_eq!(read_all(&log, tail2).await, "second\nthird\n");
    // The timestamp is that of the line's first record, printed once.
    let ts = Options {
        timestamps: true,
        tail_lines: Some(2),
        ..opts()
    };
    assert_eq!(
        read_all(&log, ts).await,
        "2026-11-30T06:00:02.000000001Z second\n2026-11-30T06:00:05.000000001Z third\n"
    );
}

#[tokio::test]
async fn since_filters_by_record_time() {
    let dir = tempfile::tempdir().unwrap();
    let log = rotated_log(dir.path());
    let since = Options {
        since: Some("2026-11-30T06:00:05Z".parse().unwrap()),
        ..opts()
    };
    assert_eq!(read_all(&log, since).await, expect(5..=8));
    let both = Options {
        since: Some("2026-11-30T06:00:05Z".parse().unwrap()),
        tail_lines: Some(6),
        ..opts()
    };
    assert_eq!(read_all(&log, both).await, expect(5..=8));
}

#[tokio::test]
async fn limit_bytes_cuts_the_output() {
    let dir = tempfile::tempdir().unwrap();
    let log = rotated_log(dir.path());
    let limit = |n| Options {
        limit_bytes: Some(n),
        ..opts()
    };
    assert_eq!(read_all(&log, limit(10)).await, "line 1\nlin");
    assert_eq!(read_all(&log, limit(14)).await, "line 1\nline 2\n");
    let with_ts = Options {
        limit_bytes: Some(20),
        timestamps: true,
        ..opts()
    };
    assert_eq!(read_all(&log, with_ts).await, "2026-11-30T06:00:01.");
}

#[tokio::test]
async fn garbage_and_unterminated_lines() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("0.log");
    let text = format!(
        "{}not a record\n{}",
        rec(1, "F", "a"),
        "2026-11-30T06:00:02Z stdout F b"
    );
    std::fs::write(&log, text).unwrap();
    assert_eq!(read_all(&log, opts()).await, "a\nb");
    // No log file at all: nothing, no error.
    assert_eq!(read_all(&dir.path().join("9.log"), opts()).await, "");
}

/// Follow: new lines arrive, a rotation loses nothing (including lines
/// written to the renamed file before the runtime reopened), and the
/// stream ends once the container has exited.
#[tokio::test]
async fn follow_across_rotation_until_exit() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("0.log");
    std::fs::write(&log, lines(1..=2)).unwrap();
    let running = Arc::new(AtomicBool::new(true));
    let (tx, mut rx) = mpsc::channel(4);
    let live = Flag(running.clone());
    let path = log.clone();
    let task = tokio::spawn(async move {
        let o = Options {
            follow: true,
            tail_lines: Some(1),
            ..Options::default()
        };
        stream(&path, &o, &live, tx).await
    });
    let mut got = String::new();
    async fn until(rx: &mut mpsc::Receiver<Vec<u8>>, got: &mut String, want: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !got.ends_with(want) {
            let chunk = tokio::time::timeout_at(deadline, rx.recv())
                .await
                .unwrap_or_else(|_| panic!("waiting for {want:?}, got {got:?}"))
                .expect("stream open");
            got.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    }
    until(&mut rx, &mut got, "line 2\n").await;
    assert_eq!(got, "line 2\n", "the tail of 1, then waits");

    let append = |p: &Path, text: String| {
        let mut f = std::fs::OpenOptions::new().append(true).open(p).unwrap();
        f.write_all(text.as_bytes()).unwrap();
    };
    append(&log, lines(3..=3));
    until(&mut rx, &mut got, "line 3\n").await;

    // Rotate as the log manager does: rename, the runtime keeps writing to
    // the renamed file until it reopens.
    let rotated = dir.path().join("0.log.20261130-060003");
    std::fs::rename(&log, &rotated).unwrap();
    append(&rotated, lines(4..=4));
    tokio::time::sleep(POLL * 2).await;
    append(&rotated, lines(5..=5));
    std::fs::write(&log, lines(6..=6)).unwrap();
    append(&log, lines(7..=7));
    until(&mut rx, &mut got, "line 7\n").await;
    assert_eq!(got, expect(2..=7));

    append(&log, lines(8..=8));
    running.store(false, Ordering::SeqCst);
    while let Some(chunk) = rx.recv().await {
        got.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    task.await.unwrap().unwrap();
    assert_eq!(got, expect(2..=8), "everything, then the end");
}

#[tokio::test]
async fn follow_of_an_exited_container_reads_to_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let log = rotated_log(dir.path());
    let o = Options {
        follow: true,
        ..opts()
    };
    assert_eq!(read_all(&log, o).await, expect(1..=8));
}

#[tokio::test]
async fn follow_stops_when_the_client_goes() {
    let dir = tempfile::tempdir().unwrap();
    let log = rotated_log(dir.path());
    let (tx, rx) = mpsc::channel(1);
    let live = Flag(Arc::new(AtomicBool::new(true)));
    let o = Options {
        follow: true,
        ..opts()
    };
    let task = tokio::spawn(async move { stream(&log, &o, &live, tx).await });
    drop(rx);
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("follower ends")
        .unwrap()
        .unwrap();
}
