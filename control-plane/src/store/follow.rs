//! Following a key prefix: list it, then watch from the list's revision,
//! listing again whenever the watch ends (a compaction, a store restart),
//! until shutdown. The in-memory copies the API server reads on every
//! request (RBAC, admission webhook configurations) are kept by it, as
//! upstream's are by informers.

use std::collections::BTreeMap;

use futures::StreamExt;
use tokio::sync::watch;

use super::{Event, KeyValue, Store};

/// What changed under the prefix.
pub enum Change {
    /// Everything there is, after a (re-)list.
    Reset(Vec<KeyValue>),
    Put(KeyValue),
    /// The key of a deleted value.
    Delete(String),
}

impl Change {
    /// Bring `copy` (values by store key) up to date: each stored value
    /// `parse`d, one that does not parse left out.
    pub fn apply_to<T>(self, copy: &mut BTreeMap<String, T>, parse: impl Fn(&[u8]) -> Option<T>) {
        match self {
            Change::Reset(kvs) => {
                *copy = kvs
                    .into_iter()
                    .filter_map(|kv| Some((kv.key, parse(&kv.value)?)))
                    .collect();
            }
            Change::Put(kv) => match parse(&kv.value) {
                Some(v) => {
                    copy.insert(kv.key, v);
                }
                None => {
                    copy.remove(&kv.key);
                }
            },
            Change::Delete(key) => {
                copy.remove(&key);
            }
        }
    }
}

/// Feed `apply` with every change under `prefix` until `shutdown` fires.
/// `what` names the copy in the log.
pub async fn follow(
    store: &dyn Store,
    prefix: &str,
    mut shutdown: watch::Receiver<bool>,
    what: &str,
    mut apply: impl FnMut(Change),
) {
    loop {
        let list = match store.list(prefix, None, 0, None).await {
            Ok(list) => list,
            Err(e) => {
                tracing::warn!(error = %e, "{what}: listing failed; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => continue,
                    _ = crate::leader::stopped(&mut shutdown) => return,
                }
            }
        };
        let rev = list.revision;
        apply(Change::Reset(list.kvs));
        let mut stream = match store.watch(prefix, rev).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "{what}: watch failed; listing again");
                continue;
            }
        };
        loop {
            tokio::select! {
                ev = stream.next() => match ev {
                    Some(Ok(Event::Put { kv, .. })) => apply(Change::Put(kv)),
                    Some(Ok(Event::Delete { prev, .. })) => apply(Change::Delete(prev.key)),
                    Some(Err(e)) => {
                        tracing::info!(error = %e, "{what}: watch ended; listing again");
                        break;
                    }
                    None => break,
                },
                _ = crate::leader::stopped(&mut shutdown) => return,
            }
        }
    }
}
