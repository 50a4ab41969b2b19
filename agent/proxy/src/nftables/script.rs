//! nft script text: the table's fixed skeleton, and the statements of a
//! transaction in an order the kernel accepts (objects created before
//! they are referenced, deleted after their last reference is gone).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::objects::Map;
use super::Tx;

/// The proxy's table. Nothing else is touched.
pub const TABLE: &str = "skiff-proxy";
/// Elements per `add element` statement: nft parses long lists fine, but
/// an error message quoting a line stays readable.
const ELEMENTS_PER_STATEMENT: usize = 1000;

fn t() -> String {
    format!("ip {TABLE}")
}

pub fn add_rule(chain: &str, rule: &str) -> String {
    format!("add rule {} {chain} {rule}", t())
}

pub fn flush_chain(chain: &str) -> String {
    format!("flush chain {} {chain}", t())
}

pub fn delete_chain(chain: &str) -> String {
    format!("delete chain {} {chain}", t())
}

pub fn add_set(name: &str, spec: &str) -> String {
    format!("add set {} {name} {{ {spec} }}", t())
}

pub fn delete_set(name: &str) -> String {
    format!("delete set {} {name}", t())
}

/// `key : value` for maps, `key` for plain sets.
pub fn element(key: &str, value: &str) -> String {
    if value.is_empty() {
        key.to_string()
    } else {
        format!("{key} : {value}")
    }
}

fn map_spec(map: Map) -> String {
    match map {
        Map::ServiceIps | Map::NoEndpointServices => {
            "type ipv4_addr . inet_proto . inet_service : verdict ;".into()
        }
        Map::ServiceNodePorts | Map::NoEndpointNodePorts => {
            "type inet_proto . inet_service : verdict ;".into()
        }
        // typeof, because the slot comes from numgen, an integer nft will
        // not match against a `mark` key.
        Map::ClusterBackends(p) => format!(
            "typeof ip daddr . {0} dport . numgen random mod 2 : ip daddr . {0} dport ;",
            p.as_str()
        ),
        Map::NodePortBackends(p) => format!(
            "typeof {0} dport . numgen random mod 2 : ip daddr . {0} dport ;",
            p.as_str()
        ),
        Map::Hairpin => "type ipv4_addr . ipv4_addr ;".into(),
    }
}

/// How a full sync treats what is in the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// Delete the table and write it anew: after a start, when what is in
    /// the kernel is unknown.
    Replace,
    /// Re-add every object, flush it and refill it, keeping the affinity
    /// sets' clients: the periodic resync that repairs tampering.
    Repair,
}

/// The fixed part of the table: its maps, the hook chains and the chains
/// every service shares.
fn skeleton(out: &mut String, mode: Full) {
    let t = t();
    for map in Map::all() {
        let kind = if map == Map::Hairpin { "set" } else { "map" };
        let _ = writeln!(out, "add {kind} {t} {} {{ {} }}", map.name(), map_spec(map));
        if mode == Full::Repair {
            let _ = writeln!(out, "flush {kind} {t} {}", map.name());
        }
    }
    let chains: &[(&str, Option<&str>, &[&str])] = &[
        // Bit 0x4000 of the packet mark asks for masquerade, as
        // kube-proxy's.
        (
            "mark-for-masquerade",
            None,
            &["meta mark set meta mark or 0x4000"],
        ),
        (
            "masquerading",
            None,
            &[
                "meta mark and 0x4000 == 0 return",
                // Clear the bit so that a packet masqueraded here is not
                // masqueraded again if it is looped back through a node.
                "meta mark set meta mark xor 0x4000",
                "masquerade fully-random",
            ],
        ),
        (
            "services",
            None,
            &[
                "ip daddr . meta l4proto . th dport vmap @service-ips",
                // Node ports on every local address but loopback, as the
                // upstream nftables proxy.
                "fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports",
            ],
        ),
        // A TCP reset refuses a connection at once even where an ICMP
        // error would not reach the client (locally generated packets on
        // some routes); other protocols get port unreachable.
        (
            "reject-chain",
            None,
            &["meta l4proto tcp reject with tcp reset", "reject"],
        ),
        (
            "endpoints-check",
            None,
            &[
                "ip daddr . meta l4proto . th dport vmap @no-endpoint-services",
                "fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @no-endpoint-nodeports",
            ],
        ),
        (
            "nat-prerouting",
            Some("type nat hook prerouting priority dstnat ; policy accept ;"),
            &["jump services"],
        ),
        (
            "nat-output",
            Some("type nat hook output priority -100 ; policy accept ;"),
            &["jump services"],
        ),
        (
            "nat-postrouting",
            Some("type nat hook postrouting priority srcnat ; policy accept ;"),
            &[
                "ct status dnat ip saddr . ip daddr @hairpin jump mark-for-masquerade",
                "jump masquerading",
            ],
        ),
        // Before the filter chains of other tables (priority filter - 10
        // as upstream), and only new connections: established ones keep
        // working whatever happens to their service.
        (
            "filter-input",
            Some("type filter hook input priority -10 ; policy accept ;"),
            &["ct state new jump endpoints-check"],
        ),
        (
            "filter-forward",
            Some("type filter hook forward priority -10 ; policy accept ;"),
            &["ct state new jump endpoints-check"],
        ),
        (
            "filter-output",
            Some("type filter hook output priority -10 ; policy accept ;"),
            &["ct state new jump endpoints-check"],
        ),
    ];
    for (name, hook, rules) in chains {
        match hook {
            Some(h) => {
                let _ = writeln!(out, "add chain {t} {name} {{ {h} }}");
            }
            None => {
                let _ = writeln!(out, "add chain {t} {name}");
            }
        }
        if mode == Full::Repair {
            let _ = writeln!(out, "{}", flush_chain(name));
        }
        for rule in *rules {
            let _ = writeln!(out, "{}", add_rule(name, rule));
        }
    }
}

fn elements(out: &mut String, verb: &str, by_map: &BTreeMap<Map, Vec<String>>) {
    for (map, items) in by_map {
        for chunk in items.chunks(ELEMENTS_PER_STATEMENT) {
            let _ = writeln!(
                out,
                "{verb} element {} {} {{ {} }}",
                t(),
                map.name(),
                chunk.join(", ")
            );
        }
    }
}

fn lines(out: &mut String, lines: &[String]) {
    for l in lines {
        out.push_str(l);
        out.push('\n');
    }
}

/// The whole table in one transaction. Replacing adds the table first so
/// that its delete succeeds whether or not it existed.
pub fn full(
    mode: Full,
    sets: &[String],
    chains: &[String],
    rules: &[String],
    elements_by_map: &BTreeMap<Map, Vec<String>>,
) -> String {
    let t = t();
    let mut out = match mode {
        Full::Replace => format!("add table {t}\ndelete table {t}\nadd table {t}\n"),
        Full::Repair => format!("add table {t}\n"),
    };
    skeleton(&mut out, mode);
    lines(&mut out, sets);
    for c in chains {
        let _ = writeln!(out, "add chain {t} {c}");
        if mode == Full::Repair {
            let _ = writeln!(out, "{}", flush_chain(c));
        }
    }
    lines(&mut out, rules);
    elements(&mut out, "add", elements_by_map);
    out
}

/// The statements of an incremental transaction; empty if there are none.
pub(super) fn partial(tx: &Tx) -> String {
    let t = t();
    let mut out = String::new();
    lines(&mut out, &tx.add_sets);
    for c in &tx.add_chains {
        let _ = writeln!(out, "add chain {t} {c}");
    }
    lines(&mut out, &tx.rules);
    elements(&mut out, "delete", &tx.del_elements);
    elements(&mut out, "add", &tx.add_elements);
    lines(&mut out, &tx.flush_doomed);
    lines(&mut out, &tx.del_chains);
    lines(&mut out, &tx.del_sets);
    out
}

/// Remove the table (`--cleanup`): adding it first makes the delete
/// succeed whether or not it exists.
pub fn cleanup_script() -> String {
    let t = t();
    format!("add table {t}\ndelete table {t}\n")
}
