//! The resource table: every kind the server serves, with what discovery,
//! storage and printing need to know about it.

use std::marker::PhantomData;

use k8s_openapi::api::{
    admissionregistration, apps, authentication, authorization, batch, certificates, coordination,
    core, discovery, events, node, policy, rbac, scheduling, storage,
};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;

use super::crd;
use super::model::{Model, Typed};
use super::review;
use super::strategy::{self, handler, Handler, Serve, Strategy, Subresource};
use super::tokenreview;

/// One served resource (one group/version/plural): a row of [`RESOURCES`].
#[derive(Clone, Copy)]
pub struct ResourceDef {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    /// The singular name when it is not the kind in lower case (custom
    /// kinds name theirs).
    pub singular_name: Option<&'static str>,
    pub categories: &'static [&'static str],
    /// Has a `/status` subresource: the main resource ignores status writes
    /// and the subresource ignores everything else (upstream's strategy split).
    pub status: bool,
    /// Has a `/scale` subresource.
    pub scale: bool,
    /// Computed per request and never stored: the verbs served and what
    /// answers them (access reviews answer a create, component statuses a
    /// get or a list).
    pub computed: Option<Computed>,
    /// The resource whose keys hold this one's objects, when not its own:
    /// events.k8s.io Events live with the core ones.
    pub stored_as: Option<(&'static str, &'static str)>,
    /// The kind's typed model (None: the object is taken as sent).
    pub model: Option<&'static dyn Model>,
    /// The kind's rules.
    pub strategy: &'static dyn Strategy,
}

impl std::fmt::Debug for ResourceDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ResourceDef({})", self.api_version_resource())
    }
}

impl PartialEq for ResourceDef {
    fn eq(&self, other: &Self) -> bool {
        (self.group, self.version, self.plural) == (other.group, other.version, other.plural)
    }
}

impl Eq for ResourceDef {}

const ALL: &[&str] = &["all"];

/// A row for k8s-openapi type `K` (its group, version, kind and plural):
/// namespaced, no status, no short names, `K` as its model.
const fn kind<K>() -> ResourceDef
where
    K: k8s_openapi::Resource + 'static,
    Typed<K>: Model,
{
    ResourceDef {
        group: K::GROUP,
        version: K::VERSION,
        kind: K::KIND,
        plural: K::URL_PATH_SEGMENT,
        namespaced: true,
        short_names: &[],
        singular_name: None,
        categories: &[],
        status: false,
        scale: false,
        computed: None,
        stored_as: None,
        model: Some(&Typed::<K>(PhantomData)),
        strategy: &strategy::Plain,
    }
}

impl ResourceDef {
    const fn cluster(self) -> Self {
        ResourceDef {
            namespaced: false,
            ..self
        }
    }
    const fn short(self, short_names: &'static [&'static str]) -> Self {
        ResourceDef {
            short_names,
            ..self
        }
    }
    const fn categories(self, categories: &'static [&'static str]) -> Self {
        ResourceDef { categories, ..self }
    }
    /// In the `all` category (`kubectl get all`).
    const fn all(self) -> Self {
        ResourceDef {
            categories: ALL,
            ..self
        }
    }
    const fn with_status(self) -> Self {
        ResourceDef {
            status: true,
            ..self
        }
    }
    const fn with_scale(self) -> Self {
        ResourceDef {
            scale: true,
            ..self
        }
    }
    const fn rules(self, strategy: &'static dyn Strategy) -> Self {
        ResourceDef { strategy, ..self }
    }
    const fn stored_with(self, group: &'static str, plural: &'static str) -> Self {
        ResourceDef {
            stored_as: Some((group, plural)),
            ..self
        }
    }
    /// Answered by `serve` for `verbs`, never stored.
    const fn computed(self, verbs: &'static [&'static str], serve: Handler) -> Self {
        ResourceDef {
            computed: Some(Computed { verbs, serve }),
            ..self
        }
    }
}

/// Every served resource. Core (`""`) first: kubectl's RESTMapper prefers the
/// earlier group when two share a name (core `events` over `events.k8s.io`).
pub static RESOURCES: &[ResourceDef] = &[
    kind::<core::v1::Namespace>()
        .cluster()
        .short(&["ns"])
        .with_status()
        .rules(&strategy::namespace::Namespace),
    kind::<core::v1::Node>()
        .cluster()
        .short(&["no"])
        .with_status()
        .rules(&strategy::node::Node),
    kind::<core::v1::Pod>()
        .short(&["po"])
        .all()
        .with_status()
        .rules(&strategy::pod::Pod),
    kind::<core::v1::Service>()
        .short(&["svc"])
        .all()
        .with_status()
        .rules(&strategy::service::Service),
    kind::<core::v1::Endpoints>()
        .short(&["ep"])
        .rules(&strategy::printed::Endpoints),
    kind::<core::v1::ConfigMap>()
        .short(&["cm"])
        .rules(&strategy::configmap::ConfigMap),
    kind::<core::v1::Secret>().rules(&strategy::secret::Secret),
    kind::<core::v1::Event>()
        .short(&["ev"])
        .rules(&strategy::event::CoreEvent),
    // Deprecated upstream since 1.19 and still served: the health of the
    // scheduler, the controller manager and the store.
    kind::<core::v1::ComponentStatus>()
        .cluster()
        .short(&["cs"])
        .rules(&strategy::componentstatus::ComponentStatus)
        .computed(READ, handler!(strategy::componentstatus::serve)),
    kind::<core::v1::ServiceAccount>()
        .short(&["sa"])
        .rules(&strategy::serviceaccount::ServiceAccount),
    kind::<core::v1::PersistentVolume>()
        .cluster()
        .short(&["pv"])
        .with_status()
        .rules(&strategy::storage::volume::PersistentVolume),
    kind::<core::v1::PersistentVolumeClaim>()
        .short(&["pvc"])
        .with_status()
        .rules(&strategy::storage::claim::PersistentVolumeClaim),
    kind::<core::v1::ResourceQuota>()
        .short(&["quota"])
        .with_status()
        .rules(&strategy::resourcequota::ResourceQuota),
    kind::<core::v1::LimitRange>()
        .short(&["limits"])
        .rules(&strategy::limitrange::LimitRange),
    kind::<core::v1::ReplicationController>()
        .short(&["rc"])
        .all()
        .with_status()
        .with_scale()
        .rules(&strategy::replicationcontroller::ReplicationController),
    kind::<apps::v1::Deployment>()
        .short(&["deploy"])
        .all()
        .with_status()
        .with_scale()
        .rules(&strategy::workloads::Deployment),
    kind::<apps::v1::ReplicaSet>()
        .short(&["rs"])
        .all()
        .with_status()
        .with_scale()
        .rules(&strategy::workloads::ReplicaSet),
    kind::<apps::v1::DaemonSet>()
        .short(&["ds"])
        .all()
        .with_status()
        .rules(&strategy::workloads::DaemonSet),
    kind::<apps::v1::StatefulSet>()
        .short(&["sts"])
        .all()
        .with_status()
        .with_scale()
        .rules(&strategy::statefulset::StatefulSet),
    kind::<apps::v1::ControllerRevision>().rules(&strategy::revision::ControllerRevision),
    kind::<batch::v1::Job>()
        .all()
        .with_status()
        .rules(&strategy::job::Job),
    kind::<batch::v1::CronJob>()
        .short(&["cj"])
        .all()
        .with_status()
        .rules(&strategy::cronjob::CronJob),
    kind::<policy::v1::PodDisruptionBudget>()
        .short(&["pdb"])
        .with_status()
        .rules(&strategy::disruptionbudget::PodDisruptionBudget),
    kind::<coordination::v1::Lease>().rules(&strategy::printed::Lease),
    kind::<discovery::v1::EndpointSlice>().rules(&strategy::printed::EndpointSlice),
    kind::<events::v1::Event>()
        .short(&["ev"])
        .stored_with("core", "events")
        .rules(&strategy::event::EventsV1),
    kind::<CustomResourceDefinition>()
        .cluster()
        .short(&["crd", "crds"])
        .categories(&["api-extensions"])
        .with_status()
        .rules(&crd::definition::Definition),
    kind::<rbac::v1::Role>().rules(&strategy::rbac::Role),
    kind::<rbac::v1::RoleBinding>().rules(&strategy::rbac::Binding),
    kind::<rbac::v1::ClusterRole>()
        .cluster()
        .rules(&strategy::rbac::Role),
    // Access reviews: asked, answered, never stored (`kubectl auth can-i`).
    kind::<authorization::v1::SelfSubjectAccessReview>()
        .cluster()
        .computed(CREATE, handler!(review::self_subject)),
    kind::<authorization::v1::SubjectAccessReview>()
        .cluster()
        .computed(CREATE, handler!(review::subject)),
    kind::<authorization::v1::LocalSubjectAccessReview>()
        .computed(CREATE, handler!(review::local_subject)),
    kind::<authorization::v1::SelfSubjectRulesReview>()
        .cluster()
        .computed(CREATE, handler!(review::self_rules)),
    // Who the requester is (`kubectl auth whoami`).
    kind::<authentication::v1::SelfSubjectReview>()
        .cluster()
        .computed(CREATE, handler!(review::self_review)),
    // Who a token is (webhooks, proxies): asked, answered, never stored.
    kind::<authentication::v1::TokenReview>()
        .cluster()
        .computed(CREATE, handler!(tokenreview::create)),
    kind::<rbac::v1::ClusterRoleBinding>()
        .cluster()
        .rules(&strategy::rbac::Binding),
    // Node certificates: the agent's CSRs, approved by the csrapproving
    // controller (or `kubectl certificate approve`), signed by csrsigning.
    kind::<certificates::v1::CertificateSigningRequest>()
        .cluster()
        .short(&["csr"])
        .with_status()
        .rules(&strategy::csr::Csr),
    kind::<scheduling::v1::PriorityClass>()
        .cluster()
        .short(&["pc"])
        .rules(&strategy::priorityclass::PriorityClass),
    kind::<storage::v1::StorageClass>()
        .cluster()
        .short(&["sc"])
        .rules(&strategy::storage::class::StorageClass),
    kind::<storage::v1::CSIDriver>()
        .cluster()
        .rules(&strategy::storage::csi::CsiDriver),
    kind::<storage::v1::CSINode>()
        .cluster()
        .rules(&strategy::storage::csi::CsiNode),
    kind::<storage::v1::VolumeAttachment>()
        .cluster()
        .with_status()
        .rules(&strategy::storage::csi::VolumeAttachment),
    kind::<admissionregistration::v1::MutatingWebhookConfiguration>()
        .cluster()
        .categories(&["api-extensions"])
        .rules(&strategy::webhookconfig::MUTATING),
    kind::<admissionregistration::v1::ValidatingWebhookConfiguration>()
        .cluster()
        .categories(&["api-extensions"])
        .rules(&strategy::webhookconfig::VALIDATING),
    kind::<admissionregistration::v1::ValidatingAdmissionPolicy>()
        .cluster()
        .categories(&["api-extensions"])
        .with_status()
        .rules(&strategy::admissionpolicy::Policy),
    kind::<admissionregistration::v1::ValidatingAdmissionPolicyBinding>()
        .cluster()
        .categories(&["api-extensions"])
        .rules(&strategy::admissionpolicy::Binding),
    kind::<APIService>()
        .cluster()
        .categories(&["api-extensions"])
        .with_status()
        .rules(&strategy::apiservice::ApiService),
    kind::<node::v1::RuntimeClass>()
        .cluster()
        .rules(&strategy::runtimeclass::RuntimeClass),
];

/// A resource computed per request (see [`ResourceDef::computed`]).
#[derive(Clone, Copy)]
pub struct Computed {
    pub verbs: &'static [&'static str],
    pub serve: Handler,
}

const CREATE: &[&str] = &["create"];
const READ: &[&str] = &["get", "list"];

/// A subresource as discovery lists it.
#[derive(Debug, Clone, Copy)]
pub struct SubresourceInfo {
    pub name: &'static str,
    /// The group and version of `kind`, when not the resource's own
    /// (`autoscaling/v1` Scale, `policy/v1` Eviction).
    pub group_version: Option<(&'static str, &'static str)>,
    pub kind: &'static str,
    pub verbs: &'static [&'static str],
}

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
    /// The singular name: the kind in lower case, as upstream derives it,
    /// unless the definition names another.
    pub fn singular(&self) -> String {
        match self.singular_name {
            Some(s) => s.to_string(),
            None => self.kind.to_lowercase(),
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
    /// `pods.v1` or `deployments.v1.apps`, for messages.
    fn api_version_resource(&self) -> String {
        if self.group.is_empty() {
            format!("{}.{}", self.plural, self.version)
        } else {
            format!("{}.{}.{}", self.plural, self.version, self.group)
        }
    }
    /// The (group, plural) whose keys hold this resource's objects.
    fn storage(&self) -> (&'static str, &'static str) {
        self.stored_as.unwrap_or((self.key_group(), self.plural))
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
    /// Subresources served for this resource, as discovery lists them.
    pub fn subresources(&self) -> Vec<SubresourceInfo> {
        let mut out = Vec::new();
        // A kind may serve its status itself (CSRs).
        if self.status && self.own_subresource("status").is_none() {
            out.push(SubresourceInfo {
                name: "status",
                group_version: None,
                kind: self.kind,
                verbs: &["get", "patch", "update"],
            });
        }
        if self.scale {
            out.push(SubresourceInfo {
                name: "scale",
                group_version: Some(("autoscaling", "v1")),
                kind: "Scale",
                verbs: &["get", "patch", "update"],
            });
        }
        out.extend(
            self.strategy
                .subresources()
                .iter()
                .map(|s| SubresourceInfo {
                    name: s.name,
                    group_version: s.group_version,
                    kind: s.kind,
                    verbs: s.verbs,
                }),
        );
        out
    }

    /// A subresource of the kind's own (not `status` or `scale`).
    pub fn own_subresource(&self, name: &str) -> Option<&'static Subresource> {
        self.strategy.subresources().iter().find(|s| s.name == name)
    }

    /// Whether the node of the object serves this subresource
    /// (pods/log, exec, attach, portforward).
    pub fn node_serves(&self, sub: Option<&str>) -> bool {
        sub.and_then(|s| self.own_subresource(s))
            .is_some_and(|s| matches!(s.serve, Serve::Node))
    }

    /// The verbs discovery lists.
    pub fn verbs(&self) -> &'static [&'static str] {
        match &self.computed {
            Some(c) => c.verbs,
            None => VERBS,
        }
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
