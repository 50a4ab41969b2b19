//! The proxy's view of Services and EndpointSlices, and which services
//! changed since the last sync (upstream's service and endpoints change
//! trackers, folded into one). Fed by the watchers; read by the sync loop.

use std::collections::{BTreeSet, HashMap};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::model::{self, ServicePort, Targets, SERVICE_NAME_LABEL};
use super::Change;

/// A namespaced object's name.
pub type Key = (String, String);

fn key_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Key {
    (
        meta.namespace.clone().unwrap_or_else(|| "default".into()),
        meta.name.clone().unwrap_or_default(),
    )
}

/// The service an EndpointSlice belongs to, by its label.
fn owner_of(slice: &EndpointSlice) -> Option<Key> {
    let svc = slice.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?;
    Some((
        slice
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into()),
        svc.clone(),
    ))
}

/// What the watchers have delivered.
#[derive(Debug, Default)]
pub struct State {
    node_name: String,
    services: HashMap<Key, Service>,
    /// Slices by their service, then by slice name.
    slices: HashMap<Key, HashMap<String, EndpointSlice>>,
    /// Services whose rules may be out of date.
    dirty: BTreeSet<Key>,
    /// Objects seen during a relist (watcher `Init` .. `InitDone`): the
    /// relist replaces what was known, so what it did not see is gone.
    relist_services: Option<Vec<Service>>,
    relist_slices: Option<Vec<EndpointSlice>>,
    services_synced: bool,
    slices_synced: bool,
    /// Counters since start, for metrics.
    pub service_changes: u64,
    pub endpoint_changes: u64,
}

impl State {
    pub fn new(node_name: &str) -> State {
        State {
            node_name: node_name.to_string(),
            ..Default::default()
        }
    }

    /// Both watchers have listed once: a sync now sees the whole cluster
    /// (a sync before would delete the rules of services not yet seen).
    pub fn synced(&self) -> bool {
        self.services_synced && self.slices_synced
    }

    pub fn has_changes(&self) -> bool {
        !self.dirty.is_empty()
    }

    pub fn apply_service(&mut self, svc: Service) {
        let key = key_of(&svc.metadata);
        if self.services.get(&key) != Some(&svc) {
            self.service_changes += 1;
            self.dirty.insert(key.clone());
            self.services.insert(key, svc);
        }
    }

    pub fn delete_service(&mut self, svc: &Service) {
        let key = key_of(&svc.metadata);
        if self.services.remove(&key).is_some() {
            self.service_changes += 1;
            self.dirty.insert(key);
        }
    }

    pub fn apply_slice(&mut self, slice: EndpointSlice) {
        let Some(owner) = owner_of(&slice) else {
            return;
        };
        let name = slice.metadata.name.clone().unwrap_or_default();
        let by_name = self.slices.entry(owner.clone()).or_default();
        if by_name.get(&name) != Some(&slice) {
            self.endpoint_changes += 1;
            by_name.insert(name, slice);
            self.dirty.insert(owner);
        }
    }

    pub fn delete_slice(&mut self, slice: &EndpointSlice) {
        let Some(owner) = owner_of(slice) else {
            return;
        };
        let name = slice.metadata.name.clone().unwrap_or_default();
        if let Some(by_name) = self.slices.get_mut(&owner) {
            if by_name.remove(&name).is_some() {
                self.endpoint_changes += 1;
                self.dirty.insert(owner.clone());
            }
            if by_name.is_empty() {
                self.slices.remove(&owner);
            }
        }
    }

    /// A relist of services starts.
    pub fn services_relist(&mut self) {
        self.relist_services = Some(Vec::new());
    }

    pub fn services_relist_item(&mut self, svc: Service) {
        match &mut self.relist_services {
            Some(items) => items.push(svc),
            None => self.apply_service(svc),
        }
    }

    /// The relist is complete: what it did not list was deleted meanwhile.
    pub fn services_relisted(&mut self) {
        let Some(items) = self.relist_services.take() else {
            return;
        };
        let seen: BTreeSet<Key> = items.iter().map(|s| key_of(&s.metadata)).collect();
        let gone: Vec<Service> = self
            .services
            .iter()
            .filter(|(k, _)| !seen.contains(*k))
            .map(|(_, s)| s.clone())
            .collect();
        for svc in gone {
            self.delete_service(&svc);
        }
        for svc in items {
            self.apply_service(svc);
        }
        self.services_synced = true;
    }

    pub fn slices_relist(&mut self) {
        self.relist_slices = Some(Vec::new());
    }

    pub fn slices_relist_item(&mut self, slice: EndpointSlice) {
        match &mut self.relist_slices {
            Some(items) => items.push(slice),
            None => self.apply_slice(slice),
        }
    }

    pub fn slices_relisted(&mut self) {
        let Some(items) = self.relist_slices.take() else {
            return;
        };
        let seen: BTreeSet<(Key, String)> = items
            .iter()
            .filter_map(|s| Some((owner_of(s)?, s.metadata.name.clone().unwrap_or_default())))
            .collect();
        let gone: Vec<EndpointSlice> = self
            .slices
            .iter()
            .flat_map(|(owner, by_name)| {
                by_name
                    .iter()
                    .filter(|(name, _)| !seen.contains(&(owner.clone(), (*name).clone())))
                    .map(|(_, s)| s.clone())
            })
            .collect();
        for slice in gone {
            self.delete_slice(&slice);
        }
        for slice in items {
            self.apply_slice(slice);
        }
        self.slices_synced = true;
    }

    /// The service's ports with their targets; empty when it is gone or
    /// not proxied.
    pub fn ports_of(&self, key: &Key) -> Vec<(ServicePort, Targets)> {
        let Some(svc) = self.services.get(key) else {
            return Vec::new();
        };
        let empty = HashMap::new();
        let slices = self.slices.get(key).unwrap_or(&empty);
        let endpoints = model::slice_endpoints(slices.values(), &self.node_name);
        model::service_ports(svc)
            .into_iter()
            .map(|port| {
                let eps = endpoints
                    .get(&(port.name.port.clone(), port.name.protocol))
                    .map(Vec::as_slice)
                    .unwrap_or(&[]);
                let targets = model::targets(&port, eps);
                (port, targets)
            })
            .collect()
    }

    /// Every proxied service port, for a full sync; clears the changes.
    pub fn all(&mut self) -> Vec<(ServicePort, Targets)> {
        self.dirty.clear();
        let mut keys: Vec<&Key> = self.services.keys().collect();
        keys.sort();
        keys.into_iter().flat_map(|k| self.ports_of(k)).collect()
    }

    /// The services changed since the last call, with what they are now.
    pub fn take_changes(&mut self) -> Vec<Change> {
        std::mem::take(&mut self.dirty)
            .into_iter()
            .map(|key| Change {
                ports: self.ports_of(&key),
                namespace: key.0,
                name: key.1,
            })
            .collect()
    }

    pub fn service_count(&self) -> usize {
        self.services.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(name: &str, ip: &str) -> Service {
        serde_saphyr::from_str(&format!(
            "metadata: {{name: {name}, namespace: default}}\nspec: {{clusterIP: {ip}, ports: [{{port: 80}}]}}"
        ))
        .unwrap()
    }

    fn slice(name: &str, svc: &str, ips: &[&str]) -> EndpointSlice {
        let eps: Vec<String> = ips
            .iter()
            .map(|ip| format!("{{addresses: [{ip}], nodeName: n1}}"))
            .collect();
        serde_saphyr::from_str(&format!(
            "metadata: {{name: {name}, namespace: default, labels: {{kubernetes.io/service-name: {svc}}}}}\naddressType: IPv4\nports: [{{port: 8080}}]\nendpoints: [{}]",
            eps.join(", ")
        ))
        .unwrap()
    }

    #[test]
    fn changes_name_the_services_touched() {
        let mut s = State::new("n1");
        assert!(!s.synced());
        s.services_relist();
        s.services_relist_item(svc("a", "198.19.0.1"));
        s.services_relist_item(svc("b", "198.19.0.2"));
        s.services_relisted();
        s.slices_relist();
        s.slices_relist_item(slice("a-1", "a", &["198.18.0.5"]));
        s.slices_relisted();
        assert!(s.synced());
        assert_eq!(s.all().len(), 2);
        assert!(!s.has_changes());

        // An unchanged re-delivery is not a change.
        s.apply_slice(slice("a-1", "a", &["198.18.0.5"]));
        assert!(!s.has_changes());
        s.apply_slice(slice("a-1", "a", &["198.18.0.5", "198.18.0.6"]));
        let changes = s.take_changes();
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].name, "a");
        assert_eq!(changes[0].ports[0].1.cluster.len(), 2);

        // A relist that misses b and a's slice: both gone.
        s.services_relist();
        s.services_relist_item(svc("a", "198.19.0.1"));
        s.services_relisted();
        s.slices_relist();
        s.slices_relisted();
        let mut changes = s.take_changes();
        changes.sort_by(|x, y| x.name.cmp(&y.name));
        assert_eq!(changes.len(), 2);
        assert!(
            changes[0].ports[0].1.cluster.is_empty(),
            "a lost its endpoints"
        );
        assert!(changes[1].ports.is_empty(), "b is gone");
    }
}
