//! TCP probes (upstream `probe/tcp`): a connection that opens within the
//! timeout succeeds. The socket is closed with a zero linger (a reset), as
//! upstream's probe dialer does, so frequent probes leave no TIME_WAIT
//! sockets behind.

use std::time::Duration;

use tokio::net::TcpStream;

use super::Verdict;

/// Connect to `host:port` within `timeout`.
pub async fn probe(host: &str, port: u16, timeout: Duration) -> Verdict {
    let addr = super::port::join_host_port(host, port);
    match tokio::time::timeout(timeout, TcpStream::connect(&addr)).await {
        Ok(Ok(s)) => {
            let _ = s.set_zero_linger();
            Verdict::Success(String::new())
        }
        // Errors are failures, as upstream: the output says why.
        Ok(Err(e)) => Verdict::Failure(format!("dial tcp {addr}: connect: {}", go_io_error(&e))),
        Err(_) => Verdict::Failure(format!("dial tcp {addr}: i/o timeout")),
    }
}

/// An I/O error in Go's words (`connection refused`), so probe output
/// reads as users know it from upstream.
pub fn go_io_error(e: &std::io::Error) -> String {
    use std::io::ErrorKind::*;
    match e.kind() {
        ConnectionRefused => "connection refused".into(),
        ConnectionReset => "connection reset by peer".into(),
        HostUnreachable => "no route to host".into(),
        NetworkUnreachable => "network is unreachable".into(),
        TimedOut => "i/o timeout".into(),
        _ => {
            let s = e.to_string();
            let s = s.split(" (os error").next().unwrap_or(&s).to_string();
            let mut c = s.chars();
            match c.next() {
                Some(f) => f.to_lowercase().chain(c).collect(),
                None => s,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn open_and_closed_ports() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let t = Duration::from_secs(1);
        assert_eq!(
            probe("127.0.0.1", port, t).await,
            Verdict::Success(String::new())
        );
        drop(l);
        assert_eq!(
            probe("127.0.0.1", port, t).await,
            Verdict::Failure(format!(
                "dial tcp 127.0.0.1:{port}: connect: connection refused"
            ))
        );
    }
}
