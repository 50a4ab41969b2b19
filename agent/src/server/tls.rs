//! The node server's TLS: its serving certificate (`--tls-cert-file` and
//! `--tls-private-key-file`; else the one issued through a CSR and kept in
//! `ROOT_DIR/pki/kubelet-server-current.pem` by certificate rotation; else
//! a self-signed pair generated once and kept under `ROOT_DIR/pki/` as the
//! kubelet keeps `kubelet.crt`), served through a resolver that rotation
//! can update ([`ReloadingCert`]), and the CA that client certificates must
//! chain to (`--client-ca-file`, else the CA of the kubeconfig's cluster).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine;
use rcgen::{CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, SanType};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

use crate::config::Config;

/// Why the node server has no TLS configuration.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} holds no usable PEM {what} (check --tls-cert-file / --tls-private-key-file / --client-ca-file)")]
    Pem { what: &'static str, path: PathBuf },
    #[error("generating the self-signed serving certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("kubeconfig {path}: {why}")]
    Kubeconfig { path: PathBuf, why: String },
    #[error("no client CA: pass --client-ca-file, or a --kubeconfig whose cluster names its CA; without one no caller can authenticate")]
    NoClientCa,
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("client certificate verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The serving certificate chain and its key.
pub struct ServingCert {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

impl ServingCert {
    /// From an issued certificate and its key.
    ///
    /// # Errors
    /// Either holds no usable PEM.
    pub fn from_pair(pair: &crate::certs::files::Pair) -> Result<ServingCert> {
        let here = Path::new("<issued certificate>");
        parse_pair(
            pair.cert_pem.as_bytes(),
            pair.key_pem.as_bytes(),
            here,
            here,
        )
    }
}

/// The serving certificate new TLS handshakes get; rotation replaces it
/// (connections already open keep theirs).
#[derive(Debug)]
pub struct ReloadingCert {
    current: std::sync::RwLock<Arc<CertifiedKey>>,
}

impl ReloadingCert {
    /// Serve `cert` until [`set`](Self::set) is called.
    ///
    /// # Errors
    /// The key does not match the certificate or is of an unknown type.
    pub fn new(cert: ServingCert) -> Result<Arc<ReloadingCert>> {
        Ok(Arc::new(ReloadingCert {
            current: std::sync::RwLock::new(Arc::new(certified(cert)?)),
        }))
    }

    /// Serve `cert` from the next handshake on.
    ///
    /// # Errors
    /// As [`new`](Self::new); the old certificate stays.
    pub fn set(&self, cert: ServingCert) -> Result<()> {
        let c = Arc::new(certified(cert)?);
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = c;
        Ok(())
    }

    /// The certificate chain served now.
    pub fn chain(&self) -> Vec<CertificateDer<'static>> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .cert
            .clone()
    }
}

fn certified(cert: ServingCert) -> Result<CertifiedKey> {
    let provider = rustls::crypto::ring::default_provider();
    Ok(CertifiedKey::from_der(cert.chain, cert.key, &provider)?)
}

impl rustls::server::ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        )
    }
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| Error::Io {
        what: "reading",
        path: path.to_owned(),
        source,
    })
}

fn parse_pair(cert: &[u8], key: &[u8], cert_path: &Path, key_path: &Path) -> Result<ServingCert> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
        .filter_map(|c| c.ok())
        .collect();
    if chain.is_empty() {
        return Err(Error::Pem {
            what: "certificate",
            path: cert_path.to_owned(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|_| Error::Pem {
        what: "private key",
        path: key_path.to_owned(),
    })?;
    Ok(ServingCert { chain, key })
}

/// Where certificate rotation keeps the CSR-issued serving certificate.
pub fn issued_serving_path(config: &Config) -> PathBuf {
    config
        .root_dir
        .join(crate::certs::files::PKI_DIR)
        .join(crate::certs::files::SERVER_PEM)
}

/// The configured pair; else, with `--rotate-server-certificates`, the
/// issued one while it is valid; else the self-signed one under
/// `ROOT_DIR/pki` (created on first start, reused afterwards).
///
/// # Errors
/// Unreadable or invalid files; the pki directory cannot be written.
pub fn serving_cert(config: &Config, hostname: &str, ips: &[IpAddr]) -> Result<ServingCert> {
    if let (Some(c), Some(k)) = (&config.tls_cert_file, &config.tls_private_key_file) {
        return parse_pair(&read(c)?, &read(k)?, c, k);
    }
    if config.rotate_server_certificates {
        let issued = crate::certs::files::Pair::read(&issued_serving_path(config));
        let valid = issued.as_ref().is_some_and(|p| {
            crate::certs::files::validity(&p.cert_pem)
                .is_some_and(|(_, not_after)| not_after > std::time::SystemTime::now())
        });
        if let (Some(p), true) = (issued, valid) {
            return ServingCert::from_pair(&p);
        }
    }
    let dir = config.root_dir.join("pki");
    let (crt, key) = (dir.join("kubelet.crt"), dir.join("kubelet.key"));
    if let (Ok(c), Ok(k)) = (std::fs::read(&crt), std::fs::read(&key)) {
        if let Ok(pair) = parse_pair(&c, &k, &crt, &key) {
            return Ok(pair);
        }
        tracing::warn!(path = %crt.display(), "stored serving certificate is unusable; generating a new one");
    }
    let (cert_pem, key_pem) = self_signed(hostname, ips)?;
    let io = |what, path: &Path| {
        let path = path.to_owned();
        move |source| Error::Io { what, path, source }
    };
    std::fs::create_dir_all(&dir).map_err(io("creating", &dir))?;
    crate::certs::files::write_private(&key, key_pem.as_bytes()).map_err(io("writing", &key))?;
    std::fs::write(&crt, cert_pem.as_bytes()).map_err(io("writing", &crt))?;
    tracing::info!(path = %crt.display(), "generated a self-signed serving certificate for the node server");
    parse_pair(cert_pem.as_bytes(), key_pem.as_bytes(), &crt, &key)
}

/// A self-signed serving certificate for the node's names and addresses
/// (the kubelet's `<host>@<timestamp>` certificate), valid for a year.
fn self_signed(hostname: &str, ips: &[IpAddr]) -> Result<(String, String)> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    let mut dn = DistinguishedName::new();
    let now = jiff::Timestamp::now();
    dn.push(
        DnType::CommonName,
        format!("{hostname}@{}", now.as_second()),
    );
    params.distinguished_name = dn;
    let mut sans = vec![SanType::DnsName(hostname.to_string().try_into()?)];
    if hostname != "localhost" {
        sans.push(SanType::DnsName("localhost".to_string().try_into()?));
    }
    sans.push(SanType::IpAddress(IpAddr::from([127, 0, 0, 1])));
    for ip in ips {
        sans.push(SanType::IpAddress(*ip));
    }
    params.subject_alt_names = sans;
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = rcgen::date_time_ymd(2000, 1, 1);
    let year = now.to_zoned(jiff::tz::TimeZone::UTC).year();
    params.not_after = rcgen::date_time_ymd(i32::from(year) + 1, 1, 1);
    let kp = rcgen::KeyPair::generate()?;
    let cert = params.self_signed(&kp)?;
    Ok((cert.pem(), kp.serialize_pem()))
}

/// The CA certificates client certificates must chain to.
///
/// # Errors
/// No CA configured or found, or unreadable.
pub fn client_ca(config: &Config) -> Result<Vec<CertificateDer<'static>>> {
    let (pem, path) = match (&config.client_ca_file, &config.kubeconfig) {
        (Some(p), _) => (read(p)?, p.clone()),
        (None, Some(kc)) => (kubeconfig_ca(kc)?, kc.clone()),
        (None, None) => return Err(Error::NoClientCa),
    };
    let cas: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .filter_map(|c| c.ok())
        .collect();
    if cas.is_empty() {
        return Err(Error::Pem {
            what: "CA certificate",
            path,
        });
    }
    Ok(cas)
}

/// The CA (PEM) of the current context's cluster in a kubeconfig.
fn kubeconfig_ca(path: &Path) -> Result<Vec<u8>> {
    let bad = |why: String| Error::Kubeconfig {
        path: path.to_owned(),
        why,
    };
    let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| bad(e.to_string()))?;
    let context = kc
        .current_context
        .as_deref()
        .and_then(|name| kc.contexts.iter().find(|c| c.name == name))
        .or(kc.contexts.first())
        .and_then(|c| c.context.as_ref())
        .map(|c| c.cluster.clone());
    let cluster = kc
        .clusters
        .iter()
        .find(|c| Some(&c.name) == context.as_ref())
        .or(kc.clusters.first())
        .and_then(|c| c.cluster.as_ref())
        .ok_or_else(|| bad("no cluster".into()))?;
    if let Some(data) = &cluster.certificate_authority_data {
        return base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .map_err(|e| bad(format!("certificate-authority-data: {e}")));
    }
    if let Some(file) = &cluster.certificate_authority {
        let file = Path::new(file);
        let file = if file.is_relative() {
            path.parent().unwrap_or(Path::new("/")).join(file)
        } else {
            file.to_owned()
        };
        return read(&file);
    }
    Err(Error::NoClientCa)
}

/// The server configuration: the serving pair, and client certificates
/// verified against `cas` when presented. Presenting none is allowed at
/// the TLS level so that the refusal is an HTTP 401 the caller can read.
///
/// # Errors
/// The key does not match the certificate, or no CA is usable.
pub fn server_config(
    serving: Arc<ReloadingCert>,
    cas: Vec<CertificateDer<'static>>,
) -> Result<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for ca in cas {
        roots.add(ca)?;
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(serving);
    // HTTP/1.1 only: the stream protocols (SPDY, WebSocket) are HTTP/1.1
    // upgrades, and kubectl's API server proxy speaks HTTP/1.1 to nodes.
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_signed_is_generated_once_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let config = Config {
            root_dir: dir.path().to_owned(),
            ..Config::default()
        };
        let a = serving_cert(&config, "node-a", &[IpAddr::from([192, 0, 2, 7])]).unwrap();
        let b = serving_cert(&config, "node-a", &[]).unwrap();
        assert_eq!(a.chain, b.chain);
        let mode = std::fs::metadata(dir.path().join("pki/kubelet.key"))
            .unwrap()
            .permissions();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(mode.mode() & 0o777, 0o600);
    }
}
