//! ServiceAccount tokens: the JWTs the server signs for TokenRequest (bound
//! tokens) and the token controller (legacy Secret tokens), and their
//! authentication, as kube-apiserver's `serviceaccount` token generator and
//! validators do.
//!
//! The signing key is an ECDSA P-256 key (ES256, which upstream accepts as
//! a service-account key), made on first start and kept in the data dir.
//! Every key of `--service-account-key-file` verifies too (and is published
//! in the JWKS), so tokens signed by a previous key keep working while a
//! key is rotated.
//!
//! A token's signature and claims are checked once and cached until it
//! expires; the objects it is bound to (its ServiceAccount, pod, secret,
//! node) are looked up again after [`OBJECT_RECHECK`], so a deleted pod's
//! token stops authenticating within that time (upstream reads them from
//! informer caches, which lag the same way).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use rcgen::PublicKeyData as _;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest as _, Sha256};
use x509_parser::public_key::PublicKey;

use super::Identity;
use crate::store::Store;

/// The issuer of legacy (Secret) tokens, as upstream.
pub const LEGACY_ISSUER: &str = "kubernetes/serviceaccount";
/// Upstream's default issuer for skiff (k3s's too).
pub const DEFAULT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
/// How long a verified token's bound objects are trusted before they are
/// looked up again.
pub const OBJECT_RECHECK: Duration = Duration::from_secs(1);
/// Tokens cached at most; the cache starts over when full.
const CACHE_CAP: usize = 10_000;
/// Clock skew tolerated on `exp`/`nbf`/`iat`, as upstream's validator.
const LEEWAY_SECS: i64 = 60;
/// The longest token accepted at all; longer bearer values are not JWTs
/// this server issued (and are not worth hashing).
const MAX_TOKEN_LEN: usize = 16 * 1024;

/// Key and configuration errors (at start-up).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("service account key {path}: {why}")]
    Key { path: String, why: String },
    #[error("generating the service account key: {0}")]
    Generate(String),
    #[error("signing a token: {0}")]
    Sign(#[from] jsonwebtoken::errors::Error),
}

/// Settings (the flags of the same names).
#[derive(Debug, Clone)]
pub struct Settings {
    /// `--service-account-issuer`: the first signs, all are accepted.
    pub issuers: Vec<String>,
    /// `--api-audiences`: tokens must be for one of these (default: the
    /// issuers).
    pub api_audiences: Vec<String>,
    /// `--service-account-signing-key-file` (default
    /// `DATA_DIR/pki/service-account.key`, made when missing).
    pub signing_key_file: PathBuf,
    /// `--service-account-key-file`: more keys that verify (public or
    /// private PEM, EC or RSA).
    pub key_files: Vec<PathBuf>,
    /// `--service-account-max-token-expiration`: longer requests are cut
    /// down to it.
    pub max_expiration: Option<Duration>,
}

/// A key that verifies tokens, with its JWK.
struct VerifyKey {
    kid: String,
    alg: Algorithm,
    key: DecodingKey,
    jwk: Value,
}

/// What a valid token says, after its signature and time checks.
#[derive(Debug, Clone)]
pub struct Verified {
    pub namespace: String,
    pub service_account: String,
    pub service_account_uid: String,
    /// The token's `aud`.
    pub audiences: Vec<String>,
    /// Bound objects (kind, name, uid): Pod, Secret, Node.
    pub bound: Vec<(&'static str, String, String)>,
    /// Legacy tokens are valid while their Secret holds them.
    pub legacy_secret: Option<String>,
    pub jti: Option<String>,
    /// Seconds since the epoch; None for legacy tokens (no expiry).
    pub expires: Option<i64>,
}

impl Verified {
    /// The identity upstream gives a ServiceAccount token.
    pub fn identity(&self) -> Identity {
        let mut id = Identity::new(
            format!(
                "system:serviceaccount:{}:{}",
                self.namespace, self.service_account
            ),
            vec![
                "system:serviceaccounts".to_string(),
                format!("system:serviceaccounts:{}", self.namespace),
            ],
        );
        id.uid = self.service_account_uid.clone();
        let mut extra = BTreeMap::new();
        for (kind, name, uid) in &self.bound {
            let k = match *kind {
                "Pod" => "pod",
                "Node" => "node",
                _ => continue,
            };
            extra.insert(
                format!("authentication.kubernetes.io/{k}-name"),
                vec![name.clone()],
            );
            extra.insert(
                format!("authentication.kubernetes.io/{k}-uid"),
                vec![uid.clone()],
            );
        }
        if let Some(jti) = &self.jti {
            extra.insert(
                "authentication.kubernetes.io/credential-id".into(),
                vec![format!("JTI={jti}")],
            );
        }
        id.extra = extra;
        id
    }
}

/// The `kubernetes.io` claim of bound tokens.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
struct Private {
    namespace: String,
    serviceaccount: Ref,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pod: Option<Ref>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    secret: Option<Ref>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    node: Option<Ref>,
}

#[derive(Debug, Clone, Serialize, Deserialize, Default)]
struct Ref {
    name: String,
    uid: String,
}

/// Claims of a bound token.
#[derive(Debug, Serialize, Deserialize)]
struct BoundClaims {
    iss: String,
    sub: String,
    aud: Vec<String>,
    exp: i64,
    iat: i64,
    nbf: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    jti: Option<String>,
    #[serde(rename = "kubernetes.io")]
    k8s: Private,
}

/// Claims of a legacy Secret token (no expiry, no audience).
#[derive(Debug, Serialize, Deserialize)]
struct LegacyClaims {
    iss: String,
    sub: String,
    #[serde(rename = "kubernetes.io/serviceaccount/namespace")]
    namespace: String,
    #[serde(rename = "kubernetes.io/serviceaccount/secret.name")]
    secret: String,
    #[serde(rename = "kubernetes.io/serviceaccount/service-account.name")]
    sa_name: String,
    #[serde(rename = "kubernetes.io/serviceaccount/service-account.uid")]
    sa_uid: String,
}

/// A token to sign (TokenRequest).
#[derive(Debug, Clone)]
pub struct Request {
    pub namespace: String,
    pub service_account: String,
    pub service_account_uid: String,
    pub audiences: Vec<String>,
    pub expiration: Duration,
    /// (kind, name, uid) of the object the token is bound to.
    pub bound: Option<(String, String, String)>,
    /// The node a bound pod runs on (name, uid), as upstream adds.
    pub node: Option<(String, String)>,
}

/// A verified token, cached until it expires.
struct Cached {
    verified: Verified,
    identity: Identity,
    /// The audiences the API server itself accepts it for.
    api_audiences: Result<Vec<String>, String>,
    /// When the bound objects were last found in place.
    checked: Option<Instant>,
}

/// What the cache knows of a token.
struct Hit {
    identity: Identity,
    audiences: Result<Vec<String>, String>,
    /// Set when its objects are due to be looked up again.
    recheck: Option<Verified>,
}

fn cache_key(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Signs and verifies ServiceAccount tokens.
pub struct Tokens {
    signing: EncodingKey,
    signing_kid: String,
    keys: Vec<VerifyKey>,
    issuers: Vec<String>,
    audiences: Vec<String>,
    max_expiration: Option<Duration>,
    cache: Mutex<HashMap<[u8; 32], Cached>>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("issuers", &self.issuers)
            .field("kid", &self.signing_kid)
            .finish_non_exhaustive()
    }
}

/// The controller manager's token controller signs with the same key.
impl skiff_controllers::serviceaccounttoken::LegacyTokenSigner for Tokens {
    fn sign_legacy(
        &self,
        namespace: &str,
        secret: &str,
        sa_name: &str,
        sa_uid: &str,
    ) -> Result<String, String> {
        Tokens::sign_legacy(self, namespace, secret, sa_name, sa_uid).map_err(|e| e.to_string())
    }
}

impl Tokens {
    /// Load the signing key (making it when missing) and the other
    /// verification keys.
    ///
    /// # Errors
    /// A key file cannot be read, written or parsed.
    pub fn load(s: &Settings) -> Result<Tokens, Error> {
        let signing_pem = load_or_make_signing_key(&s.signing_key_file)?;
        let key_err = |path: &Path, why: String| Error::Key {
            path: path.display().to_string(),
            why,
        };
        let kp = rcgen::KeyPair::from_pem(&signing_pem)
            .map_err(|e| key_err(&s.signing_key_file, e.to_string()))?;
        let own = verify_key_from_spki(&kp.subject_public_key_info())
            .map_err(|why| key_err(&s.signing_key_file, why))?;
        if own.alg != Algorithm::ES256 {
            return Err(key_err(
                &s.signing_key_file,
                "the signing key must be an ECDSA P-256 key".into(),
            ));
        }
        let signing = EncodingKey::from_ec_pem(signing_pem.as_bytes())
            .map_err(|e| key_err(&s.signing_key_file, e.to_string()))?;
        let signing_kid = own.kid.clone();
        let mut keys = vec![own];
        for path in &s.key_files {
            for k in verify_keys_from_file(path)? {
                if !keys.iter().any(|x| x.kid == k.kid) {
                    keys.push(k);
                }
            }
        }
        let issuers = if s.issuers.is_empty() {
            vec![DEFAULT_ISSUER.to_string()]
        } else {
            s.issuers.clone()
        };
        let audiences = if s.api_audiences.is_empty() {
            issuers.clone()
        } else {
            s.api_audiences.clone()
        };
        Ok(Tokens {
            signing,
            signing_kid,
            keys,
            issuers,
            audiences,
            max_expiration: s.max_expiration,
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// The issuer new tokens carry.
    pub fn issuer(&self) -> &str {
        &self.issuers[0]
    }

    /// The audiences a token without its own is for (`--api-audiences`).
    pub fn api_audiences(&self) -> &[String] {
        &self.audiences
    }

    /// A requested lifetime cut to `--service-account-max-token-expiration`.
    pub fn capped(&self, requested: Duration) -> Duration {
        match self.max_expiration {
            Some(max) if requested > max => max,
            _ => requested,
        }
    }

    /// Sign a bound token; returns it with its expiry (seconds since the
    /// epoch).
    ///
    /// # Errors
    /// Signing failed (it does not with a loaded key).
    pub fn sign(&self, req: &Request, now: i64) -> Result<(String, i64), Error> {
        let exp = now + i64::try_from(req.expiration.as_secs()).unwrap_or(i64::MAX / 2);
        let mut k8s = Private {
            namespace: req.namespace.clone(),
            serviceaccount: Ref {
                name: req.service_account.clone(),
                uid: req.service_account_uid.clone(),
            },
            ..Private::default()
        };
        if let Some((kind, name, uid)) = &req.bound {
            let r = Some(Ref {
                name: name.clone(),
                uid: uid.clone(),
            });
            match kind.as_str() {
                "Pod" => k8s.pod = r,
                "Secret" => k8s.secret = r,
                "Node" => k8s.node = r,
                _ => {}
            }
        }
        if let Some((name, uid)) = &req.node {
            k8s.node = Some(Ref {
                name: name.clone(),
                uid: uid.clone(),
            });
        }
        let claims = BoundClaims {
            iss: self.issuer().to_string(),
            sub: format!(
                "system:serviceaccount:{}:{}",
                req.namespace, req.service_account
            ),
            aud: req.audiences.clone(),
            exp,
            iat: now,
            nbf: now,
            jti: Some(uuid::Uuid::new_v4().to_string()),
            k8s,
        };
        Ok((self.encode(&claims)?, exp))
    }

    /// Sign a legacy token for a `kubernetes.io/service-account-token`
    /// Secret (the token controller's).
    ///
    /// # Errors
    /// Signing failed.
    pub fn sign_legacy(
        &self,
        namespace: &str,
        secret: &str,
        sa_name: &str,
        sa_uid: &str,
    ) -> Result<String, Error> {
        self.encode(&LegacyClaims {
            iss: LEGACY_ISSUER.into(),
            sub: format!("system:serviceaccount:{namespace}:{sa_name}"),
            namespace: namespace.into(),
            secret: secret.into(),
            sa_name: sa_name.into(),
            sa_uid: sa_uid.into(),
        })
    }

    fn encode(&self, claims: &impl Serialize) -> Result<String, Error> {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(self.signing_kid.clone());
        Ok(jsonwebtoken::encode(&header, claims, &self.signing)?)
    }

    /// Whether `token` looks like one of ours: a JWT whose (unverified)
    /// issuer is ours. Other JWTs belong to other authenticators (OIDC).
    pub fn claims_issuer(&self, token: &str) -> bool {
        unverified_issuer(token)
            .is_some_and(|iss| iss == LEGACY_ISSUER || self.issuers.contains(&iss))
    }

    /// Check a token's signature and claims, not its objects.
    ///
    /// # Errors
    /// Why the token is not valid, as upstream words it.
    pub fn verify(&self, token: &str, now: i64) -> Result<Verified, String> {
        if token.len() > MAX_TOKEN_LEN {
            return Err("token is too long".into());
        }
        self.verify_uncached(token, now)
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Cached>> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The cached verdict on a token that has not expired.
    fn cached(&self, key: &[u8; 32], now: i64, wanted: Option<&[String]>) -> Option<Hit> {
        let cache = self.cache();
        let c = cache.get(key)?;
        if c.verified.expires.is_some_and(|e| e + LEEWAY_SECS <= now) {
            return None;
        }
        let audiences = match wanted {
            None => c.api_audiences.clone(),
            Some(_) => self.accepted_audiences(&c.verified, wanted),
        };
        let fresh = c.checked.is_some_and(|t| t.elapsed() < OBJECT_RECHECK);
        Some(Hit {
            identity: c.identity.clone(),
            audiences,
            recheck: (!fresh).then(|| c.verified.clone()),
        })
    }

    fn verify_and_cache(&self, token: &str, key: [u8; 32], now: i64) -> Result<(), String> {
        let verified = self.verify(token, now)?;
        let entry = Cached {
            identity: verified.identity(),
            api_audiences: self.accepted_audiences(&verified, None),
            verified,
            checked: None,
        };
        let mut cache = self.cache();
        if cache.len() >= CACHE_CAP {
            cache.clear();
        }
        cache.insert(key, entry);
        Ok(())
    }

    fn verify_uncached(&self, token: &str, now: i64) -> Result<Verified, String> {
        let header =
            jsonwebtoken::decode_header(token).map_err(|e| format!("invalid token: {e}"))?;
        let candidates: Vec<&VerifyKey> = self
            .keys
            .iter()
            .filter(|k| k.alg == header.alg)
            .filter(|k| header.kid.as_ref().is_none_or(|kid| *kid == k.kid))
            .collect();
        if candidates.is_empty() {
            return Err("invalid signature, no keys found".into());
        }
        let mut validation = Validation::new(header.alg);
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.validate_aud = false;
        validation.required_spec_claims.clear();
        let claims: Value = candidates
            .iter()
            .find_map(|k| jsonwebtoken::decode::<Value>(token, &k.key, &validation).ok())
            .map(|d| d.claims)
            .ok_or_else(|| "invalid signature".to_string())?;
        if claims["iss"] == LEGACY_ISSUER {
            let c: LegacyClaims = serde_json::from_value(claims)
                .map_err(|e| format!("invalid legacy token claims: {e}"))?;
            return Ok(Verified {
                namespace: c.namespace,
                service_account: c.sa_name,
                service_account_uid: c.sa_uid,
                audiences: Vec::new(),
                bound: Vec::new(),
                legacy_secret: Some(c.secret),
                jti: None,
                expires: None,
            });
        }
        let c: BoundClaims =
            serde_json::from_value(claims).map_err(|e| format!("invalid token claims: {e}"))?;
        if !self.issuers.contains(&c.iss) {
            return Err(format!("token issuer {:?} is not accepted", c.iss));
        }
        if c.exp + LEEWAY_SECS < now {
            return Err("service account token has expired".into());
        }
        if c.nbf - LEEWAY_SECS > now || c.iat - LEEWAY_SECS > now {
            return Err("service account token is not valid yet".into());
        }
        let expected_sub = format!(
            "system:serviceaccount:{}:{}",
            c.k8s.namespace, c.k8s.serviceaccount.name
        );
        if c.sub != expected_sub {
            return Err("token subject does not match its service account".into());
        }
        let mut bound = Vec::new();
        for (kind, r) in [
            ("Pod", &c.k8s.pod),
            ("Secret", &c.k8s.secret),
            ("Node", &c.k8s.node),
        ] {
            if let Some(r) = r {
                bound.push((kind, r.name.clone(), r.uid.clone()));
            }
        }
        Ok(Verified {
            namespace: c.k8s.namespace,
            service_account: c.k8s.serviceaccount.name,
            service_account_uid: c.k8s.serviceaccount.uid,
            audiences: c.aud,
            bound,
            legacy_secret: None,
            jti: c.jti,
            expires: Some(c.exp),
        })
    }

    /// Authenticate `token` for one of `wanted` (None: the API server's
    /// audiences): its signature and claims (checked once, then cached
    /// until it expires), then the objects it names, which must still
    /// exist with the same uids. None when the token is not one of ours
    /// (another authenticator may know it); else its identity and the
    /// audiences it was accepted for, or why it does not authenticate.
    pub async fn authenticate(
        &self,
        store: &dyn Store,
        token: &str,
        wanted: Option<&[String]>,
        now: i64,
    ) -> Option<Result<(Identity, Vec<String>), String>> {
        let key = cache_key(token);
        let hit = match self.cached(&key, now, wanted) {
            Some(hit) => hit,
            None => {
                if !self.claims_issuer(token) {
                    return None;
                }
                if let Err(e) = self.verify_and_cache(token, key, now) {
                    return Some(Err(e));
                }
                self.cached(&key, now, wanted)?
            }
        };
        let audiences = match hit.audiences {
            Ok(a) => a,
            Err(e) => return Some(Err(e)),
        };
        if let Some(v) = hit.recheck {
            if let Err(e) = check_objects(store, &v, token).await {
                return Some(Err(e));
            }
            if let Some(c) = self.cache().get_mut(&key) {
                c.checked = Some(Instant::now());
            }
        }
        Some(Ok((hit.identity, audiences)))
    }

    /// The audiences of `v` among `wanted` (default: the API server's);
    /// legacy tokens are for the API server only.
    ///
    /// # Errors
    /// None of them: upstream's "token audiences ... is invalid for the
    /// target audiences".
    pub fn accepted_audiences(
        &self,
        v: &Verified,
        wanted: Option<&[String]>,
    ) -> Result<Vec<String>, String> {
        let has = if v.legacy_secret.is_some() {
            &self.audiences
        } else {
            &v.audiences
        };
        common_audiences(has, wanted.unwrap_or(&self.audiences))
    }

    /// The OIDC discovery document, for issuer URLs (upstream serves it
    /// only when the issuer is a URL).
    pub fn openid_configuration(&self) -> Option<Value> {
        let iss = self.issuer();
        if !iss.starts_with("https://") {
            return None;
        }
        let mut algs: Vec<&str> = self.keys.iter().map(|k| alg_name(k.alg)).collect();
        algs.sort_unstable();
        algs.dedup();
        Some(json!({
            "issuer": iss,
            "jwks_uri": format!("{}/openid/v1/jwks", iss.trim_end_matches('/')),
            "response_types_supported": ["id_token"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": algs,
        }))
    }

    /// The public keys as a JWK set.
    pub fn jwks(&self) -> Value {
        json!({"keys": self.keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>()})
    }
}

/// The audiences among `wanted` that a token for `has` is valid for.
///
/// # Errors
/// None: upstream's "token audiences ... is invalid for the target
/// audiences".
pub fn common_audiences(has: &[String], wanted: &[String]) -> Result<Vec<String>, String> {
    let both: Vec<String> = wanted.iter().filter(|a| has.contains(a)).cloned().collect();
    if both.is_empty() {
        return Err(format!(
            "token audiences {has:?} is invalid for the target audiences {wanted:?}"
        ));
    }
    Ok(both)
}

/// The bound objects of `v` are still there, with the uids it names.
async fn check_objects(store: &dyn Store, v: &Verified, token: &str) -> Result<(), String> {
    let ns = &v.namespace;
    let sa = get(
        store,
        &format!("/registry/core/serviceaccounts/{ns}/{}", v.service_account),
    )
    .await?
    .ok_or_else(|| {
        format!(
            "service account {ns}/{} has been deleted",
            v.service_account
        )
    })?;
    if !v.service_account_uid.is_empty() && uid(&sa) != v.service_account_uid {
        return Err(format!(
            "service account UID ({}) does not match claim ({})",
            uid(&sa),
            v.service_account_uid
        ));
    }
    if let Some(secret) = &v.legacy_secret {
        let s = get(store, &format!("/registry/core/secrets/{ns}/{secret}"))
            .await?
            .ok_or_else(|| format!("secret {ns}/{secret} has been deleted"))?;
        let stored = s["data"]["token"].as_str().unwrap_or_default();
        let held = base64::engine::general_purpose::STANDARD
            .decode(stored)
            .unwrap_or_default();
        if held != token.as_bytes() {
            return Err(format!(
                "token does not match the one in secret {ns}/{secret}"
            ));
        }
        return Ok(());
    }
    for (kind, name, want) in &v.bound {
        let key = match *kind {
            "Pod" => format!("/registry/core/pods/{ns}/{name}"),
            "Secret" => format!("/registry/core/secrets/{ns}/{name}"),
            _ => format!("/registry/core/nodes/{name}"),
        };
        let what = kind.to_lowercase();
        let obj = get(store, &key)
            .await?
            .ok_or_else(|| format!("{what} {name} has been deleted"))?;
        if uid(&obj) != want {
            return Err(format!(
                "{what} {name} UID ({}) does not match claim ({want})",
                uid(&obj)
            ));
        }
        if objects_deleting(&obj) && *kind != "Node" {
            return Err(format!("{what} {name} is being deleted"));
        }
    }
    Ok(())
}

fn objects_deleting(obj: &Value) -> bool {
    crate::apiserver::objects::has_deletion_timestamp(obj)
}

async fn get(store: &dyn Store, key: &str) -> Result<Option<Value>, String> {
    match store.get(key).await {
        Ok(Some(kv)) => Ok(serde_json::from_slice(&kv.value).ok()),
        Ok(None) => Ok(None),
        Err(e) => Err(format!("looking up {key}: {e}")),
    }
}

fn uid(obj: &Value) -> &str {
    obj["metadata"]["uid"].as_str().unwrap_or_default()
}

/// The `iss` of a JWT, read without verifying it.
pub fn unverified_issuer(token: &str) -> Option<String> {
    let mut parts = token.split('.');
    let (_, payload, _) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || payload.len() > MAX_TOKEN_LEN {
        return None;
    }
    let bytes = URL_SAFE_NO_PAD.decode(payload).ok()?;
    let v: Value = serde_json::from_slice(&bytes).ok()?;
    v["iss"].as_str().map(String::from)
}

fn alg_name(a: Algorithm) -> &'static str {
    match a {
        Algorithm::ES256 => "ES256",
        Algorithm::ES384 => "ES384",
        _ => "RS256",
    }
}

/// The signing key's PEM, made (and written 0600) when missing.
fn load_or_make_signing_key(path: &Path) -> Result<String, Error> {
    match std::fs::read_to_string(path) {
        Ok(pem) => return Ok(pem),
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(Error::Io {
                what: "reading",
                path: path.display().to_string(),
                source: e,
            })
        }
        Err(_) => {}
    }
    let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|e| Error::Generate(e.to_string()))?;
    let pem = kp.serialize_pem();
    crate::pki::write_file(path, &pem, true).map_err(|e| Error::Generate(e.to_string()))?;
    tracing::info!(path = %path.display(), "made a new service account signing key");
    Ok(pem)
}

/// Every key in a PEM file (public keys, or private keys whose public half
/// is taken).
fn verify_keys_from_file(path: &Path) -> Result<Vec<VerifyKey>, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        what: "reading",
        path: path.display().to_string(),
        source,
    })?;
    let key_err = |why: String| Error::Key {
        path: path.display().to_string(),
        why,
    };
    let mut out = Vec::new();
    for block in x509_parser::pem::Pem::iter_from_buffer(text.as_bytes()) {
        let block = block.map_err(|e| key_err(e.to_string()))?;
        let spki = match block.label.as_str() {
            "PUBLIC KEY" => block.contents,
            "PRIVATE KEY" => rcgen::KeyPair::try_from(block.contents.as_slice())
                .map_err(|e| key_err(format!("PRIVATE KEY: {e}")))?
                .subject_public_key_info(),
            other => {
                return Err(key_err(format!(
                    "{other} blocks are not read: give keys as PKIX \"PUBLIC KEY\" or PKCS#8 \"PRIVATE KEY\""
                )))
            }
        };
        out.push(verify_key_from_spki(&spki).map_err(key_err)?);
    }
    if out.is_empty() {
        return Err(key_err("no public or private key in the file".into()));
    }
    Ok(out)
}

/// A verification key and its JWK from a SubjectPublicKeyInfo (DER). The
/// key id is upstream's: the unpadded base64url SHA-256 of the DER.
fn verify_key_from_spki(der: &[u8]) -> Result<VerifyKey, String> {
    use x509_parser::prelude::FromDer as _;
    let (_, spki) = x509_parser::x509::SubjectPublicKeyInfo::from_der(der)
        .map_err(|e| format!("not a public key: {e}"))?;
    let kid = URL_SAFE_NO_PAD.encode(Sha256::digest(der));
    let parsed = spki.parsed().map_err(|e| format!("unsupported key: {e}"))?;
    match parsed {
        PublicKey::EC(point) => {
            let raw = point.data();
            let (crv, alg, size) = match raw.len() {
                65 => ("P-256", Algorithm::ES256, 32),
                97 => ("P-384", Algorithm::ES384, 48),
                n => return Err(format!("unsupported EC key ({n}-byte point)")),
            };
            if raw[0] != 4 {
                return Err("compressed EC points are not supported".into());
            }
            let x = URL_SAFE_NO_PAD.encode(&raw[1..=size]);
            let y = URL_SAFE_NO_PAD.encode(&raw[1 + size..]);
            let key = DecodingKey::from_ec_components(&x, &y).map_err(|e| e.to_string())?;
            let jwk = json!({"use": "sig", "kty": "EC", "kid": kid, "crv": crv, "alg": alg_name(alg), "x": x, "y": y});
            Ok(VerifyKey { kid, alg, key, jwk })
        }
        PublicKey::RSA(rsa) => {
            let n = URL_SAFE_NO_PAD.encode(strip_zeros(rsa.modulus));
            let e = URL_SAFE_NO_PAD.encode(strip_zeros(rsa.exponent));
            let key = DecodingKey::from_rsa_components(&n, &e).map_err(|e| e.to_string())?;
            let jwk =
                json!({"use": "sig", "kty": "RSA", "kid": kid, "alg": "RS256", "n": n, "e": e});
            Ok(VerifyKey {
                kid,
                alg: Algorithm::RS256,
                key,
                jwk,
            })
        }
        _ => Err("only EC (P-256, P-384) and RSA keys are supported".into()),
    }
}

/// DER integers carry a leading zero when their top bit is set; JWKs do not.
fn strip_zeros(b: &[u8]) -> &[u8] {
    let first = b.iter().position(|x| *x != 0).unwrap_or(b.len());
    &b[first..]
}

#[cfg(test)]
mod tests;
