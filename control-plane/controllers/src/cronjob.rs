//! CronJobs: Jobs created on a cron schedule, as upstream's
//! `pkg/controller/cronjob` (controllerv2).
//!
//! Each reconcile is [`plan`], a pure function of the CronJob, its Jobs
//! in the shared cache and the time, followed by the writes it names.
//! A Job's name carries its scheduled minute, so a restarted controller
//! that plans the same schedule again gets AlreadyExists: done once.
//! The reconcile returns a requeue at the next schedule time: the
//! controller runtime keeps one delay queue for all CronJobs.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::channel::mpsc;
use jiff::tz::TimeZone;
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, PropagationPolicy};
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use kube::{Api, ResourceExt};
use kube_util::cron;
use kube_util::events::{Recorder, Reporter};
use serde_json::json;

use crate::workload::{self, controller_owner, ApiResultExt, Result};
use crate::workload_claim::{controller_of, controller_ref};

/// The annotation a CronJob's Job carries: its scheduled time.
pub const SCHEDULED_TIMESTAMP: &str = "batch.kubernetes.io/cronjob-scheduled-timestamp";

struct State {
    client: kube::Client,
    jobs: Store<Job>,
    events: Recorder,
    clock: Clock,
}

/// Where the controller reads the time: the system clock, or in tests a
/// settable one, so schedules minutes apart run in milliseconds.
#[derive(Clone, Debug, Default)]
pub struct Clock(Option<Arc<AtomicI64>>);

impl Clock {
    /// A clock that stands at `at` until moved.
    pub fn manual(at: Timestamp) -> Clock {
        Clock(Some(Arc::new(AtomicI64::new(at.as_second()))))
    }

    /// Move a manual clock forward (no effect on the system clock).
    pub fn advance(&self, by: Duration) {
        if let Some(s) = &self.0 {
            let by = i64::try_from(by.as_secs()).unwrap_or(i64::MAX);
            s.fetch_add(by, Ordering::SeqCst);
        }
    }

    pub fn now(&self) -> Timestamp {
        match &self.0 {
            None => workload::now(),
            Some(s) => {
                Timestamp::from_second(s.load(Ordering::SeqCst)).unwrap_or_else(|_| workload::now())
            }
        }
    }
}

pub async fn run(ctx: crate::Ctx) -> Result<(), crate::Error> {
    run_with(ctx, Clock::default()).await
}

/// [`run`] reading the time from `clock`.
pub async fn run_with(ctx: crate::Ctx, clock: Clock) -> Result<(), crate::Error> {
    let client = ctx.client.clone();
    let (tx, rx) = mpsc::channel(1024);
    let cj_cache = ctx.informers.get::<CronJob>();
    let _cj_trigger = workload::trigger(&cj_cache, tx.clone(), |cj: &CronJob, _| {
        workload::itself(cj)
    });
    let job_cache = ctx.informers.get::<Job>();
    let _job_trigger = workload::trigger(&job_cache, tx, |job: &Job, _| {
        controller_owner::<CronJob>(&job.metadata)
    });
    workload::ready(&cj_cache).await?;
    workload::ready(&job_cache).await?;
    let state = Arc::new(State {
        events: Recorder::new(client.clone(), Reporter::new("cronjob-controller")),
        client,
        jobs: job_cache.store().clone(),
        clock,
    });
    workload::drive("cronjob", cj_cache.store().clone(), rx, state, reconcile).await;
    Ok(())
}

/// An event the plan asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
}

/// What one CronJob needs, decided from cached objects.
#[derive(Debug, Default)]
pub struct Plan {
    /// The new `status.active`.
    pub active: Vec<ObjectReference>,
    pub last_schedule: Option<Timestamp>,
    pub last_successful: Option<Timestamp>,
    /// Active Jobs to delete first (concurrencyPolicy Replace).
    pub replace: Vec<String>,
    /// The Job to create.
    pub create: Option<Job>,
    /// Finished Jobs beyond the history limits, oldest first.
    pub prune: Vec<String>,
    pub notes: Vec<Note>,
    /// When to look again: the next schedule time.
    pub requeue_at: Option<Timestamp>,
}

fn note(warning: bool, reason: &'static str, message: String) -> Note {
    Note {
        warning,
        reason,
        message,
    }
}

/// Whether a Job finished, and whether it succeeded.
fn finished(job: &Job) -> Option<bool> {
    let conds = job.status.as_ref()?.conditions.as_ref()?;
    conds
        .iter()
        .filter(|c| c.status == "True")
        .find_map(|c| match c.type_.as_str() {
            "Complete" => Some(true),
            "Failed" => Some(false),
            _ => None,
        })
}

fn job_ref(job: &Job) -> ObjectReference {
    ObjectReference {
        api_version: Some("batch/v1".into()),
        kind: Some("Job".into()),
        name: job.metadata.name.clone(),
        namespace: job.metadata.namespace.clone(),
        uid: job.metadata.uid.clone(),
        resource_version: job.metadata.resource_version.clone(),
        ..ObjectReference::default()
    }
}

/// upstream `getJobName`: the scheduled time in minutes since the epoch.
pub fn job_name(cj: &str, scheduled: Timestamp) -> String {
    format!("{cj}-{}", scheduled.as_second().div_euclid(60))
}

/// Decide what `cj` needs at `now`, given every Job of its namespace
/// (or any superset: only those it controls count).
pub fn plan(cj: &CronJob, jobs: &[Arc<Job>], now: Timestamp) -> Plan {
    let mut p = Plan::default();
    let uid = cj.metadata.uid.as_deref().unwrap_or_default();
    let spec = &cj.spec;
    let status = cj.status.clone().unwrap_or_default();
    p.last_schedule = status.last_schedule_time.as_ref().map(|t| t.0);
    p.last_successful = status.last_successful_time.as_ref().map(|t| t.0);
    let was_active: Vec<&str> = status
        .active
        .iter()
        .flatten()
        .filter_map(|r| r.uid.as_deref())
        .collect();
    let children: Vec<&Arc<Job>> = jobs
        .iter()
        .filter(|j| controller_of(&j.metadata).is_some_and(|r| r.uid == uid))
        .collect();
    let (mut succeeded, mut failed) = (Vec::new(), Vec::new());
    for j in &children {
        let name = j.name_any();
        let listed = j
            .metadata
            .uid
            .as_deref()
            .is_some_and(|u| was_active.contains(&u));
        match finished(j) {
            None => {
                if !listed {
                    p.notes.push(note(
                        true,
                        "UnexpectedJob",
                        format!("Saw a job that the controller did not create or forgot: {name}"),
                    ));
                }
                p.active.push(job_ref(j));
            }
            Some(ok) => {
                if listed {
                    let cond = if ok { "Complete" } else { "Failed" };
                    p.notes.push(note(
                        false,
                        "SawCompletedJob",
                        format!("Saw completed job: {name}, condition: {cond}"),
                    ));
                }
                if ok {
                    let done = j.status.as_ref().and_then(|s| s.completion_time.as_ref());
                    if let Some(t) = done {
                        if p.last_successful.is_none_or(|l| l < t.0) {
                            p.last_successful = Some(t.0);
                        }
                    }
                    succeeded.push(*j);
                } else {
                    failed.push(*j);
                }
            }
        }
    }
    prune(&mut p.prune, succeeded, spec.successful_jobs_history_limit);
    prune(&mut p.prune, failed, spec.failed_jobs_history_limit);

    if cj.metadata.deletion_timestamp.is_some() || spec.suspend == Some(true) {
        return p;
    }
    let tz = match spec.time_zone.as_deref() {
        None => TimeZone::UTC,
        Some(name) => match cron::time_zone(name) {
            Some(tz) => tz,
            None => {
                p.notes.push(note(
                    true,
                    "UnknownTimeZone",
                    format!("invalid timeZone: {name:?}"),
                ));
                return p;
            }
        },
    };
    let schedule = match cron::parse(&spec.schedule) {
        Ok(s) => s,
        Err(e) => {
            p.notes.push(note(
                true,
                "InvalidSchedule",
                format!("invalid schedule: {}: {e}", spec.schedule),
            ));
            return p;
        }
    };
    let created = cj.metadata.creation_timestamp.as_ref().map_or(now, |t| t.0);
    let mut earliest = p.last_schedule.unwrap_or(created);
    if let Some(sds) = spec.starting_deadline_seconds {
        if let Ok(bound) = now.checked_sub(jiff::SignedDuration::from_secs(sds)) {
            earliest = earliest.max(bound);
        }
    }
    let missed = cron::missed(&schedule, &tz, earliest, now);
    p.requeue_at = missed.next;
    if missed.count > cron::TOO_MANY_MISSED {
        p.notes.push(note(
            true,
            "TooManyMissedTimes",
            "too many missed start times. Set or decrease .spec.startingDeadlineSeconds or check clock skew".into(),
        ));
    }
    let Some(scheduled) = missed.most_recent else {
        return p;
    };
    if let Some(sds) = spec.starting_deadline_seconds {
        if scheduled.as_second().saturating_add(sds) < now.as_second() {
            p.notes.push(note(
                true,
                "MissSchedule",
                format!("Missed scheduled time to start a job: {scheduled}"),
            ));
            return p;
        }
    }
    let name = job_name(&cj.name_any(), scheduled);
    if children
        .iter()
        .any(|j| j.metadata.name.as_deref() == Some(&name))
    {
        // Its Job exists, so this schedule ran, whatever a stale cached
        // status says: never write lastScheduleTime back.
        p.last_schedule = p.last_schedule.max(Some(scheduled));
        return p;
    }
    match spec.concurrency_policy.as_deref() {
        Some("Forbid") if !p.active.is_empty() => {
            p.notes.push(note(
                false,
                "JobAlreadyActive",
                "Not starting job because prior execution is running and concurrency policy is Forbid".into(),
            ));
            return p;
        }
        Some("Replace") => {
            p.replace = p.active.drain(..).filter_map(|r| r.name).collect();
        }
        _ => {}
    }
    p.create = Some(job_from_template(cj, &name, scheduled, &tz));
    p.last_schedule = Some(scheduled);
    p
}

/// One scheduling pass over every CronJob: each one's [`plan`] given the
/// Jobs it controls (grouped once by owner uid, so a pass is linear in
/// the objects).
pub fn pass(cronjobs: &[Arc<CronJob>], jobs: &[Arc<Job>], now: Timestamp) -> Vec<Plan> {
    let mut by_owner: std::collections::HashMap<&str, Vec<Arc<Job>>> =
        std::collections::HashMap::new();
    for j in jobs {
        if let Some(r) = controller_of(&j.metadata) {
            by_owner.entry(r.uid.as_str()).or_default().push(j.clone());
        }
    }
    cronjobs
        .iter()
        .map(|cj| {
            let uid = cj.metadata.uid.as_deref().unwrap_or_default();
            let children = by_owner.get(uid).map_or(&[][..], Vec::as_slice);
            plan(cj, children, now)
        })
        .collect()
}

/// Finished Jobs beyond `limit`, oldest start first (upstream sorts by
/// startTime, Jobs without one first).
fn prune(out: &mut Vec<String>, mut jobs: Vec<&Arc<Job>>, limit: Option<i32>) {
    let Some(limit) = limit.and_then(|l| usize::try_from(l).ok()) else {
        return;
    };
    if jobs.len() <= limit {
        return;
    }
    jobs.sort_by_key(|j| {
        (
            j.status
                .as_ref()
                .and_then(|s| s.start_time.as_ref())
                .map(|t| t.0),
            j.name_any(),
        )
    });
    let excess = jobs.len() - limit;
    out.extend(jobs.into_iter().take(excess).map(|j| j.name_any()));
}

/// upstream `getJobFromTemplate2`.
fn job_from_template(cj: &CronJob, name: &str, scheduled: Timestamp, tz: &TimeZone) -> Job {
    let tmpl = &cj.spec.job_template;
    let tmeta = tmpl.metadata.clone().unwrap_or_default();
    let mut annotations = tmeta.annotations.unwrap_or_default();
    annotations.insert(
        SCHEDULED_TIMESTAMP.into(),
        scheduled
            .to_zoned(tz.clone())
            .strftime("%Y-%m-%dT%H:%M:%S%:z")
            .to_string(),
    );
    Job {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: cj.metadata.namespace.clone(),
            labels: tmeta.labels,
            annotations: Some(annotations),
            owner_references: Some(vec![controller_ref(cj)]),
            ..ObjectMeta::default()
        },
        spec: Some(tmpl.spec.clone().unwrap_or_default()),
        status: None,
    }
}

async fn reconcile(cj: Arc<CronJob>, st: Arc<State>) -> Result<Action> {
    let ns = cj.namespace().unwrap_or_default();
    let jobs: Vec<Arc<Job>> = st
        .jobs
        .state()
        .into_iter()
        .filter(|j| j.metadata.namespace.as_deref() == Some(ns.as_str()))
        .collect();
    let now = st.clock.now();
    let p = plan(&cj, &jobs, now);
    act(&cj, p, now, &st).await
}

async fn act(cj: &CronJob, mut p: Plan, now: Timestamp, st: &State) -> Result<Action> {
    let ns = cj.namespace().unwrap_or_default();
    let jobs: Api<Job> = Api::namespaced(st.client.clone(), &ns);
    for n in std::mem::take(&mut p.notes) {
        if n.warning {
            st.events.warning(cj, n.reason, n.message);
        } else {
            st.events.normal(cj, n.reason, n.message);
        }
    }
    let background = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        ..DeleteParams::default()
    };
    for name in p.replace.iter().chain(&p.prune) {
        match jobs.delete(name, &background).await {
            Ok(_) => st
                .events
                .normal(cj, "SuccessfulDelete", format!("Deleted job {name}")),
            Err(e) if workload::is_not_found(&e) => {}
            Err(e) => return Err(e).ctx(|| format!("delete job {ns}/{name}")),
        }
    }
    if let Some(job) = p.create.take() {
        let name = job.name_any();
        match jobs.create(&PostParams::default(), &job).await {
            Ok(made) => {
                st.events
                    .normal(cj, "SuccessfulCreate", format!("Created job {name}"));
                p.active.push(job_ref(&made));
            }
            // Made before a restart: this schedule is done.
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) if workload::is_namespace_terminating(&e) => return Ok(Action::await_change()),
            Err(e) => {
                st.events
                    .warning(cj, "FailedCreate", format!("Error creating job: {e}"));
                return Err(e).ctx(|| format!("create job {ns}/{name}"));
            }
        }
    }
    let old = cj.status.clone().unwrap_or_default();
    let time = |t: Option<Timestamp>| t.map(Time);
    let active = (!p.active.is_empty()).then_some(p.active);
    if old.active != active
        || old.last_schedule_time != time(p.last_schedule)
        || old.last_successful_time != time(p.last_successful)
    {
        let patch = json!({"status": {
            "active": active,
            "lastScheduleTime": time(p.last_schedule),
            "lastSuccessfulTime": time(p.last_successful),
        }});
        Api::<CronJob>::namespaced(st.client.clone(), &ns)
            .patch_status(
                &cj.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .ctx(|| format!("update cronjob {ns}/{} status", cj.name_any()))?;
    }
    Ok(match p.requeue_at {
        Some(at) => {
            let secs = (at.as_second() - now.as_second()).max(0) as u64;
            // A second past the minute so the schedule time has come.
            Action::requeue(Duration::from_secs(secs + 1))
        }
        None => Action::await_change(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::batch::v1::{
        CronJobSpec, CronJobStatus, JobCondition, JobStatus, JobTemplateSpec,
    };

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn cj(schedule: &str, policy: &str) -> CronJob {
        CronJob {
            metadata: ObjectMeta {
                name: Some("c".into()),
                namespace: Some("ns".into()),
                uid: Some("u1".into()),
                creation_timestamp: Some(Time(ts("2026-12-04T10:00:30Z"))),
                ..ObjectMeta::default()
            },
            spec: CronJobSpec {
                schedule: schedule.into(),
                concurrency_policy: Some(policy.into()),
                successful_jobs_history_limit: Some(1),
                failed_jobs_history_limit: Some(1),
                job_template: JobTemplateSpec::default(),
                ..CronJobSpec::default()
            },
            status: None,
        }
    }

    fn child(cj: &CronJob, name: &str, state: Option<&str>, start: &str) -> Arc<Job> {
        let conditions = state.map(|s| {
            vec![JobCondition {
                type_: s.into(),
                status: "True".into(),
                ..JobCondition::default()
            }]
        });
        Arc::new(Job {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                uid: Some(format!("uid-{name}")),
                owner_references: Some(vec![controller_ref(cj)]),
                ..ObjectMeta::default()
            },
            spec: None,
            status: Some(JobStatus {
                conditions,
                start_time: Some(Time(ts(start))),
                completion_time: state.map(|_| Time(ts(start))),
                ..JobStatus::default()
            }),
        })
    }

    #[test]
    fn creates_most_recent_schedule_once() {
        let c = cj("*/5 * * * *", "Allow");
        let p = plan(&c, &[], ts("2026-12-04T10:11:00Z"));
        let job = p.create.expect("a job");
        assert_eq!(job.name_any(), job_name("c", ts("2026-12-04T10:10:00Z")));
        assert_eq!(
            job.annotations()[SCHEDULED_TIMESTAMP],
            "2026-12-04T10:10:00+00:00"
        );
        assert_eq!(p.last_schedule, Some(ts("2026-12-04T10:10:00Z")));
        assert_eq!(p.requeue_at, Some(ts("2026-12-04T10:15:00Z")));
        // The Job exists (a restart before status was written): no second.
        let made = child(&c, &job.name_any(), None, "2026-12-04T10:10:01Z");
        let p = plan(&c, &[made], ts("2026-12-04T10:11:00Z"));
        assert!(p.create.is_none());
        assert_eq!(p.active.len(), 1);
        assert_eq!(p.notes[0].reason, "UnexpectedJob");
        assert_eq!(p.last_schedule, Some(ts("2026-12-04T10:10:00Z")));
    }

    #[test]
    fn concurrency_policies() {
        let mut c = cj("*/5 * * * *", "Forbid");
        let running = child(&c, "c-1", None, "2026-12-04T10:05:00Z");
        c.status = Some(CronJobStatus {
            active: Some(vec![job_ref(&running)]),
            last_schedule_time: Some(Time(ts("2026-12-04T10:05:00Z"))),
            ..CronJobStatus::default()
        });
        let p = plan(
            &c,
            std::slice::from_ref(&running),
            ts("2026-12-04T10:10:30Z"),
        );
        assert!(p.create.is_none());
        assert_eq!(p.notes[0].reason, "JobAlreadyActive");
        c.spec.concurrency_policy = Some("Replace".into());
        let p = plan(&c, &[running], ts("2026-12-04T10:10:30Z"));
        assert_eq!(p.replace, vec!["c-1".to_string()]);
        assert!(p.create.is_some());
        assert_eq!(p.active.len(), 0);
    }

    #[test]
    fn history_suspend_deadline() {
        let mut c = cj("*/5 * * * *", "Allow");
        let jobs = vec![
            child(&c, "c-2", Some("Complete"), "2026-12-04T10:02:00Z"),
            child(&c, "c-1", Some("Complete"), "2026-12-04T10:01:00Z"),
            child(&c, "c-3", Some("Failed"), "2026-12-04T10:03:00Z"),
        ];
        c.spec.suspend = Some(true);
        let p = plan(&c, &jobs, ts("2026-12-04T10:11:00Z"));
        assert_eq!(p.prune, vec!["c-1".to_string()]);
        assert!(p.create.is_none());
        assert_eq!(p.last_successful, Some(ts("2026-12-04T10:02:00Z")));
        // A deadline shorter than the time since the last schedule: none.
        let spec = &mut c.spec;
        spec.suspend = Some(false);
        spec.starting_deadline_seconds = Some(30);
        let p = plan(&c, &[], ts("2026-12-04T10:11:00Z"));
        assert!(p.create.is_none());
        assert_eq!(p.requeue_at, Some(ts("2026-12-04T10:15:00Z")));
    }

    #[test]
    fn too_many_missed() {
        let mut c = cj("* * * * *", "Allow");
        c.metadata.creation_timestamp = Some(Time(ts("2026-12-01T00:00:00Z")));
        let p = plan(&c, &[], ts("2026-12-04T10:11:30Z"));
        assert!(p.notes.iter().any(|n| n.reason == "TooManyMissedTimes"));
        assert_eq!(p.last_schedule, Some(ts("2026-12-04T10:11:00Z")));
    }
}
