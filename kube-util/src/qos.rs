//! A pod's QoS class (upstream `ComputePodQOS`), which decides its OOM
//! score adjustment, its cgroup and the order of eviction.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::quantity;

/// `status.qosClass`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QosClass {
    /// Every container (or the pod-level resources) limits CPU and memory,
    /// and requests exactly what it limits.
    Guaranteed,
    /// Something is requested or limited, but not Guaranteed.
    Burstable,
    /// No CPU or memory request or limit anywhere.
    BestEffort,
}

impl QosClass {
    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            QosClass::Guaranteed => "Guaranteed",
            QosClass::Burstable => "Burstable",
            QosClass::BestEffort => "BestEffort",
        }
    }
}

impl std::fmt::Display for QosClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Only these decide the class (upstream `isSupportedQoSComputeResource`).
const COMPUTE: [&str; 2] = ["cpu", "memory"];

/// Sums of positive CPU and memory amounts, in milli-units (exact, wide
/// enough for exabytes of memory).
#[derive(Default)]
struct Sums(BTreeMap<&'static str, i128>);

impl Sums {
    /// Add the positive compute amounts of `list`; returns which were.
    fn add(&mut self, list: Option<&BTreeMap<String, Quantity>>) -> [bool; 2] {
        let mut found = [false; 2];
        for (i, name) in COMPUTE.iter().enumerate() {
            let amount = list
                .and_then(|l| l.get(*name))
                .and_then(|q| quantity::scaled(&q.0, -3).ok())
                .filter(|v| *v > 0);
            if let Some(v) = amount {
                *self.0.entry(name).or_default() += v;
                found[i] = true;
            }
        }
        found
    }
}

/// The pod's QoS class.
///
/// A request that is absent where a limit is given counts as the limit:
/// the API server defaults it so, and this also classifies pods that did
/// not go through the API (static pods read from manifests).
pub fn qos_class(pod: &Pod) -> QosClass {
    let Some(spec) = &pod.spec else {
        return QosClass::BestEffort;
    };
    let (mut requests, mut limits) = (Sums::default(), Sums::default());
    let mut guaranteed = true;
    if let Some(r) = &spec.resources {
        // Pod-level resources, when given, decide alone.
        requests.add(Some(&defaulted(r.requests.as_ref(), r.limits.as_ref())));
        if limits.add(r.limits.as_ref()) != [true, true] {
            guaranteed = false;
        }
    } else {
        let all = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten());
        for c in all {
            let (req, lim) = container_lists(c);
            requests.add(Some(&defaulted(req, lim)));
            if limits.add(lim) != [true, true] {
                guaranteed = false;
            }
        }
    }
    if requests.0.is_empty() && limits.0.is_empty() {
        return QosClass::BestEffort;
    }
    let equal = requests
        .0
        .iter()
        .all(|(name, req)| limits.0.get(name) == Some(req));
    if guaranteed && equal && requests.0.len() == limits.0.len() {
        QosClass::Guaranteed
    } else {
        QosClass::Burstable
    }
}

type List = BTreeMap<String, Quantity>;

fn container_lists(c: &Container) -> (Option<&List>, Option<&List>) {
    c.resources
        .as_ref()
        .map_or((None, None), |r| (r.requests.as_ref(), r.limits.as_ref()))
}

/// Requests with the limits standing in for missing ones (API defaulting).
fn defaulted(requests: Option<&List>, limits: Option<&List>) -> List {
    let mut out = requests.cloned().unwrap_or_default();
    for (name, q) in limits.into_iter().flatten() {
        out.entry(name.clone()).or_insert_with(|| q.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn pod(containers: Value, init: Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"},
            "spec": {"containers": containers, "initContainers": init}}))
        .unwrap()
    }

    fn c(requests: Value, limits: Value) -> Value {
        json!({"name": "c", "resources": {"requests": requests, "limits": limits}})
    }

    #[test]
    fn classes() {
        let none = json!({});
        assert_eq!(
            qos_class(&pod(json!([{"name": "c"}]), json!([]))),
            QosClass::BestEffort
        );
        // Only CPU and memory count.
        let gpu = c(
            json!({"example.com/gpu": "1"}),
            json!({"example.com/gpu": "1"}),
        );
        assert_eq!(
            qos_class(&pod(json!([gpu]), json!([]))),
            QosClass::BestEffort
        );
        let exact = c(
            json!({"cpu": "1", "memory": "1Gi"}),
            json!({"cpu": "1000m", "memory": "1024Mi"}),
        );
        assert_eq!(
            qos_class(&pod(json!([exact.clone()]), json!([]))),
            QosClass::Guaranteed
        );
        // Limits alone: requests default to them.
        let limits_only = c(none.clone(), json!({"cpu": "500m", "memory": "128Mi"}));
        assert_eq!(
            qos_class(&pod(json!([limits_only]), json!([]))),
            QosClass::Guaranteed
        );
        let less = c(
            json!({"cpu": "500m", "memory": "1Gi"}),
            json!({"cpu": "1", "memory": "1Gi"}),
        );
        assert_eq!(
            qos_class(&pod(json!([less]), json!([]))),
            QosClass::Burstable
        );
        let cpu_only = c(json!({"cpu": "1"}), json!({"cpu": "1"}));
        assert_eq!(
            qos_class(&pod(json!([cpu_only]), json!([]))),
            QosClass::Burstable
        );
        // Every container counts, init containers too.
        assert_eq!(
            qos_class(&pod(json!([exact.clone()]), json!([{"name": "i"}]))),
            QosClass::Burstable
        );
        assert_eq!(
            qos_class(&pod(json!([exact.clone()]), json!([exact.clone()]))),
            QosClass::Guaranteed
        );
        // Zero amounts are no amounts.
        let zero = c(json!({"cpu": "0"}), json!({"cpu": "0"}));
        assert_eq!(
            qos_class(&pod(json!([zero]), json!([]))),
            QosClass::BestEffort
        );
        assert_eq!(QosClass::Burstable.to_string(), "Burstable");
    }

    #[test]
    fn pod_level_resources_decide_alone() {
        let mut p = pod(json!([{"name": "c"}]), json!([]));
        p.spec.as_mut().unwrap().resources =
            Some(serde_json::from_value(json!({"limits": {"cpu": "1", "memory": "1Gi"}})).unwrap());
        assert_eq!(qos_class(&p), QosClass::Guaranteed);
        p.spec.as_mut().unwrap().resources =
            Some(serde_json::from_value(json!({"requests": {"cpu": "1"}})).unwrap());
        assert_eq!(qos_class(&p), QosClass::Burstable);
    }
}
