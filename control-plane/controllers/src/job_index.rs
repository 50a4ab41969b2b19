//! Indexed Jobs (upstream `pkg/controller/job/indexed_job_utils.go`): each
//! pod works on one completion index, carried in an annotation (and a
//! label), the `JOB_COMPLETION_INDEX` variable and the hostname
//! `JOBNAME-INDEX`; with `backoffLimitPerIndex` each pod also carries how
//! often its index failed before it.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector, Pod, PodTemplateSpec};
use kube_util::indexes::Indexes;

use crate::pods;

pub const INDEX_ANNOTATION: &str = "batch.kubernetes.io/job-completion-index";
pub const INDEX_LABEL: &str = "batch.kubernetes.io/job-completion-index";
pub const INDEX_ENV: &str = "JOB_COMPLETION_INDEX";
/// Counted failures of the pod's index before this pod.
pub const FAILURE_COUNT_ANNOTATION: &str = "batch.kubernetes.io/job-index-failure-count";
/// Failures of the pod's index that a pod failure policy ignored.
pub const IGNORED_COUNT_ANNOTATION: &str = "batch.kubernetes.io/job-index-ignored-failure-count";

/// The pod's completion index, when it has a valid one below
/// `completions`.
pub fn index_of(pod: &Pod, completions: i32) -> Option<i32> {
    let meta = &pod.metadata;
    let text = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(INDEX_ANNOTATION))
        .or_else(|| meta.labels.as_ref().and_then(|l| l.get(INDEX_LABEL)))?;
    text.parse::<i32>()
        .ok()
        .filter(|i| (0..completions).contains(i))
}

/// Upstream `podGenerateNameWithIndex`: the Job's name, cut so that the
/// index and the random suffix still fit in a name.
pub fn generate_name(job: &str, index: i32) -> String {
    const MAX_GENERATE_NAME: usize = 63 - 5;
    let suffix = format!("-{index}-");
    let mut cut = job
        .len()
        .min(MAX_GENERATE_NAME.saturating_sub(suffix.len()));
    while !job.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}{suffix}", &job[..cut])
}

/// `JOB_COMPLETION_INDEX` from the index annotation, in every container
/// and init container that does not set it itself.
pub fn add_index_env(template: &mut PodTemplateSpec) {
    let Some(spec) = template.spec.as_mut() else {
        return;
    };
    let var = EnvVar {
        name: INDEX_ENV.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: format!("metadata.annotations['{INDEX_ANNOTATION}']"),
                api_version: None,
            }),
            ..Default::default()
        }),
        value: None,
    };
    let all = spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten());
    for c in all {
        let env = c.env.get_or_insert_with(Vec::new);
        if !env.iter().any(|e| e.name == INDEX_ENV) {
            env.push(var.clone());
        }
    }
}

/// The template of the pod for `index`: its index, hostname and, with
/// per-index limits, the failure counts it inherits.
pub fn template_for(
    template: &PodTemplateSpec,
    job: &str,
    index: i32,
    counts: Option<FailureCounts>,
) -> PodTemplateSpec {
    let mut t = template.clone();
    let meta = t.metadata.get_or_insert_with(Default::default);
    let annotations = meta.annotations.get_or_insert_with(Default::default);
    annotations.insert(INDEX_ANNOTATION.into(), index.to_string());
    if let Some(c) = counts {
        annotations.insert(FAILURE_COUNT_ANNOTATION.into(), c.failed.to_string());
        if c.ignored > 0 {
            annotations.insert(IGNORED_COUNT_ANNOTATION.into(), c.ignored.to_string());
        }
    }
    meta.labels
        .get_or_insert_with(Default::default)
        .insert(INDEX_LABEL.into(), index.to_string());
    if let Some(spec) = t.spec.as_mut() {
        spec.hostname = Some(format!("{job}-{index}"));
    }
    t
}

/// How often an index failed, counted and ignored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FailureCounts {
    pub failed: i32,
    pub ignored: i32,
}

fn annotation_count(pod: &Pod, key: &str) -> i32 {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .and_then(|v| v.parse().ok())
        .filter(|n: &i32| *n >= 0)
        .unwrap_or(0)
}

/// Counted failures of the index before `pod` ran.
pub fn failures_before(pod: &Pod) -> i32 {
    annotation_count(pod, FAILURE_COUNT_ANNOTATION)
}

/// The counts a replacement for the failed `pod` inherits (upstream
/// `getNewIndexFailureCounts`): one more ignored or one more counted.
pub fn counts_after(pod: &Pod, ignored: bool) -> FailureCounts {
    let mut c = FailureCounts {
        failed: failures_before(pod),
        ignored: annotation_count(pod, IGNORED_COUNT_ANNOTATION),
    };
    if ignored {
        c.ignored += 1;
    } else {
        c.failed += 1;
    }
    c
}

/// The last failed pod of each index: the one a new pod for that index
/// replaces.
pub fn last_failed(pods: &[Arc<Pod>], completions: i32) -> Vec<(i32, Arc<Pod>)> {
    let mut by_index: std::collections::BTreeMap<i32, Arc<Pod>> = Default::default();
    for p in pods.iter().filter(|p| pods::phase(p) == "Failed") {
        let Some(ix) = index_of(p, completions) else {
            continue;
        };
        let newer = by_index.get(&ix).is_none_or(|q| {
            p.metadata.creation_timestamp.as_ref().map(|t| t.0)
                > q.metadata.creation_timestamp.as_ref().map(|t| t.0)
        });
        if newer {
            by_index.insert(ix, p.clone());
        }
    }
    by_index.into_iter().collect()
}

/// The `n` lowest indexes below `completions` that are neither done nor
/// taken (upstream `firstPendingIndexes`).
pub fn first_pending(completions: i32, done: &[&Indexes], taken: &Indexes, n: usize) -> Vec<i32> {
    (0..completions)
        .filter(|i| !taken.contains(*i) && !done.iter().any(|d| d.contains(*i)))
        .take(n)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn names_keep_the_index_within_the_name_limit() {
        assert_eq!(generate_name("pi", 3), "pi-3-");
        let long = "j".repeat(70);
        let name = generate_name(&long, 12345);
        assert!(name.ends_with("-12345-"), "{name}");
        assert_eq!(name.len(), 58);
    }

    #[test]
    fn templates_carry_index_hostname_env_and_counts() {
        let mut t: PodTemplateSpec = serde_json::from_value(serde_json::json!({
            "spec": {"containers": [
                {"name": "a", "image": "x"},
                {"name": "b", "image": "x", "env": [{"name": "JOB_COMPLETION_INDEX", "value": "mine"}]}
            ]}
        }))
        .unwrap();
        add_index_env(&mut t);
        let t = template_for(
            &t,
            "work",
            4,
            Some(FailureCounts {
                failed: 2,
                ignored: 0,
            }),
        );
        let meta = t.metadata.clone().unwrap();
        assert_eq!(meta.annotations.as_ref().unwrap()[INDEX_ANNOTATION], "4");
        assert_eq!(
            meta.annotations.as_ref().unwrap()[FAILURE_COUNT_ANNOTATION],
            "2"
        );
        assert_eq!(meta.labels.as_ref().unwrap()[INDEX_LABEL], "4");
        let spec = t.spec.unwrap();
        assert_eq!(spec.hostname.as_deref(), Some("work-4"));
        let env_a = spec.containers[0].env.clone().unwrap();
        assert_eq!(
            env_a[0]
                .value_from
                .as_ref()
                .unwrap()
                .field_ref
                .as_ref()
                .unwrap()
                .field_path,
            "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        );
        let env_b = spec.containers[1].env.clone().unwrap();
        assert_eq!(env_b.len(), 1);
        assert_eq!(env_b[0].value.as_deref(), Some("mine"));
    }

    #[test]
    fn indexes_are_read_and_counts_inherited() {
        let mut p = Pod::default();
        p.metadata.annotations = Some(BTreeMap::from([
            (INDEX_ANNOTATION.to_string(), "2".to_string()),
            (FAILURE_COUNT_ANNOTATION.to_string(), "1".to_string()),
        ]));
        assert_eq!(index_of(&p, 3), Some(2));
        assert_eq!(index_of(&p, 2), None);
        assert_eq!(
            counts_after(&p, false),
            FailureCounts {
                failed: 2,
                ignored: 0
            }
        );
        assert_eq!(
            counts_after(&p, true),
            FailureCounts {
                failed: 1,
                ignored: 1
            }
        );
        let done: Indexes = [0, 2].into_iter().collect();
        let taken: Indexes = [1].into_iter().collect();
        assert_eq!(first_pending(6, &[&done], &taken, 2), [3, 4]);
    }
}
