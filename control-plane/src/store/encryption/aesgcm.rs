//! `aesgcm`: AES-GCM, stored as a 12-byte random nonce followed by the
//! ciphertext and its 16-byte tag, with the store key as additional
//! authenticated data (upstream's `aestransformer` GCM layout: a value
//! copied to another key does not decrypt there).
//!
//! # Caveats
//! Random 96-bit nonces: as upstream warns, rotate the key well before
//! 2^32 writes (upstream says every 200,000 writes).

use aes_gcm::aead::consts::U12;
use aes_gcm::aead::{Aead, AeadCore, KeyInit, Payload};
use aes_gcm::aes::{Aes128, Aes192, Aes256};
use aes_gcm::AesGcm;

use super::CipherError;

/// Bytes of nonce before the ciphertext.
pub const NONCE_LEN: usize = 12;
/// Bytes of tag after the ciphertext.
pub const TAG_LEN: usize = 16;
/// Key sizes upstream accepts.
pub const KEY_SIZES: &[usize] = &[16, 24, 32];

/// Encrypt `plain` under `key`, binding it to `aad` (the store key):
/// `nonce || ciphertext || tag`.
///
/// # Errors
/// `key` is not 16, 24 or 32 bytes.
pub fn seal(key: &[u8], plain: &[u8], aad: &[u8]) -> Result<Vec<u8>, CipherError> {
    seal_with_nonce(key, &rand::random::<[u8; NONCE_LEN]>(), plain, aad)
}

fn seal_with_nonce(
    key: &[u8],
    nonce: &[u8; NONCE_LEN],
    plain: &[u8],
    aad: &[u8],
) -> Result<Vec<u8>, CipherError> {
    let msg = Payload { msg: plain, aad };
    let ct = match key.len() {
        16 => encrypt::<AesGcm<Aes128, U12>>(key, nonce, msg)?,
        24 => encrypt::<AesGcm<Aes192, U12>>(key, nonce, msg)?,
        32 => encrypt::<AesGcm<Aes256, U12>>(key, nonce, msg)?,
        got => return Err(CipherError::aes_key_size(got)),
    };
    let mut out = Vec::with_capacity(NONCE_LEN + ct.len());
    out.extend_from_slice(nonce);
    out.extend_from_slice(&ct);
    Ok(out)
}

/// Decrypt `nonce || ciphertext || tag` under `key` and `aad`.
///
/// # Errors
/// Too short, or the tag does not verify (another key, another store key,
/// or corrupt).
pub fn open(key: &[u8], body: &[u8], aad: &[u8]) -> Result<Vec<u8>, CipherError> {
    if body.len() < NONCE_LEN + TAG_LEN {
        return Err(CipherError::Shape {
            len: body.len(),
            shape: "shorter than a nonce and a tag",
        });
    }
    let (nonce, ct) = body.split_at(NONCE_LEN);
    let msg = Payload { msg: ct, aad };
    match key.len() {
        16 => decrypt::<AesGcm<Aes128, U12>>(key, nonce, msg),
        24 => decrypt::<AesGcm<Aes192, U12>>(key, nonce, msg),
        32 => decrypt::<AesGcm<Aes256, U12>>(key, nonce, msg),
        got => Err(CipherError::aes_key_size(got)),
    }
}

fn encrypt<C>(key: &[u8], nonce: &[u8], msg: Payload<'_, '_>) -> Result<Vec<u8>, CipherError>
where
    C: Aead + AeadCore<NonceSize = U12> + KeyInit,
{
    let c = C::new_from_slice(key).map_err(|_| CipherError::aes_key_size(key.len()))?;
    c.encrypt(aes_gcm::Nonce::from_slice(nonce), msg)
        .map_err(|_| CipherError::Refused("AES-GCM"))
}

fn decrypt<C>(key: &[u8], nonce: &[u8], msg: Payload<'_, '_>) -> Result<Vec<u8>, CipherError>
where
    C: Aead + AeadCore<NonceSize = U12> + KeyInit,
{
    let c = C::new_from_slice(key).map_err(|_| CipherError::aes_key_size(key.len()))?;
    c.decrypt(aes_gcm::Nonce::from_slice(nonce), msg)
        .map_err(|_| {
            CipherError::NotAuthentic(
                "authentication failed: encrypted with another key, for another object, or corrupt",
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAIN: &[u8] = br#"{"kind":"Secret","data":{"a":"c2tpZmY="}}"#;
    const AAD: &[u8] = b"/registry/core/secrets/default/s";

    #[test]
    fn round_trip_for_every_key_size() {
        for n in KEY_SIZES {
            let key = vec![7u8; *n];
            let sealed = seal(&key, PLAIN, AAD).unwrap();
            assert_eq!(sealed.len(), NONCE_LEN + PLAIN.len() + TAG_LEN);
            assert_eq!(open(&key, &sealed, AAD).unwrap(), PLAIN);
        }
    }

    #[test]
    fn wrong_key_or_other_object_fails() {
        let sealed = seal(&[1u8; 16], PLAIN, AAD).unwrap();
        assert!(matches!(
            open(&[2u8; 16], &sealed, AAD),
            Err(CipherError::NotAuthentic(_))
        ));
        assert!(matches!(
            open(&[1u8; 16], &sealed, b"/registry/core/secrets/default/t"),
            Err(CipherError::NotAuthentic(_))
        ));
        assert!(matches!(
            open(&[1u8; 16], &sealed[..NONCE_LEN + 3], AAD),
            Err(CipherError::Shape { .. })
        ));
        assert!(matches!(
            seal(&[1u8; 8], PLAIN, AAD),
            Err(CipherError::KeySize { got: 8, .. })
        ));
    }

    /// Produced by Python's `cryptography` (AESGCM, 128-bit key, the store
    /// key as associated data): Go's `gcm.Seal` writes the same bytes.
    #[test]
    fn upstream_layout() {
        let key: Vec<u8> = (0..16).collect();
        let nonce: [u8; 12] = std::array::from_fn(|i| 200 + i as u8);
        let ct = hex::decode(
            "4d0affd760570913fcc4cd21b30417845c329968a54e3f29af9526ea2cdd92f7\
             8a4acc70cdb7a94895e76000a65164c90624f76cd3de561d56",
        )
        .unwrap();
        let sealed = seal_with_nonce(&key, &nonce, PLAIN, AAD).unwrap();
        assert_eq!(&sealed[..NONCE_LEN], nonce);
        assert_eq!(&sealed[NONCE_LEN..], ct);
        assert_eq!(open(&key, &sealed, AAD).unwrap(), PLAIN);
    }
}
