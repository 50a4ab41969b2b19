//! RBAC kinds (`rbac.authorization.k8s.io/v1`): names are path segments
//! (`system:node`), rules and bindings are validated as upstream's
//! `pkg/apis/rbac/validation`, nobody grants what they do not hold
//! ([`crate::auth::rbac::escalation`]), and their `kubectl get` columns.

use futures::future::BoxFuture;
use k8s_openapi::api::rbac::v1::{PolicyRule, RoleRef};
use serde_json::{json, Value};

use super::{NameRule, Strategy};
use crate::apiserver::status::{qualified, ApiError, ApiResult, Cause};
use crate::apiserver::table::{age_cell, name_cell, s, Col, AGE, NAME};
use crate::apiserver::{objects, ApiServer, Req};
use crate::auth::rbac::escalation::{self, GROUP};

/// Roles and ClusterRoles.
pub struct Role;

/// RoleBindings and ClusterRoleBindings.
pub struct Binding;

impl Strategy for Role {
    fn name_rule(&self) -> NameRule {
        NameRule::PathSegment
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let namespaced = objects::namespace(obj).is_some();
        let mut c = Vec::new();
        for (i, rule) in obj["rules"].as_array().into_iter().flatten().enumerate() {
            policy_rule(rule, namespaced, &format!("rules[{i}]"), &mut c);
        }
        c
    }

    fn authorize_write<'a>(
        &'a self,
        api: &'a ApiServer,
        r: &'a Req,
        old: Option<&'a Value>,
        new: &'a Value,
    ) -> BoxFuture<'a, ApiResult<()>> {
        Box::pin(authorize_role(api, r, old, new))
    }

    fn columns(&self) -> Vec<Col> {
        vec![
            NAME,
            ("Created At", "date", 0, "Time is a wrapper around time.Time which supports correct marshaling to YAML and JSON."),
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        vec![
            name_cell(obj),
            json!(objects::meta_str(obj, "creationTimestamp").unwrap_or_default()),
        ]
    }
}

impl Strategy for Binding {
    fn name_rule(&self) -> NameRule {
        NameRule::PathSegment
    }

    /// User and Group subjects are in the RBAC group unless they say.
    fn default(&self, obj: &mut Value) {
        for subj in obj["subjects"].as_array_mut().into_iter().flatten() {
            let person = matches!(subj["kind"].as_str(), Some("User" | "Group"));
            if person && subj["apiGroup"].as_str().is_none_or(str::is_empty) {
                subj["apiGroup"] = json!(GROUP);
            }
        }
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let namespaced = objects::namespace(obj).is_some();
        let mut c = Vec::new();
        let rr = &obj["roleRef"];
        let group = s(&rr["apiGroup"]);
        if group != GROUP {
            c.push(Cause::not_supported("roleRef.apiGroup", &group, &[GROUP]));
        }
        let kinds: &[&str] = if namespaced {
            &["Role", "ClusterRole"]
        } else {
            &["ClusterRole"]
        };
        let kind = s(&rr["kind"]);
        if !kinds.contains(&kind.as_str()) {
            c.push(Cause::not_supported("roleRef.kind", &kind, kinds));
        }
        if s(&rr["name"]).is_empty() {
            c.push(Cause::required("roleRef.name"));
        }
        for (i, subj) in obj["subjects"].as_array().into_iter().flatten().enumerate() {
            subject(subj, namespaced, &format!("subjects[{i}]"), &mut c);
        }
        c
    }

    fn validate_update(&self, old: &Value, new: &Value) -> Vec<Cause> {
        let mut c = self.validate(new);
        if old["roleRef"] != new["roleRef"] {
            c.push(Cause::invalid(
                "roleRef",
                &new["roleRef"].to_string(),
                "cannot change roleRef",
            ));
        }
        c
    }

    fn authorize_write<'a>(
        &'a self,
        api: &'a ApiServer,
        r: &'a Req,
        old: Option<&'a Value>,
        new: &'a Value,
    ) -> BoxFuture<'a, ApiResult<()>> {
        Box::pin(authorize_binding(api, r, old, new))
    }

    fn columns(&self) -> Vec<Col> {
        vec![
            NAME,
            ("Role", "string", 0, "Role"),
            AGE,
            ("Users", "string", 1, "Users in the roleBinding"),
            ("Groups", "string", 1, "Groups in the roleBinding"),
            (
                "ServiceAccounts",
                "string",
                1,
                "ServiceAccounts in the roleBinding",
            ),
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let subjects = |k: &str| -> String {
            let v: Vec<String> = obj["subjects"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|x| x["kind"] == k)
                .map(|x| {
                    if k == "ServiceAccount" {
                        format!("{}/{}", s(&x["namespace"]), s(&x["name"]))
                    } else {
                        s(&x["name"])
                    }
                })
                .collect();
            v.join(", ")
        };
        vec![
            name_cell(obj),
            json!(format!(
                "{}/{}",
                s(&obj["roleRef"]["kind"]),
                s(&obj["roleRef"]["name"])
            )),
            age_cell(obj),
            json!(subjects("User")),
            json!(subjects("Group")),
            json!(subjects("ServiceAccount")),
        ]
    }
}

/// `validatePolicyRule`.
fn policy_rule(rule: &Value, namespaced: bool, path: &str, c: &mut Vec<Cause>) {
    let len = |k: &str| rule[k].as_array().map_or(0, Vec::len);
    if len("verbs") == 0 {
        c.push(Cause::required_because(
            format!("{path}.verbs"),
            "verbs must contain at least one value",
        ));
    }
    if len("nonResourceURLs") > 0 {
        let urls = rule["nonResourceURLs"].to_string();
        if namespaced {
            c.push(Cause::invalid(
                format!("{path}.nonResourceURLs"),
                &urls,
                "namespaced rules cannot apply to non-resource URLs",
            ));
        }
        if len("apiGroups") > 0 || len("resources") > 0 || len("resourceNames") > 0 {
            c.push(Cause::invalid(
                format!("{path}.nonResourceURLs"),
                &urls,
                "rules cannot apply to both regular resources and non-resource URLs",
            ));
        }
        return;
    }
    if len("apiGroups") == 0 {
        c.push(Cause::required_because(
            format!("{path}.apiGroups"),
            "resource rules must supply at least one api group",
        ));
    }
    if len("resources") == 0 {
        c.push(Cause::required_because(
            format!("{path}.resources"),
            "resource rules must supply at least one resource",
        ));
    }
    if len("resourceNames") > 0 && len("resources") > 1 {
        c.push(Cause::required_because(
            format!("{path}.resourceNames"),
            "resource names cannot apply to multiple resources",
        ));
    }
}

/// `validateRoleBindingSubject`.
fn subject(subj: &Value, namespaced: bool, path: &str, c: &mut Vec<Cause>) {
    let name = s(&subj["name"]);
    if name.is_empty() {
        c.push(Cause::required(format!("{path}.name")));
    }
    let group = s(&subj["apiGroup"]);
    match s(&subj["kind"]).as_str() {
        "ServiceAccount" => {
            if !group.is_empty() {
                c.push(Cause::not_supported(
                    format!("{path}.apiGroup"),
                    &group,
                    &[""],
                ));
            }
            if !namespaced && s(&subj["namespace"]).is_empty() {
                c.push(Cause::required(format!("{path}.namespace")));
            }
        }
        "User" | "Group" => {
            if group != GROUP {
                c.push(Cause::not_supported(
                    format!("{path}.apiGroup"),
                    &group,
                    &[GROUP],
                ));
            }
        }
        other => c.push(Cause::not_supported(
            format!("{path}.kind"),
            other,
            &["ServiceAccount", "User", "Group"],
        )),
    }
}

/// Whether an update changes nothing but what the garbage collector
/// writes (owner references and finalizers), which needs no escalation
/// check (upstream's `IsOnlyMutatingGCFields`).
fn only_gc_fields_change(old: &Value, new: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(m) = v["metadata"].as_object_mut() {
            for k in [
                "ownerReferences",
                "finalizers",
                "resourceVersion",
                "managedFields",
                "generation",
            ] {
                m.remove(k);
            }
        }
        v
    };
    strip(old) == strip(new)
}

fn forbidden(r: &Req, name: &str, why: &str) -> ApiError {
    ApiError::forbidden(format!(
        "{} {name:?} is forbidden: {why}",
        qualified(r.def.group, r.def.plural)
    ))
}

fn rules_of(obj: &Value) -> ApiResult<Vec<PolicyRule>> {
    if obj["rules"].is_null() {
        return Ok(Vec::new());
    }
    serde_json::from_value(obj["rules"].clone())
        .map_err(|e| ApiError::bad_request(format!("rules: {e}")))
}

fn has_aggregation_rule(obj: &Value) -> bool {
    obj["aggregationRule"]["clusterRoleSelectors"]
        .as_array()
        .is_some_and(|s| !s.is_empty())
}

/// A Role or ClusterRole write: the requester holds every permission in
/// it, or may `escalate`; an aggregation rule (which can gather anything)
/// needs every permission there is.
async fn authorize_role(
    api: &ApiServer,
    r: &Req,
    old: Option<&Value>,
    new: &Value,
) -> ApiResult<()> {
    let id = &r.identity;
    if escalation::escalation_allowed(id)
        || api
            .authorize(id, &escalation::escalate_attributes(&r.attrs))
            .await
            .is_ok()
    {
        return Ok(());
    }
    if old.is_some_and(|o| only_gc_fields_change(o, new)) {
        return Ok(());
    }
    let name = objects::name(new).unwrap_or_default();
    let ns = r.ns.as_deref().unwrap_or_default();
    let index = api.rbac.index();
    escalation::confirm_no_escalation(&index, id, ns, &rules_of(new)?)
        .map_err(|why| forbidden(r, name, &why))?;
    if has_aggregation_rule(new) || old.is_some_and(has_aggregation_rule) {
        escalation::confirm_no_escalation(&index, id, ns, &escalation::full_authority()).map_err(
            |_| {
                forbidden(
                    r,
                    name,
                    "must have cluster-admin privileges to use the aggregationRule",
                )
            },
        )?;
    }
    Ok(())
}

/// A RoleBinding or ClusterRoleBinding write: the requester may `bind`
/// the role, or holds every permission it grants where the binding
/// grants it.
async fn authorize_binding(
    api: &ApiServer,
    r: &Req,
    old: Option<&Value>,
    new: &Value,
) -> ApiResult<()> {
    let id = &r.identity;
    if escalation::escalation_allowed(id) || old.is_some_and(|o| only_gc_fields_change(o, new)) {
        return Ok(());
    }
    let role: RoleRef = serde_json::from_value(new["roleRef"].clone())
        .map_err(|e| ApiError::bad_request(format!("roleRef: {e}")))?;
    let ns = r.ns.as_deref().unwrap_or_default();
    let bind = escalation::bind_attributes(&role.kind, &role.name, ns);
    if api.authorize(id, &bind).await.is_ok() {
        return Ok(());
    }
    let index = api.rbac.index();
    let rules = index.role_rules(&role, ns).ok_or_else(|| {
        let plural = if role.kind == "Role" {
            "roles"
        } else {
            "clusterroles"
        };
        ApiError::not_found(GROUP, plural, &role.name)
    })?;
    let name = objects::name(new).unwrap_or_default();
    escalation::confirm_no_escalation(&index, id, ns, &rules)
        .map_err(|why| forbidden(r, name, &why))
}
