//! What running pods use, as the eviction manager reads it: ranked by
//! [`super::rank`], held against limits by [`super::local_storage`].

use k8s_openapi::api::core::v1::Pod;

/// What one container uses of the resource being reclaimed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerUsage {
    pub name: String,
    pub memory: u64,
    /// Writable layer and logs.
    pub storage: u64,
}

/// A running pod and what it uses.
#[derive(Debug, Clone)]
pub struct PodUsage {
    pub pod: Pod,
    /// Working set.
    pub memory: u64,
    /// Writable layers, logs and disk-backed emptyDirs.
    pub storage: u64,
    pub containers: Vec<ContainerUsage>,
    /// Disk-backed emptyDirs.
    pub empty_dirs: Vec<EmptyDirUsage>,
}

/// A disk-backed emptyDir's use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmptyDirUsage {
    pub name: String,
    /// `sizeLimit` as written.
    pub limit: Option<String>,
    pub used: u64,
}
