//! A three-member etcd cluster loses its leader while a client keeps
//! writing: every acknowledged write is readable afterwards.

#[path = "support/etcd.rs"]
mod etcd_support;

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
