//! Running `nft`, `iptables` and `iptables-restore` with a script on
//! standard input, as kube-proxy does. Their error output is kept whole:
//! it names the offending line, which is what an operator needs.

use std::process::Stdio;

use tokio::io::AsyncWriteExt;

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
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Run `program args` with `input` on stdin; its stdout on success.
///
/// # Errors
/// It cannot be started, or exits non-zero (with its stderr).
pub async fn run(program: &str, args: &[&str], input: &str) -> Result<String> {
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
    if let Some(mut stdin) = child.stdin.take() {
        // A write error means the program exited early; its status and
        // stderr below say why.
        let _ = stdin.write_all(input.as_bytes()).await;
    }
    let out = child.wait_with_output().await.map_err(spawn_err)?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    let mut stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
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
        status: out.status,
        stderr,
    })
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
    run("iptables-restore", &["-w", "--noflush"], input).await
}

/// Whether `program` can be run at all (`--version`).
pub async fn available(program: &str) -> bool {
    tokio::process::Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await
        .is_ok_and(|s| s.success())
}
