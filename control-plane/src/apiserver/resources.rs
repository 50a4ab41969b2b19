//! The resource table: every kind the server serves, with what discovery,
//! storage and printing need to know about it.

/// One served resource (one group/version/plural).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResourceDef {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    pub categories: &'static [&'static str],
    /// Has a `/status` subresource: the main resource ignores status writes
    /// and the subresource ignores everything else (upstream's strategy split).
    pub status: bool,
    /// Has a `/scale` subresource.
    pub scale: bool,
}

const ALL: &[&str] = &["all"];
const NONE: &[&str] = &[];

#[allow(clippy::too_many_arguments)] // a table row, read column by column
const fn def(
    group: &'static str,
    kind: &'static str,
    plural: &'static str,
    singular: &'static str,
    namespaced: bool,
    short_names: &'static [&'static str],
    categories: &'static [&'static str],
    status: bool,
    scale: bool,
) -> ResourceDef {
    ResourceDef {
        group,
        version: "v1",
        kind,
        plural,
        singular,
        namespaced,
        short_names,
        categories,
        status,
        scale,
    }
}

/// Every served resource. Core (`""`) first: kubectl's RESTMapper prefers the
/// earlier group when two share a name (core `events` over `events.k8s.io`).
pub static RESOURCES: &[ResourceDef] = &[
    def(
        "",
        "Namespace",
        "namespaces",
        "namespace",
        false,
        &["ns"],
        NONE,
        true,
        false,
    ),
    def(
        "",
        "Node",
        "nodes",
        "node",
        false,
        &["no"],
        NONE,
        true,
        false,
    ),
    def("", "Pod", "pods", "pod", true, &["po"], ALL, true, false),
    def(
        "",
        "Service",
        "services",
        "service",
        true,
        &["svc"],
        ALL,
        true,
        false,
    ),
    def(
        "",
        "Endpoints",
        "endpoints",
        "endpoints",
        true,
        &["ep"],
        NONE,
        false,
        false,
    ),
    def(
        "",
        "ConfigMap",
        "configmaps",
        "configmap",
        true,
        &["cm"],
        NONE,
        false,
        false,
    ),
    def(
        "", "Secret", "secrets", "secret", true, NONE, NONE, false, false,
    ),
    def(
        "",
        "Event",
        "events",
        "event",
        true,
        &["ev"],
        NONE,
        false,
        false,
    ),
    def(
        "",
        "ServiceAccount",
        "serviceaccounts",
        "serviceaccount",
        true,
        &["sa"],
        NONE,
        false,
        false,
    ),
    def(
        "apps",
        "Deployment",
        "deployments",
        "deployment",
        true,
        &["deploy"],
        ALL,
        true,
        true,
    ),
    def(
        "apps",
        "ReplicaSet",
        "replicasets",
        "replicaset",
        true,
        &["rs"],
        ALL,
        true,
        true,
    ),
    def(
        "apps",
        "DaemonSet",
        "daemonsets",
        "daemonset",
        true,
        &["ds"],
        ALL,
        true,
        false,
    ),
    def("batch", "Job", "jobs", "job", true, NONE, ALL, true, false),
    def(
        "coordination.k8s.io",
        "Lease",
        "leases",
        "lease",
        true,
        NONE,
        NONE,
        false,
        false,
    ),
    def(
        "discovery.k8s.io",
        "EndpointSlice",
        "endpointslices",
        "endpointslice",
        true,
        NONE,
        NONE,
        false,
        false,
    ),
    def(
        "events.k8s.io",
        "Event",
        "events",
        "event",
        true,
        &["ev"],
        NONE,
        false,
        false,
    ),
    def(
        "rbac.authorization.k8s.io",
        "Role",
        "roles",
        "role",
        true,
        NONE,
        NONE,
        false,
        false,
    ),
    def(
        "rbac.authorization.k8s.io",
        "RoleBinding",
        "rolebindings",
        "rolebinding",
        true,
        NONE,
        NONE,
        false,
        false,
    ),
    def(
        "rbac.authorization.k8s.io",
        "ClusterRole",
        "clusterroles",
        "clusterrole",
        false,
        NONE,
        NONE,
        false,
        false,
    ),
    // Access reviews: asked, answered, never stored (`kubectl auth can-i`).
    def(
        "authorization.k8s.io",
        "SelfSubjectAccessReview",
        "selfsubjectaccessreviews",
        "selfsubjectaccessreview",
        false,
        NONE,
        NONE,
        false,
        false,
    ),
    def(
        "authorization.k8s.io",
        "SubjectAccessReview",
        "subjectaccessreviews",
        "subjectaccessreview",
        false,
        NONE,
        NONE,
        false,
        false,
    ),
    def(
        "rbac.authorization.k8s.io",
        "ClusterRoleBinding",
        "clusterrolebindings",
        "clusterrolebinding",
        false,
        NONE,
        NONE,
        false,
        false,
    ),
    // Node certificates: the agent's CSRs, approved by the csrapproving
    // controller (or `kubectl certificate approve`), signed by csrsigning.
    def(
        "certificates.k8s.io",
        "CertificateSigningRequest",
        "certificatesigningrequests",
        "certificatesigningrequest",
        false,
        &["csr"],
        NONE,
        true,
        false,
    ),
];

/// The verbs every resource supports.
pub const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

impl ResourceDef {
    /// `v1` or `apps/v1`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }
    /// The group as it appears in store keys (`core` for the legacy group).
    pub fn key_group(&self) -> &'static str {
        if self.group.is_empty() {
            "core"
        } else {
            self.group
        }
    }
    /// The resource whose keys hold this one's objects: events.k8s.io
    /// Events live with the core ones (see `convert`).
    fn storage(&self) -> (&'static str, &'static str) {
        if self.group == "events.k8s.io" {
            ("core", "events")
        } else {
            (self.key_group(), self.plural)
        }
    }

    /// `/registry/<group>/<plural>/[<ns>/]<name>`.
    pub fn key(&self, namespace: Option<&str>, name: &str) -> String {
        let (g, p) = self.storage();
        match namespace.filter(|_| self.namespaced) {
            Some(ns) => format!("/registry/{g}/{p}/{ns}/{name}"),
            None => format!("/registry/{g}/{p}/{name}"),
        }
    }
    /// Prefix of every key of this resource, or of one namespace's keys.
    pub fn prefix(&self, namespace: Option<&str>) -> String {
        let (g, p) = self.storage();
        match namespace.filter(|_| self.namespaced) {
            Some(ns) => format!("/registry/{g}/{p}/{ns}/"),
            None => format!("/registry/{g}/{p}/"),
        }
    }
    /// Subresources served for this resource, with the verbs each accepts.
    pub fn subresources(&self) -> Vec<(&'static str, &'static str, &'static [&'static str])> {
        let mut out: Vec<(&'static str, &'static str, &'static [&'static str])> = Vec::new();
        if self.status {
            out.push(("status", self.kind, &["get", "patch", "update"]));
        }
        if self.scale {
            out.push(("scale", "Scale", &["get", "patch", "update"]));
        }
        if self.group.is_empty() && self.plural == "pods" {
            out.push(("binding", "Binding", &["create"]));
            out.push(("eviction", "Eviction", &["create"]));
            out.push(("log", "Pod", &["get"]));
            out.push(("exec", "PodExecOptions", &["create", "get"]));
            out.push(("attach", "PodAttachOptions", &["create", "get"]));
            out.push(("portforward", "PodPortForwardOptions", &["create", "get"]));
        }
        if self.group.is_empty() && self.plural == "namespaces" {
            out.push(("finalize", "Namespace", &["update"]));
        }
        if self.is("certificates.k8s.io", "certificatesigningrequests") {
            out.push(("approval", self.kind, &["get", "patch", "update"]));
        }
        out
    }
    /// Access reviews are computed per request, not stored.
    pub fn is_review(&self) -> bool {
        self.group == "authorization.k8s.io"
    }

    /// The verbs discovery lists.
    pub fn verbs(&self) -> &'static [&'static str] {
        if self.is_review() {
            &["create"]
        } else {
            VERBS
        }
    }

    pub fn is(&self, group: &str, plural: &str) -> bool {
        self.group == group && self.plural == plural
    }
}

/// The resource served at `group`/`version` under `plural`.
pub fn lookup(group: &str, version: &str, plural: &str) -> Option<&'static ResourceDef> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// The resource of a kind in a group (for `apiVersion`/`kind` in bodies).
pub fn by_kind(group: &str, kind: &str) -> Option<&'static ResourceDef> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.kind == kind)
}

/// Served groups in discovery order, each with its versions.
pub fn groups() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for r in RESOURCES {
        if !r.group.is_empty() && !out.contains(&r.group) {
            out.push(r.group);
        }
    }
    out
}

/// Resources of one group version.
pub fn in_group_version(group: &str, version: &str) -> Vec<&'static ResourceDef> {
    RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_etcd_layout() {
        let pods = lookup("", "v1", "pods").unwrap();
        assert_eq!(
            pods.key(Some("default"), "p"),
            "/registry/core/pods/default/p"
        );
        assert_eq!(pods.prefix(None), "/registry/core/pods/");
        let nodes = lookup("", "v1", "nodes").unwrap();
        assert_eq!(nodes.key(Some("ignored"), "n1"), "/registry/core/nodes/n1");
        let d = lookup("apps", "v1", "deployments").unwrap();
        assert_eq!(d.api_version(), "apps/v1");
        assert!(groups().contains(&"rbac.authorization.k8s.io"));
    }
}
