//! RBAC: roles, cluster roles and their bindings, evaluated against an
//! in-memory copy of the `rbac.authorization.k8s.io` objects that a store
//! watch keeps current (upstream's RBAC authorizer reads informers too, so
//! a new binding takes effect a moment after it is written).
//!
//! # Layout
//! - [`rules`]: one rule against a request; coverage of rules by rules.
//! - [`index`]: the objects indexed by role name and binding subject.
//! - [`escalation`]: nobody grants permissions they do not hold.

pub mod escalation;
pub mod index;
pub mod rules;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use serde_json::Value;

use super::{Attributes, Identity};
use crate::store::follow::{follow, Change};
use crate::store::{self, Store};
use index::Index;

/// Key prefix of every RBAC object.
pub const PREFIX: &str = "/registry/rbac.authorization.k8s.io/";

/// The RBAC objects by store key, and their index.
#[derive(Debug, Default)]
pub struct Rbac {
    state: RwLock<State>,
}

#[derive(Debug, Default)]
struct State {
    objects: HashMap<String, Value>,
    /// Rebuilt after every change (RBAC objects change rarely; requests
    /// read it all the time, without copying it).
    index: Arc<Index>,
}

impl State {
    fn reindex(&mut self) {
        self.index = Arc::new(Index::build(self.objects.iter()));
    }
}

impl Rbac {
    pub fn new() -> Arc<Self> {
        Arc::new(Rbac::default())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The current index.
    pub fn index(&self) -> Arc<Index> {
        self.state
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .index
            .clone()
    }

    fn put(&self, key: &str, value: &[u8]) {
        if let Ok(v) = serde_json::from_slice::<Value>(value) {
            let mut st = self.write();
            st.objects.insert(key.to_string(), v);
            st.reindex();
        }
    }

    fn remove(&self, key: &str) {
        let mut st = self.write();
        if st.objects.remove(key).is_some() {
            st.reindex();
        }
    }

    /// Load everything, then follow the store until `shutdown` fires.
    pub async fn sync(
        self: Arc<Self>,
        store: Arc<dyn Store>,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) {
        follow(
            store.as_ref(),
            PREFIX,
            shutdown,
            "rbac",
            |change| match change {
                Change::Reset(kvs) => self.reset(kvs),
                Change::Put(kv) => self.put(&kv.key, &kv.value),
                Change::Delete(key) => self.remove(&key),
            },
        )
        .await
    }

    /// Replace the copy with a fresh list; returns its revision.
    pub async fn relist(&self, store: &dyn Store) -> store::Result<i64> {
        let list = store.list(PREFIX, None, 0, None).await?;
        self.reset(list.kvs);
        Ok(list.revision)
    }

    fn reset(&self, kvs: Vec<store::KeyValue>) {
        let m = kvs
            .into_iter()
            .filter_map(|kv| Some((kv.key, serde_json::from_slice::<Value>(&kv.value).ok()?)))
            .collect();
        let mut st = self.write();
        st.objects = m;
        st.reindex();
    }

    /// Whether any binding grants `a` to `id`.
    pub fn allows(&self, id: &Identity, a: &Attributes) -> bool {
        self.index()
            .any_rule(id, &a.namespace, |r| rules::allows(r, a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(verb: &str, resource: &str, sub: &str, ns: &str, name: &str) -> Attributes {
        Attributes::resource(verb, resource, sub, ns, name)
    }

    #[test]
    fn bindings() {
        let rbac = Rbac::default();
        rbac.put(
            &format!("{PREFIX}roles/d/reader"),
            br#"{"rules":[{"apiGroups":[""],"resources":["pods"],"verbs":["get","list"]}]}"#,
        );
        rbac.put(
            &format!("{PREFIX}rolebindings/d/rb"),
            br#"{"roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"Role","name":"reader"},"subjects":[{"kind":"User","name":"bob"}]}"#,
        );
        rbac.put(
            &format!("{PREFIX}clusterroles/node-reader"),
            br#"{"rules":[{"apiGroups":[""],"resources":["nodes"],"verbs":["get"]}]}"#,
        );
        rbac.put(
            &format!("{PREFIX}clusterrolebindings/nr"),
            br#"{"roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"ClusterRole","name":"node-reader"},"subjects":[{"kind":"Group","name":"ops"},{"kind":"ServiceAccount","name":"nameless-ns"}]}"#,
        );
        rbac.put(
            &format!("{PREFIX}rolebindings/d/sa"),
            br#"{"roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"ClusterRole","name":"node-reader"},"subjects":[{"kind":"ServiceAccount","name":"robot"}]}"#,
        );
        let bob = Identity::new("bob", vec![]);
        assert!(rbac.allows(&bob, &attrs("list", "pods", "", "d", "")));
        let ops = Identity::new("carol", vec!["ops".into()]);
        assert!(rbac.allows(&ops, &attrs("get", "nodes", "", "", "n1")));
        assert!(!rbac.allows(&bob, &attrs("get", "nodes", "", "", "n1")));
        // A service account subject defaults to the binding's namespace, and
        // a cluster binding's to none.
        let robot = Identity::new("system:serviceaccount:d:robot", vec![]);
        assert!(rbac.allows(&robot, &attrs("get", "nodes", "", "d", "n1")));
        assert!(!rbac.allows(&robot, &attrs("get", "nodes", "", "", "n1")));
        let nameless = Identity::new("system:serviceaccount::nameless-ns", vec![]);
        assert!(!rbac.allows(&nameless, &attrs("get", "nodes", "", "", "n1")));
        rbac.remove(&format!("{PREFIX}rolebindings/d/rb"));
        assert!(!rbac.allows(&bob, &attrs("list", "pods", "", "d", "")));
        assert!(!rbac.allows(&bob, &attrs("list", "pods", "", "other", "")));
        assert!(!rbac.allows(
            &Identity::new("eve", vec![]),
            &attrs("list", "pods", "", "d", "")
        ));
    }
}
