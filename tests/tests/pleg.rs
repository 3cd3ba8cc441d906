//! PLEG and pod status against a real containerd: a container's exit reaches `/pods` through the
//! eBPF fast path (and with `--ebpf off` through the periodic relist alone), and a pod with an
//! init container and an app that exits walks every condition's transitions. With the periodic
//! relist an hour apart, the kernel's events alone carry a crash-looping container's exits.
//! The exit latency (CRI's finishedAt to `/pods`) is printed, not asserted: speed belongs to the
//! `pod_exit` bench.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerStateTerminated, ContainerStatus};
use swiftlet_tests::{
    Agent, AgentOptions, BUSYBOX_IMAGE, PodList, Runtime, script_pod_manifest, wait_finished_at,
};

const TIMEOUT: Duration = Duration::from_secs(60);
/// How often `/pods` is polled while waiting for an exit.
const POLL: Duration = Duration::from_millis(2);
const FAST_PATH_CHANGED: &str = "swiftlet_pleg_fast_path_relists_total{result=\"changed\"}";

fn start(name: &str, args: &[&str]) -> Option<Agent> {
    let rt = Runtime::shared()?;
    let mut opts = AgentOptions::new(name);
    opts.extra_args = args.iter().map(|a| (*a).to_owned()).collect();
    Some(Agent::start(rt, opts))
}

/// A restartPolicy Never pod whose container `main` runs `script`, after an init container
/// running `init` when given.
fn manifest(agent: &Agent, name: &str, init: Option<&str>, script: &str) -> String {
    let init = init.map_or_else(String::new, |s| {
        format!(
            "  initContainers:\n  - name: init\n    image: {BUSYBOX_IMAGE}\n    \
             imagePullPolicy: Never\n    command: [\"sh\", \"-c\", {s:?}]\n"
        )
    });
    script_pod_manifest(agent.node_name(), name, "Never", script, &init)
}

fn main_status<'a>(list: &'a PodList, pod: &str) -> Option<&'a ContainerStatus> {
    list.container(pod, "main")
}

fn terminated(c: &ContainerStatus) -> Option<&ContainerStateTerminated> {
    c.state.as_ref()?.terminated.as_ref()
}

/// The value of one series in a Prometheus text exposition (0 when absent).
fn metric(body: &str, series: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Waits until `/pods` shows pod's container `main` terminated; returns that list and the
/// latency from CRI's finishedAt of the container to that answer, in milliseconds.
fn exit_seen(agent: &Agent, pod: &str) -> (PodList, f64) {
    let mut seen = None;
    let found = agent.poll_pods(POLL, TIMEOUT, |list, at| {
        let done = main_status(list, pod).and_then(terminated).is_some();
        if done {
            seen = Some((list.clone(), at));
        }
        done
    });
    let Some((list, at)) = seen.filter(|_| found) else {
        panic!(
            "{pod}: no terminated state on /pods within {TIMEOUT:?}: {}",
            agent.pods().summary()
        );
    };
    let uid = list.uid(pod).unwrap_or_default().to_owned();
    // With eBPF `/pods` can show the exit before the runtime records it: wait for CRI.
    let finished = wait_finished_at(agent.endpoint(), &uid, "main", TIMEOUT)
        .unwrap_or_else(|| panic!("{pod}: CRI shows no finishedAt of main within {TIMEOUT:?}"));
    (list, (at - finished) as f64 / 1e6)
}

fn assert_failed_with(list: &PodList, pod: &str, code: i32) {
    let t = main_status(list, pod).and_then(terminated);
    assert_eq!(t.map(|t| t.exit_code), Some(code), "{pod}: {t:?}");
    assert_eq!(t.and_then(|t| t.reason.as_deref()), Some("Error"));
    assert!(t.is_some_and(|t| t.started_at.is_some() && t.finished_at.is_some()));
}

/// Runs a pod whose container exits with `code` after a second, waits for `/pods` to show it
/// terminated (printing the latency from CRI's finishedAt) and returns the agent's metrics.
fn exit_once(agent: &Agent, label: &str, code: i32) -> String {
    let script = format!("sleep 1; exit {code}");
    agent.write_manifest("exits.yaml", &manifest(agent, "exits", None, &script));
    let pod = &agent.static_pod_name("exits");
    agent.wait_for(|l| l.is_running(pod), TIMEOUT);
    let (list, ms) = exit_seen(agent, pod);
    eprintln!("{label}: CRI finishedAt -> /pods terminated: {ms:.1} ms");
    assert_failed_with(&list, pod, code);
    let list = agent.wait_for(|l| l.phase(pod) == Some("Failed"), TIMEOUT);
    assert_failed_with(&list, pod, code);
    agent.get("/metrics").1
}

#[test]
fn a_container_exit_reaches_pods_through_the_ebpf_fast_path() {
    let Some(agent) = start("pleg-fast", &["--ebpf", "on"]) else {
        return;
    };
    exit_once(&agent, "pleg-fast", 3);
    // The status can show the exit before the runtime does; the fast path's relist that sees
    // the runtime's change may come a little later.
    let deadline = std::time::Instant::now() + TIMEOUT;
    let mut body = agent.get("/metrics").1;
    while metric(&body, FAST_PATH_CHANGED) < 1.0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        body = agent.get("/metrics").1;
    }
    assert!(
        metric(&body, FAST_PATH_CHANGED) >= 1.0,
        "the eBPF fast path relisted the pod and saw its change:\n{body}"
    );
    assert!(body.contains("swiftlet_pleg_relist_duration_seconds_count"));
}

#[test]
fn without_ebpf_the_relist_alone_reports_the_exit() {
    let args = ["--ebpf", "off", "--pleg-relist-period", "200ms"];
    let Some(agent) = start("pleg-relist", &args) else {
        return;
    };
    let body = exit_once(&agent, "pleg-relist (200 ms period)", 5);
    assert_eq!(
        metric(&body, FAST_PATH_CHANGED),
        0.0,
        "no fast path without eBPF"
    );
    assert!(metric(&body, "swiftlet_pleg_relist_duration_seconds_count") >= 1.0);
}

/// With the periodic relist an hour apart, the kernel's exit events are the only prompt: a
/// crash-looping container's every exit still reaches the status and each restart happens (the
/// back-off's timer, not a relist, wakes the restart). The relist period can be set that far
/// out (`--pleg-relist-period`) without losing a container's change.
#[test]
fn with_the_relist_an_hour_apart_kernel_events_alone_carry_every_exit() {
    let args = ["--ebpf", "on", "--pleg-relist-period", "1h"];
    let Some(agent) = start("pleg-events-only", &args) else {
        return;
    };
    let manifest = script_pod_manifest(
        agent.node_name(),
        "crashing",
        "Always",
        "sleep 1; exit 3",
        "",
    );
    agent.write_manifest("crashing.yaml", &manifest);
    let pod = agent.static_pod_name("crashing");
    let list = agent.wait_for(
        |l| main_status(l, &pod).is_some_and(|c| c.restart_count >= 2),
        Duration::from_secs(120),
    );
    let main = main_status(&list, &pod).expect("status");
    let last = main
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .map(|t| t.exit_code);
    assert_eq!(last, Some(3), "the previous run's exit is in the status");
    let body = agent.get("/metrics").1;
    assert_eq!(
        metric(&body, "swiftlet_pleg_relist_duration_seconds_count"),
        1.0,
        "only the relist at start ran"
    );
    assert!(
        metric(&body, FAST_PATH_CHANGED) >= 2.0,
        "the exits came through the kernel's events"
    );
}

/// A new pod starts without a read of its runtime state: the agent knows from its last relist
/// that the runtime holds nothing for the pod, and the status after the start is built from what
/// the start did. A read there would queue behind other pods' starts in containerd and delay the
/// pod's Running. Before the fix, a new pod's actions (`kill_pod` set, as the kubelet sets it
/// whenever it creates a sandbox) made the worker treat its state as stale and read it back.
#[test]
fn a_new_pod_starts_without_reading_its_runtime_state() {
    let args = ["--ebpf", "on", "--pleg-relist-period", "1h"];
    let Some(agent) = start("pleg-noread", &args) else {
        return;
    };
    // The relist at start up tells the agent what the runtime holds.
    let deadline = std::time::Instant::now() + TIMEOUT;
    while metric(
        &agent.get("/metrics").1,
        "swiftlet_pleg_relist_duration_seconds_count",
    ) < 1.0
    {
        assert!(std::time::Instant::now() < deadline, "no first relist");
        std::thread::sleep(Duration::from_millis(20));
    }
    let script = "trap 'exit 0' TERM; while true; do sleep 1; done";
    let host_network = "  hostNetwork: true\n";
    // Several at once: under load runc's helper is more often seen in the container's cgroup.
    const PODS: usize = 4;
    for i in 0..PODS {
        let name = format!("noread{i}");
        let manifest =
            script_pod_manifest(agent.node_name(), &name, "Always", script, host_network);
        agent.write_manifest(&format!("{name}.yaml"), &manifest);
    }
    let pods: Vec<String> = (0..PODS)
        .map(|i| agent.static_pod_name(&format!("noread{i}")))
        .collect();
    agent.wait_for(|l| pods.iter().all(|p| l.is_running(p)), TIMEOUT);
    // Time for a late kernel event to reach the PLEG, had one been sent.
    std::thread::sleep(Duration::from_millis(500));
    let body = agent.get("/metrics").1;
    let calls = |op: &str| {
        metric(
            &body,
            &format!("swiftlet_runtime_operations_duration_seconds_count{{operation=\"{op}\"}}"),
        )
    };
    assert_eq!(
        calls("StartContainer"),
        PODS as f64,
        "one start each:\n{body}"
    );
    // Nobody read the pod: not the sync, not the worker after it, and not the eBPF fast path
    // (runc's helper execs in the container's cgroup and exits while the container starts; that
    // exit is not the container's).
    for source in ["sync", "worker", "fast_path"] {
        assert_eq!(
            reads(&body, source),
            0.0,
            "a {source} read of a starting pod:\n{body}"
        );
    }
    for op in ["PodSandboxStatus", "ContainerStatus"] {
        assert_eq!(calls(op), 0.0, "{op} for a starting pod:\n{body}");
    }
}

/// One condition as `/pods` showed it: (status, reason, lastTransitionTime).
type Seen = (String, Option<String>, String);

#[test]
fn conditions_walk_their_transitions() {
    let Some(agent) = start("pleg-conditions", &[]) else {
        return;
    };
    agent.write_manifest(
        "walk.yaml",
        &manifest(&agent, "walk", Some("sleep 1"), "sleep 2; exit 4"),
    );
    let pod = &agent.static_pod_name("walk");
    // Every distinct value each condition took, in order.
    let mut history: BTreeMap<String, Vec<Seen>> = BTreeMap::new();
    let done = agent.poll_pods(Duration::from_millis(20), TIMEOUT, |list, _| {
        let Some(status) = list.get(pod).and_then(|p| p.status.as_ref()) else {
            return false;
        };
        for c in status.conditions.iter().flatten() {
            let seen = (
                c.status.clone(),
                c.reason.clone(),
                c.last_transition_time
                    .as_ref()
                    .map(|t| t.0.to_string())
                    .unwrap_or_default(),
            );
            let h = history.entry(c.type_.clone()).or_default();
            if h.last() != Some(&seen) {
                h.push(seen);
            }
        }
        // Done once the pod failed and its stopped sandbox shows.
        status.phase.as_deref() == Some("Failed")
            && status
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "PodReadyToStartContainers" && c.status == "False")
    });
    assert!(
        done,
        "pod never Failed with a stopped sandbox: {history:#?}"
    );
    let statuses = |kind: &str| -> Vec<String> {
        let mut out: Vec<String> = history[kind].iter().map(|s| s.0.clone()).collect();
        out.dedup();
        out
    };
    assert_eq!(statuses("PodScheduled"), ["True"], "{history:#?}");
    assert_eq!(statuses("Initialized"), ["False", "True"], "{history:#?}");
    assert_eq!(
        statuses("ContainersReady"),
        ["False", "True", "False"],
        "{history:#?}"
    );
    assert_eq!(
        statuses("Ready"),
        ["False", "True", "False"],
        "{history:#?}"
    );
    assert_eq!(
        statuses("PodReadyToStartContainers"),
        ["True", "False"],
        "{history:#?}"
    );
    for (kind, seen) in &history {
        // The time moves only with the status, and never backwards.
        for w in seen.windows(2) {
            let ((s0, _, t0), (s1, _, t1)) = (&w[0], &w[1]);
            if s0 == s1 {
                assert_eq!(t0, t1, "{kind}: time changed without a transition");
            } else {
                assert!(t1 >= t0, "{kind}: transition time went back: {seen:?}");
            }
        }
    }
    let reason = |kind: &str, i: usize| history[kind][i].1.clone();
    assert_eq!(
        reason("Initialized", 0).as_deref(),
        Some("ContainersNotInitialized")
    );
    assert_eq!(
        reason("ContainersReady", 0).as_deref(),
        Some("ContainersNotReady")
    );
    let last = |kind: &str| history[kind].last().and_then(|s| s.1.clone());
    assert_eq!(last("ContainersReady").as_deref(), Some("PodFailed"));
    assert_eq!(last("Ready").as_deref(), Some("PodFailed"));
    // The init container's status is complete too.
    let list = agent.pods();
    let init = list
        .get(pod)
        .and_then(|p| p.status.as_ref())
        .and_then(|s| s.init_container_statuses.as_ref())
        .and_then(|s| s.first())
        .and_then(terminated)
        .cloned();
    assert_eq!(init.as_ref().map(|t| t.exit_code), Some(0));
    assert_eq!(init.and_then(|t| t.reason).as_deref(), Some("Completed"));
    assert_failed_with(&list, pod, 4);
}

/// Reads of one pod's runtime state, by source, from a metrics body.
fn reads(body: &str, source: &str) -> f64 {
    metric(
        body,
        &format!("swiftlet_runtime_pod_state_reads_total{{source=\"{source}\"}}"),
    )
}

/// The pod's worker takes the state the PLEG just read instead of reading it again: after the
/// PLEG relists the new pod and sends its events, the sync that follows computes its actions
/// from the PLEG's read (`handoff`), so each CRI read of the pod is one the PLEG made or one of
/// a sync that followed a change of the agent's own. Before the handoff every PLEG read was
/// followed by the sync's own read of the same state.
#[test]
fn the_worker_takes_the_pleg_read_instead_of_reading_again() {
    // Relists every 100 ms: those inside the start leave the pod alone (it is being changed),
    // the first after it reads the pod and its events sync the pod again.
    let args = ["--ebpf", "off", "--pleg-relist-period", "100ms"];
    let Some(agent) = start("pleg-handoff", &args) else {
        return;
    };
    let script = "trap 'exit 0' TERM; while true; do sleep 1; done";
    let host_network = "  hostNetwork: true\n";
    let manifest =
        script_pod_manifest(agent.node_name(), "handoff", "Always", script, host_network);
    agent.write_manifest("handoff.yaml", &manifest);
    let pod = &agent.static_pod_name("handoff");
    agent.wait_for(|l| l.is_running(pod), TIMEOUT);
    let deadline = std::time::Instant::now() + TIMEOUT;
    let mut body = agent.get("/metrics").1;
    while reads(&body, "handoff") < 1.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no sync took the PLEG's read:\n{body}"
        );
        std::thread::sleep(Duration::from_millis(50));
        body = agent.get("/metrics").1;
    }
    // Let the relists settle (no change: no reads), then compare.
    std::thread::sleep(Duration::from_secs(1));
    let body = agent.get("/metrics").1;
    let sources = ["pleg", "fast_path", "sync", "worker", "kill", "handoff"];
    let counts: Vec<(&str, f64)> = sources.iter().map(|s| (*s, reads(&body, s))).collect();
    eprintln!("pod state reads by source: {counts:?}");
    let calls = metric(
        &body,
        "swiftlet_runtime_operations_duration_seconds_count{operation=\"PodSandboxStatus\"}",
    );
    eprintln!("PodSandboxStatus calls: {calls}");
    // One sandbox: each CRI read of the pod is one PodSandboxStatus call. (Not ContainerStatus:
    // a relist between RunPodSandbox and CreateContainer reads a pod with no container yet.)
    let cri_reads: f64 = counts
        .iter()
        .filter(|(s, _)| *s != "handoff")
        .map(|c| c.1)
        .sum();
    assert_eq!(calls, cri_reads, "every read is counted:\n{body}");
    // A new pod's first sync needs no read; without the handoff each PLEG read (with events)
    // would be followed by a sync's read.
    assert!(
        reads(&body, "sync") < reads(&body, "pleg"),
        "syncs read what the PLEG had just read: {counts:?}"
    );
    // Nor does the sync after a rejected read: the start handed over what it created (the pod
    // held nothing before it), so no sync of this pod read the runtime at all.
    assert_eq!(
        reads(&body, "sync"),
        0.0,
        "a sync read back what the start had just made: {counts:?}"
    );
}

/// Waits until the metric `series` reaches `at_least`; returns the last metrics body.
fn wait_metric(agent: &Agent, series: &str, at_least: f64) -> String {
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        let body = agent.get("/metrics").1;
        if metric(&body, series) >= at_least || std::time::Instant::now() >= deadline {
            return body;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A pod the agent kills itself is not re-read by the eBPF fast path: its containers' exits
/// come while the kill runs, and the kill removes the pod. (Before, each exit queued reads of
/// the pod, retried until the runtime recorded the exit.)
#[test]
fn the_fast_path_leaves_a_pod_being_killed_to_its_kill() {
    let args = ["--ebpf", "on"];
    let Some(agent) = start("pleg-killing", &args) else {
        return;
    };
    let script = "trap 'exit 0' TERM; while true; do sleep 1; done";
    let manifest = script_pod_manifest(agent.node_name(), "killed", "Always", script, "");
    agent.write_manifest("killed.yaml", &manifest);
    let pod = &agent.static_pod_name("killed");
    agent.wait_for(|l| l.is_running(pod), TIMEOUT);
    agent.remove_manifest("killed.yaml");
    agent.wait_for(|l| l.get(pod).is_none(), TIMEOUT);
    let skipped = "swiftlet_pleg_fast_path_relists_total{result=\"skipped\"}";
    let body = wait_metric(&agent, skipped, 1.0);
    eprintln!(
        "fast path: {} skipped, {} reads",
        metric(&body, skipped),
        reads(&body, "fast_path")
    );
    assert!(
        metric(&body, skipped) >= 1.0,
        "the container's exit during the kill was not relisted:\n{body}"
    );
}

/// A pod whose start is still running is not read by the PLEG: no read made then could be handed
/// to its next sync, and its busy worker could not act on the events. The relist keeps its
/// snapshot and reads the pod once the start has ended. (Before, a relist read a starting pod at
/// every change of it: a pod of n containers had its n statuses read once a relist period all
/// along its start, the agent's CPU per started container growing with the pod's size.)
#[test]
fn a_pod_being_started_is_read_by_the_pleg_only_after_its_start() {
    let args = ["--ebpf", "off", "--pleg-relist-period", "100ms"];
    let Some(agent) = start("pleg-busy", &args) else {
        return;
    };
    // Ten containers, each held up by a postStart hook of 300 ms: the start's one sync takes
    // at least 3 s, and the pod changes (another container running) every 300 ms meanwhile.
    const CONTAINERS: usize = 10;
    let mut containers = String::new();
    for i in 0..CONTAINERS {
        containers.push_str(&format!(
            "  - name: c{i}\n    image: {BUSYBOX_IMAGE}\n    imagePullPolicy: Never\n    \
             command: [\"sh\", \"-c\", \"trap 'exit 0' TERM; while true; do sleep 1; done\"]\n    \
             lifecycle:\n      postStart:\n        exec:\n          command: [\"sleep\", \"0.3\"]\n"
        ));
    }
    let manifest = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: busy, namespace: default, uid: busy-{node}}}\n\
         spec:\n  terminationGracePeriodSeconds: 5\n  hostNetwork: true\n  containers:\n{containers}",
        node = agent.node_name()
    );
    agent.write_manifest("busy.yaml", &manifest);
    let pod = &agent.static_pod_name("busy");
    agent.wait_for(|l| l.is_running(pod), TIMEOUT);
    let body = wait_metric(
        &agent,
        "swiftlet_runtime_pod_state_reads_total{source=\"pleg\"}",
        1.0,
    );
    // Time for more relists: with the start over and nothing changing, none reads the pod.
    std::thread::sleep(Duration::from_secs(1));
    let after = agent.get("/metrics").1;
    let relists = metric(&after, "swiftlet_pleg_relist_duration_seconds_count");
    let pleg = reads(&after, "pleg");
    eprintln!("{relists} relists, {pleg} PLEG reads of the pod");
    assert!(
        relists >= 20.0,
        "the relist ran every 100 ms through a start of 3 s or more:\n{after}"
    );
    assert!(
        pleg >= 1.0,
        "the PLEG read the pod after its start:\n{body}"
    );
    // Once the start ended: one read (its events sync the pod, which takes that read and finds
    // nothing to do); a second only if a container changed by itself after the start.
    assert!(
        pleg <= 2.0,
        "the PLEG read the pod {pleg} times: while its start ran too?\n{after}"
    );
    let list = agent.pods();
    for i in 0..CONTAINERS {
        let running = list
            .container(pod, &format!("c{i}"))
            .and_then(|c| c.state.as_ref())
            .is_some_and(|s| s.running.is_some());
        assert!(running, "container c{i} running: {}", list.summary());
    }
}

const RELISTS: &str = "swiftlet_pleg_relist_duration_seconds_count";

/// With the default periods and the probes reporting every exit, the periodic relist is a
/// safety net a minute apart: an idle node makes no relist in 8 s. A runtime error (a pod read
/// failing after a container's exit) brings the 1 s relist back at once, and the exit still
/// reaches the status.
#[test]
fn with_the_probes_reporting_every_exit_the_relist_is_a_safety_net() {
    use swiftlet_tests::cri_proxy::{CriProxy, Fault, Share};
    let Some(rt) = Runtime::shared() else { return };
    let proxy = CriProxy::start(&rt.endpoint, 11).unwrap_or_else(|e| panic!("{e}"));
    let mut opts = AgentOptions::new("pleg-safety-net");
    opts.cri_endpoint = Some(proxy.endpoint());
    opts.extra_args = vec!["--ebpf".into(), "on".into()];
    let agent = Agent::start(rt, opts);
    let script = "sleep 6; exit 5";
    agent.write_manifest("net.yaml", &manifest(&agent, "net", None, script));
    let pod = agent.static_pod_name("net");
    agent.wait_for(|l| l.is_running(&pod), TIMEOUT);

    let body = agent.get("/metrics").1;
    assert_eq!(metric(&body, "swiftlet_pleg_safety_net"), 1.0, "{body}");
    let before = metric(&body, RELISTS);
    std::thread::sleep(Duration::from_secs(3));
    let idle = metric(&agent.get("/metrics").1, RELISTS) - before;
    assert!(idle <= 1.0, "{idle} relists in 3 idle seconds");

    // The container's exit comes next: its pod reads fail for a while.
    proxy.inject(
        "PodSandboxStatus",
        Fault::Fail(tonic::Code::Unavailable),
        Share::Next(6),
    );
    let distrusted = "swiftlet_pleg_kernel_path_distrusted_total{reason=\"runtime_error\"}";
    assert!(
        metric(&wait_metric(&agent, distrusted, 1.0), distrusted) >= 1.0,
        "a failed pod read after the exit distrusts the kernel path"
    );
    let at = metric(&agent.get("/metrics").1, RELISTS);
    std::thread::sleep(Duration::from_secs(5));
    let body = agent.get("/metrics").1;
    let fast = metric(&body, RELISTS) - at;
    assert!(
        fast >= 3.0,
        "only {fast} relists in the 5 s after the error:\n{body}"
    );
    let list = agent.wait_for(|l| l.phase(&pod) == Some("Failed"), TIMEOUT);
    assert_failed_with(&list, &pod, 5);
}

/// A restarted agent follows the containers already running: their exit reaches the status
/// through the kernel path, not a minute later with the safety-net relist or the pod's resync.
#[test]
fn a_restarted_agent_sees_the_exit_of_a_container_it_adopted() {
    let Some(rt) = Runtime::shared() else { return };
    let mut opts = AgentOptions::new("pleg-adopted");
    opts.extra_args = vec!["--ebpf".into(), "on".into()];
    let mut agent = Agent::start(rt, opts);
    agent.write_manifest(
        "adopted.yaml",
        &manifest(&agent, "adopted", None, "sleep 15; exit 4"),
    );
    let pod = agent.static_pod_name("adopted");
    agent.wait_for(|l| l.is_running(&pod), TIMEOUT);
    agent.restart_after_sigkill();
    agent.wait_for(|l| l.is_running(&pod), TIMEOUT);
    // The exit comes at about 15 s after the start; the safety net would relist at 60 s.
    let list = agent.wait_for(
        |l| main_status(l, &pod).and_then(terminated).is_some(),
        Duration::from_secs(30),
    );
    assert_failed_with(&list, &pod, 4);
    let body = agent.get("/metrics").1;
    assert!(
        metric(&body, FAST_PATH_CHANGED) >= 1.0,
        "the exit came through the kernel path:\n{body}"
    );
}

/// While the probes report every exit, a pod's periodic resync takes the read its last sync
/// made instead of asking the runtime again; its container's exit still reaches the status.
#[test]
fn a_resync_takes_the_current_read_while_the_probes_report_every_exit() {
    let args = ["--ebpf", "on", "--sync-frequency", "1s"];
    let Some(agent) = start("pleg-current", &args) else {
        return;
    };
    agent.write_manifest(
        "cur.yaml",
        &manifest(&agent, "cur", None, "sleep 16; exit 2"),
    );
    let pod = agent.static_pod_name("cur");
    agent.wait_for(|l| l.is_running(&pod), TIMEOUT);
    let reads = |source: &str| {
        let series = format!("swiftlet_runtime_pod_state_reads_total{{source=\"{source}\"}}");
        metric(&agent.get("/metrics").1, &series)
    };
    std::thread::sleep(Duration::from_secs(2));
    let (own, current) = (reads("sync"), reads("current"));
    // Resyncs come every 2 s (a second, jittered, handed out at the sync loop's 1 s tick).
    std::thread::sleep(Duration::from_secs(8));
    let (own_after, current_after) = (reads("sync"), reads("current"));
    assert!(
        current_after - current >= 3.0,
        "resyncs took the current read {} times in 8 s",
        current_after - current
    );
    assert!(
        own_after - own <= 1.0,
        "resyncs read the runtime {} times in 8 s",
        own_after - own
    );
    let list = agent.wait_for(|l| l.phase(&pod) == Some("Failed"), TIMEOUT);
    assert_failed_with(&list, &pod, 2);
}
