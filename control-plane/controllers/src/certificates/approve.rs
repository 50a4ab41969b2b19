//! The CSR approver (upstream's `csrapproving`, `sarapprove.go`), plus the
//! node serving certificates that upstream leaves to an operator.
//!
//! A pending request is recognized, then approved only on evidence:
//!
//! - a node client certificate (signer `kube-apiserver-client-kubelet`,
//!   subject `system:node:<name>` / `system:nodes`, no names, client
//!   usages): approved when a SubjectAccessReview says the requester may
//!   `create` `certificatesigningrequests/selfnodeclient` (a renewal: the
//!   requester is that node) or `.../nodeclient` (a join: a bootstrap token
//!   bound to the `nodeclient` role). The default bindings grant these to
//!   `system:nodes` and to the tokens of `skiff-server token create`.
//! - a node serving certificate (signer `kubelet-serving`): upstream never
//!   auto-approves these, because the cluster CA also vouches for servers.
//!   Here one is approved when the requester is the node itself and every
//!   name is one its Node object reports (its name, Hostname / DNS
//!   addresses, InternalIP / ExternalIP addresses), and no address is the
//!   API server's (an endpoint or ClusterIP of `default/kubernetes`): a
//!   node can never obtain a certificate for the API server. (Peers' IPs
//!   are not refused: nodes may share one, as on a single test host; and
//!   the API server does not verify node serving certificates.)
//!
//! Nothing is ever denied (as upstream): what is not approved stays
//! pending for a person to decide (`kubectl certificate approve|deny`).

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Endpoints, Node, Service};
use kube::api::PostParams;
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use skiff_bootstrap::{csr, names};

use super::{has_condition, with_condition};
use crate::{Ctx, Error};

/// A recognized request that is not (yet) allowed is looked at again this
/// often: a binding may be created, a Node may report its addresses.
const RECHECK: Duration = Duration::from_secs(5);

pub async fn run(ctx: Ctx) -> Result<(), Error> {
    super::control(ctx, "approving", reconcile).await;
    Ok(())
}

/// What a pending request was recognized as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recognized {
    /// A node client certificate, requested by that node: a renewal.
    SelfNodeClient,
    /// A node client certificate requested by someone else (a bootstrap
    /// token joining the node).
    NodeClient,
    /// A node serving certificate requested by that node.
    NodeServing {
        node: String,
        dns: Vec<String>,
        ips: Vec<IpAddr>,
    },
}

impl Recognized {
    /// The `certificatesigningrequests/<subresource>` a SubjectAccessReview
    /// asks about (client certificates only).
    fn permission(&self) -> Option<&'static str> {
        match self {
            Recognized::SelfNodeClient => Some("selfnodeclient"),
            Recognized::NodeClient => Some("nodeclient"),
            Recognized::NodeServing { .. } => None,
        }
    }

    /// The approval message, as upstream words it for client certificates.
    fn message(&self) -> &'static str {
        match self {
            Recognized::SelfNodeClient => {
                "Auto approving self kubelet client certificate after SubjectAccessReview."
            }
            Recognized::NodeClient => {
                "Auto approving kubelet client certificate after SubjectAccessReview."
            }
            Recognized::NodeServing { .. } => {
                "Auto approving kubelet serving certificate: requested by the node for addresses its Node object reports."
            }
        }
    }
}

fn spec_strings(v: &Option<Vec<String>>) -> Vec<String> {
    v.clone().unwrap_or_default()
}

/// What a pending request is, if this approver knows it.
pub fn recognize(req: &CertificateSigningRequest) -> Option<Recognized> {
    let spec = &req.spec;
    let parsed = csr::parse_pem(&spec.request.0).ok()?;
    let usages = spec_strings(&spec.usages);
    let username = spec.username.as_deref().unwrap_or_default();
    match spec.signer_name.as_str() {
        names::SIGNER_KUBELET_CLIENT => {
            csr::node_client(&parsed, &usages).ok()?;
            if username == parsed.common_name {
                Some(Recognized::SelfNodeClient)
            } else {
                Some(Recognized::NodeClient)
            }
        }
        names::SIGNER_KUBELET_SERVING => {
            let node = csr::node_serving(&parsed, &usages).ok()?;
            let in_nodes = spec_strings(&spec.groups)
                .iter()
                .any(|g| g == names::NODES_GROUP);
            (username == parsed.common_name && in_nodes).then(|| Recognized::NodeServing {
                node: node.to_string(),
                dns: parsed.dns_names.clone(),
                ips: parsed.ip_addresses.clone(),
            })
        }
        _ => None,
    }
}

/// What a Node and the cluster say about the addresses a serving
/// certificate may name.
#[derive(Debug, Default)]
pub struct Addresses {
    /// The node's name and its Hostname / InternalDNS / ExternalDNS.
    pub names: HashSet<String>,
    /// The node's InternalIP / ExternalIP addresses.
    pub ips: HashSet<IpAddr>,
    /// The API server's endpoints and ClusterIP.
    pub forbidden_ips: HashSet<IpAddr>,
}

impl Addresses {
    /// Gather them for `node`; None when the Node does not exist yet.
    async fn of(client: &kube::Client, node: &str) -> Result<Option<Addresses>, Error> {
        let nodes: Api<Node> = Api::all(client.clone());
        let Some(n) = nodes.get_opt(node).await? else {
            return Ok(None);
        };
        let mut a = Addresses::default();
        a.names.insert(node.to_string());
        for addr in n.status.and_then(|s| s.addresses).unwrap_or_default() {
            match (addr.type_.as_str(), addr.address.parse::<IpAddr>()) {
                ("InternalIP" | "ExternalIP", Ok(ip)) => {
                    a.ips.insert(ip);
                }
                ("Hostname" | "InternalDNS" | "ExternalDNS", _) => {
                    a.names.insert(addr.address);
                }
                _ => {}
            }
        }
        let eps: Api<Endpoints> = Api::namespaced(client.clone(), "default");
        if let Some(ep) = eps.get_opt("kubernetes").await? {
            for sub in ep.subsets.unwrap_or_default() {
                for addr in sub.addresses.unwrap_or_default() {
                    if let Ok(ip) = addr.ip.parse() {
                        a.forbidden_ips.insert(ip);
                    }
                }
            }
        }
        let svcs: Api<Service> = Api::namespaced(client.clone(), "default");
        if let Some(svc) = svcs.get_opt("kubernetes").await? {
            for ip in svc.spec.and_then(|s| s.cluster_ips).unwrap_or_default() {
                if let Ok(ip) = ip.parse() {
                    a.forbidden_ips.insert(ip);
                }
            }
        }
        Ok(Some(a))
    }
}

/// Whether a serving certificate for `dns` and `ips` fits `a`; why not.
pub fn serving_names_allowed(dns: &[String], ips: &[IpAddr], a: &Addresses) -> Result<(), String> {
    if let Some(d) = dns.iter().find(|d| !a.names.contains(*d)) {
        return Err(format!("DNS name {d:?} is not an address of the Node"));
    }
    for ip in ips {
        if a.forbidden_ips.contains(ip) {
            return Err(format!("IP {ip} is the API server's"));
        }
        if !a.ips.contains(ip) {
            return Err(format!("IP {ip} is not an address of the Node"));
        }
    }
    Ok(())
}

async fn reconcile(req: Arc<CertificateSigningRequest>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    if has_condition(&req, "Approved") || has_condition(&req, "Denied") {
        return Ok(Action::await_change());
    }
    let Some(kind) = recognize(&req) else {
        return Ok(Action::await_change());
    };
    let name = req.name_any();
    let allowed = match (&kind, kind.permission()) {
        (_, Some(sub)) => match sar_allows(&ctx.client, &req, sub).await? {
            true => Ok(()),
            false => Err(format!(
                "the requester may not create certificatesigningrequests/{sub}"
            )),
        },
        (Recognized::NodeServing { node, dns, ips }, None) => {
            match Addresses::of(&ctx.client, node).await? {
                None => Err(format!("node {node:?} is not registered yet")),
                Some(a) => serving_names_allowed(dns, ips, &a),
            }
        }
        _ => Err("unrecognized".into()),
    };
    if let Err(why) = allowed {
        tracing::debug!(csr = %name, "not approving the CSR for now: {why}");
        return Ok(Action::requeue(RECHECK));
    }
    let approved = with_condition(&req, "Approved", "AutoApproved", kind.message());
    let api: Api<CertificateSigningRequest> = Api::all(ctx.client.clone());
    api.replace_subresource("approval", &name, &PostParams::default(), &approved)
        .await?;
    tracing::info!(csr = %name, requester = req.spec.username.as_deref().unwrap_or_default(), signer = %req.spec.signer_name, "approved the CSR: {}", kind.message());
    Ok(Action::await_change())
}

/// Whether the request's requester may create
/// `certificatesigningrequests/<sub>` (upstream's `authorize`).
async fn sar_allows(
    client: &kube::Client,
    req: &CertificateSigningRequest,
    sub: &str,
) -> Result<bool, Error> {
    let spec = &req.spec;
    let sar = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: spec.username.clone(),
            uid: spec.uid.clone(),
            groups: spec.groups.clone(),
            extra: spec.extra.clone(),
            resource_attributes: Some(ResourceAttributes {
                group: Some("certificates.k8s.io".into()),
                resource: Some("certificatesigningrequests".into()),
                subresource: Some(sub.into()),
                verb: Some("create".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let api: Api<SubjectAccessReview> = Api::all(client.clone());
    let answer = api.create(&PostParams::default(), &sar).await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

#[cfg(test)]
mod tests {
    use super::*;
    fn request(
        signer: &str,
        pem: &str,
        usages: &[&str],
        user: &str,
        groups: &[&str],
    ) -> CertificateSigningRequest {
        let mut r = super::super::test_request(signer, pem, usages);
        r.spec.username = Some(user.into());
        r.spec.groups = Some(groups.iter().map(|s| s.to_string()).collect());
        r
    }

    #[test]
    fn client_requests_are_joins_or_renewals() {
        let r = csr::new_node_client("n1").unwrap();
        let join = request(
            names::SIGNER_KUBELET_CLIENT,
            &r.csr_pem,
            csr::NODE_CLIENT_USAGES,
            "system:bootstrap:abcdef",
            &["system:bootstrappers"],
        );
        assert_eq!(recognize(&join), Some(Recognized::NodeClient));
        let renew = request(
            names::SIGNER_KUBELET_CLIENT,
            &r.csr_pem,
            csr::NODE_CLIENT_USAGES,
            "system:node:n1",
            &["system:nodes"],
        );
        assert_eq!(recognize(&renew), Some(Recognized::SelfNodeClient));
        let wrong_signer = request(
            names::SIGNER_API_CLIENT,
            &r.csr_pem,
            csr::NODE_CLIENT_USAGES,
            "system:node:n1",
            &["system:nodes"],
        );
        assert_eq!(recognize(&wrong_signer), None);
        let server_usage = request(
            names::SIGNER_KUBELET_CLIENT,
            &r.csr_pem,
            &["digital signature", "server auth"],
            "system:node:n1",
            &["system:nodes"],
        );
        assert_eq!(recognize(&server_usage), None);
    }

    #[test]
    fn serving_requests_only_from_the_node_for_its_own_addresses() {
        let ip: IpAddr = "198.18.0.7".parse().unwrap();
        let r = csr::new_node_serving("n1", &["n1".into()], &[ip]).unwrap();
        let own = request(
            names::SIGNER_KUBELET_SERVING,
            &r.csr_pem,
            csr::NODE_SERVING_USAGES,
            "system:node:n1",
            &["system:nodes"],
        );
        let Some(Recognized::NodeServing { node, dns, ips }) = recognize(&own) else {
            panic!("not recognized");
        };
        assert_eq!(node, "n1");
        let by_other = request(
            names::SIGNER_KUBELET_SERVING,
            &r.csr_pem,
            csr::NODE_SERVING_USAGES,
            "system:node:n2",
            &["system:nodes"],
        );
        assert_eq!(recognize(&by_other), None);
        let mut a = Addresses::default();
        a.names.insert("n1".into());
        assert!(
            serving_names_allowed(&dns, &ips, &a).is_err(),
            "IP not reported yet"
        );
        a.ips.insert(ip);
        assert!(serving_names_allowed(&dns, &ips, &a).is_ok());
        a.forbidden_ips.insert(ip);
        assert!(
            serving_names_allowed(&dns, &ips, &a).is_err(),
            "the API server's address"
        );
        assert!(serving_names_allowed(&["kubernetes".into()], &[], &a).is_err());
    }
}
