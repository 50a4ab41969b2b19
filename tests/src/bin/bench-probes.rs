//! Probe cost: skiff-agent probing N pods against the same probes issued
//! raw, same run, same containerd (the harness's private one), same pods.
//!
//! Every pod runs busybox httpd with an httpGet readiness probe and an exec
//! liveness probe (`cat /www/healthz`), both at periodSeconds 1.
//!
//! - agent: over the window, the agent's CPU (utime + stime from
//!   /proc/<pid>/stat) as a share of one core, its RSS, and the probes'
//!   latency p50/p99 from its `prober_probe_duration_seconds` histogram
//!   (scraped from `/metrics` on the status endpoint at both ends of the
//!   window; 25 % buckets, interpolated);
//! - raw: the agent is then killed (its containers keep running) and this
//!   program issues the same probes itself for the same window: CRI
//!   ExecSync through the CRI client and plain HTTP GETs to the pod IPs,
//!   each at 1 s per pod with a random phase. Its own CPU is the floor the
//!   agent's is compared with.
//!
//! Ends with one JSON line.
//!
//! Run: `cargo run --release -p skiff-tests --bin bench-probes -- [--pods 100] [--seconds 60]
//! [--probes both|http|exec|none]` (`--probes http` gives the agent's cost of the
//! http probes alone).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use cri_proto::{v1, CriClient};
use skiff_tests::agent::{pods, Agent, AgentOptions};
use skiff_tests::rawcri::pct;
use skiff_tests::{Containerd, TOOLBOX_IMAGE};

/// USER_HZ: /proc reports CPU time in these ticks on Linux.
const CLK_TCK: f64 = 100.0;
const PERIOD: Duration = Duration::from_secs(1);

struct Args {
    pods: usize,
    seconds: u64,
    /// Which probes the pods carry: both (the benchmark), or only one
    /// kind, to see what each costs the agent.
    http: bool,
    exec: bool,
}

fn args() -> Result<Args> {
    let mut a = Args {
        pods: 100,
        seconds: 60,
        http: true,
        exec: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let (name, value) = match flag.split_once('=') {
            Some((n, v)) => (n.to_string(), v.to_string()),
            None => (flag.clone(), it.next().unwrap_or_default()),
        };
        match name.as_str() {
            "--pods" => a.pods = value.parse().context("--pods")?,
            "--seconds" => a.seconds = value.parse().context("--seconds")?,
            "--probes" => {
                (a.http, a.exec) = match value.as_str() {
                    "both" => (true, true),
                    "http" => (true, false),
                    "exec" => (false, true),
                    "none" => (false, false),
                    other => bail!("--probes {other}: want both, http, exec or none"),
                }
            }
            _ => bail!(
                "unknown flag {flag}; usage: bench-probes [--pods N] [--seconds S] [--probes both|http|exec|none]"
            ),
        }
    }
    Ok(a)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let a = args()?;
    let window = Duration::from_secs(a.seconds);
    let cd = Containerd::start().await.context("starting containerd")?;
    let cri = cd.client();
    let mut agent = Agent::start(&cd, AgentOptions::default()).await?;
    let pid = agent.pid().context("agent pid")?;

    let t = Instant::now();
    for i in 0..a.pods {
        let m = manifest(&format!("probe-{i}"), a.http, a.exec);
        agent.write_manifest(&format!("probe-{i}.yaml"), &m)?;
    }
    let targets = wait_ready(&agent, a.pods).await?;
    println!(
        "{} pods Ready in {:.1} s; measuring {} s",
        a.pods,
        t.elapsed().as_secs_f64(),
        a.seconds
    );
    // Let start-up work settle before the window opens.
    tokio::time::sleep(Duration::from_secs(5)).await;

    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()?;
    let metrics_url = format!("http://{}/metrics", agent.status_address());
    let before = scrape(&http, &metrics_url).await?;
    let cpu0 = cpu_ticks(pid)?;
    let t0 = Instant::now();
    tokio::time::sleep(window).await;
    let cpu1 = cpu_ticks(pid)?;
    let elapsed = t0.elapsed();
    let after = scrape(&http, &metrics_url).await?;
    let rss_kib = rss_kib(pid)?;
    let agent_cpu = (cpu1 - cpu0) / CLK_TCK / elapsed.as_secs_f64() * 100.0;
    let exec_h = histogram_delta(&before, &after, "Liveness");
    let http_h = histogram_delta(&before, &after, "Readiness");
    let still_ready = agent
        .pods()
        .await?
        .iter()
        .filter(|p| pods::ready(p))
        .count();

    // Raw: the agent goes (its containers stay), the same probes from here.
    agent.kill();
    let self0 = cpu_ticks(std::process::id())?;
    let r0 = Instant::now();
    let raw = raw_probes(&cri, &targets, window, a.http, a.exec).await;
    let self_cpu =
        (cpu_ticks(std::process::id())? - self0) / CLK_TCK / r0.elapsed().as_secs_f64() * 100.0;
    for (kind, on, agent_n, raw_side) in [
        ("exec", a.exec, exec_h.count, &raw.exec),
        ("http", a.http, http_h.count, &raw.http),
    ] {
        if on {
            both_sides_measured(kind, agent_n, raw_side, a.seconds, targets.len())?;
        }
    }
    let (raw_exec, raw_http) = (raw.exec.ok, raw.http.ok);

    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let (ae50, ae99) = (exec_h.quantile(0.5) * 1e3, exec_h.quantile(0.99) * 1e3);
    let (ah50, ah99) = (http_h.quantile(0.5) * 1e3, http_h.quantile(0.99) * 1e3);
    let (re50, re99) = (ms(pct(&raw_exec, 50.0)), ms(pct(&raw_exec, 99.0)));
    let (rh50, rh99) = (ms(pct(&raw_http, 50.0)), ms(pct(&raw_http, 99.0)));
    let exec_ratio = ae50 / re50;
    let http_ratio = ah50 / rh50;
    let kinds = match (a.http, a.exec) {
        (true, true) => "httpGet readiness + exec liveness",
        (true, false) => "httpGet readiness only",
        (false, true) => "exec liveness only",
        _ => "no probes",
    };
    println!("{} pods, {kinds} at 1 s, {} s window:", a.pods, a.seconds);
    println!(
        "  agent CPU {agent_cpu:.1} % of one core   RSS {:.1} MiB   (aim: CPU <= 5 %)",
        rss_kib as f64 / 1024.0
    );
    println!(
        "  probes run by the agent: exec {:.0}/s, http {:.0}/s; pods Ready at the end: {still_ready}/{}",
        exec_h.count / elapsed.as_secs_f64(),
        http_h.count / elapsed.as_secs_f64(),
        a.pods
    );
    println!("latency (ms)            p50       p99");
    println!("  agent exec probe  {ae50:8.2}  {ae99:8.2}");
    println!("  raw ExecSync      {re50:8.2}  {re99:8.2}");
    println!("  agent http probe  {ah50:8.2}  {ah99:8.2}");
    println!("  raw HTTP GET      {rh50:8.2}  {rh99:8.2}");
    println!(
        "ratios (p50): exec {exec_ratio:.2} (aim <= 1.5), http {http_ratio:.2}; p99: exec {:.2}, http {:.2}",
        ae99 / re99,
        ah99 / rh99
    );
    println!(
        "raw prober (this program) CPU for the same probes: {self_cpu:.1} % of one core ({} exec, {} http)",
        raw_exec.len(),
        raw_http.len()
    );
    let json = serde_json::json!({
        "bench": "probes",
        "pods": a.pods,
        "seconds": a.seconds,
        "probes": kinds,
        "agent_cpu_pct": agent_cpu,
        "agent_rss_mib": rss_kib as f64 / 1024.0,
        "agent_exec_probes_per_s": exec_h.count / elapsed.as_secs_f64(),
        "agent_http_probes_per_s": http_h.count / elapsed.as_secs_f64(),
        "agent_exec_p50_ms": ae50, "agent_exec_p99_ms": ae99,
        "agent_http_p50_ms": ah50, "agent_http_p99_ms": ah99,
        "raw_exec_p50_ms": re50, "raw_exec_p99_ms": re99,
        "raw_http_p50_ms": rh50, "raw_http_p99_ms": rh99,
        "exec_p50_ratio": exec_ratio,
        "http_p50_ratio": http_ratio,
        "raw_prober_cpu_pct": self_cpu,
        "pods_ready_at_end": still_ready,
    });
    println!("{json}");
    drop(agent);
    cd.cleanup().await?;
    Ok(())
}

fn manifest(name: &str, http: bool, exec: bool) -> String {
    let mut m = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {TOOLBOX_IMAGE}\n    imagePullPolicy: Never\n    command: [sh, -c, 'mkdir -p /www && echo ok > /www/healthz && exec httpd -f -p 8080 -h /www']\n"
    );
    if http {
        m += "    readinessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 1}\n";
    }
    if exec {
        m += "    livenessProbe: {exec: {command: [cat, /www/healthz]}, periodSeconds: 1}\n";
    }
    m
}

/// (container id, pod IP) of each pod once all are Ready.
async fn wait_ready(agent: &Agent, n: usize) -> Result<Vec<(String, String)>> {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let ps = agent.pods().await?;
        let ready: Vec<_> = ps.iter().filter(|p| pods::ready(p)).collect();
        if ready.len() >= n {
            return Ok(ready
                .iter()
                .map(|p| {
                    let id = pods::container_id(p, "c")
                        .trim_start_matches("containerd://")
                        .to_string();
                    let ip = p
                        .status
                        .as_ref()
                        .and_then(|s| s.pod_ip.clone())
                        .unwrap_or_default();
                    (id, ip)
                })
                .collect());
        }
        if Instant::now() > deadline {
            bail!(
                "only {}/{n} pods Ready after 10 min\n{}",
                ready.len(),
                agent.log_tail(30)
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// A side that completed nothing has no latency to compare: say why
/// rather than print ratios against zero (the run then exits non-zero).
fn both_sides_measured(
    kind: &str,
    agent_probes: f64,
    raw: &Outcomes,
    seconds: u64,
    targets: usize,
) -> Result<()> {
    ensure!(
        agent_probes >= 1.0,
        "the agent ran no {kind} probe in the {seconds} s window ({targets} pods listed as targets)"
    );
    ensure!(
        !raw.ok.is_empty(),
        "the raw {kind} prober completed no probe in the {seconds} s window over {targets} pods: {} failed{}",
        raw.failed,
        raw.first_error
            .as_deref()
            .map(|e| format!(", the first with: {e}"))
            .unwrap_or_default()
    );
    Ok(())
}

/// What one kind of raw probe gave: the latencies of those that passed,
/// how many failed and why the first did.
#[derive(Default)]
struct Outcomes {
    ok: Vec<Duration>,
    failed: usize,
    first_error: Option<String>,
}

impl Outcomes {
    fn record(&mut self, r: Result<Duration, String>) {
        match r {
            Ok(d) => self.ok.push(d),
            Err(e) => {
                self.failed += 1;
                self.first_error.get_or_insert(e);
            }
        }
    }
}

struct Raw {
    exec: Outcomes,
    http: Outcomes,
}

/// Issue the pods' probes directly for `window`: per pod, one ExecSync and
/// one GET per period, each at a random phase.
async fn raw_probes(
    cri: &CriClient,
    targets: &[(String, String)],
    window: Duration,
    with_http: bool,
    with_exec: bool,
) -> Raw {
    let exec = Arc::new(Mutex::new(Outcomes::default()));
    let http = Arc::new(Mutex::new(Outcomes::default()));
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(1))
        .build()
        .expect("http client");
    let end = Instant::now() + window;
    let mut tasks = Vec::new();
    for (id, ip) in targets {
        let (cri, id, out) = (cri.clone(), id.clone(), exec.clone());
        tasks.push(tokio::spawn(every_period(end, with_exec, move || {
            let (cri, id, out) = (cri.clone(), id.clone(), out.clone());
            async move {
                let t = Instant::now();
                let r = cri
                    .exec_sync(v1::ExecSyncRequest {
                        container_id: id,
                        cmd: vec!["cat".into(), "/www/healthz".into()],
                        timeout: 1,
                    })
                    .await;
                let r = match r {
                    Ok(r) if r.exit_code == 0 => Ok(t.elapsed()),
                    Ok(r) => Err(format!("exit code {}", r.exit_code)),
                    Err(e) => Err(e.to_string()),
                };
                out.lock().unwrap().record(r);
            }
        })));
        let (client, url, out) = (
            client.clone(),
            format!("http://{ip}:8080/healthz"),
            http.clone(),
        );
        tasks.push(tokio::spawn(every_period(end, with_http, move || {
            let (client, url, out) = (client.clone(), url.clone(), out.clone());
            async move {
                let t = Instant::now();
                let r = match client.get(&url).send().await {
                    Ok(r) if r.status().is_success() => match r.bytes().await {
                        Ok(_) => Ok(t.elapsed()),
                        Err(e) => Err(format!("GET {url}: {e}")),
                    },
                    Ok(r) => Err(format!("GET {url}: {}", r.status())),
                    Err(e) => Err(format!("GET {url}: {e}")),
                };
                out.lock().unwrap().record(r);
            }
        })));
    }
    for t in tasks {
        let _ = t.await;
    }
    let take = |v: Arc<Mutex<Outcomes>>| std::mem::take(&mut *v.lock().unwrap());
    Raw {
        exec: take(exec),
        http: take(http),
    }
}

/// Run `f` once per period, starting at a random point of the first one,
/// until `end` (not at all unless `enabled`).
async fn every_period<F, Fut>(end: Instant, enabled: bool, f: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    if !enabled {
        return;
    }
    let offset = PERIOD.mul_f64(rand::random::<f64>());
    let mut tick = tokio::time::interval_at((Instant::now() + offset).into(), PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if Instant::now() >= end {
            return;
        }
        f().await;
    }
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces): state is
    // field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').context("stat format")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = f.get(11).context("utime")?.parse()?;
    let stime: f64 = f.get(12).context("stime")?.parse()?;
    Ok(utime + stime)
}

fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .context("VmRSS")?;
    Ok(line
        .split_whitespace()
        .nth(1)
        .context("VmRSS value")?
        .parse()?)
}

async fn scrape(http: &reqwest::Client, url: &str) -> Result<String> {
    Ok(http
        .get(url)
        .send()
        .await?
        .error_for_status()
        .with_context(|| format!("GET {url}"))?
        .text()
        .await?)
}

/// A cumulative histogram: upper bounds with their counts, and the total.
#[derive(Debug, Default)]
struct Hist {
    buckets: Vec<(f64, f64)>,
    count: f64,
}

impl Hist {
    /// The `q` quantile in seconds, interpolated linearly in its bucket.
    fn quantile(&self, q: f64) -> f64 {
        if self.count <= 0.0 {
            return 0.0;
        }
        let want = q * self.count;
        let (mut lo, mut below) = (0.0, 0.0);
        for &(le, cum) in &self.buckets {
            if cum >= want {
                if le.is_infinite() {
                    return lo;
                }
                let inside = cum - below;
                let frac = if inside > 0.0 {
                    (want - below) / inside
                } else {
                    0.0
                };
                return lo + (le - lo) * frac;
            }
            lo = le;
            below = cum;
        }
        lo
    }
}

/// `prober_probe_duration_seconds` of one probe type (all results), as
/// the difference between two scrapes.
fn histogram_delta(before: &str, after: &str, probe_type: &str) -> Hist {
    let b = buckets(before, probe_type);
    let a = buckets(after, probe_type);
    let mut out = Hist::default();
    let mut les: Vec<f64> = a.keys().map(|k| f64::from_bits(*k)).collect();
    les.sort_by(|x, y| x.total_cmp(y));
    for le in les {
        let k = le.to_bits();
        let d = a.get(&k).copied().unwrap_or(0.0) - b.get(&k).copied().unwrap_or(0.0);
        out.buckets.push((le, d));
    }
    out.count = out.buckets.last().map_or(0.0, |(_, c)| *c);
    out
}

/// Cumulative bucket counts by upper bound (as bits, to key a map), summed
/// over the result label.
fn buckets(text: &str, probe_type: &str) -> HashMap<u64, f64> {
    let mut m = HashMap::new();
    let want = format!("probe_type=\"{probe_type}\"");
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("prober_probe_duration_seconds_bucket{") else {
            continue;
        };
        if !rest.contains(&want) {
            continue;
        }
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let Some(le) = labels
            .split(',')
            .find_map(|l| l.strip_prefix("le=\""))
            .map(|v| v.trim_end_matches('"'))
        else {
            continue;
        };
        let le = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().unwrap_or(f64::NAN)
        };
        let v: f64 = value.trim().parse().unwrap_or(0.0);
        *m.entry(le.to_bits()).or_insert(0.0) += v;
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_ratio_over_a_side_that_measured_nothing() {
        let mut raw = Outcomes::default();
        raw.record(Err("exit code 126".into()));
        raw.record(Err("exit code 127".into()));
        let e = both_sides_measured("exec", 50.0, &raw, 60, 100).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the raw exec prober completed no probe in the 60 s window over 100 pods: 2 failed, the first with: exit code 126"
        );
        let e = both_sides_measured("http", 0.0, &raw, 60, 100).unwrap_err();
        assert!(
            e.to_string().starts_with("the agent ran no http probe"),
            "{e}"
        );
        raw.record(Ok(Duration::from_millis(3)));
        both_sides_measured("exec", 50.0, &raw, 60, 100).unwrap();
    }
}
