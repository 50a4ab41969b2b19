//! API aggregation (apiregistration.k8s.io/v1, upstream's
//! kube-aggregator): APIServices, `Local` for every group version this
//! server serves (built in or from definitions) and registered ones
//! backed by a Service; requests for a registered group version are
//! proxied to its backend ([`proxy`]) after this server authenticated and
//! authorized them, and discovery lists its group (from the APIService)
//! and its resources (from the backend's own discovery, fetched by the
//! availability checks).
//!
//! # Layout
//! - [`proxy`]: the connection to a backend and the forwarding.
//! - [`available`]: the `Available` condition of every APIService, and
//!   the backends' discovery documents.
//! - [`autoregister`]: the `Local` APIServices.

pub mod autoregister;
pub mod available;
pub mod proxy;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use base64::Engine;
use serde_json::{json, Value};

use super::resources;
use super::ApiServer;
use crate::pki::CertKey;
use crate::store::follow::{follow, Change};

/// Header names announced to backends (and published in the
/// `extension-apiserver-authentication` ConfigMap).
pub const USER_HEADER: &str = "X-Remote-User";
pub const GROUP_HEADER: &str = "X-Remote-Group";
pub const EXTRA_PREFIX: &str = "X-Remote-Extra-";
/// The common name of the front-proxy client certificate.
pub const FRONT_PROXY_CLIENT: &str = "front-proxy-client";

/// A registered group version and how to reach it.
pub struct Backend {
    /// The APIService's spec it was made from.
    spec: Value,
    pub name: String,
    pub group: String,
    pub version: String,
    pub namespace: String,
    pub service: String,
    pub port: u16,
    pub group_priority: i64,
    pub version_priority: i64,
    /// TLS towards it: its caBundle (or no verification with
    /// insecureSkipTLSVerify), the front-proxy client certificate.
    pub tls: Result<Arc<rustls::ClientConfig>, String>,
    /// Its last discovery document (`APIResourceList`), None while it
    /// is unavailable.
    pub resources: Mutex<Option<Value>>,
}

/// Registered backends by (group, version).
pub type Backends = BTreeMap<(String, String), Arc<Backend>>;

/// The registered APIServices, by (group, version).
#[derive(Default)]
pub struct Aggregator {
    backends: RwLock<Arc<Backends>>,
    /// Notified when the registered APIServices change.
    pub changed: tokio::sync::Notify,
    /// The front-proxy CA (PEM) and client certificate; set once at start.
    front_proxy: OnceLock<(String, CertKey)>,
}

impl Aggregator {
    /// Use `client` (signed by the front-proxy CA `ca_pem`) towards
    /// backends.
    pub fn set_front_proxy(&self, ca_pem: &str, client: CertKey) {
        let _ = self.front_proxy.set((ca_pem.to_string(), client));
    }

    pub fn front_proxy_ca(&self) -> Option<&str> {
        self.front_proxy.get().map(|(ca, _)| ca.as_str())
    }

    pub fn backends(&self) -> Arc<Backends> {
        self.backends
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The backend serving `group`/`version`, if one is registered.
    pub fn backend(&self, group: &str, version: &str) -> Option<Arc<Backend>> {
        self.backends()
            .get(&(group.to_string(), version.to_string()))
            .cloned()
    }

    /// Whether `group` is served by a backend (in any version).
    pub fn serves_group(&self, group: &str) -> bool {
        self.backends().keys().any(|(g, _)| g == group)
    }

    fn backend_of(&self, obj: &Value) -> Option<Backend> {
        let spec = &obj["spec"];
        let svc = spec.get("service").filter(|s| s.is_object())?;
        let ca = spec["caBundle"]
            .as_str()
            .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
            .unwrap_or_default();
        let insecure = spec["insecureSkipTLSVerify"] == true;
        let tls = match self.front_proxy.get() {
            Some((_, client)) => proxy::tls(&ca, insecure, client),
            None => Err("the server has no front-proxy client certificate".into()),
        };
        Some(Backend {
            spec: spec.clone(),
            name: obj["metadata"]["name"].as_str()?.to_string(),
            group: spec["group"].as_str().unwrap_or_default().to_string(),
            version: spec["version"].as_str()?.to_string(),
            namespace: svc["namespace"].as_str()?.to_string(),
            service: svc["name"].as_str()?.to_string(),
            port: u16::try_from(svc["port"].as_u64().unwrap_or(443)).ok()?,
            group_priority: spec["groupPriorityMinimum"].as_i64().unwrap_or(0),
            version_priority: spec["versionPriority"].as_i64().unwrap_or(0),
            tls,
            resources: Mutex::new(None),
        })
    }

    /// Plain discovery of an aggregated group: its versions, highest
    /// `versionPriority` first.
    pub fn group(&self, group: &str) -> Option<Value> {
        let mut versions: Vec<Arc<Backend>> = self
            .backends()
            .values()
            .filter(|b| b.group == group)
            .cloned()
            .collect();
        if versions.is_empty() {
            return None;
        }
        versions.sort_by_key(|b| std::cmp::Reverse(b.version_priority));
        let list: Vec<Value> = versions
            .iter()
            .map(
                |b| json!({"groupVersion": format!("{group}/{}", b.version), "version": b.version}),
            )
            .collect();
        Some(
            json!({"kind": "APIGroup", "apiVersion": "v1", "name": group,
            "versions": list, "preferredVersion": list[0]}),
        )
    }

    /// Add the aggregated groups to `/apis` (an `APIGroupList`), by
    /// `groupPriorityMinimum`, after the served ones.
    pub fn merge_groups(&self, list: &mut Value) {
        let mut groups: Vec<(i64, String)> = Vec::new();
        for b in self.backends().values() {
            match groups.iter_mut().find(|(_, g)| *g == b.group) {
                Some((p, _)) => *p = (*p).max(b.group_priority),
                None => groups.push((b.group_priority, b.group.clone())),
            }
        }
        groups.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let Some(items) = list["groups"].as_array_mut() else {
            return;
        };
        for (_, g) in groups {
            if items.iter().any(|i| i["name"] == g.as_str()) {
                continue;
            }
            if let Some(v) = self.group(&g) {
                items.push(v);
            }
        }
    }

    /// Add the aggregated groups to aggregated discovery (an
    /// `APIGroupDiscoveryList`): each version's resources as its backend
    /// last listed them, `Stale` and empty while it is unavailable.
    pub fn merge_aggregated(&self, list: &mut Value) {
        let backends = self.backends();
        let Some(items) = list["items"].as_array_mut() else {
            return;
        };
        let mut groups: BTreeMap<String, Vec<Arc<Backend>>> = BTreeMap::new();
        for b in backends.values() {
            groups.entry(b.group.clone()).or_default().push(b.clone());
        }
        for (group, mut versions) in groups {
            if items
                .iter()
                .any(|i| i["metadata"]["name"] == group.as_str())
            {
                continue;
            }
            versions.sort_by_key(|b| std::cmp::Reverse(b.version_priority));
            let versions: Vec<Value> = versions
                .iter()
                .map(|b| {
                    let list = b.resources.lock().expect("backend discovery lock").clone();
                    match list {
                        Some(l) => json!({"version": b.version, "freshness": "Current",
                            "resources": available::aggregated_resources(&l, &b.group, &b.version)}),
                        None => json!({"version": b.version, "freshness": "Stale", "resources": []}),
                    }
                })
                .collect();
            items.push(json!({"metadata": {"name": group, "creationTimestamp": null}, "versions": versions}));
        }
    }
}

/// Follow the APIServices (the registered ones into memory), keep the
/// `Local` ones and every condition current, until shutdown.
pub async fn run(api: Arc<ApiServer>) {
    let prefix = def().prefix(None);
    let mut by_key: BTreeMap<String, Arc<Backend>> = BTreeMap::new();
    let follow_backends = follow(
        api.store.as_ref(),
        &prefix,
        api.shutdown.clone(),
        "apiservices",
        |change| {
            let parse = |v: &[u8]| serde_json::from_slice::<Value>(v).ok();
            // A status write keeps the backend (and its discovery).
            if let Change::Put(kv) = &change {
                let spec = parse(&kv.value).map(|o| o["spec"].clone());
                if by_key
                    .get(&kv.key)
                    .is_some_and(|b| Some(&b.spec) == spec.as_ref())
                {
                    return;
                }
            }
            change.apply_to(&mut by_key, |v| {
                api.aggregator.backend_of(&parse(v)?).map(Arc::new)
            });
            let by_gv = by_key
                .values()
                .map(|b| ((b.group.clone(), b.version.clone()), b.clone()))
                .collect();
            *api.aggregator
                .backends
                .write()
                .unwrap_or_else(|p| p.into_inner()) = Arc::new(by_gv);
            api.aggregator.changed.notify_one();
        },
    );
    tokio::join!(
        follow_backends,
        autoregister::run(api.clone()),
        available::run(api.clone())
    );
}

pub fn def() -> &'static resources::ResourceDef {
    resources::lookup("apiregistration.k8s.io", "v1", "apiservices")
        .expect("APIServices are served")
}
