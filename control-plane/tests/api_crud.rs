//! The API suite against a SQLite-backed server, with real kubectl and kube-rs.

use crate::api;
use crate::api_suite;

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

/// kubectl's typed `create` commands send protobuf.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubectl_create_generators_send_protobuf() {
    let s = TestServer::start().await;
    for args in [
        &["create", "secret", "generic", "g-sec", "--from-literal=a=b"][..],
        &["create", "configmap", "g-cm", "--from-literal=x=y"],
        &["create", "namespace", "g-ns"],
        &["create", "serviceaccount", "g-sa"],
        &[
            "create",
            "rolebinding",
            "g-rb",
            "--clusterrole=view",
            "--user=bob",
        ],
        &[
            "create",
            "clusterrole",
            "g-cr",
            "--verb=get",
            "--resource=pods",
        ],
        &[
            "create",
            "deployment",
            "g-d",
            "--image=busybox:1",
            "--replicas=2",
            "--port=80",
        ],
        &[
            "create",
            "job",
            "g-j",
            "--image=busybox:1",
            "--",
            "echo",
            "hi",
        ],
        &["create", "service", "nodeport", "g-svc", "--tcp=80:8080"],
    ] {
        api::ok(s.kubectl(args));
    }
    assert_eq!(
        api::ok(s.kubectl(&["get", "secret", "g-sec", "-o", "jsonpath={.data.a}"])),
        "Yg=="
    );
    assert_eq!(
        api::ok(s.kubectl(&[
            "get",
            "deploy",
            "g-d",
            "-o",
            "jsonpath={.spec.replicas} {.spec.template.spec.containers[0].image}"
        ])),
        "2 busybox:1"
    );
    let np = api::ok(s.kubectl(&[
        "get",
        "svc",
        "g-svc",
        "-o",
        "jsonpath={.spec.ports[0].nodePort}",
    ]));
    assert!(
        np.parse::<u16>()
            .is_ok_and(|p| (30000..=32767).contains(&p)),
        "{np}"
    );
}
