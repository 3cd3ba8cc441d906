//! `cargo xtask <command>`: see `cargo xtask --help`.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use xtask::progress::{Progress, note};
use xtask::runtime::{self, Layout, UpOutcome};

#[derive(Debug, Parser)]
#[command(name = "cargo xtask", about = "swiftlet's development tasks")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Install what is missing: apt packages, nightly rust-src, bpf-linker (needs root).
    Setup,
    /// Build the local OCI images from the static busybox and import them (runtime must be up).
    Images,
    /// The private containerd.
    Runtime {
        #[command(subcommand)]
        action: RuntimeCmd,
    },
    /// Run swiftlet with the example pods against the private containerd.
    Demo {
        /// Build and run the release profile.
        #[arg(long)]
        release: bool,
        /// Tear down as soon as every pod runs instead of waiting for Ctrl-C.
        #[arg(long)]
        once: bool,
        /// How long to wait for the pods to run, in seconds.
        #[arg(long, default_value_t = 120)]
        timeout_secs: u64,
    },
    /// Start N pods under swiftlet with its eBPF probes and write where their start time went:
    /// report.json, waterfall.svg/.png, and the phase table (p50/p90/p99/max).
    Report {
        /// How many pods.
        #[arg(long, default_value_t = 20)]
        pods: usize,
        /// Directory for report.json and the charts.
        #[arg(long, default_value = "target/swiftlet-report")]
        out: std::path::PathBuf,
        /// Build and run the release profile.
        #[arg(long)]
        release: bool,
        /// How long to wait for every pod to run, in seconds.
        #[arg(long, default_value_t = 300)]
        timeout_secs: u64,
    },
    /// Print each crate's module graph and fail naming any import cycle (default: the agent's
    /// and xtask's sources).
    Deps {
        /// A crate's `src` directory; repeatable.
        #[arg(long = "crate-dir")]
        crate_dirs: Vec<std::path::PathBuf>,
    },
    /// The fault-injection suite against the private containerd: seeded scenarios, each ending
    /// with the invariant check (see docs/reliability.md). Arguments go to `swiftlet-chaos`
    /// (`cargo xtask chaos -- --help`).
    Chaos {
        /// Passed to `swiftlet-chaos` (after `--`), e.g. `-- --scenario kill9 --seed 7`.
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// A Debian VM with systemd as PID 1 and the cgroup layout of our choosing (see
    /// docs/machine.md): `image` builds it once, `run` runs a command in it.
    Vm {
        #[command(subcommand)]
        action: VmCmd,
    },
    /// The benches of revision REV against the working tree's, in one sitting: builds both
    /// (REV in a worktree under target/bench-compare), runs pod_startup and hot_path base, new,
    /// base, new, ... and prints each figure of both with the ratio new / base per round and the
    /// median (every figure lower is better). Takes /tmp/swiftlet-xtask.lock for the runs unless
    /// run under `flock` on it; takes the private containerd down at the end.
    BenchCompare(xtask::compare::Options),
    /// setup, runtime up, images, `cargo test --workspace [ARGS]`, runtime down.
    Test {
        /// Passed to `cargo test` (after `--`).
        #[arg(last = true)]
        args: Vec<String>,
    },
}

#[derive(Debug, Subcommand)]
enum RuntimeCmd {
    /// Start containerd unless it already answers (writes its config and the CNI network).
    Up,
    /// Stop containerd, its shims and containers; unmount; remove `swiftlet-*` cgroups and what
    /// killed sandboxes left of the pod network (idle `cni-*` namespaces, the network's NAT rules).
    Down,
    /// Say whether it is up, its pid, socket and images.
    Status,
}

#[derive(Debug, Subcommand)]
enum VmCmd {
    /// Build the guest image under /var/cache/swiftlet-vm unless it is there (needs root,
    /// debootstrap and the Debian mirror; several minutes).
    Image,
    /// Run the VM's integration tests in the guest: the cgroup tests on the unified v2
    /// hierarchy and the installation as a systemd service (what `cargo xtask test` does after
    /// the tests on this machine).
    Test,
    /// Boot the guest, run COMMAND (a shell command line, as root) in the current directory and
    /// exit with its exit code. The current directory and every --share are mounted at their own
    /// paths.
    Run {
        /// The guest's cgroup layout.
        #[arg(long, value_enum, default_value = "v2")]
        cgroups: xtask::vm::Cgroups,
        /// A host directory the command needs (repeatable).
        #[arg(long)]
        share: Vec<std::path::PathBuf>,
        /// An environment variable passed in, NAME (its value here) or NAME=VALUE (repeatable).
        #[arg(long)]
        env: Vec<String>,
        /// Use KVM (where this host offers nested virtualization) instead of emulation.
        #[arg(long)]
        kvm: bool,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 1800)]
        timeout_secs: u64,
        /// Guest memory in MiB.
        #[arg(long, default_value_t = 4096)]
        memory_mib: u32,
        /// Guest CPUs.
        #[arg(long, default_value_t = 2)]
        cpus: u32,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let layout = Layout::default();
    match cli.command {
        Cmd::Setup => {
            let report = xtask::setup::run_all(&mut Progress::new(3))?;
            if report == xtask::setup::Report::default() {
                println!("setup: nothing to do, everything was present");
            } else {
                println!("setup: {report:?}");
            }
        }
        Cmd::Images => {
            let mut p = Progress::new(1);
            let imported = p.step("images", || xtask::images::ensure(&layout))?;
            println!("imported {} image(s)", imported.len());
        }
        Cmd::Runtime { action } => match action {
            RuntimeCmd::Up => {
                let mut p = Progress::new(1);
                let outcome = p.step("runtime up", || runtime::up(&layout))?;
                match outcome {
                    UpOutcome::AlreadyUp { pid } => note(format!(
                        "already up (pid {})",
                        pid.map_or("?".to_owned(), |p| p.to_string())
                    )),
                    UpOutcome::Started { pid } => note(format!("started (pid {pid})")),
                }
                println!("endpoint: {}", layout.endpoint());
            }
            RuntimeCmd::Down => {
                let mut p = Progress::new(1);
                let report = p.step("runtime down", || runtime::down(&layout))?;
                println!("{report}");
            }
            RuntimeCmd::Status => print!("{}", runtime::status(&layout)),
        },
        Cmd::Demo {
            release,
            once,
            timeout_secs,
        } => {
            let opts = xtask::demo::Options {
                release,
                once,
                timeout: Duration::from_secs(timeout_secs),
                ..Default::default()
            };
            xtask::demo::run(&opts).context("demo")?;
        }
        Cmd::Report {
            pods,
            out,
            release,
            timeout_secs,
        } => {
            let opts = xtask::report::Options {
                pods,
                out,
                release,
                timeout: Duration::from_secs(timeout_secs),
            };
            xtask::report::run(&opts).context("report")?;
        }
        Cmd::Deps { crate_dirs } => {
            let dirs = if crate_dirs.is_empty() {
                xtask::deps::default_dirs()
            } else {
                crate_dirs
            };
            let mut clean = true;
            for dir in dirs {
                let (graph, cycles) = xtask::deps::check(&dir)?;
                println!("{}:", dir.display());
                for (module, deps) in &graph {
                    let deps: Vec<&str> = deps.iter().map(String::as_str).collect();
                    println!("  {module} -> {}", deps.join(", "));
                }
                if cycles.is_empty() {
                    println!("  no cycle among {} modules", graph.len());
                }
                for cycle in cycles {
                    clean = false;
                    println!("  CYCLE: {}", cycle.join(" -> "));
                }
                // The agent's modules follow the rows of docs/architecture.md.
                if dir.ends_with("agent/src") {
                    let doc = xtask::deps::agent_layers_doc();
                    let layers = xtask::deps::read_layers(&doc)?;
                    let violations = xtask::deps::layer_violations(&graph, &layers);
                    if violations.is_empty() {
                        println!("  the layers of {} hold", doc.display());
                    }
                    for v in violations {
                        clean = false;
                        println!("  LAYERS: {v}");
                    }
                }
            }
            if !clean {
                return Ok(ExitCode::FAILURE);
            }
        }
        Cmd::Chaos { args } => {
            let mut p = Progress::new(1);
            p.step("runtime up", || runtime::up(&layout))?;
            // The debug builds the integration tests use (the suite builds the agent itself).
            let status = std::process::Command::new(xtask::cargo_bin())
                .args(["run", "-p", "swiftlet-tests", "--bin", "swiftlet-chaos"])
                .arg("--")
                .args(&args)
                .status()
                .context("running cargo")?;
            return Ok(ExitCode::from(
                u8::try_from(status.code().unwrap_or(1)).unwrap_or(1),
            ));
        }
        Cmd::Vm { action } => match action {
            VmCmd::Image => {
                let img = xtask::vm::image()?;
                println!("{}", img.disk.display());
            }
            VmCmd::Test => {
                let mut totals = xtask::testrun::Totals::default();
                let rc = xtask::testrun::in_vm(&mut totals)?;
                println!(
                    "summary (VM: cgroup v2, and v1 for the systemd driver): {} passed, {} failed, {} skipped",
                    totals.passed, totals.failed, totals.ignored
                );
                return Ok(ExitCode::from(u8::try_from(rc).unwrap_or(1)));
            }
            VmCmd::Run {
                cgroups,
                share,
                env,
                kvm,
                timeout_secs,
                memory_mib,
                cpus,
                command,
            } => {
                let img = xtask::vm::image()?;
                let env = env
                    .into_iter()
                    .filter_map(|e| match e.split_once('=') {
                        Some((k, v)) => Some((k.to_owned(), v.to_owned())),
                        None => std::env::var(&e).ok().map(|v| (e, v)),
                    })
                    .collect();
                let job = xtask::vm::Job {
                    command: command.join(" "),
                    cwd: std::env::current_dir()?,
                    shares: share,
                    env,
                    cgroups,
                    kvm,
                    timeout: Duration::from_secs(timeout_secs),
                    memory_mib,
                    cpus,
                };
                let (rc, _) = xtask::vm::run(&img, &job)?;
                return Ok(ExitCode::from(u8::try_from(rc).unwrap_or(1)));
            }
        },
        Cmd::BenchCompare(opts) => xtask::compare::run(&opts).context("bench-compare")?,
        Cmd::Test { args } => {
            let code = xtask::testrun::run(&args)?;
            return Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)));
        }
    }
    Ok(ExitCode::SUCCESS)
}
