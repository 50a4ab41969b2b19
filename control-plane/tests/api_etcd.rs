//! The same API suite against an etcd-backed server (Debian's etcd-server,
//! started by the etcd fixture).

#[path = "support/api.rs"]
mod api;
#[path = "support/api_suite.rs"]
mod api_suite;
#[path = "support/etcd.rs"]
mod etcd_support;

use std::sync::Arc;

use api::TestServer;
use etcd_support::EtcdCluster;
use skiff_control_plane::store::{EtcdStore, Store};

async fn server() -> (EtcdCluster, TestServer) {
    let etcd = EtcdCluster::start();
    let store: Arc<dyn Store> = Arc::new(
        EtcdStore::connect(&etcd.endpoints())
            .await
            .expect("connect etcd"),
    );
    let s = TestServer::start_with_store(store).await;
    (etcd, s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcd_kubectl_crud_every_kind() {
    let (_etcd, s) = server().await;
    api_suite::kubectl_crud_every_kind(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcd_kube_rs_round_trips_apply_and_conflicts() {
    let (_etcd, s) = server().await;
    api_suite::kube_rs_round_trips(&s).await;
    api_suite::apply_twice(&s).await;
    api_suite::conflicts(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcd_pagination_tables_lifecycle_events() {
    let (_etcd, s) = server().await;
    api_suite::pagination(&s).await;
    api_suite::tables(&s).await;
    api_suite::pod_lifecycle(&s).await;
    api_suite::events(&s).await;
    let c = s.client().await;
    let (code, _, body) = api::raw(&c, "GET", "/readyz?verbose", "application/json", vec![]).await;
    assert_eq!(code, 200);
    assert!(body.as_str().unwrap().contains("[+]etcd ok"), "{body}");
    assert!(
        body.as_str().unwrap().contains("[+]etcd-readiness ok"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcd_custom_resources() {
    let (_etcd, s) = server().await;
    api_suite::derived_custom_resources(&s).await;
}
