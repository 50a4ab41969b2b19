//! Pod Security levels, policy versions and the namespace labels that
//! choose them (upstream's `pod-security-admission/api`).

use std::collections::BTreeMap;
use std::fmt;

/// Prefix of the namespace labels (`pod-security.kubernetes.io/enforce`).
pub const LABEL_PREFIX: &str = "pod-security.kubernetes.io/";

/// The three standard levels, least to most restrictive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    Privileged,
    Baseline,
    Restricted,
}

impl Level {
    /// Parse a label or configuration value.
    ///
    /// # Errors
    /// Upstream's detail for anything but the three names.
    pub fn parse(s: &str) -> Result<Level, &'static str> {
        match s {
            "privileged" => Ok(Level::Privileged),
            "baseline" => Ok(Level::Baseline),
            "restricted" => Ok(Level::Restricted),
            _ => Err("must be one of privileged, baseline, restricted"),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Level::Privileged => "privileged",
            Level::Baseline => "baseline",
            Level::Restricted => "restricted",
        }
    }
}

/// A policy version: `latest`, or the checks as they stood in Kubernetes
/// `v1.<minor>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Version {
    Latest,
    Minor(u32),
}

impl Version {
    /// Parse `latest` or `v1.x` (no leading zeros, as upstream's pattern).
    ///
    /// # Errors
    /// Upstream's detail for anything else.
    pub fn parse(s: &str) -> Result<Version, &'static str> {
        const BAD: &str = r#"must be "latest" or "v1.x""#;
        if s == "latest" {
            return Ok(Version::Latest);
        }
        let minor = s.strip_prefix("v1.").ok_or(BAD)?;
        let digits = !minor.is_empty() && minor.bytes().all(|b| b.is_ascii_digit());
        if !digits || (minor.len() > 1 && minor.starts_with('0')) {
            return Err(BAD);
        }
        minor.parse().map(Version::Minor).map_err(|_| BAD)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Version::Latest => f.write_str("latest"),
            Version::Minor(m) => write!(f, "v1.{m}"),
        }
    }
}

/// A level at a version, shown as `restricted:latest`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LevelVersion {
    pub level: Level,
    pub version: Version,
}

impl LevelVersion {
    pub const PRIVILEGED: LevelVersion = LevelVersion {
        level: Level::Privileged,
        version: Version::Latest,
    };

    /// Both privileged, or the same level at the same version.
    fn equivalent(&self, other: &LevelVersion) -> bool {
        (self.level == Level::Privileged && other.level == Level::Privileged) || self == other
    }
}

impl fmt::Display for LevelVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.level.as_str(), self.version)
    }
}

/// The three modes' levels for one namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub enforce: LevelVersion,
    pub audit: LevelVersion,
    pub warn: LevelVersion,
}

impl Default for Policy {
    /// Upstream's defaults without a configuration: privileged everywhere.
    fn default() -> Self {
        Policy {
            enforce: LevelVersion::PRIVILEGED,
            audit: LevelVersion::PRIVILEGED,
            warn: LevelVersion::PRIVILEGED,
        }
    }
}

/// One bad label: its key, value and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelError {
    pub label: String,
    pub value: String,
    pub detail: &'static str,
}

impl Policy {
    pub fn fully_privileged(&self) -> bool {
        [self.enforce, self.audit, self.warn]
            .iter()
            .all(|lv| lv.level == Level::Privileged)
    }

    pub fn equivalent(&self, other: &Policy) -> bool {
        self.enforce.equivalent(&other.enforce)
            && self.audit.equivalent(&other.audit)
            && self.warn.equivalent(&other.warn)
    }

    /// The policy a namespace's `labels` ask for over `defaults`
    /// (upstream's `PolicyToEvaluate`). Always a usable policy, with the
    /// labels it could not read: a bad enforce level enforces
    /// `restricted` (fail closed), bad audit and warn levels are
    /// `privileged` (fail open), a bad version is `latest`.
    pub fn from_labels(
        labels: &BTreeMap<String, String>,
        defaults: Policy,
    ) -> (Policy, Vec<LabelError>) {
        let mut p = defaults;
        let mut errs = Vec::new();
        let mut bad = |mode: &str, value: &str, detail| {
            errs.push(LabelError {
                label: format!("{LABEL_PREFIX}{mode}"),
                value: value.to_string(),
                detail,
            })
        };
        let get = |k: &str| labels.get(&format!("{LABEL_PREFIX}{k}"));
        let mut enforce_level_set = false;
        if let Some(v) = get("enforce") {
            match Level::parse(v) {
                Ok(l) => {
                    p.enforce.level = l;
                    enforce_level_set = true;
                }
                Err(e) => {
                    p.enforce.level = Level::Restricted;
                    bad("enforce", v, e);
                }
            }
        }
        if let Some(v) = get("enforce-version") {
            p.enforce.version = Version::parse(v).unwrap_or_else(|e| {
                bad("enforce-version", v, e);
                Version::Latest
            });
        }
        for (lv, mode) in [(&mut p.audit, "audit"), (&mut p.warn, "warn")] {
            if let Some(v) = get(mode) {
                lv.level = Level::parse(v).unwrap_or_else(|e| {
                    bad(mode, v, e);
                    Level::Privileged
                });
            }
            let key = format!("{mode}-version");
            if let Some(v) = get(&key) {
                lv.version = Version::parse(v).unwrap_or_else(|e| {
                    bad(&key, v, e);
                    Version::Latest
                });
            }
        }
        // Warn defaults to an explicitly set enforce level that is stricter
        // than it, so that what would be refused is warned about too.
        if get("warn").is_none() && enforce_level_set && p.enforce.level > p.warn.level {
            p.warn.level = p.enforce.level;
            if get("warn-version").is_none() {
                p.warn.version = p.enforce.version;
            }
        }
        (p, errs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (format!("{LABEL_PREFIX}{k}"), v.to_string()))
            .collect()
    }

    #[test]
    fn versions_parse_as_upstream() {
        assert_eq!(Version::parse("latest"), Ok(Version::Latest));
        assert_eq!(Version::parse("v1.0"), Ok(Version::Minor(0)));
        assert_eq!(Version::parse("v1.25"), Ok(Version::Minor(25)));
        for bad in ["v1.05", "v2.1", "1.25", "v1.", "v1.x", "Latest", ""] {
            assert!(Version::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn labels_choose_the_policy() {
        let (p, errs) = Policy::from_labels(
            &labels(&[
                ("enforce", "baseline"),
                ("enforce-version", "v1.24"),
                ("audit", "restricted"),
            ]),
            Policy::default(),
        );
        assert!(errs.is_empty());
        assert_eq!(p.enforce.to_string(), "baseline:v1.24");
        assert_eq!(p.audit.to_string(), "restricted:latest");
        // Warn follows the stricter enforce level, at its version.
        assert_eq!(p.warn.to_string(), "baseline:v1.24");

        let (p, errs) = Policy::from_labels(
            &labels(&[
                ("enforce", "strict"),
                ("warn", "nope"),
                ("audit-version", "v1"),
            ]),
            Policy::default(),
        );
        assert_eq!(p.enforce.level, Level::Restricted);
        assert_eq!(p.warn.level, Level::Privileged);
        assert_eq!(errs.len(), 3);
        assert_eq!(errs[0].label, "pod-security.kubernetes.io/enforce");
    }
}
