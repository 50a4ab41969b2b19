//! ControllerRevisions shared by the StatefulSet and DaemonSet controllers
//! (upstream `pkg/controller/history`): one immutable snapshot per pod
//! template, named `<owner>-<hash>`, numbered in the order they were last
//! rolled out to, and trimmed to the owner's `revisionHistoryLimit`.
//!
//! A revision's data is the strategic merge patch
//! `{"spec":{"template":{..., "$patch":"replace"}}}`: `kubectl rollout
//! undo` sends exactly that patch back to the owner, and `kubectl rollout
//! history --revision` prints its template.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::reflector::Store;
use kube::{Api, Resource, ResourceExt};
use serde_json::{json, Value};

use crate::workload::{ApiResultExt, Result};
use crate::workload_claim::{self as claim};

/// The label naming a pod's (and a revision's) template hash.
pub const HASH_LABEL: &str = "controller-revision-hash";

/// The characters upstream's `rand.SafeEncodeString` maps to.
const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// The revision data of a pod template: the patch that restores it.
pub fn data_of(template: &PodTemplateSpec) -> Value {
    let mut t = serde_json::to_value(template).unwrap_or_else(|_| json!({}));
    if let Some(m) = t.as_object_mut() {
        m.insert("$patch".into(), json!("replace"));
    }
    json!({"spec": {"template": t}})
}

/// The hash naming a revision (upstream `history.HashControllerRevision`):
/// FNV-1a 32 over the data, then the collision count, safe-encoded.
pub fn hash(data: &Value, collision_count: Option<i32>) -> String {
    // serde_json maps are sorted, so equal data gives equal bytes.
    let bytes = serde_json::to_vec(data).unwrap_or_default();
    let mut h = fnv1a32(&bytes, 0x811c_9dc5);
    if let Some(c) = collision_count.filter(|c| *c != 0) {
        h = fnv1a32(&(c as u32).to_le_bytes(), h);
    }
    h.to_string()
        .bytes()
        .map(|b| ALPHANUMS[usize::from(b) % ALPHANUMS.len()] as char)
        .collect()
}

fn fnv1a32(bytes: &[u8], mut h: u32) -> u32 {
    for b in bytes {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// The revision name `<owner>-<hash>`, the owner's name cut so the whole
/// stays a valid name.
pub fn name(owner: &str, hash: &str) -> String {
    let keep = 253usize.saturating_sub(hash.len() + 1);
    let owner: String = owner.chars().take(keep).collect();
    format!("{owner}-{hash}")
}

/// The revisions `owner_uid` controls, oldest first.
pub fn owned(
    store: &Store<ControllerRevision>,
    ns: &str,
    owner_uid: &str,
) -> Vec<Arc<ControllerRevision>> {
    let mut revs = store.state_filter(|r| {
        r.metadata.namespace.as_deref() == Some(ns)
            && claim::controller_of(&r.metadata).is_some_and(|o| o.uid == owner_uid)
    });
    sort(&mut revs);
    revs
}

fn sort(revs: &mut [Arc<ControllerRevision>]) {
    revs.sort_by(|a, b| {
        (a.revision, a.metadata.name.as_deref()).cmp(&(b.revision, b.metadata.name.as_deref()))
    });
}

/// The number the next rolled-out revision gets.
pub fn next_number(revs: &[Arc<ControllerRevision>]) -> i64 {
    revs.iter().filter_map(|r| r.revision).max().unwrap_or(0) + 1
}

/// The revisions to delete so at most `limit` remain besides the ones in
/// `live` (the current and update revisions, and any a pod still runs):
/// the oldest first, never one in `live`.
pub fn to_truncate(
    revs: &[Arc<ControllerRevision>],
    live: &HashSet<String>,
    limit: i32,
) -> Vec<Arc<ControllerRevision>> {
    let mut history: Vec<_> = revs
        .iter()
        .filter(|r| !live.contains(&r.name_any()))
        .cloned()
        .collect();
    sort(&mut history);
    let excess = history.len().saturating_sub(limit.max(0) as usize);
    history.truncate(excess);
    history
}

/// The revision for `data`, made current: an equal one is reused (renumbered
/// to the newest when it is not, which is what a rollback looks like), or a
/// new one is created. Returns it and the collision count to record when a
/// different revision already had the name. `name_hash` names the
/// revision for a collision count ([`hash`] for StatefulSets; DaemonSets
/// use their pods' template hash so a pod's label names its revision).
///
/// # Errors
/// Creating or renumbering the revision failed.
pub async fn ensure<K>(
    api: &Api<ControllerRevision>,
    revs: &[Arc<ControllerRevision>],
    owner: &K,
    labels: &BTreeMap<String, String>,
    data: Value,
    mut collision_count: i32,
    name_hash: impl Fn(&Value, i32) -> String,
) -> Result<(ControllerRevision, i32)>
where
    K: Resource<DynamicType = ()>,
{
    let next = next_number(revs);
    if let Some(equal) = revs.iter().rev().find(|r| r.data.0 == data) {
        if equal.revision == Some(next - 1) {
            return Ok(((**equal).clone(), collision_count));
        }
        let name = equal.name_any();
        let patch = json!({"revision": next});
        let updated = api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .ctx(|| format!("renumbering controller revision {name}"))?;
        return Ok((updated, collision_count));
    }
    loop {
        let h = name_hash(&data, collision_count);
        let mut labels = labels.clone();
        labels.insert(HASH_LABEL.into(), h.clone());
        let rev = ControllerRevision {
            metadata: ObjectMeta {
                name: Some(name(&owner.name_any(), &h)),
                namespace: owner.meta().namespace.clone(),
                labels: Some(labels),
                owner_references: Some(vec![claim::controller_ref(owner)]),
                ..Default::default()
            },
            data: RawExtension(data.clone()),
            revision: Some(next),
        };
        match api.create(&PostParams::default(), &rev).await {
            Ok(made) => return Ok((made, collision_count)),
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let existing = api
                    .get(&rev.name_any())
                    .await
                    .ctx(|| format!("reading controller revision {}", rev.name_any()))?;
                let ours = claim::controller_of(&existing.metadata)
                    .is_some_and(|o| Some(o.uid.as_str()) == owner.meta().uid.as_deref());
                if ours && existing.data.0 == data {
                    return Ok((existing, collision_count));
                }
                // Same name, other content: a hash collision. Upstream
                // bumps the owner's collisionCount and hashes again.
                collision_count += 1;
            }
            Err(e) => {
                return Err(e).ctx(|| format!("creating controller revision {}", rev.name_any()))
            }
        }
    }
}

/// Delete the revisions [`to_truncate`] picks.
///
/// # Errors
/// A delete failed (a revision already gone is no failure).
pub async fn truncate(
    api: &Api<ControllerRevision>,
    revs: &[Arc<ControllerRevision>],
    live: &HashSet<String>,
    limit: i32,
) -> Result<()> {
    for r in to_truncate(revs, live, limit) {
        let name = r.name_any();
        match api.delete(&name, &Default::default()).await {
            Ok(_) => {}
            Err(e) if crate::workload::is_not_found(&e) => {}
            Err(e) => return Err(e).ctx(|| format!("deleting controller revision {name}")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rev(name: &str, n: i64) -> Arc<ControllerRevision> {
        Arc::new(ControllerRevision {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            data: RawExtension(Value::Null),
            revision: Some(n),
        })
    }

    #[test]
    fn hash_depends_on_data_and_collisions() {
        let a = data_of(&PodTemplateSpec::default());
        let t = PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some([("app".to_string(), "x".to_string())].into()),
                ..Default::default()
            }),
            spec: None,
        };
        let b = data_of(&t);
        assert_eq!(hash(&a, None), hash(&a, Some(0)));
        assert_ne!(hash(&a, None), hash(&b, None));
        assert_ne!(hash(&a, None), hash(&a, Some(1)));
        assert!(hash(&a, None).bytes().all(|c| ALPHANUMS.contains(&c)));
        assert_eq!(b["spec"]["template"]["$patch"], "replace");
    }

    #[test]
    fn truncation_keeps_live_and_newest() {
        let revs = vec![
            rev("a", 1),
            rev("b", 2),
            rev("c", 3),
            rev("d", 4),
            rev("e", 5),
        ];
        let live: HashSet<String> = ["a".to_string(), "e".to_string()].into();
        let gone: Vec<String> = to_truncate(&revs, &live, 1)
            .iter()
            .map(|r| r.name_any())
            .collect();
        assert_eq!(gone, ["b", "c"]);
        assert!(to_truncate(&revs, &live, 10).is_empty());
        assert_eq!(to_truncate(&revs, &live, 0).len(), 3);
    }

    #[test]
    fn next_number_follows_the_newest() {
        assert_eq!(next_number(&[]), 1);
        assert_eq!(next_number(&[rev("a", 3), rev("b", 1)]), 4);
    }
}
