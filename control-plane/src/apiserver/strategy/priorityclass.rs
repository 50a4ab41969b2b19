//! PriorityClasses (scheduling.k8s.io/v1): defaults and validation as
//! upstream's `pkg/registry/scheduling/priorityclass` and
//! `pkg/apis/scheduling/validation`, and the `kubectl get pc` columns.
//!
//! The one-default rule and the pods' use of classes are the Priority
//! admission plugin's ([`crate::apiserver::priority`]); the built-in
//! classes are created at start by [`crate::apiserver::bootstrap`].

use serde_json::{json, Value};

use super::Strategy;
use crate::apiserver::defaults::set;
use crate::apiserver::status::Cause;
use crate::apiserver::table::{age_cell, name_cell, Col, AGE, NAME};

pub struct PriorityClass;

/// Names with this prefix are the system's (upstream's
/// `SystemPriorityClassPrefix`).
pub const SYSTEM_PREFIX: &str = "system-";
/// Upstream's `HighestUserDefinablePriority`: above it only the system
/// classes, so that user pods never preempt critical ones.
pub const HIGHEST_USER_DEFINABLE: i64 = 1_000_000_000;
pub const PREEMPTION_POLICIES: [&str; 2] = ["Never", "PreemptLowerPriority"];

/// The built-in classes (upstream's `SystemPriorityClasses`): name,
/// value, description.
pub const SYSTEM_CLASSES: [(&str, i64, &str); 2] = [
    (
        "system-node-critical",
        2_000_001_000,
        "Used for system critical pods that must not be moved from their current node.",
    ),
    (
        "system-cluster-critical",
        2_000_000_000,
        "Used for system critical pods that must run in the cluster, but can be moved to another node if necessary.",
    ),
];

/// The built-in classes as objects, for the server's bootstrap.
pub fn system_classes() -> Vec<Value> {
    SYSTEM_CLASSES
        .iter()
        .map(|(name, value, description)| {
            json!({
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": name},
                "value": value,
                "description": description,
                "preemptionPolicy": "PreemptLowerPriority",
            })
        })
        .collect()
}

/// Why a `system-` name is not one of the built-ins as they are
/// (upstream's `IsKnownSystemPriorityClass`).
fn unknown_system_class(obj: &Value, name: &str) -> Option<String> {
    let Some((_, value, _)) = SYSTEM_CLASSES.iter().find(|(n, _, _)| *n == name) else {
        return Some(format!("{name} is not a known system priority class"));
    };
    if obj["value"].as_i64() != Some(*value) {
        return Some(format!("value of {name} PriorityClass must be {value}"));
    }
    if obj["globalDefault"].as_bool() == Some(true) {
        return Some(format!(
            "globalDefault of {name} PriorityClass must be false"
        ));
    }
    None
}

impl Strategy for PriorityClass {
    fn default(&self, obj: &mut Value) {
        if let Some(m) = obj.as_object_mut() {
            set(m, "preemptionPolicy", json!("PreemptLowerPriority"));
        }
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        if name.starts_with(SYSTEM_PREFIX) {
            if let Some(why) = unknown_system_class(obj, name) {
                c.push(Cause::forbidden(
                    "metadata.name",
                    &format!("priority class names with '{SYSTEM_PREFIX}' prefix are reserved for system use only. error: {why}"),
                ));
            }
        } else if obj["value"].as_i64().unwrap_or(0) > HIGHEST_USER_DEFINABLE {
            c.push(Cause::forbidden(
                "value",
                &format!(
                    "maximum allowed value of a user defined priority is {HIGHEST_USER_DEFINABLE}"
                ),
            ));
        }
        match obj.get("preemptionPolicy").and_then(Value::as_str) {
            Some(p) if !PREEMPTION_POLICIES.contains(&p) => c.push(Cause::not_supported(
                "preemptionPolicy",
                p,
                &PREEMPTION_POLICIES,
            )),
            Some(_) => {}
            None => c.push(Cause::required("preemptionPolicy")),
        }
        c
    }

    fn validate_update(&self, old: &Value, new: &Value) -> Vec<Cause> {
        let mut c = self.validate(new);
        if old["value"] != new["value"] {
            c.push(Cause::forbidden(
                "value",
                "may not be changed in an update.",
            ));
        }
        if old["preemptionPolicy"] != new["preemptionPolicy"] {
            c.push(Cause::invalid(
                "preemptionPolicy",
                new["preemptionPolicy"].as_str().unwrap_or_default(),
                "field is immutable",
            ));
        }
        c
    }

    /// Upstream's printer: PreemptionPolicy is a default column, after Age.
    fn columns(&self) -> Vec<Col> {
        vec![
            NAME,
            (
                "Value",
                "integer",
                0,
                "The value of this priority class. This is the actual priority that pods receive when they have the name of this class in their pod spec.",
            ),
            (
                "Global-Default",
                "boolean",
                0,
                "globalDefault specifies whether this PriorityClass should be considered as the default priority for pods that do not have any priority class.",
            ),
            AGE,
            (
                "PreemptionPolicy",
                "string",
                0,
                "preemptionPolicy is the Policy for preempting pods with lower priority.",
            ),
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        vec![
            name_cell(obj),
            json!(obj["value"].as_i64().unwrap_or(0)),
            json!(obj["globalDefault"].as_bool().unwrap_or(false)),
            age_cell(obj),
            json!(obj["preemptionPolicy"].as_str().unwrap_or_default()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pc(name: &str, value: i64) -> Value {
        json!({"metadata": {"name": name}, "value": value, "preemptionPolicy": "PreemptLowerPriority"})
    }

    #[test]
    fn user_classes_stay_below_the_system_ones() {
        assert!(PriorityClass
            .validate(&pc("high", 1_000_000_000))
            .is_empty());
        let c = PriorityClass.validate(&pc("higher", 1_000_000_001));
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].field, "value");
    }

    #[test]
    fn system_names_are_reserved() {
        for obj in system_classes() {
            assert!(PriorityClass.validate(&obj).is_empty(), "{obj}");
        }
        let c = PriorityClass.validate(&pc("system-mine", 5));
        assert_eq!(c[0].field, "metadata.name");
        assert!(c[0]
            .message
            .contains("system-mine is not a known system priority class"));
        let c = PriorityClass.validate(&pc("system-node-critical", 5));
        assert!(c[0].message.contains("must be 2000001000"));
    }

    #[test]
    fn value_and_policy_are_immutable() {
        let old = pc("a", 1);
        let mut new = pc("a", 2);
        new["preemptionPolicy"] = json!("Never");
        let fields: Vec<_> = PriorityClass
            .validate_update(&old, &new)
            .into_iter()
            .map(|c| c.field)
            .collect();
        assert_eq!(fields, ["value", "preemptionPolicy"]);
        let mut bad = pc("b", 1);
        bad["preemptionPolicy"] = json!("Sometimes");
        assert_eq!(PriorityClass.validate(&bad)[0].field, "preemptionPolicy");
    }
}
