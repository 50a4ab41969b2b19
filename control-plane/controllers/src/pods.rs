//! Pods as the workload controllers see them: which count (active, ready,
//! available after minReadySeconds), how a pod is made from a template, in
//! which order surplus pods go (upstream `ActivePodsWithRanks`), and
//! creation with its events and expectations (upstream `PodControl`), in
//! slow-start batches (upstream `slowStartBatch`).

use std::cmp::Ordering;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::PostParams;
use kube::{Api, Resource, ResourceExt};
use kube_util::events::Recorder;

use crate::workload;
use crate::workload_expectations::Expectations;

/// Annotation that orders pods for scale-down (lower goes first).
pub const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";

/// The pod's phase, `Pending` when it has none yet.
pub fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

/// Finished: `Succeeded` or `Failed`.
pub fn is_finished(p: &Pod) -> bool {
    matches!(phase(p), "Succeeded" | "Failed")
}

/// Counts as a replica: not finished and not being deleted (upstream
/// `FilterActivePods`).
pub fn is_active(p: &Pod) -> bool {
    !is_finished(p) && p.metadata.deletion_timestamp.is_none()
}

/// Since when the pod has been Ready, if it is.
pub fn ready_since(p: &Pod) -> Option<Timestamp> {
    let c = p
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?;
    if c.status != "True" {
        return None;
    }
    // A Ready condition without a time has been ready "forever".
    Some(
        c.last_transition_time
            .as_ref()
            .map(|t| t.0)
            .unwrap_or(Timestamp::UNIX_EPOCH),
    )
}

pub fn is_ready(p: &Pod) -> bool {
    ready_since(p).is_some()
}

/// When the pod becomes (or became) available: Ready for
/// `min_ready_seconds`. `None` when it is not Ready.
pub fn available_at(p: &Pod, min_ready_seconds: i32) -> Option<Timestamp> {
    let since = ready_since(p)?;
    Some(
        since
            .checked_add(jiff::SignedDuration::from_secs(i64::from(
                min_ready_seconds.max(0),
            )))
            .unwrap_or(since),
    )
}

/// Ready for at least `min_ready_seconds` at `now` (upstream
/// `IsPodAvailable`).
pub fn is_available(p: &Pod, min_ready_seconds: i32, now: Timestamp) -> bool {
    available_at(p, min_ready_seconds).is_some_and(|at| min_ready_seconds == 0 || at < now)
}

/// How long until the first of `pods` that is Ready but not yet available
/// becomes available; a controller requeues itself then.
pub fn next_available_in(
    pods: &[Arc<Pod>],
    min_ready_seconds: i32,
    now: Timestamp,
) -> Option<std::time::Duration> {
    if min_ready_seconds <= 0 {
        return None;
    }
    pods.iter()
        .filter_map(|p| available_at(p, min_ready_seconds))
        .filter(|at| *at >= now)
        .min()
        .map(|at| {
            let d = at.duration_since(now);
            // One second past, so the check `at < now` holds then.
            std::time::Duration::from_secs(d.as_secs().max(0) as u64 + 1)
        })
}

/// A pod made from `template` for `owner`, named `<generate_name><random>`
/// by the API server (upstream `GetPodFromTemplate`).
pub fn from_template(
    template: &PodTemplateSpec,
    generate_name: String,
    owner: OwnerReference,
) -> Pod {
    let tm = template.metadata.clone().unwrap_or_default();
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(generate_name),
            labels: tm.labels,
            annotations: tm.annotations,
            finalizers: tm.finalizers,
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: template.spec.clone(),
        status: None,
    }
}

/// Create `pod` for `owner` as upstream's `PodControl.CreatePods`: a
/// `SuccessfulCreate` or `FailedCreate` event on the owner, and the
/// creation observed in `expectations` under `key` whatever the outcome.
/// A namespace being deleted is no error: its pods go anyway.
///
/// # Errors
/// The API's refusal, for the caller to stop its slow start on.
pub async fn create<K: Resource<DynamicType = ()>>(
    api: &Api<Pod>,
    pod: &Pod,
    owner: &K,
    events: &Recorder,
    expectations: &Expectations,
    key: &str,
) -> Result<(), kube::Error> {
    match api.create(&PostParams::default(), pod).await {
        Ok(p) => {
            let name = p.name_any();
            expectations.created(key, Some(&name));
            events.normal(owner, "SuccessfulCreate", format!("Created pod: {name}"));
            Ok(())
        }
        Err(e) if workload::is_namespace_terminating(&e) => {
            expectations.created(key, None);
            Ok(())
        }
        Err(e) => {
            expectations.created(key, None);
            events.warning(owner, "FailedCreate", format!("Error creating: {e}"));
            Err(e)
        }
    }
}

/// The name prefix for pods of `owner` (upstream
/// `getPodsPrefix`: the owner's name and a dash, cut so the API's random
/// suffix still fits in a name).
pub fn name_prefix(owner: &str) -> String {
    const MAX: usize = 63 - 5;
    let mut p = format!("{owner}-");
    if p.len() > MAX {
        p.truncate(MAX);
    }
    p
}

fn phase_rank(p: &Pod) -> u8 {
    match phase(p) {
        "Unknown" => 1,
        "Running" => 2,
        _ => 0,
    }
}

fn deletion_cost(p: &Pod) -> i32 {
    p.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DELETION_COST))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn max_restarts(p: &Pod) -> i32 {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .map(|c| c.restart_count)
        .max()
        .unwrap_or(0)
}

fn node(p: &Pod) -> &str {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or_default()
}

/// Which bucket of powers of two `t` falls in, counting back from `now`
/// (upstream `LogarithmicScaleDown`: pods of about the same age are equal,
/// so scale-down does not always hit the same failure domain).
fn log_age(t: Timestamp, now: Timestamp) -> i64 {
    let d = now.duration_since(t).as_nanos();
    if d > 0 {
        (d as f64).log2() as i64
    } else {
        -1
    }
}

/// Compare by time, newer (or unknown) first; pods of about the same age
/// tie, broken by uid.
fn newer_first(
    a: Option<Timestamp>,
    b: Option<Timestamp>,
    now: Timestamp,
    pa: &Pod,
    pb: &Pod,
) -> Option<Ordering> {
    if a == b {
        return None;
    }
    match (a, b) {
        (None, _) => Some(Ordering::Less),
        (_, None) => Some(Ordering::Greater),
        (Some(a), Some(b)) => {
            let diff = log_age(a, now) - log_age(b, now);
            Some(match diff.cmp(&0) {
                Ordering::Equal => pa.metadata.uid.cmp(&pb.metadata.uid),
                o => o,
            })
        }
    }
}

/// Order in which surplus pods are deleted, most expendable first
/// (upstream `ActivePodsWithRanks.Less`): unscheduled before scheduled,
/// Pending before Unknown before Running, not ready before ready, lower
/// deletion cost first, pods doubled up on a node (by `rank`) first, ready
/// for less time before more, more restarts first, newer before older.
pub fn deletion_order(a: &Pod, rank_a: usize, b: &Pod, rank_b: usize, now: Timestamp) -> Ordering {
    let (na, nb) = (node(a), node(b));
    if na != nb && (na.is_empty() || nb.is_empty()) {
        return if na.is_empty() {
            Ordering::Less
        } else {
            Ordering::Greater
        };
    }
    let by = phase_rank(a)
        .cmp(&phase_rank(b))
        .then(is_ready(a).cmp(&is_ready(b)))
        .then(deletion_cost(a).cmp(&deletion_cost(b)))
        .then(rank_b.cmp(&rank_a));
    if by != Ordering::Equal {
        return by;
    }
    if is_ready(a) && is_ready(b) {
        if let Some(o) = newer_first(ready_since(a), ready_since(b), now, a, b) {
            return o;
        }
    }
    let restarts = max_restarts(b).cmp(&max_restarts(a));
    if restarts != Ordering::Equal {
        return restarts;
    }
    let created = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
    if let Some(o) = newer_first(created(a), created(b), now, a, b) {
        return o;
    }
    a.metadata.uid.cmp(&b.metadata.uid)
}

/// The `n` pods of `pods` to delete first. `related` are the active pods
/// of the same owner family (all ReplicaSets of one Deployment); a pod
/// sharing its node with more of them goes earlier.
pub fn pick_victims(
    pods: &[Arc<Pod>],
    related: &[Arc<Pod>],
    n: usize,
    now: Timestamp,
) -> Vec<Arc<Pod>> {
    if n >= pods.len() {
        return pods.to_vec();
    }
    let mut on_node: HashMap<&str, usize> = HashMap::new();
    for p in related.iter().filter(|p| is_active(p)) {
        *on_node.entry(node(p)).or_default() += 1;
    }
    let mut ranked: Vec<(Arc<Pod>, usize)> = pods
        .iter()
        .map(|p| (p.clone(), on_node.get(node(p)).copied().unwrap_or(0)))
        .collect();
    ranked.sort_by(|(a, ra), (b, rb)| deletion_order(a, *ra, b, *rb, now));
    ranked.into_iter().take(n).map(|(p, _)| p).collect()
}

/// Run `count` calls of `f(i)` in batches of 1, 2, 4, ... (upstream
/// `slowStartBatch`): a template that cannot be created fails once, not
/// hundreds of times. Stops after the first batch with an error. Returns
/// how many calls succeeded, how many were made, and the first error.
pub async fn slow_start<F, Fut, E>(count: usize, f: F) -> (usize, usize, Option<E>)
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = Result<(), E>>,
{
    let mut done = 0;
    let mut ok = 0;
    let mut batch = count.min(1);
    while batch > 0 {
        let results = futures::future::join_all((done..done + batch).map(&f)).await;
        done += batch;
        let mut first = None;
        for r in results {
            match r {
                Ok(()) => ok += 1,
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        if first.is_some() {
            return (ok, done, first);
        }
        batch = (2 * batch).min(count - done);
    }
    (ok, done, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodCondition, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn pod(name: &str, node: &str, phase: &str, ready_at: Option<i64>, created: i64) -> Arc<Pod> {
        Arc::new(Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                uid: Some(name.into()),
                creation_timestamp: Some(Time(Timestamp::from_second(created).unwrap())),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: (!node.is_empty()).then(|| node.to_string()),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some(phase.into()),
                conditions: ready_at.map(|t| {
                    vec![PodCondition {
                        type_: "Ready".into(),
                        status: "True".into(),
                        last_transition_time: Some(Time(Timestamp::from_second(t).unwrap())),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
        })
    }

    #[test]
    fn victims_follow_upstream_order() {
        let now = Timestamp::from_second(1_000_000).unwrap();
        let ready_running = pod("ready", "n1", "Running", Some(100), 10);
        let unready_running = pod("unready", "n1", "Running", None, 10);
        let pending = pod("pending", "n1", "Pending", None, 10);
        let unscheduled = pod("unscheduled", "", "Pending", None, 10);
        let all = vec![
            ready_running.clone(),
            unready_running.clone(),
            pending.clone(),
            unscheduled.clone(),
        ];
        let names = |v: Vec<Arc<Pod>>| -> Vec<String> {
            v.iter().map(|p| p.metadata.name.clone().unwrap()).collect()
        };
        assert_eq!(
            names(pick_victims(&all, &all, 3, now)),
            ["unscheduled", "pending", "unready"]
        );
        // Among equals, the newer goes first.
        let old = pod("old", "n1", "Running", Some(100), 10);
        let new = pod("new", "n1", "Running", Some(999_000), 999_000);
        assert_eq!(
            names(pick_victims(&[old.clone(), new.clone()], &[], 1, now)),
            ["new"]
        );
        // A pod doubled up on a node goes before one alone on its node.
        let alone = pod("alone", "n2", "Running", Some(100), 10);
        let doubled = pod("doubled", "n1", "Running", Some(100), 10);
        let related = vec![alone.clone(), doubled.clone(), old];
        assert_eq!(
            names(pick_victims(&[alone, doubled], &related, 1, now)),
            ["doubled"]
        );
    }

    #[test]
    fn availability_waits_min_ready_seconds() {
        let p = pod("p", "", "Running", Some(100), 10);
        let at = |s| Timestamp::from_second(s).unwrap();
        assert!(is_available(&p, 0, at(100)));
        assert!(!is_available(&p, 10, at(105)));
        assert!(is_available(&p, 10, at(111)));
        assert_eq!(
            next_available_in(&[p], 10, at(105)),
            Some(std::time::Duration::from_secs(6))
        );
    }

    #[tokio::test]
    async fn slow_start_batches_double_and_stop_on_errors() {
        let calls = std::sync::Mutex::new(Vec::new());
        let (ok, made, err) = slow_start(10, |i| {
            calls.lock().unwrap().push(i);
            async move {
                if i == 4 {
                    Err("boom")
                } else {
                    Ok(())
                }
            }
        })
        .await;
        // Batches 1, 2, 4: the third holds the failure, so 7 calls made.
        assert_eq!((ok, made, err), (6, 7, Some("boom")));
        let (ok, made, err) = slow_start(5, |_| async { Ok::<(), ()>(()) }).await;
        assert_eq!((ok, made, err), (5, 5, None));
    }
}
