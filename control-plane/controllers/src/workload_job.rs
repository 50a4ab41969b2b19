//! How the Job controller counts its pods and words its conditions
//! (upstream `pkg/controller/job` tracking utilities): the
//! `batch.kubernetes.io/job-tracking` finalizer, the uids of finished pods
//! in `status.uncountedTerminatedPods` until their finalizer is off, and
//! which pods count as failed.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use k8s_openapi::api::batch::v1::{Job, JobCondition, JobStatus, UncountedTerminatedPods};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::pods;
use crate::workload::{is_not_found, ApiResultExt, Result};

/// The finalizer that keeps a Job's pod until the Job has counted it.
pub const TRACKING_FINALIZER: &str = "batch.kubernetes.io/job-tracking";

/// Whether the pod still waits to be counted.
pub fn has_finalizer(p: &Pod) -> bool {
    p.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == TRACKING_FINALIZER)
}

/// Take the tracking finalizer off `pod` (gone already is fine).
///
/// # Errors
/// The patch fails.
pub async fn remove_finalizer(api: &Api<Pod>, pod: &Pod) -> Result<()> {
    let patch = json!({"metadata": {"$deleteFromPrimitiveList/finalizers": [TRACKING_FINALIZER]}});
    match api
        .patch(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(e).ctx(|| {
            format!(
                "removing the job-tracking finalizer of pod {}",
                pod.name_any()
            )
        }),
    }
}

/// Pending finalizer removals per Job: uids sent, not yet seen gone.
#[derive(Default)]
pub struct Removing(Mutex<HashMap<String, HashSet<String>>>);

impl Removing {
    pub fn lock(&self) -> MutexGuard<'_, HashMap<String, HashSet<String>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
    pub fn expect(&self, key: &str, uid: &str) {
        self.lock()
            .entry(key.into())
            .or_default()
            .insert(uid.into());
    }
    pub fn observe(&self, key: &str, pod: &Pod, exists: bool) {
        if !exists || !has_finalizer(pod) {
            if let (Some(set), Some(uid)) = (self.lock().get_mut(key), pod.metadata.uid.as_ref()) {
                set.remove(uid);
            }
        }
    }
    pub fn pending(&self, key: &str, pods: &[Arc<Pod>]) -> HashSet<String> {
        let mut m = self.lock();
        let Some(set) = m.get_mut(key) else {
            return HashSet::new();
        };
        // What the cache already shows settles it.
        let tracked: HashSet<&str> = pods
            .iter()
            .filter(|p| has_finalizer(p))
            .filter_map(|p| p.metadata.uid.as_deref())
            .collect();
        set.retain(|uid| tracked.contains(uid.as_str()));
        set.clone()
    }
    /// A removal that failed: nothing to wait for.
    pub fn cancel(&self, key: &str, uid: &str) {
        if let Some(set) = self.lock().get_mut(key) {
            set.remove(uid);
        }
    }
    pub fn forget(&self, key: &str) {
        self.lock().remove(key);
    }
}

pub fn condition<'a>(job: &'a Job, type_: &str) -> Option<&'a JobCondition> {
    job.status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == type_ && c.status == "True")
}

/// When the Job finished (Complete or Failed), if it has.
pub fn finished(job: &Job) -> Option<jiff::Timestamp> {
    ["Complete", "Failed"].iter().find_map(|t| {
        condition(job, t).map(|c| {
            c.last_transition_time
                .as_ref()
                .map(|t| t.0)
                .unwrap_or(jiff::Timestamp::UNIX_EPOCH)
        })
    })
}

pub fn new_condition(
    type_: &str,
    reason: &str,
    message: &str,
    now: jiff::Timestamp,
) -> JobCondition {
    JobCondition {
        type_: type_.into(),
        status: "True".into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_probe_time: Some(Time(now)),
        last_transition_time: Some(Time(now)),
    }
}

/// Set condition `type_` to `status` (adding it if missing). Returns
/// whether it changed.
pub fn ensure_condition(
    s: &mut JobStatus,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    now: jiff::Timestamp,
) -> bool {
    let conds = s.conditions.get_or_insert_with(Vec::new);
    match conds.iter_mut().find(|c| c.type_ == type_) {
        Some(c) if c.status == status => false,
        Some(c) => {
            *c = JobCondition {
                status: status.into(),
                ..new_condition(type_, reason, message, now)
            };
            true
        }
        None if status == "False" => false,
        None => {
            conds.push(new_condition(type_, reason, message, now));
            true
        }
    }
}

/// A pod the Job counts as failed: Failed, or deleted before it succeeded
/// (so that pods lost with their node still count), unless a pod failure
/// policy must judge how it failed or `podReplacementPolicy: Failed` waits
/// for it to fail (upstream `isPodFailed`).
pub fn is_failed(job: &Job, p: &Pod) -> bool {
    if pods::phase(p) == "Failed" {
        return true;
    }
    let only_failed = job.spec.as_ref().is_some_and(|s| {
        s.pod_failure_policy.is_some() || s.pod_replacement_policy.as_deref() == Some("Failed")
    });
    !only_failed && p.metadata.deletion_timestamp.is_some() && pods::phase(p) != "Succeeded"
}

/// With restartPolicy OnFailure pods do not fail, their containers
/// restart: the restarts count against backoffLimit.
pub fn past_backoff_on_failure(job: &Job, pods: &[Arc<Pod>], limit: i32) -> bool {
    let on_failure = job
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.restart_policy.as_deref())
        == Some("OnFailure");
    if !on_failure {
        return false;
    }
    let restarts: i32 = pods
        .iter()
        .filter(|p| matches!(pods::phase(p), "Running" | "Pending"))
        .filter_map(|p| p.status.as_ref())
        .flat_map(|s| {
            s.container_statuses
                .iter()
                .flatten()
                .chain(s.init_container_statuses.iter().flatten())
        })
        .map(|c| c.restart_count)
        .sum();
    if limit == 0 {
        restarts > 0
    } else {
        restarts >= limit
    }
}

/// Move uncounted uids whose pods no longer carry the finalizer into the
/// counters. Returns whether anything moved.
pub fn count_uncounted(
    status: &mut JobStatus,
    ok: &mut Vec<String>,
    failed: &mut Vec<String>,
    with_finalizer: &HashSet<String>,
) -> bool {
    let (ok_before, failed_before) = (ok.len(), failed.len());
    ok.retain(|u| with_finalizer.contains(u));
    failed.retain(|u| with_finalizer.contains(u));
    let (dok, dfailed) = (
        (ok_before - ok.len()) as i32,
        (failed_before - failed.len()) as i32,
    );
    if dok > 0 {
        status.succeeded = Some(status.succeeded.unwrap_or(0) + dok);
    }
    if dfailed > 0 {
        status.failed = Some(status.failed.unwrap_or(0) + dfailed);
    }
    dok + dfailed > 0
}

pub fn set_uncounted(status: &mut JobStatus, ok: &[String], failed: &[String]) {
    status.uncounted_terminated_pods = Some(UncountedTerminatedPods {
        succeeded: (!ok.is_empty()).then(|| ok.to_vec()),
        failed: (!failed.is_empty()).then(|| failed.to_vec()),
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uncounted_pods_move_to_counters_once_released() {
        let mut s = JobStatus::default();
        let mut ok = vec!["a".to_string(), "b".to_string()];
        let mut failed = vec!["c".to_string()];
        let still: HashSet<String> = ["b".to_string()].into();
        assert!(count_uncounted(&mut s, &mut ok, &mut failed, &still));
        assert_eq!((s.succeeded, s.failed), (Some(1), Some(1)));
        assert_eq!(ok, ["b"]);
        assert!(failed.is_empty());
        // Nothing released: nothing moves, so nothing is counted twice.
        assert!(!count_uncounted(&mut s, &mut ok, &mut failed, &still));
    }

    #[test]
    fn conditions_change_only_on_status_change() {
        let now = jiff::Timestamp::from_second(100).unwrap();
        let mut s = JobStatus::default();
        assert!(!ensure_condition(
            &mut s,
            "Suspended",
            "False",
            "JobResumed",
            "Job resumed",
            now
        ));
        assert!(ensure_condition(
            &mut s,
            "Suspended",
            "True",
            "JobSuspended",
            "Job suspended",
            now
        ));
        assert!(!ensure_condition(
            &mut s,
            "Suspended",
            "True",
            "JobSuspended",
            "Job suspended",
            now
        ));
        assert!(ensure_condition(
            &mut s,
            "Suspended",
            "False",
            "JobResumed",
            "Job resumed",
            now
        ));
    }
}
