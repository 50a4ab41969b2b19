//! `--admission-control-config-file`: an `AdmissionConfiguration`
//! (`apiserver.config.k8s.io/v1`) whose `PodSecurity` plugin entry holds
//! a `PodSecurityConfiguration` (`pod-security.admission.config.k8s.io/v1`):
//! the cluster's default levels and who is exempt.
//!
//! The plugin's configuration may be inline (`configuration`) or in a
//! file (`path`, relative to the admission configuration's directory, as
//! upstream resolves it). Other plugins take no configuration here, so
//! naming one is refused rather than ignored.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::level::{Level, LevelVersion, Policy, Version};

/// Reading or checking the configuration failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configuration file cannot be read.
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A configuration file is not the documented format.
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The PodSecurity plugin's settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Config {
    /// Levels for namespaces without (some of) the labels.
    pub defaults: Policy,
    /// Requests by these users are not checked.
    pub exempt_usernames: Vec<String>,
    /// Pods in these namespaces are not checked.
    pub exempt_namespaces: Vec<String>,
    /// Pods with these runtimeClassNames are not checked.
    pub exempt_runtime_classes: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct AdmissionConfiguration {
    api_version: String,
    kind: String,
    #[serde(default)]
    plugins: Vec<PluginConfig>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PluginConfig {
    name: String,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    configuration: Option<serde_json::Value>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct PodSecurityConfiguration {
    api_version: String,
    kind: String,
    #[serde(default)]
    defaults: Defaults,
    #[serde(default)]
    exemptions: Exemptions,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Defaults {
    #[serde(default)]
    enforce: Option<String>,
    #[serde(default, rename = "enforce-version")]
    enforce_version: Option<String>,
    #[serde(default)]
    audit: Option<String>,
    #[serde(default, rename = "audit-version")]
    audit_version: Option<String>,
    #[serde(default)]
    warn: Option<String>,
    #[serde(default, rename = "warn-version")]
    warn_version: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Exemptions {
    #[serde(default)]
    usernames: Vec<String>,
    #[serde(default)]
    namespaces: Vec<String>,
    #[serde(default)]
    runtime_classes: Vec<String>,
}

const ADMISSION_VERSIONS: &[&str] = &["apiserver.config.k8s.io/v1", "apiserver.k8s.io/v1alpha1"];
const POD_SECURITY_VERSIONS: &[&str] = &[
    "pod-security.admission.config.k8s.io/v1",
    "pod-security.admission.config.k8s.io/v1beta1",
];

impl Config {
    /// Read the PodSecurity settings out of an admission configuration
    /// file; without a PodSecurity entry they are upstream's defaults.
    ///
    /// # Errors
    /// The file (or the plugin's `path`) is unreadable, not the format,
    /// names another plugin, or holds a bad level or version.
    pub fn load(path: &Path) -> Result<Config> {
        let text = read(path)?;
        Self::parse(&text, path)
    }

    /// [`Config::load`] from the file's `text`; `path` names it in errors
    /// and anchors a relative plugin `path`.
    ///
    /// # Errors
    /// As [`Config::load`].
    pub fn parse(text: &str, path: &Path) -> Result<Config> {
        let invalid = |message: String| Error::Invalid {
            path: path.to_path_buf(),
            message,
        };
        let file: AdmissionConfiguration =
            serde_saphyr::from_str(text).map_err(|e| invalid(e.to_string()))?;
        if !ADMISSION_VERSIONS.contains(&file.api_version.as_str())
            || file.kind != "AdmissionConfiguration"
        {
            return Err(invalid(format!(
                "expected kind AdmissionConfiguration in apiVersion apiserver.config.k8s.io/v1, got {} {}",
                file.kind, file.api_version
            )));
        }
        let mut found = None;
        for plugin in file.plugins {
            if plugin.name != "PodSecurity" {
                return Err(invalid(format!(
                    "plugins: admission plugin {:?} takes no configuration here (only PodSecurity does)",
                    plugin.name
                )));
            }
            if found.is_some() {
                return Err(invalid("plugins: PodSecurity is configured twice".into()));
            }
            found = Some(match (plugin.configuration, plugin.path) {
                (Some(v), None) => {
                    let c: PodSecurityConfiguration = serde_json::from_value(v)
                        .map_err(|e| invalid(format!("PodSecurity configuration: {e}")))?;
                    (c, path.to_path_buf())
                }
                (None, Some(p)) => {
                    let p = path.parent().unwrap_or(Path::new(".")).join(p);
                    let text = read(&p)?;
                    let c = serde_saphyr::from_str(&text).map_err(|e| Error::Invalid {
                        path: p.clone(),
                        message: e.to_string(),
                    })?;
                    (c, p)
                }
                (Some(_), Some(_)) => {
                    return Err(invalid(
                        "plugins: PodSecurity has both configuration and path: give one".into(),
                    ))
                }
                (None, None) => {
                    return Err(invalid(
                        "plugins: PodSecurity needs configuration or path".into(),
                    ))
                }
            });
        }
        match found {
            None => Ok(Config::default()),
            Some((c, at)) => {
                Self::from_pod_security(c).map_err(|message| Error::Invalid { path: at, message })
            }
        }
    }

    fn from_pod_security(c: PodSecurityConfiguration) -> Result<Config, String> {
        if !POD_SECURITY_VERSIONS.contains(&c.api_version.as_str())
            || c.kind != "PodSecurityConfiguration"
        {
            return Err(format!(
                "expected kind PodSecurityConfiguration in apiVersion pod-security.admission.config.k8s.io/v1, got {} {}",
                c.kind, c.api_version
            ));
        }
        let mut errs = Vec::new();
        let d = &c.defaults;
        let mut lv =
            |level: &Option<String>, lname: &str, version: &Option<String>, vname: &str| {
                // Unset fields default to privileged and latest, as upstream's
                // SetDefaults_PodSecurityDefaults.
                let level = match level.as_deref().filter(|s| !s.is_empty()) {
                    None => Level::Privileged,
                    Some(s) => Level::parse(s).unwrap_or_else(|e| {
                        errs.push(format!("defaults.{lname}: {e}"));
                        Level::Privileged
                    }),
                };
                let version = match version.as_deref().filter(|s| !s.is_empty()) {
                    None => Version::Latest,
                    Some(s) => Version::parse(s).unwrap_or_else(|e| {
                        errs.push(format!("defaults.{vname}: {e}"));
                        Version::Latest
                    }),
                };
                LevelVersion { level, version }
            };
        let defaults = Policy {
            enforce: lv(&d.enforce, "enforce", &d.enforce_version, "enforce-version"),
            audit: lv(&d.audit, "audit", &d.audit_version, "audit-version"),
            warn: lv(&d.warn, "warn", &d.warn_version, "warn-version"),
        };
        let e = c.exemptions;
        for (field, list) in [
            ("usernames", &e.usernames),
            ("namespaces", &e.namespaces),
            ("runtimeClasses", &e.runtime_classes),
        ] {
            for (i, item) in list.iter().enumerate() {
                if item.is_empty() {
                    errs.push(format!("exemptions.{field}[{i}]: must not be empty"));
                }
                if list[..i].contains(item) {
                    errs.push(format!("exemptions.{field}[{i}]: duplicate value {item:?}"));
                }
            }
        }
        if !errs.is_empty() {
            return Err(errs.join(", "));
        }
        Ok(Config {
            defaults,
            exempt_usernames: e.usernames,
            exempt_namespaces: e.namespaces,
            exempt_runtime_classes: e.runtime_classes,
        })
    }
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config> {
        Config::parse(text, Path::new("/etc/admission.yaml"))
    }

    #[test]
    fn inline_pod_security_configuration() {
        let c = parse(
            r#"
apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: PodSecurity
  configuration:
    apiVersion: pod-security.admission.config.k8s.io/v1
    kind: PodSecurityConfiguration
    defaults:
      enforce: baseline
      enforce-version: v1.30
      warn: restricted
    exemptions:
      usernames: [system:serviceaccount:kube-system:replicaset-controller]
      namespaces: [kube-system]
      runtimeClasses: [kata]
"#,
        )
        .unwrap();
        assert_eq!(c.defaults.enforce.to_string(), "baseline:v1.30");
        assert_eq!(c.defaults.warn.to_string(), "restricted:latest");
        assert_eq!(c.defaults.audit.to_string(), "privileged:latest");
        assert_eq!(c.exempt_namespaces, ["kube-system"]);
        assert_eq!(c.exempt_runtime_classes, ["kata"]);
    }

    #[test]
    fn refuses_what_it_would_not_honour() {
        let head =
            "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n";
        let ps = "  configuration:\n    apiVersion: pod-security.admission.config.k8s.io/v1\n    kind: PodSecurityConfiguration\n";
        for (body, want) in [
            (
                "- name: EventRateLimit\n  path: x.yaml\n".to_string(),
                "EventRateLimit",
            ),
            (
                format!("- name: PodSecurity\n{ps}    defaults: {{enforce: strict}}\n"),
                "defaults.enforce: must be one of",
            ),
            (
                format!("- name: PodSecurity\n{ps}    defaults: {{warn-version: \"1.2\"}}\n"),
                "defaults.warn-version",
            ),
            (
                format!("- name: PodSecurity\n{ps}    exemptions: {{groups: [a]}}\n"),
                "groups",
            ),
            (
                format!("- name: PodSecurity\n{ps}    exemptions: {{namespaces: [a, a]}}\n"),
                "duplicate",
            ),
        ] {
            let err = parse(&format!("{head}{body}")).unwrap_err().to_string();
            assert!(err.contains(want), "{err} should name {want}");
        }
        assert!(parse("apiVersion: v1\nkind: Config\n").is_err());
        // No PodSecurity entry: upstream's defaults.
        assert_eq!(
            parse(head.trim_end_matches("plugins:\n")).unwrap(),
            Config::default()
        );
    }
}
