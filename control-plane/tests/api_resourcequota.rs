//! ResourceQuotas through the API: validation, the admission that checks
//! and charges new objects (upstream's messages, no over-admission under
//! concurrent creates, scopes), and what the real `kubectl` prints for
//! `get quota` and `describe quota`.

use crate::api;

use api::{fails, ok, TestServer};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, ResourceQuota};
use kube::api::{Api, PostParams};
use serde_json::json;

fn quota(name: &str, spec: serde_json::Value) -> ResourceQuota {
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
}

/// A pod with one container `c` with `resources`.
fn pod(name: &str, resources: serde_json::Value) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"containers": [
        {"name": "c", "image": "busybox", "resources": resources}]}}))
    .unwrap()
}

fn api_message(e: kube::Error) -> (u16, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.message),
        other => panic!("not an API error: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn validation_refuses_bad_quotas() {
    let s = TestServer::start().await;
    let quotas: Api<ResourceQuota> = Api::namespaced(s.client().await, "default");
    let pp = PostParams::default();
    for (spec, want) in [
        (
            json!({"hard": {"pods": "-1"}}),
            "spec.hard[pods]: Invalid value: \"-1\": must be greater than or equal to 0",
        ),
        (
            json!({"hard": {"gpus": "1"}}),
            "must be a standard resource for quota",
        ),
        (
            json!({"hard": {"cpu": "1"}, "scopes": ["BestEffort"]}),
            "unsupported scope applied to resource",
        ),
        (
            json!({"hard": {"pods": "1"}, "scopes": ["BestEffort", "NotBestEffort"]}),
            "conflicting scopes",
        ),
        (
            json!({"hard": {"pods": "1"}, "scopeSelector": {"matchExpressions": [
                {"scopeName": "PriorityClass", "operator": "In"}]}}),
            "must be at least one value when `operator` is 'In' or 'NotIn' for scope selector",
        ),
        (
            json!({"hard": {"pods": "1"}, "scopes": ["CrossNamespacePodAffinity"]}),
            "not supported by this server",
        ),
    ] {
        let err = quotas
            .create(&pp, &quota("bad", spec.clone()))
            .await
            .unwrap_err();
        let (code, message) = api_message(err);
        assert_eq!(code, 422, "{spec}: {message}");
        assert!(message.contains(want), "{spec}: {message}");
    }
    // A status sent on create is dropped: it is the controller's to write.
    let mut q = quota("q", json!({"hard": {"pods": "1"}}));
    q.status = serde_json::from_value(json!({"used": {"pods": "100"}})).unwrap();
    let created = quotas.create(&pp, &q).await.unwrap();
    assert!(created
        .status
        .and_then(|s| s.used)
        .is_none_or(|u| u.is_empty()));
}

#[tokio::test(flavor = "multi_thread")]
async fn exceeding_a_quota_is_forbidden_with_upstreams_message() {
    let s = TestServer::start().await;
    let client = s.client().await;
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    quotas
        .create(
            &pp,
            &quota("q1", json!({"hard": {"pods": "2", "requests.cpu": "1"}})),
        )
        .await
        .unwrap();
    let small = json!({"requests": {"cpu": "300m"}});
    pods.create(&pp, &pod("p1", small.clone())).await.unwrap();
    pods.create(&pp, &pod("p2", small.clone())).await.unwrap();
    let (code, message) = api_message(pods.create(&pp, &pod("p3", small)).await.unwrap_err());
    assert_eq!(code, 403);
    assert_eq!(
        message,
        "pods \"p3\" is forbidden: exceeded quota: q1, requested: pods=1, used: pods=2, limited: pods=2"
    );
    let q = quotas.get("q1").await.unwrap();
    let used = q.status.unwrap().used.unwrap();
    assert_eq!(used["pods"].0, "2");
    assert_eq!(used["requests.cpu"].0, "600m");

    // A quota on cpu wants every container to ask for it.
    quotas
        .create(&pp, &quota("q2", json!({"hard": {"limits.memory": "1Gi"}})))
        .await
        .unwrap();
    pods.delete("p2", &Default::default()).await.unwrap();
    let (code, message) = api_message(pods.create(&pp, &pod("p4", json!({}))).await.unwrap_err());
    assert_eq!(code, 403);
    assert_eq!(
        message,
        "pods \"p4\" is forbidden: failed quota: q1: must specify requests.cpu for: c"
    );
    // Over the cpu left in q1 (600m used of 1, deletes are given back by
    // the controller, which does not run here).
    let big = json!({"requests": {"cpu": "500m"}, "limits": {"memory": "64Mi"}});
    let (code, message) = api_message(pods.create(&pp, &pod("p5", big)).await.unwrap_err());
    assert_eq!(code, 403);
    assert_eq!(
        message,
        "pods \"p5\" is forbidden: exceeded quota: q1, requested: pods=1,requests.cpu=500m, used: pods=2,requests.cpu=600m, limited: pods=2,requests.cpu=1"
    );
    // Object counts of other kinds.
    quotas
        .create(
            &pp,
            &quota("cm", json!({"hard": {"count/configmaps": "2"}})),
        )
        .await
        .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    // kube-root-ca.crt is there already.
    let cm =
        |n: &str| serde_json::from_value::<ConfigMap>(json!({"metadata": {"name": n}})).unwrap();
    cms.create(&pp, &cm("a")).await.unwrap();
    let (code, message) = api_message(cms.create(&pp, &cm("b")).await.unwrap_err());
    assert_eq!(code, 403);
    assert_eq!(message, "configmaps \"b\" is forbidden: exceeded quota: cm, requested: count/configmaps=1, used: count/configmaps=2, limited: count/configmaps=2");
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_creates_never_exceed_the_quota() {
    let s = TestServer::start().await;
    let client = s.client().await;
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), "default");
    quotas
        .create(
            &PostParams::default(),
            &quota("three", json!({"hard": {"pods": "3"}})),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let creates = (0..10).map(|i| {
        let pods = pods.clone();
        tokio::spawn(async move {
            pods.create(&PostParams::default(), &pod(&format!("p{i}"), json!({})))
                .await
        })
    });
    let results = futures::future::join_all(creates).await;
    let mut ok = 0;
    for r in results {
        match r.unwrap() {
            Ok(_) => ok += 1,
            Err(e) => {
                let (code, message) = api_message(e);
                assert_eq!(code, 403, "{message}");
                assert!(message.contains("exceeded quota: three"), "{message}");
            }
        }
    }
    assert_eq!(ok, 3);
    assert_eq!(pods.list(&Default::default()).await.unwrap().items.len(), 3);
    let used = quotas
        .get("three")
        .await
        .unwrap()
        .status
        .unwrap()
        .used
        .unwrap();
    assert_eq!(used["pods"].0, "3");
}

#[tokio::test(flavor = "multi_thread")]
async fn scopes_choose_the_pods_a_quota_counts() {
    let s = TestServer::start().await;
    let client = s.client().await;
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let pp = PostParams::default();
    quotas
        .create(
            &pp,
            &quota(
                "be",
                json!({"hard": {"pods": "1"}, "scopes": ["BestEffort"]}),
            ),
        )
        .await
        .unwrap();
    quotas
        .create(
            &pp,
            &quota(
                "high",
                json!({"hard": {"pods": "0"}, "scopeSelector": {"matchExpressions": [
            {"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]}}),
            ),
        )
        .await
        .unwrap();
    pods.create(&pp, &pod("be1", json!({}))).await.unwrap();
    let (code, message) = api_message(pods.create(&pp, &pod("be2", json!({}))).await.unwrap_err());
    assert_eq!(code, 403);
    assert!(message.contains("exceeded quota: be,"), "{message}");
    // Not BestEffort: out of that quota's scope.
    pods.create(&pp, &pod("burst", json!({"requests": {"cpu": "100m"}})))
        .await
        .unwrap();
    let mut high = pod("hi", json!({"requests": {"cpu": "100m"}}));
    high.spec.as_mut().unwrap().priority_class_name = Some("high".into());
    let err = pods.create(&pp, &high).await.unwrap_err();
    let (code, message) = api_message(err);
    // PriorityClass admission (another part) may refuse an unknown class
    // first; either way it is not created.
    assert!(code == 403 || code == 404, "{code} {message}");
    assert!(
        message.contains("exceeded quota: high,") || message.contains("PriorityClass"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_prints_used_over_hard() {
    let s = TestServer::start().await;
    ok(s.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: ResourceQuota\nmetadata: {name: q1, namespace: default}\nspec:\n  hard: {pods: \"10\", requests.cpu: \"1\", limits.memory: 1Gi}\n",
    ));
    ok(s.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: default}\nspec:\n  containers:\n  - name: c\n    image: busybox\n    resources: {requests: {cpu: 500m}, limits: {memory: 128Mi}}\n",
    ));
    let get = ok(s.kubectl(&["get", "quota", "-n", "default"]));
    let lines: Vec<&str> = get.lines().collect();
    assert!(lines[0].starts_with("NAME"), "{get}");
    for col in ["AGE", "REQUEST", "LIMIT"] {
        assert!(lines[0].contains(col), "{get}");
    }
    assert!(lines[1].starts_with("q1"), "{get}");
    assert!(
        lines[1].contains("pods: 1/10, requests.cpu: 500m/1"),
        "{get}"
    );
    assert!(lines[1].contains("limits.memory: 128Mi/1Gi"), "{get}");
    let describe = ok(s.kubectl(&["describe", "quota", "q1", "-n", "default"]));
    let rows: Vec<Vec<&str>> = describe
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    for want in [
        ["pods", "1", "10"],
        ["requests.cpu", "500m", "1"],
        ["limits.memory", "128Mi", "1Gi"],
    ] {
        assert!(rows.iter().any(|r| r == &want), "{want:?} in\n{describe}");
    }
    let err = fails(s.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p2, namespace: default}\nspec:\n  containers:\n  - name: c\n    image: busybox\n    resources: {requests: {cpu: 600m}, limits: {memory: 128Mi}}\n",
    ));
    assert!(
        err.contains("exceeded quota: q1, requested: requests.cpu=600m, used: requests.cpu=500m, limited: requests.cpu=1"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn claims_and_services_are_charged() {
    use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Service};
    let s = TestServer::start().await;
    let client = s.client().await;
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    quotas
        .create(
            &pp,
            &quota(
                "storage",
                json!({"hard": {"requests.storage": "1Gi",
                "fast.storageclass.storage.k8s.io/persistentvolumeclaims": "1",
                "services.nodeports": "1"}}),
            ),
        )
        .await
        .unwrap();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let claim = |name: &str, size: &str| -> PersistentVolumeClaim {
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": {
            "storageClassName": "fast", "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": size}}}}))
        .unwrap()
    };
    claims.create(&pp, &claim("a", "512Mi")).await.unwrap();
    let (code, message) = api_message(claims.create(&pp, &claim("b", "256Mi")).await.unwrap_err());
    assert_eq!(code, 403);
    assert_eq!(
        message,
        "persistentvolumeclaims \"b\" is forbidden: exceeded quota: storage, requested: fast.storageclass.storage.k8s.io/persistentvolumeclaims=1, used: fast.storageclass.storage.k8s.io/persistentvolumeclaims=1, limited: fast.storageclass.storage.k8s.io/persistentvolumeclaims=1"
    );

    let services: Api<Service> = Api::namespaced(client, "default");
    let svc: Service = serde_json::from_value(json!({"metadata": {"name": "web"},
        "spec": {"ports": [{"port": 80}]}}))
    .unwrap();
    services.create(&pp, &svc).await.unwrap();
    // Turned NodePort: the update is charged by what it adds.
    let patch = json!({"spec": {"type": "NodePort"}});
    services
        .patch("web", &Default::default(), &kube::api::Patch::Merge(&patch))
        .await
        .unwrap();
    let two: Service = serde_json::from_value(json!({"metadata": {"name": "two"},
        "spec": {"type": "NodePort", "ports": [{"port": 80}]}}))
    .unwrap();
    let (code, message) = api_message(services.create(&pp, &two).await.unwrap_err());
    assert_eq!(code, 403);
    assert!(
        message.ends_with("requested: services.nodeports=1, used: services.nodeports=1, limited: services.nodeports=1"),
        "{message}"
    );
    let used = quotas
        .get("storage")
        .await
        .unwrap()
        .status
        .unwrap()
        .used
        .unwrap();
    assert_eq!(used["requests.storage"].0, "512Mi");
}
