//! What the store's upkeep looks like through the real API, on SQLite and
//! on a real etcd: a no-op update keeps its resourceVersion and sends no
//! watch event, history is compacted on a schedule (old resourceVersions
//! get 410), and events expire after `--event-ttl`.

use crate::api;
use crate::etcd_support;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Event as CoreEvent};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

use api::{eventually, ok, TestServer};
use etcd_support::EtcdCluster;
use skiff_control_plane::config::Settings;
use skiff_control_plane::store::{EtcdStore, Store};

async fn etcd_server(settings: Settings) -> (EtcdCluster, TestServer) {
    let etcd = EtcdCluster::start();
    let store: Arc<dyn Store> = Arc::new(
        EtcdStore::connect(&etcd.endpoints())
            .await
            .expect("connect etcd"),
    );
    let s = TestServer::start_with_settings(Some(store), settings).await;
    (etcd, s)
}

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(
        json!({"metadata": {"name": name, "labels": {"l": "v"}}, "data": {"a": "1"}}),
    )
    .unwrap()
}

fn rv(o: &ConfigMap) -> String {
    o.metadata
        .resource_version
        .clone()
        .expect("resourceVersion")
}

/// PUT of the object as read, a merge patch that changes nothing and
/// `kubectl replace` of the manifest it was made from: same
/// resourceVersion each time, and a watcher's first event is the real
/// change that follows.
async fn noop_updates_keep_the_resource_version(s: &TestServer) {
    let manifest = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: same, namespace: default, labels: {l: v}}\ndata: {a: '1'}\n";
    ok(s.kubectl_stdin(&["create", "-f", "-"], manifest));
    let cms: Api<ConfigMap> = Api::namespaced(s.client().await, "default");
    let created = cms.get("same").await.unwrap();
    let wp = WatchParams::default().fields("metadata.name=same");
    let mut stream = cms.watch(&wp, &rv(&created)).await.unwrap().boxed();

    let put = cms
        .replace("same", &PostParams::default(), &created)
        .await
        .unwrap();
    assert_eq!(rv(&put), rv(&created), "PUT of the same object");
    let patched = cms
        .patch(
            "same",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"a": "1"}, "metadata": {"labels": {"l": "v"}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        rv(&patched),
        rv(&created),
        "merge patch that changes nothing"
    );
    ok(s.kubectl_stdin(&["replace", "-f", "-"], manifest));
    assert_eq!(
        rv(&cms.get("same").await.unwrap()),
        rv(&created),
        "kubectl replace"
    );

    let changed = cms
        .patch(
            "same",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"a": "2"}})),
        )
        .await
        .unwrap();
    assert_ne!(rv(&changed), rv(&created));
    let ev = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("a watch event within 10 s")
        .expect("stream open")
        .expect("event");
    match ev {
        WatchEvent::Modified(o) => {
            assert_eq!(rv(&o), rv(&changed), "the first event is the real change");
        }
        other => panic!("expected MODIFIED for the change, got {other:?}"),
    }
}

/// The SQLite store's compaction point, read beside the running server.
fn sqlite_compact_rev(s: &TestServer) -> i64 {
    let conn = rusqlite::Connection::open_with_flags(
        s.cfg.data_dir.join(skiff_control_plane::store::SQLITE_FILE),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    conn.query_row(
        "SELECT value FROM meta WHERE key = 'compact_rev'",
        [],
        |r| r.get(0),
    )
    .unwrap()
}

/// With a 1 s compaction interval, history older than about two intervals
/// goes: a watch from a resourceVersion before it gets 410, the current
/// objects stay.
async fn compaction_runs_on_schedule(s: &TestServer) {
    let cms: Api<ConfigMap> = Api::namespaced(s.client().await, "default");
    let mut o = cms
        .create(&PostParams::default(), &cm("hist"))
        .await
        .unwrap();
    let old = rv(&o);
    for i in 0..5 {
        o = cms
            .patch(
                "hist",
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"a": i.to_string()}})),
            )
            .await
            .unwrap();
    }
    let current = rv(&o);
    // A watch from before the updates replays them until the compactor's
    // second turn removes that history; then it gets 410.
    let gone = eventually(Duration::from_secs(20), || {
        let cms = cms.clone();
        let old = old.clone();
        async move {
            let Ok(stream) = cms.watch(&WatchParams::default(), &old).await else {
                return false;
            };
            let first = tokio::time::timeout(Duration::from_secs(5), stream.boxed().next()).await;
            match first {
                Ok(Some(Ok(WatchEvent::Error(e)))) => {
                    assert_eq!((e.code, e.reason.as_str()), (410, "Expired"));
                    true
                }
                _ => false,
            }
        }
    })
    .await;
    assert!(
        gone,
        "a watch from resourceVersion {old} still replays after 20 s"
    );
    let now = cms.get("hist").await.unwrap();
    assert_eq!(rv(&now), current);
    assert_eq!(now.data.unwrap()["a"], "4");
}

/// With `--event-ttl 2s` events (core and events.k8s.io alike) are
/// deleted a little after that: watchers see DELETED; other kinds stay.
async fn events_expire(s: &TestServer) {
    let events: Api<CoreEvent> = Api::namespaced(s.client().await, "default");
    let start = events.list(&ListParams::default()).await.unwrap();
    let start_rv = start.metadata.resource_version.unwrap();
    let mut stream = events
        .watch(&WatchParams::default(), &start_rv)
        .await
        .unwrap()
        .boxed();
    ok(s.kubectl_stdin(&["create", "-f", "-"], "apiVersion: v1\nkind: Event\nmetadata: {name: short}\ninvolvedObject: {kind: Pod, name: p, namespace: default}\nreason: R\nmessage: m\ntype: Normal\n"));
    ok(s.kubectl_stdin(&["create", "-f", "-"], "apiVersion: events.k8s.io/v1\nkind: Event\nmetadata: {name: recorded}\neventTime: 2026-01-01T00:00:00.000000Z\nreportingController: skiff/test\nreportingInstance: t1\naction: Sync\nreason: Recorded\nnote: from-test\nregarding: {kind: Pod, name: p, namespace: default}\ntype: Normal\n"));
    let cms: Api<ConfigMap> = Api::namespaced(s.client().await, "default");
    cms.create(&PostParams::default(), &cm("stays"))
        .await
        .unwrap();
    let mut deleted = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while deleted.len() < 2 {
        let ev = tokio::time::timeout_at(deadline, stream.next())
            .await
            .expect("both events deleted within 20 s")
            .expect("stream open")
            .expect("event");
        match ev {
            WatchEvent::Deleted(e) => deleted.push(e.metadata.name.unwrap()),
            WatchEvent::Error(e) => panic!("watch error: {e:?}"),
            _ => {}
        }
    }
    deleted.sort();
    assert_eq!(deleted, ["recorded", "short"]);
    assert!(events.get_opt("short").await.unwrap().is_none());
    assert!(cms.get_opt("stays").await.unwrap().is_some());
}

fn compacting() -> Settings {
    Settings {
        etcd_compaction_interval: Some("1s".into()),
        ..Default::default()
    }
}

fn short_event_ttl() -> Settings {
    Settings {
        event_ttl: Some("2s".into()),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_noop_update_keeps_resource_version() {
    let s = TestServer::start().await;
    noop_updates_keep_the_resource_version(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcd_noop_update_keeps_resource_version() {
    let (_etcd, s) = etcd_server(Settings::default()).await;
    noop_updates_keep_the_resource_version(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_compaction_runs_on_schedule_and_survives_restart() {
    let mut s = TestServer::start_with_settings(None, compacting()).await;
    assert_eq!(sqlite_compact_rev(&s), 0);
    compaction_runs_on_schedule(&s).await;
    let before = sqlite_compact_rev(&s);
    assert!(before > 0, "compact_rev advanced");
    // After a restart compaction goes on (upstream: the first turn only
    // takes note, the second compacts).
    s.restart().await;
    let cms: Api<ConfigMap> = Api::namespaced(s.client().await, "default");
    cms.create(&PostParams::default(), &cm("after-restart"))
        .await
        .unwrap();
    let advanced = eventually(Duration::from_secs(20), || async {
        sqlite_compact_rev(&s) > before
    })
    .await;
    assert!(advanced, "compact_rev still {before} 20 s after a restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcd_compaction_runs_on_schedule() {
    let (_etcd, s) = etcd_server(compacting()).await;
    compaction_runs_on_schedule(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_events_expire() {
    let s = TestServer::start_with_settings(None, short_event_ttl()).await;
    events_expire(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcd_events_expire() {
    let (_etcd, s) = etcd_server(short_event_ttl()).await;
    events_expire(&s).await;
}
