//! StatefulSets (`apps/v1`): defaults, validation, the fields an update
//! may change and the `kubectl get statefulsets` columns, as upstream's
//! `pkg/registry/apps/statefulset/strategy.go` and `ValidateStatefulSet`.

use serde_json::{json, Value};

use super::workloads::validate_workload;
use super::Strategy;
use crate::apiserver::defaults::{obj_field, obj_field_map, set, template};
use crate::apiserver::status::Cause;
use crate::apiserver::table::{age_cell, i, name_cell, template_cells, Col, AGE, NAME, TEMPLATE};

pub struct StatefulSet;

/// The spec fields an update may change (upstream's
/// `ValidateStatefulSetUpdate`); everything else is fixed at creation
/// because pods and claims were named and bound after it.
const MUTABLE: [&str; 6] = [
    "replicas",
    "ordinals",
    "template",
    "updateStrategy",
    "persistentVolumeClaimRetentionPolicy",
    "minReadySeconds",
];

impl Strategy for StatefulSet {
    fn default(&self, obj: &mut Value) {
        let spec = obj_field(obj, "spec");
        set(spec, "replicas", json!(1));
        set(spec, "podManagementPolicy", json!("OrderedReady"));
        set(spec, "revisionHistoryLimit", json!(10));
        let strategy = obj_field_map(spec, "updateStrategy");
        set(strategy, "type", json!("RollingUpdate"));
        if strategy.get("type").and_then(Value::as_str) == Some("RollingUpdate") {
            let ru = obj_field_map(strategy, "rollingUpdate");
            set(ru, "partition", json!(0));
            // Upstream defaults maxUnavailable to 1 only with the
            // MaxUnavailableStatefulSet gate; 1 is also what the
            // controller does without the field, so the default is honest.
            set(ru, "maxUnavailable", json!(1));
        }
        let retention = obj_field_map(spec, "persistentVolumeClaimRetentionPolicy");
        set(retention, "whenDeleted", json!("Retain"));
        set(retention, "whenScaled", json!("Retain"));
        if let Some(claims) = spec
            .get_mut("volumeClaimTemplates")
            .and_then(Value::as_array_mut)
        {
            for claim in claims.iter_mut().filter(|c| c.is_object()) {
                let cspec = obj_field(claim, "spec");
                set(cspec, "volumeMode", json!("Filesystem"));
                let st = obj_field(claim, "status");
                set(st, "phase", json!("Pending"));
            }
        }
        template(spec);
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = validate_workload(obj, true);
        let spec = &obj["spec"];
        match spec["podManagementPolicy"].as_str() {
            Some("OrderedReady" | "Parallel") => {}
            Some(p) => c.push(Cause::not_supported(
                "spec.podManagementPolicy",
                p,
                &["OrderedReady", "Parallel"],
            )),
            None => c.push(Cause::required("spec.podManagementPolicy")),
        }
        validate_update_strategy(&spec["updateStrategy"], &mut c);
        if let Some(start) = spec["ordinals"].get("start") {
            if start.as_i64().is_none_or(|s| s < 0) {
                c.push(Cause::invalid(
                    "spec.ordinals.start",
                    &start.to_string(),
                    "must be greater than or equal to 0",
                ));
            }
        }
        for (field, v) in [
            ("spec.minReadySeconds", &spec["minReadySeconds"]),
            ("spec.revisionHistoryLimit", &spec["revisionHistoryLimit"]),
        ] {
            if v.as_i64().is_some_and(|n| n < 0) {
                c.push(Cause::invalid(
                    field,
                    &v.to_string(),
                    "must be greater than or equal to 0",
                ));
            }
        }
        for when in ["whenDeleted", "whenScaled"] {
            let v = &spec["persistentVolumeClaimRetentionPolicy"][when];
            if let Some(p) = v.as_str() {
                if p != "Retain" && p != "Delete" {
                    c.push(Cause::not_supported(
                        format!("spec.persistentVolumeClaimRetentionPolicy.{when}"),
                        p,
                        &["Retain", "Delete"],
                    ));
                }
            }
        }
        match spec["template"]["spec"]["restartPolicy"].as_str() {
            Some("Always") | None => {}
            Some(rp) => c.push(Cause::not_supported(
                "spec.template.spec.restartPolicy",
                rp,
                &["Always"],
            )),
        }
        if spec["template"]["spec"]["activeDeadlineSeconds"].is_i64() {
            c.push(Cause::forbidden(
                "spec.template.spec.activeDeadlineSeconds",
                "activeDeadlineSeconds in StatefulSet is not Supported",
            ));
        }
        validate_claim_templates(&spec["volumeClaimTemplates"], &mut c);
        c
    }

    fn validate_update(&self, old: &Value, new: &Value) -> Vec<Cause> {
        let mut c = self.validate(new);
        let strip = |obj: &Value| {
            let mut spec = obj["spec"].as_object().cloned().unwrap_or_default();
            for f in MUTABLE {
                spec.remove(f);
            }
            spec
        };
        if strip(old) != strip(new) {
            c.push(Cause::forbidden(
                "spec",
                "updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden",
            ));
        }
        c
    }

    fn columns(&self) -> Vec<Col> {
        vec![
            NAME,
            ("Ready", "string", 0, "Number of the pod with ready state"),
            AGE,
            TEMPLATE[0],
            TEMPLATE[1],
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let (spec, st) = (&obj["spec"], &obj["status"]);
        let [containers, images, _] = template_cells(obj);
        vec![
            name_cell(obj),
            json!(format!(
                "{}/{}",
                i(&st["readyReplicas"]),
                i(&spec["replicas"])
            )),
            age_cell(obj),
            containers,
            images,
        ]
    }
}

fn validate_update_strategy(strategy: &Value, c: &mut Vec<Cause>) {
    match strategy["type"].as_str() {
        Some("OnDelete") => {
            if !strategy["rollingUpdate"].is_null() {
                c.push(Cause::invalid(
                    "spec.updateStrategy.rollingUpdate",
                    "",
                    "only allowed for updateStrategy 'RollingUpdate'",
                ));
            }
        }
        Some("RollingUpdate") => {
            let ru = &strategy["rollingUpdate"];
            let partition = &ru["partition"];
            if !partition.is_null() && partition.as_i64().is_none_or(|p| p < 0) {
                c.push(Cause::invalid(
                    "spec.updateStrategy.rollingUpdate.partition",
                    &partition.to_string(),
                    "must be greater than or equal to 0",
                ));
            }
            let mu = &ru["maxUnavailable"];
            let field = "spec.updateStrategy.rollingUpdate.maxUnavailable";
            match mu {
                Value::Null => {}
                Value::Number(n) => {
                    if n.as_i64().is_none_or(|n| n < 1) {
                        c.push(Cause::invalid(field, &n.to_string(), "must be greater than 0"));
                    }
                }
                Value::String(s) => match s.strip_suffix('%').map(str::parse::<u32>) {
                    Some(Ok(p)) if p > 0 && p <= 100 => {}
                    Some(Ok(0)) => c.push(Cause::invalid(field, s, "must be greater than 0")),
                    Some(Ok(_)) => {
                        c.push(Cause::invalid(field, s, "must not be greater than 100%"))
                    }
                    _ => c.push(Cause::invalid(
                        field,
                        s,
                        "a valid percent string must be a numeric string followed by an ending '%' (e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')",
                    )),
                },
                other => c.push(Cause::invalid(
                    field,
                    &other.to_string(),
                    "must be an integer or percentage (e.g '5%')",
                )),
            }
        }
        Some(t) => c.push(Cause::not_supported(
            "spec.updateStrategy.type",
            t,
            &["OnDelete", "RollingUpdate"],
        )),
        None => c.push(Cause::required("spec.updateStrategy.type")),
    }
}

/// Claim templates become PersistentVolumeClaims named
/// `<template>-<pod>`: each needs a name, access modes and a storage
/// request, as a claim would on create.
fn validate_claim_templates(templates: &Value, c: &mut Vec<Cause>) {
    let Some(list) = templates.as_array() else {
        return;
    };
    let mut seen = std::collections::HashSet::new();
    for (n, t) in list.iter().enumerate() {
        let at = format!("spec.volumeClaimTemplates[{n}]");
        match t["metadata"]["name"].as_str() {
            None | Some("") => c.push(Cause::required(format!("{at}.metadata.name"))),
            Some(name) => {
                crate::apiserver::validation::dns_label(&format!("{at}.metadata.name"), name, c);
                if !seen.insert(name.to_string()) {
                    c.push(Cause::duplicate(format!("{at}.metadata.name"), name));
                }
            }
        }
        if t["spec"]["accessModes"]
            .as_array()
            .is_none_or(|a| a.is_empty())
        {
            c.push(Cause::required(format!("{at}.spec.accessModes")));
        }
        if t["spec"]["resources"]["requests"]["storage"].is_null() {
            c.push(Cause::required(format!("{at}.spec.resources[storage]")));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sts() -> Value {
        let mut v = json!({
            "metadata": {"name": "web"},
            "spec": {
                "serviceName": "web",
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "c", "image": "nginx"}]},
                },
                "volumeClaimTemplates": [{
                    "metadata": {"name": "data"},
                    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
                }],
            }
        });
        StatefulSet.default(&mut v);
        v
    }

    #[test]
    fn defaults_follow_upstream() {
        let v = sts();
        assert_eq!(v["spec"]["podManagementPolicy"], "OrderedReady");
        assert_eq!(v["spec"]["updateStrategy"]["rollingUpdate"]["partition"], 0);
        assert_eq!(
            v["spec"]["persistentVolumeClaimRetentionPolicy"]["whenScaled"],
            "Retain"
        );
        assert_eq!(
            v["spec"]["volumeClaimTemplates"][0]["spec"]["volumeMode"],
            "Filesystem"
        );
        assert_eq!(
            v["spec"]["volumeClaimTemplates"][0]["status"]["phase"],
            "Pending"
        );
        assert!(
            StatefulSet.validate(&v).is_empty(),
            "{:?}",
            StatefulSet.validate(&v)
        );
    }

    #[test]
    fn bad_partition_and_max_unavailable_are_refused() {
        let mut v = sts();
        v["spec"]["updateStrategy"]["rollingUpdate"]["partition"] = json!(-1);
        v["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] = json!("0%");
        let c = StatefulSet.validate(&v);
        assert_eq!(c.len(), 2, "{c:?}");
    }

    #[test]
    fn only_the_listed_fields_may_change() {
        let old = sts();
        let mut new = old.clone();
        new["spec"]["replicas"] = json!(5);
        new["spec"]["updateStrategy"]["rollingUpdate"]["partition"] = json!(2);
        assert!(StatefulSet.validate_update(&old, &new).is_empty());
        new["spec"]["serviceName"] = json!("other");
        assert_eq!(StatefulSet.validate_update(&old, &new).len(), 1);
    }
}
