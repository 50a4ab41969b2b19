//! CertificateSigningRequests of joining and joined nodes: a bootstrap
//! token (`system:bootstrappers`) and a node (`system:nodes`) may create
//! CSRs and read the ones they created, and nothing else about CSRs.
//!
//! Upstream grants bootstrappers `get/list/watch` on every CSR through the
//! `system:node-bootstrapper` role; here a bootstrap token cannot read
//! another node's requests. What a created CSR may ask for is checked once
//! the object is known ([`admit_create`]).

use serde_json::Value;
use skiff_bootstrap::{csr, names};

use super::node::Decision;
use super::{Attributes, Identity};
use crate::store::Store;

/// The group and resource of CSRs.
pub const GROUP: &str = "certificates.k8s.io";
pub const RESOURCE: &str = "certificatesigningrequests";

/// Whether `id` is one this authorizer speaks for.
fn applies(id: &Identity) -> bool {
    id.in_group(names::BOOTSTRAP_GROUP) || id.node_name().is_some()
}

/// Allow creating CSRs and getting one's own; no opinion otherwise.
pub async fn authorize(id: &Identity, a: &Attributes, store: &dyn Store) -> Decision {
    if !applies(id) || !a.resource_request || a.group != GROUP || a.resource != RESOURCE {
        return Decision::NoOpinion;
    }
    if !a.subresource.is_empty() {
        return Decision::NoOpinion;
    }
    match a.verb.as_str() {
        "create" => Decision::Allow,
        "get" if !a.name.is_empty() => {
            let key = format!("/registry/{GROUP}/{RESOURCE}/{}", a.name);
            let owner = match store.get(&key).await {
                Ok(Some(kv)) => serde_json::from_slice::<Value>(&kv.value)
                    .ok()
                    .and_then(|v| v["spec"]["username"].as_str().map(String::from)),
                // A missing CSR: let the handler answer 404 to its creator
                // and everyone else alike (nothing is revealed by it).
                Ok(None) => return Decision::Allow,
                Err(_) => None,
            };
            if owner.as_deref() == Some(id.user.as_str()) {
                Decision::Allow
            } else {
                Decision::Deny(format!(
                    "{:?} may only read the certificate signing requests it created",
                    id.user
                ))
            }
        }
        _ => Decision::NoOpinion,
    }
}

/// What a bootstrapper or node may ask for in a new CSR (`obj`, with
/// `spec.username` already set to the requester): a bootstrap token only a
/// node client certificate, a node only certificates of its own name.
///
/// # Errors
/// The 403 message.
pub fn admit_create(id: &Identity, obj: &Value) -> Result<(), String> {
    if !applies(id) {
        return Ok(());
    }
    let signer = obj["spec"]["signerName"].as_str().unwrap_or_default();
    let pem = decode_request(obj).unwrap_or_default();
    let cn = csr::parse_pem(&pem)
        .map(|r| r.common_name)
        .unwrap_or_default();
    if let Some(node) = id.node_name() {
        let allowed = [names::SIGNER_KUBELET_CLIENT, names::SIGNER_KUBELET_SERVING];
        if !allowed.contains(&signer) {
            return Err(format!(
                "node {node:?} may only request certificates from the signers {allowed:?}"
            ));
        }
        if cn != names::node_user(node) {
            return Err(format!(
                "node {node:?} may only request certificates for {:?}, not {cn:?}",
                names::node_user(node)
            ));
        }
        return Ok(());
    }
    if signer != names::SIGNER_KUBELET_CLIENT {
        return Err(format!(
            "a bootstrap token may only request a node client certificate (signer {:?})",
            names::SIGNER_KUBELET_CLIENT
        ));
    }
    Ok(())
}

/// `spec.request`, base64-decoded (the PEM the client sent).
pub fn decode_request(obj: &Value) -> Option<Vec<u8>> {
    use base64::Engine;
    let b64 = obj["spec"]["request"].as_str()?;
    base64::engine::general_purpose::STANDARD.decode(b64).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn csr_obj(signer: &str, node: &str) -> Value {
        use base64::Engine;
        let r = csr::new_node_client(node).unwrap();
        json!({"spec": {"signerName": signer, "request": base64::engine::general_purpose::STANDARD.encode(r.csr_pem)}})
    }

    #[test]
    fn nodes_and_bootstrappers_ask_only_for_what_is_theirs() {
        let node = Identity::new("system:node:n1", vec!["system:nodes".into()]);
        let boot = Identity::new(
            "system:bootstrap:abcdef",
            vec!["system:bootstrappers".into()],
        );
        let admin = Identity::new("alice", vec![]);
        let own = csr_obj(names::SIGNER_KUBELET_CLIENT, "n1");
        let other = csr_obj(names::SIGNER_KUBELET_CLIENT, "n2");
        assert!(admit_create(&node, &own).is_ok());
        assert!(admit_create(&node, &other).is_err());
        assert!(admit_create(&node, &csr_obj(names::SIGNER_API_CLIENT, "n1")).is_err());
        assert!(admit_create(&boot, &other).is_ok());
        assert!(admit_create(&boot, &csr_obj(names::SIGNER_KUBELET_SERVING, "n2")).is_err());
        assert!(admit_create(&admin, &csr_obj("example.com/x", "n9")).is_ok());
    }
}
