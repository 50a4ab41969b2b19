//! Policy rules: whether one allows a request (upstream's `RuleAllows`),
//! whether a set of rules covers another (`Covers`, the heart of the
//! escalation check), and how a missing rule is worded in a 403
//! (`CompactString`).

use k8s_openapi::api::rbac::v1::PolicyRule;

use crate::auth::Attributes;

const ALL: &str = "*";

fn list(v: &Option<Vec<String>>) -> &[String] {
    v.as_deref().unwrap_or_default()
}

fn has(set: &[String], want: &str) -> bool {
    set.iter().any(|x| x == want)
}

fn has_or_all(set: &[String], want: &str) -> bool {
    set.iter().any(|x| x == ALL || x == want)
}

/// One rule against a request.
pub fn allows(rule: &PolicyRule, a: &Attributes) -> bool {
    if !has_or_all(&rule.verbs, &a.verb) {
        return false;
    }
    if !a.resource_request {
        return list(&rule.non_resource_urls)
            .iter()
            .any(|u| u == ALL || url_covers(u, &a.path));
    }
    if !has_or_all(list(&rule.api_groups), &a.group) {
        return false;
    }
    if !resource_matches(list(&rule.resources), &a.resource, &a.subresource) {
        return false;
    }
    let names = list(&rule.resource_names);
    names.is_empty() || has(names, &a.name)
}

/// `*`, the exact `resource[/subresource]`, or `*/subresource`.
fn resource_matches(rules: &[String], resource: &str, sub: &str) -> bool {
    rules.iter().any(|r| {
        if r == ALL {
            return true;
        }
        if sub.is_empty() {
            return r == resource;
        }
        r.strip_prefix(resource)
            .and_then(|rest| rest.strip_prefix('/'))
            .is_some_and(|s| s == sub)
            || r.strip_prefix("*/") == Some(sub)
    })
}

fn url_covers(owner: &str, path: &str) -> bool {
    owner == path || (owner.ends_with('*') && path.starts_with(owner.trim_end_matches('*')))
}

/// Every rule broken into rules of one verb, one group, one resource and
/// at most one name (or one verb and one URL): each is then covered by a
/// single owner rule or not at all (upstream's `BreakdownRule`).
fn breakdown(rule: &PolicyRule) -> Vec<PolicyRule> {
    let one = |s: &String| Some(vec![s.clone()]);
    let mut out = Vec::new();
    for group in list(&rule.api_groups) {
        for resource in list(&rule.resources) {
            for verb in &rule.verbs {
                let base = PolicyRule {
                    api_groups: one(group),
                    resources: one(resource),
                    verbs: vec![verb.clone()],
                    ..Default::default()
                };
                let names = list(&rule.resource_names);
                if names.is_empty() {
                    out.push(base);
                } else {
                    out.extend(names.iter().map(|n| PolicyRule {
                        resource_names: one(n),
                        ..base.clone()
                    }));
                }
            }
        }
    }
    for url in list(&rule.non_resource_urls) {
        for verb in &rule.verbs {
            out.push(PolicyRule {
                non_resource_urls: one(url),
                verbs: vec![verb.clone()],
                ..Default::default()
            });
        }
    }
    out
}

/// Whether `owner` covers the broken-down rule `sub` (upstream's
/// `ruleCovers`).
fn covers_one(owner: &PolicyRule, sub: &PolicyRule) -> bool {
    let all_in = |set: &[String], want: &[String]| want.iter().all(|w| has(set, w));
    let verbs = has(&owner.verbs, ALL) || all_in(&owner.verbs, &sub.verbs);
    let groups =
        has(list(&owner.api_groups), ALL) || all_in(list(&owner.api_groups), list(&sub.api_groups));
    let owned = list(&owner.resources);
    let resources = has(owned, ALL)
        || list(&sub.resources).iter().all(|path| {
            has(owned, path)
                || path
                    .split_once('/')
                    .is_some_and(|(_, s)| has(owned, &format!("*/{s}")))
        });
    let urls = list(&sub.non_resource_urls).iter().all(|p| {
        list(&owner.non_resource_urls)
            .iter()
            .any(|o| url_covers(o, p))
    });
    let names = list(&owner.resource_names).is_empty()
        || (!list(&sub.resource_names).is_empty()
            && all_in(list(&owner.resource_names), list(&sub.resource_names)));
    verbs && groups && resources && urls && names
}

/// Whether `owner` covers every permission of `servant`; the broken-down
/// rules it does not cover, compacted (rules differing only by verb are
/// merged, as upstream's `CompactRules`), when not.
pub fn covers(owner: &[PolicyRule], servant: &[PolicyRule]) -> Result<(), Vec<PolicyRule>> {
    let mut missing: Vec<PolicyRule> = Vec::new();
    for sub in servant.iter().flat_map(breakdown) {
        if owner.iter().any(|o| covers_one(o, &sub)) {
            continue;
        }
        let simple = sub.resource_names.is_none() && sub.non_resource_urls.is_none();
        match missing.iter_mut().find(|m| {
            simple
                && m.resource_names.is_none()
                && m.non_resource_urls.is_none()
                && m.api_groups == sub.api_groups
                && m.resources == sub.resources
        }) {
            Some(m) => m.verbs.extend(sub.verbs),
            None => missing.push(sub),
        }
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(missing)
    }
}

/// Go's `%q` of a string slice: `["a" "b"]`.
pub(crate) fn quoted(v: &[String]) -> String {
    let items: Vec<String> = v.iter().map(|s| format!("{s:?}")).collect();
    format!("[{}]", items.join(" "))
}

/// A rule as upstream's escalation errors show it:
/// `{APIGroups:[""], Resources:["secrets"], Verbs:["get" "list"]}`.
pub fn compact_string(r: &PolicyRule) -> String {
    let mut parts = Vec::new();
    for (name, v) in [
        ("APIGroups", list(&r.api_groups)),
        ("Resources", list(&r.resources)),
        ("NonResourceURLs", list(&r.non_resource_urls)),
        ("ResourceNames", list(&r.resource_names)),
        ("Verbs", &r.verbs[..]),
    ] {
        if !v.is_empty() {
            parts.push(format!("{name}:{}", quoted(v)));
        }
    }
    format!("{{{}}}", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
        let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        PolicyRule {
            api_groups: Some(v(groups)),
            resources: Some(v(resources)),
            verbs: v(verbs),
            ..Default::default()
        }
    }

    fn attrs(verb: &str, resource: &str, sub: &str, name: &str) -> Attributes {
        Attributes {
            verb: verb.into(),
            resource_request: true,
            resource: resource.into(),
            subresource: sub.into(),
            name: name.into(),
            ..Default::default()
        }
    }

    #[test]
    fn rules_allow_as_upstream() {
        let mut r = rule(&[""], &["pods", "pods/status"], &["get", "update"]);
        r.resource_names = Some(vec!["p1".into()]);
        assert!(allows(&r, &attrs("get", "pods", "", "p1")));
        assert!(allows(&r, &attrs("update", "pods", "status", "p1")));
        assert!(!allows(&r, &attrs("get", "pods", "", "p2")));
        assert!(!allows(&r, &attrs("get", "pods", "log", "p1")));
        assert!(!allows(&r, &attrs("delete", "pods", "", "p1")));
        // `*/sub` names a subresource of anything; `pods/*` is no wildcard.
        let any_status = rule(&[""], &["*/status"], &["get"]);
        assert!(allows(&any_status, &attrs("get", "nodes", "status", "")));
        assert!(!allows(&any_status, &attrs("get", "nodes", "", "")));
        let not_a_wildcard = rule(&[""], &["pods/*"], &["get"]);
        assert!(!allows(&not_a_wildcard, &attrs("get", "pods", "", "")));
        assert!(!allows(&not_a_wildcard, &attrs("get", "pods", "log", "")));
        let nr = PolicyRule {
            non_resource_urls: Some(vec!["/healthz".into(), "/api/*".into()]),
            verbs: vec!["get".into()],
            ..Default::default()
        };
        let get = |path: &str| Attributes {
            verb: "get".into(),
            path: path.into(),
            ..Default::default()
        };
        assert!(allows(&nr, &get("/api/v1")));
        assert!(allows(&nr, &get("/healthz")));
        assert!(!allows(&nr, &get("/metrics")));
    }

    #[test]
    fn coverage_and_what_is_missing() {
        let owner = vec![
            rule(&[""], &["pods", "configmaps"], &["get", "list"]),
            rule(&["apps"], &["*"], &["*"]),
        ];
        assert!(covers(&owner, &[rule(&[""], &["pods"], &["get"])]).is_ok());
        assert!(covers(
            &owner,
            &[rule(&["apps"], &["deployments/scale"], &["patch"])]
        )
        .is_ok());
        let missing = covers(
            &owner,
            &[rule(&[""], &["pods", "secrets"], &["get", "delete"])],
        )
        .unwrap_err();
        let shown: Vec<String> = missing.iter().map(compact_string).collect();
        assert_eq!(
            shown,
            vec![
                r#"{APIGroups:[""], Resources:["pods"], Verbs:["delete"]}"#,
                r#"{APIGroups:[""], Resources:["secrets"], Verbs:["get" "delete"]}"#,
            ]
        );
        // A named grant does not cover the whole resource.
        let mut named = rule(&[""], &["secrets"], &["get"]);
        named.resource_names = Some(vec!["s1".into()]);
        assert!(covers(&[named.clone()], &[rule(&[""], &["secrets"], &["get"])]).is_err());
        assert!(covers(&[rule(&[""], &["secrets"], &["get"])], &[named]).is_ok());
        // Everything is only covered by everything.
        let all = rule(&["*"], &["*"], &["*"]);
        assert!(covers(&owner, std::slice::from_ref(&all)).is_err());
        assert!(covers(std::slice::from_ref(&all), &owner).is_ok());
    }
}
