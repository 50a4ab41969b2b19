//! The arithmetic of Deployment rollouts, free of I/O (upstream
//! `pkg/controller/deployment/util`): revisions and the annotations that
//! carry them, which ReplicaSet is the new one, surge and unavailability
//! fenceposts, proportional scaling, and the status with its Available and
//! Progressing conditions.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition, DeploymentStatus, ReplicaSet};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::workload::Result;
use crate::workload_hash::fenceposts;

/// Label that ties a ReplicaSet and its pods to one template.
pub const POD_TEMPLATE_HASH: &str = "pod-template-hash";
/// The rollout number of a ReplicaSet (and of its Deployment).
pub const REVISION: &str = "deployment.kubernetes.io/revision";
/// Earlier revisions a ReplicaSet had before a rollback reused it.
pub const REVISION_HISTORY: &str = "deployment.kubernetes.io/revision-history";
/// The Deployment's replicas when the ReplicaSet was last scaled.
pub const DESIRED_REPLICAS: &str = "deployment.kubernetes.io/desired-replicas";
/// replicas + maxSurge when the ReplicaSet was last scaled.
pub const MAX_REPLICAS: &str = "deployment.kubernetes.io/max-replicas";
/// How long revision-history may grow (upstream default).
const MAX_REVISION_HISTORY_CHARS: usize = 2000;

/// Deployment annotations that are not copied to its ReplicaSets.
const NOT_COPIED: &[&str] = &[
    "kubectl.kubernetes.io/last-applied-configuration",
    REVISION,
    REVISION_HISTORY,
    DESIRED_REPLICAS,
    MAX_REPLICAS,
    "deprecated.deployment.rollback.to",
];

// Condition reasons (upstream `deploymentutil`).
pub const NEW_RS_CREATED: &str = "NewReplicaSetCreated";
pub const FOUND_NEW_RS: &str = "FoundNewReplicaSet";
pub const RS_UPDATED: &str = "ReplicaSetUpdated";
pub const NEW_RS_AVAILABLE: &str = "NewReplicaSetAvailable";
pub const TIMED_OUT: &str = "ProgressDeadlineExceeded";
pub const FAILED_RS_CREATE: &str = "ReplicaSetCreateError";
pub const PAUSED: &str = "DeploymentPaused";
pub const RESUMED: &str = "DeploymentResumed";
pub const MIN_AVAILABLE: &str = "MinimumReplicasAvailable";
pub const MIN_UNAVAILABLE: &str = "MinimumReplicasUnavailable";

/// `spec.replicas` of a Deployment (the API defaults it to 1).
pub fn desired(d: &Deployment) -> i32 {
    d.spec.replicas.unwrap_or(1)
}

/// `spec.replicas` of a ReplicaSet.
pub fn rs_replicas(rs: &ReplicaSet) -> i32 {
    rs.spec.replicas.unwrap_or(1)
}

fn rs_status<T: Default>(
    rs: &ReplicaSet,
    f: impl Fn(&k8s_openapi::api::apps::v1::ReplicaSetStatus) -> T,
) -> T {
    rs.status.as_ref().map(f).unwrap_or_default()
}

pub fn rs_actual(rs: &ReplicaSet) -> i32 {
    rs_status(rs, |s| s.replicas)
}

pub fn rs_ready(rs: &ReplicaSet) -> i32 {
    rs_status(rs, |s| s.ready_replicas.unwrap_or(0))
}

pub fn rs_available(rs: &ReplicaSet) -> i32 {
    rs_status(rs, |s| s.available_replicas.unwrap_or(0))
}

/// Whether the ReplicaSet controller has seen the ReplicaSet's current
/// spec, so that its status counts can be trusted for decisions.
pub fn rs_observed(rs: &ReplicaSet) -> bool {
    rs_status(rs, |s| s.observed_generation.unwrap_or(0)) >= rs.metadata.generation.unwrap_or(0)
}

fn annotation<'a>(rs: &'a ReplicaSet, key: &str) -> Option<&'a str> {
    rs.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// The revision annotation of a ReplicaSet, 0 when missing or malformed.
pub fn revision(rs: &ReplicaSet) -> i64 {
    annotation(rs, REVISION)
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

pub fn max_revision(rss: &[ReplicaSet]) -> i64 {
    rss.iter().map(revision).max().unwrap_or(0)
}

pub fn is_rolling(d: &Deployment) -> bool {
    d.spec.strategy.as_ref().and_then(|s| s.type_.as_deref()) != Some("Recreate")
}

/// (maxSurge, maxUnavailable) resolved against the desired replicas; both
/// zero for Recreate. maxUnavailable never exceeds the replicas.
///
/// # Errors
/// A fencepost is malformed.
pub fn surge_and_unavailable(d: &Deployment) -> Result<(i32, i32)> {
    if !is_rolling(d) {
        return Ok((0, 0));
    }
    let ru = d
        .spec
        .strategy
        .as_ref()
        .and_then(|s| s.rolling_update.as_ref());
    let (surge, unavailable) = fenceposts(
        ru.and_then(|r| r.max_surge.as_ref()),
        ru.and_then(|r| r.max_unavailable.as_ref()),
        desired(d),
    )?;
    let unavailable = if desired(d) == 0 {
        0
    } else {
        unavailable.min(desired(d))
    };
    Ok((surge, unavailable))
}

/// Templates equal but for the pod-template-hash label (upstream
/// `EqualIgnoreHash`): the ReplicaSet whose template is the Deployment's.
pub fn equal_ignore_hash(a: &PodTemplateSpec, b: &PodTemplateSpec) -> bool {
    let strip = |t: &PodTemplateSpec| {
        let mut t = t.clone();
        if let Some(m) = t.metadata.as_mut() {
            if let Some(l) = m.labels.as_mut() {
                l.remove(POD_TEMPLATE_HASH);
                if l.is_empty() {
                    m.labels = None;
                }
            }
        }
        t
    };
    strip(a) == strip(b)
}

fn oldest_first(a: &ReplicaSet, b: &ReplicaSet) -> std::cmp::Ordering {
    a.metadata
        .creation_timestamp
        .cmp(&b.metadata.creation_timestamp)
        .then_with(|| a.metadata.name.cmp(&b.metadata.name))
}

/// The index of the ReplicaSet running the Deployment's template; the
/// oldest wins if several do (upstream `FindNewReplicaSet`).
pub fn find_new(d: &Deployment, rss: &[ReplicaSet]) -> Option<usize> {
    let mut idx: Vec<usize> = (0..rss.len()).collect();
    idx.sort_by(|&a, &b| oldest_first(&rss[a], &rss[b]));
    idx.into_iter().find(|&i| {
        rss[i]
            .spec
            .template
            .as_ref()
            .is_some_and(|t| equal_ignore_hash(t, &d.spec.template))
    })
}

/// Copy the Deployment's annotations (but those that are the controller's
/// own) onto a ReplicaSet's. Returns whether anything changed.
fn copy_annotations(d: &Deployment, to: &mut BTreeMap<String, String>) -> bool {
    let mut changed = false;
    for (k, v) in d.metadata.annotations.iter().flatten() {
        if NOT_COPIED.contains(&k.as_str()) || to.get(k) == Some(v) {
            continue;
        }
        to.insert(k.clone(), v.clone());
        changed = true;
    }
    changed
}

/// Set desired-replicas and max-replicas. Returns whether they changed.
pub fn set_replicas_annotations(rs: &mut ReplicaSet, desired: i32, max: i32) -> bool {
    let a = rs.metadata.annotations.get_or_insert_with(BTreeMap::new);
    let mut changed = false;
    for (k, v) in [(DESIRED_REPLICAS, desired), (MAX_REPLICAS, max)] {
        let v = v.to_string();
        if a.get(k) != Some(&v) {
            a.insert(k.to_string(), v);
            changed = true;
        }
    }
    changed
}

pub fn replicas_annotations_need_update(rs: &ReplicaSet, desired: i32, max: i32) -> bool {
    annotation(rs, DESIRED_REPLICAS) != Some(desired.to_string().as_str())
        || annotation(rs, MAX_REPLICAS) != Some(max.to_string().as_str())
}

fn desired_annotation(rs: &ReplicaSet) -> Option<i32> {
    annotation(rs, DESIRED_REPLICAS)?.parse().ok()
}

fn max_annotation(rs: &ReplicaSet) -> Option<i32> {
    annotation(rs, MAX_REPLICAS)?.parse().ok()
}

/// Annotate the new ReplicaSet (upstream `SetNewReplicaSetAnnotations`):
/// the Deployment's annotations, the revision `new_revision` unless it
/// already has a higher one (a reused ReplicaSet keeps its earlier
/// revisions in revision-history), and on creation the replicas
/// annotations. Returns whether anything changed.
pub fn set_new_rs_annotations(
    d: &Deployment,
    rs: &mut ReplicaSet,
    new_revision: i64,
    exists: bool,
    max_surge: i32,
) -> bool {
    let mut a = rs.metadata.annotations.take().unwrap_or_default();
    let mut changed = copy_annotations(d, &mut a);
    let old = a.get(REVISION).cloned();
    let old_rev: i64 = match old.as_deref() {
        None => 0,
        Some(r) => match r.parse() {
            Ok(r) => r,
            // Someone else's idea of a revision: leave it alone.
            Err(_) => {
                rs.metadata.annotations = Some(a);
                return changed;
            }
        },
    };
    if old_rev < new_revision {
        a.insert(REVISION.to_string(), new_revision.to_string());
        changed = true;
        if let Some(old) = old {
            let hist = a.get(REVISION_HISTORY).cloned().unwrap_or_default();
            let mut revs: Vec<&str> = hist.split(',').filter(|s| !s.is_empty()).collect();
            revs.push(&old);
            while revs.join(",").len() > MAX_REVISION_HISTORY_CHARS && revs.len() > 1 {
                revs.remove(0);
            }
            a.insert(REVISION_HISTORY.to_string(), revs.join(","));
        }
    }
    rs.metadata.annotations = Some(a);
    if !exists && set_replicas_annotations(rs, desired(d), desired(d) + max_surge) {
        changed = true;
    }
    changed
}

/// Replicas of the new ReplicaSet for the next step of a rollout (upstream
/// `NewRSNewReplicas`). `current` counts the pods of all ReplicaSets; for
/// surge the larger of spec and status replicas of each is counted, so
/// pods of an old ReplicaSet that is still scaling down are not exceeded.
pub fn new_rs_new_replicas(d: &Deployment, current: i32, new_rs: i32, max_surge: i32) -> i32 {
    if !is_rolling(d) {
        return desired(d);
    }
    let max_total = desired(d) + max_surge;
    if current >= max_total {
        return new_rs;
    }
    new_rs + (max_total - current).min(desired(d) - new_rs).max(0)
}

/// Pods a ReplicaSet may have for surge accounting: what it wants, or what
/// it still has while scaling down.
pub fn surge_count(rss: &[&ReplicaSet]) -> i32 {
    rss.iter()
        .map(|rs| rs_replicas(rs).max(rs_actual(rs)))
        .sum()
}

/// The new ReplicaSet runs the full, fully available Deployment (upstream
/// `IsSaturated`).
pub fn is_saturated(d: &Deployment, rs: &ReplicaSet) -> bool {
    rs_replicas(rs) == desired(d)
        && desired_annotation(rs) == Some(desired(d))
        && rs_available(rs) == desired(d)
}

/// When only one ReplicaSet has replicas, it (or, with none, the newest)
/// is the one a scaling event resizes (upstream `FindActiveOrLatest`).
pub fn find_active_or_latest<'a>(
    new_rs: Option<&'a ReplicaSet>,
    old: &'a [ReplicaSet],
) -> Option<&'a ReplicaSet> {
    let mut old_sorted: Vec<&ReplicaSet> = old.iter().collect();
    old_sorted.sort_by(|a, b| oldest_first(b, a));
    let active: Vec<&ReplicaSet> = old_sorted
        .iter()
        .copied()
        .chain(new_rs)
        .filter(|rs| rs_replicas(rs) > 0)
        .collect();
    match active.len() {
        0 => new_rs.or_else(|| old_sorted.first().copied()),
        1 => Some(active[0]),
        _ => None,
    }
}

/// Whether some active ReplicaSet was sized for other Deployment replicas
/// (upstream `isScalingEvent`).
pub fn is_scaling_event(d: &Deployment, all: &[&ReplicaSet]) -> bool {
    all.iter()
        .filter(|rs| rs_replicas(rs) > 0)
        .any(|rs| desired_annotation(rs).is_some_and(|a| a != desired(d)))
}

/// New sizes (by index into `active`) that spread a change of the
/// Deployment's replicas over its active ReplicaSets in proportion to
/// their sizes (upstream `scale` for rolling Deployments). `active` holds
/// ReplicaSets with replicas; `newer_first` their creation order rank.
pub fn proportional_sizes(
    d: &Deployment,
    active: &[&ReplicaSet],
    max_surge: i32,
    status_replicas: i32,
) -> Vec<i32> {
    let total: i32 = active.iter().map(|rs| rs_replicas(rs)).sum();
    let allowed = if desired(d) > 0 {
        desired(d) + max_surge
    } else {
        0
    };
    let to_add = allowed - total;
    // Larger first; among equals, scale up the newer and down the older.
    let mut order: Vec<usize> = (0..active.len()).collect();
    order.sort_by(|&a, &b| {
        let (ra, rb) = (active[a], active[b]);
        rs_replicas(rb).cmp(&rs_replicas(ra)).then_with(|| {
            if to_add > 0 {
                oldest_first(rb, ra)
            } else {
                oldest_first(ra, rb)
            }
        })
    });
    let mut sizes: Vec<i32> = active.iter().map(|rs| rs_replicas(rs)).collect();
    if to_add == 0 {
        return sizes;
    }
    let mut added = 0;
    for &i in &order {
        let rs = active[i];
        let prop = proportion(d, rs, to_add, added, max_surge, status_replicas);
        sizes[i] += prop;
        added += prop;
    }
    // Leftovers go to the largest.
    if let Some(&first) = order.first() {
        sizes[first] = (sizes[first] + to_add - added).max(0);
    }
    sizes
}

fn proportion(
    d: &Deployment,
    rs: &ReplicaSet,
    to_add: i32,
    added: i32,
    max_surge: i32,
    status_replicas: i32,
) -> i32 {
    if rs_replicas(rs) == 0 || to_add == 0 || to_add == added {
        return 0;
    }
    let fraction = if desired(d) == 0 {
        -rs_replicas(rs)
    } else {
        let deployment_replicas = desired(d) + max_surge;
        let annotated = max_annotation(rs).unwrap_or(status_replicas);
        if annotated == 0 {
            0
        } else {
            let size =
                f64::from(rs_replicas(rs)) * f64::from(deployment_replicas) / f64::from(annotated);
            size.round() as i32 - rs_replicas(rs)
        }
    };
    let allowed = to_add - added;
    if to_add > 0 {
        fraction.min(allowed)
    } else {
        fraction.max(allowed)
    }
}

/// Conditions of a Deployment.
pub fn condition<'a>(s: &'a DeploymentStatus, type_: &str) -> Option<&'a DeploymentCondition> {
    s.conditions
        .iter()
        .flatten()
        .find(|c| c.type_.as_deref() == Some(type_))
}

pub fn new_condition(
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
    now: Timestamp,
) -> DeploymentCondition {
    DeploymentCondition {
        type_: Some(type_.into()),
        status: Some(status.into()),
        reason: Some(reason.into()),
        message: Some(message),
        last_update_time: Some(Time(now)),
        last_transition_time: Some(Time(now)),
    }
}

/// Set `c`, keeping the existing one untouched when status and reason are
/// the same, and its transition time when only the reason changes
/// (upstream `SetDeploymentCondition`).
pub fn set_condition(s: &mut DeploymentStatus, mut c: DeploymentCondition) {
    let conds = s.conditions.get_or_insert_with(Vec::new);
    if let Some(cur) = conds.iter().find(|x| x.type_ == c.type_) {
        if cur.status == c.status && cur.reason == c.reason {
            return;
        }
        if cur.status == c.status {
            c.last_transition_time = cur.last_transition_time.clone();
        }
    }
    conds.retain(|x| x.type_ != c.type_);
    conds.push(c);
}

pub fn remove_condition(s: &mut DeploymentStatus, type_: &str) {
    if let Some(c) = s.conditions.as_mut() {
        c.retain(|x| x.type_.as_deref() != Some(type_));
        if c.is_empty() {
            s.conditions = None;
        }
    }
}

fn nonzero(n: i32) -> Option<i32> {
    (n != 0).then_some(n)
}

/// The status the ReplicaSets give (upstream `calculateStatus`), with the
/// Available condition.
pub fn calculate_status(
    d: &Deployment,
    all: &[&ReplicaSet],
    new_rs: Option<&ReplicaSet>,
    max_unavailable: i32,
    now: Timestamp,
) -> DeploymentStatus {
    let available: i32 = all.iter().map(|rs| rs_available(rs)).sum();
    let total: i32 = all.iter().map(|rs| rs_replicas(rs)).sum();
    let old = d.status.clone().unwrap_or_default();
    let mut s = DeploymentStatus {
        observed_generation: d.metadata.generation,
        replicas: nonzero(all.iter().map(|rs| rs_actual(rs)).sum()),
        updated_replicas: nonzero(new_rs.map(rs_actual).unwrap_or(0)),
        ready_replicas: nonzero(all.iter().map(|rs| rs_ready(rs)).sum()),
        available_replicas: nonzero(available),
        unavailable_replicas: nonzero((total - available).max(0)),
        collision_count: old.collision_count,
        conditions: old.conditions.clone(),
        terminating_replicas: old.terminating_replicas,
    };
    if available >= desired(d) - max_unavailable {
        set_condition(
            &mut s,
            new_condition(
                "Available",
                "True",
                MIN_AVAILABLE,
                "Deployment has minimum availability.".into(),
                now,
            ),
        );
    } else {
        set_condition(
            &mut s,
            new_condition(
                "Available",
                "False",
                MIN_UNAVAILABLE,
                "Deployment does not have minimum availability.".into(),
                now,
            ),
        );
    }
    s
}

fn count(v: Option<i32>) -> i32 {
    v.unwrap_or(0)
}

/// Every replica updated and available, and the latest spec observed.
pub fn deployment_complete(d: &Deployment, s: &DeploymentStatus) -> bool {
    let want = desired(d);
    count(s.updated_replicas) == want
        && count(s.replicas) == want
        && count(s.available_replicas) == want
        && s.observed_generation.unwrap_or(0) >= d.metadata.generation.unwrap_or(0)
}

/// Whether `new` shows progress over the Deployment's current status.
pub fn deployment_progressing(d: &Deployment, new: &DeploymentStatus) -> bool {
    let old = d.status.clone().unwrap_or_default();
    let old_old = count(old.replicas) - count(old.updated_replicas);
    let new_old = count(new.replicas) - count(new.updated_replicas);
    count(new.updated_replicas) > count(old.updated_replicas)
        || new_old < old_old
        || count(new.ready_replicas) > count(old.ready_replicas)
        || count(new.available_replicas) > count(old.available_replicas)
}

/// progressDeadlineSeconds, unless unset or "never" (MaxInt32).
pub fn progress_deadline(d: &Deployment) -> Option<i32> {
    d.spec.progress_deadline_seconds.filter(|s| *s != i32::MAX)
}

/// When the rollout in `s` runs out of time: None when complete, already
/// timed out or without a deadline.
pub fn deadline_at(d: &Deployment, s: &DeploymentStatus) -> Option<Timestamp> {
    let secs = progress_deadline(d)?;
    let c = condition(s, "Progressing")?;
    if matches!(
        c.reason.as_deref(),
        Some(NEW_RS_AVAILABLE) | Some(TIMED_OUT)
    ) {
        return None;
    }
    let from = c.last_update_time.as_ref()?.0;
    from.checked_add(jiff::SignedDuration::from_secs(i64::from(secs)))
        .ok()
}

/// Whether the rollout ran out of time (upstream `DeploymentTimedOut`).
pub fn timed_out(d: &Deployment, s: &DeploymentStatus, now: Timestamp) -> bool {
    if progress_deadline(d).is_none() {
        return false;
    }
    match condition(s, "Progressing") {
        Some(c) if c.reason.as_deref() == Some(TIMED_OUT) => true,
        _ => deadline_at(d, s).is_some_and(|at| at < now),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::{
        DeploymentSpec, DeploymentStrategy, ReplicaSetSpec, RollingUpdateDeployment,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    fn deployment(replicas: i32, surge: i32, unavailable: i32) -> Deployment {
        Deployment {
            spec: DeploymentSpec {
                replicas: Some(replicas),
                strategy: Some(DeploymentStrategy {
                    type_: Some("RollingUpdate".into()),
                    rolling_update: Some(RollingUpdateDeployment {
                        max_surge: Some(IntOrString::Int(surge)),
                        max_unavailable: Some(IntOrString::Int(unavailable)),
                    }),
                }),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn rs(name: &str, replicas: i32, max: Option<i32>, created: i64) -> ReplicaSet {
        ReplicaSet {
            metadata: ObjectMeta {
                name: Some(name.into()),
                creation_timestamp: Some(Time(Timestamp::from_second(created).unwrap())),
                annotations: max.map(|m| [(MAX_REPLICAS.to_string(), m.to_string())].into()),
                ..Default::default()
            },
            spec: ReplicaSetSpec {
                replicas: Some(replicas),
                ..Default::default()
            },
            status: None,
        }
    }

    #[test]
    fn new_replicas_respect_surge() {
        let d = deployment(4, 1, 1);
        assert_eq!(new_rs_new_replicas(&d, 4, 0, 1), 1);
        assert_eq!(new_rs_new_replicas(&d, 5, 1, 1), 1);
        assert_eq!(new_rs_new_replicas(&d, 3, 1, 1), 3);
        // Never past the desired count.
        assert_eq!(new_rs_new_replicas(&d, 0, 3, 1), 4);
    }

    #[test]
    fn scaling_mid_rollout_is_proportional() {
        // 10 replicas (surge 3) mid-rollout: old 8, new 5 -> scale to 15.
        let mut d = deployment(15, 3, 2);
        d.status = Some(DeploymentStatus {
            replicas: Some(13),
            ..Default::default()
        });
        let old = rs("old", 8, Some(13), 1);
        let new = rs("new", 5, Some(13), 2);
        let sizes = proportional_sizes(&d, &[&old, &new], 3, 13);
        assert_eq!(sizes.iter().sum::<i32>(), 18);
        assert_eq!(sizes, vec![11, 7]);
        // Down to 0: everything goes.
        let d0 = deployment(0, 3, 2);
        assert_eq!(proportional_sizes(&d0, &[&old, &new], 3, 13), vec![0, 0]);
    }

    #[test]
    fn revisions_move_to_history_on_reuse() {
        let d = deployment(2, 1, 0);
        let mut r = rs("r", 0, None, 1);
        assert!(set_new_rs_annotations(&d, &mut r, 1, false, 1));
        assert_eq!(revision(&r), 1);
        assert_eq!(annotation(&r, MAX_REPLICAS), Some("3"));
        assert!(!set_new_rs_annotations(&d, &mut r, 1, true, 1));
        assert!(set_new_rs_annotations(&d, &mut r, 3, true, 1));
        assert_eq!(revision(&r), 3);
        assert_eq!(annotation(&r, REVISION_HISTORY), Some("1"));
    }

    #[test]
    fn conditions_keep_their_transition_time() {
        let t0 = Timestamp::from_second(100).unwrap();
        let t1 = Timestamp::from_second(200).unwrap();
        let mut s = DeploymentStatus::default();
        set_condition(
            &mut s,
            new_condition("Progressing", "True", NEW_RS_CREATED, "a".into(), t0),
        );
        set_condition(
            &mut s,
            new_condition("Progressing", "True", RS_UPDATED, "b".into(), t1),
        );
        let c = condition(&s, "Progressing").unwrap();
        assert_eq!(c.reason.as_deref(), Some(RS_UPDATED));
        assert_eq!(c.last_transition_time, Some(Time(t0)));
        assert_eq!(c.last_update_time, Some(Time(t1)));
    }
}
