//! `swiftlet-chaos`: runs the fault-injection scenarios against the private containerd and a
//! real agent, prints a table (and with `--json` one JSON line per scenario) and exits non-zero
//! when an invariant did not hold. `cargo xtask chaos` builds and runs it.
use std::process::ExitCode;

use swiftlet_tests::Runtime;
use swiftlet_tests::chaos::{self, Outcome};

const USAGE: &str = "usage: swiftlet-chaos [--scenario NAME] [--seed N] [--rounds N] [--pods N] \
     [--cycles N] [--json] [--debug-agent | --agent PATH]

Scenarios (default: all):
  kill9    kill -9 of the agent at random instants during manifest churn (create, update,
           delete), restarting it each round; the invariant must hold within 60 s of each restart
  sigterm  SIGTERM in the middle of a burst of changes; the agent must exit within 10 s
  hostile  hostile manifest-URL bodies and manifest files beside good pods (one pass); each is
           counted, no good pod restarts, and the release agent's peak RSS stays within 64 MiB
           (it is built first); --debug-agent measures the debug agent instead, without the
           bound, and --agent PATH holds the agent binary at PATH to the bound
  runtime  containerd SIGKILLed and restarted during churn, and down while the agent starts,
           on a containerd of its own (/var/lib/swiftlet-chaos-runtime, bridge swl-chaos0)
  disk     the agent's root dir and pod log dir on 4 MiB tmpfs mounts filled to the last byte
           and inode during churn, then freed
  cri-faults  the agent talks to the runtime through a fault-injecting CRI proxy with
           --runtime-request-timeout 5s; each round delays, fails or hangs one CRI method
           for 2-5 s during churn, and the invariant must hold within 60 s after
  soak     --cycles create/delete cycles of --pods pods (default 1000 cycles, 3 pods); fails when
           open fds or async tasks grow, or RSS grows more than 2 MiB from the middle to the end;
           the debug agent, or with --agent PATH the agent binary at PATH
  security attacks on a running agent (the kubelet API from the network: every path and method
           without a certificate, refused certificates, log requests on a 40 MB log, an idle
           exec stream, connections past the cap; a static pod UID with '..'; another local
           user in a pod's directory), each checked for its safe outcome (one pass)

Every scenario prints its seed; --seed replays the same choices.
";

struct Args {
    scenario: String,
    seed: u64,
    rounds: usize,
    pods: usize,
    /// `--pods` given (the soak's default is 3, the others' 10).
    pods_set: bool,
    cycles: usize,
    json: bool,
    debug_agent: bool,
    agent: Option<std::path::PathBuf>,
}

fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut a = Args {
        scenario: "all".into(),
        seed: chaos::fresh_seed(),
        rounds: 10,
        pods: 10,
        pods_set: false,
        cycles: 1000,
        json: false,
        debug_agent: false,
        agent: None,
    };
    while let Some(flag) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match flag.as_str() {
            "--scenario" => a.scenario = value("--scenario")?,
            "--seed" => a.seed = number(&value("--seed")?, "--seed")?,
            "--rounds" => a.rounds = number(&value("--rounds")?, "--rounds")?,
            "--pods" => {
                a.pods = number(&value("--pods")?, "--pods")?;
                a.pods_set = true;
            }
            "--cycles" => a.cycles = number(&value("--cycles")?, "--cycles")?,
            "--json" => a.json = true,
            "--debug-agent" => a.debug_agent = true,
            "--agent" => a.agent = Some(value("--agent")?.into()),
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(a)
}

fn number<T: std::str::FromStr>(s: &str, flag: &str) -> Result<T, String> {
    s.parse()
        .map_err(|_| format!("{flag} wants a non-negative number, got {s:?}"))
}

fn report(o: &Outcome, json: bool) {
    let show = |v: Option<u64>| v.map_or("-".to_owned(), |v| format!("{v} ms"));
    println!(
        "{:<10} seed {:<20} faults {:>3}  changes {:>4}  fault p50 {:>8} max {:>8}  \
         converged p50 {:>8} max {:>8}  {}",
        o.scenario,
        o.seed,
        o.faults,
        o.changes,
        show(o.fault_quantile(0.5)),
        show(o.fault_quantile(1.0)),
        show(o.converge_quantile(0.5)),
        show(o.converge_quantile(1.0)),
        if o.passed() { "PASS" } else { "FAIL" }
    );
    for v in &o.violations {
        println!("  violation: {v}");
    }
    if json {
        println!("{}", serde_json::to_string(o).unwrap_or_default());
    }
}

fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) if e.is_empty() => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("swiftlet-chaos: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let Some(runtime) = Runtime::shared() else {
        eprintln!("swiftlet-chaos: the private containerd cannot run here (see SKIPPED above)");
        return ExitCode::from(2);
    };
    println!(
        "chaos: scenario {} seed {} rounds {} pods {}",
        args.scenario, args.seed, args.rounds, args.pods
    );
    let scenarios: &[&str] = match args.scenario.as_str() {
        "all" => &[
            "kill9",
            "sigterm",
            "hostile",
            "cri-faults",
            "runtime",
            "disk",
            "soak",
            "security",
        ],
        "kill9" => &["kill9"],
        "sigterm" => &["sigterm"],
        "hostile" => &["hostile"],
        "cri-faults" => &["cri-faults"],
        "runtime" => &["runtime"],
        "disk" => &["disk"],
        "soak" => &["soak"],
        "security" => &["security"],
        other => {
            eprintln!("swiftlet-chaos: unknown scenario {other:?}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let mut passed = true;
    for name in scenarios {
        let outcome = match *name {
            "kill9" => chaos::kill9_churn(runtime, args.seed, args.rounds, args.pods),
            "sigterm" => chaos::sigterm_burst(runtime, args.seed, args.rounds, args.pods),
            "cri-faults" => {
                let (outcome, report) =
                    chaos::cri_faults(runtime, args.seed, args.rounds, args.pods);
                for (i, r) in report.rounds.iter().enumerate() {
                    println!(
                        "  round {i:>3}: {:<16} {:<24} calls disturbed {:>3}",
                        r.method, r.fault, r.disturbed
                    );
                }
                println!(
                    "  deadlines exceeded: {} (hung calls {}) {:?}",
                    report.deadlines_exceeded(),
                    report.hung_calls(),
                    report.deadline_exceeded
                );
                if args.json {
                    println!("{}", serde_json::to_string(&report).unwrap_or_default());
                }
                outcome
            }
            "runtime" => chaos::runtime_restarts(args.seed, args.rounds, args.pods),
            "security" => {
                let (outcome, attacks) = swiftlet_tests::attacks::security(runtime, args.seed);
                for a in &attacks {
                    println!(
                        "  {:<60} tried {:>4}  held {:>4}  {}",
                        a.name,
                        a.tried,
                        a.held,
                        if a.held == a.tried { "ok" } else { "BROKEN" }
                    );
                }
                if args.json {
                    println!("{}", serde_json::to_string(&attacks).unwrap_or_default());
                }
                outcome
            }
            "disk" => chaos::disk_full(runtime, args.seed, args.rounds, args.pods),
            "soak" => {
                let pods = if args.pods_set { args.pods } else { 3 };
                let (outcome, samples) =
                    chaos::soak(runtime, args.seed, args.cycles, pods, args.agent.clone());
                for r in &samples {
                    println!(
                        "  after cycle {:>5}: RSS {:>7.1} MiB  fds {:>4}  threads {:>3}  \
                         async tasks {:>4}",
                        r.cycle,
                        r.rss_kib as f64 / 1024.0,
                        r.fds,
                        r.threads,
                        r.tokio_tasks
                    );
                }
                if args.json {
                    println!("{}", serde_json::to_string(&samples).unwrap_or_default());
                }
                outcome
            }
            _ => {
                // The whole set of inputs once (about a minute); --rounds is for the others.
                // The bound is the release agent's; --debug-agent measures the debug one.
                let opts = match (&args.agent, args.debug_agent) {
                    (Some(path), _) => chaos::HostileOptions {
                        binary: Some(path.clone()),
                        bound_kib: Some(chaos::MEMORY_BOUND_KIB),
                    },
                    (None, true) => chaos::HostileOptions::default(),
                    (None, false) => chaos::HostileOptions::release(),
                };
                let (outcome, inputs) = chaos::hostile_input(runtime, args.seed, 1, &opts);
                for r in &inputs {
                    println!(
                        "  {:<36} errors counted {:>6}  peak RSS {:>7.1} MiB  {}",
                        r.input,
                        r.errors_counted,
                        r.peak_rss_kib as f64 / 1024.0,
                        if r.peak_rss_kib <= chaos::MEMORY_BOUND_KIB {
                            "within 64 MiB"
                        } else {
                            "OVER 64 MiB"
                        }
                    );
                }
                if args.json {
                    println!("{}", serde_json::to_string(&inputs).unwrap_or_default());
                }
                outcome
            }
        };
        report(&outcome, args.json);
        passed &= outcome.passed();
    }
    if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
