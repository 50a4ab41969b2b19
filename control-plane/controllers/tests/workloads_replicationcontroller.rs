//! ReplicationController controller against a real API server: the
//! ReplicaSet loop behind an equality selector, scaled through `/scale`,
//! with the RC as the pods' owner, and a cascading delete.

use crate::workloads_support;

use k8s_openapi::api::core::v1::ReplicationController;
use kube::{Api, ResourceExt};
use workloads_support::{until, Env};

const RC: &str = r#"
apiVersion: v1
kind: ReplicationController
metadata:
  name: web
spec:
  replicas: 2
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: c
        image: busybox:1
"#;

async fn rc_status(env: &Env) -> (i32, i32, i32, i32, i64) {
    let rc = Api::<ReplicationController>::default_namespaced(env.client.clone())
        .get("web")
        .await
        .expect("get rc");
    let s = rc.status.unwrap_or_default();
    (
        s.replicas,
        s.fully_labeled_replicas.unwrap_or(0),
        s.ready_replicas.unwrap_or(0),
        s.available_replicas.unwrap_or(0),
        s.observed_generation.unwrap_or(0),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_scales_counts_and_cascades() {
    let env = Env::start(&["replicationcontroller", "garbagecollector"]).await;
    env.kubectl_stdin(&["apply", "-f", "-"], RC);
    until("2 pods", 20, || async {
        let n = env.active_pods("app=web").await.len();
        (n == 2).then_some(()).ok_or(format!("{n} pods"))
    })
    .await;
    let rc = Api::<ReplicationController>::default_namespaced(env.client.clone())
        .get("web")
        .await
        .expect("get rc");
    // The selector was defaulted from the template's labels.
    let selector = rc.spec.as_ref().and_then(|s| s.selector.clone());
    assert_eq!(
        selector.unwrap_or_default().get("app").map(String::as_str),
        Some("web")
    );
    let pods = env.active_pods("app=web").await;
    for p in &pods {
        let owner = &p.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!(
            (
                owner.kind.as_str(),
                owner.api_version.as_str(),
                owner.controller
            ),
            ("ReplicationController", "v1", Some(true))
        );
        assert_eq!(Some(owner.uid.clone()), rc.uid());
        env.wait_event(
            "SuccessfulCreate",
            &format!("Created pod: {}", p.name_any()),
        )
        .await;
        env.set_running(&p.name_any(), true).await;
    }
    until("2 ready and available", 20, || async {
        let s = rc_status(&env).await;
        (s == (2, 2, 2, 2, 1)).then_some(()).ok_or(format!("{s:?}"))
    })
    .await;

    // kubectl scale goes through the /scale subresource.
    env.kubectl(&["scale", "rc", "web", "--replicas=3"]);
    until("3 pods after scaling up", 20, || async {
        let n = env.active_pods("app=web").await.len();
        (n == 3).then_some(()).ok_or(format!("{n} pods"))
    })
    .await;
    let scale = env.kubectl(&[
        "get",
        "--raw",
        "/api/v1/namespaces/default/replicationcontrollers/web/scale",
    ]);
    assert!(scale.contains("\"replicas\":3"), "{scale}");
    assert!(scale.contains("app=web"), "{scale}");
    until("status to count 3", 20, || async {
        let s = rc_status(&env).await;
        (s.0 == 3 && s.4 == 2).then_some(()).ok_or(format!("{s:?}"))
    })
    .await;

    let rows = env.kubectl(&["get", "rc", "web", "-o", "wide", "--no-headers"]);
    let cells: Vec<&str> = rows.split_whitespace().collect();
    assert_eq!(cells.first(), Some(&"web"), "{rows}");
    assert_eq!(cells.get(1), Some(&"3"), "{rows}");
    assert!(
        rows.contains("busybox:1") && rows.contains("app=web"),
        "{rows}"
    );

    env.kubectl(&["delete", "rc", "web", "--cascade=background"]);
    until("the pods to go with the rc", 30, || async {
        let n = env.active_pods("app=web").await.len();
        (n == 0).then_some(()).ok_or(format!("{n} pods"))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selector_must_match_the_template() {
    let env = Env::start(&[]).await;
    let bad = RC.replace(
        "  replicas: 2\n",
        "  replicas: 2\n  selector: {app: other}\n",
    );
    let out = env.server.kubectl_stdin(&["apply", "-f", "-"], &bad);
    assert!(!out.status.success());
    let out = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.contains("spec.template.metadata.labels")
            && out.contains("`selector` does not match template `labels`"),
        "{out}"
    );
}
