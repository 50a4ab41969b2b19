//! Stale UDP conntrack entries, cleared after a sync as upstream does.
//! UDP has no connection to end: a client sending to a service keeps its
//! conntrack entry (and the DNAT decided on its first packet) as long as
//! it keeps sending. So when an endpoint goes, its entries must go with
//! it; and when a service that had no endpoint gets one, the entries
//! made while it had none (which bound its packets to nothing) must go
//! too, or a DNS client retrying every second never reaches the new pod.
//! TCP needs none of this: a dead endpoint resets, a refused SYN leaves
//! no established entry.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use super::model::{Endpoint, Protocol, ServicePort, ServicePortName, Targets};
use super::Change;

/// One `conntrack -D` filter.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Flush {
    /// Entries to a service destination (`--orig-dst` / `--orig-port-dst`;
    /// no address for node ports, which any local address takes).
    Destination { ip: Option<Ipv4Addr>, port: u16 },
    /// Entries DNATed to a removed endpoint.
    Endpoint { ip: Ipv4Addr, port: u16 },
}

impl Flush {
    /// The `conntrack` arguments.
    pub fn args(&self) -> Vec<String> {
        let mut a: Vec<String> = ["-D", "-p", "udp"].map(String::from).into();
        match self {
            Flush::Destination { ip, port } => {
                if let Some(ip) = ip {
                    a.extend(["--orig-dst".into(), ip.to_string()]);
                }
                a.extend(["--orig-port-dst".into(), port.to_string()]);
            }
            Flush::Endpoint { ip, port } => {
                a.extend(["--dst-nat".into(), format!("{ip}:{port}")]);
            }
        }
        a
    }
}

/// What the last applied sync knew of each UDP service port.
#[derive(Debug, Default)]
pub struct Tracker {
    known: BTreeMap<ServicePortName, (ServicePort, Targets)>,
}

fn usable(t: &Targets) -> BTreeSet<&Endpoint> {
    t.cluster.iter().chain(&t.local).collect()
}

fn destinations(svc: &ServicePort) -> Vec<Flush> {
    let mut out = vec![Flush::Destination {
        ip: Some(svc.cluster_ip),
        port: svc.port,
    }];
    out.extend(svc.external_ips.iter().map(|ip| Flush::Destination {
        ip: Some(*ip),
        port: svc.port,
    }));
    if svc.node_port != 0 {
        out.push(Flush::Destination {
            ip: None,
            port: svc.node_port,
        });
    }
    out
}

impl Tracker {
    /// Record what a partial sync applied; the flushes it calls for.
    pub fn changed(&mut self, changes: &[Change]) -> BTreeSet<Flush> {
        let mut flush = BTreeSet::new();
        for change in changes {
            let mut gone = change.known_ports(&self.known);
            gone.retain(|n| !change.ports.iter().any(|(s, _)| &s.name == n));
            for name in gone {
                if let Some((_, old)) = self.known.remove(&name) {
                    flush.extend(usable(&old).iter().map(|e| Flush::Endpoint {
                        ip: e.ip,
                        port: e.port,
                    }));
                }
            }
            for (svc, targets) in &change.ports {
                if svc.name.protocol != Protocol::Udp {
                    continue;
                }
                let now = usable(targets);
                match self.known.get(&svc.name) {
                    Some((_, old)) => {
                        let before = usable(old);
                        flush.extend(before.difference(&now).map(|e| Flush::Endpoint {
                            ip: e.ip,
                            port: e.port,
                        }));
                        if before.is_empty() && !now.is_empty() {
                            flush.extend(destinations(svc));
                        }
                    }
                    // New to us: entries made before it had rules are stale.
                    None if !now.is_empty() => flush.extend(destinations(svc)),
                    None => {}
                }
                self.known
                    .insert(svc.name.clone(), (svc.clone(), targets.clone()));
            }
        }
        flush
    }

    /// Record what a full sync applied: the endpoints known before and
    /// gone now are flushed, and the destinations of services new since.
    /// The first full sync after a start flushes nothing: what flows
    /// exist is unknown, and flushing all would disturb the live ones.
    pub fn replaced(&mut self, all: &[(ServicePort, Targets)]) -> BTreeSet<Flush> {
        let old = std::mem::take(&mut self.known);
        let first = old.is_empty();
        let mut flush = BTreeSet::new();
        for (svc, targets) in all {
            if svc.name.protocol != Protocol::Udp {
                continue;
            }
            let now = usable(targets);
            if let Some((_, before)) = old.get(&svc.name) {
                flush.extend(usable(before).difference(&now).map(|e| Flush::Endpoint {
                    ip: e.ip,
                    port: e.port,
                }));
            } else if !now.is_empty() && !first {
                flush.extend(destinations(svc));
            }
            self.known
                .insert(svc.name.clone(), (svc.clone(), targets.clone()));
        }
        for (name, (_, before)) in &old {
            if !self.known.contains_key(name) {
                flush.extend(usable(before).iter().map(|e| Flush::Endpoint {
                    ip: e.ip,
                    port: e.port,
                }));
            }
        }
        flush
    }
}

/// How long one `conntrack -D` may take: it runs inside the sync loop.
const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Run the flushes; `conntrack` exits 1 when nothing matched, which is
/// fine. Failures are logged (the tool may be missing), never fatal.
pub async fn apply(flushes: &BTreeSet<Flush>) {
    for f in flushes {
        let args = f.args();
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        match super::exec::run_within("conntrack", &refs, "", TIMEOUT).await {
            Ok(_) => {}
            Err(super::exec::Error::Failed { stderr, .. }) if stderr.contains("0 flow entries") => {
            }
            Err(e) => {
                tracing::warn!("clearing stale UDP conntrack entries: {e}");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dns(eps: &[u8]) -> (ServicePort, Targets) {
        let name = ServicePortName::new("kube-system", "dns", "dns", Protocol::Udp);
        let svc = ServicePort::cluster_ip(name, Ipv4Addr::new(198, 19, 0, 10), 53);
        let t = Targets::of(
            eps.iter()
                .map(|l| Endpoint::ready(Ipv4Addr::new(198, 18, 0, *l), 5353, false))
                .collect(),
        );
        (svc, t)
    }

    fn change(p: (ServicePort, Targets)) -> Change {
        Change {
            namespace: "kube-system".into(),
            name: "dns".into(),
            ports: vec![p],
        }
    }

    #[test]
    fn flushes_what_upstream_flushes() {
        let mut t = Tracker::default();
        // No endpoints yet: nothing to flush.
        assert!(t.changed(&[change(dns(&[]))]).is_empty());
        // First endpoint: the destination's entries are stale.
        let f = t.changed(&[change(dns(&[10]))]);
        assert_eq!(
            f.iter().map(|f| f.args().join(" ")).collect::<Vec<_>>(),
            ["-D -p udp --orig-dst 198.19.0.10 --orig-port-dst 53"]
        );
        // An endpoint replaced: the old one's entries go.
        let f = t.changed(&[change(dns(&[11]))]);
        assert_eq!(
            f.iter().map(|f| f.args().join(" ")).collect::<Vec<_>>(),
            ["-D -p udp --dst-nat 198.18.0.10:5353"]
        );
        // The service deleted: its endpoints' entries go.
        let gone = Change {
            namespace: "kube-system".into(),
            name: "dns".into(),
            ports: Vec::new(),
        };
        assert_eq!(t.changed(&[gone]).len(), 1);
        // The first full sync after a start leaves live flows alone; a
        // later one flushes what changed.
        let mut fresh = Tracker::default();
        assert!(fresh.replaced(&[dns(&[12])]).is_empty());
        let f = fresh.replaced(&[dns(&[13])]);
        assert_eq!(
            f.iter().map(|f| f.args().join(" ")).collect::<Vec<_>>(),
            ["-D -p udp --dst-nat 198.18.0.12:5353"]
        );
    }
}
