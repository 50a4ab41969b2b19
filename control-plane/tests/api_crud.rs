//! The API suite against a SQLite-backed server, with real kubectl and kube-rs.

#[path = "support/api.rs"]
mod api;
#[path = "support/api_suite.rs"]
mod api_suite;

use api::TestServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubectl_crud_every_kind() {
    let s = TestServer::start().await;
    api_suite::kubectl_crud_every_kind(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kube_rs_round_trips() {
    let s = TestServer::start().await;
    api_suite::kube_rs_round_trips(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn apply_twice() {
    let s = TestServer::start().await;
    api_suite::apply_twice(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conflicts() {
    let s = TestServer::start().await;
    api_suite::conflicts(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pagination() {
    let s = TestServer::start().await;
    api_suite::pagination(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tables() {
    let s = TestServer::start().await;
    api_suite::tables(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pod_lifecycle() {
    let s = TestServer::start().await;
    api_suite::pod_lifecycle(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn events() {
    let s = TestServer::start().await;
    api_suite::events(&s).await;
}
