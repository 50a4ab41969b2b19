//! Job controller (upstream `pkg/controller/job`): runs up to
//! `parallelism` pods until `completions` of them succeed (NonIndexed) or
//! every completion index has a succeeded pod (Indexed); fails the Job
//! when more pods failed than `backoffLimit` allows
//! (BackoffLimitExceeded), a pod failure policy rule says so
//! (PodFailurePolicy), too many indexes failed their `backoffLimitPerIndex`
//! (MaxFailedIndexesExceeded, FailedIndexes) or it ran past
//! `activeDeadlineSeconds` (DeadlineExceeded); ends early when a
//! `successPolicy` is met; honours `suspend` and `podReplacementPolicy`;
//! deletes finished Jobs after `ttlSecondsAfterFinished`.
//!
//! Pods are counted as upstream does since 1.26: each carries the
//! `batch.kubernetes.io/job-tracking` finalizer; a finished pod's uid is
//! first written to `status.uncountedTerminatedPods`, then its finalizer is
//! removed, then it moves into the `succeeded` / `failed` counters. Each
//! step is written before the next, so a restart at any point neither
//! loses a pod that was deleted meanwhile nor counts one twice. An Indexed
//! Job records a succeeded pod by its index in `status.completedIndexes`
//! (and a failed index in `status.failedIndexes`) in that first write
//! instead. Terminal
//! conditions are preceded by the interim SuccessCriteriaMet /
//! FailureTarget and set once no pod of the Job is left running.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::channel::mpsc;
use futures::StreamExt;
use k8s_openapi::api::batch::v1::{Job, JobCondition, JobSpec, JobStatus};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, PostParams, Preconditions, PropagationPolicy};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, ResourceExt};
use kube_util::events::{Recorder, Reporter};
use kube_util::indexes::Indexes;
use kube_util::selector;

use crate::job_index;
use crate::job_policy::{self, Verdict};
use crate::pods::{self, is_active, is_finished};
use crate::workload::{self, controller_owner, is_not_found, AbortOnDrop, ApiResultExt, Result};
use crate::workload_claim::{self as claim, Claim};
use crate::workload_expectations::Expectations;
use crate::workload_job::{
    condition, count_uncounted, ensure_condition, finished, has_finalizer, is_failed,
    new_condition, past_backoff_on_failure, remove_finalizer, set_uncounted, Removing,
    TRACKING_FINALIZER,
};

/// Who may run a Job (`spec.managedBy`): anything else is left alone.
const MANAGED_BY: &str = "kubernetes.io/job-controller";
/// First delay before replacing a failed pod, doubled per further failure
/// up to the maximum (upstream `DefaultJobPodFailureBackOff`).
const POD_BACKOFF: Duration = Duration::from_secs(10);
const POD_BACKOFF_MAX: Duration = Duration::from_secs(6 * 60);
/// At most this many pods created or deleted in one sync.
const MAX_PODS_PER_SYNC: usize = 500;

struct State {
    client: kube::Client,
    pods: Store<Pod>,
    expectations: Arc<Expectations>,
    /// Pods (by Job key) whose finalizer removal the cache has not shown
    /// yet: until it does, their finalizer must not make them count again.
    removing: Arc<Removing>,
    /// Failures since the last success, and when the last was seen.
    backoff: Mutex<HashMap<String, (u32, Instant)>>,
    events: Recorder,
}

/// Run the Job controller until its task is aborted.
///
/// # Errors
/// The caches cannot be filled.
pub async fn run(ctx: crate::Ctx) -> Result<(), crate::Error> {
    let client = ctx.client.clone();
    let (tx, rx) = mpsc::channel(1024);
    let (orphans_tx, orphans_rx) = mpsc::channel::<Pod>(1024);
    let expectations = Arc::new(Expectations::default());
    let removing = Arc::new(Removing::default());
    let jobs = ctx.informers.get::<Job>();
    let _jobs_trigger = workload::trigger(&jobs, tx.clone(), {
        let exp = expectations.clone();
        let removing = removing.clone();
        move |job: &Job, exists| {
            if !exists {
                exp.forget(&workload::key(job));
                removing.forget(&workload::key(job));
            }
            workload::itself(job)
        }
    });
    let pod_cache = ctx.informers.get::<Pod>();
    let _pod_cache_trigger = workload::trigger(&pod_cache, tx, {
        let jobs = jobs.store().clone();
        let (exp, removing) = (expectations.clone(), removing.clone());
        let mut orphans = orphans_tx;
        move |pod: &Pod, exists| {
            let owner = controller_owner::<Job>(&pod.metadata);
            if let Some(o) = &owner {
                let key = format!("{}/{}", pod.namespace().unwrap_or_default(), o.name);
                exp.observe(&key, pod, exists);
                removing.observe(&key, pod, exists);
            }
            // A tracked pod whose Job is gone or done would otherwise keep
            // its finalizer, and never finish deleting.
            let job = owner.as_ref().and_then(|o| jobs.get(o));
            if exists && has_finalizer(pod) && job.as_ref().is_none_or(|j| finished(j).is_some()) {
                let _ = orphans.try_send(pod.clone());
            }
            owner
        }
    });
    workload::ready(&jobs).await?;
    workload::ready(&pod_cache).await?;
    let _orphans = AbortOnDrop::spawn(release_orphans(client.clone(), orphans_rx));
    let state = Arc::new(State {
        events: Recorder::new(client.clone(), Reporter::new("job-controller")),
        client,
        pods: pod_cache.store().clone(),
        expectations,
        removing,
        backoff: Mutex::new(HashMap::new()),
    });
    workload::drive("job", jobs.store().clone(), rx, state, reconcile).await;
    Ok(())
}

/// Remove the tracking finalizer from pods whose Job is gone or finished
/// (upstream `syncOrphanPod`), checking the Job against the API first: a
/// cache that has not seen a new Job yet must not make its pods uncounted.
async fn release_orphans(client: kube::Client, mut rx: mpsc::Receiver<Pod>) -> Result<()> {
    while let Some(pod) = rx.next().await {
        let ns = pod.namespace().unwrap_or_default();
        if let Some(r) = claim::controller_of(&pod.metadata).filter(|r| r.kind == "Job") {
            let job = Api::<Job>::namespaced(client.clone(), &ns)
                .get_opt(&r.name)
                .await;
            match job {
                Ok(Some(j))
                    if j.metadata.uid.as_deref() == Some(r.uid.as_str())
                        && finished(&j).is_none() =>
                {
                    continue
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(pod = %pod.name_any(), namespace = %ns, "checking the job of a tracked pod failed: {e}");
                    continue;
                }
            }
        }
        if let Err(e) = remove_finalizer(&Api::namespaced(client.clone(), &ns), &pod).await {
            tracing::warn!(pod = %pod.name_any(), namespace = %ns, "releasing a pod of a finished or deleted job failed: {e}");
        }
    }
    Ok(())
}

async fn reconcile(job: Arc<Job>, st: Arc<State>) -> Result<Action> {
    let Some(spec) = job.spec.clone() else {
        return Ok(Action::await_change());
    };
    if spec.managed_by.as_deref().is_some_and(|m| m != MANAGED_BY) {
        return Ok(Action::await_change());
    }
    let key = workload::key(&*job);
    if let Some(at) = finished(&job) {
        st.expectations.forget(&key);
        lock(&st.backoff).remove(&key);
        return expire(&job, spec.ttl_seconds_after_finished, at, &st).await;
    }
    Sync::new(&st, (*job).clone(), key).run().await
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Delete a finished Job `ttl` seconds after it finished (upstream
/// ttl-after-finished controller), its pods with it.
async fn expire(job: &Job, ttl: Option<i32>, at: jiff::Timestamp, st: &State) -> Result<Action> {
    let Some(ttl) = ttl else {
        return Ok(Action::await_change());
    };
    let due = at
        .checked_add(jiff::SignedDuration::from_secs(i64::from(ttl.max(0))))
        .unwrap_or(at);
    let now = jiff::Timestamp::now();
    if due > now {
        let wait = due.duration_since(now).as_millis().max(0) as u64;
        return Ok(Action::requeue(Duration::from_millis(wait + 100)));
    }
    let dp = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Foreground),
        preconditions: Some(Preconditions {
            uid: job.metadata.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    let name = job.name_any();
    match Api::<Job>::namespaced(st.client.clone(), &job.namespace().unwrap_or_default())
        .delete(&name, &dp)
        .await
    {
        Ok(_) => {
            tracing::info!(job = %workload::key(job), "deleted finished job after ttlSecondsAfterFinished");
            Ok(Action::await_change())
        }
        Err(e) if is_not_found(&e) => Ok(Action::await_change()),
        Err(e) => Err(e).ctx(|| format!("deleting expired job {}", workload::key(job))),
    }
}

/// What the Job's pods add up to in one sync (upstream's `syncJobCtx`
/// counts): recorded status plus the tracked pods that finished since.
struct Tally {
    /// Completions, for an Indexed Job.
    indexed: Option<i32>,
    /// Indexed: the succeeded indexes, recorded and new.
    completed: Indexes,
    /// With per-index limits: the failed indexes, recorded and new.
    failed_indexes: Indexes,
    /// Newly failed pods (by uid) whose failure the pod failure policy
    /// ignores: they are replaced, never counted.
    ignored: HashSet<String>,
    new_ok: i32,
    new_failed: i32,
    uncounted_ok: i32,
    uncounted_failed: i32,
    /// The message of the first FailJob verdict.
    fail_job: Option<String>,
}

impl Tally {
    fn of(job: &Job, status: &JobStatus, pods: &[Arc<Pod>], removing: &HashSet<String>) -> Tally {
        let spec = job.spec.as_ref();
        let indexed = spec
            .filter(|s| s.completion_mode.as_deref() == Some("Indexed"))
            .map(|s| s.completions.unwrap_or(0));
        let per_index = spec
            .and_then(|s| s.backoff_limit_per_index)
            .filter(|_| indexed.is_some());
        let n = indexed.unwrap_or(0);
        let recorded = |s: &Option<String>| Indexes::parse_lenient(s.as_deref().unwrap_or(""), n);
        let unc = status.uncounted_terminated_pods.clone().unwrap_or_default();
        let (unc_ok, unc_failed) = (
            unc.succeeded.unwrap_or_default(),
            unc.failed.unwrap_or_default(),
        );
        let mut t = Tally {
            indexed,
            completed: recorded(&status.completed_indexes),
            failed_indexes: recorded(&status.failed_indexes),
            ignored: HashSet::new(),
            new_ok: 0,
            new_failed: 0,
            uncounted_ok: unc_ok.len() as i32,
            uncounted_failed: unc_failed.len() as i32,
            fail_job: None,
        };
        for p in pods {
            let uid = p.metadata.uid.clone().unwrap_or_default();
            if !has_finalizer(p)
                || removing.contains(&uid)
                || unc_ok.contains(&uid)
                || unc_failed.contains(&uid)
            {
                continue;
            }
            let index = match indexed {
                // A pod of an Indexed Job with no valid index counts for
                // nothing.
                Some(n) => match job_index::index_of(p, n) {
                    Some(i) => Some(i),
                    None => continue,
                },
                None => None,
            };
            if pods::phase(p) == "Succeeded" {
                // An index counts once, however many pods succeeded in it.
                if index.is_none_or(|i| t.completed.insert(i)) {
                    t.new_ok += 1;
                }
            } else if is_failed(job, p) {
                let verdict = if pods::phase(p) == "Failed" {
                    job_policy::judge(job, p)
                } else {
                    Verdict::Count
                };
                if let (Some(limit), Some(i)) = (per_index, index) {
                    let index_failed = verdict == Verdict::FailIndex
                        || (verdict != Verdict::Ignore && job_index::failures_before(p) >= limit);
                    if index_failed {
                        t.failed_indexes.insert(i);
                    }
                }
                match verdict {
                    Verdict::Ignore => {
                        t.ignored.insert(uid);
                    }
                    Verdict::FailJob(m) => {
                        t.fail_job.get_or_insert(m);
                        t.new_failed += 1;
                    }
                    Verdict::Count | Verdict::FailIndex => t.new_failed += 1,
                }
            }
        }
        t
    }

    /// `status.succeeded` after this sync: an Indexed Job counts indexes.
    fn succeeded(&self, status: &JobStatus) -> i32 {
        match self.indexed {
            Some(_) => self.completed.len() as i32,
            None => status.succeeded.unwrap_or(0) + self.new_ok + self.uncounted_ok,
        }
    }

    fn failed(&self, status: &JobStatus) -> i32 {
        status.failed.unwrap_or(0) + self.new_failed + self.uncounted_failed
    }

    /// Whether the failed (or, for a failing Job, stopped) `pod` counts
    /// in `status.failed`.
    fn counts_failed(&self, pod: &Pod) -> bool {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        self.indexed
            .is_none_or(|n| job_index::index_of(pod, n).is_some())
            && !self.ignored.contains(uid)
    }

    /// Active pods of an Indexed Job that must go: no valid index, an index
    /// already succeeded or failed, or a second pod for one index (the
    /// ready, older one stays).
    fn misplaced(&self, active: &[Arc<Pod>]) -> Vec<Arc<Pod>> {
        let Some(n) = self.indexed else {
            return Vec::new();
        };
        let mut sorted: Vec<&Arc<Pod>> = active.iter().collect();
        sorted.sort_by_key(|p| {
            (
                !pods::is_ready(p),
                p.metadata.creation_timestamp.as_ref().map(|t| t.0),
            )
        });
        let mut seen = Indexes::default();
        sorted
            .into_iter()
            .filter(|p| match job_index::index_of(p, n) {
                None => true,
                Some(i) => {
                    self.completed.contains(i) || self.failed_indexes.contains(i) || !seen.insert(i)
                }
            })
            .cloned()
            .collect()
    }
}

/// How this sync may end the Job.
struct End {
    finish: Option<JobCondition>,
    /// Every pod is on its way out and the cache has settled: the terminal
    /// condition may follow the interim one.
    may_end: bool,
    terminating: i32,
}

/// One sync of one Job (upstream `syncJob`).
struct Sync<'a> {
    st: &'a State,
    job: Job,
    key: String,
    ns: String,
    now: jiff::Timestamp,
    requeue: Vec<Duration>,
}

impl<'a> Sync<'a> {
    fn new(st: &'a State, job: Job, key: String) -> Self {
        Sync {
            ns: job.namespace().unwrap_or_default(),
            now: workload::now(),
            requeue: Vec::new(),
            st,
            job,
            key,
        }
    }

    fn pods_api(&self) -> Api<Pod> {
        Api::namespaced(self.st.client.clone(), &self.ns)
    }

    async fn run(mut self) -> Result<Action> {
        let spec = self.job.spec.clone().unwrap_or_default();
        let suspended = spec.suspend == Some(true);
        let settled = self.st.expectations.satisfied(&self.key, |n| {
            self.st.pods.get(&ObjectRef::new(n).within(&self.ns))
        });
        let pods = self.claim_pods().await?;
        let removing = self.st.removing.pending(&self.key, &pods);
        let mut status = self.job.status.clone().unwrap_or_default();
        let tally = Tally::of(&self.job, &status, &pods, &removing);

        let active: Vec<Arc<Pod>> = pods.iter().filter(|p| is_active(p)).cloned().collect();
        let mut n_active = active.len() as i32;
        let mut ready = active.iter().filter(|p| pods::is_ready(p)).count() as i32;
        let mut terminating = pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_some() && !is_finished(p))
            .count() as i32;
        let succeeded = tally.succeeded(&status);
        let failed = tally.failed(&status);
        if status.start_time.is_none() && !suspended {
            status.start_time = Some(Time(self.now));
        }
        self.record_backoff(tally.new_ok, tally.new_failed);

        let mut finish = self.finish(&spec, &tally, &pods, failed, &status, suspended);
        let mut may_end = true;
        let mut manage_err = None;
        if finish.is_some() {
            // Whether it failed or met a success policy, nothing of it may
            // keep running.
            let (deleted, deleted_ready, err) = self.delete_pods(&active, false).await;
            may_end = deleted == n_active && settled;
            n_active -= deleted;
            terminating += deleted;
            ready -= deleted_ready;
            manage_err = err;
        } else {
            let mut managed = false;
            if settled && self.job.metadata.deletion_timestamp.is_none() {
                match self
                    .manage(&spec, &pods, &active, &tally, succeeded, terminating)
                    .await
                {
                    Ok((a, r, t)) => (n_active, ready, terminating) = (a, r, t),
                    Err(e) => manage_err = Some(e),
                }
                managed = true;
            }
            finish = self.completion(&spec, &tally, succeeded, n_active);
            if finish.is_none() && managed {
                self.suspend_conditions(&mut status, suspended).await;
            }
        }
        status.active = Some(n_active).filter(|n| *n > 0);
        status.ready = Some(ready.max(0));
        status.terminating = Some(terminating.max(0));
        let end = End {
            finish,
            may_end,
            terminating,
        };
        self.track(status, &pods, &removing, &tally, end).await?;
        if let Some(e) = manage_err {
            return Err(e);
        }
        if !settled {
            self.requeue
                .extend(self.st.expectations.expires_in(&self.key));
        }
        Ok(match self.requeue.iter().min() {
            Some(d) => Action::requeue((*d).max(Duration::from_millis(100))),
            None => Action::await_change(),
        })
    }

    /// What ends the Job before its pods are managed (upstream `syncJob`'s
    /// order): an interim condition written earlier, a FailJob rule, too
    /// many failures, the deadline, too many failed indexes, a success
    /// policy.
    fn finish(
        &mut self,
        spec: &JobSpec,
        tally: &Tally,
        pods: &[Arc<Pod>],
        failed: i32,
        status: &JobStatus,
        suspended: bool,
    ) -> Option<JobCondition> {
        if let Some(c) = condition(&self.job, "SuccessCriteriaMet")
            .or_else(|| condition(&self.job, "FailureTarget"))
        {
            return Some(c.clone());
        }
        let failure = |reason: &str, message: &str| {
            Some(new_condition("FailureTarget", reason, message, self.now))
        };
        if let Some(msg) = &tally.fail_job {
            return failure("PodFailurePolicy", msg);
        }
        let backoff_limit = spec.backoff_limit.unwrap_or(6);
        if failed > backoff_limit || past_backoff_on_failure(&self.job, pods, backoff_limit) {
            return failure(
                "BackoffLimitExceeded",
                "Job has reached the specified backoff limit",
            );
        }
        if let Some(left) = self.deadline_left(status, suspended) {
            if left.is_zero() {
                return failure(
                    "DeadlineExceeded",
                    "Job was active longer than specified deadline",
                );
            }
            self.requeue.push(left);
        }
        if spec
            .max_failed_indexes
            .is_some_and(|m| tally.failed_indexes.len() > usize::try_from(m).unwrap_or(0))
        {
            return failure(
                "MaxFailedIndexesExceeded",
                "Job has exceeded the specified maximal number of failed indexes",
            );
        }
        job_policy::success(&self.job, &tally.completed)
            .map(|msg| new_condition("SuccessCriteriaMet", "SuccessPolicy", &msg, self.now))
    }

    /// The condition the Job ends with once nothing is left to run: all
    /// completions reached, or (with per-index limits) every index done
    /// and some of them failed.
    fn completion(
        &self,
        spec: &JobSpec,
        tally: &Tally,
        succeeded: i32,
        n_active: i32,
    ) -> Option<JobCondition> {
        if n_active > 0 {
            return None;
        }
        let failed_indexes = tally.failed_indexes.len() as i32;
        let done = match spec.completions {
            None => succeeded > 0,
            Some(c) => succeeded + failed_indexes >= c,
        };
        if !done {
            None
        } else if failed_indexes > 0 {
            Some(new_condition(
                "FailureTarget",
                "FailedIndexes",
                "Job has failed indexes",
                self.now,
            ))
        } else {
            Some(new_condition(
                "SuccessCriteriaMet",
                "CompletionsReached",
                "Reached expected number of succeeded pods",
                self.now,
            ))
        }
    }

    /// Time left before activeDeadlineSeconds (zero when past), if set.
    fn deadline_left(&self, status: &JobStatus, suspended: bool) -> Option<Duration> {
        let secs = self.job.spec.as_ref()?.active_deadline_seconds?;
        if suspended {
            return None;
        }
        let start = status.start_time.as_ref()?.0;
        let end = start
            .checked_add(jiff::SignedDuration::from_secs(secs))
            .ok()?;
        let left = end.duration_since(jiff::Timestamp::now());
        Some(if left.is_positive() {
            Duration::from_millis(left.as_millis() as u64 + 100)
        } else {
            Duration::ZERO
        })
    }

    fn record_backoff(&self, new_ok: i32, new_failed: i32) {
        let mut m = lock(&self.st.backoff);
        if new_failed > 0 {
            let e = m.entry(self.key.clone()).or_insert((0, Instant::now()));
            *e = (e.0 + new_failed as u32, Instant::now());
        } else if new_ok > 0 {
            m.remove(&self.key);
        }
    }

    /// How long new pods must wait after recent failures.
    fn backoff_left(&self) -> Duration {
        let m = lock(&self.st.backoff);
        let Some((n, at)) = m.get(&self.key) else {
            return Duration::ZERO;
        };
        let exp = n.saturating_sub(1).min(16);
        let delay = (POD_BACKOFF * 2u32.pow(exp)).min(POD_BACKOFF_MAX);
        delay.saturating_sub(at.elapsed())
    }

    /// The Job's pods, after adopting matching orphans (adding the
    /// tracking finalizer) and releasing strays.
    async fn claim_pods(&self) -> Result<Vec<Arc<Pod>>> {
        let uid = self.job.uid().unwrap_or_default();
        let deleting = self.job.metadata.deletion_timestamp.is_some();
        let sel = self.job.spec.as_ref().and_then(|s| s.selector.clone());
        let candidates = self
            .st
            .pods
            .state_filter(|p| p.metadata.namespace.as_deref() == Some(self.ns.as_str()));
        let mut owned = Vec::new();
        let mut may_adopt = None;
        for pod in candidates {
            let selected = sel.as_ref().is_some_and(|s| {
                !selector::is_empty(s) && selector::matches(s, pod.metadata.labels.as_ref())
            });
            match claim::classify(&uid, deleting, selected, &pod.metadata) {
                Claim::Owned => owned.push(pod),
                Claim::Adopt if !is_finished(&pod) => {
                    if may_adopt.is_none() {
                        let api = Api::<Job>::namespaced(self.st.client.clone(), &self.ns);
                        may_adopt = Some(claim::can_adopt(&api, &self.job).await?);
                    }
                    if may_adopt == Some(true) {
                        let adopted = claim::adopt(
                            &self.pods_api(),
                            &*pod,
                            claim::controller_ref(&self.job),
                            Some(TRACKING_FINALIZER),
                        )
                        .await?;
                        owned.push(Arc::new(adopted));
                    }
                }
                Claim::Release => claim::release(&self.pods_api(), &*pod, &uid).await?,
                _ => {}
            }
        }
        Ok(owned)
    }

    /// Bring the active pods to what parallelism and the remaining
    /// completions want (upstream `manageJob`). Returns active, ready and
    /// terminating counts after acting.
    async fn manage(
        &mut self,
        spec: &JobSpec,
        pods: &[Arc<Pod>],
        active: &[Arc<Pod>],
        tally: &Tally,
        succeeded: i32,
        terminating: i32,
    ) -> Result<(i32, i32, i32)> {
        let n_active = active.len() as i32;
        let ready = active.iter().filter(|p| pods::is_ready(p)).count() as i32;
        let after_deleting =
            |(deleted, deleted_ready, err): (i32, i32, Option<workload::Error>)| match err {
                Some(e) => Err(e),
                None => Ok((
                    n_active - deleted,
                    ready - deleted_ready,
                    terminating + deleted,
                )),
            };
        if spec.suspend == Some(true) {
            return after_deleting(self.delete_pods(active, true).await);
        }
        let parallelism = spec.parallelism.unwrap_or(1).max(0);
        let want = match spec.completions {
            // Without completions, the first success means: let the rest
            // finish, start no more.
            None if succeeded > 0 => n_active,
            None => parallelism,
            Some(c) => (c - succeeded - tally.failed_indexes.len() as i32).clamp(0, parallelism),
        };
        // An Indexed Job's pods for no index, a done index, or an index
        // another pod already works on go first.
        let mut victims = tally.misplaced(active);
        let left: Vec<Arc<Pod>> = active
            .iter()
            .filter(|p| !victims.iter().any(|v| Arc::ptr_eq(v, p)))
            .cloned()
            .collect();
        let extra = left.len() as i32 - want;
        if extra > 0 {
            victims.extend(pods::pick_victims(&left, &[], extra as usize, self.now));
        }
        if !victims.is_empty() {
            victims.truncate(MAX_PODS_PER_SYNC);
            return after_deleting(self.delete_pods(&victims, true).await);
        }
        // podReplacementPolicy Failed waits for terminating pods to end.
        let waiting = if spec.pod_replacement_policy.as_deref() == Some("Failed") {
            terminating
        } else {
            0
        };
        let missing = want - waiting - n_active;
        if missing <= 0 {
            return Ok((n_active, ready, terminating));
        }
        let wait = self.backoff_left();
        if !wait.is_zero() {
            self.requeue.push(wait);
            return Ok((n_active, ready, terminating));
        }
        let n = (missing as usize).min(MAX_PODS_PER_SYNC);
        let made = self
            .create_pods(self.new_pods(spec, pods, tally, waiting > 0, n))
            .await?;
        Ok((n_active + made as i32, ready, terminating))
    }

    /// Templates and name prefixes of `n` new pods: alike for a NonIndexed
    /// Job, one per lowest pending index for an Indexed one.
    fn new_pods(
        &self,
        spec: &JobSpec,
        pods: &[Arc<Pod>],
        tally: &Tally,
        terminating_taken: bool,
        n: usize,
    ) -> Vec<(PodTemplateSpec, String)> {
        let mut template = spec.template.clone();
        let meta = template.metadata.get_or_insert_with(Default::default);
        let fs = meta.finalizers.get_or_insert_with(Vec::new);
        if !fs.iter().any(|f| f == TRACKING_FINALIZER) {
            fs.push(TRACKING_FINALIZER.into());
        }
        let name = self.job.name_any();
        let Some(completions) = tally.indexed else {
            return vec![(template, pods::name_prefix(&name)); n];
        };
        job_index::add_index_env(&mut template);
        let taken: Indexes = pods
            .iter()
            .filter(|p| {
                is_active(p)
                    || (terminating_taken
                        && p.metadata.deletion_timestamp.is_some()
                        && !is_finished(p))
            })
            .filter_map(|p| job_index::index_of(p, completions))
            .collect();
        let replaced = job_index::last_failed(pods, completions);
        let per_index = spec.backoff_limit_per_index.is_some();
        job_index::first_pending(
            completions,
            &[&tally.completed, &tally.failed_indexes],
            &taken,
            n,
        )
        .into_iter()
        .map(|i| {
            let counts = per_index.then(|| {
                replaced
                    .iter()
                    .find(|(ix, _)| *ix == i)
                    .map(|(_, p)| {
                        let ignored = job_policy::judge(&self.job, p) == Verdict::Ignore;
                        job_index::counts_after(p, ignored)
                    })
                    .unwrap_or_default()
            });
            (
                job_index::template_for(&template, &name, i, counts),
                job_index::generate_name(&name, i),
            )
        })
        .collect()
    }

    async fn create_pods(&self, new: Vec<(PodTemplateSpec, String)>) -> Result<usize> {
        let n = new.len();
        let owner = claim::controller_ref(&self.job);
        let api = self.pods_api();
        self.st.expectations.creating(&self.key, n);
        let (ok, made, err) = pods::slow_start(n, |i| {
            let (template, prefix) = &new[i];
            let pod = pods::from_template(template, prefix.clone(), owner.clone());
            let api = &api;
            let st = &self.st;
            async move {
                pods::create(
                    api,
                    &pod,
                    &self.job,
                    &st.events,
                    &st.expectations,
                    &self.key,
                )
                .await
            }
        })
        .await;
        for _ in made..n {
            self.st.expectations.created(&self.key, None);
        }
        match err {
            Some(e) => Err(e).ctx(|| format!("creating pods for job {}", self.key)),
            None => Ok(ok),
        }
    }

    /// Delete `victims` (keeping their finalizers: they are counted once
    /// they are gone). `expect` records expectations for the deletions.
    /// Returns how many were deleted, how many of those were ready, and
    /// the first error.
    async fn delete_pods(
        &self,
        victims: &[Arc<Pod>],
        expect: bool,
    ) -> (i32, i32, Option<workload::Error>) {
        let api = self.pods_api();
        if expect {
            for v in victims {
                self.st.expectations.deleting(
                    &self.key,
                    &v.name_any(),
                    v.metadata.uid.as_deref().unwrap_or_default(),
                );
            }
        }
        let results = futures::future::join_all(victims.iter().map(|v| {
            let api = &api;
            async move {
                let name = v.name_any();
                let dp = DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: v.metadata.uid.clone(),
                        resource_version: None,
                    }),
                    ..Default::default()
                };
                match api.delete(&name, &dp).await {
                    Ok(_) => {
                        self.st.events.normal(
                            &self.job,
                            "SuccessfulDelete",
                            format!("Deleted pod: {name}"),
                        );
                        Ok(())
                    }
                    Err(e) => {
                        self.st.expectations.delete_failed(&self.key, &name);
                        if is_not_found(&e) {
                            return Ok(());
                        }
                        self.st.events.warning(
                            &self.job,
                            "FailedDelete",
                            format!("Error deleting: {e}"),
                        );
                        Err(e).ctx(|| format!("deleting pod {name} of job {}", self.key))
                    }
                }
            }
        }))
        .await;
        let mut deleted = 0;
        let mut deleted_ready = 0;
        let mut first = None;
        for (v, r) in victims.iter().zip(results) {
            match r {
                Ok(()) => {
                    deleted += 1;
                    if pods::is_ready(v) {
                        deleted_ready += 1;
                    }
                }
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        (deleted, deleted_ready, first)
    }

    /// Suspended / resumed conditions and events; a resumed Job's
    /// activeDeadlineSeconds counts from the resume.
    async fn suspend_conditions(&self, status: &mut JobStatus, suspended: bool) {
        if suspended {
            if ensure_condition(
                status,
                "Suspended",
                "True",
                "JobSuspended",
                "Job suspended",
                self.now,
            ) {
                self.st
                    .events
                    .normal(&self.job, "Suspended", "Job suspended".into());
            }
        } else if ensure_condition(
            status,
            "Suspended",
            "False",
            "JobResumed",
            "Job resumed",
            self.now,
        ) {
            self.st
                .events
                .normal(&self.job, "Resumed", "Job resumed".into());
            status.start_time = Some(Time(self.now));
        }
    }

    /// Count finished pods through uncountedTerminatedPods and their
    /// finalizers, then set the terminal condition when it is due (upstream
    /// `trackJobStatusAndRemoveFinalizers`).
    async fn track(
        &mut self,
        mut status: JobStatus,
        pods: &[Arc<Pod>],
        removing: &HashSet<String>,
        tally: &Tally,
        end: End,
    ) -> Result<()> {
        let End {
            finish,
            may_end,
            terminating,
        } = end;
        let mut unc = status.uncounted_terminated_pods.clone().unwrap_or_default();
        let mut unc_ok: Vec<String> = unc.succeeded.take().unwrap_or_default();
        let mut unc_failed: Vec<String> = unc.failed.take().unwrap_or_default();
        let with_finalizer: HashSet<String> = pods
            .iter()
            .filter(|p| has_finalizer(p))
            .filter_map(|p| p.metadata.uid.clone())
            .filter(|u| !removing.contains(u))
            .collect();
        count_uncounted(&mut status, &mut unc_ok, &mut unc_failed, &with_finalizer);

        let failing = finish.as_ref().is_some_and(|c| c.type_ == "FailureTarget");
        let deleting = self.job.metadata.deletion_timestamp.is_some();
        let mut to_release = Vec::new();
        for p in pods {
            let uid = p.metadata.uid.clone().unwrap_or_default();
            if !with_finalizer.contains(&uid) {
                continue;
            }
            let failed = is_failed(&self.job, p);
            let succeeded = pods::phase(p) == "Succeeded";
            if !(deleting || finish.is_some() || succeeded || failed) {
                continue;
            }
            to_release.push(p.clone());
            if succeeded && !unc_failed.contains(&uid) {
                // An Indexed Job records its index instead, below.
                if tally.indexed.is_none() && !unc_ok.contains(&uid) {
                    unc_ok.push(uid);
                }
            } else if (failed || failing) && !unc_failed.contains(&uid) && tally.counts_failed(p) {
                unc_failed.push(uid);
            }
        }
        if tally.indexed.is_some() {
            status.completed_indexes = Some(tally.completed.to_string()).filter(|s| !s.is_empty());
            status.succeeded = Some(tally.completed.len() as i32);
            if self
                .job
                .spec
                .as_ref()
                .and_then(|s| s.backoff_limit_per_index)
                .is_some()
            {
                status.failed_indexes = Some(tally.failed_indexes.to_string());
            }
        }

        // Interim conditions go in before finalizers come off, so the
        // decision survives a restart.
        let mut final_cond = None;
        if let Some(f) = &finish {
            let conds = status.conditions.get_or_insert_with(Vec::new);
            if !conds.iter().any(|c| c.type_ == f.type_) {
                conds.push(f.clone());
            }
            let t = if f.type_ == "FailureTarget" {
                "Failed"
            } else {
                "Complete"
            };
            let (reason, msg) = (
                f.reason.clone().unwrap_or_default(),
                f.message.clone().unwrap_or_default(),
            );
            final_cond = Some(new_condition(t, &reason, &msg, self.now));
        }
        set_uncounted(&mut status, &unc_ok, &unc_failed);
        self.write_status(status).await?;

        // Finalizers off, then the counters.
        let api = self.pods_api();
        let results = futures::future::join_all(to_release.iter().map(|p| {
            self.st
                .removing
                .expect(&self.key, p.metadata.uid.as_deref().unwrap_or_default());
            let api = &api;
            async move { remove_finalizer(api, p).await }
        }))
        .await;
        let mut with_finalizer = with_finalizer;
        let mut rm_err = None;
        for (p, r) in to_release.iter().zip(results) {
            let uid = p.metadata.uid.clone().unwrap_or_default();
            match r {
                Ok(()) => {
                    with_finalizer.remove(&uid);
                }
                Err(e) => {
                    self.st.removing.cancel(&self.key, &uid);
                    rm_err.get_or_insert(e);
                }
            }
        }
        let mut status = self.job.status.clone().unwrap_or_default();
        count_uncounted(&mut status, &mut unc_ok, &mut unc_failed, &with_finalizer);
        set_uncounted(&mut status, &unc_ok, &unc_failed);

        // Finished once every pod is counted and none is still running.
        let mut done = None;
        if let Some(c) = final_cond {
            if may_end
                && rm_err.is_none()
                && unc_ok.is_empty()
                && unc_failed.is_empty()
                && terminating == 0
            {
                let reason = c.reason.clone().unwrap_or_default();
                let msg = c.message.clone().unwrap_or_default();
                ensure_condition(&mut status, &c.type_, "True", &reason, &msg, self.now);
                if c.type_ == "Complete" {
                    status.completion_time = Some(Time(self.now));
                }
                done = Some(c);
            }
        }
        self.write_status(status).await?;
        if let Some(e) = rm_err {
            return Err(e);
        }
        if let Some(c) = done {
            self.record_finished(&c).await;
        }
        Ok(())
    }

    async fn record_finished(&self, c: &JobCondition) {
        let s = self.job.status.clone().unwrap_or_default();
        if c.type_ == "Complete" {
            let completions = self.job.spec.as_ref().and_then(|s| s.completions);
            if completions.is_some_and(|n| s.succeeded.unwrap_or(0) > n) {
                self.st.events.warning(
                    &self.job,
                    "TooManySucceededPods",
                    "Too many succeeded pods running after completion count reached".into(),
                );
            }
            self.st
                .events
                .normal(&self.job, "Completed", "Job completed".into());
            tracing::info!(job = %self.key, succeeded = s.succeeded.unwrap_or(0), "job completed");
        } else {
            let reason = c.reason.clone().unwrap_or_default();
            self.st
                .events
                .warning(&self.job, &reason, c.message.clone().unwrap_or_default());
            tracing::info!(job = %self.key, reason, failed = s.failed.unwrap_or(0), "job failed");
        }
    }

    async fn write_status(&mut self, s: JobStatus) -> Result<()> {
        if self.job.status.as_ref() == Some(&s) {
            return Ok(());
        }
        let mut j = self.job.clone();
        j.status = Some(s);
        self.job = Api::<Job>::namespaced(self.st.client.clone(), &self.ns)
            .replace_status(&self.job.name_any(), &PostParams::default(), &j)
            .await
            .ctx(|| format!("updating status of job {}", self.key))?;
        Ok(())
    }
}
