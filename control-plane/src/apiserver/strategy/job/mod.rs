//! Jobs (`batch/v1`): defaults, the selector the server generates on the
//! Job's own uid (upstream's job strategy `generateSelector`), validation
//! and the `kubectl get jobs` columns.

mod validation;

use serde_json::{json, Value};

use super::workloads::validate_workload;
use super::Strategy;
use crate::apiserver::defaults::{obj_field, set, template};
use crate::apiserver::objects::{self, parse_time};
use crate::apiserver::status::Cause;
use crate::apiserver::table::{
    age_cell, human_duration, i, name_cell, template_cells, Col, AGE, NAME, TEMPLATE,
};
use crate::apiserver::Req;

pub struct Job;

impl Strategy for Job {
    fn prepare_for_create(&self, r: &Req, obj: &mut Value) {
        super::reset_status(r.def, obj);
        generate_selector(obj);
    }

    /// A selector generated on create is kept by updates that leave it out.
    fn prepare_for_update(&self, old: &Value, new: &mut Value) {
        if new["spec"]["selector"].is_null() {
            new["spec"]["selector"] = old["spec"]["selector"].clone();
        }
    }

    fn default(&self, obj: &mut Value) {
        let spec = obj_field(obj, "spec");
        set(spec, "parallelism", json!(1));
        if !spec.contains_key("completions")
            && spec.get("completionMode").and_then(Value::as_str) != Some("Indexed")
        {
            spec.insert("completions".into(), json!(1));
        }
        // With per-index limits the Job-wide limit is off unless given.
        let backoff = if spec.contains_key("backoffLimitPerIndex") {
            i64::from(i32::MAX)
        } else {
            6
        };
        set(spec, "backoffLimit", json!(backoff));
        set(spec, "completionMode", json!("NonIndexed"));
        set(spec, "suspend", json!(false));
        set(spec, "manualSelector", json!(false));
        // A pod failure policy judges failed pods: replacing a pod before
        // it has failed would run two at once for its index.
        let replacement = if spec.contains_key("podFailurePolicy") {
            "Failed"
        } else {
            "TerminatingOrFailed"
        };
        set(spec, "podReplacementPolicy", json!(replacement));
        if let Some(rules) = spec
            .get_mut("podFailurePolicy")
            .and_then(|p| p.get_mut("rules"))
            .and_then(Value::as_array_mut)
        {
            for pattern in rules
                .iter_mut()
                .filter_map(|r| r.get_mut("onPodConditions"))
                .filter_map(Value::as_array_mut)
                .flatten()
                .filter_map(Value::as_object_mut)
            {
                set(pattern, "status", json!("True"));
            }
        }
        template(spec);
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let manual = obj["spec"]["manualSelector"].as_bool() == Some(true);
        let mut c = validate_workload(obj, manual);
        match obj["spec"]["template"]["spec"]["restartPolicy"].as_str() {
            Some("OnFailure" | "Never") => {}
            Some(rp) => c.push(Cause::not_supported(
                "spec.template.spec.restartPolicy",
                rp,
                &["OnFailure", "Never"],
            )),
            None => c.push(Cause::required("spec.template.spec.restartPolicy")),
        }
        validation::spec(&obj["spec"], &mut c);
        if let Some(m) = obj["spec"]["managedBy"].as_str() {
            if m.len() > 63 {
                c.push(Cause::too_long("spec.managedBy", 63));
            }
        }
        c
    }

    /// Upstream `validateJobSpecUpdate`: what decides which pods belong to
    /// the Job, how their failures are judged, and who runs it, is fixed.
    fn validate_update(&self, old: &Value, new: &Value) -> Vec<Cause> {
        let mut c = self.validate(new);
        for field in [
            "selector",
            "completionMode",
            "managedBy",
            "podFailurePolicy",
            "backoffLimitPerIndex",
            "successPolicy",
        ] {
            let (was, now) = (&old["spec"][field], &new["spec"][field]);
            if was != now {
                let shown = match now {
                    Value::String(s) => s.clone(),
                    v => v.to_string(),
                };
                c.push(Cause::invalid(
                    format!("spec.{field}"),
                    &shown,
                    "field is immutable",
                ));
            }
        }
        // Only an elastic Indexed Job (completions kept equal to
        // parallelism) may change its completions.
        let (was, now) = (&old["spec"]["completions"], &new["spec"]["completions"]);
        if was != now {
            let elastic =
                new["spec"]["completionMode"] == "Indexed" && now == &new["spec"]["parallelism"];
            if !elastic {
                c.push(Cause::invalid(
                    "spec.completions",
                    &now.to_string(),
                    "field is immutable",
                ));
            }
        }
        c
    }

    fn selectable_fields(&self) -> &'static [&'static str] {
        &["status.successful"]
    }

    fn columns(&self) -> Vec<Col> {
        let mut cols = vec![
            NAME,
            ("Status", "string", 0, "Status of the job."),
            (
                "Completions",
                "string",
                0,
                "The desired number of successfully finished pods the job should be run with.",
            ),
            (
                "Duration",
                "string",
                0,
                "Time required to complete the job.",
            ),
            AGE,
        ];
        cols.extend(TEMPLATE);
        cols
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let (spec, st) = (&obj["spec"], &obj["status"]);
        let conds = st["conditions"].as_array().cloned().unwrap_or_default();
        let has = |t: &str| {
            conds
                .iter()
                .any(|c| c["type"] == t && c["status"] == "True")
        };
        let status = if has("Complete") {
            "Complete"
        } else if has("Failed") {
            "Failed"
        } else if has("FailureTarget") {
            "FailureTarget"
        } else if has("SuccessCriteriaMet") {
            "SuccessCriteriaMet"
        } else if spec["suspend"].as_bool() == Some(true) || has("Suspended") {
            "Suspended"
        } else if objects::has_deletion_timestamp(obj) {
            "Terminating"
        } else {
            "Running"
        };
        let completions = match spec["completions"].as_i64() {
            Some(n) => format!("{}/{}", i(&st["succeeded"]), n),
            None => {
                let p = spec["parallelism"].as_i64().unwrap_or(0);
                if p > 1 {
                    format!("{}/1 of {}", i(&st["succeeded"]), p)
                } else {
                    format!("{}/1", i(&st["succeeded"]))
                }
            }
        };
        let duration = match (
            st["startTime"].as_str().and_then(parse_time),
            st["completionTime"].as_str().and_then(parse_time),
        ) {
            (Some(a), Some(b)) => human_duration(b.as_second() - a.as_second()),
            (Some(a), None) => human_duration(objects::seconds_since(a)),
            _ => String::new(),
        };
        let mut cells = vec![
            name_cell(obj),
            json!(status),
            json!(completions),
            json!(duration),
            age_cell(obj),
        ];
        cells.extend(template_cells(obj));
        cells
    }
}

/// Jobs get a generated selector on their own uid (unless manualSelector),
/// and the template gets the matching labels.
fn generate_selector(obj: &mut Value) {
    if obj["spec"]["manualSelector"].as_bool() == Some(true) {
        return;
    }
    let uid = obj["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let name = obj["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    obj["spec"]["selector"] = json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}});
    let tmpl = &mut obj["spec"]["template"];
    if !tmpl["metadata"].is_object() {
        tmpl["metadata"] = json!({});
    }
    if !tmpl["metadata"]["labels"].is_object() {
        tmpl["metadata"]["labels"] = json!({});
    }
    let labels = &mut tmpl["metadata"]["labels"];
    labels["batch.kubernetes.io/controller-uid"] = json!(uid);
    labels["batch.kubernetes.io/job-name"] = json!(name);
    labels["controller-uid"] = json!(uid);
    labels["job-name"] = json!(name);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(extra: Value) -> Value {
        let mut obj = json!({
            "metadata": {"name": "pi"},
            "spec": {"template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "c", "image": "busybox"}]
            }}}
        });
        for (k, v) in extra.as_object().into_iter().flatten() {
            obj["spec"][k] = v.clone();
        }
        Job.default(&mut obj);
        obj
    }

    #[test]
    fn policies_change_the_defaults_as_upstream() {
        let plain = job(json!({}));
        assert!(Job.validate(&plain).is_empty());
        assert_eq!(plain["spec"]["backoffLimit"], 6);
        assert_eq!(plain["spec"]["podReplacementPolicy"], "TerminatingOrFailed");
        let o = job(json!({
            "completionMode": "Indexed", "completions": 3, "backoffLimitPerIndex": 1,
            "podFailurePolicy": {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]}
        }));
        assert_eq!(o["spec"]["backoffLimit"], i64::from(i32::MAX));
        assert_eq!(o["spec"]["podReplacementPolicy"], "Failed");
        assert_eq!(
            o["spec"]["podFailurePolicy"]["rules"][0]["onPodConditions"][0]["status"],
            "True"
        );
        assert!(Job.validate(&o).is_empty(), "{:?}", Job.validate(&o));
    }

    #[test]
    fn completions_change_only_for_elastic_indexed_jobs() {
        let old = job(json!({"completions": 3}));
        let mut new = old.clone();
        new["spec"]["completions"] = json!(4);
        let shown = format!("{:?}", Job.validate_update(&old, &new));
        assert!(shown.contains("spec.completions"), "{shown}");
        let old = job(json!({"completionMode": "Indexed", "completions": 3, "parallelism": 3}));
        let mut new = old.clone();
        new["spec"]["completions"] = json!(4);
        new["spec"]["parallelism"] = json!(4);
        assert!(Job.validate_update(&old, &new).is_empty());
    }

    #[test]
    fn managed_by_and_completion_mode_are_immutable() {
        let old = job(json!({"managedBy": "example.com/other"}));
        let mut new = old.clone();
        new["spec"]["managedBy"] = json!("kubernetes.io/job-controller");
        let shown = format!("{:?}", Job.validate_update(&old, &new));
        assert!(shown.contains("spec.managedBy"), "{shown}");
        assert!(shown.contains("field is immutable"), "{shown}");
        assert!(Job.validate_update(&old, &old).is_empty());
    }
}
