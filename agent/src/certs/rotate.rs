//! Certificate rotation (the kubelet's certificate manager): each
//! certificate is renewed through a new CSR, with a new key, once 70 to
//! 84% of its lifetime has passed (upstream's jittered deadline, so that
//! a fleet issued at once does not renew at once), and the new one is put
//! to use without restarting anything:
//!
//! - the client certificate: the combined file the kubeconfig names is
//!   replaced, and the shared API client is rebuilt from it
//!   ([`Reloader`]);
//! - the serving certificate of the node server: the file under the root
//!   dir is replaced, and the TLS resolver hands it to new handshakes
//!   ([`ReloadingCert`]). Without one yet (first start) it is requested
//!   at once; the self-signed one serves meanwhile.
//!
//! A failed renewal is retried with back-off; the old certificate stays
//! in use until it works.

use std::future::Future;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use skiff_bootstrap::{csr, names};

use super::files::{self, Pair};
use super::request;
use crate::apiclient::Reloader;
use crate::server::tls::{ReloadingCert, ServingCert};

/// Longest wait for one renewal's CSR to be approved and issued.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// Which certificate, and how a new one is put to use.
pub enum Kind {
    /// The API client certificate.
    Client(Reloader),
    /// The node server's serving certificate for these names.
    Serving {
        cert: Arc<ReloadingCert>,
        dns: Vec<String>,
        ips: Vec<IpAddr>,
    },
}

/// One certificate's rotation loop.
pub struct Rotator {
    client: kube::Client,
    node: String,
    /// The combined certificate-and-key file it replaces.
    file: PathBuf,
    kind: Kind,
}

/// When a certificate valid from `not_before` to `not_after` is renewed:
/// at 70% of its lifetime, plus up to a fifth of that (`jitter` in [0, 1)).
pub fn deadline(not_before: SystemTime, not_after: SystemTime, jitter: f64) -> SystemTime {
    let total = not_after
        .duration_since(not_before)
        .unwrap_or(Duration::ZERO);
    not_before + total.mul_f64(0.7 * (1.0 + 0.2 * jitter.clamp(0.0, 1.0)))
}

impl Rotator {
    pub fn new(client: kube::Client, node: &str, file: PathBuf, kind: Kind) -> Rotator {
        Rotator {
            client,
            node: node.to_string(),
            file,
            kind,
        }
    }

    fn what(&self) -> &'static str {
        match self.kind {
            Kind::Client(_) => "client",
            Kind::Serving { .. } => "serving",
        }
    }

    /// How long until the current certificate is due; zero without one.
    fn until_due(&self) -> Duration {
        let Some((nb, na)) = Pair::read(&self.file).and_then(|p| files::validity(&p.cert_pem))
        else {
            return Duration::ZERO;
        };
        let at = deadline(nb, na, rand::random::<f64>());
        let wait = at
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO);
        tracing::info!(
            certificate = self.what(),
            expires_in = ?na.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO),
            rotates_in = ?wait,
            "certificate rotation scheduled"
        );
        wait
    }

    /// Rotate until `stop` resolves.
    pub async fn run(self, stop: impl Future<Output = ()>) {
        tokio::pin!(stop);
        let mut backoff = BACKOFF_MIN;
        loop {
            let wait = self.until_due();
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = &mut stop => return,
            }
            match self.renew().await {
                Ok(()) => backoff = BACKOFF_MIN,
                Err(e) => {
                    tracing::warn!(
                        certificate = self.what(),
                        "renewing the certificate failed, retrying in {backoff:?}: {e}"
                    );
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = &mut stop => return,
                    }
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
    }

    /// One renewal: a new key, a CSR, the file replaced, the new
    /// certificate put to use.
    async fn renew(&self) -> Result<(), Error> {
        let pair = match &self.kind {
            Kind::Client(_) => {
                let req = csr::new_node_client(&self.node)?;
                request::obtain(
                    &self.client,
                    names::SIGNER_KUBELET_CLIENT,
                    req,
                    csr::NODE_CLIENT_USAGES,
                    REQUEST_TIMEOUT,
                )
                .await?
            }
            Kind::Serving { dns, ips, .. } => {
                let req = csr::new_node_serving(&self.node, dns, ips)?;
                request::obtain(
                    &self.client,
                    names::SIGNER_KUBELET_SERVING,
                    req,
                    csr::NODE_SERVING_USAGES,
                    REQUEST_TIMEOUT,
                )
                .await?
            }
        };
        pair.write(&self.file).map_err(|source| Error::Write {
            path: self.file.clone(),
            source,
        })?;
        match &self.kind {
            Kind::Client(reloader) => reloader.reload().await?,
            Kind::Serving { cert, .. } => cert.set(ServingCert::from_pair(&pair)?)?,
        }
        tracing::info!(certificate = self.what(), file = %self.file.display(), "certificate rotated");
        Ok(())
    }
}

/// Why one renewal failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Csr(#[from] csr::Error),
    #[error(transparent)]
    Request(#[from] request::Error),
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Reload(#[from] crate::apiclient::Error),
    #[error(transparent)]
    Tls(#[from] crate::server::tls::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_is_due_between_70_and_84_percent_of_the_lifetime() {
        let nb = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let na = nb + Duration::from_secs(100);
        let secs = |t: SystemTime| t.duration_since(nb).unwrap().as_secs_f64();
        assert!((secs(deadline(nb, na, 0.0)) - 70.0).abs() < 1e-6);
        assert!((secs(deadline(nb, na, 0.999_999)) - 84.0).abs() < 1e-3);
        assert!((secs(deadline(nb, na, 7.0)) - 84.0).abs() < 1e-6, "clamped");
        assert_eq!(
            deadline(na, nb, 0.5),
            na,
            "an inverted window is due at once"
        );
    }
}
