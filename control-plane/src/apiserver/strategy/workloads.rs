//! Deployments, ReplicaSets and DaemonSets (`apps/v1`): their defaults,
//! the validation every workload with a pod template shares (Jobs use it
//! too), and their `kubectl get` columns.

use serde_json::{json, Map, Value};

use super::Strategy;
use crate::apiserver::defaults::{obj_field, obj_field_map, set, template};
use crate::apiserver::objects;
use crate::apiserver::selectors::LabelSelector;
use crate::apiserver::status::Cause;
use crate::apiserver::table::{
    age_cell, i, name_cell, or_none, s, template_cells, Col, AGE, NAME, TEMPLATE,
};
use crate::apiserver::validation;

pub struct Deployment;
pub struct ReplicaSet;
pub struct DaemonSet;

impl Strategy for Deployment {
    fn default(&self, obj: &mut Value) {
        let spec = obj_field(obj, "spec");
        set(spec, "replicas", json!(1));
        set(spec, "revisionHistoryLimit", json!(10));
        set(spec, "progressDeadlineSeconds", json!(600));
        rolling_update(spec, "strategy", json!("25%"), json!("25%"));
        template(spec);
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        validate_workload(obj, true)
    }

    fn columns(&self) -> Vec<Col> {
        let mut cols = vec![
            NAME,
            ("Ready", "string", 0, "Number of the pod with ready state"),
            ("Up-to-date", "string", 0, "Total number of non-terminated pods targeted by this deployment that have the desired template spec."),
            ("Available", "string", 0, "Total number of available pods (ready for at least minReadySeconds) targeted by this deployment."),
            AGE,
        ];
        cols.extend(TEMPLATE);
        cols
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let (spec, st) = (&obj["spec"], &obj["status"]);
        let mut cells = vec![
            name_cell(obj),
            json!(format!(
                "{}/{}",
                i(&st["readyReplicas"]),
                i(&spec["replicas"])
            )),
            json!(i(&st["updatedReplicas"])),
            json!(i(&st["availableReplicas"])),
            age_cell(obj),
        ];
        cells.extend(template_cells(obj));
        cells
    }
}

impl Strategy for ReplicaSet {
    fn default(&self, obj: &mut Value) {
        let spec = obj_field(obj, "spec");
        set(spec, "replicas", json!(1));
        template(spec);
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        validate_workload(obj, true)
    }

    fn selectable_fields(&self) -> &'static [&'static str] {
        &["status.replicas"]
    }

    fn columns(&self) -> Vec<Col> {
        let mut cols = vec![
            NAME,
            ("Desired", "integer", 0, "Number of desired pods."),
            ("Current", "integer", 0, "Number of actual replicas."),
            (
                "Ready",
                "integer",
                0,
                "The number of ready replicas for this replica set.",
            ),
            AGE,
        ];
        cols.extend(TEMPLATE);
        cols
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let (spec, st) = (&obj["spec"], &obj["status"]);
        let mut cells = vec![
            name_cell(obj),
            json!(i(&spec["replicas"])),
            json!(i(&st["replicas"])),
            json!(i(&st["readyReplicas"])),
            age_cell(obj),
        ];
        cells.extend(template_cells(obj));
        cells
    }
}

impl Strategy for DaemonSet {
    fn default(&self, obj: &mut Value) {
        let spec = obj_field(obj, "spec");
        set(spec, "revisionHistoryLimit", json!(10));
        rolling_update(spec, "updateStrategy", json!(1), json!(0));
        template(spec);
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = validate_workload(obj, true);
        let strategy = &obj["spec"]["updateStrategy"];
        if strategy["type"].as_str() == Some("RollingUpdate") {
            daemonset_rolling_update(&strategy["rollingUpdate"], &mut c);
        }
        c
    }

    fn columns(&self) -> Vec<Col> {
        let mut cols = vec![
            NAME,
            ("Desired", "integer", 0, "The total number of nodes that should be running the daemon pod."),
            ("Current", "integer", 0, "The number of nodes that are running at least 1 daemon pod."),
            ("Ready", "integer", 0, "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and ready."),
            ("Up-to-date", "integer", 0, "The total number of nodes that are running updated daemon pod"),
            ("Available", "integer", 0, "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and available."),
            ("Node Selector", "string", 0, "NodeSelector is a selector which must be true for the pod to fit on a node."),
            AGE,
        ];
        cols.extend(TEMPLATE);
        cols
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let (spec, st) = (&obj["spec"], &obj["status"]);
        let ns: Vec<String> = spec["template"]["spec"]["nodeSelector"]
            .as_object()
            .map(|m| m.iter().map(|(k, v)| format!("{k}={}", s(v))).collect())
            .unwrap_or_default();
        let mut cells = vec![
            name_cell(obj),
            json!(i(&st["desiredNumberScheduled"])),
            json!(i(&st["currentNumberScheduled"])),
            json!(i(&st["numberReady"])),
            json!(i(&st["updatedNumberScheduled"])),
            json!(i(&st["numberAvailable"])),
            json!(or_none(ns.join(","))),
            age_cell(obj),
        ];
        cells.extend(template_cells(obj));
        cells
    }
}

/// A DaemonSet's rolling update bounds (upstream
/// `ValidateRollingUpdateDaemonSet`): each a non-negative int or a percent
/// up to 100%, and exactly one of them non-zero, for the controller either
/// surges or takes nodes down, never both.
fn daemonset_rolling_update(ru: &Value, c: &mut Vec<Cause>) {
    const FIELD: &str = "spec.updateStrategy.rollingUpdate";
    let mut nonzero = [false; 2];
    for (i, name) in ["maxUnavailable", "maxSurge"].into_iter().enumerate() {
        let field = format!("{FIELD}.{name}");
        let v = &ru[name];
        if !v.is_null() {
            validation::int_or_percent(v, &field, c);
        }
        nonzero[i] = is_nonzero(v);
    }
    match nonzero {
        [true, true] => c.push(Cause::invalid(
            format!("{FIELD}.maxSurge"),
            &shown(&ru["maxSurge"]),
            "may not be set when maxUnavailable is non-zero",
        )),
        [false, false] => c.push(Cause::required_because(
            format!("{FIELD}.maxUnavailable"),
            "cannot be 0 when maxSurge is 0",
        )),
        _ => {}
    }
}

/// Whether an IntOrString bound allows anything (upstream
/// `getIntOrPercentValue`: a string counts as the integer it spells
/// without its `%`, else 0).
fn is_nonzero(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Number(n) => n.as_i64() != Some(0),
        Value::String(p) => p
            .strip_suffix('%')
            .unwrap_or(p)
            .parse::<i64>()
            .is_ok_and(|n| n != 0),
        _ => true,
    }
}

/// A value as upstream quotes an IntOrString: strings bare.
fn shown(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The update strategy at `field` defaults to RollingUpdate, and a rolling
/// update to these bounds.
fn rolling_update(spec: &mut Map<String, Value>, field: &str, unavailable: Value, surge: Value) {
    let strategy = obj_field_map(spec, field);
    set(strategy, "type", json!("RollingUpdate"));
    if strategy.get("type").and_then(Value::as_str) == Some("RollingUpdate") {
        let ru = obj_field_map(strategy, "rollingUpdate");
        set(ru, "maxUnavailable", unavailable);
        set(ru, "maxSurge", surge);
    }
}

/// A workload's replicas, pod template and selector. `needs_selector`:
/// the client must bring a selector that selects the template's labels,
/// or the controller would adopt nothing (Jobs generate theirs unless
/// `manualSelector`).
pub(super) fn validate_workload(obj: &Value, needs_selector: bool) -> Vec<Cause> {
    let mut c = Vec::new();
    let spec = &obj["spec"];
    if let Some(r) = spec.get("replicas").and_then(Value::as_i64) {
        if r < 0 {
            c.push(Cause::invalid(
                "spec.replicas",
                &r.to_string(),
                "must be greater than or equal to 0",
            ));
        }
    }
    let template = &spec["template"];
    validation::pod_spec("spec.template.spec", template.get("spec"), &mut c);
    if template["spec"]
        .get("ephemeralContainers")
        .is_some_and(|e| e.as_array().is_none_or(|a| !a.is_empty()))
    {
        c.push(Cause::forbidden(
            "spec.template.spec.ephemeralContainers",
            "ephemeral containers not allowed in pod template",
        ));
    }
    super::pod::security::validate("spec.template.spec", template.get("spec"), &mut c);
    super::pod::affinity::validate("spec.template.spec", template.get("spec"), &mut c);
    if !needs_selector {
        return c;
    }
    match spec.get("selector") {
        None | Some(Value::Null) => c.push(Cause::required("spec.selector")),
        Some(sel) => {
            let ml = sel.get("matchLabels").and_then(Value::as_object);
            let has_expr = sel
                .get("matchExpressions")
                .and_then(Value::as_array)
                .is_some_and(|a| !a.is_empty());
            if ml.is_none_or(|m| m.is_empty()) && !has_expr {
                c.push(Cause::invalid(
                    "spec.selector",
                    "{}",
                    "empty selector is invalid for deployment",
                ));
            } else if let Some(ml) = ml {
                let labels = objects::labels(template);
                if !LabelSelector::from_map(ml).matches_labels(&labels) {
                    let shown =
                        serde_json::to_string(&template["metadata"]["labels"]).unwrap_or_default();
                    c.push(Cause::invalid(
                        "spec.template.metadata.labels",
                        &shown,
                        "`selector` does not match template `labels`",
                    ));
                }
            }
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The causes for a DaemonSet with this `rollingUpdate`, defaulted.
    fn ds_causes(ru: Value) -> Vec<String> {
        let mut obj = json!({
            "spec": {
                "selector": {"matchLabels": {"app": "a"}},
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": ru},
                "template": {
                    "metadata": {"labels": {"app": "a"}},
                    "spec": {"containers": [{"name": "c", "image": "busybox"}]}
                }
            }
        });
        DaemonSet.default(&mut obj);
        DaemonSet
            .validate(&obj)
            .into_iter()
            .map(|c| c.line())
            .collect()
    }

    const RU: &str = "spec.updateStrategy.rollingUpdate";

    #[test]
    fn daemonset_surges_or_takes_down_never_both() {
        assert_eq!(ds_causes(json!({})), Vec::<String>::new());
        assert_eq!(
            ds_causes(json!({"maxSurge": 1, "maxUnavailable": 0})),
            Vec::<String>::new()
        );
        assert_eq!(
            ds_causes(json!({"maxSurge": "100%", "maxUnavailable": "0%"})),
            Vec::<String>::new()
        );
        // maxUnavailable defaults to 1: a surge needs an explicit 0.
        assert_eq!(
            ds_causes(json!({"maxSurge": "25%"})),
            [format!("{RU}.maxSurge: Invalid value: \"25%\": may not be set when maxUnavailable is non-zero")]
        );
        assert_eq!(
            ds_causes(json!({"maxSurge": 0, "maxUnavailable": "0%"})),
            [format!(
                "{RU}.maxUnavailable: Required value: cannot be 0 when maxSurge is 0"
            )]
        );
    }

    #[test]
    fn daemonset_bounds_are_nonnegative_ints_or_percents_up_to_100() {
        assert_eq!(
            ds_causes(json!({"maxSurge": -1, "maxUnavailable": 0})),
            [format!(
                "{RU}.maxSurge: Invalid value: \"-1\": must be greater than or equal to 0"
            )]
        );
        assert_eq!(
            ds_causes(json!({"maxSurge": "101%", "maxUnavailable": 0})),
            [format!(
                "{RU}.maxSurge: Invalid value: \"101%\": must not be greater than 100%"
            )]
        );
        let bad = ds_causes(json!({"maxSurge": 0, "maxUnavailable": "ten%"}));
        assert_eq!(bad.len(), 2, "{bad:?}");
        assert!(bad[0].starts_with(&format!(
            "{RU}.maxUnavailable: Invalid value: \"ten%\": a valid percent string"
        )));
        assert!(bad[1].ends_with("cannot be 0 when maxSurge is 0"));
        // OnDelete ignores the bounds.
        let mut obj = json!({"spec": {"updateStrategy": {"type": "OnDelete",
            "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 1}}}});
        DaemonSet.default(&mut obj);
        let causes = DaemonSet.validate(&obj);
        assert!(causes.iter().all(|c| !c.field.starts_with(RU)));
    }
}
