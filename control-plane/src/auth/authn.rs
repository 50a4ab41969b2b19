//! Authentication: client certificates signed by the cluster CA (CN = user,
//! O = groups) and bearer tokens from a static token file. The chain of
//! token authenticators is [`crate::apiserver::authenticate`].

use std::collections::HashMap;
use std::path::Path;

/// Authentication errors (all at start-up: a bad request is just anonymous).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading token file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("token file {path} line {line}: {why}")]
    Parse {
        path: String,
        line: usize,
        why: String,
    },
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Identity {
    pub user: String,
    pub uid: String,
    pub groups: Vec<String>,
    /// Extra attributes (a ServiceAccount token's pod name and uid, as
    /// upstream's `authentication.kubernetes.io/pod-name`), shown by
    /// reviews and passed to webhooks.
    pub extra: std::collections::BTreeMap<String, Vec<String>>,
}

impl Identity {
    pub fn new(user: impl Into<String>, groups: Vec<String>) -> Self {
        let mut groups = groups;
        // Every authenticated caller is in system:authenticated (upstream adds
        // it too), which is what the default discovery bindings grant to.
        if !groups.iter().any(|g| g == "system:authenticated") {
            groups.push("system:authenticated".into());
        }
        Identity {
            user: user.into(),
            uid: String::new(),
            groups,
            extra: Default::default(),
        }
    }
    /// A request without credentials where one is allowed: upstream's
    /// `system:anonymous` in `system:unauthenticated` (and not in
    /// `system:authenticated`).
    pub fn anonymous() -> Self {
        Identity {
            user: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
            ..Identity::default()
        }
    }
    pub fn in_group(&self, g: &str) -> bool {
        self.groups.iter().any(|x| x == g)
    }
    /// `Some(name)` for a node identity (`system:node:NAME` in `system:nodes`).
    pub fn node_name(&self) -> Option<&str> {
        if self.in_group("system:nodes") {
            self.user.strip_prefix("system:node:")
        } else {
            None
        }
    }
}

/// Identity of a verified client certificate (DER).
pub fn identity_from_cert(der: &[u8]) -> Option<Identity> {
    let (user, groups) = skiff_bootstrap::identity::from_cert(der)?;
    Some(Identity::new(user, groups))
}

/// Static bearer tokens (`--token-auth-file`).
#[derive(Debug, Clone, Default)]
pub struct Authenticator {
    tokens: HashMap<String, Identity>,
}

impl Authenticator {
    /// Load a CSV file of `token,user,uid,"group1,group2"` lines.
    ///
    /// # Errors
    /// The file cannot be read or a line has fewer than three fields.
    pub fn from_token_file(path: &Path) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.display().to_string(),
            source,
        })?;
        let mut tokens = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fields = split_csv(line);
            if fields.len() < 3 || fields[0].is_empty() || fields[1].is_empty() {
                return Err(Error::Parse {
                    path: path.display().to_string(),
                    line: i + 1,
                    why: "expected token,user,uid[,\"group1,group2\"]".into(),
                });
            }
            let groups = fields
                .get(3)
                .map(|g| {
                    g.split(',')
                        .map(|s| s.trim().to_string())
                        .filter(|s| !s.is_empty())
                        .collect()
                })
                .unwrap_or_default();
            let mut id = Identity::new(fields[1].clone(), groups);
            id.uid = fields[2].clone();
            tokens.insert(fields[0].clone(), id);
        }
        Ok(Authenticator { tokens })
    }

    /// The identity of a known token.
    pub fn authenticate_token(&self, token: &str) -> Option<Identity> {
        self.tokens.get(token).cloned()
    }
}

/// The token of an `Authorization: Bearer` header value.
pub fn bearer_token(header: &str) -> Option<&str> {
    let token = header
        .strip_prefix("Bearer ")
        .or_else(|| header.strip_prefix("bearer "))?
        .trim();
    (!token.is_empty()).then_some(token)
}

/// Split one CSV line, honouring double quotes.
fn split_csv(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => out.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    out.push(cur);
    out.into_iter().map(|s| s.trim().to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("tokens.csv");
        std::fs::write(&p, "abc,alice,1,\"dev,ops\"\nxyz,bob,2\n").unwrap();
        let a = Authenticator::from_token_file(&p).unwrap();
        let id = a.authenticate_token("abc").unwrap();
        assert_eq!(id.user, "alice");
        assert!(id.in_group("dev") && id.in_group("ops") && id.in_group("system:authenticated"));
        assert_eq!(a.authenticate_token("xyz").unwrap().user, "bob");
        assert!(a.authenticate_token("nope").is_none());
        assert_eq!(bearer_token("Bearer abc "), Some("abc"));
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("Basic abc"), None);
    }
}
