//! CPU time and memory from /proc: the figures that stay meaningful when
//! other work shares the machine (wall-clock ones do not).

/// The unit of /proc's CPU times: the kernel ABI fixes `USER_HZ` at 100
/// whatever the kernel's own tick rate.
const USER_HZ: f64 = 100.0;

/// User + system CPU seconds of process `pid` (all its threads).
fn process_cpu_secs(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are the
    // 14th and 15th of the line.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / USER_HZ
}

/// (busy, total) CPU seconds of the whole machine since boot, all cores.
fn machine_cpu_secs() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().next() else {
        return (0.0, 0.0);
    };
    let v: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is
    // already counted in user).
    let total: f64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0.0) + v.get(4).copied().unwrap_or(0.0);
    ((total - idle) / USER_HZ, total / USER_HZ)
}

/// A reading of the CPU counters the benchmark reports per phase.
#[derive(Debug, Clone, Copy)]
pub struct Mark {
    server: f64,
    client: f64,
    busy: f64,
    total: f64,
}

/// CPU used between two [`Mark`]s, in seconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct Used {
    /// The skiff-server process.
    pub server: f64,
    /// This process (the load generator, or the store itself for raw writes).
    pub client: f64,
    /// Everything else on the machine (other builds and tests).
    pub others: f64,
    /// Core-seconds the machine had in that time.
    pub capacity: f64,
}

impl Mark {
    pub fn now(server_pid: u32) -> Mark {
        let (busy, total) = machine_cpu_secs();
        Mark {
            server: process_cpu_secs(&server_pid.to_string()),
            client: process_cpu_secs("self"),
            busy,
            total,
        }
    }

    pub fn used_since(&self, start: &Mark) -> Used {
        let server = self.server - start.server;
        let client = self.client - start.client;
        Used {
            server,
            client,
            others: (self.busy - start.busy - server - client).max(0.0),
            capacity: self.total - start.total,
        }
    }
}

impl std::ops::Add for Used {
    type Output = Used;
    fn add(self, o: Used) -> Used {
        Used {
            server: self.server + o.server,
            client: self.client + o.client,
            others: self.others + o.others,
            capacity: self.capacity + o.capacity,
        }
    }
}

/// Peak resident set (VmHWM) of `pid`, KiB.
pub fn peak_rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmHWM:")
}

/// Resident set (VmRSS) of `pid`, KiB (bench_watch_cache's).
#[allow(dead_code)]
pub fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:")
}

fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}
