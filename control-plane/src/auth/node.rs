//! The Node authorizer and NodeRestriction admission: a kubelet identity
//! (`system:node:NAME` in `system:nodes`) may read what nodes read, write
//! only its own Node and Lease and the status of pods bound to it, read
//! only the secrets and configmaps its pods use, and mint only tokens of
//! the ServiceAccounts its pods run as, bound to those pods. Storage
//! follows upstream's graph: the claims its pods use (and their status),
//! the PVs bound to those; skiff's local-path agent also watches the PVs
//! labelled with its node and removes their cleanup finalizer.

use serde_json::Value;

use super::Attributes;
use crate::apiserver::selectors::LabelSelector;
use crate::store::Store;

/// An authorizer's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    Deny(String),
    /// Not the node authorizer's business: ask RBAC.
    NoOpinion,
}

const READ: &[&str] = &["get", "list", "watch"];

/// Authorize a node's request. Object-level checks (a pod's `nodeName`)
/// happen later in [`admit`], once the object is known.
pub async fn authorize(node: &str, a: &Attributes, store: &dyn Store) -> Decision {
    if !a.resource_request {
        let p = a.path.as_str();
        let ok = a.verb == "get"
            && (p.starts_with("/api")
                || p.starts_with("/openapi")
                || matches!(p, "/version" | "/healthz" | "/livez" | "/readyz"));
        return if ok {
            Decision::Allow
        } else {
            Decision::NoOpinion
        };
    }
    let verb = a.verb.as_str();
    let read = READ.contains(&verb);
    let write = matches!(verb, "create" | "update" | "patch" | "delete");
    match (a.group.as_str(), a.resource.as_str()) {
        ("", "nodes") => {
            if read || (write && (a.name.is_empty() || a.name == node)) {
                Decision::Allow
            } else {
                Decision::Deny(format!(
                    "node {node:?} is not allowed to modify node {:?}",
                    a.name
                ))
            }
        }
        ("coordination.k8s.io", "leases") if a.namespace == "kube-node-lease" => {
            if read || verb == "create" || (write && a.name == node) {
                Decision::Allow
            } else {
                Decision::Deny(format!(
                    "node {node:?} is not allowed to modify lease {:?}",
                    a.name
                ))
            }
        }
        ("", "pods") => match a.subresource.as_str() {
            "" if read || verb == "create" || verb == "delete" => Decision::Allow,
            "status" if matches!(verb, "get" | "update" | "patch") => Decision::Allow,
            "eviction" if verb == "create" => Decision::Allow,
            _ => Decision::NoOpinion,
        },
        // The node server's webhook authorization asks whether its callers
        // may use it (upstream's system:node role grants this too).
        ("authorization.k8s.io", "subjectaccessreviews") if verb == "create" => Decision::Allow,
        ("", "events") | ("events.k8s.io", "events")
            if matches!(verb, "create" | "update" | "patch") =>
        {
            Decision::Allow
        }
        // What every node reads; a pod's RuntimeClass names the CRI
        // handler the agent starts its sandbox with (upstream's node
        // rules grant get, list and watch on runtimeclasses).
        ("", "services")
        | ("", "endpoints")
        | ("discovery.k8s.io", "endpointslices")
        | ("", "namespaces")
        | ("node.k8s.io", "runtimeclasses")
            if read =>
        {
            Decision::Allow
        }
        // The kubelet's token manager asks for its pods' tokens; which pod
        // a token is bound to is checked in [`admit_token_request`].
        ("", "serviceaccounts") if a.subresource == "token" => {
            authorize_create_token(node, a, store).await
        }
        ("", "persistentvolumeclaims") => {
            let ok = match a.subresource.as_str() {
                "" => verb == "get",
                // Volume expansion reports the new size.
                "status" => matches!(verb, "get" | "update" | "patch"),
                _ => false,
            };
            if !ok || a.name.is_empty() {
                return Decision::Deny("can only get individual resources of this type".into());
            }
            if referenced_by_node_pod(store, node, &a.namespace, &a.resource, &a.name).await {
                Decision::Allow
            } else {
                no_relationship(node, a)
            }
        }
        ("", "persistentvolumes") if a.subresource.is_empty() => match verb {
            "get" if !a.name.is_empty() => {
                if volume_of_node_claim(store, node, &a.name).await {
                    Decision::Allow
                } else {
                    no_relationship(node, a)
                }
            }
            // The agent's local-path cleanup watches its own volumes.
            "list" | "watch" if selects_own_local_path(node, &a.label_selector) => Decision::Allow,
            "list" | "watch" => Decision::Deny(format!(
                "node {node:?} can only list and watch persistentvolumes with labelSelector {}={node}",
                LOCAL_PATH_NODE_LABEL
            )),
            // Which PV and which change: checked in [`admit`].
            "update" | "patch" if !a.name.is_empty() => Decision::Allow,
            _ => Decision::Deny("can only get individual resources of this type".into()),
        },
        ("", "secrets") | ("", "configmaps") | ("", "serviceaccounts")
            if read && !a.name.is_empty() && a.subresource.is_empty() =>
        {
            if referenced_by_node_pod(store, node, &a.namespace, &a.resource, &a.name).await {
                Decision::Allow
            } else {
                Decision::Deny(format!(
                    "no relationship found between node {node:?} and this object ({} {}/{})",
                    a.resource, a.namespace, a.name
                ))
            }
        }
        _ => Decision::NoOpinion,
    }
}

const LOCAL_PATH_NODE_LABEL: &str = "skiff.io/local-path-node";
const LOCAL_PATH_CLEANUP_FINALIZER: &str = "skiff.io/local-path-cleanup";

fn no_relationship(node: &str, a: &Attributes) -> Decision {
    let what = if a.namespace.is_empty() {
        a.name.clone()
    } else {
        format!("{}/{}", a.namespace, a.name)
    };
    Decision::Deny(format!(
        "no relationship found between node {node:?} and this object ({} {what})",
        a.resource
    ))
}

/// Whether a label selector restricts a list to the local-path PVs of
/// `node`: it requires `skiff.io/local-path-node=<node>`; any other
/// requirement only narrows it further.
pub fn selects_own_local_path(node: &str, selector: &str) -> bool {
    LabelSelector::parse(selector).is_ok_and(|s| s.requires(LOCAL_PATH_NODE_LABEL, node))
}

/// Whether PV `name` is bound to a claim a pod of `node` uses: the
/// claim's `spec.volumeName` names it (upstream's pvc -> pv edge).
async fn volume_of_node_claim(store: &dyn Store, node: &str, name: &str) -> bool {
    let Ok(list) = store.list("/registry/core/pods/", None, 0, None).await else {
        return false;
    };
    for pod in list
        .kvs
        .iter()
        .filter_map(|kv| serde_json::from_slice::<Value>(&kv.value).ok())
        .filter(|p| p["spec"]["nodeName"].as_str() == Some(node))
    {
        let ns = pod["metadata"]["namespace"].as_str().unwrap_or_default();
        for claim in pod_claims(&pod) {
            let key = format!("/registry/core/persistentvolumeclaims/{ns}/{claim}");
            let Ok(Some(kv)) = store.get(&key).await else {
                continue;
            };
            let Ok(pvc) = serde_json::from_slice::<Value>(&kv.value) else {
                continue;
            };
            if pvc["spec"]["volumeName"].as_str() == Some(name) {
                return true;
            }
        }
    }
    false
}

/// The claims a pod's volumes use: `persistentVolumeClaim.claimName`,
/// and `<pod>-<volume>` for generic ephemeral volumes.
fn pod_claims(pod: &Value) -> Vec<String> {
    let pod_name = pod["metadata"]["name"].as_str().unwrap_or_default();
    pod["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| {
            if let Some(c) = v["persistentVolumeClaim"]["claimName"].as_str() {
                Some(c.to_string())
            } else if v["ephemeral"].is_object() {
                Some(format!(
                    "{pod_name}-{}",
                    v["name"].as_str().unwrap_or_default()
                ))
            } else {
                None
            }
        })
        .collect()
}

/// `create serviceaccounts/token`: only for a ServiceAccount a pod bound
/// to the node runs as (upstream's `authorizeCreateToken`).
async fn authorize_create_token(node: &str, a: &Attributes, store: &dyn Store) -> Decision {
    if a.verb != "create" || a.name.is_empty() {
        return Decision::Deny("can only create tokens for individual service accounts".into());
    }
    if referenced_by_node_pod(store, node, &a.namespace, "serviceaccounts", &a.name).await {
        Decision::Allow
    } else {
        Decision::Deny(format!(
            "no relationship found between node {node:?} and this object (serviceaccounts {}/{})",
            a.namespace, a.name
        ))
    }
}

/// Whether a pod bound to `node` in `ns` uses the object.
async fn referenced_by_node_pod(
    store: &dyn Store,
    node: &str,
    ns: &str,
    resource: &str,
    name: &str,
) -> bool {
    let Ok(list) = store
        .list(&format!("/registry/core/pods/{ns}/"), None, 0, None)
        .await
    else {
        return false;
    };
    list.kvs
        .iter()
        .filter_map(|kv| serde_json::from_slice::<Value>(&kv.value).ok())
        .any(|pod| {
            pod["spec"]["nodeName"].as_str() == Some(node) && pod_references(&pod, resource, name)
        })
}

/// Whether `pod` references secret/configmap/serviceaccount `name`.
pub fn pod_references(pod: &Value, resource: &str, name: &str) -> bool {
    let spec = &pod["spec"];
    let eq = |v: &Value| v.as_str() == Some(name);
    match resource {
        "serviceaccounts" => eq(&spec["serviceAccountName"]),
        "persistentvolumeclaims" => pod_claims(pod).iter().any(|c| c == name),
        "secrets" | "configmaps" => {
            let (vol_key, vol_name, env_key, ref_key) = if resource == "secrets" {
                ("secret", "secretName", "secretKeyRef", "secretRef")
            } else {
                ("configMap", "name", "configMapKeyRef", "configMapRef")
            };
            let in_volumes = spec["volumes"].as_array().into_iter().flatten().any(|v| {
                eq(&v[vol_key][vol_name])
                    || v["projected"]["sources"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|s| eq(&s[vol_key]["name"]))
            });
            let in_pull = resource == "secrets"
                && spec["imagePullSecrets"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|s| eq(&s["name"]));
            let in_env = ["containers", "initContainers", "ephemeralContainers"]
                .iter()
                .any(|f| {
                    spec[*f].as_array().into_iter().flatten().any(|c| {
                        c["env"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .any(|e| eq(&e["valueFrom"][env_key]["name"]))
                            || c["envFrom"]
                                .as_array()
                                .into_iter()
                                .flatten()
                                .any(|e| eq(&e[ref_key]["name"]))
                    })
                });
            in_volumes || in_pull || in_env
        }
        _ => false,
    }
}

/// NodeRestriction: checks that need the object. `old` is the stored
/// object (updates, deletes), `new` the one being written.
///
/// # Errors
/// A node may only change the Node and Lease named after itself.
fn only_own(
    node: &str,
    kind: &str,
    a: &Attributes,
    old: Option<&Value>,
    new: Option<&Value>,
) -> Result<(), String> {
    let target = new
        .or(old)
        .and_then(|o| o["metadata"]["name"].as_str())
        .unwrap_or(&a.name);
    if target != node {
        return Err(format!(
            "node {node:?} is not allowed to modify {kind} {target:?}"
        ));
    }
    Ok(())
}

/// The 403 message when a node reaches beyond its own objects.
pub fn admit(
    node: &str,
    a: &Attributes,
    old: Option<&Value>,
    new: Option<&Value>,
) -> Result<(), String> {
    match (a.group.as_str(), a.resource.as_str()) {
        ("", "nodes") => only_own(node, "node", a, old, new)?,
        ("", "pods") => {
            let bound =
                |o: Option<&Value>| o.and_then(|p| p["spec"]["nodeName"].as_str()) == Some(node);
            match (a.verb.as_str(), a.subresource.as_str()) {
                ("create", "") => {
                    if !bound(new) {
                        return Err(format!(
                            "node {node:?} can only create pods with spec.nodeName set to itself"
                        ));
                    }
                    let mirror = new
                        .and_then(|p| {
                            p["metadata"]["annotations"]["kubernetes.io/config.mirror"].as_str()
                        })
                        .is_some();
                    if !mirror {
                        return Err(format!(
                            "pod does not have \"kubernetes.io/config.mirror\" annotation, node {node:?} can only create mirror pods"
                        ));
                    }
                }
                ("update" | "patch", "status") if !bound(old) => {
                    return Err(format!("node {node:?} can only update pod status for pods with spec.nodeName set to itself"));
                }
                ("delete", "") | ("create", "eviction") if !bound(old) => {
                    return Err(format!(
                        "node {node:?} can only delete pods with spec.nodeName set to itself"
                    ));
                }
                _ => {}
            }
        }
        ("coordination.k8s.io", "leases") => {
            only_own(node, "lease", a, old, new)?;
        }
        ("", "persistentvolumes") if matches!(a.verb.as_str(), "update" | "patch") => {
            admit_volume_update(node, old, new)?;
        }
        _ => {}
    }
    Ok(())
}

/// A node may change a PV only to remove finalizers from a local-path PV
/// labelled with its name: the last step of its cleanup.
fn admit_volume_update(node: &str, old: Option<&Value>, new: Option<&Value>) -> Result<(), String> {
    let (Some(old), Some(new)) = (old, new) else {
        return Err(format!(
            "node {node:?} can only update existing persistentvolumes"
        ));
    };
    let name = old["metadata"]["name"].as_str().unwrap_or_default();
    if old["metadata"]["labels"][LOCAL_PATH_NODE_LABEL].as_str() != Some(node) {
        return Err(format!(
            "node {node:?} is not allowed to modify persistentvolume {name:?}: it is not labelled {LOCAL_PATH_NODE_LABEL}={node}"
        ));
    }
    let finalizers = |o: &Value| -> Vec<String> {
        o["metadata"]["finalizers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f| f.as_str().map(String::from))
            .collect()
    };
    let (was, is) = (finalizers(old), finalizers(new));
    let only_removed = is.iter().all(|f| was.contains(f));
    // Everything else must stay as stored: the object's spec, status,
    // labels, annotations and owners.
    let same = |path: &[&str]| {
        let get = |o: &Value| path.iter().fold(o.clone(), |v, k| v[*k].clone());
        get(old) == get(new)
    };
    let unchanged = same(&["spec"])
        && (new["status"].is_null() || same(&["status"]))
        && same(&["metadata", "labels"])
        && same(&["metadata", "annotations"])
        && same(&["metadata", "ownerReferences"]);
    if !only_removed || !unchanged {
        return Err(format!(
            "node {node:?} can only remove finalizers (such as {LOCAL_PATH_CLEANUP_FINALIZER}) from persistentvolume {name:?}"
        ));
    }
    Ok(())
}

/// NodeRestriction for a TokenRequest a node makes (upstream's
/// `admitServiceAccount`): the token must be bound to a pod, by name and
/// uid, and that pod must be bound to the node. A node can thus only mint
/// tokens that die with one of its own pods. `pod` is the bound pod as
/// stored, None when there is none.
///
/// # Errors
/// The 403 message (upstream's words); for a missing pod, the NotFound
/// message (upstream answers 404 there).
pub fn admit_token_request(
    node: &str,
    pod: Option<&Value>,
    token_request: &Value,
) -> Result<(), String> {
    let r = &token_request["spec"]["boundObjectRef"];
    let field = |k: &str| r[k].as_str().unwrap_or("");
    if !r.is_object()
        || field("apiVersion") != "v1"
        || field("kind") != "Pod"
        || field("name").is_empty()
    {
        return Err("node requested token not bound to a pod".into());
    }
    let uid = field("uid");
    if uid.is_empty() {
        return Err("node requested token with a pod binding without a uid".into());
    }
    let Some(pod) = pod else {
        return Err(format!("pods {:?} not found", field("name")));
    };
    if pod["metadata"]["uid"].as_str() != Some(uid) {
        return Err(format!("the UID in the bound object reference ({uid}) does not match the UID in record. The object might have been deleted and then recreated"));
    }
    if pod["spec"]["nodeName"].as_str() != Some(node) {
        return Err("node requested token bound to a pod scheduled on a different node".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn restriction() {
        let a = Attributes {
            verb: "patch".into(),
            resource_request: true,
            resource: "pods".into(),
            subresource: "status".into(),
            ..Default::default()
        };
        let mine = json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n1"}});
        assert!(admit("n1", &a, Some(&mine), None).is_ok());
        assert!(admit("n2", &a, Some(&mine), None).is_err());
        let a = Attributes {
            verb: "update".into(),
            resource_request: true,
            resource: "nodes".into(),
            subresource: "status".into(),
            name: "n2".into(),
            ..Default::default()
        };
        assert!(admit("n1", &a, None, Some(&json!({"metadata": {"name": "n2"}}))).is_err());
        let pod = json!({"spec": {"volumes": [{"name": "v", "secret": {"secretName": "s"}}], "containers": [{"envFrom": [{"configMapRef": {"name": "cm"}}]}]}});
        assert!(pod_references(&pod, "secrets", "s"));
        assert!(pod_references(&pod, "configmaps", "cm"));
        assert!(!pod_references(&pod, "secrets", "cm"));
    }

    #[test]
    fn token_requests_bound_to_own_pods_only() {
        let pod = json!({"metadata": {"name": "p", "uid": "u1"}, "spec": {"nodeName": "n1"}});
        let tr = |r: Value| json!({"spec": {"audiences": ["a"], "boundObjectRef": r}});
        let bound = tr(json!({"kind": "Pod", "apiVersion": "v1", "name": "p", "uid": "u1"}));
        assert_eq!(admit_token_request("n1", Some(&pod), &bound), Ok(()));
        let err = |node: &str, pod: Option<&Value>, t: &Value| {
            admit_token_request(node, pod, t).unwrap_err()
        };
        assert_eq!(
            err("n2", Some(&pod), &bound),
            "node requested token bound to a pod scheduled on a different node"
        );
        assert_eq!(err("n1", None, &bound), "pods \"p\" not found");
        assert_eq!(
            err("n1", Some(&pod), &json!({"spec": {}})),
            "node requested token not bound to a pod"
        );
        let secret = tr(json!({"kind": "Secret", "apiVersion": "v1", "name": "p", "uid": "u1"}));
        assert_eq!(
            err("n1", Some(&pod), &secret),
            "node requested token not bound to a pod"
        );
        let no_uid = tr(json!({"kind": "Pod", "apiVersion": "v1", "name": "p"}));
        assert_eq!(
            err("n1", Some(&pod), &no_uid),
            "node requested token with a pod binding without a uid"
        );
        let other = tr(json!({"kind": "Pod", "apiVersion": "v1", "name": "p", "uid": "u0"}));
        assert!(err("n1", Some(&pod), &other)
            .starts_with("the UID in the bound object reference (u0) does not match"));
    }

    #[test]
    fn pv_list_selector_must_name_the_node() {
        assert!(selects_own_local_path("n1", "skiff.io/local-path-node=n1"));
        assert!(selects_own_local_path(
            "n1",
            "a=b, skiff.io/local-path-node==n1"
        ));
        assert!(!selects_own_local_path("n1", "skiff.io/local-path-node=n2"));
        assert!(!selects_own_local_path(
            "n1",
            "skiff.io/local-path-node!=n2"
        ));
        assert!(!selects_own_local_path("n1", "skiff.io/local-path-node"));
        assert!(!selects_own_local_path(
            "n1",
            "skiff.io/local-path-node in (n1,n2)"
        ));
        assert!(!selects_own_local_path("n1", ""));
    }

    #[test]
    fn nodes_only_remove_finalizers_of_their_local_path_volumes() {
        let a = Attributes {
            verb: "update".into(),
            resource_request: true,
            resource: "persistentvolumes".into(),
            name: "pv1".into(),
            ..Default::default()
        };
        let old = json!({"metadata": {"name": "pv1", "labels": {"skiff.io/local-path-node": "n1"},
            "finalizers": ["kubernetes.io/pv-protection", "skiff.io/local-path-cleanup"]},
            "spec": {"local": {"path": "/r/v"}, "persistentVolumeReclaimPolicy": "Delete"},
            "status": {"phase": "Released"}});
        let mut new = old.clone();
        new["metadata"]["finalizers"] = json!(["kubernetes.io/pv-protection"]);
        assert_eq!(admit("n1", &a, Some(&old), Some(&new)), Ok(()));
        assert!(admit("n2", &a, Some(&old), Some(&new))
            .unwrap_err()
            .contains("is not labelled skiff.io/local-path-node=n2"));
        let mut added = old.clone();
        added["metadata"]["finalizers"] = json!(["x"]);
        assert!(admit("n1", &a, Some(&old), Some(&added)).is_err());
        let mut respec = new.clone();
        respec["spec"]["persistentVolumeReclaimPolicy"] = json!("Retain");
        assert!(admit("n1", &a, Some(&old), Some(&respec)).is_err());
        let mut relabel = new.clone();
        relabel["metadata"]["labels"]["skiff.io/local-path-node"] = json!("n2");
        assert!(admit("n1", &a, Some(&old), Some(&relabel)).is_err());
        let mut restatus = new;
        restatus["status"]["phase"] = json!("Available");
        assert!(admit("n1", &a, Some(&old), Some(&restatus)).is_err());
        assert!(admit("n1", &a, None, Some(&old)).is_err());
    }

    #[tokio::test]
    async fn nodes_read_the_claims_and_volumes_of_their_pods() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::SqliteStore::open(dir.path().join("s.db"))
            .await
            .unwrap();
        let put = |key: String, v: Value| {
            let store = &store;
            async move {
                store
                    .create(&key, serde_json::to_vec(&v).unwrap())
                    .await
                    .unwrap();
            }
        };
        put(
            "/registry/core/pods/ns/a".into(),
            json!({"metadata": {"name": "a", "namespace": "ns"},
            "spec": {"nodeName": "n1", "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "c1"}},
                {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}]}}),
        )
        .await;
        put("/registry/core/pods/ns/b".into(), json!({"metadata": {"name": "b", "namespace": "ns"},
            "spec": {"nodeName": "n2", "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "c2"}}]}})).await;
        for (claim, pv) in [("c1", "pv1"), ("a-scratch", "pv2"), ("c2", "pv3")] {
            put(
                format!("/registry/core/persistentvolumeclaims/ns/{claim}"),
                json!({"metadata": {"name": claim, "namespace": "ns"}, "spec": {"volumeName": pv}}),
            )
            .await;
        }
        let at = Attributes::resource;
        let d = |a: Attributes, sel: Option<&'static str>| {
            let store = &store;
            let a = Attributes {
                label_selector: sel.unwrap_or_default().into(),
                ..a
            };
            async move { authorize("n1", &a, store).await }
        };
        let pvc = "persistentvolumeclaims";
        let pv = "persistentvolumes";
        assert_eq!(
            d(at("get", pvc, "", "ns", "c1"), None).await,
            Decision::Allow
        );
        assert_eq!(
            d(at("get", pvc, "", "ns", "a-scratch"), None).await,
            Decision::Allow
        );
        assert!(matches!(d(at("get", pvc, "", "ns", "c2"), None).await,
            Decision::Deny(m) if m == "no relationship found between node \"n1\" and this object (persistentvolumeclaims ns/c2)"));
        assert!(matches!(
            d(at("list", pvc, "", "ns", ""), None).await,
            Decision::Deny(_)
        ));
        assert!(matches!(
            d(at("update", pvc, "", "ns", "c1"), None).await,
            Decision::Deny(_)
        ));
        assert_eq!(
            d(at("patch", pvc, "status", "ns", "c1"), None).await,
            Decision::Allow
        );
        assert!(matches!(
            d(at("patch", pvc, "status", "ns", "c2"), None).await,
            Decision::Deny(_)
        ));
        assert_eq!(d(at("get", pv, "", "", "pv1"), None).await, Decision::Allow);
        assert_eq!(d(at("get", pv, "", "", "pv2"), None).await, Decision::Allow);
        assert!(matches!(
            d(at("get", pv, "", "", "pv3"), None).await,
            Decision::Deny(_)
        ));
        assert!(matches!(
            d(at("list", pv, "", "", ""), None).await,
            Decision::Deny(_)
        ));
        assert!(matches!(
            d(
                at("watch", pv, "", "", ""),
                Some("skiff.io/local-path-node=n2")
            )
            .await,
            Decision::Deny(_)
        ));
        assert_eq!(
            d(
                at("watch", pv, "", "", ""),
                Some("skiff.io/local-path-node=n1")
            )
            .await,
            Decision::Allow
        );
        assert_eq!(
            d(
                at("list", pv, "", "", ""),
                Some("skiff.io/local-path-node=n1")
            )
            .await,
            Decision::Allow
        );
        assert_eq!(
            d(at("update", pv, "", "", "pv9"), None).await,
            Decision::Allow,
            "checked in admit"
        );
        assert!(matches!(
            d(at("delete", pv, "", "", "pv1"), None).await,
            Decision::Deny(_)
        ));
        assert!(matches!(
            d(at("create", pv, "", "", ""), None).await,
            Decision::Deny(_)
        ));
    }

    #[tokio::test]
    async fn nodes_create_tokens_of_their_pods_service_accounts() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::SqliteStore::open(dir.path().join("s.db"))
            .await
            .unwrap();
        for (name, node, sa) in [("a", "n1", "robot"), ("b", "n2", "other")] {
            let pod = json!({"metadata": {"name": name, "namespace": "ns"}, "spec": {"nodeName": node, "serviceAccountName": sa}});
            store
                .create(
                    &format!("/registry/core/pods/ns/{name}"),
                    serde_json::to_vec(&pod).unwrap(),
                )
                .await
                .unwrap();
        }
        let a = |verb: &str, name: &str, sub: &str| Attributes {
            verb: verb.into(),
            resource_request: true,
            resource: "serviceaccounts".into(),
            subresource: sub.into(),
            namespace: "ns".into(),
            name: name.into(),
            ..Default::default()
        };
        let d = |at: Attributes| {
            let store = &store;
            async move { authorize("n1", &at, store).await }
        };
        assert_eq!(d(a("create", "robot", "token")).await, Decision::Allow);
        assert!(
            matches!(d(a("create", "other", "token")).await, Decision::Deny(m) if m.starts_with("no relationship found between node \"n1\""))
        );
        assert!(
            matches!(d(a("get", "robot", "token")).await, Decision::Deny(m) if m == "can only create tokens for individual service accounts")
        );
        assert_eq!(d(a("get", "robot", "")).await, Decision::Allow);
        assert!(matches!(d(a("get", "other", "")).await, Decision::Deny(_)));
    }
}
