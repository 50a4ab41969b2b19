//! Which stored keys are transformed and how: one provider chain per
//! configured resource group, the first provider (its first key) writing,
//! every key reading by the prefix it finds (upstream's
//! `prefixTransformers`).

use std::borrow::Cow;

use super::{aescbc, aesgcm, secretbox, CipherError, Error, Result, ENCRYPTED_PREFIX};

/// A cipher upstream offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    AesCbc,
    AesGcm,
    Secretbox,
}

impl Kind {
    /// The provider's name in the config and in the stored prefix.
    pub fn name(self) -> &'static str {
        match self {
            Kind::AesCbc => "aescbc",
            Kind::AesGcm => "aesgcm",
            Kind::Secretbox => "secretbox",
        }
    }

    /// Key sizes in bytes the cipher accepts (the first is the one
    /// `rotate` generates, upstream's recommended size last for AES).
    pub fn key_sizes(self) -> &'static [usize] {
        match self {
            Kind::AesCbc => aescbc::KEY_SIZES,
            Kind::AesGcm => aesgcm::KEY_SIZES,
            Kind::Secretbox => secretbox::KEY_SIZES,
        }
    }

    fn seal(self, secret: &[u8], plain: &[u8], key: &str) -> Result<Vec<u8>, CipherError> {
        match self {
            Kind::AesCbc => aescbc::seal(secret, plain),
            Kind::AesGcm => aesgcm::seal(secret, plain, key.as_bytes()),
            Kind::Secretbox => secretbox::seal(secret, plain),
        }
    }

    fn open(self, secret: &[u8], body: &[u8], key: &str) -> Result<Vec<u8>, CipherError> {
        match self {
            Kind::AesCbc => aescbc::open(secret, body),
            Kind::AesGcm => aesgcm::open(secret, body, key.as_bytes()),
            Kind::Secretbox => secretbox::open(secret, body),
        }
    }
}

/// One named key of one provider.
#[derive(Clone)]
pub struct DataKey {
    pub kind: Kind,
    pub name: String,
    /// `k8s:enc:<kind>:v1:<name>:`.
    prefix: Vec<u8>,
    secret: Vec<u8>,
}

impl std::fmt::Debug for DataKey {
    // Never print the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.kind.name(), self.name)
    }
}

impl DataKey {
    /// A key whose size the caller has checked against `kind.key_sizes()`.
    pub fn new(kind: Kind, name: &str, secret: Vec<u8>) -> DataKey {
        DataKey {
            kind,
            name: name.to_string(),
            prefix: format!("k8s:enc:{}:v1:{name}:", kind.name()).into_bytes(),
            secret,
        }
    }
}

/// A provider slot in order: identity, or one key of a cipher provider
/// (a provider with three keys is three slots, in their order).
#[derive(Debug, Clone)]
pub enum Slot {
    Identity,
    Key(DataKey),
}

impl Slot {
    /// `identity`, or `aescbc:key1`.
    pub fn label(&self) -> String {
        match self {
            Slot::Identity => "identity".into(),
            Slot::Key(k) => format!("{}:{}", k.kind.name(), k.name),
        }
    }
}

/// The providers of one `resources` entry.
#[derive(Debug, Clone)]
pub struct Chain {
    /// Not empty (the config checks it): `slots[0]` writes.
    slots: Vec<Slot>,
}

/// A value read back, and whether it should be rewritten.
pub struct Read<'a> {
    pub plain: Cow<'a, [u8]>,
    /// Not written by the first slot: an update must rewrite it even when
    /// the object is unchanged (upstream's `stale`).
    pub stale: bool,
}

impl Chain {
    /// # Panics
    /// Never: an empty `slots` is replaced by identity.
    pub fn new(slots: Vec<Slot>) -> Chain {
        if slots.is_empty() {
            return Chain {
                slots: vec![Slot::Identity],
            };
        }
        Chain { slots }
    }

    /// The slot that encrypts writes.
    pub fn active(&self) -> &Slot {
        &self.slots[0]
    }

    pub fn slots(&self) -> &[Slot] {
        &self.slots
    }

    /// The stored form of `plain` under store key `key`.
    ///
    /// # Errors
    /// The cipher refused its key (sizes are checked at load, so: never).
    pub fn write(&self, key: &str, plain: &[u8]) -> Result<Vec<u8>> {
        match self.active() {
            Slot::Identity => Ok(plain.to_vec()),
            Slot::Key(k) => {
                let body = k
                    .kind
                    .seal(&k.secret, plain, key)
                    .map_err(|why| Error::Encrypt {
                        key: key.to_string(),
                        why,
                    })?;
                let mut out = Vec::with_capacity(k.prefix.len() + body.len());
                out.extend_from_slice(&k.prefix);
                out.extend_from_slice(&body);
                Ok(out)
            }
        }
    }

    /// The plaintext of `stored` (under store key `key`).
    ///
    /// # Errors
    /// An encrypted value whose key is not configured, or that does not
    /// decrypt with it.
    pub fn read<'a>(&self, key: &str, stored: &'a [u8]) -> Result<Read<'a>> {
        if !stored.starts_with(ENCRYPTED_PREFIX) {
            return Ok(Read {
                plain: Cow::Borrowed(stored),
                stale: !matches!(self.active(), Slot::Identity),
            });
        }
        for (i, slot) in self.slots.iter().enumerate() {
            let Slot::Key(k) = slot else { continue };
            if let Some(body) = stored.strip_prefix(k.prefix.as_slice()) {
                let plain = k
                    .kind
                    .open(&k.secret, body, key)
                    .map_err(|why| Error::Decrypt {
                        key: key.to_string(),
                        provider: slot.label(),
                        why,
                    })?;
                return Ok(Read {
                    plain: Cow::Owned(plain),
                    stale: i != 0,
                });
            }
        }
        Err(Error::UnknownKey {
            key: key.to_string(),
            stored_under: stored_under(stored),
        })
    }
}

/// What wrote `stored`: `aescbc:key1` for upstream's prefix, `identity`
/// for plaintext.
pub fn stored_under(stored: &[u8]) -> String {
    let Some(rest) = stored.strip_prefix(ENCRYPTED_PREFIX) else {
        return "identity".into();
    };
    // <kind>:v1:<name>:<body>
    let mut parts = rest.splitn(4, |b| *b == b':');
    let kind = parts.next().unwrap_or_default();
    let _version = parts.next();
    let name = parts.next().unwrap_or_default();
    format!(
        "{}:{}",
        String::from_utf8_lossy(kind),
        String::from_utf8_lossy(name)
    )
}

/// One `resources` entry's resource, as a store key prefix.
#[derive(Debug, Clone)]
pub struct Rule {
    /// As written in the config (`secrets`, `*.apps`).
    pub resource: String,
    /// `/registry/core/secrets/`, `/registry/apps/`.
    pub prefix: String,
    /// Index into `Transformers::chains`.
    chain: usize,
}

/// Every configured resource with its providers, first match wins.
#[derive(Debug, Clone, Default)]
pub struct Transformers {
    rules: Vec<Rule>,
    chains: Vec<Chain>,
}

impl Transformers {
    /// Add a `resources` entry (its resources as store prefixes).
    pub fn push(&mut self, resources: Vec<(String, String)>, chain: Chain) {
        let idx = self.chains.len();
        self.chains.push(chain);
        for (resource, prefix) in resources {
            self.rules.push(Rule {
                resource,
                prefix,
                chain: idx,
            });
        }
    }

    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    pub fn chain(&self, rule: &Rule) -> &Chain {
        &self.chains[rule.chain]
    }

    /// The first rule whose prefix holds store key `key`.
    pub fn rule_for(&self, key: &str) -> Option<&Rule> {
        self.rules.iter().find(|r| key.starts_with(&r.prefix))
    }

    /// The chain for store key `key`, when its resource is configured.
    pub fn chain_for(&self, key: &str) -> Option<&Chain> {
        self.rule_for(key).map(|r| &self.chains[r.chain])
    }

    /// Whether any key under `prefix` may be transformed (a list or watch
    /// of other resources skips the per-value work).
    pub fn touches(&self, prefix: &str) -> bool {
        self.rules
            .iter()
            .any(|r| r.prefix.starts_with(prefix) || prefix.starts_with(&r.prefix))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(slots: Vec<Slot>) -> Chain {
        Chain::new(slots)
    }

    fn key(kind: Kind, name: &str, b: u8) -> Slot {
        Slot::Key(DataKey::new(kind, name, vec![b; 32]))
    }

    #[test]
    fn first_key_writes_every_key_reads() {
        let k = "/registry/core/secrets/default/s";
        let old = chain(vec![key(Kind::AesCbc, "old", 1)]);
        let stored = old.write(k, b"{}").unwrap();
        assert!(stored.starts_with(b"k8s:enc:aescbc:v1:old:"));
        assert_eq!(stored_under(&stored), "aescbc:old");

        let rotated = chain(vec![
            key(Kind::Secretbox, "new", 2),
            key(Kind::AesCbc, "old", 1),
            Slot::Identity,
        ]);
        let r = rotated.read(k, &stored).unwrap();
        assert_eq!(&*r.plain, b"{}");
        assert!(r.stale, "read with a key that is not the first");
        let fresh = rotated.write(k, b"{}").unwrap();
        assert!(fresh.starts_with(b"k8s:enc:secretbox:v1:new:"));
        assert!(!rotated.read(k, &fresh).unwrap().stale);

        // Plaintext always reads; it is stale unless identity writes.
        let r = rotated.read(k, b"{\"a\":1}").unwrap();
        assert!(r.stale && &*r.plain == b"{\"a\":1}");
        let off = chain(vec![Slot::Identity, key(Kind::AesCbc, "old", 1)]);
        assert!(!off.read(k, b"{}").unwrap().stale);
        assert_eq!(off.write(k, b"{}").unwrap(), b"{}");
        assert!(off.read(k, &stored).unwrap().stale);
    }

    #[test]
    fn unknown_or_wrong_key_fails_with_its_name() {
        let k = "/registry/core/secrets/default/s";
        let a = chain(vec![key(Kind::AesGcm, "a", 1)]);
        let stored = a.write(k, b"{}").unwrap();
        let other = chain(vec![key(Kind::AesGcm, "b", 1)]);
        let e = other.read(k, &stored).err().unwrap();
        assert!(matches!(e, Error::UnknownKey { .. }), "{e:?}");
        let e = e.to_string();
        assert!(e.contains("aesgcm:a") && e.contains(k), "{e}");
        let same_name = chain(vec![key(Kind::AesGcm, "a", 2)]);
        let e = same_name.read(k, &stored).err().unwrap();
        assert!(
            matches!(
                e,
                Error::Decrypt {
                    why: CipherError::NotAuthentic(_),
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains("authentication failed"), "{e}");
    }

    #[test]
    fn rules_match_by_prefix_first_wins() {
        let mut t = Transformers::default();
        t.push(
            vec![("secrets".into(), "/registry/core/secrets/".into())],
            chain(vec![key(Kind::AesCbc, "s", 1)]),
        );
        t.push(
            vec![("*.*".into(), "/registry/".into())],
            chain(vec![Slot::Identity]),
        );
        let s = t.chain_for("/registry/core/secrets/ns/x").unwrap();
        assert!(matches!(s.active(), Slot::Key(_)));
        let o = t.chain_for("/registry/core/configmaps/ns/x").unwrap();
        assert!(matches!(o.active(), Slot::Identity));
        assert!(t.chain_for("compact_rev_key").is_none());
        assert!(t.touches("/registry/core/secrets/ns/"));
        assert!(t.touches("/registry/"));
    }
}
