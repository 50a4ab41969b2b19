//! LimitRanges (core/v1): defaults and validation as upstream's
//! `SetDefaults_LimitRangeItem` and `ValidateLimitRange`, and the
//! `kubectl get limits` columns.
//!
//! What they do to pods and claims is the LimitRanger admission plugin's
//! ([`crate::apiserver::limitranger`]).

use std::collections::BTreeSet;

use serde_json::{json, Map, Value};

use super::Strategy;
use crate::apiserver::status::Cause;
use crate::apiserver::table::{name_cell, Col, NAME};
use kube_util::quantity;

pub struct LimitRange;

/// The item types the LimitRanger plugin enforces; others would be
/// accepted and ignored, so they are refused.
pub const TYPES: [&str; 3] = ["Container", "Pod", "PersistentVolumeClaim"];
const LISTS: [&str; 5] = [
    "max",
    "min",
    "default",
    "defaultRequest",
    "maxLimitRequestRatio",
];

/// A quantity in thousandths, for comparisons.
pub(crate) fn milli(v: &Value) -> Option<i128> {
    quantity::scaled(v.as_str()?, -3).ok()
}

fn text(v: &Value) -> String {
    v.as_str()
        .map(str::to_string)
        .unwrap_or_else(|| v.to_string())
}

/// Fills `to[k]` from `from[k]` where missing.
fn fill(item: &mut Map<String, Value>, from: &str, to: &str) {
    let Some(src) = item.get(from).and_then(Value::as_object).cloned() else {
        return;
    };
    let dst = item.entry(to).or_insert_with(|| json!({}));
    if dst.is_null() {
        *dst = json!({});
    }
    if let Some(dst) = dst.as_object_mut() {
        for (k, v) in src {
            dst.entry(k).or_insert(v);
        }
    }
}

fn validate_item(item: &Value, path: &str, c: &mut Vec<Cause>) {
    let ty = item["type"].as_str().unwrap_or_default();
    if ty.is_empty() {
        c.push(Cause::required(format!("{path}.type")));
    } else if !TYPES.contains(&ty) {
        c.push(Cause::not_supported(format!("{path}.type"), ty, &TYPES));
    }
    if ty == "Pod" {
        for list in ["default", "defaultRequest"] {
            if item[list].as_object().is_some_and(|m| !m.is_empty()) {
                c.push(Cause::forbidden(
                    format!("{path}.{list}"),
                    "may not be specified when `type` is 'Pod'",
                ));
            }
        }
    }
    let mut keys = BTreeSet::new();
    for list in LISTS {
        for (k, v) in item[list].as_object().into_iter().flatten() {
            keys.insert(k.clone());
            match milli(v) {
                None => c.push(Cause::invalid(
                    format!("{path}.{list}[{k}]"),
                    &text(v),
                    crate::apiserver::validation::QUANTITY_MESSAGE,
                )),
                Some(n) if n < 0 => c.push(Cause::invalid(
                    format!("{path}.{list}[{k}]"),
                    &text(v),
                    "must be greater than or equal to 0",
                )),
                Some(_) => {}
            }
        }
    }
    if ty == "PersistentVolumeClaim"
        && item["min"].get("storage").is_none()
        && item["max"].get("storage").is_none()
    {
        c.push(Cause::required_because(
            format!("{path}.limits"),
            "either minimum or maximum storage value is required, but neither was provided",
        ));
    }
    for k in &keys {
        let get = |list: &str| item[list].get(k.as_str()).map(|v| (text(v), milli(v)));
        let (min, max, def, req, ratio) = (
            get("min"),
            get("max"),
            get("default"),
            get("defaultRequest"),
            get("maxLimitRequestRatio"),
        );
        let greater = |a: &Option<(String, Option<i128>)>, b: &Option<(String, Option<i128>)>| matches!((a, b), (Some((_, Some(x))), Some((_, Some(y)))) if x > y);
        let s = |q: &Option<(String, Option<i128>)>| {
            q.as_ref().map(|q| q.0.clone()).unwrap_or_default()
        };
        let mut bad = |list: &str, shown: &Option<(String, Option<i128>)>, why: String| {
            c.push(Cause::invalid(
                format!("{path}.{list}[{k}]"),
                &s(shown),
                &why,
            ));
        };
        if greater(&min, &max) {
            bad(
                "min",
                &min,
                format!(
                    "min value {} is greater than max value {}",
                    s(&min),
                    s(&max)
                ),
            );
        }
        if greater(&min, &req) {
            bad(
                "defaultRequest",
                &req,
                format!(
                    "min value {} is greater than default request value {}",
                    s(&min),
                    s(&req)
                ),
            );
        }
        if greater(&req, &max) {
            bad(
                "defaultRequest",
                &req,
                format!(
                    "default request value {} is greater than max value {}",
                    s(&req),
                    s(&max)
                ),
            );
        }
        if greater(&req, &def) {
            bad(
                "defaultRequest",
                &req,
                format!(
                    "default request value {} is greater than default limit value {}",
                    s(&req),
                    s(&def)
                ),
            );
        }
        if greater(&min, &def) {
            bad(
                "default",
                &min,
                format!(
                    "min value {} is greater than default value {}",
                    s(&min),
                    s(&def)
                ),
            );
        }
        if greater(&def, &max) {
            bad(
                "default",
                &max,
                format!(
                    "default value {} is greater than max value {}",
                    s(&def),
                    s(&max)
                ),
            );
        }
        if let Some((shown, Some(r))) = &ratio {
            if *r < 1000 {
                bad(
                    "maxLimitRequestRatio",
                    &ratio,
                    format!("ratio {shown} is less than 1"),
                );
            }
        }
    }
}

impl Strategy for LimitRange {
    /// Container items: the default limit is the max, the default request
    /// the default limit, else the min (upstream's
    /// `SetDefaults_LimitRangeItem`).
    fn default(&self, obj: &mut Value) {
        let Some(items) = obj["spec"].get_mut("limits").and_then(Value::as_array_mut) else {
            return;
        };
        for item in items.iter_mut().filter_map(Value::as_object_mut) {
            if item.get("type").and_then(Value::as_str) == Some("Container") {
                fill(item, "max", "default");
                fill(item, "default", "defaultRequest");
                fill(item, "min", "defaultRequest");
            }
        }
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        let mut seen = BTreeSet::new();
        for (i, item) in obj["spec"]["limits"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let path = format!("spec.limits[{i}]");
            let ty = item["type"].as_str().unwrap_or_default();
            if !seen.insert(ty.to_string()) {
                c.push(Cause::duplicate(format!("{path}.type"), ty));
            }
            validate_item(item, &path, &mut c);
        }
        c
    }

    fn columns(&self) -> Vec<Col> {
        vec![
            NAME,
            ("Created At", "date", 0, "Date of creation for limit range"),
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        vec![
            name_cell(obj),
            json!(obj["metadata"]["creationTimestamp"]
                .as_str()
                .unwrap_or_default()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(item: Value) -> Value {
        json!({"metadata": {"name": "r"}, "spec": {"limits": [item]}})
    }

    #[test]
    fn container_defaults_come_from_max_and_min() {
        let mut lr =
            range(json!({"type": "Container", "max": {"cpu": "1"}, "min": {"memory": "64Mi"}}));
        LimitRange.default(&mut lr);
        let item = &lr["spec"]["limits"][0];
        assert_eq!(item["default"], json!({"cpu": "1"}));
        assert_eq!(
            item["defaultRequest"],
            json!({"cpu": "1", "memory": "64Mi"})
        );
        assert!(LimitRange.validate(&lr).is_empty());
    }

    #[test]
    fn bounds_must_be_ordered() {
        let lr = range(
            json!({"type": "Container", "min": {"cpu": "200m"}, "max": {"cpu": "100m"},
            "maxLimitRequestRatio": {"cpu": "500m"}}),
        );
        let msgs: Vec<String> = LimitRange
            .validate(&lr)
            .into_iter()
            .map(|c| c.message)
            .collect();
        assert!(
            msgs.iter()
                .any(|m| m.contains("min value 200m is greater than max value 100m")),
            "{msgs:?}"
        );
        assert!(
            msgs.iter().any(|m| m.contains("ratio 500m is less than 1")),
            "{msgs:?}"
        );
    }

    #[test]
    fn types_are_checked() {
        let c = LimitRange.validate(&range(json!({"type": "Pod", "default": {"cpu": "1"}})));
        assert_eq!(c[0].field, "spec.limits[0].default");
        let c = LimitRange.validate(&range(json!({"type": "Node"})));
        assert_eq!(c[0].field, "spec.limits[0].type");
        let c = LimitRange.validate(&range(json!({"type": "PersistentVolumeClaim"})));
        assert_eq!(c[0].field, "spec.limits[0].limits");
    }
}
