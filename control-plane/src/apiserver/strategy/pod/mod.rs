//! Pods (`core/v1`): defaults and admission-time fields, validation, the
//! QoS class on create, graceful deletion, the node-served subresources and
//! the `kubectl get pods` columns (upstream's `pkg/registry/core/pod`).

pub(crate) mod affinity;
mod binding;
mod ephemeral;
mod eviction;
mod print;
pub(crate) mod security;

use serde_json::{json, Value};

use super::{handler, Serve, Strategy, Subresource};
use crate::apiserver::defaults;
use crate::apiserver::handlers::DeleteOptions;
use crate::apiserver::objects::{self, meta_mut};
use crate::apiserver::status::{ApiError, ApiResult, Cause};
use crate::apiserver::table::Col;
use crate::apiserver::validation;
use crate::apiserver::ApiServer;
use crate::apiserver::Req;

pub struct Pod;

static SUBRESOURCES: &[Subresource] = &[
    Subresource {
        name: "binding",
        kind: "Binding",
        group_version: None,
        verbs: &["create"],
        serve: Serve::Handler(handler!(binding::binding)),
    },
    Subresource {
        name: "eviction",
        kind: "Eviction",
        group_version: Some(("policy", "v1")),
        verbs: &["create"],
        serve: Serve::Handler(handler!(eviction::eviction)),
    },
    Subresource {
        name: "ephemeralcontainers",
        kind: "Pod",
        group_version: None,
        verbs: &["get", "patch", "update"],
        serve: Serve::Handler(handler!(ephemeral::ephemeral_containers)),
    },
    Subresource {
        name: "log",
        kind: "Pod",
        group_version: None,
        verbs: &["get"],
        serve: Serve::Node,
    },
    Subresource {
        name: "exec",
        kind: "PodExecOptions",
        group_version: None,
        verbs: &["create", "get"],
        serve: Serve::Node,
    },
    Subresource {
        name: "attach",
        kind: "PodAttachOptions",
        group_version: None,
        verbs: &["create", "get"],
        serve: Serve::Node,
    },
    Subresource {
        name: "portforward",
        kind: "PodPortForwardOptions",
        group_version: None,
        verbs: &["create", "get"],
        serve: Serve::Node,
    },
    super::proxy("PodProxyOptions"),
];

impl Strategy for Pod {
    /// A new pod is Pending, with its QoS class.
    fn prepare_for_create(&self, _r: &Req, obj: &mut Value) {
        obj["status"] = json!({"phase": "Pending", "qosClass": qos_class(obj)});
    }

    fn default(&self, obj: &mut Value) {
        if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
            defaults::pod_spec(spec, true);
            ephemeral::default(spec);
        }
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        validation::pod_spec("spec", obj.get("spec"), &mut c);
        if let Some(spec) = obj.get("spec") {
            ephemeral::validate("spec", spec, &mut c);
        }
        security::validate("spec", obj.get("spec"), &mut c);
        affinity::validate("spec", obj.get("spec"), &mut c);
        priority_fields(obj.get("spec"), &mut c);
        c
    }

    /// The scheduler and preemption read a pod's priority as admitted:
    /// an update may not change it (part of upstream's immutable pod spec).
    fn validate_update(&self, old: &Value, new: &Value) -> Vec<Cause> {
        let mut c = self.validate(new);
        let changed = ["priority", "priorityClassName", "preemptionPolicy"]
            .iter()
            .any(|k| old["spec"].get(*k) != new["spec"].get(*k));
        if changed {
            c.push(Cause::forbidden(
                "spec",
                "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
            ));
        }
        c
    }

    /// Ephemeral containers change through their subresource only: an
    /// update of the pod keeps the stored ones.
    fn prepare_for_update(&self, old: &Value, new: &mut Value) {
        let kept = old["spec"].get("ephemeralContainers").cloned();
        if let Some(spec) = new.get_mut("spec").and_then(Value::as_object_mut) {
            // Priority admission set these on create; an update that
            // leaves them out keeps them (upstream's plugin on update).
            for k in ["priority", "preemptionPolicy"] {
                if let Some(v) = old["spec"].get(k).filter(|v| !v.is_null()) {
                    if spec.get(k).is_none_or(Value::is_null) {
                        spec.insert(k.into(), v.clone());
                    }
                }
            }
            match kept {
                Some(k) => spec.insert("ephemeralContainers".into(), k),
                None => spec.remove("ephemeralContainers"),
            };
        }
    }

    /// A new pod may not come with ephemeral containers (upstream's
    /// `ValidatePodCreate`); refused here, the one hook that tells a
    /// create from the subresource's writes.
    fn authorize_write<'a>(
        &'a self,
        _api: &'a ApiServer,
        _r: &'a Req,
        old: Option<&'a Value>,
        new: &'a Value,
    ) -> futures::future::BoxFuture<'a, ApiResult<()>> {
        let set = new["spec"]["ephemeralContainers"]
            .as_array()
            .is_some_and(|a| !a.is_empty());
        let res = if old.is_none() && set {
            Err(ApiError::invalid(
                "Pod",
                "",
                objects::name(new).unwrap_or_default(),
                vec![Cause::forbidden(
                    "spec.ephemeralContainers",
                    "cannot be set on create",
                )],
            ))
        } else {
            Ok(())
        };
        Box::pin(std::future::ready(res))
    }

    /// A bound pod that may still run is deleted gracefully: it stays,
    /// with its deadline, until its node has stopped it.
    fn mark_deleted(&self, _api: &ApiServer, obj: &mut Value, opts: &DeleteOptions) -> bool {
        super::add_propagation_finalizer(obj, opts);
        let grace = grace_period(obj, opts.grace);
        let graceful = grace > 0;
        if graceful {
            let current = obj["metadata"]["deletionGracePeriodSeconds"].as_i64();
            // A second delete may only shorten the grace period.
            if current.is_none_or(|c| grace < c) {
                let at = jiff::Timestamp::now()
                    .saturating_add(jiff::SignedDuration::from_secs(grace))
                    .unwrap_or(jiff::Timestamp::MAX);
                let ts = format!("{at:.0}");
                let m = meta_mut(obj);
                m.insert("deletionTimestamp".into(), json!(ts));
                m.insert("deletionGracePeriodSeconds".into(), json!(grace));
            }
        } else if objects::has_deletion_timestamp(obj) {
            meta_mut(obj).insert("deletionGracePeriodSeconds".into(), json!(0));
        }
        super::hold_for_finalizers(obj, opts) || graceful
    }

    /// The node finishes a graceful deletion by deleting with grace 0.
    fn holds_deletion(&self, obj: &Value) -> bool {
        obj["metadata"]["deletionGracePeriodSeconds"]
            .as_i64()
            .unwrap_or(0)
            > 0
    }

    fn selectable_fields(&self) -> &'static [&'static str] {
        &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ]
    }

    fn subresources(&self) -> &'static [Subresource] {
        SUBRESOURCES
    }

    fn columns(&self) -> Vec<Col> {
        print::COLUMNS.to_vec()
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        print::cells(obj)
    }
}

/// The grace period a pod deletion gets: none for pods never bound to a
/// node or already finished (nothing runs that must stop).
fn grace_period(pod: &Value, asked: Option<i64>) -> i64 {
    let bound = pod["spec"]["nodeName"]
        .as_str()
        .is_some_and(|n| !n.is_empty());
    let phase = pod["status"]["phase"].as_str().unwrap_or_default();
    if !bound || phase == "Succeeded" || phase == "Failed" {
        return 0;
    }
    let g = asked.unwrap_or_else(|| {
        pod["spec"]["terminationGracePeriodSeconds"]
            .as_i64()
            .unwrap_or(30)
    });
    // Upstream turns a requested 0 into 1 for bound pods unless forced; the
    // node then finishes the deletion right away. Honour 0 as immediate.
    g.max(0)
}

/// `priorityClassName` is a DNS subdomain and `preemptionPolicy` one of
/// upstream's two (`ValidatePodSpec`).
fn priority_fields(spec: Option<&Value>, c: &mut Vec<Cause>) {
    let Some(spec) = spec else {
        return;
    };
    if let Some(name) = spec["priorityClassName"].as_str().filter(|n| !n.is_empty()) {
        validation::dns_subdomain("spec.priorityClassName", name, c);
    }
    if let Some(p) = spec["preemptionPolicy"].as_str() {
        let allowed = super::priorityclass::PREEMPTION_POLICIES;
        if !allowed.contains(&p) {
            c.push(Cause::not_supported("spec.preemptionPolicy", p, &allowed));
        }
    }
}

/// The pod's QoS class, kube-util's as the agent's. Only the resources
/// decide it, so only they are read into the typed model: reading the
/// whole pod cost a deep copy of it on every create. A pod whose resources
/// do not read is refused by validation after this.
pub(crate) fn qos_class(obj: &Value) -> &'static str {
    use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
    let spec = &obj["spec"];
    let resources = |v: &Value| {
        v.get("resources")
            .and_then(|r| serde_json::from_value::<ResourceRequirements>(r.clone()).ok())
    };
    let containers = |key: &str| -> Vec<Container> {
        spec[key]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| Container {
                resources: resources(c),
                ..Container::default()
            })
            .collect()
    };
    let pod = Pod {
        spec: Some(PodSpec {
            containers: containers("containers"),
            init_containers: Some(containers("initContainers")),
            resources: resources(spec),
            ..PodSpec::default()
        }),
        ..Pod::default()
    };
    kube_util::qos::qos_class(&pod).as_str()
}

#[cfg(test)]
mod tests {
    use super::qos_class;
    use serde_json::json;

    #[test]
    fn qos_class_reads_the_resources_of_every_container() {
        let pod = |spec| json!({"apiVersion": "v1", "kind": "Pod", "spec": spec});
        let c = |resources| json!({"name": "c", "image": "i", "resources": resources});
        let both = json!({"cpu": "500m", "memory": "64Mi"});
        assert_eq!(
            qos_class(&pod(json!({"containers": [c(json!({}))]}))),
            "BestEffort"
        );
        assert_eq!(qos_class(&json!({"kind": "Pod"})), "BestEffort");
        // Requests default to limits.
        let limited = c(json!({"limits": both}));
        assert_eq!(
            qos_class(&pod(json!({"containers": [limited]}))),
            "Guaranteed"
        );
        let requested = c(json!({"requests": {"cpu": "1"}}));
        assert_eq!(
            qos_class(&pod(json!({"containers": [requested]}))),
            "Burstable"
        );
        // An init container without limits makes a limited pod Burstable.
        let spec = json!({"containers": [limited], "initContainers": [requested]});
        assert_eq!(qos_class(&pod(spec)), "Burstable");
        // Pod-level resources decide alone.
        let spec = json!({"containers": [requested], "resources": {"limits": both}});
        assert_eq!(qos_class(&pod(spec)), "Guaranteed");
    }
}
