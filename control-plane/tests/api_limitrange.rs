//! LimitRanges through the API: validation, the LimitRanger admission's
//! container defaults (and its annotation), its min / max / ratio
//! refusals per container and per pod with upstream's messages, claims'
//! storage bounds, and what the real `kubectl` prints for `get limits`.

use crate::api;

use api::{header, ok, TestServer};
use k8s_openapi::api::core::v1::{LimitRange, PersistentVolumeClaim, Pod};
use kube::api::{Api, PostParams};
use serde_json::{json, Value};

fn range(name: &str, item: Value) -> LimitRange {
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"limits": [item]}})).unwrap()
}

fn pod(name: &str, containers: Value) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"containers": containers}}))
        .unwrap()
}

fn container(name: &str, resources: Value) -> Value {
    json!({"name": name, "image": "busybox", "resources": resources})
}

fn api_message(e: kube::Error) -> (u16, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.message),
        other => panic!("not an API error: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn defaults_fill_containers_without_resources() {
    let s = TestServer::start().await;
    let client = s.client().await;
    let ranges: Api<LimitRange> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let pp = PostParams::default();
    let created = ranges
        .create(
            &pp,
            &range(
                "defaults",
                json!({"type": "Container", "max": {"cpu": "1"},
                    "defaultRequest": {"cpu": "100m", "memory": "128Mi"}, "default": {"memory": "256Mi"}}),
            ),
        )
        .await
        .unwrap();
    // Served defaults: the max is the default limit.
    let item = &created.spec.unwrap().limits[0];
    assert_eq!(item.default.as_ref().unwrap()["cpu"].0, "1");
    assert_eq!(item.default_request.as_ref().unwrap()["cpu"].0, "100m");

    let p = pods
        .create(&pp, &pod("bare", json!([container("c", json!({}))])))
        .await
        .unwrap();
    let v = serde_json::to_value(&p).unwrap();
    let res = &v["spec"]["containers"][0]["resources"];
    assert_eq!(res["requests"], json!({"cpu": "100m", "memory": "128Mi"}));
    assert_eq!(res["limits"], json!({"cpu": "1", "memory": "256Mi"}));
    assert_eq!(
        v["metadata"]["annotations"]["kubernetes.io/limit-ranger"],
        "LimitRanger plugin set: cpu, memory request for container c; cpu, memory limit for container c"
    );
    assert_eq!(v["status"]["qosClass"], "Burstable");

    // What the pod gives itself is kept; only the rest is defaulted.
    let p = pods
        .create(
            &pp,
            &pod(
                "own",
                json!([container("c", json!({"limits": {"memory": "200Mi"}}))]),
            ),
        )
        .await
        .unwrap();
    let v = serde_json::to_value(&p).unwrap();
    let res = &v["spec"]["containers"][0]["resources"];
    assert_eq!(res["limits"], json!({"cpu": "1", "memory": "200Mi"}));
    assert_eq!(res["requests"], json!({"cpu": "100m", "memory": "200Mi"}));
    assert_eq!(
        v["metadata"]["annotations"]["kubernetes.io/limit-ranger"],
        "LimitRanger plugin set: cpu request for container c; cpu limit for container c"
    );

    ok(s.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: LimitRange\nmetadata:\n  name: applied\n  namespace: default\nspec:\n  limits:\n  - type: Pod\n    max:\n      memory: 8Gi\n",
    ));
    let get = ok(s.kubectl(&["get", "limits", "-n", "default"]));
    assert_eq!(header(&get), ["NAME", "CREATED", "AT"]);
    assert!(get.contains("defaults"), "{get}");
}

#[tokio::test(flavor = "multi_thread")]
async fn container_bounds_are_enforced() {
    let s = TestServer::start().await;
    let client = s.client().await;
    let ranges: Api<LimitRange> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let pp = PostParams::default();
    ranges
        .create(
            &pp,
            &range(
                "bounds",
                json!({"type": "Container", "min": {"cpu": "100m"}, "max": {"cpu": "2", "memory": "1Gi"},
                    "maxLimitRequestRatio": {"cpu": "2"}}),
            ),
        )
        .await
        .unwrap();
    for (resources, want) in [
        (
            json!({"requests": {"cpu": "50m"}, "limits": {"cpu": "100m"}}),
            "minimum cpu usage per Container is 100m, but request is 50m",
        ),
        (
            json!({"limits": {"memory": "2Gi"}}),
            "maximum memory usage per Container is 1Gi, but limit is 2Gi",
        ),
        (
            json!({"requests": {"cpu": "100m"}, "limits": {"cpu": "400m"}}),
            "cpu max limit to request ratio per Container is 2, but provided ratio is 4.000000",
        ),
    ] {
        let err = pods
            .create(&pp, &pod("p", json!([container("c", resources.clone())])))
            .await
            .unwrap_err();
        let (code, message) = api_message(err);
        assert_eq!(code, 403, "{resources}: {message}");
        assert!(
            message.starts_with("pods \"p\" is forbidden: "),
            "{message}"
        );
        assert!(message.contains(want), "{resources}: {message}");
    }
    // Within bounds (with the defaults filling the rest): admitted.
    pods.create(
        &pp,
        &pod(
            "fits",
            json!([container(
                "c",
                json!({"requests": {"cpu": "200m"}, "limits": {"cpu": "300m"}})
            )]),
        ),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn pod_max_sums_containers_and_claims_are_bounded() {
    let s = TestServer::start().await;
    let client = s.client().await;
    let ranges: Api<LimitRange> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client, "default");
    let pp = PostParams::default();
    ranges
        .create(
            &pp,
            &range("pod", json!({"type": "Pod", "max": {"cpu": "1"}})),
        )
        .await
        .unwrap();
    ranges
        .create(
            &pp,
            &range(
                "claims",
                json!({"type": "PersistentVolumeClaim", "max": {"storage": "2Gi"}}),
            ),
        )
        .await
        .unwrap();
    let c = |name: &str, cpu: &str| container(name, json!({"limits": {"cpu": cpu}}));
    let err = pods
        .create(&pp, &pod("big", json!([c("a", "600m"), c("b", "500m")])))
        .await
        .unwrap_err();
    let (code, message) = api_message(err);
    assert_eq!(code, 403);
    assert!(
        message.contains("maximum cpu usage per Pod is 1, but limit is 1100m"),
        "{message}"
    );
    pods.create(&pp, &pod("small", json!([c("a", "600m"), c("b", "400m")])))
        .await
        .unwrap();

    let claim = |name: &str, size: &str| -> PersistentVolumeClaim {
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": {
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}}))
        .unwrap()
    };
    let err = claims.create(&pp, &claim("huge", "5Gi")).await.unwrap_err();
    let (code, message) = api_message(err);
    assert_eq!(code, 403);
    assert!(
        message
            .contains("maximum storage usage per PersistentVolumeClaim is 2Gi, but request is 5Gi"),
        "{message}"
    );
    claims.create(&pp, &claim("ok", "1Gi")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn validation_refuses_disordered_ranges() {
    let s = TestServer::start().await;
    let ranges: Api<LimitRange> = Api::namespaced(s.client().await, "default");
    let pp = PostParams::default();
    for (item, want) in [
        (
            json!({"type": "Container", "min": {"cpu": "2"}, "max": {"cpu": "1"}}),
            "min value 2 is greater than max value 1",
        ),
        (
            json!({"type": "Container", "defaultRequest": {"memory": "2Gi"}, "default": {"memory": "1Gi"}}),
            "default request value 2Gi is greater than default limit value 1Gi",
        ),
        (
            json!({"type": "Container", "maxLimitRequestRatio": {"cpu": "500m"}}),
            "ratio 500m is less than 1",
        ),
        (
            json!({"type": "Pod", "default": {"cpu": "1"}}),
            "may not be specified when `type` is 'Pod'",
        ),
        (
            json!({"type": "Node", "max": {"cpu": "1"}}),
            "spec.limits[0].type",
        ),
    ] {
        let err = ranges
            .create(&pp, &range("bad", item.clone()))
            .await
            .unwrap_err();
        let (code, message) = api_message(err);
        assert_eq!(code, 422, "{item}: {message}");
        assert!(message.contains(want), "{item}: {message}");
    }
}
