//! One watched cache per kind (client-go's shared informer): a list and
//! watch through kube-runtime's watcher into a reflector store, lookups on
//! it, and subscriptions that hear of every change after the store took
//! it in. [`Factory`] hands out one informer per kind and scope to every
//! controller of a process, so that they all read the same cache fed by
//! one watch: two caches of the same objects are a disagreement waiting
//! to happen.
//!
//! The watcher re-lists after a desync (410 Gone), an API server restart
//! or any error, with back-off. A re-list replaces the store at once when
//! complete (never half-filled), and subscribers then hear `Relisting`,
//! every listed object, a `Deleted` for each object that vanished while
//! the watch was away (upstream's `DeletedFinalStateUnknown`), and
//! `Listed`.

use std::any::{Any, TypeId};
use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use futures::{Stream, StreamExt};
use k8s_openapi::NamespaceResourceScope;
use kube::runtime::reflector::{self, store::Writer, ObjectRef, Store};
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch as signal};
use tokio::task::JoinHandle;

/// What an informer can watch: a typed Kubernetes object.
pub trait Object:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
}

impl<K> Object for K where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
}

/// Why an informer cannot serve.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Its watch task ended (the informer was dropped, or the runtime is
    /// shutting down) before the first list was in.
    #[error("the watch of {kind} stopped before its first list was loaded")]
    Stopped { kind: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A change, sent to subscribers after the store applied it.
#[derive(Debug)]
pub enum Change<K> {
    /// A complete list is about to be replayed (the first one, a re-list,
    /// or the current contents for a new subscriber).
    Relisting,
    /// Added or modified (or listed); the store holds this version.
    Applied(Arc<K>),
    /// Deleted, or gone from a re-list; the store no longer holds it.
    Deleted(Arc<K>),
    /// The list replay is complete: the subscriber has seen everything.
    Listed,
}

impl<K> Clone for Change<K> {
    fn clone(&self) -> Self {
        match self {
            Change::Relisting => Change::Relisting,
            Change::Applied(o) => Change::Applied(o.clone()),
            Change::Deleted(o) => Change::Deleted(o.clone()),
            Change::Listed => Change::Listed,
        }
    }
}

impl<K> Change<K> {
    /// The object applied or deleted, with whether it still exists.
    pub fn object(&self) -> Option<(&Arc<K>, bool)> {
        match self {
            Change::Applied(o) => Some((o, true)),
            Change::Deleted(o) => Some((o, false)),
            Change::Relisting | Change::Listed => None,
        }
    }
}

/// What the watch task and the subscribers share.
struct Shared<K> {
    /// One sender per subscription. Unbounded, as client-go's listeners
    /// are: a slow controller must neither hold up the watch for the
    /// others nor lose a change (its own queue grows instead). Senders
    /// whose subscription was dropped are removed on the next change.
    /// The store is only written with this lock held, so a new
    /// subscriber's replay and the changes after it never overlap.
    subscribers: Mutex<Vec<mpsc::UnboundedSender<Change<K>>>>,
    synced: AtomicBool,
}

impl<K> Shared<K> {
    fn lock(&self) -> MutexGuard<'_, Vec<mpsc::UnboundedSender<Change<K>>>> {
        self.subscribers.lock().unwrap_or_else(|p| p.into_inner())
    }
}

struct Handle<K: Object> {
    store: Store<K>,
    shared: Arc<Shared<K>>,
    /// True once the first list is in. Its sender belongs to the watch
    /// task, so waiters learn when that task ends. (kube-runtime's
    /// `Store::wait_until_ready` wakes only one of several concurrent
    /// waiters, and here every controller of a kind waits on one store.)
    synced: signal::Receiver<bool>,
    task: JoinHandle<()>,
}

impl<K: Object> Drop for Handle<K> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A watched cache of `K`. Cheap to clone; the watch runs until the last
/// clone is dropped.
pub struct Informer<K: Object> {
    inner: Arc<Handle<K>>,
}

impl<K: Object> Clone for Informer<K> {
    fn clone(&self) -> Self {
        Informer {
            inner: self.inner.clone(),
        }
    }
}

impl<K: Object> Informer<K> {
    /// Start watching `api` with `cfg`. Must be called within a tokio
    /// runtime. Prefer [`Factory`], which shares informers.
    pub fn start(api: Api<K>, cfg: watcher::Config) -> Self {
        let (store, writer) = reflector::store();
        let shared = Arc::new(Shared {
            subscribers: Mutex::new(Vec::new()),
            synced: AtomicBool::new(false),
        });
        let (synced_tx, synced) = signal::channel(false);
        let task = tokio::spawn(watch(
            api,
            cfg,
            writer,
            store.clone(),
            shared.clone(),
            synced_tx,
        ));
        Informer {
            inner: Arc::new(Handle {
                store,
                shared,
                synced,
                task,
            }),
        }
    }

    /// The kube-runtime store, for kube-runtime's applier and friends.
    pub fn store(&self) -> &Store<K> {
        &self.inner.store
    }

    /// The object named `name` (in `namespace`, for namespaced kinds).
    pub fn get(&self, namespace: Option<&str>, name: &str) -> Option<Arc<K>> {
        let mut r = ObjectRef::new(name);
        if let Some(ns) = namespace {
            r = r.within(ns);
        }
        self.inner.store.get(&r)
    }

    /// Every cached object, in no particular order.
    pub fn list(&self) -> Vec<Arc<K>> {
        self.inner.store.state()
    }

    /// The cached objects in `namespace`.
    pub fn list_namespace(&self, namespace: &str) -> Vec<Arc<K>> {
        self.inner
            .store
            .state_filter(|o| o.meta().namespace.as_deref() == Some(namespace))
    }

    /// Whether the first complete list is in the store.
    pub fn has_synced(&self) -> bool {
        self.inner.shared.synced.load(Ordering::Acquire)
    }

    /// Wait until the first complete list is in the store. A controller
    /// that acted on a half-filled cache would, for example, create pods
    /// that exist.
    ///
    /// # Errors
    /// [`Error::Stopped`] when the watch ended first.
    pub async fn ready(&self) -> Result<()> {
        let mut synced = self.inner.synced.clone();
        synced
            .wait_for(|s| *s)
            .await
            .map(|_| ())
            .map_err(|_| Error::Stopped {
                kind: K::kind(&()).into_owned(),
            })
    }

    /// Hear of every change from now on. When the store is already
    /// synced, the subscription starts with a replay of its contents
    /// (`Relisting`, `Applied` for each object, `Listed`), so a late
    /// subscriber misses nothing.
    pub fn subscribe(&self) -> Subscription<K> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut subs = self.inner.shared.lock();
        if self.has_synced() {
            let _ = tx.send(Change::Relisting);
            for o in self.inner.store.state() {
                let _ = tx.send(Change::Applied(o));
            }
            let _ = tx.send(Change::Listed);
        }
        subs.push(tx);
        Subscription {
            rx,
            _informer: self.clone(),
        }
    }
}

/// The changes of one informer, for one consumer. Keeps the informer
/// alive.
pub struct Subscription<K: Object> {
    /// Sent to by the informer's watch task; ends when that task does.
    rx: mpsc::UnboundedReceiver<Change<K>>,
    _informer: Informer<K>,
}

impl<K: Object> Subscription<K> {
    /// The next change; `None` once the watch ended.
    pub async fn recv(&mut self) -> Option<Change<K>> {
        self.rx.recv().await
    }

    /// Wait for at least one change and take every change already
    /// queued: for loops that reconcile the whole store on any change.
    /// Returns false once the watch ended.
    pub async fn changed(&mut self) -> bool {
        if self.rx.recv().await.is_none() {
            return false;
        }
        while self.rx.try_recv().is_ok() {}
        true
    }

    /// The changes as a stream (ends when the watch does).
    pub fn into_stream(self) -> impl Stream<Item = Change<K>> + Send {
        futures::stream::unfold(self, |mut s| async move { s.recv().await.map(|c| (c, s)) })
    }

    /// The objects applied or deleted, as a stream: the trigger of a
    /// reconcile loop keyed on the objects themselves.
    pub fn objects(self) -> impl Stream<Item = Arc<K>> + Send {
        self.into_stream().filter_map(|c| async move {
            match c {
                Change::Applied(o) | Change::Deleted(o) => Some(o),
                Change::Relisting | Change::Listed => None,
            }
        })
    }
}

/// The watch task: apply each event to the store, then tell subscribers.
async fn watch<K: Object>(
    api: Api<K>,
    cfg: watcher::Config,
    mut writer: Writer<K>,
    store: Store<K>,
    shared: Arc<Shared<K>>,
    synced: signal::Sender<bool>,
) {
    let kind = K::kind(&()).into_owned();
    let mut events = std::pin::pin!(watcher(api, cfg).default_backoff());
    while let Some(ev) = events.next().await {
        let ev = match ev {
            Ok(ev) => ev,
            // The watcher retries with back-off by itself; say why.
            Err(e) => {
                tracing::warn!(kind, error = %e,
                    "watch failed, re-listing with back-off (check the API server and this client's RBAC)");
                continue;
            }
        };
        let mut subs = shared.lock();
        let Some(changes) = apply(&mut writer, &store, &shared.synced, ev) else {
            continue;
        };
        subs.retain(|tx| changes.iter().all(|c| tx.send(c.clone()).is_ok()));
        drop(subs);
        if shared.synced.load(Ordering::Acquire) {
            synced.send_if_modified(|s| !std::mem::replace(s, true));
        }
    }
}

/// Apply `ev` to the store through `writer`; the changes to tell
/// subscribers, if any.
fn apply<K: Object>(
    writer: &mut Writer<K>,
    store: &Store<K>,
    synced: &AtomicBool,
    ev: Event<K>,
) -> Option<Vec<Change<K>>> {
    Some(match ev {
        // Buffered by the writer until the list is complete.
        Event::Init | Event::InitApply(_) => {
            writer.apply_watcher_event(&ev);
            return None;
        }
        Event::InitDone => {
            let before = store.state();
            writer.apply_watcher_event(&ev);
            let after = store.state();
            let listed: HashSet<ObjectRef<K>> =
                after.iter().map(|o| ObjectRef::from_obj(&**o)).collect();
            let gone = before
                .into_iter()
                .filter(|o| !listed.contains(&ObjectRef::from_obj(&**o)));
            let mut out = Vec::with_capacity(after.len() + 2);
            out.push(Change::Relisting);
            out.extend(after.into_iter().map(Change::Applied));
            out.extend(gone.map(Change::Deleted));
            out.push(Change::Listed);
            synced.store(true, Ordering::Release);
            out
        }
        Event::Apply(o) => {
            let key = ObjectRef::from_obj(&o);
            writer.apply_watcher_event(&Event::Apply(o));
            vec![Change::Applied(store.get(&key)?)]
        }
        Event::Delete(o) => {
            let ev = Event::Delete(o);
            writer.apply_watcher_event(&ev);
            let Event::Delete(o) = ev else {
                unreachable!("built just above")
            };
            vec![Change::Deleted(Arc::new(o))]
        }
    })
}

/// What part of a kind an informer watches, besides the kind itself.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Scope {
    /// Only this namespace (all namespaces when `None`).
    pub namespace: Option<String>,
    /// A label selector (`a=b,c`).
    pub labels: Option<String>,
    /// A field selector (`type=x`).
    pub fields: Option<String>,
}

impl Scope {
    /// Objects with labels matching `selector`.
    pub fn labels(selector: &str) -> Self {
        Scope {
            labels: Some(selector.to_string()),
            ..Scope::default()
        }
    }

    /// Also restrict to fields matching `selector`.
    pub fn with_fields(mut self, selector: &str) -> Self {
        self.fields = Some(selector.to_string());
        self
    }

    fn config(&self) -> watcher::Config {
        let mut cfg = watcher::Config::default();
        if let Some(l) = &self.labels {
            cfg = cfg.labels(l);
        }
        if let Some(f) = &self.fields {
            cfg = cfg.fields(f);
        }
        cfg
    }
}

/// One informer per kind and scope for a whole process (client-go's
/// `SharedInformerFactory`). Cheap to clone; informers start on first
/// use and run as long as the factory (or a clone of one) holds them.
#[derive(Clone)]
pub struct Factory {
    client: kube::Client,
    informers: Arc<Mutex<Started>>,
}

/// The informers started so far, by kind and scope; each an `Informer<K>`.
type Started = HashMap<(TypeId, Scope), Box<dyn Any + Send + Sync>>;

impl std::fmt::Debug for Factory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Factory").finish_non_exhaustive()
    }
}

impl Factory {
    pub fn new(client: kube::Client) -> Self {
        Factory {
            client,
            informers: Arc::default(),
        }
    }

    /// The informer of every `K` in the cluster.
    pub fn get<K: Object>(&self) -> Informer<K> {
        self.get_scoped(Scope::default())
    }

    /// The informer of the `K` that `scope` selects, in all namespaces
    /// (`scope.namespace` must be `None`; see [`Factory::namespaced`]).
    pub fn get_scoped<K: Object>(&self, scope: Scope) -> Informer<K> {
        debug_assert!(scope.namespace.is_none(), "use Factory::namespaced");
        self.informer(scope, |client, _| Api::all(client.clone()))
    }

    /// The informer of the `K` in `namespace` that `scope` selects.
    pub fn namespaced<K>(&self, namespace: &str, scope: Scope) -> Informer<K>
    where
        K: Object + Resource<Scope = NamespaceResourceScope>,
    {
        let scope = Scope {
            namespace: Some(namespace.to_string()),
            ..scope
        };
        self.informer(scope, |client, scope| {
            Api::namespaced(
                client.clone(),
                scope.namespace.as_deref().unwrap_or_default(),
            )
        })
    }

    fn informer<K: Object>(
        &self,
        scope: Scope,
        api: impl FnOnce(&kube::Client, &Scope) -> Api<K>,
    ) -> Informer<K> {
        let mut map = self.informers.lock().unwrap_or_else(|p| p.into_inner());
        let key = (TypeId::of::<K>(), scope);
        if let Some(i) = map.get(&key).and_then(|b| b.downcast_ref::<Informer<K>>()) {
            return i.clone();
        }
        let informer = Informer::start(api(&self.client, &key.1), key.1.config());
        map.insert(key, Box::new(informer.clone()));
        informer
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn client() -> kube::Client {
        let cfg = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        kube::Client::try_from(cfg).unwrap()
    }

    #[tokio::test]
    async fn the_factory_shares_one_informer_per_kind_and_scope() {
        let f = Factory::new(client());
        let a = f.get::<ConfigMap>();
        let b = f.clone().get::<ConfigMap>();
        assert!(Arc::ptr_eq(&a.inner, &b.inner));
        let labelled = f.get_scoped::<ConfigMap>(Scope::labels("a=b"));
        assert!(!Arc::ptr_eq(&a.inner, &labelled.inner));
        let ns = f.namespaced::<ConfigMap>("kube-system", Scope::default());
        assert!(!Arc::ptr_eq(&a.inner, &ns.inner));
        assert!(Arc::ptr_eq(
            &ns.inner,
            &f.namespaced::<ConfigMap>("kube-system", Scope::default())
                .inner
        ));
        // Nothing answers on port 1: never synced.
        assert!(!a.has_synced());
        assert!(a.list().is_empty());
    }

    fn cm(name: &str, v: &str) -> ConfigMap {
        ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            data: Some([("v".to_string(), v.to_string())].into()),
            ..Default::default()
        }
    }

    fn describe(changes: &[Change<ConfigMap>]) -> Vec<String> {
        let mut out: Vec<String> = changes
            .iter()
            .map(|c| match c {
                Change::Relisting => "relisting".into(),
                Change::Listed => "listed".into(),
                Change::Applied(o) => format!(
                    "+{}={}",
                    o.metadata.name.as_deref().unwrap(),
                    o.data.as_ref().unwrap()["v"]
                ),
                Change::Deleted(o) => format!("-{}", o.metadata.name.as_deref().unwrap()),
            })
            .collect();
        // Objects of one list come in no particular order.
        if out.len() > 2 {
            let n = out.len();
            out[1..n - 1].sort();
        }
        out
    }

    #[test]
    fn changes_follow_the_store_and_relists_report_what_vanished() {
        let (store, mut writer) = reflector::store::<ConfigMap>();
        let synced = AtomicBool::new(false);
        let mut feed = |ev| apply(&mut writer, &store, &synced, ev).map(|c| describe(&c));
        assert_eq!(feed(Event::Init), None);
        assert_eq!(feed(Event::InitApply(cm("a", "1"))), None);
        assert_eq!(feed(Event::InitApply(cm("b", "1"))), None);
        assert!(store.state().is_empty(), "a list is never half-applied");
        assert!(!synced.load(Ordering::Acquire));
        assert_eq!(
            feed(Event::InitDone).unwrap(),
            ["relisting", "+a=1", "+b=1", "listed"]
        );
        assert!(synced.load(Ordering::Acquire));
        assert_eq!(feed(Event::Apply(cm("a", "2"))).unwrap(), ["+a=2"]);
        assert_eq!(feed(Event::Delete(cm("b", "1"))).unwrap(), ["-b"]);
        assert_eq!(feed(Event::Apply(cm("c", "1"))).unwrap(), ["+c=1"]);
        // A re-list (after a 410) in which c is missing: deleted meanwhile.
        assert_eq!(feed(Event::Init), None);
        assert_eq!(feed(Event::InitApply(cm("a", "3"))), None);
        assert_eq!(
            store.state().len(),
            2,
            "the old list serves until the new one is in"
        );
        assert_eq!(
            feed(Event::InitDone).unwrap(),
            ["relisting", "+a=3", "-c", "listed"]
        );
        let names: Vec<_> = store
            .state()
            .iter()
            .map(|o| o.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["a"]);
    }

    #[tokio::test]
    async fn late_subscribers_get_a_replay_and_closed_watches_end_them() {
        // Stand in for the watch task: feed the store by hand.
        let started = Informer::<ConfigMap>::start(Api::all(client()), watcher::Config::default());
        let shared = started.inner.shared.clone();
        drop(started);
        let (store, mut writer) = reflector::store::<ConfigMap>();
        let (synced_tx, synced) = signal::channel(false);
        let i = Informer {
            inner: Arc::new(Handle {
                store: store.clone(),
                shared: shared.clone(),
                synced,
                task: tokio::spawn(async {}),
            }),
        };
        let mut early = i.subscribe();
        for ev in [Event::Init, Event::InitApply(cm("a", "1")), Event::InitDone] {
            let mut subs = shared.lock();
            if let Some(changes) = apply(&mut writer, &store, &shared.synced, ev) {
                subs.retain(|tx| changes.iter().all(|c| tx.send(c.clone()).is_ok()));
            }
        }
        assert!(i.has_synced());
        let (a, b) = (i.clone(), i.clone());
        let waiters = tokio::spawn(async move {
            let (x, y) = tokio::join!(a.ready(), b.ready());
            x.is_ok() && y.is_ok()
        });
        tokio::task::yield_now().await;
        synced_tx.send_replace(true);
        assert!(waiters.await.unwrap(), "every waiter wakes");
        i.ready().await.unwrap();
        assert_eq!(
            i.get(Some("ns"), "a").unwrap().data.as_ref().unwrap()["v"],
            "1"
        );
        assert_eq!(i.list_namespace("ns").len(), 1);
        assert!(i.list_namespace("other").is_empty());
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(early.recv().await.unwrap());
        }
        assert_eq!(describe(&got), ["relisting", "+a=1", "listed"]);
        let late = i.subscribe();
        let Subscription { mut rx, _informer } = late;
        let mut replay = Vec::new();
        while let Ok(c) = rx.try_recv() {
            replay.push(c);
        }
        assert_eq!(describe(&replay), ["relisting", "+a=1", "listed"]);
        // Everything dropped: the shared senders go with the informer.
        drop((i, _informer, early));
        drop(shared);
        assert!(rx.recv().await.is_none());
    }

    #[tokio::test]
    async fn ready_fails_once_the_watch_task_is_gone() {
        let (store, _writer) = reflector::store::<ConfigMap>();
        let (synced_tx, synced) = signal::channel(false);
        let i = Informer {
            inner: Arc::new(Handle {
                store,
                shared: Arc::new(Shared {
                    subscribers: Mutex::new(Vec::new()),
                    synced: AtomicBool::new(false),
                }),
                synced,
                task: tokio::spawn(async {}),
            }),
        };
        let waiting = tokio::spawn({
            let i = i.clone();
            async move { i.ready().await }
        });
        drop(synced_tx);
        assert!(matches!(waiting.await.unwrap(), Err(Error::Stopped { .. })));
    }
}
