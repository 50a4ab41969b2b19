//! The node's images beyond pulling them for pods (that is
//! [`crate::runtime::image`]): the sandbox image check at start, archives
//! imported from a directory or the command line, and the image garbage
//! collector.

use cri_proto::{v1, CriClient};

pub mod archive;
pub mod collector;
pub mod gc;
pub mod import;
pub mod sandbox;

/// The runtime's own configuration from its verbose status (containerd's
/// CRI plugin config: `sandboxImage`, `containerd.snapshotter`, ...);
/// None when the runtime does not give it.
pub async fn runtime_config(cri: &CriClient) -> Option<serde_json::Value> {
    let status = cri.status(v1::StatusRequest { verbose: true }).await.ok()?;
    serde_json::from_str(status.info.get("config")?).ok()
}
