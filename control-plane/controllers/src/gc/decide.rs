//! The collector's decisions, as upstream's attemptToDeleteItem,
//! processDeletingDependentsItem and orphanDependents make them: pure
//! functions of an item and what is known of its owners and dependents.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::PropagationPolicy;

use super::graph::{Item, FOREGROUND, ORPHAN};

/// What is known of one owner reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// Exists and is not waiting for its dependents.
    Solid,
    /// Gone (404, or the name now belongs to another uid).
    Dangling,
    /// Exists, being deleted in the foreground.
    Waiting,
    /// Cannot be told (unknown kind): leave the item alone.
    Unknown,
}

/// What to do with an item.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Nothing,
    /// Delete the item with this propagation.
    Delete(PropagationPolicy),
    /// Drop these owner references (by uid) from the item.
    DropOwners(Vec<String>),
    /// Orphan: drop the reference to this item from each dependent, then
    /// remove the `orphan` finalizer.
    Orphan,
    /// Foreground: delete (or release) the dependents, and remove the
    /// `foregroundDeletion` finalizer once no blocking one is left.
    Foreground {
        release: bool,
    },
}

/// Whether a dependent's reference to `owner_uid` holds the owner's
/// foreground deletion back.
pub fn blocks(dep: &Item, owner_uid: &str) -> bool {
    dep.owners
        .iter()
        .any(|o| o.uid == owner_uid && o.block_owner_deletion == Some(true))
}

/// The decision for an item being deleted (owner side), if it carries one
/// of the collector's finalizers; None otherwise.
pub fn as_owner(item: &Item, blocking_dependents: usize) -> Option<Decision> {
    if !item.deleting {
        return None;
    }
    // Orphan first: a delete that asked for both ends up orphaning, as
    // upstream (orphan is processed before deleting dependents).
    if item.has_finalizer(ORPHAN) {
        return Some(Decision::Orphan);
    }
    if item.has_finalizer(FOREGROUND) {
        return Some(Decision::Foreground {
            release: blocking_dependents == 0,
        });
    }
    None
}

/// The decision for an item with owner references (dependent side):
/// `owners` pairs each reference with what is known of it, and
/// `has_dependents` says whether the item owns anything itself.
pub fn as_dependent(
    item: &Item,
    owners: &[(&OwnerReference, Owner)],
    has_dependents: bool,
) -> Decision {
    if owners.is_empty() || owners.iter().any(|(_, s)| *s == Owner::Unknown) {
        return Decision::Nothing;
    }
    // Already going, and not waiting on dependents of its own: nothing
    // more to decide (upstream skips these too).
    if item.deleting && !item.has_finalizer(FOREGROUND) {
        return Decision::Nothing;
    }
    let uids = |want: &[Owner]| -> Vec<String> {
        owners
            .iter()
            .filter(|(_, s)| want.contains(s))
            .map(|(o, _)| o.uid.clone())
            .collect()
    };
    if owners.iter().any(|(_, s)| *s == Owner::Solid) {
        // Kept by a live owner; references to gone or foreground-deleting
        // owners go, or those owners would wait for it forever.
        let drop = uids(&[Owner::Dangling, Owner::Waiting]);
        return if drop.is_empty() {
            Decision::Nothing
        } else {
            Decision::DropOwners(drop)
        };
    }
    if item.deleting {
        // Foreground-deleting already, every owner gone or going.
        return Decision::Nothing;
    }
    let waiting = owners.iter().any(|(_, s)| *s == Owner::Waiting);
    if waiting && has_dependents {
        // An owner waits for us and we own things: go in the foreground
        // too, so the wait covers our dependents.
        return Decision::Delete(PropagationPolicy::Foreground);
    }
    let policy = if item.has_finalizer(ORPHAN) {
        PropagationPolicy::Orphan
    } else if item.has_finalizer(FOREGROUND) {
        PropagationPolicy::Foreground
    } else {
        PropagationPolicy::Background
    };
    Decision::Delete(policy)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(owners: &[(&str, bool)], finalizers: &[&str], deleting: bool) -> Item {
        Item {
            res: 0,
            namespace: Some("ns".into()),
            name: "x".into(),
            uid: "x".into(),
            resource_version: None,
            owners: owners
                .iter()
                .map(|(u, b)| OwnerReference {
                    uid: u.to_string(),
                    block_owner_deletion: Some(*b),
                    ..Default::default()
                })
                .collect(),
            finalizers: finalizers.iter().map(|s| s.to_string()).collect(),
            deleting,
        }
    }

    fn decide(i: &Item, states: &[Owner], has_deps: bool) -> Decision {
        let pairs: Vec<(&OwnerReference, Owner)> =
            i.owners.iter().zip(states.iter().copied()).collect();
        as_dependent(i, &pairs, has_deps)
    }

    #[test]
    fn dependents_follow_their_owners() {
        let one = item(&[("a", true)], &[], false);
        assert_eq!(decide(&one, &[Owner::Solid], false), Decision::Nothing);
        assert_eq!(
            decide(&one, &[Owner::Dangling], false),
            Decision::Delete(PropagationPolicy::Background)
        );
        assert_eq!(
            decide(&one, &[Owner::Waiting], true),
            Decision::Delete(PropagationPolicy::Foreground)
        );
        assert_eq!(
            decide(&one, &[Owner::Waiting], false),
            Decision::Delete(PropagationPolicy::Background)
        );
        assert_eq!(decide(&one, &[Owner::Unknown], false), Decision::Nothing);
        let two = item(&[("a", true), ("b", true)], &[], false);
        assert_eq!(
            decide(&two, &[Owner::Solid, Owner::Dangling], false),
            Decision::DropOwners(vec!["b".into()])
        );
        let orphaning = item(&[("a", true)], &[ORPHAN], false);
        assert_eq!(
            decide(&orphaning, &[Owner::Dangling], false),
            Decision::Delete(PropagationPolicy::Orphan)
        );
        let going = item(&[("a", true)], &[], true);
        assert_eq!(decide(&going, &[Owner::Dangling], false), Decision::Nothing);
    }

    #[test]
    fn owners_being_deleted() {
        let fg = item(&[], &[FOREGROUND], true);
        assert_eq!(
            as_owner(&fg, 1),
            Some(Decision::Foreground { release: false })
        );
        assert_eq!(
            as_owner(&fg, 0),
            Some(Decision::Foreground { release: true })
        );
        let orphan = item(&[], &[ORPHAN, FOREGROUND], true);
        assert_eq!(as_owner(&orphan, 3), Some(Decision::Orphan));
        assert_eq!(as_owner(&item(&[], &[FOREGROUND], false), 0), None);
        let dep = item(&[("o", true), ("p", false)], &[], false);
        assert!(blocks(&dep, "o") && !blocks(&dep, "p"));
    }
}
