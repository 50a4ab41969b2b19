//! `aescbc`: AES-CBC with PKCS#7 padding, stored as a 16-byte random IV
//! followed by the ciphertext (upstream's `aestransformer` CBC layout).
//!
//! CBC has no integrity check: a wrong key shows up only as bad padding
//! (or, one time in 256, as garbage). Upstream keeps it as the k3s
//! default and recommends secretbox or KMS for new clusters; so do we.

use aes::cipher::block_padding::Pkcs7;
use aes::cipher::{BlockCipher, BlockDecryptMut, BlockEncryptMut, KeyInit, KeyIvInit};

use super::CipherError;

/// Bytes of IV before the ciphertext.
pub const IV_LEN: usize = 16;
/// Key sizes upstream accepts (AES-128, -192, -256).
pub const KEY_SIZES: &[usize] = &[16, 24, 32];

/// Encrypt `plain` under `key` with a fresh random IV: `IV || ciphertext`.
///
/// # Errors
/// `key` is not 16, 24 or 32 bytes.
pub fn seal(key: &[u8], plain: &[u8]) -> Result<Vec<u8>, CipherError> {
    seal_with_iv(key, &rand::random::<[u8; IV_LEN]>(), plain)
}

fn seal_with_iv(key: &[u8], iv: &[u8; IV_LEN], plain: &[u8]) -> Result<Vec<u8>, CipherError> {
    let ct = match key.len() {
        16 => encrypt::<aes::Aes128>(key, iv, plain)?,
        24 => encrypt::<aes::Aes192>(key, iv, plain)?,
        32 => encrypt::<aes::Aes256>(key, iv, plain)?,
        got => return Err(CipherError::aes_key_size(got)),
    };
    let mut out = Vec::with_capacity(IV_LEN + ct.len());
    out.extend_from_slice(iv);
    out.extend_from_slice(&ct);
    Ok(out)
}

/// Decrypt `IV || ciphertext` under `key`.
///
/// # Errors
/// Too short, not whole blocks, or bad padding (most often: another key).
pub fn open(key: &[u8], body: &[u8]) -> Result<Vec<u8>, CipherError> {
    if body.len() < 2 * IV_LEN || !body.len().is_multiple_of(IV_LEN) {
        return Err(CipherError::Shape {
            len: body.len(),
            shape: "not an IV and whole AES blocks",
        });
    }
    let (iv, ct) = body.split_at(IV_LEN);
    match key.len() {
        16 => decrypt::<aes::Aes128>(key, iv, ct),
        24 => decrypt::<aes::Aes192>(key, iv, ct),
        32 => decrypt::<aes::Aes256>(key, iv, ct),
        got => Err(CipherError::aes_key_size(got)),
    }
}

fn encrypt<C>(key: &[u8], iv: &[u8], plain: &[u8]) -> Result<Vec<u8>, CipherError>
where
    C: BlockEncryptMut + BlockCipher + KeyInit,
{
    let enc = cbc::Encryptor::<C>::new_from_slices(key, iv)
        .map_err(|_| CipherError::aes_key_size(key.len()))?;
    Ok(enc.encrypt_padded_vec_mut::<Pkcs7>(plain))
}

fn decrypt<C>(key: &[u8], iv: &[u8], ct: &[u8]) -> Result<Vec<u8>, CipherError>
where
    C: BlockDecryptMut + BlockCipher + KeyInit,
{
    let dec = cbc::Decryptor::<C>::new_from_slices(key, iv)
        .map_err(|_| CipherError::aes_key_size(key.len()))?;
    dec.decrypt_padded_vec_mut::<Pkcs7>(ct).map_err(|_| {
        CipherError::NotAuthentic("bad padding: encrypted with another key, or corrupt")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAIN: &[u8] = br#"{"kind":"Secret","data":{"a":"c2tpZmY="}}"#;

    #[test]
    fn round_trip_for_every_key_size() {
        for n in KEY_SIZES {
            let key = vec![7u8; *n];
            let sealed = seal(&key, PLAIN).unwrap();
            // IV, then the plaintext padded to whole blocks.
            assert_eq!(sealed.len(), IV_LEN + (PLAIN.len() / 16 + 1) * 16);
            assert_eq!(open(&key, &sealed).unwrap(), PLAIN);
            assert_ne!(seal(&key, PLAIN).unwrap(), sealed, "a fresh IV each time");
        }
    }

    #[test]
    fn wrong_key_or_bad_sizes_fail() {
        let sealed = seal(&[1u8; 32], PLAIN).unwrap();
        // One wrong key in 256 yields valid padding, never the plaintext.
        assert!(open(&[2u8; 32], &sealed).map_or(true, |p| p != PLAIN));
        assert!(matches!(
            seal(&[1u8; 20], PLAIN),
            Err(CipherError::KeySize { got: 20, .. })
        ));
        assert!(matches!(
            open(&[1u8; 32], &sealed[..sealed.len() - 1]),
            Err(CipherError::Shape { .. })
        ));
        assert!(matches!(
            open(&[1u8; 32], &sealed[..IV_LEN]),
            Err(CipherError::Shape { .. })
        ));
    }

    /// Produced by Python's `cryptography` (AES-256-CBC, PKCS7): the same
    /// bytes Go's crypto/cipher writes after upstream's prefix.
    #[test]
    fn upstream_layout() {
        let key: Vec<u8> = (0..32).collect();
        let iv: [u8; 16] = std::array::from_fn(|i| 100 + i as u8);
        let ct = hex::decode(
            "44283a8a80a45cba29966b60a5c5bdab0852d02cb7739da2357f6af4aaa1bce0\
             bc38ecf9e7191705d86ce4e5ffa93e98",
        )
        .unwrap();
        let sealed = seal_with_iv(&key, &iv, PLAIN).unwrap();
        assert_eq!(&sealed[..IV_LEN], iv);
        assert_eq!(&sealed[IV_LEN..], ct);
        assert_eq!(open(&key, &sealed).unwrap(), PLAIN);
    }
}
