//! ConfigMaps and Secrets read from the API with the node's own identity
//! (the Node authorizer lets it read only what its pods use), cached for a
//! short TTL: pods sharing an object in one burst of syncs read it once,
//! and every pod sync reads it afresh, so an update reaches the pod's files
//! and new containers within the sync period (upstream's TTL-based
//! `Cache` change detection strategy).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Container, Secret};
use kube::Api;

/// A configMap's or secret's data: key -> bytes (configMap `data` and
/// `binaryData` merged).
pub type Data = BTreeMap<String, Vec<u8>>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    ConfigMap,
    Secret,
}

impl Kind {
    /// The word upstream's messages use (`configmap "x" not found`).
    pub fn noun(self) -> &'static str {
        match self {
            Kind::ConfigMap => "configmap",
            Kind::Secret => "secret",
        }
    }
}

/// Why an object could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// The object does not exist (upstream's wording).
    #[error("{} {name:?} not found", kind.noun())]
    NotFound { kind: Kind, name: String },
    /// The API refused or failed the read.
    #[error("couldn't get {} {namespace}/{name}: {message}", kind.noun())]
    Api {
        kind: Kind,
        namespace: String,
        name: String,
        message: String,
    },
}

impl FetchError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, FetchError::NotFound { .. })
    }
}

pub type Fetched = Result<Arc<Data>, FetchError>;

type Key = (Kind, String, String);

/// Reads and caches objects; cheap to share.
pub struct ObjectSource {
    client: kube::Client,
    ttl: Duration,
    cache: Mutex<HashMap<Key, (Instant, Fetched)>>,
    /// The API server's Service, for every container's environment.
    master: crate::runtime::service_env::MasterService,
}

impl ObjectSource {
    /// `ttl` bounds how stale a read may be; keep it well under the sync
    /// period.
    pub fn new(client: kube::Client, ttl: Duration) -> ObjectSource {
        ObjectSource {
            master: crate::runtime::service_env::MasterService::new(client.clone(), ttl),
            client,
            ttl,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The object's data, from the cache when fresh enough.
    pub async fn get(&self, kind: Kind, namespace: &str, name: &str) -> Fetched {
        let key = (kind, namespace.to_string(), name.to_string());
        let now = Instant::now();
        {
            let mut c = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            // Entries of pods long gone age out here.
            c.retain(|_, (at, _)| now.duration_since(*at) < self.ttl * 10);
            if let Some((at, v)) = c.get(&key) {
                if now.duration_since(*at) < self.ttl {
                    return v.clone();
                }
            }
        }
        let v = self.fetch(kind, namespace, name).await;
        self.cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, (Instant::now(), v.clone()));
        v
    }

    async fn fetch(&self, kind: Kind, namespace: &str, name: &str) -> Fetched {
        let result = match kind {
            Kind::ConfigMap => Api::<ConfigMap>::namespaced(self.client.clone(), namespace)
                .get_opt(name)
                .await
                .map(|o| o.map(config_map_data)),
            Kind::Secret => Api::<Secret>::namespaced(self.client.clone(), namespace)
                .get_opt(name)
                .await
                .map(|o| o.map(secret_data)),
        };
        match result {
            Ok(Some(d)) => Ok(Arc::new(d)),
            Ok(None) => Err(FetchError::NotFound {
                kind,
                name: name.to_string(),
            }),
            Err(e) => {
                let message = match &e {
                    kube::Error::Api(s) => s.message.clone(),
                    other => other.to_string(),
                };
                Err(FetchError::Api {
                    kind,
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                    message,
                })
            }
        }
    }

    /// Every configMap and secret a container's env and envFrom name.
    pub async fn for_container(&self, namespace: &str, c: &Container) -> EnvObjects {
        let mut out = EnvObjects {
            service_env: self.master.env().await,
            ..Default::default()
        };
        for (kind, name) in env_references(c) {
            if out.objects.contains_key(&(kind, name.clone())) {
                continue;
            }
            let v = self.get(kind, namespace, &name).await;
            out.objects.insert((kind, name), v);
        }
        out
    }
}

pub fn config_map_data(cm: ConfigMap) -> Data {
    let mut d: Data = cm
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.into_bytes()))
        .collect();
    for (k, v) in cm.binary_data.unwrap_or_default() {
        d.insert(k, v.0);
    }
    d
}

pub fn secret_data(s: Secret) -> Data {
    s.data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect()
}

/// The objects a container's environment refers to, fetched before its
/// config is built (which is synchronous).
#[derive(Debug, Default, Clone)]
pub struct EnvObjects {
    pub objects: HashMap<(Kind, String), Fetched>,
    /// `KUBERNETES_SERVICE_HOST` and its kin: the base every container's
    /// env starts from.
    pub service_env: crate::runtime::service_env::EnvVars,
}

impl EnvObjects {
    pub fn get(&self, kind: Kind, name: &str) -> Option<&Fetched> {
        self.objects.get(&(kind, name.to_string()))
    }
}

fn env_references(c: &Container) -> Vec<(Kind, String)> {
    let mut refs = Vec::new();
    for e in c.env_from.iter().flatten() {
        if let Some(r) = &e.config_map_ref {
            refs.push((Kind::ConfigMap, r.name.clone()));
        }
        if let Some(r) = &e.secret_ref {
            refs.push((Kind::Secret, r.name.clone()));
        }
    }
    for e in c.env.iter().flatten() {
        let Some(from) = &e.value_from else { continue };
        if let Some(r) = &from.config_map_key_ref {
            refs.push((Kind::ConfigMap, r.name.clone()));
        }
        if let Some(r) = &from.secret_key_ref {
            refs.push((Kind::Secret, r.name.clone()));
        }
    }
    refs
}
