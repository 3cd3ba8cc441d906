//! `cargo bench -p swiftlet-benches --bench steady_state`: what idle pods cost the agent on a
//! node, measured as an operator measures it, on the real containerd.
//!
//! **Operator rows.** For each N (`--pods`, default 100 and 250): a fresh release agent with the
//! default flags (besides what the harness needs to run it beside other agents: its root and
//! manifest dirs, node name, ports, cgroup root, `-v 0`, the tests' eviction thresholds, which
//! change only the disk percentages; `--file-check-frequency 20s` is the default; `--max-pods`
//! only when N is over the default 110), its N busybox static pods' manifests written at once;
//! the time until all N are `Running`; then, after `--settle` s (default 30), a window of
//! `--window` s (default 150, longer than every periodic job of the agent but image GC's 5 min:
//! the pods' resyncs every 60-90 s, the relist every 60 s (every second without the probes),
//! file rescans every 20 s, orphan scans, container GC, log rotation and eviction every 10 s,
//! housekeeping every 2 s) while nothing changes: the whole process's CPU time as a share of one
//! core, split by thread (threads that exited during the window, the blocking pool's, are
//! counted as "exited"), its RSS, and what ran in the window by the agent's own counters
//! (relists, pod syncs, CRI calls by method, pod reads, eBPF records and reader wake-ups).
//!
//! **Baseline beside it** (with `--baseline-flags "<flags>"` or `--baseline-agent <binary>`): at
//! each N a second fresh agent, started from `<binary>` (default: the same release agent) with
//! `<flags>` added, runs its own N pods beside the first, and both are watched over the same
//! windows: a change measured against the build or the setting before it on the same busy host
//! (`--baseline-flags "--pleg-safety-net-period 0"` is the relist cadence before the safety net).
//!
//! **Foreign churn** (at the first N, unless `--no-foreign`): a second fresh agent with
//! `--ebpf off` and N pods of its own runs beside the first (probes loaded); both are watched
//! over the same windows, once quiet and once while a workload outside the pods starts processes
//! (`/bin/true` in a loop, in cgroups of its own) and makes and removes cgroups (a `mkdir`/`rmdir`
//! loop in the cgroup2 hierarchy and in a v1 one): what the probes cost when the host is busy
//! with something else.
//!
//! **Restarted rows** (at the largest N, unless `--no-settings`): the agent restarted (SIGTERM;
//! its pods keep running and are adopted) into each setting, left `--setting-settle` s (default
//! 15), watched `--setting-window` s (default 60): the defaults (eBPF on, the relist a 60 s
//! safety net), eBPF on with `--pleg-safety-net-period 0` (the relist every second, as before
//! the safety net), and `--ebpf off`. These rows compare settings; they are not what a node pays: a window of 60 s
//! after a restart holds only the resyncs the restart's own syncs scheduled into it.
//!
//! **Pod churn** (at the largest N, unless `--no-churn`): pods created and deleted at
//! `--churn-rate` a minute (default 300) for `--churn-secs` (default 60), each living
//! `--churn-life` s (default 10), beside the N steady pods; the eBPF events lost meanwhile; and
//! once every churned pod is gone, the fault-injection suite's invariant
//! (`swiftlet_tests::chaos::check`): every steady pod Running exactly once, and nothing left of
//! the churned ones (sandboxes, containers, pod cgroups in every hierarchy, shm mounts, pod log
//! and state directories).
//!
//! **Scraped** (with `--scrape-every S`): in the fresh rows' windows the measured agent is
//! scraped every S s (`/metrics`, `/metrics/cadvisor`, `/metrics/probes`, `/metrics/resource` on
//! the read-only port, as a monitoring job reads a kubelet; 15 s is the usual interval); a
//! baseline of the same build (`--baseline-flags ""`) beside it is not, so the two rows show what
//! the scrapes cost.
//!
//! `cargo bench -p swiftlet-benches --bench steady_state [-- --pods 100,250 --window 150 ...]`.
//! Without root or containerd it says so and exits 0, unless `SWIFTLET_REQUIRE_RUNTIME=1`.
use std::collections::BTreeMap;
use std::process::{Child, ExitCode};
use std::time::{Duration, Instant};

use swiftlet_benches::{bucket_quantile, cpu_ms, histogram_buckets, rss_kib, ticks_per_sec};
use swiftlet_tests::chaos::{Desired, converge};
use swiftlet_tests::{Agent, AgentOptions, PodList, Runtime, busybox_pod_manifest};

const RELIST: &str = "swiftlet_pleg_relist_duration_seconds";
const START_TIMEOUT: Duration = Duration::from_secs(900);
/// The agent's default `--max-pods`.
const DEFAULT_MAX_PODS: usize = 110;

struct Opts {
    pods: Vec<usize>,
    window: u64,
    settle: u64,
    setting_window: u64,
    setting_settle: u64,
    churn_rate: u64,
    churn_secs: u64,
    churn_life: u64,
    foreign: bool,
    settings: bool,
    pod_churn: bool,
    /// The baseline agent's binary (`None`: the measured one) and its extra flags, when asked.
    baseline: Option<(Option<String>, Vec<String>)>,
    /// Seconds between two scrapes of the measured agent in the fresh rows' windows (0: none).
    scrape_every: u64,
}

fn parse_opts() -> Result<Opts, String> {
    let mut o = Opts {
        pods: vec![100, 250],
        window: 150,
        settle: 30,
        setting_window: 60,
        setting_settle: 15,
        churn_rate: 300,
        churn_secs: 60,
        churn_life: 10,
        foreign: true,
        settings: true,
        pod_churn: true,
        baseline: None,
        scrape_every: 0,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let target = match a.as_str() {
            "--pods" => {
                let v = args.next().ok_or("--pods needs a value")?;
                o.pods = swiftlet_benches::number_list("--pods", &v)?;
                continue;
            }
            "--no-foreign" => {
                o.foreign = false;
                continue;
            }
            "--no-settings" => {
                o.settings = false;
                continue;
            }
            "--no-churn" => {
                o.pod_churn = false;
                continue;
            }
            "--scrape-every" => {
                let v = args.next().ok_or("--scrape-every needs seconds")?;
                o.scrape_every = v
                    .parse()
                    .map_err(|_| format!("--scrape-every {v:?}: not a number of seconds"))?;
                continue;
            }
            "--baseline-flags" => {
                let v = args.next().ok_or("--baseline-flags needs a value")?;
                let flags = v.split_whitespace().map(str::to_owned).collect();
                o.baseline.get_or_insert_with(Default::default).1 = flags;
                continue;
            }
            "--baseline-agent" => {
                let v = args.next().ok_or("--baseline-agent needs a binary")?;
                o.baseline.get_or_insert_with(Default::default).0 = Some(v);
                continue;
            }
            "--window" => &mut o.window,
            "--settle" => &mut o.settle,
            "--setting-window" => &mut o.setting_window,
            "--setting-settle" => &mut o.setting_settle,
            "--churn-rate" => &mut o.churn_rate,
            "--churn-secs" => &mut o.churn_secs,
            "--churn-life" => &mut o.churn_life,
            // cargo bench passes --bench.
            _ => continue,
        };
        *target = args
            .next()
            .and_then(|v| v.parse().ok())
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("{a} needs a positive number"))?;
    }
    o.pods.sort_unstable();
    o.pods.dedup();
    if o.pods.is_empty() || o.pods.contains(&0) {
        return Err("--pods must list positive numbers".into());
    }
    Ok(o)
}

fn manifest(name: &str) -> String {
    busybox_pod_manifest(
        &format!("name: {name}, namespace: default"),
        "",
        "sleep 3600 & wait",
        "",
    )
}

fn running(list: &PodList) -> usize {
    list.items
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .count()
}

/// `VmHWM` (peak RSS) of `pid` in KiB.
fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// CPU time (ms) of each live thread of `pid` by thread id: (name, ms), from
/// `/proc/<pid>/task/*/stat` (clock ticks).
fn thread_cpu(pid: u32) -> BTreeMap<u32, (String, f64)> {
    let mut out = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name = stat[open + 1..close].to_owned();
        // utime and stime: the 12th and 13th fields after the command.
        let f: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        let ticks: u64 = [11, 12]
            .iter()
            .filter_map(|&i| f.get(i)?.parse::<u64>().ok())
            .sum();
        out.insert(tid, (name, ticks as f64 * 1000.0 / ticks_per_sec()));
    }
    out
}

/// Every sample of the agent's metrics but histogram buckets: `name{labels}` -> value.
fn samples(agent: &Agent) -> BTreeMap<String, f64> {
    let (_, body) = agent.get("/metrics");
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            (!key.contains("_bucket{")).then(|| Some((key.to_owned(), value.parse().ok()?)))?
        })
        .collect()
}

/// What one agent looked like at one instant.
struct Snapshot {
    cpu_ms: f64,
    threads: BTreeMap<u32, (String, f64)>,
    samples: BTreeMap<String, f64>,
    relists: Vec<(f64, u64)>,
    at: Instant,
}

fn snapshot(agent: &Agent) -> Snapshot {
    let pid = agent.pid().expect("the agent runs");
    let (_, body) = agent.get("/metrics");
    let (relists, _) = histogram_buckets(&body, RELIST);
    Snapshot {
        cpu_ms: cpu_ms(pid).unwrap_or(0.0),
        threads: thread_cpu(pid),
        samples: samples(agent),
        relists,
        at: Instant::now(),
    }
}

/// One agent over one window.
struct Window {
    secs: f64,
    cpu_pct: f64,
    /// Thread name -> (CPU ms in the window, threads); "exited": CPU of threads gone by the end.
    threads: BTreeMap<String, (f64, usize)>,
    /// Counters and histogram counts that moved in the window.
    moved: BTreeMap<String, f64>,
    rss_mib: f64,
    peak_mib: f64,
    relists: u64,
    relist_p50_ms: Option<f64>,
    relist_p99_ms: Option<f64>,
}

fn window(agent: &Agent, a: &Snapshot, b: &Snapshot) -> Window {
    let pid = agent.pid().expect("the agent runs");
    let secs = b.at.duration_since(a.at).as_secs_f64();
    let cpu = (b.cpu_ms - a.cpu_ms).max(0.0);
    let mut threads: BTreeMap<String, (f64, usize)> = BTreeMap::new();
    let mut live = 0.0;
    for (tid, (name, ms)) in &b.threads {
        let before = a.threads.get(tid).map_or(0.0, |(_, m)| *m);
        let entry = threads.entry(name.clone()).or_default();
        entry.0 += ms - before;
        entry.1 += 1;
        live += ms - before;
    }
    // Ticks are 10 ms: a small negative remainder is rounding.
    let exited = cpu - live;
    if exited > 10.0 {
        threads.insert("exited".into(), (exited, 0));
    }
    let moved = b
        .samples
        .iter()
        .filter(|(k, _)| {
            let name = k.split('{').next().unwrap_or(k);
            name.ends_with("_total") || name.ends_with("_count")
        })
        .filter_map(|(k, v)| {
            let d = v - a.samples.get(k).copied().unwrap_or(0.0);
            (d != 0.0).then(|| (k.trim_start_matches("swiftlet_").to_owned(), d))
        })
        .collect();
    let delta: Vec<(f64, u64)> = b
        .relists
        .iter()
        .map(|&(le, n)| {
            let before = a
                .relists
                .iter()
                .find(|(l, _)| *l == le)
                .map_or(0, |(_, m)| *m);
            (le, n.saturating_sub(before))
        })
        .collect();
    let count_key = format!("{RELIST}_count");
    let count = (b.samples.get(&count_key).copied().unwrap_or(0.0)
        - a.samples.get(&count_key).copied().unwrap_or(0.0))
    .max(0.0) as u64;
    let ms = |q| bucket_quantile(&delta, count, q).map(|s| s * 1000.0);
    let kib = |v: Option<u64>| v.unwrap_or(0) as f64 / 1024.0;
    Window {
        secs,
        cpu_pct: cpu / 1000.0 / secs * 100.0,
        threads,
        moved,
        rss_mib: kib(rss_kib(pid)),
        peak_mib: kib(peak_rss_kib(pid)),
        relists: count,
        relist_p50_ms: ms(0.5),
        relist_p99_ms: ms(0.99),
    }
}

/// What a monitoring scrape reads of a node's kubelet, every 15 s with the usual ServiceMonitor.
const SCRAPED: [&str; 4] = [
    "/metrics",
    "/metrics/cadvisor",
    "/metrics/probes",
    "/metrics/resource",
];

/// [`watch`], while `scraped` (when given) is scraped every `every` s: each of [`SCRAPED`] in
/// turn, as Prometheus' jobs would.
fn watch_scraped(agents: &[&Agent], secs: u64, scraped: Option<&Agent>, every: u64) -> Vec<Window> {
    let Some(target) = scraped.filter(|_| every > 0) else {
        return watch(agents, secs);
    };
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut next = Instant::now();
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                if Instant::now() >= next {
                    for path in SCRAPED {
                        let (code, body) = target.get(path);
                        assert_eq!(code, 200, "{path}: {body}");
                    }
                    next += Duration::from_secs(every);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let windows = watch(agents, secs);
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        windows
    })
}

/// Watches `agents` over the same `secs` s.
fn watch(agents: &[&Agent], secs: u64) -> Vec<Window> {
    let before: Vec<Snapshot> = agents.iter().map(|a| snapshot(a)).collect();
    std::thread::sleep(Duration::from_secs(secs));
    let after: Vec<Snapshot> = agents.iter().map(|a| snapshot(a)).collect();
    agents
        .iter()
        .zip(before.iter().zip(&after))
        .map(|(agent, (a, b))| window(agent, a, b))
        .collect()
}

fn bound(ms: Option<f64>) -> String {
    ms.map_or("-".into(), |v| format!("<= {v:.1}"))
}

fn print_window(label: &str, w: &Window) {
    println!(
        "  {label}: CPU {:.3} % of a core over {:.0} s ({:.0} ms); RSS {:.1} MiB (peak {:.1}); \
         {} relists, p50 {} ms, p99 {} ms",
        w.cpu_pct,
        w.secs,
        w.cpu_pct * w.secs * 10.0,
        w.rss_mib,
        w.peak_mib,
        w.relists,
        bound(w.relist_p50_ms),
        bound(w.relist_p99_ms),
    );
    let mut threads: Vec<_> = w.threads.iter().collect();
    threads.sort_by(|a, b| b.1.0.total_cmp(&a.1.0));
    let threads: Vec<String> = threads
        .iter()
        .map(|(name, (ms, n))| {
            if *n == 0 {
                format!("{name} {ms:.0} ms")
            } else {
                format!("{name} x{n} {ms:.0} ms")
            }
        })
        .collect();
    println!("    threads: {}", threads.join(", "));
    let moved: Vec<String> = w
        .moved
        .iter()
        .map(|(k, d)| format!("{k} +{d:.0}"))
        .collect();
    println!("    in the window: {}", moved.join(", "));
}

/// The settings of the restarted rows: (label, flag, value).
const SETTINGS: [&str; 3] = [
    "restarted: defaults (eBPF on, relist a 60 s safety net)",
    "restarted: eBPF on, --pleg-safety-net-period 0 (relist every 1 s)",
    "restarted: --ebpf off (relist every 1 s)",
];

/// Restarts the agent into setting `i` of [`SETTINGS`] (from setting `i - 1`, or the defaults).
fn enter_setting(agent: &mut Agent, i: usize) {
    match i {
        0 => {
            agent.restart_with_flag("--ebpf", "auto");
            agent.restart_with_flag("--pleg-safety-net-period", "60s");
        }
        1 => agent.restart_with_flag("--pleg-safety-net-period", "0s"),
        _ => {
            agent.restart_with_flag("--pleg-safety-net-period", "60s");
            agent.restart_with_flag("--ebpf", "off");
        }
    }
}

/// `/debug/trace/pods`' `events_lost`: ring-buffer records the probes could not hand over.
fn events_lost(agent: &Agent) -> Option<u64> {
    let (status, body) = agent.get("/debug/trace/pods");
    if status != 200 {
        return None;
    }
    serde_json::from_str::<serde_json::Value>(&body)
        .ok()?
        .get("events_lost")?
        .as_u64()
}

/// Pods `c<k>` created every `60 / rate` s and each removed `life` s after it was created, for
/// `secs` s; then the rest removed. Returns how many were created.
fn churn(agent: &Agent, opts: &Opts) -> usize {
    let interval = Duration::from_secs_f64(60.0 / opts.churn_rate as f64);
    let live = ((opts.churn_life as f64) / interval.as_secs_f64()).ceil() as usize;
    let total = (opts.churn_secs as f64 / interval.as_secs_f64()) as usize;
    let start = Instant::now();
    for k in 0..total {
        let due = start + interval * u32::try_from(k).unwrap_or(u32::MAX);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        agent.write_manifest(&format!("c{k}.yaml"), &manifest(&format!("c{k}")));
        if k >= live {
            agent.remove_manifest(&format!("c{}.yaml", k - live));
        }
        if k % 50 == 49 {
            eprintln!("  churn: {} created in {:.0?}", k + 1, start.elapsed());
        }
    }
    for k in total.saturating_sub(live)..total {
        agent.remove_manifest(&format!("c{k}.yaml"));
    }
    total
}

/// A workload outside the pods: a shell starting `/bin/true` in a loop, in cgroups of its own
/// (cgroup2 and the v1 `cpu` hierarchy, where present), and one making and removing a cgroup
/// in the cgroup2 hierarchy and in the v1 `memory` one about every 10 ms. Killed (and its
/// cgroups removed) on drop.
struct ForeignChurn {
    children: Vec<Child>,
    dirs: Vec<std::path::PathBuf>,
}

impl ForeignChurn {
    fn start() -> std::io::Result<ForeignChurn> {
        let name = format!("swiftlet-bench-foreign-{}", std::process::id());
        let hierarchies: Vec<&str> = [
            "/sys/fs/cgroup/unified",
            "/sys/fs/cgroup",
            "/sys/fs/cgroup/cpu",
            "/sys/fs/cgroup/memory",
        ]
        .into_iter()
        .filter(|h| std::path::Path::new(h).join("cgroup.procs").is_file())
        .collect();
        let mut dirs = Vec::new();
        for h in &hierarchies {
            let dir = std::path::Path::new(h).join(&name);
            std::fs::create_dir_all(&dir)?;
            dirs.push(dir);
        }
        let join: String = dirs
            .iter()
            .map(|d| format!("echo $$ > {}/cgroup.procs; ", d.display()))
            .collect();
        let execs = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("{join}while :; do /bin/true; done"))
            .spawn()?;
        let mkdirs: String = hierarchies
            .iter()
            .map(|h| format!("mkdir {h}/{name}-$i && rmdir {h}/{name}-$i; "))
            .collect();
        let cgroups = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "{join}i=0; while :; do {mkdirs}i=$(((i + 1) % 100)); sleep 0.01; done"
            ))
            .spawn()?;
        Ok(ForeignChurn {
            children: vec![execs, cgroups],
            dirs,
        })
    }
}

impl Drop for ForeignChurn {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        for dir in &self.dirs {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Processes started on the host so far (`processes` of `/proc/stat`).
fn forks() -> u64 {
    std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("processes "))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// A fresh release agent (`-v 0`, the defaults but what it needs to run beside other agents)
/// with `pods` pods `<prefix><i>` all Running; with the manifests it was given.
fn fresh_agent(rt: &Runtime, name: &str, pods: usize, extra: &[&str]) -> (Agent, Desired) {
    fresh_agent_of(rt, name, None, pods, extra)
}

/// [`fresh_agent`] from `binary` (`None`: the measured release agent).
fn fresh_agent_of(
    rt: &Runtime,
    name: &str,
    binary: Option<&str>,
    pods: usize,
    extra: &[&str],
) -> (Agent, Desired) {
    let mut opts = AgentOptions::new(name);
    opts.verbosity = 0;
    // The default (the harness's own is 1 s).
    opts.file_check_frequency = "20s".into();
    opts.binary = Some(binary.map_or_else(swiftlet_tests::release_agent_binary, Into::into));
    if pods > DEFAULT_MAX_PODS {
        opts.extra_args = vec!["--max-pods".into(), (pods + 10).to_string()];
    }
    opts.extra_args
        .extend(extra.iter().map(|s| (*s).to_owned()));
    let agent = Agent::start(rt, opts);
    let mut desired = Desired::new();
    let start = Instant::now();
    for i in 0..pods {
        let name = format!("s{i}");
        let text = manifest(&name);
        agent.write_manifest(&format!("{name}.yaml"), &text);
        desired.insert(format!("{name}.yaml"), text);
    }
    agent.wait_for(|l| running(l) == pods, START_TIMEOUT);
    let took = start.elapsed();
    println!(
        "  {name}: {pods} pods Running in {:.1} s ({:.0} pods/min)",
        took.as_secs_f64(),
        pods as f64 / took.as_secs_f64() * 60.0
    );
    (agent, desired)
}

/// The options and the shared runtime, or the exit code to end with at once: 2 for bad
/// options, success when the runtime cannot run here (`Runtime::shared` printed why).
fn set_up() -> Result<(Opts, &'static Runtime), ExitCode> {
    let opts = parse_opts().map_err(|e| {
        eprintln!("steady_state: {e}");
        ExitCode::from(2)
    })?;
    let rt = Runtime::shared().ok_or_else(|| {
        eprintln!("steady_state: skipped (needs root and containerd)");
        ExitCode::SUCCESS
    })?;
    Ok((opts, rt))
}

/// The foreign-churn part at `n` pods beside `on` (probes loaded).
fn foreign(rt: &Runtime, on: &Agent, n: usize, opts: &Opts, summary: &mut Vec<String>) {
    println!("\nforeign churn at N = {n}: a second agent with --ebpf off and {n} pods of its own");
    let (off, _) = fresh_agent(rt, "steady-ebpf-off", n, &["--ebpf", "off"]);
    std::thread::sleep(Duration::from_secs(opts.settle));
    let agents = [on, &off];
    let labels = ["eBPF on (default)", "--ebpf off"];
    for churning in [false, true] {
        let workload = if churning {
            match ForeignChurn::start() {
                Ok(w) => Some(w),
                Err(e) => {
                    println!("  the foreign workload could not start: {e}");
                    return;
                }
            }
        } else {
            None
        };
        if churning {
            // Past its start.
            std::thread::sleep(Duration::from_secs(5));
        }
        let f0 = forks();
        let windows = watch(&agents, opts.window);
        let rate = (forks() - f0) as f64 / windows[0].secs;
        drop(workload);
        let what = if churning {
            format!("foreign processes and cgroups ({rate:.0} processes/s on the host)")
        } else {
            "quiet".to_owned()
        };
        println!(" N = {n}, side by side, {what}:");
        for (label, w) in labels.iter().zip(&windows) {
            print_window(label, w);
            summary.push(format!(
                "N={n:<4} side by side, {:<6} {label:<18} CPU {:.3} %",
                if churning { "churn" } else { "quiet" },
                w.cpu_pct
            ));
        }
    }
}

fn main() -> ExitCode {
    let (opts, rt) = match set_up() {
        Ok(v) => v,
        Err(code) => return code,
    };
    let largest = *opts.pods.last().unwrap_or(&0);
    println!(
        "steady_state: busybox pods sleeping; fresh agents with default flags; {} s settle, {} s \
         window; machine: {} cores",
        opts.settle,
        opts.window,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    let mut summary = Vec::new();
    let mut kept = None;
    for (k, &n) in opts.pods.iter().enumerate() {
        println!("\nN = {n}: a fresh agent, default flags");
        let (agent, desired) = fresh_agent(rt, "steady", n, &[]);
        let baseline = opts.baseline.as_ref().map(|(binary, flags)| {
            let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
            let name = "steady-baseline";
            (
                fresh_agent_of(rt, name, binary.as_deref(), n, &flags).0,
                flags.join(" "),
            )
        });
        std::thread::sleep(Duration::from_secs(opts.settle));
        let mut agents = vec![&agent];
        agents.extend(baseline.as_ref().map(|(b, _)| b));
        let windows = watch_scraped(&agents, opts.window, Some(&agent), opts.scrape_every);
        let mut labels = vec![if opts.scrape_every > 0 {
            format!(
                "this build, default flags, scraped every {} s",
                opts.scrape_every
            )
        } else {
            "this build, default flags".to_owned()
        }];
        labels.extend(baseline.as_ref().map(|(_, flags)| {
            let binary = opts.baseline.as_ref().and_then(|(b, _)| b.as_deref());
            format!("baseline {} {flags}", binary.unwrap_or("(same build)"))
        }));
        for (label, w) in labels.iter().zip(&windows) {
            print_window(&format!("N = {n}, fresh, {label}"), w);
            summary.push(format!(
                "N={n:<4} fresh, {label}, {:.0} s window: CPU {:.3} %, RSS {:.1} MiB (peak \
                 {:.1}), relist p99 {} ms",
                w.secs,
                w.cpu_pct,
                w.rss_mib,
                w.peak_mib,
                bound(w.relist_p99_ms)
            ));
        }
        drop(baseline);
        if k == 0 && opts.foreign {
            foreign(rt, &agent, n, &opts, &mut summary);
        }
        if n == largest {
            kept = Some((agent, desired));
        }
    }
    let Some((mut agent, mut desired)) = kept else {
        return ExitCode::FAILURE;
    };
    if opts.settings {
        println!(
            "\nN = {largest}, restarted per setting: {} s settle, {} s window (settings compared, \
             not a node's cost)",
            opts.setting_settle, opts.setting_window
        );
        for (i, label) in SETTINGS.iter().enumerate() {
            enter_setting(&mut agent, i);
            std::thread::sleep(Duration::from_secs(opts.setting_settle));
            let w = watch(&[&agent], opts.setting_window).remove(0);
            print_window(label, &w);
            summary.push(format!(
                "N={largest:<4} {label}, {:.0} s window: CPU {:.3} %, relist p99 {} ms",
                w.secs,
                w.cpu_pct,
                bound(w.relist_p99_ms)
            ));
        }
    }
    let mut leftovers = Ok(Duration::ZERO);
    if opts.pod_churn {
        if opts.settings {
            enter_setting(&mut agent, 0);
        }
        let churn_live = (opts.churn_rate * opts.churn_life).div_ceil(60) as usize;
        // Room for the churned pods beside the steady ones.
        agent.restart_with_flag("--max-pods", &(largest + 2 * churn_live + 10).to_string());
        println!(
            "\nchurn beside {largest} steady pods: {} pods/min for {} s, each living {} s",
            opts.churn_rate, opts.churn_secs, opts.churn_life
        );
        let lost_before = events_lost(&agent);
        let start = Instant::now();
        let created = churn(&agent, &opts);
        agent.wait_for(|l| l.items.len() == largest, START_TIMEOUT);
        println!(
            "  {created} pods created and deleted; the last gone {:.1} s after the churn began",
            start.elapsed().as_secs_f64()
        );
        match (lost_before, events_lost(&agent)) {
            (Some(a), Some(b)) => println!("  eBPF events lost during the churn: {}", b - a.min(b)),
            _ => println!("  eBPF events lost: not known (no probes or no /debug/trace/pods)"),
        }
        leftovers = converge(&agent, &desired, Duration::from_secs(120));
        match &leftovers {
            Ok(t) => println!(
                "  nothing left behind: every steady pod Running once, no sandbox, container, \
                 cgroup, mount, log or state directory of a churned pod ({:.1} s to hold)",
                t.as_secs_f64()
            ),
            Err(bad) => {
                println!("  LEFT BEHIND ({}):", bad.len());
                for b in bad.iter().take(20) {
                    println!("    {b}");
                }
            }
        }
    }
    println!(
        "\nsummary (goals at 250 pods: CPU <= 0.3 % of a core, RSS <= 48 MiB, relist p99 <= 10 ms):"
    );
    for line in &summary {
        println!("  {line}");
    }
    eprintln!("removing the pods ...");
    for file in desired.keys() {
        agent.remove_manifest(file);
    }
    desired.clear();
    agent.wait_for(|l| l.items.is_empty(), START_TIMEOUT);
    if leftovers.is_err() {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
