//! How each field of an object merges: upstream's markers (`+listType`,
//! `+listMapKey`, `+structType=atomic`, `+mapType=atomic`) for the built-in
//! kinds, and a CRD's OpenAPI v3 schema (`x-kubernetes-list-type`, ...)
//! for custom resources.

use serde_json::Value;

use Rule::{Atomic, MapList, Set, Struct};

/// How a list merges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListKind {
    /// Replaced whole (upstream's default for lists).
    Atomic,
    /// A set of scalars, merged by value.
    Set,
    /// Objects merged by these key fields.
    Map(Vec<String>),
}

/// The merge rules at one place in an object. Cheap to copy.
#[derive(Debug, Clone, Copy)]
pub struct Shape<'a>(Node<'a>);

#[derive(Debug, Clone, Copy)]
enum Node<'a> {
    /// Upstream's "deduced" type, for objects of no known shape: objects
    /// are granular maps (every key a member of field sets), lists atomic.
    Deduced,
    Builtin(Rule),
    /// A node of a CRD's structural schema; true where the object is a
    /// resource (the root, `x-kubernetes-embedded-resource`).
    Schema(&'a Value, bool),
}

#[derive(Debug, Clone, Copy)]
enum Rule {
    /// A struct of the named type of [`TABLE`]; "" for one the table does
    /// not list, whose objects are structs and lists atomic, as a Go
    /// struct without markers is.
    Struct(&'static str),
    /// `+listType=map` with its `+listMapKey`s, and the items' type.
    MapList(&'static [&'static str], &'static str),
    /// `+listType=set`.
    Set,
    /// Replaced whole: `+structType=atomic`, `+mapType=atomic`, or an
    /// atomic list.
    Atomic,
}

/// Item type of a map-list whose items are atomic structs.
const ATOMIC: &str = "atomic";

/// (type, field, rule) for the fields whose merge is not the default, from
/// upstream's `k8s.io/api` markers. Types are Go type names, or a name
/// shared by several Go types with the same rules (`WorkloadSpec`,
/// `Conditions`). Unlisted fields of a listed type are `Struct("")`, and
/// every `metadata` is an `ObjectMeta`.
const TABLE: &[(&str, &str, Rule)] = &[
    ("Deployment", "spec", Struct("WorkloadSpec")),
    ("ReplicaSet", "spec", Struct("WorkloadSpec")),
    ("StatefulSet", "spec", Struct("WorkloadSpec")),
    ("DaemonSet", "spec", Struct("WorkloadSpec")),
    ("Job", "spec", Struct("WorkloadSpec")),
    ("ReplicationController", "spec", Struct("WorkloadSpec")),
    ("CronJob", "spec", Struct("CronJobSpec")),
    ("CronJobSpec", "jobTemplate", Struct("JobTemplateSpec")),
    ("JobTemplateSpec", "spec", Struct("WorkloadSpec")),
    ("PodTemplate", "template", Struct("PodTemplateSpec")),
    ("WorkloadSpec", "template", Struct("PodTemplateSpec")),
    // LabelSelector is +structType=atomic; ReplicationController's
    // map selector is +mapType=atomic.
    ("WorkloadSpec", "selector", Atomic),
    ("PodTemplateSpec", "spec", Struct("PodSpec")),
    ("Pod", "spec", Struct("PodSpec")),
    ("Pod", "status", Struct("PodStatus")),
    // Statuses whose conditions merge by type (Job's are atomic).
    ("Deployment", "status", Struct("Conditions")),
    ("ReplicaSet", "status", Struct("Conditions")),
    ("StatefulSet", "status", Struct("Conditions")),
    ("DaemonSet", "status", Struct("Conditions")),
    ("ReplicationController", "status", Struct("Conditions")),
    ("Namespace", "status", Struct("Conditions")),
    ("Service", "status", Struct("Conditions")),
    ("PersistentVolumeClaim", "status", Struct("Conditions")),
    ("Conditions", "conditions", MapList(&["type"], "")),
    ("ObjectMeta", "finalizers", Set),
    ("ObjectMeta", "ownerReferences", MapList(&["uid"], ATOMIC)),
    ("ObjectMeta", "managedFields", Atomic),
    ("PodSpec", "containers", MapList(&["name"], "Container")),
    ("PodSpec", "initContainers", MapList(&["name"], "Container")),
    (
        "PodSpec",
        "ephemeralContainers",
        MapList(&["name"], "Container"),
    ),
    ("PodSpec", "volumes", MapList(&["name"], "")),
    ("PodSpec", "imagePullSecrets", MapList(&["name"], ATOMIC)),
    ("PodSpec", "hostAliases", MapList(&["ip"], "")),
    (
        "PodSpec",
        "topologySpreadConstraints",
        MapList(&["topologyKey", "whenUnsatisfiable"], ""),
    ),
    ("PodSpec", "schedulingGates", MapList(&["name"], "")),
    ("PodSpec", "resourceClaims", MapList(&["name"], "")),
    ("PodSpec", "nodeSelector", Atomic),
    ("Container", "env", MapList(&["name"], "EnvVar")),
    (
        "Container",
        "ports",
        MapList(&["containerPort", "protocol"], "ContainerPort"),
    ),
    ("Container", "volumeMounts", MapList(&["mountPath"], "")),
    ("Container", "volumeDevices", MapList(&["devicePath"], "")),
    ("Container", "resources", Struct("ResourceRequirements")),
    ("ResourceRequirements", "claims", MapList(&["name"], "")),
    ("EnvVar", "valueFrom", Struct("EnvVarSource")),
    ("EnvVarSource", "configMapKeyRef", Atomic),
    ("EnvVarSource", "secretKeyRef", Atomic),
    ("EnvVarSource", "fieldRef", Atomic),
    ("EnvVarSource", "resourceFieldRef", Atomic),
    ("PodStatus", "conditions", MapList(&["type"], "")),
    ("PodStatus", "podIPs", MapList(&["ip"], "")),
    ("PodStatus", "resourceClaimStatuses", MapList(&["name"], "")),
    ("Service", "spec", Struct("ServiceSpec")),
    (
        "ServiceSpec",
        "ports",
        MapList(&["port", "protocol"], "ServicePort"),
    ),
    ("ServiceSpec", "selector", Atomic),
    ("Node", "spec", Struct("NodeSpec")),
    ("NodeSpec", "podCIDRs", Set),
    ("Node", "status", Struct("NodeStatus")),
    ("NodeStatus", "conditions", MapList(&["type"], "")),
    ("NodeStatus", "addresses", MapList(&["type"], "")),
    ("ServiceAccount", "secrets", MapList(&["name"], ATOMIC)),
    (
        "MutatingWebhookConfiguration",
        "webhooks",
        MapList(&["name"], "Webhook"),
    ),
    (
        "ValidatingWebhookConfiguration",
        "webhooks",
        MapList(&["name"], "Webhook"),
    ),
    ("Webhook", "matchConditions", MapList(&["name"], "")),
];

/// (item type, key, default): a key field an item may omit, as upstream
/// takes the OpenAPI default, so `ports: [{containerPort: 80}]` names the
/// same item as the defaulted `protocol: TCP` one.
const KEY_DEFAULTS: &[(&str, &str, &str)] = &[
    ("ContainerPort", "protocol", "TCP"),
    ("ServicePort", "protocol", "TCP"),
];

fn embedded(schema: &Value) -> bool {
    schema.get("x-kubernetes-embedded-resource") == Some(&Value::Bool(true))
}

fn schema_node(schema: Option<&Value>) -> Node<'_> {
    match schema {
        Some(s) if s.is_object() => Node::Schema(s, embedded(s)),
        _ => Node::Deduced,
    }
}

impl Shape<'static> {
    /// No known shape (upstream's deduced type).
    pub fn deduced() -> Self {
        Shape(Node::Deduced)
    }

    /// A built-in kind; one the table does not list is still a struct, as
    /// every built-in kind is a Go struct upstream.
    pub fn builtin(kind: &str) -> Self {
        let ty = TABLE
            .iter()
            .find(|(t, _, _)| *t == kind)
            .map_or("", |(t, _, _)| *t);
        Shape(Node::Builtin(Struct(ty)))
    }
}

impl<'a> Shape<'a> {
    /// A custom resource of a CRD version's `openAPIV3Schema`.
    pub fn from_openapi(schema: &'a Value) -> Self {
        Shape(Node::Schema(schema, true))
    }

    /// The shape of field `name` of an object here.
    pub fn field(&self, name: &str) -> Shape<'a> {
        match self.0 {
            Node::Builtin(Struct(ty)) => Shape(Node::Builtin(
                match TABLE.iter().find(|(t, f, _)| *t == ty && *f == name) {
                    Some((_, _, rule)) => *rule,
                    None if name == "metadata" => Struct("ObjectMeta"),
                    None => Struct(""),
                },
            )),
            Node::Schema(s, resource) => match s.get("properties").and_then(|p| p.get(name)) {
                Some(p) => Shape(schema_node(Some(p))),
                None if resource && name == "metadata" => {
                    Shape(Node::Builtin(Struct("ObjectMeta")))
                }
                None => self.values(),
            },
            _ => self.values(),
        }
    }

    /// The shape of a map's values here (keys that are not named fields).
    pub fn values(&self) -> Shape<'a> {
        Shape(match self.0 {
            Node::Builtin(Atomic) => Node::Builtin(Atomic),
            Node::Builtin(_) => Node::Builtin(Struct("")),
            // Nothing is known of values that `additionalProperties: true`
            // or preserved unknown fields allow.
            Node::Schema(s, _) => schema_node(s.get("additionalProperties")),
            Node::Deduced => Node::Deduced,
        })
    }

    /// The shape of a list's items here.
    pub fn items(&self) -> Shape<'a> {
        Shape(match self.0 {
            Node::Builtin(MapList(_, item)) if item == ATOMIC => Node::Builtin(Atomic),
            Node::Builtin(MapList(_, item)) => Node::Builtin(Struct(item)),
            Node::Schema(s, _) => schema_node(s.get("items")),
            other => Shape(other).values().0,
        })
    }

    /// How a list here merges.
    pub fn list_kind(&self) -> ListKind {
        match self.0 {
            Node::Builtin(MapList(keys, _)) => {
                ListKind::Map(keys.iter().map(|k| k.to_string()).collect())
            }
            Node::Builtin(Set) => ListKind::Set,
            Node::Schema(s, _) => match s.get("x-kubernetes-list-type").and_then(Value::as_str) {
                Some("set") => ListKind::Set,
                Some("map") => {
                    let keys = s
                        .get("x-kubernetes-list-map-keys")
                        .and_then(Value::as_array);
                    let keys: Vec<String> = keys
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_str)
                        .map(String::from)
                        .collect();
                    // CRD validation refuses a map-list without keys.
                    if keys.is_empty() {
                        ListKind::Atomic
                    } else {
                        ListKind::Map(keys)
                    }
                }
                _ => ListKind::Atomic,
            },
            _ => ListKind::Atomic,
        }
    }

    /// Whether an object here is replaced whole rather than merged per key.
    pub fn atomic(&self) -> bool {
        match self.0 {
            Node::Builtin(rule) => matches!(rule, Atomic),
            Node::Schema(s, _) => {
                s.get("x-kubernetes-map-type").and_then(Value::as_str) == Some("atomic")
                    || s.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true))
            }
            Node::Deduced => false,
        }
    }

    /// Whether `name` is a struct field here rather than a map key: a
    /// struct field holding something is owned through what it holds.
    pub fn is_named_field(&self, name: &str) -> bool {
        match self.0 {
            Node::Builtin(rule) => matches!(rule, Struct(_)),
            Node::Schema(s, resource) => {
                s.get("properties").and_then(|p| p.get(name)).is_some()
                    || (resource && matches!(name, "apiVersion" | "kind" | "metadata"))
            }
            Node::Deduced => false,
        }
    }

    /// The default of key field `key` of a map-list here, for items that
    /// omit it (upstream takes it from the schema).
    pub fn key_default(&self, key: &str) -> Option<Value> {
        match self.0 {
            Node::Builtin(MapList(_, item)) => (KEY_DEFAULTS.iter())
                .find(|(t, k, _)| *t == item && *k == key)
                .map(|(_, _, d)| Value::from(*d)),
            Node::Schema(s, _) => s
                .get("items")?
                .get("properties")?
                .get(key)?
                .get("default")
                .cloned(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn at<'a>(shape: Shape<'a>, path: &str) -> Shape<'a> {
        path.split('.')
            .fold(shape, |s, f| if f == "[]" { s.items() } else { s.field(f) })
    }

    #[test]
    fn builtin_markers() {
        let d = Shape::builtin("Deployment");
        let ports = at(d, "spec.template.spec.containers.[].ports");
        assert_eq!(
            ports.list_kind(),
            ListKind::Map(vec!["containerPort".into(), "protocol".into()])
        );
        assert_eq!(ports.key_default("protocol"), Some(json!("TCP")));
        assert_eq!(
            at(d, "spec.template.spec.tolerations").list_kind(),
            ListKind::Atomic
        );
        assert!(at(d, "spec.selector").atomic() && at(d, "metadata.ownerReferences.[]").atomic());
        assert_eq!(at(d, "metadata.finalizers").list_kind(), ListKind::Set);
        let cron = at(
            Shape::builtin("CronJob"),
            "spec.jobTemplate.spec.template.spec.volumes",
        );
        assert_eq!(cron.list_kind(), ListKind::Map(vec!["name".into()]));
        assert!(
            Shape::builtin("ConfigMap").is_named_field("data")
                && !Shape::deduced().is_named_field("data")
        );
    }

    #[test]
    fn crd_schema() {
        let schema = json!({"properties": {"spec": {"properties": {
            "ports": {
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name", "proto"],
                "items": {"properties": {"name": {}, "proto": {"default": "TCP"}}},
            },
            "tags": {"x-kubernetes-list-type": "set"},
            "args": {"items": {}},
            "sel": {"x-kubernetes-map-type": "atomic"},
            "env": {"additionalProperties": {"properties": {"v": {}}}},
            "port": {"x-kubernetes-int-or-string": true},
        }}}});
        let cr = Shape::from_openapi(&schema);
        let ports = at(cr, "spec.ports");
        assert_eq!(
            ports.list_kind(),
            ListKind::Map(vec!["name".into(), "proto".into()])
        );
        assert_eq!(ports.key_default("proto"), Some(json!("TCP")));
        assert_eq!(at(cr, "spec.tags").list_kind(), ListKind::Set);
        assert_eq!(at(cr, "spec.args").list_kind(), ListKind::Atomic);
        assert!(at(cr, "spec.sel").atomic() && at(cr, "spec.port").atomic());
        assert!(
            !at(cr, "spec.env").is_named_field("a") && at(cr, "spec.env.a").is_named_field("v")
        );
        assert!(cr.is_named_field("metadata") && !at(cr, "spec.free").is_named_field("x"));
        assert_eq!(at(cr, "metadata.finalizers").list_kind(), ListKind::Set);
    }
}
