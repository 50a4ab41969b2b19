//! Masquerade of pod traffic that leaves the pod network, as flannel and
//! k3s do: a pod's packet to anything but another pod (the control plane,
//! another node's address, the world) leaves with this node's address,
//! because nothing outside the nodes routes pod CIDRs back. Pod-to-pod
//! traffic, on this node or another, keeps its source.
//!
//! One table of its own, `ip skiff-network`, rewritten whole in one
//! transaction whenever the pod CIDRs change (nodes come and go rarely).

use std::fmt::Write as _;

use super::Cidr;

pub const TABLE: &str = "skiff-network";

/// The table for this node's pod CIDR `local` and every node's `pods`.
pub fn script(local: Cidr, pods: &[Cidr]) -> String {
    let t = format!("ip {TABLE}");
    let mut out = format!("add table {t}\ndelete table {t}\nadd table {t}\n");
    let _ = writeln!(
        out,
        "add set {t} pod-cidrs {{ type ipv4_addr ; flags interval ; }}"
    );
    let mut all: Vec<Cidr> = pods.to_vec();
    all.push(local);
    all.sort();
    all.dedup();
    let elements: Vec<String> = all.iter().map(|(ip, len)| format!("{ip}/{len}")).collect();
    let _ = writeln!(
        out,
        "add element {t} pod-cidrs {{ {} }}",
        elements.join(", ")
    );
    let _ = writeln!(
        out,
        "add chain {t} postrouting {{ type nat hook postrouting priority srcnat ; policy accept ; }}"
    );
    let _ = writeln!(
        out,
        "add rule {t} postrouting ip saddr {}/{} ip daddr != @pod-cidrs masquerade",
        local.0, local.1
    );
    out
}

/// Removing the table: adding it first makes the delete succeed.
pub fn remove_script() -> String {
    format!("add table ip {TABLE}\ndelete table ip {TABLE}\n")
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    #[test]
    fn masquerades_what_leaves_the_pod_network() {
        let local = (Ipv4Addr::new(198, 18, 1, 0), 24);
        let other = (Ipv4Addr::new(198, 18, 2, 0), 24);
        let s = script(local, &[other, local]);
        assert!(s.starts_with("add table ip skiff-network\ndelete table ip skiff-network\n"));
        assert!(
            s.contains("pod-cidrs { 198.18.1.0/24, 198.18.2.0/24 }"),
            "{s}"
        );
        assert!(s.contains("ip saddr 198.18.1.0/24 ip daddr != @pod-cidrs masquerade"));
    }
}
