//! The node's upstream resolvers, for every name outside the cluster
//! domain: read from resolv.conf and re-read as it changes, tried in turn
//! with a timeout each, over UDP with a TCP retry when the answer was
//! truncated.
//!
//! The agent forwards from the host's network namespace, so a host
//! resolver on loopback (systemd-resolved's 127.0.0.53) is reachable here,
//! unlike from a pod: the host's own /etc/resolv.conf is the right input.

use std::net::{IpAddr, SocketAddr, SocketAddrV6};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use hickory_server::net::runtime::TokioRuntimeProvider;
use hickory_server::net::tcp::TcpClientStream;
use hickory_server::net::udp::UdpClientStream;
use hickory_server::net::xfer::DnsExchange;
use hickory_server::net::{DnsHandle, NetError};
use hickory_server::proto::op::{DnsRequest, DnsRequestOptions, Message, Query, ResponseCode};
use tokio::sync::watch;

/// Resolvers listen on 53: resolv.conf has no way to say otherwise.
pub const DNS_PORT: u16 = 53;

/// Why one upstream gave no usable answer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No answer within the timeout.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The exchange failed (network error, malformed answer).
    #[error("{0}")]
    Exchange(#[from] NetError),
    /// The exchange ended without an answer.
    #[error("no response")]
    NoResponse,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The resolvers named in resolv.conf `content` (port 53, IPv6 scopes
/// resolved to interface indexes), without those that are the DNS server
/// itself at `listen`: forwarding to them would loop. Returns the usable
/// ones and the skipped ones.
pub fn nameservers(content: &[u8], listen: &[SocketAddr]) -> (Vec<SocketAddr>, Vec<SocketAddr>) {
    // Best effort, like glibc: an option this parser does not know must
    // not cost the node its nameservers.
    let (config, _errors) = resolv_conf::Config::parse_with_errors(content);
    let all = config.nameservers.iter().map(|ns| match ns {
        resolv_conf::ScopedIp::V6(ip, Some(scope)) => {
            let scope = scope
                .parse()
                .ok()
                .or_else(|| nix::net::if_::if_nametoindex(scope.as_str()).ok())
                .unwrap_or(0);
            SocketAddr::V6(SocketAddrV6::new(*ip, DNS_PORT, 0, scope))
        }
        ns => SocketAddr::new(IpAddr::from(ns), DNS_PORT),
    });
    all.partition(|ns| !would_loop(*ns, listen))
}

/// Whether a query sent to `upstream` would come back to a server
/// listening on `listen`: the same address, or any loopback address when
/// the server listens on all addresses of the port.
pub fn would_loop(upstream: SocketAddr, listen: &[SocketAddr]) -> bool {
    let ip = upstream.ip().to_canonical();
    listen.iter().any(|l| {
        l.port() == upstream.port()
            && (l.ip().to_canonical() == ip || (l.ip().is_unspecified() && ip.is_loopback()))
    })
}

/// One upstream resolver.
struct Upstream {
    addr: SocketAddr,
    /// UDP exchange; every request goes out from a fresh random port.
    udp: DnsExchange<TokioRuntimeProvider>,
    /// Whether its last exchange failed: failures are logged when it
    /// starts and stops failing, not once per query.
    failing: AtomicBool,
}

/// The current upstreams, replaced as a whole when resolv.conf changes.
type Set = Arc<Vec<Upstream>>;

/// Sends queries to the upstreams.
pub struct Forwarder {
    /// From the resolv.conf watcher (the loop [`Forwarder::new`] returns).
    upstreams: watch::Receiver<Set>,
    timeout: Duration,
    /// Index of the upstream that answered last: tried first, so a dead
    /// first nameserver costs one timeout, not one per query.
    preferred: AtomicUsize,
    /// Owns the exchanges' background tasks (hickory keeps them in the
    /// provider's task set): they live as long as the forwarder.
    provider: TokioRuntimeProvider,
}

impl Forwarder {
    /// A forwarder over the nameservers in `resolv_conf` (read now), and
    /// the loop that re-reads it every `reload` to run beside it (until
    /// dropped). `listen` are the DNS server's own addresses: skipped, with
    /// a warning. An unreadable file keeps the last list. Each upstream
    /// gets `timeout`.
    pub async fn new(
        resolv_conf: PathBuf,
        listen: Vec<SocketAddr>,
        timeout: Duration,
        reload: Duration,
    ) -> (Forwarder, impl std::future::Future<Output = ()>) {
        let provider = TokioRuntimeProvider::new();
        let mut watch = Watch {
            provider: provider.clone(),
            path: resolv_conf,
            listen,
            timeout,
            current: None,
            unreadable: false,
        };
        let (tx, rx) = watch::channel(watch.read().await.unwrap_or_default());
        let run = async move {
            let mut tick = tokio::time::interval(reload);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                if let Some(set) = watch.read().await {
                    let _ = tx.send(set);
                }
            }
        };
        let forwarder = Forwarder {
            upstreams: rx,
            timeout,
            preferred: AtomicUsize::new(0),
            provider,
        };
        (forwarder, run)
    }

    /// The upstream answer to `query`, trying each upstream in turn from
    /// the one that answered last. SERVFAIL and REFUSED from one upstream
    /// move on to the next (as glibc does); the last such answer is
    /// returned if no upstream did better. `None` when no upstream
    /// answered at all.
    pub async fn forward(
        &self,
        query: &Query,
        recursion_desired: bool,
        dnssec_ok: bool,
    ) -> Option<Message> {
        let upstreams = self.upstreams.borrow().clone();
        let n = upstreams.len();
        let first = self.preferred.load(Ordering::Relaxed);
        let mut fallback = None;
        for i in (0..n).map(|k| (first + k) % n) {
            let upstream = &upstreams[i];
            match self
                .exchange(upstream, query, recursion_desired, dnssec_ok)
                .await
            {
                Ok(answer) => {
                    if upstream.failing.swap(false, Ordering::Relaxed) {
                        tracing::info!(upstream = %upstream.addr, "upstream resolver answers again");
                    }
                    if matches!(
                        answer.metadata.response_code,
                        ResponseCode::ServFail | ResponseCode::Refused
                    ) {
                        fallback = Some(answer);
                        continue;
                    }
                    self.preferred.store(i, Ordering::Relaxed);
                    return Some(answer);
                }
                Err(error) => {
                    if !upstream.failing.swap(true, Ordering::Relaxed) {
                        tracing::warn!(upstream = %upstream.addr, %error, "upstream resolver failed; trying the others");
                    }
                }
            }
        }
        fallback
    }

    /// One query to one upstream: UDP, then TCP if the answer was cut.
    async fn exchange(
        &self,
        upstream: &Upstream,
        query: &Query,
        recursion_desired: bool,
        dnssec_ok: bool,
    ) -> Result<Message> {
        let mut options = DnsRequestOptions::default();
        options.recursion_desired = recursion_desired;
        options.edns_set_dnssec_ok = dnssec_ok;
        let request = DnsRequest::from_query(query.clone(), options);
        let answer = first(&upstream.udp, request.clone(), self.timeout).await?;
        if !answer.metadata.truncation {
            return Ok(answer);
        }
        let tcp = async {
            let exchange = TcpClientStream::exchange(
                upstream.addr,
                None,
                self.timeout,
                None,
                self.provider.clone(),
            )
            .await?;
            first(&exchange, request, self.timeout).await
        };
        tokio::time::timeout(self.timeout, tcp)
            .await
            .map_err(|_| Error::Timeout(self.timeout))?
    }
}

/// The first answer to `request` on `exchange`.
async fn first(
    exchange: &DnsExchange<TokioRuntimeProvider>,
    request: DnsRequest,
    timeout: Duration,
) -> Result<Message> {
    let mut responses = exchange.send(request);
    match tokio::time::timeout(timeout, responses.next()).await {
        Err(_) => Err(Error::Timeout(timeout)),
        Ok(None) => Err(Error::NoResponse),
        Ok(Some(Err(NetError::Timeout))) => Err(Error::Timeout(timeout)),
        Ok(Some(Err(e))) => Err(e.into()),
        Ok(Some(Ok(response))) => Ok(response.into_message()),
    }
}

/// Reads resolv.conf for [`Forwarder`].
struct Watch {
    provider: TokioRuntimeProvider,
    path: PathBuf,
    listen: Vec<SocketAddr>,
    timeout: Duration,
    /// The nameservers last published.
    current: Option<Vec<SocketAddr>>,
    /// Whether the last read failed (logged once until it succeeds).
    unreadable: bool,
}

impl Watch {
    /// The new upstream set if the file names other nameservers than last time.
    async fn read(&mut self) -> Option<Set> {
        let content = match tokio::fs::read(&self.path).await {
            Ok(content) => content,
            Err(error) => {
                if !std::mem::replace(&mut self.unreadable, true) {
                    tracing::warn!(path = %self.path.display(), %error,
                        "cannot read resolv.conf; names outside the cluster domain fail until it can be read");
                }
                return None;
            }
        };
        self.unreadable = false;
        let (usable, skipped) = nameservers(&content, &self.listen);
        if self.current.as_ref() == Some(&usable) {
            return None;
        }
        log_change(&self.path, &usable, &skipped);
        let set = usable
            .iter()
            .map(|&addr| Upstream {
                addr,
                udp: UdpClientStream::builder(addr, self.provider.clone())
                    .with_timeout(Some(self.timeout))
                    .exchange(),
                failing: AtomicBool::new(false),
            })
            .collect();
        self.current = Some(usable);
        Some(Arc::new(set))
    }
}

fn log_change(path: &Path, usable: &[SocketAddr], skipped: &[SocketAddr]) {
    if !skipped.is_empty() {
        tracing::warn!(path = %path.display(), ?skipped,
            "resolv.conf names the cluster DNS server itself; skipping it to avoid a forwarding loop");
    }
    if usable.is_empty() {
        tracing::warn!(path = %path.display(), "resolv.conf names no usable nameserver; names outside the cluster domain fail");
    } else {
        tracing::info!(path = %path.display(), upstreams = ?usable, "upstream resolvers");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn nameservers_are_read_in_order_on_port_53() {
        let conf = b"# generated\nsearch example.org\nnameserver 192.0.2.1\nnameserver 2001:db8::1\noptions ndots:2 edns0 trust-ad\nnameserver 192.0.2.2\n";
        let (usable, skipped) = nameservers(conf, &[]);
        assert_eq!(
            usable,
            vec![
                addr("192.0.2.1:53"),
                addr("[2001:db8::1]:53"),
                addr("192.0.2.2:53")
            ]
        );
        assert!(skipped.is_empty());
    }

    #[test]
    fn unknown_lines_do_not_lose_the_nameservers() {
        let conf = b"nameserver 192.0.2.1\nfrobnicate yes\noptions no-such-option\n";
        assert_eq!(nameservers(conf, &[]).0, vec![addr("192.0.2.1:53")]);
    }

    #[test]
    fn scoped_ipv6_nameserver_keeps_its_numeric_scope() {
        let (usable, _) = nameservers(b"nameserver fe80::1%7\n", &[]);
        let SocketAddr::V6(v6) = usable[0] else {
            panic!("not v6: {usable:?}")
        };
        assert_eq!(v6.scope_id(), 7);
    }

    #[test]
    fn own_listen_address_is_skipped() {
        let conf = b"nameserver 198.18.0.1\nnameserver 192.0.2.1\n";
        let (usable, skipped) = nameservers(conf, &[addr("198.18.0.1:53")]);
        assert_eq!(usable, vec![addr("192.0.2.1:53")]);
        assert_eq!(skipped, vec![addr("198.18.0.1:53")]);
    }

    #[test]
    fn loops_only_on_the_same_port() {
        assert!(!would_loop(
            addr("198.18.0.1:53"),
            &[addr("198.18.0.1:5353")]
        ));
        assert!(would_loop(addr("198.18.0.1:53"), &[addr("198.18.0.1:53")]));
        // All addresses of the port: loopback resolvers would be the server.
        assert!(would_loop(addr("127.0.0.53:53"), &[addr("0.0.0.0:53")]));
        assert!(!would_loop(addr("192.0.2.1:53"), &[addr("0.0.0.0:53")]));
        // An IPv4-mapped listen address is the same address.
        assert!(would_loop(
            addr("198.18.0.1:53"),
            &[addr("[::ffff:198.18.0.1]:53")]
        ));
    }
}
