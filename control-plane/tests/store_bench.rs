//! Raw store write figures (printed, never asserted): 10,000 creates at
//! concurrency 32 into SQLite, and a shorter run into a real etcd.

use crate::etcd_support;

use std::sync::Arc;
use std::time::Duration;

use skiff_control_plane::store::bench::{bench_raw_writes, percentile};
use skiff_control_plane::store::{EtcdStore, SqliteStore, Store, SQLITE_FILE};

use etcd_support::EtcdCluster;

fn report(name: &str, n: usize, latencies: &[Duration], total: Duration) {
    println!(
        "{name}: {} of {n} creates ok, {:.0}/s, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        latencies.len(),
        latencies.len() as f64 / total.as_secs_f64(),
        percentile(latencies, 0.5).as_secs_f64() * 1e3,
        percentile(latencies, 0.99).as_secs_f64() * 1e3,
        percentile(latencies, 1.0).as_secs_f64() * 1e3,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_raw_writes() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(
        SqliteStore::open(dir.path().join(SQLITE_FILE))
            .await
            .unwrap(),
    );
    let (lat, total) = bench_raw_writes(store.clone(), 10_000, 32).await;
    report("sqlite", 10_000, &lat, total);
    assert_eq!(lat.len(), 10_000);
    let t = std::time::Instant::now();
    let listed = store
        .list("/registry/skiff-bench/", None, 0, None)
        .await
        .unwrap();
    let list_time = t.elapsed();
    assert_eq!(listed.kvs.len(), 10_000);
    let t = std::time::Instant::now();
    let page = store
        .list("/registry/skiff-bench/", None, 500, None)
        .await
        .unwrap();
    let page_time = t.elapsed();
    assert_eq!(page.kvs.len(), 500);
    let key = &listed.kvs[5_000].key;
    let t = std::time::Instant::now();
    for _ in 0..1000 {
        store.get(key).await.unwrap().unwrap();
    }
    println!(
        "sqlite: list of 10,000 keys {:.1} ms, first page of 500 {:.1} ms, get {:.0} us",
        list_time.as_secs_f64() * 1e3,
        page_time.as_secs_f64() * 1e3,
        t.elapsed().as_secs_f64() * 1e6 / 1000.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcd_raw_writes() {
    let etcd = EtcdCluster::start();
    let store: Arc<dyn Store> = Arc::new(EtcdStore::connect(&etcd.endpoints()).await.unwrap());
    let (lat, total) = bench_raw_writes(store, 2_000, 32).await;
    report("etcd", 2_000, &lat, total);
    assert_eq!(lat.len(), 2_000);
}
