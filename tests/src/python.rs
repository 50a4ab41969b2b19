//! The official Python `kubernetes` client, as the client-compatibility
//! tests run it: scripts from `tests/python/` in the virtualenv that
//! `scripts/test-deps.sh` installs (version pinned in
//! `tests/python/requirements.txt`), against a cluster's admin kubeconfig.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::cluster::Cluster;

/// The interpreter of the test virtualenv.
pub const PYTHON: &str = "/opt/skiff-test/venv/bin/python";
/// How long one script may run.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(180);

/// `tests/python/<name>`.
fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("python")
        .join(name)
}

/// Runs `tests/python/<name>` with `args` against `cluster` as admin.
///
/// # Errors
/// The virtualenv is missing (run `scripts/test-deps.sh`), the script
/// could not be run or timed out; its exit status is the caller's to
/// judge.
pub async fn run(cluster: &Cluster, name: &str, args: &[&str]) -> Result<Output> {
    if !Path::new(PYTHON).exists() {
        bail!("{PYTHON} is missing: run scripts/test-deps.sh");
    }
    let child = tokio::process::Command::new(PYTHON)
        .arg(script(name))
        .args(args)
        .env("KUBECONFIG", cluster.admin_kubeconfig())
        .env("HOME", cluster.dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("running {name}"))?;
    match tokio::time::timeout(SCRIPT_TIMEOUT, child.wait_with_output()).await {
        Ok(out) => Ok(out?),
        Err(_) => bail!("{name} did not finish in {SCRIPT_TIMEOUT:?}"),
    }
}

/// [`run`] that must exit 0; returns its stdout.
///
/// # Errors
/// As [`run`], and a non-zero exit (the error carries stderr).
pub async fn run_ok(cluster: &Cluster, name: &str, args: &[&str]) -> Result<String> {
    let out = run(cluster, name, args).await?;
    if !out.status.success() {
        bail!(
            "{name} {args:?} exited {:?}\nstdout: {}\nstderr: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
