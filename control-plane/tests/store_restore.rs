//! Restore drills: write, snapshot, lose the data directory, restore; every
//! key comes back at its mod_revision and new writes get higher revisions.

use crate::etcd_support;

use std::collections::BTreeMap;
use std::sync::Arc;

use skiff_control_plane::store::{
    snapshot::{snapshot_format, snapshot_restore_etcd, SnapshotFormat},
    snapshot_restore, snapshot_status, EtcdStore, KeyValue, SqliteStore, Store, SQLITE_FILE,
};

use etcd_support::EtcdCluster;

/// Creates, updates and deletes under `/registry/drill/`; returns the live keys.
async fn write_objects(store: &Arc<dyn Store>) -> BTreeMap<String, KeyValue> {
    let mut live = BTreeMap::new();
    for i in 0..60 {
        let key = format!("/registry/drill/obj-{i:03}");
        let kv = store
            .create(&key, format!("v1-{i}").into_bytes())
            .await
            .unwrap();
        live.insert(key, kv);
    }
    for i in (0..60).step_by(3) {
        let key = format!("/registry/drill/obj-{i:03}");
        let old = live[&key].mod_revision;
        let kv = store
            .update(&key, format!("v2-{i}").into_bytes(), old)
            .await
            .unwrap();
        live.insert(key, kv);
    }
    for i in (0..60).step_by(7) {
        let key = format!("/registry/drill/obj-{i:03}");
        store.delete(&key, None).await.unwrap();
        live.remove(&key);
    }
    live
}

async fn check_restored(store: &Arc<dyn Store>, live: &BTreeMap<String, KeyValue>, snap_rev: i64) {
    let listed = store.list("/registry/drill/", None, 0, None).await.unwrap();
    let got: BTreeMap<String, KeyValue> = listed
        .kvs
        .into_iter()
        .map(|kv| (kv.key.clone(), kv))
        .collect();
    assert_eq!(&got, live, "every object back at its mod_revision");
    for (key, kv) in live {
        assert_eq!(store.get(key).await.unwrap().as_ref(), Some(kv));
    }
    let new = store
        .create("/registry/drill/after-restore", b"new".to_vec())
        .await
        .unwrap();
    assert!(
        new.mod_revision > snap_rev,
        "{} must be > {snap_rev}",
        new.mod_revision
    );
    // an object from before the snapshot can still be updated with its revision
    let (key, kv) = live.iter().next().unwrap();
    store
        .update(key, b"updated".to_vec(), kv.mod_revision)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_restore_drill() {
    let root = tempfile::tempdir().unwrap();
    let data_dir = root.path().join("data");
    let snap = root.path().join("backup.snap");
    let store: Arc<dyn Store> =
        Arc::new(SqliteStore::open(data_dir.join(SQLITE_FILE)).await.unwrap());
    let live = write_objects(&store).await;
    let rev = store.current_revision().await.unwrap();

    let info = store.snapshot_save(&snap).await.unwrap();
    assert_eq!(info.revision, rev);
    assert_eq!(info.keys, live.len() as u64);
    assert_eq!(info.size, std::fs::metadata(&snap).unwrap().len());
    assert_eq!(info.hash.len(), 64);
    assert_eq!(snapshot_status(&snap).await.unwrap(), info);
    assert_eq!(snapshot_format(&snap).unwrap(), SnapshotFormat::Sqlite);
    // writes after the snapshot are lost with the directory
    store
        .create("/registry/drill/too-late", b"x".to_vec())
        .await
        .unwrap();
    drop(store);

    std::fs::remove_dir_all(&data_dir).unwrap();
    snapshot_restore(&snap, &data_dir).unwrap();
    // restore never overwrites a live database
    assert!(snapshot_restore(&snap, &data_dir).is_err());

    let store: Arc<dyn Store> =
        Arc::new(SqliteStore::open(data_dir.join(SQLITE_FILE)).await.unwrap());
    assert_eq!(store.current_revision().await.unwrap(), rev);
    assert_eq!(store.get("/registry/drill/too-late").await.unwrap(), None);
    check_restored(&store, &live, rev).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcd_restore_drill() {
    let root = tempfile::tempdir().unwrap();
    let snap = root.path().join("etcd.snap");
    let mut etcd = EtcdCluster::start();
    let store: Arc<dyn Store> = Arc::new(EtcdStore::connect(&etcd.endpoints()).await.unwrap());
    let live = write_objects(&store).await;
    let rev = store.current_revision().await.unwrap();

    let info = store.snapshot_save(&snap).await.unwrap();
    assert_eq!(info.revision, rev);
    assert!(info.keys >= live.len() as u64);
    assert_eq!(info.size, std::fs::metadata(&snap).unwrap().len());
    assert_eq!(snapshot_format(&snap).unwrap(), SnapshotFormat::Etcd);
    assert_eq!(snapshot_status(&snap).await.unwrap(), info);
    drop(store);

    // lose the member and its data
    etcd.kill_all();
    for m in &etcd.members {
        std::fs::remove_dir_all(&m.data_dir).unwrap();
    }
    let restored = root.path().join("restored.etcd");
    let peer = EtcdCluster::free_peer_url();
    snapshot_restore_etcd(&snap, &restored, "restored", &peer).unwrap();
    let etcd = EtcdCluster::start_existing(&restored, "restored", &peer);
    let store: Arc<dyn Store> = Arc::new(EtcdStore::connect(&etcd.endpoints()).await.unwrap());
    check_restored(&store, &live, rev).await;
}
