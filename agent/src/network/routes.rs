//! Routes to the other nodes' pod CIDRs through their node addresses, in
//! the style of flannel's host-gw backend: a pod on node A reaches a pod
//! on node B directly, with no tunnel, as long as the nodes share a link.
//!
//! The routes carry a protocol number of the agent's own, so that it can
//! tell them from everyone else's: it adds what is missing, replaces what
//! is wrong and deletes what is stale among its own, and never touches
//! another route. The same loop keeps the pod CIDRs of the
//! [`masquerade`](super::masquerade) table current.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::runtime::WatchStreamExt;
use kube::Api;
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteProtocol};
use rtnetlink::RouteMessageBuilder;

use super::Cidr;

/// The `proto` of the agent's routes (`ip route show proto 88`).
pub const ROUTE_PROTOCOL: u8 = 88;
/// RT_TABLE_MAIN.
const MAIN_TABLE: u8 = 254;
/// Routes are checked this often even without a Node change, repairing
/// any that someone deleted.
const RESYNC: Duration = Duration::from_secs(30);

/// Failures programming routes.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot open a route netlink socket: {0}")]
    Socket(#[source] std::io::Error),
    #[error("listing routes: {0}")]
    List(#[source] rtnetlink::Error),
    #[error("route to {cidr} via {via} (node {node}): {source} (host-gw routing needs the nodes on one link)")]
    Add {
        cidr: String,
        via: Ipv4Addr,
        node: String,
        #[source]
        source: rtnetlink::Error,
    },
    #[error("deleting stale route to {cidr}: {source}")]
    Delete {
        cidr: String,
        #[source]
        source: rtnetlink::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A route the agent wants: where the CIDR's node is, and which node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Via {
    pub gateway: Ipv4Addr,
    pub node: String,
}

fn parse_cidr(s: &str) -> Option<Cidr> {
    let (ip, len) = s.split_once('/')?;
    let ip: Ipv4Addr = ip.parse().ok()?;
    let len: u8 = len.parse().ok().filter(|l| *l <= 32)?;
    let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
    Some((Ipv4Addr::from(u32::from(ip) & mask), len))
}

/// The routes this node needs: every other node's IPv4 pod CIDRs through
/// its first InternalIP. Nodes without either are skipped.
pub fn desired(nodes: &[std::sync::Arc<Node>], me: &str) -> BTreeMap<Cidr, Via> {
    let mut out = BTreeMap::new();
    for node in nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        if name == me {
            continue;
        }
        let Some(gateway) = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .and_then(|a| {
                a.iter()
                    .filter(|a| a.type_ == "InternalIP")
                    .find_map(|a| a.address.parse::<Ipv4Addr>().ok())
            })
        else {
            continue;
        };
        let spec = node.spec.as_ref();
        let cidrs = spec
            .and_then(|s| s.pod_cidrs.clone())
            .filter(|c| !c.is_empty())
            .or_else(|| spec.and_then(|s| s.pod_cidr.clone()).map(|c| vec![c]))
            .unwrap_or_default();
        for cidr in cidrs.iter().filter_map(|c| parse_cidr(c)) {
            out.insert(
                cidr,
                Via {
                    gateway,
                    node: name.clone(),
                },
            );
        }
    }
    out
}

/// Every node's IPv4 pod CIDRs, and this node's own (first) one.
pub fn pod_cidrs(nodes: &[std::sync::Arc<Node>], me: &str) -> (Option<Cidr>, Vec<Cidr>) {
    let mut all = Vec::new();
    let mut mine = None;
    for node in nodes {
        let spec = node.spec.as_ref();
        let cidrs: Vec<Cidr> = spec
            .and_then(|s| s.pod_cidrs.clone())
            .filter(|c| !c.is_empty())
            .or_else(|| spec.and_then(|s| s.pod_cidr.clone()).map(|c| vec![c]))
            .unwrap_or_default()
            .iter()
            .filter_map(|c| parse_cidr(c))
            .collect();
        if node.metadata.name.as_deref() == Some(me) {
            mine = cidrs.first().copied();
        }
        all.extend(cidrs);
    }
    all.sort();
    all.dedup();
    (mine, all)
}

/// Keeps the routes in step with the Nodes.
pub struct Routes {
    client: kube::Client,
    node_name: String,
}

impl Routes {
    pub fn new(client: kube::Client, node_name: &str) -> Routes {
        Routes {
            client,
            node_name: node_name.to_string(),
        }
    }

    /// Watch Nodes and reconcile the routes until `stop` turns true.
    /// Failures are logged once per distinct message and retried.
    pub async fn run(self, mut stop: tokio::sync::watch::Receiver<bool>) {
        let (conn, handle, _) = match rtnetlink::new_connection() {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(
                    "{}; pod routes to other nodes are not managed",
                    Error::Socket(e)
                );
                return;
            }
        };
        let conn = tokio::spawn(conn);
        // Forwarding between the pod bridge and the node's link.
        if let Err(e) = std::fs::write("/proc/sys/net/ipv4/ip_forward", "1") {
            tracing::warn!(
                "cannot enable IPv4 forwarding: {e}; pods on other nodes may be unreachable"
            );
        }
        let (store, writer): (Store<Node>, _) = reflector::store();
        let events = reflector::reflector(
            writer,
            watcher::watcher(Api::<Node>::all(self.client), watcher::Config::default())
                .default_backoff(),
        );
        let mut events = std::pin::pin!(events);
        let mut last_error = String::new();
        let mut applied = BTreeMap::new();
        // The masquerade table last written: (this node's CIDR, all).
        let mut masq_applied: Option<(Cidr, Vec<Cidr>)> = None;
        let mut masq_error = String::new();
        let mut tick = tokio::time::interval(RESYNC);
        // Set once the first list is complete: before, a missing node
        // would look deleted and its route be removed.
        let mut listed = false;
        loop {
            let mut resync = false;
            tokio::select! {
                r = stop.wait_for(|s| *s) => { let _ = r; break }
                ev = events.next() => match ev {
                    None => break,
                    Some(Err(_)) => continue,
                    Some(Ok(watcher::Event::Init | watcher::Event::InitApply(_))) => continue,
                    Some(Ok(watcher::Event::InitDone)) => listed = true,
                    Some(Ok(_)) => {}
                },
                _ = tick.tick() => resync = true,
            }
            if !listed {
                continue;
            }
            let nodes = store.state();
            if let (Some(local), all) = pod_cidrs(&nodes, &self.node_name) {
                let masq = (local, all);
                if masq_applied.as_ref() != Some(&masq) || resync {
                    let script = super::masquerade::script(masq.0, &masq.1);
                    match skiff_proxy::exec::nft(&script).await {
                        Ok(_) => {
                            masq_error.clear();
                            masq_applied = Some(masq);
                        }
                        Err(e) => {
                            let msg = e.to_string();
                            if msg != masq_error {
                                tracing::error!(
                                    "masquerade of pod traffic leaving the pod network: {msg}"
                                );
                            }
                            masq_error = msg;
                        }
                    }
                }
            }
            let want = desired(&nodes, &self.node_name);
            if want == applied && !resync {
                continue;
            }
            match reconcile(&handle, &want).await {
                Ok(changed) => {
                    if changed > 0 {
                        tracing::info!(
                            routes = want.len(),
                            changed,
                            "pod routes to other nodes updated"
                        );
                    }
                    last_error.clear();
                    applied = want;
                }
                Err(errors) => {
                    let msg = errors
                        .iter()
                        .map(|e| e.to_string())
                        .collect::<Vec<_>>()
                        .join("; ");
                    if msg != last_error {
                        tracing::error!("pod routes: {msg}");
                    }
                    last_error = msg;
                    applied.clear();
                }
            }
        }
        conn.abort();
    }
}

fn dst_of(r: &RouteMessage) -> Option<Cidr> {
    let len = r.header.destination_prefix_length;
    r.attributes.iter().find_map(|a| match a {
        RouteAttribute::Destination(RouteAddress::Inet(ip)) => Some((*ip, len)),
        _ => None,
    })
}

fn gateway_of(r: &RouteMessage) -> Option<Ipv4Addr> {
    r.attributes.iter().find_map(|a| match a {
        RouteAttribute::Gateway(RouteAddress::Inet(ip)) => Some(*ip),
        _ => None,
    })
}

/// Remove every route of our protocol (the node leaves the cluster); the
/// number removed.
///
/// # Errors
/// No netlink socket, or routes that could not be listed or deleted.
pub async fn remove_all() -> std::result::Result<usize, Vec<Error>> {
    let (conn, handle, _) = rtnetlink::new_connection().map_err(|e| vec![Error::Socket(e)])?;
    let conn = tokio::spawn(conn);
    let removed = reconcile(&handle, &BTreeMap::new()).await;
    conn.abort();
    removed
}

/// Make the kernel's routes of our protocol exactly `want`; the number
/// of routes added, replaced or deleted. Every route is tried; the errors
/// of those that failed are returned together.
pub async fn reconcile(
    handle: &rtnetlink::Handle,
    want: &BTreeMap<Cidr, Via>,
) -> std::result::Result<usize, Vec<Error>> {
    let mut have: BTreeMap<Cidr, (Option<Ipv4Addr>, RouteMessage)> = BTreeMap::new();
    // Prefixes someone else routes in the main table (a bridge of this
    // host, an operator's route): never replaced.
    let mut others: std::collections::BTreeSet<Cidr> = Default::default();
    let mut listing = handle
        .route()
        .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
        .execute();
    loop {
        match listing.try_next().await {
            Ok(Some(r)) => {
                if r.header.table != MAIN_TABLE {
                    continue;
                }
                if r.header.protocol != RouteProtocol::Other(ROUTE_PROTOCOL) {
                    others.extend(dst_of(&r));
                    continue;
                }
                // Ours even without a gateway (edited by hand): replaced
                // or removed like the others.
                if let Some(dst) = dst_of(&r) {
                    have.insert(dst, (gateway_of(&r), r));
                }
            }
            Ok(None) => break,
            Err(e) => return Err(vec![Error::List(e)]),
        }
    }
    let mut errors = Vec::new();
    let mut changed = 0;
    for (cidr, via) in want {
        if have
            .get(cidr)
            .is_some_and(|(gw, _)| *gw == Some(via.gateway))
        {
            continue;
        }
        if others.contains(cidr) {
            tracing::debug!(cidr = %format!("{}/{}", cidr.0, cidr.1), node = %via.node, "already routed by someone else; left alone");
            continue;
        }
        let route = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(cidr.0, cidr.1)
            .gateway(via.gateway)
            .protocol(RouteProtocol::Other(ROUTE_PROTOCOL))
            .build();
        match handle.route().add(route).replace().execute().await {
            Ok(()) => changed += 1,
            Err(source) => errors.push(Error::Add {
                cidr: format!("{}/{}", cidr.0, cidr.1),
                via: via.gateway,
                node: via.node.clone(),
                source,
            }),
        }
    }
    for (cidr, (_, route)) in have {
        if want.contains_key(&cidr) {
            continue;
        }
        match handle.route().del(route).execute().await {
            Ok(()) => changed += 1,
            Err(source) => errors.push(Error::Delete {
                cidr: format!("{}/{}", cidr.0, cidr.1),
                source,
            }),
        }
    }
    if errors.is_empty() {
        Ok(changed)
    } else {
        Err(errors)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn node(yaml: &str) -> Arc<Node> {
        Arc::new(serde_saphyr::from_str(yaml).unwrap())
    }

    #[test]
    fn other_nodes_cidrs_via_their_internal_ip() {
        let nodes = [
            node("metadata: {name: a}\nspec: {podCIDR: 198.18.0.0/24}\nstatus: {addresses: [{type: InternalIP, address: 198.18.250.2}]}"),
            node("metadata: {name: b}\nspec: {podCIDR: 198.18.1.7/24, podCIDRs: [198.18.1.0/24, 'fd00::/64']}\nstatus: {addresses: [{type: Hostname, address: b}, {type: InternalIP, address: 198.18.250.3}]}"),
            node("metadata: {name: c}\nspec: {}\nstatus: {addresses: [{type: InternalIP, address: 198.18.250.4}]}"),
            node("metadata: {name: d}\nspec: {podCIDR: 198.18.3.0/24}\nstatus: {addresses: [{type: ExternalIP, address: 203.0.113.1}]}"),
        ];
        let want = desired(&nodes, "a");
        assert_eq!(want.len(), 1, "{want:?}");
        let (cidr, via) = want.iter().next().unwrap();
        assert_eq!(*cidr, (Ipv4Addr::new(198, 18, 1, 0), 24));
        assert_eq!(via.gateway, Ipv4Addr::new(198, 18, 250, 3));
        assert_eq!(via.node, "b");
        assert_eq!(
            parse_cidr("198.18.1.7/24"),
            Some((Ipv4Addr::new(198, 18, 1, 0), 24))
        );
        assert_eq!(parse_cidr("198.18.1.7/33"), None);
    }
}
