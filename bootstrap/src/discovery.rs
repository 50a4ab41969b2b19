//! Finding the cluster CA before there is any trust (upstream's
//! "discovery", k3s's `/cacerts`): the bundle is read over TLS without
//! verifying the server, then accepted only if its hash is the one the
//! join token carries. Nothing secret goes out on that unverified
//! connection, so a man in the middle learns nothing and cannot make the
//! node trust another CA.

use std::time::Duration;

use crate::names;
use crate::JoinToken;

/// Why the CA could not be discovered.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Not an `https://host:port` URL.
    #[error("--server {0:?} is not an https:// URL (e.g. https://10.0.0.1:6443)")]
    BadServer(String),
    /// Nothing answered in time, or TLS failed.
    #[error("cannot reach the API server at {server}: {source} (check --server, the address and port, and that skiff-server runs)")]
    Unreachable {
        server: String,
        #[source]
        source: reqwest::Error,
    },
    /// It answered, but not with a CA bundle.
    #[error("{server} answered {status} for {path}: it does not look like a skiff API server")]
    NotServed {
        server: String,
        path: &'static str,
        status: u16,
    },
    /// The bundle is not the one the token pins.
    #[error("the CA certificate served by {server} does not match the join token's CA hash (token: {expected}, served: {served}); no credentials were sent. Check that the token is for this cluster, or that nothing intercepts the connection")]
    Mismatch {
        server: String,
        expected: String,
        served: String,
    },
}

/// `server` without a trailing slash, checked to be https.
///
/// # Errors
/// [`Error::BadServer`].
pub fn normalize(server: &str) -> Result<String, Error> {
    let s = server.trim().trim_end_matches('/');
    let ok = s
        .strip_prefix("https://")
        .is_some_and(|rest| !rest.is_empty() && !rest.contains('/'));
    if !ok {
        return Err(Error::BadServer(server.to_string()));
    }
    Ok(s.to_string())
}

/// Fetch the CA bundle from `server` (unverified), and accept it only if
/// `token` pins it.
///
/// # Errors
/// The server cannot be reached, serves no bundle, or serves another CA.
pub async fn fetch_pinned_ca(
    server: &str,
    token: &JoinToken,
    timeout: Duration,
) -> Result<String, Error> {
    let unreachable = |source| Error::Unreachable {
        server: server.to_string(),
        source,
    };
    // Verification is impossible before the CA is known; the pin below is
    // what makes the answer trustworthy.
    let http = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .no_proxy()
        .timeout(timeout)
        .build()
        .map_err(unreachable)?;
    let resp = http
        .get(format!("{server}{}", names::CA_PATH))
        .send()
        .await
        .map_err(unreachable)?;
    let status = resp.status().as_u16();
    if status != 200 {
        return Err(Error::NotServed {
            server: server.to_string(),
            path: names::CA_PATH,
            status,
        });
    }
    let body = resp.bytes().await.map_err(unreachable)?;
    if !token.pins(&body) {
        return Err(Error::Mismatch {
            server: server.to_string(),
            expected: token.ca_hash.clone(),
            served: crate::token::ca_hash(&body),
        });
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_must_be_https_urls() {
        assert_eq!(
            normalize("https://10.0.0.1:6443/").unwrap(),
            "https://10.0.0.1:6443"
        );
        assert!(normalize("http://10.0.0.1:6443").is_err());
        assert!(normalize("10.0.0.1:6443").is_err());
        assert!(normalize("https://h:1/api").is_err());
        assert!(normalize("https://").is_err());
    }
}
