//! `cargo bench -p swiftlet-benches --bench rapid_edits [-- --edits 21 --grace 30 --rounds 1
//! --gap-ms 100]`: how long rapid edits of one static pod take to settle on the newest spec when
//! its container ignores SIGTERM. The pod keeps its UID (the manifest names it) and each edit
//! changes the container's command, so each edit asks for the old container to be killed (its
//! whole grace period, SIGKILL at the end) and the new one started.
//!
//! Per round: version 0 runs; then `--edits` versions are written `--gap-ms` apart; the round
//! ends when the newest version's container has started (each version appends its name to a
//! file in the pod's emptyDir, read from the host). The settle time runs from the first edit.
//! The kubelet's order, one sync per spec with no safe point, kills the running container and
//! starts the spec it was given, which the next sync kills again: at least two grace periods.
//! The goal is one grace period plus the start. Also printed: how many intermediate versions
//! ever started (0 when every superseded sync stopped at its safe point).
//!
//! Builds and runs the release agent on the shared containerd.
use std::process::ExitCode;
use std::time::{Duration, Instant};
use swiftlet_tests::{Agent, AgentOptions, BUSYBOX_IMAGE, Runtime, release_agent_binary};

const NAME: &str = "rapid";

/// Version `v` of the pod: appends `v<v>` to /data/started, then ignores SIGTERM.
fn manifest(node: &str, v: usize, grace: usize) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {NAME}, namespace: default, uid: {NAME}-{node}}}
spec:
  terminationGracePeriodSeconds: {grace}
  volumes:
  - {{name: data, emptyDir: {{}}}}
  containers:
  - name: main
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: Never
    command: ["sh", "-c", "echo v{v} >> /data/started; trap '' TERM; sleep 3600 & wait"]
    volumeMounts:
    - {{name: data, mountPath: /data}}
"#
    )
}

fn started(agent: &Agent) -> String {
    let file = agent
        .root_dir()
        .join("pods")
        .join(format!("{NAME}-{}", agent.node_name()))
        .join("volumes/kubernetes.io~empty-dir/data/started");
    std::fs::read_to_string(file).unwrap_or_default()
}

fn main() -> ExitCode {
    let (mut edits, mut grace, mut rounds, mut gap_ms) = (21usize, 30usize, 1usize, 100usize);
    if let Err(code) = swiftlet_benches::count_args(
        "rapid_edits",
        &mut [
            ("edits", &mut edits),
            ("grace", &mut grace),
            ("rounds", &mut rounds),
            ("gap-ms", &mut gap_ms),
        ],
    ) {
        return code;
    }
    let Some(rt) = Runtime::shared() else {
        eprintln!("rapid_edits: skipped (needs root and containerd; see the SKIPPED line above)");
        return ExitCode::SUCCESS;
    };
    let mut opts = AgentOptions::new("bench-rapid-edits");
    opts.binary = Some(release_agent_binary());
    opts.verbosity = 2;
    let agent = Agent::start(rt, opts);
    let pod = agent.static_pod_name(NAME);
    let timeout = Duration::from_secs(4 * grace as u64 + 120);
    for round in 1..=rounds {
        agent.write_manifest("rapid.yaml", &manifest(agent.node_name(), 0, grace));
        agent.wait_for(|l| l.is_running(&pod), timeout);
        let first = Instant::now();
        for v in 1..=edits {
            agent.write_manifest("rapid.yaml", &manifest(agent.node_name(), v, grace));
            if v < edits {
                std::thread::sleep(Duration::from_millis(gap_ms as u64));
            }
        }
        let newest = format!("v{edits}\n");
        let deadline = first + timeout;
        while !started(&agent).ends_with(&newest) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let settle = first.elapsed().as_secs_f64();
        let ran = started(&agent);
        if !ran.ends_with(&newest) {
            eprintln!("rapid_edits: round {round}: the newest version never started: {ran:?}");
            return ExitCode::FAILURE;
        }
        // v0 and the newest: the rest are intermediate versions that started.
        let intermediate = ran.lines().count().saturating_sub(2);
        println!(
            "round {round}: {edits} edits {gap_ms} ms apart, grace {grace} s: settled {settle:.2} s \
             after the first edit ({:.2} grace periods; goal: one plus the start); \
             intermediate versions started: {intermediate}",
            settle / grace as f64
        );
        agent.remove_manifest("rapid.yaml");
        agent.wait_for(|l| l.get(&pod).is_none(), timeout);
        // The emptyDir goes with the pod; wait until it has, so the next round's file is new.
        let deadline = Instant::now() + timeout;
        while !started(&agent).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    ExitCode::SUCCESS
}
