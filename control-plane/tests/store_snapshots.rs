//! Snapshots on a schedule: a server taking one every second keeps only
//! the newest `--etcd-snapshot-retention`, and `skiff-server snapshot`
//! lists, saves, prunes and restores them by name.

use crate::api;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use api::{eventually, ok, TestServer};
use skiff_control_plane::config::Settings;
use skiff_control_plane::store::{SqliteStore, Store, SQLITE_FILE};

fn names(dir: &Path) -> Vec<String> {
    let mut n: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    n.sort();
    n
}

fn server(data_dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_skiff-server"))
        .arg("--data-dir")
        .arg(data_dir)
        .args(args)
        .output()
        .expect("run skiff-server")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_snapshots_are_kept_listed_pruned_and_restored() {
    let mut s = TestServer::start_with_settings(
        None,
        Settings {
            etcd_disable_snapshots: Some(false),
            etcd_snapshot_schedule_cron: Some("* * * * * *".into()),
            etcd_snapshot_retention: Some(2),
            ..Default::default()
        },
    )
    .await;
    ok(s.kubectl(&["create", "configmap", "kept", "--from-literal=k=v"]));
    let data = s.cfg.data_dir.clone();
    let dir = data.join("snapshots");

    // Every name the schedule wrote, until at least four were taken.
    let mut seen = BTreeSet::new();
    let taken = eventually(Duration::from_secs(60), || {
        let now = names(&dir);
        seen.extend(
            now.into_iter()
                // Being written: `NAME.part` and, for SQLite, its
                // `NAME.part.tmp*` files.
                .filter(|n| n.starts_with("etcd-snapshot-") && !n.contains(".part")),
        );
        let enough = seen.len() >= 4;
        async move { enough }
    })
    .await;
    assert!(taken, "scheduled snapshots seen: {seen:?}");
    s.stop().await;
    let left = names(&dir);
    assert_eq!(left.len(), 2, "the retention keeps two: {left:?}");
    assert!(
        left.iter().all(|n| n.starts_with("etcd-snapshot-")),
        "{left:?}"
    );
    assert_eq!(
        left.as_slice(),
        &seen.iter().rev().take(2).rev().cloned().collect::<Vec<_>>()[..],
        "the newest two are kept"
    );

    // Saved by hand: an on-demand one beside them, verified, listed.
    let saved = ok(server(&data, &["snapshot", "save"]));
    assert!(
        saved.starts_with(&format!("saved {}/on-demand-", dir.display())),
        "{saved}"
    );
    let listed = ok(server(&data, &["snapshot", "list"]));
    let rows: Vec<&str> = listed.lines().collect();
    assert!(rows[0].starts_with("NAME"), "{listed}");
    assert_eq!(rows.len(), 4, "{listed}");
    for name in &left {
        assert!(listed.contains(name.as_str()), "{listed}");
    }

    // Pruning on-demand snapshots to none leaves the scheduled ones.
    let pruned = ok(server(
        &data,
        &["snapshot", "prune", "--etcd-snapshot-retention", "0"],
    ));
    assert!(pruned.contains("removed "), "{pruned}");
    assert_eq!(names(&dir), left);

    // The newest scheduled snapshot, by name, into a new data dir: the
    // ConfigMap is there.
    let status = ok(server(&data, &["snapshot", "status", &left[1]]));
    assert!(status.contains("hash: "), "{status}");
    let restored = s.dir.path().join("restored");
    let dir_flag = dir.display().to_string();
    ok(server(
        &restored,
        &[
            "--etcd-snapshot-dir",
            &dir_flag,
            "snapshot",
            "restore",
            &left[1],
        ],
    ));
    let store = SqliteStore::open(restored.join(SQLITE_FILE)).await.unwrap();
    let cm = store
        .get("/registry/core/configmaps/default/kept")
        .await
        .unwrap()
        .expect("the ConfigMap is in the snapshot");
    assert!(String::from_utf8_lossy(&cm.value).contains("\"k\":\"v\""));
}
