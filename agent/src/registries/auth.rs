//! The node's registry logins from the registries file, for pulls the
//! pod's own pull secrets do not log in to (as the kubelet's node-level
//! keyring). CRI takes one login per PullImage, so each is its own
//! attempt, and each names its registry (`server_address`): containerd
//! gives it to that host only, never to a mirror or registry it was not
//! written for.

use cri_proto::v1;

use super::config::{Login, Registries, ANY_REGISTRY};
use crate::runtime::credentials::repo_to_pull;

/// Docker Hub: the names images and logins use, and where containerd goes.
const HUB_NAMES: [&str; 3] = ["docker.io", "index.docker.io", "registry-1.docker.io"];
const HUB_URL: &str = "https://registry-1.docker.io";

/// The logins for pulling `image`: those of its mirror endpoints (tried
/// first by containerd), then that of its registry.
pub fn logins_for(registries: &Registries, image: &str) -> Vec<v1::AuthConfig> {
    let repo = repo_to_pull(image);
    let host = repo.split('/').next().unwrap_or_default();
    let hub = host == "docker.io";
    let endpoints = registries
        .mirrors
        .get(host)
        .or_else(|| registries.mirrors.get(ANY_REGISTRY))
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut out: Vec<v1::AuthConfig> = endpoints
        .iter()
        .filter_map(|e| {
            Some(auth(
                registries.configs.get(&e.host)?.auth.as_ref()?,
                &e.url,
            ))
        })
        .collect();
    let own = if hub {
        HUB_NAMES
            .iter()
            .find_map(|n| registries.configs.get(*n)?.auth.as_ref())
            .map(|l| auth(l, HUB_URL))
    } else {
        registries
            .configs
            .get(host)
            .and_then(|c| c.auth.as_ref())
            .map(|l| auth(l, &format!("https://{host}")))
    };
    out.extend(own);
    out
}

/// `server` is a URL: containerd 1.6 parses it without adding a scheme,
/// and compares its host with the one it is about to log in to.
fn auth(login: &Login, server: &str) -> v1::AuthConfig {
    let mut cri = match login {
        Login::Password(c) => c.to_cri(),
        Login::IdentityToken(t) => v1::AuthConfig {
            identity_token: t.clone(),
            ..Default::default()
        },
    };
    cri.server_address = server.to_string();
    cri
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::registries::config::parse;

    fn logins(yaml: &str, image: &str) -> Vec<(String, String)> {
        let r = parse(Path::new("r.yaml"), yaml).unwrap();
        logins_for(&r, image)
            .into_iter()
            .map(|a| {
                (
                    a.server_address,
                    format!("{}{}", a.username, a.identity_token),
                )
            })
            .collect()
    }

    #[test]
    fn mirror_logins_first_then_the_registry() {
        let yaml = "mirrors:\n  docker.io:\n    endpoint: [\"https://m1:5000\", \"https://m2\"]\nconfigs:\n  m2:\n    auth: {identitytoken: tok}\n  m1:5000:\n    auth: {username: one, password: p}\n  docker.io:\n    auth: {username: hub, password: p}\n";
        assert_eq!(
            logins(yaml, "busybox:1"),
            [
                ("https://m1:5000".to_string(), "one".to_string()),
                ("https://m2".into(), "tok".into()),
                ("https://registry-1.docker.io".into(), "hub".into()),
            ]
        );
        assert_eq!(logins(yaml, "quay.io/x/y"), []);
    }

    #[test]
    fn wildcard_mirror_and_plain_registry() {
        let yaml = "mirrors:\n  \"*\":\n    endpoint: [\"https://m\"]\nconfigs:\n  m:\n    auth: {username: mu, password: p}\n  r.example:5000:\n    auth: {username: ru, password: p}\n";
        assert_eq!(
            logins(yaml, "r.example:5000/team/app:v1"),
            [
                ("https://m".to_string(), "mu".to_string()),
                ("https://r.example:5000".into(), "ru".into())
            ]
        );
    }
}
