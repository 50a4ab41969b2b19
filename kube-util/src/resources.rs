//! Resource amounts: what a pod requests (upstream's `PodRequests`
//! formula with init containers, sidecars and overhead) and what a node
//! offers (`status.allocatable`), in exact integers (see [`crate::quantity`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Node, PodSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::quantity;

/// Requests of containers without a CPU request count as this many
/// millicores when scheduling scores nodes (upstream `DefaultMilliCPURequest`), so that
/// best-effort pods still spread.
pub const DEFAULT_MILLI_CPU_REQUEST: i64 = 100;
/// Likewise for memory (upstream `DefaultMemoryRequest`, 200 MiB).
pub const DEFAULT_MEMORY_REQUEST: i64 = 200 * 1024 * 1024;

/// Amounts of resources: a pod's requests, a node's allocatable, or the
/// sum of the requests of the pods on a node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resources {
    /// Millicores.
    pub cpu: i64,
    /// Bytes.
    pub memory: i64,
    /// Every other resource (ephemeral-storage, hugepages-*, extended
    /// resources) in base units, sorted by name. Usually empty, so a
    /// Vec beats a map.
    pub scalars: Vec<(String, i64)>,
}

impl Resources {
    /// Read a resource list (`requests`, `limits`, `allocatable`).
    /// `pods` is not a resource a pod requests and is left out.
    pub fn from_list(list: &BTreeMap<String, Quantity>) -> Resources {
        let mut r = Resources::default();
        for (name, q) in list {
            r.set(name, &q.0);
        }
        r
    }

    /// An unparsable amount counts as none: validation refuses those, and
    /// a pod the API stored before that must not stop scheduling.
    fn set(&mut self, name: &str, q: &str) {
        match name {
            "cpu" => self.cpu = quantity::milli_value(q).unwrap_or(0),
            "memory" => self.memory = quantity::value(q).unwrap_or(0),
            "pods" => {}
            _ => self.set_scalar(name, quantity::value(q).unwrap_or(0)),
        }
    }

    /// The amount of a scalar resource (0 when absent).
    pub fn scalar(&self, name: &str) -> i64 {
        self.scalars
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0, |(_, v)| *v)
    }

    fn set_scalar(&mut self, name: &str, v: i64) {
        match self.scalars.binary_search_by(|(n, _)| n.as_str().cmp(name)) {
            Ok(i) => self.scalars[i].1 = v,
            Err(i) => self.scalars.insert(i, (name.to_string(), v)),
        }
    }

    /// Add `other` to these amounts.
    pub fn add(&mut self, other: &Resources) {
        self.cpu += other.cpu;
        self.memory += other.memory;
        for (n, v) in &other.scalars {
            let cur = self.scalar(n);
            self.set_scalar(n, cur + v);
        }
    }

    /// Subtract `other` from these amounts (removing a pod from a node).
    pub fn sub(&mut self, other: &Resources) {
        self.cpu -= other.cpu;
        self.memory -= other.memory;
        for (n, v) in &other.scalars {
            let cur = self.scalar(n);
            self.set_scalar(n, cur - v);
        }
    }

    /// Raise each amount to at least the one in `other`.
    pub fn max_with(&mut self, other: &Resources) {
        self.cpu = self.cpu.max(other.cpu);
        self.memory = self.memory.max(other.memory);
        for (n, v) in &other.scalars {
            let cur = self.scalar(n);
            if *v > cur {
                self.set_scalar(n, *v);
            }
        }
    }

    /// True when nothing is requested at all.
    pub fn is_zero(&self) -> bool {
        self.cpu == 0 && self.memory == 0 && self.scalars.iter().all(|(_, v)| *v == 0)
    }
}

/// A container's requests. Where only a limit is given for a resource,
/// the request is the limit (apiserver defaulting, which a client may
/// not have gone through). With `non_zero`, an absent CPU or memory
/// request counts as the scoring defaults above.
fn container_requests(c: &Container, non_zero: bool) -> Resources {
    let mut r = Resources::default();
    let (requests, limits) = c.resources.as_ref().map_or((None, None), |res| {
        (res.requests.as_ref(), res.limits.as_ref())
    });
    if let Some(limits) = limits {
        for (name, q) in limits {
            if requests.is_none_or(|req| !req.contains_key(name)) {
                r.set(name, &q.0);
            }
        }
    }
    if let Some(requests) = requests {
        for (name, q) in requests {
            r.set(name, &q.0);
        }
    }
    if non_zero {
        let has = |n: &str| {
            requests.is_some_and(|m| m.contains_key(n)) || limits.is_some_and(|m| m.contains_key(n))
        };
        if !has("cpu") {
            r.cpu = DEFAULT_MILLI_CPU_REQUEST;
        }
        if !has("memory") {
            r.memory = DEFAULT_MEMORY_REQUEST;
        }
    }
    r
}

fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// What a pod requests of a node, as upstream's `PodRequests`: the sum of
/// the app containers, raised to the largest init container (an init
/// container runs beside the sidecars started before it), plus the
/// pod overhead. With `non_zero`, absent CPU/memory requests count as
/// the scoring defaults (upstream's `NonZeroRequested`).
pub fn pod_requests(spec: &PodSpec, non_zero: bool) -> Resources {
    let mut total = Resources::default();
    for c in &spec.containers {
        total.add(&container_requests(c, non_zero));
    }
    let mut sidecars = Resources::default();
    let mut init_max = Resources::default();
    for c in spec.init_containers.iter().flatten() {
        let req = container_requests(c, non_zero);
        if is_sidecar(c) {
            // Sidecars keep running beside the app containers.
            total.add(&req);
            sidecars.add(&req);
            init_max.max_with(&sidecars);
        } else {
            let mut running = req;
            running.add(&sidecars);
            init_max.max_with(&running);
        }
    }
    total.max_with(&init_max);
    if let Some(overhead) = &spec.overhead {
        total.add(&Resources::from_list(overhead));
    }
    total
}

/// What a node offers to pods: `status.allocatable` (or `capacity` when a
/// node reports no allocatable), and the number of pods it takes.
pub fn node_allocatable(node: &Node) -> (Resources, i64) {
    let status = node.status.as_ref();
    let list = status.and_then(|s| s.allocatable.as_ref().or(s.capacity.as_ref()));
    match list {
        Some(list) => {
            let pods = list
                .get("pods")
                .and_then(|q| quantity::value(&q.0).ok())
                .unwrap_or(0);
            (Resources::from_list(list), pods)
        }
        None => (Resources::default(), 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ResourceRequirements;

    fn list(items: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
        items
            .iter()
            .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
            .collect()
    }

    fn container(requests: &[(&str, &str)], sidecar: bool) -> Container {
        Container {
            name: "c".into(),
            resources: Some(ResourceRequirements {
                requests: Some(list(requests)),
                ..Default::default()
            }),
            restart_policy: sidecar.then(|| "Always".to_string()),
            ..Default::default()
        }
    }

    #[test]
    fn app_containers_add_up() {
        let spec = PodSpec {
            containers: vec![
                container(&[("cpu", "100m"), ("memory", "64Mi")], false),
                container(&[("cpu", "250m"), ("nvidia.com/gpu", "1")], false),
            ],
            ..Default::default()
        };
        let r = pod_requests(&spec, false);
        assert_eq!(r.cpu, 350);
        assert_eq!(r.memory, 64 << 20);
        assert_eq!(r.scalar("nvidia.com/gpu"), 1);
    }

    #[test]
    fn init_containers_count_as_their_max() {
        let spec = PodSpec {
            containers: vec![container(&[("cpu", "100m")], false)],
            init_containers: Some(vec![
                container(&[("cpu", "500m")], false),
                container(&[("cpu", "200m")], false),
            ]),
            overhead: Some(list(&[("cpu", "10m")])),
            ..Default::default()
        };
        assert_eq!(pod_requests(&spec, false).cpu, 510);
    }

    #[test]
    fn sidecars_run_beside_later_init_containers_and_the_app() {
        let spec = PodSpec {
            containers: vec![container(&[("cpu", "100m")], false)],
            init_containers: Some(vec![
                container(&[("cpu", "50m")], true),
                container(&[("cpu", "300m")], false),
            ]),
            ..Default::default()
        };
        // init: max(50, 300 + 50) = 350; app: 100 + 50 = 150.
        assert_eq!(pod_requests(&spec, false).cpu, 350);
    }

    #[test]
    fn limits_stand_in_for_missing_requests_and_non_zero_defaults() {
        let c = Container {
            name: "c".into(),
            resources: Some(ResourceRequirements {
                limits: Some(list(&[("cpu", "1")])),
                ..Default::default()
            }),
            ..Default::default()
        };
        let spec = PodSpec {
            containers: vec![c],
            ..Default::default()
        };
        let r = pod_requests(&spec, false);
        assert_eq!((r.cpu, r.memory), (1000, 0));
        let nz = pod_requests(&spec, true);
        assert_eq!((nz.cpu, nz.memory), (1000, DEFAULT_MEMORY_REQUEST));
    }

    #[test]
    fn sub_undoes_add() {
        let a = Resources::from_list(&list(&[("cpu", "1"), ("example.com/x", "3")]));
        let mut r = Resources::default();
        r.add(&a);
        r.add(&a);
        r.sub(&a);
        assert_eq!(r, a);
    }
}
