//! Nobody grants a permission they do not hold (upstream's
//! `pkg/registry/rbac/.../policybased` storages and
//! `validation.ConfirmNoEscalation`): writing a Role or ClusterRole needs
//! every permission in it, or the `escalate` verb on it; writing a binding
//! needs every permission of the role it binds, or the `bind` verb on that
//! role; members of `system:masters` may do either.

use k8s_openapi::api::rbac::v1::PolicyRule;

use super::index::Index;
use super::rules::{compact_string, covers, quoted};
use crate::auth::{Attributes, Identity};

/// The group the RBAC kinds are in.
pub const GROUP: &str = "rbac.authorization.k8s.io";

/// Members may escalate whatever RBAC says (upstream's `EscalationAllowed`).
pub fn escalation_allowed(id: &Identity) -> bool {
    id.in_group("system:masters")
}

/// Everything, as the aggregation rule of a ClusterRole may gather it.
pub fn full_authority() -> Vec<PolicyRule> {
    let all = || Some(vec!["*".to_string()]);
    vec![
        PolicyRule {
            api_groups: all(),
            resources: all(),
            verbs: vec!["*".into()],
            ..Default::default()
        },
        PolicyRule {
            non_resource_urls: all(),
            verbs: vec!["*".into()],
            ..Default::default()
        },
    ]
}

/// `rules` must be covered by what `id` holds in `namespace` (cluster
/// bindings, and the namespace's when it is not empty).
///
/// # Errors
/// The message upstream gives, listing each permission not held.
pub fn confirm_no_escalation(
    index: &Index,
    id: &Identity,
    namespace: &str,
    rules: &[PolicyRule],
) -> Result<(), String> {
    let held = index.rules_for(id, namespace);
    covers(&held, rules).map_err(|missing| {
        let mut shown: Vec<String> = missing.iter().map(compact_string).collect();
        shown.sort();
        shown.dedup();
        format!(
            "user {:?} (groups={}) is attempting to grant RBAC permissions not currently held:\n{}",
            id.user,
            quoted(&id.groups),
            shown.join("\n")
        )
    })
}

/// The attributes of the `escalate` check on the role a request writes
/// (`RoleEscalationAuthorized`).
pub fn escalate_attributes(request: &Attributes) -> Attributes {
    Attributes {
        verb: "escalate".into(),
        resource_request: true,
        group: request.group.clone(),
        resource: request.resource.clone(),
        namespace: request.namespace.clone(),
        name: request.name.clone(),
        ..Default::default()
    }
}

/// The attributes of the `bind` check on the role a binding in
/// `namespace` refers to (`BindingAuthorized`).
pub fn bind_attributes(role_kind: &str, role_name: &str, namespace: &str) -> Attributes {
    Attributes {
        verb: "bind".into(),
        resource_request: true,
        group: GROUP.into(),
        resource: if role_kind == "Role" {
            "roles".into()
        } else {
            "clusterroles".into()
        },
        namespace: namespace.into(),
        name: role_name.into(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn holding_a_permission_is_needed_to_grant_it() {
        let objs = [
            (
                format!("{}roles/team/editor", super::super::PREFIX),
                json!({"metadata": {"name": "editor", "namespace": "team"},
                       "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create"]}]}),
            ),
            (
                format!("{}rolebindings/team/alice", super::super::PREFIX),
                json!({"metadata": {"name": "alice", "namespace": "team"},
                       "roleRef": {"apiGroup": GROUP, "kind": "Role", "name": "editor"},
                       "subjects": [{"kind": "User", "name": "alice"}]}),
            ),
        ];
        let index = Index::build(objs.iter().map(|(k, v)| (k, v)));
        let alice = Identity::new("alice", vec!["system:authenticated".into()]);
        let cm_get: PolicyRule = serde_json::from_value(
            json!({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}),
        )
        .unwrap();
        assert!(
            confirm_no_escalation(&index, &alice, "team", std::slice::from_ref(&cm_get)).is_ok()
        );
        // Held in team, not elsewhere.
        assert!(confirm_no_escalation(&index, &alice, "other", &[cm_get]).is_err());
        let err = confirm_no_escalation(&index, &alice, "team", &full_authority()).unwrap_err();
        assert_eq!(
            err,
            "user \"alice\" (groups=[\"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:\n\
             {APIGroups:[\"*\"], Resources:[\"*\"], Verbs:[\"*\"]}\n\
             {NonResourceURLs:[\"*\"], Verbs:[\"*\"]}"
        );
        assert!(escalation_allowed(&Identity::new(
            "root",
            vec!["system:masters".into()]
        )));
        assert!(!escalation_allowed(&alice));
    }
}
