//! What the proxy programs, read off the API objects: one [`ServicePort`]
//! per port of a Service, and the [`Endpoint`]s its EndpointSlices list
//! for that port (upstream's `ServicePortInfo` and `EndpointInfo`).

use std::collections::BTreeMap;
use std::fmt;
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// Services carrying this label belong to another proxy (upstream's
/// `service.kubernetes.io/service-proxy-name`), so this one leaves them.
pub const SERVICE_PROXY_NAME_LABEL: &str = "service.kubernetes.io/service-proxy-name";
/// The label linking an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Upstream's default sessionAffinityConfig.clientIP.timeoutSeconds.
pub const DEFAULT_AFFINITY_TIMEOUT: u32 = 10_800;

/// A transport protocol a Service port can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// From the API's spelling; unknown protocols are not proxied.
    pub fn parse(s: Option<&str>) -> Option<Protocol> {
        match s.unwrap_or("TCP") {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }

    /// The lower-case name nft and iptables use.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

/// Identifies one port of one Service: upstream's `ServicePortName`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServicePortName {
    pub namespace: String,
    pub name: String,
    /// The port's name ("" for a single unnamed port).
    pub port: String,
    pub protocol: Protocol,
}

impl fmt::Display for ServicePortName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)?;
        if !self.port.is_empty() {
            write!(f, ":{}", self.port)?;
        }
        Ok(())
    }
}

impl ServicePortName {
    pub fn new(namespace: &str, name: &str, port: &str, protocol: Protocol) -> ServicePortName {
        ServicePortName {
            namespace: namespace.into(),
            name: name.into(),
            port: port.into(),
            protocol,
        }
    }
}

/// Traffic policy: all endpoints of the cluster, or only this node's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    Cluster,
    Local,
}

/// One Service port as the proxy sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    pub name: ServicePortName,
    pub cluster_ip: Ipv4Addr,
    pub port: u16,
    /// 0 when the service has no node port.
    pub node_port: u16,
    /// `spec.externalIPs` and `status.loadBalancer.ingress[].ip` (IPv4).
    pub external_ips: Vec<Ipv4Addr>,
    /// `sessionAffinity: ClientIP`: the timeout in seconds.
    pub affinity_timeout: Option<u32>,
    pub internal_policy: Policy,
    pub external_policy: Policy,
}

impl ServicePort {
    /// A ClusterIP-only port with the API's defaults: no node port,
    /// external IPs or affinity, both traffic policies Cluster.
    pub fn cluster_ip(name: ServicePortName, ip: Ipv4Addr, port: u16) -> ServicePort {
        ServicePort {
            name,
            cluster_ip: ip,
            port,
            node_port: 0,
            external_ips: Vec::new(),
            affinity_timeout: None,
            internal_policy: Policy::Cluster,
            external_policy: Policy::Cluster,
        }
    }

    /// Whether traffic reaches it from outside the cluster network (node
    /// ports, external and load-balancer IPs): only then does the
    /// external traffic policy matter.
    pub fn has_external(&self) -> bool {
        self.node_port != 0 || !self.external_ips.is_empty()
    }
}

/// One backend of a Service port.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Endpoint {
    pub ip: Ipv4Addr,
    pub port: u16,
    /// On this node (the endpoint's `nodeName` is ours).
    pub local: bool,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
}

impl Endpoint {
    /// A ready endpoint.
    pub fn ready(ip: Ipv4Addr, port: u16, local: bool) -> Endpoint {
        Endpoint {
            ip,
            port,
            local,
            ready: true,
            serving: true,
            terminating: false,
        }
    }
}

/// The Service's ports the proxy handles. Headless services, services of
/// another proxy, ExternalName services and non-IPv4 cluster IPs have
/// none.
pub fn service_ports(svc: &Service) -> Vec<ServicePort> {
    let meta = &svc.metadata;
    if meta
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(SERVICE_PROXY_NAME_LABEL))
    {
        return Vec::new();
    }
    let Some(spec) = &svc.spec else {
        return Vec::new();
    };
    if spec.type_.as_deref() == Some("ExternalName") {
        return Vec::new();
    }
    let Some(cluster_ip) = spec
        .cluster_ip
        .as_deref()
        .and_then(|ip| ip.parse::<Ipv4Addr>().ok())
    else {
        return Vec::new();
    };
    let mut external_ips: Vec<Ipv4Addr> = spec
        .external_ips
        .iter()
        .flatten()
        .filter_map(|ip| ip.parse().ok())
        .collect();
    let ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref());
    external_ips.extend(
        ingress
            .into_iter()
            .flatten()
            .filter_map(|i| i.ip.as_deref()?.parse::<Ipv4Addr>().ok()),
    );
    external_ips.sort();
    external_ips.dedup();
    let affinity_timeout = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
        spec.session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            .and_then(|t| u32::try_from(t).ok())
            .filter(|t| *t > 0)
            .unwrap_or(DEFAULT_AFFINITY_TIMEOUT)
    });
    let policy = |p: Option<&String>| match p.map(String::as_str) {
        Some("Local") => Policy::Local,
        _ => Policy::Cluster,
    };
    let namespace = meta.namespace.clone().unwrap_or_else(|| "default".into());
    let name = meta.name.clone().unwrap_or_default();
    spec.ports
        .iter()
        .flatten()
        .filter_map(|p| {
            Some(ServicePort {
                name: ServicePortName {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    port: p.name.clone().unwrap_or_default(),
                    protocol: Protocol::parse(p.protocol.as_deref())?,
                },
                cluster_ip,
                port: u16::try_from(p.port).ok().filter(|p| *p != 0)?,
                node_port: p.node_port.and_then(|n| u16::try_from(n).ok()).unwrap_or(0),
                external_ips: external_ips.clone(),
                affinity_timeout,
                internal_policy: policy(spec.internal_traffic_policy.as_ref()),
                external_policy: policy(spec.external_traffic_policy.as_ref()),
            })
        })
        .collect()
}

/// The endpoints the slices list for each (port name, protocol), merged
/// over the slices and de-duplicated by address and port (an endpoint
/// listed twice while it moves between slices counts once, its readiest
/// listing winning).
pub fn slice_endpoints<'a>(
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
    node_name: &str,
) -> BTreeMap<(String, Protocol), Vec<Endpoint>> {
    let mut out: BTreeMap<(String, Protocol), BTreeMap<(Ipv4Addr, u16), Endpoint>> =
        BTreeMap::new();
    for slice in slices {
        if slice.address_type != "IPv4" {
            continue;
        }
        for port in slice.ports.iter().flatten() {
            let Some(protocol) = Protocol::parse(port.protocol.as_deref()) else {
                continue;
            };
            let Some(number) = port.port.and_then(|p| u16::try_from(p).ok()) else {
                continue;
            };
            let by_addr = out
                .entry((port.name.clone().unwrap_or_default(), protocol))
                .or_default();
            for ep in slice.endpoints.iter().flatten() {
                let c = ep.conditions.as_ref();
                // Upstream: ready unset means ready; serving unset means
                // ready; terminating unset means not terminating.
                let ready = c.and_then(|c| c.ready).unwrap_or(true);
                let endpoint = |ip: Ipv4Addr| Endpoint {
                    ip,
                    port: number,
                    local: ep.node_name.as_deref() == Some(node_name),
                    ready,
                    serving: c.and_then(|c| c.serving).unwrap_or(ready),
                    terminating: c.and_then(|c| c.terminating).unwrap_or(false),
                };
                // Only the first address counts, as upstream.
                let Some(ip) = ep.addresses.first().and_then(|a| a.parse().ok()) else {
                    continue;
                };
                let new = endpoint(ip);
                by_addr
                    .entry((ip, number))
                    .and_modify(|old| {
                        if (new.ready, new.serving) > (old.ready, old.serving) {
                            *old = new.clone();
                        }
                    })
                    .or_insert(new);
            }
        }
    }
    out.into_iter()
        .map(|(k, v)| (k, v.into_values().collect()))
        .collect()
}

/// The endpoints traffic may go to, split as upstream's
/// `CategorizeEndpoints`: ready endpoints when there are any, otherwise
/// the serving terminating ones (so that a rolling update or a scale-down
/// never black-holes a service that still has pods finishing requests).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Targets {
    /// For traffic under the internal policy (ClusterIP, and external
    /// traffic under the Cluster policy).
    pub cluster: Vec<Endpoint>,
    /// This node's endpoints, for external traffic under the Local policy.
    pub local: Vec<Endpoint>,
    /// Whether any endpoint at all could serve: with none, traffic is
    /// rejected; with some but none usable under a Local policy, dropped.
    pub any: bool,
}

impl Targets {
    /// Usable endpoints as they are: all for cluster traffic, this node's
    /// for local traffic.
    pub fn of(endpoints: Vec<Endpoint>) -> Targets {
        Targets {
            any: !endpoints.is_empty(),
            local: endpoints.iter().filter(|e| e.local).cloned().collect(),
            cluster: endpoints,
        }
    }
}

/// Pick the endpoints of `svc` from all its endpoints.
pub fn targets(svc: &ServicePort, endpoints: &[Endpoint]) -> Targets {
    let usable = |eps: Vec<&Endpoint>| -> Vec<Endpoint> {
        let ready: Vec<Endpoint> = eps
            .iter()
            .filter(|e| e.ready)
            .map(|e| (*e).clone())
            .collect();
        if !ready.is_empty() {
            return ready;
        }
        eps.iter()
            .filter(|e| e.serving && e.terminating)
            .map(|e| (*e).clone())
            .collect()
    };
    let all = usable(endpoints.iter().collect());
    let local = usable(endpoints.iter().filter(|e| e.local).collect());
    let cluster = match svc.internal_policy {
        Policy::Cluster => all.clone(),
        Policy::Local => local.clone(),
    };
    Targets {
        any: !all.is_empty(),
        cluster,
        local,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(yaml: &str) -> Service {
        serde_saphyr::from_str(yaml).unwrap()
    }

    fn slice(yaml: &str) -> EndpointSlice {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn ports_of_a_service() {
        let s = svc(r#"
metadata: {name: web, namespace: prod}
spec:
  clusterIP: 198.19.0.10
  type: NodePort
  externalIPs: [203.0.113.7, "::1"]
  sessionAffinity: ClientIP
  externalTrafficPolicy: Local
  ports:
  - {name: http, port: 80, targetPort: 8080, nodePort: 30080}
  - {name: dns, port: 53, protocol: UDP}
  - {name: odd, port: 9, protocol: ICMP}
status:
  loadBalancer: {ingress: [{ip: 203.0.113.9}, {hostname: lb.example}]}
"#);
        let ports = service_ports(&s);
        assert_eq!(ports.len(), 2, "{ports:?}");
        let http = &ports[0];
        assert_eq!(http.name.to_string(), "prod/web:http");
        assert_eq!(http.name.protocol, Protocol::Tcp);
        assert_eq!(http.cluster_ip, Ipv4Addr::new(198, 19, 0, 10));
        assert_eq!((http.port, http.node_port), (80, 30080));
        assert_eq!(
            http.external_ips,
            vec![Ipv4Addr::new(203, 0, 113, 7), Ipv4Addr::new(203, 0, 113, 9)]
        );
        assert_eq!(http.affinity_timeout, Some(DEFAULT_AFFINITY_TIMEOUT));
        assert_eq!(http.external_policy, Policy::Local);
        assert_eq!(http.internal_policy, Policy::Cluster);
        assert!(http.has_external());
        assert_eq!(ports[1].name.protocol, Protocol::Udp);
        assert_eq!(ports[1].node_port, 0);
    }

    #[test]
    fn services_not_proxied() {
        for yaml in [
            "metadata: {name: h}\nspec: {clusterIP: None, ports: [{port: 80}]}",
            "metadata: {name: x}\nspec: {type: ExternalName, externalName: a.example, ports: [{port: 80}]}",
            "metadata: {name: o, labels: {service.kubernetes.io/service-proxy-name: other}}\nspec: {clusterIP: 198.19.0.1, ports: [{port: 80}]}",
            "metadata: {name: v6}\nspec: {clusterIP: 'fd00::1', ports: [{port: 80}]}",
        ] {
            assert!(service_ports(&svc(yaml)).is_empty(), "{yaml}");
        }
    }

    #[test]
    fn endpoints_merge_slices_and_pick_targets() {
        let a = slice(
            r#"
metadata: {name: web-a, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- {addresses: [198.18.0.10], nodeName: n1}
- {addresses: [198.18.1.10], nodeName: n2, conditions: {ready: false}}
- {addresses: [198.18.1.11], nodeName: n2, conditions: {ready: false, serving: true, terminating: true}}
"#,
        );
        // The same endpoint in a second slice, now ready: it counts once.
        let b = slice(
            r#"
metadata: {name: web-b, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- {addresses: [198.18.1.10], nodeName: n2, conditions: {ready: true}}
"#,
        );
        let v6 = slice("metadata: {name: web-c}\naddressType: IPv6\nendpoints: [{addresses: ['fd00::5']}]\nports: [{name: http, port: 8080}]\n");
        let eps = slice_endpoints([&a, &b, &v6], "n1");
        let http = &eps[&("http".to_string(), Protocol::Tcp)];
        assert_eq!(http.len(), 3);
        assert!(http.iter().all(|e| e.port == 8080));
        assert!(http[0].local && http[0].ready);
        assert!(!http[1].local && http[1].ready, "readiest listing wins");

        let s = &service_ports(&svc(
            "metadata: {name: web}\nspec: {clusterIP: 198.19.0.10, ports: [{name: http, port: 80}]}",
        ))[0];
        let t = targets(s, http);
        let ips: Vec<String> = t.cluster.iter().map(|e| e.ip.to_string()).collect();
        assert_eq!(ips, ["198.18.0.10", "198.18.1.10"], "ready only");
        assert_eq!(t.local.len(), 1);
        assert!(t.any);

        // No ready endpoint left: the serving terminating one takes over.
        let draining: Vec<Endpoint> = http
            .iter()
            .map(|e| Endpoint {
                ready: false,
                ..e.clone()
            })
            .collect();
        let t = targets(s, &draining);
        assert_eq!(t.cluster.len(), 1);
        assert_eq!(t.cluster[0].ip, Ipv4Addr::new(198, 18, 1, 11));
        assert!(t.local.is_empty());

        // Internal policy Local: only this node's endpoints for ClusterIP.
        let local = ServicePort {
            internal_policy: Policy::Local,
            ..s.clone()
        };
        let t = targets(&local, http);
        assert_eq!(t.cluster.len(), 1);
        assert!(t.cluster[0].local);
        assert!(targets(s, &[]) == Targets::default());
    }
}
