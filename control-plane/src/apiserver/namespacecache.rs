//! The namespaces, followed into memory for dynamic admission (namespace
//! selectors of webhooks and policies, policies' `namespaceObject`), as
//! upstream's admission plugins read a namespace informer: a write does
//! not read its namespace from the store each time. A namespace not in
//! the copy yet (just created) is read from the store.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use serde_json::Value;

use crate::store::follow::follow;
use crate::store::Store;

const PREFIX: &str = "/registry/core/namespaces/";

#[derive(Default)]
pub struct NamespaceCache {
    by_key: RwLock<BTreeMap<String, Arc<Value>>>,
}

impl NamespaceCache {
    /// Namespace `name`: from the copy, else from the store.
    pub async fn get(
        &self,
        store: &dyn Store,
        name: &str,
    ) -> crate::store::Result<Option<Arc<Value>>> {
        let key = format!("{PREFIX}{name}");
        if let Some(v) = self
            .by_key
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            return Ok(Some(v.clone()));
        }
        Ok(store
            .get(&key)
            .await?
            .and_then(|kv| serde_json::from_slice::<Value>(&kv.value).ok())
            .map(Arc::new))
    }

    /// Follow the store until `shutdown` fires.
    pub async fn run(&self, store: &dyn Store, shutdown: tokio::sync::watch::Receiver<bool>) {
        let parse = |v: &[u8]| serde_json::from_slice::<Value>(v).ok().map(Arc::new);
        follow(store, PREFIX, shutdown, "namespaces", |change| {
            change.apply_to(
                &mut self.by_key.write().unwrap_or_else(|p| p.into_inner()),
                parse,
            );
        })
        .await;
    }
}
