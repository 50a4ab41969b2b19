//! The Node authorizer and NodeRestriction admission: a kubelet identity
//! (`system:node:NAME` in `system:nodes`) may read what nodes read, write
//! only its own Node and Lease and the status of pods bound to it, read
//! only the secrets and configmaps its pods use, and mint only tokens of
//! the ServiceAccounts its pods run as, bound to those pods.

use serde_json::Value;

use super::Attributes;
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
        ("", "services")
        | ("", "endpoints")
        | ("discovery.k8s.io", "endpointslices")
        | ("", "namespaces")
            if read =>
        {
            Decision::Allow
        }
        // The kubelet's token manager asks for its pods' tokens; which pod
        // a token is bound to is checked in [`admit_token_request`].
        ("", "serviceaccounts") if a.subresource == "token" => {
            authorize_create_token(node, a, store).await
        }
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
        _ => {}
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
