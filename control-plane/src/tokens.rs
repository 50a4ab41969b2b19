//! Join tokens, managed through the API as upstream's `kubeadm token`
//! does: each is a bootstrap token Secret `kube-system/bootstrap-token-<id>`
//! (authentication usage, an expiration, the default node-token group),
//! printed as a join token that pins the cluster CA (see
//! [`skiff_bootstrap::token`]).
//!
//! The CA hash is taken from the bundle the server itself serves at
//! `/cacerts`, read over the admin kubeconfig's verified connection: the
//! hash is then of exactly the bytes a joining node will receive.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::Api;
use skiff_bootstrap::names;
use skiff_bootstrap::token::{self, BootstrapToken, JoinToken};

use crate::auth::bootstraptoken::valid_extra_group;

/// Token management errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed.
    #[error("{action}: {source}")]
    Api {
        action: String,
        #[source]
        source: kube::Error,
    },
    /// A group a bootstrap token may not carry.
    #[error("invalid group {0:?}: a token's extra groups must start with system:bootstrappers: and use lowercase letters, digits, ':' and '-'")]
    Group(String),
    /// Neither a token id nor a token.
    #[error("{0:?} is neither a token id (6 lowercase letters or digits) nor a token")]
    NotAToken(String),
    /// Nothing by that id.
    #[error("no bootstrap token {0:?} (see `skiff-server token list`)")]
    NotFound(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

fn api_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let action = action.into();
    move |source| Error::Api { action, source }
}

/// What a new token is for.
#[derive(Debug, Clone, Default)]
pub struct TokenSpec {
    /// None: it never expires (kubeadm's `--ttl 0`).
    pub ttl: Option<Duration>,
    pub description: Option<String>,
    /// Extra groups; empty means [`names::DEFAULT_TOKEN_GROUP`], the one
    /// whose CSRs are approved automatically.
    pub groups: Vec<String>,
}

/// A token as `token list` shows it (the secret is never listed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenInfo {
    pub id: String,
    pub expires: Option<jiff::Timestamp>,
    pub usages: Vec<String>,
    pub description: String,
    pub groups: Vec<String>,
}

fn secret_name(id: &str) -> String {
    format!("{}{id}", names::TOKEN_SECRET_PREFIX)
}

/// The cluster CA bundle, exactly as served to joining nodes.
///
/// # Errors
/// The request failed.
pub async fn ca_bundle(client: &kube::Client) -> Result<String> {
    let req = http::Request::get(names::CA_PATH)
        .body(Vec::new())
        .expect("a static request is valid");
    client
        .request_text(req)
        .await
        .map_err(api_err("reading the cluster CA from the API server"))
}

/// The Secret that stores `token` for `spec`, expiring `ttl` after `now`.
pub fn token_secret(
    token: &BootstrapToken,
    spec: &TokenSpec,
    now: jiff::Timestamp,
) -> Result<Secret> {
    let groups = if spec.groups.is_empty() {
        vec![names::DEFAULT_TOKEN_GROUP.to_string()]
    } else {
        spec.groups.clone()
    };
    if let Some(g) = groups.iter().find(|g| !valid_extra_group(g)) {
        return Err(Error::Group(g.clone()));
    }
    let mut data = BTreeMap::new();
    let mut put = |k: &str, v: &str| {
        data.insert(k.to_string(), ByteString(v.as_bytes().to_vec()));
    };
    put(names::KEY_TOKEN_ID, &token.id);
    put(names::KEY_TOKEN_SECRET, &token.secret);
    put(names::KEY_USAGE_AUTHENTICATION, "true");
    put(names::KEY_EXTRA_GROUPS, &groups.join(","));
    if let Some(d) = spec.description.as_deref().filter(|d| !d.is_empty()) {
        put(names::KEY_DESCRIPTION, d);
    }
    if let Some(ttl) = spec.ttl {
        let at = now + jiff::SignedDuration::try_from(ttl).unwrap_or(jiff::SignedDuration::MAX);
        put(
            names::KEY_EXPIRATION,
            &at.round(jiff::Unit::Second).unwrap_or(at).to_string(),
        );
    }
    Ok(Secret {
        metadata: ObjectMeta {
            name: Some(secret_name(&token.id)),
            namespace: Some(names::TOKEN_NAMESPACE.into()),
            ..Default::default()
        },
        type_: Some(names::TOKEN_SECRET_TYPE.into()),
        data: Some(data),
        ..Default::default()
    })
}

/// Create a token; returns the join token to print.
///
/// # Errors
/// A bad group, or the API refused.
pub async fn create(client: &kube::Client, spec: &TokenSpec) -> Result<JoinToken> {
    let ca = ca_bundle(client).await?;
    let api: Api<Secret> = Api::namespaced(client.clone(), names::TOKEN_NAMESPACE);
    // A random id may collide with an existing token: draw again.
    for _ in 0..5 {
        let token = BootstrapToken::generate();
        let secret = token_secret(&token, spec, jiff::Timestamp::now())?;
        match api.create(&PostParams::default(), &secret).await {
            Ok(_) => return Ok(JoinToken::new(ca.as_bytes(), token)),
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(api_err("creating the bootstrap token secret")(e)),
        }
    }
    Err(Error::Api {
        action: "creating the bootstrap token secret".into(),
        source: kube::Error::Service("five token ids in a row were taken".into()),
    })
}

fn data_str(s: &Secret, key: &str) -> Option<String> {
    s.data
        .as_ref()?
        .get(key)
        .map(|v| String::from_utf8_lossy(&v.0).into_owned())
}

/// What a token Secret says, if it is one.
pub fn info(s: &Secret) -> Option<TokenInfo> {
    if s.type_.as_deref() != Some(names::TOKEN_SECRET_TYPE) {
        return None;
    }
    let id = data_str(s, names::KEY_TOKEN_ID)?;
    let usages = s
        .data
        .iter()
        .flatten()
        .filter(|(_, v)| v.0 == b"true")
        .filter_map(|(k, _)| k.strip_prefix("usage-bootstrap-").map(String::from))
        .collect();
    let split = |v: Option<String>| -> Vec<String> {
        v.unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|x| !x.is_empty())
            .map(String::from)
            .collect()
    };
    Some(TokenInfo {
        id,
        expires: data_str(s, names::KEY_EXPIRATION).and_then(|e| e.trim().parse().ok()),
        usages,
        description: data_str(s, names::KEY_DESCRIPTION).unwrap_or_default(),
        groups: split(data_str(s, names::KEY_EXTRA_GROUPS)),
    })
}

/// Every token, by id.
///
/// # Errors
/// The API refused.
pub async fn list(client: &kube::Client) -> Result<Vec<TokenInfo>> {
    let api: Api<Secret> = Api::namespaced(client.clone(), names::TOKEN_NAMESPACE);
    let lp = ListParams::default().fields(&format!("type={}", names::TOKEN_SECRET_TYPE));
    let list = api
        .list(&lp)
        .await
        .map_err(api_err("listing bootstrap tokens"))?;
    let mut out: Vec<TokenInfo> = list.items.iter().filter_map(info).collect();
    out.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(out)
}

/// The token id in `arg`: an id, a bootstrap token, or a join token.
///
/// # Errors
/// [`Error::NotAToken`].
pub fn token_id(arg: &str) -> Result<String> {
    if token::is_token_id(arg) {
        return Ok(arg.to_string());
    }
    if let Ok(t) = BootstrapToken::parse(arg) {
        return Ok(t.id);
    }
    JoinToken::parse(arg)
        .map(|j| j.token.id)
        .map_err(|_| Error::NotAToken(arg.to_string()))
}

/// Delete the token named by `arg` (see [`token_id`]); returns its id.
///
/// # Errors
/// Not a token, no such token, or the API refused.
pub async fn delete(client: &kube::Client, arg: &str) -> Result<String> {
    let id = token_id(arg)?;
    let api: Api<Secret> = Api::namespaced(client.clone(), names::TOKEN_NAMESPACE);
    match api
        .delete(&secret_name(&id), &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(id),
        Err(kube::Error::Api(e)) if e.code == 404 => Err(Error::NotFound(id)),
        Err(e) => Err(api_err(format!("deleting bootstrap token {id}"))(e)),
    }
}

/// `token list` output, in kubeadm's columns (without the secret).
pub fn table(tokens: &[TokenInfo], now: jiff::Timestamp) -> String {
    let mut rows = vec![[
        "ID".to_string(),
        "TTL".into(),
        "EXPIRES".into(),
        "USAGES".into(),
        "DESCRIPTION".into(),
        "EXTRA GROUPS".into(),
    ]];
    for t in tokens {
        let (ttl, expires) = match t.expires {
            None => ("<forever>".to_string(), "<never>".to_string()),
            Some(e) if e <= now => ("<invalid>".to_string(), e.to_string()),
            Some(e) => (human(e.duration_since(now).unsigned_abs()), e.to_string()),
        };
        let or_none = |s: String| {
            if s.is_empty() {
                "<none>".to_string()
            } else {
                s
            }
        };
        rows.push([
            t.id.clone(),
            ttl,
            expires,
            t.usages.join(","),
            or_none(t.description.clone()),
            t.groups.join(","),
        ]);
    }
    let widths: Vec<usize> = (0..6)
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out += line.join("   ").trim_end();
        out.push('\n');
    }
    out
}

/// `23h`, `59m`, `12s`: the largest whole unit, as kubeadm prints TTLs.
fn human(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m", s / 60),
        _ => format!("{}h", s / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_secrets_round_trip_through_info() {
        let t = BootstrapToken::generate();
        let now: jiff::Timestamp = "2030-01-01T00:00:00Z".parse().unwrap();
        let spec = TokenSpec {
            ttl: Some(Duration::from_secs(3600)),
            description: Some("rack 4".into()),
            groups: vec![],
        };
        let s = token_secret(&t, &spec, now).unwrap();
        assert_eq!(
            s.metadata.name.as_deref(),
            Some(&*format!("bootstrap-token-{}", t.id))
        );
        let i = info(&s).unwrap();
        assert_eq!(i.id, t.id);
        assert_eq!(i.expires, Some("2030-01-01T01:00:00Z".parse().unwrap()));
        assert_eq!(i.usages, vec!["authentication"]);
        assert_eq!(i.groups, vec![names::DEFAULT_TOKEN_GROUP]);
        let table = table(&[i], now);
        assert!(table.contains(&t.id) && table.contains("1h") && !table.contains(&t.secret));
        let forever = token_secret(&t, &TokenSpec::default(), now).unwrap();
        assert_eq!(info(&forever).unwrap().expires, None);
        let bad = TokenSpec {
            groups: vec!["system:masters".into()],
            ..TokenSpec::default()
        };
        assert!(matches!(token_secret(&t, &bad, now), Err(Error::Group(_))));
    }

    #[test]
    fn tokens_are_named_by_id_token_or_join_token() {
        let t = BootstrapToken::generate();
        assert_eq!(token_id(&t.id).unwrap(), t.id);
        assert_eq!(token_id(&t.expose()).unwrap(), t.id);
        let j = JoinToken::new(b"ca", t.clone());
        assert_eq!(token_id(&j.expose()).unwrap(), t.id);
        assert!(token_id("nope").is_err());
    }
}
