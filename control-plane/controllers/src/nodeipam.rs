//! Node IPAM, as upstream's range allocator: every Node without
//! `spec.podCIDR` gets a free `/node_cidr_mask_size` subnet of
//! `cluster_cidr`; nodes that already have one occupy it; a deleted node's
//! subnet is free again. IPv4 only.
//!
//! The allocation is recomputed from the cached Nodes on every change
//! (level-triggered: a restart loses nothing), plus what this process
//! wrote and the cache has not shown yet.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use kube_util::events::{Recorder, Reporter};
use serde_json::json;

use crate::cidrset::{Cidr, CidrSet};
use crate::{Ctx, Error};

/// Resync when nothing happens (a lost write is retried at the latest then).
const RESYNC: Duration = Duration::from_secs(60);
/// Retry sooner after a failed write.
const RETRY: Duration = Duration::from_secs(1);

pub async fn run(ctx: Ctx) -> Result<(), Error> {
    let Some(range) = ctx.config.cluster_cidr.clone() else {
        tracing::info!("node IPAM disabled: no --cluster-cidr");
        return std::future::pending().await;
    };
    let cluster = Cidr::parse(&range).map_err(|e| Error::Config(format!("--cluster-cidr: {e}")))?;
    // Validate the mask once, up front, so a bad flag fails loudly.
    CidrSet::new(cluster, ctx.config.node_cidr_mask_size)
        .map_err(|e| Error::Config(format!("--node-cidr-mask-size: {e}")))?;
    let api: Api<Node> = Api::all(ctx.client.clone());
    let nodes = ctx.informers.get::<Node>();
    let mut changes = nodes.subscribe();
    nodes
        .ready()
        .await
        .map_err(|e| Error::Config(e.to_string()))?;
    let mut ipam = Ipam {
        api,
        events: Recorder::new(ctx.client.clone(), Reporter::new("node-ipam-controller")),
        cluster,
        mask: ctx.config.node_cidr_mask_size,
        written: HashMap::new(),
        warned: HashSet::new(),
    };
    loop {
        let ok = ipam.sync(&nodes.list()).await;
        let wait = if ok { RESYNC } else { RETRY };
        tokio::select! {
            _ = changes.changed() => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

struct Ipam {
    api: Api<Node>,
    events: Recorder,
    cluster: Cidr,
    mask: u8,
    /// Subnets patched onto nodes (by name: uid, subnet) that the cache
    /// may not show yet; dropped once it does or the node is gone.
    written: HashMap<String, (String, Cidr)>,
    /// Nodes told CIDRNotAvailable, so the event is sent once per node.
    warned: HashSet<String>,
}

/// What one pass decided.
#[derive(Debug, Default, PartialEq)]
struct Plan {
    /// (node name, subnet to assign).
    assign: Vec<(String, Cidr)>,
    /// Nodes left without a subnet: the range is exhausted.
    exhausted: Vec<String>,
}

/// The podCIDRs a node holds (podCIDRs, else podCIDR), parsed.
fn node_cidrs(n: &Node) -> Vec<Cidr> {
    let spec = n.spec.as_ref();
    let list: Vec<&String> = spec
        .and_then(|s| s.pod_cidrs.as_ref())
        .map(|v| v.iter().collect())
        .unwrap_or_default();
    let list = if list.is_empty() {
        spec.and_then(|s| s.pod_cidr.as_ref()).into_iter().collect()
    } else {
        list
    };
    list.into_iter()
        .filter_map(|s| Cidr::parse(s).ok())
        .collect()
}

fn has_cidr(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.pod_cidr.as_deref())
        .is_some_and(|c| !c.is_empty())
}

/// Decide subnets for nodes lacking one. `written` holds assignments the
/// cache does not show yet (name -> (uid, subnet)); entries that are
/// stale (node gone, recreated, or now showing a podCIDR) are removed.
fn plan(
    set: &mut CidrSet,
    nodes: &[Arc<Node>],
    written: &mut HashMap<String, (String, Cidr)>,
) -> Plan {
    let by_name: HashMap<String, &Node> = nodes.iter().map(|n| (n.name_any(), &**n)).collect();
    written.retain(|name, (uid, _)| {
        by_name
            .get(name)
            .is_some_and(|n| n.uid().as_deref() == Some(uid.as_str()) && !has_cidr(n))
    });
    for n in nodes {
        for c in node_cidrs(n) {
            set.occupy(c);
        }
    }
    for (_, c) in written.values() {
        set.occupy(*c);
    }
    // Oldest first, so that on exhaustion the newest nodes wait.
    let mut waiting: Vec<&Arc<Node>> = nodes
        .iter()
        .filter(|n| !has_cidr(n) && !written.contains_key(&n.name_any()))
        .filter(|n| n.metadata.deletion_timestamp.is_none())
        .collect();
    waiting.sort_by_key(|n| (n.creation_timestamp().map(|t| t.0), n.name_any()));
    let mut out = Plan::default();
    for n in waiting {
        match set.allocate() {
            Some(c) => out.assign.push((n.name_any(), c)),
            None => out.exhausted.push(n.name_any()),
        }
    }
    out
}

impl Ipam {
    /// One pass over all nodes; false if a write failed (retry soon).
    async fn sync(&mut self, nodes: &[Arc<Node>]) -> bool {
        let Ok(mut set) = CidrSet::new(self.cluster, self.mask) else {
            return false; // validated in run()
        };
        let p = plan(&mut set, nodes, &mut self.written);
        let by_name: HashMap<String, &Arc<Node>> =
            nodes.iter().map(|n| (n.name_any(), n)).collect();
        self.warned.retain(|name| {
            by_name
                .get(name)
                .is_some_and(|n| !has_cidr(n) && !p.assign.iter().any(|(a, _)| a == name))
        });
        let mut ok = true;
        for (name, cidr) in p.assign {
            let Some(node) = by_name.get(&name) else {
                continue;
            };
            match self.assign(node, cidr).await {
                Ok(()) => {
                    tracing::info!(node = %name, pod_cidr = %cidr, "assigned podCIDR");
                    let uid = node.uid().unwrap_or_default();
                    self.written.insert(name, (uid, cidr));
                }
                Err(e) => {
                    // 409: the node changed under us (maybe got a podCIDR
                    // elsewhere); the next pass sees the new state.
                    tracing::warn!(node = %name, pod_cidr = %cidr, "assigning podCIDR failed: {e}");
                    ok = false;
                }
            }
        }
        for name in p.exhausted {
            if !self.warned.insert(name.clone()) {
                continue;
            }
            let Some(node) = by_name.get(&name) else {
                continue;
            };
            tracing::warn!(node = %name, cluster_cidr = %self.cluster, "no podCIDR left for node");
            self.events.normal(
                &***node,
                "CIDRNotAvailable",
                format!("Node {name} status is now: CIDRNotAvailable"),
            );
        }
        ok
    }

    /// Patch the subnet onto the node, only if it is still the version we
    /// planned with (a resourceVersion precondition).
    async fn assign(&self, node: &Node, cidr: Cidr) -> Result<(), kube::Error> {
        let c = cidr.to_string();
        let patch = json!({
            "metadata": {"resourceVersion": node.resource_version()},
            "spec": {"podCIDR": c, "podCIDRs": [c]},
        });
        self.api
            .patch(
                &node.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, uid: &str, cidr: Option<&str>) -> Arc<Node> {
        let mut n: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "uid": uid},
            "spec": {},
        }))
        .unwrap();
        if let Some(c) = cidr {
            n.spec.as_mut().unwrap().pod_cidr = Some(c.into());
        }
        Arc::new(n)
    }

    #[test]
    fn plan_skips_taken_and_written_subnets() {
        let mut set = CidrSet::new(Cidr::parse("10.0.0.0/22").unwrap(), 24).unwrap();
        let nodes = vec![
            node("a", "1", Some("10.0.1.0/24")),
            node("b", "2", None),
            node("c", "3", None),
            node("d", "4", None),
        ];
        let mut written = HashMap::new();
        written.insert(
            "b".to_string(),
            ("2".to_string(), Cidr::parse("10.0.0.0/24").unwrap()),
        );
        // A stale entry for a recreated node is dropped.
        written.insert(
            "c".to_string(),
            ("old".to_string(), Cidr::parse("10.0.3.0/24").unwrap()),
        );
        let p = plan(&mut set, &nodes, &mut written);
        let got: Vec<(String, String)> = p
            .assign
            .iter()
            .map(|(n, c)| (n.clone(), c.to_string()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("c".to_string(), "10.0.2.0/24".to_string()),
                ("d".to_string(), "10.0.3.0/24".to_string())
            ]
        );
        assert!(p.exhausted.is_empty());
        assert_eq!(written.len(), 1);
    }

    #[test]
    fn plan_reports_exhaustion() {
        let mut set = CidrSet::new(Cidr::parse("10.0.0.0/24").unwrap(), 24).unwrap();
        let nodes = vec![node("a", "1", Some("10.0.0.0/24")), node("b", "2", None)];
        let p = plan(&mut set, &nodes, &mut HashMap::new());
        assert!(p.assign.is_empty());
        assert_eq!(p.exhausted, vec!["b".to_string()]);
    }
}
