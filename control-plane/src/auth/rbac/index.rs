//! The RBAC objects indexed for authorization: roles by name, and each
//! binding's role under every subject it names, so a request looks up
//! only the bindings of its own user and groups (upstream's rule resolver
//! lists every binding; an index keeps the cost flat as bindings grow).

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};

use serde::Deserialize;

use super::PREFIX;
use crate::auth::Identity;

/// Bindings of one scope (the cluster, or one namespace) by subject.
#[derive(Debug, Default)]
struct Bindings {
    /// User name (service accounts as `system:serviceaccount:NS:NAME`)
    /// -> role references.
    users: HashMap<String, Vec<RoleRef>>,
    groups: HashMap<String, Vec<RoleRef>>,
}

impl Bindings {
    fn add(&mut self, subjects: &[Subject], role: &RoleRef, binding_ns: &str) {
        for s in subjects {
            let key = match s.kind.as_str() {
                "User" => s.name.clone(),
                "Group" => {
                    self.groups
                        .entry(s.name.clone())
                        .or_default()
                        .push(role.clone());
                    continue;
                }
                // A service account subject without a namespace is in the
                // binding's (none for cluster bindings: it names nobody).
                "ServiceAccount" => {
                    let ns = s
                        .namespace
                        .as_deref()
                        .filter(|n| !n.is_empty())
                        .unwrap_or(binding_ns);
                    if ns.is_empty() {
                        continue;
                    }
                    format!("system:serviceaccount:{ns}:{}", s.name)
                }
                _ => continue,
            };
            self.users.entry(key).or_default().push(role.clone());
        }
    }

    /// The role references bound to `id` (its user or any of its groups).
    fn of<'a>(&'a self, id: &'a Identity) -> impl Iterator<Item = &'a RoleRef> + 'a {
        let user = self.users.get(&id.user).into_iter().flatten();
        let groups = id
            .groups
            .iter()
            .filter_map(|g| self.groups.get(g))
            .flatten();
        user.chain(groups)
    }
}

/// Everything RBAC needs to answer a request, built from the objects.
#[derive(Debug, Default)]
pub struct Index {
    roles: HashMap<(String, String), Arc<[PolicyRule]>>,
    cluster_roles: HashMap<String, Arc<[PolicyRule]>>,
    cluster_bindings: Bindings,
    bindings: HashMap<String, Bindings>,
}

impl Index {
    /// Index the objects (by store key). Objects that do not decode are
    /// left out: they grant nothing.
    pub fn build<'a>(objects: impl Iterator<Item = (&'a String, &'a serde_json::Value)>) -> Self {
        let mut ix = Index::default();
        for (key, v) in objects {
            let Some(rest) = key.strip_prefix(PREFIX) else {
                continue;
            };
            // The key says where the object is: `roles/NS/NAME`,
            // `clusterroles/NAME`.
            let mut parts = rest.split('/');
            let resource = parts.next().unwrap_or_default();
            let (ns, name) = match (parts.next(), parts.next()) {
                (Some(ns), Some(name)) => (ns, name),
                (Some(name), None) => ("", name),
                _ => continue,
            };
            let decoded = match resource {
                "roles" => Role::deserialize(v).map(|r| ix.add_role(ns, name, r)),
                "clusterroles" => ClusterRole::deserialize(v).map(|r| ix.add_cluster_role(name, r)),
                "rolebindings" => RoleBinding::deserialize(v).map(|b| ix.add_binding(ns, b)),
                "clusterrolebindings" => {
                    ClusterRoleBinding::deserialize(v).map(|b| ix.add_cluster_binding(b))
                }
                _ => Ok(()),
            };
            if let Err(e) = decoded {
                tracing::warn!(key, error = %e, "rbac: object does not decode; it grants nothing");
            }
        }
        ix
    }

    fn add_role(&mut self, ns: &str, name: &str, r: Role) {
        let key = (ns.to_string(), name.to_string());
        self.roles.insert(key, r.rules.unwrap_or_default().into());
    }

    fn add_cluster_role(&mut self, name: &str, r: ClusterRole) {
        self.cluster_roles
            .insert(name.to_string(), r.rules.unwrap_or_default().into());
    }

    fn add_binding(&mut self, ns: &str, b: RoleBinding) {
        self.bindings.entry(ns.to_string()).or_default().add(
            b.subjects.as_deref().unwrap_or_default(),
            &b.role_ref,
            ns,
        );
    }

    fn add_cluster_binding(&mut self, b: ClusterRoleBinding) {
        // A cluster binding may only refer to a ClusterRole.
        if b.role_ref.kind != "ClusterRole" {
            return;
        }
        self.cluster_bindings
            .add(b.subjects.as_deref().unwrap_or_default(), &b.role_ref, "");
    }

    /// The rules a role reference grants in `namespace` (the binding's;
    /// empty for cluster bindings). None when the role does not exist.
    pub fn role_rules(&self, role: &RoleRef, namespace: &str) -> Option<Arc<[PolicyRule]>> {
        match role.kind.as_str() {
            "ClusterRole" => self.cluster_roles.get(&role.name).cloned(),
            "Role" if !namespace.is_empty() => self
                .roles
                .get(&(namespace.to_string(), role.name.clone()))
                .cloned(),
            _ => None,
        }
    }

    /// Every rule granted to `id` in `namespace` (cluster bindings
    /// everywhere; the namespace's bindings when it is not empty), each
    /// visited until `visit` returns true. Returns whether one did.
    pub fn any_rule(
        &self,
        id: &Identity,
        namespace: &str,
        mut visit: impl FnMut(&PolicyRule) -> bool,
    ) -> bool {
        let mut scopes: Vec<(&Bindings, &str)> = vec![(&self.cluster_bindings, "")];
        if !namespace.is_empty() {
            if let Some(b) = self.bindings.get(namespace) {
                scopes.push((b, namespace));
            }
        }
        for (bindings, ns) in scopes {
            for role in bindings.of(id) {
                let Some(rules) = self.role_rules(role, ns) else {
                    continue;
                };
                if rules.iter().any(&mut visit) {
                    return true;
                }
            }
        }
        false
    }

    /// Every rule granted to `id` in `namespace`.
    pub fn rules_for(&self, id: &Identity, namespace: &str) -> Vec<PolicyRule> {
        let mut out = Vec::new();
        self.any_rule(id, namespace, |r| {
            out.push(r.clone());
            false
        });
        out
    }
}
