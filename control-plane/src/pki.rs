//! The cluster's PKI: a CA made on first start, the API server's serving
//! certificate, client certificates (CN = user, O = group) and kubeconfigs.
//!
//! Files live in `DATA_DIR/pki/`: `ca.crt`, `ca.key` (0600), `server.crt`,
//! `server.key`. The serving certificate is re-issued at every start so
//! that its SANs always match the addresses served.

use std::path::{Path, PathBuf};

use base64::Engine;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use serde_json::json;

/// PKI errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("certificate operation failed ({what}): {source}")]
    Cert {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },
    #[error("a client certificate carries at most two groups (got {0}); use a token for more")]
    TooManyGroups(usize),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

fn cert_err(what: &'static str) -> impl FnOnce(rcgen::Error) -> Error {
    move |source| Error::Cert { what, source }
}

/// The cluster CA, loaded or created.
pub struct Pki {
    dir: PathBuf,
    ca_pem: String,
    ca_key_pem: String,
}

/// A certificate and its private key, PEM.
#[derive(Debug, Clone)]
pub struct CertKey {
    pub cert_pem: String,
    pub key_pem: String,
    pub cert_der: Vec<u8>,
    pub key_der: Vec<u8>,
}

pub(crate) fn write_file(path: &Path, data: &str, private: bool) -> Result<()> {
    let io = |source| Error::Io {
        what: "writing",
        path: path.display().to_string(),
        source,
    };
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, data).map_err(io)?;
    if private {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
    }
    std::fs::rename(&tmp, path).map_err(io)
}

fn read_file(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| Error::Io {
        what: "reading",
        path: path.display().to_string(),
        source,
    })
}

/// `sans` (IPs or DNS names) as SAN entries, empty and repeated ones
/// left out.
fn san_types(sans: &[String]) -> Result<Vec<SanType>> {
    let mut seen: Vec<&String> = Vec::new();
    let mut out = Vec::new();
    for s in sans {
        if s.is_empty() || seen.contains(&s) {
            continue;
        }
        seen.push(s);
        out.push(match s.parse::<std::net::IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(s.clone().try_into().map_err(cert_err("certificate SAN"))?),
        });
    }
    Ok(out)
}

/// Validity window: from yesterday (clock skew) for `years`.
fn validity(params: &mut CertificateParams, years: i32) {
    let from = (jiff::Timestamp::now() - jiff::SignedDuration::from_hours(24))
        .to_zoned(jiff::tz::TimeZone::UTC)
        .date();
    let (year, month, day) = (i32::from(from.year()), from.month() as u8, from.day() as u8);
    params.not_before = rcgen::date_time_ymd(year, month, day);
    params.not_after = rcgen::date_time_ymd(year + years, month, day.min(28));
}

impl Pki {
    /// Load `DATA_DIR/pki`, creating the CA on first start.
    ///
    /// # Errors
    /// The directory cannot be written, or the stored CA cannot be parsed.
    pub fn load_or_create(data_dir: &Path) -> Result<Pki> {
        Pki::named(data_dir, "ca", "skiff-ca")
    }

    /// The front-proxy CA (`DATA_DIR/pki/front-proxy-ca.*`, created on
    /// first start): it signs only the certificate the API server shows
    /// aggregated API servers, which trust the `X-Remote-*` headers of
    /// requests that present it. A CA of its own, so that no client
    /// certificate of the cluster CA can claim an identity in headers.
    ///
    /// # Errors
    /// As [`Pki::load_or_create`].
    pub fn front_proxy(data_dir: &Path) -> Result<Pki> {
        Pki::named(data_dir, "front-proxy-ca", "skiff-front-proxy-ca")
    }

    /// The etcd CA of managed etcd (`DATA_DIR/pki/etcd-ca.*`, created by
    /// the first server, copied to those that join): it signs the
    /// members' certificates, which are also the servers' etcd client
    /// certificates. A CA of its own, so that no cluster client
    /// certificate reaches etcd.
    ///
    /// # Errors
    /// As [`Pki::load_or_create`].
    pub fn etcd(data_dir: &Path) -> Result<Pki> {
        Pki::named(data_dir, "etcd-ca", "skiff-etcd-ca")
    }

    fn named(data_dir: &Path, stem: &str, common_name: &str) -> Result<Pki> {
        let dir = data_dir.join("pki");
        std::fs::create_dir_all(&dir).map_err(|source| Error::Io {
            what: "creating",
            path: dir.display().to_string(),
            source,
        })?;
        let (crt, key) = (
            dir.join(format!("{stem}.crt")),
            dir.join(format!("{stem}.key")),
        );
        if crt.exists() && key.exists() {
            let pki = Pki {
                ca_pem: read_file(&crt)?,
                ca_key_pem: read_file(&key)?,
                dir,
            };
            pki.issuer()?;
            return Ok(pki);
        }
        let kp = KeyPair::generate().map_err(cert_err("generating the CA key"))?;
        let mut params =
            CertificateParams::new(Vec::<String>::new()).map_err(cert_err("CA parameters"))?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, common_name);
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        validity(&mut params, 10);
        let cert = params
            .self_signed(&kp)
            .map_err(cert_err("self-signing the CA"))?;
        write_file(&key, &kp.serialize_pem(), true)?;
        write_file(&crt, &cert.pem(), false)?;
        tracing::info!(dir = %dir.display(), ca = stem, "created CA");
        Ok(Pki {
            dir,
            ca_pem: cert.pem(),
            ca_key_pem: kp.serialize_pem(),
        })
    }

    fn issuer(&self) -> Result<Issuer<'static, KeyPair>> {
        let kp = KeyPair::from_pem(&self.ca_key_pem).map_err(cert_err("parsing ca.key"))?;
        Issuer::from_ca_cert_pem(&self.ca_pem, kp).map_err(cert_err("parsing ca.crt"))
    }

    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The CA's private key (PEM), for the CSR signer.
    pub fn ca_key_pem(&self) -> &str {
        &self.ca_key_pem
    }

    /// DER of the CA certificate.
    pub fn ca_der(&self) -> Vec<u8> {
        use rustls::pki_types::{pem::PemObject, CertificateDer};
        CertificateDer::from_pem_slice(self.ca_pem.as_bytes())
            .map(|c| c.to_vec())
            .unwrap_or_default()
    }

    fn issue(&self, params: CertificateParams, what: &'static str) -> Result<CertKey> {
        let kp = KeyPair::generate().map_err(cert_err(what))?;
        let cert = params
            .signed_by(&kp, &self.issuer()?)
            .map_err(cert_err(what))?;
        Ok(CertKey {
            cert_pem: cert.pem(),
            key_pem: kp.serialize_pem(),
            cert_der: cert.der().to_vec(),
            key_der: kp.serialize_der(),
        })
    }

    /// Issue (and write) the serving certificate for `sans` (names or IPs).
    ///
    /// # Errors
    /// Signing or writing fails.
    pub fn serving_cert(&self, sans: &[String]) -> Result<CertKey> {
        let mut params =
            CertificateParams::new(Vec::<String>::new()).map_err(cert_err("serving parameters"))?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "skiff-apiserver");
        params.distinguished_name = dn;
        params.subject_alt_names = san_types(sans)?;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        validity(&mut params, 1);
        let ck = self.issue(params, "issuing the serving certificate")?;
        write_file(&self.dir.join("server.crt"), &ck.cert_pem, false)?;
        write_file(&self.dir.join("server.key"), &ck.key_pem, true)?;
        Ok(ck)
    }

    /// An etcd member's certificate (CN `name`, server and client use,
    /// for `sans`): it serves clients and peers and is presented to
    /// them.
    ///
    /// # Errors
    /// A SAN is neither an IP nor a DNS name, or signing fails.
    pub fn member_cert(&self, name: &str, sans: &[String]) -> Result<CertKey> {
        let mut params =
            CertificateParams::new(Vec::<String>::new()).map_err(cert_err("member parameters"))?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name);
        params.distinguished_name = dn;
        params.subject_alt_names = san_types(sans)?;
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        validity(&mut params, 1);
        self.issue(params, "issuing an etcd member certificate")
    }

    /// A client certificate for `user` in `groups`.
    ///
    /// # Errors
    /// More than two groups (one certificate subject holds two O
    /// attributes here), or signing fails.
    pub fn client_cert(&self, user: &str, groups: &[String]) -> Result<CertKey> {
        if groups.len() > 2 {
            return Err(Error::TooManyGroups(groups.len()));
        }
        let mut params =
            CertificateParams::new(Vec::<String>::new()).map_err(cert_err("client parameters"))?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, user);
        if let Some(g) = groups.first() {
            dn.push(DnType::OrganizationName, g.as_str());
        }
        if let Some(g) = groups.get(1) {
            // A second O attribute: same OID, distinct map key in rcgen.
            dn.push(DnType::CustomDnType(vec![2, 5, 4, 10]), g.as_str());
        }
        params.distinguished_name = dn;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        validity(&mut params, 1);
        self.issue(params, "issuing a client certificate")
    }

    /// The API server's client certificate towards node servers (upstream's
    /// `apiserver-kubelet-client`: CN kube-apiserver-kubelet-client, O
    /// system:masters, so that every agent lets it through without asking),
    /// re-issued and written at every start.
    ///
    /// # Errors
    /// Signing or writing fails.
    pub fn kubelet_client_cert(&self) -> Result<CertKey> {
        let ck = self.client_cert(
            "kube-apiserver-kubelet-client",
            &["system:masters".to_string()],
        )?;
        write_file(
            &self.dir.join("apiserver-kubelet-client.crt"),
            &ck.cert_pem,
            false,
        )?;
        write_file(
            &self.dir.join("apiserver-kubelet-client.key"),
            &ck.key_pem,
            true,
        )?;
        Ok(ck)
    }

    /// A kubeconfig for `user` (client certificate) against `server`.
    ///
    /// # Errors
    /// Issuing the certificate fails.
    pub fn kubeconfig(&self, server: &str, user: &str, groups: &[String]) -> Result<String> {
        let ck = self.client_cert(user, groups)?;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let cfg = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "skiff", "cluster": {"server": server, "certificate-authority-data": b64(&self.ca_pem)}}],
            "users": [{"name": user, "user": {"client-certificate-data": b64(&ck.cert_pem), "client-key-data": b64(&ck.key_pem)}}],
            "contexts": [{"name": "skiff", "context": {"cluster": "skiff", "user": user}}],
            "current-context": "skiff",
            "preferences": {},
        });
        Ok(serde_saphyr::to_string(&cfg).unwrap_or_default())
    }

    /// Write `DATA_DIR/admin.kubeconfig` (system:masters) for `server`.
    ///
    /// # Errors
    /// Issuing or writing fails.
    pub fn write_admin_kubeconfig(&self, data_dir: &Path, server: &str) -> Result<PathBuf> {
        let path = data_dir.join("admin.kubeconfig");
        let text = self.kubeconfig(server, "admin", &["system:masters".to_string()])?;
        write_file(&path, &text, true)?;
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_persists_and_client_identity_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let a = Pki::load_or_create(dir.path()).unwrap();
        let b = Pki::load_or_create(dir.path()).unwrap();
        assert_eq!(a.ca_pem(), b.ca_pem());
        let ck = b
            .client_cert("system:node:n1", &["system:nodes".into(), "extra".into()])
            .unwrap();
        let id = crate::auth::authn::identity_from_cert(&ck.cert_der).unwrap();
        assert_eq!(id.user, "system:node:n1");
        assert_eq!(id.node_name(), Some("n1"));
        assert!(id.in_group("extra"));
        b.serving_cert(&["127.0.0.1".into(), "localhost".into()])
            .unwrap();
        let kc = b.kubeconfig("https://127.0.0.1:6443", "bob", &[]).unwrap();
        assert!(kc.contains("client-certificate-data"));
        assert!(b
            .client_cert("x", &["a".into(), "b".into(), "c".into()])
            .is_err());
    }
}
