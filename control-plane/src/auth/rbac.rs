//! RBAC: roles, cluster roles and their bindings, evaluated against an
//! in-memory copy of the `rbac.authorization.k8s.io` objects that a store
//! watch keeps current (upstream's RBAC authorizer reads informers too, so
//! a new binding takes effect a moment after it is written).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use serde_json::Value;

use super::{Attributes, Identity};
use crate::store::{self, Event, Store};

/// Key prefix of every RBAC object.
pub const PREFIX: &str = "/registry/rbac.authorization.k8s.io/";

/// The RBAC objects by store key.
#[derive(Debug, Default)]
pub struct Rbac {
    objects: RwLock<HashMap<String, Value>>,
}

impl Rbac {
    pub fn new() -> Arc<Self> {
        Arc::new(Rbac::default())
    }

    fn put(&self, key: &str, value: &[u8]) {
        if let Ok(v) = serde_json::from_slice::<Value>(value) {
            self.objects
                .write()
                .expect("rbac lock")
                .insert(key.to_string(), v);
        }
    }

    fn remove(&self, key: &str) {
        self.objects.write().expect("rbac lock").remove(key);
    }

    /// Load everything, then follow the store until `shutdown` fires;
    /// re-lists when the watch ends (compaction, store restart).
    pub async fn sync(
        self: Arc<Self>,
        store: Arc<dyn Store>,
        mut shutdown: tokio::sync::watch::Receiver<bool>,
    ) {
        loop {
            let rev = match self.relist(store.as_ref()).await {
                Ok(rev) => rev,
                Err(e) => {
                    tracing::warn!(error = %e, "rbac: listing roles failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => continue,
                        _ = shutdown.changed() => return,
                    }
                }
            };
            let mut stream = match store.watch(PREFIX, rev).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "rbac: watch failed; re-listing");
                    continue;
                }
            };
            loop {
                tokio::select! {
                    ev = stream.next() => match ev {
                        Some(Ok(Event::Put { kv, .. })) => self.put(&kv.key, &kv.value),
                        Some(Ok(Event::Delete { prev, .. })) => self.remove(&prev.key),
                        Some(Err(e)) => {
                            tracing::info!(error = %e, "rbac: watch ended; re-listing");
                            break;
                        }
                        None => break,
                    },
                    _ = shutdown.changed() => return,
                }
            }
        }
    }

    /// Replace the copy with a fresh list; returns its revision.
    pub async fn relist(&self, store: &dyn Store) -> store::Result<i64> {
        let list = store.list(PREFIX, None, 0, None).await?;
        let mut m = HashMap::new();
        for kv in list.kvs {
            if let Ok(v) = serde_json::from_slice::<Value>(&kv.value) {
                m.insert(kv.key, v);
            }
        }
        *self.objects.write().expect("rbac lock") = m;
        Ok(list.revision)
    }

    /// Whether any binding grants `a` to `id`.
    pub fn allows(&self, id: &Identity, a: &Attributes) -> bool {
        let objs = self.objects.read().expect("rbac lock");
        let role_rules = |kind: &str, ns: &str, name: &str| -> Vec<Value> {
            let key = match kind {
                "ClusterRole" => format!("{PREFIX}clusterroles/{name}"),
                _ => format!("{PREFIX}roles/{ns}/{name}"),
            };
            objs.get(&key)
                .and_then(|r| r["rules"].as_array().cloned())
                .unwrap_or_default()
        };
        for (key, b) in objs.iter() {
            let binding_ns = if let Some(rest) = key.strip_prefix(&format!("{PREFIX}rolebindings/"))
            {
                let ns = rest.split('/').next().unwrap_or_default();
                if a.namespace.is_empty() || ns != a.namespace {
                    continue;
                }
                ns
            } else if key.starts_with(&format!("{PREFIX}clusterrolebindings/")) {
                ""
            } else {
                continue;
            };
            if !subjects_match(b, binding_ns, id) {
                continue;
            }
            let rr = &b["roleRef"];
            let rules = role_rules(
                rr["kind"].as_str().unwrap_or_default(),
                binding_ns,
                rr["name"].as_str().unwrap_or_default(),
            );
            if rules.iter().any(|r| rule_allows(r, a)) {
                return true;
            }
        }
        false
    }
}

fn subjects_match(binding: &Value, binding_ns: &str, id: &Identity) -> bool {
    binding["subjects"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|s| {
            let name = s["name"].as_str().unwrap_or_default();
            match s["kind"].as_str().unwrap_or_default() {
                "User" => name == id.user,
                "Group" => id.in_group(name),
                "ServiceAccount" => {
                    let ns = s["namespace"]
                        .as_str()
                        .filter(|n| !n.is_empty())
                        .unwrap_or(binding_ns);
                    id.user == format!("system:serviceaccount:{ns}:{name}")
                }
                _ => false,
            }
        })
}

fn has(list: &Value, want: &str) -> bool {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .any(|x| x == "*" || x == want)
}

/// One `PolicyRule` against a request (upstream's `RuleAllows`).
pub fn rule_allows(rule: &Value, a: &Attributes) -> bool {
    if !has(&rule["verbs"], &a.verb) {
        return false;
    }
    if !a.resource_request {
        return rule["nonResourceURLs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .any(|u| {
                u == "*"
                    || u == a.path
                    || (u.ends_with('*') && a.path.starts_with(u.trim_end_matches('*')))
            });
    }
    if !has(&rule["apiGroups"], &a.group) {
        return false;
    }
    let combined = if a.subresource.is_empty() {
        a.resource.clone()
    } else {
        format!("{}/{}", a.resource, a.subresource)
    };
    let resource_ok = rule["resources"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .any(|r| {
            r == "*"
                || r == combined
                || (!a.subresource.is_empty() && r == format!("*/{}", a.subresource))
                || (r.ends_with("/*") && r.trim_end_matches("/*") == a.resource)
        });
    if !resource_ok {
        return false;
    }
    match rule["resourceNames"].as_array() {
        Some(names) if !names.is_empty() => {
            names.iter().any(|n| n.as_str() == Some(a.name.as_str()))
        }
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn attrs(verb: &str, resource: &str, sub: &str, ns: &str, name: &str) -> Attributes {
        Attributes {
            verb: verb.into(),
            resource_request: true,
            resource: resource.into(),
            subresource: sub.into(),
            namespace: ns.into(),
            name: name.into(),
            ..Default::default()
        }
    }

    #[test]
    fn rules() {
        let r = json!({"apiGroups": [""], "resources": ["pods", "pods/status"], "verbs": ["get", "update"], "resourceNames": ["p1"]});
        assert!(rule_allows(&r, &attrs("get", "pods", "", "d", "p1")));
        assert!(rule_allows(
            &r,
            &attrs("update", "pods", "status", "d", "p1")
        ));
        assert!(!rule_allows(&r, &attrs("get", "pods", "", "d", "p2")));
        assert!(!rule_allows(&r, &attrs("get", "pods", "log", "d", "p1")));
        assert!(!rule_allows(&r, &attrs("delete", "pods", "", "d", "p1")));
        let nr = json!({"nonResourceURLs": ["/healthz", "/api/*"], "verbs": ["get"]});
        let a = Attributes {
            verb: "get".into(),
            path: "/api/v1".into(),
            ..Default::default()
        };
        assert!(rule_allows(&nr, &a));
    }

    #[test]
    fn bindings() {
        let rbac = Rbac::default();
        rbac.put(
            &format!("{PREFIX}roles/d/reader"),
            br#"{"rules":[{"apiGroups":[""],"resources":["pods"],"verbs":["get","list"]}]}"#,
        );
        rbac.put(
            &format!("{PREFIX}rolebindings/d/rb"),
            br#"{"roleRef":{"kind":"Role","name":"reader"},"subjects":[{"kind":"User","name":"bob"}]}"#,
        );
        let bob = Identity::new("bob", vec![]);
        assert!(rbac.allows(&bob, &attrs("list", "pods", "", "d", "")));
        assert!(!rbac.allows(&bob, &attrs("list", "pods", "", "other", "")));
        assert!(!rbac.allows(
            &Identity::new("eve", vec![]),
            &attrs("list", "pods", "", "d", "")
        ));
    }
}
