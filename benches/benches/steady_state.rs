//! `cargo bench -p swiftlet-benches --bench steady_state`: the agent at the node sizes
//! production uses, on the real containerd.
//!
//! One release agent (quiet, `--file-check-frequency 20s` as the kubelet's default, `--max-pods`
//! above the largest N plus the churn) runs busybox pods that sleep. For each N (default 110, the kubelet's default max-pods, then 250), grown from the
//! N before:
//! 1. **start**: the new pods' manifests written at once; the time until all N are `Running`
//!    on `/pods`;
//! 2. **steady state**, once per setting: the eBPF probes loaded with the default 1 s relist;
//!    the probes loaded with the relist a safety net only (`--pleg-relist-period 300s`, as the
//!    kubelet's Evented PLEG keeps it); no probes (`--ebpf off`, 1 s relist). The agent is
//!    restarted with SIGTERM between settings (its pods keep running and are adopted), left to
//!    settle (`--settle` s, default 15), then watched for `--window` s (default 60) while nothing
//!    changes: its CPU time (`/proc/<pid>/stat`) as a share of one core, its RSS at the end and
//!    its peak (`VmRSS`, `VmHWM`), and the PLEG relists it recorded in the window
//!    (`swiftlet_pleg_relist_duration_seconds`: count, p50 and p99 as the bucket bounds they
//!    fall under).
//!
//! Then, at the largest N with the probes and the default relist: **churn**, pods created and
//! deleted at `--churn-rate` a minute (default 300) for `--churn-secs` (default 60), each living
//! `--churn-life` s (default 10), beside the N steady pods; the eBPF events lost meanwhile; and
//! once every churned pod is gone, the fault-injection suite's invariant
//! (`swiftlet_tests::chaos::check`): every steady pod Running exactly once, and nothing left of
//! the churned ones (sandboxes, containers, pod cgroups in every hierarchy, shm mounts, pod log
//! and state directories).
//!
//! `cargo bench -p swiftlet-benches --bench steady_state [-- --pods 110,250 --window 60 ...]`.
//! Without root or containerd it says so and exits 0, unless `SWIFTLET_REQUIRE_RUNTIME=1`.
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use swiftlet_benches::{bucket_quantile, cpu_ms_over, histogram_buckets, rss_kib};
use swiftlet_tests::chaos::{Desired, converge};
use swiftlet_tests::{Agent, AgentOptions, PodList, Runtime, busybox_pod_manifest};

const RELIST: &str = "swiftlet_pleg_relist_duration_seconds";
const START_TIMEOUT: Duration = Duration::from_secs(900);

struct Opts {
    pods: Vec<usize>,
    window: u64,
    settle: u64,
    churn_rate: u64,
    churn_secs: u64,
    churn_life: u64,
}

fn parse_opts() -> Result<Opts, String> {
    let mut o = Opts {
        pods: vec![110, 250],
        window: 60,
        settle: 15,
        churn_rate: 300,
        churn_secs: 60,
        churn_life: 10,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let target = match a.as_str() {
            "--pods" => {
                let v = args.next().ok_or("--pods needs a value")?;
                o.pods = swiftlet_benches::number_list("--pods", &v)?;
                continue;
            }
            "--window" => &mut o.window,
            "--settle" => &mut o.settle,
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

/// The relist histogram's cumulative buckets and count now.
fn relists(agent: &Agent) -> (Vec<(f64, u64)>, u64) {
    let (_, body) = agent.get("/metrics");
    histogram_buckets(&body, RELIST)
}

/// One setting's steady state.
struct Steady {
    cpu_pct: f64,
    rss_mib: f64,
    peak_mib: f64,
    relists: u64,
    relist_p50_ms: Option<f64>,
    relist_p99_ms: Option<f64>,
}

fn steady(agent: &Agent, opts: &Opts) -> Steady {
    std::thread::sleep(Duration::from_secs(opts.settle));
    let pid = agent.pid().expect("the agent runs");
    let (b0, n0) = relists(agent);
    let start = Instant::now();
    let cpu = cpu_ms_over(pid, Duration::from_secs(opts.window)).unwrap_or(0.0);
    let elapsed = start.elapsed().as_secs_f64();
    let (b1, n1) = relists(agent);
    let delta: Vec<(f64, u64)> = b1
        .iter()
        .map(|&(le, n)| {
            let before = b0.iter().find(|(l, _)| *l == le).map_or(0, |(_, m)| *m);
            (le, n.saturating_sub(before))
        })
        .collect();
    let count = n1.saturating_sub(n0);
    let ms = |q| bucket_quantile(&delta, count, q).map(|s| s * 1000.0);
    let kib = |v: Option<u64>| v.unwrap_or(0) as f64 / 1024.0;
    Steady {
        cpu_pct: cpu / 1000.0 / elapsed * 100.0,
        rss_mib: kib(rss_kib(pid)),
        peak_mib: kib(peak_rss_kib(pid)),
        relists: count,
        relist_p50_ms: ms(0.5),
        relist_p99_ms: ms(0.99),
    }
}

fn bound(ms: Option<f64>) -> String {
    ms.map_or("-".into(), |v| format!("<= {v:.1}"))
}

/// The settings a steady state is measured in: (label, flag, value).
const SETTINGS: [(&str, &str, &str); 3] = [
    ("eBPF on, relist 1 s", "--pleg-relist-period", "1s"),
    ("eBPF on, relist 300 s", "--pleg-relist-period", "300s"),
    ("eBPF off, relist 1 s", "--ebpf", "off"),
];

/// Puts the agent into setting `i` of [`SETTINGS`] (from setting `i - 1`).
fn enter_setting(agent: &mut Agent, i: usize) {
    match i {
        0 => {
            agent.restart_with_flag("--ebpf", "auto");
            agent.restart_with_flag("--pleg-relist-period", "1s");
        }
        1 => agent.restart_with_flag("--pleg-relist-period", "300s"),
        _ => {
            agent.restart_with_flag("--pleg-relist-period", "1s");
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

fn main() -> ExitCode {
    let (opts, rt) = match set_up() {
        Ok(v) => v,
        Err(code) => return code,
    };
    let largest = *opts.pods.last().unwrap_or(&0);
    let churn_live = (opts.churn_rate * opts.churn_life).div_ceil(60) as usize;
    eprint!("building the agent (release) ...");
    let mut agent_opts = AgentOptions::new("steady");
    agent_opts.verbosity = 0;
    // The kubelet's default: the manifest directory is rescanned every 20 s (changes are seen
    // at once through inotify).
    agent_opts.file_check_frequency = "20s".into();
    agent_opts.binary = Some(swiftlet_tests::release_agent_binary());
    eprintln!(" done");
    agent_opts.extra_args = vec![
        "--max-pods".into(),
        (largest + 2 * churn_live + 10).to_string(),
    ];
    let mut agent = Agent::start(rt, agent_opts);
    println!(
        "steady_state: busybox pods sleeping; {} s settle, {} s window per setting; machine: {} cores",
        opts.settle,
        opts.window,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    let mut desired = Desired::new();
    let mut rows: BTreeMap<(usize, usize), Steady> = BTreeMap::new();
    for &n in &opts.pods {
        let before = desired.len();
        eprintln!("N = {n}: starting {} pods ...", n - before);
        let start = Instant::now();
        for i in before..n {
            let name = format!("s{i}");
            let text = manifest(&name);
            agent.write_manifest(&format!("{name}.yaml"), &text);
            desired.insert(format!("{name}.yaml"), text);
        }
        agent.wait_for(|l| running(l) == n, START_TIMEOUT);
        let took = start.elapsed();
        println!(
            "\nN = {n}: {} new pods Running in {:.1} s ({:.0} pods/min)",
            n - before,
            took.as_secs_f64(),
            (n - before) as f64 / took.as_secs_f64() * 60.0
        );
        println!(
            "  {:<24} {:>10} {:>9} {:>10} {:>8} {:>12} {:>12}",
            "setting", "CPU % core", "RSS MiB", "peak MiB", "relists", "p50 ms", "p99 ms"
        );
        for (i, (label, _, _)) in SETTINGS.iter().enumerate() {
            if i > 0 || n != opts.pods[0] {
                enter_setting(&mut agent, i);
            }
            eprintln!("  N = {n}, {label}: measuring ...");
            let s = steady(&agent, &opts);
            println!(
                "  {:<24} {:>10.3} {:>9.1} {:>10.1} {:>8} {:>12} {:>12}",
                label,
                s.cpu_pct,
                s.rss_mib,
                s.peak_mib,
                s.relists,
                bound(s.relist_p50_ms),
                bound(s.relist_p99_ms)
            );
            rows.insert((n, i), s);
        }
    }
    enter_setting(&mut agent, 0);
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
    let leftovers = converge(&agent, &desired, Duration::from_secs(120));
    match &leftovers {
        Ok(t) => println!(
            "  nothing left behind: every steady pod Running once, no sandbox, container, cgroup, \
             mount, log or state directory of a churned pod ({:.1} s to hold)",
            t.as_secs_f64()
        ),
        Err(bad) => {
            println!("  LEFT BEHIND ({}):", bad.len());
            for b in bad.iter().take(20) {
                println!("    {b}");
            }
        }
    }
    println!(
        "\nsummary (goals at 250 pods: CPU <= 0.3 % of a core, RSS <= 48 MiB, relist p99 <= 10 ms):"
    );
    for ((n, i), s) in &rows {
        println!(
            "  N={n:<4} {:<24} CPU {:.3} %, RSS {:.1} MiB (peak {:.1}), relist p99 {} ms",
            SETTINGS[*i].0,
            s.cpu_pct,
            s.rss_mib,
            s.peak_mib,
            bound(s.relist_p99_ms)
        );
    }
    eprintln!("removing the pods ...");
    for file in desired.keys() {
        agent.remove_manifest(file);
    }
    agent.wait_for(|l| l.items.is_empty(), START_TIMEOUT);
    if leftovers.is_err() {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
