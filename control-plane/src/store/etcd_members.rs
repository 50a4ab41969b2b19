//! The etcd cluster behind the store, as an operator sees it
//! (`skiff-server etcd status | remove`): each member's raft state, as
//! `etcdctl endpoint status --cluster` shows it, and removing a member
//! so the cluster can shrink.

use std::time::Duration;

use etcd_client::{Client, ConnectOptions};

use super::etcd::{etcd_err, Tls};
use super::{Error, Result};

/// One member, as it reports itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    pub id: u64,
    pub client_urls: Vec<String>,
    pub peer_urls: Vec<String>,
    /// What the member answered, or why it did not.
    pub status: std::result::Result<Status, String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub leader: bool,
    pub raft_term: u64,
    pub raft_index: u64,
    /// Bytes of the member's database file.
    pub db_size: i64,
    pub version: String,
    /// Alarms and errors the member reports (`NOSPACE`, ...).
    pub errors: Vec<String>,
}

fn options() -> ConnectOptions {
    ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_timeout(Duration::from_secs(10))
}

async fn connect(endpoints: &[String], tls: Option<&Tls>) -> Result<Client> {
    let mut opts = options();
    if let Some(tls) = tls {
        opts = opts.with_tls(tls.options()?);
    }
    Client::connect(endpoints, Some(opts))
        .await
        .map_err(etcd_err(format!("connect to {}", endpoints.join(","))))
}

/// Whether the member at `endpoints` serves a linearizable read (the
/// check `etcdctl endpoint health` makes): it runs and its cluster has a
/// quorum.
pub async fn member_ready(endpoints: &[String], tls: Option<&Tls>) -> bool {
    let ask = async {
        let mut c = connect(endpoints, tls).await.ok()?;
        c.get("health", None).await.ok()
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(5), ask).await,
        Ok(Some(_))
    )
}

/// Add a member named `name` at `peer_url` (unless one with that peer
/// URL is there already, as after a join that failed half-way): every
/// member's `NAME=PEER_URL`, joined by commas, as etcd's
/// `--initial-cluster` for the new member.
///
/// # Errors
/// The cluster cannot be reached or refuses the member (no quorum).
pub async fn add(
    endpoints: &[String],
    tls: Option<&Tls>,
    name: &str,
    peer_url: &str,
) -> Result<String> {
    let mut c = connect(endpoints, tls).await?;
    let list = c
        .member_list()
        .await
        .map_err(etcd_err("list etcd members"))?;
    let known = list
        .members()
        .iter()
        .any(|m| m.peer_urls().iter().any(|u| u == peer_url));
    let members = if known {
        list.members().to_vec()
    } else {
        let added = c
            .member_add([peer_url], None)
            .await
            .map_err(etcd_err(format!("add etcd member {name:?} at {peer_url}")))?;
        added.member_list().to_vec()
    };
    let mut entries = Vec::new();
    for m in &members {
        // A member not started yet has no name: the one joining is ours.
        let is_new = m.peer_urls().iter().any(|u| u == peer_url);
        let member_name = if is_new { name } else { m.name() };
        if member_name.is_empty() {
            continue;
        }
        for u in m.peer_urls() {
            entries.push(format!("{member_name}={u}"));
        }
    }
    Ok(entries.join(","))
}

/// Every member of the cluster `endpoints` reach, each asked for its own
/// status (a member that does not answer is listed with why).
///
/// # Errors
/// No endpoint answers the member list.
pub async fn status(endpoints: &[String], tls: Option<&Tls>) -> Result<Vec<Member>> {
    let mut c = connect(endpoints, tls).await?;
    let list = c
        .member_list()
        .await
        .map_err(etcd_err("list etcd members"))?;
    let mut out = Vec::new();
    for m in list.members() {
        let status = match m.client_urls() {
            [] => Err("not started yet (no client URL)".to_string()),
            urls => member_status(urls, tls).await.map_err(|e| e.to_string()),
        };
        out.push(Member {
            name: m.name().to_string(),
            id: m.id(),
            client_urls: m.client_urls().to_vec(),
            peer_urls: m.peer_urls().to_vec(),
            status,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

async fn member_status(urls: &[String], tls: Option<&Tls>) -> Result<Status> {
    let mut c = connect(urls, tls).await?;
    let s = c
        .status()
        .await
        .map_err(etcd_err(format!("status of {}", urls.join(","))))?;
    let me = s.header().map(|h| h.member_id());
    Ok(Status {
        leader: s.leader() != 0 && me == Some(s.leader()),
        raft_term: s.raft_term(),
        raft_index: s.raft_index(),
        db_size: s.db_size(),
        version: s.version().to_string(),
        errors: s.errors().to_vec(),
    })
}

/// What [`try_remove`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Removal {
    /// Removed; its id.
    Removed(u64),
    /// No member has that name; the names there are, sorted.
    NoSuchMember(Vec<String>),
    /// It is the cluster's only member: left, as removing it would lose
    /// the cluster.
    LastMember,
}

/// Remove the member called `name` from the cluster when it is there
/// and not the last one.
///
/// # Errors
/// The cluster cannot be reached, or etcd refuses.
pub async fn try_remove(endpoints: &[String], tls: Option<&Tls>, name: &str) -> Result<Removal> {
    let mut c = connect(endpoints, tls).await?;
    let list = c
        .member_list()
        .await
        .map_err(etcd_err("list etcd members"))?;
    let members = list.members();
    let Some(m) = members.iter().find(|m| m.name() == name) else {
        let mut names: Vec<String> = members.iter().map(|m| m.name().to_string()).collect();
        names.sort_unstable();
        return Ok(Removal::NoSuchMember(names));
    };
    if members.len() == 1 {
        return Ok(Removal::LastMember);
    }
    let id = m.id();
    c.member_remove(id)
        .await
        .map_err(etcd_err(format!("remove etcd member {name:?}")))?;
    Ok(Removal::Removed(id))
}

/// Remove the member called `name` from the cluster; returns its id.
///
/// # Errors
/// There is no such member, it is the last one, or etcd refuses.
pub async fn remove(endpoints: &[String], tls: Option<&Tls>, name: &str) -> Result<u64> {
    match try_remove(endpoints, tls, name).await? {
        Removal::Removed(id) => Ok(id),
        Removal::NoSuchMember(names) => Err(Error::backend(
            "etcd",
            format!(
                "no etcd member named {name:?} (members: {})",
                names.join(", ")
            ),
        )),
        Removal::LastMember => Err(Error::backend(
            "etcd",
            format!("{name:?} is the cluster's only member: removing it would lose the cluster"),
        )),
    }
}
