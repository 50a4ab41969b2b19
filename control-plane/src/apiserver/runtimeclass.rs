//! The RuntimeClass admission plugin (upstream's
//! `plugin/pkg/admission/runtimeclass`), on pod creation: a pod naming a
//! RuntimeClass gets the class's fixed overhead (which the scheduler and
//! quota add to its requests) and its scheduling constraints (node
//! selector, tolerations), so that it lands only on nodes that have the
//! handler; a pod naming a class that does not exist, or bringing an
//! overhead of its own, is refused.
//!
//! Only pods are admitted: workload templates keep the class name alone,
//! and their pods are admitted when they are created, as upstream.

use serde_json::{json, Map, Value};

use super::objects;
use super::priority::forbidden;
use super::resources::{lookup, ResourceDef};
use super::status::{ApiError, ApiResult};
use super::table::s;
use super::ApiServer;

fn classes_def() -> ApiResult<&'static ResourceDef> {
    lookup("node.k8s.io", "v1", "runtimeclasses")
        .ok_or_else(|| ApiError::internal("runtimeclasses are not served"))
}

/// The stored class, None when there is none by that name. Upstream reads
/// an informer and, on a miss, the API; the store is that second read.
async fn get_class(api: &ApiServer, name: &str) -> ApiResult<Option<Value>> {
    let kv = api.store.get(&classes_def()?.key(None, name)).await?;
    Ok(kv.and_then(|kv| objects::decode_stored(&kv.value, kv.mod_revision)))
}

/// Mutating (and validating) admission of a new pod (the caller checked it
/// is one).
///
/// # Errors
/// 403 with upstream's message for a class that does not exist, an
/// overhead that is not the class's (or without a class defining one), or
/// a node selector that contradicts the class's.
pub(crate) async fn admit_create(api: &ApiServer, pod: &mut Value) -> ApiResult<()> {
    let class = match pod["spec"]["runtimeClassName"]
        .as_str()
        .filter(|c| !c.is_empty())
    {
        Some(name) => match get_class(api, name).await? {
            Some(class) => Some(class),
            None => {
                return Err(refuse(
                    pod,
                    format!("pod rejected: RuntimeClass {name:?} not found"),
                ))
            }
        },
        None => None,
    };
    apply(pod, class.as_ref()).map_err(|why| refuse(pod, why))
}

fn refuse(pod: &Value, why: String) -> ApiError {
    forbidden("", "pods", objects::name(pod).unwrap_or_default(), why)
}

/// What the plugin does to a pod given its class (None: it names none),
/// in upstream's order: overhead, scheduling, then the overhead check of
/// the validating phase. `Err` is the reason to refuse it.
fn apply(pod: &mut Value, class: Option<&Value>) -> Result<(), String> {
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return Ok(());
    };
    let field = |name: &str| class.and_then(|c| c.get(name)).filter(|v| !v.is_null());
    let class_overhead = field("overhead");
    if let Some(overhead) = class_overhead {
        set_overhead(spec, &overhead["podFixed"])?;
    }
    if let Some(scheduling) = field("scheduling") {
        set_scheduling(spec, scheduling)?;
    }
    // Only this plugin sets a pod's overhead: one that came with the pod
    // was not computed from a class.
    if class_overhead.is_none() && has_overhead(spec) {
        return Err(
            "pod rejected: Pod Overhead set without corresponding RuntimeClass defined Overhead"
                .into(),
        );
    }
    Ok(())
}

fn has_overhead(spec: &Map<String, Value>) -> bool {
    spec.get("overhead")
        .and_then(Value::as_object)
        .is_some_and(|o| !o.is_empty())
}

/// The pod's overhead becomes the class's `podFixed`; an overhead the pod
/// already had must be the same, quantity for quantity (`1Gi` is
/// `1024Mi`, as upstream's semantic equality has it).
fn set_overhead(spec: &mut Map<String, Value>, pod_fixed: &Value) -> Result<(), String> {
    let fixed = pod_fixed.as_object().cloned().unwrap_or_default();
    if has_overhead(spec) && !same_resources(&spec["overhead"], &fixed) {
        return Err(
            "pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead".into(),
        );
    }
    if fixed.is_empty() {
        spec.remove("overhead");
    } else {
        spec.insert("overhead".into(), Value::Object(fixed));
    }
    Ok(())
}

fn same_resources(pod: &Value, class: &Map<String, Value>) -> bool {
    let Some(pod) = pod.as_object() else {
        return class.is_empty();
    };
    pod.len() == class.len()
        && pod
            .iter()
            .all(|(name, q)| class.get(name).is_some_and(|c| same_quantity(&s(q), &s(c))))
}

fn same_quantity(a: &str, b: &str) -> bool {
    a == b || kube_util::quantity::compare(a, b) == Some(std::cmp::Ordering::Equal)
}

/// The class's node selector joins the pod's (a key both set must agree),
/// and its tolerations join the pod's, each kept only once.
fn set_scheduling(spec: &mut Map<String, Value>, scheduling: &Value) -> Result<(), String> {
    let class_selector = scheduling["nodeSelector"].as_object();
    match spec.get_mut("nodeSelector").and_then(Value::as_object_mut) {
        Some(pod_selector) => {
            for (key, value) in class_selector.into_iter().flatten() {
                match pod_selector.get(key) {
                    Some(pod_value) if pod_value != value => {
                        return Err(format!(
                            "conflict: runtimeClass.scheduling.nodeSelector[{key}] = {}; pod.spec.nodeSelector[{key}] = {}",
                            s(value),
                            s(pod_value)
                        ));
                    }
                    _ => {
                        pod_selector.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        None => {
            if let Some(sel) = class_selector {
                spec.insert("nodeSelector".into(), Value::Object(sel.clone()));
            }
        }
    }
    let list = |v: Option<&Value>| v.and_then(Value::as_array).cloned().unwrap_or_default();
    let merged = merge_tolerations(
        list(spec.get("tolerations")),
        list(scheduling.get("tolerations")),
    );
    if merged.is_empty() {
        spec.remove("tolerations");
    } else {
        spec.insert("tolerations".into(), json!(merged));
    }
    Ok(())
}

/// One toleration's fields, absent ones as their zero values, for the
/// comparisons upstream makes on its structs.
#[derive(PartialEq)]
struct Toleration<'a> {
    key: &'a str,
    operator: &'a str,
    value: &'a str,
    effect: &'a str,
    seconds: Option<i64>,
}

impl<'a> Toleration<'a> {
    fn of(v: &'a Value) -> Self {
        let f = |name: &str| v[name].as_str().unwrap_or_default();
        Toleration {
            key: f("key"),
            operator: f("operator"),
            value: f("value"),
            effect: f("effect"),
            seconds: v["tolerationSeconds"].as_i64(),
        }
    }

    /// Whether `self` tolerates every taint `t` does (upstream's
    /// `isSuperset`).
    fn covers(&self, t: &Toleration) -> bool {
        if self == t {
            return true;
        }
        // An empty key with Exists matches every key.
        if t.key != self.key && !(self.key.is_empty() && self.operator == "Exists") {
            return false;
        }
        // An empty effect matches every effect.
        if t.effect != self.effect && !self.effect.is_empty() {
            return false;
        }
        // A NoExecute toleration with a deadline covers only ones that
        // leave no later.
        if self.effect == "NoExecute" {
            if let Some(mine) = self.seconds {
                if t.seconds.is_none_or(|theirs| theirs > mine) {
                    return false;
                }
            }
        }
        match self.operator {
            "" | "Equal" => t.operator == "Equal" && t.value == self.value,
            "Exists" => true,
            _ => false,
        }
    }
}

/// The pod's tolerations then the class's, without those another one
/// covers (upstream's `MergeTolerations`: of two equal ones the first is
/// kept).
fn merge_tolerations(pod: Vec<Value>, class: Vec<Value>) -> Vec<Value> {
    let all: Vec<Value> = pod.into_iter().chain(class).collect();
    let mut merged: Vec<Value> = Vec::new();
    for (i, v) in all.iter().enumerate() {
        let t = Toleration::of(v);
        let redundant = merged.iter().any(|m| Toleration::of(m).covers(&t))
            || all[i + 1..].iter().any(|later| {
                let later = Toleration::of(later);
                later != t && later.covers(&t)
            });
        if !redundant {
            merged.push(v.clone());
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `base` with the fields of `extra` added.
    fn with(mut base: Value, extra: Value) -> Value {
        if let (Some(m), Some(e)) = (base.as_object_mut(), extra.as_object()) {
            m.extend(e.clone());
        }
        base
    }

    fn pod(spec: Value) -> Value {
        let spec = with(json!({"containers": [{"name": "c", "image": "i"}]}), spec);
        json!({"metadata": {"name": "p"}, "spec": spec})
    }

    fn class(extra: Value) -> Value {
        with(
            json!({"metadata": {"name": "gvisor"}, "handler": "runsc"}),
            extra,
        )
    }

    #[test]
    fn overhead_comes_from_the_class_only() {
        let rc = class(json!({"overhead": {"podFixed": {"cpu": "250m", "memory": "1Gi"}}}));
        let mut p = pod(json!({}));
        apply(&mut p, Some(&rc)).unwrap();
        assert_eq!(
            p["spec"]["overhead"],
            json!({"cpu": "250m", "memory": "1Gi"})
        );
        // The same overhead, written otherwise, is the class's.
        let mut same = pod(json!({"overhead": {"cpu": "0.25", "memory": "1024Mi"}}));
        apply(&mut same, Some(&rc)).unwrap();
        assert_eq!(same["spec"]["overhead"]["memory"], "1Gi");
        let mut other = pod(json!({"overhead": {"cpu": "1"}}));
        assert_eq!(
            apply(&mut other, Some(&rc)).unwrap_err(),
            "pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead"
        );
        let without =
            "pod rejected: Pod Overhead set without corresponding RuntimeClass defined Overhead";
        let mut own = pod(json!({"overhead": {"cpu": "1"}}));
        assert_eq!(apply(&mut own.clone(), None).unwrap_err(), without);
        assert_eq!(
            apply(&mut own, Some(&class(json!({})))).unwrap_err(),
            without
        );
        let mut plain = pod(json!({}));
        apply(&mut plain, Some(&class(json!({})))).unwrap();
        assert!(plain["spec"].get("overhead").is_none());
    }

    #[test]
    fn node_selectors_merge_and_conflicts_are_refused() {
        let rc = class(json!({"scheduling": {"nodeSelector": {"sandbox": "true", "zone": "a"}}}));
        let mut bare = pod(json!({}));
        apply(&mut bare, Some(&rc)).unwrap();
        assert_eq!(
            bare["spec"]["nodeSelector"],
            json!({"sandbox": "true", "zone": "a"})
        );
        let mut own = pod(json!({"nodeSelector": {"disk": "ssd", "zone": "a"}}));
        apply(&mut own, Some(&rc)).unwrap();
        assert_eq!(
            own["spec"]["nodeSelector"],
            json!({"disk": "ssd", "sandbox": "true", "zone": "a"})
        );
        let mut clash = pod(json!({"nodeSelector": {"zone": "b"}}));
        assert_eq!(
            apply(&mut clash, Some(&rc)).unwrap_err(),
            "conflict: runtimeClass.scheduling.nodeSelector[zone] = a; pod.spec.nodeSelector[zone] = b"
        );
    }

    #[test]
    fn tolerations_are_added_once() {
        let rc = class(json!({"scheduling": {"tolerations": [
            {"key": "sandbox", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "gpu", "operator": "Equal", "value": "yes"},
        ]}}));
        let mut p = pod(json!({"tolerations": [
            {"key": "sandbox", "operator": "Exists", "effect": "NoSchedule"},
        ]}));
        apply(&mut p, Some(&rc)).unwrap();
        assert_eq!(
            p["spec"]["tolerations"],
            json!([
                {"key": "sandbox", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "gpu", "operator": "Equal", "value": "yes"},
            ])
        );
        // A pod tolerating everything needs nothing more.
        let mut all = pod(json!({"tolerations": [{"operator": "Exists"}]}));
        apply(&mut all, Some(&rc)).unwrap();
        assert_eq!(all["spec"]["tolerations"], json!([{"operator": "Exists"}]));
    }

    #[test]
    fn superset_rules_follow_upstream() {
        let exists = json!({"key": "k", "operator": "Exists"});
        let equal = json!({"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule"});
        assert!(Toleration::of(&exists).covers(&Toleration::of(&equal)));
        assert!(!Toleration::of(&equal).covers(&Toleration::of(&exists)));
        let short = json!({"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 10});
        let long = json!({"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60});
        assert!(Toleration::of(&long).covers(&Toleration::of(&short)));
        assert!(!Toleration::of(&short).covers(&Toleration::of(&long)));
        assert_eq!(
            merge_tolerations(vec![short.clone()], vec![long.clone()]),
            vec![long]
        );
    }
}
