//! The Priority admission plugin (upstream's
//! `plugin/pkg/admission/priority`): a new pod's `priorityClassName`
//! becomes its `priority` and `preemptionPolicy`, which the scheduler
//! orders and preempts by; at most one PriorityClass is the global
//! default; the built-in classes are not deleted.
//!
//! Only pods are resolved: workload templates keep the class name alone,
//! and their pods are resolved when they are created, as upstream.

use serde_json::{json, Value};

use super::objects;
use super::resources::{lookup, ResourceDef};
use super::status::{qualified, ApiError, ApiResult};
use super::strategy::priorityclass::SYSTEM_CLASSES;
use super::{ApiServer, Req};

const GROUP: &str = "scheduling.k8s.io";
const PLURAL: &str = "priorityclasses";

/// Upstream's `DefaultPriorityWhenNoDefaultClassExists`.
const NO_DEFAULT_PRIORITY: i64 = 0;

fn classes_def() -> ApiResult<&'static ResourceDef> {
    lookup(GROUP, "v1", PLURAL).ok_or_else(|| ApiError::internal("priorityclasses are not served"))
}

/// `<resource> "<name>" is forbidden: <why>`, upstream's
/// `admission.NewForbidden`.
pub(crate) fn forbidden(group: &str, plural: &str, name: &str, why: String) -> ApiError {
    ApiError::forbidden(format!(
        "{} {name:?} is forbidden: {why}",
        qualified(group, plural)
    ))
}

async fn get_class(api: &ApiServer, name: &str) -> ApiResult<Option<Value>> {
    let def = classes_def()?;
    let kv = api.store.get(&def.key(None, name)).await?;
    Ok(kv.and_then(|kv| objects::decode_stored(&kv.value, kv.mod_revision)))
}

/// The class marked `globalDefault`; with several (written before this
/// plugin checked, or racing), the lowest value, as upstream picks.
async fn default_class(api: &ApiServer) -> ApiResult<Option<Value>> {
    let def = classes_def()?;
    let list = api.store.list(&def.prefix(None), None, 0, None).await?;
    Ok(list
        .kvs
        .iter()
        .filter_map(|kv| objects::decode_stored(&kv.value, kv.mod_revision))
        .filter(|pc| pc["globalDefault"].as_bool() == Some(true))
        .min_by_key(|pc| pc["value"].as_i64().unwrap_or(0)))
}

/// Mutating admission of a new pod: resolves its class.
///
/// # Errors
/// 403 for an unknown class, or a `priority` / `preemptionPolicy` that
/// differs from the class's. The system classes are allowed in every
/// namespace, as upstream since 1.17 (DaemonSets in their own
/// namespaces, such as CNI and CSI nodes, use `system-node-critical`).
pub(crate) async fn admit_create(api: &ApiServer, r: &Req, pod: &mut Value) -> ApiResult<()> {
    if !r.is_resource("", "pods") {
        return Ok(());
    }
    let pod_name = objects::name(pod).unwrap_or_default().to_string();
    let refuse = |why: String| forbidden("", "pods", &pod_name, why);
    let class_name = pod["spec"]["priorityClassName"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let (class_name, priority, policy) = if class_name.is_empty() {
        match default_class(api).await? {
            Some(pc) => (
                objects::name(&pc).unwrap_or_default().to_string(),
                pc["value"].as_i64().unwrap_or(0),
                pc["preemptionPolicy"].as_str().map(str::to_string),
            ),
            None => (String::new(), NO_DEFAULT_PRIORITY, None),
        }
    } else {
        let Some(pc) = get_class(api, &class_name).await? else {
            return Err(refuse(format!(
                "no PriorityClass with name {class_name} was found"
            )));
        };
        (
            class_name,
            pc["value"].as_i64().unwrap_or(0),
            pc["preemptionPolicy"].as_str().map(str::to_string),
        )
    };
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return Ok(());
    };
    if let Some(given) = spec.get("priority").and_then(Value::as_i64) {
        if given != priority {
            return Err(refuse(format!(
                "the integer value of priority ({given}) must not be provided in pod spec; priority admission controller computed {priority} from the given PriorityClass name"
            )));
        }
    }
    let given_policy = spec
        .get("preemptionPolicy")
        .and_then(Value::as_str)
        .map(str::to_string);
    if let (Some(computed), Some(given)) = (policy.as_deref(), given_policy.as_deref()) {
        if computed != given {
            return Err(refuse(format!(
                "the string value of PreemptionPolicy ({given}) must not be provided in pod spec; priority admission controller computed {computed} from the given PriorityClass name"
            )));
        }
    }
    if !class_name.is_empty() {
        spec.insert("priorityClassName".into(), json!(class_name));
    }
    spec.insert("priority".into(), json!(priority));
    // No class (or one without a policy): the pod's own, else upstream's
    // default.
    let policy = policy
        .or(given_policy)
        .unwrap_or_else(|| "PreemptLowerPriority".into());
    spec.insert("preemptionPolicy".into(), json!(policy));
    Ok(())
}

/// Validating admission of PriorityClass writes: one global default at
/// most, and the built-ins are never deleted.
///
/// # Errors
/// 403 as upstream.
pub(crate) async fn validate(
    api: &ApiServer,
    r: &Req,
    old: Option<&Value>,
    new: Option<&Value>,
) -> ApiResult<()> {
    if !r.is_resource(GROUP, PLURAL) {
        return Ok(());
    }
    let Some(new) = new else {
        // Upstream's REST storage refuses these deletes.
        let name = old.and_then(objects::name).unwrap_or_default();
        if SYSTEM_CLASSES.iter().any(|(n, _, _)| *n == name) {
            return Err(forbidden(
                GROUP,
                PLURAL,
                name,
                "this is a system priority class and cannot be deleted".into(),
            ));
        }
        return Ok(());
    };
    if new["globalDefault"].as_bool() != Some(true) {
        return Ok(());
    }
    let name = objects::name(new).unwrap_or_default();
    if let Some(current) = default_class(api).await? {
        let current = objects::name(&current).unwrap_or_default();
        if current != name {
            return Err(forbidden(
                GROUP,
                PLURAL,
                name,
                format!("PriorityClass {current} is already marked as default. Only one default can exist"),
            ));
        }
    }
    Ok(())
}
