//! The SQLite store's files stay bounded: a node Lease written 20,000
//! times back to back (a node writes it every 10 s; this is two days of
//! one node) with the compactor running leaves a WAL of a few MiB and a
//! database of the live data plus recent history, and a database from
//! before incremental vacuum switches to it once, keeping its data.
//! Figures are printed; the bounds asserted are several times what was
//! measured, and far below what the store left before (168 MB WAL, 12 MB
//! database, compact_rev 0).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use skiff_control_plane::store::{compactor, SqliteStore, Store, SQLITE_FILE};

const MIB: u64 = 1024 * 1024;

fn size(p: &Path) -> u64 {
    std::fs::metadata(p).map_or(0, |m| m.len())
}

fn wal_of(db: &Path) -> std::path::PathBuf {
    db.with_file_name(format!("{SQLITE_FILE}-wal"))
}

/// A node Lease as the API server stores it (about 450 bytes).
fn lease(i: usize) -> Vec<u8> {
    format!(
        concat!(
            r#"{{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{{"name":"node-1","#,
            r#""namespace":"kube-node-lease","uid":"6b1f7c62-3c1e-4a43-9d6e-0d3c1a1e7f00","#,
            r#""creationTimestamp":"2026-01-01T00:00:00Z","ownerReferences":[{{"apiVersion":"v1","#,
            r#""kind":"Node","name":"node-1","uid":"0c6f3a7e-8a55-4c2e-b3a4-2f4f5e6d7c8b"}}]}},"#,
            r#""spec":{{"holderIdentity":"node-1","leaseDurationSeconds":40,"#,
            r#""renewTime":"2026-01-01T00:00:00.{:06}Z"}}}}"#
        ),
        i
    )
    .into_bytes()
}

fn sql(db: &Path) -> rusqlite::Connection {
    rusqlite::Connection::open(db).expect("open the database beside the store")
}

fn compact_rev(db: &Path) -> i64 {
    sql(db)
        .query_row(
            "SELECT value FROM meta WHERE key = 'compact_rev'",
            [],
            |r| r.get(0),
        )
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_wal_and_database_stay_bounded_under_20000_updates() {
    let n = 20_000;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join(SQLITE_FILE);
    let wal = wal_of(&db);
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&db).await.unwrap());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let compactor = tokio::spawn(compactor::run(
        store.clone(),
        Duration::from_millis(200),
        stopped,
    ));
    let key = "/registry/coordination.k8s.io/leases/kube-node-lease/node-1";
    let mut kv = store.create(key, lease(0)).await.unwrap();
    let (mut max_wal, mut max_db) = (0, 0);
    let mut latencies = Vec::with_capacity(n);
    let start = Instant::now();
    for i in 1..=n {
        let t = Instant::now();
        kv = store.update(key, lease(i), kv.mod_revision).await.unwrap();
        latencies.push(t.elapsed());
        if i % 50 == 0 {
            max_wal = max_wal.max(size(&wal));
            max_db = max_db.max(size(&db));
        }
    }
    let took = start.elapsed();
    latencies.sort();
    println!(
        "{n} updates of one key in {:.1} s ({:.0}/s; p50 {:.2} ms, p99 {:.2} ms, max {:.1} ms): \
         WAL max {:.2} MiB, now {:.2} MiB; database max {:.2} MiB, now {:.2} MiB",
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64(),
        latencies[n / 2].as_secs_f64() * 1e3,
        latencies[n * 99 / 100].as_secs_f64() * 1e3,
        latencies[n - 1].as_secs_f64() * 1e3,
        max_wal as f64 / MIB as f64,
        size(&wal) as f64 / MIB as f64,
        max_db as f64 / MIB as f64,
        size(&db) as f64 / MIB as f64,
    );
    assert!(max_wal <= 8 * MIB, "the WAL grew to {max_wal} bytes");
    assert!(max_db <= 2 * MIB, "the database grew to {max_db} bytes");
    let _ = stop.send(true);
    compactor.await.unwrap();

    // A restart keeps the compaction point and the latest value; the
    // history left is what the last intervals wrote.
    drop(store);
    let store = SqliteStore::open(&db).await.unwrap();
    assert_eq!(store.get(key).await.unwrap(), Some(kv));
    let compacted = compact_rev(&db);
    let rows: i64 = sql(&db)
        .query_row("SELECT COUNT(*) FROM kv", [], |r| r.get(0))
        .unwrap();
    println!("after a restart: compact_rev {compacted}, {rows} rows of history");
    assert!(compacted > 0, "compact_rev still 0 after a restart");
    assert!(rows < (n / 4) as i64, "{rows} rows left of {n} updates");
}

/// A database made before incremental vacuum (auto_vacuum NONE) gets one
/// VACUUM on open; afterwards compaction gives the freed space back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_database_without_auto_vacuum_switches_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join(SQLITE_FILE);
    let store = SqliteStore::open(&db).await.unwrap();
    let mut last = None;
    for i in 0..2000 {
        let kv = store
            .create(&format!("/registry/legacy/k{i:05}"), lease(i))
            .await
            .unwrap();
        last = Some(kv);
    }
    let rev = store.current_revision().await.unwrap();
    drop(store);
    // Wait for the writer to close, then turn the file into the old format.
    tokio::time::sleep(Duration::from_millis(300)).await;
    {
        let c = sql(&db);
        c.execute_batch("PRAGMA auto_vacuum=NONE; VACUUM;").unwrap();
        let mode: i64 = c.query_row("PRAGMA auto_vacuum", [], |r| r.get(0)).unwrap();
        assert_eq!(mode, 0, "the test database is in the old format");
    }
    let store = SqliteStore::open(&db).await.unwrap();
    let mode: i64 = sql(&db)
        .query_row("PRAGMA auto_vacuum", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, 2, "switched to incremental auto-vacuum");
    assert_eq!(store.current_revision().await.unwrap(), rev);
    let listed = store
        .list("/registry/legacy/", None, 0, None)
        .await
        .unwrap();
    assert_eq!(listed.kvs.len(), 2000);
    assert_eq!(listed.kvs.last(), last.as_ref());

    // Deleting most keys and compacting past the deletes shrinks the file.
    let full = size(&db);
    for kv in &listed.kvs[100..] {
        store.delete(&kv.key, None).await.unwrap();
    }
    store
        .compact(store.current_revision().await.unwrap())
        .await
        .unwrap();
    // The pages are handed back once the WAL is checkpointed into the file.
    let shrunk = tokio::time::timeout(Duration::from_secs(10), async {
        while size(&db) * 2 > full {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        shrunk.is_ok(),
        "database still {} bytes of {full} after deleting 95 % of it",
        size(&db)
    );
    let free: i64 = sql(&db)
        .query_row("PRAGMA freelist_count", [], |r| r.get(0))
        .unwrap();
    assert_eq!(free, 0, "no free pages left after compaction");
}

/// Each compaction removes what the ones before it kept and later writes
/// superseded: after any number of them a key has one row at or below the
/// compaction point (before, each compaction left one row per written key
/// behind for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_repeated_compactions_keep_one_row_per_key() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join(SQLITE_FILE);
    let store = SqliteStore::open(&db).await.unwrap();
    let hot = "/registry/coordination.k8s.io/leases/kube-node-lease/node-1";
    let gone = "/registry/core/configmaps/default/gone";
    let mut kv = store.create(hot, lease(0)).await.unwrap();
    let g = store.create(gone, b"g".to_vec()).await.unwrap();
    for round in 1..=10 {
        for i in 0..5 {
            kv = store
                .update(hot, lease(round * 10 + i), kv.mod_revision)
                .await
                .unwrap();
        }
        if round == 5 {
            store.delete(gone, Some(g.mod_revision)).await.unwrap();
        }
        store.compact(kv.mod_revision).await.unwrap();
    }
    let rows = |name: &str| -> i64 {
        sql(&db)
            .query_row("SELECT COUNT(*) FROM kv WHERE name = ?1", [name], |r| {
                r.get(0)
            })
            .unwrap()
    };
    assert_eq!(rows(hot), 1, "one row left of the hot key's 51");
    assert_eq!(rows(gone), 0, "a deleted key leaves nothing once compacted");
    assert_eq!(store.get(hot).await.unwrap(), Some(kv.clone()));
    // a watch from the compaction point still works, with the previous value
    let mut w = store.watch("/registry/", kv.mod_revision).await.unwrap();
    let next = store
        .update(hot, lease(999), kv.mod_revision)
        .await
        .unwrap();
    use futures::StreamExt;
    match tokio::time::timeout(Duration::from_secs(10), w.next()).await {
        Ok(Some(Ok(skiff_control_plane::store::Event::Put { kv: got, prev }))) => {
            assert_eq!(got, next);
            assert_eq!(prev, Some(kv));
        }
        other => panic!("expected the update after compaction, got {other:?}"),
    }
}
