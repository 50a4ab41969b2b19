//! One conformance body for every `Store` backend: SQLite and a real etcd.

use crate::etcd_support;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use skiff_control_plane::store::compactor::{Compactor, COMPACT_REV_KEY};
use skiff_control_plane::store::{
    Error, EtcdStore, Event, KeyValue, SqliteStore, Store, WatchStream, SQLITE_FILE,
};

use etcd_support::EtcdCluster;

/// Next event, failing the test after a few seconds of silence.
async fn next_event(w: &mut WatchStream) -> Event {
    match tokio::time::timeout(Duration::from_secs(10), w.next()).await {
        Ok(Some(Ok(ev))) => ev,
        Ok(Some(Err(e))) => panic!("watch failed: {e}"),
        Ok(None) => panic!("watch ended early"),
        Err(_) => panic!("no watch event within 10 s"),
    }
}

fn key_of(ev: &Event) -> &str {
    match ev {
        Event::Put { kv, .. } => &kv.key,
        Event::Delete { prev, .. } => &prev.key,
    }
}

/// The shared body. `p` is a key prefix owned by this run.
async fn conformance(store: Arc<dyn Store>, p: &str) {
    let r0 = store.current_revision().await.unwrap();
    store.health().await.unwrap();

    // create / get / duplicate create
    let a = format!("{p}/a");
    let kv1 = store.create(&a, b"one".to_vec()).await.unwrap();
    assert!(kv1.mod_revision > r0);
    assert_eq!(kv1.create_revision, kv1.mod_revision);
    assert_eq!(store.get(&a).await.unwrap(), Some(kv1.clone()));
    assert!(matches!(
        store.create(&a, b"again".to_vec()).await,
        Err(Error::AlreadyExists { key }) if key == a
    ));
    assert_eq!(store.get(&format!("{p}/missing")).await.unwrap(), None);

    // update with compare-and-swap
    let kv2 = store
        .update(&a, b"two".to_vec(), kv1.mod_revision)
        .await
        .unwrap();
    assert!(kv2.mod_revision > kv1.mod_revision);
    assert_eq!(kv2.create_revision, kv1.create_revision);
    match store.update(&a, b"stale".to_vec(), kv1.mod_revision).await {
        Err(Error::Conflict {
            expected, actual, ..
        }) => {
            assert_eq!((expected, actual), (kv1.mod_revision, kv2.mod_revision))
        }
        other => panic!("stale update: expected Conflict, got {other:?}"),
    }
    assert!(matches!(
        store
            .update(&format!("{p}/missing"), b"x".to_vec(), 1)
            .await,
        Err(Error::NotFound { .. })
    ));
    assert_eq!(store.get(&a).await.unwrap().unwrap().value, b"two");

    // delete: missing, stale, then for real
    assert!(matches!(
        store.delete(&format!("{p}/missing"), None).await,
        Err(Error::NotFound { .. })
    ));
    assert!(matches!(
        store.delete(&a, Some(kv1.mod_revision)).await,
        Err(Error::Conflict { actual, .. }) if actual == kv2.mod_revision
    ));
    let (gone, del_rev) = store.delete(&a, Some(kv2.mod_revision)).await.unwrap();
    assert_eq!(gone, kv2);
    assert!(del_rev > kv2.mod_revision);
    assert_eq!(store.get(&a).await.unwrap(), None);
    // re-create after delete starts a new life
    let kv3 = store.create(&a, b"three".to_vec()).await.unwrap();
    assert_eq!(kv3.create_revision, kv3.mod_revision);
    assert!(kv3.mod_revision > del_rev);

    // list pagination at a fixed revision, while the data changes
    let b = format!("{p}/b/");
    let mut originals = Vec::new();
    for i in 0..10 {
        originals.push(
            store
                .create(&format!("{b}{i:02}"), format!("v{i}").into_bytes())
                .await
                .unwrap(),
        );
    }
    let first = store.list(&b, None, 4, None).await.unwrap();
    assert_eq!(first.kvs, originals[..4].to_vec());
    assert!(first.more);
    let at = first.revision;
    assert_eq!(at, store.current_revision().await.unwrap());
    store
        .update(
            &originals[0].key,
            b"changed".to_vec(),
            originals[0].mod_revision,
        )
        .await
        .unwrap();
    store.delete(&originals[5].key, None).await.unwrap();
    store
        .create(&format!("{b}10"), b"new".to_vec())
        .await
        .unwrap();
    let mut seen: Vec<KeyValue> = first.kvs.clone();
    let mut more = first.more;
    while more {
        let last = seen.last().unwrap().key.clone();
        let page = store.list(&b, Some(&last), 4, Some(at)).await.unwrap();
        assert_eq!(page.revision, at);
        assert!(page.kvs.len() <= 4);
        seen.extend(page.kvs);
        more = page.more;
    }
    assert_eq!(
        seen, originals,
        "paginated list at revision {at} must show that revision"
    );
    let now = store.list(&b, None, 0, None).await.unwrap();
    assert!(!now.more);
    let keys: Vec<&str> = now.kvs.iter().map(|kv| kv.key.as_str()).collect();
    assert_eq!(keys.len(), 10);
    assert!(!keys.contains(&originals[5].key.as_str()));
    assert_eq!(now.kvs[0].value, b"changed");
    // the prefix does not leak into sibling keys
    store
        .create(&format!("{p}/b0"), b"sibling".to_vec())
        .await
        .unwrap();
    assert_eq!(store.list(&b, None, 0, None).await.unwrap().kvs.len(), 10);
    // a future revision is refused
    let cur = store.current_revision().await.unwrap();
    assert!(matches!(
        store.list(&b, None, 0, Some(cur + 1000)).await,
        Err(Error::FutureRevision { .. })
    ));

    // watch from an old revision: replay, then live, no gap, no duplicate
    let mut w = store.watch(&format!("{p}/"), r0).await.unwrap();
    let live_writer = {
        let store = store.clone();
        let p = p.to_string();
        tokio::spawn(async move {
            for i in 0..50 {
                let k = format!("{p}/live/{i:03}");
                let kv = store.create(&k, b"x".to_vec()).await.unwrap();
                if i % 3 == 0 {
                    store
                        .update(&k, b"y".to_vec(), kv.mod_revision)
                        .await
                        .unwrap();
                }
                if i % 5 == 0 {
                    store.delete(&k, None).await.unwrap();
                }
            }
        })
    };
    live_writer.await.unwrap();
    let end = store.current_revision().await.unwrap();
    let mut events = Vec::new();
    while events.last().map_or(r0, Event::revision) < end {
        events.push(next_event(&mut w).await);
    }
    let revs: Vec<i64> = events.iter().map(Event::revision).collect();
    let expected: Vec<i64> = (r0 + 1..=end).collect();
    assert_eq!(revs, expected, "every revision exactly once, in order");
    assert!(events
        .iter()
        .all(|e| key_of(e).starts_with(&format!("{p}/"))));
    // the first three events are a's create, update (with prev) and delete
    match &events[1] {
        Event::Put {
            kv,
            prev: Some(prev),
        } => {
            assert_eq!((kv, prev), (&kv2, &kv1));
        }
        other => panic!("expected the update of {a} with its previous value, got {other:?}"),
    }
    match &events[2] {
        Event::Delete { prev, revision } => assert_eq!((prev, *revision), (&kv2, del_rev)),
        other => panic!("expected the delete of {a}, got {other:?}"),
    }
    assert!(matches!(&events[0], Event::Put { prev: None, .. }));
    // and it stays live
    let kv = store
        .create(&format!("{p}/after"), b"z".to_vec())
        .await
        .unwrap();
    match next_event(&mut w).await {
        Event::Put {
            kv: got,
            prev: None,
        } => assert_eq!(got, kv),
        other => panic!("expected the live create, got {other:?}"),
    }
    drop(w);

    // compaction: old revisions are gone, current state stays
    let before = store.current_revision().await.unwrap();
    store.compact(before).await.unwrap();
    store.compact(before).await.unwrap(); // again: no-op
    assert!(matches!(
        store.watch(&format!("{p}/"), r0).await,
        Err(Error::Compacted { .. })
    ));
    assert!(matches!(
        store.list(&b, None, 0, Some(at)).await,
        Err(Error::Compacted { .. })
    ));
    assert_eq!(
        store.list(&b, None, 0, Some(before)).await.unwrap().kvs,
        now.kvs
    );
    assert_eq!(store.get(&a).await.unwrap(), Some(kv3.clone()));
    let mut w = store.watch(&format!("{p}/"), before).await.unwrap();
    let kv = store
        .update(&a, b"four".to_vec(), kv3.mod_revision)
        .await
        .unwrap();
    match next_event(&mut w).await {
        Event::Put {
            kv: got,
            prev: Some(prev),
        } => assert_eq!((got, prev), (kv, kv3)),
        other => panic!("expected the update after compaction, got {other:?}"),
    }
}

/// An update to the bytes already stored writes nothing: same revision,
/// no event; a changed value after it is the next event.
async fn noop_updates(store: Arc<dyn Store>, p: &str) {
    let k = format!("{p}/noop");
    let kv = store.create(&k, b"same".to_vec()).await.unwrap();
    let rev = store.current_revision().await.unwrap();
    let mut w = store.watch(&format!("{p}/"), rev).await.unwrap();
    let again = store.update(&k, b"same".to_vec(), kv.mod_revision).await;
    assert_eq!(
        again.unwrap(),
        kv,
        "a no-op update answers the stored value"
    );
    let with_ttl = store
        .update_with_ttl(
            &k,
            b"same".to_vec(),
            kv.mod_revision,
            Some(Duration::from_secs(1)),
        )
        .await
        .unwrap();
    assert_eq!(with_ttl, kv);
    assert_eq!(
        store.current_revision().await.unwrap(),
        rev,
        "no revision written"
    );
    // the compare-and-swap still holds for a no-op
    assert!(matches!(
        store
            .update(&k, b"same".to_vec(), kv.mod_revision - 1)
            .await,
        Err(Error::Conflict { .. })
    ));
    let changed = store
        .update(&k, b"changed".to_vec(), kv.mod_revision)
        .await
        .unwrap();
    assert!(changed.mod_revision > rev);
    match next_event(&mut w).await {
        Event::Put { kv: got, prev } => {
            assert_eq!(got, changed, "the first event is the real change");
            assert_eq!(prev.map(|p| p.value), Some(b"same".to_vec()));
        }
        other => panic!("expected the update, got {other:?}"),
    }
    // the key did not pick up the no-op's TTL
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(store.get(&k).await.unwrap().is_some());
}

/// Keys written with a TTL go with a normal delete once it passes; a
/// rewrite without a TTL ends the expiry, one with a TTL restarts it.
async fn ttl_expiry(store: Arc<dyn Store>, p: &str) {
    let ttl = Some(Duration::from_secs(2));
    let rev = store.current_revision().await.unwrap();
    let mut w = store.watch(&format!("{p}/ttl/"), rev).await.unwrap();
    let gone = store
        .create_with_ttl(&format!("{p}/ttl/gone"), b"e".to_vec(), ttl)
        .await
        .unwrap();
    let kept = store
        .create_with_ttl(&format!("{p}/ttl/kept"), b"e".to_vec(), ttl)
        .await
        .unwrap();
    let kept = store
        .update(&kept.key, b"no ttl now".to_vec(), kept.mod_revision)
        .await
        .unwrap();
    let plain = store
        .create(&format!("{p}/ttl/plain"), b"p".to_vec())
        .await
        .unwrap();
    let later = store
        .create(&format!("{p}/ttl/later"), b"l".to_vec())
        .await
        .unwrap();
    let later = store
        .update_with_ttl(&later.key, b"l2".to_vec(), later.mod_revision, ttl)
        .await
        .unwrap();
    let mut deleted = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while deleted.len() < 2 {
        let ev = tokio::time::timeout_at(deadline, w.next())
            .await
            .expect("expired keys deleted within 15 s")
            .expect("watch open")
            .expect("watch event");
        if let Event::Delete { prev, .. } = ev {
            deleted.push(prev);
        }
    }
    deleted.sort_by(|a, b| a.key.cmp(&b.key));
    assert_eq!(
        deleted,
        vec![gone.clone(), later],
        "watchers see DELETED with the last value"
    );
    assert_eq!(store.get(&gone.key).await.unwrap(), None);
    assert_eq!(store.get(&kept.key).await.unwrap(), Some(kept));
    assert_eq!(store.get(&plain.key).await.unwrap(), Some(plain));
}

/// Two compactors on one store (two servers on one etcd) take turns
/// through the compact key: each successful turn compacts to the revision
/// of the turn before, a turn that finds the other's write only takes
/// note, and when one stops the other carries on.
async fn compactors_take_turns(store: Arc<dyn Store>, p: &str) {
    let write = |i: usize| {
        let store = store.clone();
        let k = format!("{p}/turns/{i}");
        async move { store.create(&k, b"t".to_vec()).await.unwrap() }
    };
    let (mut a, mut b) = (Compactor::default(), Compactor::default());
    assert_eq!(
        a.turn(store.as_ref()).await.unwrap(),
        None,
        "no compaction on the first turn"
    );
    let first = store
        .get(COMPACT_REV_KEY)
        .await
        .unwrap()
        .expect("compact key written");
    assert_eq!(
        b.turn(store.as_ref()).await.unwrap(),
        None,
        "b finds a's key"
    );
    let old = write(0).await;
    let r1 = store.current_revision().await.unwrap();
    let compacted = a.turn(store.as_ref()).await.unwrap();
    assert_eq!(
        compacted,
        Some(first.mod_revision),
        "a compacts to its previous turn"
    );
    assert!(matches!(
        store
            .list(
                &format!("{p}/turns/"),
                None,
                0,
                Some(first.mod_revision - 1)
            )
            .await,
        Err(Error::Compacted { .. })
    ));
    assert_eq!(
        store
            .list(&format!("{p}/turns/"), None, 0, Some(old.mod_revision))
            .await
            .unwrap()
            .kvs,
        vec![old]
    );
    assert_eq!(
        b.turn(store.as_ref()).await.unwrap(),
        None,
        "b lost the turn to a"
    );
    write(1).await;
    let second = a
        .turn(store.as_ref())
        .await
        .unwrap()
        .expect("a compacts again");
    assert!(second > r1);
    // a stops; b's first turn finds a's last write, its next one compacts.
    assert_eq!(b.turn(store.as_ref()).await.unwrap(), None);
    write(2).await;
    let noted = store.current_revision().await.unwrap();
    let taken = b.turn(store.as_ref()).await.unwrap().expect("b takes over");
    assert!(
        taken > second && taken <= noted,
        "{taken} in ({second}, {noted}]"
    );
    assert!(matches!(
        store
            .list(&format!("{p}/turns/"), None, 0, Some(taken - 1))
            .await,
        Err(Error::Compacted { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_conformance_and_durability() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(SQLITE_FILE);
    let store = SqliteStore::open(&path).await.unwrap();
    conformance(Arc::new(store.clone()), "/registry/conformance").await;
    noop_updates(Arc::new(store.clone()), "/registry/noop").await;
    ttl_expiry(Arc::new(store.clone()), "/registry/ttl").await;
    compactors_take_turns(Arc::new(store.clone()), "/registry/compactors").await;

    // durability across reopen: values, revisions, history and counter
    let rev = store.current_revision().await.unwrap();
    let listed = store.list("/registry/", None, 0, None).await.unwrap();
    let kv = store
        .create("/registry/last", b"durable".to_vec())
        .await
        .unwrap();
    drop(store);
    let store = SqliteStore::open(&path).await.unwrap();
    assert_eq!(store.current_revision().await.unwrap(), kv.mod_revision);
    assert_eq!(store.get("/registry/last").await.unwrap(), Some(kv.clone()));
    assert_eq!(
        store
            .list("/registry/", None, 0, Some(rev))
            .await
            .unwrap()
            .kvs,
        listed.kvs
    );
    let next = store.create("/registry/next", b"n".to_vec()).await.unwrap();
    assert!(next.mod_revision > kv.mod_revision);
    // a watch from before the reopen replays from the log
    let mut w = store.watch("/registry/", rev).await.unwrap();
    assert_eq!(next_event(&mut w).await.revision(), kv.mod_revision);
    assert_eq!(next_event(&mut w).await.revision(), next.mod_revision);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcd_conformance() {
    let etcd = EtcdCluster::start();
    let store = EtcdStore::connect(&etcd.endpoints()).await.unwrap();
    conformance(Arc::new(store.clone()), "/registry/conformance").await;
    noop_updates(Arc::new(store.clone()), "/registry/noop").await;
    ttl_expiry(Arc::new(store.clone()), "/registry/ttl").await;
    compactors_take_turns(Arc::new(store), "/registry/compactors").await;
}

/// A watcher that does not read while thousands of commits go by is not
/// allowed to grow memory: it falls off the in-process hub and re-reads the
/// log, still without a lost or duplicated event.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_slow_watcher_catches_up_from_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join(SQLITE_FILE))
        .await
        .unwrap();
    let start = store.current_revision().await.unwrap();
    let mut w = store.watch("/registry/slow/", start).await.unwrap();
    // more single-write commits than the hub keeps, plus noise on another prefix
    let mut expected = Vec::new();
    for i in 0..1300 {
        let kv = store
            .create(&format!("/registry/slow/{i:05}"), b"v".to_vec())
            .await
            .unwrap();
        expected.push(kv.mod_revision);
        if i % 100 == 0 {
            store
                .create(&format!("/registry/other/{i}"), b"o".to_vec())
                .await
                .unwrap();
        }
    }
    let mut got = Vec::new();
    while got.len() < expected.len() {
        got.push(next_event(&mut w).await.revision());
    }
    assert_eq!(got, expected);

    // and a watcher left behind compaction ends with Compacted
    let mut w = store
        .watch("/registry/slow/", store.current_revision().await.unwrap())
        .await
        .unwrap();
    for i in 0..1100 {
        store
            .create(&format!("/registry/lag/{i:05}"), b"v".to_vec())
            .await
            .unwrap();
    }
    store
        .compact(store.current_revision().await.unwrap())
        .await
        .unwrap();
    // the first read finds the hub overrun, re-reads the log, finds it compacted
    match tokio::time::timeout(Duration::from_secs(10), w.next())
        .await
        .unwrap()
    {
        Some(Err(Error::Compacted { .. })) => {}
        other => panic!("expected Compacted for a watcher behind compaction, got {other:?}"),
    }
    assert!(w.next().await.is_none(), "the stream ends after Compacted");
}
