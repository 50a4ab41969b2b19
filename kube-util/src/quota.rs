//! What an object uses of a ResourceQuota (upstream's quota evaluators,
//! `pkg/quota/v1/evaluator/core`), and which quotas' scopes it falls in.
//!
//! Shared by the API server's ResourceQuota admission (which charges a
//! new object) and the controller manager's resourcequota controller
//! (which recomputes `status.used` from what is there): the two must
//! agree on every amount, or the controller would undo what admission
//! charged. It reads objects as JSON, as the API server holds them.
//!
//! Amounts are exact integers in milli-units (`quantity::scaled(q, -3)`),
//! so that `500m` of CPU and `1Gi` of memory add without rounding.

use std::collections::BTreeMap;

use crate::qos::{qos_class, QosClass};
use crate::{quantity, resources};
use k8s_openapi::api::core::v1::{Pod, PodSpec};
use serde_json::Value;

/// Resource name -> amount in milli-units.
pub type Usage = BTreeMap<String, i128>;

/// The resources a pod's evaluator checks that every container asks for
/// explicitly (upstream keeps this for backward compatibility only).
pub const POD_REQUIRED: [&str; 6] = [
    "cpu",
    "memory",
    "requests.cpu",
    "requests.memory",
    "limits.cpu",
    "limits.memory",
];

/// The scopes upstream defines.
pub const SCOPES: [&str; 6] = [
    "Terminating",
    "NotTerminating",
    "BestEffort",
    "NotBestEffort",
    "PriorityClass",
    "CrossNamespacePodAffinity",
];

/// The object count resource of `plural` in `group` (`count/pods`,
/// `count/deployments.apps`).
pub fn count_name(group: &str, plural: &str) -> String {
    if group.is_empty() {
        format!("count/{plural}")
    } else {
        format!("count/{plural}.{group}")
    }
}

/// The names the core kinds were counted by before `count/` existed.
fn legacy_count(group: &str, plural: &str) -> bool {
    group.is_empty()
        && matches!(
            plural,
            "pods"
                | "services"
                | "persistentvolumeclaims"
                | "configmaps"
                | "secrets"
                | "replicationcontrollers"
                | "resourcequotas"
        )
}

const STORAGE_CLASS_SUFFIX: &str = ".storageclass.storage.k8s.io/";

/// Whether a quota on `name` constrains objects of `group`/`plural`
/// (upstream's `MatchingResources`).
pub fn matches_resource(group: &str, plural: &str, name: &str) -> bool {
    if name == count_name(group, plural) || (legacy_count(group, plural) && name == plural) {
        return true;
    }
    match (group, plural) {
        ("", "pods") => {
            matches!(name, "cpu" | "memory" | "ephemeral-storage")
                || name.starts_with("requests.")
                || name.starts_with("limits.")
                || name.starts_with("hugepages-")
        }
        ("", "persistentvolumeclaims") => {
            name == "requests.storage"
                || name
                    .split_once(STORAGE_CLASS_SUFFIX)
                    .is_some_and(|(_, r)| r == "requests.storage" || r == "persistentvolumeclaims")
        }
        ("", "services") => matches!(name, "services.nodeports" | "services.loadbalancers"),
        _ => false,
    }
}

/// Whether the object is one whose usage counts at all: pods that ended
/// (Succeeded, Failed) or are being deleted past their grace period no
/// longer hold anything (upstream's `QuotaV1Pod`).
pub fn counts(group: &str, plural: &str, obj: &Value) -> bool {
    if group.is_empty() && plural == "pods" {
        let phase = obj["status"]["phase"].as_str().unwrap_or_default();
        return phase != "Succeeded" && phase != "Failed";
    }
    true
}

/// What the object uses. Only the names [`matches_resource`] accepts
/// appear; the caller masks with the quota's `hard`.
pub fn usage(group: &str, plural: &str, obj: &Value) -> Usage {
    let mut u = Usage::new();
    if !counts(group, plural, obj) {
        return u;
    }
    u.insert(count_name(group, plural), 1000);
    if legacy_count(group, plural) {
        u.insert(plural.to_string(), 1000);
    }
    match (group, plural) {
        ("", "pods") => pod_usage(obj, &mut u),
        ("", "persistentvolumeclaims") => claim_usage(obj, &mut u),
        ("", "services") => service_usage(obj, &mut u),
        _ => {}
    }
    u
}

fn pod_usage(obj: &Value, u: &mut Usage) {
    let Ok(spec) = serde_json::from_value::<PodSpec>(obj["spec"].clone()) else {
        return;
    };
    let req = resources::pod_requests(&spec, false);
    let milli = |v: i64| i128::from(v) * 1000;
    for (name, v) in [
        ("cpu", i128::from(req.cpu)),
        ("requests.cpu", i128::from(req.cpu)),
        ("memory", milli(req.memory)),
        ("requests.memory", milli(req.memory)),
    ] {
        u.insert(name.into(), v);
    }
    for (name, v) in &req.scalars {
        if name == "ephemeral-storage" || name.starts_with("hugepages-") {
            u.insert(name.clone(), milli(*v));
        }
        u.insert(format!("requests.{name}"), milli(*v));
    }
    let lim = resources::pod_requests(&limits_as_requests(spec), false);
    u.insert("limits.cpu".into(), i128::from(lim.cpu));
    u.insert("limits.memory".into(), milli(lim.memory));
    if let Some(v) = lim.scalars.iter().find(|(n, _)| n == "ephemeral-storage") {
        u.insert("limits.ephemeral-storage".into(), milli(v.1));
    }
}

/// The spec with each container's limits in place of its requests: the
/// pod's limits follow the same formula as its requests (upstream's
/// `PodLimits`: app containers summed, raised to the largest init
/// container, plus overhead).
fn limits_as_requests(mut spec: PodSpec) -> PodSpec {
    let swap = |c: &mut k8s_openapi::api::core::v1::Container| {
        if let Some(r) = c.resources.as_mut() {
            r.requests = r.limits.take();
        }
    };
    spec.containers.iter_mut().for_each(swap);
    spec.init_containers.iter_mut().flatten().for_each(swap);
    spec
}

fn claim_usage(obj: &Value, u: &mut Usage) {
    let requested = obj["spec"]["resources"]["requests"]["storage"]
        .as_str()
        .and_then(|q| quantity::scaled(q, -3).ok())
        .unwrap_or(0);
    // An expansion in progress holds the larger of the two (upstream).
    let allocated = obj["status"]["allocatedResources"]["storage"]
        .as_str()
        .and_then(|q| quantity::scaled(q, -3).ok())
        .unwrap_or(0);
    let storage = requested.max(allocated);
    u.insert("requests.storage".into(), storage);
    let class = obj["spec"]["storageClassName"]
        .as_str()
        .or_else(|| {
            obj["metadata"]["annotations"]["volume.beta.kubernetes.io/storage-class"].as_str()
        })
        .unwrap_or_default();
    if !class.is_empty() {
        u.insert(
            format!("{class}{STORAGE_CLASS_SUFFIX}requests.storage"),
            storage,
        );
        u.insert(
            format!("{class}{STORAGE_CLASS_SUFFIX}persistentvolumeclaims"),
            1000,
        );
    }
}

fn service_usage(obj: &Value, u: &mut Usage) {
    let ports = obj["spec"]["ports"].as_array().map_or(0, Vec::len) as i128;
    let (lbs, node_ports) = match obj["spec"]["type"].as_str().unwrap_or("ClusterIP") {
        "NodePort" => (0, ports),
        "LoadBalancer" => {
            let alloc = obj["spec"]["allocateLoadBalancerNodePorts"]
                .as_bool()
                .unwrap_or(true);
            (1, if alloc { ports } else { 0 })
        }
        _ => (0, 0),
    };
    u.insert("services.loadbalancers".into(), lbs * 1000);
    u.insert("services.nodeports".into(), node_ports * 1000);
}

/// The pod's containers (init containers too) missing an explicit request
/// or limit for the `required` resources: `(resource, container names)`,
/// sorted, as upstream's pod evaluator `Constraints`.
pub fn missing_requests(pod: &Value, required: &[&str]) -> Vec<(String, Vec<String>)> {
    let mut missing: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let containers = ["containers", "initContainers"]
        .into_iter()
        .flat_map(|k| pod["spec"][k].as_array().into_iter().flatten());
    for c in containers {
        let has = |list: &str, r: &str| c["resources"][list].get(r).is_some();
        for &r in required {
            let given = match r {
                "cpu" | "requests.cpu" => has("requests", "cpu"),
                "memory" | "requests.memory" => has("requests", "memory"),
                "limits.cpu" => has("limits", "cpu"),
                "limits.memory" => has("limits", "memory"),
                _ => true,
            };
            if !given {
                let name = c["name"].as_str().unwrap_or_default().to_string();
                let names = missing.entry(r.to_string()).or_default();
                if !names.contains(&name) {
                    names.push(name);
                }
            }
        }
    }
    missing
        .into_iter()
        .map(|(r, mut names)| {
            names.sort();
            (r, names)
        })
        .collect()
}

/// Whether any of a quota's `hard` resources counts objects of this
/// kind: when none does, its objects need not be looked at.
pub fn constrains(hard: &Usage, group: &str, plural: &str) -> bool {
    hard.keys().any(|k| matches_resource(group, plural, k))
}

/// Add what `obj` uses to `used`, a quota's usage keyed by its hard
/// resources (others are not its business), when the quota's scopes
/// select the object: how admission's and the controller's recounts add
/// up each object.
pub fn add_usage(used: &mut Usage, quota: &Value, group: &str, plural: &str, obj: &Value) {
    if !in_scope(quota, group, plural, obj) {
        return;
    }
    for (k, v) in usage(group, plural, obj) {
        if let Some(u) = used.get_mut(&k) {
            *u += v;
        }
    }
}

/// Whether the quota's `scopes` and `scopeSelector` select the object
/// (upstream's `Matches`). Scopes are about pods: other kinds fall only
/// in quotas without any.
pub fn in_scope(quota: &Value, group: &str, plural: &str, obj: &Value) -> bool {
    let spec = &quota["spec"];
    let mut reqs: Vec<(String, String, Vec<String>)> = spec["scopes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(|s| (s.to_string(), "Exists".to_string(), Vec::new()))
        .collect();
    for e in spec["scopeSelector"]["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let values = e["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect();
        reqs.push((
            e["scopeName"].as_str().unwrap_or_default().to_string(),
            e["operator"].as_str().unwrap_or_default().to_string(),
            values,
        ));
    }
    if reqs.is_empty() {
        return true;
    }
    if !(group.is_empty() && plural == "pods") {
        return false;
    }
    let typed = serde_json::from_value::<Pod>(obj.clone()).ok();
    reqs.iter()
        .all(|(scope, op, values)| pod_matches(obj, typed.as_ref(), scope, op, values))
}

fn pod_matches(obj: &Value, typed: Option<&Pod>, scope: &str, op: &str, values: &[String]) -> bool {
    if scope == "PriorityClass" {
        let class = obj["spec"]["priorityClassName"]
            .as_str()
            .unwrap_or_default();
        return match op {
            "In" => values.iter().any(|v| v == class),
            "NotIn" => !values.iter().any(|v| v == class),
            "Exists" => !class.is_empty(),
            "DoesNotExist" => class.is_empty(),
            _ => false,
        };
    }
    let terminating = obj["spec"]["activeDeadlineSeconds"]
        .as_i64()
        .is_some_and(|s| s >= 0);
    let best_effort = typed.is_some_and(|p| qos_class(p) == QosClass::BestEffort);
    let matched = match scope {
        "Terminating" => terminating,
        "NotTerminating" => !terminating,
        "BestEffort" => best_effort,
        "NotBestEffort" => !best_effort,
        // Refused by validation (see the strategy); nothing to match.
        _ => false,
    };
    match op {
        "Exists" => matched,
        "DoesNotExist" => !matched,
        _ => false,
    }
}

/// Parse a resource list (`spec.hard`, `status.used`) into milli-units;
/// unparsable amounts (refused by validation) count as 0.
pub fn parse_list(list: &Value) -> Usage {
    list.as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| {
            let q = match v {
                Value::String(s) => quantity::scaled(s, -3).unwrap_or(0),
                Value::Number(n) => n.as_i64().map_or(0, |n| i128::from(n) * 1000),
                _ => 0,
            };
            (k.clone(), q)
        })
        .collect()
}

/// Whether the resource is one of bytes (printed with binary suffixes
/// where exact, as `kubectl` users write them).
fn is_bytes(name: &str) -> bool {
    name.contains("memory") || name.contains("storage") || name.contains("hugepages-")
}

/// An amount as a quantity string: `500m`, `2`, `1Gi`.
pub fn format(name: &str, milli: i128) -> String {
    if milli % 1000 != 0 {
        return format!("{milli}m");
    }
    let mut v = milli / 1000;
    if is_bytes(name) && v != 0 {
        let mut suffix = "";
        for s in ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"] {
            if v % 1024 != 0 {
                break;
            }
            v /= 1024;
            suffix = s;
        }
        return format!("{v}{suffix}");
    }
    v.to_string()
}

/// A resource list as JSON, formatted by [`format`].
pub fn to_list(u: &Usage) -> Value {
    Value::Object(
        u.iter()
            .map(|(k, v)| (k.clone(), Value::String(format(k, *v))))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: Value) -> Value {
        json!({"metadata": {"name": "p"}, "spec": spec})
    }

    #[test]
    fn pod_usage_sums_requests_and_limits() {
        let p = pod(json!({"containers": [
            {"name": "a", "resources": {"requests": {"cpu": "250m", "memory": "64Mi"},
                                        "limits": {"cpu": "1", "memory": "128Mi"}}},
            {"name": "b", "resources": {"requests": {"cpu": "250m", "example.com/gpu": "1"}}},
        ]}));
        let u = usage("", "pods", &p);
        assert_eq!(u["pods"], 1000);
        assert_eq!(u["count/pods"], 1000);
        assert_eq!(format("requests.cpu", u["requests.cpu"]), "500m");
        assert_eq!(u["cpu"], u["requests.cpu"]);
        assert_eq!(format("requests.memory", u["requests.memory"]), "64Mi");
        assert_eq!(format("limits.cpu", u["limits.cpu"]), "1");
        assert_eq!(format("limits.memory", u["limits.memory"]), "128Mi");
        assert_eq!(u["requests.example.com/gpu"], 1000);
        let done = json!({"spec": p["spec"], "status": {"phase": "Succeeded"}});
        assert!(usage("", "pods", &done).is_empty());
    }

    #[test]
    fn claims_and_services() {
        let pvc = json!({"spec": {"storageClassName": "fast",
            "resources": {"requests": {"storage": "2Gi"}}}});
        let u = usage("", "persistentvolumeclaims", &pvc);
        assert_eq!(format("requests.storage", u["requests.storage"]), "2Gi");
        assert_eq!(
            u["fast.storageclass.storage.k8s.io/persistentvolumeclaims"],
            1000
        );
        let svc = json!({"spec": {"type": "LoadBalancer", "ports": [{"port": 1}, {"port": 2}]}});
        let u = usage("", "services", &svc);
        assert_eq!(
            (u["services.loadbalancers"], u["services.nodeports"]),
            (1000, 2000)
        );
        let cm = usage("apps", "deployments", &json!({}));
        assert_eq!(cm.keys().collect::<Vec<_>>(), ["count/deployments.apps"]);
        assert!(matches_resource("", "configmaps", "configmaps"));
        assert!(!matches_resource("", "configmaps", "pods"));
        assert!(matches_resource("", "pods", "requests.example.com/gpu"));
    }

    #[test]
    fn missing_requests_names_containers() {
        let p = pod(json!({"containers": [
            {"name": "c", "resources": {}},
            {"name": "d", "resources": {"requests": {"cpu": "1"}}},
        ]}));
        assert_eq!(
            missing_requests(&p, &["requests.cpu", "limits.memory"]),
            vec![
                (
                    "limits.memory".to_string(),
                    vec!["c".to_string(), "d".to_string()]
                ),
                ("requests.cpu".to_string(), vec!["c".to_string()]),
            ]
        );
    }

    #[test]
    fn scopes_select_pods() {
        let be = pod(json!({"containers": [{"name": "c"}], "priorityClassName": "high"}));
        let burst = pod(json!({"containers": [{"name": "c",
            "resources": {"requests": {"cpu": "1"}}}], "activeDeadlineSeconds": 5}));
        let q = |spec: Value| json!({"spec": spec});
        let best = q(json!({"scopes": ["BestEffort"]}));
        assert!(in_scope(&best, "", "pods", &be));
        assert!(!in_scope(&best, "", "pods", &burst));
        assert!(!in_scope(&best, "", "services", &json!({})));
        let term = q(json!({"scopes": ["Terminating"]}));
        assert!(in_scope(&term, "", "pods", &burst) && !in_scope(&term, "", "pods", &be));
        let sel = |op: &str, values: Value| {
            q(json!({"scopeSelector": {"matchExpressions": [
                {"scopeName": "PriorityClass", "operator": op, "values": values}]}}))
        };
        assert!(in_scope(&sel("In", json!(["high"])), "", "pods", &be));
        assert!(!in_scope(&sel("In", json!(["high"])), "", "pods", &burst));
        assert!(in_scope(&sel("NotIn", json!(["high"])), "", "pods", &burst));
        assert!(in_scope(
            &sel("DoesNotExist", json!([])),
            "",
            "pods",
            &burst
        ));
        assert!(in_scope(&q(json!({})), "", "services", &json!({})));
    }

    #[test]
    fn amounts_format_back() {
        assert_eq!(format("cpu", 1500), "1500m");
        assert_eq!(format("pods", 3000), "3");
        assert_eq!(format("requests.memory", 1024 * 1024 * 1000), "1Mi");
        assert_eq!(format("requests.memory", 1000 * 1000), "1000");
        assert_eq!(format("requests.memory", 0), "0");
        assert_eq!(parse_list(&json!({"cpu": "1", "pods": 2}))["pods"], 2000);
    }
}
