//! Where a probe or hook connects: a port given by number or by the name
//! of one of the container's ports (upstream `probe.ResolveContainerPort`),
//! joined to a host the way Go's `net.JoinHostPort` does.

use k8s_openapi::api::core::v1::Container;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// The port cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PortError {
    /// A name that none of the container's ports has (and not a number).
    #[error("port {name:?} is not a number and container {container} has no port of that name")]
    UnknownName { name: String, container: String },
    /// Out of 1..=65535.
    #[error("invalid port number: {0}")]
    OutOfRange(i64),
}

/// The port number `port` means for container `c`. A name is looked up
/// in the container's ports; a string that names none but holds a number
/// is taken as that number, as upstream does.
///
/// # Errors
/// An unknown name, or a number outside 1..=65535.
pub fn resolve(port: &IntOrString, c: &Container) -> Result<u16, PortError> {
    let n: i64 = match port {
        IntOrString::Int(n) => i64::from(*n),
        IntOrString::String(name) => {
            let named = c
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .map(|p| i64::from(p.container_port));
            match named.or_else(|| name.parse().ok()) {
                Some(n) => n,
                None => {
                    return Err(PortError::UnknownName {
                        name: name.clone(),
                        container: c.name.clone(),
                    })
                }
            }
        }
    };
    u16::try_from(n)
        .ok()
        .filter(|p| *p > 0)
        .ok_or(PortError::OutOfRange(n))
}

/// `host:port`, with brackets around an IPv6 address.
pub fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c() -> Container {
        serde_saphyr::from_str(
            "{name: web, ports: [{name: http, containerPort: 8080}, {containerPort: 9000}]}",
        )
        .unwrap()
    }

    #[test]
    fn ports_by_number_and_name() {
        assert_eq!(resolve(&IntOrString::Int(80), &c()), Ok(80));
        assert_eq!(resolve(&IntOrString::String("http".into()), &c()), Ok(8080));
        // A number spelled as a string is still a number.
        assert_eq!(resolve(&IntOrString::String("81".into()), &c()), Ok(81));
        assert!(matches!(
            resolve(&IntOrString::String("grpc".into()), &c()),
            Err(PortError::UnknownName { .. })
        ));
        assert_eq!(
            resolve(&IntOrString::Int(0), &c()),
            Err(PortError::OutOfRange(0))
        );
        assert_eq!(
            resolve(&IntOrString::Int(70000), &c()),
            Err(PortError::OutOfRange(70000))
        );
    }

    #[test]
    fn hosts_join_like_go() {
        assert_eq!(join_host_port("198.18.0.2", 80), "198.18.0.2:80");
        assert_eq!(join_host_port("fd00::2", 80), "[fd00::2]:80");
    }
}
