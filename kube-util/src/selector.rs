//! Label selectors (`matchLabels` + `matchExpressions` with In, NotIn,
//! Exists, DoesNotExist) against labels, and plain `key: value` map
//! selectors (a Service's selector, a pod's `spec.nodeSelector`).
//!
//! kube-core's [`Selector`] has exactly upstream's `labels.Selector`
//! semantics for these operators, and [`selector`] turns a
//! `LabelSelector` into one (for list and watch parameters, or to test
//! one selector against many objects). [`matches`] gives the same answer
//! straight from the `LabelSelector`, without building one: controllers
//! call it for every pod against every owner, where the conversion's
//! clone and sets would be most of the cost.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::Selector;

/// A `LabelSelector` that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// An operator other than In, NotIn, Exists, DoesNotExist, or In /
    /// NotIn without values (upstream `LabelSelectorAsSelector` refuses
    /// both; API validation refuses them on stored objects).
    #[error("invalid label selector: {0}")]
    Invalid(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `sel` as a reusable [`Selector`].
///
/// # Errors
/// [`Error::Invalid`] for an operator kube-core does not know or In /
/// NotIn without values.
pub fn selector(sel: &LabelSelector) -> Result<Selector> {
    Selector::try_from(sel.clone()).map_err(|e| Error::Invalid(e.to_string()))
}

/// Whether `labels` match `sel`. An empty selector matches everything (a
/// missing one, nothing: callers handle `None`); an invalid one nothing,
/// as upstream controllers skip an object whose selector does not parse.
pub fn matches(sel: &LabelSelector, labels: Option<&BTreeMap<String, String>>) -> bool {
    let get = |k: &str| labels.and_then(|l| l.get(k));
    let by_labels = sel
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| get(k) == Some(v));
    by_labels
        && sel.match_expressions.iter().flatten().all(|e| {
            let have = get(&e.key);
            match (e.operator.as_str(), e.values.as_deref()) {
                ("In", Some(values)) => have.is_some_and(|h| values.contains(h)),
                ("NotIn", Some(values)) => have.is_none_or(|h| !values.contains(h)),
                ("Exists", _) => have.is_some(),
                ("DoesNotExist", _) => have.is_none(),
                // What `selector` refuses.
                _ => false,
            }
        })
}

/// Whether a selector has no terms at all, so that it would select
/// everything: upstream controllers refuse to act on such a selector.
pub fn is_empty(sel: &LabelSelector) -> bool {
    sel.match_labels.as_ref().is_none_or(|m| m.is_empty())
        && sel.match_expressions.as_ref().is_none_or(|e| e.is_empty())
}

/// Whether every `key: value` of the map selector `sel` is among
/// `labels` (a Service's selector, a pod's `spec.nodeSelector`). An empty
/// map matches everything.
pub fn map_matches(
    sel: &BTreeMap<String, String>,
    labels: Option<&BTreeMap<String, String>>,
) -> bool {
    sel.iter()
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn expr(key: &str, op: &str, values: Option<&[&str]>) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: values.map(|v| v.iter().map(|s| s.to_string()).collect()),
        }
    }

    #[test]
    fn match_labels_and_expressions() {
        let sel = LabelSelector {
            match_labels: Some(labels(&[("app", "web")])),
            match_expressions: Some(vec![expr("tier", "NotIn", Some(&["db"]))]),
        };
        assert!(matches(&sel, Some(&labels(&[("app", "web")]))));
        assert!(matches(
            &sel,
            Some(&labels(&[("app", "web"), ("tier", "fe")]))
        ));
        assert!(!matches(
            &sel,
            Some(&labels(&[("app", "web"), ("tier", "db")]))
        ));
        assert!(!matches(&sel, Some(&labels(&[("app", "api")]))));
        assert!(!matches(&sel, None));
        assert!(matches(&LabelSelector::default(), None));
    }

    #[test]
    fn every_operator() {
        let l = labels(&[("disk", "ssd")]);
        let one = |e| LabelSelector {
            match_expressions: Some(vec![e]),
            ..Default::default()
        };
        let cases = [
            (expr("disk", "In", Some(&["ssd", "nvme"])), true),
            (expr("disk", "In", Some(&["hdd"])), false),
            (expr("missing", "In", Some(&["x"])), false),
            (expr("disk", "NotIn", Some(&["hdd"])), true),
            (expr("missing", "NotIn", Some(&["x"])), true),
            (expr("disk", "NotIn", Some(&["ssd"])), false),
            (expr("disk", "Exists", None), true),
            (expr("missing", "Exists", None), false),
            (expr("missing", "DoesNotExist", None), true),
            (expr("disk", "DoesNotExist", None), false),
            // Invalid selectors select nothing.
            (expr("disk", "Gt", Some(&["1"])), false),
            (expr("disk", "In", None), false),
        ];
        for (e, want) in cases {
            assert_eq!(matches(&one(e.clone()), Some(&l)), want, "{e:?}");
        }
        assert!(selector(&one(expr("disk", "Bogus", None))).is_err());
    }

    #[test]
    fn agrees_with_kube_core() {
        use kube::core::SelectorExt;
        let sets = [
            labels(&[]),
            labels(&[("disk", "ssd")]),
            labels(&[("disk", "hdd"), ("app", "web")]),
        ];
        let sels = [
            LabelSelector::default(),
            LabelSelector {
                match_labels: Some(labels(&[("app", "web")])),
                match_expressions: Some(vec![expr("disk", "NotIn", Some(&["ssd"]))]),
            },
            LabelSelector {
                match_expressions: Some(vec![
                    expr("disk", "In", Some(&["ssd", "hdd"])),
                    expr("zone", "DoesNotExist", None),
                    expr("disk", "Exists", None),
                ]),
                ..Default::default()
            },
        ];
        for sel in &sels {
            let s = selector(sel).unwrap();
            for l in &sets {
                assert_eq!(matches(sel, Some(l)), s.matches(l), "{sel:?} {l:?}");
            }
        }
    }

    #[test]
    fn empty_and_map_selectors() {
        assert!(is_empty(&LabelSelector::default()));
        assert!(is_empty(&LabelSelector {
            match_labels: Some(BTreeMap::new()),
            match_expressions: Some(vec![]),
        }));
        assert!(!is_empty(&LabelSelector {
            match_expressions: Some(vec![expr("a", "Exists", None)]),
            ..Default::default()
        }));
        let l = labels(&[("a", "1"), ("b", "2")]);
        assert!(map_matches(&labels(&[("a", "1")]), Some(&l)));
        assert!(!map_matches(&labels(&[("a", "2")]), Some(&l)));
        assert!(!map_matches(&labels(&[("a", "1")]), None));
        assert!(map_matches(&BTreeMap::new(), None));
    }
}
