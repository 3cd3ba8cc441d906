//! A huge pod (hundreds of containers) against a real containerd: the agent's CPU per started
//! container stays flat along the start (nothing is quadratic in the number of containers), and
//! deleting the pod stops its containers concurrently within the grace period while `/pods`
//! shows it not Ready.
//!
//! `SWIFTLET_HUGE_POD_CONTAINERS=N` sets the number of containers (default 200) and
//! `SWIFTLET_HUGE_POD_AGENT=PATH` the agent binary measured (default: this tree's debug build),
//! so that two builds can be compared in one sitting; the figures of `BENCHMARKS.md` ("A huge
//! pod") come from this test run with 100, 300 and 1,000 containers.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::time::{Duration, Instant};

use swiftlet_tests::{Agent, AgentOptions, BUSYBOX_IMAGE, Runtime};

/// The pod's grace period: `sleep` as PID 1 ignores SIGTERM, so every container waits for all of
/// it and is then killed.
const GRACE_SECS: u64 = 10;
/// How much longer than the grace period the whole deletion may take.
const DELETE_MARGIN: Duration = Duration::from_secs(15);
/// Containers per CPU sample.
const BATCH: usize = 100;

fn containers() -> usize {
    std::env::var("SWIFTLET_HUGE_POD_CONTAINERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

fn manifest(name: &str, n: usize) -> String {
    let mut m = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  \
         terminationGracePeriodSeconds: {GRACE_SECS}\n  containers:\n"
    );
    for i in 0..n {
        m.push_str(&format!(
            "  - {{name: c{i}, image: {BUSYBOX_IMAGE}, imagePullPolicy: Never, command: [sleep, \"3600\"]}}\n"
        ));
    }
    m
}

/// The agent's CPU time so far (utime + stime of `/proc/<pid>/stat`), in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .unwrap_or_else(|e| panic!("reading /proc/{pid}/stat: {e}"));
    // The fields after the command name (which may hold spaces) start at `) `.
    let rest = &stat[stat.rfind(')').map_or(0, |i| i + 2)..];
    let fields: Vec<&str> = rest.split(' ').collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    field(11) + field(12)
}

fn ticks_per_sec() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// Counts the agent's `container started` log lines, reading only what was appended.
struct StartCounter {
    offset: u64,
    count: usize,
    partial: String,
}

impl StartCounter {
    fn poll(&mut self, log: &Path) -> usize {
        let Ok(mut f) = std::fs::File::open(log) else {
            return self.count;
        };
        if f.seek(SeekFrom::Start(self.offset)).is_err() {
            return self.count;
        }
        let mut buf = String::new();
        if let Ok(n) = f.read_to_string(&mut buf) {
            self.offset += n as u64;
        }
        self.partial.push_str(&buf);
        let complete = self.partial.rfind('\n').map_or(0, |i| i + 1);
        self.count += self.partial[..complete]
            .lines()
            .filter(|l| l.contains("container started"))
            .count();
        self.partial.drain(..complete);
        self.count
    }
}

#[test]
#[ignore = "not met yet: the deletion of a 200-container pod takes longer than its grace period \
            + 15 s, containerd 1.6 handling the containers' exits one at a time \
            (BENCHMARKS.md, \"A huge pod\")"]
fn a_huge_pod_starts_at_a_flat_cost_per_container_and_is_deleted_within_its_grace_period() {
    let Some(rt) = Runtime::shared() else {
        return;
    };
    let n = containers();
    assert!(
        n >= 2 * BATCH,
        "SWIFTLET_HUGE_POD_CONTAINERS must be at least {}",
        2 * BATCH
    );
    // Info level: the debug log of a 1,000-container pod would be measured as well.
    let mut opts = AgentOptions::new("huge-pod");
    opts.verbosity = 2;
    opts.binary = std::env::var_os("SWIFTLET_HUGE_POD_AGENT").map(Into::into);
    let agent = Agent::start(rt, opts);
    let pid = agent.pid().expect("the agent runs");
    let pod = agent.static_pod_name("huge");
    let hz = ticks_per_sec();

    // Start: the agent's CPU each time another BATCH containers have started.
    let started_at = Instant::now();
    let cpu0 = cpu_ticks(pid);
    agent.write_manifest("huge.yaml", &manifest("huge", n));
    let mut counter = StartCounter {
        offset: 0,
        count: 0,
        partial: String::new(),
    };
    let mut marks = vec![(0usize, cpu0, Duration::ZERO)];
    let start_timeout = Duration::from_secs(60 + n as u64);
    while counter.poll(agent.log_path()) < n {
        assert!(
            started_at.elapsed() < start_timeout,
            "{} of {n} containers started within {start_timeout:?}; log {}",
            counter.count,
            agent.log_path().display()
        );
        let done = counter.count / BATCH * BATCH;
        if done > marks.last().map_or(0, |m| m.0) {
            marks.push((done, cpu_ticks(pid), started_at.elapsed()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    marks.push((n, cpu_ticks(pid), started_at.elapsed()));
    marks.dedup_by_key(|m| m.0);
    let per_container: Vec<(usize, f64)> = marks
        .windows(2)
        .map(|w| {
            let ms = (w[1].1 - w[0].1) as f64 / hz * 1000.0;
            (w[1].0, ms / (w[1].0 - w[0].0) as f64)
        })
        .collect();
    eprintln!(
        "huge pod, {n} containers: started in {:?}",
        started_at.elapsed()
    );
    for (upto, ms) in &per_container {
        eprintln!("  agent CPU per container up to #{upto}: {ms:.2} ms");
    }
    let total_ms = (marks.last().map_or(cpu0, |m| m.1) - cpu0) as f64 / hz * 1000.0;
    eprintln!(
        "  agent CPU per container overall: {:.2} ms",
        total_ms / n as f64
    );
    let list = agent.wait_for(|l| l.is_running(&pod), Duration::from_secs(60));
    let ready = |l: &swiftlet_tests::PodList| {
        l.get(&pod)
            .and_then(|p| p.status.as_ref())
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.status.clone())
    };
    assert_eq!(ready(&list).as_deref(), Some("True"), "{}", list.summary());

    // The first batch (after the sandbox) against the last: flat, within this machine's noise.
    let first = per_container.first().map_or(0.0, |p| p.1);
    let last = per_container.last().map_or(0.0, |p| p.1);
    // Checked after the deletion, so that one run shows both.
    let flat = last <= first * 2.0 + 1.0;

    // Deletion: all containers stopped within the grace period, the pod not Ready meanwhile.
    let deleted_at = Instant::now();
    agent.remove_manifest("huge.yaml");
    let mut not_ready_seen = false;
    let mut running_while_deleting = Vec::new();
    let gone = agent.poll_pods(
        Duration::from_millis(200),
        Duration::from_secs(GRACE_SECS) + DELETE_MARGIN,
        |l, _| {
            let Some(p) = l.get(&pod) else { return true };
            // Right after the removal the status may not have moved yet.
            if deleted_at.elapsed() > Duration::from_secs(2) {
                match ready(l).as_deref() {
                    Some("False") => not_ready_seen = true,
                    other => running_while_deleting.push(format!(
                        "{:?}: Ready {other:?}, phase {:?}",
                        deleted_at.elapsed(),
                        p.status.as_ref().and_then(|s| s.phase.clone())
                    )),
                }
            }
            false
        },
    );
    let took = deleted_at.elapsed();
    eprintln!("  deleted in {took:?} (grace period {GRACE_SECS} s)");
    assert!(
        gone,
        "the pod was not deleted within its grace period ({GRACE_SECS} s) + {DELETE_MARGIN:?}; log {}",
        agent.log_path().display()
    );
    assert!(
        running_while_deleting.is_empty(),
        "/pods showed the pod Ready while it was being deleted: {running_while_deleting:?}"
    );
    assert!(
        not_ready_seen,
        "/pods never showed the pod not Ready while it was being deleted"
    );
    assert!(
        agent.log().contains("containers stopped"),
        "no progress of the stop in the log"
    );
    assert!(
        flat,
        "the agent's CPU per container grew along the start: {first:.2} ms for the first {BATCH}, \
         {last:.2} ms for the last ({per_container:?})"
    );
}
