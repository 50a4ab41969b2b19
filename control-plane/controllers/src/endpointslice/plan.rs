//! From desired endpoints and a Service's existing slices to the fewest
//! writes: endpoints stay in the slice they are in, changed ones are
//! updated in place, new ones fill slices that are written anyway (then
//! any with room), and only then go to new slices of at most 100.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;

use super::desired::{ports_key, PortsKey};

/// Upstream's default `--max-endpoints-per-slice`.
pub const MAX_ENDPOINTS: usize = 100;
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
pub const LABEL_MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "endpointslice-controller.k8s.io";
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";

/// The writes that bring a Service's slices to the desired state.
#[derive(Debug, Default)]
pub struct Plan {
    /// New slices (generateName `<svc>-`).
    pub create: Vec<EndpointSlice>,
    /// Existing slices with new content (resourceVersion kept for the
    /// optimistic write).
    pub update: Vec<EndpointSlice>,
    pub delete: Vec<EndpointSlice>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.create.is_empty() && self.update.is_empty() && self.delete.is_empty()
    }
}

/// The labels every slice of `svc` carries: the service's own, the
/// headless marker, and the two the controller selects its slices by.
pub fn slice_labels(svc: &Service) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = svc
        .labels()
        .iter()
        .filter(|(k, _)| {
            !matches!(
                k.as_str(),
                LABEL_SERVICE_NAME | LABEL_MANAGED_BY | LABEL_HEADLESS
            )
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if headless(svc) {
        labels.insert(LABEL_HEADLESS.into(), String::new());
    }
    labels.insert(LABEL_SERVICE_NAME.into(), svc.name_any());
    labels.insert(LABEL_MANAGED_BY.into(), MANAGED_BY.into());
    labels
}

pub fn headless(svc: &Service) -> bool {
    svc.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None")
}

/// The reference from a slice to its Service (the garbage collector
/// deletes the slices with the Service).
pub fn service_owner(svc: &Service, controller: bool) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Service".into(),
        name: svc.name_any(),
        uid: svc.uid().unwrap_or_default(),
        controller: Some(controller),
        block_owner_deletion: Some(controller),
    }
}

fn endpoint_id(ep: &Endpoint) -> String {
    match ep.target_ref.as_ref().and_then(|r| r.uid.as_deref()) {
        Some(uid) => format!("uid:{uid}"),
        None => format!("ip:{}", ep.addresses.first().map_or("", String::as_str)),
    }
}

fn new_slice(svc: &Service, ports: Vec<EndpointPort>, endpoints: Vec<Endpoint>) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-", svc.name_any())),
            namespace: svc.namespace(),
            labels: Some(slice_labels(svc)),
            owner_references: Some(vec![service_owner(svc, true)]),
            ..Default::default()
        },
        address_type: "IPv4".into(),
        endpoints: Some(endpoints),
        ports: Some(ports),
    }
}

/// Whether a slice's labels and owner are what `svc` wants.
fn meta_current(svc: &Service, s: &EndpointSlice) -> bool {
    let owned = s
        .owner_references()
        .iter()
        .any(|o| Some(&o.uid) == svc.uid().as_ref() && o.controller == Some(true));
    owned && s.labels() == &slice_labels(svc)
}

fn with_content(
    svc: &Service,
    s: &EndpointSlice,
    ports: Option<Vec<EndpointPort>>,
    endpoints: Vec<Endpoint>,
) -> EndpointSlice {
    let mut out = s.clone();
    out.metadata.labels = Some(slice_labels(svc));
    let mut owners: Vec<OwnerReference> = s
        .owner_references()
        .iter()
        .filter(|o| o.kind != "Service")
        .cloned()
        .collect();
    owners.push(service_owner(svc, true));
    out.metadata.owner_references = Some(owners);
    out.metadata.managed_fields = None;
    if let Some(p) = ports {
        out.ports = Some(p);
    }
    out.endpoints = Some(endpoints);
    out
}

/// A slice in progress: what it will hold and whether that differs.
struct Work<'a> {
    slice: &'a EndpointSlice,
    key: PortsKey,
    endpoints: Vec<Endpoint>,
    changed: bool,
}

/// Plan the writes for `svc` given the desired endpoint groups (by port
/// list) and its existing managed slices.
pub fn plan(
    svc: &Service,
    groups: BTreeMap<PortsKey, (Vec<EndpointPort>, Vec<Endpoint>)>,
    existing: &[&EndpointSlice],
) -> Plan {
    let mut out = Plan::default();
    let mut existing: Vec<&EndpointSlice> = existing.to_vec();
    existing.sort_by_key(|s| s.name_any());
    let total: usize = groups.values().map(|(_, e)| e.len()).sum();
    if total == 0 {
        // No endpoints: one placeholder slice (no ports, no endpoints) says
        // so, as upstream keeps one.
        let is_placeholder = |s: &EndpointSlice| {
            s.endpoints.as_ref().is_none_or(Vec::is_empty)
                && s.ports.as_ref().is_none_or(Vec::is_empty)
        };
        let keep = existing.iter().position(|s| is_placeholder(s));
        match keep {
            Some(i) if !meta_current(svc, existing[i]) => {
                out.update
                    .push(with_content(svc, existing[i], Some(Vec::new()), Vec::new()));
            }
            Some(_) => {}
            None => out.create.push(new_slice(svc, Vec::new(), Vec::new())),
        }
        for (i, s) in existing.iter().enumerate() {
            if Some(i) != keep {
                out.delete.push((*s).clone());
            }
        }
        reuse_deleted(svc, &mut out);
        return out;
    }

    // Desired endpoints by id, per group; taken out as slices claim them.
    let mut wanted: BTreeMap<PortsKey, (Vec<EndpointPort>, Vec<Option<Endpoint>>)> =
        BTreeMap::new();
    let mut index: HashMap<(PortsKey, String), usize> = HashMap::new();
    for (key, (ports, eps)) in groups {
        for (i, ep) in eps.iter().enumerate() {
            index.insert((key.clone(), endpoint_id(ep)), i);
        }
        wanted.insert(key, (ports, eps.into_iter().map(Some).collect()));
    }

    let mut work: Vec<Work> = Vec::new();
    for s in existing {
        let key = ports_key(s.ports.as_deref().unwrap_or_default());
        let Some((_, group)) = wanted.get_mut(&key) else {
            out.delete.push(s.clone());
            continue;
        };
        let mut changed = !meta_current(svc, s);
        let mut endpoints = Vec::new();
        for ep in s.endpoints.iter().flatten() {
            let taken = index
                .get(&(key.clone(), endpoint_id(ep)))
                .and_then(|&i| group[i].take());
            match taken {
                Some(d) => {
                    changed |= d != *ep;
                    endpoints.push(d);
                }
                None => changed = true,
            }
        }
        work.push(Work {
            slice: s,
            key,
            endpoints,
            changed,
        });
    }

    for (key, (ports, group)) in wanted {
        let mut fresh: Vec<Endpoint> = group.into_iter().flatten().collect();
        if fresh.is_empty() {
            continue;
        }
        // Slices written anyway first, then the fullest ones with room
        // (fewest writes, fewest slices).
        let mut slots: Vec<usize> = (0..work.len()).filter(|&i| work[i].key == key).collect();
        slots.sort_by_key(|&i| (!work[i].changed, std::cmp::Reverse(work[i].endpoints.len())));
        for i in slots {
            let room = MAX_ENDPOINTS.saturating_sub(work[i].endpoints.len());
            if room == 0 || fresh.is_empty() {
                continue;
            }
            let n = room.min(fresh.len());
            work[i].endpoints.extend(fresh.drain(..n));
            work[i].changed = true;
        }
        while !fresh.is_empty() {
            let n = MAX_ENDPOINTS.min(fresh.len());
            let chunk: Vec<Endpoint> = fresh.drain(..n).collect();
            out.create.push(new_slice(svc, ports.clone(), chunk));
        }
    }

    for w in work {
        if w.endpoints.is_empty() {
            out.delete.push(w.slice.clone());
        } else if w.changed {
            out.update
                .push(with_content(svc, w.slice, None, w.endpoints));
        }
    }
    reuse_deleted(svc, &mut out);
    out
}

/// Turn creates into updates of slices that would be deleted (upstream's
/// finalize step): one write instead of two, and the name stays. Only
/// slices this Service owns, of the same address type, are reused (not a
/// slice of an earlier Service of the same name, still being collected).
fn reuse_deleted(svc: &Service, p: &mut Plan) {
    let mut i = 0;
    while i < p.delete.len() && !p.create.is_empty() {
        let old = &p.delete[i];
        let owned = old
            .owner_references()
            .iter()
            .any(|o| Some(&o.uid) == svc.uid().as_ref());
        if !owned || old.address_type != "IPv4" {
            i += 1;
            continue;
        }
        let old = p.delete.remove(i);
        let Some(new) = p.create.pop() else {
            break;
        };
        let ports = new.ports.unwrap_or_default();
        let endpoints = new.endpoints.unwrap_or_default();
        p.update
            .push(with_content(svc, &old, Some(ports), endpoints));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ObjectReference;
    use serde_json::json;

    fn svc() -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "svc-uid", "labels": {"team": "a"}},
            "spec": {"selector": {"app": "web"}},
        }))
        .unwrap()
    }

    fn ep(i: usize) -> Endpoint {
        Endpoint {
            addresses: vec![format!("10.0.{}.{}", i / 250, i % 250 + 1)],
            target_ref: Some(ObjectReference {
                uid: Some(format!("pod-{i}")),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn port(p: i32) -> Vec<EndpointPort> {
        vec![EndpointPort {
            name: Some(String::new()),
            port: Some(p),
            protocol: Some("TCP".into()),
            app_protocol: None,
        }]
    }

    fn groups(
        p: i32,
        eps: Vec<Endpoint>,
    ) -> BTreeMap<PortsKey, (Vec<EndpointPort>, Vec<Endpoint>)> {
        let mut g = BTreeMap::new();
        g.insert(ports_key(&port(p)), (port(p), eps));
        g
    }

    fn existing(name: &str, p: i32, eps: Vec<Endpoint>) -> EndpointSlice {
        let s = svc();
        let mut e = new_slice(&s, port(p), eps);
        e.metadata.name = Some(name.into());
        e.metadata.generate_name = None;
        e
    }

    #[test]
    fn splits_into_slices_of_at_most_100() {
        let p = plan(&svc(), groups(80, (0..250).map(ep).collect()), &[]);
        let sizes: Vec<usize> = p
            .create
            .iter()
            .map(|s| s.endpoints.as_ref().unwrap().len())
            .collect();
        assert_eq!(sizes, vec![100, 100, 50]);
        let s = &p.create[0];
        assert_eq!(s.metadata.generate_name.as_deref(), Some("web-"));
        assert_eq!(s.labels()[LABEL_SERVICE_NAME], "web");
        assert_eq!(s.labels()[LABEL_MANAGED_BY], MANAGED_BY);
        assert_eq!(s.labels()["team"], "a");
        assert_eq!(s.owner_references()[0].uid, "svc-uid");
    }

    #[test]
    fn unchanged_is_no_write_and_changes_stay_in_place() {
        let a = existing("web-a", 80, (0..3).map(ep).collect());
        let p = plan(&svc(), groups(80, (0..3).map(ep).collect()), &[&a]);
        assert!(p.is_empty(), "{p:?}");
        // One endpoint changes, one goes, one comes: one update, no create.
        let mut want: Vec<Endpoint> = vec![ep(0), ep(2), ep(7)];
        want[0].node_name = Some("n2".into());
        let p = plan(&svc(), groups(80, want), &[&a]);
        assert!(p.create.is_empty() && p.delete.is_empty());
        let got = p.update[0].endpoints.as_ref().unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].node_name.as_deref(), Some("n2"));
        assert_eq!(got[2].addresses, ep(7).addresses);
    }

    #[test]
    fn port_change_replaces_slices_and_empty_means_placeholder() {
        let a = existing("web-a", 80, (0..3).map(ep).collect());
        // A new port list reuses the old slice instead of create + delete.
        let p = plan(&svc(), groups(81, (0..3).map(ep).collect()), &[&a]);
        assert!(p.create.is_empty() && p.delete.is_empty());
        assert_eq!(p.update[0].name_any(), "web-a");
        assert_eq!(p.update[0].ports, Some(port(81)));
        let p = plan(&svc(), BTreeMap::new(), &[&a]);
        assert!(p.create.is_empty() && p.delete.is_empty());
        assert!(p.update[0].endpoints.as_ref().unwrap().is_empty());
        assert!(p.update[0].ports.as_ref().unwrap().is_empty());
        // A slice of another owner is not reused.
        let mut foreign = a.clone();
        foreign.metadata.owner_references = None;
        let p = plan(&svc(), BTreeMap::new(), &[&foreign]);
        assert_eq!((p.create.len(), p.delete.len()), (1, 1));
        let placeholder = existing("web-b", 0, Vec::new());
        let mut placeholder = placeholder;
        placeholder.ports = Some(Vec::new());
        let p = plan(&svc(), BTreeMap::new(), &[&placeholder]);
        assert!(p.is_empty(), "{p:?}");
    }
}
