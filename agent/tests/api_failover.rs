//! The agent's API client outlives its server: with two skiff-servers on
//! one etcd (127.0.0.1 and 127.0.0.2, one port, one CA), a client built
//! from the first's kubeconfig learns the second from `default/kubernetes`
//! and moves its requests, and its watches' retries, there when the
//! first stops.

#[path = "../../control-plane/tests/support/etcd.rs"]
mod etcd_support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use etcd_support::EtcdCluster;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use skiff_control_plane::config::Settings;
use skiff_control_plane::store::{EtcdStore, Store};
use skiff_control_plane::testkit::{eventually, TestServer};

const WAIT: Duration = Duration::from_secs(30);

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_client_moves_to_a_live_server_when_its_own_stops() {
    let etcd = EtcdCluster::start();
    let store = || async {
        Arc::new(EtcdStore::connect(&etcd.endpoints()).await.unwrap()) as Arc<dyn Store>
    };
    let mut a = TestServer::start_with_store(store().await).await;
    let port = a.cfg.secure_port;
    // The second server shares the first's CA, as joined servers do.
    let dir = tempfile::tempdir().unwrap();
    let b_data = dir.path().join("data");
    copy_dir(&a.cfg.data_dir.join("pki"), &b_data.join("pki"));
    let _b = TestServer::start_with_settings(
        Some(store().await),
        Settings {
            data_dir: Some(b_data),
            bind_address: Some("127.0.0.2".into()),
            secure_port: Some(port),
            ..Default::default()
        },
    )
    .await;

    let api = skiff_agent::apiclient::from_kubeconfig(&a.admin_kubeconfig())
        .await
        .unwrap();
    let first = format!("https://127.0.0.1:{port}");
    let second = format!("https://127.0.0.2:{port}");
    assert!(
        eventually(WAIT, || {
            let servers = api.servers();
            let want = [first.clone(), second.clone()];
            async move { servers == want }
        })
        .await,
        "{:?}",
        api.servers()
    );

    let cms: Api<ConfigMap> = Api::namespaced(api.client.clone(), "default");
    let mut seen = watcher(cms.clone(), watcher::Config::default())
        .default_backoff()
        .applied_objects()
        .boxed();
    cms.create(&PostParams::default(), &cm("before"))
        .await
        .unwrap();
    let name = |o: ConfigMap| o.metadata.name.unwrap_or_default();
    loop {
        let o = tokio::time::timeout(WAIT, seen.next()).await.unwrap();
        if o.map(|o| o.map(name)).transpose().unwrap().as_deref() == Some("before") {
            break;
        }
    }

    a.stop().await;
    assert!(
        eventually(WAIT, || {
            let cms = cms.clone();
            async move { cms.list(&ListParams::default()).await.is_ok() }
        })
        .await,
        "requests never reached the second server"
    );
    assert_eq!(api.servers()[0], second);
    cms.create(&PostParams::default(), &cm("after"))
        .await
        .unwrap();
    // The watch's retries reached the second server too.
    loop {
        let o = tokio::time::timeout(WAIT, seen.next())
            .await
            .expect("the watch goes on through the second server");
        if o.map(|o| o.map(name)).transpose().ok().flatten().as_deref() == Some("after") {
            break;
        }
    }
}
