//! Probe results by container id (the kubelet's `prober/results`): the
//! probe workers write them, the pod worker reads a snapshot of its pod's
//! results to plan (kill on liveness / startup failure) and to report
//! (`ready`, `started`). A result that changes wakes the pod's worker.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::{Container, Probe};
use tokio::sync::mpsc;

/// Which probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Liveness,
    Readiness,
    Startup,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Liveness, Kind::Readiness, Kind::Startup];

    /// `Liveness`, as upstream's events and metric labels spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Liveness => "Liveness",
            Kind::Readiness => "Readiness",
            Kind::Startup => "Startup",
        }
    }

    /// This probe of a container, if it has one.
    pub fn of(self, c: &Container) -> Option<&Probe> {
        match self {
            Kind::Liveness => c.liveness_probe.as_ref(),
            Kind::Readiness => c.readiness_probe.as_ref(),
            Kind::Startup => c.startup_probe.as_ref(),
        }
    }

    /// The value a container's result has before its first probe:
    /// readiness starts failed, liveness successful, startup unknown.
    pub fn initial(self) -> Outcome {
        match self {
            Kind::Liveness => Outcome::Success,
            Kind::Readiness => Outcome::Failure,
            Kind::Startup => Outcome::Unknown,
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A probe's standing result (after the thresholds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    Success,
    Failure,
    Unknown,
}

/// Counts consecutive results and says when the standing result changes:
/// `successThreshold` successes or `failureThreshold` failures in a row.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Thresholds {
    last: Option<Outcome>,
    run: u32,
}

impl Thresholds {
    /// Record one probe's outcome; `Some` when it must be stored (the run
    /// reached its threshold), as upstream stores it on every probe past
    /// the threshold.
    pub fn observe(&mut self, o: Outcome, success: u32, failure: u32) -> Option<Outcome> {
        if self.last == Some(o) {
            self.run = self.run.saturating_add(1);
        } else {
            self.last = Some(o);
            self.run = 1;
        }
        let below = match o {
            Outcome::Success => self.run < success.max(1),
            Outcome::Failure => self.run < failure.max(1),
            Outcome::Unknown => false,
        };
        (!below).then_some(o)
    }

    /// Start counting again (after a liveness failure, the container is
    /// restarted and its new run starts from zero).
    pub fn reset(&mut self) {
        *self = Thresholds::default();
    }
}

type PodResults = HashMap<(String, Kind), Outcome>;

/// Every pod's results, keyed by pod uid, then (container id, kind).
pub struct Results {
    by_pod: Mutex<HashMap<String, PodResults>>,
    /// Wakes a pod's worker (the manager routes by uid); closed at
    /// shutdown, when nobody needs waking any more.
    wake: mpsc::UnboundedSender<String>,
}

impl Results {
    pub fn new(wake: mpsc::UnboundedSender<String>) -> Results {
        Results {
            by_pod: Mutex::new(HashMap::new()),
            wake,
        }
    }

    /// Store a result; wakes the pod's worker when it changed.
    pub fn set(&self, uid: &str, id: &str, kind: Kind, o: Outcome) -> bool {
        let changed = self.store(uid, id, kind, o);
        if changed {
            let _ = self.wake.send(uid.to_string());
        }
        changed
    }

    /// Store a container's initial result, waking nobody: it says what
    /// having no result says already.
    pub fn set_initial(&self, uid: &str, id: &str, kind: Kind) {
        self.store(uid, id, kind, kind.initial());
    }

    fn store(&self, uid: &str, id: &str, kind: Kind, o: Outcome) -> bool {
        let mut m = self.by_pod.lock().unwrap_or_else(|e| e.into_inner());
        let prev = m
            .entry(uid.to_string())
            .or_default()
            .insert((id.to_string(), kind), o);
        prev != Some(o)
    }

    pub fn get(&self, uid: &str, id: &str, kind: Kind) -> Option<Outcome> {
        let m = self.by_pod.lock().unwrap_or_else(|e| e.into_inner());
        m.get(uid)?.get(&(id.to_string(), kind)).copied()
    }

    pub fn remove(&self, uid: &str, id: &str, kind: Kind) {
        let mut m = self.by_pod.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = m.get_mut(uid) {
            p.remove(&(id.to_string(), kind));
            if p.is_empty() {
                m.remove(uid);
            }
        }
    }

    pub fn remove_pod(&self, uid: &str) {
        self.by_pod
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
    }

    /// A copy of one pod's results.
    pub fn pod(&self, uid: &str) -> PodProbes {
        let m = self.by_pod.lock().unwrap_or_else(|e| e.into_inner());
        PodProbes {
            results: m.get(uid).cloned().unwrap_or_default(),
        }
    }
}

/// One pod's probe results at one moment, as the planner and the status
/// read them. Having no result means the probe has not run yet.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodProbes {
    results: PodResults,
}

impl PodProbes {
    /// Results given by hand (tests).
    pub fn from_results(r: impl IntoIterator<Item = (String, Kind, Outcome)>) -> PodProbes {
        PodProbes {
            results: r.into_iter().map(|(id, k, o)| ((id, k), o)).collect(),
        }
    }

    pub fn get(&self, id: &str, kind: Kind) -> Option<Outcome> {
        self.results.get(&(id.to_string(), kind)).copied()
    }

    /// Whether the running container `id` of `spec` has started: it has
    /// no startup probe, or that probe succeeded.
    pub fn started(&self, spec: &Container, id: &str) -> bool {
        spec.startup_probe.is_none() || self.get(id, Kind::Startup) == Some(Outcome::Success)
    }

    /// Whether the probes call the running container `id` ready: no
    /// readiness probe, or its last standing result is a success (false
    /// until the first success).
    pub fn ready(&self, spec: &Container, id: &str) -> bool {
        spec.readiness_probe.is_none() || self.get(id, Kind::Readiness) == Some(Outcome::Success)
    }

    /// The probe that failed and wants container `id` restarted: liveness
    /// first, then startup, as upstream checks them.
    pub fn failed(&self, id: &str) -> Option<Kind> {
        [Kind::Liveness, Kind::Startup]
            .into_iter()
            .find(|k| self.get(id, *k) == Some(Outcome::Failure))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_need_runs_in_a_row() {
        let mut t = Thresholds::default();
        // failureThreshold 3: two failures change nothing, the third does.
        assert_eq!(t.observe(Outcome::Failure, 1, 3), None);
        assert_eq!(t.observe(Outcome::Failure, 1, 3), None);
        assert_eq!(t.observe(Outcome::Failure, 1, 3), Some(Outcome::Failure));
        // And every failure after it is stored again.
        assert_eq!(t.observe(Outcome::Failure, 1, 3), Some(Outcome::Failure));
        // A success in between restarts the count.
        let mut t = Thresholds::default();
        t.observe(Outcome::Failure, 1, 2);
        assert_eq!(t.observe(Outcome::Success, 1, 2), Some(Outcome::Success));
        assert_eq!(t.observe(Outcome::Failure, 1, 2), None);
        assert_eq!(t.observe(Outcome::Failure, 1, 2), Some(Outcome::Failure));
    }

    #[test]
    fn success_threshold_counts_too() {
        let mut t = Thresholds::default();
        assert_eq!(t.observe(Outcome::Success, 2, 3), None);
        assert_eq!(t.observe(Outcome::Success, 2, 3), Some(Outcome::Success));
        t.reset();
        assert_eq!(t.observe(Outcome::Success, 2, 3), None);
        // Zero thresholds (unset, not defaulted) count as one.
        let mut t = Thresholds::default();
        assert_eq!(t.observe(Outcome::Failure, 0, 0), Some(Outcome::Failure));
    }

    fn container(yaml: &str) -> Container {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn views_follow_upstream() {
        let plain = container("{name: a}");
        let probed = container(
            "{name: a, readinessProbe: {exec: {command: [true]}}, startupProbe: {exec: {command: [true]}}}",
        );
        let none = PodProbes::default();
        assert!(none.ready(&plain, "c1") && none.started(&plain, "c1"));
        assert!(!none.ready(&probed, "c1") && !none.started(&probed, "c1"));
        let p = PodProbes::from_results([
            ("c1".to_string(), Kind::Readiness, Outcome::Success),
            ("c1".to_string(), Kind::Startup, Outcome::Success),
            ("c1".to_string(), Kind::Liveness, Outcome::Success),
            ("c2".to_string(), Kind::Startup, Outcome::Failure),
            ("c3".to_string(), Kind::Liveness, Outcome::Failure),
        ]);
        assert!(p.ready(&probed, "c1") && p.started(&probed, "c1"));
        assert!(!p.ready(&probed, "c2") && !p.started(&probed, "c2"));
        assert_eq!(p.failed("c1"), None);
        assert_eq!(p.failed("c2"), Some(Kind::Startup));
        assert_eq!(p.failed("c3"), Some(Kind::Liveness));
    }

    #[test]
    fn changes_wake_the_pod_once() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let r = Results::new(tx);
        r.set_initial("u", "c1", Kind::Readiness);
        assert!(rx.try_recv().is_err(), "initial values wake nobody");
        assert!(r.set("u", "c1", Kind::Readiness, Outcome::Success));
        assert!(!r.set("u", "c1", Kind::Readiness, Outcome::Success));
        assert_eq!(rx.try_recv().ok().as_deref(), Some("u"));
        assert!(rx.try_recv().is_err());
        r.remove_pod("u");
        assert_eq!(r.get("u", "c1", Kind::Readiness), None);
    }
}
