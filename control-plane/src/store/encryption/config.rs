//! The `--encryption-provider-config` file: kube-apiserver's
//! `apiserver.config.k8s.io/v1` `EncryptionConfiguration`, in YAML or JSON.
//!
//! ```yaml
//! apiVersion: apiserver.config.k8s.io/v1
//! kind: EncryptionConfiguration
//! resources:
//!   - resources: [secrets, configmaps]
//!     providers:
//!       - aescbc:
//!           keys: [{name: key1, secret: <base64 of 32 random bytes>}]
//!       - identity: {}
//! ```
//!
//! Loading checks what upstream checks and names the field it refuses
//! (`resources[0].providers[1].aescbc.keys[0].secret`); rewriting (for
//! `rotate`) keeps the file's format, YAML or JSON.

use std::collections::HashSet;
use std::path::Path;

use base64::Engine;
use serde::{Deserialize, Serialize};

use super::transformer::{Chain, DataKey, Kind, Slot, Transformers};
use super::{Error, Result};

pub const API_VERSION: &str = "apiserver.config.k8s.io/v1";
pub const KIND: &str = "EncryptionConfiguration";

/// The whole file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EncryptionConfiguration {
    pub api_version: String,
    pub kind: String,
    pub resources: Vec<ResourceConfiguration>,
}

/// Resources that share a list of providers.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceConfiguration {
    /// `secrets`, `deployments.apps`, `*.apps`, `*.` (the core group) or `*.*`.
    pub resources: Vec<String>,
    /// In order: the first writes, all read.
    pub providers: Vec<ProviderConfiguration>,
}

/// Exactly one of the fields is set.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfiguration {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aescbc: Option<KeysConfiguration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aesgcm: Option<KeysConfiguration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secretbox: Option<KeysConfiguration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<IdentityConfiguration>,
    /// Recognised only to refuse it clearly: no KMS plugin support.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kms: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeysConfiguration {
    pub keys: Vec<Key>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Key {
    pub name: String,
    /// Base64 (standard alphabet, padded) of the key bytes.
    pub secret: String,
}

/// `identity: {}`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdentityConfiguration {}

impl ProviderConfiguration {
    /// The cipher provider's kind and keys (None for identity or an
    /// unchecked, ambiguous entry).
    pub fn keyed(&self) -> Option<(Kind, &KeysConfiguration)> {
        match (&self.aescbc, &self.aesgcm, &self.secretbox) {
            (Some(k), None, None) => Some((Kind::AesCbc, k)),
            (None, Some(k), None) => Some((Kind::AesGcm, k)),
            (None, None, Some(k)) => Some((Kind::Secretbox, k)),
            _ => None,
        }
    }

    fn keyed_mut(&mut self) -> Option<&mut KeysConfiguration> {
        self.aescbc
            .as_mut()
            .or(self.aesgcm.as_mut())
            .or(self.secretbox.as_mut())
    }

    fn set_count(&self) -> usize {
        [
            self.aescbc.is_some(),
            self.aesgcm.is_some(),
            self.secretbox.is_some(),
            self.identity.is_some(),
            self.kms.is_some(),
        ]
        .iter()
        .filter(|x| **x)
        .count()
    }
}

impl EncryptionConfiguration {
    /// Read and check `path`.
    ///
    /// # Errors
    /// Unreadable, not YAML/JSON of this shape, or a field upstream would
    /// refuse; the message names the file and the field.
    pub fn load(path: &Path) -> Result<EncryptionConfiguration> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            action: "reading",
            path: path.display().to_string(),
            source,
        })?;
        let cfg = Self::parse(&text, path)?;
        cfg.transformers(path)?;
        Ok(cfg)
    }

    /// Parse without checking the values (`load` checks).
    ///
    /// # Errors
    /// Not YAML or JSON of this shape.
    pub fn parse(text: &str, path: &Path) -> Result<EncryptionConfiguration> {
        // JSON is YAML: one parser reads both, and names the field it refuses.
        serde_saphyr::from_str(text).map_err(|e| Error::Parse {
            path: path.display().to_string(),
            message: e.to_string(),
        })
    }

    /// The checked providers, as store key prefixes and ciphers.
    ///
    /// # Errors
    /// The first field upstream would refuse.
    pub fn transformers(&self, path: &Path) -> Result<Transformers> {
        let invalid = |field: String, why: String| Error::Invalid {
            path: path.display().to_string(),
            field,
            why,
        };
        if self.api_version != API_VERSION {
            return Err(invalid(
                "apiVersion".into(),
                format!("{:?} is not {API_VERSION}", self.api_version),
            ));
        }
        if self.kind != KIND {
            return Err(invalid(
                "kind".into(),
                format!("{:?} is not {KIND}", self.kind),
            ));
        }
        if self.resources.is_empty() {
            return Err(invalid("resources".into(), "must not be empty".into()));
        }
        let mut out = Transformers::default();
        let mut seen = HashSet::new();
        for (i, rc) in self.resources.iter().enumerate() {
            let field = format!("resources[{i}]");
            if rc.resources.is_empty() {
                return Err(invalid(
                    format!("{field}.resources"),
                    "must not be empty".into(),
                ));
            }
            let mut prefixes = Vec::new();
            for (j, r) in rc.resources.iter().enumerate() {
                let f = format!("{field}.resources[{j}]");
                let prefix = resource_prefix(r).map_err(|why| invalid(f.clone(), why))?;
                if !seen.insert(r.clone()) {
                    return Err(invalid(f, format!("{r:?} is listed twice")));
                }
                prefixes.push((r.clone(), prefix));
            }
            if rc.providers.is_empty() {
                return Err(invalid(
                    format!("{field}.providers"),
                    "must not be empty".into(),
                ));
            }
            let mut slots = Vec::new();
            for (j, p) in rc.providers.iter().enumerate() {
                slots.extend(provider_slots(
                    p,
                    &format!("{field}.providers[{j}]"),
                    &invalid,
                )?);
            }
            out.push(prefixes, Chain::new(slots));
        }
        Ok(out)
    }

    /// Put a new random key of the first provider's kind first in every
    /// `resources` entry (an identity-first entry gets a new `aescbc`
    /// provider in front), keeping every old key for reading. Returns the
    /// new keys as `aescbc:NAME`, one per entry.
    pub fn rotate(&mut self, now: jiff::Timestamp) -> Vec<String> {
        let stamp = now.strftime("%Y%m%dT%H%M%SZ").to_string();
        let mut added = Vec::new();
        for rc in &mut self.resources {
            let kind = rc
                .providers
                .first()
                .and_then(|p| p.keyed())
                .map(|(k, _)| k)
                .unwrap_or(Kind::AesCbc);
            let taken: HashSet<String> = rc
                .providers
                .iter()
                .filter_map(|p| p.keyed())
                .flat_map(|(_, ks)| ks.keys.iter().map(|k| k.name.clone()))
                .collect();
            let mut name = format!("{}key-{stamp}", kind.name());
            let mut n = 1;
            while taken.contains(&name) {
                n += 1;
                name = format!("{}key-{stamp}-{n}", kind.name());
            }
            let size = kind.key_sizes().last().copied().unwrap_or(32);
            let bytes: Vec<u8> = (0..size).map(|_| rand::random::<u8>()).collect();
            let key = Key {
                name: name.clone(),
                secret: base64::engine::general_purpose::STANDARD.encode(bytes),
            };
            match rc.providers.first_mut().and_then(|p| p.keyed_mut()) {
                Some(keys) => keys.keys.insert(0, key),
                None => rc.providers.insert(
                    0,
                    ProviderConfiguration {
                        aescbc: Some(KeysConfiguration { keys: vec![key] }),
                        ..Default::default()
                    },
                ),
            }
            added.push(format!("{}:{name}", kind.name()));
        }
        added
    }

    /// Write to `path` (JSON when `json`, else YAML), replacing it whole
    /// and readable by its owner only: it holds keys.
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn save(&self, path: &Path, json: bool) -> Result<()> {
        let text = if json {
            serde_json::to_string_pretty(self).map(|s| s + "\n").ok()
        } else {
            serde_saphyr::to_string(self).ok()
        }
        .unwrap_or_default();
        let io = |source| Error::Io {
            action: "writing",
            path: path.display().to_string(),
            source,
        };
        let tmp = path.with_extension("tmp");
        {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)
                .map_err(io)?;
            f.write_all(text.as_bytes()).map_err(io)?;
            f.sync_all().map_err(io)?;
        }
        std::fs::rename(&tmp, path).map_err(io)
    }
}

/// The checked slots of one provider entry.
fn provider_slots(
    p: &ProviderConfiguration,
    field: &str,
    invalid: &impl Fn(String, String) -> Error,
) -> Result<Vec<Slot>> {
    if p.set_count() != 1 {
        return Err(invalid(
            field.to_string(),
            "set exactly one of aescbc, aesgcm, secretbox, identity ({}), kms".into(),
        ));
    }
    if p.kms.is_some() {
        return Err(invalid(
            format!("{field}.kms"),
            "KMS plugins are not supported; use aescbc, aesgcm or secretbox".into(),
        ));
    }
    if p.identity.is_some() {
        return Ok(vec![Slot::Identity]);
    }
    let Some((kind, keys)) = p.keyed() else {
        return Err(invalid(field.to_string(), "no provider set".into()));
    };
    let field = format!("{field}.{}", kind.name());
    if keys.keys.is_empty() {
        return Err(invalid(format!("{field}.keys"), "must not be empty".into()));
    }
    let mut names = HashSet::new();
    let mut slots = Vec::new();
    for (i, k) in keys.keys.iter().enumerate() {
        let f = format!("{field}.keys[{i}]");
        if k.name.is_empty() {
            return Err(invalid(format!("{f}.name"), "must not be empty".into()));
        }
        // The name ends the stored prefix at its ':'.
        if k.name.contains(':') {
            return Err(invalid(
                format!("{f}.name"),
                format!("{:?} must not contain ':'", k.name),
            ));
        }
        if !names.insert(k.name.as_str()) {
            return Err(invalid(
                format!("{f}.name"),
                format!("{:?} is used by another key of this provider", k.name),
            ));
        }
        let secret = base64::engine::general_purpose::STANDARD
            .decode(k.secret.trim())
            .map_err(|e| invalid(format!("{f}.secret"), format!("not base64: {e}")))?;
        let sizes = kind.key_sizes();
        if !sizes.contains(&secret.len()) {
            return Err(invalid(
                format!("{f}.secret"),
                format!(
                    "{} bytes; {} keys are {} bytes",
                    secret.len(),
                    kind.name(),
                    sizes
                        .iter()
                        .map(|s| s.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        slots.push(Slot::Key(DataKey::new(kind, &k.name, secret)));
    }
    Ok(slots)
}

/// The store key prefix of a configured resource: `secrets` is
/// `/registry/core/secrets/`, `deployments.apps` `/registry/apps/deployments/`,
/// `*.apps` `/registry/apps/`, `*.` every core resource, `*.*` everything.
fn resource_prefix(r: &str) -> Result<String, String> {
    let ok = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
    };
    match r {
        "*.*" => Ok("/registry/".into()),
        "*." => Ok("/registry/core/".into()),
        _ => {
            if let Some(group) = r.strip_prefix("*.") {
                if ok(group) {
                    return Ok(format!("/registry/{group}/"));
                }
            } else {
                let (res, group) = r.split_once('.').unwrap_or((r, "core"));
                if ok(res) && ok(group) && !res.contains('.') {
                    return Ok(format!("/registry/{group}/{res}/"));
                }
            }
            Err(format!(
                "{r:?} is not a resource (lower-case plural, \
                 optionally .group; or *.group, *. or *.*)"
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY32: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

    fn load(text: &str) -> Result<EncryptionConfiguration> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("enc.yaml");
        std::fs::write(&p, text).unwrap();
        EncryptionConfiguration::load(&p)
    }

    fn with_provider(provider: &str) -> String {
        format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\n\
             resources:\n- resources: [secrets, configmaps]\n  providers:\n  - {provider}\n  - identity: {{}}\n"
        )
    }

    #[test]
    fn loads_every_provider_in_yaml_and_json() {
        for p in [
            format!("aescbc: {{keys: [{{name: k1, secret: {KEY32}}}]}}"),
            format!("aesgcm: {{keys: [{{name: k1, secret: {KEY32}}}]}}"),
            format!("secretbox: {{keys: [{{name: k1, secret: {KEY32}}}]}}"),
            "identity: {}".to_string(),
        ] {
            let cfg = load(&with_provider(&p)).unwrap_or_else(|e| panic!("{p}: {e}"));
            let t = cfg.transformers(Path::new("x")).unwrap();
            assert!(t.chain_for("/registry/core/configmaps/ns/c").is_some());
            assert!(t.chain_for("/registry/core/pods/ns/p").is_none());
        }
        let json = format!(
            r#"{{"apiVersion":"apiserver.config.k8s.io/v1","kind":"EncryptionConfiguration",
               "resources":[{{"resources":["secrets"],"providers":[{{"secretbox":{{"keys":[{{"name":"k","secret":"{KEY32}"}}]}}}}]}}]}}"#
        );
        load(&json).unwrap();
    }

    #[test]
    fn refusals_name_the_field() {
        let cases = [
            (
                with_provider("aesgmc: {keys: []}"),
                "unknown field `aesgmc`",
            ),
            (
                with_provider("aescbc: {keys: [{name: k1, secret: AAEC}]}"),
                "resources[0].providers[0].aescbc.keys[0].secret: 3 bytes",
            ),
            (
                with_provider("secretbox: {keys: [{name: k1, secret: AAECAwQFBgcICQoLDA0ODw==}]}"),
                "secretbox.keys[0].secret: 16 bytes",
            ),
            (
                with_provider("aesgcm: {keys: [{name: k1, secret: '%%%'}]}"),
                "aesgcm.keys[0].secret: not base64",
            ),
            (
                with_provider("aescbc: {keys: []}"),
                "providers[0].aescbc.keys: must not be empty",
            ),
            (
                with_provider(&format!("aescbc: {{keys: [{{name: k, secret: {KEY32}}}, {{name: k, secret: {KEY32}}}]}}")),
                "keys[1].name",
            ),
            (with_provider("kms: {name: x}"), "providers[0].kms"),
            (with_provider("{}"), "set exactly one"),
            (
                with_provider("identity: {}").replace("secrets,", "Secrets,"),
                "resources[0].resources[0]",
            ),
            (
                with_provider("identity: {}").replace("v1\n", "v2\n"),
                "apiVersion",
            ),
        ];
        for (text, want) in cases {
            let e = load(&text).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(e.contains(want), "want {want:?} in {e:?}");
        }
    }

    #[test]
    fn resource_prefixes() {
        assert_eq!(
            resource_prefix("secrets").unwrap(),
            "/registry/core/secrets/"
        );
        assert_eq!(
            resource_prefix("deployments.apps").unwrap(),
            "/registry/apps/deployments/"
        );
        assert_eq!(
            resource_prefix("*.rbac.authorization.k8s.io").unwrap(),
            "/registry/rbac.authorization.k8s.io/"
        );
        assert_eq!(resource_prefix("*.").unwrap(), "/registry/core/");
        assert_eq!(resource_prefix("*.*").unwrap(), "/registry/");
        assert!(resource_prefix("*").is_err());
        assert!(resource_prefix("a/b").is_err());
    }

    #[test]
    fn rotate_puts_a_new_key_first_and_keeps_the_old() {
        let mut cfg = load(&with_provider(&format!(
            "secretbox: {{keys: [{{name: k1, secret: {KEY32}}}]}}"
        )))
        .unwrap();
        let added = cfg.rotate(jiff::Timestamp::UNIX_EPOCH);
        assert_eq!(added, vec!["secretbox:secretboxkey-19700101T000000Z"]);
        let keys = &cfg.resources[0].providers[0]
            .secretbox
            .as_ref()
            .unwrap()
            .keys;
        assert_eq!(keys.len(), 2);
        assert_eq!(keys[1].name, "k1");
        // Twice in the same second: another name.
        let again = cfg.rotate(jiff::Timestamp::UNIX_EPOCH);
        assert_eq!(again, vec!["secretbox:secretboxkey-19700101T000000Z-2"]);
        cfg.transformers(Path::new("x")).unwrap();

        // Identity first: an aescbc provider goes in front.
        let mut off = load(&with_provider("identity: {}")).unwrap();
        off.rotate(jiff::Timestamp::UNIX_EPOCH);
        assert!(off.resources[0].providers[0].aescbc.is_some());
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("enc.yaml");
        off.save(&p, false).unwrap();
        let back = EncryptionConfiguration::load(&p).unwrap();
        let t = back.transformers(&p).unwrap();
        let chain = t.chain_for("/registry/core/secrets/a/b").unwrap();
        assert!(chain.active().label().starts_with("aescbc:aescbckey-"));
    }
}
