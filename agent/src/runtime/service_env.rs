//! The `KUBERNETES_SERVICE_HOST`-style variables of the API server's
//! Service (`default/kubernetes`), which every container gets (the
//! kubelet's `getServiceEnvVarMap` adds the master service even when
//! `enableServiceLinks` is false): in-cluster clients find the API server
//! through them.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;

/// The API server's Service, in the `default` namespace.
const MASTER_NAMESPACE: &str = "default";
const MASTER_NAME: &str = "kubernetes";

/// One container's environment entries, in upstream's order.
pub type EnvVars = Vec<(String, String)>;

/// The Service's variables (upstream `envvars.FromServices`): host, first
/// port, named ports, and the Docker-link style `_PORT_*` ones. A Service
/// without a ClusterIP or ports has none.
pub fn from_service(svc: &Service) -> EnvVars {
    let Some(spec) = &svc.spec else {
        return Vec::new();
    };
    let ip = spec.cluster_ip.as_deref().unwrap_or("");
    let ports = spec.ports.as_deref().unwrap_or_default();
    if ip.is_empty() || ip == "None" || ports.is_empty() {
        return Vec::new();
    }
    let prefix = var_name(svc.metadata.name.as_deref().unwrap_or(""));
    let mut out = vec![
        (format!("{prefix}_SERVICE_HOST"), ip.to_string()),
        (format!("{prefix}_SERVICE_PORT"), ports[0].port.to_string()),
    ];
    for p in ports {
        if let Some(n) = p.name.as_deref().filter(|n| !n.is_empty()) {
            out.push((
                format!("{prefix}_SERVICE_PORT_{}", var_name(n)),
                p.port.to_string(),
            ));
        }
    }
    // An IPv6 ClusterIP is bracketed, as Go's JoinHostPort does.
    let host = if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip.to_string()
    };
    for (i, p) in ports.iter().enumerate() {
        let proto = p.protocol.as_deref().unwrap_or("TCP");
        let lower = proto.to_lowercase();
        let url = format!("{lower}://{host}:{}", p.port);
        if i == 0 {
            out.push((format!("{prefix}_PORT"), url.clone()));
        }
        let pp = format!("{prefix}_PORT_{}_{}", p.port, proto.to_uppercase());
        out.push((format!("{pp}_PROTO"), lower.clone()));
        out.push((format!("{pp}_PORT"), p.port.to_string()));
        out.push((format!("{pp}_ADDR"), ip.to_string()));
        out.push((pp, url));
    }
    out
}

/// Upstream's `makeEnvVariableName`.
fn var_name(s: &str) -> String {
    s.replace('-', "_").to_uppercase()
}

/// The master Service's variables, read from the API with a short TTL
/// (the Service changes only when the API server's address does).
pub struct MasterService {
    client: kube::Client,
    ttl: Duration,
    cache: Mutex<Option<(Instant, EnvVars)>>,
}

impl MasterService {
    pub fn new(client: kube::Client, ttl: Duration) -> MasterService {
        MasterService {
            client,
            ttl,
            cache: Mutex::new(None),
        }
    }

    /// The variables; none while the Service cannot be read (logged): the
    /// container still starts, as a kubelet whose lister has no such
    /// Service starts it.
    pub async fn env(&self) -> EnvVars {
        if let Some((at, v)) = self
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            if at.elapsed() < self.ttl {
                return v.clone();
            }
        }
        let api = kube::Api::<Service>::namespaced(self.client.clone(), MASTER_NAMESPACE);
        let v = match api.get_opt(MASTER_NAME).await {
            Ok(Some(svc)) => from_service(&svc),
            Ok(None) => Vec::new(),
            Err(e) => {
                tracing::warn!("cannot read service default/kubernetes for the containers' KUBERNETES_SERVICE_* variables: {e}");
                return Vec::new();
            }
        };
        *self.cache.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), v.clone()));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubernetes_service_variables_as_upstream() {
        let svc: Service = serde_saphyr::from_str(
            "metadata: {name: kubernetes, namespace: default}\nspec:\n  clusterIP: 10.96.0.1\n  ports: [{name: https, port: 443, protocol: TCP, targetPort: 6443}]\n",
        )
        .unwrap();
        let env = from_service(&svc);
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("KUBERNETES_SERVICE_HOST"), Some("10.96.0.1"));
        assert_eq!(get("KUBERNETES_SERVICE_PORT"), Some("443"));
        assert_eq!(get("KUBERNETES_SERVICE_PORT_HTTPS"), Some("443"));
        assert_eq!(get("KUBERNETES_PORT"), Some("tcp://10.96.0.1:443"));
        assert_eq!(get("KUBERNETES_PORT_443_TCP"), Some("tcp://10.96.0.1:443"));
        assert_eq!(get("KUBERNETES_PORT_443_TCP_PROTO"), Some("tcp"));
        assert_eq!(get("KUBERNETES_PORT_443_TCP_PORT"), Some("443"));
        assert_eq!(get("KUBERNETES_PORT_443_TCP_ADDR"), Some("10.96.0.1"));
        assert_eq!(env.len(), 8);
        let headless: Service = serde_saphyr::from_str(
            "metadata: {name: h}\nspec: {clusterIP: None, ports: [{port: 80}]}\n",
        )
        .unwrap();
        assert!(from_service(&headless).is_empty());
        let v6: Service = serde_saphyr::from_str(
            "metadata: {name: my-api}\nspec: {clusterIP: 'fd00::1', ports: [{port: 443}]}\n",
        )
        .unwrap();
        assert!(from_service(&v6).contains(&("MY_API_PORT".into(), "tcp://[fd00::1]:443".into())));
    }
}
