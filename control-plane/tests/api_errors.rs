//! Bad inputs and authorization negatives: every one answered with the
//! upstream status code and a Status object, none of them harming the server.

use crate::api;

use api::{fails, ok, raw, TestServer, USER_TOKEN};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_inputs_get_upstream_status_codes() {
    let s = TestServer::start().await;
    let c = s.client().await;
    let pods = "/api/v1/namespaces/default/pods";

    let (code, _, body) = raw(&c, "POST", pods, "application/json", b"{not json".to_vec()).await;
    assert_eq!(code, 400, "{body}");
    assert_eq!(body["kind"], "Status");
    assert_eq!(body["reason"], "BadRequest");

    let (code, _, body) = raw(
        &c,
        "POST",
        pods,
        "application/yaml",
        b"a: [unclosed".to_vec(),
    )
    .await;
    assert_eq!(code, 400, "{body}");

    let (code, _, body) = raw(&c, "POST", pods, "application/json", b"[1,2]".to_vec()).await;
    assert_eq!(code, 400, "{body}");

    let big = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "big"}, "data": {"x": "a".repeat(4 * 1024 * 1024)}});
    let (code, _, body) = raw(
        &c,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        "application/json",
        serde_json::to_vec(&big).unwrap(),
    )
    .await;
    assert_eq!(code, 413, "{}", body["message"]);

    let (code, _, body) = raw(
        &c,
        "GET",
        "/api/v1/namespaces/default/widgets",
        "application/json",
        vec![],
    )
    .await;
    assert_eq!(code, 404, "{body}");
    let (code, _, _) = raw(
        &c,
        "GET",
        "/apis/nope.example.com/v1/things",
        "application/json",
        vec![],
    )
    .await;
    assert_eq!(code, 404);
    let err = fails(s.kubectl(&["get", "widgets"]));
    assert!(err.contains("doesn't have a resource type"), "{err}");

    let invalid = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "inv"}, "spec": {"containers": [{"name": "c"}]}});
    let (code, _, body) = raw(
        &c,
        "POST",
        pods,
        "application/json",
        serde_json::to_vec(&invalid).unwrap(),
    )
    .await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(body["reason"], "Invalid");
    assert_eq!(
        body["details"]["causes"][0]["field"],
        "spec.containers[0].image"
    );
    let err = fails(s.kubectl_stdin(&["create", "-f", "-"], &invalid.to_string()));
    assert!(
        err.contains("spec.containers[0].image: Required value"),
        "{err}"
    );

    let bad_name =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "Bad_Name"}});
    let (code, _, _) = raw(
        &c,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        "application/json",
        serde_json::to_vec(&bad_name).unwrap(),
    )
    .await;
    assert_eq!(code, 422);

    let wrong_type = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "wt"}, "spec": {"containers": "nope"}});
    let (code, _, _) = raw(
        &c,
        "POST",
        pods,
        "application/json",
        serde_json::to_vec(&wrong_type).unwrap(),
    )
    .await;
    assert_eq!(code, 400);

    // fieldValidation: Strict refuses unknown fields, Warn answers a Warning.
    let unknown =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "unk"}, "bogus": 1});
    let (code, _, body) = raw(
        &c,
        "POST",
        "/api/v1/namespaces/default/configmaps?fieldValidation=Strict",
        "application/json",
        serde_json::to_vec(&unknown).unwrap(),
    )
    .await;
    assert_eq!(code, 400, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("unknown field \"bogus\""),
        "{body}"
    );
    let (code, headers, _) = raw(
        &c,
        "POST",
        "/api/v1/namespaces/default/configmaps?fieldValidation=Warn",
        "application/json",
        serde_json::to_vec(&unknown).unwrap(),
    )
    .await;
    assert_eq!(code, 201);
    assert!(headers
        .get("warning")
        .unwrap()
        .to_str()
        .unwrap()
        .contains("unknown field"));
    let err = fails(s.kubectl_stdin(
        &["create", "-f", "-"],
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: unk2}\nbogus: 1\n",
    ));
    assert!(err.contains("unknown field"), "{err}");

    // Patches: wrong media type, malformed patch, a JSON patch that fails.
    ok(s.kubectl_stdin(
        &["create", "-f", "-"],
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: pt}\n",
    ));
    let cm = "/api/v1/namespaces/default/configmaps/pt";
    let (code, _, _) = raw(&c, "PATCH", cm, "text/plain", b"{}".to_vec()).await;
    assert_eq!(code, 415);
    let (code, _, _) = raw(
        &c,
        "PATCH",
        cm,
        "application/merge-patch+json",
        b"{oops".to_vec(),
    )
    .await;
    assert_eq!(code, 400);
    let (code, _, _) = raw(
        &c,
        "PATCH",
        cm,
        "application/json-patch+json",
        br#"[{"op":"remove","path":"/nope"}]"#.to_vec(),
    )
    .await;
    assert_eq!(code, 422);
    let (code, _, _) = raw(
        &c,
        "PUT",
        cm,
        "application/json",
        serde_json::to_vec(
            &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "other"}}),
        )
        .unwrap(),
    )
    .await;
    assert_eq!(code, 400, "name mismatch");
    let (code, _, _) = raw(
        &c,
        "GET",
        "/api/v1/namespaces/default/configmaps?labelSelector=a%20in%20(b",
        "application/json",
        vec![],
    )
    .await;
    assert_eq!(code, 400);

    // The server is still fine.
    let (code, _, body) = raw(&c, "GET", "/readyz?verbose", "application/json", vec![]).await;
    assert_eq!(code, 200);
    assert!(body.as_str().unwrap().contains("[+]sqlite ok"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn authentication_and_authorization_negatives() {
    let s = TestServer::start().await;
    let admin = s.client().await;

    // Anonymous: 401 with a Status (health stays public).
    let anon = s.anonymous_client().await;
    let (code, _, body) = raw(
        &anon,
        "GET",
        "/api/v1/namespaces/default/pods",
        "application/json",
        vec![],
    )
    .await;
    assert_eq!(code, 401, "{body}");
    assert_eq!(body["reason"], "Unauthorized");
    let (code, _, _) = raw(&anon, "GET", "/healthz", "application/json", vec![]).await;
    assert_eq!(code, 200);
    let bogus = s.token_client("not-a-token").await;
    let (code, _, _) = raw(&bogus, "GET", "/api/v1/pods", "application/json", vec![]).await;
    assert_eq!(code, 401);

    // A known token authenticates; discovery is allowed, pods are not.
    let tok = s.token_client(USER_TOKEN).await;
    let (code, _, _) = raw(&tok, "GET", "/api/v1", "application/json", vec![]).await;
    assert_eq!(code, 200);
    let (code, _, body) = raw(
        &tok,
        "GET",
        "/api/v1/namespaces/default/pods",
        "application/json",
        vec![],
    )
    .await;
    assert_eq!(code, 403, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("User \"token-user\" cannot list resource \"pods\""),
        "{body}"
    );

    // Unbound certificate user: 403, and a RoleBinding lets them in.
    let bob_cfg = s.kubeconfig_for("bob", &[]);
    let err = fails(s.kubectl_as(&bob_cfg, &["get", "pods"], None));
    assert!(
        err.contains("Forbidden") && err.contains("\"bob\""),
        "{err}"
    );
    ok(s.kubectl_stdin(&["apply", "-f", "-"], "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: bob-view, namespace: default}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: view}\nsubjects: [{kind: User, name: bob}]\n"));
    let bob = s.client_from(&bob_cfg).await;
    let allowed = api::eventually(std::time::Duration::from_secs(5), || {
        let bob = bob.clone();
        async move {
            raw(
                &bob,
                "GET",
                "/api/v1/namespaces/default/pods",
                "application/json",
                vec![],
            )
            .await
            .0 == 200
        }
    })
    .await;
    assert!(allowed, "the RoleBinding took effect");
    // kubectl auth can-i asks the same authorizers (protobuf SelfSubjectAccessReview).
    let can = |args: &[&str]| s.kubectl_as(&bob_cfg, args, None);
    let out = can(&["auth", "can-i", "list", "pods", "-n", "default"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "yes",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = can(&["auth", "can-i", "delete", "pods", "-n", "default"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "no");
    assert_eq!(
        ok(s.kubectl(&["auth", "can-i", "delete", "nodes"])).trim(),
        "yes"
    );
    let (code, _, _) = raw(
        &bob,
        "GET",
        "/api/v1/namespaces/kube-system/pods",
        "application/json",
        vec![],
    )
    .await;
    assert_eq!(code, 403, "view is bound in default only");
    let (code, _, _) = raw(
        &bob,
        "GET",
        "/api/v1/namespaces/default/secrets",
        "application/json",
        vec![],
    )
    .await;
    assert_eq!(code, 403, "view does not read secrets");
    let (code, _, _) = raw(
        &bob,
        "DELETE",
        "/api/v1/namespaces/default/pods/x",
        "application/json",
        vec![],
    )
    .await;
    assert_eq!(code, 403, "view does not delete");

    // Nodes: their own Node and pods only.
    for n in ["node-a", "node-b"] {
        ok(s.kubectl_stdin(
            &["create", "-f", "-"],
            &format!("apiVersion: v1\nkind: Node\nmetadata: {{name: {n}}}\n"),
        ));
    }
    let node_a = s.client_for("system:node:node-a", &["system:nodes"]).await;
    let status = serde_json::to_vec(&json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ok"}]}})).unwrap();
    let (code, _, body) = raw(
        &node_a,
        "PATCH",
        "/api/v1/nodes/node-a/status",
        "application/strategic-merge-patch+json",
        status.clone(),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let (code, _, body) = raw(
        &node_a,
        "PATCH",
        "/api/v1/nodes/node-b/status",
        "application/strategic-merge-patch+json",
        status.clone(),
    )
    .await;
    assert_eq!(code, 403, "node A writing node B's status: {body}");
    let (code, _, _) = raw(
        &node_a,
        "GET",
        "/api/v1/nodes/node-b",
        "application/json",
        vec![],
    )
    .await;
    assert_eq!(code, 200, "nodes may read other nodes");
    let out = ok(s.kubectl(&["get", "nodes"]));
    assert!(
        out.lines()
            .any(|l| l.starts_with("node-a") && l.contains(" Ready")),
        "{out}"
    );

    for (pod, node) in [("on-a", "node-a"), ("on-b", "node-b")] {
        ok(s.kubectl_stdin(&["create", "-f", "-"], &format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: {pod}}}\nspec:\n  nodeName: {node}\n  volumes: [{{name: s, secret: {{secretName: sec-{node}}}}}]\n  containers: [{{name: c, image: i:1}}]\n")));
        ok(s.kubectl_stdin(&["apply", "-f", "-"], &format!("apiVersion: v1\nkind: Secret\nmetadata: {{name: sec-{node}}}\nstringData: {{k: v}}\n")));
    }
    let running = serde_json::to_vec(&json!({"status": {"phase": "Running"}})).unwrap();
    let (code, _, body) = raw(
        &node_a,
        "PATCH",
        "/api/v1/namespaces/default/pods/on-a/status",
        "application/merge-patch+json",
        running.clone(),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let (code, _, _) = raw(
        &node_a,
        "PATCH",
        "/api/v1/namespaces/default/pods/on-b/status",
        "application/merge-patch+json",
        running,
    )
    .await;
    assert_eq!(code, 403, "node A writing a pod bound to node B");
    let (code, _, _) = raw(
        &node_a,
        "GET",
        "/api/v1/namespaces/default/secrets/sec-node-a",
        "application/json",
        vec![],
    )
    .await;
    assert_eq!(code, 200, "a secret its pod uses");
    let (code, _, _) = raw(
        &node_a,
        "GET",
        "/api/v1/namespaces/default/secrets/sec-node-b",
        "application/json",
        vec![],
    )
    .await;
    assert_eq!(code, 403, "another node's secret");
    let (code, _, _) = raw(
        &node_a,
        "DELETE",
        "/api/v1/namespaces/default/pods/on-b",
        "application/json",
        vec![],
    )
    .await;
    assert_eq!(code, 403);
    let (code, _, _) = raw(
        &admin,
        "GET",
        "/api/v1/namespaces/default/pods/on-b",
        "application/json",
        vec![],
    )
    .await;
    assert_eq!(code, 200, "still there");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn health_metrics_discovery_and_openapi() {
    let s = TestServer::start().await;
    let c = s.client().await;
    for p in ["/healthz", "/livez", "/readyz"] {
        let (code, _, body) = raw(&c, "GET", p, "application/json", vec![]).await;
        assert_eq!((code, body.as_str()), (200, Some("ok")), "{p}");
    }
    let (_, _, body) = raw(&c, "GET", "/livez?verbose", "application/json", vec![]).await;
    assert!(body.as_str().unwrap().contains("[+]ping ok"));
    ok(s.kubectl(&["get", "pods"]));
    let (code, _, body) = raw(&c, "GET", "/metrics", "application/json", vec![]).await;
    assert_eq!(code, 200);
    let text = body.as_str().unwrap();
    // prometheus-client writes the bucket's `le` before the family's labels.
    assert!(text.contains("apiserver_request_duration_seconds_bucket{le=\"+Inf\",verb=\"LIST\",resource=\"pods\",code=\"200\"}"), "{text}");
    assert!(text.contains("apiserver_request_total"));
    assert!(text.contains("apiserver_current_watchers"));
    assert!(text.contains(
        "skiff_store_operation_duration_seconds_count{backend=\"sqlite\",operation=\"list\"}"
    ));
    let out = ok(s.kubectl(&["api-resources"]));
    for r in [
        "pods",
        "deployments",
        "endpointslices",
        "clusterrolebindings",
        "leases",
    ] {
        assert!(out.contains(r), "{out}");
    }
    // Aggregated discovery when asked for it.
    let req = http::Request::get("/apis")
        .header(
            "accept",
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json",
        )
        .body(kube::client::Body::empty())
        .unwrap();
    let resp = c.send(req).await.unwrap();
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .contains("apidiscovery.k8s.io"));
    let (code, _, body) = raw(&c, "GET", "/openapi/v3", "application/json", vec![]).await;
    assert_eq!(code, 200);
    assert!(body["paths"]["apis/apps/v1"]["serverRelativeURL"].is_string());
    let out = ok(s.kubectl(&["explain", "deployment.spec.replicas"]));
    assert!(out.contains("replicas"), "{out}");
    let out = ok(s.kubectl(&["version", "-o", "json"]));
    assert!(out.contains("serverVersion"), "{out}");
}

/// Garbage in every shape a client could send: never a 5xx, never a crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn garbage_never_breaks_the_server() {
    let s = TestServer::start().await;
    let c = s.client().await;
    let deep = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
    let bodies: Vec<Vec<u8>> = vec![
        vec![],
        b"null".to_vec(),
        b"\"str\"".to_vec(),
        b"{\"metadata\":\"x\"}".to_vec(),
        b"{\"metadata\":{\"name\":[1]}}".to_vec(),
        b"{\"apiVersion\":5,\"kind\":{}}".to_vec(),
        b"{\"metadata\":{\"name\":\"ok\",\"labels\":{\"a\":5}},\"spec\":\"nope\"}".to_vec(),
        b"{\"metadata\":{\"name\":\"ok2\"},\"spec\":{\"containers\":[{\"name\":\"c\",\"image\":\"i\",\"ports\":[{\"containerPort\":1e99}]}]}}".to_vec(),
        deep.into_bytes(),
        (0..=255u8).cycle().take(10_000).collect(),
        b"k8s\0\x0a\x05\x0a\x02v1\x12".to_vec(),
        b"k8s\0\x12\xff\xff\xff\xff\x0f".to_vec(),
    ];
    let paths = [
        "/api/v1/namespaces/default/pods",
        "/api/v1/namespaces/default/pods/ok",
        "/api/v1/namespaces/default/pods/ok/status",
        "/api/v1/namespaces/default/pods/ok/binding",
        "/api/v1/namespaces/default/pods/ok/eviction",
        "/apis/apps/v1/namespaces/default/deployments/ok/scale",
        "/api/v1/namespaces/ok/finalize",
        "/api/v1/nodes",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        "/api/v1/namespaces/default/pods?labelSelector=%%%&fieldSelector=(",
        "/api/v1/namespaces/default/pods?limit=-1&continue=%00",
        "/api/v1/namespaces/default/pods?watch=true&resourceVersion=abc",
        "/api/v1/namespaces/default/pods/ok?gracePeriodSeconds=x",
        "/api/v1/namespaces//pods",
        "/apis/apps/v1/namespaces/default/deployments/ok/status/extra",
        "/openapi/v3/../../etc/passwd",
    ];
    let types = [
        "application/json",
        "application/yaml",
        "application/vnd.kubernetes.protobuf",
        "application/merge-patch+json",
        "application/json-patch+json",
        "application/strategic-merge-patch+json",
        "application/apply-patch+yaml",
    ];
    for path in paths {
        for method in ["GET", "POST", "PUT", "PATCH", "DELETE"] {
            for (i, body) in bodies.iter().enumerate() {
                let ct = types[i % types.len()];
                let (code, _, resp) = raw(&c, method, path, ct, body.clone()).await;
                assert!(
                    code < 500 || code == 503,
                    "{method} {path} ({ct}, body {i}) -> {code}: {resp}"
                );
            }
        }
    }
    let (code, _, _) = raw(&c, "GET", "/readyz", "application/json", vec![]).await;
    assert_eq!(code, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_service_takes_no_cluster_ip() {
    let s = TestServer::start().await;
    let c = s.client().await;
    let services = "/api/v1/namespaces/default/services";
    let svc = |name: &str, node_port: i64| {
        serde_json::to_vec(
            &json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
            "spec": {"type": "NodePort", "clusterIP": "198.19.77.7",
                "ports": [{"port": 80, "nodePort": node_port}]}}),
        )
        .unwrap()
    };
    // The NodePort is out of range: refused after the ClusterIP was taken,
    // which must go back to the pool with the refusal.
    let (code, _, body) = raw(&c, "POST", services, "application/json", svc("a", 80)).await;
    assert_eq!(code, 422, "{body}");
    let (code, _, body) = raw(&c, "POST", services, "application/json", svc("b", 30080)).await;
    assert_eq!(code, 201, "the refused service kept its ClusterIP: {body}");
}
