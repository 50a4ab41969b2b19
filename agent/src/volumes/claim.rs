//! Claim volumes (`persistentVolumeClaim` and generic `ephemeral`): the
//! pod's claim, its bound PV, and where that PV is on this node.
//!
//! Only PVs whose data is a directory of this host are served: `local`
//! and `hostPath` sources, the built-in local-path provisioner's among
//! them. Reads go through the node's own identity (the Node authorizer
//! lets it get only the claims of its pods and their PVs) and a short TTL
//! cache; a claim is cached only once bound, so a pod waiting for its
//! claim to bind sees the binding on its next retry.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::Api;
use kube_util::storage::{self, PodClaim};

use super::Error;

/// Where a claim's data is and what must be true of it before a mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A hostPath PV: upstream's type check.
    HostPath { type_: String },
    /// A static `local` PV: the path must exist (it is never created).
    Local,
    /// A local-path PV of this node: created on first use under `root`.
    LocalPath { root: String },
}

/// A claim resolved to a directory of this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub path: PathBuf,
    pub source: Source,
}

/// Check the claim a pod's volume names: it must be the pod's own when
/// ephemeral, not being deleted, and bound. Returns the PV's name.
///
/// # Errors
/// The volume's FailedMount message.
pub fn bound_volume<'a>(
    pod: &Pod,
    claim: &PodClaim,
    pvc: &'a PersistentVolumeClaim,
) -> Result<&'a str, Error> {
    let ns = pvc.metadata.namespace.as_deref().unwrap_or_default();
    if claim.ephemeral {
        if let Some(m) = storage::ephemeral_claim_not_for_pod(pod, pvc) {
            return Err(Error::Claim(m));
        }
    }
    if pvc.metadata.deletion_timestamp.is_some() {
        // Upstream's kubelet refuses such a claim too: its data is going.
        return Err(Error::Claim(format!(
            "can't start pod because PVC {ns}/{} is being deleted",
            claim.claim
        )));
    }
    storage::claim_bound(pvc).ok_or_else(|| Error::ClaimNotBound {
        claim: format!("{ns}/{}", claim.claim),
        phase: pvc
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default(),
    })
}

/// Where a bound PV's data is on `node`.
///
/// # Errors
/// The PV is bound to another claim, has a source this agent cannot
/// mount, does not allow this node, or is a local-path PV of another
/// node.
pub fn resolve(
    pvc: &PersistentVolumeClaim,
    pv: &PersistentVolume,
    node: &Node,
) -> Result<Resolved, Error> {
    let name = pv.metadata.name.clone().unwrap_or_default();
    let node_name = node.metadata.name.as_deref().unwrap_or_default();
    let spec = pv.spec.clone().unwrap_or_default();
    let claim_uid = spec.claim_ref.as_ref().and_then(|r| r.uid.as_deref());
    if claim_uid.is_none() || claim_uid != pvc.metadata.uid.as_deref() {
        return Err(Error::Claim(format!(
            "the PV's ClaimRef.UID ({}) does not match the PVC's UID ({})",
            claim_uid.unwrap_or_default(),
            pvc.metadata.uid.as_deref().unwrap_or_default()
        )));
    }
    if !storage::volume_allows_node(&spec, node) {
        return Err(Error::VolumeNodeAffinity {
            volume: name,
            node: node_name.to_string(),
        });
    }
    if let Some(h) = &spec.host_path {
        return Ok(Resolved {
            path: PathBuf::from(&h.path),
            source: Source::HostPath {
                type_: h.type_.clone().unwrap_or_default(),
            },
        });
    }
    let Some(local) = &spec.local else {
        return Err(Error::VolumeSourceUnsupported {
            volume: name,
            kind: source_name(pv),
        });
    };
    let path = PathBuf::from(&local.path);
    if !storage::is_local_path(pv) {
        return Ok(Resolved {
            path,
            source: Source::Local,
        });
    }
    let owner = pv
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(storage::LOCAL_PATH_NODE_LABEL));
    if owner.map(String::as_str) != Some(node_name) {
        return Err(Error::LocalPathOtherNode {
            volume: name,
            node: owner.cloned().unwrap_or_default(),
        });
    }
    let root = storage::annotation(
        &pv.metadata.annotations,
        storage::LOCAL_PATH_ROOT_ANNOTATION,
    )
    .unwrap_or_default()
    .to_string();
    // Checked here too, so a bad PV fails before anything is touched.
    super::localpath::check_path(&path, &root)?;
    Ok(Resolved {
        path,
        source: Source::LocalPath { root },
    })
}

/// The name of a PV's volume source (its spec's key), for messages.
fn source_name(pv: &PersistentVolume) -> String {
    let v = serde_json::to_value(pv.spec.as_ref()).unwrap_or_default();
    const NOT_SOURCES: &[&str] = &[
        "accessModes",
        "capacity",
        "claimRef",
        "mountOptions",
        "nodeAffinity",
        "persistentVolumeReclaimPolicy",
        "storageClassName",
        "volumeMode",
        "volumeAttributesClassName",
    ];
    v.as_object()
        .and_then(|o| {
            o.keys()
                .find(|k| !NOT_SOURCES.contains(&k.as_str()))
                .cloned()
        })
        .unwrap_or_else(|| "none".into())
}

type Cache<T> = Mutex<HashMap<String, (Instant, Arc<T>)>>;

/// Reads claims, their PVs and this node's Node; cheap to share.
pub struct ClaimSource {
    client: kube::Client,
    node_name: String,
    ttl: Duration,
    claims: Cache<PersistentVolumeClaim>,
    volumes: Cache<PersistentVolume>,
    node: Cache<Node>,
}

impl ClaimSource {
    pub fn new(client: kube::Client, node_name: &str, ttl: Duration) -> ClaimSource {
        ClaimSource {
            client,
            node_name: node_name.to_string(),
            ttl,
            claims: Mutex::default(),
            volumes: Mutex::default(),
            node: Mutex::default(),
        }
    }

    /// Resolve a pod's claim volume (reading what is not cached).
    ///
    /// # Errors
    /// The volume's FailedMount message: a missing or unbound claim, a
    /// missing PV, an unusable PV, or a failed read.
    pub async fn resolve(&self, pod: &Pod, claim: &PodClaim) -> Result<Resolved, Error> {
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        let key = format!("{ns}/{}", claim.claim);
        let pvc = match cached(&self.claims, &key, self.ttl) {
            Some(c) => c,
            None => {
                let api = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), ns);
                let c = Arc::new(get(api, &claim.claim, "persistentvolumeclaim").await?);
                // Unbound answers are not kept: the binding may land any
                // moment.
                if storage::claim_bound(&c).is_some() {
                    store(&self.claims, key, c.clone());
                }
                c
            }
        };
        let pv_name = bound_volume(pod, claim, &pvc)?.to_string();
        let pv = match cached(&self.volumes, &pv_name, self.ttl) {
            Some(v) => v,
            None => {
                let api = Api::<PersistentVolume>::all(self.client.clone());
                let v = Arc::new(get(api, &pv_name, "persistentvolume").await?);
                store(&self.volumes, pv_name, v.clone());
                v
            }
        };
        let node = match cached(&self.node, "", self.ttl) {
            Some(n) => n,
            None => {
                let api = Api::<Node>::all(self.client.clone());
                let n = Arc::new(get(api, &self.node_name, "node").await?);
                store(&self.node, String::new(), n.clone());
                n
            }
        };
        resolve(&pvc, &pv, &node)
    }
}

fn cached<T>(cache: &Cache<T>, key: &str, ttl: Duration) -> Option<Arc<T>> {
    let mut c = cache.lock().unwrap_or_else(|e| e.into_inner());
    let now = Instant::now();
    // Entries of claims long gone age out here.
    c.retain(|_, (at, _)| now.duration_since(*at) < ttl * 10);
    c.get(key)
        .filter(|(at, _)| now.duration_since(*at) < ttl)
        .map(|(_, v)| v.clone())
}

fn store<T>(cache: &Cache<T>, key: String, v: Arc<T>) {
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, (Instant::now(), v));
}

async fn get<K>(api: Api<K>, name: &str, noun: &'static str) -> Result<K, Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.get_opt(name).await {
        Ok(Some(o)) => Ok(o),
        Ok(None) => Err(Error::Claim(format!("{noun} {name:?} not found"))),
        Err(e) => {
            let message = match &e {
                kube::Error::Api(s) => s.message.clone(),
                other => other.to_string(),
            };
            Err(Error::Claim(format!(
                "couldn't get {noun} {name:?}: {message}"
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod() -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "ns", "uid": "pu"}}))
            .unwrap()
    }
    fn pvc(v: serde_json::Value) -> PersistentVolumeClaim {
        let mut base = json!({"metadata": {"name": "c", "namespace": "ns", "uid": "cu"},
            "spec": {"volumeName": "pv1"}, "status": {"phase": "Bound"}});
        merge(&mut base, v);
        serde_json::from_value(base).unwrap()
    }
    fn pv(v: serde_json::Value) -> PersistentVolume {
        let mut base = json!({"metadata": {"name": "pv1"},
            "spec": {"claimRef": {"name": "c", "namespace": "ns", "uid": "cu"}}});
        merge(&mut base, v);
        serde_json::from_value(base).unwrap()
    }
    fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
        match (a, b) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }
    fn node(name: &str) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "zone": "z1"}}}))
            .unwrap()
    }
    fn claim(ephemeral: bool) -> PodClaim {
        PodClaim {
            volume: "v".into(),
            claim: "c".into(),
            ephemeral,
            read_only: false,
        }
    }

    #[test]
    fn claims_must_be_bound_and_the_pods_own() {
        assert_eq!(
            bound_volume(&pod(), &claim(false), &pvc(json!({}))).unwrap(),
            "pv1"
        );
        let pending = pvc(json!({"spec": {"volumeName": null}, "status": {"phase": "Pending"}}));
        let e = bound_volume(&pod(), &claim(false), &pending).unwrap_err();
        assert_eq!(
            e.to_string(),
            "PVC ns/c is not bound yet (phase \"Pending\", spec.volumeName \"\")"
        );
        let e = bound_volume(&pod(), &claim(true), &pvc(json!({}))).unwrap_err();
        assert_eq!(
            e.to_string(),
            "PVC ns/c was not created for pod ns/p (pod is not owner)"
        );
        let owned = pvc(
            json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "pu", "controller": true}]}}),
        );
        assert!(bound_volume(&pod(), &claim(true), &owned).is_ok());
        let deleting = pvc(json!({"metadata": {"deletionTimestamp": "2024-01-01T00:00:00Z"}}));
        assert!(bound_volume(&pod(), &claim(false), &deleting)
            .unwrap_err()
            .to_string()
            .contains("is being deleted"));
    }

    #[test]
    fn volumes_resolve_to_host_directories() {
        let c = pvc(json!({}));
        let hp = pv(json!({"spec": {"hostPath": {"path": "/data", "type": "Directory"}}}));
        assert_eq!(
            resolve(&c, &hp, &node("n1")).unwrap(),
            Resolved {
                path: "/data".into(),
                source: Source::HostPath {
                    type_: "Directory".into()
                }
            }
        );
        let affinity = json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}]}});
        let local = pv(json!({"spec": {"local": {"path": "/mnt/disk"}, "nodeAffinity": affinity}}));
        assert_eq!(
            resolve(&c, &local, &node("n1")).unwrap().source,
            Source::Local
        );
        let mut other_zone = node("n2");
        other_zone
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("zone".into(), "z2".into());
        assert_eq!(
            resolve(&c, &local, &other_zone).unwrap_err().to_string(),
            "persistentvolume \"pv1\" cannot be used on node \"n2\": its nodeAffinity does not match the node's labels"
        );

        let nfs = pv(json!({"spec": {"nfs": {"server": "s", "path": "/"}}}));
        assert_eq!(
            resolve(&c, &nfs, &node("n1")).unwrap_err().to_string(),
            "persistentvolume \"pv1\" has volume source \"nfs\", which skiff-agent cannot mount (supported: local, hostPath)"
        );
        let stolen =
            pv(json!({"spec": {"hostPath": {"path": "/d"}, "claimRef": {"uid": "other"}}}));
        assert!(resolve(&c, &stolen, &node("n1")).is_err());
    }

    #[test]
    fn local_path_volumes_belong_to_their_node() {
        let c = pvc(json!({}));
        let lp = |path: &str, root: &str| {
            pv(
                json!({"metadata": {"labels": {"skiff.io/local-path-node": "n1"},
                "annotations": {"pv.kubernetes.io/provisioned-by": "skiff.io/local-path", "skiff.io/local-path-root": root}},
                "spec": {"local": {"path": path}}}),
            )
        };
        let good = lp("/var/lp/pv1_ns_c", "/var/lp");
        assert_eq!(
            resolve(&c, &good, &node("n1")).unwrap(),
            Resolved {
                path: "/var/lp/pv1_ns_c".into(),
                source: Source::LocalPath {
                    root: "/var/lp".into()
                }
            }
        );
        assert!(matches!(
            resolve(&c, &good, &node("n2")),
            Err(Error::LocalPathOtherNode { .. })
        ));
        for (path, root) in [
            ("/var/lp/..", "/var/lp"),
            ("/etc", "/var/lp"),
            ("/var/lp/a/b", "/var/lp"),
            ("/x/y", ""),
        ] {
            assert!(
                matches!(
                    resolve(&c, &lp(path, root), &node("n1")),
                    Err(Error::LocalPathUnsafe { .. })
                ),
                "{path} under {root:?}"
            );
        }
    }
}
