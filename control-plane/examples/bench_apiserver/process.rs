//! The processes a benchmark starts (shared with `bench_watch_cache`).

use std::path::{Path, PathBuf};
use std::process::Child;

use anyhow::{bail, Context};

/// Kills the process on drop.
pub struct ServerProc(pub Child);

impl Drop for ServerProc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The skiff-server binary: `given`, else the one in the target directory
/// this example was built into.
pub fn server_bin(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    let bin = match given {
        Some(b) => b.to_path_buf(),
        None => std::env::current_exe()?
            .parent()
            .and_then(|p| p.parent())
            .context("locating the target dir")?
            .join("skiff-server"),
    };
    if !bin.exists() {
        bail!("{} not found: build it with `cargo build --release -p skiff-control-plane --bin skiff-server` or pass --server-bin", bin.display());
    }
    Ok(bin)
}
