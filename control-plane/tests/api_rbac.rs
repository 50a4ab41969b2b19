//! RBAC through the API: nobody grants permissions they do not hold
//! (upstream's escalation check on Roles, ClusterRoles and bindings), the
//! `bind` and `escalate` verbs, aggregation rules, and rule validation.

use crate::api;

use std::time::Duration;

use api::{eventually, raw, TestServer};
use serde_json::{json, Value};

const RBAC: &str = "/apis/rbac.authorization.k8s.io/v1";

async fn post(c: &kube::Client, path: &str, obj: Value) -> (u16, Value) {
    let (code, _, body) = raw(c, "POST", path, "application/json", obj.to_string().into()).await;
    (code, body)
}

fn role(name: &str, rules: Value) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
           "metadata": {"name": name}, "rules": rules})
}

fn binding(kind: &str, name: &str, role_kind: &str, role: &str, user: &str) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": {"name": name},
           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
           "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": user}]})
}

fn message(body: &Value) -> &str {
    body["message"].as_str().unwrap_or_default()
}

/// Wait until the authorizer's copy of RBAC shows a new grant.
async fn until_allowed(c: &kube::Client, path: &str) {
    let granted = eventually(Duration::from_secs(5), || async {
        raw(c, "GET", path, "application/json", vec![]).await.0 != 403
    })
    .await;
    assert!(granted, "GET {path} never became allowed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nobody_grants_what_they_do_not_hold() {
    let s = TestServer::start().await;
    let admin = s.client().await;
    let (code, body) = post(
        &admin,
        "/api/v1/namespaces",
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}}),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let team = |r: &str| format!("{RBAC}/namespaces/team/{r}");
    // alice may create and read roles and bindings in team, and read
    // configmaps there; nothing else.
    let writer = role(
        "rbac-writer",
        json!([{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles", "rolebindings"], "verbs": ["create", "get"]},
               {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]),
    );
    assert_eq!(post(&admin, &team("roles"), writer).await.0, 201);
    let b = binding(
        "RoleBinding",
        "alice-writer",
        "Role",
        "rbac-writer",
        "alice",
    );
    assert_eq!(post(&admin, &team("rolebindings"), b).await.0, 201);
    let alice = s.client_for("alice", &["system:authenticated"]).await;
    until_allowed(&alice, &team("roles/rbac-writer")).await;

    // The report's two escalations: binding cluster-admin to herself, and a
    // Role with everything.
    let (code, body) = post(
        &alice,
        &team("rolebindings"),
        binding(
            "RoleBinding",
            "mine",
            "ClusterRole",
            "cluster-admin",
            "alice",
        ),
    )
    .await;
    assert_eq!(code, 403, "{body}");
    assert!(
        message(&body).starts_with(
            "rolebindings.rbac.authorization.k8s.io \"mine\" is forbidden: user \"alice\" (groups=[\"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:\n"
        ),
        "{body}"
    );
    let all = role(
        "all",
        json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]),
    );
    let (code, body) = post(&alice, &team("roles"), all.clone()).await;
    assert_eq!(code, 403, "{body}");
    assert!(
        message(&body).contains("{APIGroups:[\"*\"], Resources:[\"*\"], Verbs:[\"*\"]}"),
        "{body}"
    );
    let (code, _, _) = raw(
        &alice,
        "GET",
        "/api/v1/namespaces/team/secrets",
        "application/json",
        vec![],
    )
    .await;
    assert_eq!(code, 403);

    // What she holds she may pass on: a role with it, and a binding of it.
    let reader = role(
        "cm-reader",
        json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]),
    );
    let (code, body) = post(&alice, &team("roles"), reader).await;
    assert_eq!(code, 201, "{body}");
    let (code, body) = post(
        &alice,
        &team("rolebindings"),
        binding("RoleBinding", "bob-reader", "Role", "cm-reader", "bob"),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    // A binding of a role that does not exist: nothing to compare with.
    let (code, body) = post(
        &alice,
        &team("rolebindings"),
        binding("RoleBinding", "ghost", "Role", "no-such-role", "bob"),
    )
    .await;
    assert_eq!(code, 404, "{body}");

    // `bind` on one ClusterRole lets her bind exactly that one; `escalate`
    // on roles lets her write any role.
    let grants = role(
        "grants",
        json!([{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["bind"], "resourceNames": ["view"]},
               {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["escalate"]}]),
    );
    assert_eq!(post(&admin, &team("roles"), grants).await.0, 201);
    let b = binding("RoleBinding", "alice-grants", "Role", "grants", "alice");
    assert_eq!(post(&admin, &team("rolebindings"), b).await.0, 201);
    let bound = eventually(Duration::from_secs(5), || async {
        let b = binding("RoleBinding", "bob-view", "ClusterRole", "view", "bob");
        post(&alice, &team("rolebindings"), b).await.0 == 201
    })
    .await;
    assert!(
        bound,
        "bind on clusterroles/view did not let alice bind view"
    );
    let (code, body) = post(
        &alice,
        &team("rolebindings"),
        binding("RoleBinding", "bob-edit", "ClusterRole", "edit", "bob"),
    )
    .await;
    assert_eq!(code, 403, "bind is on view only: {body}");
    let (code, body) = post(&alice, &team("roles"), all).await;
    assert_eq!(code, 201, "escalate lets her write any role: {body}");

    // system:masters may do anything.
    let b = binding(
        "ClusterRoleBinding",
        "root",
        "ClusterRole",
        "cluster-admin",
        "carol",
    );
    let (code, body) = post(&admin, &format!("{RBAC}/clusterrolebindings"), b).await;
    assert_eq!(code, 201, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn aggregation_rules_need_everything_and_rules_are_validated() {
    let s = TestServer::start().await;
    let admin = s.client().await;
    let clusterroles = format!("{RBAC}/clusterroles");
    // dave may create cluster roles, and holds nothing else.
    let creator = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "creator"},
        "rules": [{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["create", "get", "list"]}]});
    assert_eq!(post(&admin, &clusterroles, creator).await.0, 201);
    let b = binding(
        "ClusterRoleBinding",
        "dave",
        "ClusterRole",
        "creator",
        "dave",
    );
    assert_eq!(
        post(&admin, &format!("{RBAC}/clusterrolebindings"), b)
            .await
            .0,
        201
    );
    let dave = s.client_for("dave", &[]).await;
    until_allowed(&dave, &clusterroles).await;
    let aggregated = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "gatherer"},
        "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"gather": "me"}}]}, "rules": []});
    let (code, body) = post(&dave, &clusterroles, aggregated.clone()).await;
    assert_eq!(code, 403, "{body}");
    assert!(
        message(&body).contains("must have cluster-admin privileges to use the aggregationRule"),
        "{body}"
    );
    assert_eq!(post(&admin, &clusterroles, aggregated).await.0, 201);

    // Upstream's rule validation.
    let bad = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "bad"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": []},
                  {"nonResourceURLs": ["/healthz"], "verbs": ["get"]}]});
    let (code, body) = post(&admin, &format!("{RBAC}/namespaces/default/roles"), bad).await;
    assert_eq!(code, 422, "{body}");
    let fields: Vec<&str> = body["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["field"].as_str().unwrap())
        .collect();
    assert_eq!(
        fields,
        vec!["rules[0].verbs", "rules[1].nonResourceURLs"],
        "{body}"
    );
    let (code, body) = post(
        &admin,
        &format!("{RBAC}/clusterrolebindings"),
        binding("ClusterRoleBinding", "x", "Role", "r", "u"),
    )
    .await;
    assert_eq!(
        code, 422,
        "a cluster binding refers to a ClusterRole: {body}"
    );

    // roleRef is immutable.
    let b = binding("RoleBinding", "fixed", "ClusterRole", "view", "erin");
    let rb = format!("{RBAC}/namespaces/default/rolebindings");
    assert_eq!(post(&admin, &rb, b).await.0, 201);
    let mut changed = binding("RoleBinding", "fixed", "ClusterRole", "edit", "erin");
    changed["metadata"]["namespace"] = json!("default");
    let (code, _, body) = raw(
        &admin,
        "PUT",
        &format!("{rb}/fixed"),
        "application/json",
        changed.to_string().into(),
    )
    .await;
    assert_eq!(code, 422, "{body}");
    assert!(message(&body).contains("cannot change roleRef"), "{body}");
}
