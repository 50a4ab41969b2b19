//! PodDisruptionBudgets (`policy/v1`): validation and the `kubectl get
//! pdb` columns (upstream's `pkg/registry/policy/poddisruptionbudget` and
//! `ValidatePodDisruptionBudget`).
//!
//! The status is the disruption controller's and the eviction API's to
//! write (status subresource); a spec change bumps `metadata.generation`,
//! which the eviction API compares with `status.observedGeneration`.

use serde_json::{json, Value};

use super::Strategy;
use crate::apiserver::status::Cause;
use crate::apiserver::table::{age_cell, i, name_cell, s, Col, AGE, NAME};
use crate::apiserver::validation;

pub struct PodDisruptionBudget;

impl Strategy for PodDisruptionBudget {
    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        let spec = &obj["spec"];
        let min = spec.get("minAvailable").filter(|v| !v.is_null());
        let max = spec.get("maxUnavailable").filter(|v| !v.is_null());
        if min.is_some() && max.is_some() {
            c.push(Cause::invalid(
                "spec",
                &spec.to_string(),
                "minAvailable and maxUnavailable cannot be both set",
            ));
        }
        if let Some(v) = min {
            validation::int_or_percent(v, "spec.minAvailable", &mut c);
        }
        if let Some(v) = max {
            validation::int_or_percent(v, "spec.maxUnavailable", &mut c);
        }
        if let Some(sel) = spec.get("selector").filter(|v| !v.is_null()) {
            validation::label_selector(sel, "spec.selector", &mut c);
        }
        if let Some(p) = spec
            .get("unhealthyPodEvictionPolicy")
            .filter(|v| !v.is_null())
        {
            let p = s(p);
            if !matches!(p.as_str(), "IfHealthyBudget" | "AlwaysAllow") {
                c.push(Cause::not_supported(
                    "spec.unhealthyPodEvictionPolicy",
                    &p,
                    &["AlwaysAllow", "IfHealthyBudget"],
                ));
            }
        }
        // The status the controller and the eviction API write
        // (`ValidatePodDisruptionBudgetStatusUpdate`).
        for f in [
            "disruptionsAllowed",
            "currentHealthy",
            "desiredHealthy",
            "expectedPods",
        ] {
            if let Some(n) = obj["status"][f].as_i64().filter(|n| *n < 0) {
                c.push(Cause::invalid(
                    format!("status.{f}"),
                    &n.to_string(),
                    "must be greater than or equal to 0",
                ));
            }
        }
        c
    }

    fn columns(&self) -> Vec<Col> {
        vec![
            NAME,
            (
                "Min Available",
                "string",
                0,
                "The minimum number of pods that must be available.",
            ),
            (
                "Max Unavailable",
                "string",
                0,
                "The maximum number of pods that may be unavailable.",
            ),
            (
                "Allowed Disruptions",
                "integer",
                0,
                "Calculated number of pods that may be disrupted at this time.",
            ),
            AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let shown = |v: &Value| if v.is_null() { "N/A".into() } else { s(v) };
        vec![
            name_cell(obj),
            json!(shown(&obj["spec"]["minAvailable"])),
            json!(shown(&obj["spec"]["maxUnavailable"])),
            json!(i(&obj["status"]["disruptionsAllowed"])),
            age_cell(obj),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(spec: Value) -> Vec<String> {
        PodDisruptionBudget
            .validate(&json!({"spec": spec}))
            .into_iter()
            .map(|c| c.line())
            .collect()
    }

    #[test]
    fn one_of_min_and_max_with_valid_values() {
        assert!(fields(json!({"minAvailable": 2, "selector": {}})).is_empty());
        assert!(fields(json!({"maxUnavailable": "25%"})).is_empty());
        let both = fields(json!({"minAvailable": 1, "maxUnavailable": 1}));
        assert_eq!(both.len(), 1);
        assert!(both[0].ends_with("minAvailable and maxUnavailable cannot be both set"));
        assert_eq!(
            fields(json!({"minAvailable": -1})),
            vec!["spec.minAvailable: Invalid value: \"-1\": must be greater than or equal to 0"]
        );
        assert_eq!(
            fields(json!({"maxUnavailable": "101%"})),
            vec!["spec.maxUnavailable: Invalid value: \"101%\": must not be greater than 100%"]
        );
        assert_eq!(fields(json!({"minAvailable": "ten%"})).len(), 1);
        assert_eq!(fields(json!({"minAvailable": "10"})).len(), 1);
    }

    #[test]
    fn policy_and_selector_are_checked() {
        assert_eq!(
            fields(json!({"minAvailable": 1, "unhealthyPodEvictionPolicy": "Never"})),
            vec!["spec.unhealthyPodEvictionPolicy: Unsupported value: \"Never\": supported values: \"AlwaysAllow\", \"IfHealthyBudget\""]
        );
        let sel = json!({"matchExpressions": [{"key": "a", "operator": "Is"}]});
        assert_eq!(
            fields(json!({"minAvailable": 1, "selector": sel})),
            vec!["spec.selector.matchExpressions[0].operator: Invalid value: \"Is\": not a valid selector operator"]
        );
    }

    #[test]
    fn unset_bounds_print_as_na() {
        let obj = json!({"metadata": {"name": "p"}, "spec": {"minAvailable": "50%"},
                         "status": {"disruptionsAllowed": 1}});
        let cells = PodDisruptionBudget.cells(&obj);
        assert_eq!(
            cells[..4],
            [json!("p"), json!("50%"), json!("N/A"), json!(1)]
        );
    }
}
