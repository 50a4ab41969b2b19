//! Encryption at rest: kube-apiserver's `--encryption-provider-config`
//! (`EncryptionConfiguration`), applied to the stored values of the
//! configured resources by a [`Store`](super::Store) wrapper.
//!
//! # Layout
//! - [`config`]: the `apiserver.config.k8s.io/v1` file: parsing, checks
//!   that name the bad field, and rewriting it (key rotation).
//! - [`aescbc`], [`aesgcm`], [`secretbox`]: one cipher each, sealing and
//!   opening the bytes that follow upstream's `k8s:enc:<kind>:v1:<key>:`
//!   prefix, in upstream's layout (nonce or IV first).
//! - [`transformer`]: which resources' keys are transformed, and with which
//!   providers: the first key encrypts, every key decrypts.
//! - [`store`](mod@store): [`EncryptedStore`], plaintext above, ciphertext below.
//! - [`admin`]: what `skiff-server secrets-encrypt status|rotate|reencrypt`
//!   do.
//!
//! # Guarantees
//! A value without the `k8s:enc:` prefix is read as plaintext whatever the
//! providers are, so turning encryption on keeps existing objects readable
//! (upstream needs `identity` listed for that); such values, and values
//! under any key but the first, are *stale*: an update rewrites them with
//! the first key even when the object did not change.

pub mod admin;
pub mod aescbc;
pub mod aesgcm;
pub mod config;
pub mod secretbox;
pub mod store;
pub mod transformer;

pub use config::EncryptionConfiguration;
pub use store::EncryptedStore;
pub use transformer::Transformers;

/// Encryption errors; each names the config file and field, or the stored key.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The config file cannot be read or written.
    #[error("{action} encryption config {path}: {source}")]
    Io {
        action: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// Not YAML or JSON of the expected shape (serde's message names the field).
    #[error("parsing encryption config {path}: {message}")]
    Parse { path: String, message: String },
    /// A field has a value the server cannot use.
    #[error("encryption config {path}: {field}: {why}")]
    Invalid {
        path: String,
        field: String,
        why: String,
    },
    /// A stored value does not decrypt with the key its prefix names.
    #[error("decrypting {key}: {provider}: {why}")]
    Decrypt {
        key: String,
        /// `aescbc:key1`.
        provider: String,
        #[source]
        why: CipherError,
    },
    /// A stored value was written under a key the config does not hold.
    #[error("decrypting {key}: stored under {stored_under}, which is not a key in --encryption-provider-config")]
    UnknownKey { key: String, stored_under: String },
    /// A value cannot be encrypted (a cipher refused its key).
    #[error("encrypting {key}: {why}")]
    Encrypt {
        key: String,
        #[source]
        why: CipherError,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why one cipher refused a key or a stored body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CipherError {
    #[error("key is {got} bytes, want {want}")]
    KeySize { got: usize, want: &'static str },
    /// The body after the prefix cannot hold what the cipher stores.
    #[error("{len} bytes after the prefix is {shape}")]
    Shape { len: usize, shape: &'static str },
    /// Decryption failed: another key, another store key, or corrupt.
    #[error("{0}")]
    NotAuthentic(&'static str),
    /// The cipher refused to encrypt (a message longer than it allows).
    #[error("{0} refused the message")]
    Refused(&'static str),
}

impl CipherError {
    /// An AES key of `got` bytes (AES takes 16, 24 or 32).
    fn aes_key_size(got: usize) -> CipherError {
        CipherError::KeySize {
            got,
            want: "16, 24 or 32",
        }
    }
}

/// The prefix every encrypted value starts with (upstream's).
pub const ENCRYPTED_PREFIX: &[u8] = b"k8s:enc:";
