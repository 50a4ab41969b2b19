//! What a Service's endpoints should be, from its selector and the pods:
//! one endpoint per selected pod with an IPv4 address, grouped by the
//! ports that pod resolves the service's target ports to.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ObjectReference, Pod, Service, ServicePort};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

/// A port list in a comparable form: (name, port, protocol, appProtocol).
pub type PortsKey = Vec<(String, i32, String, String)>;

/// The key of a port list, as it orders and compares.
pub fn ports_key(ports: &[EndpointPort]) -> PortsKey {
    ports
        .iter()
        .map(|p| {
            (
                p.name.clone().unwrap_or_default(),
                p.port.unwrap_or_default(),
                p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                p.app_protocol.clone().unwrap_or_default(),
            )
        })
        .collect()
}

/// One selected pod's endpoint and the ports it serves.
#[derive(Debug, Clone, PartialEq)]
pub struct PodEndpoint {
    pub pod: Pod,
    pub ip: String,
    pub ports: Vec<EndpointPort>,
    /// Pod Ready (the endpoint's `serving`).
    pub ready: bool,
    pub terminating: bool,
}

/// The service's selector, if it selects pods at all (no selector, or an
/// empty one, means its endpoints are managed by someone else).
pub fn selector(svc: &Service) -> Option<&BTreeMap<String, String>> {
    let spec = svc.spec.as_ref()?;
    if spec.type_.as_deref() == Some("ExternalName") {
        return None;
    }
    spec.selector.as_ref().filter(|s| !s.is_empty())
}

/// Whether `pod` carries every label of `sel`.
pub fn selects(sel: &BTreeMap<String, String>, pod: &Pod) -> bool {
    kube_util::selector::map_matches(sel, pod.metadata.labels.as_ref())
}

/// The pod's IPv4 address, if it has one.
pub fn pod_ipv4(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    let from_list = status
        .pod_ips
        .iter()
        .flatten()
        .map(|p| p.ip.as_str())
        .find(|ip| ip.parse::<std::net::Ipv4Addr>().is_ok());
    let ip = from_list.or_else(|| {
        status
            .pod_ip
            .as_deref()
            .filter(|ip| ip.parse::<std::net::Ipv4Addr>().is_ok())
    })?;
    Some(ip.to_string())
}

/// Pod condition Ready is True.
pub fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn pod_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// The container port named `name` with `protocol`, as upstream's FindPort.
fn named_port(pod: &Pod, name: &str, protocol: &str) -> Option<i32> {
    let spec = pod.spec.as_ref()?;
    spec.containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| {
            p.name.as_deref() == Some(name) && p.protocol.as_deref().unwrap_or("TCP") == protocol
        })
        .map(|p| p.container_port)
}

/// The ports `pod` serves for `svc`: each service port's targetPort, a
/// number or a named container port. A name the pod lacks leaves that
/// port out for this pod (upstream logs and skips it too).
pub fn pod_ports(svc: &Service, pod: &Pod) -> Vec<EndpointPort> {
    let ports: &[ServicePort] = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_deref())
        .unwrap_or_default();
    ports
        .iter()
        .filter_map(|sp| {
            let protocol = sp.protocol.clone().unwrap_or_else(|| "TCP".into());
            let port = match &sp.target_port {
                None => sp.port,
                Some(IntOrString::Int(n)) => *n,
                Some(IntOrString::String(s)) => match s.parse::<i32>() {
                    Ok(n) => n,
                    Err(_) => named_port(pod, s, &protocol)?,
                },
            };
            Some(EndpointPort {
                name: Some(sp.name.clone().unwrap_or_default()),
                port: Some(port),
                protocol: Some(protocol),
                app_protocol: sp.app_protocol.clone(),
            })
        })
        .collect()
}

/// The pods of `svc`, as endpoints: selected, with an IPv4 address, and
/// not finished (terminating pods stay, marked so).
pub fn pod_endpoints<'a>(
    svc: &Service,
    pods: impl IntoIterator<Item = &'a Pod>,
) -> Vec<PodEndpoint> {
    let Some(sel) = selector(svc) else {
        return Vec::new();
    };
    let ns = svc.namespace().unwrap_or_default();
    let mut out: Vec<PodEndpoint> = pods
        .into_iter()
        .filter(|p| p.namespace().as_deref() == Some(ns.as_str()))
        .filter(|p| selects(sel, p) && !pod_terminal(p))
        .filter_map(|p| {
            let ip = pod_ipv4(p)?;
            Some(PodEndpoint {
                ip,
                ports: pod_ports(svc, p),
                ready: pod_ready(p),
                terminating: p.metadata.deletion_timestamp.is_some(),
                pod: p.clone(),
            })
        })
        .collect();
    // Stable order: new slices and Endpoints come out the same every time.
    out.sort_by(|a, b| {
        a.ip.cmp(&b.ip)
            .then_with(|| a.pod.name_any().cmp(&b.pod.name_any()))
    });
    out
}

/// A reference to the pod, as endpoints carry it.
pub fn pod_ref(pod: &Pod) -> ObjectReference {
    ObjectReference {
        kind: Some("Pod".into()),
        namespace: pod.namespace(),
        name: Some(pod.name_any()),
        uid: pod.uid(),
        ..Default::default()
    }
}

/// The pod's hostname, if it asked for one under this service's name.
pub fn hostname(svc: &Service, pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    let h = spec.hostname.as_deref().filter(|h| !h.is_empty())?;
    (spec.subdomain.as_deref() == Some(svc.name_any().as_str())).then(|| h.to_string())
}

/// The EndpointSlice endpoint for a pod. `ready` is never true for a
/// terminating pod unless the service publishes not-ready addresses
/// (upstream keeps that for compatibility); `serving` is plain readiness.
pub fn slice_endpoint(svc: &Service, pe: &PodEndpoint) -> Endpoint {
    let publish = svc
        .spec
        .as_ref()
        .and_then(|s| s.publish_not_ready_addresses)
        .unwrap_or(false);
    let node = pe
        .pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .filter(|n| !n.is_empty());
    Endpoint {
        addresses: vec![pe.ip.clone()],
        conditions: Some(EndpointConditions {
            ready: Some(publish || (pe.ready && !pe.terminating)),
            serving: Some(publish || pe.ready),
            terminating: Some(pe.terminating),
        }),
        hostname: hostname(svc, &pe.pod),
        node_name: node,
        target_ref: Some(pod_ref(&pe.pod)),
        ..Default::default()
    }
}

/// Desired slice endpoints grouped by port list (each slice carries one).
pub fn slice_groups(
    svc: &Service,
    pods: &[PodEndpoint],
) -> BTreeMap<PortsKey, (Vec<EndpointPort>, Vec<Endpoint>)> {
    let mut out: BTreeMap<PortsKey, (Vec<EndpointPort>, Vec<Endpoint>)> = BTreeMap::new();
    for pe in pods {
        let entry = out
            .entry(ports_key(&pe.ports))
            .or_insert_with(|| (pe.ports.clone(), Vec::new()));
        entry.1.push(slice_endpoint(svc, pe));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(v: serde_json::Value) -> Service {
        serde_json::from_value(v).unwrap()
    }

    fn pod(name: &str, ip: Option<&str>, ready: bool, port_name: &str, port: i32) -> Pod {
        let mut status = json!({"phase": "Running", "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]});
        if let Some(ip) = ip {
            status["podIP"] = json!(ip);
            status["podIPs"] = json!([{"ip": ip}]);
        }
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"), "labels": {"app": "web"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "ports": [{"name": port_name, "containerPort": port}]}]},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn named_ports_resolve_per_pod_and_group_endpoints() {
        let s = svc(json!({
            "metadata": {"name": "web", "namespace": "ns"},
            "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "web", "protocol": "TCP"}]},
        }));
        let pods = [
            pod("a", Some("10.0.0.2"), true, "web", 8080),
            pod("b", Some("10.0.0.1"), false, "web", 9090),
            pod("c", None, true, "web", 8080),
            pod("d", Some("10.0.0.3"), true, "other", 8080),
        ];
        let pes = pod_endpoints(&s, pods.iter());
        assert_eq!(
            pes.iter().map(|p| p.ip.as_str()).collect::<Vec<_>>(),
            vec!["10.0.0.1", "10.0.0.2", "10.0.0.3"],
            "pods without an IP are left out"
        );
        let groups = slice_groups(&s, &pes);
        assert_eq!(
            groups.len(),
            3,
            "8080, 9090 and the pod without the named port"
        );
        let (ports, eps) =
            &groups[&vec![("http".to_string(), 8080, "TCP".to_string(), String::new())]];
        assert_eq!(ports[0].port, Some(8080));
        assert_eq!(eps[0].addresses, vec!["10.0.0.2".to_string()]);
        assert_eq!(
            eps[0].target_ref.as_ref().unwrap().name.as_deref(),
            Some("a")
        );
        let b = &groups[&vec![("http".to_string(), 9090, "TCP".to_string(), String::new())]].1[0];
        let c = b.conditions.as_ref().unwrap();
        assert_eq!(
            (c.ready, c.serving, c.terminating),
            (Some(false), Some(false), Some(false))
        );
        assert!(groups.contains_key(&Vec::new()));
    }

    #[test]
    fn terminating_pods_serve_but_are_not_ready() {
        let s = svc(json!({
            "metadata": {"name": "web", "namespace": "ns"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
        }));
        let mut p = pod("a", Some("10.0.0.2"), true, "x", 1);
        p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::now(),
        ));
        let pes = pod_endpoints(&s, [&p]);
        let ep = slice_endpoint(&s, &pes[0]);
        let c = ep.conditions.unwrap();
        assert_eq!(
            (c.ready, c.serving, c.terminating),
            (Some(false), Some(true), Some(true))
        );
        // publishNotReadyAddresses: always ready.
        let mut s2 = s.clone();
        s2.spec.as_mut().unwrap().publish_not_ready_addresses = Some(true);
        let c = slice_endpoint(&s2, &pes[0]).conditions.unwrap();
        assert_eq!(c.ready, Some(true));
    }

    #[test]
    fn no_selector_no_endpoints() {
        let s = svc(
            json!({"metadata": {"name": "x", "namespace": "ns"}, "spec": {"ports": [{"port": 80}]}}),
        );
        let p = pod("a", Some("10.0.0.2"), true, "x", 1);
        assert!(pod_endpoints(&s, [&p]).is_empty());
        assert!(selector(&s).is_none());
    }
}
