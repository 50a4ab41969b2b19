//! Upstream `ValidateJobSpec` for what decides how a Job runs and ends:
//! counts and limits, the Indexed completion mode with its per-index
//! limits, `podFailurePolicy`, `successPolicy` and `podReplacementPolicy`.

use kube_util::indexes::Indexes;
use serde_json::Value;

use crate::apiserver::status::Cause;

/// Upstream's caps for Indexed Jobs.
const MAX_PARALLELISM_INDEXED: i64 = 100_000;
const MAX_FAILED_INDEXES: i64 = 100_000;
const COMPLETIONS_SOFT_LIMIT: i64 = 100_000;
const PARALLELISM_HIGH_COMPLETIONS: i64 = 10_000;
const MAX_FAILED_INDEXES_HIGH_COMPLETIONS: i64 = 10_000;
const MAX_POLICY_RULES: usize = 20;
const MAX_EXIT_CODES: usize = 255;
const MAX_CONDITION_PATTERNS: usize = 20;
const MAX_SUCCESS_RULES: usize = 20;

/// Everything below about `spec`.
pub fn spec(spec: &Value, c: &mut Vec<Cause>) {
    for field in [
        "parallelism",
        "completions",
        "activeDeadlineSeconds",
        "backoffLimit",
        "ttlSecondsAfterFinished",
        "backoffLimitPerIndex",
        "maxFailedIndexes",
    ] {
        if let Some(n) = spec[field].as_i64().filter(|n| *n < 0) {
            c.push(Cause::invalid(
                format!("spec.{field}"),
                &n.to_string(),
                "must be greater than or equal to 0",
            ));
        }
    }
    let indexed = completion_mode(spec, c);
    if !spec["maxFailedIndexes"].is_null() && spec["backoffLimitPerIndex"].is_null() {
        c.push(Cause::required_because(
            "spec.backoffLimitPerIndex",
            "when maxFailedIndexes is specified",
        ));
    }
    if indexed {
        indexed_limits(spec, c);
    } else {
        for field in ["backoffLimitPerIndex", "maxFailedIndexes"] {
            if let Some(n) = spec[field].as_i64() {
                c.push(Cause::invalid(
                    format!("spec.{field}"),
                    &n.to_string(),
                    "requires indexed completion mode",
                ));
            }
        }
    }
    if spec["podFailurePolicy"].is_object() {
        pod_failure_policy(spec, c);
    }
    if !spec["successPolicy"].is_null() {
        success_policy(spec, indexed, c);
    }
    pod_replacement_policy(spec, c);
    if spec["podFailurePolicy"].is_object() {
        if let Some(rp) = spec["template"]["spec"]["restartPolicy"]
            .as_str()
            .filter(|rp| *rp == "OnFailure")
        {
            c.push(Cause::invalid(
                "spec.template.spec.restartPolicy",
                rp,
                "only \"Never\" is supported when podFailurePolicy is specified",
            ));
        }
    }
}

/// Whether the Job is Indexed (after checking the mode is known).
fn completion_mode(spec: &Value, c: &mut Vec<Cause>) -> bool {
    match spec["completionMode"].as_str() {
        None | Some("NonIndexed") => false,
        Some("Indexed") => true,
        Some(other) => {
            c.push(Cause::not_supported(
                "spec.completionMode",
                other,
                &["Indexed", "NonIndexed"],
            ));
            false
        }
    }
}

fn indexed_limits(spec: &Value, c: &mut Vec<Cause>) {
    let completions = spec["completions"].as_i64();
    let parallelism = spec["parallelism"].as_i64();
    let max_failed = spec["maxFailedIndexes"].as_i64();
    if completions.is_none() {
        c.push(Cause::required_because(
            "spec.completions",
            "when completion mode is Indexed",
        ));
    }
    if let Some(p) = parallelism.filter(|p| *p > MAX_PARALLELISM_INDEXED) {
        c.push(Cause::invalid(
            "spec.parallelism",
            &p.to_string(),
            &format!("must be less than or equal to {MAX_PARALLELISM_INDEXED} when completion mode is Indexed"),
        ));
    }
    if let (Some(n), Some(m)) = (completions, max_failed) {
        if m > n {
            c.push(Cause::invalid(
                "spec.maxFailedIndexes",
                &m.to_string(),
                "must be less than or equal to completions",
            ));
        }
    }
    if let Some(m) = max_failed.filter(|m| *m > MAX_FAILED_INDEXES) {
        c.push(Cause::invalid(
            "spec.maxFailedIndexes",
            &m.to_string(),
            &format!("must be less than or equal to {MAX_FAILED_INDEXES}"),
        ));
    }
    let high = completions.is_some_and(|n| n > COMPLETIONS_SOFT_LIMIT);
    if high && !spec["backoffLimitPerIndex"].is_null() {
        let why = format!(
            "when completions are above {COMPLETIONS_SOFT_LIMIT} and used with backoff limit per index"
        );
        if max_failed.is_none() {
            c.push(Cause::required_because(
                "spec.maxFailedIndexes",
                &format!("must be specified when completions is above {COMPLETIONS_SOFT_LIMIT}"),
            ));
        }
        if let Some(p) = parallelism.filter(|p| *p > PARALLELISM_HIGH_COMPLETIONS) {
            c.push(Cause::invalid(
                "spec.parallelism",
                &p.to_string(),
                &format!("must be less than or equal to {PARALLELISM_HIGH_COMPLETIONS} {why}"),
            ));
        }
        if let Some(m) = max_failed.filter(|m| *m > MAX_FAILED_INDEXES_HIGH_COMPLETIONS) {
            c.push(Cause::invalid(
                "spec.maxFailedIndexes",
                &m.to_string(),
                &format!(
                    "must be less than or equal to {MAX_FAILED_INDEXES_HIGH_COMPLETIONS} {why}"
                ),
            ));
        }
    }
}

fn pod_failure_policy(spec: &Value, c: &mut Vec<Cause>) {
    let rules = spec["podFailurePolicy"]["rules"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let path = "spec.podFailurePolicy.rules";
    if rules.len() > MAX_POLICY_RULES {
        c.push(Cause::too_many(path, rules.len(), MAX_POLICY_RULES));
    }
    let pod = &spec["template"]["spec"];
    let names: Vec<&str> = ["containers", "initContainers"]
        .iter()
        .flat_map(|k| pod[*k].as_array().into_iter().flatten())
        .filter_map(|c| c["name"].as_str())
        .collect();
    let per_index = !spec["backoffLimitPerIndex"].is_null();
    for (i, rule) in rules.iter().enumerate() {
        let rp = format!("{path}[{i}]");
        match rule["action"].as_str().unwrap_or_default() {
            "" => c.push(Cause::required_because(
                format!("{rp}.action"),
                "valid values: [\"Count\" \"FailIndex\" \"FailJob\" \"Ignore\"]",
            )),
            "FailIndex" if !per_index => c.push(Cause::invalid(
                format!("{rp}.action"),
                "FailIndex",
                "requires the backoffLimitPerIndex to be set",
            )),
            "FailIndex" | "FailJob" | "Ignore" | "Count" => {}
            other => c.push(Cause::not_supported(
                format!("{rp}.action"),
                other,
                &["Count", "FailIndex", "FailJob", "Ignore"],
            )),
        }
        let on_codes = rule["onExitCodes"].is_object();
        let on_conds = rule["onPodConditions"]
            .as_array()
            .is_some_and(|a| !a.is_empty());
        if on_codes {
            exit_codes(
                &rule["onExitCodes"],
                &format!("{rp}.onExitCodes"),
                &names,
                c,
            );
        }
        if on_conds {
            pod_conditions(
                &rule["onPodConditions"],
                &format!("{rp}.onPodConditions"),
                c,
            );
        }
        if on_codes && on_conds {
            c.push(Cause::invalid(
                rp.clone(),
                "",
                "specifying both OnExitCodes and OnPodConditions is not supported",
            ));
        } else if !on_codes && !on_conds {
            c.push(Cause::invalid(
                rp,
                "",
                "specifying one of OnExitCodes and OnPodConditions is required",
            ));
        }
    }
}

fn exit_codes(req: &Value, path: &str, containers: &[&str], c: &mut Vec<Cause>) {
    let op = req["operator"].as_str().unwrap_or_default();
    match op {
        "" => c.push(Cause::required_because(
            format!("{path}.operator"),
            "valid values: [\"In\" \"NotIn\"]",
        )),
        "In" | "NotIn" => {}
        other => c.push(Cause::not_supported(
            format!("{path}.operator"),
            other,
            &["In", "NotIn"],
        )),
    }
    if let Some(name) = req["containerName"].as_str() {
        if !containers.contains(&name) {
            c.push(Cause::invalid(
                format!("{path}.containerName"),
                name,
                "must be one of the container or initContainer names in the pod template",
            ));
        }
    }
    let values: Vec<i64> = req["values"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_i64)
        .collect();
    let vp = format!("{path}.values");
    if values.is_empty() {
        c.push(Cause::invalid(
            vp.clone(),
            "[]",
            "at least one value is required",
        ));
    } else if values.len() > MAX_EXIT_CODES {
        c.push(Cause::too_many(vp.clone(), values.len(), MAX_EXIT_CODES));
    }
    let mut seen = std::collections::HashSet::new();
    for (j, v) in values.iter().enumerate() {
        if op == "In" && *v == 0 {
            c.push(Cause::invalid(
                format!("{vp}[{j}]"),
                "0",
                "must not be 0 for the In operator",
            ));
        }
        if !seen.insert(*v) {
            c.push(Cause::duplicate(format!("{vp}[{j}]"), &v.to_string()));
        }
    }
    if values.windows(2).any(|w| w[0] > w[1]) {
        c.push(Cause::invalid(
            vp,
            &format!("{values:?}"),
            "must be ordered",
        ));
    }
}

fn pod_conditions(patterns: &Value, path: &str, c: &mut Vec<Cause>) {
    let patterns = patterns.as_array().cloned().unwrap_or_default();
    if patterns.len() > MAX_CONDITION_PATTERNS {
        c.push(Cause::too_many(
            path,
            patterns.len(),
            MAX_CONDITION_PATTERNS,
        ));
    }
    for (j, p) in patterns.iter().enumerate() {
        let type_ = p["type"].as_str().unwrap_or_default();
        if type_.is_empty() {
            c.push(Cause::required(format!("{path}[{j}].type")));
        }
        match p["status"].as_str().unwrap_or_default() {
            "" => c.push(Cause::required_because(
                format!("{path}[{j}].status"),
                "valid values: [\"False\" \"True\" \"Unknown\"]",
            )),
            "True" | "False" | "Unknown" => {}
            other => c.push(Cause::not_supported(
                format!("{path}[{j}].status"),
                other,
                &["False", "True", "Unknown"],
            )),
        }
    }
}

fn success_policy(spec: &Value, indexed: bool, c: &mut Vec<Cause>) {
    let path = "spec.successPolicy";
    if !indexed {
        c.push(Cause::invalid(
            path,
            &spec["successPolicy"].to_string(),
            "requires indexed completion mode",
        ));
        return;
    }
    let rules = spec["successPolicy"]["rules"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if rules.is_empty() {
        c.push(Cause::required_because(
            format!("{path}.rules"),
            "at least one rules must be specified when the successPolicy is specified",
        ));
    }
    if rules.len() > MAX_SUCCESS_RULES {
        c.push(Cause::too_many(
            format!("{path}.rules"),
            rules.len(),
            MAX_SUCCESS_RULES,
        ));
    }
    let completions = spec["completions"].as_i64().unwrap_or(0);
    let completions32 = i32::try_from(completions).unwrap_or(i32::MAX);
    for (i, rule) in rules.iter().enumerate() {
        let rp = format!("{path}.rules[{i}]");
        let indexes = rule["succeededIndexes"].as_str();
        let count = rule["succeededCount"].as_i64();
        if indexes.is_none() && count.is_none() {
            c.push(Cause::required_because(
                rp.clone(),
                "at least one of succeededCount or succeededIndexes must be specified",
            ));
        }
        let mut total = None;
        if let Some(s) = indexes {
            match Indexes::parse(s, completions32) {
                Ok(ix) => total = Some(ix.len() as i64),
                Err(e) => c.push(Cause::invalid(
                    format!("{rp}.succeededIndexes"),
                    s,
                    &format!("error parsing succeededIndexes: {e}"),
                )),
            }
        }
        if let Some(n) = count {
            let field = format!("{rp}.succeededCount");
            if n < 0 {
                c.push(Cause::invalid(
                    field,
                    &n.to_string(),
                    "must be greater than or equal to 0",
                ));
            } else if n > completions {
                c.push(Cause::invalid(
                    field,
                    &n.to_string(),
                    &format!("must be less than or equal to {completions} (the number of specified completions)"),
                ));
            } else if let Some(t) = total.filter(|t| n > *t) {
                c.push(Cause::invalid(
                    field,
                    &n.to_string(),
                    &format!("must be less than or equal to {t} (the number of indexes in the specified succeededIndexes field)"),
                ));
            }
        }
    }
}

fn pod_replacement_policy(spec: &Value, c: &mut Vec<Cause>) {
    let Some(p) = spec["podReplacementPolicy"].as_str() else {
        return;
    };
    if spec["podFailurePolicy"].is_object() {
        if p != "Failed" {
            c.push(Cause::not_supported(
                "spec.podReplacementPolicy",
                p,
                &["Failed"],
            ));
        }
    } else if !matches!(p, "Failed" | "TerminatingOrFailed") {
        c.push(Cause::not_supported(
            "spec.podReplacementPolicy",
            p,
            &["Failed", "TerminatingOrFailed"],
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn causes(extra: Value) -> String {
        let mut spec = json!({
            "parallelism": 1,
            "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "main", "image": "busybox"}]
            }}
        });
        for (k, v) in extra.as_object().into_iter().flatten() {
            spec[k] = v.clone();
        }
        let mut c = Vec::new();
        super::spec(&spec, &mut c);
        format!("{c:?}")
    }

    #[test]
    fn indexed_jobs_need_completions_and_per_index_limits_need_indexed() {
        assert_eq!(
            causes(json!({"completionMode": "Indexed", "completions": 5})),
            "[]"
        );
        let c = causes(json!({"completionMode": "Indexed"}));
        assert!(c.contains("when completion mode is Indexed"), "{c}");
        let c = causes(json!({"backoffLimitPerIndex": 1, "maxFailedIndexes": 1}));
        assert!(c.contains("spec.backoffLimitPerIndex"), "{c}");
        assert!(c.contains("requires indexed completion mode"), "{c}");
        let c =
            causes(json!({"completionMode": "Indexed", "completions": 2, "maxFailedIndexes": 3}));
        assert!(c.contains("when maxFailedIndexes is specified"), "{c}");
        assert!(
            c.contains("must be less than or equal to completions"),
            "{c}"
        );
        let c = causes(json!({"backoffLimit": -1}));
        assert!(c.contains("spec.backoffLimit"), "{c}");
    }

    #[test]
    fn pod_failure_policies_are_checked_as_upstream() {
        let ok = json!({"podFailurePolicy": {"rules": [
            {"action": "Ignore", "onExitCodes": {"containerName": "main", "operator": "In", "values": [42]}},
            {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [3]}},
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
        ]}, "podReplacementPolicy": "Failed"});
        assert_eq!(causes(ok), "[]");
        for (rule, want) in [
            (
                json!({"action": "FailIndex", "onExitCodes": {"operator": "In", "values": [1]}}),
                "requires the backoffLimitPerIndex to be set",
            ),
            (
                json!({"action": "Restart", "onExitCodes": {"operator": "In", "values": [1]}}),
                "Unsupported value: \\\"Restart\\\"",
            ),
            (
                json!({"action": "Count", "onExitCodes": {"operator": "In", "values": [0]}}),
                "must not be 0 for the In operator",
            ),
            (
                json!({"action": "Count", "onExitCodes": {"operator": "NotIn", "values": [3, 1]}}),
                "must be ordered",
            ),
            (
                json!({"action": "Count", "onExitCodes": {"operator": "In", "values": [1, 1]}}),
                "Duplicate value",
            ),
            (
                json!({"action": "Count", "onExitCodes": {"operator": "In", "values": []}}),
                "at least one value is required",
            ),
            (
                json!({"action": "Count", "onExitCodes": {"containerName": "x", "operator": "In", "values": [1]}}),
                "must be one of the container or initContainer names",
            ),
            (
                json!({"action": "Count"}),
                "specifying one of OnExitCodes and OnPodConditions is required",
            ),
        ] {
            let c = causes(json!({"podFailurePolicy": {"rules": [rule]}}));
            assert!(c.contains(want), "{want}: {c}");
        }
        let c = causes(json!({
            "podFailurePolicy": {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]},
            "podReplacementPolicy": "TerminatingOrFailed"
        }));
        assert!(c.contains("spec.podReplacementPolicy"), "{c}");
    }

    #[test]
    fn success_policies_are_checked_as_upstream() {
        let base = json!({"completionMode": "Indexed", "completions": 5});
        let with = |rules: Value| {
            let mut s = base.clone();
            s["successPolicy"] = json!({"rules": rules});
            causes(s)
        };
        assert_eq!(
            with(json!([{"succeededIndexes": "0-2", "succeededCount": 2}])),
            "[]"
        );
        assert!(with(json!([])).contains("at least one rules must be specified"));
        assert!(with(json!([{}])).contains("at least one of succeededCount or succeededIndexes"));
        assert!(with(json!([{"succeededIndexes": "3,1"}]))
            .contains("error parsing succeededIndexes: non-increasing order"));
        assert!(with(json!([{"succeededIndexes": "7"}])).contains("too large index"));
        assert!(
            with(json!([{"succeededCount": 6}])).contains("(the number of specified completions)")
        );
        assert!(
            with(json!([{"succeededIndexes": "0-1", "succeededCount": 3}]))
                .contains("(the number of indexes in the specified succeededIndexes field)")
        );
        let c = causes(json!({"successPolicy": {"rules": [{"succeededCount": 1}]}}));
        assert!(c.contains("requires indexed completion mode"), "{c}");
    }
}
