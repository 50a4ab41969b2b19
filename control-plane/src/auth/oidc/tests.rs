use super::*;
use crate::auth::authconfig::PrefixedClaim;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::json;

const ISS: &str = "https://issuer.example";

fn cfg() -> JwtIssuer {
    JwtIssuer {
        url: ISS.into(),
        discovery_url: None,
        ca_pem: None,
        audiences: vec!["skiff".into()],
        algorithms: vec![Algorithm::ES256],
        username: PrefixedClaim {
            claim: "email".into(),
            prefix: String::new(),
        },
        groups: Some(PrefixedClaim {
            claim: "groups".into(),
            prefix: "oidc:".into(),
        }),
        uid_claim: None,
        required_claims: vec![],
    }
}

/// A P-256 signing key and its JWK.
fn signing_key(kid: &str) -> (EncodingKey, Value) {
    let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let raw = kp.public_key_raw();
    let jwk = json!({
        "kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": kid,
        "x": URL_SAFE_NO_PAD.encode(&raw[1..33]),
        "y": URL_SAFE_NO_PAD.encode(&raw[33..65]),
    });
    (EncodingKey::from_ec_der(&kp.serialize_der()), jwk)
}

fn claims() -> Value {
    let now = jiff::Timestamp::now().as_second();
    json!({"iss": ISS, "aud": "skiff", "sub": "1234", "email": "jane@example.com",
           "email_verified": true, "groups": ["dev", "ops"], "exp": now + 600, "iat": now})
}

fn sign(key: &EncodingKey, kid: &str, claims: &Value) -> String {
    let mut h = Header::new(Algorithm::ES256);
    h.kid = Some(kid.into());
    jsonwebtoken::encode(&h, claims, key).unwrap()
}

/// An authenticator whose issuer's keys are already cached (and whose
/// endpoint does not answer, so refreshes fail fast).
fn oidc_with(jwks: Value) -> Oidc {
    let mut c = cfg();
    c.discovery_url = Some("https://127.0.0.1:1/.well-known/openid-configuration".into());
    c.ca_pem = Some(test_ca());
    let o = Oidc::new(vec![c]).unwrap();
    let keys = keys::parse_jwks(&jwks);
    let mut cache = o.issuers[0].cache.lock().unwrap();
    cache.keys = Arc::new(keys.into_iter().map(Arc::new).collect());
    cache.last_attempt = Some(Instant::now());
    drop(cache);
    o
}

fn test_ca() -> Vec<u8> {
    let kp = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(vec![]).unwrap();
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    p.self_signed(&kp).unwrap().pem().into_bytes()
}

#[test]
fn claims_map_as_upstream() {
    let c = claims().as_object().unwrap().clone();
    let id = identity(&cfg(), &c).unwrap();
    assert_eq!(id.user, "jane@example.com");
    assert_eq!(
        id.groups,
        vec!["oidc:dev", "oidc:ops", "system:authenticated"]
    );
    let mut one = c.clone();
    one.insert("groups".into(), json!("admins"));
    one.insert("jti".into(), json!("abc"));
    let id = identity(&cfg(), &one).unwrap();
    assert_eq!(id.groups[0], "oidc:admins");
    assert_eq!(id.extra[CREDENTIAL_ID], vec!["JTI=abc"]);
    let mut unverified = c.clone();
    unverified.insert("email_verified".into(), json!(false));
    assert!(identity(&cfg(), &unverified)
        .unwrap_err()
        .contains("not verified"));
    let mut bad_groups = c.clone();
    bad_groups.insert("groups".into(), json!([1, 2]));
    assert!(identity(&cfg(), &bad_groups).is_err());
    let mut distributed = c.clone();
    distributed.remove("groups");
    assert!(identity(&cfg(), &distributed).unwrap().groups == vec!["system:authenticated"]);
    distributed.insert("_claim_names".into(), json!({"groups": "src1"}));
    assert!(identity(&cfg(), &distributed)
        .unwrap_err()
        .contains("distributed"));
    let mut with_req = cfg();
    with_req.required_claims = vec![("hd".into(), "example.com".into())];
    with_req.uid_claim = Some("sub".into());
    assert!(identity(&with_req, &c)
        .unwrap_err()
        .contains("required claim hd"));
    let mut hd = c.clone();
    hd.insert("hd".into(), json!("example.com"));
    assert_eq!(identity(&with_req, &hd).unwrap().uid, "1234");
    hd.insert("hd".into(), json!("other.com"));
    assert!(identity(&with_req, &hd)
        .unwrap_err()
        .contains("does not match"));
}

#[tokio::test]
async fn tokens_verify_against_cached_keys_only() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (key, jwk) = signing_key("k1");
    let (other, _) = signing_key("k1");
    let o = oidc_with(json!({"keys": [jwk]}));
    let good = sign(&key, "k1", &claims());
    assert!(o.claims_issuer(&good));
    assert_eq!(
        o.authenticate(&good).await.unwrap().unwrap().user,
        "jane@example.com"
    );

    let refuse = |why: &'static str, token: String| {
        let o = &o;
        async move {
            let e = o.authenticate(&token).await.expect("ours").unwrap_err();
            assert!(e.contains(why), "{why}: {e}");
        }
    };
    let mut c = claims();
    c["exp"] = json!(jiff::Timestamp::now().as_second() - 3600);
    refuse("expired", sign(&key, "k1", &c)).await;
    let mut c = claims();
    c["aud"] = json!(["someone-else"]);
    refuse("audience", sign(&key, "k1", &c)).await;
    let mut c = claims();
    c.as_object_mut().unwrap().remove("exp");
    refuse("exp", sign(&key, "k1", &c)).await;
    refuse("signature", sign(&other, "k1", &claims())).await;
    refuse("no ES256 key with id", sign(&key, "k2", &claims())).await;
    let hs = jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims(),
        &EncodingKey::from_secret(b"secret"),
    )
    .unwrap();
    refuse("not accepted", hs).await;
    // alg none: not even a header the library parses.
    let none = format!(
        "{}.{}.",
        URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#),
        URL_SAFE_NO_PAD.encode(claims().to_string())
    );
    refuse("malformed", none).await;
    // Another issuer's token is not ours; nor is garbage or a huge value.
    let mut c = claims();
    c["iss"] = json!("https://elsewhere.example");
    assert!(o.authenticate(&sign(&key, "k1", &c)).await.is_none());
    assert!(o.authenticate("garbage").await.is_none());
    let huge = format!("{good}{}", "A".repeat(MAX_TOKEN_LEN));
    assert!(o.authenticate(&huge).await.is_none());
}

#[test]
fn jwks_keeps_signature_keys_only() {
    let (_, ec) = signing_key("ec");
    let doc = json!({"keys": [
        ec,
        {"kty": "oct", "k": "c2VjcmV0", "kid": "hmac"},
        {"kty": "EC", "crv": "P-256", "use": "enc", "kid": "enc", "x": "AA", "y": "AA"},
        {"kty": "EC", "crv": "P-521", "kid": "big", "x": "AA", "y": "AA"},
        {"kty": "RSA", "kid": "broken"},
        "not a key",
    ]});
    let keys = keys::parse_jwks(&doc);
    assert_eq!(keys.len(), 1);
    assert!(keys[0].fits(Algorithm::ES256));
    assert!(!keys[0].fits(Algorithm::ES384) && !keys[0].fits(Algorithm::RS256));
    assert!(!keys[0].fits(Algorithm::HS256));
}
