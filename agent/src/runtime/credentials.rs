//! Registry credentials from a pod's image pull secrets, as the kubelet's
//! `credentialprovider` keyring: `kubernetes.io/dockerconfigjson` and
//! `kubernetes.io/dockercfg` secrets decoded into entries keyed by registry
//! host and path, and looked up by the image's repository (host match with
//! `*.` globs per label, path prefix, most specific key first, every match
//! returned in order so that each can be tried).
//!
//! Nothing is cached: the secrets are read for a pull and dropped after it.

use std::collections::{BTreeMap, HashMap};

use base64::Engine as _;
use k8s_openapi::api::core::v1::{Pod, Secret};
use serde::Deserialize;

/// `.dockerconfigjson`'s key and type (upstream `v1.DockerConfigJsonKey`).
const DOCKER_CONFIG_JSON_KEY: &str = ".dockerconfigjson";
const DOCKER_CONFIG_JSON_TYPE: &str = "kubernetes.io/dockerconfigjson";
/// The legacy `.dockercfg` format: the map of entries without `auths`.
const DOCKERCFG_KEY: &str = ".dockercfg";
const DOCKERCFG_TYPE: &str = "kubernetes.io/dockercfg";

/// Docker Hub's key: credentials for `index.docker.io/v1/` serve every
/// image that resolves to the default registry.
const DEFAULT_REGISTRY_HOST: &str = "index.docker.io";

/// Why a secret's credentials could not be read; the pull fails with it,
/// as upstream's MakeDockerKeyring fails the pull on a malformed secret.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The secret's data is not a docker config.
    #[error("{0}")]
    Json(#[from] serde_json::Error),
}

/// One registry login, as sent to the runtime. Read from a docker config
/// entry, where `auth` (base64 `user:password`) wins over `username` /
/// `password`, as in upstream's `DockerConfigEntry`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "RawEntry")]
pub struct Credential {
    pub username: String,
    pub password: String,
}

impl Credential {
    pub fn to_cri(&self) -> cri_proto::v1::AuthConfig {
        cri_proto::v1::AuthConfig {
            username: self.username.clone(),
            password: self.password.clone(),
            ..Default::default()
        }
    }
}

#[derive(Deserialize)]
struct RawEntry {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    auth: String,
}

impl TryFrom<RawEntry> for Credential {
    type Error = String;

    fn try_from(raw: RawEntry) -> Result<Credential, String> {
        if raw.auth.is_empty() {
            return Ok(Credential {
                username: raw.username,
                password: raw.password,
            });
        }
        decode_auth(&raw.auth)
    }
}

/// A docker config `auth` field: base64 of `user:password`, padded or not
/// (docker clients write both).
///
/// # Errors
/// Upstream's message when it is not base64 of `user:password`.
pub fn decode_auth(field: &str) -> Result<Credential, String> {
    let field = field.trim();
    let decoded = if field.ends_with('=') {
        base64::engine::general_purpose::STANDARD.decode(field)
    } else {
        base64::engine::general_purpose::STANDARD_NO_PAD.decode(field)
    };
    let decoded = decoded.map_err(|e| e.to_string())?;
    let decoded = String::from_utf8_lossy(&decoded);
    match decoded.split_once(':') {
        Some((user, pass)) => Ok(Credential {
            username: user.to_string(),
            password: pass.to_string(),
        }),
        None => Err(
            "unable to parse auth field, must be formatted as base64(username:password)"
                .to_string(),
        ),
    }
}

type DockerConfig = BTreeMap<String, Credential>;

#[derive(Deserialize)]
struct DockerConfigJson {
    #[serde(default)]
    auths: DockerConfig,
}

/// The credentials of a set of pull secrets, indexed by registry key.
#[derive(Debug, Default)]
pub struct Keyring {
    /// Unique keys, reverse-sorted so that `quay.io/coreos` is tried
    /// before `quay.io`.
    index: Vec<String>,
    creds: HashMap<String, Vec<Credential>>,
}

impl Keyring {
    /// The keyring of `secrets`, in their order; secrets of other types,
    /// or without their type's key, add nothing (upstream does the same).
    ///
    /// # Errors
    /// A docker config secret whose data does not decode.
    pub fn from_secrets(secrets: &[Secret]) -> Result<Keyring, Error> {
        let mut ring = Keyring::default();
        for s in secrets {
            let data = |key: &str| {
                s.data
                    .as_ref()
                    .and_then(|d| d.get(key))
                    .map(|b| b.0.as_slice())
                    .filter(|b| !b.is_empty())
            };
            match s.type_.as_deref() {
                Some(DOCKER_CONFIG_JSON_TYPE) => {
                    if let Some(b) = data(DOCKER_CONFIG_JSON_KEY) {
                        ring.add(serde_json::from_slice::<DockerConfigJson>(b)?.auths);
                    }
                }
                Some(DOCKERCFG_TYPE) => {
                    if let Some(b) = data(DOCKERCFG_KEY) {
                        ring.add(serde_json::from_slice::<DockerConfig>(b)?);
                    }
                }
                _ => {}
            }
        }
        Ok(ring)
    }

    fn add(&mut self, cfg: DockerConfig) {
        for (loc, entry) in cfg {
            let (host, path) = split_url(&loc);
            // Docker treats `host/v1/` and `host/v2/` as the bare host.
            let path = path
                .strip_prefix("/v1/")
                .or_else(|| path.strip_prefix("/v2/"))
                .map_or(path, |rest| &path[path.len() - rest.len() - 1..]);
            let key = if path.is_empty() || path == "/" {
                host.to_string()
            } else {
                format!("{host}{path}")
            };
            self.creds.entry(key.clone()).or_default().push(entry);
            if !self.index.contains(&key) {
                self.index.push(key);
            }
        }
        self.index.sort_unstable_by(|a, b| b.cmp(a));
    }

    /// Every credential for `repo` (a normalized repository, see
    /// [`repo_to_pull`]), the most specific key first; Docker Hub's
    /// `index.docker.io` entry serves default-registry images that nothing
    /// else matched.
    pub fn lookup(&self, repo: &str) -> Vec<Credential> {
        let mut out = Vec::new();
        for key in &self.index {
            if url_matches(key, repo) {
                out.extend(self.creds[key].iter().cloned());
            }
        }
        if out.is_empty() && is_default_registry(repo) {
            if let Some(c) = self.creds.get(DEFAULT_REGISTRY_HOST) {
                out.extend(c.iter().cloned());
            }
        }
        out
    }
}

/// `[scheme://]host[:port][/path]` -> (`host[:port]`, `/path`).
fn split_url(s: &str) -> (&str, &str) {
    let s = s
        .strip_prefix("https://")
        .or_else(|| s.strip_prefix("http://"))
        .unwrap_or(s);
    match s.find('/') {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, ""),
    }
}

/// Upstream's URLsMatch: same port, same number of host labels each
/// matching its glob, and the key's path a prefix of the image's.
fn url_matches(key: &str, repo: &str) -> bool {
    let (ghost, gpath) = split_url(key);
    let (thost, tpath) = split_url(repo);
    let split = |h: &str| -> (String, String) {
        match h.rsplit_once(':') {
            Some((host, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
                (host.to_string(), port.to_string())
            }
            _ => (h.to_string(), String::new()),
        }
    };
    let ((gh, gp), (th, tp)) = (split(ghost), split(thost));
    if gp != tp || !tpath.starts_with(gpath) {
        return false;
    }
    let (gl, tl): (Vec<&str>, Vec<&str>) = (gh.split('.').collect(), th.split('.').collect());
    gl.len() == tl.len() && gl.iter().zip(&tl).all(|(g, t)| glob(g, t))
}

/// Shell-style `*` and `?` within one host label (Go's filepath.Match
/// without character classes).
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Whether `repo` pulls from Docker Hub: a first component without `.`
/// or `:` (and not `localhost`) is a Hub namespace, not a host.
fn is_default_registry(repo: &str) -> bool {
    match repo.split_once('/') {
        None => !repo.is_empty(),
        Some(("", _)) => false,
        Some((first, _)) => {
            first == "docker.io"
                || first == "index.docker.io"
                || !(first.contains('.') || first.contains(':'))
        }
    }
}

/// The repository an image pulls from, without tag or digest and with
/// Docker Hub's implicit host and `library/` filled in, as the kubelet's
/// `parsers.ParseImageName` gives it to the keyring.
pub fn repo_to_pull(image: &str) -> String {
    let name = image.split('@').next().unwrap_or(image);
    let name = match name.rfind(':') {
        Some(i) if !name[i..].contains('/') => &name[..i],
        _ => name,
    };
    match name.split_once('/') {
        None => format!("docker.io/library/{name}"),
        Some((first, _)) if first == "localhost" || first.contains('.') || first.contains(':') => {
            name.to_string()
        }
        Some(_) => format!("docker.io/{name}"),
    }
}

/// The pod's image pull secrets read from the API, and the names that
/// could not be read (missing, or refused): the pull goes on without them.
pub async fn pull_secrets(client: &kube::Client, pod: &Pod) -> (Vec<Secret>, Vec<String>) {
    let refs = pod
        .spec
        .as_ref()
        .and_then(|s| s.image_pull_secrets.as_deref())
        .unwrap_or_default();
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let api = kube::Api::<Secret>::namespaced(client.clone(), namespace);
    let (mut found, mut failed) = (Vec::new(), Vec::new());
    for name in refs
        .iter()
        .map(|r| r.name.as_str())
        .filter(|n| !n.is_empty())
    {
        match api.get_opt(name).await {
            Ok(Some(s)) => found.push(s),
            Ok(None) => failed.push(name.to_string()),
            Err(e) => {
                tracing::info!(secret = %format!("{namespace}/{name}"), "unable to retrieve pull secret, the image pull may not succeed: {e}");
                failed.push(name.to_string());
            }
        }
    }
    (found, failed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn secret(type_: &str, key: &str, data: &str) -> Secret {
        Secret {
            type_: Some(type_.into()),
            data: Some(BTreeMap::from([(key.into(), ByteString(data.into()))])),
            ..Default::default()
        }
    }

    fn json_secret(auths: serde_json::Value) -> Secret {
        secret(
            DOCKER_CONFIG_JSON_TYPE,
            DOCKER_CONFIG_JSON_KEY,
            &serde_json::json!({ "auths": auths }).to_string(),
        )
    }

    fn cred(u: &str, p: &str) -> Credential {
        Credential {
            username: u.into(),
            password: p.into(),
        }
    }

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    #[test]
    fn auth_field_wins_over_username_and_password() {
        let s = json_secret(serde_json::json!({
            "reg.example:5000": {"auth": b64("alice:pa:ss"), "username": "bob", "password": "x"},
            "other.example": {"username": "carol", "password": "y"},
        }));
        let ring = Keyring::from_secrets(&[s]).unwrap();
        assert_eq!(
            ring.lookup("reg.example:5000/team/app"),
            vec![cred("alice", "pa:ss")]
        );
        assert_eq!(ring.lookup("other.example/app"), vec![cred("carol", "y")]);
        assert_eq!(ring.lookup("reg.example/app"), vec![]);
    }

    #[test]
    fn unpadded_auth_decodes_and_bad_auth_fails_the_secret() {
        let unpadded = b64("u:p1").trim_end_matches('=').to_string();
        let s = json_secret(serde_json::json!({"r.example": {"auth": unpadded}}));
        let ring = Keyring::from_secrets(&[s]).unwrap();
        assert_eq!(ring.lookup("r.example/x"), vec![cred("u", "p1")]);

        let s = json_secret(serde_json::json!({"r.example": {"auth": b64("nocolon")}}));
        let err = Keyring::from_secrets(&[s]).unwrap_err().to_string();
        assert!(err.contains("base64(username:password)"), "{err}");
        let s = secret(DOCKER_CONFIG_JSON_TYPE, DOCKER_CONFIG_JSON_KEY, "{not json");
        assert!(Keyring::from_secrets(&[s]).is_err());
    }

    #[test]
    fn dockercfg_and_type_mismatch() {
        let cfg = serde_json::json!({"https://r.example/v1/": {"username": "u", "password": "p"}});
        let legacy = secret(DOCKERCFG_TYPE, DOCKERCFG_KEY, &cfg.to_string());
        let ring = Keyring::from_secrets(&[legacy]).unwrap();
        assert_eq!(ring.lookup("r.example/ns/img"), vec![cred("u", "p")]);

        // The key of one type under the other type counts for nothing.
        let wrong = secret("Opaque", DOCKERCFG_KEY, &cfg.to_string());
        let wrong2 = secret(DOCKER_CONFIG_JSON_TYPE, DOCKERCFG_KEY, &cfg.to_string());
        let ring = Keyring::from_secrets(&[wrong, wrong2]).unwrap();
        assert_eq!(ring.lookup("r.example/ns/img"), vec![]);
    }

    #[test]
    fn most_specific_first_and_all_matches_in_order() {
        let a = json_secret(serde_json::json!({
            "quay.io": {"username": "host", "password": "1"},
            "quay.io/coreos": {"username": "ns", "password": "2"},
            "*.quay.io": {"username": "glob", "password": "3"},
        }));
        let b = json_secret(serde_json::json!({
            "quay.io": {"username": "host2", "password": "4"},
        }));
        let ring = Keyring::from_secrets(&[a, b]).unwrap();
        assert_eq!(
            ring.lookup("quay.io/coreos/etcd"),
            vec![cred("ns", "2"), cred("host", "1"), cred("host2", "4")]
        );
        assert_eq!(
            ring.lookup("quay.io/other/x"),
            vec![cred("host", "1"), cred("host2", "4")]
        );
        // `*` is one label: it neither matches two labels nor none.
        assert_eq!(ring.lookup("eu.quay.io/x"), vec![cred("glob", "3")]);
        assert_eq!(ring.lookup("a.eu.quay.io/x"), vec![]);
        // A path is a prefix of the image's path, never of the host.
        assert_eq!(ring.lookup("quay.iox/coreos/etcd"), vec![]);
    }

    #[test]
    fn ports_must_agree() {
        let s = json_secret(serde_json::json!({
            "127.0.0.1:5000": {"username": "u", "password": "p"},
        }));
        let ring = Keyring::from_secrets(&[s]).unwrap();
        assert_eq!(ring.lookup("127.0.0.1:5000/a"), vec![cred("u", "p")]);
        assert_eq!(ring.lookup("127.0.0.1:5001/a"), vec![]);
        assert_eq!(ring.lookup("127.0.0.1/a"), vec![]);
    }

    #[test]
    fn docker_hub_key_serves_default_registry_images() {
        let s = json_secret(serde_json::json!({
            "https://index.docker.io/v1/": {"username": "hub", "password": "p"},
        }));
        let ring = Keyring::from_secrets(&[s]).unwrap();
        assert_eq!(
            ring.lookup(&repo_to_pull("busybox:1.36")),
            vec![cred("hub", "p")]
        );
        assert_eq!(ring.lookup(&repo_to_pull("me/app")), vec![cred("hub", "p")]);
        assert_eq!(ring.lookup(&repo_to_pull("ghcr.io/me/app")), vec![]);
    }

    #[test]
    fn repo_to_pull_normalizes() {
        assert_eq!(repo_to_pull("busybox"), "docker.io/library/busybox");
        assert_eq!(repo_to_pull("me/app:v1"), "docker.io/me/app");
        assert_eq!(
            repo_to_pull("reg.example:5000/a/b:t@sha256:00"),
            "reg.example:5000/a/b"
        );
        assert_eq!(repo_to_pull("localhost/x"), "localhost/x");
        assert_eq!(repo_to_pull("127.0.0.1:5000/x"), "127.0.0.1:5000/x");
    }

    #[test]
    fn glob_per_label() {
        assert!(glob("*", "abc"));
        assert!(glob("a*c", "abbbc"));
        assert!(glob("a?c", "abc"));
        assert!(!glob("a?c", "ac"));
        assert!(!glob("abc", "abd"));
    }
}
