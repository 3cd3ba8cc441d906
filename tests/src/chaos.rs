//! The fault-injection suite: seeded scenarios against a real agent and the private containerd,
//! each ending with the same invariant check ([`check`]).
//!
//! A scenario prints its seed; running it again with that seed replays the same choices (the
//! timing of the machine still varies). `cargo xtask chaos` runs the suite from the command
//! line (the `swiftlet-chaos` binary of this crate); `tests/tests/chaos.rs` runs its quick form.
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use swiftlet::config::manifest::MAX_POD_BYTES;
use swiftlet::container_gc::MAX_DEAD_PER_CONTAINER;

pub use crate::rng::Rng;

use crate::cri_proxy::{CriProxy, Fault, Share};
use crate::{
    Agent, AgentOptions, CONTAINER_NAME_LABEL, NODE_NAME_LABEL, POD_UID_LABEL, Runtime, block_on,
    cri_objects_labelled, looping_pod_manifest, pod_cgroup_uids, runtime_client,
    sandboxes_with_labels,
};

/// How long a scenario waits for the invariant to hold after a fault before calling it failed.
pub const CONVERGE_TIMEOUT: Duration = Duration::from_secs(60);

/// A seed from the clock, for runs that do not name one.
pub fn fresh_seed() -> u64 {
    u64::try_from(crate::unix_nanos()).unwrap_or(1) ^ u64::from(std::process::id())
}

/// What the agent should be running: manifest file name -> manifest text.
pub type Desired = BTreeMap<String, String>;

/// Checks the invariant once: every desired pod Running exactly once (one ready sandbox, one
/// running instance of each container and at most one dead one, as the kubelet's container
/// garbage collection keeps), nothing left for pods that are gone (sandboxes, containers, pod cgroups,
/// pod log and state directories, shm mounts of removed sandboxes), `/pods` agreeing with CRI,
/// and no panic in the agent's log. `Err` lists every violation found.
pub fn check(agent: &Agent, desired: &Desired) -> Result<(), Vec<String>> {
    check_allowing(agent, desired, 0)
}

/// [`check`], allowing up to `dead` exited instances of each container beside its running one
/// (the kubelet keeps the newest dead instance, with its last termination state, when a
/// container failed, e.g. to start on a full disk).
pub fn check_allowing(agent: &Agent, desired: &Desired, dead: usize) -> Result<(), Vec<String>> {
    let mut bad = Vec::new();
    let pods = agent.pods();
    let mut want_uids = BTreeSet::new();
    for file in desired.keys() {
        let name = agent.static_pod_name(file.trim_end_matches(".yaml"));
        match pods.get(&name) {
            None => bad.push(format!("{name}: not in /pods")),
            Some(p) => {
                let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
                if phase != Some("Running") {
                    bad.push(format!("{name}: phase {phase:?}"));
                }
                let running = p
                    .status
                    .as_ref()
                    .and_then(|s| s.container_statuses.as_ref())
                    .is_some_and(|cs| {
                        !cs.is_empty()
                            && cs
                                .iter()
                                .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
                    });
                if !running {
                    bad.push(format!("{name}: a container is not running in /pods"));
                }
                if let Some(uid) = p.metadata.uid.clone() {
                    want_uids.insert(uid);
                }
            }
        }
    }
    // Pods /pods lists but nobody wants any more.
    for p in &pods.items {
        let uid = p.metadata.uid.clone().unwrap_or_default();
        if !want_uids.contains(&uid) {
            let name = p.metadata.name.clone().unwrap_or_default();
            bad.push(format!("{name}: still in /pods after its manifest went"));
        }
    }
    match cri_view(
        agent.endpoint(),
        agent.node_name(),
        agent.runtime_state_dir(),
    ) {
        Err(e) => bad.push(format!("listing CRI objects: {e}")),
        Ok(view) => check_cri(&view, agent.runtime_state_dir(), &want_uids, dead, &mut bad),
    }
    let cgroups = pod_cgroup_uids(agent.cgroup_root());
    compare_sets("pod cgroup", &cgroups, &want_uids, &mut bad);
    let logs = dir_uids(&agent.root_dir().join("pod-logs"), |n| {
        n.rsplit('_').next().map(str::to_owned)
    });
    compare_sets("pod log directory", &logs, &want_uids, &mut bad);
    let state = dir_uids(&agent.root_dir().join("pods"), |n| Some(n.to_owned()));
    for uid in state.difference(&want_uids) {
        bad.push(format!("pod state directory of gone pod {uid}"));
    }
    if let Some(line) = agent.log().lines().find(|l| l.contains("panicked")) {
        bad.push(format!("the agent panicked: {line}"));
    }
    if bad.is_empty() { Ok(()) } else { Err(bad) }
}

/// The runtime's objects of one node, and every sandbox ID the runtime has (any node).
struct CriView {
    sandboxes: Vec<cri::PodSandbox>,
    containers: Vec<cri::Container>,
    all_sandbox_ids: BTreeSet<String>,
    /// The sandbox IDs of the runtime's shm mounts, read before the listing.
    shm_before: BTreeSet<String>,
}

fn cri_view(endpoint: &str, node: &str, state: &Path) -> crate::Result<CriView> {
    let shm_before = shm_sandbox_ids(state);
    let (sandboxes, containers) = cri_objects_labelled(endpoint, NODE_NAME_LABEL, node)?;
    let endpoint = endpoint.to_owned();
    let all = block_on(async move {
        let mut client = runtime_client(&endpoint)?;
        sandboxes_with_labels(&mut client, &[]).await
    })??;
    Ok(CriView {
        sandboxes,
        containers,
        all_sandbox_ids: all.into_iter().map(|s| s.id).collect(),
        shm_before,
    })
}

fn check_cri(
    view: &CriView,
    state: &Path,
    want: &BTreeSet<String>,
    dead: usize,
    bad: &mut Vec<String>,
) {
    let uid_of = |labels: &std::collections::HashMap<String, String>| {
        labels.get(POD_UID_LABEL).cloned().unwrap_or_default()
    };
    let mut sandboxes: BTreeMap<String, Vec<&cri::PodSandbox>> = BTreeMap::new();
    for s in &view.sandboxes {
        sandboxes.entry(uid_of(&s.labels)).or_default().push(s);
    }
    let mut containers: BTreeMap<String, Vec<&cri::Container>> = BTreeMap::new();
    for c in &view.containers {
        containers.entry(uid_of(&c.labels)).or_default().push(c);
    }
    let ready = cri::PodSandboxState::SandboxReady as i32;
    let running = cri::ContainerState::ContainerRunning as i32;
    for uid in want {
        let sbs = sandboxes.get(uid).map_or(&[][..], Vec::as_slice);
        let n_ready = sbs.iter().filter(|s| s.state == ready).count();
        if n_ready != 1 || sbs.len() != 1 {
            bad.push(format!(
                "pod {uid}: {} sandboxes, {n_ready} ready (want exactly one, ready)",
                sbs.len()
            ));
        }
        let cs = containers.get(uid).map_or(&[][..], Vec::as_slice);
        let mut by_name: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
        for c in cs {
            let name = c
                .labels
                .get(CONTAINER_NAME_LABEL)
                .map_or("", String::as_str);
            let e = by_name.entry(name).or_default();
            e.0 += 1;
            e.1 += usize::from(c.state == running);
        }
        if by_name.is_empty() {
            bad.push(format!("pod {uid}: no container in the runtime"));
        }
        for (name, (all, live)) in by_name {
            if live != 1 || all - live > dead.max(MAX_DEAD_PER_CONTAINER) {
                bad.push(format!(
                    "pod {uid} container {name}: {all} instances, {live} running (want one \
                     running and at most {MAX_DEAD_PER_CONTAINER} dead)"
                ));
            }
        }
    }
    for uid in sandboxes.keys().chain(containers.keys()) {
        if !want.contains(uid) {
            bad.push(format!("runtime objects left for gone pod {uid}"));
        }
    }
    // shm mounts of sandboxes the runtime no longer has (only this runtime's: another
    // containerd's mounts are under its own state directory). Only a mount that was there
    // before the listing and still is after counts: one of a sandbox made meanwhile (another
    // test's agent shares this runtime) is in neither the listing nor the first read.
    let after = shm_sandbox_ids(state);
    for id in view.shm_before.intersection(&after) {
        if !view.all_sandbox_ids.contains(id) {
            bad.push(format!("shm mount of removed sandbox {id}"));
        }
    }
}

/// The sandbox IDs of the shm mounts under the runtime state directory `state`.
fn shm_sandbox_ids(state: &Path) -> BTreeSet<String> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let state = state.to_string_lossy();
    mounts
        .lines()
        .filter(|line| line.contains("/sandboxes/"))
        .filter_map(|line| {
            line.split_whitespace()
                .nth(4)
                .filter(|m| m.starts_with(state.as_ref()))
                .and_then(|m| m.strip_suffix("/shm"))
                .and_then(|m| m.rsplit('/').next())
                .map(str::to_owned)
        })
        .collect()
}

fn compare_sets(
    what: &str,
    have: &BTreeSet<String>,
    want: &BTreeSet<String>,
    bad: &mut Vec<String>,
) {
    for uid in have.difference(want) {
        bad.push(format!("{what} of gone pod {uid}"));
    }
    for uid in want.difference(have) {
        bad.push(format!("no {what} for pod {uid}"));
    }
}

/// The pod UIDs named by the entries of `dir` (through `uid_of` of each entry's name).
fn dir_uids(dir: &Path, uid_of: impl Fn(&str) -> Option<String>) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(&uid_of))
        .collect()
}

/// Polls [`check`] until it holds: the time it took, or the last violations after `timeout`.
pub fn converge(
    agent: &Agent,
    desired: &Desired,
    timeout: Duration,
) -> Result<Duration, Vec<String>> {
    converge_allowing(agent, desired, 0, timeout)
}

/// [`converge`] with [`check_allowing`] `dead` exited instances of each container.
pub fn converge_allowing(
    agent: &Agent,
    desired: &Desired,
    dead: usize,
    timeout: Duration,
) -> Result<Duration, Vec<String>> {
    converge_ignoring(agent, desired, dead, timeout, |_| false)
}

/// [`converge_allowing`] with the violations `ignored` picks left out: it holds once every
/// other violation is gone, and only those count after `timeout`.
fn converge_ignoring(
    agent: &Agent,
    desired: &Desired,
    dead: usize,
    timeout: Duration,
    ignored: impl Fn(&str) -> bool,
) -> Result<Duration, Vec<String>> {
    let start = Instant::now();
    loop {
        let bad: Vec<String> = match check_allowing(agent, desired, dead) {
            Ok(()) => Vec::new(),
            Err(bad) => bad.into_iter().filter(|b| !ignored(b)).collect(),
        };
        if bad.is_empty() {
            return Ok(start.elapsed());
        }
        if start.elapsed() >= timeout {
            return Err(bad);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// What one scenario run did and measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Outcome {
    pub scenario: &'static str,
    pub seed: u64,
    /// Faults injected (for kill9: agent kills).
    pub faults: usize,
    /// Manifest changes made (creates, updates, deletes).
    pub changes: usize,
    /// How long each fault itself took, in milliseconds, sorted (kill9: the restart until
    /// `/healthz`; sigterm: the agent's exit after SIGTERM).
    pub fault_ms: Vec<u64>,
    /// Time from each fault's end to the invariant holding, in milliseconds, sorted.
    pub converge_ms: Vec<u64>,
    /// Violations still there when the scenario gave up (empty: the invariant held every time).
    pub violations: Vec<String>,
}

impl Outcome {
    /// Nothing injected yet.
    pub fn new(scenario: &'static str, seed: u64) -> Self {
        Self {
            scenario,
            seed,
            faults: 0,
            changes: 0,
            fault_ms: Vec::new(),
            converge_ms: Vec::new(),
            violations: Vec::new(),
        }
    }

    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }

    /// Fails with the seed and every violation when the scenario's invariant did not hold.
    pub fn assert_passed(&self) {
        assert!(self.passed(), "seed {}: {:#?}", self.seed, self.violations);
    }

    /// The `q`-quantile (0..=1) of the convergence times.
    pub fn converge_quantile(&self, q: f64) -> Option<u64> {
        quantile(&self.converge_ms, q)
    }

    /// The `q`-quantile (0..=1) of the faults' own times.
    pub fn fault_quantile(&self, q: f64) -> Option<u64> {
        quantile(&self.fault_ms, q)
    }
}

/// The `q`-quantile of sorted `v`.
fn quantile(v: &[u64], q: f64) -> Option<u64> {
    let n = v.len();
    let idx = ((n as f64 - 1.0) * q).round();
    (n > 0).then(|| v[(idx as usize).min(n - 1)])
}

/// A scenario's moving parts: its random source, the agent and what it should run.
pub struct Ctx {
    pub rng: Rng,
    pub agent: Agent,
    pub desired: Desired,
    /// The most pods the churn keeps.
    pub max_pods: usize,
    next: usize,
    changes: usize,
}

impl Ctx {
    /// Applies one random change to the manifests: create a pod, update one (a new label: the
    /// static pod gets a new UID, so the old one is killed and a new one started) or delete one.
    pub fn churn(&mut self) {
        let names: Vec<String> = self.desired.keys().cloned().collect();
        let op = if names.is_empty() {
            0
        } else if names.len() >= self.max_pods {
            1 + self.rng.below(2)
        } else {
            self.rng.below(3)
        };
        self.change(op);
    }

    /// Replaces one pod by a new one (an update to a new UID: its containers are stopped, a new
    /// sandbox and containers are created and started), or creates one when there is none.
    pub fn replace_one(&mut self) {
        self.change(u64::from(!self.desired.is_empty()));
    }

    /// Makes change `op`: 0 creates a pod, 1 updates one, anything else deletes one.
    fn change(&mut self, op: u64) {
        let names: Vec<String> = self.desired.keys().cloned().collect();
        let op = if names.is_empty() { 0 } else { op };
        self.changes += 1;
        let pick = |rng: &mut Rng| {
            names[usize::try_from(rng.below(names.len() as u64)).unwrap_or(0)].clone()
        };
        match op {
            0 => {
                let file = format!("chaos-{}.yaml", self.next);
                self.next += 1;
                let text = looping_pod_manifest(file.trim_end_matches(".yaml"), &[]);
                self.agent.write_manifest(&file, &text);
                self.desired.insert(file, text);
            }
            1 => {
                let file = pick(&mut self.rng);
                let generation = self.rng.next_u64().to_string();
                let text =
                    looping_pod_manifest(file.trim_end_matches(".yaml"), &[("gen", &generation)]);
                self.agent.write_manifest(&file, &text);
                self.desired.insert(file, text);
            }
            _ => {
                let file = pick(&mut self.rng);
                self.agent.remove_manifest(&file);
                self.desired.remove(&file);
            }
        }
    }

    /// [`Ctx::churn`] that never updates or deletes the manifests `keep` selects.
    pub fn churn_keeping(&mut self, keep: impl Fn(&str) -> bool) {
        let kept: Desired = self
            .desired
            .iter()
            .filter(|(f, _)| keep(f))
            .map(|(f, t)| (f.clone(), t.clone()))
            .collect();
        self.desired.retain(|f, _| !keep(f));
        self.churn();
        self.desired.extend(kept);
    }

    /// A pause of up to `max_ms` milliseconds, chosen by the seed.
    pub fn pause(&mut self, max_ms: u64) {
        std::thread::sleep(Duration::from_millis(self.rng.below(max_ms)));
    }
}

/// Runs `rounds` rounds of `fault` (which injects one fault and returns how long the fault took
/// in milliseconds, or why it failed), checking the invariant after each.
fn run_rounds(
    runtime: &Runtime,
    scenario: &'static str,
    seed: u64,
    rounds: usize,
    pods: usize,
    fault: impl FnMut(&mut Ctx) -> Result<u64, String>,
) -> Outcome {
    let opts = AgentOptions::new(&format!("chaos-{scenario}"));
    run_rounds_with(runtime, scenario, seed, (rounds, pods), (opts, 0), fault).0
}

/// [`run_rounds`] with the agent started with `opts.0`, allowing `opts.1` exited instances of
/// each container ([`check_allowing`]); `(rounds, pods)`. Hands back the scenario's context too,
/// its agent still running, for what the scenario reads at the end.
fn run_rounds_with(
    runtime: &Runtime,
    scenario: &'static str,
    seed: u64,
    (rounds, pods): (usize, usize),
    (opts, dead): (AgentOptions, usize),
    mut fault: impl FnMut(&mut Ctx) -> Result<u64, String>,
) -> (Outcome, Ctx) {
    let mut cx = Ctx {
        rng: Rng::new(seed),
        agent: Agent::start(runtime, opts),
        desired: Desired::new(),
        max_pods: pods.max(1),
        next: 0,
        changes: 0,
    };
    let mut out = Outcome::new(scenario, seed);
    for _ in 0..pods.min(3) {
        cx.churn();
    }
    for round in 0..rounds {
        let result = fault(&mut cx);
        out.faults += 1;
        let checked = result.map_err(|e| vec![e]).and_then(|ms| {
            out.fault_ms.push(ms);
            converge_allowing(&cx.agent, &cx.desired, dead, CONVERGE_TIMEOUT)
        });
        match checked {
            Ok(t) => out
                .converge_ms
                .push(u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
            Err(bad) => {
                out.violations = bad
                    .into_iter()
                    .map(|b| format!("round {round}: {b}"))
                    .collect();
                break;
            }
        }
    }
    out.changes = cx.changes;
    out.converge_ms.sort_unstable();
    out.fault_ms.sort_unstable();
    if !out.passed() {
        eprintln!(
            "chaos {scenario} (seed {seed}) failed; agent log {}",
            cx.agent.log_path().display()
        );
    }
    (out, cx)
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// kill -9 of the agent at random instants during create/update/delete churn: each round makes
/// one to three changes, kills the agent 0-1.5 s later (a third of the time changing one more
/// manifest while it is down) and restarts it.
pub fn kill9_churn(runtime: &Runtime, seed: u64, rounds: usize, pods: usize) -> Outcome {
    run_rounds(runtime, "kill9", seed, rounds, pods, |cx| {
        for _ in 0..=cx.rng.below(3) {
            cx.churn();
        }
        cx.pause(1500);
        cx.agent.kill();
        if cx.rng.below(3) == 0 {
            cx.churn();
        }
        let started = Instant::now();
        cx.agent.restart_after_sigkill();
        Ok(ms(started.elapsed()))
    })
}

/// How long the agent may take to exit after SIGTERM.
pub const SIGTERM_EXIT_LIMIT: Duration = Duration::from_secs(10);

/// SIGTERM in the middle of a burst: each round makes three to eight changes at once, sends
/// SIGTERM 0-0.5 s later (the fault's time is how long the agent took to exit, at most
/// [`SIGTERM_EXIT_LIMIT`]) and starts the agent again.
pub fn sigterm_burst(runtime: &Runtime, seed: u64, rounds: usize, pods: usize) -> Outcome {
    run_rounds(runtime, "sigterm", seed, rounds, pods, |cx| {
        for _ in 0..3 + cx.rng.below(6) {
            cx.churn();
        }
        cx.pause(500);
        let started = Instant::now();
        cx.agent.stop(SIGTERM_EXIT_LIMIT + Duration::from_secs(5));
        let took = started.elapsed();
        if took > SIGTERM_EXIT_LIMIT {
            return Err(format!(
                "the agent took {took:?} to exit after SIGTERM (limit {SIGTERM_EXIT_LIMIT:?})"
            ));
        }
        cx.agent.restart_after_sigkill();
        Ok(ms(took))
    })
}

/// `--runtime-request-timeout` of the `cri-faults` agent: a hung call fails within it (twice it
/// for `RunPodSandbox`, plus the grace period for `StopContainer`).
pub const CRI_FAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The CRI methods the `cri-faults` scenario disturbs.
pub const CRI_FAULT_METHODS: &[&str] = &[
    "RunPodSandbox",
    "CreateContainer",
    "StartContainer",
    "StopContainer",
    "ListContainers",
];

/// One round of `cri-faults`: the fault and how many calls it disturbed.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CriFaultRound {
    pub method: &'static str,
    pub fault: String,
    /// Calls the fault disturbed (0: the churn made no call of the method in the window).
    pub disturbed: u64,
}

/// What `cri-faults` saw besides the [`Outcome`].
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct CriFaultReport {
    pub rounds: Vec<CriFaultRound>,
    /// `swiftlet_cri_deadline_exceeded_total` at the end, by label set.
    pub deadline_exceeded: BTreeMap<String, u64>,
}

impl CriFaultReport {
    /// Rounds whose fault was a hang that took a call: each must end in a deadline exceeded.
    pub fn hung_calls(&self) -> u64 {
        self.rounds
            .iter()
            .filter(|r| r.fault == Fault::Hang.to_string())
            .map(|r| r.disturbed)
            .sum()
    }

    /// Every call the agent gave up on at its deadline.
    pub fn deadlines_exceeded(&self) -> u64 {
        self.deadline_exceeded.values().sum()
    }
}

/// The fault of one `cri-faults` round, chosen by the seed: a method of [`CRI_FAULT_METHODS`]
/// and a delay of 0.5-8 s (every call), an Unavailable, Internal or DeadlineExceeded error (three
/// calls in four), or a hang of the next call.
fn pick_cri_fault(rng: &mut Rng) -> (&'static str, Fault, Share) {
    let method =
        CRI_FAULT_METHODS[usize::try_from(rng.below(CRI_FAULT_METHODS.len() as u64)).unwrap_or(0)];
    let most = Share::PerMillion(750_000);
    let (fault, share) = match rng.below(6) {
        0 => (
            Fault::Delay(Duration::from_millis(500 + rng.below(7_500))),
            Share::ALL,
        ),
        1 => (Fault::Fail(tonic::Code::Unavailable), most),
        2 => (Fault::Fail(tonic::Code::Internal), most),
        3 => (Fault::Fail(tonic::Code::DeadlineExceeded), most),
        // Twice as likely as each other fault: the one only a deadline ends.
        _ => (Fault::Hang, Share::Next(1)),
    };
    (method, fault, share)
}

/// CRI faults during manifest churn: the agent talks to the runtime through a [`CriProxy`] and
/// runs with `--runtime-request-timeout` [`CRI_FAULT_REQUEST_TIMEOUT`]. Each round injects one
/// fault chosen by the seed ([`pick_cri_fault`]) for 2-5 s while replacing a pod and making zero
/// to two other changes, then removes it (the fault's time is that window); the invariant must then hold within the
/// convergence timeout, hung calls having failed at their deadlines.
pub fn cri_faults(
    runtime: &Runtime,
    seed: u64,
    rounds: usize,
    pods: usize,
) -> (Outcome, CriFaultReport) {
    let mut report = CriFaultReport::default();
    let proxy = match CriProxy::start(&runtime.endpoint, seed) {
        Ok(p) => p,
        Err(e) => {
            let mut out = Outcome::new("cri-faults", seed);
            out.violations.push(e.to_string());
            return (out, report);
        }
    };
    let mut opts = AgentOptions::new("chaos-cri-faults");
    opts.cri_endpoint = Some(proxy.endpoint());
    opts.extra_args = vec![
        "--runtime-request-timeout".into(),
        format!("{}s", CRI_FAULT_REQUEST_TIMEOUT.as_secs()),
    ];
    let (out, cx) = run_rounds_with(
        runtime,
        "cri-faults",
        seed,
        (rounds, pods),
        (opts, 0),
        |cx| {
            let (method, fault, share) = pick_cri_fault(&mut cx.rng);
            let before = proxy.injected(method);
            let window = Duration::from_millis(2_000 + cx.rng.below(3_000));
            let started = Instant::now();
            proxy.inject(method, fault, share);
            // A replaced pod calls every method the faults aim at; then zero to two more changes.
            cx.replace_one();
            for _ in 0..cx.rng.below(3) {
                cx.pause(1_000);
                cx.churn();
            }
            std::thread::sleep(window.saturating_sub(started.elapsed()));
            proxy.clear();
            report.rounds.push(CriFaultRound {
                method,
                fault: fault.to_string(),
                disturbed: proxy.injected(method) - before,
            });
            Ok(ms(started.elapsed()))
        },
    );
    report.deadline_exceeded = metric_by_label(&cx.agent, "swiftlet_cri_deadline_exceeded_total");
    // The agent goes before the proxy it talks through.
    drop(cx);
    (out, report)
}

/// The agent's peak RSS bound under hostile input, for the release build (the build that
/// ships; the debug build carries unoptimised code and larger frames).
pub const MEMORY_BOUND_KIB: u64 = 64 * 1024;

/// How the hostile scenario runs.
#[derive(Debug, Clone, Default)]
pub struct HostileOptions {
    /// The agent binary; `None`: the debug build.
    pub binary: Option<std::path::PathBuf>,
    /// Fail when the agent's peak RSS (idle, or while an input is offered) is over this many
    /// KiB; `None`: measure and report only.
    pub bound_kib: Option<u64>,
}

impl HostileOptions {
    /// The release agent, held to [`MEMORY_BOUND_KIB`] (builds it: minutes on a cold cache).
    pub fn release() -> Self {
        HostileOptions {
            binary: Some(crate::release_agent_binary()),
            bound_kib: Some(MEMORY_BOUND_KIB),
        }
    }
}

/// One hostile input and what it did to the agent.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HostileResult {
    pub input: &'static str,
    /// Rejections counted in `swiftlet_config_errors_total` while it was offered.
    pub errors_counted: u64,
    /// The agent's peak RSS while it was offered (VmHWM, reset before), KiB.
    pub peak_rss_kib: u64,
}

/// What the manifest-URL server answers; switched by the scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Body {
    /// A PodList of the two good URL pods.
    Good,
    /// A body that never ends (no length, bytes forever).
    Endless,
    /// Headers and a declared length, then nothing.
    Stall,
    /// A declared 64 MiB body.
    Oversized,
    /// Bytes that are not UTF-8.
    InvalidUtf8,
    /// A YAML document whose aliases expand to billions of nodes.
    AliasBomb,
    /// JSON nested 100,000 deep.
    DeepNesting,
    /// The two good pods and 9,998 more (more than `--max-pods`, and more than one list's
    /// memory budget holds).
    HugeList,
    /// The two good pods and 90,000 tiny ones: about 9.7 MB, just within the 10 MiB body limit.
    FullList,
}

const HOSTILE_BODIES: &[(&str, Body)] = &[
    ("url: endless body", Body::Endless),
    ("url: stalled body", Body::Stall),
    ("url: 64 MiB body", Body::Oversized),
    ("url: invalid UTF-8", Body::InvalidUtf8),
    ("url: YAML alias bomb", Body::AliasBomb),
    ("url: JSON nested 100,000 deep", Body::DeepNesting),
    ("url: PodList of 10,000 pods", Body::HugeList),
    ("url: PodList of 90,000 pods (9.7 MB)", Body::FullList),
];

fn url_pod(name: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("{name}-uid")},
        "spec": {"terminationGracePeriodSeconds": 2, "containers": [{
            "name": "main", "image": crate::BUSYBOX_IMAGE, "imagePullPolicy": "Never",
            "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]}]}
    })
}

/// Writes the HTTP answer for `body` to `stream`; returns when the body is written or the
/// agent hangs up.
fn answer(mut stream: std::net::TcpStream, body: Body) {
    use std::io::{Read, Write};
    let mut buf = [0u8; 4096];
    let mut request = Vec::new();
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => request.extend_from_slice(&buf[..n]),
        }
    }
    let whole = |text: Vec<u8>| {
        let mut out = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            text.len()
        )
        .into_bytes();
        out.extend(text);
        out
    };
    let list = |extra: usize| {
        let mut items = vec![url_pod("url-a"), url_pod("url-b")];
        items.extend((0..extra).map(|i| {
            serde_json::json!({"metadata": {"name": format!("h{i}")},
                "spec": {"containers": [{"name": "c", "image": crate::BUSYBOX_IMAGE}]}})
        }));
        serde_json::to_vec(
            &serde_json::json!({"kind": "PodList", "apiVersion": "v1", "items": items}),
        )
        .unwrap_or_default()
    };
    let _ = match body {
        Body::Good => stream.write_all(&whole(list(0))),
        Body::HugeList => stream.write_all(&whole(list(9_998))),
        Body::FullList => stream.write_all(&whole(list(90_000))),
        Body::InvalidUtf8 => {
            stream.write_all(&whole(b"kind: Pod\nmetadata: {name: \xff\xfe}\n".to_vec()))
        }
        Body::AliasBomb => {
            let mut y =
                String::from("a: &a [\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"]\n");
            for (i, prev) in ('b'..='j').zip('a'..='i') {
                y.push_str(&format!("{i}: &{i} [*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev}]\n"));
            }
            y.push_str("kind: Pod\n");
            stream.write_all(&whole(y.into_bytes()))
        }
        Body::DeepNesting => {
            let mut j = "[".repeat(100_000);
            j.push_str(&"]".repeat(100_000));
            stream.write_all(&whole(j.into_bytes()))
        }
        Body::Stall => stream
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n{")
            .map(|()| std::thread::sleep(Duration::from_secs(20))),
        Body::Endless | Body::Oversized => {
            let head: &[u8] = if body == Body::Endless {
                b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n"
            } else {
                b"HTTP/1.1 200 OK\r\ncontent-length: 67108864\r\n\r\n"
            };
            let chunk = vec![b' '; 64 * 1024];
            let mut r = stream.write_all(head);
            let mut sent = 0usize;
            while r.is_ok() && (body == Body::Endless || sent < 64 << 20) {
                r = stream.write_all(&chunk);
                sent += chunk.len();
            }
            r
        }
    };
}

/// The manifest-URL server's switch: what it answers, and how many requests it has had for
/// each answer.
#[derive(Clone, Default)]
struct Served {
    state: std::sync::Arc<std::sync::Mutex<ServedState>>,
}

/// The body answered now (`None`: good) and the requests per body so far.
type ServedState = (Option<Body>, BTreeMap<Body, usize>);

impl Served {
    fn lock(&self) -> std::sync::MutexGuard<'_, ServedState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn set(&self, body: Body) {
        self.lock().0 = Some(body);
    }

    /// The body to answer with, counted.
    fn take(&self) -> Body {
        let mut g = self.lock();
        let body = g.0.unwrap_or(Body::Good);
        *g.1.entry(body).or_default() += 1;
        body
    }

    fn count(&self, body: Body) -> usize {
        self.lock().1.get(&body).copied().unwrap_or(0)
    }

    /// Waits until `body` has been asked for `n` more times than `since` (false after `timeout`).
    fn wait_requests(&self, body: Body, since: usize, n: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.count(body) < since + n {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        true
    }
}

/// A manifest-URL server on loopback answering what the returned switch says.
fn hostile_server() -> std::io::Result<(u16, Served)> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let served = Served::default();
    let s = served.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let body = s.take();
            std::thread::spawn(move || answer(stream, body));
        }
    });
    Ok((port, served))
}

/// A valid pod named `name` whose manifest (YAML) is about `bytes` long: one container with
/// env vars of about 100 bytes each.
fn large_pod(name: &str, bytes: usize) -> Vec<u8> {
    let mut m = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  \
         containers:\n  - name: main\n    image: {}\n    imagePullPolicy: Never\n    env:\n",
        crate::BUSYBOX_IMAGE
    );
    let value = "v".repeat(60);
    let mut i = 0;
    while m.len() + 128 < bytes {
        m.push_str(&format!(
            "    - name: VAR_{i:08}\n      value: \"{value}\"\n"
        ));
        i += 1;
    }
    m.into_bytes()
}

/// The name of the valid large pod among the hostile files: it is not a config error (the
/// agent's `--max-pods` rejects it at admission), so the scenario waits for it on `/pods`.
const LARGE_VALID_POD: &str = "large";

/// The hostile files written into the manifest directory: (what, file name, contents).
fn hostile_files() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let mut bomb = String::from("a: &a [x,x,x,x,x,x,x,x,x]\n");
    for (i, prev) in ('b'..='j').zip('a'..='i') {
        bomb.push_str(&format!(
            "{i}: &{i} [*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev}]\n"
        ));
    }
    let escape = "apiVersion: v1\nkind: Pod\nmetadata: {name: ../../../etc/passwd}\n\
                  spec: {containers: [{name: c, image: x}]}\n";
    vec![
        ("file: YAML alias bomb", "bomb.yaml", bomb.into_bytes()),
        (
            "file: invalid UTF-8",
            "bad-utf8.yaml",
            b"kind: Pod\nmetadata: {name: \xff}\n".to_vec(),
        ),
        ("file: 11 MiB manifest", "huge.yaml", vec![b'#'; 11 << 20]),
        (
            "file: a valid pod of 9 MiB (over the pod limit)",
            "huge-pod.yaml",
            large_pod("huge-pod", 9 << 20),
        ),
        (
            "file: a valid pod just under 3 MiB",
            "large.yaml",
            large_pod(LARGE_VALID_POD, MAX_POD_BYTES as usize - 4096),
        ),
        (
            "file: a name leaving its directory",
            "escape.yaml",
            escape.as_bytes().to_vec(),
        ),
        ("file: JSON nested 100,000 deep", "deep.json", {
            let mut j = "[".repeat(100_000);
            j.push_str(&"]".repeat(100_000));
            j.into_bytes()
        }),
    ]
}

/// The total of `swiftlet_config_errors_total` on the agent's `/metrics`.
fn config_errors(agent: &Agent) -> u64 {
    metric_by_label(agent, "swiftlet_config_errors_total")
        .values()
        .sum()
}

/// Config errors counted for a PodList whose pods would hold more than one list may.
fn list_too_large(agent: &Agent) -> u64 {
    metric_by_label(agent, "swiftlet_config_errors_total")
        .iter()
        .filter(|(labels, _)| labels.contains("reason=\"list_too_large\""))
        .map(|(_, n)| n)
        .sum()
}

/// The samples of counter family `name` on the agent's `/metrics`, by their label set (the text
/// between the braces).
pub(crate) fn metric_by_label(agent: &Agent, name: &str) -> BTreeMap<String, u64> {
    let (_, body) = agent.get("/metrics");
    body.lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix('{'))
        .filter_map(|l| {
            let (labels, value) = l.rsplit_once(' ')?;
            let value = value.parse::<f64>().ok()? as u64;
            Some((labels.trim_end_matches('}').to_owned(), value))
        })
        .collect()
}

/// Resets the agent's peak RSS (`/proc/<pid>/clear_refs` 5) so VmHWM measures from now.
pub fn reset_peak(pid: u32) {
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
}

/// The agent's VmHWM in KiB.
pub fn peak_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The container IDs of every pod in `/pods`, by pod name (a restart changes them).
fn container_ids(agent: &Agent) -> BTreeMap<String, Vec<String>> {
    agent
        .pods()
        .items
        .iter()
        .map(|p| {
            let ids = p
                .status
                .iter()
                .flat_map(|s| s.container_statuses.iter().flatten())
                .filter_map(|c| c.container_id.clone())
                .collect();
            (p.metadata.name.clone().unwrap_or_default(), ids)
        })
        .collect()
}

/// Hostile input at scale: every hostile body the manifest URL can serve and every hostile file
/// the manifest directory can hold, one at a time beside two good file pods and two good URL
/// pods. Each must be rejected and counted (`swiftlet_config_errors_total`), must not restart or
/// drop a good pod, and its peak RSS is measured; with `opts.bound_kib`, a peak over it (the
/// idle agent's included) is a violation. `rounds` repeats the whole set (in a new order).
pub fn hostile_input(
    runtime: &Runtime,
    seed: u64,
    rounds: usize,
    hostile: &HostileOptions,
) -> (Outcome, Vec<HostileResult>) {
    let mut out = Outcome::new("hostile", seed);
    let (port, served) = match hostile_server() {
        Ok(s) => s,
        Err(e) => {
            out.violations
                .push(format!("starting the manifest-URL server: {e}"));
            return (out, Vec::new());
        }
    };
    let mut opts = AgentOptions::new("chaos-hostile");
    opts.extra_args = vec![
        "--manifest-url".into(),
        format!("http://127.0.0.1:{port}/pods"),
        "--http-check-frequency".into(),
        "1s".into(),
        "--max-pods".into(),
        "4".into(),
    ];
    // Debug logs of 10,000 rejected pods would be the test's own cost; warnings say enough.
    opts.verbosity = 2;
    opts.binary = hostile.binary.clone();
    let agent = Agent::start(runtime, opts);
    let mut desired = Desired::new();
    for name in ["good-a", "good-b"] {
        let text = looping_pod_manifest(name, &[]);
        agent.write_manifest(&format!("{name}.yaml"), &text);
        desired.insert(format!("{name}.yaml"), text);
    }
    let all_good = |agent: &Agent| {
        let pods = agent.pods();
        let names = [
            agent.static_pod_name("good-a"),
            agent.static_pod_name("good-b"),
            agent.static_pod_name("url-a"),
            agent.static_pod_name("url-b"),
        ];
        names.iter().all(|n| pods.is_running(n))
    };
    if agent
        .try_wait_for(|_| all_good(&agent), CONVERGE_TIMEOUT)
        .is_none()
    {
        out.violations.push("the good pods did not start".into());
        return (out, Vec::new());
    }
    let Some(pid) = agent.pid() else {
        out.violations.push("the agent is not running".into());
        return (out, Vec::new());
    };
    let mut rng = Rng::new(seed);
    let mut results = vec![HostileResult {
        input: "none (idle, the good pods running)",
        errors_counted: 0,
        peak_rss_kib: peak_kib(pid),
    }];
    let files = hostile_files();
    for _ in 0..rounds.max(1) {
        // Every input once a round, in an order the seed picks.
        let mut order: Vec<usize> = (0..HOSTILE_BODIES.len() + files.len()).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, usize::try_from(rng.below(i as u64 + 1)).unwrap_or(0));
        }
        for i in order {
            let before_ids = container_ids(&agent);
            let before = config_errors(&agent);
            let lists_before = list_too_large(&agent);
            reset_peak(pid);
            let started = Instant::now();
            let mut counted = || config_errors(&agent).saturating_sub(before);
            let wait_counted = |counted: &mut dyn FnMut() -> u64| {
                let deadline = Instant::now() + Duration::from_secs(15);
                while counted() == 0 && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(100));
                }
            };
            let what = if let Some((what, body)) = HOSTILE_BODIES.get(i) {
                // Two fetches of it at least (a stalled one runs into the agent's fetch timeout),
                // and then two good fetches, so no stalled fetch reaches into the next input.
                served.set(*body);
                let asked = served.count(*body);
                if !served.wait_requests(*body, asked, 2, Duration::from_secs(30)) {
                    out.violations
                        .push(format!("{what}: the agent stopped fetching"));
                }
                wait_counted(&mut counted);
                // Both lists are valid pods, more than one list may hold: refused for that.
                if matches!(body, Body::HugeList | Body::FullList)
                    && list_too_large(&agent) <= lists_before
                {
                    out.violations.push(format!(
                        "{what}: not refused as over a list's memory budget"
                    ));
                }
                let good = served.count(Body::Good);
                served.set(Body::Good);
                if !served.wait_requests(Body::Good, good, 2, Duration::from_secs(30)) {
                    out.violations
                        .push(format!("{what}: the agent stopped fetching after it"));
                }
                *what
            } else {
                let (what, file, bytes) = &files[i - HOSTILE_BODIES.len()];
                let path = agent.manifest_dir().join(file);
                if let Err(e) = std::fs::write(&path, bytes) {
                    out.violations.push(format!("{what}: writing it: {e}"));
                }
                if file.starts_with(LARGE_VALID_POD) {
                    let name = agent.static_pod_name(LARGE_VALID_POD);
                    if agent
                        .try_wait_for(|pods| pods.get(&name).is_some(), Duration::from_secs(30))
                        .is_none()
                    {
                        out.violations.push(format!("{what}: never shown on /pods"));
                    }
                } else {
                    wait_counted(&mut counted);
                }
                let _ = std::fs::remove_file(&path);
                *what
            };
            out.faults += 1;
            let counted = counted();
            // The large pod is valid input: admitted or rejected by --max-pods (admission, not a
            // config error). The lists' pods past the memory budget are one config error.
            if counted == 0 && !what.contains("just under") {
                out.violations
                    .push(format!("{what}: not counted as a config error"));
            }
            // The good pods come back if the input replaced them, but never restarted.
            std::thread::sleep(Duration::from_secs(2));
            let after_ids = container_ids(&agent);
            for (name, ids) in &before_ids {
                if after_ids.get(name) != Some(ids) {
                    out.violations
                        .push(format!("{what}: pod {name} restarted or went away"));
                }
            }
            let peak = peak_kib(pid);
            out.fault_ms.push(ms(started.elapsed()));
            results.push(HostileResult {
                input: what,
                errors_counted: counted,
                peak_rss_kib: peak,
            });
        }
    }
    if let Some(bound) = hostile.bound_kib {
        for r in results.iter().filter(|r| r.peak_rss_kib > bound) {
            out.violations.push(format!(
                "{}: peak RSS {:.1} MiB, over the {:.1} MiB bound",
                r.input,
                r.peak_rss_kib as f64 / 1024.0,
                bound as f64 / 1024.0
            ));
        }
    }
    // The URL pods are in /pods but not in `desired`: the invariant holds once every other
    // violation is gone (polled, so that one seen while another test's sandbox is being
    // removed passes, as in every other scenario).
    let url_pod = |b: &str| b.contains("url-a") || b.contains("url-b") || b.contains("-uid");
    match converge_ignoring(&agent, &desired, 0, CONVERGE_TIMEOUT, url_pod) {
        Ok(t) => out.converge_ms.push(ms(t)),
        Err(bad) => out.violations.extend(bad),
    }
    out.fault_ms.sort_unstable();
    if !out.passed() {
        eprintln!(
            "chaos hostile (seed {seed}) failed; agent log {}",
            agent.log_path().display()
        );
    }
    (out, results)
}

/// Where the `runtime` scenario's own containerd keeps its files (see [`runtime_restarts`]).
pub const RUNTIME_SCENARIO_DIR: &str = "/var/lib/swiftlet-chaos-runtime";
/// The bridge of the `runtime` scenario's containerd (the shared one's is `swiftlet0`).
pub const RUNTIME_SCENARIO_BRIDGE: &str = "swl-chaos0";
/// The pod subnet of the `runtime` scenario's containerd (the shared one's is 10.99.0.0/16).
pub const RUNTIME_SCENARIO_SUBNET: &str = "10.98.0.0/16";

/// containerd SIGKILLed and started again under a running agent, on a containerd of the
/// scenario's own (its own socket, root, state, config, CNI dirs, bridge and subnet: the shared
/// runtime other tests use is never touched). Each round either makes one to three changes,
/// kills containerd 0-1.5 s later (in the middle of pod starts, kills and updates; a third of
/// the time changing one more manifest while it is down) and starts it again 0-3 s later; or
/// kills the agent and containerd together and starts the agent while
/// containerd is down, starting containerd 2-6 s later (the second round and every fourth after
/// it, so that every run of two rounds or more has one). The fault's time runs from the kill to
/// containerd (and the agent) answering again.
pub fn runtime_restarts(seed: u64, rounds: usize, pods: usize) -> Outcome {
    let rt = match Runtime::private(
        Path::new(RUNTIME_SCENARIO_DIR),
        RUNTIME_SCENARIO_BRIDGE,
        RUNTIME_SCENARIO_SUBNET,
    ) {
        Ok(rt) => rt,
        Err(e) => {
            let mut out = Outcome::new("runtime", seed);
            out.violations.push(e);
            return out;
        }
    };
    let mut round = 0;
    run_rounds(&rt, "runtime", seed, rounds, pods, |cx| {
        round += 1;
        if round % 4 == 2 {
            // The runtime down when the agent starts.
            cx.agent.kill();
            let started = Instant::now();
            rt.kill()?;
            if cx.rng.below(2) == 0 {
                cx.churn();
            }
            let delay = Duration::from_millis(2000 + cx.rng.below(4000));
            let up = std::thread::scope(|s| {
                let up = s.spawn(|| {
                    std::thread::sleep(delay);
                    rt.up()
                });
                cx.agent.restart_after_sigkill();
                up.join()
            });
            up.map_err(|_| "starting containerd panicked".to_owned())??;
            return Ok(ms(started.elapsed()));
        }
        for _ in 0..=cx.rng.below(3) {
            cx.churn();
        }
        cx.pause(1500);
        let started = Instant::now();
        rt.kill()?;
        if cx.rng.below(3) == 0 {
            cx.churn();
        }
        cx.pause(3000);
        rt.up()?;
        Ok(ms(started.elapsed()))
    })
}

/// Where [`runtime_killed_mid_burst`]'s own containerd keeps its files, its bridge and subnet
/// (apart from [`runtime_restarts`]' so that both can run at once).
pub const BURST_SCENARIO_DIR: &str = "/var/lib/swiftlet-chaos-burst";
pub const BURST_SCENARIO_BRIDGE: &str = "swl-burst0";
pub const BURST_SCENARIO_SUBNET: &str = "10.97.0.0/16";

/// What [`runtime_killed_mid_burst`] saw when it killed containerd.
#[derive(Debug, Clone, Default)]
pub struct MidBurst {
    /// The node's sandboxes in the runtime at the kill.
    pub sandboxes_at_kill: usize,
    /// Pods `/pods` showed Running at the kill.
    pub running_at_kill: usize,
    /// From containerd answering again to the invariant holding.
    pub converged: Option<Duration>,
    /// The invariant's violations, when it never held.
    pub violations: Vec<String>,
}

/// `pods` static pods written at once; containerd (a containerd of the scenario's own) SIGKILLed
/// as soon as the first of their sandboxes exists, so that the burst is cut in the middle, and
/// started again `down` later. Then the invariant ([`check`]) must hold within `timeout`: every
/// pod Running once, no duplicate sandbox or container, no leaked pod cgroup.
pub fn runtime_killed_mid_burst(pods: usize, down: Duration, timeout: Duration) -> MidBurst {
    let mut out = MidBurst::default();
    let rt = match Runtime::private(
        Path::new(BURST_SCENARIO_DIR),
        BURST_SCENARIO_BRIDGE,
        BURST_SCENARIO_SUBNET,
    ) {
        Ok(rt) => rt,
        Err(e) => {
            out.violations.push(e);
            return out;
        }
    };
    let agent = Agent::start(&rt, AgentOptions::new("chaos-burst"));
    let mut desired = Desired::new();
    for i in 0..pods {
        let file = format!("burst-{i}.yaml");
        let text = looping_pod_manifest(file.trim_end_matches(".yaml"), &[]);
        desired.insert(file, text);
    }
    // All at once: the agent sees one directory's worth of new files.
    for (file, text) in &desired {
        agent.write_manifest(file, text);
    }
    let deadline = Instant::now() + timeout;
    loop {
        let sandboxes = cri_objects_labelled(agent.endpoint(), NODE_NAME_LABEL, agent.node_name())
            .map(|(s, _)| s.len())
            .unwrap_or(0);
        if sandboxes > 0 {
            out.sandboxes_at_kill = sandboxes;
            break;
        }
        if Instant::now() > deadline {
            out.violations
                .push("no sandbox was ever created".to_owned());
            return out;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if let Err(e) = rt.kill() {
        out.violations.push(e);
        return out;
    }
    out.running_at_kill = agent
        .pods()
        .items
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .count();
    std::thread::sleep(down);
    if let Err(e) = rt.up() {
        out.violations.push(e);
        return out;
    }
    match converge(&agent, &desired, timeout) {
        Ok(t) => out.converged = Some(t),
        Err(bad) => {
            eprintln!(
                "chaos burst failed; agent log {}",
                agent.log_path().display()
            );
            out.violations = bad;
        }
    }
    out
}

/// One sample of the agent's resources.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Resources {
    /// Create/delete cycles done when it was taken.
    pub cycle: usize,
    /// VmRSS, KiB.
    pub rss_kib: u64,
    /// Open file descriptors (entries of `/proc/<pid>/fd`).
    pub fds: u64,
    /// Threads (`Threads:` of `/proc/<pid>/status`).
    pub threads: u64,
    /// Tasks alive in the agent's async runtime (`swiftlet_tokio_alive_tasks` on `/metrics`).
    pub tokio_tasks: u64,
}

/// The soak's rule: RSS may grow at most this much between the middle and the end.
pub const SOAK_RSS_GROWTH_KIB: u64 = 2 * 1024;

/// The agent's resources now (zeros for what cannot be read).
pub fn resources(agent: &Agent, cycle: usize) -> Resources {
    let pid = agent.pid().unwrap_or(0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    // The fewest open descriptors over five readings 200 ms apart: a connection being opened or
    // closed at one instant (a poll of the test's own) is not a leak; a leaked one is in all.
    let fds = (0..5)
        .map(|i| {
            if i > 0 {
                std::thread::sleep(Duration::from_millis(200));
            }
            std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64)
        })
        .min()
        .unwrap_or(0);
    let (_, metrics) = agent.get("/metrics");
    let tokio_tasks = metrics
        .lines()
        .find_map(|l| l.strip_prefix("swiftlet_tokio_alive_tasks "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    Resources {
        cycle,
        rss_kib: field("VmRSS:"),
        fds,
        threads: field("Threads:"),
        tokio_tasks,
    }
}

/// `cycles` create/delete cycles of `pods` pods on one agent: each cycle writes the pods'
/// manifests, waits for the invariant (all Running once), removes them and waits for the
/// invariant again (nothing left). The agent's resources are sampled after the first cycle
/// (the start: the first pods' one-time costs are paid), after half the cycles and at the end,
/// each time with no pod and a second's rest. It fails when the open file descriptors at the
/// end are more than at the start or the middle, when the async runtime's tasks at the end are
/// more than at the start, or when RSS grew more than [`SOAK_RSS_GROWTH_KIB`] from the middle
/// to the end. `seed` picks each cycle's pod names' order of deletion. `binary`: the agent
/// binary (`None`: the debug build).
pub fn soak(
    runtime: &Runtime,
    seed: u64,
    cycles: usize,
    pods: usize,
    binary: Option<std::path::PathBuf>,
) -> (Outcome, Vec<Resources>) {
    let mut out = Outcome::new("soak", seed);
    let mut rng = Rng::new(seed);
    let mut opts = AgentOptions::new("chaos-soak");
    opts.binary = binary;
    let agent = Agent::start(runtime, opts);
    let cycles = cycles.max(2);
    let mut samples = Vec::new();
    let mut desired = Desired::new();
    for cycle in 1..=cycles {
        let started = Instant::now();
        for i in 0..pods.max(1) {
            let file = format!("soak-{i}.yaml");
            let text = looping_pod_manifest(&format!("soak-{i}"), &[("cycle", &cycle.to_string())]);
            agent.write_manifest(&file, &text);
            desired.insert(file, text);
        }
        out.changes += desired.len();
        let up = converge(&agent, &desired, CONVERGE_TIMEOUT);
        let mut files: Vec<String> = desired.keys().cloned().collect();
        while !files.is_empty() {
            let i = usize::try_from(rng.below(files.len() as u64)).unwrap_or(0);
            agent.remove_manifest(&files.swap_remove(i));
        }
        out.changes += desired.len();
        desired.clear();
        let down = up.and_then(|_| converge(&agent, &desired, CONVERGE_TIMEOUT));
        out.faults += 1;
        match down {
            Ok(_) => out.converge_ms.push(ms(started.elapsed())),
            Err(bad) => {
                out.violations
                    .extend(bad.into_iter().map(|b| format!("cycle {cycle}: {b}")));
                break;
            }
        }
        if cycle == 1 || cycle == cycles / 2 || cycle == cycles {
            std::thread::sleep(Duration::from_secs(1));
            samples.push(resources(&agent, cycle));
        }
    }
    out.converge_ms.sort_unstable();
    if let [start, middle, end] = samples[..] {
        if end.fds > start.fds || end.fds > middle.fds {
            out.violations.push(format!(
                "open fds grew: {} after cycle 1, {} at the middle, {} at the end",
                start.fds, middle.fds, end.fds
            ));
        }
        if end.tokio_tasks > start.tokio_tasks {
            out.violations.push(format!(
                "async tasks grew: {} after cycle 1, {} at the end",
                start.tokio_tasks, end.tokio_tasks
            ));
        }
        if end.rss_kib > middle.rss_kib + SOAK_RSS_GROWTH_KIB {
            out.violations.push(format!(
                "RSS grew {} KiB from the middle to the end (limit {SOAK_RSS_GROWTH_KIB} KiB)",
                end.rss_kib - middle.rss_kib
            ));
        }
    }
    if !out.passed() {
        eprintln!(
            "chaos soak (seed {seed}) failed; agent log {}",
            agent.log_path().display()
        );
    }
    (out, samples)
}

/// The size of each tmpfs of the `disk` scenario (the agent's root dir and its pod log dir).
pub const DISK_TMPFS_KIB: u64 = 4096;
/// How long the `disk` scenario keeps the disks full in each round.
pub const DISK_FULL_FOR: Duration = Duration::from_secs(8);

/// Fills the filesystem of `dir`: one file of every byte it takes, then empty files until no
/// inode is left. Returns the files made.
fn fill(dir: &Path) -> Vec<std::path::PathBuf> {
    use std::io::Write;
    let mut made = Vec::new();
    let big = dir.join(".chaos-fill");
    if let Ok(mut f) = std::fs::File::create(&big) {
        made.push(big);
        let chunk = vec![0x5a_u8; 64 * 1024];
        while f.write_all(&chunk).is_ok() {}
        // The last partial page.
        while f.write_all(&chunk[..512]).is_ok() {}
    }
    for i in 0.. {
        let p = dir.join(format!(".chaos-fill-{i}"));
        if std::fs::File::create(&p).is_err() {
            break;
        }
        made.push(p);
    }
    made
}

/// A pod whose container writes a 1 KiB log line every 50 ms.
fn chatty_pod(node: &str, name: &str) -> String {
    crate::script_pod_manifest(
        node,
        name,
        "Always",
        "trap 'exit 0' TERM; line=$(printf '%1000s' | tr ' ' x); \
         while true; do echo \"$line\"; sleep 0.05; done",
        "",
    )
}

/// A full disk: the agent's `--root-dir` and `--pod-logs-dir` are small tmpfs mounts
/// ([`DISK_TMPFS_KIB`] each, unmounted afterwards even when the scenario fails), two pods
/// write logs all the time. Each round fills both (every byte and every inode), makes one to
/// three manifest changes while they are full and waits [`DISK_FULL_FOR`]: the agent must keep
/// answering (`/healthz`, `/pods`), must not panic, and a pod it could not start must say why in
/// its status; then the fill is removed and the invariant must hold within the convergence
/// timeout, allowing one exited instance of a container beside its running one (a container
/// whose start failed on the full disk is kept as its dead instance, as the kubelet keeps it).
/// The fault's time is how long the disks were full.
pub fn disk_full(runtime: &Runtime, seed: u64, rounds: usize, pods: usize) -> Outcome {
    let mut opts = AgentOptions::new("chaos-disk");
    opts.tmpfs_kib = Some(DISK_TMPFS_KIB);
    // A container whose start failed on the full disk stays as its one dead instance.
    run_rounds_with(runtime, "disk", seed, (rounds, pods), (opts, 1), |cx| {
        for name in ["chatty-0", "chatty-1"] {
            let file = format!("{name}.yaml");
            if !cx.desired.contains_key(&file) {
                let text = chatty_pod(cx.agent.node_name(), name);
                cx.agent.write_manifest(&file, &text);
                cx.desired.insert(file, text);
            }
        }
        converge_allowing(&cx.agent, &cx.desired, 1, CONVERGE_TIMEOUT)
            .map_err(|bad| format!("before filling the disks: {bad:?}"))?;
        let started = Instant::now();
        let root = cx.agent.root_dir().to_owned();
        let mut filled = fill(&root);
        filled.extend(fill(&root.join("pod-logs")));
        for _ in 0..=cx.rng.below(3) {
            cx.churn_keeping(|f| f.starts_with("chatty-"));
        }
        std::thread::sleep(DISK_FULL_FOR);
        let mut bad = Vec::new();
        if cx.agent.pid().is_none() || !cx.agent.healthy() {
            bad.push("the agent stopped answering /healthz with the disks full".to_owned());
        }
        if let Some(line) = cx.agent.log().lines().find(|l| l.contains("panicked")) {
            bad.push(format!("the agent panicked with the disks full: {line}"));
        }
        // Every pod that is not running says why.
        for p in &cx.agent.pods().items {
            let name = p.metadata.name.clone().unwrap_or_default();
            for c in p
                .status
                .iter()
                .flat_map(|s| s.container_statuses.iter().flatten())
            {
                let Some(w) = c.state.as_ref().and_then(|s| s.waiting.as_ref()) else {
                    continue;
                };
                if let Some(m) = w.message.as_deref().filter(|m| !m.is_empty()) {
                    println!("  disk full: {name}/{} waits: {:?}: {m}", c.name, w.reason);
                } else if w.reason.as_deref() != Some("ContainerCreating") {
                    bad.push(format!(
                        "{name}/{}: waiting ({:?}) with no message",
                        c.name, w.reason
                    ));
                }
            }
        }
        for f in filled {
            let _ = std::fs::remove_file(f);
        }
        if bad.is_empty() {
            Ok(ms(started.elapsed()))
        } else {
            Err(bad.join("; "))
        }
    })
    .0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_choices() {
        let a: Vec<u64> = {
            let mut r = Rng::new(42);
            (0..8).map(|_| r.below(100)).collect()
        };
        let mut r = Rng::new(42);
        let b: Vec<u64> = (0..8).map(|_| r.below(100)).collect();
        assert_eq!(a, b);
        assert!(a.iter().any(|&x| x != a[0]), "{a:?}");
        let q = Outcome {
            scenario: "t",
            seed: 1,
            faults: 3,
            changes: 0,
            fault_ms: vec![],
            converge_ms: vec![100, 200, 900],
            violations: vec![],
        };
        assert_eq!(q.converge_quantile(0.5), Some(200));
        assert_eq!(q.converge_quantile(1.0), Some(900));
    }
}
