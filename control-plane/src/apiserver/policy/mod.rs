//! ValidatingAdmissionPolicy enforcement (admissionregistration.k8s.io/v1,
//! upstream's `plugin/policy/validating`): the policies and bindings in
//! the store, followed into memory and compiled once, and their CEL
//! validations run on every write a binding selects, after the built-in
//! validating plugins and before the validating webhooks.
//!
//! For each binding (by name) whose policy exists: the policy's
//! `matchConstraints` and the binding's `matchResources` must select the
//! write, the policy's `matchConditions` hold; then for each parameter
//! object the binding's `paramRef` finds (one run without parameters when
//! the policy has no `paramKind`), the `variables` are computed in order
//! and every validation runs. A failed validation is acted on as the
//! binding says: `Deny` refuses the write, `Warn` adds a warning, `Audit`
//! adds an audit annotation. An expression that cannot be evaluated, or
//! missing parameters under `parameterNotFoundAction: Deny`, fail the
//! policy as its `failurePolicy` says.
//!
//! # Layout
//! - [`compiled`]: a policy and a binding, compiled.
//! - [`typecheck`]: the `status.typeChecking` of policies.

pub mod compiled;
pub mod typecheck;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};

use cel::Value as Cel;
use serde_json::{json, Map, Value};

use self::compiled::{Binding, Policy};
use super::admission_request::{exempt, operation, AdmissionRequest};
use super::audit;
use super::cel::expression::{self, Vars};
use super::resources::{self, ResourceDef};
use super::status::{ApiError, ApiResult};
use super::webhook::hook::conditions_hold;
use super::{ApiServer, Req};
use crate::store::follow::{follow, Change};

/// The audit annotation of failed validations under `Audit`.
const VALIDATION_FAILURE: &str = "validation.policy.admission.k8s.io/validation_failure";

#[derive(Default)]
struct Published {
    policies: BTreeMap<String, Arc<Policy>>,
    bindings: Vec<Arc<Binding>>,
}

/// The policies and bindings in force.
#[derive(Default)]
pub struct Policies {
    published: RwLock<Arc<Published>>,
    /// By store key, as followed.
    policies: Mutex<BTreeMap<String, Arc<Policy>>>,
    bindings: Mutex<BTreeMap<String, Arc<Binding>>>,
}

impl Policies {
    fn published(&self) -> Arc<Published> {
        self.published
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn publish(&self) {
        let policies = self
            .policies
            .lock()
            .expect("policies lock")
            .values()
            .map(|p| (p.name.clone(), p.clone()))
            .collect();
        let bindings = self
            .bindings
            .lock()
            .expect("bindings lock")
            .values()
            .cloned()
            .collect();
        *self.published.write().unwrap_or_else(|p| p.into_inner()) =
            Arc::new(Published { policies, bindings });
    }
}

fn apply<T>(
    map: &Mutex<BTreeMap<String, Arc<T>>>,
    change: Change,
    build: impl Fn(&Value) -> Option<T>,
) {
    let parse = |value: &[u8]| {
        serde_json::from_slice::<Value>(value)
            .ok()
            .and_then(|v| build(&v))
            .map(Arc::new)
    };
    change.apply_to(&mut map.lock().expect("policy map lock"), parse);
}

/// Follow policies and bindings until the server shuts down, and keep
/// the policies' type checking current.
pub async fn run(api: Arc<ApiServer>) {
    let def = |plural| {
        resources::lookup("admissionregistration.k8s.io", "v1", plural)
            .expect("admission policies are served")
    };
    let (policy_prefix, binding_prefix) = (
        def("validatingadmissionpolicies").prefix(None),
        def("validatingadmissionpolicybindings").prefix(None),
    );
    let policies = follow(
        api.store.as_ref(),
        &policy_prefix,
        api.shutdown.clone(),
        "validatingadmissionpolicies",
        |change| {
            apply(&api.policies.policies, change, Policy::new);
            api.policies.publish();
        },
    );
    let bindings = follow(
        api.store.as_ref(),
        &binding_prefix,
        api.shutdown.clone(),
        "validatingadmissionpolicybindings",
        |change| {
            apply(&api.policies.bindings, change, Binding::new);
            api.policies.publish();
        },
    );
    tokio::join!(policies, bindings, typecheck::run(api.clone()));
}

/// A failed validation.
struct Failure {
    message: String,
    reason: &'static str,
    index: Option<usize>,
}

/// Run the policies on a create, update (`old`) or delete (`new` None);
/// returns the warnings of `Warn` bindings.
///
/// # Errors
/// The first failure of a `Deny` binding, with the policy's reason.
pub(crate) async fn validate(
    api: &ApiServer,
    r: &Req,
    old: Option<&Value>,
    new: Option<&Value>,
) -> ApiResult<Vec<String>> {
    let published = api.policies.published();
    if published.bindings.is_empty() || exempt(r) {
        return Ok(Vec::new());
    }
    let mut req = AdmissionRequest::new(api, r, operation(old, new));
    let mut warnings = Vec::new();
    for binding in &published.bindings {
        let Some(policy) = published.policies.get(&binding.policy) else {
            continue;
        };
        let failures = evaluate(&mut req, policy, binding, old, new).await?;
        for f in failures {
            let message = format!(
                "ValidatingAdmissionPolicy '{}' with binding '{}' denied request: {}",
                policy.name, binding.name, f.message
            );
            if binding.deny {
                let code = match f.reason {
                    "Forbidden" => 403,
                    "Unauthorized" => 401,
                    "RequestEntityTooLarge" => 413,
                    _ => 422,
                };
                return Err(ApiError::new(code, f.reason, message));
            }
            if binding.warn {
                warnings.push(format!(
                    "Validation failed for ValidatingAdmissionPolicy '{}' with binding '{}': {}",
                    policy.name, binding.name, f.message
                ));
            }
            if binding.audit {
                let mut actions = Vec::new();
                for (on, name) in [
                    (binding.deny, "Deny"),
                    (binding.warn, "Warn"),
                    (binding.audit, "Audit"),
                ] {
                    if on {
                        actions.push(name);
                    }
                }
                let mut entry = json!({"message": f.message, "policy": policy.name,
                    "binding": binding.name, "validationActions": actions});
                if let Some(i) = f.index {
                    entry["expressionIndex"] = json!(i);
                }
                audit::annotate(VALIDATION_FAILURE, json!([entry]).to_string());
            }
        }
    }
    Ok(warnings)
}

/// The failures of `policy` under `binding` for this write (none when
/// they do not select it).
async fn evaluate(
    req: &mut AdmissionRequest<'_>,
    policy: &Policy,
    binding: &Binding,
    old: Option<&Value>,
    new: Option<&Value>,
) -> ApiResult<Vec<Failure>> {
    let Some(version) = req.selected(&policy.matches, old, new).await? else {
        return Ok(Vec::new());
    };
    if let Some(m) = &binding.matches {
        if req.selected(m, old, new).await?.is_none() {
            return Ok(Vec::new());
        }
    }
    let fail = |message: String| -> Vec<Failure> {
        if policy.ignore_failures {
            Vec::new()
        } else {
            vec![Failure {
                message,
                reason: "Invalid",
                index: None,
            }]
        }
    };
    let params = match params(req, policy, binding).await {
        Ok(p) => p,
        Err(why) => return Ok(fail(why)),
    };
    // Only what the expressions read is built.
    let request = match policy.reads("request") {
        true => req.request(&version, old, new),
        false => Value::Null,
    };
    let namespace = match policy.reads("namespaceObject") {
        true => req
            .namespace_object()
            .await?
            .cloned()
            .unwrap_or(Value::Null),
        false => Value::Null,
    };
    let mut failures = Vec::new();
    for param in &params {
        let no_variables = Value::Object(Map::new());
        let all = [
            ("object", new.unwrap_or(&Value::Null)),
            ("oldObject", old.unwrap_or(&Value::Null)),
            ("request", &request),
            ("params", param.as_ref().unwrap_or(&Value::Null)),
            ("namespaceObject", &namespace),
            ("variables", &no_variables),
        ];
        let read: Vec<(&str, &Value)> = all.into_iter().filter(|(n, _)| policy.reads(n)).collect();
        let mut vars = Vars::new(&read);
        match conditions_hold(&policy.conditions, &vars, &mut req.budget) {
            Ok(true) => {}
            Ok(false) => continue,
            Err((name, why)) => {
                failures.extend(fail(format!(
                    "failed to evaluate match condition {name:?}: {why}"
                )));
                continue;
            }
        }
        let mut computed = Value::Object(Map::new());
        let mut broken = None;
        for (name, p) in &policy.variables {
            match expression::evaluate(p, &vars, &mut req.budget)
                .and_then(|v| v.json().map_err(|e| e.to_string()))
            {
                Ok(v) => {
                    computed[name.as_str()] = v;
                    vars.set("variables", &computed);
                }
                Err(e) => {
                    broken = Some(format!("variable {name:?} resulted in error: {e}"));
                    break;
                }
            }
        }
        if let Some(why) = broken {
            failures.extend(fail(why));
            continue;
        }
        for (i, check) in policy.checks.iter().enumerate() {
            match expression::evaluate(&check.program, &vars, &mut req.budget) {
                Ok(Cel::Bool(true)) => {}
                Ok(Cel::Bool(false)) => failures.push(Failure {
                    message: message(check, &vars, &mut req.budget),
                    reason: check.reason,
                    index: Some(i),
                }),
                Ok(other) => failures.extend(fail(format!(
                    "expression '{}' resulted in error: must evaluate to a bool, not {}",
                    check.source,
                    other.type_of()
                ))),
                Err(e) => failures.extend(fail(format!(
                    "expression '{}' resulted in error: {e}",
                    check.source
                ))),
            }
        }
        for (key, p) in &policy.annotations {
            if let Ok(Cel::String(s)) = expression::evaluate(p, &vars, &mut req.budget) {
                audit::annotate(format!("{}/{key}", policy.name), s.to_string());
            }
        }
    }
    Ok(failures)
}

/// A failed check's message: its messageExpression's when that gives one
/// line of text, else its message, else `failed expression: EXPR`.
fn message(check: &compiled::Check, vars: &Vars, budget: &mut f64) -> String {
    if let Some(p) = &check.message_expression {
        if let Ok(Cel::String(s)) = expression::evaluate(p, vars, budget) {
            if !s.trim().is_empty() && !s.contains('\n') {
                return s.to_string();
            }
        }
    }
    match check.message.as_deref().map(str::trim) {
        Some(m) if !m.is_empty() => m.to_string(),
        _ => format!("failed expression: {}", check.source),
    }
}

/// The parameter objects of `binding`: `[None]` for a policy without
/// `paramKind`; an empty list when none are found and that is allowed.
///
/// # Errors
/// Why the binding cannot be evaluated (subject to the failure policy).
async fn params(
    req: &mut AdmissionRequest<'_>,
    policy: &Policy,
    binding: &Binding,
) -> Result<Vec<Option<Value>>, String> {
    let Some((group, version, kind)) = &policy.param_kind else {
        return Ok(vec![None]);
    };
    let Some(pr) = &binding.param else {
        return Err("failed to configure binding: paramKind is set on the policy but the binding has no paramRef".into());
    };
    let def = param_def(req.api, group, version, kind).ok_or_else(|| {
        format!("failed to configure policy: failed to find resource referenced by paramKind: '{group}/{version}, Kind={kind}'")
    })?;
    let namespace = match (&pr.namespace, def.namespaced) {
        (Some(ns), true) => Some(ns.clone()),
        (None, true) => match &req.r.ns {
            Some(ns) => Some(ns.clone()),
            None => return Err("failed to configure binding: cannot use namespaced paramRef in policy binding that matches cluster-scoped resources".into()),
        },
        (_, false) => None,
    };
    let store = &req.api.store;
    let mut found = Vec::new();
    match &pr.name {
        Some(name) => {
            let kv = store
                .get(&def.key(namespace.as_deref(), name))
                .await
                .map_err(|e| e.to_string())?;
            found.extend(kv.and_then(|kv| serde_json::from_slice(&kv.value).ok()));
        }
        None => {
            let list = store
                .list(&def.prefix(namespace.as_deref()), None, 0, None)
                .await
                .map_err(|e| e.to_string())?;
            let selector = pr.selector.clone().unwrap_or_default();
            for kv in list.kvs {
                let Ok(v) = serde_json::from_slice::<Value>(&kv.value) else {
                    continue;
                };
                let labels = super::matching::labels_of(&v);
                if kube_util::selector::matches(&selector, Some(&labels)) {
                    found.push(v);
                }
            }
        }
    }
    if found.is_empty() && pr.deny_if_missing {
        return Err("failed to configure binding: no params found for policy binding with `Deny` parameterNotFoundAction".into());
    }
    Ok(found.into_iter().map(Some).collect())
}

/// The served resource of a parameter kind: built in or custom.
fn param_def(
    api: &ApiServer,
    group: &str,
    version: &str,
    kind: &str,
) -> Option<&'static ResourceDef> {
    resources::RESOURCES
        .iter()
        .find(|d| d.group == group && d.version == version && d.kind == kind)
        .or_else(|| {
            api.crds
                .in_group_version(group, version)
                .into_iter()
                .find(|d| d.kind == kind)
        })
}
