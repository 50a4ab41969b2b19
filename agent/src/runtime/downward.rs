//! The downward API's resource values: a container's requests and limits
//! as the strings env vars (`valueFrom.resourceFieldRef`, in
//! [`super::container`]) and downwardAPI volume files
//! ([`crate::volumes::projection`]) carry. One place for both, so that the
//! volumes do not depend on container configuration.

use k8s_openapi::api::core::v1::Container;
use kube_util::quantity;

use super::resources::{self, Which};

/// A resourceFieldRef that cannot be resolved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Not `limits.NAME` or `requests.NAME`.
    #[error("unsupported resourceFieldRef {0:?}")]
    Unsupported(String),
}

/// A container's resource for env and downwardAPI volumes.
pub fn resource_field_ref(
    c: &Container,
    resource: &str,
    divisor: Option<&str>,
) -> Result<String, Error> {
    let (which, name) = resource
        .split_once('.')
        .ok_or_else(|| Error::Unsupported(resource.to_string()))?;
    let which = match which {
        "limits" => Which::Limit,
        "requests" => Which::Request,
        _ => return Err(Error::Unsupported(resource.to_string())),
    };
    // Exact milli-units for both, so `1Mi` divides `64Mi` to exactly 64
    // (upstream: ceil(value / divisor) on the Quantity's integers).
    let milli = |q: &str| quantity::scaled(q, -3).ok();
    let value = resources::get(c, which, name).and_then(|q| milli(&q));
    let divisor = divisor.and_then(milli).filter(|d| *d > 0).unwrap_or(1000);
    // Unset limits read as node allocatable upstream; 0 is the honest
    // answer until the node's capacity is wired in.
    Ok(value.map(|v| div_ceil(v, divisor)).unwrap_or(0).to_string())
}

/// `v / d` rounded towards positive infinity (d > 0).
fn div_ceil(v: i128, d: i128) -> i128 {
    let q = v / d;
    if v % d > 0 {
        q + 1
    } else {
        q
    }
}
