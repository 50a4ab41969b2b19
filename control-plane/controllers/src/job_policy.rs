//! How a Job judges its pods (upstream `pkg/controller/job/pod_failure_policy.go`
//! and `success_policy.go`): which failures end the Job, fail an index, or
//! do not count, and when enough indexes succeeded.

use k8s_openapi::api::batch::v1::{
    Job, PodFailurePolicyOnExitCodesRequirement, PodFailurePolicyOnPodConditionsPattern,
};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::ResourceExt;
use kube_util::indexes::Indexes;

/// What the pod failure policy makes of one failed pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Counted against the backoff limits (no rule matched, or `Count`).
    Count,
    /// Not counted: the pod is simply replaced.
    Ignore,
    /// The pod's index fails at once.
    FailIndex,
    /// The whole Job fails, with this message.
    FailJob(String),
}

/// Judge the failed `pod` by the Job's `podFailurePolicy` (the first
/// matching rule decides; no policy or no match counts the failure).
pub fn judge(job: &Job, pod: &Pod) -> Verdict {
    let Some(policy) = job
        .spec
        .as_ref()
        .and_then(|s| s.pod_failure_policy.as_ref())
    else {
        return Verdict::Count;
    };
    let ns = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    for (i, rule) in policy.rules.iter().enumerate() {
        let matched = if let Some(req) = &rule.on_exit_codes {
            exit_code_match(pod, req).map(|(c, code)| {
                format!(
                    "Container {c} for pod {ns}/{name} failed with exit code {code} matching {} rule at index {i}",
                    rule.action
                )
            })
        } else {
            condition_match(pod, rule.on_pod_conditions.as_deref().unwrap_or_default()).map(|t| {
                format!(
                    "Pod {ns}/{name} has condition {t} matching {} rule at index {i}",
                    rule.action
                )
            })
        };
        let Some(message) = matched else {
            continue;
        };
        return match rule.action.as_str() {
            "Ignore" => Verdict::Ignore,
            "FailIndex" => Verdict::FailIndex,
            "FailJob" => Verdict::FailJob(message),
            _ => Verdict::Count,
        };
    }
    Verdict::Count
}

/// The first terminated container (app containers before init ones)
/// whose non-zero exit code the requirement matches.
fn exit_code_match(
    pod: &Pod,
    req: &PodFailurePolicyOnExitCodesRequirement,
) -> Option<(String, i32)> {
    let status = pod.status.as_ref()?;
    let all = status
        .container_statuses
        .iter()
        .flatten()
        .chain(status.init_container_statuses.iter().flatten());
    all.filter(|c| req.container_name.as_ref().is_none_or(|n| *n == c.name))
        .filter_map(|c: &ContainerStatus| {
            let code = c.state.as_ref()?.terminated.as_ref()?.exit_code;
            Some((c.name.clone(), code))
        })
        .find(|(_, code)| {
            *code != 0
                && match req.operator.as_str() {
                    "In" => req.values.contains(code),
                    "NotIn" => !req.values.contains(code),
                    _ => false,
                }
        })
}

/// The type of the first pod condition a pattern matches.
fn condition_match(
    pod: &Pod,
    patterns: &[PodFailurePolicyOnPodConditionsPattern],
) -> Option<String> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    patterns.iter().find_map(|p| {
        // The API server defaults a pattern's status to True.
        let status = p.status.as_deref().unwrap_or("True");
        conditions
            .iter()
            .find(|c| c.type_ == p.type_ && c.status == status)
            .map(|c| c.type_.clone())
    })
}

/// The message of the first success policy rule the succeeded indexes
/// satisfy (upstream `matchSuccessPolicy`).
pub fn success(job: &Job, succeeded: &Indexes) -> Option<String> {
    let spec = job.spec.as_ref()?;
    let policy = spec.success_policy.as_ref()?;
    if succeeded.is_empty() {
        return None;
    }
    let completions = spec.completions.unwrap_or(0);
    policy.rules.iter().enumerate().find_map(|(i, rule)| {
        let met = match (&rule.succeeded_indexes, rule.succeeded_count) {
            (Some(text), count) => {
                let required = Indexes::parse_lenient(text, completions);
                let have = required.iter().filter(|ix| succeeded.contains(*ix)).count();
                !required.is_empty()
                    && match count {
                        Some(n) => have >= usize::try_from(n).unwrap_or(0),
                        None => have == required.len(),
                    }
            }
            (None, Some(n)) => succeeded.len() >= usize::try_from(n).unwrap_or(0),
            (None, None) => false,
        };
        met.then(|| format!("Matched rules at index {i}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job(spec: serde_json::Value) -> Job {
        let mut s = json!({"template": {"spec": {"containers": [{"name": "main", "image": "x"}]}}});
        for (k, v) in spec.as_object().into_iter().flatten() {
            s[k] = v.clone();
        }
        serde_json::from_value(json!({"metadata": {"name": "j"}, "spec": s})).unwrap()
    }

    fn failed_pod(code: i32, conditions: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "status": {
                "phase": "Failed",
                "conditions": conditions,
                "containerStatuses": [{
                    "name": "main", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                    "state": {"terminated": {"exitCode": code}}
                }]
            }
        }))
        .unwrap()
    }

    #[test]
    fn the_first_matching_rule_decides() {
        let j = job(json!({"podFailurePolicy": {"rules": [
            {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [42]}},
            {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [3]}},
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            {"action": "Count", "onExitCodes": {"operator": "NotIn", "values": [5]}}
        ]}}));
        assert_eq!(judge(&j, &failed_pod(42, json!([]))), Verdict::Ignore);
        assert_eq!(
            judge(&j, &failed_pod(3, json!([]))),
            Verdict::FailJob(
                "Container main for pod ns/p failed with exit code 3 matching FailJob rule at index 1".into()
            )
        );
        let evicted = json!([{"type": "DisruptionTarget", "status": "True"}]);
        assert_eq!(judge(&j, &failed_pod(5, evicted)), Verdict::Ignore);
        assert_eq!(judge(&j, &failed_pod(5, json!([]))), Verdict::Count);
        assert_eq!(
            judge(&job(json!({})), &failed_pod(3, json!([]))),
            Verdict::Count
        );
    }

    #[test]
    fn condition_rules_name_the_condition() {
        let j = job(json!({"podFailurePolicy": {"rules": [
            {"action": "FailJob", "onPodConditions": [{"type": "ConfigIssue", "status": "True"}]}
        ]}}));
        let p = failed_pod(1, json!([{"type": "ConfigIssue", "status": "True"}]));
        assert_eq!(
            judge(&j, &p),
            Verdict::FailJob(
                "Pod ns/p has condition ConfigIssue matching FailJob rule at index 0".into()
            )
        );
    }

    #[test]
    fn success_rules_match_as_upstream() {
        let j = job(
            json!({"completionMode": "Indexed", "completions": 10, "successPolicy": {"rules": [
                {"succeededIndexes": "0-3", "succeededCount": 3},
                {"succeededIndexes": "8-9"},
                {"succeededCount": 5}
            ]}}),
        );
        let s = |ix: &[i32]| success(&j, &ix.iter().copied().collect());
        assert_eq!(s(&[]), None);
        assert_eq!(s(&[0, 1, 5]), None);
        assert_eq!(s(&[0, 1, 3]).as_deref(), Some("Matched rules at index 0"));
        assert_eq!(s(&[8, 9]).as_deref(), Some("Matched rules at index 1"));
        assert_eq!(
            s(&[4, 5, 6, 7, 8]).as_deref(),
            Some("Matched rules at index 2")
        );
    }
}
