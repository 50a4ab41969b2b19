//! Kubernetes quantities to the Linux numbers CRI wants, with the
//! kubelet's formulas (`MilliCPUToShares`, `MilliCPUToQuota`). Parsing is
//! kube-util's exact integer quantities, as the scheduler's.

use k8s_openapi::api::core::v1::Container;
use kube_util::quantity;

pub const CPU_PERIOD_US: i64 = 100_000;
const MIN_SHARES: i64 = 2;
const MAX_SHARES: i64 = 262_144;
const MIN_QUOTA_US: i64 = 1_000;

/// CPU in millicores, rounded up as the apiserver does; `None` for text
/// that is not a quantity or is negative.
pub fn parse_cpu_millis(s: &str) -> Option<i64> {
    quantity::milli_value(s).ok().filter(|v| *v >= 0)
}

/// Bytes, rounded up; `None` for text that is not a quantity or is
/// negative.
pub fn parse_bytes(s: &str) -> Option<i64> {
    quantity::value(s).ok().filter(|v| *v >= 0)
}

/// A container's request or limit for one resource. Requests default to
/// limits when only limits are given (apiserver defaulting).
pub fn get(c: &Container, which: Which, resource: &str) -> Option<String> {
    let res = c.resources.as_ref()?;
    let from = |m: &Option<
        std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >| {
        m.as_ref()
            .and_then(|m| m.get(resource))
            .map(|q| q.0.clone())
    };
    match which {
        Which::Limit => from(&res.limits),
        Which::Request => from(&res.requests).or_else(|| from(&res.limits)),
    }
}

#[derive(Debug, Clone, Copy)]
pub enum Which {
    Request,
    Limit,
}

/// cgroup cpu.shares for a request (kubelet `MilliCPUToShares`).
pub fn cpu_shares(request_millis: Option<i64>) -> i64 {
    match request_millis {
        None | Some(0) => MIN_SHARES,
        Some(m) => (m * 1024 / 1000).clamp(MIN_SHARES, MAX_SHARES),
    }
}

/// CFS quota for a limit (kubelet `MilliCPUToQuota`); 0 means unlimited.
pub fn cpu_quota(limit_millis: Option<i64>) -> i64 {
    match limit_millis {
        None | Some(0) => 0,
        Some(m) => (m * CPU_PERIOD_US / 1000).max(MIN_QUOTA_US),
    }
}

/// The cgroup settings for a CPU request and limit (millicores) and a
/// memory limit (bytes), as the kubelet's `calculateLinuxResources`.
pub fn linux_resources(
    cpu_request: Option<i64>,
    cpu_limit: Option<i64>,
    memory_limit: Option<i64>,
) -> cri_proto::v1::LinuxContainerResources {
    let quota = cpu_quota(cpu_limit);
    cri_proto::v1::LinuxContainerResources {
        cpu_period: if quota > 0 { CPU_PERIOD_US } else { 0 },
        cpu_quota: quota,
        cpu_shares: cpu_shares(cpu_request),
        memory_limit_in_bytes: memory_limit.unwrap_or(0),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(parse_cpu_millis("100m"), Some(100));
        assert_eq!(parse_cpu_millis("0.5"), Some(500));
        assert_eq!(parse_cpu_millis("2"), Some(2000));
        assert_eq!(parse_bytes("64Mi"), Some(64 << 20));
        assert_eq!(parse_bytes("1G"), Some(1_000_000_000));
        assert_eq!(parse_bytes("1e3"), Some(1000));
        assert_eq!(parse_bytes("12abc"), None);
        assert_eq!(parse_bytes("-1"), None);
    }

    #[test]
    fn kubelet_formulas() {
        assert_eq!(cpu_shares(None), 2);
        assert_eq!(cpu_shares(Some(100)), 102);
        assert_eq!(cpu_shares(Some(1000)), 1024);
        assert_eq!(cpu_quota(Some(250)), 25_000);
        assert_eq!(cpu_quota(Some(5)), 1_000);
        assert_eq!(cpu_quota(None), 0);
    }
}
