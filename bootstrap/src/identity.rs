//! The user a verified client certificate names: CN is the user, each O a
//! group (upstream's `CommonNameUserConversion`). The API server reads
//! agents' certificates and the agent reads the API server's this way, so
//! both take it from here.

/// The user and groups in a client certificate (DER) that TLS already
/// verified; `None` if it does not parse or names no user (an empty CN
/// authenticates no one, as upstream).
pub fn from_cert(der: &[u8]) -> Option<(String, Vec<String>)> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let user = subject.iter_common_name().next()?.as_str().ok()?;
    if user.is_empty() {
        return None;
    }
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(String::from))
        .collect();
    Some((user.to_string(), groups))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(cn: &str, orgs: &[&str]) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        for o in orgs {
            params
                .distinguished_name
                .push(rcgen::DnType::OrganizationName, *o);
        }
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn common_name_and_organizations() {
        // (rcgen keeps one value per attribute type: one O here.)
        let (user, groups) = from_cert(&cert("system:node:n1", &["system:nodes"])).unwrap();
        assert_eq!(user, "system:node:n1");
        assert_eq!(groups, ["system:nodes"]);
    }

    #[test]
    fn no_user_no_identity() {
        assert_eq!(from_cert(&cert("", &["system:masters"])), None);
        assert_eq!(from_cert(b"not a certificate"), None);
    }
}
