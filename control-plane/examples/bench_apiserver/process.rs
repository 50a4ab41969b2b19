//! The processes a benchmark starts (shared with `bench_watch_cache`).

use std::process::Child;

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
