//! Pod startup timelines end to end: swiftlet with its eBPF probes on, a real containerd, one pod.
//! The timeline must hold every phase (agent marks, CRI calls from the uprobes, the pod cgroup and
//! the container's first exec from the tracepoints) in order, consecutive, adding up to the
//! end-to-end time, with plausible durations; after the pod is removed, its exit and the pod
//! cgroup's removal. With `tracing.endpoint`, the same start reaches a real OTLP/gRPC receiver
//! as one trace.

use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;

use swiftlet_tests::otlp::Receiver;
use swiftlet_tests::{Agent, AgentOptions, Runtime, trace_binary};

const RUNNING_TIMEOUT: Duration = Duration::from_secs(90);

/// The container exits with 7 on SIGTERM, so the timeline's exit code is recognisable.
fn manifest(name: &str) -> String {
    xtask::looping_pod_manifest(name, 5, 7, &[])
}

/// The pod's entry in `/debug/trace/pods`, once `done` accepts it.
fn wait_timeline(
    agent: &Agent,
    uid: &str,
    what: &str,
    mut done: impl FnMut(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = serde_json::Value::Null;
    while Instant::now() < deadline {
        let (status, body) = agent.get("/debug/trace/pods");
        assert_eq!(status, 200, "{body}");
        let view: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(view["probes_loaded"], true, "--ebpf on loads the probes");
        if let Some(pod) = view["pods"]
            .as_array()
            .and_then(|pods| pods.iter().find(|p| p["uid"] == uid))
        {
            if done(pod) {
                return pod.clone();
            }
            last = pod.clone();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("timeline of {uid}: no {what} within 30 s; last: {last:#}");
}

#[test]
fn pod_start_yields_every_phase_in_order() {
    let Some(rt) = Runtime::shared() else {
        return;
    };
    let mut opts = AgentOptions::new("trace-phases");
    opts.extra_args = vec!["--ebpf".into(), "on".into()];
    let agent = Agent::start(rt, opts);
    agent.write_manifest("traced.yaml", &manifest("traced"));
    let name = agent.static_pod_name("traced");
    let pods = agent.wait_for(|l| l.is_running(&name), RUNNING_TIMEOUT);
    let uid = pods.uid(&name).expect("uid").to_owned();

    let pod = wait_timeline(&agent, &uid, "complete timeline", |p| p["complete"] == true);
    let phases = pod["phases"].as_array().expect("phases");
    let names: Vec<&str> = phases
        .iter()
        .map(|p| p["phase"].as_str().expect("name"))
        .collect();
    let pos = |n: &str| {
        names
            .iter()
            .position(|x| *x == n)
            .unwrap_or_else(|| panic!("phase {n} missing from {names:?}"))
    };
    // Causal order (exec and the StartContainer return may come either way round: runc start
    // does not wait for the exec).
    let order = [
        "admission",
        "dispatch",
        "volumes",
        "pod_cgroup",
        "agent/RunPodSandbox",
        "RunPodSandbox",
        "agent/image/main",
        "image/main",
        "agent/CreateContainer/main",
        "CreateContainer/main",
        "agent/StartContainer/main",
    ];
    for pair in order.windows(2) {
        assert!(
            pos(pair[0]) < pos(pair[1]),
            "{} before {}: {names:?}",
            pair[0],
            pair[1]
        );
    }
    assert!(
        pos("agent/StartContainer/main") < pos("exec/main"),
        "{names:?}"
    );
    // The pause process's exec may also land after RunPodSandbox returned.
    assert!(
        pos("agent/RunPodSandbox") < pos("sandbox_exec"),
        "{names:?}"
    );
    // The runtime may call a container running before its process's execve: the breakdown
    // ends with whichever of the two comes last.
    assert!(
        matches!(names.last(), Some(&("running_observed" | "exec/main"))),
        "{names:?}"
    );
    assert!(
        pos("agent/StartContainer/main") < pos("running_observed"),
        "{names:?}"
    );
    assert!(
        names.iter().any(|n| n.contains("cgroup")) && names.iter().any(|n| n.contains("exec")),
        "kernel phases are named with cgroup and exec: {names:?}"
    );

    // Consecutive, non-negative, adding up to e2e.
    let mut sum = 0.0;
    for pair in phases.windows(2) {
        let end = pair[0]["start_ns"].as_u64().expect("start")
            + (pair[0]["ms"].as_f64().expect("ms") * 1e6).round() as u64;
        let next = pair[1]["start_ns"].as_u64().expect("start");
        assert!(end.abs_diff(next) <= 1, "phases are consecutive: {pair:?}");
    }
    for p in phases {
        let ms = p["ms"].as_f64().expect("ms");
        assert!(ms >= 0.0, "{p}");
        sum += ms;
    }
    let e2e = pod["e2e_ms"].as_f64().expect("e2e");
    assert!(
        (sum - e2e).abs() < 0.01,
        "phases sum to {sum} ms, e2e {e2e} ms"
    );
    // Plausible: a pod start on this machine takes tens of ms to seconds; the runtime's calls
    // take milliseconds, not nanoseconds or minutes.
    let ms_of = |n: &str| phases[pos(n)]["ms"].as_f64().expect("ms");
    assert!(e2e > 1.0 && e2e < 60_000.0, "e2e {e2e} ms");
    let sandbox = ms_of("RunPodSandbox") + ms_of("sandbox_exec");
    assert!(
        sandbox > 1.0 && sandbox < 30_000.0,
        "RunPodSandbox {sandbox} ms"
    );
    assert!(ms_of("CreateContainer/main") > 0.1, "CreateContainer");
    let observers: Vec<&str> = phases
        .iter()
        .map(|p| p["observer"].as_str().expect("observer"))
        .collect();
    for o in ["agent", "cri", "kernel"] {
        assert!(observers.contains(&o), "{o} in {observers:?}");
    }

    // The same timeline over gRPC, through the swiftlet-trace client.
    let out = std::process::Command::new(trace_binary())
        .arg("--root-dir")
        .arg(agent.root_dir())
        .args(["--json", "get", &uid])
        .output()
        .expect("run swiftlet-trace");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let grpc: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("swiftlet-trace --json prints JSON");
    assert_eq!(grpc["uid"], uid.as_str());
    assert_eq!(grpc["complete"], true);
    assert_eq!(
        grpc["phases"].as_array().map(Vec::len),
        Some(phases.len()),
        "{grpc:#}"
    );

    // `swiftlet trace` (the agent binary's subcommand) is the same client.
    let out = std::process::Command::new(swiftlet_tests::agent_binary())
        .arg("trace")
        .arg("--root-dir")
        .arg(agent.root_dir())
        .args(["--json", "get", &uid])
        .output()
        .expect("run swiftlet trace");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sub: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("swiftlet trace --json prints JSON");
    assert_eq!(sub["uid"], uid.as_str());

    // Phase histograms.
    let (_, metrics) = agent.get("/metrics");
    for phase in ["pod_cgroup", "exec", "RunPodSandbox", "running_observed"] {
        let line =
            format!("swiftlet_pod_start_phase_duration_seconds_count{{phase=\"{phase}\"}} 1");
        assert!(metrics.contains(&line), "{line} in /metrics");
    }

    // Stop: the container's exit (its TERM trap exits 7) and the pod cgroup's removal.
    agent.remove_manifest("traced.yaml");
    let pod = wait_timeline(&agent, &uid, "exit and cgroup removal", |p| {
        let marks = p["marks"].as_array().cloned().unwrap_or_default();
        marks.iter().any(|m| m["name"] == "exit/main")
            && marks.iter().any(|m| m["name"] == "pod_cgroup_removed")
    });
    let marks = pod["marks"].as_array().expect("marks");
    let exit = marks
        .iter()
        .find(|m| m["name"] == "exit/main")
        .expect("exit mark");
    assert_eq!(exit["detail"], "exit code 7", "{exit}");
    assert_eq!(exit["observer"], "kernel");
}

fn string_attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a str> {
    attrs
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| match a.value.as_ref()?.value.as_ref()? {
            any_value::Value::StringValue(v) => Some(v.as_str()),
            _ => None,
        })
}

fn nanos(s: &Span) -> u64 {
    s.end_time_unix_nano.saturating_sub(s.start_time_unix_nano)
}

/// With `--tracing-endpoint` (`tracing.endpoint`) and every start sampled, a pod's start reaches
/// a real OTLP/gRPC receiver as one trace: a root span of the pod whose phase spans add up to
/// it and to the timeline's end-to-end time within 1 ms, and the CRI calls as client spans.
#[test]
fn a_pod_start_is_exported_over_otlp_as_one_trace() {
    let Some(rt) = Runtime::shared() else {
        return;
    };
    let receiver = Receiver::start();
    let mut opts = AgentOptions::new("trace-otlp");
    opts.extra_args = vec![
        "--ebpf".into(),
        "on".into(),
        "--tracing-endpoint".into(),
        receiver.addr.to_string(),
        "--tracing-sampling-rate-per-million".into(),
        "1000000".into(),
    ];
    let agent = Agent::start(rt, opts);
    agent.write_manifest("exported.yaml", &manifest("exported"));
    let name = agent.static_pod_name("exported");
    let pods = agent.wait_for(|l| l.is_running(&name), RUNNING_TIMEOUT);
    let uid = pods.uid(&name).expect("uid").to_owned();
    let timeline = wait_timeline(&agent, &uid, "complete timeline", |p| p["complete"] == true);

    let deadline = Instant::now() + Duration::from_secs(30);
    let mut spans: Vec<Span> = Vec::new();
    let mut node = None;
    while !spans
        .iter()
        .any(|s| s.name == "pod_start" && string_attr(&s.attributes, "k8s.pod.uid") == Some(&uid))
    {
        let left = deadline.saturating_duration_since(Instant::now());
        let request = receiver.requests.recv_timeout(left).unwrap_or_else(|_| {
            panic!("no trace of pod {uid} within 30 s; spans so far: {spans:#?}")
        });
        for rs in request.resource_spans {
            if let Some(r) = &rs.resource {
                node = string_attr(&r.attributes, "k8s.node.name").map(str::to_owned);
            }
            spans.extend(rs.scope_spans.into_iter().flat_map(|s| s.spans));
        }
    }
    assert_eq!(
        node.as_deref(),
        Some(agent.node_name()),
        "the resource names the node"
    );
    let root = spans
        .iter()
        .find(|s| s.name == "pod_start" && string_attr(&s.attributes, "k8s.pod.uid") == Some(&uid))
        .expect("the root span");
    assert_eq!(
        string_attr(&root.attributes, "k8s.pod.name"),
        Some(name.as_str())
    );
    let ours: Vec<&Span> = spans
        .iter()
        .filter(|s| s.trace_id == root.trace_id && s.span_id != root.span_id)
        .collect();
    assert!(
        ours.iter().all(|s| s.parent_span_id == root.span_id),
        "every span is the root's child: {ours:#?}"
    );
    let phases: Vec<&&Span> = ours
        .iter()
        .filter(|s| string_attr(&s.attributes, "swiftlet.phase").is_some())
        .collect();
    let timeline_phases = timeline["phases"].as_array().expect("phases");
    assert_eq!(
        phases.len(),
        timeline_phases.len(),
        "a span per phase: {phases:#?}"
    );
    let sum: u64 = phases.iter().map(|s| nanos(s)).sum();
    let root_ns = nanos(root);
    assert!(
        sum.abs_diff(root_ns) <= 1_000_000,
        "phases add up to {sum} ns, the root lasts {root_ns} ns"
    );
    let e2e_ns = (timeline["e2e_ms"].as_f64().expect("e2e") * 1e6) as u64;
    assert!(
        e2e_ns.abs_diff(root_ns) <= 1_000_000,
        "the root lasts {root_ns} ns, the timeline's end-to-end time is {e2e_ns} ns"
    );
    let sandbox = ours
        .iter()
        .find(|s| s.name == "runtime.v1.RuntimeService/RunPodSandbox")
        .unwrap_or_else(|| panic!("no RunPodSandbox client span in {ours:#?}"));
    assert!(sandbox.start_time_unix_nano >= root.start_time_unix_nano);
    // Unix times: within a minute of now.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos() as u64;
    assert!(
        now.abs_diff(root.end_time_unix_nano) < 60_000_000_000,
        "the root ended at {} (Unix ns), now is {now}",
        root.end_time_unix_nano
    );
    // Counted once the receiver's answer is back, which may be after the test read the request.
    agent.eventually(
        "the exported spans counted",
        Duration::from_secs(10),
        || {
            let n = agent.metric("swiftlet_otlp_spans_exported_total");
            (n >= spans.len() as f64)
                .then_some(())
                .ok_or(format!("{n} counted, {} received", spans.len()))
        },
    );
}
