//! Watches: resume from a resourceVersion across a server restart without a
//! lost event, 410 Gone after compaction, bookmarks, selectors.

use crate::api;

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use serde_json::json;

use api::TestServer;

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": {"w": "y"}}})).unwrap()
}

/// Read events until `want` names were seen (ADDED), or fail after 10 s.
async fn collect_added(
    stream: &mut (impl futures::Stream<Item = kube::Result<WatchEvent<ConfigMap>>> + Unpin),
    want: usize,
    last_rv: &mut String,
) -> Vec<String> {
    let mut names = Vec::new();
    while names.len() < want {
        let ev = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("watch event within 10 s")
            .expect("stream open")
            .expect("event");
        match ev {
            WatchEvent::Added(o) => {
                *last_rv = o.metadata.resource_version.clone().unwrap();
                names.push(o.metadata.name.unwrap());
            }
            WatchEvent::Modified(o) | WatchEvent::Deleted(o) => {
                *last_rv = o.metadata.resource_version.unwrap()
            }
            WatchEvent::Bookmark(b) => *last_rv = b.metadata.resource_version,
            WatchEvent::Error(e) => panic!("watch error: {e:?}"),
        }
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn watch_resumes_across_restart_without_loss() {
    let mut s = TestServer::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(s.client().await, "default");
    let first = cms.create(&PostParams::default(), &cm("w0")).await.unwrap();
    let mut last_rv = first.metadata.resource_version.unwrap();
    let wp = WatchParams::default().labels("w=y");
    let mut stream = cms.watch(&wp, &last_rv).await.unwrap().boxed();
    for i in 1..=3 {
        cms.create(&PostParams::default(), &cm(&format!("w{i}")))
            .await
            .unwrap();
    }
    let seen = collect_added(&mut stream, 3, &mut last_rv).await;
    assert_eq!(seen, ["w1", "w2", "w3"]);
    // Writes the watcher has not read yet, then a restart.
    for i in 4..=5 {
        cms.create(&PostParams::default(), &cm(&format!("w{i}")))
            .await
            .unwrap();
    }
    drop(stream);
    s.restart().await;
    let cms: Api<ConfigMap> = Api::namespaced(s.client().await, "default");
    for i in 6..=7 {
        cms.create(&PostParams::default(), &cm(&format!("w{i}")))
            .await
            .unwrap();
    }
    let mut stream = cms.watch(&wp, &last_rv).await.unwrap().boxed();
    let seen = collect_added(&mut stream, 4, &mut last_rv).await;
    assert_eq!(
        seen,
        ["w4", "w5", "w6", "w7"],
        "every event after the resume point, once, in order"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compacted_resource_version_is_410_gone() {
    let s = TestServer::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(s.client().await, "default");
    let a = cms.create(&PostParams::default(), &cm("c1")).await.unwrap();
    let old_rv = a.metadata.resource_version.unwrap();
    let b = cms.create(&PostParams::default(), &cm("c2")).await.unwrap();
    let rev: i64 = b.metadata.resource_version.unwrap().parse().unwrap();
    s.handle().api.store().compact(rev).await.unwrap();
    let mut stream = cms
        .watch(&WatchParams::default(), &old_rv)
        .await
        .unwrap()
        .boxed();
    match tokio::time::timeout(Duration::from_secs(10), stream.try_next())
        .await
        .unwrap()
        .unwrap()
    {
        Some(WatchEvent::Error(e)) => {
            assert_eq!(e.code, 410);
            assert_eq!(e.reason, "Expired");
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn watch_from_zero_lists_then_follows_with_selectors() {
    let s = TestServer::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(s.client().await, "default");
    cms.create(&PostParams::default(), &cm("z1")).await.unwrap();
    let mut stream = cms
        .watch(&WatchParams::default().labels("w=y"), "0")
        .await
        .unwrap()
        .boxed();
    let mut rv = String::new();
    assert_eq!(collect_added(&mut stream, 1, &mut rv).await, ["z1"]);
    // Dropping the label makes it leave the selection: DELETED for us.
    cms.patch(
        "z1",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"metadata": {"labels": {"w": null}}})),
    )
    .await
    .unwrap();
    let ev = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        matches!(ev, WatchEvent::Deleted(ref o) if o.metadata.name.as_deref() == Some("z1")),
        "{ev:?}"
    );
    // kube-runtime's watcher (list + watch with bookmarks) sees new objects.
    let w = kube::runtime::watcher(
        cms.clone(),
        kube::runtime::watcher::Config::default().labels("w=y"),
    );
    let mut objs = Box::pin(kube::runtime::WatchStreamExt::applied_objects(w));
    cms.create(&PostParams::default(), &cm("z2")).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), objs.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(got.metadata.name.as_deref(), Some("z2"));
    // kubectl get -w prints the table rows as changes arrive.
    let out = s.kubectl(&["get", "cm", "z2", "-w", "--request-timeout=2s"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("z2"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metadata_lists_and_watches() {
    let s = TestServer::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(s.client().await, "default");
    cms.create(&PostParams::default(), &cm("m1")).await.unwrap();
    let list = cms
        .list_metadata(&kube::api::ListParams::default())
        .await
        .unwrap();
    assert!(list
        .items
        .iter()
        .any(|m| m.metadata.name.as_deref() == Some("m1")));
    let meta: Api<kube::core::PartialObjectMeta<ConfigMap>> =
        Api::namespaced(s.client().await, "default");
    let w = kube::runtime::watcher(
        meta,
        kube::runtime::watcher::Config::default().labels("w=y"),
    );
    let mut objs = Box::pin(kube::runtime::WatchStreamExt::applied_objects(w));
    let got = tokio::time::timeout(Duration::from_secs(10), objs.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(got.metadata.name.as_deref(), Some("m1"));
}

/// Store watches the server has opened, from its own metrics.
fn store_watches(s: &TestServer) -> u64 {
    let text = s.handle().api.metrics().render();
    text.lines()
        .find_map(|l| {
            l.strip_prefix(
                "skiff_store_operation_duration_seconds_count{backend=\"sqlite\",operation=\"watch\"} ",
            )
        })
        .map_or(0, |n| n.parse().expect("a count"))
}

/// With the watch cache (the default) twenty watches of ConfigMaps open
/// at most one store watch between them (none when the server's own
/// controllers already watch ConfigMaps); without it, one each.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn watches_of_one_type_share_one_store_watch() {
    for cache in [true, false] {
        let s = TestServer::start_with_settings(
            None,
            skiff_control_plane::config::Settings {
                watch_cache: Some(cache),
                ..Default::default()
            },
        )
        .await;
        let api: Api<ConfigMap> = Api::namespaced(s.client().await, "default");
        let before = store_watches(&s);
        let mut streams = Vec::new();
        for _ in 0..20 {
            let wp = WatchParams::default().labels("w=y");
            streams.push(api.watch(&wp, "0").await.unwrap().boxed());
        }
        api.create(&PostParams::default(), &cm("shared"))
            .await
            .unwrap();
        for st in &mut streams {
            let mut rv = String::new();
            assert_eq!(collect_added(st, 1, &mut rv).await, ["shared"]);
        }
        let opened = store_watches(&s) - before;
        if cache {
            assert!(opened <= 1, "{opened} store watches for 20 client watches");
        } else {
            assert!(opened >= 20, "{opened} store watches for 20 client watches");
        }
    }
}
