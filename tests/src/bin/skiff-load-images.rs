//! Builds the local test images (pause, toolbox) and side-loads them into a
//! containerd: no registry is reachable on these machines, so the bring-up
//! script's demo workload runs from these.
//!
//! Usage: `skiff-load-images SOCKET WORK_DIR`

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use skiff_tests::images::{self, Images};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let socket = PathBuf::from(
        args.next()
            .context("usage: skiff-load-images SOCKET WORK_DIR")?,
    );
    let work = PathBuf::from(
        args.next()
            .context("usage: skiff-load-images SOCKET WORK_DIR")?,
    );
    std::fs::create_dir_all(&work)?;
    let client = cri_proto::CriClient::connect(&socket, Duration::from_secs(30))
        .await
        .with_context(|| format!("cannot reach containerd at {}", socket.display()))?;
    let loader = Images::new(&socket, &work, "overlayfs", client);
    for image in [images::pause()?, images::toolbox()?] {
        loader
            .load(&image)
            .await
            .with_context(|| format!("loading {}", image.name()))?;
        println!("loaded {}", image.name());
    }
    Ok(())
}
