//! `secretbox`: NaCl's XSalsa20-Poly1305, stored as a 24-byte random nonce
//! followed by the box (tag first, then ciphertext), as Go's
//! `nacl/secretbox.Seal` writes it for upstream's secretbox transformer.

use crypto_secretbox::aead::{Aead, KeyInit};
use crypto_secretbox::{Nonce, XSalsa20Poly1305};

use super::CipherError;

/// Bytes of nonce before the box.
pub const NONCE_LEN: usize = 24;
/// Bytes of tag at the start of the box.
pub const TAG_LEN: usize = 16;
/// The one key size (upstream's).
pub const KEY_SIZES: &[usize] = &[32];

/// Encrypt `plain` under `key`: `nonce || tag || ciphertext`.
///
/// # Errors
/// `key` is not 32 bytes.
pub fn seal(key: &[u8], plain: &[u8]) -> Result<Vec<u8>, CipherError> {
    seal_with_nonce(key, &rand::random::<[u8; NONCE_LEN]>(), plain)
}

fn seal_with_nonce(
    key: &[u8],
    nonce: &[u8; NONCE_LEN],
    plain: &[u8],
) -> Result<Vec<u8>, CipherError> {
    let c = cipher(key)?;
    let sealed = c
        .encrypt(Nonce::from_slice(nonce), plain)
        .map_err(|_| CipherError::Refused("secretbox"))?;
    let mut out = Vec::with_capacity(NONCE_LEN + sealed.len());
    out.extend_from_slice(nonce);
    out.extend_from_slice(&sealed);
    Ok(out)
}

/// Open `nonce || box` under `key`.
///
/// # Errors
/// Too short, or the box does not verify (another key, or corrupt).
pub fn open(key: &[u8], body: &[u8]) -> Result<Vec<u8>, CipherError> {
    if body.len() < NONCE_LEN + TAG_LEN {
        return Err(CipherError::Shape {
            len: body.len(),
            shape: "shorter than a nonce and a tag",
        });
    }
    let (nonce, sealed) = body.split_at(NONCE_LEN);
    cipher(key)?
        .decrypt(Nonce::from_slice(nonce), sealed)
        .map_err(|_| {
            CipherError::NotAuthentic(
                "authentication failed: encrypted with another key, or corrupt",
            )
        })
}

fn cipher(key: &[u8]) -> Result<XSalsa20Poly1305, CipherError> {
    XSalsa20Poly1305::new_from_slice(key).map_err(|_| CipherError::KeySize {
        got: key.len(),
        want: "32",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let key = [9u8; 32];
        let sealed = seal(&key, b"hello").unwrap();
        assert_eq!(sealed.len(), NONCE_LEN + TAG_LEN + 5);
        assert_eq!(open(&key, &sealed).unwrap(), b"hello");
        assert_ne!(
            seal(&key, b"hello").unwrap(),
            sealed,
            "a fresh nonce each time"
        );
    }

    #[test]
    fn wrong_key_fails() {
        let sealed = seal(&[9u8; 32], b"hello").unwrap();
        assert!(matches!(
            open(&[8u8; 32], &sealed),
            Err(CipherError::NotAuthentic(_))
        ));
        assert!(matches!(
            open(&[9u8; 32], &sealed[..NONCE_LEN + 4]),
            Err(CipherError::Shape { .. })
        ));
        assert!(matches!(
            seal(&[9u8; 16], b"hello"),
            Err(CipherError::KeySize { got: 16, .. })
        ));
    }

    /// NaCl's own secretbox test vector (tests/secretbox.c): the layout Go's
    /// `secretbox.Seal` (and so upstream) writes after the nonce.
    #[test]
    fn upstream_layout() {
        let key = hex::decode("1b27556473e985d462cd51197a9a46c76009549eac6474f206c4ee0844f68389")
            .unwrap();
        let nonce: [u8; 24] = hex::decode("69696ee955b62b73cd62bda875fc73d68219e0036b7a0b37")
            .unwrap()
            .try_into()
            .unwrap();
        let plain = hex::decode(
            "be075fc53c81f2d5cf141316ebeb0c7b5228c52a4c62cbd44b66849b64244ffce5ecbaaf33bd751a\
             1ac728d45e6c61296cdc3c01233561f41db66cce314adb310e3be8250c46f06dceea3a7fa1348057\
             e2f6556ad6b1318a024a838f21af1fde048977eb48f59ffd4924ca1c60902e52f0a089bc76897040\
             e082f937763848645e0705",
        )
        .unwrap();
        let boxed = hex::decode(
            "f3ffc7703f9400e52a7dfb4b3d3305d98e993b9f48681273c29650ba32fc76ce48332ea7164d96a4\
             476fb8c531a1186ac0dfc17c98dce87b4da7f011ec48c97271d2c20f9b928fe2270d6fb863d51738\
             b48eeee314a7cc8ab932164548e526ae90224368517acfeabd6bb3732bc0e9da99832b61ca01b6de\
             56244a9e88d5f9b37973f622a43d14a6599b1f654cb45a74e355a5",
        )
        .unwrap();
        let sealed = seal_with_nonce(&key, &nonce, &plain).unwrap();
        assert_eq!(&sealed[..NONCE_LEN], nonce);
        assert_eq!(&sealed[NONCE_LEN..], boxed);
        assert_eq!(open(&key, &sealed).unwrap(), plain);
    }
}
