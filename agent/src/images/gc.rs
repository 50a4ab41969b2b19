//! Image garbage collection as the kubelet's `realImageGCManager`: the
//! images no container uses are removed, least recently used first, when
//! the image file system is over `imageGCHighThresholdPercent`, until it
//! is under `imageGCLowThresholdPercent`; and, with `imageMaximumGCAge`,
//! whenever one has gone unused that long. This module holds the
//! bookkeeping and the choice; [`super::collector`] talks to the runtime.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// The kubelet's image GC policy (`imageGC*` in KubeletConfiguration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Disk usage (percent) at which images are removed; 100 turns the
    /// disk-based collection off.
    pub high_threshold_percent: u8,
    /// Usage (percent) that a collection frees down to.
    pub low_threshold_percent: u8,
    /// An image is never removed before it has been seen this long.
    pub min_age: Duration,
    /// An image unused this long is removed whatever the usage; zero: off.
    pub max_age: Duration,
}

impl Default for Policy {
    /// Upstream's defaults: 85 %, 80 %, 2 m, off.
    fn default() -> Self {
        Policy {
            high_threshold_percent: 85,
            low_threshold_percent: 80,
            min_age: Duration::from_secs(120),
            max_age: Duration::ZERO,
        }
    }
}

impl Policy {
    /// The kubelet's validation of the thresholds and ages, with its
    /// messages.
    ///
    /// # Errors
    /// A threshold over 100, the low threshold not under the high one
    /// (unless collection is off), or a maximum age under the minimum.
    pub fn validate(&self) -> Result<(), String> {
        let (high, low) = (self.high_threshold_percent, self.low_threshold_percent);
        if high > 100 {
            return Err(format!(
                "invalid configuration: imageGCHighThresholdPercent ({high}) must be between 0 and 100"
            ));
        }
        if low > 100 {
            return Err(format!(
                "invalid configuration: imageGCLowThresholdPercent ({low}) must be between 0 and 100"
            ));
        }
        if low >= high && high != 100 {
            return Err(format!(
                "invalid configuration: imageGCLowThresholdPercent ({low}) must be less than imageGCHighThresholdPercent ({high})"
            ));
        }
        if !self.max_age.is_zero() && self.max_age < self.min_age {
            return Err(format!(
                "invalid configuration: imageMaximumGCAge {:?} must be greater than imageMinimumGCAge {:?}",
                self.max_age, self.min_age
            ));
        }
        Ok(())
    }

    /// Whether there is anything to collect at all (the kubelet does not
    /// start its collector otherwise).
    pub fn enabled(&self) -> bool {
        self.high_threshold_percent < 100 || !self.max_age.is_zero()
    }

    /// Bytes to free so that usage falls to the low threshold, when usage
    /// has reached the high one; None otherwise.
    pub fn bytes_to_free(&self, capacity: u64, available: u64) -> Option<u64> {
        if self.high_threshold_percent >= 100 || capacity == 0 {
            return None;
        }
        let available = available.min(capacity);
        let usage = 100 - available * 100 / capacity;
        if usage < u64::from(self.high_threshold_percent) {
            return None;
        }
        let target = capacity * u64::from(100 - self.low_threshold_percent) / 100;
        Some(target.saturating_sub(available))
    }
}

/// An image as the runtime lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    pub id: String,
    pub size: u64,
    /// Pinned by the runtime (or the sandbox image): never removed.
    pub pinned: bool,
}

/// What the collector remembers of an image.
#[derive(Debug, Clone, Copy)]
struct Record {
    /// None: present when the agent started, so "long ago" (the kubelet
    /// detects the first time with a zero time).
    first_detected: Option<Instant>,
    /// None: never seen in use.
    last_used: Option<Instant>,
    size: u64,
    pinned: bool,
}

/// The images seen, when first and when last in use.
#[derive(Debug, Default)]
pub struct Records {
    images: HashMap<String, Record>,
    initialized: bool,
}

/// An image that may be removed, in the order removal is tried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub id: String,
    pub size: u64,
}

impl Records {
    /// Take in the runtime's image list at `now`; `in_use` holds the
    /// image IDs that some container (running or not) was created from.
    pub fn detect(&mut self, now: Instant, images: &[Image], in_use: &HashSet<String>) {
        let detected = self.initialized.then_some(now);
        self.initialized = true;
        let present: HashSet<&str> = images.iter().map(|i| i.id.as_str()).collect();
        self.images.retain(|id, _| present.contains(id.as_str()));
        for image in images {
            let r = self.images.entry(image.id.clone()).or_insert(Record {
                first_detected: detected,
                last_used: None,
                size: image.size,
                pinned: image.pinned,
            });
            r.size = image.size;
            r.pinned = image.pinned;
            if in_use.contains(&image.id) {
                r.last_used = Some(now);
            }
        }
    }

    /// The images that may go, least recently used first (never-used
    /// ones before all others), then the earliest detected: everything
    /// not in use now and not pinned.
    pub fn eviction_order(&self, in_use: &HashSet<String>) -> Vec<Candidate> {
        let mut out: Vec<(&String, &Record)> = self
            .images
            .iter()
            .filter(|(id, r)| !r.pinned && !in_use.contains(*id))
            .collect();
        out.sort_by(|(a_id, a), (b_id, b)| {
            (a.last_used, a.first_detected, a_id).cmp(&(b.last_used, b.first_detected, b_id))
        });
        out.into_iter()
            .map(|(id, r)| Candidate {
                id: id.clone(),
                size: r.size,
            })
            .collect()
    }

    /// Of `candidates`, those unused for longer than the maximum age, once
    /// the collector has itself run that long (so a restart does not count
    /// as disuse).
    pub fn too_old(
        &self,
        candidates: &[Candidate],
        policy: &Policy,
        began: Instant,
        now: Instant,
    ) -> Vec<Candidate> {
        if policy.max_age.is_zero() || now.duration_since(began) <= policy.max_age {
            return Vec::new();
        }
        candidates
            .iter()
            .filter(|c| {
                self.images.get(&c.id).is_some_and(|r| match r.last_used {
                    Some(used) => now.duration_since(used) > policy.max_age,
                    None => true,
                })
            })
            .cloned()
            .collect()
    }

    /// Of `candidates`, in order, the ones to remove to free `bytes`:
    /// images detected less than the minimum age ago are skipped.
    pub fn to_free(
        &self,
        candidates: &[Candidate],
        bytes: u64,
        policy: &Policy,
        now: Instant,
    ) -> Vec<Candidate> {
        let mut freed = 0;
        let mut out = Vec::new();
        for c in candidates {
            if freed >= bytes {
                break;
            }
            let young = self
                .images
                .get(&c.id)
                .and_then(|r| r.first_detected)
                .is_some_and(|first| now.duration_since(first) < policy.min_age);
            if young {
                continue;
            }
            freed += c.size;
            out.push(c.clone());
        }
        out
    }

    /// Forget an image the collector removed.
    pub fn forget(&mut self, id: &str) {
        self.images.remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(id: &str, size: u64) -> Image {
        Image {
            id: id.into(),
            size,
            pinned: false,
        }
    }

    fn ids(c: &[Candidate]) -> Vec<&str> {
        c.iter().map(|c| c.id.as_str()).collect()
    }

    fn set(ids: &[&str]) -> HashSet<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn validation_follows_the_kubelet() {
        assert!(Policy::default().validate().is_ok());
        let p = |high, low| Policy {
            high_threshold_percent: high,
            low_threshold_percent: low,
            ..Policy::default()
        };
        assert!(p(101, 80)
            .validate()
            .unwrap_err()
            .contains("between 0 and 100"));
        assert!(p(80, 80)
            .validate()
            .unwrap_err()
            .contains("must be less than"));
        assert!(p(100, 100).validate().is_ok(), "collection off");
        let ages = Policy {
            max_age: Duration::from_secs(60),
            ..Policy::default()
        };
        assert!(ages.validate().unwrap_err().contains("imageMaximumGCAge"));
    }

    #[test]
    fn frees_down_to_the_low_threshold_once_over_the_high_one() {
        let p = Policy::default();
        // 84 % used: under the high threshold.
        assert_eq!(p.bytes_to_free(1000, 160), None);
        // 85 % used: free down to 80 %, i.e. 200 available.
        assert_eq!(p.bytes_to_free(1000, 150), Some(50));
        assert_eq!(p.bytes_to_free(0, 0), None);
        let off = Policy {
            high_threshold_percent: 100,
            ..p
        };
        assert_eq!(off.bytes_to_free(1000, 0), None);
    }

    #[test]
    fn least_recently_used_first_never_in_use_or_pinned() {
        let t0 = Instant::now();
        let mut r = Records::default();
        let mut pinned = image("pause", 1);
        pinned.pinned = true;
        let all = [image("a", 10), image("b", 20), image("c", 30), pinned];
        r.detect(t0, &all, &set(&["a"]));
        r.detect(t0 + Duration::from_secs(10), &all, &set(&["b"]));
        // c was never used, a was used before b; c is in use now.
        let order = r.eviction_order(&set(&[]));
        assert_eq!(ids(&order), ["c", "a", "b"]);
        assert_eq!(ids(&r.eviction_order(&set(&["c"]))), ["a", "b"]);
    }

    #[test]
    fn young_images_are_kept_and_enough_is_freed() {
        let t0 = Instant::now();
        let p = Policy::default();
        let mut r = Records::default();
        // Present at start: old at once, as upstream's zero detection time.
        r.detect(t0, &[image("old", 10), image("old2", 10)], &set(&[]));
        let now = t0 + Duration::from_secs(30);
        let all = [image("old", 10), image("old2", 10), image("new", 100)];
        r.detect(now, &all, &set(&[]));
        let order = r.eviction_order(&set(&[]));
        assert_eq!(ids(&r.to_free(&order, 500, &p, now)), ["old", "old2"]);
        assert_eq!(ids(&r.to_free(&order, 5, &p, now)), ["old"]);
        let later = now + p.min_age;
        assert_eq!(r.to_free(&order, 500, &p, later).len(), 3);
    }

    #[test]
    fn gone_images_are_forgotten() {
        let t0 = Instant::now();
        let mut r = Records::default();
        r.detect(t0, &[image("a", 1), image("b", 1)], &set(&[]));
        r.detect(t0, &[image("b", 1)], &set(&[]));
        assert_eq!(ids(&r.eviction_order(&set(&[]))), ["b"]);
        r.forget("b");
        assert!(r.eviction_order(&set(&[])).is_empty());
    }

    #[test]
    fn maximum_age_counts_from_the_last_use_once_the_collector_ran_that_long() {
        let began = Instant::now();
        let p = Policy {
            max_age: Duration::from_secs(300),
            ..Policy::default()
        };
        let mut r = Records::default();
        let all = [image("used", 1), image("idle", 1)];
        r.detect(began, &all, &set(&["used"]));
        let soon = began + Duration::from_secs(200);
        r.detect(soon, &all, &set(&["used"]));
        let order = r.eviction_order(&set(&[]));
        assert!(r.too_old(&order, &p, began, soon).is_empty(), "too early");
        let later = began + Duration::from_secs(301);
        assert_eq!(ids(&r.too_old(&order, &p, began, later)), ["idle"]);
        let much_later = soon + Duration::from_secs(301);
        assert_eq!(
            ids(&r.too_old(&order, &p, began, much_later)),
            ["idle", "used"]
        );
    }
}
