use super::*;

fn flags() -> Options {
    Options {
        issuer_url: Some("https://issuer.example".into()),
        client_id: Some("skiff".into()),
        ..Default::default()
    }
}

fn refused(r: Result<Vec<JwtIssuer>>) -> String {
    r.expect_err("refused").to_string()
}

#[test]
fn flags_follow_upstream_defaults() {
    let i = &flags().load(&[]).unwrap()[0];
    assert_eq!(i.audiences, vec!["skiff"]);
    assert_eq!(i.algorithms, vec![Algorithm::RS256]);
    assert_eq!(
        i.username,
        PrefixedClaim {
            claim: "sub".into(),
            prefix: "https://issuer.example#".into()
        }
    );
    assert!(i.groups.is_none());
    let mut o = flags();
    o.username_claim = Some("email".into());
    assert_eq!(o.load(&[]).unwrap()[0].username.prefix, "");
    o.username_claim = Some("name".into());
    o.username_prefix = Some("-".into());
    assert_eq!(o.load(&[]).unwrap()[0].username.prefix, "");
    o.username_prefix = Some("oidc:".into());
    o.groups_claim = Some("groups".into());
    o.groups_prefix = Some("g:".into());
    o.required_claims = vec!["hd=example.com".into()];
    o.signing_algs = vec!["ES256".into(), "PS256".into()];
    let i = &o.load(&[]).unwrap()[0];
    assert_eq!(i.username.prefix, "oidc:");
    assert_eq!(i.groups.as_ref().unwrap().prefix, "g:");
    assert_eq!(i.required_claims, vec![("hd".into(), "example.com".into())]);
    assert_eq!(i.algorithms, vec![Algorithm::ES256, Algorithm::PS256]);
    assert!(Options::default().load(&[]).unwrap().is_empty());
}

#[test]
fn bad_flags_are_refused_by_name() {
    let with = |f: fn(&mut Options)| {
        let mut o = flags();
        f(&mut o);
        refused(o.load(&[]))
    };
    assert!(with(|o| o.client_id = None).contains("oidc-client-id"));
    assert!(with(|o| o.issuer_url = Some("http://x".into())).contains("https"));
    assert!(with(|o| o.signing_algs = vec!["HS256".into()]).contains("oidc-signing-algs"));
    assert!(with(|o| o.signing_algs = vec!["none".into()]).contains("oidc-signing-algs"));
    assert!(with(|o| o.signing_algs = vec!["ES512".into()]).contains("ES512"));
    assert!(with(|o| o.groups_prefix = Some("g:".into())).contains("oidc-groups-prefix"));
    assert!(with(|o| o.required_claims = vec!["nokey".into()]).contains("oidc-required-claim"));
    assert!(with(|o| o.ca_file = Some("/nonexistent/ca.pem".into())).contains("/nonexistent"));
    let o = Options {
        groups_claim: Some("groups".into()),
        ..Default::default()
    };
    assert!(refused(o.load(&[])).contains("oidc-issuer-url"));
    let o = Options {
        authentication_config: Some("/x.yaml".into()),
        ..flags()
    };
    assert!(refused(o.load(&[])).contains("mutually exclusive"));
    let e = refused(flags().load(&["https://issuer.example".into()]));
    assert!(e.contains("service account issuer"), "{e}");
}

const GOOD: &str = r#"
apiVersion: apiserver.config.k8s.io/v1beta1
kind: AuthenticationConfiguration
jwt:
- issuer:
    url: https://one.example
    audiences: [a, b]
    audienceMatchPolicy: MatchAny
  claimValidationRules:
  - claim: hd
    requiredValue: example.com
  claimMappings:
    username: {claim: email, prefix: ""}
    groups: {claim: roles, prefix: "one:"}
    uid: {claim: sub}
- issuer:
    url: https://two.example
    discoveryURL: https://internal.example/two/.well-known/openid-configuration
    audiences: [two]
  claimMappings:
    username: {claim: sub, prefix: "two:"}
"#;

#[test]
fn the_file_maps_claims() {
    let v = from_str(GOOD).unwrap();
    assert_eq!(v.len(), 2);
    assert_eq!(v[0].audiences, vec!["a", "b"]);
    assert_eq!(v[0].username.claim, "email");
    assert_eq!(v[0].groups.as_ref().unwrap().claim, "roles");
    assert_eq!(v[0].uid_claim.as_deref(), Some("sub"));
    assert_eq!(
        v[0].required_claims,
        vec![("hd".into(), "example.com".into())]
    );
    assert_eq!(v[0].algorithms, ASYMMETRIC.to_vec());
    assert!(v[1].discovery_url.is_some() && v[1].groups.is_none());
    let v1 = GOOD.replace("v1beta1", "v1");
    assert_eq!(from_str(&v1).unwrap().len(), 2);
}

#[test]
fn the_file_refuses_what_it_does_not_honour() {
    let cases = [
        (
            "username: {claim: sub, prefix: \"two:\"}",
            "username: {expression: 'claims.sub'}",
            "jwt[1].claimMappings.username.expression",
        ),
        (
            "username: {claim: sub, prefix: \"two:\"}",
            "username: {claim: sub}",
            "jwt[1].claimMappings.username.prefix",
        ),
        (
            "uid: {claim: sub}",
            "uid: {expression: claims.sub}",
            "jwt[0].claimMappings.uid.expression",
        ),
        (
            "uid: {claim: sub}",
            "extra: [{key: a.io/x, valueExpression: claims.x}]",
            "jwt[0].claimMappings.extra",
        ),
        (
            "- claim: hd\n    requiredValue: example.com",
            "- expression: claims.hd == 'x'",
            "jwt[0].claimValidationRules[0].expression",
        ),
        (
            "    audienceMatchPolicy: MatchAny\n",
            "",
            "jwt[0].issuer.audienceMatchPolicy",
        ),
        (
            "url: https://two.example",
            "url: https://one.example",
            "jwt[1].issuer.url",
        ),
        (
            "url: https://two.example",
            "url: http://two.example",
            "jwt[1].issuer.url",
        ),
        (
            "audiences: [two]",
            "audiences: []",
            "jwt[1].issuer.audiences",
        ),
        (
            "kind: AuthenticationConfiguration",
            "kind: AuthenticationConfiguration\nanonymous: {enabled: true}",
            "anonymous",
        ),
        (
            "    audiences: [two]",
            "    audiences: [two]\n    egressSelectorType: cluster",
            "egressSelectorType",
        ),
        (
            "    audiences: [two]",
            "    audiences: [two]\n    certificateAuthority: nope",
            "certificateAuthority",
        ),
    ];
    for (from, to, field) in cases {
        assert!(GOOD.contains(from), "{from}");
        let e = refused(from_str(&GOOD.replacen(from, to, 1)));
        assert!(e.contains(field), "{field}: {e}");
    }
    let text = format!(
        "{GOOD}  userValidationRules:\n  - expression: \"!user.username.startsWith('system:')\"\n"
    );
    assert!(refused(from_str(&text)).contains("jwt[1].userValidationRules"));
    assert!(
        refused(from_str(&GOOD.replace("claimMappings:", "claimMapping:"))).contains("parsing")
    );
}
