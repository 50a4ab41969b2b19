//! A private registry for pull-credential tests: the CNCF distribution
//! server (Debian's `docker-registry`, see scripts/test-deps.sh) over TLS
//! with a certificate of a test CA and htpasswd (bcrypt) basic auth, as a
//! real private registry is. Images are placed in its filesystem storage
//! before it starts (the layout the `filesystem` driver reads), so no push
//! client with the test CA is needed.
//!
//! It listens on one given address only: a cluster's nodes reach the host
//! on its LAN address (see [`cluster`](crate::cluster)), never anything
//! outside the machine. containerd trusts the CA through
//! [`Distribution::containerd_config`].
//!
//! # Guarantees
//! The server is killed and its directory removed on drop; a SIGKILLed
//! test's server is swept with its run directory, which its command line
//! names (see [`cleanup`](crate::cleanup)) when `dir` lies in one.

use std::fs;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use base64::Engine as _;

use crate::images::OciImage;

/// The distribution server's binary in Debian's `docker-registry`.
const BINARY: &str = "/usr/bin/docker-registry";
/// How long the server may take to listen.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// A running private registry; stops when dropped.
pub struct Distribution {
    dir: PathBuf,
    addr: SocketAddr,
    child: Option<Child>,
}

impl Distribution {
    /// Serves `images` (repository, tag, image) at `ip`:`port` from `dir`
    /// (created; removed on drop), accepting only `user` / `password`.
    ///
    /// # Errors
    /// Fails when `docker-registry` is missing, when a file cannot be
    /// written, or when the server does not listen in time (the error
    /// carries its log).
    pub fn start(
        dir: &Path,
        ip: IpAddr,
        port: u16,
        user: &str,
        password: &str,
        images: &[(&str, &str, &OciImage)],
    ) -> Result<Distribution> {
        if !Path::new(BINARY).exists() {
            bail!("{BINARY} is missing: run scripts/test-deps.sh");
        }
        fs::create_dir_all(dir)?;
        let addr = SocketAddr::new(ip, port);
        let mut d = Distribution {
            dir: dir.to_path_buf(),
            addr,
            child: None,
        };
        d.write_certificates(ip)?;
        let htpasswd = bcrypt::hash(password, 4).context("hashing the test password")?;
        fs::write(dir.join("htpasswd"), format!("{user}:{htpasswd}\n"))?;
        for (repository, tag, image) in images {
            write_storage(&dir.join("storage"), repository, tag, image)?;
        }
        let config = dir.join("config.yml");
        fs::write(&config, d.config_yaml())?;
        let log = fs::File::create(dir.join("registry.log"))?;
        let child = Command::new(BINARY)
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("spawning docker-registry")?;
        d.child = Some(child);
        d.wait_listening()?;
        Ok(d)
    }

    /// `ip:port`, the registry host of its image references.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// `host/repository:tag`.
    pub fn reference(&self, repository: &str, tag: &str) -> String {
        format!("{}/{repository}:{tag}", self.host())
    }

    /// The test CA's certificate (PEM).
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("registry.log")).unwrap_or_default()
    }

    /// TOML for a containerd 1.6 config (version 2) that trusts the test
    /// CA for this host; no credentials, so that those of the pull request
    /// are the only ones.
    pub fn containerd_config(&self) -> String {
        format!(
            "[plugins.\"io.containerd.grpc.v1.cri\".registry.configs.\"{}\".tls]\n  ca_file = \"{}\"\n",
            self.host(),
            self.ca_file().display()
        )
    }

    /// A `.dockerconfigjson` value for this registry.
    pub fn docker_config_json(&self, user: &str, password: &str) -> String {
        let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        serde_json::json!({"auths": {self.host(): {"auth": auth}}}).to_string()
    }

    fn write_certificates(&self, ip: IpAddr) -> Result<()> {
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new())?;
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, "skiff test registry CA");
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let ca_key = rcgen::KeyPair::generate()?;
        let ca = rcgen::CertifiedIssuer::self_signed(ca, ca_key)?;
        let mut server = rcgen::CertificateParams::new(Vec::<String>::new())?;
        server
            .distinguished_name
            .push(rcgen::DnType::CommonName, ip.to_string());
        server.subject_alt_names = vec![rcgen::SanType::IpAddress(ip)];
        server.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let key = rcgen::KeyPair::generate()?;
        let cert = server.signed_by(&key, &ca)?;
        fs::write(self.ca_file(), ca.pem())?;
        fs::write(self.dir.join("server.crt"), cert.pem())?;
        fs::write(self.dir.join("server.key"), key.serialize_pem())?;
        Ok(())
    }

    fn config_yaml(&self) -> String {
        let d = self.dir.display();
        let secret: u64 = rand::random();
        format!(
            "version: 0.1
log:
  level: info
storage:
  filesystem:
    rootdirectory: {d}/storage
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: {addr}
  secret: {secret:x}
  tls:
    certificate: {d}/server.crt
    key: {d}/server.key
auth:
  htpasswd:
    realm: skiff-test
    path: {d}/htpasswd
",
            addr = self.addr
        )
    }

    fn wait_listening(&mut self) -> Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if std::net::TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok()
            {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    bail!("docker-registry exited ({status}):\n{}", self.log());
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "docker-registry does not listen on {}:\n{}",
                    self.addr,
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Distribution {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// `image` as the `filesystem` storage driver keeps a pushed image: blobs
/// by digest, and the repository's links to its layers, its manifest
/// revision and its tag.
fn write_storage(root: &Path, repository: &str, tag: &str, image: &OciImage) -> Result<()> {
    let v2 = root.join("docker/registry/v2");
    let repo = v2.join("repositories").join(repository);
    let link = |path: PathBuf, digest: &str| -> Result<()> {
        fs::create_dir_all(&path)?;
        fs::write(path.join("link"), digest)?;
        Ok(())
    };
    for (digest, data) in image.blobs() {
        let hex = digest
            .strip_prefix("sha256:")
            .with_context(|| format!("unexpected digest {digest}"))?;
        let blob = v2.join("blobs/sha256").join(&hex[..2]).join(hex);
        fs::create_dir_all(&blob)?;
        fs::write(blob.join("data"), data)?;
        link(repo.join("_layers/sha256").join(hex), digest)?;
    }
    let manifest = image.manifest_digest();
    let hex = manifest.trim_start_matches("sha256:");
    link(repo.join("_manifests/revisions/sha256").join(hex), manifest)?;
    let tag_dir = repo.join("_manifests/tags").join(tag);
    link(tag_dir.join("current"), manifest)?;
    link(tag_dir.join("index/sha256").join(hex), manifest)?;
    Ok(())
}
