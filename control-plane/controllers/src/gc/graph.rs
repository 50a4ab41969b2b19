//! The ownership graph: every watched object by uid, with its owner
//! references and the reverse index (owner uid -> dependents). Applying
//! a watch event returns the uids whose decisions may have changed.

use std::collections::{HashMap, HashSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

pub const FOREGROUND: &str = "foregroundDeletion";
pub const ORPHAN: &str = "orphan";

/// One object, as much as the collector needs of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    /// Index into the collector's resource table.
    pub res: usize,
    pub namespace: Option<String>,
    pub name: String,
    pub uid: String,
    pub resource_version: Option<String>,
    pub owners: Vec<OwnerReference>,
    pub finalizers: Vec<String>,
    pub deleting: bool,
}

impl Item {
    /// The item for `meta` of resource `res`; None without a uid.
    pub fn from_meta(res: usize, meta: &ObjectMeta) -> Option<Item> {
        Some(Item {
            res,
            namespace: meta.namespace.clone(),
            name: meta.name.clone()?,
            uid: meta.uid.clone()?,
            resource_version: meta.resource_version.clone(),
            owners: meta.owner_references.clone().unwrap_or_default(),
            finalizers: meta.finalizers.clone().unwrap_or_default(),
            deleting: meta.deletion_timestamp.is_some(),
        })
    }

    pub fn has_finalizer(&self, f: &str) -> bool {
        self.finalizers.iter().any(|x| x == f)
    }

    /// Being deleted in the foreground: waits for its blocking dependents.
    pub fn waiting_for_dependents(&self) -> bool {
        self.deleting && self.has_finalizer(FOREGROUND)
    }

    /// Something for the collector to do or check on this item.
    pub fn interesting(&self) -> bool {
        !self.owners.is_empty()
            || (self.deleting && (self.has_finalizer(FOREGROUND) || self.has_finalizer(ORPHAN)))
    }
}

#[derive(Debug, Default)]
pub struct Graph {
    items: HashMap<String, Item>,
    /// owner uid -> dependent uids (owners may be absent from `items`).
    dependents: HashMap<String, HashSet<String>>,
    /// Per resource, uids listed since the watch (re)started.
    listing: HashMap<usize, HashSet<String>>,
}

impl Graph {
    pub fn get(&self, uid: &str) -> Option<&Item> {
        self.items.get(uid)
    }

    /// The items that list `uid` as an owner.
    pub fn dependents(&self, uid: &str) -> Vec<&Item> {
        self.dependents
            .get(uid)
            .into_iter()
            .flatten()
            .filter_map(|d| self.items.get(d))
            .collect()
    }

    pub fn has_dependents(&self, uid: &str) -> bool {
        !self.dependents(uid).is_empty()
    }

    /// Every item the collector may have work on (a periodic resync).
    pub fn interesting(&self) -> Vec<String> {
        self.items
            .values()
            .filter(|i| i.interesting())
            .map(|i| i.uid.clone())
            .collect()
    }

    fn unlink(&mut self, item: &Item) {
        for o in &item.owners {
            if let Some(set) = self.dependents.get_mut(&o.uid) {
                set.remove(&item.uid);
                if set.is_empty() {
                    self.dependents.remove(&o.uid);
                }
            }
        }
    }

    /// Add or replace an item. Dirty: the item, and its owners old and
    /// new (a foreground owner may be waiting on it).
    pub fn upsert(&mut self, item: Item) -> Vec<String> {
        let mut dirty: Vec<String> = vec![item.uid.clone()];
        if let Some(old) = self.items.remove(&item.uid) {
            self.unlink(&old);
            dirty.extend(old.owners.iter().map(|o| o.uid.clone()));
        }
        for o in &item.owners {
            self.dependents
                .entry(o.uid.clone())
                .or_default()
                .insert(item.uid.clone());
            dirty.push(o.uid.clone());
        }
        if let Some(seen) = self.listing.get_mut(&item.res) {
            seen.insert(item.uid.clone());
        }
        self.items.insert(item.uid.clone(), item);
        dirty
    }

    /// Remove an item. Dirty: its owners (one may have been waiting for
    /// it) and its dependents (their owner is gone now).
    pub fn remove(&mut self, uid: &str) -> Vec<String> {
        let mut dirty = Vec::new();
        if let Some(old) = self.items.remove(uid) {
            self.unlink(&old);
            dirty.extend(old.owners.iter().map(|o| o.uid.clone()));
        }
        dirty.extend(self.dependents.get(uid).into_iter().flatten().cloned());
        dirty
    }

    /// A watch of resource `res` starts listing from scratch.
    pub fn list_started(&mut self, res: usize) {
        self.listing.insert(res, HashSet::new());
    }

    /// The listing of `res` is complete: what it did not show is gone.
    pub fn list_done(&mut self, res: usize) -> Vec<String> {
        let seen = self.listing.remove(&res).unwrap_or_default();
        let gone: Vec<String> = self
            .items
            .values()
            .filter(|i| i.res == res && !seen.contains(&i.uid))
            .map(|i| i.uid.clone())
            .collect();
        gone.iter().flat_map(|uid| self.remove(uid)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(res: usize, uid: &str, owners: &[&str]) -> Item {
        Item {
            res,
            namespace: Some("ns".into()),
            name: format!("n-{uid}"),
            uid: uid.into(),
            resource_version: None,
            owners: owners
                .iter()
                .map(|o| OwnerReference {
                    uid: o.to_string(),
                    ..Default::default()
                })
                .collect(),
            finalizers: Vec::new(),
            deleting: false,
        }
    }

    #[test]
    fn tracks_dependents_and_dirties_neighbours() {
        let mut g = Graph::default();
        g.upsert(item(0, "rs", &["dep"]));
        let dirty = g.upsert(item(1, "pod", &["rs"]));
        assert_eq!(dirty, vec!["pod".to_string(), "rs".to_string()]);
        assert_eq!(g.dependents("rs").len(), 1);
        // Deleting the owner dirties its dependents.
        let dirty = g.remove("rs");
        assert!(dirty.contains(&"pod".to_string()) && dirty.contains(&"dep".to_string()));
        // Re-owning moves the reverse index.
        g.upsert(item(1, "pod", &["other"]));
        assert!(g.dependents("rs").is_empty());
        assert_eq!(g.dependents("other").len(), 1);
    }

    #[test]
    fn relist_drops_what_it_did_not_show() {
        let mut g = Graph::default();
        g.upsert(item(1, "a", &["o"]));
        g.upsert(item(1, "b", &["o"]));
        g.upsert(item(2, "c", &[]));
        g.list_started(1);
        g.upsert(item(1, "a", &["o"]));
        let dirty = g.list_done(1);
        assert_eq!(dirty, vec!["o".to_string()]);
        assert!(g.get("b").is_none());
        assert!(g.get("a").is_some() && g.get("c").is_some());
    }
}
