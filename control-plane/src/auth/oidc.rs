//! OIDC authentication of people: bearer JWTs from the issuers of
//! `--oidc-issuer-url` or `--authentication-config`
//! ([`super::authconfig`]), verified against the issuer's published keys
//! and mapped to a user, groups and uid as kube-apiserver's
//! `plugin/pkg/authenticator/token/oidc` does.
//!
//! A token is this authenticator's when its (unverified) `iss` names a
//! configured issuer; other tokens go on to the next authenticator. Once
//! it is ours, any failure refuses it: expired, another audience, a bad
//! signature, an algorithm not accepted (`none` and the HMAC family are
//! never accepted: the keys are public), or claims that do not map.
//!
//! Keys come from the issuer's discovery document and JWKS
//! ([`keys`]): fetched in the background from start, and again when a
//! token names a key id we do not know.

pub mod keys;

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::Validation;
use serde_json::{Map, Value};

use super::authconfig::{self, JwtIssuer};
use super::Identity;

/// Longest bearer value read as a JWT; ID tokens are a few KiB at most,
/// and a longer value is refused before any decoding.
pub const MAX_TOKEN_LEN: usize = 64 * 1024;
/// `nbf` may be this far in the future (go-oidc's allowance for skew).
const NBF_LEEWAY_SECS: i64 = 5 * 60;
/// The extra key naming the token that authenticated (upstream's
/// `authentication.kubernetes.io/credential-id`, `JTI=<jti>`).
pub const CREDENTIAL_ID: &str = "authentication.kubernetes.io/credential-id";

/// Start-up errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The flags or the file are refused.
    #[error(transparent)]
    Config(#[from] authconfig::Error),
    /// The TLS settings towards an issuer cannot be built.
    #[error("OIDC issuer {issuer}: {why}")]
    Tls { issuer: String, why: String },
}

/// The configured issuers.
pub struct Oidc {
    issuers: Vec<Arc<Issuer>>,
}

/// One issuer with its key cache.
struct Issuer {
    cfg: JwtIssuer,
    source: keys::Source,
    cache: Mutex<keys::Cache>,
    /// Held while fetching: one fetch at a time per issuer.
    fetching: tokio::sync::Mutex<()>,
}

impl Oidc {
    /// The issuers `opts` configure (none when no OIDC option is set).
    /// `disallowed` are the ServiceAccount issuers.
    ///
    /// # Errors
    /// A refused option or file field (named in the message), or an
    /// unusable CA bundle.
    pub fn from_options(opts: &authconfig::Options, disallowed: &[String]) -> Result<Oidc, Error> {
        Self::new(opts.load(disallowed)?)
    }

    /// An authenticator for `issuers` (already checked).
    ///
    /// # Errors
    /// An issuer's TLS settings cannot be built.
    pub fn new(issuers: Vec<JwtIssuer>) -> Result<Oidc, Error> {
        let mut out = Vec::new();
        for cfg in issuers {
            let tls = keys::tls_config(cfg.ca_pem.as_deref()).map_err(|why| Error::Tls {
                issuer: cfg.url.clone(),
                why,
            })?;
            let discovery = cfg.discovery_url.clone().unwrap_or_else(|| {
                format!(
                    "{}/.well-known/openid-configuration",
                    cfg.url.trim_end_matches('/')
                )
            });
            out.push(Arc::new(Issuer {
                source: keys::Source {
                    issuer: cfg.url.clone(),
                    discovery,
                    tls,
                },
                cfg,
                cache: Mutex::default(),
                fetching: tokio::sync::Mutex::new(()),
            }));
        }
        Ok(Oidc { issuers: out })
    }

    pub fn is_empty(&self) -> bool {
        self.issuers.is_empty()
    }

    /// Fetch every issuer's keys in the background, retrying (up to every
    /// 30 s) until it answers, so the first token need not wait. The tasks
    /// end once they have keys, or when the authenticator is dropped.
    pub fn start(&self) {
        for iss in &self.issuers {
            let weak = Arc::downgrade(iss);
            tokio::spawn(initial_fetch(weak));
        }
    }

    /// The issuer `token` claims to come from, if it is one of ours.
    fn issuer_of(&self, token: &str) -> Option<&Arc<Issuer>> {
        let iss = unverified_issuer(token)?;
        self.issuers.iter().find(|i| i.cfg.url == iss)
    }

    /// Whether `token` is a JWT whose `iss` is a configured issuer.
    pub fn claims_issuer(&self, token: &str) -> bool {
        self.issuer_of(token).is_some()
    }

    /// The identity of `token`: None when it is not this authenticator's
    /// (not a JWT of a configured issuer), else the identity or why the
    /// token is refused.
    pub async fn authenticate(&self, token: &str) -> Option<Result<Identity, String>> {
        let iss = self.issuer_of(token)?;
        Some(iss.authenticate(token).await)
    }
}

async fn initial_fetch(weak: Weak<Issuer>) {
    let mut backoff = Duration::from_secs(1);
    loop {
        let Some(iss) = weak.upgrade() else { return };
        if !iss.cache.lock().expect("oidc key cache").keys.is_empty() {
            return;
        }
        if iss.fetch().await {
            return;
        }
        drop(iss);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(30));
    }
}

/// The `iss` of a compact JWT, unverified (to pick the authenticator).
pub fn unverified_issuer(token: &str) -> Option<String> {
    if token.len() > MAX_TOKEN_LEN {
        return None;
    }
    let mut parts = token.split('.');
    let (_, payload, _) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let bytes = URL_SAFE_NO_PAD.decode(payload.trim_end_matches('=')).ok()?;
    let claims: Value = serde_json::from_slice(&bytes).ok()?;
    claims.get("iss")?.as_str().map(String::from)
}

impl Issuer {
    /// Fetch the keys now (one fetch at a time); true when it worked.
    async fn fetch(&self) -> bool {
        let _one = self.fetching.lock().await;
        self.fetch_locked().await
    }

    async fn fetch_locked(&self) -> bool {
        let result = tokio::time::timeout(keys::FETCH_TIMEOUT, self.source.fetch())
            .await
            .unwrap_or_else(|_| Err("fetching the keys timed out".into()));
        let mut c = self.cache.lock().expect("oidc key cache");
        c.last_attempt = Some(Instant::now());
        match result {
            Ok(keys) => {
                tracing::info!(issuer = %self.cfg.url, keys = keys.len(), "OIDC issuer keys fetched");
                c.keys = Arc::new(keys.into_iter().map(Arc::new).collect());
                c.last_error = None;
                true
            }
            Err(e) => {
                tracing::warn!(issuer = %self.cfg.url, error = %e, "fetching OIDC issuer keys");
                c.last_error = Some(e);
                false
            }
        }
    }

    /// Fetch again unless a fetch happened within
    /// [`keys::REFRESH_MIN_INTERVAL`]; waits for a fetch under way (at
    /// most [`keys::FETCH_TIMEOUT`]). True when the keys changed since
    /// `seen`.
    async fn refresh(&self, seen: &Arc<Vec<Arc<keys::Key>>>) -> bool {
        let Ok(_one) = tokio::time::timeout(keys::FETCH_TIMEOUT, self.fetching.lock()).await else {
            return false;
        };
        {
            let c = self.cache.lock().expect("oidc key cache");
            if !Arc::ptr_eq(&c.keys, seen) {
                return true;
            }
            if c.last_attempt
                .is_some_and(|t| t.elapsed() < keys::REFRESH_MIN_INTERVAL)
            {
                return false;
            }
        }
        self.fetch_locked().await
    }

    fn current(&self) -> (Arc<Vec<Arc<keys::Key>>>, Option<String>) {
        let c = self.cache.lock().expect("oidc key cache");
        (c.keys.clone(), c.last_error.clone())
    }

    async fn authenticate(&self, token: &str) -> Result<Identity, String> {
        let claims = self.verify(token).await?;
        identity(&self.cfg, &claims)
    }

    /// Check the signature (against keys fetched again once if none
    /// fits), issuer, audience and times; the claims when valid.
    async fn verify(&self, token: &str) -> Result<Map<String, Value>, String> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|e| format!("oidc: malformed token: {e}"))?;
        let alg = header.alg;
        if !self.cfg.algorithms.contains(&alg) {
            return Err(format!(
                "oidc: verify token: signing algorithm {alg:?} is not accepted (accepted: {:?})",
                self.cfg.algorithms
            ));
        }
        let mut validation = Validation::new(alg);
        validation.leeway = 0;
        validation.validate_nbf = false;
        validation.set_issuer(&[&self.cfg.url]);
        validation.set_audience(&self.cfg.audiences);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        let mut refreshed = false;
        loop {
            let (keys, last_error) = self.current();
            let mut tried = false;
            for k in keys
                .iter()
                .filter(|k| k.fits(alg) && (header.kid.is_none() || k.kid == header.kid))
            {
                tried = true;
                match jsonwebtoken::decode::<Map<String, Value>>(token, &k.key, &validation) {
                    Ok(data) => return check_nbf(data.claims),
                    Err(e) if matches!(e.kind(), ErrorKind::InvalidSignature) => continue,
                    Err(e) => return Err(format!("oidc: verify token: {}", describe(&e))),
                }
            }
            // No key fits, or none verifies: the issuer may have rotated.
            if !refreshed && self.refresh(&keys).await {
                refreshed = true;
                continue;
            }
            return Err(match (tried, last_error) {
                (true, _) => "oidc: verify token: failed to verify signature".into(),
                (false, Some(e)) if keys.is_empty() => {
                    format!("oidc: authenticator not initialized: {e}")
                }
                (false, _) => format!(
                    "oidc: verify token: no {alg:?} key{} in the issuer's JWKS",
                    header
                        .kid
                        .as_deref()
                        .map(|k| format!(" with id {k:?}"))
                        .unwrap_or_default()
                ),
            });
        }
    }
}

fn describe(e: &jsonwebtoken::errors::Error) -> String {
    match e.kind() {
        ErrorKind::ExpiredSignature => "token is expired".into(),
        ErrorKind::InvalidAudience => "expected audience not in the token's aud".into(),
        ErrorKind::InvalidIssuer => "id token issued by a different provider".into(),
        ErrorKind::MissingRequiredClaim(c) => format!("token has no {c} claim"),
        _ => e.to_string(),
    }
}

fn check_nbf(claims: Map<String, Value>) -> Result<Map<String, Value>, String> {
    if let Some(nbf) = claims.get("nbf") {
        let nbf = nbf
            .as_f64()
            .ok_or("oidc: verify token: nbf is not a number")?;
        let now = jiff::Timestamp::now().as_second();
        if nbf > (now + NBF_LEEWAY_SECS) as f64 {
            return Err("oidc: verify token: token is not valid yet (nbf)".into());
        }
    }
    Ok(claims)
}

/// The identity the claims map to under `cfg`, as upstream's claim
/// mappings without CEL.
///
/// # Errors
/// A claim is missing or of the wrong type, the email is not verified, or
/// a required claim does not match.
pub fn identity(cfg: &JwtIssuer, claims: &Map<String, Value>) -> Result<Identity, String> {
    let claim = &cfg.username.claim;
    let username = match claims.get(claim) {
        Some(Value::String(s)) => s.clone(),
        Some(_) => {
            return Err(format!(
                "oidc: parse username claims {claim:?}: not a string"
            ))
        }
        None => {
            return Err(format!(
                "oidc: parse username claims {claim:?}: claim not present"
            ))
        }
    };
    if claim == "email" {
        // OIDC's email_verified: when the issuer says, it must say true.
        match claims.get("email_verified") {
            None | Some(Value::Bool(true)) => {}
            Some(Value::Bool(false)) => return Err("oidc: email not verified".into()),
            Some(_) => return Err("oidc: parse 'email_verified' claim: not a boolean".into()),
        }
    }
    if username.is_empty() {
        return Err(format!("oidc: username claim {claim:?} is empty"));
    }
    let mut groups = Vec::new();
    if let Some(g) = &cfg.groups {
        match claims.get(&g.claim) {
            // Upstream lets the claim be a single string (issue 33290).
            Some(Value::String(s)) => groups.push(s.clone()),
            Some(Value::Array(a)) => {
                for v in a {
                    let Value::String(s) = v else {
                        return Err(format!(
                            "oidc: parse groups claim {:?}: not a string or an array of strings",
                            g.claim
                        ));
                    };
                    groups.push(s.clone());
                }
            }
            Some(_) => {
                return Err(format!(
                    "oidc: parse groups claim {:?}: not a string or an array of strings",
                    g.claim
                ))
            }
            None => {
                // A distributed claim would have to be fetched from
                // another endpoint: refuse rather than drop the groups.
                if claims
                    .get("_claim_names")
                    .and_then(|n| n.get(&g.claim))
                    .is_some()
                {
                    return Err(format!(
                        "oidc: groups claim {:?} is distributed, which is not supported",
                        g.claim
                    ));
                }
            }
        }
        for group in &mut groups {
            group.insert_str(0, &g.prefix);
        }
    }
    let uid = match &cfg.uid_claim {
        None => String::new(),
        Some(c) => match claims.get(c) {
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err(format!("oidc: parse uid claim {c:?}: not a string")),
            None => return Err(format!("oidc: parse uid claim {c:?}: claim not present")),
        },
    };
    for (name, want) in &cfg.required_claims {
        match claims.get(name) {
            None => {
                return Err(format!(
                    "oidc: required claim {name} not present in ID token"
                ))
            }
            Some(Value::String(got)) if got == want => {}
            Some(Value::String(got)) => {
                return Err(format!(
                    "oidc: required claim {name} value does not match. Got = {got}, want = {want}"
                ))
            }
            Some(_) => return Err(format!("oidc: parse claim {name}: not a string")),
        }
    }
    let mut id = Identity::new(format!("{}{username}", cfg.username.prefix), groups);
    id.uid = uid;
    if let Some(Value::String(jti)) = claims.get("jti") {
        id.extra
            .insert(CREDENTIAL_ID.into(), vec![format!("JTI={jti}")]);
    }
    Ok(id)
}

#[cfg(test)]
mod tests;
