//! The cluster domain's records, computed per query from the Service and
//! EndpointSlice stores, as the Kubernetes DNS specification
//! (kubernetes/dns `docs/specification.md`, schema 1.1.0) defines them;
//! where it leaves a choice, CoreDNS's `kubernetes` plugin decides.
//!
//! Nothing is cached or indexed here: a query reads the reflector stores as
//! they are now, so a deleted Service is gone from the next answer.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use hickory_server::proto::op::{Query, ResponseCode};
use hickory_server::proto::rr::rdata::{A, AAAA, CNAME, PTR, SOA, SRV, TXT};
use hickory_server::proto::rr::{DNSClass, Name, RData, Record, RecordType};
use hickory_server::proto::ProtoError;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use kube::runtime::reflector::{ObjectRef, Store};

/// TTL of every cluster record and of negative answers: CoreDNS's default
/// for the kubernetes plugin, short because Services and endpoints change.
pub const TTL: u32 = 5;

/// `dns-version.<domain>` TXT: the specification's schema version.
pub const SCHEMA_VERSION: &str = "1.1.0";

/// The label that links an EndpointSlice to its Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The cluster domain is not a domain name.
#[derive(Debug, thiserror::Error)]
#[error("invalid cluster domain {domain:?}: {source} (expected e.g. cluster.local)")]
pub struct Error {
    domain: String,
    #[source]
    source: ProtoError,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What to do with a query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Not ours: send it to the upstream resolvers.
    Forward,
    /// Ours: answer it with this, authoritatively.
    Local(Box<Local>),
}

/// An authoritative answer from the cluster records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Local {
    /// `NoError` (with no answers: NODATA, the name exists but not with
    /// that type), `NXDomain` (no such name), or `Refused` (not class IN).
    pub rcode: ResponseCode,
    pub answers: Vec<Record>,
    /// Address records of SRV targets, so clients need no second query.
    pub additionals: Vec<Record>,
    /// The zone's SOA on negative answers, for negative caching (RFC 2308).
    pub soa: Option<Record>,
}

/// The cluster domain, answered from the stores.
#[derive(Clone)]
pub struct Zone {
    /// Lower case, fully qualified.
    domain: Name,
    services: Store<Service>,
    slices: Store<EndpointSlice>,
}

impl Zone {
    /// # Errors
    /// `domain` (e.g. `cluster.local`) is not a valid domain name.
    pub fn new(
        domain: &str,
        services: Store<Service>,
        slices: Store<EndpointSlice>,
    ) -> Result<Zone> {
        let bad = |source| Error {
            domain: domain.to_string(),
            source,
        };
        let mut name = Name::from_ascii(domain).map_err(bad)?.to_lowercase();
        name.set_fqdn(true);
        if name.is_root() {
            return Err(bad("the root cannot be the cluster domain".into()));
        }
        Ok(Zone {
            domain: name,
            services,
            slices,
        })
    }

    /// The cluster domain, fully qualified.
    pub fn domain(&self) -> &Name {
        &self.domain
    }

    /// The answer to `query` from the stores as they are now. Names are
    /// matched without regard to case; answers carry the name as asked.
    /// Reverse (PTR) queries for ClusterIPs and headless endpoints with a
    /// hostname are ours, other reverse names are forwarded (CoreDNS's
    /// `fallthrough in-addr.arpa ip6.arpa`).
    pub fn answer(&self, query: &Query) -> Answer {
        let name = &query.name;
        let qtype = query.query_type;
        if !self.domain.zone_of(name) {
            return match qtype {
                RecordType::PTR => self.reverse(name).map_or(Answer::Forward, |answers| {
                    Answer::records(answers, Vec::new())
                }),
                _ => Answer::Forward,
            };
        }
        if !matches!(query.query_class, DNSClass::IN | DNSClass::ANY) {
            return Answer::empty(ResponseCode::Refused, None);
        }
        let node = labels_below(name, &self.domain).and_then(|labels| {
            let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
            self.node(name, &labels)
        });
        let Some(node) = node else {
            return Answer::empty(ResponseCode::NXDomain, Some(self.soa()));
        };
        let answers = node.select(qtype);
        if answers.is_empty() {
            return Answer::empty(ResponseCode::NoError, Some(self.soa()));
        }
        let additionals = if answers.iter().any(|r| r.record_type() == RecordType::SRV) {
            node.additionals
        } else {
            Vec::new()
        };
        Answer::records(answers, additionals)
    }

    /// What exists at `owner`, the name `labels` (left to right, lower
    /// case) below the domain; `None` when nothing does.
    fn node(&self, owner: &Name, labels: &[&str]) -> Option<Node> {
        match labels {
            [] => Some(Node::of(vec![record(owner, RData::SOA(self.soa_data()))])),
            ["dns-version"] => Some(Node::of(vec![record(
                owner,
                RData::TXT(TXT::new(vec![SCHEMA_VERSION.to_string()])),
            )])),
            // Empty non-terminals: names below them exist.
            ["svc"] | ["pod"] => Some(Node::default()),
            [ns, "svc"] => self
                .services
                .find(|s| s.metadata.namespace.as_deref() == Some(*ns))
                .map(|_| Node::default()),
            [svc, ns, "svc"] => self.service(owner, ns, svc),
            [endpoint, svc, ns, "svc"] => self.endpoint(owner, ns, svc, endpoint),
            [port, proto, svc, ns, "svc"] => {
                let port = port.strip_prefix('_')?;
                let proto = proto.strip_prefix('_')?;
                self.srv(owner, ns, svc, Ports::Named { port, proto })
            }
            // `pods insecure`, CoreDNS's default: any well-formed address.
            [ip, _ns, "pod"] => pod_ip(ip).map(|ip| Node::of(vec![record(owner, address(ip))])),
            _ => None,
        }
    }

    /// `<svc>.<ns>.svc.<domain>`: ClusterIPs, the ready endpoints of a
    /// headless service, or a CNAME to an ExternalName; and SRV records for
    /// all its ports (CoreDNS answers SRV at the service name too).
    fn service(&self, owner: &Name, ns: &str, svc: &str) -> Option<Node> {
        let service = self.get_service(ns, svc)?;
        let mut records = match kind(&service) {
            Kind::ExternalName(target) => {
                // Answered for every type: a CNAME stands alone at its name.
                return Some(Node::of(
                    fqdn(target)
                        .map(|t| record(owner, RData::CNAME(CNAME(t))))
                        .into_iter()
                        .collect(),
                ));
            }
            Kind::ClusterIp(ips) => ips
                .into_iter()
                .map(|ip| record(owner, address(ip)))
                .collect(),
            Kind::Headless => self
                .ready_addresses(ns, svc)
                .into_iter()
                .map(|ip| record(owner, address(ip)))
                .collect::<Vec<_>>(),
        };
        let srv = self.srv(owner, ns, svc, Ports::All).unwrap_or_default();
        records.extend(srv.records);
        Some(Node {
            records,
            additionals: srv.additionals,
        })
    }

    /// `<endpoint>.<svc>.<ns>.svc.<domain>` of a headless service: the
    /// ready endpoints named so (their hostname, else their dashed IP).
    /// `_<proto>.<svc>...` is the empty parent of that protocol's SRV names.
    fn endpoint(&self, owner: &Name, ns: &str, svc: &str, endpoint: &str) -> Option<Node> {
        let service = self.get_service(ns, svc)?;
        if let Some(proto) = endpoint.strip_prefix('_') {
            let has = service_ports(&service).any(|p| protocol(p.protocol.as_deref()) == proto);
            return has.then(Node::default);
        }
        if !matches!(kind(&service), Kind::Headless) {
            return None;
        }
        let slices = self.slices_of(ns, svc);
        let ips: BTreeSet<IpAddr> = slices
            .iter()
            .flat_map(|s| ready_endpoints(s))
            .filter(|ep| endpoint_name(ep).as_deref() == Some(endpoint))
            .flat_map(addresses)
            .collect();
        if ips.is_empty() {
            return None;
        }
        Some(Node::of(
            ips.into_iter()
                .map(|ip| record(owner, address(ip)))
                .collect(),
        ))
    }

    /// SRV records of a service's ports (`ports`): for a headless service
    /// one per ready endpoint, targeting the endpoint's name, with the
    /// endpoint's port; otherwise one targeting the service name (the
    /// external name for ExternalName). Weights share 100 equally.
    fn srv(&self, owner: &Name, ns: &str, svc: &str, ports: Ports<'_>) -> Option<Node> {
        let service = self.get_service(ns, svc)?;
        let mut targets = Targets::default();
        match kind(&service) {
            Kind::Headless => {
                for slice in self.slices_of(ns, svc) {
                    for port in slice.ports.iter().flatten() {
                        let (Some(number), true) = (
                            port.port,
                            ports.matches(port.name.as_deref(), port.protocol.as_deref()),
                        ) else {
                            continue;
                        };
                        for ep in ready_endpoints(&slice) {
                            let Some(target) = endpoint_name(ep)
                                .and_then(|n| self.service_name(ns, svc).prepend_label(n).ok())
                            else {
                                continue;
                            };
                            targets.add(to_port(number), target, addresses(ep));
                        }
                    }
                }
            }
            Kind::ExternalName(name) => {
                targets = service_targets(&service, ports, fqdn(name)?, &[]);
            }
            Kind::ClusterIp(ips) => {
                targets = service_targets(&service, ports, self.service_name(ns, svc), &ips);
            }
        }
        // A named port the service does not have: no such name. (The bare
        // service name exists whatever its ports.)
        if targets.ports.is_empty() && matches!(ports, Ports::Named { .. }) {
            let declared = service_ports(&service)
                .any(|p| ports.matches(p.name.as_deref(), p.protocol.as_deref()));
            return declared.then(Node::default);
        }
        let weight = u16::try_from(100 / targets.ports.len().max(1))
            .unwrap_or(100)
            .max(1);
        let records = targets
            .ports
            .into_iter()
            .map(|(port, target)| record(owner, RData::SRV(SRV::new(0, weight, port, target))));
        let additionals = targets
            .addresses
            .into_iter()
            .flat_map(|(target, ips)| ips.into_iter().map(move |ip| record(&target, address(ip))));
        Some(Node {
            records: records.collect(),
            additionals: additionals.collect(),
        })
    }

    /// PTR names of `name` if it is the reverse name of a ClusterIP or of a
    /// ready endpoint with a hostname of a headless service.
    fn reverse(&self, name: &Name) -> Option<Vec<Record>> {
        let net = name.parse_arpa_name().ok()?;
        if net.prefix_len() != net.max_prefix_len() {
            return None;
        }
        let ip = net.addr();
        let mut targets = BTreeSet::new();
        for service in self.services.state() {
            if let (Kind::ClusterIp(ips), Some(ns), Some(svc)) = (
                kind(&service),
                &service.metadata.namespace,
                &service.metadata.name,
            ) {
                if ips.contains(&ip) {
                    targets.insert(self.service_name(ns, svc));
                }
            }
        }
        for slice in self.slices.state() {
            let (Some(ns), Some(svc)) = (
                &slice.metadata.namespace,
                slice
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(SERVICE_NAME_LABEL)),
            ) else {
                continue;
            };
            for ep in ready_endpoints(&slice) {
                let Some(hostname) = ep.hostname.as_deref() else {
                    continue;
                };
                if !addresses(ep).any(|a| a == ip) {
                    continue;
                }
                let headless = self
                    .get_service(ns, svc)
                    .is_some_and(|s| matches!(kind(&s), Kind::Headless));
                if let (true, Ok(target)) =
                    (headless, self.service_name(ns, svc).prepend_label(hostname))
                {
                    targets.insert(target);
                }
            }
        }
        if targets.is_empty() {
            return None;
        }
        Some(
            targets
                .into_iter()
                .map(|t| record(name, RData::PTR(PTR(t))))
                .collect(),
        )
    }

    fn get_service(&self, ns: &str, svc: &str) -> Option<std::sync::Arc<Service>> {
        self.services.get(&ObjectRef::new(svc).within(ns))
    }

    fn slices_of(&self, ns: &str, svc: &str) -> Vec<std::sync::Arc<EndpointSlice>> {
        self.slices.state_filter(|s| {
            s.metadata.namespace.as_deref() == Some(ns)
                && s.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(SERVICE_NAME_LABEL))
                    .is_some_and(|name| name == svc)
                // FQDN slices (deprecated) carry no addresses for DNS.
                && matches!(s.address_type.as_str(), "IPv4" | "IPv6")
        })
    }

    /// The addresses of the service's ready endpoints, each once.
    fn ready_addresses(&self, ns: &str, svc: &str) -> BTreeSet<IpAddr> {
        let slices = self.slices_of(ns, svc);
        slices
            .iter()
            .flat_map(|s| ready_endpoints(s))
            .flat_map(addresses)
            .collect()
    }

    /// `<svc>.<ns>.svc.<domain>`.
    fn service_name(&self, ns: &str, svc: &str) -> Name {
        Name::from_labels([svc, ns, "svc"])
            .and_then(|n| n.append_domain(&self.domain))
            .unwrap_or_else(|_| self.domain.clone())
    }

    fn soa_data(&self) -> SOA {
        let ns = Name::from_labels(["ns", "dns"]).and_then(|n| n.append_domain(&self.domain));
        let admin = Name::from_labels(["hostmaster"]).and_then(|n| n.append_domain(&self.domain));
        // No zone transfers, so the serial never has to move; the refresh,
        // retry and expire values are CoreDNS's.
        SOA::new(
            ns.unwrap_or_else(|_| self.domain.clone()),
            admin.unwrap_or_else(|_| self.domain.clone()),
            1,
            7200,
            1800,
            86400,
            TTL,
        )
    }

    fn soa(&self) -> Record {
        record(&self.domain, RData::SOA(self.soa_data()))
    }
}

impl Answer {
    fn empty(rcode: ResponseCode, soa: Option<Record>) -> Answer {
        Answer::Local(Box::new(Local {
            rcode,
            answers: Vec::new(),
            additionals: Vec::new(),
            soa,
        }))
    }

    fn records(answers: Vec<Record>, additionals: Vec<Record>) -> Answer {
        Answer::Local(Box::new(Local {
            rcode: ResponseCode::NoError,
            answers,
            additionals,
            soa: None,
        }))
    }
}

/// The records at one name, of every type.
#[derive(Debug, Default)]
struct Node {
    records: Vec<Record>,
    /// Address records of the SRV targets among `records`.
    additionals: Vec<Record>,
}

impl Node {
    fn of(records: Vec<Record>) -> Node {
        Node {
            records,
            additionals: Vec::new(),
        }
    }

    /// The answers for `qtype`: a CNAME answers every type (RFC 1034 3.6.2).
    fn select(&self, qtype: RecordType) -> Vec<Record> {
        let cname = self
            .records
            .iter()
            .find(|r| r.record_type() == RecordType::CNAME);
        match (qtype, cname) {
            (RecordType::ANY, _) => self.records.clone(),
            (_, Some(cname)) => vec![cname.clone()],
            _ => self
                .records
                .iter()
                .filter(|r| r.record_type() == qtype)
                .cloned()
                .collect(),
        }
    }
}

/// Which ports an SRV name asks for.
#[derive(Debug, Clone, Copy)]
enum Ports<'a> {
    /// The bare service name: every port.
    All,
    /// `_<port>._<proto>`: the named port with that protocol.
    Named { port: &'a str, proto: &'a str },
}

impl Ports<'_> {
    fn matches(&self, name: Option<&str>, proto: Option<&str>) -> bool {
        match self {
            Ports::All => true,
            Ports::Named { port, proto: p } => name == Some(*port) && protocol(proto) == *p,
        }
    }
}

/// How a service is answered.
enum Kind<'a> {
    ClusterIp(Vec<IpAddr>),
    Headless,
    ExternalName(&'a str),
}

fn kind(service: &Service) -> Kind<'_> {
    let Some(spec) = &service.spec else {
        return Kind::ClusterIp(Vec::new());
    };
    if spec.type_.as_deref() == Some("ExternalName") {
        return Kind::ExternalName(spec.external_name.as_deref().unwrap_or_default());
    }
    if spec.cluster_ip.as_deref() == Some("None") {
        return Kind::Headless;
    }
    // clusterIPs (dual stack) when set, clusterIP before it was.
    let ips = match &spec.cluster_ips {
        Some(ips) if !ips.is_empty() => ips.iter().map(String::as_str).collect(),
        _ => spec.cluster_ip.as_deref().into_iter().collect::<Vec<_>>(),
    };
    Kind::ClusterIp(ips.into_iter().filter_map(|ip| ip.parse().ok()).collect())
}

/// The SRV records of a name, before weights: an endpoint in two slices
/// (one per family) is one target with both addresses.
#[derive(Default)]
struct Targets {
    ports: BTreeSet<(u16, Name)>,
    addresses: BTreeMap<Name, BTreeSet<IpAddr>>,
}

impl Targets {
    fn add(&mut self, port: u16, target: Name, ips: impl IntoIterator<Item = IpAddr>) {
        self.addresses
            .entry(target.clone())
            .or_default()
            .extend(ips);
        self.ports.insert((port, target));
    }
}

/// SRV targets of a service that is not headless: the `target` name (with
/// its addresses) at each of the service's `ports`.
fn service_targets(service: &Service, ports: Ports<'_>, target: Name, ips: &[IpAddr]) -> Targets {
    let mut targets = Targets::default();
    for port in service_ports(service) {
        if ports.matches(port.name.as_deref(), port.protocol.as_deref()) {
            targets.add(to_port(port.port), target.clone(), ips.iter().copied());
        }
    }
    targets
}

fn service_ports(
    service: &Service,
) -> impl Iterator<Item = &k8s_openapi::api::core::v1::ServicePort> {
    service.spec.iter().flat_map(|s| s.ports.iter().flatten())
}

/// The protocol label of a port: `tcp` unless set.
fn protocol(proto: Option<&str>) -> String {
    proto.unwrap_or("TCP").to_ascii_lowercase()
}

/// Endpoints count as ready unless they say they are not: the API defines
/// an unset `ready` as ready.
fn ready_endpoints(slice: &EndpointSlice) -> impl Iterator<Item = &Endpoint> {
    slice
        .endpoints
        .iter()
        .flatten()
        .filter(|ep| ep.conditions.as_ref().and_then(|c| c.ready) != Some(false))
}

fn addresses(ep: &Endpoint) -> impl Iterator<Item = IpAddr> + '_ {
    ep.addresses.iter().filter_map(|a| a.parse().ok())
}

/// An endpoint's DNS label: its hostname, else its first address with the
/// separators as dashes (CoreDNS's `endpointHostname`).
fn endpoint_name(ep: &Endpoint) -> Option<String> {
    if let Some(hostname) = ep.hostname.as_deref().filter(|h| !h.is_empty()) {
        return Some(hostname.to_ascii_lowercase());
    }
    addresses(ep).next().map(dashed)
}

fn dashed(ip: IpAddr) -> String {
    ip.to_string().replace(['.', ':'], "-")
}

/// `a-b-c-d` (or an IPv6 address with dashes for colons) as an address.
fn pod_ip(label: &str) -> Option<IpAddr> {
    if let Ok(ip) = label.replace('-', ".").parse::<std::net::Ipv4Addr>() {
        return Some(IpAddr::V4(ip));
    }
    label
        .replace('-', ":")
        .parse::<std::net::Ipv6Addr>()
        .ok()
        .map(IpAddr::V6)
}

/// The labels of `name` below `domain`, left to right, in lower case;
/// `None` if one is not UTF-8 (no Kubernetes name is).
fn labels_below(name: &Name, domain: &Name) -> Option<Vec<String>> {
    let below = name.iter().count() - domain.iter().count();
    name.iter()
        .take(below)
        .map(|l| std::str::from_utf8(l).ok().map(str::to_ascii_lowercase))
        .collect()
}

fn fqdn(name: &str) -> Option<Name> {
    let mut name = Name::from_ascii(name).ok()?;
    if name.is_root() {
        return None;
    }
    name.set_fqdn(true);
    Some(name)
}

fn to_port(port: i32) -> u16 {
    u16::try_from(port).unwrap_or_default()
}

fn address(ip: IpAddr) -> RData {
    match ip {
        IpAddr::V4(ip) => RData::A(A(ip)),
        IpAddr::V6(ip) => RData::AAAA(AAAA(ip)),
    }
}

fn record(name: &Name, data: RData) -> Record {
    Record::from_rdata(name.clone(), TTL, data)
}

#[cfg(test)]
mod tests;
