//! CronJobs (`batch/v1`): defaults, validation of the schedule and time
//! zone, and the `kubectl get cronjobs` columns, as upstream's
//! `pkg/registry/batch/cronjob` and `pkg/apis/batch/validation`.
//!
//! The schedule is parsed by [`kube_util::cron`], the parser the cronjob
//! controller schedules with, so what is accepted here is what runs.

use serde_json::{json, Map, Value};

use super::job::Job;
use super::Strategy;
use crate::apiserver::defaults::{obj_field, set};
use crate::apiserver::status::Cause;
use crate::apiserver::table::{
    age_cell, name_cell, since, template_cells, Col, AGE, NAME, TEMPLATE,
};

pub struct CronJob;

/// Job names are the CronJob's plus `-` and up to 10 digits of scheduled
/// minutes (upstream's validation: 63 - 11).
const MAX_NAME: usize = 52;

impl Strategy for CronJob {
    fn default(&self, obj: &mut Value) {
        let spec = obj_field(obj, "spec");
        set(spec, "concurrencyPolicy", json!("Allow"));
        set(spec, "suspend", json!(false));
        set(spec, "successfulJobsHistoryLimit", json!(3));
        set(spec, "failedJobsHistoryLimit", json!(1));
        // Upstream defaults the template's Job spec as a Job's, so
        // `kubectl get cronjob -o yaml` shows what its Jobs will get.
        let mut job = json!({"spec": spec.get("jobTemplate").and_then(|t| t.get("spec")).cloned().unwrap_or(json!({}))});
        Job.default(&mut job);
        let tmpl = spec
            .entry("jobTemplate")
            .or_insert_with(|| Value::Object(Map::new()));
        if tmpl.is_object() {
            tmpl["spec"] = job["spec"].take();
        }
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        let spec = &obj["spec"];
        if let Some(name) = obj["metadata"]["name"].as_str() {
            if name.len() > MAX_NAME {
                c.push(Cause::invalid(
                    "metadata.name",
                    name,
                    "must be no more than 52 characters",
                ));
            }
        }
        match spec["schedule"].as_str() {
            None | Some("") => c.push(Cause::required("spec.schedule")),
            Some(s) => {
                if let Err(e) = kube_util::cron::parse(s) {
                    c.push(Cause::invalid("spec.schedule", s, &e.to_string()));
                }
            }
        }
        if let Some(tz) = spec.get("timeZone").filter(|v| !v.is_null()) {
            match tz.as_str() {
                Some(name) if is_time_zone(name) => {}
                Some(name) => c.push(Cause::invalid(
                    "spec.timeZone",
                    name,
                    &format!("unknown time zone {name}"),
                )),
                None => c.push(Cause::invalid(
                    "spec.timeZone",
                    &tz.to_string(),
                    "must be a string",
                )),
            }
        }
        match spec["concurrencyPolicy"].as_str() {
            Some("Allow" | "Forbid" | "Replace") => {}
            Some(p) => c.push(Cause::not_supported(
                "spec.concurrencyPolicy",
                p,
                &["Allow", "Forbid", "Replace"],
            )),
            None => c.push(Cause::required("spec.concurrencyPolicy")),
        }
        for f in [
            "startingDeadlineSeconds",
            "successfulJobsHistoryLimit",
            "failedJobsHistoryLimit",
        ] {
            if let Some(n) = spec[f].as_i64() {
                if n < 0 {
                    c.push(Cause::invalid(
                        format!("spec.{f}"),
                        &n.to_string(),
                        "must be greater than or equal to 0",
                    ));
                }
            }
        }
        // The template validates as the Job it becomes (its selector is
        // generated on each Job's create).
        let job = json!({
            "metadata": spec["jobTemplate"]["metadata"],
            "spec": spec["jobTemplate"]["spec"],
        });
        for mut cause in Job.validate(&job) {
            if let Some(rest) = cause.field.strip_prefix("spec.") {
                cause.field = format!("spec.jobTemplate.spec.{rest}");
            }
            c.push(cause);
        }
        c
    }

    fn columns(&self) -> Vec<Col> {
        let mut cols = vec![
            NAME,
            ("Schedule", "string", 0, "The schedule in Cron format, see https://en.wikipedia.org/wiki/Cron."),
            ("Timezone", "string", 0, "The time zone name for the given schedule, see https://en.wikipedia.org/wiki/List_of_tz_database_time_zones."),
            ("Suspend", "boolean", 0, "This flag tells the controller to suspend subsequent executions."),
            ("Active", "integer", 0, "A list of pointers to currently running jobs."),
            ("Last Schedule", "string", 0, "Information when was the last time the job was successfully scheduled."),
            AGE,
        ];
        cols.extend(TEMPLATE);
        cols
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let (spec, st) = (&obj["spec"], &obj["status"]);
        let last = st["lastScheduleTime"]
            .as_str()
            .map_or_else(|| "<none>".to_string(), since);
        let tz = spec["timeZone"].as_str().unwrap_or("<none>");
        let active = st["active"].as_array().map_or(0, Vec::len);
        let mut cells = vec![
            name_cell(obj),
            json!(spec["schedule"].as_str().unwrap_or_default()),
            json!(tz),
            json!(spec["suspend"].as_bool().unwrap_or(false)),
            json!(active),
            json!(last),
            age_cell(obj),
        ];
        cells.extend(template_cells(
            &json!({"spec": spec["jobTemplate"]["spec"]}),
        ));
        cells
    }
}

/// An IANA name jiff's database knows; upstream also refuses `Local`,
/// which would depend on the server's machine.
fn is_time_zone(name: &str) -> bool {
    !name.is_empty() && name != "Local" && kube_util::cron::time_zone(name).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cj(schedule: &str) -> Value {
        let mut o = json!({
            "metadata": {"name": "c"},
            "spec": {"schedule": schedule, "jobTemplate": {"spec": {"template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "c", "image": "busybox"}]}}}}}
        });
        CronJob.default(&mut o);
        o
    }

    fn fields(o: &Value) -> Vec<(String, String)> {
        CronJob
            .validate(o)
            .into_iter()
            .map(|c| (c.field, c.message))
            .collect()
    }

    #[test]
    fn defaults_and_valid() {
        let o = cj("*/5 * * * *");
        assert_eq!(o["spec"]["concurrencyPolicy"], "Allow");
        assert_eq!(o["spec"]["successfulJobsHistoryLimit"], 3);
        assert_eq!(o["spec"]["failedJobsHistoryLimit"], 1);
        assert_eq!(o["spec"]["jobTemplate"]["spec"]["backoffLimit"], 6);
        assert!(fields(&o).is_empty(), "{:?}", fields(&o));
    }

    #[test]
    fn refuses_bad_schedule_zone_and_limits() {
        let o = cj("TZ=UTC * * * * *");
        let f = fields(&o);
        assert_eq!(f[0].0, "spec.schedule");
        assert!(f[0]
            .1
            .contains("cannot use TZ or CRON_TZ in schedule, use timeZone field instead"));
        let mut o = cj("* * * * *");
        o["spec"]["timeZone"] = json!("Nowhere/Land");
        o["spec"]["failedJobsHistoryLimit"] = json!(-1);
        o["spec"]["concurrencyPolicy"] = json!("Sometimes");
        o["metadata"]["name"] = json!("x".repeat(53));
        let f: Vec<String> = fields(&o).into_iter().map(|x| x.0).collect();
        for want in [
            "spec.timeZone",
            "spec.failedJobsHistoryLimit",
            "spec.concurrencyPolicy",
            "metadata.name",
        ] {
            assert!(f.iter().any(|x| x == want), "{want} in {f:?}");
        }
        let mut o = cj("0 0 * * *");
        o["spec"]["timeZone"] = json!("Europe/Berlin");
        assert!(fields(&o).is_empty());
    }
}
