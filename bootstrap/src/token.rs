//! Bootstrap tokens and join tokens.
//!
//! A bootstrap token is upstream's `[a-z0-9]{6}.[a-z0-9]{16}`: a public id
//! (the Secret `bootstrap-token-<id>` holds it) and a secret. A join token
//! is what `skiff-server token create` prints and `skiff-agent join`
//! takes: k3s's secure token format,
//!
//! ```text
//! K10<sha256 of the cluster CA bundle, 64 hex digits>::<id>.<secret>
//! ```
//!
//! where the hash is over the exact bytes the API server serves at
//! [`CA_PATH`](crate::names::CA_PATH). The joining node fetches that
//! bundle without any trust, and refuses to go on (sending no credential)
//! unless its hash matches: a man in the middle would have to present the
//! real CA, whose key it does not have.

use std::fmt;

use sha2::{Digest, Sha256};

/// Why a token does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Not `[a-z0-9]{6}.[a-z0-9]{16}`.
    #[error("malformed bootstrap token: expected 6 and 16 lowercase letters or digits joined by a dot (abcdef.0123456789abcdef)")]
    MalformedBootstrap,
    /// No `K10<hash>::` prefix: the token cannot pin the CA.
    #[error("the token carries no CA hash: pass the whole join token that `skiff-server token create` printed (K10<hash>::<id>.<secret>)")]
    NoCaHash,
    /// A prefix that is not K10 and 64 hex digits.
    #[error("malformed join token: expected K10<64 hex digits of the CA hash>::<id>.<secret>")]
    MalformedJoin,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

const ID_LEN: usize = 6;
const SECRET_LEN: usize = 16;
const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
/// k3s's version prefix of secure tokens.
const JOIN_PREFIX: &str = "K10";

/// A bootstrap token: its public id and its secret.
#[derive(Clone, PartialEq, Eq)]
pub struct BootstrapToken {
    pub id: String,
    pub secret: String,
}

/// The secret never reaches logs through `{:?}`.
impl fmt::Debug for BootstrapToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BootstrapToken({}.<redacted>)", self.id)
    }
}

fn is_token_part(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| ALPHABET.contains(&b))
}

/// Whether `s` is a bootstrap token id (`[a-z0-9]{6}`).
pub fn is_token_id(s: &str) -> bool {
    is_token_part(s, ID_LEN)
}

impl BootstrapToken {
    /// A new random token (from the OS's CSPRNG through `rand`).
    pub fn generate() -> BootstrapToken {
        use rand::Rng;
        let mut rng = rand::rng();
        let mut pick = |n: usize| -> String {
            (0..n)
                .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
                .collect()
        };
        BootstrapToken {
            id: pick(ID_LEN),
            secret: pick(SECRET_LEN),
        }
    }

    /// Parse `id.secret`.
    ///
    /// # Errors
    /// [`Error::MalformedBootstrap`].
    pub fn parse(s: &str) -> Result<BootstrapToken> {
        let (id, secret) = s.split_once('.').ok_or(Error::MalformedBootstrap)?;
        if !is_token_part(id, ID_LEN) || !is_token_part(secret, SECRET_LEN) {
            return Err(Error::MalformedBootstrap);
        }
        Ok(BootstrapToken {
            id: id.to_string(),
            secret: secret.to_string(),
        })
    }

    /// `id.secret`, the bearer credential.
    pub fn expose(&self) -> String {
        format!("{}.{}", self.id, self.secret)
    }

    /// Whether `secret` equals this token's secret, in time independent of
    /// where they differ (a timing oracle would leak it byte by byte).
    pub fn secret_matches(&self, secret: &[u8]) -> bool {
        let mine = self.secret.as_bytes();
        if mine.len() != secret.len() {
            return false;
        }
        mine.iter()
            .zip(secret)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }
}

/// A join token: the CA hash and the bootstrap token.
#[derive(Clone, PartialEq, Eq)]
pub struct JoinToken {
    /// Lowercase hex sha256 of the CA bundle (see [`ca_hash`]).
    pub ca_hash: String,
    pub token: BootstrapToken,
}

impl fmt::Debug for JoinToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JoinToken(K10{}::{:?})", self.ca_hash, self.token)
    }
}

impl JoinToken {
    /// The join token for `token` in the cluster whose CA bundle is `ca`.
    pub fn new(ca: &[u8], token: BootstrapToken) -> JoinToken {
        JoinToken {
            ca_hash: ca_hash(ca),
            token,
        }
    }

    /// Parse `K10<hash>::<id>.<secret>`.
    ///
    /// # Errors
    /// [`Error::NoCaHash`] for a bare bootstrap token, [`Error::MalformedJoin`]
    /// or [`Error::MalformedBootstrap`] otherwise.
    pub fn parse(s: &str) -> Result<JoinToken> {
        let s = s.trim();
        let Some((prefix, creds)) = s.split_once("::") else {
            return Err(if BootstrapToken::parse(s).is_ok() {
                Error::NoCaHash
            } else {
                Error::MalformedJoin
            });
        };
        let hash = prefix
            .strip_prefix(JOIN_PREFIX)
            .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or(Error::MalformedJoin)?;
        Ok(JoinToken {
            ca_hash: hash.to_ascii_lowercase(),
            token: BootstrapToken::parse(creds)?,
        })
    }

    /// The printable token (it holds the secret).
    pub fn expose(&self) -> String {
        format!("{JOIN_PREFIX}{}::{}", self.ca_hash, self.token.expose())
    }

    /// Whether `ca` (the bytes served at the CA path) is the pinned CA.
    pub fn pins(&self, ca: &[u8]) -> bool {
        ca_hash(ca) == self.ca_hash
    }
}

/// Lowercase hex sha256 of a CA bundle's bytes.
pub fn ca_hash(ca: &[u8]) -> String {
    hex::encode(Sha256::digest(ca))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_tokens_follow_the_upstream_format() {
        let t = BootstrapToken::generate();
        assert!(is_token_id(&t.id) && t.secret.len() == 16);
        assert_eq!(BootstrapToken::parse(&t.expose()).unwrap(), t);
        for bad in [
            "abcdef0123456789abcdef",
            "ABCDEF.0123456789abcdef",
            "abcde.0123456789abcdef",
            "abcdef.0123456789abcde_",
            "abcdef.0123456789abcdef0",
        ] {
            assert_eq!(
                BootstrapToken::parse(bad),
                Err(Error::MalformedBootstrap),
                "{bad}"
            );
        }
        assert!(t.secret_matches(t.secret.as_bytes()));
        assert!(!t.secret_matches(b"0000000000000000"));
        assert!(!t.secret_matches(b"short"));
        assert!(!format!("{t:?}").contains(&t.secret));
    }

    #[test]
    fn join_tokens_pin_the_ca() {
        let ca = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let j = JoinToken::new(ca, BootstrapToken::generate());
        let text = j.expose();
        assert!(text.starts_with("K10") && text.contains("::"));
        let back = JoinToken::parse(&format!("  {text}\n")).unwrap();
        assert_eq!(back, j);
        assert!(back.pins(ca));
        assert!(!back.pins(b"another CA"));
        assert_eq!(
            JoinToken::parse(&j.token.expose()),
            Err(Error::NoCaHash),
            "a bare token is refused with a hint"
        );
        assert_eq!(
            JoinToken::parse(&format!("K10abc::{}", j.token.expose())),
            Err(Error::MalformedJoin)
        );
        assert_eq!(
            JoinToken::parse(&format!("K10{}::nope", j.ca_hash)),
            Err(Error::MalformedBootstrap)
        );
        assert_eq!(JoinToken::parse("garbage"), Err(Error::MalformedJoin));
        assert!(!format!("{j:?}").contains(&j.token.secret));
    }
}
