//! ReplicationControllers (upstream `pkg/controller/replication`): a
//! ReplicaSet with an equality selector. Upstream converts them to
//! ReplicaSets and runs the ReplicaSet controller; so does this, through
//! [`Replicated`], writing owner references, events and status as the
//! ReplicationController itself.

use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetSpec, ReplicaSetStatus};
use k8s_openapi::api::core::v1::{
    ReplicationController, ReplicationControllerCondition, ReplicationControllerStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::replicaset::{run_for, Replicated};
use crate::Ctx;

impl Replicated for ReplicationController {
    const CONTROLLER: &'static str = "replicationcontroller";
    const REPORTER: &'static str = "replication-controller";
    const WORDS: &'static str = "replication controller";

    fn view(&self) -> ReplicaSet {
        let spec = self.spec.clone().unwrap_or_default();
        let status = self.status.clone().map(|s| ReplicaSetStatus {
            replicas: s.replicas,
            fully_labeled_replicas: s.fully_labeled_replicas,
            ready_replicas: s.ready_replicas,
            available_replicas: s.available_replicas,
            observed_generation: s.observed_generation,
            conditions: s.conditions.map(|cs| {
                cs.into_iter()
                    .map(|c| k8s_openapi::api::apps::v1::ReplicaSetCondition {
                        type_: Some(c.type_),
                        status: Some(c.status),
                        reason: c.reason,
                        message: c.message,
                        last_transition_time: c.last_transition_time,
                    })
                    .collect()
            }),
            terminating_replicas: None,
        });
        ReplicaSet {
            metadata: self.metadata.clone(),
            spec: ReplicaSetSpec {
                replicas: spec.replicas,
                min_ready_seconds: spec.min_ready_seconds,
                // An empty selector selects nothing here, as in the
                // ReplicaSet loop (validation refuses one anyway).
                selector: LabelSelector {
                    match_labels: spec.selector.filter(|m| !m.is_empty()),
                    match_expressions: None,
                },
                template: spec.template,
            },
            status,
        }
    }

    fn with_status(&self, s: ReplicaSetStatus) -> Self {
        let mut updated = self.clone();
        updated.status = Some(ReplicationControllerStatus {
            replicas: s.replicas,
            fully_labeled_replicas: s.fully_labeled_replicas,
            ready_replicas: s.ready_replicas,
            available_replicas: s.available_replicas,
            observed_generation: s.observed_generation,
            conditions: s.conditions.map(|cs| {
                cs.into_iter()
                    .map(|c| ReplicationControllerCondition {
                        type_: c.type_.unwrap_or_default(),
                        status: c.status.unwrap_or_default(),
                        reason: c.reason,
                        message: c.message,
                        last_transition_time: c.last_transition_time,
                    })
                    .collect()
            }),
        });
        updated
    }
}

/// Run the ReplicationController controller until its task is aborted.
///
/// # Errors
/// The caches cannot be filled.
pub async fn run(ctx: Ctx) -> Result<(), crate::Error> {
    run_for::<ReplicationController>(ctx).await
}
