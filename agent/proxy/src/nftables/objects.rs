//! What one Service port puts into the proxy's nftables table, as nft
//! text fragments: elements of the shared maps, and for the few services
//! that need per-service logic (session affinity, external traffic policy
//! Local) their own chains and sets. Pure: the proxier diffs these.
//!
//! # The fast path
//! Most services need no chain of their own. A destination (ClusterIP,
//! external IP or node port) maps to a shared chain `cluster-N`,
//! `external-N` or `nodeport-N`, where N is the number of endpoints; that
//! chain DNATs to `numgen random mod N` looked up, with the destination,
//! in a backends map whose elements are the service's endpoints by slot.
//! One endpoint changing is then one or two map elements, and the chain
//! graph the kernel validates on every commit stays tiny however many
//! services there are.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::Ipv4Addr;

use crate::model::{Endpoint, Policy, Protocol, ServicePort, Targets};

/// The maps and sets of the table that services put elements in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Map {
    /// `ip . proto . port : verdict` for ClusterIPs and external IPs.
    ServiceIps,
    /// `proto . port : verdict` for node ports.
    ServiceNodePorts,
    /// Destinations without usable endpoints: reject or drop.
    NoEndpointServices,
    NoEndpointNodePorts,
    /// `ip . port . slot : endpoint ip . port`, one map per protocol (nft
    /// 1.0.6 cannot re-read a map typed with `th dport` once it exists).
    ClusterBackends(Protocol),
    /// `port . slot : endpoint ip . port`, per protocol.
    NodePortBackends(Protocol),
    /// `ip . ip` of this node's endpoints: a pod reaching itself through
    /// its service is masqueraded so that the reply comes back.
    Hairpin,
}

/// The protocols a service port can use.
pub const PROTOCOLS: [Protocol; 3] = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp];

impl Map {
    pub fn name(self) -> String {
        match self {
            Map::ServiceIps => "service-ips".into(),
            Map::ServiceNodePorts => "service-nodeports".into(),
            Map::NoEndpointServices => "no-endpoint-services".into(),
            Map::NoEndpointNodePorts => "no-endpoint-nodeports".into(),
            Map::ClusterBackends(p) => format!("cluster-backends-{}", p.as_str()),
            Map::NodePortBackends(p) => format!("nodeport-backends-{}", p.as_str()),
            Map::Hairpin => "hairpin".into(),
        }
    }

    /// Every map and set of the table.
    pub fn all() -> Vec<Map> {
        let mut all = vec![
            Map::ServiceIps,
            Map::ServiceNodePorts,
            Map::NoEndpointServices,
            Map::NoEndpointNodePorts,
        ];
        all.extend(PROTOCOLS.map(Map::ClusterBackends));
        all.extend(PROTOCOLS.map(Map::NodePortBackends));
        all.push(Map::Hairpin);
        all
    }
}

/// A shared load-balancing chain, one per kind and endpoint count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Shared {
    /// ClusterIP traffic: masqueraded unless it comes from a local pod.
    Cluster(usize),
    /// External IP traffic under the Cluster policy: always masqueraded.
    External(usize),
    /// Node port traffic under the Cluster policy: always masqueraded.
    NodePort(usize),
}

impl Shared {
    pub fn name(self) -> String {
        match self {
            Shared::Cluster(n) => format!("cluster-{n}"),
            Shared::External(n) => format!("external-{n}"),
            Shared::NodePort(n) => format!("nodeport-{n}"),
        }
    }

    /// The chain's rules. `local_cidr` is this node's pod CIDR: traffic
    /// from it is the node's own pods (upstream's detect-local-mode
    /// NodeCIDR); without one, ClusterIP traffic is not masqueraded, as
    /// upstream without a local detector.
    pub fn rules(self, local_cidr: Option<&str>) -> Vec<String> {
        let mut rules = Vec::new();
        let (n, nodeport) = match self {
            Shared::Cluster(n) => {
                if let Some(cidr) = local_cidr {
                    rules.push(format!("ip saddr != {cidr} jump mark-for-masquerade"));
                }
                (n, false)
            }
            Shared::External(n) => {
                rules.push("jump mark-for-masquerade".into());
                (n, false)
            }
            Shared::NodePort(n) => {
                rules.push("jump mark-for-masquerade".into());
                (n, true)
            }
        };
        // One rule per protocol: nft wants the transport protocol matched
        // before a port is mapped, and each protocol has its own map.
        for proto in PROTOCOLS {
            let p = proto.as_str();
            let (key, map) = if nodeport {
                (format!("{p} dport"), Map::NodePortBackends(proto))
            } else {
                (format!("ip daddr . {p} dport"), Map::ClusterBackends(proto))
            };
            rules.push(format!(
                "meta l4proto {p} dnat ip to {key} . numgen random mod {n} map @{}",
                map.name()
            ));
        }
        rules
    }
}

/// Everything one service port contributes to the table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Objects {
    /// (map, key) -> value; the value is empty for plain sets.
    pub elements: BTreeMap<(Map, String), String>,
    /// Chains of its own: name -> rules.
    pub chains: BTreeMap<String, Vec<String>>,
    /// Sets of its own (affinity): name -> the text inside `{ }`.
    pub sets: BTreeMap<String, String>,
    /// Shared chains its elements jump to.
    pub shared: BTreeSet<Shared>,
}

/// What the builder needs besides the service.
#[derive(Debug, Clone, Default)]
pub struct Context<'a> {
    pub local_cidr: Option<&'a str>,
}

/// The service port's objects. `cluster` and `local` are the targets in
/// slot order (see [`crate::slots`]).
pub fn build(svc: &ServicePort, targets: &Targets, ctx: &Context) -> Objects {
    let mut o = Objects::default();
    let proto = svc.name.protocol.as_str();
    let cip_key = format!("{} . {proto} . {}", svc.cluster_ip, svc.port);
    let ext_keys: Vec<String> = svc
        .external_ips
        .iter()
        .map(|ip| format!("{ip} . {proto} . {}", svc.port))
        .collect();
    let np_key = (svc.node_port != 0).then(|| format!("{proto} . {}", svc.node_port));
    for ep in targets.cluster.iter().chain(&targets.local) {
        if ep.local {
            o.elements.insert(
                (Map::Hairpin, format!("{} . {}", ep.ip, ep.ip)),
                String::new(),
            );
        }
    }
    // Nothing to send traffic to: reject when the service has no
    // endpoints at all, drop when it has some but none this traffic may
    // use (a Local policy on a node without local endpoints).
    let refuse = |any: bool| {
        if any {
            "drop".to_string()
        } else {
            "goto reject-chain".to_string()
        }
    };
    let special = svc.affinity_timeout.is_some()
        || (svc.external_policy == Policy::Local && svc.has_external());
    if special {
        per_service(
            svc,
            targets,
            ctx,
            &mut o,
            &cip_key,
            &ext_keys,
            np_key.as_deref(),
        );
        return o;
    }
    let n = targets.cluster.len();
    if n == 0 {
        let verdict = refuse(targets.any);
        o.elements
            .insert((Map::NoEndpointServices, cip_key), verdict.clone());
        for k in ext_keys {
            o.elements
                .insert((Map::NoEndpointServices, k), verdict.clone());
        }
        if let Some(k) = np_key {
            o.elements.insert((Map::NoEndpointNodePorts, k), verdict);
        }
        return o;
    }
    // The verdict map sends the destination to the shared chain; the
    // backends map, keyed without the protocol (it has a map of its own),
    // holds the endpoints by slot.
    let mut route = |map: Map, key: &str, backends: Map, backend_key: String, shared: Shared| {
        o.elements
            .insert((map, key.to_string()), format!("goto {}", shared.name()));
        o.shared.insert(shared);
        for (slot, ep) in targets.cluster.iter().enumerate() {
            o.elements.insert(
                (backends, format!("{backend_key} . {slot}")),
                format!("{} . {}", ep.ip, ep.port),
            );
        }
    };
    let protocol = svc.name.protocol;
    route(
        Map::ServiceIps,
        &cip_key,
        Map::ClusterBackends(protocol),
        format!("{} . {}", svc.cluster_ip, svc.port),
        Shared::Cluster(n),
    );
    for (k, ip) in ext_keys.iter().zip(&svc.external_ips) {
        route(
            Map::ServiceIps,
            k,
            Map::ClusterBackends(protocol),
            format!("{ip} . {}", svc.port),
            Shared::External(n),
        );
    }
    if let Some(k) = &np_key {
        route(
            Map::ServiceNodePorts,
            k,
            Map::NodePortBackends(protocol),
            svc.node_port.to_string(),
            Shared::NodePort(n),
        );
    }
    o
}

/// Chain and set names of a service port: `svc-ns/name/proto/port`.
fn id(svc: &ServicePort) -> String {
    let port = if svc.name.port.is_empty() {
        format!("p{}", svc.port)
    } else {
        svc.name.port.clone()
    };
    format!(
        "{}/{}/{}/{port}",
        svc.name.namespace,
        svc.name.name,
        svc.name.protocol.as_str()
    )
}

fn endpoint_id(svc_id: &str, ep: &Endpoint) -> String {
    format!("{svc_id}/{}/{}", ep.ip, ep.port)
}

/// The clients an endpoint has seen. The timeout is part of the name, so
/// a changed timeout is a new set (and new rules naming it) rather than a
/// set changed under rules that use it.
fn affinity_set(timeout: u32, endpoint_id: &str) -> String {
    format!("aff{timeout}-{endpoint_id}")
}

/// Session affinity and the Local external policy: upstream's chain
/// layout, a chain per service path and per endpoint.
fn per_service(
    svc: &ServicePort,
    targets: &Targets,
    ctx: &Context,
    o: &mut Objects,
    cip_key: &str,
    ext_keys: &[String],
    np_key: Option<&str>,
) {
    let sid = id(svc);
    let proto = svc.name.protocol.as_str();
    let svc_chain = format!("svc-{sid}");
    let ext_chain = format!("ext-{sid}");
    let local_chain = format!("svl-{sid}");
    let refuse = if targets.any {
        "drop"
    } else {
        "goto reject-chain"
    };

    let mut endpoints: BTreeSet<Endpoint> = BTreeSet::new();
    let mut balance = |name: &str, eps: &[Endpoint], first: Vec<String>, o: &mut Objects| {
        let mut rules = first;
        for ep in eps {
            if let Some(timeout) = svc.affinity_timeout {
                let eid = endpoint_id(&sid, ep);
                rules.push(format!(
                    "ip saddr @{} goto ep-{eid}",
                    affinity_set(timeout, &eid)
                ));
            }
        }
        let mut vmap = String::new();
        for (i, ep) in eps.iter().enumerate() {
            let _ = write!(
                vmap,
                "{}{i} : goto ep-{}",
                if i == 0 { "" } else { ", " },
                endpoint_id(&sid, ep)
            );
        }
        rules.push(format!("numgen random mod {} vmap {{ {vmap} }}", eps.len()));
        o.chains.insert(name.to_string(), rules);
        endpoints.extend(eps.iter().cloned());
    };

    let cluster_first = match ctx.local_cidr {
        Some(cidr) => vec![format!("ip saddr != {cidr} jump mark-for-masquerade")],
        None => Vec::new(),
    };
    let has_cluster = !targets.cluster.is_empty();
    if has_cluster {
        balance(&svc_chain, &targets.cluster, cluster_first, o);
        o.elements.insert(
            (Map::ServiceIps, cip_key.to_string()),
            format!("goto {svc_chain}"),
        );
    } else {
        o.elements.insert(
            (Map::NoEndpointServices, cip_key.to_string()),
            refuse.to_string(),
        );
    }

    if svc.has_external() {
        let external_ok = match svc.external_policy {
            Policy::Cluster => has_cluster,
            // Pods and the node itself still reach cluster endpoints.
            Policy::Local => has_cluster || !targets.local.is_empty(),
        };
        if external_ok {
            let mut rules = Vec::new();
            match svc.external_policy {
                Policy::Cluster => {
                    rules.push("jump mark-for-masquerade".to_string());
                    rules.push(format!("goto {svc_chain}"));
                }
                Policy::Local => {
                    if has_cluster {
                        if let Some(cidr) = ctx.local_cidr {
                            rules.push(format!("ip saddr {cidr} goto {svc_chain}"));
                        }
                        rules.push("fib saddr type local jump mark-for-masquerade".to_string());
                        rules.push(format!("fib saddr type local goto {svc_chain}"));
                    }
                    if targets.local.is_empty() {
                        rules.push("drop".to_string());
                    } else {
                        balance(&local_chain, &targets.local, Vec::new(), o);
                        rules.push(format!("goto {local_chain}"));
                    }
                }
            }
            o.chains.insert(ext_chain.clone(), rules);
            for k in ext_keys {
                o.elements
                    .insert((Map::ServiceIps, k.clone()), format!("goto {ext_chain}"));
            }
            if let Some(k) = np_key {
                o.elements.insert(
                    (Map::ServiceNodePorts, k.to_string()),
                    format!("goto {ext_chain}"),
                );
            }
        } else {
            for k in ext_keys {
                o.elements
                    .insert((Map::NoEndpointServices, k.clone()), refuse.to_string());
            }
            if let Some(k) = np_key {
                o.elements.insert(
                    (Map::NoEndpointNodePorts, k.to_string()),
                    refuse.to_string(),
                );
            }
        }
    }

    for ep in &endpoints {
        let eid = endpoint_id(&sid, ep);
        let mut rules = Vec::new();
        if let Some(timeout) = svc.affinity_timeout {
            let set = affinity_set(timeout, &eid);
            o.sets.insert(
                set.clone(),
                format!("type ipv4_addr ; flags dynamic,timeout ; timeout {timeout}s ;"),
            );
            rules.push(format!("update @{set} {{ ip saddr }}"));
        }
        rules.push(format!(
            "meta l4proto {proto} dnat ip to {}:{}",
            ep.ip, ep.port
        ));
        o.chains.insert(format!("ep-{eid}"), rules);
    }
}

/// The address of an endpoint, for [`crate::slots`].
pub fn addr(ep: &Endpoint) -> (Ipv4Addr, u16) {
    (ep.ip, ep.port)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Protocol, ServicePortName};

    fn port() -> ServicePort {
        let name = ServicePortName::new("default", "web", "http", Protocol::Tcp);
        ServicePort::cluster_ip(name, Ipv4Addr::new(198, 19, 0, 10), 80)
    }

    fn ep(last: u8, local: bool) -> Endpoint {
        Endpoint::ready(Ipv4Addr::new(198, 18, 0, last), 8080, local)
    }

    fn elements(o: &Objects) -> Vec<String> {
        o.elements
            .iter()
            .map(|((m, k), v)| format!("{} {k} : {v}", m.name()))
            .collect()
    }

    const CTX: Context = Context {
        local_cidr: Some("198.18.0.0/24"),
    };

    #[test]
    fn plain_service_uses_shared_chains_and_backend_slots() {
        let mut svc = port();
        svc.node_port = 30080;
        svc.external_ips = vec![Ipv4Addr::new(203, 0, 113, 7)];
        let targets = Targets {
            cluster: vec![ep(10, true), ep(11, false)],
            local: vec![ep(10, true)],
            any: true,
        };
        let o = build(&svc, &targets, &CTX);
        assert!(o.chains.is_empty() && o.sets.is_empty());
        assert_eq!(
            o.shared,
            [Shared::Cluster(2), Shared::External(2), Shared::NodePort(2)].into()
        );
        assert_eq!(
            elements(&o),
            [
                "service-ips 198.19.0.10 . tcp . 80 : goto cluster-2",
                "service-ips 203.0.113.7 . tcp . 80 : goto external-2",
                "service-nodeports tcp . 30080 : goto nodeport-2",
                "cluster-backends-tcp 198.19.0.10 . 80 . 0 : 198.18.0.10 . 8080",
                "cluster-backends-tcp 198.19.0.10 . 80 . 1 : 198.18.0.11 . 8080",
                "cluster-backends-tcp 203.0.113.7 . 80 . 0 : 198.18.0.10 . 8080",
                "cluster-backends-tcp 203.0.113.7 . 80 . 1 : 198.18.0.11 . 8080",
                "nodeport-backends-tcp 30080 . 0 : 198.18.0.10 . 8080",
                "nodeport-backends-tcp 30080 . 1 : 198.18.0.11 . 8080",
                "hairpin 198.18.0.10 . 198.18.0.10 : ",
            ]
        );
        let rules = Shared::Cluster(2).rules(CTX.local_cidr);
        assert_eq!(
            rules[0],
            "ip saddr != 198.18.0.0/24 jump mark-for-masquerade"
        );
        assert_eq!(
            rules[1],
            "meta l4proto tcp dnat ip to ip daddr . tcp dport . numgen random mod 2 map @cluster-backends-tcp"
        );
        assert_eq!(
            Shared::NodePort(3).rules(None)[0],
            "jump mark-for-masquerade"
        );
    }

    #[test]
    fn no_endpoints_reject_and_unusable_endpoints_drop() {
        let mut svc = port();
        svc.node_port = 30080;
        let o = build(&svc, &Targets::default(), &CTX);
        assert_eq!(
            elements(&o),
            [
                "no-endpoint-services 198.19.0.10 . tcp . 80 : goto reject-chain",
                "no-endpoint-nodeports tcp . 30080 : goto reject-chain",
            ]
        );
        // Internal policy Local on a node without local endpoints.
        svc.internal_policy = Policy::Local;
        let o = build(
            &svc,
            &Targets {
                any: true,
                ..Default::default()
            },
            &CTX,
        );
        assert!(elements(&o)[0].ends_with(": drop"), "{:?}", elements(&o));
    }

    #[test]
    fn affinity_gets_chains_per_endpoint() {
        let mut svc = port();
        svc.affinity_timeout = Some(60);
        let targets = Targets {
            cluster: vec![ep(10, false), ep(11, false)],
            local: Vec::new(),
            any: true,
        };
        let o = build(&svc, &targets, &CTX);
        let sid = "default/web/tcp/http";
        assert_eq!(
            elements(&o),
            [format!(
                "service-ips 198.19.0.10 . tcp . 80 : goto svc-{sid}"
            )]
        );
        let chain = &o.chains[&format!("svc-{sid}")];
        assert_eq!(
            chain[0],
            "ip saddr != 198.18.0.0/24 jump mark-for-masquerade"
        );
        assert_eq!(
            chain[1],
            format!("ip saddr @aff60-{sid}/198.18.0.10/8080 goto ep-{sid}/198.18.0.10/8080")
        );
        assert_eq!(
            chain[3],
            format!("numgen random mod 2 vmap {{ 0 : goto ep-{sid}/198.18.0.10/8080, 1 : goto ep-{sid}/198.18.0.11/8080 }}")
        );
        assert_eq!(
            o.chains[&format!("ep-{sid}/198.18.0.11/8080")],
            [
                format!("update @aff60-{sid}/198.18.0.11/8080 {{ ip saddr }}"),
                "meta l4proto tcp dnat ip to 198.18.0.11:8080".to_string(),
            ]
        );
        assert!(o.sets[&format!("aff60-{sid}/198.18.0.10/8080")].contains("timeout 60s"));
    }

    #[test]
    fn external_policy_local_keeps_external_traffic_on_the_node() {
        let mut svc = port();
        svc.node_port = 30080;
        svc.external_policy = Policy::Local;
        let sid = "default/web/tcp/http";
        let targets = Targets {
            cluster: vec![ep(10, true), ep(11, false)],
            local: vec![ep(10, true)],
            any: true,
        };
        let o = build(&svc, &targets, &CTX);
        assert_eq!(
            o.chains[&format!("ext-{sid}")],
            [
                format!("ip saddr 198.18.0.0/24 goto svc-{sid}"),
                "fib saddr type local jump mark-for-masquerade".to_string(),
                format!("fib saddr type local goto svc-{sid}"),
                format!("goto svl-{sid}"),
            ]
        );
        assert!(o.chains[&format!("svl-{sid}")][0].starts_with("numgen random mod 1 vmap"));
        // No local endpoint: outside traffic is dropped, pods still served.
        let o = build(
            &svc,
            &Targets {
                local: Vec::new(),
                ..targets
            },
            &CTX,
        );
        assert_eq!(o.chains[&format!("ext-{sid}")].last().unwrap(), "drop");
        assert!(!o.chains.contains_key(&format!("svl-{sid}")));
    }
}
