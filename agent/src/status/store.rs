//! The latest pod and status of every pod the agent runs: written by the
//! pod workers after each sync, read by the status endpoint and the node
//! server, and drained by the status manager, which it wakes on changes.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::{Pod, PodStatus};

use crate::pod::PodExt;

/// The latest pod and status of every pod the agent runs; read by the
/// status endpoint, and by the status manager, which it wakes on changes.
#[derive(Default)]
pub struct StatusStore {
    inner: std::sync::RwLock<HashMap<String, (Pod, PodStatus)>>,
    /// Pods whose status changed since the status manager last looked.
    dirty: Mutex<HashSet<String>>,
    changed: tokio::sync::Notify,
}

impl StatusStore {
    pub fn set(&self, pod: &Pod, status: PodStatus) {
        let uid = pod.uid().to_string();
        let mut m = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let same = m.get(&uid).is_some_and(|(_, s)| *s == status);
        m.insert(uid.clone(), (pod.clone(), status));
        drop(m);
        if !same {
            self.mark_dirty(uid);
        }
    }
    pub fn remove(&self, uid: &str) {
        self.inner
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
    }
    pub fn get(&self, uid: &str) -> Option<(Pod, PodStatus)> {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(uid)
            .cloned()
    }
    /// Every pod with its status, sorted by namespace and name.
    pub fn list(&self) -> Vec<Pod> {
        let m = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let mut pods: Vec<Pod> = m
            .values()
            .map(|(p, s)| {
                let mut p = p.clone();
                p.status = Some(s.clone());
                p
            })
            .collect();
        pods.sort_by(|a, b| (a.namespace(), a.name()).cmp(&(b.namespace(), b.name())));
        pods
    }
    /// The pods (with their status) for which `keep` holds; only those are
    /// copied, so a question most pods answer no to stays cheap.
    pub fn list_where(&self, keep: impl Fn(&Pod, &PodStatus) -> bool) -> Vec<Pod> {
        let m = self.inner.read().unwrap_or_else(|e| e.into_inner());
        m.values()
            .filter(|(p, s)| keep(p, s))
            .map(|(p, s)| {
                let mut p = p.clone();
                p.status = Some(s.clone());
                p
            })
            .collect()
    }
    /// Ask the status manager to look at `uid` again.
    pub fn mark_dirty(&self, uid: String) {
        self.dirty
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(uid);
        self.changed.notify_one();
    }
    /// Wait until some status changed, then take the changed pods' uids.
    pub async fn take_dirty(&self) -> HashSet<String> {
        loop {
            let taken = std::mem::take(&mut *self.dirty.lock().unwrap_or_else(|e| e.into_inner()));
            if !taken.is_empty() {
                return taken;
            }
            self.changed.notified().await;
        }
    }
    /// Every pod's uid.
    pub fn uids(&self) -> Vec<String> {
        let m = self.inner.read().unwrap_or_else(|e| e.into_inner());
        m.keys().cloned().collect()
    }
}
