//! The same API suite against an etcd-backed server (Debian's etcd-server,
//! started by the etcd fixture).

use crate::api;
use crate::api_suite;
use crate::etcd_support;

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

/// Two servers on one etcd (127.0.0.1 and 127.0.0.2, one port) are both
/// endpoints of `default/kubernetes`; one that stops leaves at once, one
/// that dies (a lease nobody renews) when its lease expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_api_server_is_an_endpoint_of_the_kubernetes_service() {
    let (etcd, a) = server().await;
    let store: Arc<dyn Store> = Arc::new(EtcdStore::connect(&etcd.endpoints()).await.unwrap());
    let mut b = TestServer::start_with_settings(
        Some(store),
        skiff_control_plane::config::Settings {
            bind_address: Some("127.0.0.2".into()),
            secure_port: Some(a.cfg.secure_port),
            ..Default::default()
        },
    )
    .await;
    let endpoints = || {
        let ep = api::ok(a.kubectl(&[
            "get",
            "endpoints",
            "kubernetes",
            "-o",
            "jsonpath={.subsets[*].addresses[*].ip}",
        ]));
        let slice = api::ok(a.kubectl(&[
            "get",
            "endpointslice",
            "kubernetes",
            "-o",
            "jsonpath={.endpoints[*].addresses[*]}",
        ]));
        (ep, slice)
    };
    let within = std::time::Duration::from_secs(30);
    let both = (
        "127.0.0.1 127.0.0.2".to_string(),
        "127.0.0.1 127.0.0.2".to_string(),
    );
    assert!(
        api::eventually(within, || {
            let now = endpoints();
            let want = both.clone();
            async move { now == want }
        })
        .await,
        "{:?}",
        endpoints()
    );

    // Past the lease's TTL both are still there: renewals renew.
    tokio::time::sleep(
        skiff_control_plane::apiserver::peers::TTL + std::time::Duration::from_secs(2),
    )
    .await;
    assert_eq!(endpoints(), both);

    b.stop().await;
    let one = ("127.0.0.1".to_string(), "127.0.0.1".to_string());
    assert!(
        api::eventually(within, || {
            let now = endpoints();
            let want = one.clone();
            async move { now == want }
        })
        .await,
        "{:?}",
        endpoints()
    );

    // A server that died: its lease is not renewed.
    a.handle()
        .api
        .store()
        .create_with_ttl(
            "/registry/masterleases/127.0.0.9",
            b"{}".to_vec(),
            Some(std::time::Duration::from_secs(2)),
        )
        .await
        .unwrap();
    assert!(
        api::eventually(within, || {
            let now = endpoints().0;
            async move { now == "127.0.0.1 127.0.0.9" }
        })
        .await
    );
    assert!(
        api::eventually(within, || {
            let now = endpoints().0;
            async move { now == "127.0.0.1" }
        })
        .await,
        "{:?}",
        endpoints()
    );
}
