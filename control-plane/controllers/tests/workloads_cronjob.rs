//! The cronjob controller through the API server, on a test clock the
//! test moves a minute at a time; the job controller does not run: the
//! test finishes Jobs by writing their status, as it would.

use crate::workloads_support;

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use skiff_controllers::cronjob::{job_name, Clock};
use workloads_support::{until, CronJobController, Env};

const MINUTE: Duration = Duration::from_secs(60);

/// A test clock ten seconds into the minute after the CronJobs are made
/// (so their first schedule is that minute), and that minute.
fn clock() -> (Clock, Timestamp) {
    let now = Timestamp::now().as_second();
    let first = Timestamp::from_second(now - now.rem_euclid(60) + 60).unwrap();
    let at = Timestamp::from_second(first.as_second() + 10).unwrap();
    (Clock::manual(at), first)
}

fn minute(t: Timestamp, n: i64) -> Timestamp {
    Timestamp::from_second(t.as_second() + 60 * n).unwrap()
}

async fn create(env: &Env, name: &str, spec: serde_json::Value) {
    let mut spec = spec;
    spec["schedule"] = json!("*/1 * * * *");
    spec["jobTemplate"] = json!({"spec": {"template": {"spec": {
        "restartPolicy": "Never",
        "containers": [{"name": "c", "image": "busybox"}],
    }}}});
    let cj: CronJob = serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "CronJob",
        "metadata": {"name": name}, "spec": spec,
    }))
    .unwrap();
    Api::<CronJob>::default_namespaced(env.client.clone())
        .create(&PostParams::default(), &cj)
        .await
        .unwrap();
}

/// Make the controller look at `name` again (after the clock moved).
async fn touch(env: &Env, name: &str) {
    let patch = json!({"metadata": {"annotations": {"test/touch": Timestamp::now().to_string()}}});
    Api::<CronJob>::default_namespaced(env.client.clone())
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// Names of the Jobs `cj` made that are not being deleted, sorted.
async fn jobs(env: &Env, cj: &str) -> Vec<String> {
    let mut v: Vec<String> = Api::<Job>::default_namespaced(env.client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|j| j.metadata.deletion_timestamp.is_none())
        .filter(|j| j.owner_references().iter().any(|r| r.name == cj))
        .map(|j| j.name_any())
        .collect();
    v.sort();
    v
}

async fn wait_jobs(env: &Env, cj: &str, want: &[String]) {
    until(&format!("jobs {want:?}"), 10, || async {
        let got = jobs(env, cj).await;
        (got == want).then_some(()).ok_or(format!("{got:?}"))
    })
    .await;
}

/// As the job controller: `name` finished, Complete or Failed, having
/// started at `start`.
async fn finish(env: &Env, name: &str, ok: bool, start: Timestamp) {
    let now = Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let start = start.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let cond = |t: &str| json!({"type": t, "status": "True", "lastTransitionTime": now});
    let status = if ok {
        json!({"startTime": start, "completionTime": now, "succeeded": 1,
               "conditions": [cond("SuccessCriteriaMet"), cond("Complete")]})
    } else {
        json!({"startTime": start, "failed": 1,
               "conditions": [cond("FailureTarget"), cond("Failed")]})
    };
    Api::<Job>::default_namespaced(env.client.clone())
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": status})),
        )
        .await
        .unwrap_or_else(|e| panic!("finishing job {name}: {e}"));
}

async fn last_schedule(env: &Env, cj: &str) -> Option<Timestamp> {
    let cj = Api::<CronJob>::default_namespaced(env.client.clone())
        .get(cj)
        .await
        .unwrap();
    cj.status?.last_schedule_time.map(|t| t.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forbid_skips_while_a_job_runs() {
    let env = Env::start(&[]).await;
    let (clock, t0) = clock();
    let ctl = CronJobController::start(&env, clock.clone()).await;
    create(&env, "f", json!({"concurrencyPolicy": "Forbid"})).await;
    let j0 = job_name("f", t0);
    wait_jobs(&env, "f", std::slice::from_ref(&j0)).await;
    env.wait_event("SuccessfulCreate", &format!("Created job {j0}"))
        .await;

    clock.advance(MINUTE);
    touch(&env, "f").await;
    env.wait_event(
        "JobAlreadyActive",
        "Not starting job because prior execution is running and concurrency policy is Forbid",
    )
    .await;
    assert_eq!(jobs(&env, "f").await, vec![j0.clone()]);
    assert_eq!(last_schedule(&env, "f").await, Some(t0));

    // Finished: the schedule it held back runs.
    finish(&env, &j0, true, t0).await;
    let j1 = job_name("f", minute(t0, 1));
    wait_jobs(&env, "f", &[j0.clone(), j1]).await;
    env.wait_event(
        "SawCompletedJob",
        &format!("Saw completed job: {j0}, condition: Complete"),
    )
    .await;
    until("lastScheduleTime at the second schedule", 10, || async {
        let got = last_schedule(&env, "f").await;
        (got == Some(minute(t0, 1)))
            .then_some(())
            .ok_or(format!("{got:?}"))
    })
    .await;
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replace_deletes_the_running_job() {
    let env = Env::start(&[]).await;
    let (clock, t0) = clock();
    let ctl = CronJobController::start(&env, clock.clone()).await;
    create(&env, "r", json!({"concurrencyPolicy": "Replace"})).await;
    let j0 = job_name("r", t0);
    wait_jobs(&env, "r", std::slice::from_ref(&j0)).await;

    clock.advance(MINUTE);
    touch(&env, "r").await;
    wait_jobs(&env, "r", &[job_name("r", minute(t0, 1))]).await;
    env.wait_event("SuccessfulDelete", &format!("Deleted job {j0}"))
        .await;
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_limits_prune_old_jobs() {
    let env = Env::start(&[]).await;
    let (clock, t0) = clock();
    let ctl = CronJobController::start(&env, clock.clone()).await;
    create(
        &env,
        "h",
        json!({"concurrencyPolicy": "Allow",
               "successfulJobsHistoryLimit": 1, "failedJobsHistoryLimit": 1}),
    )
    .await;
    let names: Vec<String> = (0..4).map(|n| job_name("h", minute(t0, n))).collect();
    for (n, name) in names.iter().enumerate() {
        if n > 0 {
            clock.advance(MINUTE);
            touch(&env, "h").await;
        }
        until(&format!("job {name}"), 10, || async {
            let got = jobs(&env, "h").await;
            got.contains(name).then_some(()).ok_or(format!("{got:?}"))
        })
        .await;
        // Two succeed, then two fail.
        finish(&env, name, n < 2, minute(t0, n as i64)).await;
    }
    // The newest of each kind stays.
    wait_jobs(&env, "h", &[names[1].clone(), names[3].clone()]).await;
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suspended_cronjob_makes_no_jobs() {
    let env = Env::start(&[]).await;
    let (clock, t0) = clock();
    let ctl = CronJobController::start(&env, clock.clone()).await;
    create(&env, "s", json!({"suspend": true})).await;
    // A twin that is not suspended shows when the controller has looked.
    create(&env, "twin", json!({})).await;
    wait_jobs(&env, "twin", &[job_name("twin", t0)]).await;
    clock.advance(MINUTE);
    touch(&env, "s").await;
    touch(&env, "twin").await;
    wait_jobs(
        &env,
        "twin",
        &[job_name("twin", t0), job_name("twin", minute(t0, 1))],
    )
    .await;
    assert_eq!(jobs(&env, "s").await, Vec::<String>::new());
    assert_eq!(last_schedule(&env, "s").await, None);

    // Resumed: the most recent schedule runs.
    let patch = json!({"spec": {"suspend": false}});
    Api::<CronJob>::default_namespaced(env.client.clone())
        .patch("s", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait_jobs(&env, "s", &[job_name("s", minute(t0, 1))]).await;
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_runs_each_schedule_once() {
    let env = Env::start(&[]).await;
    let (clock, t0) = clock();
    let ctl = CronJobController::start(&env, clock.clone()).await;
    create(&env, "x", json!({"concurrencyPolicy": "Allow"})).await;
    let j0 = job_name("x", t0);
    wait_jobs(&env, "x", std::slice::from_ref(&j0)).await;
    ctl.stop().await;

    // Down across a schedule: on start it runs that schedule once.
    clock.advance(MINUTE);
    let ctl = CronJobController::start(&env, clock.clone()).await;
    let j1 = job_name("x", minute(t0, 1));
    wait_jobs(&env, "x", &[j0.clone(), j1.clone()]).await;
    until("lastScheduleTime at the second schedule", 10, || async {
        let got = last_schedule(&env, "x").await;
        (got == Some(minute(t0, 1)))
            .then_some(())
            .ok_or(format!("{got:?}"))
    })
    .await;
    ctl.stop().await;

    // Started again within the same minute: nothing new.
    let ctl = CronJobController::start(&env, clock.clone()).await;
    touch(&env, "x").await;
    clock.advance(MINUTE);
    touch(&env, "x").await;
    // The next schedule shows the controller has run; still one per minute.
    wait_jobs(&env, "x", &[j0, j1, job_name("x", minute(t0, 2))]).await;
    until("three SuccessfulCreate events", 10, || async {
        let got = env.events("SuccessfulCreate").await;
        (got.len() == 3).then_some(()).ok_or(format!("{got:?}"))
    })
    .await;
    ctl.stop().await;
}
