//! Job controller against a real API server: completions within
//! parallelism, tracking finalizers, backoffLimit (with the replacement of
//! a failed pod after back-off), activeDeadlineSeconds, suspend,
//! ttlSecondsAfterFinished, Indexed Jobs, pod failure policies, per-index
//! limits and success policies.

use crate::workloads_support;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use workloads_support::{until, Env};

const FINALIZER: &str = "batch.kubernetes.io/job-tracking";

fn job_yaml(name: &str, spec: &str) -> String {
    format!(
        r#"
apiVersion: batch/v1
kind: Job
metadata:
  name: {name}
spec:
  {spec}
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: c
        image: busybox:1
"#
    )
}

async fn job(env: &Env, name: &str) -> Job {
    Api::<Job>::default_namespaced(env.client.clone())
        .get(name)
        .await
        .expect("get job")
}

/// (active, succeeded, failed) from the status.
fn counts(j: &Job) -> (i32, i32, i32) {
    let s = j.status.clone().unwrap_or_default();
    (
        s.active.unwrap_or(0),
        s.succeeded.unwrap_or(0),
        s.failed.unwrap_or(0),
    )
}

/// The reason of condition `type_` when it is True.
fn condition(j: &Job, type_: &str) -> Option<String> {
    j.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_ && c.status == "True")
        .map(|c| c.reason.clone().unwrap_or_default())
}

async fn job_pods(env: &Env, name: &str) -> Vec<Pod> {
    env.list_pods(&format!("batch.kubernetes.io/job-name={name}"))
        .await
}

async fn active_job_pods(env: &Env, name: &str) -> Vec<Pod> {
    env.active_pods(&format!("batch.kubernetes.io/job-name={name}"))
        .await
}

async fn wait_active(env: &Env, name: &str, n: usize) -> Vec<Pod> {
    until(&format!("{n} active pods of {name}"), 20, || async {
        let have = active_job_pods(env, name).await.len();
        (have == n).then_some(()).ok_or(format!("{have}"))
    })
    .await;
    active_job_pods(env, name).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_completions_within_parallelism() {
    let env = Env::start(&["job"]).await;
    env.kubectl_stdin(
        &["apply", "-f", "-"],
        &job_yaml("calc", "completions: 4\n  parallelism: 2"),
    );
    let j = job(&env, "calc").await;
    let uid = j.uid().unwrap();
    let pods = wait_active(&env, "calc", 2).await;
    for p in &pods {
        let l = p.labels();
        for (k, v) in [
            ("batch.kubernetes.io/controller-uid", uid.as_str()),
            ("controller-uid", uid.as_str()),
            ("batch.kubernetes.io/job-name", "calc"),
            ("job-name", "calc"),
        ] {
            assert_eq!(
                l.get(k).map(String::as_str),
                Some(v),
                "label {k} of {}",
                p.name_any()
            );
        }
        assert!(p.name_any().starts_with("calc-"));
        assert!(p.finalizers().iter().any(|f| f == FINALIZER));
        assert_eq!(p.owner_references()[0].uid, uid);
    }
    until(
        "the status to show 2 active and a start time",
        10,
        || async {
            let j = job(&env, "calc").await;
            let started = j.status.as_ref().is_some_and(|s| s.start_time.is_some());
            (counts(&j) == (2, 0, 0) && started)
                .then_some(())
                .ok_or(format!("{:?}", counts(&j)))
        },
    )
    .await;

    // The agent: each pod runs and succeeds; never more than 2 at once.
    until("4 completions", 30, || async {
        let active = active_job_pods(&env, "calc").await;
        assert!(active.len() <= 2, "{} pods active", active.len());
        if let Some(p) = active.first() {
            env.set_finished(&p.name_any(), "Succeeded").await;
        }
        let j = job(&env, "calc").await;
        condition(&j, "Complete")
            .map(|_| ())
            .ok_or(format!("{:?}", counts(&j)))
    })
    .await;
    let j = job(&env, "calc").await;
    assert_eq!(counts(&j), (0, 4, 0));
    assert_eq!(
        condition(&j, "Complete").as_deref(),
        Some("CompletionsReached")
    );
    assert!(condition(&j, "SuccessCriteriaMet").is_some());
    assert!(j.status.as_ref().unwrap().completion_time.is_some());
    let pods = job_pods(&env, "calc").await;
    assert_eq!(pods.len(), 4, "exactly one pod per completion");
    assert!(
        pods.iter()
            .all(|p| !p.finalizers().iter().any(|f| f == FINALIZER)),
        "finalizers left"
    );
    env.wait_event("Completed", "Job completed").await;
    let out = env.kubectl(&[
        "wait",
        "--for=condition=complete",
        "job/calc",
        "--timeout=10s",
    ]);
    assert!(out.contains("condition met"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fails_past_the_backoff_limit_and_expires() {
    let env = Env::start(&["job"]).await;
    let spec = "completions: 3\n  parallelism: 3\n  backoffLimit: 1\n  ttlSecondsAfterFinished: 1";
    env.kubectl_stdin(&["apply", "-f", "-"], &job_yaml("flaky", spec));
    let pods = wait_active(&env, "flaky", 3).await;
    env.set_running(&pods[2].name_any(), true).await;
    // Two failures with a limit of one: the Job fails, its last pod goes.
    env.set_finished(&pods[0].name_any(), "Failed").await;
    env.set_finished(&pods[1].name_any(), "Failed").await;
    until("the job to fail", 20, || async {
        let j = job(&env, "flaky").await;
        condition(&j, "Failed")
            .map(|_| ())
            .ok_or(format!("{:?}", counts(&j)))
    })
    .await;
    let j = job(&env, "flaky").await;
    assert_eq!(
        condition(&j, "Failed").as_deref(),
        Some("BackoffLimitExceeded")
    );
    assert_eq!(
        condition(&j, "FailureTarget").as_deref(),
        Some("BackoffLimitExceeded")
    );
    // The running pod was killed, and counts as failed too.
    assert_eq!(counts(&j), (0, 0, 3));
    assert!(active_job_pods(&env, "flaky").await.is_empty());
    env.wait_event(
        "BackoffLimitExceeded",
        "Job has reached the specified backoff limit",
    )
    .await;
    // ttlSecondsAfterFinished: 1.
    until("the finished job to be deleted", 20, || async {
        let j = Api::<Job>::default_namespaced(env.client.clone())
            .get_opt("flaky")
            .await
            .unwrap();
        j.is_none_or(|j| j.metadata.deletion_timestamp.is_some())
            .then_some(())
            .ok_or("still there".into())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaces_a_failed_pod_after_back_off() {
    let env = Env::start(&["job"]).await;
    env.kubectl_stdin(&["apply", "-f", "-"], &job_yaml("retry", "backoffLimit: 2"));
    let first = wait_active(&env, "retry", 1).await[0].name_any();
    env.set_finished(&first, "Failed").await;
    // Upstream's first back-off is 10 s.
    until("a replacement pod", 30, || async {
        let active = active_job_pods(&env, "retry").await;
        active
            .iter()
            .any(|p| p.name_any() != first)
            .then_some(())
            .ok_or(format!("{} active", active.len()))
    })
    .await;
    let second = active_job_pods(&env, "retry").await[0].name_any();
    env.set_finished(&second, "Succeeded").await;
    until("completion after one failure", 20, || async {
        let j = job(&env, "retry").await;
        (condition(&j, "Complete").is_some() && counts(&j) == (0, 1, 1))
            .then_some(())
            .ok_or(format!("{:?}", counts(&j)))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stops_at_the_active_deadline_and_honours_suspend() {
    let env = Env::start(&["job"]).await;
    env.kubectl_stdin(
        &["apply", "-f", "-"],
        &job_yaml(
            "slow",
            "parallelism: 2\n  completions: 2\n  activeDeadlineSeconds: 2",
        ),
    );
    let pods = wait_active(&env, "slow", 2).await;
    for p in &pods {
        env.set_running(&p.name_any(), true).await;
    }
    until("the deadline to fail the job", 20, || async {
        let j = job(&env, "slow").await;
        condition(&j, "Failed")
            .map(|_| ())
            .ok_or(format!("{:?}", counts(&j)))
    })
    .await;
    let j = job(&env, "slow").await;
    assert_eq!(condition(&j, "Failed").as_deref(), Some("DeadlineExceeded"));
    assert_eq!(counts(&j), (0, 0, 2));
    assert!(active_job_pods(&env, "slow").await.is_empty());
    env.wait_event(
        "DeadlineExceeded",
        "Job was active longer than specified deadline",
    )
    .await;

    // Suspended: no pods until resumed.
    env.kubectl_stdin(&["apply", "-f", "-"], &job_yaml("later", "suspend: true"));
    until("the Suspended condition", 20, || async {
        let j = job(&env, "later").await;
        condition(&j, "Suspended")
            .map(|_| ())
            .ok_or("not suspended".into())
    })
    .await;
    assert!(job_pods(&env, "later").await.is_empty());
    Api::<Job>::default_namespaced(env.client.clone())
        .patch(
            "later",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"suspend": false}})),
        )
        .await
        .unwrap();
    wait_active(&env, "later", 1).await;
    env.wait_event("Resumed", "Job resumed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_pods_that_finished_and_were_deleted_while_it_was_down() {
    let mut env = Env::start(&["job"]).await;
    env.kubectl_stdin(
        &["apply", "-f", "-"],
        &job_yaml("batch", "completions: 3\n  parallelism: 3"),
    );
    let pods = wait_active(&env, "batch", 3).await;
    env.stop_controllers().await;
    for p in &pods {
        env.set_finished(&p.name_any(), "Succeeded").await;
    }
    // Deleted before anyone counted it: the tracking finalizer keeps it.
    env.pods()
        .delete(&pods[0].name_any(), &Default::default())
        .await
        .unwrap();
    env.start_controllers(&["job"]).await;
    until("completion with every pod counted once", 20, || async {
        let j = job(&env, "batch").await;
        (condition(&j, "Complete").is_some() && counts(&j) == (0, 3, 0))
            .then_some(())
            .ok_or(format!("{:?}", counts(&j)))
    })
    .await;
    until("the deleted pod gone once counted", 10, || async {
        let gone = env
            .pods()
            .get_opt(&pods[0].name_any())
            .await
            .unwrap()
            .is_none();
        gone.then_some(()).ok_or("still there".into())
    })
    .await;
    assert_eq!(
        job_pods(&env, "batch").await.len(),
        2,
        "no pod was re-created"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_managed_by_another_controller_is_left_alone() {
    let env = Env::start(&["job"]).await;
    env.kubectl_stdin(
        &["apply", "-f", "-"],
        &job_yaml("theirs", "managedBy: example.com/other"),
    );
    env.kubectl_stdin(&["apply", "-f", "-"], &job_yaml("ours", "completions: 1"));
    // Both were seen by the controller by the time ours has its pod.
    until("a pod for ours", 20, || async {
        let n = env.list_pods("job-name=ours").await.len();
        (n == 1).then_some(()).ok_or(format!("{n} pods"))
    })
    .await;
    assert!(env.list_pods("job-name=theirs").await.is_empty());
    assert!(job(&env, "theirs")
        .await
        .status
        .unwrap_or_default()
        .start_time
        .is_none());

    let out = env.server.kubectl(&[
        "patch",
        "job",
        "theirs",
        "--type=merge",
        "-p",
        r#"{"spec":{"managedBy":"kubernetes.io/job-controller"}}"#,
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("spec.managedBy") && err.contains("field is immutable"),
        "{err}"
    );
}

/// As the agent: the pod's container `c` exited with `code` (Succeeded
/// for 0, Failed otherwise), with the pod conditions given.
async fn exit(env: &Env, pod: &str, code: i32, conditions: serde_json::Value) {
    let phase = if code == 0 { "Succeeded" } else { "Failed" };
    let mut conds = vec![json!({"type": "Ready", "status": "False"})];
    conds.extend(conditions.as_array().cloned().unwrap_or_default());
    let patch = json!({"status": {"phase": phase, "conditions": conds, "containerStatuses": [{
        "name": "c", "image": "busybox:1", "imageID": "", "ready": false, "restartCount": 0,
        "state": {"terminated": {"exitCode": code, "reason": if code == 0 { "Completed" } else { "Error" }}}
    }]}});
    env.pods()
        .patch_status(pod, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("finishing pod {pod}: {e}"));
}

fn index_of(p: &Pod) -> i32 {
    p.annotations()["batch.kubernetes.io/job-completion-index"]
        .parse()
        .unwrap()
}

async fn job_status(env: &Env, name: &str) -> k8s_openapi::api::batch::v1::JobStatus {
    job(env, name).await.status.unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn indexed_jobs_run_each_index_once() {
    let env = Env::start(&["job"]).await;
    env.kubectl_stdin(
        &["apply", "-f", "-"],
        &job_yaml(
            "ix",
            "completionMode: Indexed\n  completions: 4\n  parallelism: 2",
        ),
    );
    let pods = wait_active(&env, "ix", 2).await;
    let mut first: Vec<i32> = pods.iter().map(index_of).collect();
    first.sort();
    assert_eq!(first, [0, 1], "the lowest indexes first");
    for p in &pods {
        let i = index_of(p);
        assert!(
            p.name_any().starts_with(&format!("ix-{i}-")),
            "{}",
            p.name_any()
        );
        assert_eq!(
            p.labels()["batch.kubernetes.io/job-completion-index"],
            i.to_string()
        );
        let spec = p.spec.clone().unwrap();
        assert_eq!(spec.hostname, Some(format!("ix-{i}")));
        let env_var = &spec.containers[0].env.clone().unwrap()[0];
        assert_eq!(env_var.name, "JOB_COMPLETION_INDEX");
        assert_eq!(
            env_var
                .value_from
                .clone()
                .unwrap()
                .field_ref
                .unwrap()
                .field_path,
            "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        );
    }
    // Index 1 succeeds: the next pending index starts.
    let one = pods.iter().find(|p| index_of(p) == 1).unwrap().name_any();
    exit(&env, &one, 0, json!([])).await;
    until("index 1 completed and index 2 started", 20, || async {
        let st = job_status(&env, "ix").await;
        let active: Vec<i32> = active_job_pods(&env, "ix")
            .await
            .iter()
            .map(index_of)
            .collect();
        (st.completed_indexes.as_deref() == Some("1") && active.contains(&2))
            .then_some(())
            .ok_or(format!("{:?} {active:?}", st.completed_indexes))
    })
    .await;
    for p in active_job_pods(&env, "ix").await {
        exit(&env, &p.name_any(), 0, json!([])).await;
    }
    wait_active(&env, "ix", 1).await;
    for p in active_job_pods(&env, "ix").await {
        assert_eq!(index_of(&p), 3);
        exit(&env, &p.name_any(), 0, json!([])).await;
    }
    until("completion with every index", 20, || async {
        let j = job(&env, "ix").await;
        let st = j.status.clone().unwrap_or_default();
        (condition(&j, "Complete").as_deref() == Some("CompletionsReached")
            && st.completed_indexes.as_deref() == Some("0-3")
            && counts(&j) == (0, 4, 0))
            .then_some(())
            .ok_or(format!("{:?} {:?}", st.completed_indexes, counts(&j)))
    })
    .await;
    let all = job_pods(&env, "ix").await;
    assert_eq!(all.len(), 4, "one pod per index");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_failure_policy_ignores_counts_and_fails() {
    let env = Env::start(&["job"]).await;
    let policy = "backoffLimit: 0\n  podFailurePolicy:\n    rules:\n    - action: Ignore\n      onExitCodes: {operator: In, values: [42]}\n    - action: Ignore\n      onPodConditions: [{type: DisruptionTarget}]\n    - action: FailJob\n      onExitCodes: {containerName: c, operator: In, values: [3]}";
    env.kubectl_stdin(&["apply", "-f", "-"], &job_yaml("pfp", policy));
    let j = job(&env, "pfp").await;
    assert_eq!(
        j.spec.as_ref().unwrap().pod_replacement_policy.as_deref(),
        Some("Failed")
    );
    // Exit 42 and an eviction are ignored: replaced at once, not counted,
    // although backoffLimit is 0.
    let first = wait_active(&env, "pfp", 1).await[0].name_any();
    exit(&env, &first, 42, json!([])).await;
    let replaced = |old: String| {
        let env = &env;
        async move {
            until("a replacement pod", 20, || async {
                let active = active_job_pods(env, "pfp").await;
                active
                    .iter()
                    .find(|p| p.name_any() != old)
                    .map(|p| p.name_any())
                    .ok_or(format!("{} active", active.len()))
                    .map(|_| ())
            })
            .await;
            active_job_pods(env, "pfp").await[0].name_any()
        }
    };
    let second = replaced(first).await;
    exit(
        &env,
        &second,
        137,
        json!([{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}]),
    )
    .await;
    let third = replaced(second).await;
    assert_eq!(
        counts(&job(&env, "pfp").await).2,
        0,
        "ignored failures count"
    );
    // Exit 3 fails the Job by rule.
    exit(&env, &third, 3, json!([])).await;
    until("the policy to fail the job", 20, || async {
        let j = job(&env, "pfp").await;
        condition(&j, "Failed")
            .filter(|r| r == "PodFailurePolicy")
            .map(|_| ())
            .ok_or(format!("{:?}", j.status))
    })
    .await;
    let j = job(&env, "pfp").await;
    assert_eq!(counts(&j), (0, 0, 1));
    env.wait_event(
        "PodFailurePolicy",
        &format!("Container c for pod default/{third} failed with exit code 3 matching FailJob rule at index 2"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_index_limits_and_success_policy() {
    let env = Env::start(&["job"]).await;
    // Index failures: index 0 fails twice (backoffLimitPerIndex 1), FailIndex
    // ends index 1 at once; two failed indexes exceed maxFailedIndexes 1.
    let spec = "completionMode: Indexed\n  completions: 3\n  parallelism: 3\n  backoffLimitPerIndex: 1\n  maxFailedIndexes: 1\n  podFailurePolicy:\n    rules:\n    - action: FailIndex\n      onExitCodes: {operator: In, values: [7]}";
    env.kubectl_stdin(&["apply", "-f", "-"], &job_yaml("per", spec));
    let pods = wait_active(&env, "per", 3).await;
    let of = |i: i32| pods.iter().find(|p| index_of(p) == i).unwrap().name_any();
    exit(&env, &of(1), 7, json!([])).await;
    until("index 1 failed", 20, || async {
        let st = job_status(&env, "per").await;
        (st.failed_indexes.as_deref() == Some("1"))
            .then_some(())
            .ok_or(format!("{:?}", st.failed_indexes))
    })
    .await;
    exit(&env, &of(0), 1, json!([])).await;
    // The replacement for index 0 comes after the back-off, one failure on.
    let retry = until_pod_for(&env, "per", 0, &of(0)).await;
    assert_eq!(
        retry.annotations()["batch.kubernetes.io/job-index-failure-count"],
        "1"
    );
    exit(&env, &retry.name_any(), 1, json!([])).await;
    until("too many failed indexes", 20, || async {
        let j = job(&env, "per").await;
        condition(&j, "Failed")
            .filter(|r| r == "MaxFailedIndexesExceeded")
            .map(|_| ())
            .ok_or(format!("{:?}", j.status))
    })
    .await;
    assert!(active_job_pods(&env, "per").await.is_empty());
    assert_eq!(
        job_status(&env, "per").await.failed_indexes.as_deref(),
        Some("0-1")
    );

    // A success policy ends the Job once indexes 0 and 2 succeeded; the
    // rest is stopped.
    let spec = "completionMode: Indexed\n  completions: 3\n  parallelism: 3\n  successPolicy:\n    rules:\n    - succeededIndexes: \"0,2\"";
    env.kubectl_stdin(&["apply", "-f", "-"], &job_yaml("lead", spec));
    let pods = wait_active(&env, "lead", 3).await;
    for p in pods.iter().filter(|p| index_of(p) != 1) {
        exit(&env, &p.name_any(), 0, json!([])).await;
    }
    until("the success policy to complete the job", 20, || async {
        let j = job(&env, "lead").await;
        let st = j.status.clone().unwrap_or_default();
        let interim = st.conditions.iter().flatten().any(|c| {
            c.type_ == "SuccessCriteriaMet"
                && c.message.as_deref() == Some("Matched rules at index 0")
        });
        if condition(&j, "Complete").as_deref() == Some("SuccessPolicy") && interim {
            return Ok(());
        }
        // As the agent: the pod the policy stopped ends.
        for p in job_pods(&env, "lead").await {
            if p.metadata.deletion_timestamp.is_some() {
                env.force_delete(&p.name_any()).await;
            }
        }
        Err(format!("{:?}", st.conditions))
    })
    .await;
    let st = job_status(&env, "lead").await;
    assert_eq!(st.completed_indexes.as_deref(), Some("0,2"));
    assert_eq!(st.succeeded, Some(2));
}

/// The active pod for index `i` of `name` that is not `old`.
async fn until_pod_for(env: &Env, name: &str, i: i32, old: &str) -> Pod {
    until(&format!("a new pod for index {i}"), 60, || async {
        let active = active_job_pods(env, name).await;
        active
            .iter()
            .any(|p| index_of(p) == i && p.name_any() != old)
            .then_some(())
            .ok_or(format!("{} active", active.len()))
    })
    .await;
    active_job_pods(env, name)
        .await
        .into_iter()
        .find(|p| index_of(p) == i && p.name_any() != old)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_policies_are_refused_with_upstream_messages() {
    let env = Env::start(&[]).await;
    for (spec, want) in [
        ("completionMode: Indexed", "spec.completions: Required value: when completion mode is Indexed"),
        ("backoffLimitPerIndex: 1", "spec.backoffLimitPerIndex: Invalid value: \"1\": requires indexed completion mode"),
        (
            "podFailurePolicy:\n    rules:\n    - action: FailJob\n      onExitCodes: {operator: In, values: [0]}",
            "must not be 0 for the In operator",
        ),
        ("backoffLimit: -1", "spec.backoffLimit"),
    ] {
        let out = env.server.kubectl_stdin(&["apply", "-f", "-"], &job_yaml("bad", spec));
        assert!(!out.status.success(), "{spec} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{spec}: {err}");
    }
}
