//! Every acknowledged SQLite write survives SIGKILL of the process, also
//! while the WAL is being checkpointed and restarted and the database
//! compacted and vacuumed under load:
//! a helper process (this test binary again) runs 8 concurrent writers
//! and a compacting hot key and prints each write the store acknowledged;
//! the test kills it at three different moments and finds every printed
//! write in the reopened database, which passes SQLite's integrity check.
//! The WAL stays bounded under these concurrent writers too.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use skiff_control_plane::store::{SqliteStore, Store, SQLITE_FILE};

/// Set for the helper: the database it writes to.
const HELPER_DB: &str = "SKIFF_CRASH_HELPER_DB";
const WRITERS: usize = 8;

/// The helper process: writes until killed (at most a minute), printing
/// `ACK <key> <revision>` after each acknowledged write.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "helper process of acknowledged_writes_survive_sigkill"]
async fn crash_helper() {
    let Ok(db) = std::env::var(HELPER_DB) else {
        return;
    };
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&db).await.unwrap());
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let hot = format!("/registry/crash/hot/{w}");
            let mut hot_rev = match store.get(&hot).await.unwrap() {
                Some(kv) => kv.mod_revision,
                None => {
                    store
                        .create(&hot, vec![b'h'; 900])
                        .await
                        .unwrap()
                        .mod_revision
                }
            };
            let mut i = 0u64;
            while Instant::now() < deadline {
                let key = format!("/registry/crash/{w}/{}-{i}", std::process::id());
                let kv = store.create(&key, vec![b'v'; 1000]).await.unwrap();
                println!("ACK {} {}", kv.key, kv.mod_revision);
                let mut value = vec![b'h'; 900];
                value[..8].copy_from_slice(&i.to_le_bytes());
                hot_rev = store
                    .update(&hot, value, hot_rev)
                    .await
                    .unwrap()
                    .mod_revision;
                println!("ACK {hot} {hot_rev}");
                if w == 0 && i.is_multiple_of(200) {
                    // compaction and the vacuum after it, under load
                    let _ = store.compact(hot_rev).await;
                }
                i += 1;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

#[test]
fn acknowledged_writes_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join(SQLITE_FILE);
    let exe = std::env::current_exe().unwrap();
    // The helper's name in this binary: its module path less the crate.
    let helper = match module_path!().split_once("::") {
        Some((_, module)) => format!("{module}::crash_helper"),
        None => "crash_helper".to_string(),
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    for (round, run_for) in [1500u64, 2300, 3100].into_iter().enumerate() {
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                &helper,
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(HELPER_DB, &db)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let acked = Arc::new(Mutex::new(Vec::<(String, i64)>::new()));
        let reader = {
            let out = child.stdout.take().unwrap();
            let acked = acked.clone();
            std::thread::spawn(move || {
                // A line is complete only with its newline: a half-printed
                // one at the kill is not counted.
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    let mut parts = line.split(' ');
                    if let (Some("ACK"), Some(key), Some(rev)) =
                        (parts.next(), parts.next(), parts.next())
                    {
                        if let Ok(rev) = rev.parse() {
                            acked.lock().unwrap().push((key.to_string(), rev));
                        }
                    }
                }
            })
        };
        // Sample the WAL meanwhile: this load writes it over many times
        // (restart checkpoints) and it stays a few MiB.
        let wal = db.with_file_name(format!("{SQLITE_FILE}-wal"));
        let mut wal_max = 0;
        let until = Instant::now() + Duration::from_millis(run_for);
        while Instant::now() < until {
            wal_max = wal_max.max(std::fs::metadata(&wal).map_or(0, |m| m.len()));
            // A synchronous test driving a child process: no runtime here.
            #[allow(clippy::disallowed_methods)]
            std::thread::sleep(Duration::from_millis(5));
        }
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        child.wait().unwrap();
        reader.join().unwrap();
        let acked = std::mem::take(&mut *acked.lock().unwrap());
        assert!(
            wal_max <= 16 * 1024 * 1024,
            "round {round}: the WAL grew to {wal_max} bytes under 8 writers"
        );
        assert!(
            acked.len() > 100,
            "round {round}: only {} writes before the kill",
            acked.len()
        );

        let check: String = rusqlite::Connection::open(&db)
            .unwrap()
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(check, "ok", "round {round}: database damaged");
        rt.block_on(async {
            let store = SqliteStore::open(&db).await.unwrap();
            let mut lost = Vec::new();
            let mut newest = std::collections::HashMap::new();
            for (key, rev) in &acked {
                let e = newest.entry(key.clone()).or_insert(*rev);
                *e = (*e).max(*rev);
            }
            for (key, rev) in &newest {
                match store.get(key).await.unwrap() {
                    Some(kv) if kv.mod_revision >= *rev => {}
                    other => lost.push(format!("{key}@{rev}: {other:?}")),
                }
            }
            assert!(
                lost.is_empty(),
                "round {round}: {} of {} acknowledged writes lost: {:?}",
                lost.len(),
                acked.len(),
                &lost[..lost.len().min(5)]
            );
            let max = acked.iter().map(|(_, r)| *r).max().unwrap();
            assert!(store.current_revision().await.unwrap() >= max);
            println!(
                "round {round}: killed after {run_for} ms, {} acknowledged writes, none lost \
                 (WAL file up to {:.1} MiB)",
                acked.len(),
                wal_max as f64 / (1024.0 * 1024.0)
            );
        });
    }
}
