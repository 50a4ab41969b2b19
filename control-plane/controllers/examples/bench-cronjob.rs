//! Benchmark of the cronjob controller's decisions: the CPU time of one
//! scheduling pass ([`skiff_controllers::cronjob::pass`]) over 1,000
//! CronJobs and their Jobs, against the raw cost of computing the next
//! schedule time of 1,000 schedules. Prints figures; asserts nothing.
//!
//! Run: `cargo run --release -p skiff-controllers --example bench-cronjob`

use std::sync::Arc;

use jiff::tz::TimeZone;
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::{
    CronJob, CronJobSpec, CronJobStatus, Job, JobCondition, JobStatus,
};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use skiff_controllers::cronjob;

const N: usize = 1000;
const PASSES: u32 = 20;
const SCHEDULES: [&str; 5] = [
    "*/5 * * * *",
    "0 * * * *",
    "@daily",
    "0 9 * * MON-FRI",
    "15 2 1,15 * SUN",
];
const ZONES: [Option<&str>; 3] = [None, Some("Europe/Berlin"), Some("America/New_York")];

/// CPU time of this (single-threaded) process's main thread, from the
/// scheduler's own accounting, in nanoseconds.
fn cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn job(name: &str, owner: &str, finished: bool, start: Timestamp) -> Arc<Job> {
    Arc::new(Job {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("bench".into()),
            uid: Some(format!("uid-{name}")),
            owner_references: Some(vec![OwnerReference {
                api_version: "batch/v1".into(),
                kind: "CronJob".into(),
                name: owner.into(),
                uid: format!("uid-{owner}"),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        },
        spec: None,
        status: Some(JobStatus {
            start_time: Some(Time(start)),
            completion_time: finished.then_some(Time(start)),
            conditions: finished.then(|| {
                vec![JobCondition {
                    type_: "Complete".into(),
                    status: "True".into(),
                    ..JobCondition::default()
                }]
            }),
            ..JobStatus::default()
        }),
    })
}

fn main() {
    let now = Timestamp::now();
    let hour_ago = now - jiff::SignedDuration::from_hours(1);
    let mut cjs = Vec::with_capacity(N);
    let mut jobs = Vec::with_capacity(N * 4);
    for i in 0..N {
        let name = format!("cj-{i}");
        // Four finished Jobs (one past the history limit) and one running.
        for k in 0..4 {
            jobs.push(job(&format!("{name}-{k}"), &name, true, hour_ago));
        }
        let running = job(&format!("{name}-run"), &name, false, hour_ago);
        let active = ObjectReference {
            name: running.metadata.name.clone(),
            uid: running.metadata.uid.clone(),
            ..ObjectReference::default()
        };
        jobs.push(running);
        cjs.push(Arc::new(CronJob {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some("bench".into()),
                uid: Some(format!("uid-{name}")),
                creation_timestamp: Some(Time(hour_ago)),
                ..ObjectMeta::default()
            },
            spec: CronJobSpec {
                schedule: SCHEDULES[i % SCHEDULES.len()].into(),
                time_zone: ZONES[i % ZONES.len()].map(String::from),
                concurrency_policy: Some(["Allow", "Forbid", "Replace"][i % 3].into()),
                successful_jobs_history_limit: Some(3),
                failed_jobs_history_limit: Some(1),
                ..CronJobSpec::default()
            },
            status: Some(CronJobStatus {
                active: Some(vec![active]),
                last_schedule_time: Some(Time(hour_ago)),
                ..CronJobStatus::default()
            }),
        }));
    }

    let mut creates = 0;
    let start = cpu_ns();
    for _ in 0..PASSES {
        let plans = cronjob::pass(&cjs, &jobs, now);
        creates = plans.iter().filter(|p| p.create.is_some()).count();
    }
    let pass_ms = (cpu_ns() - start) as f64 / 1e6 / f64::from(PASSES);

    let parsed: Vec<(kube_util::cron::Schedule, TimeZone)> = (0..N)
        .filter_map(|i| {
            let s = kube_util::cron::parse(SCHEDULES[i % SCHEDULES.len()]).ok()?;
            let tz = ZONES[i % ZONES.len()]
                .and_then(kube_util::cron::time_zone)
                .unwrap_or(TimeZone::UTC);
            Some((s, tz))
        })
        .collect();
    let mut found = 0;
    let start = cpu_ns();
    for _ in 0..PASSES {
        found = parsed
            .iter()
            .filter(|(s, tz)| s.next_after(now, tz).is_some())
            .count();
    }
    let raw_ms = (cpu_ns() - start) as f64 / 1e6 / f64::from(PASSES);

    println!(
        "cronjob pass: {N} cronjobs, {} jobs, {creates} creates planned",
        jobs.len()
    );
    println!(
        "cronjob pass: {N} cronjobs, {pass_ms:.2} ms CPU per pass (aim <= 100), raw next-time: {raw_ms:.2} ms ({found} found), ratio {:.1}",
        pass_ms / raw_ms.max(1e-9)
    );
}
