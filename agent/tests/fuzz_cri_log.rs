//! Fuzzing the CRI log parser, and the reader built on it, with proptest:
//! no line panics it, a record prints and parses back to itself, the fast
//! "is this a full line" check agrees with the parser, and reading a log
//! file gives back exactly the messages of its records, however the file
//! is broken up (partial records, garbage lines, a missing last newline),
//! with `limitBytes` a prefix of that and `tailLines` a suffix.
//!
//! `tests/corpus/cri_log/` holds hand-picked log files replayed on every
//! run; proptest's failures persist in
//! `tests/proptest-regressions/fuzz_cri_log.txt`.

#[path = "../../control-plane/tests/support/fuzz.rs"]
mod fuzz;

use std::path::Path;

use futures::future::BoxFuture;
use jiff::Timestamp;
use proptest::prelude::*;
use skiff_agent::logs::cri::{self, Stream};
use skiff_agent::logs::read::{self, Liveness, Options};
use tokio::sync::mpsc;

const REGRESSIONS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/proptest-regressions/fuzz_cri_log.txt"
);

/// One record as the runtime writes it.
#[derive(Debug, Clone)]
struct Rec {
    time: Timestamp,
    stderr: bool,
    partial: bool,
    /// Tags after the first (`F:x:y`), which readers must ignore.
    extra_tags: Vec<String>,
    /// Without the newline.
    message: Vec<u8>,
}

impl Rec {
    fn line(&self) -> Vec<u8> {
        let mut tag = String::from(if self.partial { "P" } else { "F" });
        for t in &self.extra_tags {
            tag.push(':');
            tag.push_str(t);
        }
        let stream = if self.stderr { "stderr" } else { "stdout" };
        let mut line = format!("{} {stream} {tag} ", cri::format_time(self.time)).into_bytes();
        line.extend_from_slice(&self.message);
        line.push(b'\n');
        line
    }

    /// The output this record stands for.
    fn output(&self) -> Vec<u8> {
        let mut out = self.message.clone();
        if !self.partial {
            out.push(b'\n');
        }
        out
    }
}

fn timestamp() -> impl Strategy<Value = Timestamp> {
    // Year 1 to jiff's last instant (9999-12-30T22:00Z: its range leaves
    // room for any offset), to the nanosecond.
    let last = Timestamp::MAX.as_second();
    (-62_135_596_800i64..last, 0..1_000_000_000i32)
        .prop_map(|(s, n)| Timestamp::new(s, n).expect("in range"))
}

fn rec() -> impl Strategy<Value = Rec> {
    (
        timestamp(),
        any::<bool>(),
        prop::bool::weighted(0.3),
        prop::collection::vec("[a-z0-9]{0,3}", 0..2),
        // Any bytes but the newline that ends the record.
        prop::collection::vec(
            any::<u8>().prop_map(|b| if b == b'\n' { b' ' } else { b }),
            0..40,
        ),
    )
        .prop_map(|(time, stderr, partial, extra_tags, message)| Rec {
            time,
            stderr,
            partial,
            extra_tags,
            message,
        })
}

/// Tokens of the line format, for mutations.
const LINE_TOKENS: &[&[u8]] = &[
    b" ",
    b"\n",
    b"F",
    b"P",
    b"P:",
    b":",
    b"stdout",
    b"stderr",
    b"Z",
    b"+01:00",
    b".",
    b"T",
    b"2026-11-30T06:00:00Z",
    b"\r",
];

/// A record's line, sometimes mutated.
fn line() -> impl Strategy<Value = Vec<u8>> {
    fuzz::mutated(rec().prop_map(|r| r.line()), LINE_TOKENS)
}

/// Whatever a runtime (or a disk) may leave in a log file: records, and
/// sometimes a mangled line among them.
#[derive(Debug, Clone)]
enum Line {
    Record(Rec),
    Garbage(Vec<u8>),
}

fn file() -> impl Strategy<Value = Vec<Line>> {
    prop::collection::vec(
        prop_oneof![
            6 => rec().prop_map(Line::Record),
            1 => line().prop_map(|mut b| {
                // One line: whatever newline the mutation put in goes.
                b.retain(|c| *c != b'\n');
                b.push(b'\n');
                Line::Garbage(b)
            }),
        ],
        0..24,
    )
}

fn text(lines: &[Line]) -> Vec<u8> {
    lines
        .iter()
        .flat_map(|l| match l {
            Line::Record(r) => r.line(),
            Line::Garbage(b) => b.clone(),
        })
        .collect()
}

/// The container has exited: a reader reads to the end and stops.
struct Exited;

impl Liveness for Exited {
    fn running(&self) -> BoxFuture<'_, bool> {
        Box::pin(async { false })
    }
}

/// Read the log at `path` with `opts`, as `/containerLogs` would.
fn read_log(rt: &tokio::runtime::Runtime, path: &Path, opts: Options) -> Vec<u8> {
    rt.block_on(async {
        let (tx, mut rx) = mpsc::channel(4);
        let path = path.to_path_buf();
        let task = tokio::spawn(async move { read::stream(&path, &opts, &Exited, tx).await });
        let mut out = Vec::new();
        while let Some(chunk) = rx.recv().await {
            out.extend(chunk);
        }
        task.await.expect("reader task").expect("log reads");
        out
    })
}

/// What every parsed line of `text` says, in order: the reader's output
/// with no options.
fn messages(text: &[u8]) -> Vec<u8> {
    text.split_inclusive(|b| *b == b'\n')
        .filter_map(|l| cri::parse(l).ok())
        .flat_map(|r| r.message.to_vec())
        .collect()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

proptest! {
    #![proptest_config(fuzz::config(REGRESSIONS, 30000))]

    /// No line panics the parser, and the quick fullness check agrees
    /// with it wherever the parser takes the line.
    #[test]
    fn any_line_parses_or_is_refused(line in line()) {
        if let Ok(r) = cri::parse(&line) {
            prop_assert_eq!(cri::is_full(&line), !r.partial);
            prop_assert!(line.ends_with(r.message) || line.strip_suffix(b"\n").is_some_and(|l| l.ends_with(r.message)));
        }
        let _ = cri::is_full(&line);
    }

    /// A record as the runtime writes it parses back to itself; its
    /// timestamp prints as it was written.
    #[test]
    fn records_round_trip(r in rec()) {
        let line = r.line();
        let parsed = cri::parse(&line);
        prop_assert!(parsed.is_ok(), "{:?}: {parsed:?}", String::from_utf8_lossy(&line));
        let parsed = parsed.expect("checked");
        prop_assert_eq!(parsed.time, r.time);
        prop_assert_eq!(parsed.stream, if r.stderr { Stream::Stderr } else { Stream::Stdout });
        prop_assert_eq!(parsed.partial, r.partial);
        prop_assert_eq!(parsed.message, &r.output()[..]);
        prop_assert_eq!(cri::format_time(parsed.time), cri::format_time(r.time));
        // The last line of a file may lack its newline.
        let cut = &line[..line.len() - 1];
        prop_assert_eq!(cri::parse(cut).map(|p| p.message), Ok(&r.message[..]));
    }
}

/// What `tailLines: n` reads, as the kubelet's `ReadLogs` decides it:
/// start where exactly `n` complete lines (newline-terminated full
/// records) follow, then write records until `n` full ones are written.
fn tail_model(text: &[u8], n: u64) -> Vec<u8> {
    let lines: Vec<&[u8]> = text.split_inclusive(|b| *b == b'\n').collect();
    let full: Vec<usize> = (0..lines.len())
        .filter(|i| lines[*i].ends_with(b"\n") && cri::is_full(lines[*i]))
        .collect();
    let n_usize = usize::try_from(n).expect("small");
    let start = if full.len() > n_usize {
        full[full.len() - n_usize - 1] + 1
    } else {
        0
    };
    let mut out = Vec::new();
    let mut left = n;
    if left == 0 {
        return out;
    }
    for l in &lines[start..] {
        let Ok(r) = cri::parse(l) else { continue };
        out.extend_from_slice(r.message);
        if !r.partial {
            left -= 1;
            if left == 0 {
                break;
            }
        }
    }
    out
}

proptest! {
    // Each case writes and reads files: fewer of them.
    #![proptest_config(fuzz::config(REGRESSIONS, 3000))]

    /// Reading a log gives the messages of its records in order, skipping
    /// lines that do not parse; a byte limit gives a prefix of that, a
    /// tail what the kubelet's tail gives.
    #[test]
    fn reading_a_log_gives_its_messages(
        lines in file(),
        unterminated in any::<bool>(),
        limit in 0..400u64,
        tail in 0..30u64,
    ) {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("0.log");
        let mut text = text(&lines);
        if unterminated && text.ends_with(b"\n") {
            text.pop();
        }
        std::fs::write(&path, &text).expect("write log");
        let rt = runtime();

        let all = read_log(&rt, &path, Options::default());
        prop_assert_eq!(&all, &messages(&text));
        // Without garbage, that is exactly what the records stand for.
        if lines.iter().all(|l| matches!(l, Line::Record(_))) {
            let mut want: Vec<u8> = lines
                .iter()
                .filter_map(|l| match l { Line::Record(r) => Some(r.output()), _ => None })
                .flatten()
                .collect();
            if unterminated && want.ends_with(b"\n") && lines.last().is_some_and(|l| matches!(l, Line::Record(r) if !r.partial)) {
                want.pop();
            }
            prop_assert_eq!(&all, &want);
        }

        let limited = read_log(&rt, &path, Options { limit_bytes: Some(limit), ..Options::default() });
        let n = usize::try_from(limit).expect("small").min(all.len());
        prop_assert_eq!(&limited[..], &all[..n]);

        let tailed = read_log(&rt, &path, Options { tail_lines: Some(tail), ..Options::default() });
        prop_assert_eq!(&tailed, &tail_model(&text, tail), "tail {}", tail);
        prop_assert!(tailed.is_empty() || all.windows(tailed.len()).any(|w| w == &tailed[..]));

        // Timestamps are prefixed to lines, the rest unchanged.
        let stamped = read_log(&rt, &path, Options { timestamps: true, ..Options::default() });
        prop_assert!(stamped.len() >= all.len());
    }
}

/// Lines the format allows or that a broken runtime (or disk) writes.
#[test]
fn odd_lines() {
    for line in [
        &b""[..],
        b"\n",
        b" ",
        b"   \n",
        b"2026-11-30T06:00:00Z",
        b"2026-11-30T06:00:00Z ",
        b"2026-11-30T06:00:00Z stdout",
        b"2026-11-30T06:00:00Z stdout ",
        b"2026-11-30T06:00:00Z stdout  ",
        b"2026-11-30T06:00:00Z stdout P",
        b"2026-11-30T06:00:00Z stdout P ",
        b"2026-11-30T06:00:00Z stdout P \n",
        b"2026-11-30T06:00:00Z stdout : x\n",
        b"9999-12-31T23:59:59.999999999Z stdout F x\n",
        b"-009999-01-01T00:00:00Z stdout F x\n",
        b"2026-11-30T06:00:00.0000000000001Z stdout F x\n",
        b"2026-11-30T06:00:00\xffZ stdout F x\n",
        b"2026-11-30T06:00:00+25:00 stdout F x\n",
    ] {
        if let Ok(r) = cri::parse(line) {
            assert_eq!(
                cri::is_full(line),
                !r.partial,
                "{:?}",
                String::from_utf8_lossy(line)
            );
        }
    }
}

/// Every file in `tests/corpus/cri_log/` read as a container's log.
#[test]
fn corpus_replays() {
    let rt = runtime();
    for (path, bytes) in fuzz::corpus(env!("CARGO_MANIFEST_DIR"), "cri_log") {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = dir.path().join("0.log");
        std::fs::write(&log, &bytes).expect("write log");
        assert_eq!(
            read_log(&rt, &log, Options::default()),
            messages(&bytes),
            "{}",
            path.display()
        );
        for tail in [0, 1, 2, 100] {
            let tailed = read_log(
                &rt,
                &log,
                Options {
                    tail_lines: Some(tail),
                    ..Options::default()
                },
            );
            assert_eq!(
                tailed,
                tail_model(&bytes, tail),
                "{} tail {tail}",
                path.display()
            );
        }
    }
}
