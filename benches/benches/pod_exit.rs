//! `cargo bench --bench pod_exit`: how long after a container exits `/pods` shows it, with the
//! eBPF fast path and with the periodic relist alone (`--ebpf off`), on the private containerd.
//!
//! Per mode, one release agent; per round, `--pods` restartPolicy Never pods whose container runs
//! `sleep 2; exit 3` are started together (so their exits come at about the same time). Once all
//! run, `/pods` is polled back to back (each answer takes about a millisecond) until every pod
//! shows its container terminated. Per pod, the latency is the wall-clock time of the first
//! answer showing it minus CRI's `finishedAt` of that container (containerd's record of the exit,
//! read once it has one). It can be negative: with eBPF the agent shows the exit from the
//! kernel's view, and containerd's time is taken when its shim reaps the process.
//!
//! Options (after `--`): `--pods 5`, `--rounds 6`, `--modes ebpf,off`. Without root or
//! containerd it says so and exits 0, unless `SWIFTLET_REQUIRE_RUNTIME=1`, where it fails.
use hdrhistogram::Histogram;
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;
use swiftlet_tests::{
    Agent, AgentOptions, Runtime, release_agent_binary, script_pod_manifest, wait_finished_at,
};

const SCRIPT: &str = "sleep 2; exit 3";
const TIMEOUT: Duration = Duration::from_secs(60);

struct Opts {
    pods: usize,
    rounds: usize,
    modes: Vec<String>,
}

fn parse_opts() -> Result<Opts, String> {
    let mut o = Opts {
        pods: 5,
        rounds: 6,
        modes: vec!["ebpf".into(), "off".into()],
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "--pods" => o.pods = number(&value("--pods")?)?,
            "--rounds" => o.rounds = number(&value("--rounds")?)?,
            "--modes" => {
                o.modes = value("--modes")?.split(',').map(str::to_owned).collect();
                if let Some(bad) = o
                    .modes
                    .iter()
                    .find(|m| !matches!(m.as_str(), "ebpf" | "off"))
                {
                    return Err(format!("--modes: {bad:?} is not ebpf or off"));
                }
            }
            // cargo bench passes --bench.
            "--bench" => {}
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    Ok(o)
}

fn number(v: &str) -> Result<usize, String> {
    v.parse()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{v:?} is not a positive number"))
}

/// One round: latencies in microseconds (signed) of `n` pods exiting together.
fn round(agent: &Agent, round: usize, n: usize) -> Vec<i64> {
    let names: Vec<String> = (0..n).map(|i| format!("exit-{round}-{i}")).collect();
    for name in &names {
        let manifest = script_pod_manifest(agent.node_name(), name, "Never", SCRIPT, "");
        agent.write_manifest(&format!("{name}.yaml"), &manifest);
    }
    let full: Vec<String> = names.iter().map(|n| agent.static_pod_name(n)).collect();
    agent.wait_for(|l| full.iter().all(|p| l.is_running(p)), TIMEOUT);
    let mut seen: BTreeMap<String, (String, i64)> = BTreeMap::new();
    let done = agent.poll_pods(Duration::ZERO, TIMEOUT, |list, at| {
        for p in &full {
            let exited = list
                .container(p, "main")
                .and_then(|c| c.state.as_ref()?.terminated.as_ref())
                .is_some();
            if exited && !seen.contains_key(p) {
                let uid = list.uid(p).unwrap_or_default().to_owned();
                seen.insert(p.clone(), (uid, at));
            }
        }
        seen.len() == full.len()
    });
    assert!(done, "not every pod showed its exit within {TIMEOUT:?}");
    let mut out = Vec::with_capacity(n);
    for (pod, (uid, at)) in &seen {
        let finished = wait_finished_at(agent.endpoint(), uid, "main", TIMEOUT)
            .unwrap_or_else(|| panic!("{pod}: CRI shows no finishedAt within {TIMEOUT:?}"));
        out.push((at - finished) / 1000);
    }
    for name in &names {
        agent.remove_manifest(&format!("{name}.yaml"));
    }
    agent.wait_for(|l| full.iter().all(|p| l.get(p).is_none()), TIMEOUT);
    out
}

fn main() -> ExitCode {
    let opts = match parse_opts() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("pod_exit: {e}");
            return ExitCode::from(2);
        }
    };
    // Runtime::shared prints `SKIPPED: why` (or panics when SWIFTLET_REQUIRE_RUNTIME=1).
    let Some(rt) = Runtime::shared() else {
        eprintln!("pod_exit: skipped (needs root and containerd; see the SKIPPED line above)");
        return ExitCode::SUCCESS;
    };
    let binary = release_agent_binary();
    println!(
        "container exit (CRI finishedAt) -> terminated on /pods, ms; {} pods exiting together \
         x {} rounds per mode",
        opts.pods, opts.rounds
    );
    println!(
        "  {:<12} {:>5} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9}",
        "mode", "n", "min", "p50", "p90", "p99", "max", "before"
    );
    for mode in &opts.modes {
        let mut agent_opts = AgentOptions::new(&format!("bench-exit-{mode}"));
        agent_opts.binary = Some(binary.clone());
        agent_opts.verbosity = 0;
        agent_opts.extra_args = vec![
            "--ebpf".into(),
            if mode == "ebpf" { "on" } else { "off" }.into(),
        ];
        let agent = Agent::start(rt, agent_opts);
        let mut all = Vec::new();
        for r in 0..opts.rounds {
            eprint!("\r{mode}: round {}/{} ", r + 1, opts.rounds);
            all.extend(round(&agent, r, opts.pods));
        }
        eprintln!();
        let mut h =
            Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds");
        for us in &all {
            let _ = h.record(u64::try_from(*us).unwrap_or(0).max(1));
        }
        let min = all.iter().copied().min().unwrap_or(0);
        // Shown before containerd's own finishedAt (negative latencies, counted as 0 above).
        let before = all.iter().filter(|us| **us <= 0).count();
        let ms = |us: u64| us as f64 / 1000.0;
        println!(
            "  {:<12} {:>5} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>9}",
            if mode == "ebpf" { "eBPF" } else { "relist 1s" },
            all.len(),
            min as f64 / 1000.0,
            ms(h.value_at_quantile(0.5)),
            ms(h.value_at_quantile(0.9)),
            ms(h.value_at_quantile(0.99)),
            ms(h.max()),
            before
        );
    }
    ExitCode::SUCCESS
}
