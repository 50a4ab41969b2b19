//! A three-member etcd cluster loses its leader while a client keeps
//! writing: every acknowledged write is readable afterwards.

use crate::etcd_support;

use std::time::{Duration, Instant};

use skiff_control_plane::store::{EtcdStore, Store};

use etcd_support::EtcdCluster;

/// The index of the member that is the raft leader.
async fn leader(cluster: &EtcdCluster) -> usize {
    for _ in 0..100 {
        for (i, m) in cluster.members.iter().enumerate() {
            let Ok(mut c) = etcd_client::Client::connect([m.client_url.as_str()], None).await
            else {
                continue;
            };
            if let Ok(s) = c.status().await {
                if s.leader() != 0 && s.header().map(|h| h.member_id()) == Some(s.leader()) {
                    return i;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no etcd leader found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_members_lose_the_leader_while_writing() {
    let mut cluster = EtcdCluster::start_n(3);
    let store = EtcdStore::connect(&cluster.endpoints()).await.unwrap();

    let writer = {
        let store = store.clone();
        tokio::spawn(async move {
            // (key, revision) of every acknowledged create; failures while
            // the cluster elects a new leader are retried with a new key.
            let mut acked = Vec::new();
            let mut failures = 0;
            let started = Instant::now();
            let mut i = 0;
            while acked.len() < 600 && started.elapsed() < Duration::from_secs(40) {
                let key = format!("/registry/ha/{i:05}");
                i += 1;
                match store.create(&key, key.clone().into_bytes()).await {
                    Ok(kv) => acked.push((key, kv.mod_revision, Instant::now())),
                    Err(_) => {
                        failures += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
            (acked, failures)
        })
    };

    // let some writes land, then kill the leader
    tokio::time::sleep(Duration::from_millis(300)).await;
    let victim = leader(&cluster).await;
    let killed_at = Instant::now();
    cluster.members[victim].kill();

    let (acked, failures) = writer.await.unwrap();
    let after_kill = acked.iter().filter(|(_, _, t)| *t > killed_at).count();
    println!(
        "acknowledged {} writes ({after_kill} after killing leader m{victim}), {failures} failed attempts",
        acked.len()
    );
    assert!(
        after_kill > 100,
        "the two remaining members must keep accepting writes"
    );

    // every acknowledged write is there, at its revision, through the survivors
    let survivors = EtcdStore::connect(&cluster.endpoints()).await.unwrap();
    for (key, rev, _) in &acked {
        let kv = survivors
            .get(key)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{key} lost"));
        assert_eq!(
            (kv.mod_revision, kv.value.as_slice()),
            (*rev, key.as_bytes())
        );
    }
    let listed = survivors
        .list("/registry/ha/", None, 0, None)
        .await
        .unwrap();
    assert!(listed.kvs.len() >= acked.len());
}

fn skiff_server(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_skiff-server"))
        .args(args)
        .output()
        .expect("run skiff-server")
}

/// `skiff-server etcd status` shows every member with one leader;
/// `etcd remove` shrinks the cluster, refusing names it does not have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_status_lists_members_and_remove_shrinks_the_cluster() {
    let cluster = EtcdCluster::start_n(3);
    let lead = leader(&cluster).await;
    let endpoints = cluster.endpoints().join(",");
    let status = |endpoints: &str| {
        let out = skiff_server(&["--datastore-endpoint", endpoints, "etcd", "status"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let table = status(&endpoints);
    let rows: Vec<&str> = table.lines().collect();
    assert!(
        rows[0].starts_with("NAME") && rows[0].contains("RAFT INDEX"),
        "{table}"
    );
    assert_eq!(rows.len(), 4, "{table}");
    let leaders: Vec<&str> = rows[1..]
        .iter()
        .filter(|r| r.split_whitespace().nth(3) == Some("true"))
        .copied()
        .collect();
    assert_eq!(leaders.len(), 1, "{table}");
    assert!(
        leaders[0].starts_with(&cluster.members[lead].name),
        "{table}"
    );

    let out = skiff_server(&["--datastore-endpoint", &endpoints, "etcd", "remove", "m9"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no etcd member named \"m9\" (members: m0, m1, m2)"),
        "{err}"
    );

    let gone = (lead + 1) % 3;
    let name = &cluster.members[gone].name;
    // etcd refuses to reconfigure a cluster whose members have not all
    // been connected for a few seconds ("unhealthy cluster"): a fresh
    // cluster is asked again.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = skiff_server(&["--datastore-endpoint", &endpoints, "etcd", "remove", name]);
        let err = String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            break;
        }
        assert!(
            err.contains("unhealthy cluster") && Instant::now() < deadline,
            "{err}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let left: Vec<String> = cluster
        .members
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != gone)
        .map(|(_, m)| m.client_url.clone())
        .collect();
    let table = status(&left.join(","));
    assert_eq!(table.lines().count(), 3, "{table}");
    assert!(!table.contains(&format!("{name} ")), "{table}");

    let dir = tempfile::tempdir().unwrap();
    let out = skiff_server(&[
        "--data-dir",
        &dir.path().display().to_string(),
        "etcd",
        "status",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("there is no etcd cluster"));
}
