//! The watch cache (kube-apiserver's `--watch-cache`): client watches of
//! one resource type share one store watch.
//!
//! The first watch of a type (`/registry/GROUP/RESOURCE/`) opens a store
//! watch from its revision and a task that keeps a window of the latest
//! [`WINDOW`] events and broadcasts each new one. A later watch starting
//! inside the window is served the window's events after its revision,
//! then the broadcast; one starting before it, or one the broadcast
//! leaves behind (a slow reader), is served by a store watch of its own
//! from where it is, so the answers are the store's (history, `410 Gone`
//! once compacted: compactions through this store trim the windows)
//! either way. A type nobody watches for [`IDLE`] closes its store watch.
//!
//! Watches of other prefixes (a whole group, everything) go to the store.

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::{broadcast, watch};

use super::{Event, KeyValue, ListResult, Result, SnapshotInfo, Store, WatchStream};

/// Events a type's window keeps (and a reader may fall behind by before
/// it is moved to a store watch of its own).
pub const WINDOW: usize = 1024;

/// How long a type's store watch stays open with no client watching.
pub const IDLE: Duration = Duration::from_secs(30);

/// A [`Store`] whose watches are shared per resource type.
pub struct WatchCache {
    inner: Arc<dyn Store>,
    types: Arc<Mutex<HashMap<String, Arc<Mutex<Window>>>>>,
    shutdown: watch::Receiver<bool>,
}

/// One resource type's recent events.
struct Window {
    /// Every event of the type with a revision above this is in `events`
    /// or still to come.
    since: i64,
    /// A revision the store is known to have reached (the last event's,
    /// or one a watch was checked against); watches after it wait for
    /// the store.
    latest: i64,
    events: VecDeque<Arc<Event>>,
    /// `None` once the store watch has ended: new watches go to the store.
    tx: Option<broadcast::Sender<Arc<Event>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `/registry/GROUP/RESOURCE/` of a watch prefix within one type.
fn type_prefix(prefix: &str) -> Option<&str> {
    const ROOT: &str = "/registry/";
    let rest = prefix.strip_prefix(ROOT)?;
    let end = rest.match_indices('/').nth(1)?.0;
    Some(&prefix[..ROOT.len() + end + 1])
}

fn key(ev: &Event) -> &str {
    match ev {
        Event::Put { kv, .. } => &kv.key,
        Event::Delete { prev, .. } => &prev.key,
    }
}

impl WatchCache {
    /// Share `inner`'s watches until `shutdown` turns true.
    pub fn new(inner: Arc<dyn Store>, shutdown: watch::Receiver<bool>) -> Self {
        WatchCache {
            inner,
            types: Arc::default(),
            shutdown,
        }
    }

    /// The window of `ty`, opening its store watch after `after` when
    /// there is none.
    async fn window(&self, ty: &str, after: i64) -> Result<Arc<Mutex<Window>>> {
        if let Some(w) = lock(&self.types).get(ty) {
            return Ok(w.clone());
        }
        let stream = self.inner.watch(ty, after).await?;
        let mut types = lock(&self.types);
        if let Some(w) = types.get(ty) {
            // Another watch opened it meanwhile: ours is dropped.
            return Ok(w.clone());
        }
        let (tx, _) = broadcast::channel(WINDOW);
        let w = Arc::new(Mutex::new(Window {
            since: after,
            latest: after,
            events: VecDeque::new(),
            tx: Some(tx),
        }));
        types.insert(ty.to_string(), w.clone());
        tokio::spawn(feed(Feed {
            inner: self.inner.clone(),
            ty: ty.to_string(),
            window: w.clone(),
            types: self.types.clone(),
            stream,
            shutdown: self.shutdown.clone(),
        }));
        Ok(w)
    }

    /// A watch of `prefix` after `after` served from `window`, or `None`
    /// when the window cannot serve it.
    fn subscribe(window: &Mutex<Window>, prefix: &str, after: i64) -> Option<Sub> {
        let w = lock(window);
        let tx = w.tx.as_ref()?;
        if after < w.since || after > w.latest {
            return None;
        }
        let backlog = w
            .events
            .iter()
            .filter(|e| e.revision() > after && key(e).starts_with(prefix))
            .cloned()
            .collect();
        Some(Sub::Cache {
            backlog,
            rx: tx.subscribe(),
        })
    }
}

/// What feeds one type's window.
struct Feed {
    inner: Arc<dyn Store>,
    ty: String,
    window: Arc<Mutex<Window>>,
    types: Arc<Mutex<HashMap<String, Arc<Mutex<Window>>>>>,
    stream: WatchStream,
    shutdown: watch::Receiver<bool>,
}

/// Keep the window until the store watch ends for good, nobody watches
/// for [`IDLE`], or the server stops; then close it, so its watchers move
/// to store watches of their own and new ones open another.
async fn feed(mut f: Feed) {
    let mut idle = tokio::time::interval_at(tokio::time::Instant::now() + IDLE, IDLE);
    let mut last = lock(&f.window).since;
    loop {
        tokio::select! {
            ev = f.stream.next() => match ev {
                Some(Ok(ev)) => {
                    last = ev.revision();
                    let mut w = lock(&f.window);
                    let ev = Arc::new(ev);
                    w.latest = last;
                    w.events.push_back(ev.clone());
                    while w.events.len() > WINDOW {
                        if let Some(old) = w.events.pop_front() {
                            w.since = old.revision();
                        }
                    }
                    if let Some(tx) = &w.tx {
                        let _ = tx.send(ev);
                    }
                }
                // Reopened where it was, after a pause (a store whose
                // watches end at once is not spun on); a store that
                // cannot (compacted past it, gone) closes the window.
                _ => match reopen(&f.inner, &f.ty, last).await {
                    Ok(s) => f.stream = s,
                    Err(e) => {
                        tracing::debug!(prefix = %f.ty, "watch cache closes: {e}");
                        break;
                    }
                },
            },
            _ = idle.tick() => {
                let quiet = lock(&f.window).tx.as_ref().is_none_or(|tx| tx.receiver_count() == 0);
                if quiet {
                    break;
                }
            }
            _ = crate::leader::stopped(&mut f.shutdown) => break,
        }
    }
    let mut types = lock(&f.types);
    lock(&f.window).tx = None;
    if types.get(&f.ty).is_some_and(|w| Arc::ptr_eq(w, &f.window)) {
        types.remove(&f.ty);
    }
}

async fn reopen(inner: &Arc<dyn Store>, ty: &str, after: i64) -> Result<WatchStream> {
    tokio::time::sleep(Duration::from_millis(100)).await;
    inner.watch(ty, after).await
}

/// One client watch: from the window, or from a store watch of its own.
enum Sub {
    Cache {
        backlog: VecDeque<Arc<Event>>,
        rx: broadcast::Receiver<Arc<Event>>,
    },
    Store(WatchStream),
    Done,
}

struct Reader {
    inner: Arc<dyn Store>,
    prefix: String,
    /// The revision of the last event given.
    seen: i64,
    sub: Sub,
}

impl Reader {
    async fn next(&mut self) -> Option<Result<Event>> {
        loop {
            let ev = match &mut self.sub {
                Sub::Done => return None,
                Sub::Store(s) => {
                    let item = s.next().await;
                    match &item {
                        Some(Ok(ev)) => self.seen = ev.revision(),
                        Some(Err(_)) | None => self.sub = Sub::Done,
                    }
                    return item;
                }
                Sub::Cache { backlog, rx } => match backlog.pop_front() {
                    Some(ev) => ev,
                    None => match rx.recv().await {
                        Ok(ev) => ev,
                        // Left behind, or the window closed: on from
                        // here with a store watch.
                        Err(_) => {
                            match self.inner.watch(&self.prefix, self.seen).await {
                                Ok(s) => self.sub = Sub::Store(s),
                                Err(e) => {
                                    self.sub = Sub::Done;
                                    return Some(Err(e));
                                }
                            }
                            continue;
                        }
                    },
                },
            };
            if ev.revision() > self.seen && key(&ev).starts_with(&self.prefix) {
                self.seen = ev.revision();
                return Some(Ok((*ev).clone()));
            }
        }
    }
}

#[async_trait::async_trait]
impl Store for WatchCache {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    async fn current_revision(&self) -> Result<i64> {
        self.inner.current_revision().await
    }
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        self.inner.get(key).await
    }
    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
        revision: Option<i64>,
    ) -> Result<ListResult> {
        self.inner.list(prefix, start_after, limit, revision).await
    }
    async fn create_with_ttl(
        &self,
        key: &str,
        value: Vec<u8>,
        ttl: Option<Duration>,
    ) -> Result<KeyValue> {
        self.inner.create_with_ttl(key, value, ttl).await
    }
    async fn update_with_ttl(
        &self,
        key: &str,
        value: Vec<u8>,
        expected_revision: i64,
        ttl: Option<Duration>,
    ) -> Result<KeyValue> {
        self.inner
            .update_with_ttl(key, value, expected_revision, ttl)
            .await
    }
    async fn delete(&self, key: &str, expected_revision: Option<i64>) -> Result<(KeyValue, i64)> {
        self.inner.delete(key, expected_revision).await
    }

    async fn watch(&self, prefix: &str, after_revision: i64) -> Result<WatchStream> {
        let Some(ty) = type_prefix(prefix) else {
            return self.inner.watch(prefix, after_revision).await;
        };
        let after = after_revision.max(0);
        let window = self.window(ty, after).await?;
        let mut sub = Self::subscribe(&window, prefix, after);
        if sub.is_none() && after > lock(&window).latest {
            // Ahead of what the window has seen: fine if the store has
            // reached it (the window's events are on their way), else
            // the store answers.
            if after <= self.inner.current_revision().await? {
                let mut w = lock(&window);
                w.latest = w.latest.max(after);
                drop(w);
                sub = Self::subscribe(&window, prefix, after);
            }
        }
        let sub = match sub {
            Some(s) => s,
            None => Sub::Store(self.inner.watch(prefix, after).await?),
        };
        let reader = Reader {
            inner: self.inner.clone(),
            prefix: prefix.to_string(),
            seen: after,
            sub,
        };
        Ok(Box::pin(futures::stream::unfold(
            reader,
            |mut r| async move { r.next().await.map(|item| (item, r)) },
        )))
    }

    /// Windows forget what the store forgot, so watches from before the
    /// compaction get the store's `410 Gone`, as without the cache.
    async fn compact(&self, revision: i64) -> Result<()> {
        self.inner.compact(revision).await?;
        for w in lock(&self.types).values() {
            let mut w = lock(w);
            while w.events.front().is_some_and(|e| e.revision() <= revision) {
                w.events.pop_front();
            }
            w.since = w.since.max(revision);
            w.latest = w.latest.max(w.since);
        }
        Ok(())
    }
    async fn health(&self) -> Result<()> {
        self.inner.health().await
    }
    async fn snapshot_save(&self, path: &Path) -> Result<SnapshotInfo> {
        self.inner.snapshot_save(path).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SqliteStore;

    async fn sqlite(dir: &tempfile::TempDir) -> Arc<dyn Store> {
        Arc::new(
            SqliteStore::open(dir.path().join("db.sqlite"))
                .await
                .unwrap(),
        )
    }

    /// The keys of the next `n` events.
    async fn keys(s: &mut WatchStream, n: usize) -> Vec<String> {
        let mut out = Vec::new();
        for _ in 0..n {
            let ev = tokio::time::timeout(Duration::from_secs(10), s.next())
                .await
                .expect("an event in time")
                .expect("the watch goes on")
                .expect("no error");
            out.push(key(&ev).to_string());
        }
        out
    }

    #[tokio::test]
    async fn watchers_share_a_window_and_fall_back_to_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let inner = sqlite(&dir).await;
        let (stop, stopped) = watch::channel(false);
        let cache = WatchCache::new(inner.clone(), stopped);
        let start = inner.current_revision().await.unwrap();
        let mut all = cache.watch("/registry/core/pods/", start).await.unwrap();
        let mut one_ns = cache.watch("/registry/core/pods/b/", start).await.unwrap();
        let mut others = cache.watch("/registry/core/other/", start).await.unwrap();
        assert_eq!(lock(&cache.types).len(), 2, "one window per type");
        let mut slow = cache.watch("/registry/core/pods/", start).await.unwrap();
        for i in 0..(WINDOW + 50) {
            let ns = if i % 2 == 0 { "a" } else { "b" };
            inner
                .create(&format!("/registry/core/pods/{ns}/p{i}"), b"x".to_vec())
                .await
                .unwrap();
        }
        let want: Vec<String> = (0..(WINDOW + 50))
            .map(|i| {
                format!(
                    "/registry/core/pods/{}/p{i}",
                    if i % 2 == 0 { "a" } else { "b" }
                )
            })
            .collect();
        assert_eq!(keys(&mut all, want.len()).await, want);
        let b: Vec<String> = want.iter().filter(|k| k.contains("/b/")).cloned().collect();
        assert_eq!(keys(&mut one_ns, b.len()).await, b);
        // `slow` read nothing while more than the broadcast holds went
        // by: it goes on from a store watch, missing nothing.
        assert_eq!(keys(&mut slow, want.len()).await, want);
        inner
            .create("/registry/core/other/o", b"x".to_vec())
            .await
            .unwrap();
        assert_eq!(keys(&mut others, 1).await, ["/registry/core/other/o"]);

        // From before the window: the store's history.
        let mut early = cache.watch("/registry/core/pods/a/", start).await.unwrap();
        let a: Vec<String> = want.iter().filter(|k| k.contains("/a/")).cloned().collect();
        assert_eq!(keys(&mut early, a.len()).await, a);
        // From inside it (the last write was the other type's).
        let rev = inner.current_revision().await.unwrap();
        let mut late = cache.watch("/registry/core/pods/", rev - 3).await.unwrap();
        assert_eq!(keys(&mut late, 2).await, want[want.len() - 2..]);

        // Compacted history is the store's 410, through the cache too.
        inner.compact(rev).await.unwrap();
        assert!(matches!(
            cache.watch("/registry/core/pods/", start).await,
            Err(crate::store::Error::Compacted { .. })
        ));

        // Stopping closes the windows; open watches go on from the store.
        stop.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), async {
            while !lock(&cache.types).is_empty() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("windows closed");
        inner
            .create("/registry/core/pods/a/after", b"x".to_vec())
            .await
            .unwrap();
        assert_eq!(keys(&mut all, 1).await, ["/registry/core/pods/a/after"]);
    }

    #[test]
    fn watches_of_one_type_share_its_prefix() {
        assert_eq!(
            type_prefix("/registry/core/pods/"),
            Some("/registry/core/pods/")
        );
        assert_eq!(
            type_prefix("/registry/apps/deployments/ns/"),
            Some("/registry/apps/deployments/")
        );
        assert_eq!(
            type_prefix("/registry/example.com/widgets/ns/name"),
            Some("/registry/example.com/widgets/")
        );
        assert_eq!(type_prefix("/registry/rbac.authorization.k8s.io/"), None);
        assert_eq!(type_prefix("/registry/"), None);
        assert_eq!(type_prefix(""), None);
    }
}
