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

use crate::{
    Agent, AgentOptions, CONTAINER_NAME_LABEL, NODE_NAME_LABEL, POD_UID_LABEL, Runtime, block_on,
    cri_objects_labelled, looping_pod_manifest, pod_cgroup_uids, runtime_client,
    sandboxes_with_labels,
};

/// How long a scenario waits for the invariant to hold after a fault before calling it failed.
pub const CONVERGE_TIMEOUT: Duration = Duration::from_secs(60);

/// A small seeded generator (xorshift64*): the same seed gives the same choices.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// A seed from the clock, for runs that do not name one.
pub fn fresh_seed() -> u64 {
    u64::try_from(crate::unix_nanos()).unwrap_or(1) ^ u64::from(std::process::id())
}

/// What the agent should be running: manifest file name -> manifest text.
pub type Desired = BTreeMap<String, String>;

/// Checks the invariant once: every desired pod Running exactly once (one ready sandbox, one
/// running container), nothing left for pods that are gone (sandboxes, containers, pod cgroups,
/// pod log and state directories, shm mounts of removed sandboxes), `/pods` agreeing with CRI,
/// and no panic in the agent's log. `Err` lists every violation found.
pub fn check(agent: &Agent, desired: &Desired) -> Result<(), Vec<String>> {
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
    match cri_view(agent.endpoint(), agent.node_name()) {
        Err(e) => bad.push(format!("listing CRI objects: {e}")),
        Ok(view) => check_cri(&view, &want_uids, &mut bad),
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
}

fn cri_view(endpoint: &str, node: &str) -> crate::Result<CriView> {
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
    })
}

fn check_cri(view: &CriView, want: &BTreeSet<String>, bad: &mut Vec<String>) {
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
            if live != 1 || all != 1 {
                bad.push(format!(
                    "pod {uid} container {name}: {all} instances, {live} running (want one)"
                ));
            }
        }
    }
    for uid in sandboxes.keys().chain(containers.keys()) {
        if !want.contains(uid) {
            bad.push(format!("runtime objects left for gone pod {uid}"));
        }
    }
    // shm mounts of sandboxes the runtime no longer has.
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for line in mounts.lines() {
        if let Some(id) = line
            .split_whitespace()
            .nth(4)
            .and_then(|m| m.strip_suffix("/shm"))
            .and_then(|m| m.rsplit('/').next())
            && line.contains("/sandboxes/")
            && !view.all_sandbox_ids.contains(id)
        {
            bad.push(format!("shm mount of removed sandbox {id}"));
        }
    }
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
    let start = Instant::now();
    loop {
        match check(agent, desired) {
            Ok(()) => return Ok(start.elapsed()),
            Err(bad) if start.elapsed() >= timeout => return Err(bad),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
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
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
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
    mut fault: impl FnMut(&mut Ctx) -> Result<u64, String>,
) -> Outcome {
    let mut cx = Ctx {
        rng: Rng::new(seed),
        agent: Agent::start(runtime, AgentOptions::new(&format!("chaos-{scenario}"))),
        desired: Desired::new(),
        max_pods: pods.max(1),
        next: 0,
        changes: 0,
    };
    let mut out = Outcome {
        scenario,
        seed,
        faults: 0,
        changes: 0,
        fault_ms: Vec::new(),
        converge_ms: Vec::new(),
        violations: Vec::new(),
    };
    for _ in 0..pods.min(3) {
        cx.churn();
    }
    for round in 0..rounds {
        let result = fault(&mut cx);
        out.faults += 1;
        let checked = result.map_err(|e| vec![e]).and_then(|ms| {
            out.fault_ms.push(ms);
            converge(&cx.agent, &cx.desired, CONVERGE_TIMEOUT)
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
    out
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
