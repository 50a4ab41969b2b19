//! Obtaining a certificate through the CertificateSigningRequest API: the
//! key is made here and never sent; the request goes to the API, and the
//! node waits until it is approved and issued (or denied, or failed).

use std::time::{Duration, Instant};

use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use kube::api::PostParams;
use kube::Api;
use skiff_bootstrap::csr::NewRequest;

use super::files::{self, Pair};

/// How often the request is looked at while it waits.
const POLL: Duration = Duration::from_millis(500);

/// Why no certificate was obtained.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// 401: the credential (a bootstrap token, or the node's certificate)
    /// is not accepted.
    #[error("the API server rejected the credentials (401 Unauthorized): the token is expired, deleted or unknown; create a new one with `skiff-server token create`")]
    Unauthorized,
    /// 403 on create.
    #[error("the API server refused the certificate request: {0}")]
    Forbidden(String),
    /// Any other API failure.
    #[error("{action}: {source}")]
    Api {
        action: &'static str,
        #[source]
        source: kube::Error,
    },
    /// Someone denied it.
    #[error("certificate signing request {name} was denied ({reason}: {message})")]
    Denied {
        name: String,
        reason: String,
        message: String,
    },
    /// The signer refused it.
    #[error("certificate signing request {name} failed ({reason}: {message})")]
    Failed {
        name: String,
        reason: String,
        message: String,
    },
    /// Not approved in time.
    #[error("certificate signing request {name} was not approved and issued within {after:?}; approve it with `kubectl certificate approve {name}` or check the server's csrapproving and csrsigning controllers")]
    Timeout { name: String, after: Duration },
    /// What came back does not belong to the key.
    #[error("the certificate issued for {name} is not for this node's key")]
    WrongKey { name: String },
}

fn api_error(action: &'static str) -> impl FnOnce(kube::Error) -> Error {
    move |source| match &source {
        kube::Error::Api(s) if s.code == 401 => Error::Unauthorized,
        _ => Error::Api { action, source },
    }
}

fn condition(c: &CertificateSigningRequest, ty: &str) -> Option<(String, String)> {
    c.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|x| x.type_ == ty)
        .map(|x| {
            (
                x.reason.clone().unwrap_or_default(),
                x.message.clone().unwrap_or_default(),
            )
        })
}

/// Send `req` to `signer` with `usages` as the caller `client` is, and
/// wait up to `timeout` for the certificate.
///
/// # Errors
/// Refused, denied, failed, timed out, or the API failed.
pub async fn obtain(
    client: &kube::Client,
    signer: &str,
    req: NewRequest,
    usages: &[&str],
    timeout: Duration,
) -> Result<Pair, Error> {
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let obj = CertificateSigningRequest {
        metadata: ObjectMeta {
            generate_name: Some("csr-".into()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(req.csr_pem.into_bytes()),
            signer_name: signer.to_string(),
            usages: Some(usages.iter().map(|u| u.to_string()).collect()),
            ..Default::default()
        },
        ..Default::default()
    };
    let created = api
        .create(&PostParams::default(), &obj)
        .await
        .map_err(|e| match e {
            kube::Error::Api(s) if s.code == 403 => Error::Forbidden(s.message),
            e => api_error("creating the certificate signing request")(e),
        })?;
    let name = created.metadata.name.unwrap_or_default();
    tracing::info!(csr = %name, signer, "certificate signing request sent; waiting for approval");
    let deadline = Instant::now() + timeout;
    loop {
        let c = api
            .get(&name)
            .await
            .map_err(api_error("reading the certificate signing request"))?;
        if let Some((reason, message)) = condition(&c, "Denied") {
            return Err(Error::Denied {
                name,
                reason,
                message,
            });
        }
        if let Some((reason, message)) = condition(&c, "Failed") {
            return Err(Error::Failed {
                name,
                reason,
                message,
            });
        }
        let cert = c
            .status
            .as_ref()
            .and_then(|s| s.certificate.as_ref())
            .filter(|b| !b.0.is_empty());
        if let (Some(cert), Some(_)) = (cert, condition(&c, "Approved")) {
            let cert_pem = String::from_utf8_lossy(&cert.0).into_owned();
            if !files::key_matches(&cert_pem, &req.key_pem) {
                return Err(Error::WrongKey { name });
            }
            tracing::info!(csr = %name, "certificate issued");
            return Ok(Pair {
                cert_pem,
                key_pem: req.key_pem,
            });
        }
        if Instant::now() >= deadline {
            return Err(Error::Timeout {
                name,
                after: timeout,
            });
        }
        tokio::time::sleep(POLL).await;
    }
}
