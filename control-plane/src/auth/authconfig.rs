//! Which OIDC issuers the server trusts for people: the `--oidc-*` flags or
//! kube-apiserver's structured `AuthenticationConfiguration` file
//! (`--authentication-config`, `apiserver.config.k8s.io/v1beta1` and `v1`),
//! checked and resolved into [`JwtIssuer`]s for [`super::oidc`].
//!
//! Everything upstream expresses in CEL (`expression` fields, `extra`
//! mappings, `userValidationRules`) is refused at start with the field's
//! path: a setting we accept is a setting we honour.

use std::path::{Path, PathBuf};

use jsonwebtoken::Algorithm;
use serde::Deserialize;

/// Configuration errors (all at start-up).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file or the CA file cannot be read.
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The file is not an `AuthenticationConfiguration` we can parse.
    #[error("parsing authentication config {path}: {why}")]
    Parse { path: String, why: String },
    /// A field holds a value upstream refuses, or one we do not implement.
    #[error("invalid {field}: {why}")]
    Invalid { field: String, why: String },
}

type Result<T, E = Error> = std::result::Result<T, E>;

fn invalid(field: impl Into<String>, why: impl Into<String>) -> Error {
    Error::Invalid {
        field: field.into(),
        why: why.into(),
    }
}

/// The flags (and `--config` keys) of the same names, unchecked.
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub issuer_url: Option<String>,
    pub client_id: Option<String>,
    pub username_claim: Option<String>,
    pub username_prefix: Option<String>,
    pub groups_claim: Option<String>,
    pub groups_prefix: Option<String>,
    pub ca_file: Option<PathBuf>,
    /// `key=value` each.
    pub required_claims: Vec<String>,
    pub signing_algs: Vec<String>,
    /// `--authentication-config`.
    pub authentication_config: Option<PathBuf>,
}

/// How a claim becomes the username or the groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixedClaim {
    pub claim: String,
    /// Put before every value ("" for none).
    pub prefix: String,
}

/// One trusted issuer, checked.
#[derive(Debug, Clone)]
pub struct JwtIssuer {
    /// The `iss` its tokens carry (https).
    pub url: String,
    /// Where its discovery document is, when not under `url`.
    pub discovery_url: Option<String>,
    /// PEM bundle trusted for its endpoints; None: the system's roots.
    pub ca_pem: Option<Vec<u8>>,
    /// A token must name one of these in `aud`.
    pub audiences: Vec<String>,
    /// Signature algorithms accepted (asymmetric only).
    pub algorithms: Vec<Algorithm>,
    pub username: PrefixedClaim,
    pub groups: Option<PrefixedClaim>,
    pub uid_claim: Option<String>,
    /// Claims that must be present, strings, equal to the value.
    pub required_claims: Vec<(String, String)>,
}

/// Every asymmetric algorithm we verify. Upstream also lists ES512, which
/// our JWT library does not implement: asking for it is refused.
pub const ASYMMETRIC: [Algorithm; 8] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
];

/// Upstream's limit on `jwt` entries.
const MAX_JWT: usize = 64;

impl Options {
    /// Whether any OIDC flag is set.
    fn any_flag(&self) -> Option<&'static str> {
        [
            ("oidc-issuer-url", self.issuer_url.is_some()),
            ("oidc-client-id", self.client_id.is_some()),
            ("oidc-username-claim", self.username_claim.is_some()),
            ("oidc-username-prefix", self.username_prefix.is_some()),
            ("oidc-groups-claim", self.groups_claim.is_some()),
            ("oidc-groups-prefix", self.groups_prefix.is_some()),
            ("oidc-ca-file", self.ca_file.is_some()),
            ("oidc-required-claim", !self.required_claims.is_empty()),
            ("oidc-signing-algs", !self.signing_algs.is_empty()),
        ]
        .into_iter()
        .find_map(|(f, set)| set.then_some(f))
    }

    /// The issuers these options trust (none when nothing is set).
    /// `disallowed` are the ServiceAccount issuers, which an OIDC issuer
    /// may not claim (upstream refuses the overlap too).
    ///
    /// # Errors
    /// Flags and file together, an unreadable file, or a refused field
    /// (the message names it).
    pub fn load(&self, disallowed: &[String]) -> Result<Vec<JwtIssuer>> {
        let issuers = match (&self.authentication_config, self.any_flag()) {
            (Some(_), Some(flag)) => {
                return Err(invalid(
                    "authentication-config",
                    format!("--authentication-config and --{flag} are mutually exclusive"),
                ))
            }
            (Some(path), None) => from_file(path)?,
            (None, Some(_)) => vec![self.flag_issuer()?],
            (None, None) => Vec::new(),
        };
        for (i, iss) in issuers.iter().enumerate() {
            if disallowed.iter().any(|d| d == &iss.url) {
                let field = match &self.authentication_config {
                    Some(_) => format!("jwt[{i}].issuer.url"),
                    None => "oidc-issuer-url".into(),
                };
                return Err(invalid(
                    field,
                    format!(
                        "{:?} is a service account issuer: an OIDC issuer may not overlap with it",
                        iss.url
                    ),
                ));
            }
        }
        Ok(issuers)
    }

    /// kube-apiserver's flag semantics.
    fn flag_issuer(&self) -> Result<JwtIssuer> {
        let (Some(url), Some(client_id)) = (&self.issuer_url, &self.client_id) else {
            return Err(match (&self.issuer_url, &self.client_id) {
                (Some(_), None) | (None, Some(_)) => invalid(
                    "oidc-issuer-url",
                    "--oidc-issuer-url and --oidc-client-id must be given together",
                ),
                _ => invalid(
                    self.any_flag().unwrap_or("oidc-issuer-url"),
                    "needs --oidc-issuer-url and --oidc-client-id",
                ),
            });
        };
        check_https_url("oidc-issuer-url", url)?;
        if client_id.is_empty() {
            return Err(invalid("oidc-client-id", "must not be empty"));
        }
        let claim = self.username_claim.clone().unwrap_or_else(|| "sub".into());
        if claim.is_empty() {
            return Err(invalid("oidc-username-claim", "must not be empty"));
        }
        // Upstream: no prefix given means "ISSUER#" unless the claim is the
        // email (already unique); "-" means none.
        let prefix = match self.username_prefix.as_deref() {
            Some("-") => String::new(),
            Some(p) if !p.is_empty() => p.to_string(),
            _ if claim == "email" => String::new(),
            _ => format!("{url}#"),
        };
        let groups = match (&self.groups_claim, &self.groups_prefix) {
            (Some(c), p) if !c.is_empty() => Some(PrefixedClaim {
                claim: c.clone(),
                prefix: p.clone().unwrap_or_default(),
            }),
            (_, Some(_)) => {
                return Err(invalid(
                    "oidc-groups-prefix",
                    "needs --oidc-groups-claim: it prefixes that claim's values",
                ))
            }
            _ => None,
        };
        let ca_pem = match &self.ca_file {
            Some(path) => {
                let pem = std::fs::read(path).map_err(|source| Error::Read {
                    path: path.display().to_string(),
                    source,
                })?;
                check_ca("oidc-ca-file", &pem)?;
                Some(pem)
            }
            None => None,
        };
        let mut required_claims = Vec::new();
        for kv in &self.required_claims {
            let Some((k, v)) = kv.split_once('=') else {
                return Err(invalid(
                    "oidc-required-claim",
                    format!("{kv:?} is not key=value"),
                ));
            };
            if k.is_empty() {
                return Err(invalid(
                    "oidc-required-claim",
                    format!("{kv:?} has no claim name"),
                ));
            }
            required_claims.retain(|(name, _): &(String, String)| name != k);
            required_claims.push((k.to_string(), v.to_string()));
        }
        let algorithms = if self.signing_algs.is_empty() {
            vec![Algorithm::RS256]
        } else {
            self.signing_algs
                .iter()
                .map(|a| parse_alg(a).map_err(|why| invalid("oidc-signing-algs", why)))
                .collect::<Result<_>>()?
        };
        Ok(JwtIssuer {
            url: url.clone(),
            discovery_url: None,
            ca_pem,
            audiences: vec![client_id.clone()],
            algorithms,
            username: PrefixedClaim { claim, prefix },
            groups,
            uid_claim: None,
            required_claims,
        })
    }
}

/// An algorithm name of `--oidc-signing-algs`.
fn parse_alg(name: &str) -> Result<Algorithm, String> {
    match name {
        "ES512" => Err("ES512 is not supported; use ES256, ES384, RS* or PS*".into()),
        _ => ASYMMETRIC
            .iter()
            .find(|a| format!("{a:?}") == name)
            .copied()
            .ok_or_else(|| {
                format!(
                    "{name:?} is not an asymmetric signing algorithm (one of RS256, RS384, RS512, ES256, ES384, PS256, PS384, PS512)"
                )
            }),
    }
}

/// Upstream's rules for an issuer or discovery URL.
fn check_https_url(field: &str, url: &str) -> Result<()> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| invalid(field, format!("{url:?} is not a URL: {e}")))?;
    if uri.scheme_str() != Some("https") {
        return Err(invalid(field, format!("{url:?}: URL scheme must be https")));
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(invalid(field, format!("{url:?}: URL has no host")));
    }
    if uri.query().is_some() || url.contains('#') {
        return Err(invalid(
            field,
            format!("{url:?}: URL must not have a query or fragment"),
        ));
    }
    if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
        return Err(invalid(field, format!("{url:?}: URL must not have a user")));
    }
    Ok(())
}

/// The bundle holds at least one certificate.
fn check_ca(field: &str, pem: &[u8]) -> Result<()> {
    use rustls::pki_types::{pem::PemObject as _, CertificateDer};
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem)
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| invalid(field, format!("not a PEM certificate bundle: {e:?}")))?;
    if certs.is_empty() {
        return Err(invalid(field, "no certificate in the PEM bundle"));
    }
    Ok(())
}

// --- the file format (kube-apiserver's AuthenticationConfiguration) ---

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileConfig {
    api_version: String,
    kind: String,
    #[serde(default)]
    jwt: Vec<FileJwt>,
    /// Refused: anonymous requests are configured by flags here.
    #[serde(default)]
    anonymous: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileJwt {
    issuer: FileIssuer,
    #[serde(default)]
    claim_validation_rules: Vec<FileClaimValidationRule>,
    claim_mappings: FileClaimMappings,
    #[serde(default)]
    user_validation_rules: Vec<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileIssuer {
    #[serde(default)]
    url: String,
    #[serde(default, rename = "discoveryURL")]
    discovery_url: Option<String>,
    #[serde(default)]
    certificate_authority: Option<String>,
    #[serde(default)]
    audiences: Vec<String>,
    #[serde(default)]
    audience_match_policy: Option<String>,
    #[serde(default)]
    egress_selector_type: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileClaimValidationRule {
    #[serde(default)]
    claim: Option<String>,
    #[serde(default)]
    required_value: Option<String>,
    #[serde(default)]
    expression: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileClaimMappings {
    #[serde(default)]
    username: FilePrefixed,
    #[serde(default)]
    groups: FilePrefixed,
    #[serde(default)]
    uid: FileClaimOrExpression,
    #[serde(default)]
    extra: Vec<serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FilePrefixed {
    #[serde(default)]
    claim: Option<String>,
    #[serde(default)]
    prefix: Option<String>,
    #[serde(default)]
    expression: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileClaimOrExpression {
    #[serde(default)]
    claim: Option<String>,
    #[serde(default)]
    expression: Option<String>,
}

const CEL: &str =
    "CEL expressions are not supported by skiff-server; map claims with claim (and prefix)";

/// Read and check an `AuthenticationConfiguration` file (YAML or JSON).
///
/// # Errors
/// Unreadable, unparsable, or a refused field.
pub fn from_file(path: &Path) -> Result<Vec<JwtIssuer>> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.display().to_string(),
        source,
    })?;
    from_str(&text).map_err(|e| match e {
        Error::Parse { why, .. } => Error::Parse {
            path: path.display().to_string(),
            why,
        },
        other => other,
    })
}

/// [`from_file`] over text.
///
/// # Errors
/// As [`from_file`].
pub fn from_str(text: &str) -> Result<Vec<JwtIssuer>> {
    let cfg: FileConfig = serde_saphyr::from_str(text).map_err(|e| Error::Parse {
        path: String::new(),
        why: e.to_string(),
    })?;
    if cfg.kind != "AuthenticationConfiguration" {
        return Err(invalid(
            "kind",
            format!("{:?}: must be AuthenticationConfiguration", cfg.kind),
        ));
    }
    if !matches!(
        cfg.api_version.as_str(),
        "apiserver.config.k8s.io/v1"
            | "apiserver.config.k8s.io/v1beta1"
            | "apiserver.config.k8s.io/v1alpha1"
    ) {
        return Err(invalid(
            "apiVersion",
            format!(
                "{:?}: must be apiserver.config.k8s.io/v1, v1beta1 or v1alpha1",
                cfg.api_version
            ),
        ));
    }
    if cfg.anonymous.is_some() {
        return Err(invalid(
            "anonymous",
            "not supported by skiff-server: anonymous requests are always allowed, RBAC decides",
        ));
    }
    if cfg.jwt.len() > MAX_JWT {
        return Err(invalid(
            "jwt",
            format!("{} authenticators: at most {MAX_JWT}", cfg.jwt.len()),
        ));
    }
    let mut out: Vec<JwtIssuer> = Vec::new();
    for (i, j) in cfg.jwt.into_iter().enumerate() {
        let iss = jwt_issuer(i, j)?;
        if out.iter().any(|o| o.url == iss.url) {
            return Err(invalid(
                format!("jwt[{i}].issuer.url"),
                format!("{:?}: duplicate issuer URL", iss.url),
            ));
        }
        if iss.discovery_url.is_some() && out.iter().any(|o| o.discovery_url == iss.discovery_url) {
            return Err(invalid(
                format!("jwt[{i}].issuer.discoveryURL"),
                "duplicate discoveryURL",
            ));
        }
        out.push(iss);
    }
    Ok(out)
}

/// One `jwt[i]`, checked as upstream's validation does.
fn jwt_issuer(i: usize, j: FileJwt) -> Result<JwtIssuer> {
    let at = |f: &str| format!("jwt[{i}].{f}");
    let issuer = j.issuer;
    if issuer.url.is_empty() {
        return Err(invalid(at("issuer.url"), "required"));
    }
    check_https_url(&at("issuer.url"), &issuer.url)?;
    if let Some(d) = &issuer.discovery_url {
        check_https_url(&at("issuer.discoveryURL"), d)?;
        if d.trim_end_matches('/') == issuer.url.trim_end_matches('/') {
            return Err(invalid(
                at("issuer.discoveryURL"),
                "must be different from issuer.url",
            ));
        }
    }
    if let Some(e) = &issuer.egress_selector_type {
        return Err(invalid(
            at("issuer.egressSelectorType"),
            format!("{e:?}: egress selection is not supported by skiff-server"),
        ));
    }
    let ca_pem = match &issuer.certificate_authority {
        Some(pem) => {
            check_ca(&at("issuer.certificateAuthority"), pem.as_bytes())?;
            Some(pem.as_bytes().to_vec())
        }
        None => None,
    };
    if issuer.audiences.is_empty() {
        return Err(invalid(at("issuer.audiences"), "required"));
    }
    for (k, a) in issuer.audiences.iter().enumerate() {
        if a.is_empty() {
            return Err(invalid(
                format!("jwt[{i}].issuer.audiences[{k}]"),
                "must not be empty",
            ));
        }
        if issuer.audiences[..k].contains(a) {
            return Err(invalid(
                format!("jwt[{i}].issuer.audiences[{k}]"),
                format!("duplicate value {a:?}"),
            ));
        }
    }
    match issuer.audience_match_policy.as_deref() {
        Some("MatchAny") => {}
        None | Some("") if issuer.audiences.len() == 1 => {}
        None | Some("") => {
            return Err(invalid(
                at("issuer.audienceMatchPolicy"),
                "must be MatchAny for multiple audiences",
            ))
        }
        Some(p) => {
            return Err(invalid(
                at("issuer.audienceMatchPolicy"),
                format!("{p:?}: the only supported value is MatchAny"),
            ))
        }
    }
    let mut required_claims: Vec<(String, String)> = Vec::new();
    for (k, rule) in j.claim_validation_rules.into_iter().enumerate() {
        let at = |f: &str| format!("jwt[{i}].claimValidationRules[{k}].{f}");
        if rule.expression.is_some() || rule.message.is_some() {
            let f = if rule.expression.is_some() {
                "expression"
            } else {
                "message"
            };
            return Err(invalid(at(f), CEL));
        }
        let claim = rule.claim.unwrap_or_default();
        if claim.is_empty() {
            return Err(invalid(at("claim"), "required"));
        }
        if required_claims.iter().any(|(c, _)| *c == claim) {
            return Err(invalid(at("claim"), format!("duplicate claim {claim:?}")));
        }
        required_claims.push((claim, rule.required_value.unwrap_or_default()));
    }
    let m = j.claim_mappings;
    let username = prefixed(&at("claimMappings.username"), m.username)?
        .ok_or_else(|| invalid(at("claimMappings.username"), "claim is required"))?;
    let groups = prefixed(&at("claimMappings.groups"), m.groups)?;
    if m.uid.expression.is_some() {
        return Err(invalid(at("claimMappings.uid.expression"), CEL));
    }
    let uid_claim = m.uid.claim.filter(|c| !c.is_empty());
    if !m.extra.is_empty() {
        return Err(invalid(
            at("claimMappings.extra"),
            format!("extra mappings are CEL expressions: {CEL}"),
        ));
    }
    if !j.user_validation_rules.is_empty() {
        return Err(invalid(
            at("userValidationRules"),
            format!("user validation rules are CEL expressions: {CEL}"),
        ));
    }
    Ok(JwtIssuer {
        url: issuer.url,
        discovery_url: issuer.discovery_url,
        ca_pem,
        audiences: issuer.audiences,
        algorithms: ASYMMETRIC.to_vec(),
        username,
        groups,
        uid_claim,
        required_claims,
    })
}

/// A `PrefixedClaimOrExpression`: the prefix is required with a claim (""
/// to disable it) and refused without one.
fn prefixed(at: &str, p: FilePrefixed) -> Result<Option<PrefixedClaim>> {
    if p.expression.is_some() {
        return Err(invalid(format!("{at}.expression"), CEL));
    }
    match (p.claim.filter(|c| !c.is_empty()), p.prefix) {
        (Some(claim), Some(prefix)) => Ok(Some(PrefixedClaim { claim, prefix })),
        (Some(_), None) => Err(invalid(
            format!("{at}.prefix"),
            "required when claim is set; it can be set to an empty string to disable prefixing",
        )),
        (None, Some(_)) => Err(invalid(
            format!("{at}.prefix"),
            "may only be set when claim is set",
        )),
        (None, None) => Ok(None),
    }
}

#[cfg(test)]
mod tests;
