//! The core/v1 Endpoints object of a Service (upstream's endpoints
//! controller), kept beside the slices for the clients that still read
//! it: ready pods in `addresses`, the others in `notReadyAddresses`,
//! one subset per distinct port list.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, Service,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;

use super::desired::{hostname, pod_ref, ports_key, PodEndpoint, PortsKey};
use super::plan::{headless, service_owner, LABEL_HEADLESS};

/// Tells the EndpointSlice mirroring controller (upstream) to leave this
/// object alone: its slices come from the Service directly.
pub const LABEL_SKIP_MIRROR: &str = "endpointslice.kubernetes.io/skip-mirror";

fn labels(svc: &Service) -> BTreeMap<String, String> {
    let mut l: BTreeMap<String, String> = svc
        .labels()
        .iter()
        .filter(|(k, _)| k.as_str() != LABEL_HEADLESS)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if headless(svc) {
        l.insert(LABEL_HEADLESS.into(), String::new());
    }
    l.insert(LABEL_SKIP_MIRROR.into(), "true".into());
    l
}

/// The Endpoints `svc` should have. Terminating pods are left out unless
/// the service publishes not-ready addresses (as upstream).
pub fn desired(svc: &Service, pods: &[PodEndpoint]) -> Endpoints {
    let publish = svc
        .spec
        .as_ref()
        .and_then(|s| s.publish_not_ready_addresses)
        .unwrap_or(false);
    type Subset = (
        Vec<EndpointPort>,
        Vec<EndpointAddress>,
        Vec<EndpointAddress>,
    );
    let mut subsets: BTreeMap<PortsKey, Subset> = BTreeMap::new();
    for pe in pods {
        if pe.terminating && !publish {
            continue;
        }
        let entry = subsets.entry(ports_key(&pe.ports)).or_insert_with(|| {
            let ports = pe
                .ports
                .iter()
                .map(|p| EndpointPort {
                    name: p.name.clone().filter(|n| !n.is_empty()),
                    port: p.port.unwrap_or_default(),
                    protocol: p.protocol.clone(),
                    app_protocol: p.app_protocol.clone(),
                })
                .collect();
            (ports, Vec::new(), Vec::new())
        });
        let addr = EndpointAddress {
            ip: pe.ip.clone(),
            hostname: hostname(svc, &pe.pod),
            node_name: pe
                .pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .filter(|n| !n.is_empty()),
            target_ref: Some(pod_ref(&pe.pod)),
        };
        if publish || pe.ready {
            entry.1.push(addr);
        } else {
            entry.2.push(addr);
        }
    }
    let non_empty = |v: Vec<EndpointAddress>| (!v.is_empty()).then_some(v);
    let subsets: Vec<EndpointSubset> = subsets
        .into_values()
        .map(|(ports, ready, not_ready)| EndpointSubset {
            addresses: non_empty(ready),
            not_ready_addresses: non_empty(not_ready),
            ports: (!ports.is_empty()).then_some(ports),
        })
        .collect();
    Endpoints {
        metadata: ObjectMeta {
            name: Some(svc.name_any()),
            namespace: svc.namespace(),
            labels: Some(labels(svc)),
            owner_references: Some(vec![service_owner(svc, false)]),
            ..Default::default()
        },
        subsets: (!subsets.is_empty()).then_some(subsets),
    }
}

/// Whether `have` already says what `want` does (content, labels, owner).
pub fn up_to_date(have: &Endpoints, want: &Endpoints) -> bool {
    have.subsets.clone().unwrap_or_default() == want.subsets.clone().unwrap_or_default()
        && have.labels() == want.labels()
        && have.owner_references() == want.owner_references()
}

#[cfg(test)]
mod tests {
    use super::super::desired::pod_endpoints;
    use super::*;
    use serde_json::json;

    #[test]
    fn ready_and_not_ready_addresses() {
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u"},
            "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]},
        }))
        .unwrap();
        let pod = |name: &str, ip: &str, ready: &str| -> k8s_openapi::api::core::v1::Pod {
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "ns", "uid": name, "labels": {"app": "web"}},
                "spec": {"containers": []},
                "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": ready}]},
            }))
            .unwrap()
        };
        let pods = [pod("a", "10.0.0.1", "True"), pod("b", "10.0.0.2", "False")];
        let e = desired(&svc, &pod_endpoints(&svc, pods.iter()));
        let s = &e.subsets.as_ref().unwrap()[0];
        assert_eq!(s.addresses.as_ref().unwrap()[0].ip, "10.0.0.1");
        assert_eq!(s.not_ready_addresses.as_ref().unwrap()[0].ip, "10.0.0.2");
        assert_eq!(s.ports.as_ref().unwrap()[0].port, 8080);
        assert_eq!(e.labels()[LABEL_SKIP_MIRROR], "true");
        assert!(up_to_date(&e, &e.clone()));
    }
}
