//! Namespace controller against a real API server and real kubectl:
//! deleting a namespace deletes everything in it, waits for pods that
//! terminate on their node, reports progress in conditions, then lets
//! the namespace go.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, Service};
use kube::api::{DeleteParams, PostParams};
use kube::Api;
use serde_json::json;
use skiff_control_plane::testkit::{eventually, ok, TestServer};
use skiff_controllers::Config;

const WAIT: Duration = Duration::from_secs(20);

async fn start_controllers(server: &TestServer) -> tokio::sync::oneshot::Sender<()> {
    let client = server
        .client_for("system:kube-controller-manager", &[])
        .await;
    let cfg = Config {
        controllers: vec!["namespace".into()],
        ..Config::default()
    };
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(skiff_controllers::run(client, cfg, async {
        let _ = rx.await;
    }));
    tx
}

fn pod(name: &str, node: Option<&str>) -> Pod {
    let mut spec = json!({"containers": [{"name": "c", "image": "busybox:1"}]});
    if let Some(n) = node {
        spec["nodeName"] = json!(n);
    }
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_namespace_deletes_its_content_then_the_namespace() {
    let server = TestServer::start().await;
    let admin = server.client().await;
    let _stop = start_controllers(&server).await;
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    ok(server.kubectl(&["create", "namespace", "doomed"]));
    ok(server.kubectl(&["create", "namespace", "bystander"]));
    let pp = PostParams::default();
    for ns in ["doomed", "bystander"] {
        let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), ns);
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": "cfg"}, "data": {"k": "v"}}))
                .unwrap();
        cms.create(&pp, &cm).await.unwrap();
    }
    let svcs: Api<Service> = Api::namespaced(admin.clone(), "doomed");
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]},
    }))
    .unwrap();
    svcs.create(&pp, &svc).await.unwrap();
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), "doomed");
    let secret: Secret =
        serde_json::from_value(json!({"metadata": {"name": "s"}, "stringData": {"a": "b"}}))
            .unwrap();
    secrets.create(&pp, &secret).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "doomed");
    // One pod never scheduled (goes at once), one running on a node (its
    // agent must finish the graceful deletion).
    pods.create(&pp, &pod("pending", None)).await.unwrap();
    pods.create(&pp, &pod("running", Some("node-1")))
        .await
        .unwrap();
    // Something from another API group, applied with kubectl.
    let deploy = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: d\nspec:\n  selector:\n    matchLabels: {app: d}\n  template:\n    metadata:\n      labels: {app: d}\n    spec:\n      containers: [{name: c, image: busybox:1}]\n";
    ok(server.kubectl_stdin(&["apply", "-f", "-", "--namespace=doomed"], deploy));

    ok(server.kubectl(&["delete", "namespace", "doomed", "--wait=false"]));
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), "doomed");

    // Everything but the running pod goes; the namespace waits for it and
    // says so.
    assert!(
        eventually(WAIT, || async {
            let cm: Api<ConfigMap> = Api::namespaced(admin.clone(), "doomed");
            cm.get_opt("cfg").await.unwrap().is_none()
                && svcs.get_opt("web").await.unwrap().is_none()
                && secrets.get_opt("s").await.unwrap().is_none()
                && pods.get_opt("pending").await.unwrap().is_none()
                && deployments.get_opt("d").await.unwrap().is_none()
        })
        .await,
        "content deleted"
    );
    assert!(
        eventually(WAIT, || async {
            let p = pods.get("running").await.unwrap();
            p.metadata.deletion_timestamp.is_some()
        })
        .await,
        "running pod is terminating"
    );
    assert!(
        eventually(WAIT, || async {
            let ns = namespaces.get("doomed").await.unwrap();
            ns.status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| {
                    c.type_ == "NamespaceContentRemaining"
                        && c.status == "True"
                        && c.message
                            .as_deref()
                            .is_some_and(|m| m.contains("pods has 1"))
                })
        })
        .await,
        "NamespaceContentRemaining names the pod: {:?}",
        namespaces.get("doomed").await.unwrap().status
    );
    let ns = namespaces.get("doomed").await.unwrap();
    assert_eq!(ns.status.unwrap().phase.as_deref(), Some("Terminating"));

    // The node finishes the pod: the namespace goes.
    pods.delete("running", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    assert!(
        eventually(WAIT, || async {
            namespaces.get_opt("doomed").await.unwrap().is_none()
        })
        .await,
        "namespace deleted: {:?}",
        namespaces
            .get_opt("doomed")
            .await
            .unwrap()
            .map(|n| n.status)
    );
    let out = ok(server.kubectl(&["get", "configmaps", "-n", "bystander", "-o", "name"]));
    // Every namespace also gets kube-root-ca.crt from its publisher.
    let own: Vec<&str> = out
        .lines()
        .filter(|l| *l != "configmap/kube-root-ca.crt")
        .collect();
    assert_eq!(own, ["configmap/cfg"], "other namespaces untouched");

    // A namespace of the same name can be made again, and emptied again.
    ok(server.kubectl(&["create", "namespace", "doomed"]));
    ok(server.kubectl(&["create", "configmap", "again", "-n", "doomed"]));
    ok(server.kubectl(&["delete", "namespace", "doomed", "--timeout=20s"]));
    assert!(namespaces.get_opt("doomed").await.unwrap().is_none());
}
