//! iptables mode: kube-proxy's chain layout with a `SKIFF-` prefix,
//! applied with `iptables-restore --noflush` so that only the proxy's own
//! chains are touched.
//!
//! Per service port: `SKIFF-SVC-*` (cluster endpoints), `SKIFF-EXT-*`
//! (external traffic), `SKIFF-SVL-*` (local endpoints) and one
//! `SKIFF-SEP-*` per endpoint. The dispatch chains (`SKIFF-SERVICES`,
//! `SKIFF-NODEPORTS`, and the filter table's reject lists) hold one rule
//! per destination: they are rewritten only when a destination appears,
//! goes or loses its last endpoint; an endpoint change rewrites only that
//! service's chains.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;

use sha2::{Digest, Sha256};

use super::model::{Endpoint, Policy, ServicePort, ServicePortName, Targets};
use super::{Basis, Change, SyncStats};

pub const SERVICES: &str = "SKIFF-SERVICES";
pub const EXTERNAL_SERVICES: &str = "SKIFF-EXTERNAL-SERVICES";
pub const NODEPORTS: &str = "SKIFF-NODEPORTS";
pub const POSTROUTING: &str = "SKIFF-POSTROUTING";
pub const MARK_MASQ: &str = "SKIFF-MARK-MASQ";
pub const MARK_DROP: &str = "SKIFF-MARK-DROP";
/// Every chain the proxy owns starts with this.
pub const PREFIX: &str = "SKIFF-";

/// The two tables the proxy writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Table {
    Filter,
    Nat,
}

impl Table {
    pub fn name(self) -> &'static str {
        match self {
            Table::Filter => "filter",
            Table::Nat => "nat",
        }
    }
}

/// The jumps from the built-in chains into the proxy's, ensured with
/// `iptables -C` / `-I` (as kube-proxy's EnsureRule).
pub const JUMPS: &[(Table, &str, &str)] = &[
    (Table::Nat, "PREROUTING", SERVICES),
    (Table::Nat, "OUTPUT", SERVICES),
    (Table::Nat, "POSTROUTING", POSTROUTING),
    (Table::Filter, "INPUT", SERVICES),
    (Table::Filter, "FORWARD", SERVICES),
    (Table::Filter, "OUTPUT", SERVICES),
    (Table::Filter, "INPUT", EXTERNAL_SERVICES),
    (Table::Filter, "FORWARD", EXTERNAL_SERVICES),
];

/// The arguments of a jump rule (without `-t`, `-C`/`-I` and the chain).
pub fn jump_args(table: Table, target: &str) -> Vec<String> {
    let mut args = Vec::new();
    if table == Table::Filter {
        // New connections only: established ones are never cut.
        args.extend(["-m", "conntrack", "--ctstate", "NEW"].map(String::from));
    }
    args.extend(
        [
            "-m",
            "comment",
            "--comment",
            "skiff service portals",
            "-j",
            target,
        ]
        .map(String::from),
    );
    args
}

/// Rules one service port adds to the dispatch chains, and its own chains.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Objects {
    pub dispatch: BTreeMap<(Table, &'static str), Vec<String>>,
    pub chains: BTreeMap<String, Vec<String>>,
}

fn hash16(s: &str) -> String {
    let d = Sha256::digest(s.as_bytes());
    hex::encode_upper(&d[..8])
}

fn svc_id(name: &ServicePortName) -> String {
    format!("{name}{}", name.protocol.as_str())
}

fn chain(kind: &str, name: &ServicePortName) -> String {
    format!("{PREFIX}{kind}-{}", hash16(&svc_id(name)))
}

fn sep_chain(name: &ServicePortName, ep: &Endpoint) -> String {
    format!(
        "{PREFIX}SEP-{}",
        hash16(&format!("{}{}:{}", svc_id(name), ep.ip, ep.port))
    )
}

fn comment(name: &ServicePortName, what: &str) -> String {
    format!("-m comment --comment \"{name} {what}\"")
}

/// The service port's rules. `local_cidr` is the node's pod CIDR.
pub fn build(svc: &ServicePort, targets: &Targets, local_cidr: Option<&str>) -> Objects {
    let mut o = Objects::default();
    let name = &svc.name;
    let proto = name.protocol.as_str();
    let svc_chain = chain("SVC", name);
    let ext_chain = chain("EXT", name);
    let svl_chain = chain("SVL", name);
    let dst = |ip: &dyn std::fmt::Display, port: u16| {
        format!("-d {ip}/32 -p {proto} -m {proto} --dport {port}")
    };
    // A TCP reset refuses at once even where an ICMP error would not
    // reach the client (locally generated packets on some routes).
    let refuse = match (targets.any, name.protocol) {
        (true, _) => "-j DROP",
        (false, super::model::Protocol::Tcp) => "-j REJECT --reject-with tcp-reset",
        (false, _) => "-j REJECT --reject-with icmp-port-unreachable",
    };
    let has_cluster = !targets.cluster.is_empty();
    let mut push = |table: Table, chain: &'static str, rule: String| {
        o.dispatch.entry((table, chain)).or_default().push(rule);
    };

    if has_cluster {
        push(
            Table::Nat,
            SERVICES,
            format!(
                "{} {} -j {svc_chain}",
                comment(name, "cluster IP"),
                dst(&svc.cluster_ip, svc.port)
            ),
        );
    } else {
        push(
            Table::Filter,
            SERVICES,
            format!(
                "{} {} {refuse}",
                comment(name, "has no endpoints"),
                dst(&svc.cluster_ip, svc.port)
            ),
        );
    }
    let external_ok = match svc.external_policy {
        Policy::Cluster => has_cluster,
        Policy::Local => has_cluster || !targets.local.is_empty(),
    };
    for ip in &svc.external_ips {
        if external_ok {
            push(
                Table::Nat,
                SERVICES,
                format!(
                    "{} {} -j {ext_chain}",
                    comment(name, "external IP"),
                    dst(ip, svc.port)
                ),
            );
        } else {
            push(
                Table::Filter,
                EXTERNAL_SERVICES,
                format!(
                    "{} {} {refuse}",
                    comment(name, "has no endpoints"),
                    dst(ip, svc.port)
                ),
            );
        }
    }
    if svc.node_port != 0 {
        let np = format!("-p {proto} -m {proto} --dport {}", svc.node_port);
        if external_ok {
            push(
                Table::Nat,
                NODEPORTS,
                format!("{} {np} -j {ext_chain}", comment(name, "node port")),
            );
        } else {
            push(
                Table::Filter,
                EXTERNAL_SERVICES,
                format!(
                    "{} -m addrtype --dst-type LOCAL {np} {refuse}",
                    comment(name, "has no endpoints")
                ),
            );
        }
    }

    let mut endpoints: BTreeSet<Endpoint> = BTreeSet::new();
    let mut balance = |chain_name: &str, eps: &[Endpoint], mut rules: Vec<String>| {
        if let Some(timeout) = svc.affinity_timeout {
            for ep in eps {
                let sep = sep_chain(name, ep);
                rules.push(format!(
                    "-m recent --name {sep} --mask 255.255.255.255 --rsource --rcheck --seconds {timeout} --reap -j {sep}"
                ));
            }
        }
        // Each rule takes its share of what the rules before it left.
        let n = eps.len();
        for (i, ep) in eps.iter().enumerate() {
            let sep = sep_chain(name, ep);
            if i + 1 < n {
                rules.push(format!(
                    "-m statistic --mode random --probability {:.10} -j {sep}",
                    1.0 / (n - i) as f64
                ));
            } else {
                rules.push(format!("-j {sep}"));
            }
        }
        endpoints.extend(eps.iter().cloned());
        (chain_name.to_string(), rules)
    };
    let mut chains = Vec::new();
    if has_cluster {
        let first = match local_cidr {
            Some(cidr) => vec![format!(
                "{} ! -s {cidr} {} -j {MARK_MASQ}",
                comment(name, "cluster IP"),
                dst(&svc.cluster_ip, svc.port)
            )],
            None => Vec::new(),
        };
        chains.push(balance(&svc_chain, &targets.cluster, first));
    }
    if svc.has_external() && external_ok {
        let mut rules = Vec::new();
        match svc.external_policy {
            Policy::Cluster => {
                rules.push(format!("-j {MARK_MASQ}"));
                rules.push(format!("-j {svc_chain}"));
            }
            Policy::Local => {
                if has_cluster {
                    if let Some(cidr) = local_cidr {
                        rules.push(format!("-s {cidr} -j {svc_chain}"));
                    }
                    rules.push(format!("-m addrtype --src-type LOCAL -j {MARK_MASQ}"));
                    rules.push(format!("-m addrtype --src-type LOCAL -j {svc_chain}"));
                }
                if targets.local.is_empty() {
                    rules.push(format!("-j {MARK_DROP}"));
                } else {
                    chains.push(balance(&svl_chain, &targets.local, Vec::new()));
                    rules.push(format!("-j {svl_chain}"));
                }
            }
        }
        chains.push((ext_chain, rules));
    }
    for ep in &endpoints {
        let sep = sep_chain(name, ep);
        let mut rules = vec![format!("-s {}/32 -j {MARK_MASQ}", ep.ip)];
        if svc.affinity_timeout.is_some() {
            rules.push(format!(
                "-m recent --name {sep} --mask 255.255.255.255 --rsource --set"
            ));
        }
        rules.push(format!(
            "-p {proto} -m {proto} -j DNAT --to-destination {}:{}",
            ep.ip, ep.port
        ));
        chains.push((sep, rules));
    }
    o.chains = chains.into_iter().collect();
    o
}

/// The fixed chains and their rules.
fn fixed() -> Vec<(Table, &'static str, Vec<String>)> {
    vec![
        (
            Table::Nat,
            MARK_MASQ,
            vec!["-j MARK --or-mark 0x4000".to_string()],
        ),
        (
            Table::Nat,
            MARK_DROP,
            vec!["-j MARK --or-mark 0x8000".to_string()],
        ),
        (
            Table::Nat,
            POSTROUTING,
            vec![
                "-m mark ! --mark 0x4000/0x4000 -j RETURN".to_string(),
                "-j MARK --xor-mark 0x4000".to_string(),
                "-m comment --comment \"skiff service traffic requiring SNAT\" -j MASQUERADE --random-fully".to_string(),
            ],
        ),
    ]
}

/// The iptables proxier's memory of what it wrote.
#[derive(Debug, Default)]
pub struct Proxier {
    /// The pod CIDR and whether the kernel holds what was written.
    pub basis: Basis,
    programmed: BTreeMap<ServicePortName, Objects>,
}

/// An `iptables-restore --noflush` input and the chains it must delete.
#[derive(Debug, Default)]
pub struct Script {
    pub text: String,
    pub stats: SyncStats,
}

impl Proxier {
    pub fn new(local_cidr: Option<String>) -> Proxier {
        Proxier {
            basis: Basis::new(local_cidr),
            ..Default::default()
        }
    }

    /// Chains currently programmed (for metrics).
    pub fn programmed(&self) -> usize {
        self.programmed.values().map(|o| o.chains.len()).sum()
    }

    /// Everything; `existing` are the proxy's chains now in the kernel
    /// (from iptables-save), so that stale ones are deleted.
    pub fn full_sync<'a>(
        &mut self,
        all: impl IntoIterator<Item = (&'a ServicePort, &'a Targets)>,
        existing: &BTreeSet<(Table, String)>,
    ) -> Script {
        self.programmed.clear();
        let mut stats = SyncStats::default();
        for (svc, targets) in all {
            let o = build(svc, targets, self.basis.local_cidr.as_deref());
            stats.chains += o.chains.len();
            stats.service_ports += 1;
            self.programmed.insert(svc.name.clone(), o);
        }
        let mut chains: BTreeMap<(Table, String), Vec<String>> = BTreeMap::new();
        for (table, name, rules) in fixed() {
            chains.insert((table, name.to_string()), rules);
        }
        for (table, name) in self.dispatch_chains() {
            chains.insert((table, name.to_string()), self.dispatch_rules(table, name));
        }
        for o in self.programmed.values() {
            for (name, rules) in &o.chains {
                chains.insert((Table::Nat, name.clone()), rules.clone());
            }
        }
        let stale: Vec<(Table, String)> = existing
            .iter()
            .filter(|k| !chains.contains_key(*k))
            .cloned()
            .collect();
        Script {
            text: render(&chains, &stale),
            stats,
        }
    }

    /// Only the changed services' chains, and the dispatch chains if a
    /// destination changed.
    pub fn partial_sync(&mut self, changes: &[Change]) -> Script {
        let mut stats = SyncStats::default();
        let mut write: BTreeMap<(Table, String), Vec<String>> = BTreeMap::new();
        let mut delete: BTreeSet<(Table, String)> = BTreeSet::new();
        let mut dispatch_changed = false;
        for change in changes {
            let old_names = change.known_ports(&self.programmed);
            let mut next: HashMap<ServicePortName, Objects> = HashMap::new();
            for (svc, targets) in &change.ports {
                next.insert(
                    svc.name.clone(),
                    build(svc, targets, self.basis.local_cidr.as_deref()),
                );
            }
            for name in old_names.iter().chain(next.keys()) {
                let old = self.programmed.get(name).cloned().unwrap_or_default();
                let new = next.get(name).cloned().unwrap_or_default();
                if old == new {
                    continue;
                }
                stats.service_ports += 1;
                dispatch_changed |= old.dispatch != new.dispatch;
                for (chain, rules) in &new.chains {
                    if old.chains.get(chain) != Some(rules) {
                        write.insert((Table::Nat, chain.clone()), rules.clone());
                        stats.chains += 1;
                    }
                }
                for chain in old.chains.keys() {
                    if !new.chains.contains_key(chain) {
                        delete.insert((Table::Nat, chain.clone()));
                        stats.chains += 1;
                    }
                }
                if new == Objects::default() {
                    self.programmed.remove(name);
                } else {
                    self.programmed.insert(name.clone(), new);
                }
            }
        }
        if dispatch_changed {
            for (table, name) in self.dispatch_chains() {
                write.insert((table, name.to_string()), self.dispatch_rules(table, name));
            }
        }
        if write.is_empty() && delete.is_empty() {
            return Script::default();
        }
        let delete: Vec<(Table, String)> = delete.into_iter().collect();
        Script {
            text: render(&write, &delete),
            stats,
        }
    }

    fn dispatch_chains(&self) -> [(Table, &'static str); 4] {
        [
            (Table::Nat, SERVICES),
            (Table::Nat, NODEPORTS),
            (Table::Filter, SERVICES),
            (Table::Filter, EXTERNAL_SERVICES),
        ]
    }

    /// A dispatch chain's rules, in a stable order.
    fn dispatch_rules(&self, table: Table, chain: &'static str) -> Vec<String> {
        let mut rules: Vec<String> = Vec::new();
        if table == Table::Filter && chain == SERVICES {
            rules.push(
                "-m mark --mark 0x8000/0x8000 -m comment --comment \"skiff drops\" -j DROP".into(),
            );
        }
        for o in self.programmed.values() {
            if let Some(r) = o.dispatch.get(&(table, chain)) {
                rules.extend(r.iter().cloned());
            }
        }
        if table == Table::Nat && chain == SERVICES {
            // Last, so that a ClusterIP always wins over a node port.
            rules.push(format!(
                "-m comment --comment \"skiff service nodeports\" -m addrtype --dst-type LOCAL ! -d 127.0.0.0/8 -j {NODEPORTS}"
            ));
        }
        rules
    }
}

/// `iptables-restore --noflush` input: each chain written is declared
/// (which flushes it) and refilled; stale chains are flushed, then
/// deleted once nothing jumps to them.
fn render(write: &BTreeMap<(Table, String), Vec<String>>, delete: &[(Table, String)]) -> String {
    let mut out = String::new();
    for table in [Table::Filter, Table::Nat] {
        let w: Vec<_> = write.iter().filter(|((t, _), _)| *t == table).collect();
        let d: Vec<_> = delete.iter().filter(|(t, _)| *t == table).collect();
        if w.is_empty() && d.is_empty() {
            continue;
        }
        let _ = writeln!(out, "*{}", table.name());
        for ((_, name), _) in &w {
            let _ = writeln!(out, ":{name} - [0:0]");
        }
        for (_, name) in &d {
            let _ = writeln!(out, ":{name} - [0:0]");
        }
        for ((_, name), rules) in &w {
            for r in *rules {
                let _ = writeln!(out, "-A {name} {r}");
            }
        }
        for (_, name) in &d {
            let _ = writeln!(out, "-X {name}");
        }
        out.push_str("COMMIT\n");
    }
    out
}

/// The proxy's chains in `iptables-save` output (`:SKIFF-... - [0:0]`).
pub fn existing_chains(save_output: &str) -> BTreeSet<(Table, String)> {
    let mut table = None;
    let mut out = BTreeSet::new();
    for line in save_output.lines() {
        if let Some(t) = line.strip_prefix('*') {
            table = match t.trim() {
                "nat" => Some(Table::Nat),
                "filter" => Some(Table::Filter),
                _ => None,
            };
        } else if let (Some(t), Some(rest)) = (table, line.strip_prefix(':')) {
            if let Some(name) = rest.split_whitespace().next() {
                if name.starts_with(PREFIX) {
                    out.insert((t, name.to_string()));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::model::Protocol;

    fn svc() -> ServicePort {
        let name = ServicePortName::new("default", "web", "", Protocol::Tcp);
        ServicePort {
            node_port: 30080,
            ..ServicePort::cluster_ip(name, Ipv4Addr::new(198, 19, 0, 10), 80)
        }
    }

    fn ep(last: u8) -> Endpoint {
        Endpoint::ready(Ipv4Addr::new(198, 18, 0, last), 8080, false)
    }

    #[test]
    fn layout_like_kube_proxy() {
        let t = Targets {
            cluster: vec![ep(10), ep(11), ep(12)],
            local: Vec::new(),
            any: true,
        };
        let o = build(&svc(), &t, Some("198.18.0.0/24"));
        let svc_chain = chain("SVC", &svc().name);
        let rules = &o.chains[&svc_chain];
        assert!(
            rules[0].contains(
                "! -s 198.18.0.0/24 -d 198.19.0.10/32 -p tcp -m tcp --dport 80 -j SKIFF-MARK-MASQ"
            ),
            "{rules:?}"
        );
        assert!(rules[1].contains("--probability 0.3333333333"));
        assert!(rules[2].contains("--probability 0.5000000000"));
        assert!(rules[3].starts_with("-j SKIFF-SEP-"));
        assert_eq!(o.chains.len(), 1 + 1 + 3, "SVC, EXT, 3 SEP");
        let sep = &o.chains[&sep_chain(&svc().name, &ep(11))];
        assert_eq!(sep[0], "-s 198.18.0.11/32 -j SKIFF-MARK-MASQ");
        assert_eq!(
            sep[1],
            "-p tcp -m tcp -j DNAT --to-destination 198.18.0.11:8080"
        );
        assert!(o.dispatch[&(Table::Nat, NODEPORTS)][0]
            .ends_with(&format!("-j {}", chain("EXT", &svc().name))));
        assert!(
            svc_chain.len() <= 28,
            "iptables chain names are at most 28 bytes"
        );

        // No endpoints: rejected in the filter table, nothing in nat.
        let o = build(&svc(), &Targets::default(), None);
        assert!(o.chains.is_empty());
        assert!(o.dispatch[&(Table::Filter, SERVICES)][0]
            .ends_with("-j REJECT --reject-with tcp-reset"));
        assert!(o.dispatch[&(Table::Filter, EXTERNAL_SERVICES)][0].contains("--dst-type LOCAL"));
    }

    #[test]
    fn endpoint_change_rewrites_only_that_service() {
        let mut p = Proxier::new(Some("198.18.0.0/24".into()));
        let a = svc();
        let mut b = svc();
        b.name.name = "api".into();
        b.cluster_ip = Ipv4Addr::new(198, 19, 0, 11);
        b.node_port = 0;
        let t = |eps: Vec<Endpoint>| Targets {
            any: !eps.is_empty(),
            cluster: eps,
            local: Vec::new(),
        };
        let (ta, tb) = (t(vec![ep(10)]), t(vec![ep(20)]));
        let full = p.full_sync([(&a, &ta), (&b, &tb)], &BTreeSet::new());
        assert!(full.text.contains(":SKIFF-SERVICES - [0:0]"));
        p.basis.commit();
        let change = Change {
            namespace: "default".into(),
            name: "web".into(),
            ports: vec![(a.clone(), t(vec![ep(10), ep(11)]))],
        };
        let s = p.partial_sync(&[change]);
        assert!(!s.text.contains("SKIFF-SERVICES"), "{}", s.text);
        assert!(!s.text.contains("198.19.0.11"), "service b untouched");
        assert!(s.text.contains("198.18.0.11:8080"));
        // Losing every endpoint changes the dispatch chains.
        let change = Change {
            namespace: "default".into(),
            name: "web".into(),
            ports: vec![(a.clone(), t(vec![]))],
        };
        let s = p.partial_sync(&[change]);
        assert!(s.text.contains("*filter") && s.text.contains("REJECT"));
        assert!(s.text.contains("-X SKIFF-SEP-"));
        assert!(p.partial_sync(&[]).text.is_empty());
    }

    #[test]
    fn finds_own_chains_in_iptables_save() {
        let save = "*nat\n:PREROUTING ACCEPT [0:0]\n:SKIFF-SERVICES - [0:0]\n:KUBE-X - [0:0]\nCOMMIT\n*filter\n:SKIFF-SERVICES - [0:0]\nCOMMIT\n";
        let c = existing_chains(save);
        assert_eq!(c.len(), 2);
        assert!(c.contains(&(Table::Filter, SERVICES.to_string())));
    }
}
