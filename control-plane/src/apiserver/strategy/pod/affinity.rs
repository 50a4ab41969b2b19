//! What this server's scheduler cannot honour in a pod's inter-pod
//! affinity: a `namespaceSelector` other than `{}` (all namespaces)
//! would need the namespaces' labels, which the scheduler does not
//! watch. Refused with a 422 rather than silently ignored.

use serde_json::Value;

use crate::apiserver::status::Cause;

const DETAIL: &str = "not supported by this server";

/// Refuse non-empty `namespaceSelector`s in the required and preferred
/// terms of `spec.affinity.podAffinity` and `podAntiAffinity`.
pub(crate) fn validate(path: &str, spec: Option<&Value>, c: &mut Vec<Cause>) {
    let Some(affinity) = spec.and_then(|s| s.get("affinity")) else {
        return;
    };
    for kind in ["podAffinity", "podAntiAffinity"] {
        let base = format!("{path}.affinity.{kind}");
        let required = affinity[kind]["requiredDuringSchedulingIgnoredDuringExecution"].as_array();
        for (i, term) in required.into_iter().flatten().enumerate() {
            let field = format!("{base}.requiredDuringSchedulingIgnoredDuringExecution[{i}]");
            check_term(&field, term, c);
        }
        let preferred =
            affinity[kind]["preferredDuringSchedulingIgnoredDuringExecution"].as_array();
        for (i, weighted) in preferred.into_iter().flatten().enumerate() {
            let field = format!(
                "{base}.preferredDuringSchedulingIgnoredDuringExecution[{i}].podAffinityTerm"
            );
            check_term(&field, &weighted["podAffinityTerm"], c);
        }
    }
}

fn check_term(field: &str, term: &Value, c: &mut Vec<Cause>) {
    let Some(sel) = term.get("namespaceSelector").filter(|s| !s.is_null()) else {
        return;
    };
    let empty = |k: &str| match &sel[k] {
        Value::Null => true,
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    };
    if !(empty("matchLabels") && empty("matchExpressions")) {
        c.push(Cause::forbidden(
            format!("{field}.namespaceSelector"),
            DETAIL,
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn causes(affinity: Value) -> Vec<String> {
        let spec = json!({"affinity": affinity});
        let mut c = Vec::new();
        validate("spec", Some(&spec), &mut c);
        c.iter().map(|c| c.line()).collect()
    }

    #[test]
    fn only_the_all_namespaces_selector_is_accepted() {
        let term =
            |sel: Value| json!({"labelSelector": {}, "topologyKey": "k", "namespaceSelector": sel});
        let ok = json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            term(json!({})), term(json!({"matchLabels": {}})), {"topologyKey": "k"}]}});
        assert_eq!(causes(ok), Vec::<String>::new());
        let bad = json!({
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                term(json!({})), term(json!({"matchLabels": {"team": "a"}}))]},
            "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "podAffinityTerm": term(json!({"matchExpressions": [
                    {"key": "team", "operator": "Exists"}]}))}]}});
        assert_eq!(
            causes(bad),
            [
                "spec.affinity.podAffinity.preferredDuringSchedulingIgnoredDuringExecution[0]\
                 .podAffinityTerm.namespaceSelector: Forbidden: not supported by this server",
                "spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[1]\
                 .namespaceSelector: Forbidden: not supported by this server",
            ]
        );
    }
}
