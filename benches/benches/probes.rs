//! Probes, measured against the real containerd:
//!
//! 1. Readiness flip -> `/pods`: a pod whose exec readiness probe (period 1 s) flips every 2 s;
//!    `/pods` is polled every 5 ms. Latency = when `/pods` first showed the new `ready` minus the
//!    agent's log timestamp of the result change ("probe result changed"); both are the same wall
//!    clock. The poll interval and the GET are included.
//! 2. What probes cost the agent: utime+stime of the agent (`/proc/<pid>/stat`) over a window with
//!    one probe-less pod, then with a second pod with an exec readiness and a tcpSocket liveness
//!    probe (period 1 s, to a loopback listener of this bench); the difference per probe run. And
//!    the mean ExecSync time from the agent's own CRI histogram.
//!
//! `cargo bench -p swiftlet-benches --bench probes [-- --seconds N]` (N: each window, default 20).
//! Uses the debug agent binary the integration tests build.
use k8s_openapi::jiff::Timestamp;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use swiftlet_benches::cpu_ms_over;
use swiftlet_tests::{Agent, AgentOptions, PodList, Runtime, busybox_pod_manifest};

const TIMEOUT: Duration = Duration::from_secs(90);
const CONTAINERS: usize = 5;

fn manifest(name: &str, script: &str, probes: &str) -> String {
    busybox_pod_manifest(
        &format!("name: {name}, namespace: default"),
        "",
        &format!("{script}; while true; do sleep 1; done"),
        probes,
    )
}

fn ready(list: &PodList, pod: &str) -> Option<bool> {
    let c = list.container(pod, "main")?;
    c.state.as_ref()?.running.as_ref()?;
    Some(c.ready)
}

/// `(timestamp, became ready)` of each readiness result change of `pod` in the agent log.
fn logged_changes(agent: &Agent, pod: &str) -> Vec<(Timestamp, bool)> {
    agent
        .log()
        .lines()
        .filter(|l| {
            l.contains("probe result changed") && l.contains(pod) && l.contains("Readiness")
        })
        .filter_map(|l| {
            let l = strip_ansi(l);
            let ts = l.split_whitespace().next()?.parse().ok()?;
            Some((ts, l.contains("result=Success")))
        })
        .collect()
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut esc = false;
    for ch in s.chars() {
        match (esc, ch) {
            (false, '\x1b') => esc = true,
            (true, 'm') => esc = false,
            (true, _) => {}
            (false, c) => out.push(c),
        }
    }
    out
}

fn metric(agent: &Agent, prefix: &str) -> f64 {
    let (_, body) = agent.get("/metrics");
    body.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Probe runs of any kind and result.
fn probe_runs(agent: &Agent) -> f64 {
    let (_, body) = agent.get("/metrics");
    body.lines()
        .filter(|l| l.starts_with("swiftlet_prober_probe_total{"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

fn agent_cpu_ms(agent: &Agent, window: Duration) -> f64 {
    let pid = agent.pid().expect("the agent runs");
    cpu_ms_over(pid, window).unwrap_or_default()
}

fn flip_latency(agent: &Agent, window: Duration) {
    let flip = r#"    readinessProbe:
      exec: {command: ["test", "-f", "/tmp/ready"]}
      periodSeconds: 1
      failureThreshold: 1
"#;
    let script = "while true; do touch /tmp/ready; sleep 2; rm /tmp/ready; sleep 2; done";
    agent.write_manifest("flip.yaml", &manifest("flip", script, flip));
    let pod = agent.static_pod_name("flip");
    agent.wait_for(|l| ready(l, &pod).is_some(), TIMEOUT);
    let mut seen: Vec<(Timestamp, bool)> = Vec::new();
    let end = Instant::now() + window;
    while Instant::now() < end {
        let v = ready(&agent.pods(), &pod);
        let now = Timestamp::now();
        if let Some(v) = v
            && seen.last().is_none_or(|s| s.1 != v)
        {
            seen.push((now, v));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let logged = logged_changes(agent, &pod);
    println!(
        "readiness flips: {} seen on /pods, {} result changes logged",
        seen.len().saturating_sub(1),
        logged.len()
    );
    let mut ms: Vec<f64> = seen
        .iter()
        .skip(1)
        .filter_map(|&(at, v)| {
            let (ts, _) = logged.iter().rev().find(|(ts, r)| *r == v && *ts <= at)?;
            Some(at.duration_since(*ts).as_secs_f64() * 1000.0)
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    agent.remove_manifest("flip.yaml");
    if ms.is_empty() {
        println!(
            "readiness flip -> /pods: no flips matched (log {})",
            agent.log_path().display()
        );
        return;
    }
    let pct = |p: f64| ms[((ms.len() - 1) as f64 * p).round() as usize];
    println!(
        "readiness flip -> /pods: n = {}, median {:.1} ms, p90 {:.1} ms, max {:.1} ms (5 ms poll included)",
        ms.len(),
        pct(0.5),
        pct(0.9),
        pct(1.0)
    );
}

fn cost(agent: &Agent, window: Duration) {
    agent.write_manifest("plain.yaml", &manifest("plain", "true", ""));
    let plain = agent.static_pod_name("plain");
    agent.wait_for(|l| ready(l, &plain) == Some(true), TIMEOUT);
    std::thread::sleep(Duration::from_secs(2));
    let base = agent_cpu_ms(agent, window);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback listener");
    let port = listener.local_addr().expect("its address").port();
    let probe = format!(
        r#"    readinessProbe:
      exec: {{command: ["true"]}}
      periodSeconds: 1
    livenessProbe:
      tcpSocket: {{host: 127.0.0.1, port: {port}}}
      periodSeconds: 1
"#
    );
    // CONTAINERS containers with both probes: enough probe runs to stand out of the noise.
    let mut m = manifest("probed", "true", &probe);
    for i in 1..CONTAINERS {
        let extra = manifest("x", "true", &probe);
        let (_, container) = extra
            .split_once("  containers:\n")
            .expect("a container list");
        m.push_str(&container.replacen("name: main", &format!("name: main{i}"), 1));
    }
    agent.write_manifest("probed.yaml", &m);
    let probed = agent.static_pod_name("probed");
    agent.wait_for(|l| ready(l, &probed) == Some(true), TIMEOUT);
    std::thread::sleep(Duration::from_secs(2));
    let runs0 = probe_runs(agent);
    let with = agent_cpu_ms(agent, window);
    let runs = probe_runs(agent) - runs0;
    let exec_sum = metric(
        agent,
        "swiftlet_runtime_operations_duration_seconds_sum{operation=\"ExecSync\"}",
    );
    let exec_n = metric(
        agent,
        "swiftlet_runtime_operations_duration_seconds_count{operation=\"ExecSync\"}",
    );
    println!(
        "agent CPU over {window:?}: {base:.0} ms with one probe-less pod, {with:.0} ms with a second pod \
         of {CONTAINERS} containers probed {runs:.0} times (exec + tcp, 1 s period): {:.2} ms CPU \
         per probe run",
        (with - base) / runs.max(1.0)
    );
    println!(
        "ExecSync (agent's CRI histogram): {exec_n:.0} calls, mean {:.1} ms",
        exec_sum * 1000.0 / exec_n.max(1.0)
    );
    agent.remove_manifest("plain.yaml");
    agent.remove_manifest("probed.yaml");
    drop(listener);
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut window = Duration::from_secs(20);
    while let Some(a) = args.next() {
        if a == "--seconds" {
            match args.next().and_then(|v| v.parse().ok()) {
                Some(s) => window = Duration::from_secs(s),
                None => {
                    eprintln!("probes: --seconds needs a number");
                    return ExitCode::from(2);
                }
            }
        }
    }
    let Some(rt) = Runtime::shared() else {
        eprintln!("probes: skipped (needs root and containerd; see the SKIPPED line above)");
        return ExitCode::SUCCESS;
    };
    let mut opts = AgentOptions::new("bench-probes");
    opts.verbosity = 0;
    let agent = Agent::start(rt, opts);
    flip_latency(&agent, window);
    cost(&agent, window);
    agent.wait_for(|l| l.items.is_empty(), TIMEOUT);
    ExitCode::SUCCESS
}
