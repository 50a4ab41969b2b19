//! The image garbage collector's loop against the runtime: every period
//! (the kubelet's fixed 5 m unless set) it lists images and containers,
//! removes what [`super::gc`] picks, and reports on the Node what it could
//! not do (`InvalidDiskCapacity`, `FreeDiskSpaceFailed`, and
//! `ImageGCFailed` when a collection fails twice in a row, as upstream).

use std::collections::HashSet;
use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};

use cri_proto::{v1, CriClient};

use super::gc::{Candidate, Image, Policy, Records};
use crate::events::{ApiRecorder, WARNING};

/// Why a collection failed: the message of the Node's event.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to list images or containers: {0}")]
    List(#[source] cri_proto::Error),
    #[error("failed to get image filesystem stats: {0}")]
    Stats(String),
    #[error("invalid capacity 0 on image filesystem")]
    InvalidCapacity,
    #[error("Failed to garbage collect required amount of images. Attempted to free {wanted} bytes, but only found {freed} bytes eligible to free.")]
    NotEnough { wanted: u64, freed: u64 },
}

/// Removes unused images by [`Policy`].
pub struct Collector {
    cri: CriClient,
    policy: Policy,
    period: Duration,
    recorder: Option<ApiRecorder>,
    records: Records,
}

impl Collector {
    pub fn new(
        cri: CriClient,
        policy: Policy,
        period: Duration,
        recorder: Option<ApiRecorder>,
    ) -> Collector {
        Collector {
            cri,
            policy,
            period,
            recorder,
            records: Records::default(),
        }
    }

    fn warn(&self, reason: &str, message: &str) {
        crate::events::report_node(self.recorder.as_ref(), WARNING, reason, message);
    }

    /// Collect at once, then every period, until `shutdown` resolves.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        tracing::info!(policy = ?self.policy, period = ?self.period, "image garbage collection");
        let began = Instant::now();
        let mut failed_before = false;
        let mut ticks = crate::ticks::Ticks::new(self.period, shutdown);
        while ticks.next().await {
            match self.collect(began).await {
                Ok(()) => failed_before = false,
                // One failure may be a passing one (the runtime restarting).
                Err(e) if failed_before => self.warn("ImageGCFailed", &e.to_string()),
                Err(e) => {
                    tracing::warn!("image garbage collection failed: {e}");
                    failed_before = true;
                }
            }
        }
    }

    /// One collection: images unused past the maximum age, then, when the
    /// image file system is over the high threshold, the least recently
    /// used until it is under the low one.
    ///
    /// # Errors
    /// The runtime could not list or report; or not enough could be freed.
    pub async fn collect(&mut self, began: Instant) -> Result<(), Error> {
        let (images, in_use) = self.observe().await?;
        let now = Instant::now();
        self.records.detect(now, &images, &in_use);
        let mut candidates = self.records.eviction_order(&in_use);
        let old = self.records.too_old(&candidates, &self.policy, began, now);
        if !old.is_empty() {
            let removed = self.remove(&old).await;
            candidates.retain(|c| !removed.contains(&c.id));
        }
        let Some((capacity, available)) = self.image_fs().await? else {
            return Ok(());
        };
        if capacity == 0 {
            let e = Error::InvalidCapacity;
            self.warn("InvalidDiskCapacity", &e.to_string());
            return Err(e);
        }
        let Some(wanted) = self.policy.bytes_to_free(capacity, available) else {
            return Ok(());
        };
        tracing::info!(
            usage = 100 - available.min(capacity) * 100 / capacity,
            high = self.policy.high_threshold_percent,
            low = self.policy.low_threshold_percent,
            wanted,
            "disk usage on image filesystem is over the high threshold, trying to free bytes down to the low threshold"
        );
        let chosen = self.records.to_free(&candidates, wanted, &self.policy, now);
        let freed = self.free(&chosen).await;
        if freed < wanted {
            let e = Error::NotEnough { wanted, freed };
            self.warn("FreeDiskSpaceFailed", &e.to_string());
            return Err(e);
        }
        Ok(())
    }

    /// Remove every unused image past the minimum age (the eviction
    /// manager's first resort under disk pressure, upstream's
    /// `DeleteUnusedImages`); the bytes freed.
    ///
    /// # Errors
    /// The runtime could not list images or containers.
    pub async fn delete_unused(&mut self) -> Result<u64, Error> {
        let (images, in_use) = self.observe().await?;
        let now = Instant::now();
        self.records.detect(now, &images, &in_use);
        let candidates = self.records.eviction_order(&in_use);
        let chosen = self
            .records
            .to_free(&candidates, u64::MAX, &self.policy, now);
        Ok(self.free(&chosen).await)
    }

    /// The runtime's images (the sandbox image counted as pinned) and the
    /// IDs of the images some container, running or exited, uses.
    async fn observe(&self) -> Result<(Vec<Image>, HashSet<String>), Error> {
        let (images, containers, sandbox) = tokio::join!(
            self.cri.list_images(v1::ListImagesRequest { filter: None }),
            self.cri
                .list_containers(v1::ListContainersRequest { filter: None }),
            super::sandbox::image_name(&self.cri),
        );
        let images = images.map_err(Error::List)?.images;
        let containers = containers.map_err(Error::List)?.containers;
        let names = |i: &v1::Image| -> Vec<String> {
            i.repo_tags.iter().chain(&i.repo_digests).cloned().collect()
        };
        let mut in_use = HashSet::new();
        for c in &containers {
            let by_name = c.image.as_ref().map(|s| s.image.as_str()).unwrap_or("");
            // image_ref is the image ID with containerd; a runtime that
            // answers with a name is matched by name.
            for i in &images {
                if i.id == c.image_ref || names(i).iter().any(|n| n == by_name || *n == c.image_ref)
                {
                    in_use.insert(i.id.clone());
                }
            }
        }
        let listed = images
            .iter()
            .map(|i| Image {
                id: i.id.clone(),
                size: i.size,
                pinned: i.pinned
                    || sandbox
                        .as_deref()
                        .is_some_and(|s| super::sandbox::names_match(&names(i), s)),
            })
            .collect();
        Ok((listed, in_use))
    }

    /// Capacity and free bytes of the image file system; None when the
    /// runtime reports none.
    async fn image_fs(&self) -> Result<Option<(u64, u64)>, Error> {
        let info = self
            .cri
            .image_fs_info(v1::ImageFsInfoRequest::default())
            .await
            .map_err(|e| Error::Stats(e.to_string()))?;
        let Some(mountpoint) = info
            .image_filesystems
            .into_iter()
            .find_map(|f| f.fs_id.map(|id| id.mountpoint))
        else {
            return Ok(None);
        };
        tokio::task::spawn_blocking(move || {
            let v = nix::sys::statvfs::statvfs(Path::new(&mountpoint))
                .map_err(|e| Error::Stats(format!("statvfs {mountpoint}: {e}")))?;
            let frsize = v.fragment_size() as u64;
            Ok(Some((
                v.blocks() as u64 * frsize,
                v.blocks_available() as u64 * frsize,
            )))
        })
        .await
        .map_err(|e| Error::Stats(e.to_string()))?
    }

    /// Remove `images`; the bytes freed.
    async fn free(&mut self, images: &[Candidate]) -> u64 {
        let removed = self.remove(images).await;
        images
            .iter()
            .filter(|c| removed.contains(&c.id))
            .map(|c| c.size)
            .sum()
    }

    /// Remove `images`; the IDs removed. A failure is logged and the
    /// others are still tried, as upstream.
    async fn remove(&mut self, images: &[Candidate]) -> HashSet<String> {
        let mut removed = HashSet::new();
        for c in images {
            let request = v1::RemoveImageRequest {
                image: Some(v1::ImageSpec {
                    image: c.id.clone(),
                    ..Default::default()
                }),
            };
            match self.cri.remove_image(request).await {
                Ok(_) => {
                    tracing::info!(image = %c.id, size = c.size, "removed unused image");
                    self.records.forget(&c.id);
                    removed.insert(c.id.clone());
                }
                Err(e) => tracing::warn!(image = %c.id, "failed to remove image: {e}"),
            }
        }
        removed
    }
}
