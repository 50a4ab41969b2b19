//! The node conditions under pressure (MemoryPressure, DiskPressure,
//! PIDPressure) as the eviction manager last decided them: reported in
//! node status, and what pod admission refuses pods by (upstream's
//! eviction `Admit`).

use std::sync::RwLock;

use k8s_openapi::api::core::v1::{NodeCondition, Pod};

/// The node conditions under pressure now, shared with node status and
/// admission.
#[derive(Debug, Default)]
pub struct Pressure(RwLock<Vec<&'static str>>);

impl Pressure {
    pub fn conditions(&self) -> Vec<&'static str> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn set(&self, conditions: Vec<&'static str>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = conditions;
    }

    /// Set the pressure conditions among `conditions` (the node status's,
    /// all False by default) True, in the kubelet's words.
    pub fn apply(&self, conditions: &mut [NodeCondition]) {
        let under = self.conditions();
        for c in conditions.iter_mut() {
            if !under.contains(&c.type_.as_str()) {
                continue;
            }
            let (reason, message) = match c.type_.as_str() {
                "MemoryPressure" => (
                    "KubeletHasInsufficientMemory",
                    "kubelet has insufficient memory available",
                ),
                "DiskPressure" => ("KubeletHasDiskPressure", "kubelet has disk pressure"),
                "PIDPressure" => (
                    "KubeletHasInsufficientPID",
                    "kubelet has insufficient PID available",
                ),
                _ => continue,
            };
            c.status = "True".into();
            c.reason = Some(reason.into());
            c.message = Some(message.into());
        }
    }

    /// Upstream's eviction admission: under pressure only critical pods
    /// are admitted, and under memory pressure alone also pods that are
    /// not BestEffort or that tolerate the memory-pressure taint. The
    /// refusal's message when refused.
    pub fn refuses(&self, pod: &Pod) -> Option<String> {
        let under = self.conditions();
        if under.is_empty() || crate::pod::is_critical(pod) {
            return None;
        }
        if under == ["MemoryPressure"] {
            let best_effort =
                kube_util::qos::qos_class(pod) == kube_util::qos::QosClass::BestEffort;
            let tolerations = pod
                .spec
                .as_ref()
                .and_then(|s| s.tolerations.clone())
                .unwrap_or_default();
            let taint = k8s_openapi::api::core::v1::Taint {
                key: "node.kubernetes.io/memory-pressure".into(),
                effect: "NoSchedule".into(),
                ..Default::default()
            };
            if !best_effort || kube_util::taints::tolerated(&tolerations, &taint) {
                return None;
            }
        }
        // Go's %v of a slice: space-separated in brackets.
        Some(format!("The node had condition: [{}]. ", under.join(" ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn admission_under_pressure_as_upstream() {
        let p = Pressure::default();
        let best_effort = pod(serde_json::json!({"spec": {"containers": [{"name": "c"}]}}));
        let burstable = pod(serde_json::json!({"spec": {"containers": [
            {"name": "c", "resources": {"requests": {"memory": "1Mi"}}}]}}));
        let tolerating = pod(serde_json::json!({"spec": {
            "containers": [{"name": "c"}],
            "tolerations": [{"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"}]}}));
        assert_eq!(p.refuses(&best_effort), None);
        p.set(vec!["MemoryPressure"]);
        assert_eq!(
            p.refuses(&best_effort).as_deref(),
            Some("The node had condition: [MemoryPressure]. ")
        );
        assert_eq!(p.refuses(&burstable), None);
        assert_eq!(p.refuses(&tolerating), None);
        p.set(vec!["DiskPressure", "MemoryPressure"]);
        assert_eq!(
            p.refuses(&burstable).as_deref(),
            Some("The node had condition: [DiskPressure MemoryPressure]. ")
        );
    }

    #[test]
    fn pressure_conditions_in_the_kubelets_words() {
        let p = Pressure::default();
        p.set(vec!["DiskPressure"]);
        let cond = |t: &str| NodeCondition {
            type_: t.into(),
            status: "False".into(),
            ..Default::default()
        };
        let mut c = vec![cond("MemoryPressure"), cond("DiskPressure")];
        p.apply(&mut c);
        assert_eq!(c[0].status, "False");
        assert_eq!(c[1].status, "True");
        assert_eq!(c[1].reason.as_deref(), Some("KubeletHasDiskPressure"));
    }
}
