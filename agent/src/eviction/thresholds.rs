//! Eviction signals and thresholds as the kubelet's `evictionHard`,
//! `evictionSoft`, `evictionSoftGracePeriod` and `evictionMinimumReclaim`
//! configure them (`pkg/kubelet/eviction/api`, `helpers.go`): a threshold
//! is met when the signal's available amount falls below its quantity (or
//! percentage of capacity).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// What the eviction manager watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Signal {
    MemoryAvailable,
    NodeFsAvailable,
    NodeFsInodesFree,
    ImageFsAvailable,
    ImageFsInodesFree,
    PidAvailable,
}

impl Signal {
    pub const ALL: [Signal; 6] = [
        Signal::MemoryAvailable,
        Signal::NodeFsAvailable,
        Signal::NodeFsInodesFree,
        Signal::ImageFsAvailable,
        Signal::ImageFsInodesFree,
        Signal::PidAvailable,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory.available",
            Signal::NodeFsAvailable => "nodefs.available",
            Signal::NodeFsInodesFree => "nodefs.inodesFree",
            Signal::ImageFsAvailable => "imagefs.available",
            Signal::ImageFsInodesFree => "imagefs.inodesFree",
            Signal::PidAvailable => "pid.available",
        }
    }

    fn parse(s: &str) -> Result<Signal, String> {
        Signal::ALL
            .into_iter()
            .find(|sig| sig.name() == s)
            .ok_or_else(|| format!("unsupported eviction signal {s}"))
    }

    /// The node condition a met threshold of this signal sets.
    pub fn condition(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "MemoryPressure",
            Signal::PidAvailable => "PIDPressure",
            _ => "DiskPressure",
        }
    }

    /// The resource eviction messages name (upstream `signalToResource`).
    pub fn resource(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory",
            Signal::NodeFsAvailable | Signal::ImageFsAvailable => "ephemeral-storage",
            Signal::NodeFsInodesFree | Signal::ImageFsInodesFree => "inodes",
            Signal::PidAvailable => "pids",
        }
    }
}

/// A threshold's amount: absolute, or a share of the capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    Quantity(u64),
    Percentage(f64),
}

impl Value {
    fn parse(signal: Signal, s: &str) -> Result<Value, String> {
        let s = s.trim();
        if let Some(p) = s.strip_suffix('%') {
            let p: f64 = p
                .parse()
                .map_err(|_| format!("invalid percentage {s} for {}", signal.name()))?;
            if !(0.0..=100.0).contains(&p) {
                return Err(format!(
                    "eviction percentage threshold {} must be >= 0% and <= 100%: {s}",
                    signal.name()
                ));
            }
            return Ok(Value::Percentage(p / 100.0));
        }
        let q = kube_util::quantity::value(s)
            .map_err(|e| format!("invalid quantity {s} for {}: {e}", signal.name()))?;
        if q < 0 {
            return Err(format!(
                "eviction threshold {} must be positive: {s}",
                signal.name()
            ));
        }
        Ok(Value::Quantity(q as u64))
    }

    /// The amount for a signal whose capacity is `capacity`.
    pub fn amount(&self, capacity: u64) -> u64 {
        match *self {
            Value::Quantity(q) => q,
            Value::Percentage(p) => (capacity as f64 * p) as u64,
        }
    }
}

/// One threshold: met when the signal's available amount is below `value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Threshold {
    pub signal: Signal,
    pub value: Value,
    /// How long a soft threshold must hold; zero for a hard one.
    pub grace_period: Duration,
    /// Reclaimed beyond the threshold before pressure is relieved.
    pub min_reclaim: Option<Value>,
}

impl Threshold {
    pub fn is_hard(&self) -> bool {
        self.grace_period.is_zero()
    }
}

/// Upstream's `DefaultEvictionHard`.
pub fn default_hard() -> BTreeMap<String, String> {
    [
        ("memory.available", "100Mi"),
        ("nodefs.available", "10%"),
        ("nodefs.inodesFree", "5%"),
        ("imagefs.available", "15%"),
        ("imagefs.inodesFree", "5%"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// The thresholds of the four eviction settings, validated as the
/// kubelet's `ParseThresholdConfig`.
///
/// # Errors
/// An unknown signal, a bad quantity or percentage, a soft threshold
/// without a grace period (or a grace period without one).
pub fn parse(
    hard: &BTreeMap<String, String>,
    soft: &BTreeMap<String, String>,
    soft_grace: &BTreeMap<String, Duration>,
    min_reclaim: &BTreeMap<String, String>,
) -> Result<Vec<Threshold>, String> {
    let mut reclaim = HashMap::new();
    for (k, v) in min_reclaim {
        let signal = Signal::parse(k)?;
        reclaim.insert(signal, Value::parse(signal, v)?);
    }
    let mut out = Vec::new();
    for (k, v) in hard {
        let signal = Signal::parse(k)?;
        out.push(Threshold {
            signal,
            value: Value::parse(signal, v)?,
            grace_period: Duration::ZERO,
            min_reclaim: reclaim.get(&signal).copied(),
        });
    }
    for (k, v) in soft {
        let signal = Signal::parse(k)?;
        let grace = soft_grace
            .get(k)
            .copied()
            .filter(|g| !g.is_zero())
            .ok_or_else(|| format!("threshold for signal {k} must have grace period"))?;
        out.push(Threshold {
            signal,
            value: Value::parse(signal, v)?,
            grace_period: grace,
            min_reclaim: reclaim.get(&signal).copied(),
        });
    }
    for k in soft_grace.keys() {
        Signal::parse(k)?;
        if !soft.contains_key(k) {
            return Err(format!(
                "grace period must have a corresponding threshold for signal {k}"
            ));
        }
    }
    Ok(out)
}

/// A signal's reading: how much is available of how much.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    pub available: u64,
    pub capacity: u64,
}

/// The thresholds met by `observed`; with `enforce_min_reclaim`, a
/// threshold stays met until the minimum reclaim is available beyond it
/// (upstream `thresholdsMet`).
pub fn met(
    thresholds: &[Threshold],
    observed: &HashMap<Signal, Observation>,
    enforce_min_reclaim: bool,
) -> Vec<Threshold> {
    thresholds
        .iter()
        .filter(|t| {
            let Some(o) = observed.get(&t.signal) else {
                return false;
            };
            let mut quantity = t.value.amount(o.capacity);
            if enforce_min_reclaim {
                if let Some(r) = &t.min_reclaim {
                    quantity += r.amount(o.capacity);
                }
            }
            quantity > o.available
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_parse_and_bad_input_is_refused() {
        let none = BTreeMap::new();
        let t = parse(&default_hard(), &none, &BTreeMap::new(), &none).unwrap();
        assert_eq!(t.len(), 5);
        assert!(t.iter().all(Threshold::is_hard));
        let mem = t
            .iter()
            .find(|t| t.signal == Signal::MemoryAvailable)
            .unwrap();
        assert_eq!(mem.value, Value::Quantity(100 * 1024 * 1024));
        let bad =
            |hard: &[(&str, &str)]| parse(&map(hard), &none, &BTreeMap::new(), &none).unwrap_err();
        assert_eq!(
            bad(&[("cpu.available", "1")]),
            "unsupported eviction signal cpu.available"
        );
        assert!(bad(&[("memory.available", "150%")]).contains("<= 100%"));
        assert!(bad(&[("memory.available", "lots")]).contains("invalid quantity"));
        let soft = map(&[("memory.available", "1Gi")]);
        let err = parse(&none, &soft, &BTreeMap::new(), &none).unwrap_err();
        assert_eq!(
            err,
            "threshold for signal memory.available must have grace period"
        );
        let grace = BTreeMap::from([("nodefs.available".to_string(), Duration::from_secs(60))]);
        assert!(parse(&none, &none, &grace, &none)
            .unwrap_err()
            .contains("corresponding threshold"));
    }

    #[test]
    fn met_below_the_amount_and_until_the_minimum_reclaim_is_back() {
        let none = BTreeMap::new();
        let t = parse(
            &map(&[("nodefs.available", "10%")]),
            &none,
            &BTreeMap::new(),
            &map(&[("nodefs.available", "100")]),
        )
        .unwrap();
        let obs = |available| {
            HashMap::from([(
                Signal::NodeFsAvailable,
                Observation {
                    available,
                    capacity: 10_000,
                },
            )])
        };
        assert_eq!(met(&t, &obs(999), false).len(), 1);
        assert!(met(&t, &obs(1000), false).is_empty());
        // Still met while under threshold + minimum reclaim.
        assert_eq!(met(&t, &obs(1050), true).len(), 1);
        assert!(met(&t, &obs(1100), true).is_empty());
        assert!(
            met(&t, &HashMap::new(), false).is_empty(),
            "no reading, not met"
        );
    }
}
