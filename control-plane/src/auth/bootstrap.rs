//! Default RBAC objects created at first start (upstream's bootstrap
//! policy, trimmed to the resources this server serves).

use serde_json::{json, Value};

fn role(name: &str, rules: Value) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
                     "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"}},
        "rules": rules,
    })
}

fn binding(name: &str, role: &str, subjects: Value) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
                     "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": subjects,
    })
}

fn group(name: &str) -> Value {
    json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": name})
}

fn user(name: &str) -> Value {
    json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": name})
}

const RW: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];
const RO: &[&str] = &["get", "list", "watch"];

/// Cluster roles, then cluster role bindings.
pub fn cluster_roles() -> Vec<Value> {
    let workloads = json!([
        {"apiGroups": [""], "resources": ["pods", "pods/attach", "pods/exec", "pods/portforward", "pods/proxy", "pods/eviction", "services", "endpoints", "configmaps", "secrets", "serviceaccounts", "events", "persistentvolumeclaims", "replicationcontrollers", "replicationcontrollers/scale", "pods/ephemeralcontainers"], "verbs": RW},
        {"apiGroups": [""], "resources": ["pods/log", "pods/status", "namespaces", "namespaces/status", "services/status"], "verbs": RO},
        {"apiGroups": [""], "resources": ["resourcequotas", "resourcequotas/status"], "verbs": RO},
        {"apiGroups": [""], "resources": ["limitranges"], "verbs": RO},
        {"apiGroups": ["apps"], "resources": ["deployments", "deployments/scale", "replicasets", "replicasets/scale", "daemonsets", "statefulsets", "statefulsets/scale", "controllerrevisions"], "verbs": RW},
        {"apiGroups": ["batch"], "resources": ["jobs", "cronjobs"], "verbs": RW},
        {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": RW},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": RW},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": RO},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": RO},
    ]);
    let mut admin = workloads.clone();
    if let Some(a) = admin.as_array_mut() {
        a.push(json!({"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles", "rolebindings"], "verbs": RW}));
    }
    let view = json!([
        {"apiGroups": [""], "resources": ["pods", "pods/log", "pods/status", "services", "services/status", "endpoints", "configmaps", "serviceaccounts", "events", "namespaces", "namespaces/status", "persistentvolumeclaims", "replicationcontrollers", "replicationcontrollers/scale", "replicationcontrollers/status"], "verbs": RO},
        {"apiGroups": [""], "resources": ["resourcequotas", "resourcequotas/status"], "verbs": RO},
        {"apiGroups": [""], "resources": ["limitranges"], "verbs": RO},
        {"apiGroups": ["apps"], "resources": ["deployments", "deployments/scale", "deployments/status", "replicasets", "replicasets/scale", "replicasets/status", "daemonsets", "daemonsets/status", "statefulsets", "statefulsets/scale", "statefulsets/status", "controllerrevisions"], "verbs": RO},
        {"apiGroups": ["batch"], "resources": ["jobs", "jobs/status", "cronjobs", "cronjobs/status"], "verbs": RO},
        {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets", "poddisruptionbudgets/status"], "verbs": RO},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": RO},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": RO},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": RO},
    ]);
    let discovery_urls = json!([
        "/api",
        "/api/*",
        "/apis",
        "/apis/*",
        "/healthz",
        "/livez",
        "/readyz",
        "/openapi",
        "/openapi/*",
        "/version",
        "/version/"
    ]);
    vec![
        role(
            "cluster-admin",
            json!([
                {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                {"nonResourceURLs": ["*"], "verbs": ["*"]},
            ]),
        ),
        role("admin", admin),
        role("edit", workloads),
        role("view", view),
        role(
            "system:discovery",
            json!([{"nonResourceURLs": discovery_urls, "verbs": ["get"]}]),
        ),
        role(
            "system:basic-user",
            json!([
                {"apiGroups": ["authorization.k8s.io"], "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"], "verbs": ["create"]},
                {"apiGroups": ["authentication.k8s.io"], "resources": ["selfsubjectreviews"], "verbs": ["create"]},
            ]),
        ),
        role(
            "system:service-account-issuer-discovery",
            json!([{"nonResourceURLs": ["/.well-known/openid-configuration", "/.well-known/openid-configuration/", "/openid/v1/jwks", "/openid/v1/jwks/"], "verbs": ["get"]}]),
        ),
        role(
            "system:public-info-viewer",
            json!([{"nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version", "/version/", skiff_bootstrap::names::CA_PATH], "verbs": ["get"]}]),
        ),
        role(
            "system:node",
            json!([
                {"apiGroups": [""], "resources": ["nodes", "nodes/status"], "verbs": ["create", "get", "list", "watch", "patch", "update", "delete"]},
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "create", "delete"]},
                {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch", "update"]},
                {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
                {"apiGroups": [""], "resources": ["services", "endpoints"], "verbs": RO},
                {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch", "update"]},
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create", "delete", "get", "patch", "update"]},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": RO},
                {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
                {"apiGroups": [""], "resources": ["persistentvolumeclaims", "persistentvolumes"], "verbs": ["get"]},
                {"apiGroups": [""], "resources": ["persistentvolumeclaims/status"], "verbs": ["get", "patch", "update"]},
                // The agent reads a pod's RuntimeClass for its CRI handler.
                {"apiGroups": ["node.k8s.io"], "resources": ["runtimeclasses"], "verbs": RO},
            ]),
        ),
        // What the scheduler's volume binding writes: the selected node on
        // a claim, a pre-bound PV's claimRef.
        role(
            "system:volume-scheduler",
            json!([
                {"apiGroups": [""], "resources": ["persistentvolumes", "persistentvolumeclaims"], "verbs": ["get", "list", "watch", "patch", "update"]},
                {"apiGroups": ["storage.k8s.io"], "resources": ["storageclasses", "csinodes", "csidrivers"], "verbs": RO},
            ]),
        ),
        role(
            "system:kube-scheduler",
            json!([
                {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch", "update"]},
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create", "get", "list", "watch", "update"]},
                {"apiGroups": [""], "resources": ["nodes", "namespaces", "services", "persistentvolumeclaims", "persistentvolumes", "replicationcontrollers"], "verbs": RO},
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["delete", "get", "list", "watch"]},
                {"apiGroups": [""], "resources": ["bindings", "pods/binding"], "verbs": ["create"]},
                {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch", "update"]},
                {"apiGroups": ["apps"], "resources": ["replicasets", "statefulsets"], "verbs": RO},
                {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": RO},
            ]),
        ),
        // One identity for all controllers (upstream runs each with its own
        // service account); narrow this when the controllers get their own.
        role(
            "system:kube-controller-manager",
            json!([
                {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
            ]),
        ),
        // Node certificates the csrapproving controller approves: it asks
        // (SubjectAccessReview) whether the requester may create these
        // pseudo-subresources, as upstream's approver does.
        role(
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            json!([{"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests/nodeclient"], "verbs": ["create"]}]),
        ),
        role(
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            json!([{"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests/selfnodeclient"], "verbs": ["create"]}]),
        ),
        // Tokens of `skiff-server token create` join nodes; renewals of
        // every node's own client certificate go through (kubeadm's
        // node-autoapprove-bootstrap and -certificate-rotation bindings).
        binding(
            "skiff:node-autoapprove-bootstrap",
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            json!([group(skiff_bootstrap::names::DEFAULT_TOKEN_GROUP)]),
        ),
        // Tokens in the servers' group join servers: they are handed the
        // cluster's CAs and keys (see `store::managed::join`).
        role(
            "skiff:server-join",
            json!([{"nonResourceURLs": [crate::store::managed::join::PATH], "verbs": ["post"]}]),
        ),
        binding(
            "skiff:server-join",
            "skiff:server-join",
            json!([group(crate::store::managed::join::SERVERS_GROUP)]),
        ),
        binding(
            "skiff:node-autoapprove-certificate-rotation",
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            json!([group(skiff_bootstrap::names::NODES_GROUP)]),
        ),
        binding(
            "cluster-admin",
            "cluster-admin",
            json!([group("system:masters")]),
        ),
        binding(
            "system:discovery",
            "system:discovery",
            json!([group("system:authenticated")]),
        ),
        binding(
            "system:basic-user",
            "system:basic-user",
            json!([group("system:authenticated")]),
        ),
        // Upstream binds only system:serviceaccounts; relying parties
        // outside the cluster (cloud IAM, Vault) fetch these documents
        // without credentials, so they are public here, as k3s users
        // usually make them.
        binding(
            "system:service-account-issuer-discovery",
            "system:service-account-issuer-discovery",
            json!([
                group("system:authenticated"),
                group("system:unauthenticated")
            ]),
        ),
        binding(
            "system:public-info-viewer",
            "system:public-info-viewer",
            json!([
                group("system:authenticated"),
                group("system:unauthenticated")
            ]),
        ),
        binding(
            "system:kube-scheduler",
            "system:kube-scheduler",
            json!([user("system:kube-scheduler")]),
        ),
        binding(
            "system:volume-scheduler",
            "system:volume-scheduler",
            json!([user("system:kube-scheduler")]),
        ),
        binding(
            "system:kube-controller-manager",
            "system:kube-controller-manager",
            json!([user("system:kube-controller-manager")]),
        ),
    ]
}
