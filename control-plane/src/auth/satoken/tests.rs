use super::*;

fn settings(dir: &Path) -> Settings {
    Settings {
        issuers: vec![],
        api_audiences: vec![],
        signing_key_file: dir.join("sa.key"),
        key_files: vec![],
        max_expiration: None,
    }
}

fn request() -> Request {
    Request {
        namespace: "ns".into(),
        service_account: "robot".into(),
        service_account_uid: "sa-uid".into(),
        audiences: vec![DEFAULT_ISSUER.into()],
        expiration: Duration::from_secs(3607),
        bound: Some(("Pod".into(), "web".into(), "pod-uid".into())),
        node: Some(("n1".into(), "node-uid".into())),
    }
}

const NOW: i64 = 1_800_000_000;

#[test]
fn signed_tokens_verify_with_upstreams_identity() {
    let dir = tempfile::tempdir().unwrap();
    let t = Tokens::load(&settings(dir.path())).unwrap();
    let (token, exp) = t.sign(&request(), NOW).unwrap();
    assert_eq!(exp, NOW + 3607);
    assert!(t.claims_issuer(&token));
    let v = t.verify(&token, NOW + 10).unwrap();
    let id = v.identity();
    assert_eq!(id.user, "system:serviceaccount:ns:robot");
    assert_eq!(id.uid, "sa-uid");
    for g in [
        "system:serviceaccounts",
        "system:serviceaccounts:ns",
        "system:authenticated",
    ] {
        assert!(id.in_group(g), "{g}");
    }
    assert_eq!(id.extra["authentication.kubernetes.io/pod-name"], ["web"]);
    assert_eq!(
        id.extra["authentication.kubernetes.io/pod-uid"],
        ["pod-uid"]
    );
    assert_eq!(id.extra["authentication.kubernetes.io/node-name"], ["n1"]);
    assert!(id.extra["authentication.kubernetes.io/credential-id"][0].starts_with("JTI="));
}

#[test]
fn the_key_is_kept_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let (token, _) = Tokens::load(&settings(dir.path()))
        .unwrap()
        .sign(&request(), NOW)
        .unwrap();
    let again = Tokens::load(&settings(dir.path())).unwrap();
    assert!(again.verify(&token, NOW).is_ok());
    let mode = std::fs::metadata(dir.path().join("sa.key")).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(mode.permissions().mode() & 0o777, 0o600);
}

#[test]
fn expired_early_wrong_audience_and_wrong_issuer_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let t = Tokens::load(&settings(dir.path())).unwrap();
    let (token, _) = t.sign(&request(), NOW).unwrap();
    assert!(t
        .verify(&token, NOW + 3607 + 61)
        .unwrap_err()
        .contains("expired"));
    assert!(t
        .verify(&token, NOW - 120)
        .unwrap_err()
        .contains("not valid yet"));

    let mut other_aud = request();
    other_aud.audiences = vec!["vault".into()];
    let (token, _) = t.sign(&other_aud, NOW).unwrap();
    let v = t.verify(&token, NOW).unwrap();
    assert!(t
        .accepted_audiences(&v, None)
        .unwrap_err()
        .contains("audiences"));
    let vault = ["vault".to_string(), "other".to_string()];
    assert_eq!(t.accepted_audiences(&v, Some(&vault)).unwrap(), ["vault"]);

    let mut s = settings(dir.path());
    s.issuers = vec!["https://elsewhere".into()];
    let elsewhere = Tokens::load(&s).unwrap();
    let mut r = request();
    r.audiences = vec!["https://elsewhere".into()];
    let (token, _) = elsewhere.sign(&r, NOW).unwrap();
    // Same key, another issuer: not ours.
    assert!(!t.claims_issuer(&token));
    assert!(t.verify(&token, NOW).unwrap_err().contains("issuer"));
}

#[test]
fn forged_tokens_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let t = Tokens::load(&settings(dir.path())).unwrap();
    let (token, _) = t.sign(&request(), NOW).unwrap();
    let parts: Vec<&str> = token.split('.').collect();

    // Another key signs the same claims.
    let other_dir = tempfile::tempdir().unwrap();
    let other = Tokens::load(&settings(other_dir.path())).unwrap();
    let (forged, _) = other.sign(&request(), NOW).unwrap();
    assert!(t.verify(&forged, NOW).is_err());

    // The payload changed under the signature.
    let mut claims: Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
    claims["kubernetes.io"]["serviceaccount"]["name"] = json!("admin");
    claims["sub"] = json!("system:serviceaccount:ns:admin");
    let payload = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims).unwrap());
    let tampered = format!("{}.{payload}.{}", parts[0], parts[2]);
    assert!(t.verify(&tampered, NOW).is_err());

    // alg none and an HMAC keyed with the public JWK.
    let none = URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#);
    assert!(t.verify(&format!("{none}.{}.", parts[1]), NOW).is_err());
    let hs_key = serde_json::to_vec(&t.jwks()).unwrap();
    let hs = jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(&hs_key),
    )
    .unwrap();
    assert!(t.verify(&hs, NOW).is_err());

    // Garbage and oversize values.
    for bad in ["", "a.b.c", "....", "not a jwt"] {
        assert!(t.verify(bad, NOW).is_err(), "{bad:?}");
    }
    assert!(t.verify(&"a".repeat(1 << 20), NOW).is_err());
    assert_eq!(unverified_issuer(&"a.".repeat(1 << 19)), None);
}

#[test]
fn a_previous_key_still_verifies_when_listed() {
    let old_dir = tempfile::tempdir().unwrap();
    let old = Tokens::load(&settings(old_dir.path())).unwrap();
    let (token, _) = old.sign(&request(), NOW).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let mut s = settings(dir.path());
    assert!(Tokens::load(&s).unwrap().verify(&token, NOW).is_err());
    s.key_files = vec![old_dir.path().join("sa.key")];
    let t = Tokens::load(&s).unwrap();
    assert!(t.verify(&token, NOW).is_ok());
    assert_eq!(t.jwks()["keys"].as_array().unwrap().len(), 2);
}

#[test]
fn legacy_tokens_carry_their_secret() {
    let dir = tempfile::tempdir().unwrap();
    let t = Tokens::load(&settings(dir.path())).unwrap();
    let token = t
        .sign_legacy("ns", "robot-token", "robot", "sa-uid")
        .unwrap();
    assert!(t.claims_issuer(&token));
    let v = t.verify(&token, NOW).unwrap();
    assert_eq!(v.legacy_secret.as_deref(), Some("robot-token"));
    assert_eq!(v.identity().user, "system:serviceaccount:ns:robot");
    assert_eq!(v.expires, None);
    assert!(t.accepted_audiences(&v, None).is_ok());
    assert!(t
        .accepted_audiences(&v, Some(&["vault".to_string()]))
        .is_err());
}

#[test]
fn discovery_documents() {
    let dir = tempfile::tempdir().unwrap();
    let t = Tokens::load(&settings(dir.path())).unwrap();
    let doc = t.openid_configuration().unwrap();
    assert_eq!(doc["issuer"], DEFAULT_ISSUER);
    assert_eq!(doc["jwks_uri"], format!("{DEFAULT_ISSUER}/openid/v1/jwks"));
    let key = &t.jwks()["keys"][0];
    assert_eq!(key["kty"], "EC");
    assert_eq!(key["crv"], "P-256");
    assert_eq!(key["kid"], t.signing_kid);

    let mut s = settings(dir.path());
    s.issuers = vec!["not-a-url".into()];
    assert!(Tokens::load(&s).unwrap().openid_configuration().is_none());
}

#[test]
fn unreadable_key_files_are_refused_with_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = settings(dir.path());
    let bad = dir.path().join("bad.pem");
    std::fs::write(
        &bad,
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    s.key_files = vec![bad];
    let e = Tokens::load(&s).err().unwrap().to_string();
    assert!(e.contains("bad.pem"), "{e}");
}

#[test]
fn long_requests_are_capped() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = settings(dir.path());
    s.max_expiration = Some(Duration::from_secs(7200));
    let t = Tokens::load(&s).unwrap();
    assert_eq!(t.capped(Duration::from_secs(86400)).as_secs(), 7200);
    assert_eq!(t.capped(Duration::from_secs(600)).as_secs(), 600);
}
