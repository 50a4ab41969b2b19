//! What the `fuzz_*` property suites share: their case budget, where their
//! failures persist, byte mutations of structured inputs, and the seed
//! corpus they replay first.
//!
//! cargo-fuzz needs a nightly compiler, which these machines do not have,
//! so the decoders and parsers are fuzzed with proptest instead: structured
//! generators reach the deep paths, and [`mutated`] breaks their output the
//! way a byte-level fuzzer would. Plain `std` only, so the agent's crates
//! can include this file too (`#[path]`).
#![allow(dead_code)] // each suite uses its own part

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, FileFailurePersistence};

/// The cases one property runs: `PROPTEST_CASES` when set (to run the
/// suites longer), else `default`. The defaults are sized so that all the
/// suites together stay near a minute in a debug build on two cores.
pub fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A property's configuration: [`cases`] cases, its failures persisted to
/// (and replayed first from) `regressions`, a file under the suite's
/// `tests/proptest-regressions/`.
pub fn config(regressions: &'static str, default_cases: u32) -> Config {
    Config {
        cases: cases(default_cases),
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(regressions))),
        // A failing input is shrunk for a bounded while, not forever.
        max_shrink_iters: 4096,
        ..Config::default()
    }
}

/// One byte-level change, as a mutating fuzzer makes them. Positions are
/// [`Index`]es, resolved against the input's length when applied.
#[derive(Debug, Clone)]
pub enum Edit {
    /// XOR one byte.
    Flip(Index, u8),
    /// Insert bytes.
    Insert(Index, Vec<u8>),
    /// Remove up to `n` bytes.
    Delete(Index, usize),
    /// Copy a run of the input elsewhere (repeats structure).
    Splice { from: Index, len: usize, to: Index },
    /// Cut the input short.
    Truncate(Index),
    /// Insert one of the suite's interesting tokens.
    Token(Index, Index),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        3 => (any::<Index>(), 1..=255u8).prop_map(|(i, x)| Edit::Flip(i, x)),
        2 => (any::<Index>(), prop::collection::vec(any::<u8>(), 1..8))
            .prop_map(|(i, b)| Edit::Insert(i, b)),
        2 => (any::<Index>(), 1..16usize).prop_map(|(i, n)| Edit::Delete(i, n)),
        1 => (any::<Index>(), 1..64usize, any::<Index>())
            .prop_map(|(from, len, to)| Edit::Splice { from, len, to }),
        1 => any::<Index>().prop_map(Edit::Truncate),
        3 => (any::<Index>(), any::<Index>()).prop_map(|(i, t)| Edit::Token(i, t)),
    ]
}

/// Apply `edits` to `input`; `tokens` are what [`Edit::Token`] inserts.
pub fn apply_edits(mut input: Vec<u8>, edits: &[Edit], tokens: &[&[u8]]) -> Vec<u8> {
    for e in edits {
        // Positions 0..=len: inserting at the end is allowed.
        let at = |i: &Index, len: usize| i.index(len + 1);
        match e {
            Edit::Flip(i, x) if !input.is_empty() => {
                let i = i.index(input.len());
                input[i] ^= x;
            }
            Edit::Flip(..) => {}
            Edit::Insert(i, b) => {
                let i = at(i, input.len());
                input.splice(i..i, b.iter().copied());
            }
            Edit::Delete(i, n) => {
                let i = at(i, input.len());
                let end = (i + n).min(input.len());
                input.drain(i..end);
            }
            Edit::Splice { from, len, to } => {
                let from = at(from, input.len());
                let end = (from + len).min(input.len());
                let run = input[from..end].to_vec();
                let to = at(to, input.len());
                input.splice(to..to, run);
            }
            Edit::Truncate(i) => {
                let i = at(i, input.len());
                input.truncate(i);
            }
            Edit::Token(i, t) if !tokens.is_empty() => {
                let i = at(i, input.len());
                input.splice(i..i, t.get(tokens).iter().copied());
            }
            Edit::Token(..) => {}
        }
    }
    input
}

/// `base` as it is about a quarter of the time, else with one to four
/// [`Edit`]s: mostly well-formed inputs that reach the deep paths, and
/// near misses of them that reach the error paths.
pub fn mutated(
    base: impl Strategy<Value = Vec<u8>>,
    tokens: &'static [&'static [u8]],
) -> impl Strategy<Value = Vec<u8>> {
    let edits = prop_oneof![
        1 => Just(Vec::new()),
        3 => prop::collection::vec(edit(), 1..=4),
    ];
    (base, edits).prop_map(move |(input, edits)| apply_edits(input, &edits, tokens))
}

/// Tokens that matter to JSON and YAML parsers.
pub const TEXT_TOKENS: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b":",
    b",",
    b"\\",
    b"\\u0000",
    b"\\ud800",
    b"null",
    b"-0",
    b"1e999999",
    b"18446744073709551616",
    b"-9223372036854775809",
    b"0.1e-400",
    b"\n",
    b"\n  ",
    b"- ",
    b"&a ",
    b"*a",
    b"<<: ",
    b"!!binary ",
    b"? ",
    b"|\n",
    b"---\n",
    b"\t",
    b"\xef\xbb\xbf",
    b"\xff",
    b"$patch",
    b"\"$patch\":\"delete\"",
];

/// The seed inputs of one target, `tests/corpus/<target>/*` under the
/// crate (README files excepted), sorted by name so that runs agree.
pub fn corpus(manifest_dir: &str, target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = Path::new(manifest_dir).join("tests/corpus").join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {}: {e}", dir.display()))
        .map(|e| e.expect("corpus entry").path())
        .filter(|p| p.is_file() && p.file_name().is_some_and(|n| n != "README.md"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "corpus {} is empty", dir.display());
    files
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p, bytes)
        })
        .collect()
}

/// The corpus file's name, for messages and for picking how to feed it.
pub fn name(path: &Path) -> &str {
    path.file_name().and_then(|n| n.to_str()).unwrap_or("?")
}
