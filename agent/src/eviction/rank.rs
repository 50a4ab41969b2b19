//! Which pod goes first, and what its eviction says (upstream
//! `rankMemoryPressure`, `rankDiskPressureFunc`, `rankPIDPressure`,
//! `evictionMessage`): pods using more than they requested, then the
//! lowest priority, then the largest use beyond the request.

use std::cmp::Reverse;

use kube_util::quantity::binary_si;
use kube_util::resources::{pod_requests, Resources};

use super::thresholds::Signal;
use super::usage::PodUsage;

impl PodUsage {
    fn requests(&self) -> Resources {
        self.pod
            .spec
            .as_ref()
            .map(|s| pod_requests(s, false))
            .unwrap_or_default()
    }

    /// Use and request of the signal's resource (pids: neither is known
    /// per pod, so ranking is by priority alone).
    fn use_and_request(&self, signal: Signal) -> (u64, u64) {
        let r = self.requests();
        match signal {
            Signal::MemoryAvailable => (self.memory, r.memory.max(0) as u64),
            Signal::PidAvailable => (0, 0),
            _ => (self.storage, r.scalar("ephemeral-storage").max(0) as u64),
        }
    }

    fn priority(&self) -> i32 {
        self.pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
    }
}

/// Order `pods` for eviction under pressure on `signal`.
pub fn rank(signal: Signal, pods: &mut [PodUsage]) {
    pods.sort_by_key(|p| {
        let (used, requested) = p.use_and_request(signal);
        let exceeds = used > requested;
        (
            Reverse(exceeds),
            p.priority(),
            Reverse(used as i128 - requested as i128),
        )
    });
}

/// A quantity as upstream prints it: bytes in binary units, counts plain.
fn amount(signal: Signal, v: u64) -> String {
    match signal {
        Signal::MemoryAvailable | Signal::NodeFsAvailable | Signal::ImageFsAvailable => {
            binary_si(v)
        }
        _ => v.to_string(),
    }
}

/// The evicted pod's status message and event (upstream's wording,
/// trailing spaces included): the resource, the threshold and what was
/// available, and each container using more than it requested.
pub fn message(signal: Signal, threshold: u64, available: u64, usage: &PodUsage) -> String {
    let resource = signal.resource();
    let mut m = format!(
        "The node was low on resource: {resource}. Threshold quantity: {}, available: {}. ",
        amount(signal, threshold),
        amount(signal, available)
    );
    let containers = usage
        .pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    for c in &usage.containers {
        let Some(spec) = containers.iter().find(|s| s.name == c.name) else {
            continue;
        };
        let (used, key) = match signal {
            Signal::MemoryAvailable => (c.memory, "memory"),
            Signal::NodeFsAvailable | Signal::ImageFsAvailable => (c.storage, "ephemeral-storage"),
            _ => continue,
        };
        let requested = spec
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get(key))
            .map(|q| q.0.clone());
        let requested_bytes = requested
            .as_deref()
            .and_then(|q| kube_util::quantity::value(q).ok())
            .unwrap_or(0)
            .max(0) as u64;
        if requested_bytes < used {
            m += &format!(
                "Container {} was using {}, request is {}, has larger consumption of {resource}. ",
                c.name,
                binary_si(used),
                requested.unwrap_or_else(|| "0".into())
            );
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eviction::usage::ContainerUsage;
    use k8s_openapi::api::core::v1::Pod;

    fn pod(name: &str, priority: i32, memory_request: Option<&str>) -> Pod {
        let requests = memory_request
            .map(|m| format!(r#","resources":{{"requests":{{"memory":"{m}"}}}}"#))
            .unwrap_or_default();
        serde_json::from_str(&format!(
            r#"{{"metadata":{{"name":"{name}"}},"spec":{{"priority":{priority},"containers":[{{"name":"c"{requests}}}]}}}}"#
        ))
        .unwrap()
    }

    fn usage(p: Pod, memory: u64) -> PodUsage {
        PodUsage {
            pod: p,
            memory,
            storage: 0,
            containers: vec![ContainerUsage {
                name: "c".into(),
                memory,
                storage: 0,
            }],
            empty_dirs: Vec::new(),
        }
    }

    fn names(v: &[PodUsage]) -> Vec<&str> {
        v.iter()
            .map(|u| u.pod.metadata.name.as_deref().unwrap_or(""))
            .collect()
    }

    #[test]
    fn over_request_then_priority_then_excess() {
        let mib = 1 << 20;
        let mut pods = vec![
            // Within its request: last whatever its size.
            usage(pod("guaranteed", 0, Some("500Mi")), 400 * mib),
            usage(pod("important-hog", 1000, None), 300 * mib),
            usage(pod("small-hog", 0, None), 10 * mib),
            usage(pod("big-hog", 0, None), 200 * mib),
        ];
        rank(Signal::MemoryAvailable, &mut pods);
        assert_eq!(
            names(&pods),
            ["big-hog", "small-hog", "important-hog", "guaranteed"]
        );
    }

    #[test]
    fn message_in_upstreams_words() {
        let u = usage(pod("p", 0, None), 120 << 20);
        assert_eq!(
            message(Signal::MemoryAvailable, 100 << 20, 52 << 20, &u),
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 52Mi. Container c was using 120Mi, request is 0, has larger consumption of memory. "
        );
        let within = usage(pod("p", 0, Some("1Gi")), 120 << 20);
        assert_eq!(
            message(Signal::MemoryAvailable, 100 << 20, 52 << 20, &within),
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 52Mi. "
        );
    }
}
