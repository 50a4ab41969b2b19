//! Node certificates: the CSR approver (`csrapproving`) and the signer
//! (`csrsigning`) of kube-controller-manager, each a kube-runtime
//! controller whose reconcile function handles one
//! CertificateSigningRequest.
//!
//! # Layout
//! - [`approve`]: which requests are approved, and by what evidence.
//! - [`sign`]: issuing approved requests with the cluster CA.

pub mod approve;
pub mod sign;

use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Whether the request has a condition of type `ty`.
pub fn has_condition(csr: &CertificateSigningRequest, ty: &str) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == ty))
}

/// Whether a certificate was issued for the request.
pub fn is_issued(csr: &CertificateSigningRequest) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.certificate.as_ref())
        .is_some_and(|c| !c.0.is_empty())
}

/// `csr` with a new True condition of type `ty` appended.
pub fn with_condition(
    csr: &CertificateSigningRequest,
    ty: &str,
    reason: &str,
    message: &str,
) -> CertificateSigningRequest {
    let mut csr = csr.clone();
    let now = Time(jiff::Timestamp::now());
    let status = csr.status.get_or_insert_with(Default::default);
    status
        .conditions
        .get_or_insert_with(Vec::new)
        .push(CertificateSigningRequestCondition {
            type_: ty.to_string(),
            status: "True".into(),
            reason: Some(reason.into()),
            message: Some(message.into()),
            last_update_time: Some(now.clone()),
            last_transition_time: Some(now),
        });
    csr
}
