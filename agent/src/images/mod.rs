//! The node's images beyond pulling them for pods (that is
//! [`crate::runtime::image`]): the sandbox image check at start, archives
//! imported from a directory or the command line, and the image garbage
//! collector.

use std::future::Future;

use cri_proto::{v1, CriClient};

use crate::config::Config;
use crate::events::ApiRecorder;

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

/// Start the node's image work in the background: the sandbox image
/// check, the import directory, and the collector when its policy is on.
/// `stopped` gives a future that resolves when the agent stops.
pub fn spawn<S>(
    config: &Config,
    cri: &CriClient,
    recorder: Option<&ApiRecorder>,
    stopped: &impl Fn() -> S,
) where
    S: Future<Output = ()> + Send + 'static,
{
    {
        let cri = cri.clone();
        let recorder = recorder.cloned();
        tokio::spawn(async move { sandbox::check(&cri, recorder.as_ref()).await });
    }
    let importer = import::Importer::new(
        cri.clone(),
        config.container_runtime_endpoint.clone(),
        config.image_import_dir.clone(),
        recorder.cloned(),
    );
    tokio::spawn(importer.run(stopped()));
    if config.image_gc.enabled() {
        let collector = collector::Collector::new(
            cri.clone(),
            config.image_gc,
            config.image_gc_period,
            recorder.cloned(),
        );
        tokio::spawn(collector.run(stopped()));
    }
}
