//! Where a node's credentials live, and how they are read and replaced.
//!
//! `skiff-agent join` writes into the config directory:
//!
//! ```text
//! CONFIG_DIR/kubeconfig                      the API server, its CA (inline), and
//! CONFIG_DIR/pki/kubelet-client-current.pem  the client certificate and key, in one file
//! ```
//!
//! and the agent keeps its serving certificate in
//! `ROOT_DIR/pki/kubelet-server-current.pem`, as the kubelet does. A
//! certificate and its key share one file (the kubeconfig names it as both
//! `client-certificate` and `client-key`) so that replacing it is a single
//! rename: a reader never sees a new certificate with an old key.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use base64::Engine;
use x509_parser::prelude::FromDer;

/// The kubeconfig `join` writes in the config directory.
pub const KUBECONFIG: &str = "kubeconfig";
/// Credentials directory inside the config directory (client) and the
/// root directory (serving).
pub const PKI_DIR: &str = "pki";
/// The kubelet's names for the current certificate-and-key files.
pub const CLIENT_PEM: &str = "kubelet-client-current.pem";
pub const SERVER_PEM: &str = "kubelet-server-current.pem";

/// A certificate (chain) and its private key, PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct Pair {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for Pair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pair({:?}, <key>)", common_name(&self.cert_pem))
    }
}

impl Pair {
    /// Certificate then key, one file.
    pub fn combined(&self) -> String {
        let mut s = self.cert_pem.trim_end().to_string();
        s.push('\n');
        s.push_str(self.key_pem.trim_end());
        s.push('\n');
        s
    }

    /// Split a combined file back (certificates first, the key anywhere).
    pub fn parse_combined(text: &str) -> Option<Pair> {
        let mut certs = String::new();
        let mut key = String::new();
        for block in pem_blocks(text) {
            if block.starts_with("-----BEGIN CERTIFICATE-----") {
                certs.push_str(&block);
            } else if block.contains("PRIVATE KEY-----") {
                key = block;
            }
        }
        (!certs.is_empty() && !key.is_empty()).then_some(Pair {
            cert_pem: certs,
            key_pem: key,
        })
    }

    /// Read a combined file.
    pub fn read(path: &Path) -> Option<Pair> {
        Pair::parse_combined(&std::fs::read_to_string(path).ok()?)
    }

    /// Write it as one private file, replacing the old one atomically.
    ///
    /// # Errors
    /// The directory or file cannot be written.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        write_private(path, self.combined().as_bytes())
    }
}

/// Each `-----BEGIN ...-----` to `-----END ...-----` block, with its newline.
fn pem_blocks(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur: Option<String> = None;
    for line in text.lines() {
        if line.starts_with("-----BEGIN ") {
            cur = Some(String::new());
        }
        if let Some(c) = cur.as_mut() {
            c.push_str(line.trim_end());
            c.push('\n');
        }
        if line.starts_with("-----END ") {
            if let Some(c) = cur.take() {
                out.push(c);
            }
        }
    }
    out
}

/// Write `data` to `path` with mode 0600 through a temporary file and a
/// rename (creating the directory), so the file is never seen half written.
///
/// # Errors
/// I/O failures.
pub fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(data)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

fn first_cert_der(pem: &str) -> Option<Vec<u8>> {
    let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).ok()?;
    (block.label == "CERTIFICATE").then_some(block.contents)
}

/// `(notBefore, notAfter)` of the first certificate in `pem`.
pub fn validity(pem: &str) -> Option<(SystemTime, SystemTime)> {
    let der = first_cert_der(pem)?;
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(&der).ok()?;
    let at = |t: i64| {
        let secs = u64::try_from(t).ok()?;
        Some(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
    };
    Some((
        at(cert.validity().not_before.timestamp())?,
        at(cert.validity().not_after.timestamp())?,
    ))
}

/// The subject common name of the first certificate in `pem`.
pub fn common_name(pem: &str) -> Option<String> {
    let der = first_cert_der(pem)?;
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(&der).ok()?;
    let cn = cert.subject().iter_common_name().next()?.as_str().ok()?;
    Some(cn.to_string())
}

/// Whether the certificate in `cert_pem` is for the key in `key_pem`.
pub fn key_matches(cert_pem: &str, key_pem: &str) -> bool {
    let Some(der) = first_cert_der(cert_pem) else {
        return false;
    };
    let Ok((_, cert)) = x509_parser::certificate::X509Certificate::from_der(&der) else {
        return false;
    };
    let Ok(key) = rcgen::KeyPair::from_pem(key_pem) else {
        return false;
    };
    *cert.public_key().subject_public_key.data == *key.public_key_raw()
}

/// The kubeconfig of a joined node: `server`, its CA inline, and the
/// combined certificate file at `client_pem`.
pub fn kubeconfig_text(server: &str, ca_pem: &str, client_pem: &Path, node: &str) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let user = skiff_bootstrap::names::node_user(node);
    let file = client_pem.display();
    // JSON is YAML: serde_json escapes whatever the paths hold.
    let cfg = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "skiff", "cluster": {"server": server, "certificate-authority-data": b64}}],
        "users": [{"name": user, "user": {"client-certificate": file.to_string(), "client-key": file.to_string()}}],
        "contexts": [{"name": "skiff", "context": {"cluster": "skiff", "user": user}}],
        "current-context": "skiff",
    });
    serde_saphyr::to_string(&cfg).unwrap_or_default()
}

/// The current user's auth info of a kubeconfig file.
fn current_user(path: &Path) -> Option<kube::config::AuthInfo> {
    let kc = kube::config::Kubeconfig::read_from(path).ok()?;
    let ctx_name = kc.current_context.clone()?;
    let ctx = kc
        .contexts
        .iter()
        .find(|c| c.name == ctx_name)?
        .context
        .clone()?;
    let user = ctx.user?;
    kc.auth_infos
        .into_iter()
        .find(|a| a.name == user)?
        .auth_info
}

fn resolve(kubeconfig: &Path, file: &str) -> PathBuf {
    let p = Path::new(file);
    if p.is_relative() {
        kubeconfig.parent().unwrap_or(Path::new("/")).join(p)
    } else {
        p.to_owned()
    }
}

/// The combined certificate-and-key file the kubeconfig's user names as
/// both `client-certificate` and `client-key`: the one rotation may
/// replace. None for inline credentials or separate files.
pub fn rotatable_client_file(kubeconfig: &Path) -> Option<PathBuf> {
    let user = current_user(kubeconfig)?;
    let cert = user.client_certificate?;
    let key = user.client_key?;
    (cert == key).then(|| resolve(kubeconfig, &cert))
}

/// The node a kubeconfig's client certificate is for (`system:node:<name>`).
pub fn node_name_of(kubeconfig: &Path) -> Option<String> {
    let user = current_user(kubeconfig)?;
    let pem = match (&user.client_certificate_data, &user.client_certificate) {
        (Some(data), _) => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(data.trim())
                .ok()?;
            String::from_utf8(bytes).ok()?
        }
        (None, Some(file)) => std::fs::read_to_string(resolve(kubeconfig, file)).ok()?,
        (None, None) => return None,
    };
    common_name(&pem)?
        .strip_prefix(skiff_bootstrap::names::NODE_USER_PREFIX)
        .map(String::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn self_signed(cn: &str) -> Pair {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        let mut dn = rcgen::DistinguishedName::new();
        dn.push(rcgen::DnType::CommonName, cn);
        params.distinguished_name = dn;
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Pair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    #[test]
    fn combined_files_round_trip_and_kubeconfigs_name_them() {
        let dir = tempfile::tempdir().unwrap();
        let pair = self_signed("system:node:n1");
        let pem = dir.path().join("pki").join(CLIENT_PEM);
        pair.write(&pem).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&pem).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(Pair::read(&pem).unwrap(), pair);
        assert!(key_matches(&pair.cert_pem, &pair.key_pem));
        assert!(!key_matches(&pair.cert_pem, &self_signed("x").key_pem));
        let (nb, na) = validity(&pair.cert_pem).unwrap();
        assert!(nb < na);
        let kc = dir.path().join(KUBECONFIG);
        std::fs::write(
            &kc,
            kubeconfig_text("https://127.0.0.1:6443", &pair.cert_pem, &pem, "n1"),
        )
        .unwrap();
        assert_eq!(rotatable_client_file(&kc).as_deref(), Some(pem.as_path()));
        assert_eq!(node_name_of(&kc).as_deref(), Some("n1"));
        let cfg = kube::config::Kubeconfig::read_from(&kc).unwrap();
        assert_eq!(
            cfg.clusters[0].cluster.as_ref().unwrap().server.as_deref(),
            Some("https://127.0.0.1:6443")
        );
    }
}
