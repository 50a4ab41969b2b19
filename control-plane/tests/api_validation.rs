//! Validation parity with upstream: what upstream refuses with 400, 415
//! or 422 is refused here too, before anything is stored.

use crate::api;

use api::{raw, TestServer};
use serde_json::{json, Value};

async fn send(
    c: &kube::Client,
    method: &str,
    path: &str,
    ct: &str,
    body: Vec<u8>,
) -> (u16, Value, http::HeaderMap) {
    let (code, headers, body) = raw(c, method, path, ct, body).await;
    (code, body, headers)
}

async fn post(c: &kube::Client, path: &str, obj: &Value) -> (u16, Value) {
    let (code, body, _) = send(c, "POST", path, "application/json", obj.to_string().into()).await;
    (code, body)
}

fn fields(body: &Value) -> Vec<String> {
    body["details"]["causes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| c["field"].as_str().unwrap_or_default().to_string())
        .collect()
}

const SVC: &str = "/api/v1/namespaces/default/services";
const CM: &str = "/api/v1/namespaces/default/configmaps";

fn service(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": spec})
}

fn configmap(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fields_the_proxy_writes_into_rules_are_validated() {
    let s = TestServer::start().await;
    let c = s.client().await;
    // Port names go into DNS names and into the proxy's nft/iptables text.
    for bad in [
        "web\nflush ruleset",
        "we\"b",
        "Web",
        "a--b-very-long-name-over-63-characters-aaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    ] {
        let svc = service(
            "s1",
            json!({"ports": [{"name": bad, "port": 80}, {"name": "b", "port": 81}]}),
        );
        let (code, body) = post(&c, SVC, &svc).await;
        assert_eq!(code, 422, "{bad:?}: {body}");
        assert_eq!(fields(&body), vec!["spec.ports[0].name"], "{body}");
    }
    let svc = service(
        "s2",
        json!({"ports": [{"name": "a", "port": 80, "targetPort": "Not_A_Port"}],
        "externalIPs": ["10.0.0.1; flush ruleset"]}),
    );
    let (code, body) = post(&c, SVC, &svc).await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(
        fields(&body),
        vec!["spec.ports[0].targetPort", "spec.externalIPs[0]"]
    );
    let svc = service(
        "s3",
        json!({"ports": [{"name": "a", "port": 80}, {"name": "a", "port": 80}]}),
    );
    let (code, body) = post(&c, SVC, &svc).await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(fields(&body), vec!["spec.ports[1].name", "spec.ports[1]"]);

    let slice = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "sl"}, "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.1.1.1 } ; flush ruleset"]}],
        "ports": [{"name": "x y", "port": 80}]});
    let (code, body) = post(
        &c,
        "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices",
        &slice,
    )
    .await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(
        fields(&body),
        vec!["endpoints[0].addresses[0]", "ports[0].name"]
    );

    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "i", "ports": [{"name": "http_port", "containerPort": 80}]}]}});
    let (code, body) = post(&c, "/api/v1/namespaces/default/pods", &pod).await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(fields(&body), vec!["spec.containers[0].ports[0].name"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn object_meta_and_data_limits_as_upstream() {
    let s = TestServer::start().await;
    let c = s.client().await;
    let mut cm = configmap("a1");
    cm["metadata"]["annotations"] = json!({"bad key": "x"});
    let (code, body) = post(&c, CM, &cm).await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(fields(&body), vec!["metadata.annotations"]);

    let mut cm = configmap("a2");
    cm["metadata"]["ownerReferences"] = json!([
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "r1", "uid": "u1", "controller": true},
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "r2", "uid": "u2", "controller": true},
    ]);
    cm["metadata"]["finalizers"] = json!(["not a finalizer"]);
    let (code, body) = post(&c, CM, &cm).await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(
        fields(&body),
        vec!["metadata.ownerReferences", "metadata.finalizers"]
    );

    // 1 MiB of data at most, in ConfigMaps and (decoded) in Secrets.
    let mut cm = configmap("big");
    cm["data"] = json!({"k": "x".repeat(1024 * 1024 + 1)});
    let (code, body) = post(&c, CM, &cm).await;
    assert_eq!(code, 422, "{}", body["message"]);
    assert!(body["message"]
        .as_str()
        .unwrap()
        .contains("Too long: may not be more than 1048576 bytes"));
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "big"},
        "stringData": {"k": "x".repeat(1024 * 1024 + 1)}});
    let (code, body) = post(&c, "/api/v1/namespaces/default/secrets", &secret).await;
    assert_eq!(code, 422, "{}", body["message"]);
    assert_eq!(fields(&body), vec!["data"]);
    let mut cm = configmap("fits");
    cm["data"] = json!({"k": "x".repeat(1024 * 1024 - 16)});
    assert_eq!(post(&c, CM, &cm).await.0, 201);

    // No new finalizers on an object being deleted.
    let mut cm = configmap("held");
    cm["metadata"]["finalizers"] = json!(["example.com/hold"]);
    assert_eq!(post(&c, CM, &cm).await.0, 201);
    let (code, _, _) = send(
        &c,
        "DELETE",
        &format!("{CM}/held"),
        "application/json",
        vec![],
    )
    .await;
    assert_eq!(code, 200);
    let patch = json!({"metadata": {"finalizers": ["example.com/hold", "example.com/more"]}});
    let (code, body, _) = send(
        &c,
        "PATCH",
        &format!("{CM}/held"),
        "application/merge-patch+json",
        patch.to_string().into(),
    )
    .await;
    assert_eq!(code, 422, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("no new finalizers can be added if the object is being deleted"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn request_options_and_bodies_as_upstream() {
    let s = TestServer::start().await;
    let c = s.client().await;
    let dup = br#"{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "d1", "name": "d2"}, "data": {}}"#;
    let (code, body, _) = send(
        &c,
        "POST",
        &format!("{CM}?fieldValidation=Strict"),
        "application/json",
        dup.to_vec(),
    )
    .await;
    assert_eq!(code, 400, "{body}");
    assert_eq!(
        body["message"],
        "strict decoding error: duplicate field \"metadata.name\""
    );
    let (code, body, headers) = send(&c, "POST", CM, "application/json", dup.to_vec()).await;
    assert_eq!(code, 201, "{body}");
    let warning = headers
        .get("warning")
        .map(|w| w.to_str().unwrap().to_string());
    assert!(
        warning
            .as_deref()
            .is_some_and(|w| w.contains("duplicate field")),
        "{warning:?}"
    );

    let (code, body, _) = send(
        &c,
        "POST",
        CM,
        "text/plain",
        configmap("t").to_string().into(),
    )
    .await;
    assert_eq!(code, 415, "{body}");
    let (code, body) = post(&c, &format!("{CM}?fieldValidation=Bogus"), &configmap("b")).await;
    assert_eq!(code, 422, "{body}");
    assert!(body["message"].as_str().unwrap().starts_with("CreateOptions.meta.k8s.io \"\" is invalid: fieldValidation: Unsupported value: \"Bogus\""), "{body}");
    let (code, body) = post(&c, &format!("{CM}?dryRun=Sometimes"), &configmap("b")).await;
    assert_eq!(code, 422, "{body}");
    let (code, body, _) = send(
        &c,
        "PATCH",
        &format!("{CM}/new"),
        "application/apply-patch+yaml",
        configmap("new").to_string().into(),
    )
    .await;
    assert_eq!(code, 422, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("fieldManager: Required value: is required for apply patch"),
        "{body}"
    );

    for q in ["resourceVersion=-5&watch=true", "resourceVersion=garbage"] {
        let (code, body, _) =
            send(&c, "GET", &format!("{CM}?{q}"), "application/json", vec![]).await;
        assert_eq!(code, 400, "{q}: {body}");
    }
    let (code, body, _) = send(
        &c,
        "GET",
        &format!("{CM}?resourceVersionMatch=Exact"),
        "application/json",
        vec![],
    )
    .await;
    assert_eq!(code, 422, "{body}");
    // An exact list shows the state at that revision.
    let (_, first) = post(&c, CM, &configmap("e1")).await;
    let rv = first["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    post(&c, CM, &configmap("e2")).await;
    let (code, list, _) = send(
        &c,
        "GET",
        &format!("{CM}?resourceVersion={rv}&resourceVersionMatch=Exact"),
        "application/json",
        vec![],
    )
    .await;
    assert_eq!(code, 200, "{list}");
    let names: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"e1") && !names.contains(&"e2"), "{names:?}");
}
