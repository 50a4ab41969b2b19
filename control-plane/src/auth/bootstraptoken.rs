//! Bootstrap token authentication, as upstream's bootstrap token
//! authenticator (`plugin/pkg/auth/authenticator/token/bootstrap`): a
//! bearer `<id>.<secret>` is checked against the Secret
//! `kube-system/bootstrap-token-<id>` of type `bootstrap.kubernetes.io/token`
//! and authenticates as `system:bootstrap:<id>` in `system:bootstrappers`
//! plus the Secret's `auth-extra-groups`.
//!
//! Every failure is the same anonymous refusal (a 401), as upstream: the
//! caller learns nothing about which tokens exist. The reason is logged at
//! debug level for the operator.

use base64::Engine;
use serde_json::Value;
use skiff_bootstrap::names;
use skiff_bootstrap::BootstrapToken;

use super::Identity;
use crate::store::Store;

/// The store key of token `id`'s Secret.
fn secret_key(id: &str) -> String {
    format!(
        "/registry/core/secrets/{}/{}{id}",
        names::TOKEN_NAMESPACE,
        names::TOKEN_SECRET_PREFIX
    )
}

/// A `data` value of the Secret, decoded.
fn data(secret: &Value, key: &str) -> Option<Vec<u8>> {
    let b64 = secret["data"][key].as_str()?;
    base64::engine::general_purpose::STANDARD.decode(b64).ok()
}

fn data_str(secret: &Value, key: &str) -> Option<String> {
    data(secret, key).and_then(|b| String::from_utf8(b).ok())
}

/// Whether an extra group is one a bootstrap token may carry (upstream's
/// `^system:bootstrappers:[a-z0-9:-]{0,255}[a-z0-9]$`).
pub fn valid_extra_group(g: &str) -> bool {
    let Some(rest) = g.strip_prefix("system:bootstrappers:") else {
        return false;
    };
    !rest.is_empty()
        && rest.len() <= 256
        && rest
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b':' || b == b'-')
        && rest
            .bytes()
            .last()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// Whether the Secret's `expiration` has passed; a malformed one counts as
/// expired, as upstream.
pub fn expired(secret: &Value, now: jiff::Timestamp) -> bool {
    match data_str(secret, names::KEY_EXPIRATION) {
        None => false,
        Some(t) => t
            .trim()
            .parse::<jiff::Timestamp>()
            .map_or(true, |e| e <= now),
    }
}

/// Check `secret` for `token`; the identity, or why not.
pub fn check(
    secret: &Value,
    token: &BootstrapToken,
    now: jiff::Timestamp,
) -> Result<Identity, &'static str> {
    if secret["metadata"]["deletionTimestamp"].is_string() {
        return Err("its secret is being deleted");
    }
    if secret["type"].as_str() != Some(names::TOKEN_SECRET_TYPE) {
        return Err("its secret has the wrong type");
    }
    let stored = data(secret, names::KEY_TOKEN_SECRET).unwrap_or_default();
    if !token.secret_matches(&stored) {
        return Err("the secret does not match");
    }
    if data_str(secret, names::KEY_TOKEN_ID).as_deref() != Some(token.id.as_str()) {
        return Err("its secret names another token id");
    }
    if expired(secret, now) {
        return Err("it has expired");
    }
    if data_str(secret, names::KEY_USAGE_AUTHENTICATION).as_deref() != Some("true") {
        return Err("it is not marked for authentication");
    }
    let mut groups = vec![names::BOOTSTRAP_GROUP.to_string()];
    for g in data_str(secret, names::KEY_EXTRA_GROUPS)
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|g| !g.is_empty())
    {
        if !valid_extra_group(g) {
            return Err("it carries an invalid extra group");
        }
        if !groups.iter().any(|x| x == g) {
            groups.push(g.to_string());
        }
    }
    Ok(Identity::new(
        format!("{}{}", names::BOOTSTRAP_USER_PREFIX, token.id),
        groups,
    ))
}

/// The identity of a bearer token if it is a valid bootstrap token.
pub async fn authenticate(store: &dyn Store, bearer: &str) -> Option<Identity> {
    let token = BootstrapToken::parse(bearer).ok()?;
    let kv = match store.get(&secret_key(&token.id)).await {
        Ok(Some(kv)) => kv,
        Ok(None) => {
            tracing::debug!(token = %token.id, "bootstrap token refused: no such token");
            return None;
        }
        Err(e) => {
            tracing::warn!(token = %token.id, error = %e, "bootstrap token refused: reading its secret failed");
            return None;
        }
    };
    let secret: Value = serde_json::from_slice(&kv.value).ok()?;
    match check(&secret, &token, jiff::Timestamp::now()) {
        Ok(id) => Some(id),
        Err(why) => {
            tracing::debug!(token = %token.id, "bootstrap token refused: {why}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn secret(token: &BootstrapToken, extra: &[(&str, &str)]) -> Value {
        let b = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let mut data = json!({
            "token-id": b(&token.id),
            "token-secret": b(&token.secret),
            "usage-bootstrap-authentication": b("true"),
        });
        for (k, v) in extra {
            data[*k] = json!(b(v));
        }
        json!({"type": "bootstrap.kubernetes.io/token", "metadata": {"name": format!("bootstrap-token-{}", token.id)}, "data": data})
    }

    #[test]
    fn bootstrap_tokens_authenticate_until_they_expire() {
        let t = BootstrapToken::generate();
        let now = jiff::Timestamp::now();
        let hours = |h| jiff::SignedDuration::from_hours(h);
        let later = (now + hours(1)).to_string();
        let s = secret(
            &t,
            &[
                ("expiration", &later),
                (
                    "auth-extra-groups",
                    "system:bootstrappers:skiff:default-node-token",
                ),
            ],
        );
        let id = check(&s, &t, now).unwrap();
        assert_eq!(id.user, format!("system:bootstrap:{}", t.id));
        assert!(id.in_group("system:bootstrappers"));
        assert!(id.in_group("system:bootstrappers:skiff:default-node-token"));
        assert!(id.in_group("system:authenticated"));
        assert_eq!(check(&s, &t, now + hours(2)).unwrap_err(), "it has expired");
        let wrong = BootstrapToken {
            secret: "0000000000000000".into(),
            ..t.clone()
        };
        assert!(check(&s, &wrong, now).is_err());
        let mut opaque = s.clone();
        opaque["type"] = json!("Opaque");
        assert!(check(&opaque, &t, now).is_err());
        let bad_group = secret(&t, &[("auth-extra-groups", "system:masters")]);
        assert!(check(&bad_group, &t, now).is_err());
        let no_usage = secret(&t, &[("usage-bootstrap-authentication", "false")]);
        assert!(check(&no_usage, &t, now).is_err());
        let garbled = secret(&t, &[("expiration", "tomorrow")]);
        assert!(check(&garbled, &t, now).is_err());
    }

    #[test]
    fn extra_groups() {
        assert!(valid_extra_group(
            "system:bootstrappers:kubeadm:default-node-token"
        ));
        assert!(!valid_extra_group("system:bootstrappers:"));
        assert!(!valid_extra_group("system:bootstrappers:Upper"));
        assert!(!valid_extra_group("system:bootstrappers:trailing-"));
        assert!(!valid_extra_group("system:nodes"));
    }
}
