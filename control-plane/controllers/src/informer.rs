//! A cached, watched view of one resource plus a "something changed"
//! signal, for the controllers that reconcile whole sets (node lifecycle,
//! node IPAM) rather than one object per work item.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;

use futures::StreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

/// Objects a watch may get ahead of its consumer by before it waits.
const EVENT_BUFFER: usize = 1024;

/// A reflector store fed by a watch, and a wake-up on every watch event.
///
/// The watch runs in its own task (retrying with kube's default back-off)
/// until the `Informer` is dropped.
pub struct Informer<K: Resource + 'static>
where
    K::DynamicType: Eq + Hash + Clone,
{
    store: Store<K>,
    /// Notified (with a stored permit, so nothing is lost) after the store
    /// applied a watch event; waited on by the one loop that owns this.
    changed: Arc<Notify>,
    task: JoinHandle<()>,
}

impl<K> Informer<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    /// Start watching `api` with `cfg`.
    pub fn start(api: Api<K>, cfg: watcher::Config) -> Self {
        Self::spawn(api, cfg, None)
    }

    /// Like [`Informer::start`], and also send every object the watch
    /// touches (listed, added, modified or deleted), after the store
    /// took it in, to the returned receiver: the work queue of a
    /// controller that maps objects to the things it reconciles.
    pub fn start_with_events(api: Api<K>, cfg: watcher::Config) -> (Self, mpsc::Receiver<K>) {
        let (tx, rx) = mpsc::channel(EVENT_BUFFER);
        (Self::spawn(api, cfg, Some(tx)), rx)
    }

    fn spawn(api: Api<K>, cfg: watcher::Config, events: Option<mpsc::Sender<K>>) -> Self {
        let (store, writer) = reflector::store();
        let changed = Arc::new(Notify::new());
        let notify = changed.clone();
        let kind = K::kind(&()).into_owned();
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(watcher(api, cfg).default_backoff().reflect(writer));
            while let Some(ev) = stream.next().await {
                let ev = match ev {
                    Ok(ev) => ev,
                    // The watcher retries by itself; say why it had to.
                    Err(e) => {
                        tracing::warn!(kind, "watch failed, retrying: {e}");
                        continue;
                    }
                };
                notify.notify_one();
                let Some(tx) = &events else {
                    continue;
                };
                let obj = match ev {
                    watcher::Event::Apply(o)
                    | watcher::Event::Delete(o)
                    | watcher::Event::InitApply(o) => o,
                    watcher::Event::Init | watcher::Event::InitDone => continue,
                };
                // A closed receiver means its controller stopped: keep
                // the store going for whoever still reads it.
                let _ = tx.send(obj).await;
            }
        });
        Informer {
            store,
            changed,
            task,
        }
    }

    /// The cached objects.
    pub fn store(&self) -> &Store<K> {
        &self.store
    }

    /// Wait until the first list has been loaded.
    pub async fn ready(&self) {
        // Only fails if the writer is dropped, i.e. the watch task ended:
        // then there is nothing more to wait for.
        let _ = self.store.wait_until_ready().await;
    }

    /// Wait for the next change (returns at once if one happened since the
    /// last call).
    pub async fn changed(&self) {
        self.changed.notified().await;
    }
}

impl<K: Resource + 'static> Drop for Informer<K>
where
    K::DynamicType: Eq + Hash + Clone,
{
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A receiver as a stream (ends when every sender is gone).
pub fn receiver_stream<T>(mut rx: mpsc::Receiver<T>) -> impl futures::Stream<Item = T> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
