//! The audit policy (`audit.k8s.io/v1` `Policy`, `--audit-policy-file`):
//! which requests are logged at which level, checked as upstream's
//! `policy/checker.go` checks them. The first rule that matches decides;
//! no match means `None`.
//!
//! Every field upstream's v1 Policy has is read and honoured; anything
//! else refuses the file with a message naming the field.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use super::event::{Level, Stage, Stages};
use super::{Error, Result};
use crate::auth::Attributes;

/// A checked policy.
#[derive(Debug, Clone)]
pub struct Policy {
    rules: Vec<Rule>,
    omit_stages: Stages,
}

/// What the policy says about one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestConfig {
    pub level: Level,
    /// Stages not written (the rule's and the policy's).
    pub omit_stages: Stages,
    /// Drop `metadata.managedFields` from logged objects.
    pub omit_managed_fields: bool,
}

#[derive(Debug, Clone)]
struct Rule {
    level: Level,
    users: Vec<String>,
    user_groups: Vec<String>,
    verbs: Vec<String>,
    resources: Vec<GroupResources>,
    namespaces: Vec<String>,
    non_resource_urls: Vec<String>,
    /// Already joined with the policy's (as upstream's `NewChecker` does).
    omit_stages: Stages,
    omit_managed_fields: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct GroupResources {
    #[serde(default)]
    group: String,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    resource_names: Vec<String>,
}

/// The file as written.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PolicyFile {
    api_version: Option<String>,
    kind: Option<String>,
    /// Descriptive only, as upstream.
    #[serde(default)]
    #[allow(dead_code)]
    metadata: Option<Metadata>,
    #[serde(default)]
    rules: Vec<RuleFile>,
    #[serde(default)]
    omit_stages: Vec<String>,
    #[serde(default)]
    omit_managed_fields: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct Metadata {
    name: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RuleFile {
    level: Option<String>,
    #[serde(default)]
    users: Vec<String>,
    #[serde(default)]
    user_groups: Vec<String>,
    #[serde(default)]
    verbs: Vec<String>,
    #[serde(default)]
    resources: Vec<GroupResources>,
    #[serde(default)]
    namespaces: Vec<String>,
    #[serde(default, rename = "nonResourceURLs")]
    non_resource_urls: Vec<String>,
    #[serde(default)]
    omit_stages: Vec<String>,
    omit_managed_fields: Option<bool>,
}

const API_VERSION: &str = "audit.k8s.io/v1";

impl Policy {
    /// Read and check `--audit-policy-file`.
    ///
    /// # Errors
    /// The file is unreadable, not YAML/JSON of a Policy, or a field is
    /// unknown or invalid; the message names the file and the field.
    pub fn load(path: &Path) -> Result<Policy> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.display().to_string(),
            source,
        })?;
        Policy::parse(&text).map_err(|e| e.in_file(path))
    }

    /// Parse and check a policy document (errors name no file yet).
    pub fn parse(text: &str) -> Result<Policy> {
        let f: PolicyFile = serde_saphyr::from_str(text).map_err(|e| Error::Parse {
            path: String::new(),
            message: e.to_string(),
        })?;
        f.check()
    }

    /// The level and stages for a request by `user` in `groups`.
    pub fn evaluate(&self, user: &str, groups: &[String], a: &Attributes) -> RequestConfig {
        match self.rules.iter().find(|r| r.matches(user, groups, a)) {
            Some(r) => RequestConfig {
                level: r.level,
                omit_stages: r.omit_stages,
                omit_managed_fields: r.omit_managed_fields,
            },
            None => RequestConfig {
                level: Level::None,
                omit_stages: self.omit_stages,
                omit_managed_fields: false,
            },
        }
    }
}

fn invalid(field: String, why: impl Into<String>) -> Error {
    Error::Invalid {
        path: String::new(),
        field,
        why: why.into(),
    }
}

fn stages(list: &[String], field: &str) -> Result<Stages> {
    list.iter()
        .enumerate()
        .try_fold(Stages::default(), |acc, (i, s)| {
            Stage::parse(s).map(|st| acc.with(st)).ok_or_else(|| {
                invalid(
                    format!("{field}[{i}]"),
                    format!(
                        "invalid value {s:?}: allowed stages are {}",
                        Stage::ALL.join(",")
                    ),
                )
            })
        })
}

/// Lower-case RFC 1123 subdomain (upstream's check on `resources[].group`).
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

impl PolicyFile {
    fn check(self) -> Result<Policy> {
        match self.api_version.as_deref() {
            Some(API_VERSION) => {}
            other => {
                return Err(invalid(
                    "apiVersion".into(),
                    format!(
                        "{:?} is not supported: use {API_VERSION}",
                        other.unwrap_or("")
                    ),
                ))
            }
        }
        if self.kind.as_deref() != Some("Policy") {
            return Err(invalid(
                "kind".into(),
                format!("{:?}: must be Policy", self.kind.unwrap_or_default()),
            ));
        }
        let omit = stages(&self.omit_stages, "omitStages")?;
        if self.rules.is_empty() {
            // Upstream refuses "a policy with 0 rules" too: it would log nothing.
            return Err(invalid(
                "rules".into(),
                "the policy has no rules, so nothing would be logged",
            ));
        }
        let rules = self
            .rules
            .into_iter()
            .enumerate()
            .map(|(i, r)| r.check(&format!("rules[{i}]"), omit, self.omit_managed_fields))
            .collect::<Result<_>>()?;
        Ok(Policy {
            rules,
            omit_stages: omit,
        })
    }
}

impl RuleFile {
    fn check(self, at: &str, policy_omit: Stages, policy_omf: bool) -> Result<Rule> {
        let level = match self.level.as_deref() {
            None | Some("") => return Err(invalid(format!("{at}.level"), "Required value")),
            Some(l) => Level::parse(l).ok_or_else(|| {
                invalid(
                    format!("{at}.level"),
                    format!(
                        "Unsupported value: {l:?}: supported values: {}",
                        Level::ALL.join(", ")
                    ),
                )
            })?,
        };
        for (i, url) in self.non_resource_urls.iter().enumerate() {
            if url == "*" {
                continue;
            }
            let field = format!("{at}.nonResourceURLs[{i}]");
            if !url.starts_with('/') {
                return Err(invalid(
                    field,
                    format!("{url:?}: non-resource URL rules must begin with a '/' character"),
                ));
            }
            if url[..url.len() - 1].contains('*') {
                return Err(invalid(
                    field,
                    format!(
                        "{url:?}: non-resource URL wildcards '*' must be the final character of the rule"
                    ),
                ));
            }
        }
        if !self.non_resource_urls.is_empty()
            && (!self.resources.is_empty() || !self.namespaces.is_empty())
        {
            return Err(invalid(
                format!("{at}.nonResourceURLs"),
                "rules cannot apply to both regular resources and non-resource URLs",
            ));
        }
        for (i, gr) in self.resources.iter().enumerate() {
            if !gr.group.is_empty() && !is_dns_subdomain(&gr.group) {
                return Err(invalid(
                    format!("{at}.resources[{i}].group"),
                    format!(
                        "{:?}: must be an API group name (lower case DNS subdomain, no version)",
                        gr.group
                    ),
                ));
            }
            if !gr.resource_names.is_empty() && gr.resources.is_empty() {
                return Err(invalid(
                    format!("{at}.resources[{i}].resourceNames"),
                    "using resourceNames requires at least one resource",
                ));
            }
        }
        let omit = stages(&self.omit_stages, &format!("{at}.omitStages"))?;
        Ok(Rule {
            level,
            users: self.users,
            user_groups: self.user_groups,
            verbs: self.verbs,
            resources: self.resources,
            namespaces: self.namespaces,
            non_resource_urls: self.non_resource_urls,
            omit_stages: omit.union(policy_omit),
            omit_managed_fields: self.omit_managed_fields.unwrap_or(policy_omf),
        })
    }
}

fn has(list: &[String], v: &str) -> bool {
    list.iter().any(|x| x == v)
}

impl Rule {
    fn matches(&self, user: &str, groups: &[String], a: &Attributes) -> bool {
        if !self.users.is_empty() && !has(&self.users, user) {
            return false;
        }
        if !self.user_groups.is_empty() && !groups.iter().any(|g| has(&self.user_groups, g)) {
            return false;
        }
        if !self.verbs.is_empty() && !has(&self.verbs, &a.verb) {
            return false;
        }
        if !self.namespaces.is_empty() || !self.resources.is_empty() {
            return self.matches_resource(a);
        }
        if !self.non_resource_urls.is_empty() {
            return !a.resource_request
                && self
                    .non_resource_urls
                    .iter()
                    .any(|spec| path_matches(&a.path, spec));
        }
        true
    }

    fn matches_resource(&self, a: &Attributes) -> bool {
        if !a.resource_request {
            return false;
        }
        // Cluster-scoped requests have the empty namespace, which a rule
        // may list.
        if !self.namespaces.is_empty() && !has(&self.namespaces, &a.namespace) {
            return false;
        }
        if self.resources.is_empty() {
            return true;
        }
        let combined = if a.subresource.is_empty() {
            a.resource.clone()
        } else {
            format!("{}/{}", a.resource, a.subresource)
        };
        self.resources
            .iter()
            .filter(|gr| gr.group == a.group)
            .any(|gr| {
                if gr.resources.is_empty() {
                    return true;
                }
                if !gr.resource_names.is_empty() && !has(&gr.resource_names, &a.name) {
                    return false;
                }
                gr.resources.iter().any(|res| {
                    res == "*"
                        || *res == combined
                        || (!a.subresource.is_empty()
                            && res.strip_prefix("*/") == Some(a.subresource.as_str()))
                        || res.strip_suffix("/*") == Some(a.resource.as_str())
                })
            })
    }
}

/// `*`, the exact path, or a prefix ending in `*`.
fn path_matches(path: &str, spec: &str) -> bool {
    spec == "*"
        || spec == path
        || spec
            .strip_suffix('*')
            .is_some_and(|prefix| path.starts_with(prefix.trim_end_matches('*')))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(verb: &str, group: &str, resource: &str, sub: &str, ns: &str, name: &str) -> Attributes {
        Attributes {
            verb: verb.into(),
            resource_request: true,
            group: group.into(),
            resource: resource.into(),
            subresource: sub.into(),
            namespace: ns.into(),
            name: name.into(),
            ..Default::default()
        }
    }

    fn nonres(path: &str) -> Attributes {
        Attributes {
            verb: "get".into(),
            path: path.into(),
            ..Default::default()
        }
    }

    fn level(p: &Policy, user: &str, groups: &[&str], a: &Attributes) -> Level {
        let groups: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
        p.evaluate(user, &groups, a).level
    }

    /// Close to upstream's documented example policy.
    const EXAMPLE: &str = r#"
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: RequestResponse
    resources:
    - group: ""
      resources: ["pods"]
  - level: Metadata
    resources:
    - group: ""
      resources: ["pods/log", "pods/status"]
  - level: None
    resources:
    - group: ""
      resources: ["configmaps"]
      resourceNames: ["controller-leader"]
  - level: None
    users: ["system:kube-proxy"]
    verbs: ["watch"]
    resources:
    - group: ""
      resources: ["endpoints", "services"]
  - level: None
    userGroups: ["system:authenticated"]
    nonResourceURLs:
    - "/api*"
    - "/version"
  - level: Request
    resources:
    - group: ""
      resources: ["configmaps"]
    namespaces: ["kube-system"]
  - level: Metadata
    resources:
    - group: ""
      resources: ["secrets", "configmaps"]
  - level: Request
    resources:
    - group: ""
    - group: "extensions"
  - level: Metadata
    omitStages:
      - "RequestReceived"
"#;

    #[test]
    fn first_matching_rule_wins() {
        let p = Policy::parse(EXAMPLE).unwrap();
        let u = ["system:authenticated"];
        let get = |r, sub, ns, name| res("get", "", r, sub, ns, name);
        assert_eq!(
            level(&p, "a", &u, &get("pods", "", "d", "p")),
            Level::RequestResponse
        );
        // `pods` does not cover its subresources; `pods/log` does.
        assert_eq!(
            level(&p, "a", &u, &get("pods", "log", "d", "p")),
            Level::Metadata
        );
        assert_eq!(
            level(&p, "a", &u, &get("pods", "exec", "d", "p")),
            Level::Request
        );
        assert_eq!(
            level(
                &p,
                "a",
                &u,
                &get("configmaps", "", "d", "controller-leader")
            ),
            Level::None
        );
        assert_eq!(
            level(&p, "a", &u, &get("configmaps", "", "kube-system", "x")),
            Level::Request
        );
        assert_eq!(
            level(&p, "a", &u, &get("configmaps", "", "d", "x")),
            Level::Metadata
        );
        assert_eq!(
            level(&p, "a", &u, &get("secrets", "", "d", "x")),
            Level::Metadata
        );
        let watch = res("watch", "", "services", "", "d", "");
        assert_eq!(level(&p, "system:kube-proxy", &u, &watch), Level::None);
        assert_eq!(level(&p, "someone", &u, &watch), Level::Request);
        assert_eq!(level(&p, "a", &u, &nonres("/apis/apps/v1")), Level::None);
        assert_eq!(level(&p, "a", &u, &nonres("/version")), Level::None);
        assert_eq!(level(&p, "a", &[], &nonres("/version")), Level::Metadata);
        assert_eq!(level(&p, "a", &u, &nonres("/healthz")), Level::Metadata);
        assert_eq!(
            level(
                &p,
                "a",
                &u,
                &res("list", "apps", "deployments", "", "d", "")
            ),
            Level::Metadata
        );
    }

    #[test]
    fn no_match_is_none_and_stages_are_joined() {
        let p = Policy::parse(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [Panic]\nrules:\n\
             - level: Metadata\n  verbs: [create]\n  omitStages: [RequestReceived]\n  omitManagedFields: true\n",
        )
        .unwrap();
        let c = p.evaluate("u", &[], &res("create", "", "pods", "", "d", ""));
        assert_eq!(c.level, Level::Metadata);
        assert!(c.omit_stages.contains(Stage::Panic));
        assert!(c.omit_stages.contains(Stage::RequestReceived));
        assert!(!c.omit_stages.contains(Stage::ResponseComplete));
        assert!(c.omit_managed_fields);
        let c = p.evaluate("u", &[], &res("get", "", "pods", "", "d", "p"));
        assert_eq!(c.level, Level::None);
    }

    #[test]
    fn wildcards_namespaces_and_names() {
        let p = Policy::parse(
            r#"
apiVersion: audit.k8s.io/v1
kind: Policy
rules:
- level: Request
  resources: [{group: "", resources: ["*/status"]}]
- level: RequestResponse
  resources: [{group: apps, resources: ["deployments/*"]}]
- level: Metadata
  namespaces: [""]
- level: None
  resources: [{group: "", resources: ["secrets"], resourceNames: [a, b]}]
- level: Request
  resources: [{group: "", resources: ["*"]}]
"#,
        )
        .unwrap();
        let l = |a: &Attributes| level(&p, "u", &[], a);
        assert_eq!(
            l(&res("update", "", "pods", "status", "d", "p")),
            Level::Request
        );
        assert_eq!(
            l(&res("get", "apps", "deployments", "", "d", "x")),
            Level::RequestResponse
        );
        assert_eq!(
            l(&res("update", "apps", "deployments", "scale", "d", "x")),
            Level::RequestResponse
        );
        // Cluster-scoped: the empty namespace.
        assert_eq!(l(&res("get", "", "nodes", "", "", "n")), Level::Metadata);
        assert_eq!(l(&res("get", "", "secrets", "", "d", "a")), Level::None);
        assert_eq!(l(&res("get", "", "secrets", "", "d", "c")), Level::Request);
        // `*` covers subresources too, as upstream's checker.
        assert_eq!(l(&res("get", "", "pods", "log", "d", "p")), Level::Request);
        // A resource rule never matches a non-resource request.
        assert_eq!(l(&nonres("/healthz")), Level::None);
    }

    #[test]
    fn path_patterns() {
        assert!(path_matches("/healthz/etcd", "/healthz*"));
        assert!(path_matches("/healthz", "/healthz*"));
        assert!(path_matches("/x", "*"));
        assert!(!path_matches("/healthz", "/version"));
        assert!(!path_matches("/livez", "/healthz*"));
    }

    fn refused(text: &str) -> String {
        Policy::parse(text).unwrap_err().to_string()
    }

    #[test]
    fn bad_policies_are_refused_naming_the_field() {
        let head = "apiVersion: audit.k8s.io/v1\nkind: Policy\n";
        let e = refused(&format!("{head}rules:\n- level: Verbose\n"));
        assert!(e.contains("rules[0].level") && e.contains("Verbose"), "{e}");
        let e = refused(&format!("{head}rules:\n- verbs: [get]\n"));
        assert!(
            e.contains("rules[0].level") && e.contains("Required"),
            "{e}"
        );
        let e = refused(&format!("{head}rules:\n- level: None\n  usrs: [a]\n"));
        assert!(e.contains("usrs"), "{e}");
        let e = refused(&format!("{head}rules:\n- level: None\nextra: 1\n"));
        assert!(e.contains("extra"), "{e}");
        let e = refused(&format!(
            "{head}rules:\n- level: None\n  nonResourceURLs: ['/a*b']\n"
        ));
        assert!(e.contains("rules[0].nonResourceURLs[0]"), "{e}");
        let e = refused(&format!(
            "{head}rules:\n- level: None\n  nonResourceURLs: ['/a']\n  namespaces: [d]\n"
        ));
        assert!(e.contains("both regular resources"), "{e}");
        let e = refused(&format!(
            "{head}rules:\n- level: None\n  resources: [{{group: apps/v1}}]\n"
        ));
        assert!(e.contains("rules[0].resources[0].group"), "{e}");
        let e = refused(&format!(
            "{head}rules:\n- level: None\n  resources: [{{resourceNames: [x]}}]\n"
        ));
        assert!(e.contains("resourceNames"), "{e}");
        let e = refused(&format!(
            "{head}omitStages: [Sometimes]\nrules:\n- level: None\n"
        ));
        assert!(e.contains("omitStages[0]"), "{e}");
        let e = refused(&format!("{head}rules: []\n"));
        assert!(e.contains("rules"), "{e}");
        let e = refused("apiVersion: audit.k8s.io/v1beta1\nkind: Policy\nrules:\n- level: None\n");
        assert!(e.contains("apiVersion"), "{e}");
        let e = refused("apiVersion: audit.k8s.io/v1\nkind: Polcy\nrules:\n- level: None\n");
        assert!(e.contains("kind"), "{e}");
    }

    #[test]
    fn json_policies_parse_too() {
        let p = Policy::parse(
            r#"{"apiVersion":"audit.k8s.io/v1","kind":"Policy","metadata":{"name":"p"},
                "rules":[{"level":"Metadata"}]}"#,
        )
        .unwrap();
        assert_eq!(level(&p, "u", &[], &nonres("/x")), Level::Metadata);
    }
}
