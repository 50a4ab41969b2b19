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

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::controller::Action;
use kube::ResourceExt;

use crate::{Ctx, Error};

/// A failed reconcile is tried again this soon.
const RETRY: Duration = Duration::from_secs(2);

/// Run `reconcile` for every CSR as it changes, until the watch ends; a
/// failure is logged as failed `doing` and retried.
pub(crate) async fn control<F, Fut>(ctx: Ctx, doing: &'static str, reconcile: F)
where
    F: FnMut(Arc<CertificateSigningRequest>, Arc<Ctx>) -> Fut,
    Fut: Future<Output = Result<Action, Error>> + Send + 'static,
{
    // Approver and signer read the one CSR informer of the manager.
    let csrs = ctx.informers.get::<CertificateSigningRequest>();
    let error_policy = move |csr: Arc<CertificateSigningRequest>, err: &Error, _: Arc<Ctx>| {
        tracing::warn!(csr = %csr.name_any(), "{doing} the CSR failed, retrying: {err}");
        Action::requeue(RETRY)
    };
    crate::reconciler::run(csrs, Arc::new(ctx), reconcile, error_policy).await;
}

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

/// A request as a test writes it: `pem` to `signer` for `usages`.
#[cfg(test)]
pub(crate) fn test_request(signer: &str, pem: &str, usages: &[&str]) -> CertificateSigningRequest {
    CertificateSigningRequest {
        spec: k8s_openapi::api::certificates::v1::CertificateSigningRequestSpec {
            request: k8s_openapi::ByteString(pem.as_bytes().to_vec()),
            signer_name: signer.into(),
            usages: Some(usages.iter().map(|s| s.to_string()).collect()),
            ..Default::default()
        },
        ..Default::default()
    }
}
