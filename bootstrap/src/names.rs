//! Well-known names of node bootstrap, as upstream spells them (see
//! `k8s.io/cluster-bootstrap/token/api` and `k8s.io/api/certificates/v1`).

/// Namespace of the bootstrap token Secrets.
pub const TOKEN_NAMESPACE: &str = "kube-system";
/// A bootstrap token Secret is named this followed by the token id.
pub const TOKEN_SECRET_PREFIX: &str = "bootstrap-token-";
/// The Secret type of bootstrap tokens.
pub const TOKEN_SECRET_TYPE: &str = "bootstrap.kubernetes.io/token";

/// Keys of a bootstrap token Secret's data.
pub const KEY_TOKEN_ID: &str = "token-id";
pub const KEY_TOKEN_SECRET: &str = "token-secret";
/// RFC 3339 time after which the token is invalid (and the token cleaner
/// deletes it); absent means never.
pub const KEY_EXPIRATION: &str = "expiration";
pub const KEY_DESCRIPTION: &str = "description";
/// `"true"` lets the token authenticate against the API.
pub const KEY_USAGE_AUTHENTICATION: &str = "usage-bootstrap-authentication";
/// Comma-separated groups beyond [`BOOTSTRAP_GROUP`]; each must start with
/// `system:bootstrappers:`.
pub const KEY_EXTRA_GROUPS: &str = "auth-extra-groups";

/// A bootstrap token authenticates as this followed by its id.
pub const BOOTSTRAP_USER_PREFIX: &str = "system:bootstrap:";
/// Every bootstrap token's group.
pub const BOOTSTRAP_GROUP: &str = "system:bootstrappers";
/// The extra group `skiff-server token create` gives its tokens (kubeadm's
/// is `system:bootstrappers:kubeadm:default-node-token`).
pub const DEFAULT_TOKEN_GROUP: &str = "system:bootstrappers:skiff:default-node-token";

/// Node identities: user `system:node:<name>` in group `system:nodes`.
pub const NODE_USER_PREFIX: &str = "system:node:";
pub const NODES_GROUP: &str = "system:nodes";

/// Signer of the node's client certificate (kubelet client, CN
/// `system:node:<name>`, O `system:nodes`).
pub const SIGNER_KUBELET_CLIENT: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// Signer of the node server's serving certificate.
pub const SIGNER_KUBELET_SERVING: &str = "kubernetes.io/kubelet-serving";
/// Signer of other API client certificates.
pub const SIGNER_API_CLIENT: &str = "kubernetes.io/kube-apiserver-client";

/// Unauthenticated path on the API server that serves the cluster CA
/// bundle (PEM), as k3s serves it. A joining node reads it before it has
/// any trust, and checks it against the join token's hash.
pub const CA_PATH: &str = "/cacerts";

/// The user name of node `name`.
pub fn node_user(name: &str) -> String {
    format!("{NODE_USER_PREFIX}{name}")
}
