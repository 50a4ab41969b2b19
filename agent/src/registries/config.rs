//! The registries file in k3s's `registries.yaml` format: `mirrors` (per
//! registry host, or `*` for every host: the endpoints tried before the
//! registry itself) and `configs` (per registry or endpoint host: the
//! login and the TLS settings). Read strictly: an unknown field, an
//! endpoint that is not an http(s) URL, a TLS file that is not there or a
//! setting containerd cannot carry out (`rewrite`) refuses the whole file,
//! naming the field, rather than being dropped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::runtime::credentials::{decode_auth, Credential};

/// Why a registries file was refused.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Parse {
        path: PathBuf,
        source: Box<serde_saphyr::Error>,
    },
    #[error("{path}: {field}: {message}")]
    Invalid {
        path: PathBuf,
        field: String,
        message: String,
    },
}

/// The mirror key that stands for every registry (containerd's `_default`).
pub const ANY_REGISTRY: &str = "*";

/// A validated registries file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Registries {
    /// Registry host (or [`ANY_REGISTRY`]) -> endpoints, in the file's order.
    pub mirrors: BTreeMap<String, Vec<Endpoint>>,
    /// Registry or endpoint host (`host[:port]`) -> its settings.
    pub configs: BTreeMap<String, HostConfig>,
}

/// A mirror endpoint: `scheme://host[:port]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub url: String,
    /// `host[:port]`, the key of its entry in `configs`.
    pub host: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostConfig {
    pub auth: Option<Login>,
    pub tls: Option<Tls>,
}

/// A registry login: user and password, or an identity token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Login {
    Password(Credential),
    IdentityToken(String),
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tls {
    pub ca_file: Option<PathBuf>,
    /// Client certificate and key.
    pub client: Option<(PathBuf, PathBuf)>,
    pub insecure_skip_verify: bool,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    mirrors: BTreeMap<String, RawMirror>,
    #[serde(default)]
    configs: BTreeMap<String, RawConfig>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMirror {
    #[serde(default)]
    endpoint: Vec<String>,
    #[serde(default)]
    rewrite: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    auth: Option<RawAuth>,
    tls: Option<RawTls>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAuth {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    auth: String,
    #[serde(default)]
    identitytoken: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    #[serde(default)]
    insecure_skip_verify: bool,
}

/// Read and check `path`; a file that is not there is an empty
/// configuration (no mirrors, no logins).
///
/// # Errors
/// The file cannot be read, is not the format, or a field is invalid.
pub fn load(path: &Path) -> Result<Registries, Error> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Registries::default()),
        Err(source) => {
            return Err(Error::Read {
                path: path.into(),
                source,
            })
        }
    };
    parse(path, &text)
}

/// Check the text of the file at `path` (named in errors).
///
/// # Errors
/// As [`load`].
pub fn parse(path: &Path, text: &str) -> Result<Registries, Error> {
    let raw: RawFile = if text.trim().is_empty() {
        RawFile::default()
    } else {
        serde_saphyr::from_str(text).map_err(|e| Error::Parse {
            path: path.into(),
            source: Box::new(e),
        })?
    };
    let invalid = |field: String, message: String| Error::Invalid {
        path: path.into(),
        field,
        message,
    };
    let mut out = Registries::default();
    for (host, mirror) in raw.mirrors {
        let field = format!("mirrors.{host:?}");
        if host != ANY_REGISTRY {
            check_host(&host).map_err(|m| invalid(field.clone(), m))?;
        }
        if !mirror.rewrite.is_empty() {
            return Err(invalid(
                format!("{field}.rewrite"),
                "rewrite rules are not supported: containerd's registry host configuration cannot rename repositories; use the mirror's repository names in the image references instead".into(),
            ));
        }
        let endpoints = mirror
            .endpoint
            .iter()
            .enumerate()
            .map(|(i, e)| endpoint(e).map_err(|m| invalid(format!("{field}.endpoint[{i}]"), m)))
            .collect::<Result<Vec<_>, _>>()?;
        out.mirrors.insert(host, endpoints);
    }
    for (host, config) in raw.configs {
        let field = format!("configs.{host:?}");
        check_host(&host).map_err(|m| invalid(field.clone(), m))?;
        let auth = config
            .auth
            .map(login)
            .transpose()
            .map_err(|m| invalid(format!("{field}.auth"), m))?;
        let tls = config
            .tls
            .map(|t| tls(t, &format!("{field}.tls")))
            .transpose()
            .map_err(|(f, m)| invalid(f, m))?;
        out.configs.insert(host, HostConfig { auth, tls });
    }
    Ok(out)
}

/// A registry host as image references name it: `host[:port]`, no scheme
/// and no path.
fn check_host(host: &str) -> Result<(), String> {
    let authority: Result<http::uri::Authority, _> = host.parse();
    match authority {
        Ok(a) if a.as_str() == host && !host.contains('@') => Ok(()),
        _ => Err(format!(
            "{host:?} is not a registry host (host or host:port, without a scheme or path)"
        )),
    }
}

/// An endpoint URL; without a scheme it is https, as in k3s.
fn endpoint(text: &str) -> Result<Endpoint, String> {
    let with_scheme = if text.contains("://") {
        text.to_string()
    } else {
        format!("https://{text}")
    };
    let uri: http::Uri = with_scheme
        .parse()
        .map_err(|e| format!("{text:?} is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err(format!("{text:?}: the scheme must be http or https")),
    }
    let host = uri
        .authority()
        .map(|a| a.as_str().to_string())
        .filter(|a| !a.is_empty() && !a.contains('@'))
        .ok_or_else(|| format!("{text:?} has no host"))?;
    // containerd appends /v2 to a host without a path; any other path
    // would need its override_path, which k3s does not set either.
    if !matches!(uri.path(), "" | "/" | "/v2" | "/v2/") || uri.query().is_some() {
        return Err(format!("{text:?}: a path other than /v2 is not supported"));
    }
    let scheme = uri.scheme_str().unwrap_or("https");
    Ok(Endpoint {
        url: format!("{scheme}://{host}"),
        host,
    })
}

fn login(raw: RawAuth) -> Result<Login, String> {
    if !raw.identitytoken.is_empty() {
        return Ok(Login::IdentityToken(raw.identitytoken));
    }
    if !raw.auth.is_empty() {
        return decode_auth(&raw.auth).map(Login::Password);
    }
    if raw.username.is_empty() {
        return Err("username and password, auth or identitytoken is required".into());
    }
    Ok(Login::Password(Credential {
        username: raw.username,
        password: raw.password,
    }))
}

/// The TLS settings; the files must exist (containerd would only say so
/// at the first pull, per pod).
fn tls(raw: RawTls, field: &str) -> Result<Tls, (String, String)> {
    let exists = |name: &str, p: &Path| -> Result<(), (String, String)> {
        match std::fs::metadata(p) {
            Ok(m) if m.is_file() => Ok(()),
            Ok(_) => Err((
                format!("{field}.{name}"),
                format!("{}: not a file", p.display()),
            )),
            Err(e) => Err((format!("{field}.{name}"), format!("{}: {e}", p.display()))),
        }
    };
    if let Some(ca) = &raw.ca_file {
        exists("ca_file", ca)?;
    }
    let client = match (raw.cert_file, raw.key_file) {
        (Some(cert), Some(key)) => {
            exists("cert_file", &cert)?;
            exists("key_file", &key)?;
            Some((cert, key))
        }
        (None, None) => None,
        (Some(_), None) => {
            return Err((
                format!("{field}.key_file"),
                "required with cert_file".into(),
            ))
        }
        (None, Some(_)) => {
            return Err((
                format!("{field}.cert_file"),
                "required with key_file".into(),
            ))
        }
    };
    Ok(Tls {
        ca_file: raw.ca_file,
        client,
        insecure_skip_verify: raw.insecure_skip_verify,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Result<Registries, String> {
        parse(Path::new("/etc/skiff/registries.yaml"), text).map_err(|e| e.to_string())
    }

    #[test]
    fn mirrors_and_configs() {
        let ca = tempfile::NamedTempFile::new().unwrap();
        let text = format!(
            "mirrors:\n  docker.io:\n    endpoint: [\"https://m.example:5000\", \"http://10.0.0.1:5000/v2\", \"plain.example\"]\n  \"*\":\n    endpoint: [\"https://any.example\"]\nconfigs:\n  m.example:5000:\n    auth: {{username: u, password: p}}\n    tls: {{ca_file: {}, insecure_skip_verify: true}}\n  other.example:\n    auth: {{auth: dTpw}}\n",
            ca.path().display()
        );
        let r = parsed(&text).unwrap();
        let urls: Vec<&str> = r.mirrors["docker.io"]
            .iter()
            .map(|e| e.url.as_str())
            .collect();
        assert_eq!(
            urls,
            [
                "https://m.example:5000",
                "http://10.0.0.1:5000",
                "https://plain.example"
            ]
        );
        assert_eq!(r.mirrors["docker.io"][0].host, "m.example:5000");
        assert_eq!(r.mirrors["*"].len(), 1);
        let m = &r.configs["m.example:5000"];
        assert_eq!(
            m.auth,
            Some(Login::Password(Credential {
                username: "u".into(),
                password: "p".into()
            }))
        );
        assert!(m.tls.as_ref().unwrap().insecure_skip_verify);
        assert_eq!(
            r.configs["other.example"].auth,
            Some(Login::Password(Credential {
                username: "u".into(),
                password: "p".into()
            }))
        );
    }

    #[test]
    fn empty_or_missing_file_is_no_configuration() {
        assert_eq!(parsed("").unwrap(), Registries::default());
        assert_eq!(
            load(Path::new("/nonexistent/registries.yaml")).unwrap(),
            Registries::default()
        );
    }

    #[test]
    fn refusals_name_the_field() {
        let cases = [
            (
                "mirrors:\n  docker.io:\n    endpoint: [\"https://m\"]\n    rewrite: {\"^a/(.*)\": \"b/$1\"}\n",
                "mirrors.\"docker.io\".rewrite: rewrite rules are not supported",
            ),
            (
                "mirrors:\n  docker.io:\n    endpoint: [\"ftp://m\"]\n",
                "mirrors.\"docker.io\".endpoint[0]: \"ftp://m\": the scheme must be http or https",
            ),
            (
                "mirrors:\n  docker.io:\n    endpoint: [\"https://m/prefix\"]\n",
                "a path other than /v2 is not supported",
            ),
            (
                "mirrors:\n  https://docker.io:\n    endpoint: []\n",
                "mirrors.\"https://docker.io\": \"https://docker.io\" is not a registry host",
            ),
            (
                "configs:\n  r.example:\n    auth: {password: p}\n",
                "configs.\"r.example\".auth: username and password, auth or identitytoken is required",
            ),
            (
                "configs:\n  r.example:\n    auth: {auth: bm9jb2xvbg==}\n",
                "configs.\"r.example\".auth: unable to parse auth field",
            ),
            (
                "configs:\n  r.example:\n    tls: {ca_file: /nonexistent/ca.crt}\n",
                "configs.\"r.example\".tls.ca_file: /nonexistent/ca.crt: No such file",
            ),
            (
                "configs:\n  r.example:\n    tls: {cert_file: /etc/hostname}\n",
                "configs.\"r.example\".tls.key_file: required with cert_file",
            ),
            ("mirror:\n  docker.io: {}\n", "unknown field `mirror`"),
            (
                "configs:\n  r.example:\n    auth: {user: u}\n",
                "unknown field `user`",
            ),
        ];
        for (text, want) in cases {
            let err = parsed(text).unwrap_err();
            assert!(err.contains(want), "{text}: {err}");
            assert!(err.starts_with("/etc/skiff/registries.yaml: "), "{err}");
        }
    }

    #[test]
    fn identity_token_wins() {
        let r = parsed("configs:\n  r.example:\n    auth: {username: u, identitytoken: tok}\n")
            .unwrap();
        assert_eq!(
            r.configs["r.example"].auth,
            Some(Login::IdentityToken("tok".into()))
        );
    }
}
