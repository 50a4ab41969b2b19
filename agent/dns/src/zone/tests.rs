use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher::Event;

use super::*;

const WEB: &str = "
metadata: {name: web, namespace: default}
spec:
  type: ClusterIP
  clusterIP: 198.19.0.10
  clusterIPs: [198.19.0.10, 'fd00:19::10']
  ports:
  - {name: http, port: 80, protocol: TCP}
  - {name: dns, port: 53, protocol: UDP}
  - {port: 8080}
";

const DB: &str = "
metadata: {name: db, namespace: default}
spec:
  clusterIP: None
  ports: [{name: pg, port: 5432}]
";

const DB_V4: &str = "
metadata: {name: db-v4, namespace: default, labels: {kubernetes.io/service-name: db}}
addressType: IPv4
ports: [{name: pg, port: 15432, protocol: TCP}]
endpoints:
- {addresses: [198.18.0.2], conditions: {ready: true}, hostname: db-0}
- {addresses: [198.18.0.3], conditions: {ready: false}, hostname: db-1}
- {addresses: [198.18.0.4]}
";

const DB_V6: &str = "
metadata: {name: db-v6, namespace: default, labels: {kubernetes.io/service-name: db}}
addressType: IPv6
ports: [{name: pg, port: 15432, protocol: TCP}]
endpoints:
- {addresses: ['fd00:18::2'], conditions: {ready: true}, hostname: db-0}
";

const EXTERNAL: &str = "
metadata: {name: ext, namespace: default}
spec: {type: ExternalName, externalName: db.example.org, ports: [{name: pg, port: 5432}]}
";

struct Fixture {
    services: Writer<Service>,
    slices: Writer<EndpointSlice>,
    zone: Zone,
}

fn fixture(services: &[&str], slices: &[&str]) -> Fixture {
    let mut f = Fixture::empty("cluster.local");
    for s in services {
        f.services.apply_watcher_event(&Event::Apply(yaml(s)));
    }
    for s in slices {
        f.slices.apply_watcher_event(&Event::Apply(yaml(s)));
    }
    f
}

impl Fixture {
    fn empty(domain: &str) -> Fixture {
        let services = Writer::default();
        let slices = Writer::default();
        let zone = Zone::new(domain, services.as_reader(), slices.as_reader()).unwrap();
        Fixture {
            services,
            slices,
            zone,
        }
    }

    fn ask(&self, name: &str, qtype: RecordType) -> Answer {
        self.zone
            .answer(&Query::query(Name::from_ascii(name).unwrap(), qtype))
    }

    /// The local answer, failing the test when the query would be forwarded.
    fn local(&self, name: &str, qtype: RecordType) -> Local {
        match self.ask(name, qtype) {
            Answer::Local(local) => *local,
            Answer::Forward => panic!("{name} {qtype} was forwarded"),
        }
    }

    /// The answers' data, sorted, asserting NOERROR.
    fn data(&self, name: &str, qtype: RecordType) -> Vec<String> {
        let local = self.local(name, qtype);
        assert_eq!(
            local.rcode,
            ResponseCode::NoError,
            "{name} {qtype}: {local:?}"
        );
        strings(&local.answers)
    }
}

fn yaml<T: serde::de::DeserializeOwned>(s: &str) -> T {
    serde_saphyr::from_str(s).unwrap()
}

fn strings(records: &[Record]) -> Vec<String> {
    let mut v: Vec<String> = records
        .iter()
        .map(|r| format!("{} {} {}", r.name, r.record_type(), r.data))
        .collect();
    v.sort();
    v
}

fn assert_nxdomain(f: &Fixture, name: &str, qtype: RecordType) {
    let local = f.local(name, qtype);
    assert_eq!(
        local.rcode,
        ResponseCode::NXDomain,
        "{name} {qtype}: {local:?}"
    );
    assert!(local.answers.is_empty());
    assert_eq!(
        local.soa.as_ref().map(|r| r.name.to_string()),
        Some("cluster.local.".to_string()),
        "a negative answer carries the zone's SOA"
    );
}

fn assert_nodata(f: &Fixture, name: &str, qtype: RecordType) {
    let local = f.local(name, qtype);
    assert_eq!(
        local.rcode,
        ResponseCode::NoError,
        "{name} {qtype}: {local:?}"
    );
    assert!(local.answers.is_empty(), "{name} {qtype}: {local:?}");
    assert!(local.soa.is_some(), "NODATA carries the zone's SOA");
}

#[test]
fn cluster_ip_service_answers_its_cluster_ips_by_family() {
    let f = fixture(&[WEB], &[]);
    let name = "web.default.svc.cluster.local.";
    assert_eq!(
        f.data(name, RecordType::A),
        vec![format!("{name} A 198.19.0.10")]
    );
    assert_eq!(
        f.data(name, RecordType::AAAA),
        vec![format!("{name} AAAA fd00:19::10")]
    );
    let local = f.local(name, RecordType::A);
    assert_eq!(local.answers[0].ttl, TTL);
    assert!(local.soa.is_none());
}

#[test]
fn service_with_only_cluster_ip_set_answers_it() {
    let f = fixture(
        &["metadata: {name: old, namespace: default}\nspec: {clusterIP: 198.19.0.11}"],
        &[],
    );
    assert_eq!(
        f.data("old.default.svc.cluster.local.", RecordType::A),
        vec!["old.default.svc.cluster.local. A 198.19.0.11"]
    );
    assert_nodata(&f, "old.default.svc.cluster.local.", RecordType::AAAA);
}

#[test]
fn headless_service_answers_ready_endpoints_only() {
    let f = fixture(&[DB], &[DB_V4, DB_V6]);
    let name = "db.default.svc.cluster.local.";
    // 198.18.0.3 is not ready; 198.18.0.4 has no conditions: ready.
    assert_eq!(
        f.data(name, RecordType::A),
        vec![
            format!("{name} A 198.18.0.2"),
            format!("{name} A 198.18.0.4")
        ]
    );
    assert_eq!(
        f.data(name, RecordType::AAAA),
        vec![format!("{name} AAAA fd00:18::2")]
    );
}

#[test]
fn headless_service_without_ready_endpoints_is_nodata() {
    let not_ready = "
metadata: {name: db-x, namespace: default, labels: {kubernetes.io/service-name: db}}
addressType: IPv4
endpoints: [{addresses: [198.18.0.3], conditions: {ready: false}}]
";
    let f = fixture(&[DB], &[not_ready]);
    assert_nodata(&f, "db.default.svc.cluster.local.", RecordType::A);
}

#[test]
fn endpoint_in_two_slices_is_answered_once() {
    let again = DB_V4.replace("name: db-v4", "name: db-v4-copy");
    let f = fixture(&[DB], &[DB_V4, &again]);
    assert_eq!(
        f.data("db.default.svc.cluster.local.", RecordType::A).len(),
        2
    );
}

#[test]
fn slices_of_other_services_and_namespaces_are_not_used() {
    let other_service = DB_V4
        .replace("service-name: db", "service-name: web")
        .replace("name: db-v4", "name: web-1");
    let other_namespace = DB_V4.replace("namespace: default", "namespace: other");
    let unlabelled = "
metadata: {name: stray, namespace: default}
addressType: IPv4
endpoints: [{addresses: [198.18.0.9]}]
";
    let f = fixture(&[DB], &[&other_service, &other_namespace, unlabelled]);
    assert_nodata(&f, "db.default.svc.cluster.local.", RecordType::A);
}

#[test]
fn endpoints_of_a_headless_service_have_names() {
    let f = fixture(&[DB], &[DB_V4, DB_V6]);
    // By hostname, both families of the same endpoint.
    let db0 = "db-0.db.default.svc.cluster.local.";
    assert_eq!(
        f.data(db0, RecordType::A),
        vec![format!("{db0} A 198.18.0.2")]
    );
    assert_eq!(
        f.data(db0, RecordType::AAAA),
        vec![format!("{db0} AAAA fd00:18::2")]
    );
    // Without a hostname: the dashed address.
    let dashed = "198-18-0-4.db.default.svc.cluster.local.";
    assert_eq!(
        f.data(dashed, RecordType::A),
        vec![format!("{dashed} A 198.18.0.4")]
    );
    // Not ready: no name. With a hostname: no dashed name either.
    assert_nxdomain(&f, "db-1.db.default.svc.cluster.local.", RecordType::A);
    assert_nxdomain(
        &f,
        "198-18-0-2.db.default.svc.cluster.local.",
        RecordType::A,
    );
}

#[test]
fn endpoint_names_exist_only_for_headless_services() {
    let web_slice = DB_V4
        .replace("service-name: db", "service-name: web")
        .replace("name: db-v4", "name: web-1");
    let f = fixture(&[WEB], &[&web_slice]);
    assert_nxdomain(&f, "db-0.web.default.svc.cluster.local.", RecordType::A);
}

#[test]
fn named_port_srv_of_a_cluster_ip_service_targets_the_service() {
    let f = fixture(&[WEB], &[]);
    let local = f.local("_http._tcp.web.default.svc.cluster.local.", RecordType::SRV);
    assert_eq!(local.rcode, ResponseCode::NoError);
    assert_eq!(
        strings(&local.answers),
        vec![
            "_http._tcp.web.default.svc.cluster.local. SRV 0 100 80 web.default.svc.cluster.local."
        ]
    );
    assert_eq!(
        strings(&local.additionals),
        vec![
            "web.default.svc.cluster.local. A 198.19.0.10",
            "web.default.svc.cluster.local. AAAA fd00:19::10",
        ]
    );
    assert_eq!(
        f.data("_dns._udp.web.default.svc.cluster.local.", RecordType::SRV),
        vec![
            "_dns._udp.web.default.svc.cluster.local. SRV 0 100 53 web.default.svc.cluster.local."
        ]
    );
}

#[test]
fn srv_names_that_do_not_match_a_port_do_not_exist() {
    let f = fixture(&[WEB], &[]);
    // Wrong protocol, unknown port, missing underscores.
    assert_nxdomain(
        &f,
        "_http._udp.web.default.svc.cluster.local.",
        RecordType::SRV,
    );
    assert_nxdomain(
        &f,
        "_nope._tcp.web.default.svc.cluster.local.",
        RecordType::SRV,
    );
    assert_nxdomain(
        &f,
        "http.tcp.web.default.svc.cluster.local.",
        RecordType::SRV,
    );
    // The name exists, but not with address records.
    assert_nodata(
        &f,
        "_http._tcp.web.default.svc.cluster.local.",
        RecordType::A,
    );
    // `_tcp.<svc>` is the empty parent of the TCP port names.
    assert_nodata(&f, "_tcp.web.default.svc.cluster.local.", RecordType::SRV);
    assert_nxdomain(&f, "_sctp.web.default.svc.cluster.local.", RecordType::SRV);
}

#[test]
fn srv_at_the_service_name_lists_every_port() {
    let f = fixture(&[WEB], &[]);
    let name = "web.default.svc.cluster.local.";
    let target = "web.default.svc.cluster.local.";
    assert_eq!(
        f.data(name, RecordType::SRV),
        vec![
            format!("{name} SRV 0 33 53 {target}"),
            format!("{name} SRV 0 33 80 {target}"),
            format!("{name} SRV 0 33 8080 {target}"),
        ]
    );
}

#[test]
fn named_port_srv_of_a_headless_service_targets_each_ready_endpoint() {
    let f = fixture(&[DB], &[DB_V4, DB_V6]);
    let name = "_pg._tcp.db.default.svc.cluster.local.";
    let local = f.local(name, RecordType::SRV);
    // The endpoints' port (the slice's), not the service's.
    assert_eq!(
        strings(&local.answers),
        vec![
            format!("{name} SRV 0 50 15432 198-18-0-4.db.default.svc.cluster.local."),
            format!("{name} SRV 0 50 15432 db-0.db.default.svc.cluster.local."),
        ]
    );
    assert_eq!(
        strings(&local.additionals),
        vec![
            "198-18-0-4.db.default.svc.cluster.local. A 198.18.0.4",
            "db-0.db.default.svc.cluster.local. A 198.18.0.2",
            "db-0.db.default.svc.cluster.local. AAAA fd00:18::2",
        ]
    );
}

#[test]
fn named_port_srv_without_ready_endpoints_is_nodata() {
    let f = fixture(&[DB], &[]);
    assert_nodata(
        &f,
        "_pg._tcp.db.default.svc.cluster.local.",
        RecordType::SRV,
    );
}

#[test]
fn external_name_service_is_a_cname_for_every_type() {
    let f = fixture(&[EXTERNAL], &[]);
    let name = "ext.default.svc.cluster.local.";
    for qtype in [
        RecordType::A,
        RecordType::AAAA,
        RecordType::CNAME,
        RecordType::TXT,
    ] {
        assert_eq!(
            f.data(name, qtype),
            vec![format!("{name} CNAME db.example.org.")],
            "{qtype}"
        );
    }
    assert_eq!(
        f.data("_pg._tcp.ext.default.svc.cluster.local.", RecordType::SRV),
        vec!["_pg._tcp.ext.default.svc.cluster.local. SRV 0 100 5432 db.example.org."]
    );
}

#[test]
fn missing_names_are_nxdomain_and_existing_ones_nodata() {
    let f = fixture(&[WEB], &[]);
    assert_nxdomain(&f, "nope.default.svc.cluster.local.", RecordType::A);
    assert_nxdomain(&f, "web.nope.svc.cluster.local.", RecordType::A);
    assert_nxdomain(&f, "nope.svc.cluster.local.", RecordType::A);
    assert_nxdomain(&f, "nope.cluster.local.", RecordType::A);
    assert_nxdomain(&f, "a.b.c.d.e.f.svc.cluster.local.", RecordType::A);
    // Search-path expansions of an external name (ndots 5) are NXDOMAIN,
    // so the client goes on to the name itself.
    assert_nxdomain(&f, "example.org.default.svc.cluster.local.", RecordType::A);
    assert_nodata(&f, "web.default.svc.cluster.local.", RecordType::TXT);
    assert_nodata(&f, "default.svc.cluster.local.", RecordType::A);
    assert_nodata(&f, "svc.cluster.local.", RecordType::A);
    assert_nodata(&f, "pod.cluster.local.", RecordType::A);
    assert_nodata(&f, "cluster.local.", RecordType::A);
}

#[test]
fn zone_apex_has_an_soa_and_the_schema_version() {
    let f = fixture(&[], &[]);
    assert_eq!(
        f.data("cluster.local.", RecordType::SOA),
        vec!["cluster.local. SOA ns.dns.cluster.local. hostmaster.cluster.local. 1 7200 1800 86400 5"]
    );
    assert_eq!(
        f.data("dns-version.cluster.local.", RecordType::TXT),
        vec![format!("dns-version.cluster.local. TXT {SCHEMA_VERSION}")]
    );
}

#[test]
fn names_are_matched_without_case_and_answered_as_asked() {
    let f = fixture(&[WEB, DB], &[DB_V4]);
    assert_eq!(
        f.data("WEB.Default.SVC.Cluster.LOCAL.", RecordType::A),
        vec!["WEB.Default.SVC.Cluster.LOCAL. A 198.19.0.10"]
    );
    assert_eq!(
        f.data("DB-0.db.default.svc.cluster.local.", RecordType::A),
        vec!["DB-0.db.default.svc.cluster.local. A 198.18.0.2"]
    );
    assert_eq!(
        f.data("_HTTP._TCP.web.default.svc.cluster.local.", RecordType::SRV)
            .len(),
        1
    );
}

#[test]
fn services_are_per_namespace() {
    let other = WEB
        .replace("namespace: default", "namespace: other")
        .replace("198.19.0.10", "198.19.0.20");
    let f = fixture(&[&other], &[]);
    assert_nxdomain(&f, "web.default.svc.cluster.local.", RecordType::A);
    assert_eq!(
        f.data("web.other.svc.cluster.local.", RecordType::A),
        vec!["web.other.svc.cluster.local. A 198.19.0.20"]
    );
}

#[test]
fn deleted_service_disappears() {
    let mut f = fixture(&[WEB], &[]);
    let name = "web.default.svc.cluster.local.";
    assert_eq!(f.data(name, RecordType::A).len(), 1);
    f.services.apply_watcher_event(&Event::Delete(yaml(WEB)));
    assert_nxdomain(&f, name, RecordType::A);
    assert_nxdomain(
        &f,
        "_http._tcp.web.default.svc.cluster.local.",
        RecordType::SRV,
    );
}

#[test]
fn endpoint_that_stops_being_ready_disappears() {
    let mut f = fixture(&[DB], &[DB_V4]);
    let name = "db-0.db.default.svc.cluster.local.";
    assert_eq!(f.data(name, RecordType::A).len(), 1);
    let not_ready = DB_V4.replace(
        "conditions: {ready: true}, hostname: db-0",
        "conditions: {ready: false}, hostname: db-0",
    );
    f.slices
        .apply_watcher_event(&Event::Apply(yaml(&not_ready)));
    assert_nxdomain(&f, name, RecordType::A);
}

#[test]
fn any_returns_every_type_at_the_name() {
    let f = fixture(&[WEB], &[]);
    let answers = f.data("web.default.svc.cluster.local.", RecordType::ANY);
    let types: BTreeSet<&str> = answers
        .iter()
        .map(|a| a.split(' ').nth(1).unwrap())
        .collect();
    assert_eq!(types, BTreeSet::from(["A", "AAAA", "SRV"]));
}

#[test]
fn pod_names_answer_the_address_they_spell() {
    let f = fixture(&[], &[]);
    let v4 = "198-18-0-9.default.pod.cluster.local.";
    assert_eq!(
        f.data(v4, RecordType::A),
        vec![format!("{v4} A 198.18.0.9")]
    );
    assert_nodata(&f, v4, RecordType::AAAA);
    let v6 = "fd00-18--9.any-namespace.pod.cluster.local.";
    assert_eq!(
        f.data(v6, RecordType::AAAA),
        vec![format!("{v6} AAAA fd00:18::9")]
    );
    assert_nxdomain(&f, "not-an-ip.default.pod.cluster.local.", RecordType::A);
    assert_nxdomain(&f, "198-18-0-300.default.pod.cluster.local.", RecordType::A);
}

#[test]
fn reverse_names_of_cluster_ips_and_endpoint_hostnames_are_ours() {
    let f = fixture(&[WEB, DB], &[DB_V4, DB_V6]);
    assert_eq!(
        f.data("10.0.19.198.in-addr.arpa.", RecordType::PTR),
        vec!["10.0.19.198.in-addr.arpa. PTR web.default.svc.cluster.local."]
    );
    let v6 = "0.1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.9.1.0.0.0.0.d.f.ip6.arpa.";
    assert_eq!(
        f.data(v6, RecordType::PTR),
        vec![format!("{v6} PTR web.default.svc.cluster.local.")]
    );
    assert_eq!(
        f.data("2.0.18.198.in-addr.arpa.", RecordType::PTR),
        vec!["2.0.18.198.in-addr.arpa. PTR db-0.db.default.svc.cluster.local."]
    );
    // No hostname, unknown address, partial name, other type: upstream's.
    for (name, qtype) in [
        ("4.0.18.198.in-addr.arpa.", RecordType::PTR),
        ("1.2.0.192.in-addr.arpa.", RecordType::PTR),
        ("19.198.in-addr.arpa.", RecordType::PTR),
        ("10.0.19.198.in-addr.arpa.", RecordType::TXT),
    ] {
        assert_eq!(f.ask(name, qtype), Answer::Forward, "{name} {qtype}");
    }
}

#[test]
fn names_outside_the_cluster_domain_are_forwarded() {
    let f = fixture(&[WEB], &[]);
    for name in [
        "example.org.",
        "web.default.svc.cluster.local.example.org.",
        "notcluster.local.",
        "local.",
        ".",
    ] {
        assert_eq!(f.ask(name, RecordType::A), Answer::Forward, "{name}");
    }
}

#[test]
fn other_classes_in_the_cluster_domain_are_refused() {
    let f = fixture(&[WEB], &[]);
    let mut query = Query::query(
        Name::from_ascii("web.default.svc.cluster.local.").unwrap(),
        RecordType::A,
    );
    query.set_query_class(DNSClass::CH);
    let Answer::Local(local) = f.zone.answer(&query) else {
        panic!("forwarded")
    };
    assert_eq!(local.rcode, ResponseCode::Refused);
}

#[test]
fn cluster_domain_is_configurable() {
    let mut f = Fixture::empty("Example.Internal");
    f.services.apply_watcher_event(&Event::Apply(yaml(WEB)));
    assert_eq!(f.zone.domain().to_string(), "example.internal.");
    assert_eq!(
        f.data("web.default.svc.example.internal.", RecordType::A),
        vec!["web.default.svc.example.internal. A 198.19.0.10"]
    );
    assert_eq!(
        f.ask("web.default.svc.cluster.local.", RecordType::A),
        Answer::Forward
    );
}

#[test]
fn invalid_cluster_domains_are_rejected() {
    for domain in ["", ".", "a..b"] {
        let services = Writer::<Service>::default();
        let slices = Writer::<EndpointSlice>::default();
        assert!(
            Zone::new(domain, services.as_reader(), slices.as_reader()).is_err(),
            "{domain:?}"
        );
    }
}
