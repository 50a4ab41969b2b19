//! The CSR signer (upstream's `csrsigning`): approved requests for the
//! well-known signers are issued with the cluster CA.
//!
//! - `kube-apiserver-client-kubelet` and `kubelet-serving` requests must
//!   meet the node certificate rules (see `skiff_bootstrap::csr`);
//!   `kube-apiserver-client` requests must be for client use only.
//! - A request that breaks its signer's rules gets a `Failed` condition
//!   (reason `SignerValidationFailure`) instead of a certificate.
//! - The certificate carries the request's subject and names, the usages
//!   of `spec.usages`, and lasts `spec.expirationSeconds` when that is
//!   shorter than `--cluster-signing-duration` (at least ten minutes, as
//!   the API validates), never past the CA's own expiry; it starts five
//!   minutes back to absorb clock skew, as upstream, but at most a tenth
//!   of its lifetime back: a short-lived certificate (tests) would
//!   otherwise be past its rotation point the moment it is issued.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::ByteString;
use kube::api::PostParams;
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use rcgen::{ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use skiff_bootstrap::{csr, names};

use super::{has_condition, is_issued, with_condition};
use crate::{Ctx, Error, SigningCa};

/// Backdating of `notBefore` (upstream's signer uses five minutes).
const BACKDATE: Duration = Duration::from_secs(5 * 60);

/// Why a request cannot be signed.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    /// The request breaks its signer's rules: it fails for good.
    #[error("{0}")]
    Invalid(String),
    /// The CA could not be loaded or rcgen failed.
    #[error("signing failed: {0}")]
    Rcgen(#[from] rcgen::Error),
}

pub async fn run(ctx: Ctx) -> Result<(), Error> {
    let Some(ca) = ctx.config.signing.clone() else {
        tracing::info!("CSR signing disabled: no cluster signing CA");
        return std::future::pending().await;
    };
    // Fail loudly at start on an unusable CA rather than on every request.
    ca.issuer()
        .map_err(|e| Error::Config(format!("cluster signing CA: {e}")))?;
    super::control(ctx, "signing", reconcile).await;
    Ok(())
}

impl SigningCa {
    fn issuer(&self) -> Result<Issuer<'static, KeyPair>, rcgen::Error> {
        let key = KeyPair::from_pem(&self.key_pem)?;
        Issuer::from_ca_cert_pem(&self.cert_pem, key)
    }
}

fn signed_by_us(signer: &str) -> bool {
    matches!(
        signer,
        names::SIGNER_KUBELET_CLIENT | names::SIGNER_KUBELET_SERVING | names::SIGNER_API_CLIENT
    )
}

/// Check `req` against its signer's rules.
///
/// # Errors
/// [`SignError::Invalid`] with the broken rule.
pub fn validate(req: &CertificateSigningRequest) -> Result<(), SignError> {
    let parsed =
        csr::parse_pem(&req.spec.request.0).map_err(|e| SignError::Invalid(e.to_string()))?;
    let usages = req.spec.usages.clone().unwrap_or_default();
    let res = match req.spec.signer_name.as_str() {
        names::SIGNER_KUBELET_CLIENT => csr::node_client(&parsed, &usages).map(drop),
        names::SIGNER_KUBELET_SERVING => csr::node_serving(&parsed, &usages).map(drop),
        names::SIGNER_API_CLIENT => csr::client_usages(&usages),
        other => {
            return Err(SignError::Invalid(format!(
                "signer {other:?} is not handled here"
            )))
        }
    };
    res.map_err(|e| SignError::Invalid(e.to_string()))
}

/// How long the certificate for `req` lasts.
pub fn lifetime(req: &CertificateSigningRequest, max: Duration) -> Duration {
    match req.spec.expiration_seconds {
        Some(s) if s > 0 => max.min(Duration::from_secs(s as u64)),
        _ => max,
    }
}

/// Issue `req` with `ca` for `lifetime`; returns the certificate PEM.
///
/// # Errors
/// An invalid request, or a signing failure.
#[allow(clippy::disallowed_types)] // rcgen's validity is in `time` values
pub fn issue(
    req: &CertificateSigningRequest,
    ca: &SigningCa,
    lifetime: Duration,
) -> Result<String, SignError> {
    validate(req)?;
    let pem = std::str::from_utf8(&req.spec.request.0)
        .map_err(|_| SignError::Invalid("spec.request is not PEM text".into()))?;
    let mut params = rcgen::CertificateSigningRequestParams::from_pem(pem)
        .map_err(|e| SignError::Invalid(format!("spec.request: {e}")))?;
    let issuer = ca.issuer()?;
    let now = time::OffsetDateTime::now_utc();
    let ca_expiry = ca_not_after(&ca.cert_pem)
        .unwrap_or(time::OffsetDateTime::now_utc() + time::Duration::days(1));
    let p = &mut params.params;
    p.not_before = now - BACKDATE.min(lifetime / 10);
    p.not_after = (now + lifetime).min(ca_expiry);
    p.is_ca = IsCa::ExplicitNoCa;
    p.use_authority_key_identifier_extension = true;
    p.serial_number = Some(rcgen::SerialNumber::from(rand_serial()));
    p.key_usages.clear();
    p.extended_key_usages.clear();
    for u in req.spec.usages.iter().flatten() {
        match u.as_str() {
            csr::USAGE_DIGITAL_SIGNATURE => p.key_usages.push(KeyUsagePurpose::DigitalSignature),
            csr::USAGE_KEY_ENCIPHERMENT => p.key_usages.push(KeyUsagePurpose::KeyEncipherment),
            csr::USAGE_CLIENT_AUTH => p
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ClientAuth),
            csr::USAGE_SERVER_AUTH => p
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ServerAuth),
            _ => {}
        }
    }
    Ok(params.signed_by(&issuer)?.pem())
}

/// A random positive 128-bit serial number (RFC 5280 allows 20 octets).
fn rand_serial() -> Vec<u8> {
    let mut b: [u8; 16] = rand::random();
    b[0] &= 0x7f;
    b.to_vec()
}

// rcgen takes its validity as `time` values: this is the one boundary
// where that library is used.
#[allow(clippy::disallowed_types)]
fn ca_not_after(pem: &str) -> Option<time::OffsetDateTime> {
    let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).ok()?;
    let cert = block.parse_x509().ok()?;
    time::OffsetDateTime::from_unix_timestamp(cert.validity().not_after.timestamp()).ok()
}

async fn reconcile(req: Arc<CertificateSigningRequest>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let pending_issue = has_condition(&req, "Approved")
        && !has_condition(&req, "Denied")
        && !has_condition(&req, "Failed")
        && !is_issued(&req);
    if !pending_issue || !signed_by_us(&req.spec.signer_name) {
        return Ok(Action::await_change());
    }
    let Some(ca) = ctx.config.signing.as_ref() else {
        return Ok(Action::await_change());
    };
    let name = req.name_any();
    let updated = match issue(
        &req,
        ca,
        lifetime(&req, ctx.config.cluster_signing_duration),
    ) {
        Ok(cert) => {
            let mut r = (*req).clone();
            r.status.get_or_insert_with(Default::default).certificate =
                Some(ByteString(cert.into_bytes()));
            tracing::info!(csr = %name, signer = %req.spec.signer_name, "issued the certificate");
            r
        }
        Err(SignError::Invalid(why)) => {
            tracing::warn!(csr = %name, signer = %req.spec.signer_name, "not signing the CSR: {why}");
            with_condition(&req, "Failed", "SignerValidationFailure", &why)
        }
        Err(e) => return Err(Error::Config(e.to_string())),
    };
    let api: Api<CertificateSigningRequest> = Api::all(ctx.client.clone());
    api.replace_subresource("status", &name, &PostParams::default(), &updated)
        .await?;
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    fn ca() -> SigningCa {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        SigningCa {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    fn request(
        signer: &str,
        pem: &str,
        usages: &[&str],
        seconds: Option<i32>,
    ) -> CertificateSigningRequest {
        let mut r = super::super::test_request(signer, pem, usages);
        r.spec.expiration_seconds = seconds;
        r
    }

    #[test]
    fn node_certificates_are_issued_with_the_requested_identity_and_lifetime() {
        let ca = ca();
        let r = csr::new_node_client("n1").unwrap();
        let req = request(
            names::SIGNER_KUBELET_CLIENT,
            &r.csr_pem,
            csr::NODE_CLIENT_USAGES,
            Some(600),
        );
        let life = lifetime(&req, Duration::from_secs(3600));
        assert_eq!(life, Duration::from_secs(600));
        let pem = issue(&req, &ca, life).unwrap();
        let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
        let cert = block.parse_x509().unwrap();
        let cn = cert
            .subject()
            .iter_common_name()
            .next()
            .unwrap()
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(cn, "system:node:n1");
        let v = cert.validity();
        let span = v.not_after.timestamp() - v.not_before.timestamp();
        assert_eq!(span, 600 + 60, "backdated by a tenth of the lifetime");
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.client_auth && !eku.server_auth);
        assert_eq!(
            lifetime(
                &request(names::SIGNER_KUBELET_CLIENT, &r.csr_pem, &[], None),
                Duration::from_secs(60)
            ),
            Duration::from_secs(60)
        );
    }

    #[test]
    fn requests_breaking_their_signers_rules_fail() {
        let ca = ca();
        let serving = csr::new_node_serving("n1", &["n1".into()], &[]).unwrap();
        let as_client = request(
            names::SIGNER_KUBELET_CLIENT,
            &serving.csr_pem,
            csr::NODE_CLIENT_USAGES,
            None,
        );
        assert!(matches!(
            issue(&as_client, &ca, Duration::from_secs(600)),
            Err(SignError::Invalid(_))
        ));
        let client = csr::new_node_client("n1").unwrap();
        let server_usage = request(
            names::SIGNER_API_CLIENT,
            &client.csr_pem,
            &["server auth"],
            None,
        );
        assert!(matches!(
            validate(&server_usage),
            Err(SignError::Invalid(_))
        ));
        let ok = request(
            names::SIGNER_KUBELET_SERVING,
            &serving.csr_pem,
            csr::NODE_SERVING_USAGES,
            None,
        );
        assert!(issue(&ok, &ca, Duration::from_secs(600)).is_ok());
    }
}
