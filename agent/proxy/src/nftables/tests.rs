use std::net::Ipv4Addr;

use super::*;
use crate::model::{Endpoint, Protocol};

fn svc(name: &str, last: u8) -> ServicePort {
    let name = ServicePortName::new("default", name, "", Protocol::Tcp);
    ServicePort::cluster_ip(name, Ipv4Addr::new(198, 19, 0, last), 80)
}

fn eps(lasts: &[u8]) -> Targets {
    Targets::of(
        lasts
            .iter()
            .map(|l| Endpoint::ready(Ipv4Addr::new(198, 18, 0, *l), 8080, false))
            .collect(),
    )
}

fn change(s: &ServicePort, t: Targets) -> Change {
    Change {
        namespace: s.name.namespace.clone(),
        name: s.name.name.clone(),
        ports: vec![(s.clone(), t)],
    }
}

#[test]
fn full_sync_replaces_the_table() {
    let mut p = Proxier::new(Some("198.18.0.0/24".into()));
    assert!(p.basis.needs_full_sync());
    let a = svc("a", 1);
    let t = eps(&[10, 11]);
    let (text, stats) = p.full_sync(Full::Replace, [(&a, &t)]);
    assert!(text.starts_with(
        "add table ip skiff-proxy\ndelete table ip skiff-proxy\nadd table ip skiff-proxy\n"
    ));
    assert!(text.contains("add chain ip skiff-proxy cluster-2\n"));
    assert!(text.contains(
        "add element ip skiff-proxy service-ips { 198.19.0.1 . tcp . 80 : goto cluster-2 }"
    ));
    assert_eq!(stats.service_ports, 1);
    p.basis.commit();
    assert!(!p.basis.needs_full_sync());
}

#[test]
fn one_endpoint_change_is_a_few_elements() {
    let mut p = Proxier::new(None);
    let services: Vec<ServicePort> = (1..=50).map(|i| svc(&format!("s{i}"), i)).collect();
    let t = eps(&[10, 11, 12, 13, 14]);
    let all: Vec<(&ServicePort, &Targets)> = services.iter().map(|s| (s, &t)).collect();
    let _ = p.full_sync(Full::Replace, all);
    p.basis.commit();

    // One endpoint replaced: one slot rewritten, nothing else.
    let (text, stats) = p.partial_sync(&[change(&services[7], eps(&[10, 11, 99, 13, 14]))]);
    assert_eq!(
        text,
        "delete element ip skiff-proxy cluster-backends-tcp { 198.19.0.8 . 80 . 2 }\n\
         add element ip skiff-proxy cluster-backends-tcp { 198.19.0.8 . 80 . 2 : 198.18.0.99 . 8080 }\n"
    );
    assert_eq!(stats.elements, 1);

    // One endpoint gone: the last moves into its slot, the count changes.
    let (text, _) = p.partial_sync(&[change(&services[7], eps(&[10, 99, 13, 14]))]);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        text.contains("add chain ip skiff-proxy cluster-4\n"),
        "{text}"
    );
    assert!(lines
        .iter()
        .any(|l| l.contains("service-ips { 198.19.0.8 . tcp . 80 : goto cluster-4 }")));
    assert!(lines
        .iter()
        .any(|l| l.starts_with("delete element") && l.contains("198.19.0.8 . 80 . 4 ")));
    assert!(
        !text.contains("198.19.0.9"),
        "other services untouched:\n{text}"
    );

    // Unchanged: nothing to do.
    let (text, _) = p.partial_sync(&[change(&services[7], eps(&[10, 99, 13, 14]))]);
    assert!(text.is_empty(), "{text}");

    // Deleted: its elements go, the shared chains stay.
    let gone = Change {
        namespace: "default".into(),
        name: "s8".into(),
        ports: Vec::new(),
    };
    let (text, _) = p.partial_sync(&[gone]);
    assert!(text.contains("delete element ip skiff-proxy service-ips { 198.19.0.8 . tcp . 80 }"));
    assert!(!text.contains("add "), "{text}");
    assert!(!text.contains("delete chain"));
}

#[test]
fn shared_hairpin_elements_are_reference_counted() {
    let mut p = Proxier::new(None);
    let (a, b) = (svc("a", 1), svc("b", 2));
    let mut t = eps(&[10]);
    t.cluster[0].local = true;
    let _ = p.full_sync(Full::Replace, [(&a, &t), (&b, &t)]);
    p.basis.commit();
    let (text, _) = p.partial_sync(&[change(&a, Targets::default())]);
    assert!(!text.contains("hairpin"), "b still needs it:\n{text}");
    let (text, _) = p.partial_sync(&[change(&b, Targets::default())]);
    assert!(text.contains("delete element ip skiff-proxy hairpin { 198.18.0.10 . 198.18.0.10 }"));
}

#[test]
fn affinity_chains_are_created_before_use_and_deleted_after() {
    let mut p = Proxier::new(None);
    let mut a = svc("a", 1);
    a.affinity_timeout = Some(30);
    let _ = p.full_sync(Full::Replace, [(&a, &eps(&[10, 11]))]);
    p.basis.commit();
    let (text, _) = p.partial_sync(&[change(&a, eps(&[11, 12]))]);
    let pos = |needle: &str| {
        text.find(needle)
            .unwrap_or_else(|| panic!("{needle} in\n{text}"))
    };
    let sid = "default/a/tcp/p80";
    assert!(
        pos(&format!(
            "add set ip skiff-proxy aff30-{sid}/198.18.0.12/8080"
        )) < pos(&format!(
            "add chain ip skiff-proxy ep-{sid}/198.18.0.12/8080"
        ))
    );
    assert!(
        pos(&format!("flush chain ip skiff-proxy svc-{sid}"))
            < pos(&format!(
                "delete chain ip skiff-proxy ep-{sid}/198.18.0.10/8080"
            ))
    );
    assert!(
        pos(&format!(
            "delete chain ip skiff-proxy ep-{sid}/198.18.0.10/8080"
        )) < pos(&format!(
            "delete set ip skiff-proxy aff30-{sid}/198.18.0.10/8080"
        ))
    );

    // The periodic repair rewrites the table in place.
    let (text, _) = p.full_sync(Full::Repair, [(&a, &eps(&[11, 12]))]);
    assert!(!text.contains("delete table"));
    assert!(text.contains("flush map ip skiff-proxy service-ips"));
    assert!(
        !text.contains(&format!("flush set ip skiff-proxy aff30-{sid}")),
        "affinity kept"
    );
}
