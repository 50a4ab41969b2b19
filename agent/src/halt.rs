//! Pods the agent stops for good on its own account (a node shutdown, an
//! eviction): stopped within a grace period, reported `Failed` with the
//! reason and a `DisruptionTarget` condition (reason
//! `TerminationByKubelet`), never started again.

use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
use tokio::sync::oneshot;

/// Why a pod is halted: its status's reason and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Halt {
    pub reason: &'static str,
    pub message: String,
}

/// A request to the pod manager: halt these pods (uid, grace seconds);
/// `done` fires when every one has stopped.
#[derive(Debug)]
pub struct StopPods {
    pub pods: Vec<(String, i64)>,
    pub halt: Halt,
    pub done: oneshot::Sender<()>,
}

/// A halted pod's final status (upstream's wording for both causes).
pub fn mark_failed(status: &mut PodStatus, halt: &Halt) {
    status.phase = Some("Failed".into());
    status.reason = Some(halt.reason.into());
    status.message = Some(halt.message.clone());
    let conds = status.conditions.get_or_insert_with(Vec::new);
    conds.retain(|c| c.type_ != "DisruptionTarget");
    conds.push(PodCondition {
        type_: "DisruptionTarget".into(),
        status: "True".into(),
        reason: Some("TerminationByKubelet".into()),
        message: Some(halt.message.clone()),
        last_transition_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::now(),
        )),
        ..Default::default()
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stopped_pods_are_failed_with_a_disruption_target() {
        let mut s = PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        };
        mark_failed(&mut s, &crate::shutdown::halt());
        mark_failed(&mut s, &crate::shutdown::halt());
        assert_eq!(s.phase.as_deref(), Some("Failed"));
        assert_eq!(s.reason.as_deref(), Some("Terminated"));
        let dt: Vec<&PodCondition> = s
            .conditions
            .iter()
            .flatten()
            .filter(|c| c.type_ == "DisruptionTarget")
            .collect();
        assert_eq!(dt.len(), 1);
    }
}
