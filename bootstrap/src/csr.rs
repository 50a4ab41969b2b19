//! Node certificate requests (PKCS #10): built on the node, where the key
//! is generated and stays, and recognized on the control plane, where the
//! API server admits them, the approver approves them and the signers sign
//! them. The rules are upstream's `ValidateKubeletClientCSR` and
//! `ValidateKubeletServingCSR` (`k8s.io/api/certificates/v1` signers):
//!
//! - a node client certificate (signer `kube-apiserver-client-kubelet`):
//!   subject `CN=system:node:<name>, O=system:nodes`, no subject
//!   alternative names, usages `digital signature` and `client auth`
//!   (`key encipherment` allowed);
//! - a node serving certificate (signer `kubelet-serving`): the same
//!   subject, at least one DNS or IP name and no e-mail or URI, usages
//!   `digital signature` and `server auth` (`key encipherment` allowed).

use std::net::IpAddr;

use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, KeyPair,
    KeyUsagePurpose, SanType,
};
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::prelude::FromDer;

use crate::names;

pub const USAGE_DIGITAL_SIGNATURE: &str = "digital signature";
pub const USAGE_KEY_ENCIPHERMENT: &str = "key encipherment";
pub const USAGE_CLIENT_AUTH: &str = "client auth";
pub const USAGE_SERVER_AUTH: &str = "server auth";

/// `spec.usages` of a node's client certificate request (an ECDSA key
/// does no key encipherment, as the kubelet's since 1.27).
pub const NODE_CLIENT_USAGES: &[&str] = &[USAGE_DIGITAL_SIGNATURE, USAGE_CLIENT_AUTH];
/// `spec.usages` of a node's serving certificate request.
pub const NODE_SERVING_USAGES: &[&str] = &[USAGE_DIGITAL_SIGNATURE, USAGE_SERVER_AUTH];

/// What a node's client certificate may be used for.
const CLIENT_ALLOWED: &[&str] = &[
    USAGE_DIGITAL_SIGNATURE,
    USAGE_KEY_ENCIPHERMENT,
    USAGE_CLIENT_AUTH,
];
/// What a node's serving certificate may be used for.
const SERVING_ALLOWED: &[&str] = &[
    USAGE_DIGITAL_SIGNATURE,
    USAGE_KEY_ENCIPHERMENT,
    USAGE_SERVER_AUTH,
];

/// Why a request cannot be read or built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Not a PEM `CERTIFICATE REQUEST` block.
    #[error("spec.request is not a PEM-encoded CERTIFICATE REQUEST")]
    Pem,
    /// DER that is not PKCS #10.
    #[error("spec.request does not parse as a certificate request: {0}")]
    Parse(String),
    /// The request's signature is not made by its own key.
    #[error("the certificate request's signature does not verify against its public key")]
    Signature,
    /// rcgen failed generating a key or a request.
    #[error("generating the certificate request: {0}")]
    Generate(#[from] rcgen::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a request breaks its signer's rules, in words for a `Failed`
/// condition or a log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("subject organization must be exactly [{group}], not {0:?}", group = names::NODES_GROUP)]
    Organization(Vec<String>),
    #[error("subject common name must be {prefix}<node name>, not {0:?}", prefix = names::NODE_USER_PREFIX)]
    CommonName(String),
    #[error("a node client certificate carries no subject alternative names")]
    ClientNames,
    #[error("a node serving certificate needs at least one DNS name or IP address")]
    NoServingNames,
    #[error("a node serving certificate carries no e-mail or URI names")]
    OtherNames,
    #[error("usages must include {0:?}")]
    MissingUsage(&'static str),
    #[error("usage {0:?} is not allowed (allowed: {1:?})")]
    Usage(String, &'static [&'static str]),
}

/// What a certificate request asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request {
    pub common_name: String,
    pub organizations: Vec<String>,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<IpAddr>,
    /// E-mail addresses and URIs (node certificates carry none).
    pub other_names: usize,
}

/// Parse a PEM request and verify its self-signature.
///
/// # Errors
/// Not PEM, not PKCS #10, or a bad signature.
pub fn parse_pem(pem: &[u8]) -> Result<Request> {
    let (_, block) = x509_parser::pem::parse_x509_pem(pem).map_err(|_| Error::Pem)?;
    if block.label != "CERTIFICATE REQUEST" {
        return Err(Error::Pem);
    }
    parse_der(&block.contents)
}

/// Parse a DER request and verify its self-signature.
///
/// # Errors
/// Not PKCS #10, or a bad signature.
pub fn parse_der(der: &[u8]) -> Result<Request> {
    let (_, csr) = x509_parser::certification_request::X509CertificationRequest::from_der(der)
        .map_err(|e| Error::Parse(e.to_string()))?;
    csr.verify_signature().map_err(|_| Error::Signature)?;
    let subject = &csr.certification_request_info.subject;
    let mut req = Request {
        common_name: subject
            .iter_common_name()
            .next()
            .and_then(|c| c.as_str().ok())
            .unwrap_or_default()
            .to_string(),
        organizations: subject
            .iter_organization()
            .filter_map(|o| o.as_str().ok().map(String::from))
            .collect(),
        ..Request::default()
    };
    for ext in csr.requested_extensions().into_iter().flatten() {
        if let ParsedExtension::SubjectAlternativeName(san) = ext {
            for name in &san.general_names {
                match name {
                    GeneralName::DNSName(d) => req.dns_names.push(d.to_string()),
                    GeneralName::IPAddress(b) => match b.len() {
                        4 => req
                            .ip_addresses
                            .push(IpAddr::from(<[u8; 4]>::try_from(*b).unwrap_or_default())),
                        16 => req
                            .ip_addresses
                            .push(IpAddr::from(<[u8; 16]>::try_from(*b).unwrap_or_default())),
                        _ => req.other_names += 1,
                    },
                    _ => req.other_names += 1,
                }
            }
        }
    }
    Ok(req)
}

/// The node name of a `system:node:<name>` / `system:nodes` subject.
fn node_subject(req: &Request) -> Result<&str, Invalid> {
    if req.organizations != [names::NODES_GROUP] {
        return Err(Invalid::Organization(req.organizations.clone()));
    }
    req.common_name
        .strip_prefix(names::NODE_USER_PREFIX)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| Invalid::CommonName(req.common_name.clone()))
}

fn usages_within(
    usages: &[String],
    required: &[&'static str],
    allowed: &'static [&'static str],
) -> Result<(), Invalid> {
    for r in required {
        if !usages.iter().any(|u| u == r) {
            return Err(Invalid::MissingUsage(r));
        }
    }
    if let Some(u) = usages.iter().find(|u| !allowed.contains(&u.as_str())) {
        return Err(Invalid::Usage(u.clone(), allowed));
    }
    Ok(())
}

/// Usages fit for a client certificate (signer
/// `kube-apiserver-client`): client auth, nothing for serving.
///
/// # Errors
/// A missing `client auth` or a usage client certificates do not have.
pub fn client_usages(usages: &[String]) -> Result<(), Invalid> {
    usages_within(usages, &[USAGE_CLIENT_AUTH], CLIENT_ALLOWED)
}

/// The node a client certificate request is for, if it is a valid node
/// client request (signer `kube-apiserver-client-kubelet`).
///
/// # Errors
/// What makes it not one, in words for a `Failed` condition or a log.
pub fn node_client<'a>(req: &'a Request, usages: &[String]) -> Result<&'a str, Invalid> {
    let node = node_subject(req)?;
    if !req.dns_names.is_empty() || !req.ip_addresses.is_empty() || req.other_names > 0 {
        return Err(Invalid::ClientNames);
    }
    usages_within(
        usages,
        &[USAGE_DIGITAL_SIGNATURE, USAGE_CLIENT_AUTH],
        CLIENT_ALLOWED,
    )?;
    Ok(node)
}

/// The node a serving certificate request is for, if it is a valid node
/// serving request (signer `kubelet-serving`).
///
/// # Errors
/// What makes it not one.
pub fn node_serving<'a>(req: &'a Request, usages: &[String]) -> Result<&'a str, Invalid> {
    let node = node_subject(req)?;
    if req.dns_names.is_empty() && req.ip_addresses.is_empty() {
        return Err(Invalid::NoServingNames);
    }
    if req.other_names > 0 {
        return Err(Invalid::OtherNames);
    }
    usages_within(
        usages,
        &[USAGE_DIGITAL_SIGNATURE, USAGE_SERVER_AUTH],
        SERVING_ALLOWED,
    )?;
    Ok(node)
}

/// A private key made here and a request signed with it.
pub struct NewRequest {
    /// PKCS #8 PEM; it never leaves the node.
    pub key_pem: String,
    pub csr_pem: String,
}

fn node_params(node: &str) -> Result<CertificateParams> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, names::node_user(node));
    dn.push(DnType::OrganizationName, names::NODES_GROUP);
    params.distinguished_name = dn;
    Ok(params)
}

fn sign_request(params: CertificateParams) -> Result<NewRequest> {
    // ECDSA P-256, the kubelet's choice for its keys.
    let key = KeyPair::generate()?;
    let csr = params.serialize_request(&key)?;
    Ok(NewRequest {
        key_pem: key.serialize_pem(),
        csr_pem: csr.pem()?,
    })
}

/// A new key and client certificate request for node `node`.
///
/// # Errors
/// Key generation or signing failed.
pub fn new_node_client(node: &str) -> Result<NewRequest> {
    let mut params = node_params(node)?;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    sign_request(params)
}

/// A new key and serving certificate request for node `node`, valid for
/// `dns` names and `ips`.
///
/// # Errors
/// A DNS name rcgen refuses, or key generation or signing failed.
pub fn new_node_serving(node: &str, dns: &[String], ips: &[IpAddr]) -> Result<NewRequest> {
    let mut params = node_params(node)?;
    for d in dns {
        params
            .subject_alt_names
            .push(SanType::DnsName(d.clone().try_into()?));
    }
    for ip in ips {
        params.subject_alt_names.push(SanType::IpAddress(*ip));
    }
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    sign_request(params)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn node_requests_round_trip_and_are_recognized() {
        let c = new_node_client("n1").unwrap();
        assert!(c.key_pem.contains("PRIVATE KEY"));
        let req = parse_pem(c.csr_pem.as_bytes()).unwrap();
        assert_eq!(req.common_name, "system:node:n1");
        assert_eq!(req.organizations, vec!["system:nodes"]);
        assert_eq!(node_client(&req, &strings(NODE_CLIENT_USAGES)), Ok("n1"));
        assert!(node_client(&req, &strings(&["client auth"])).is_err());
        assert!(node_client(
            &req,
            &strings(&["digital signature", "client auth", "server auth"])
        )
        .is_err());
        assert!(
            node_serving(&req, &strings(NODE_SERVING_USAGES)).is_err(),
            "no SANs"
        );

        let ip: IpAddr = "198.18.0.7".parse().unwrap();
        let s = new_node_serving("n1", &["n1".into()], &[ip]).unwrap();
        let req = parse_pem(s.csr_pem.as_bytes()).unwrap();
        assert_eq!(req.dns_names, vec!["n1"]);
        assert_eq!(req.ip_addresses, vec![ip]);
        assert_eq!(node_serving(&req, &strings(NODE_SERVING_USAGES)), Ok("n1"));
        assert!(
            node_client(&req, &strings(NODE_CLIENT_USAGES)).is_err(),
            "SANs"
        );
    }

    #[test]
    fn foreign_subjects_and_garbage_are_refused() {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "admin");
        dn.push(DnType::OrganizationName, "system:masters");
        params.distinguished_name = dn;
        let r = sign_request(params).unwrap();
        let req = parse_pem(r.csr_pem.as_bytes()).unwrap();
        assert!(node_client(&req, &strings(NODE_CLIENT_USAGES)).is_err());
        assert!(matches!(parse_pem(b"not pem"), Err(Error::Pem)));
        let cert_pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        assert!(parse_pem(cert_pem.as_bytes()).is_err());
    }
}
