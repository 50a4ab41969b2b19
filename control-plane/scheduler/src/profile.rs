//! The scheduler's configuration file, kube-scheduler's
//! `KubeSchedulerConfiguration` (`kubescheduler.config.k8s.io/v1`):
//! profiles by `schedulerName`, their score plugins (enabled, disabled,
//! weights) and plugin arguments, `percentageOfNodesToScore` and the
//! queue's back-off.
//!
//! Decoding is strict, as upstream's: an unknown field is an error. What
//! skiff cannot honour is refused by name rather than ignored: extension
//! points other than scoring (filters are always on), plugins it does
//! not have, extenders, leader election (each skiff-server runs its own
//! scheduler), and client or serving settings of a separate process.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::TopologySpreadConstraint;
use serde::Deserialize;

use crate::score::{self, FitStrategy, Scoring};

const API_VERSION: &str = "kubescheduler.config.k8s.io/v1";
const KIND: &str = "KubeSchedulerConfiguration";
const DEFAULT_SCHEDULER: &str = "default-scheduler";

/// The plugins every profile runs outside scoring, by upstream's names:
/// enabling one is a no-op, disabling one is refused.
const ALWAYS_ON: &[&str] = &[
    "PrioritySort",
    "NodeUnschedulable",
    "NodeName",
    "TaintToleration",
    "NodeAffinity",
    "NodePorts",
    "NodeResourcesFit",
    "VolumeRestrictions",
    "VolumeBinding",
    "VolumeZone",
    "PodTopologySpread",
    "InterPodAffinity",
    "DefaultPreemption",
    "DefaultBinder",
    "SchedulingGates",
];

/// A configuration file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading scheduler config {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("decoding scheduler config: {0}")]
    Decode(String),
    #[error("invalid scheduler config: {0}")]
    Invalid(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One profile: the pods whose `spec.schedulerName` is `scheduler_name`
/// are scored this way.
#[derive(Debug, Clone)]
pub struct Profile {
    pub scheduler_name: String,
    pub scoring: Scoring,
    /// Percent of the nodes to find feasible before scoring stops
    /// looking; 0 adapts to the cluster's size (upstream's default).
    pub percentage_of_nodes_to_score: u32,
}

impl Profile {
    /// Upstream's default profile.
    pub fn default_scheduler() -> Profile {
        Profile {
            scheduler_name: DEFAULT_SCHEDULER.into(),
            scoring: Scoring::default(),
            percentage_of_nodes_to_score: 0,
        }
    }
}

/// What a configuration file sets.
#[derive(Debug, Clone)]
pub struct FileConfig {
    pub profiles: Vec<Profile>,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct File {
    api_version: String,
    kind: String,
    /// Upstream's filter parallelism; decisions here are made one at a
    /// time, so it changes nothing but is a valid setting.
    parallelism: Option<i32>,
    leader_election: Option<LeaderElection>,
    percentage_of_nodes_to_score: Option<i32>,
    pod_initial_backoff_seconds: Option<i64>,
    pod_max_backoff_seconds: Option<i64>,
    #[serde(default)]
    profiles: Vec<FileProfile>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct LeaderElection {
    leader_elect: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileProfile {
    scheduler_name: Option<String>,
    percentage_of_nodes_to_score: Option<i32>,
    #[serde(default)]
    plugins: BTreeMap<String, PluginSet>,
    #[serde(default)]
    plugin_config: Vec<PluginConfig>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PluginSet {
    #[serde(default)]
    enabled: Vec<Plugin>,
    #[serde(default)]
    disabled: Vec<Plugin>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Plugin {
    name: String,
    weight: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PluginConfig {
    name: String,
    #[serde(default)]
    args: serde_json::Value,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FitArgs {
    scoring_strategy: Option<FitScoring>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FitScoring {
    #[serde(rename = "type")]
    type_: Option<String>,
    resources: Option<Vec<ResourceWeight>>,
    requested_to_capacity_ratio: Option<Ratio>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ResourceWeight {
    name: String,
    weight: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Ratio {
    shape: Vec<Point>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Point {
    utilization: i64,
    score: i64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct InterPodAffinityArgs {
    hard_pod_affinity_weight: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SpreadArgs {
    default_constraints: Option<Vec<TopologySpreadConstraint>>,
    defaulting_type: Option<String>,
}

/// Read and check the file at `path`.
///
/// # Errors
/// The file cannot be read or decoded, or sets what skiff cannot honour.
pub fn load(path: &Path) -> Result<FileConfig> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.display().to_string(),
        source,
    })?;
    parse(&text)
}

/// Decode and check a configuration.
///
/// # Errors
/// As [`load`].
pub fn parse(text: &str) -> Result<FileConfig> {
    let file: File = serde_saphyr::from_str(text).map_err(|e| Error::Decode(e.to_string()))?;
    if file.api_version != API_VERSION || file.kind != KIND {
        return Err(Error::Invalid(format!(
            "apiVersion/kind must be {API_VERSION}/{KIND}, not {}/{}",
            file.api_version, file.kind
        )));
    }
    if file.parallelism.is_some_and(|p| p <= 0) {
        return Err(Error::Invalid("parallelism: must be greater than 0".into()));
    }
    if file
        .leader_election
        .as_ref()
        .is_some_and(|l| l.leader_elect == Some(true))
    {
        return Err(Error::Invalid(
            "leaderElection.leaderElect: true is not supported: each skiff-server runs its own scheduler; set it to false".into(),
        ));
    }
    let global = percentage(
        "percentageOfNodesToScore",
        file.percentage_of_nodes_to_score,
    )?;
    let initial = seconds(
        "podInitialBackoffSeconds",
        file.pod_initial_backoff_seconds,
        1,
    )?;
    let max = seconds("podMaxBackoffSeconds", file.pod_max_backoff_seconds, 10)?;
    if max < initial {
        return Err(Error::Invalid(
            "podMaxBackoffSeconds: must be greater than or equal to podInitialBackoffSeconds"
                .into(),
        ));
    }
    let mut profiles = Vec::new();
    for (i, p) in file.profiles.iter().enumerate() {
        let profile =
            profile(p, global).map_err(|e| Error::Invalid(format!("profiles[{i}].{e}")))?;
        if profiles
            .iter()
            .any(|q: &Profile| q.scheduler_name == profile.scheduler_name)
        {
            return Err(Error::Invalid(format!(
                "profiles[{i}].schedulerName: Duplicate value: {:?}",
                profile.scheduler_name
            )));
        }
        profiles.push(profile);
    }
    if profiles.is_empty() {
        let mut p = Profile::default_scheduler();
        p.percentage_of_nodes_to_score = global;
        profiles.push(p);
    }
    Ok(FileConfig {
        profiles,
        initial_backoff: initial,
        max_backoff: max,
    })
}

fn percentage(field: &str, v: Option<i32>) -> Result<u32> {
    match v {
        None => Ok(0),
        Some(p) => u32::try_from(p)
            .ok()
            .filter(|p| *p <= 100)
            .ok_or_else(|| Error::Invalid(format!("{field}: not in valid range [0-100]"))),
    }
}

fn seconds(field: &str, v: Option<i64>, default: u64) -> Result<Duration> {
    match v {
        None => Ok(Duration::from_secs(default)),
        Some(s) if s > 0 => Ok(Duration::from_secs(s.unsigned_abs())),
        Some(_) => Err(Error::Invalid(format!("{field}: must be greater than 0"))),
    }
}

/// One profile; errors name the field within the profile.
fn profile(p: &FileProfile, global: u32) -> std::result::Result<Profile, String> {
    let scheduler_name = p
        .scheduler_name
        .clone()
        .unwrap_or_else(|| DEFAULT_SCHEDULER.into());
    if scheduler_name.is_empty() {
        return Err("schedulerName: Required value".into());
    }
    let own = percentage("percentageOfNodesToScore", p.percentage_of_nodes_to_score)
        .map_err(|e| e.to_string())?;
    let mut scoring = Scoring::default();
    for (point, set) in &p.plugins {
        plugins(point, set, &mut scoring.weights).map_err(|e| format!("plugins.{point}.{e}"))?;
    }
    for (i, c) in p.plugin_config.iter().enumerate() {
        plugin_args(c, &mut scoring).map_err(|e| format!("pluginConfig[{i}].args: {e}"))?;
    }
    Ok(Profile {
        scheduler_name,
        scoring,
        percentage_of_nodes_to_score: if own > 0 { own } else { global },
    })
}

/// An extension point's enabled and disabled plugins. Score plugins
/// (under `score` or `multiPoint`) change `weights`; elsewhere only
/// enabling what is always on is accepted.
fn plugins(
    point: &str,
    set: &PluginSet,
    weights: &mut BTreeMap<String, i64>,
) -> std::result::Result<(), String> {
    const POINTS: &[&str] = &[
        "preEnqueue",
        "queueSort",
        "preFilter",
        "filter",
        "postFilter",
        "preScore",
        "score",
        "reserve",
        "permit",
        "preBind",
        "bind",
        "postBind",
        "multiPoint",
    ];
    if !POINTS.contains(&point) {
        return Err(format!("{point}: unknown extension point"));
    }
    let scores = point == "score" || point == "multiPoint";
    for (i, d) in set.disabled.iter().enumerate() {
        if scores && d.name == "*" {
            weights.clear();
        } else if scores && score::PLUGINS.contains(&d.name.as_str()) {
            weights.remove(&d.name);
        } else if score::PLUGINS.contains(&d.name.as_str()) || ALWAYS_ON.contains(&d.name.as_str())
        {
            // multiPoint may switch a score plugin off everywhere; its
            // filters stay on.
            return Err(format!(
                "disabled[{i}].name: {:?}: disabling plugins other than score plugins is not supported",
                d.name
            ));
        } else {
            return Err(format!("disabled[{i}].name: {:?}: unknown plugin", d.name));
        }
    }
    for (i, e) in set.enabled.iter().enumerate() {
        let name = e.name.as_str();
        if scores && score::PLUGINS.contains(&name) {
            let weight = match e.weight {
                None | Some(0) => score::default_weight(name),
                Some(w) if w > 0 => w,
                Some(_) => return Err(format!("enabled[{i}].weight: must be greater than 0")),
            };
            weights.insert(name.to_string(), weight);
        } else if e.weight.is_some() && !scores {
            return Err(format!(
                "enabled[{i}].weight: only score plugins have weights"
            ));
        } else if !ALWAYS_ON.contains(&name) && !score::PLUGINS.contains(&name) {
            return Err(format!("enabled[{i}].name: {name:?}: unknown plugin"));
        }
    }
    Ok(())
}

/// A plugin's `args`.
fn plugin_args(c: &PluginConfig, scoring: &mut Scoring) -> std::result::Result<(), String> {
    fn decode<T: serde::de::DeserializeOwned>(v: &serde_json::Value) -> Result<T, String> {
        serde_json::from_value(v.clone()).map_err(|e| e.to_string())
    }
    // Typed args (`NodeResourcesFitArgs` ...) may say what they are.
    let mut args = if c.args.is_null() {
        serde_json::json!({})
    } else {
        c.args.clone()
    };
    if let Some(o) = args.as_object_mut() {
        o.remove("apiVersion");
        o.remove("kind");
    }
    match c.name.as_str() {
        "NodeResourcesFit" => {
            let a: FitArgs = decode(&args)?;
            if let Some(s) = a.scoring_strategy {
                scoring.fit = fit_strategy(s)?;
            }
        }
        "InterPodAffinity" => {
            let a: InterPodAffinityArgs = decode(&args)?;
            if let Some(w) = a.hard_pod_affinity_weight {
                if !(0..=100).contains(&w) {
                    return Err("hardPodAffinityWeight: not in valid range [0-100]".into());
                }
                scoring.hard_pod_affinity_weight = w;
            }
        }
        "PodTopologySpread" => {
            let a: SpreadArgs = decode(&args)?;
            match a.defaulting_type.as_deref().unwrap_or("System") {
                "System" => {
                    if a.default_constraints.as_ref().is_some_and(|c| !c.is_empty()) {
                        return Err(
                            "defaultConstraints: Invalid value: when .defaultingType is \"System\", .defaultConstraints must be empty".into(),
                        );
                    }
                    scoring.default_constraints = None;
                }
                "List" => {
                    let list = a.default_constraints.unwrap_or_default();
                    for (i, c) in list.iter().enumerate() {
                        if c.label_selector.is_some() {
                            return Err(format!("defaultConstraints[{i}].labelSelector: Forbidden: constraint must not define a selector, as they deduced for each pod"));
                        }
                        // Default constraints only score here; as filters
                        // they would be accepted and not honoured.
                        if c.when_unsatisfiable != "ScheduleAnyway" {
                            return Err(format!(
                                "defaultConstraints[{i}].whenUnsatisfiable: Unsupported value: {:?}: supported values: \"ScheduleAnyway\"",
                                c.when_unsatisfiable
                            ));
                        }
                        if c.max_skew <= 0 {
                            return Err(format!(
                                "defaultConstraints[{i}].maxSkew: must be greater than zero"
                            ));
                        }
                    }
                    scoring.default_constraints = Some(list);
                }
                other => {
                    return Err(format!(
                        "defaultingType: Unsupported value: {other:?}: supported values: \"System\", \"List\""
                    ))
                }
            }
        }
        "DefaultPreemption" => {
            // Bounds on how many nodes the dry run looks at; skiff's
            // looks at all of them, which any bound allows.
        }
        other if score::PLUGINS.contains(&other) || ALWAYS_ON.contains(&other) => {
            if args.as_object().is_some_and(|o| !o.is_empty()) {
                return Err(format!("{other}: arguments are not supported"));
            }
        }
        other => return Err(format!("{other:?}: unknown plugin")),
    }
    Ok(())
}

fn fit_strategy(s: FitScoring) -> std::result::Result<FitStrategy, String> {
    let resources: Vec<(String, i64)> = match s.resources {
        None => vec![("cpu".into(), 1), ("memory".into(), 1)],
        Some(list) => {
            let mut out = Vec::new();
            for (i, r) in list.into_iter().enumerate() {
                let w = r.weight.unwrap_or(1);
                if !(1..=100).contains(&w) {
                    return Err(format!(
                        "scoringStrategy.resources[{i}].weight: not in valid range [1-100]"
                    ));
                }
                out.push((r.name, w));
            }
            out
        }
    };
    match s.type_.as_deref().unwrap_or("LeastAllocated") {
        "LeastAllocated" => Ok(FitStrategy::LeastAllocated(resources)),
        "MostAllocated" => Ok(FitStrategy::MostAllocated(resources)),
        "RequestedToCapacityRatio" => {
            let shape = s
                .requested_to_capacity_ratio
                .ok_or("scoringStrategy.requestedToCapacityRatio: Required value")?
                .shape;
            if shape.is_empty() {
                return Err("scoringStrategy.requestedToCapacityRatio.shape: Required value: at least one point must be specified".into());
            }
            let mut last = -1;
            for (i, p) in shape.iter().enumerate() {
                if !(0..=100).contains(&p.utilization) {
                    return Err(format!("scoringStrategy.requestedToCapacityRatio.shape[{i}].utilization: not in valid range [0-100]"));
                }
                if !(0..=10).contains(&p.score) {
                    return Err(format!("scoringStrategy.requestedToCapacityRatio.shape[{i}].score: not in valid range [0-10]"));
                }
                if p.utilization <= last {
                    return Err(format!("scoringStrategy.requestedToCapacityRatio.shape[{i}].utilization: Invalid value: values must be sorted in increasing order"));
                }
                last = p.utilization;
            }
            Ok(FitStrategy::RequestedToCapacityRatio {
                resources,
                shape: shape.iter().map(|p| (p.utilization, p.score)).collect(),
            })
        }
        other => Err(format!(
            "scoringStrategy.type: Unsupported value: {other:?}: supported values: \"LeastAllocated\", \"MostAllocated\", \"RequestedToCapacityRatio\""
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_weights_and_strategies() {
        let c = parse(
            r#"
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: false
percentageOfNodesToScore: 30
podInitialBackoffSeconds: 2
profiles:
- schedulerName: default-scheduler
- schedulerName: bin-packer
  percentageOfNodesToScore: 70
  plugins:
    score:
      disabled:
      - name: NodeResourcesBalancedAllocation
      enabled:
      - name: NodeResourcesFit
        weight: 5
  pluginConfig:
  - name: NodeResourcesFit
    args:
      scoringStrategy:
        type: MostAllocated
        resources:
        - name: cpu
          weight: 2
"#,
        )
        .unwrap();
        assert_eq!(c.initial_backoff, Duration::from_secs(2));
        assert_eq!(c.max_backoff, Duration::from_secs(10));
        let names: Vec<_> = c
            .profiles
            .iter()
            .map(|p| p.scheduler_name.as_str())
            .collect();
        assert_eq!(names, ["default-scheduler", "bin-packer"]);
        let (default, packer) = (&c.profiles[0], &c.profiles[1]);
        assert_eq!(default.percentage_of_nodes_to_score, 30);
        assert_eq!(default.scoring.weights, Scoring::default().weights);
        assert_eq!(packer.percentage_of_nodes_to_score, 70);
        assert_eq!(packer.scoring.weights.get("NodeResourcesFit"), Some(&5));
        assert!(!packer
            .scoring
            .weights
            .contains_key("NodeResourcesBalancedAllocation"));
        assert!(matches!(
            &packer.scoring.fit,
            FitStrategy::MostAllocated(r) if r == &[("cpu".to_string(), 2)]
        ));
    }

    #[test]
    fn no_profiles_is_the_default_one() {
        let c =
            parse("apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n")
                .unwrap();
        assert_eq!(c.profiles.len(), 1);
        assert_eq!(c.profiles[0].scheduler_name, "default-scheduler");
    }

    #[test]
    fn what_cannot_be_honoured_is_refused_by_name() {
        let head = "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n";
        for (body, wanted) in [
            ("extenders: []\n", "extenders"),
            ("clientConnection: {kubeconfig: /x}\n", "clientConnection"),
            ("leaderElection: {leaderElect: true}\n", "leaderElection.leaderElect"),
            (
                "profiles:\n- plugins:\n    filter:\n      disabled: [{name: NodeAffinity}]\n",
                "profiles[0].plugins.filter.disabled[0].name",
            ),
            (
                "profiles:\n- plugins:\n    score:\n      enabled: [{name: Nope}]\n",
                "unknown plugin",
            ),
            (
                "profiles:\n- schedulerName: a\n- schedulerName: a\n",
                "profiles[1].schedulerName: Duplicate value",
            ),
            (
                "profiles:\n- pluginConfig:\n  - name: PodTopologySpread\n    args: {defaultingType: List, defaultConstraints: [{maxSkew: 1, topologyKey: k, whenUnsatisfiable: ScheduleAnyway, labelSelector: {}}]}\n",
                "labelSelector: Forbidden",
            ),
            ("percentageOfNodesToScore: 101\n", "percentageOfNodesToScore"),
            (
                "profiles:\n- pluginConfig:\n  - name: PodTopologySpread\n    args: {defaultingType: List, defaultConstraints: [{maxSkew: 1, topologyKey: k, whenUnsatisfiable: DoNotSchedule}]}\n",
                "defaultConstraints[0].whenUnsatisfiable",
            ),
        ] {
            let e = parse(&format!("{head}{body}")).unwrap_err().to_string();
            assert!(e.contains(wanted), "{body}: {e}");
        }
        let e = parse(
            "apiVersion: kubescheduler.config.k8s.io/v1beta3\nkind: KubeSchedulerConfiguration\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("apiVersion/kind"), "{e}");
    }
}
