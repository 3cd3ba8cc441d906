//! `cargo xtask bench-compare <rev>`: the benches of a revision against the working tree's, run
//! in turn in one sitting (base, new, base, new, ...) so that both see the same machine, and the
//! ratios new / base printed as one table ([`crate::figures`]).
//!
//! The base is built in a git worktree of `<rev>` under `target/bench-compare/<hash>/src` with
//! a target directory of its own (`target/bench-compare/target`, shared by every base revision,
//! so the working tree's builds stay fresh); its release agent and hot_path executable are kept
//! in `target/bench-compare/<hash>/` and reused by later comparisons with the same commit, and
//! the worktree is removed at the end. pod_startup is the working tree's executable for both
//! sides, given each side's agent (`SWIFTLET_BENCH_AGENT`): the same harness measures both, and
//! its CRI floor, which no agent touches, shows how much the machine itself drifted.
//!
//! The benches that use the private containerd run under the machine's bench lock
//! ([`MACHINE_LOCK`]), taken here unless the caller already holds it (run under `flock`), and
//! the runtime is taken down at the end, also after a failure or Ctrl-C.

use std::io::BufRead;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};

use crate::demo::Interrupt;
use crate::figures::{self, Figure, Round};
use crate::progress::{Progress, note};

/// The lock the benches and test runs that use the private containerd take in turn, on a
/// machine shared by several people (README.md, BENCHMARKS.md).
pub const MACHINE_LOCK: &str = "/tmp/swiftlet-xtask.lock";

/// A bench `bench-compare` can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum Bench {
    /// Pod start end to end, against a private containerd (the agent differs per side).
    PodStartup,
    /// The criterion benches of the hot path (the library code differs per side).
    HotPath,
}

impl Bench {
    fn name(self) -> &'static str {
        match self {
            Bench::PodStartup => "pod_startup",
            Bench::HotPath => "hot_path",
        }
    }
}

/// What to compare and how (`cargo xtask bench-compare --help`).
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// The base revision (a commit, branch or tag; e.g. `HEAD` or `main~3`).
    pub rev: String,
    /// A prebuilt agent for the base instead of REV's release build.
    #[arg(long, value_name = "BINARY")]
    pub agent_base: Option<PathBuf>,
    /// A prebuilt agent for the working tree instead of its release build.
    #[arg(long, value_name = "BINARY")]
    pub agent_new: Option<PathBuf>,
    /// The benches to run, comma-separated.
    #[arg(
        long = "bench",
        value_name = "BENCH,...",
        value_enum,
        value_delimiter = ',',
        default_value = "pod_startup,hot_path"
    )]
    pub benches: Vec<Bench>,
    /// How many times each side runs each bench (base, new, base, new, ...).
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
    /// pod_startup's options (`cargo bench -p swiftlet-benches --bench pod_startup -- ...`).
    #[arg(
        long,
        allow_hyphen_values = true,
        default_value = "--pods 1,10 --reps 3 --no-cost"
    )]
    pub pod_startup_args: String,
    /// hot_path's criterion options, e.g. a filter such as `container_hash`.
    #[arg(
        long,
        allow_hyphen_values = true,
        default_value = "--warm-up-time 1 --measurement-time 3"
    )]
    pub hot_path_args: String,
}

/// One side of the comparison: its agent and its hot_path executable.
#[derive(Debug, Default)]
struct Side {
    agent: Option<PathBuf>,
    hot_path: Option<PathBuf>,
}

/// Builds what is missing, runs the benches in turn and prints the tables.
pub fn run(opts: &Options) -> anyhow::Result<()> {
    anyhow::ensure!(opts.rounds > 0, "--rounds must be 1 or more");
    anyhow::ensure!(!opts.benches.is_empty(), "--bench names no bench");
    let mut interrupt = Interrupt::install().context("installing the Ctrl-C handler")?;
    let root = crate::workspace_root();
    let hash = rev_hash(&root, &opts.rev)?;
    let short = &hash[..12];
    let dir = crate::target_dir().join("bench-compare");
    let wants = |b: Bench| opts.benches.contains(&b);
    let startup = wants(Bench::PodStartup);
    let mut progress = Progress::new(2);
    // The benches run in the workspace root: a prebuilt agent is named by its absolute path.
    let prebuilt = |option: &str, agent: &Option<PathBuf>| {
        agent
            .as_deref()
            .map(|a| std::fs::canonicalize(a).with_context(|| format!("{option} {}", a.display())))
            .transpose()
    };
    let (agent_base, agent_new) = (
        prebuilt("--agent-base", &opts.agent_base)?,
        prebuilt("--agent-new", &opts.agent_new)?,
    );

    // The base: prebuilt, kept from an earlier comparison, or built in a worktree of `rev`.
    let kept = dir.join(short);
    let mut base = Side {
        agent: agent_base,
        hot_path: None,
    };
    if startup && base.agent.is_none() && kept.join("swiftlet").is_file() {
        base.agent = Some(kept.join("swiftlet"));
    }
    if wants(Bench::HotPath) && kept.join("hot_path").is_file() {
        base.hot_path = Some(kept.join("hot_path"));
    }
    let base_needs_agent = startup && base.agent.is_none();
    let base_needs_bench = wants(Bench::HotPath) && base.hot_path.is_none();
    progress.step(&format!("build the base ({} = {short})", opts.rev), || {
        if !(base_needs_agent || base_needs_bench) {
            note("nothing to build: prebuilt or kept from an earlier comparison");
            return Ok(());
        }
        let tree = Worktree::add(&root, &kept.join("src"), &hash)?;
        let target = dir.join("target");
        if base_needs_agent {
            let built = build_agent(&tree.path, Some(&target), &mut interrupt)?;
            base.agent = Some(keep(&built, &kept.join("swiftlet"))?);
        }
        if base_needs_bench {
            let built =
                bench_executables(&tree.path, Some(&target), &[Bench::HotPath], &mut interrupt)?;
            base.hot_path = Some(keep(&built[0], &kept.join("hot_path"))?);
        }
        Ok::<_, anyhow::Error>(())
    })?;

    // The working tree: its agent unless prebuilt, its bench executables (pod_startup is the
    // harness of both sides).
    let mut new = Side {
        agent: agent_new,
        hot_path: None,
    };
    let mut startup_exe = None;
    progress.step("build the working tree", || {
        if startup && new.agent.is_none() {
            new.agent = Some(build_agent(&root, None, &mut interrupt)?);
        }
        let exes = bench_executables(&root, None, &opts.benches, &mut interrupt)?;
        for (bench, exe) in opts.benches.iter().zip(exes) {
            match bench {
                Bench::PodStartup => startup_exe = Some(exe),
                Bench::HotPath => new.hot_path = Some(exe),
            }
        }
        Ok::<_, anyhow::Error>(())
    })?;

    let logs = dir.join("last");
    let _ = std::fs::remove_dir_all(&logs);
    std::fs::create_dir_all(&logs).map_err(crate::io_err("creating", &logs))?;
    let _lock = machine_lock(&mut interrupt)?;
    let results = run_rounds(
        opts,
        &base,
        &new,
        startup_exe.as_deref(),
        &logs,
        &mut interrupt,
    );
    if startup {
        let mut p = Progress::new(1);
        let _ = p.step("runtime down", || {
            crate::runtime::down(&crate::runtime::Layout::default()).map(|r| note(r.to_string()))
        });
    }
    let results = results?;

    println!(
        "\nbase: {} ({short}); new: the working tree at {}; {} round(s), base first in each; \
         every figure lower is better; the runs' output is in {}",
        opts.rev,
        root.display(),
        opts.rounds,
        logs.display()
    );
    for (bench, rounds) in &results {
        println!();
        print!("{}", figures::table(bench.name(), rounds));
    }
    Ok(())
}

/// The benches in turn, per round base then new; per bench the figures of each round.
fn run_rounds(
    opts: &Options,
    base: &Side,
    new: &Side,
    startup_exe: Option<&Path>,
    logs: &Path,
    interrupt: &mut Interrupt,
) -> anyhow::Result<Vec<(Bench, Vec<Round>)>> {
    let mut results: Vec<(Bench, Vec<Round>)> =
        opts.benches.iter().map(|b| (*b, Vec::new())).collect();
    let mut progress = Progress::new(opts.rounds * opts.benches.len() * 2);
    for round in 1..=opts.rounds {
        for (bench, rounds) in &mut results {
            let mut pair = Vec::new();
            for (label, side) in [("base", base), ("new", new)] {
                let what = format!("{} {label}, round {round}/{}", bench.name(), opts.rounds);
                let log = logs.join(format!("{}-{label}-{round}.txt", bench.name()));
                let mut cmd = match bench {
                    Bench::PodStartup => {
                        let mut c = Command::new(startup_exe.context("pod_startup is not built")?);
                        let agent = side.agent.as_deref().context("no agent")?;
                        c.args(opts.pod_startup_args.split_whitespace())
                            .env("SWIFTLET_BENCH_AGENT", agent)
                            .env(crate::testrun::REQUIRE_RUNTIME_ENV, "1");
                        c
                    }
                    Bench::HotPath => {
                        let mut c = Command::new(side.hot_path.as_deref().context("no hot_path")?);
                        // Each side compares with its own last run only, away from target/criterion.
                        c.args(opts.hot_path_args.split_whitespace())
                            .env("CRITERION_HOME", logs.join(format!("criterion-{label}")));
                        c
                    }
                };
                cmd.arg("--bench").current_dir(crate::workspace_root());
                let figures = progress.step(&what, || {
                    let out = run_captured(&mut cmd, &what, &log, interrupt)?;
                    let figures = match bench {
                        Bench::PodStartup => figures::parse_pod_startup(&out),
                        Bench::HotPath => figures::parse_criterion(&out),
                    };
                    if figures.is_empty() {
                        bail!(
                            "{what}: no figure could be read from its output ({}): did its format change?",
                            log.display()
                        );
                    }
                    Ok::<Vec<Figure>, anyhow::Error>(figures)
                })?;
                pair.push(figures);
            }
            let new_figures = pair.pop().unwrap_or_default();
            rounds.push((pair.pop().unwrap_or_default(), new_figures));
        }
    }
    Ok(results)
}

/// The commit `rev` names.
fn rev_hash(root: &Path, rev: &str) -> anyhow::Result<String> {
    let out = Command::new("git")
        .current_dir(root)
        .args(["rev-parse", "--verify", "--quiet", "--end-of-options"])
        .arg(format!("{rev}^{{commit}}"))
        .stdin(Stdio::null())
        .output()
        .context("running git rev-parse")?;
    let hash = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if !out.status.success() || hash.len() < 12 {
        bail!("unknown revision {rev:?}: git rev-parse names no commit for it");
    }
    Ok(hash)
}

/// A detached git worktree, removed when dropped.
struct Worktree {
    path: PathBuf,
}

impl Worktree {
    fn add(root: &Path, path: &Path, hash: &str) -> anyhow::Result<Self> {
        // A worktree an earlier run could not remove (killed with SIGKILL) is replaced.
        Self::remove(root, path);
        let status = Command::new("git")
            .current_dir(root)
            .args(["worktree", "add", "--detach", "--quiet"])
            .arg(path)
            .arg(hash)
            .stdin(Stdio::null())
            .status()
            .context("running git worktree add")?;
        anyhow::ensure!(
            status.success(),
            "git worktree add {} {hash} failed ({status})",
            path.display()
        );
        Ok(Self {
            path: path.to_owned(),
        })
    }

    fn remove(root: &Path, path: &Path) {
        let _ = Command::new("git")
            .current_dir(root)
            .args(["worktree", "remove", "--force"])
            .arg(path)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(path);
        // Its parent too when nothing was kept there (a build that failed or was interrupted).
        if let Some(parent) = path.parent() {
            let _ = std::fs::remove_dir(parent);
        }
        let _ = Command::new("git")
            .current_dir(root)
            .args(["worktree", "prune"])
            .stdin(Stdio::null())
            .status();
    }
}

impl Drop for Worktree {
    fn drop(&mut self) {
        Self::remove(&crate::workspace_root(), &self.path);
    }
}

/// `cargo` in `dir`, with `target` as its target directory when given, without the package
/// variables `cargo run` gave this process: build scripts that watch them (ring's, for one)
/// would otherwise run again, and what depends on them be rebuilt, at every change between
/// `cargo xtask` and a plain cargo command.
fn cargo(dir: &Path, target: Option<&Path>) -> Command {
    let mut cmd = Command::new(crate::cargo_bin());
    cmd.current_dir(dir).stdin(Stdio::null());
    for (key, _) in std::env::vars_os() {
        let name = key.to_string_lossy();
        if name.starts_with("CARGO_PKG_")
            || name.starts_with("CARGO_MANIFEST_")
            || [
                "CARGO_CRATE_NAME",
                "CARGO_BIN_NAME",
                "CARGO_PRIMARY_PACKAGE",
            ]
            .contains(&&*name)
        {
            cmd.env_remove(&key);
        }
    }
    if let Some(target) = target {
        cmd.env("CARGO_TARGET_DIR", target);
    }
    cmd
}

/// The release agent of the tree at `dir`; returns its path.
fn build_agent(
    dir: &Path,
    target: Option<&Path>,
    interrupt: &mut Interrupt,
) -> anyhow::Result<PathBuf> {
    let what = format!(
        "cargo build --release -p swiftlet --bin swiftlet in {}",
        dir.display()
    );
    note(format!("{what} (a fat-LTO build: minutes)"));
    let mut cmd = cargo(dir, target);
    cmd.args(["build", "--release", "-p", "swiftlet", "--bin", "swiftlet"])
        .stdout(Stdio::null());
    wait(&mut cmd, &what, interrupt)?;
    let target = target.map_or_else(crate::target_dir, Path::to_owned);
    Ok(target.join("release").join("swiftlet"))
}

/// The executables of `benches` of the tree at `dir` (`cargo bench --no-run`), in that order.
fn bench_executables(
    dir: &Path,
    target: Option<&Path>,
    benches: &[Bench],
    interrupt: &mut Interrupt,
) -> anyhow::Result<Vec<PathBuf>> {
    let names: Vec<&str> = benches.iter().map(|b| b.name()).collect();
    let what = format!(
        "cargo bench --no-run --bench {} in {}",
        names.join(" --bench "),
        dir.display()
    );
    note(&what);
    let mut cmd = cargo(dir, target);
    cmd.args([
        "bench",
        "-p",
        "swiftlet-benches",
        "--no-run",
        "--message-format=json",
    ]);
    for name in &names {
        cmd.args(["--bench", name]);
    }
    cmd.stdout(Stdio::piped());
    let out = wait_output(&mut cmd, &what, interrupt)?;
    crate::executables_named(&out, &names).with_context(|| what.clone())
}

/// Copies `built` to `to` (kept for later comparisons with the same commit); returns `to`.
fn keep(built: &Path, to: &Path) -> anyhow::Result<PathBuf> {
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir).map_err(crate::io_err("creating", dir))?;
    }
    let part = to.with_extension("part");
    std::fs::copy(built, &part).map_err(crate::io_err("copying to", &part))?;
    std::fs::rename(&part, to).map_err(crate::io_err("renaming to", to))?;
    Ok(to.to_owned())
}

/// Runs `cmd` to its end; Ctrl-C (or SIGTERM) here is passed on to its process group as SIGINT
/// and ends the comparison once it exited.
fn wait(cmd: &mut Command, what: &str, interrupt: &mut Interrupt) -> anyhow::Result<()> {
    wait_output(cmd, what, interrupt).map(drop)
}

/// [`wait`], returning its stdout when piped (read as it comes, so a full pipe cannot stall it).
fn wait_output(cmd: &mut Command, what: &str, interrupt: &mut Interrupt) -> anyhow::Result<String> {
    // A process group of its own, so that the interrupt reaches every process of it (cargo's
    // rustc jobs too, which would otherwise finish with an inherited lock descriptor open).
    let mut child = cmd
        .process_group(0)
        .spawn()
        .with_context(|| format!("{what}: starting it"))?;
    let reader = child.stdout.take().map(|out| {
        std::thread::spawn(move || {
            let mut text = String::new();
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                text.push_str(&line);
                text.push('\n');
            }
            text
        })
    });
    let mut interrupted = false;
    let status = loop {
        if let Some(status) = child
            .try_wait()
            .with_context(|| format!("{what}: waiting"))?
        {
            break status;
        }
        if interrupt.sleep(Duration::from_millis(200)) && !interrupted {
            interrupted = true;
            if let Ok(pid) = i32::try_from(child.id()) {
                // SAFETY: kill(2) on the process group of our own child, which keeps its pid
                // (the group's id) until we reap it.
                unsafe { libc::kill(-pid, libc::SIGINT) };
            }
        }
    };
    let out = reader.and_then(|r| r.join().ok()).unwrap_or_default();
    if interrupted {
        bail!("{what}: interrupted");
    }
    anyhow::ensure!(status.success(), "{what} failed ({status})");
    Ok(out)
}

/// Runs a bench with its stdout written to `log` and returned and its stderr to `<log>.err.txt`;
/// on failure, the error shows the end of its stderr.
fn run_captured(
    cmd: &mut Command,
    what: &str,
    log: &Path,
    interrupt: &mut Interrupt,
) -> anyhow::Result<String> {
    let err_log = log.with_extension("err.txt");
    let out = std::fs::File::create(log).map_err(crate::io_err("creating", log))?;
    let err = std::fs::File::create(&err_log).map_err(crate::io_err("creating", &err_log))?;
    cmd.stdout(out).stderr(err);
    if let Err(e) = wait(cmd, what, interrupt) {
        let err = std::fs::read_to_string(&err_log).unwrap_or_default();
        let tail: Vec<&str> = err.lines().rev().take(15).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        bail!(
            "{e:#}; the end of {}:\n{}",
            err_log.display(),
            tail.join("\n")
        );
    }
    Ok(std::fs::read_to_string(log).map_err(crate::io_err("reading", log))?)
}

/// Holds [`MACHINE_LOCK`] while alive; `None` when this process already has it open (it runs
/// under `flock`, whose descriptor it inherited: taking it again on a second descriptor would
/// wait for ourselves).
fn machine_lock(interrupt: &mut Interrupt) -> anyhow::Result<Option<std::fs::File>> {
    let path = Path::new(MACHINE_LOCK);
    let inherited = std::fs::read_dir("/proc/self/fd")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|p| p == path));
    if inherited {
        note(format!("{MACHINE_LOCK}: held by the caller"));
        return Ok(None);
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(crate::io_err("opening", path))?;
    let mut waiting = false;
    loop {
        match file.try_lock() {
            Ok(()) => break,
            Err(std::fs::TryLockError::WouldBlock) => {}
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(crate::io_err("locking", path)(e).into());
            }
        }
        if !waiting {
            waiting = true;
            note(format!(
                "waiting for {MACHINE_LOCK} (another bench or test run holds it)"
            ));
        }
        if interrupt.sleep(Duration::from_secs(1)) {
            bail!("waiting for {MACHINE_LOCK}: interrupted");
        }
    }
    Ok(Some(file))
}
