//! Running `nft`, `iptables`, `iptables-restore` and `conntrack` with a
//! script on standard input, as kube-proxy does. Their error output is kept
//! whole: it names the offending line, which is what an operator needs.
//!
//! Every run is bounded: a program that has not finished within its
//! timeout (a wedged kernel call, a lock that is never released) is killed
//! and reported, so that the sync loop goes on to retry instead of
//! hanging. iptables' own wait for the xtables lock is bounded too
//! ([`LOCK_WAIT`]), as kube-proxy bounds it.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long one run of a tool may take. Generous: a full sync of ten
/// thousand Services is one `nft -f` of a few seconds, and a sync that
/// times out is retried from scratch.
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// How long `--version` may take to say whether a tool exists.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Seconds iptables waits for the xtables lock (`-w 5`, kube-proxy's
/// value) before it gives up, rather than forever (`-w` alone).
pub const LOCK_WAIT: &str = "5";

/// A command that failed or could not be run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot run {program}: {source} (is it installed and on PATH?)")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{program} {args} failed ({status}): {stderr}")]
    Failed {
        program: String,
        args: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
    /// It ran longer than its timeout and was killed.
    #[error("{program} {args} did not finish within {timeout:?} and was killed")]
    Timeout {
        program: String,
        args: String,
        timeout: Duration,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Run `program args` with `input` on stdin, within [`TIMEOUT`]; its
/// stdout on success.
///
/// # Errors
/// It cannot be started, exits non-zero (with its stderr), or times out.
pub async fn run(program: &str, args: &[&str], input: &str) -> Result<String> {
    run_within(program, args, input, TIMEOUT).await
}

/// [`run`] with its own timeout.
///
/// # Errors
/// As [`run`]; [`Error::Timeout`] once `timeout` has passed (the program
/// has then been killed and reaped).
pub async fn run_within(
    program: &str,
    args: &[&str],
    input: &str,
    timeout: Duration,
) -> Result<String> {
    let spawn_err = |source| Error::Spawn {
        program: program.to_string(),
        source,
    };
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(spawn_err)?;
    let mut stdin = child.stdin.take();
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    // Feeding stdin, draining both outputs and waiting happen together and
    // under the timeout: a program that stops reading its input (or whose
    // output fills the pipe) must not block us past it.
    let talk = async {
        let feed = async {
            if let Some(mut w) = stdin.take() {
                // A write error means the program exited early; its status
                // and stderr say why.
                let _ = w.write_all(input.as_bytes()).await;
            }
        };
        let (_, out, err, status) = tokio::join!(
            feed,
            read_all(stdout.as_mut()),
            read_all(stderr.as_mut()),
            child.wait()
        );
        (out, err, status)
    };
    // Bound first, so that the borrows of `child` end before a kill.
    let talked = tokio::time::timeout(timeout, talk).await;
    let (out, err, status) = match talked {
        Ok(r) => r,
        Err(_) => {
            // SIGKILL and reap: nothing is left behind.
            let _ = child.kill().await;
            return Err(Error::Timeout {
                program: program.to_string(),
                args: args.join(" "),
                timeout,
            });
        }
    };
    let status = status.map_err(spawn_err)?;
    if status.success() {
        return Ok(String::from_utf8_lossy(&out).into_owned());
    }
    let mut stderr = String::from_utf8_lossy(&err).trim().to_string();
    // A failing statement inside a 10,000-service script is quoted with
    // its whole line: keep the message, not megabytes of elements.
    if stderr.len() > 4096 {
        let mut cut = 4096;
        while !stderr.is_char_boundary(cut) {
            cut -= 1;
        }
        stderr.truncate(cut);
        stderr.push_str(" ...");
    }
    Err(Error::Failed {
        program: program.to_string(),
        args: args.join(" "),
        status,
        stderr,
    })
}

async fn read_all<R: tokio::io::AsyncRead + Unpin>(r: Option<&mut R>) -> Vec<u8> {
    let mut buf = Vec::new();
    if let Some(r) = r {
        let _ = r.read_to_end(&mut buf).await;
    }
    buf
}

/// Load an nftables script as one transaction (`nft -f -`).
///
/// # Errors
/// As [`run`].
pub async fn nft(script: &str) -> Result<String> {
    run("nft", &["-f", "-"], script).await
}

/// Load `iptables-restore` input into the chains it names, leaving the
/// others as they are (`--noflush`).
///
/// # Errors
/// As [`run`].
pub async fn iptables_restore(input: &str) -> Result<String> {
    run("iptables-restore", &["-w", LOCK_WAIT, "--noflush"], input).await
}

/// Whether `program` can be run at all (`--version`, within a few
/// seconds).
pub async fn available(program: &str) -> bool {
    run_within(program, &["--version"], "", PROBE_TIMEOUT)
        .await
        .is_ok()
}

/// Run `attempt` until it fails, at most `max` times; how many times it
/// succeeded. For "delete every copy of this rule": a copy is removed per
/// success, and a tool that answers success forever (a wrapper, a fake)
/// must not keep the caller looping.
pub async fn repeat_while_ok<F, Fut, T, E>(max: usize, mut attempt: F) -> usize
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::result::Result<T, E>>,
{
    let mut n = 0;
    while n < max && attempt().await.is_ok() {
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn output_and_failures() {
        let out = run("sh", &["-c", "cat; echo done"], "in\n").await.unwrap();
        assert_eq!(out, "in\ndone\n");
        let err = run("sh", &["-c", "echo bad >&2; exit 3"], "")
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::Failed { stderr, .. } if stderr == "bad"),
            "{err}"
        );
        let err = run("skiff-no-such-tool", &[], "").await.unwrap_err();
        assert!(matches!(err, Error::Spawn { .. }), "{err}");
        assert!(!available("skiff-no-such-tool").await);
    }

    #[tokio::test]
    async fn a_command_that_hangs_is_killed_after_its_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        let script = format!("echo $$ > {}; exec sleep 30", pid_file.display());
        let started = std::time::Instant::now();
        let err = run_within("sh", &["-c", &script], "", Duration::from_millis(300))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Timeout { .. }), "{err}");
        assert!(err.to_string().contains("did not finish within"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10));
        // Killed and reaped: no process, not even a zombie, is left.
        let pid = std::fs::read_to_string(&pid_file).unwrap();
        let proc = std::path::Path::new("/proc").join(pid.trim());
        assert!(!proc.exists(), "process {} is still there", pid.trim());
    }

    #[tokio::test]
    async fn a_command_that_never_reads_its_input_times_out_too() {
        // More than a pipe holds: the write blocks until the timeout.
        let input = "x".repeat(4 << 20);
        let err = run_within("sleep", &["30"], &input, Duration::from_millis(300))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Timeout { .. }), "{err}");
    }

    #[tokio::test]
    async fn repeating_stops_at_the_first_failure_or_the_bound() {
        let mut left = 3;
        let n = repeat_while_ok(100, || {
            left -= 1;
            let r = if left >= 0 { Ok(()) } else { Err(()) };
            async move { r }
        })
        .await;
        assert_eq!(n, 3);
        let forever = repeat_while_ok(5, || async { Ok::<(), ()>(()) }).await;
        assert_eq!(forever, 5);
    }
}
