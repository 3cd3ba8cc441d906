//! Probes against a real containerd: exec, httpGet, HTTPS httpGet, tcpSocket and grpc readiness
//! probes failing and recovering (container `ready` and the Ready / ContainersReady conditions on
//! `/pods`), a liveness (failing, or timing out) and a startup probe failure restarting their
//! containers, and a startup probe gating readiness. Probe traffic goes to loopback, the pod
//! network, or (HTTPS and gRPC) the node's own address. Each test runs its own agent.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::jiff::Timestamp;
use swiftlet::handler::test_servers::{GrpcServer, HttpsServer};
use swiftlet_tests::{Agent, PodList, is_running, start_agent};

const TIMEOUT: Duration = Duration::from_secs(60);

/// A pod with one container `main` running `script` (TERM ends it at once), with `probes`
/// (container-level YAML, indented by four spaces) and optional extra container lines.
fn manifest(agent: &Agent, name: &str, host_network: bool, script: &str, probes: &str) -> String {
    let spec = format!("  hostNetwork: {host_network}\n");
    agent.busybox_pod(name, &spec, script, probes)
}

fn container<'a>(list: &'a PodList, pod: &str) -> Option<&'a ContainerStatus> {
    list.container(pod, "main")
}

/// `(status, lastTransitionTime)` of condition `kind`.
fn condition(pod: &Pod, kind: &str) -> Option<(String, Option<Timestamp>)> {
    let c = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == kind)?;
    Some((
        c.status.clone(),
        c.last_transition_time.as_ref().map(|t| t.0),
    ))
}

/// One distinct readiness state seen on `/pods` while the container ran.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    ready: bool,
    ready_condition: (String, Option<Timestamp>),
    containers_ready: (String, Option<Timestamp>),
}

/// Watches the pod's running container (the same container ID throughout) until its `ready`
/// values have gone through `want`; returns each distinct state seen.
fn watch_readiness(agent: &Agent, pod: &str, want: &[bool]) -> Vec<Seen> {
    let mut seen: Vec<Seen> = Vec::new();
    let mut id: Option<String> = None;
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let list = agent.pods();
        if let (Some(c), Some(p)) = (container(&list, pod), list.get(pod))
            && is_running(c)
        {
            match &id {
                None => id = c.container_id.clone(),
                Some(id) => assert_eq!(
                    Some(id),
                    c.container_id.as_ref(),
                    "the container restarted; seen {seen:?}"
                ),
            }
            let s = Seen {
                ready: c.ready,
                ready_condition: condition(p, "Ready").expect("a Ready condition"),
                containers_ready: condition(p, "ContainersReady")
                    .expect("a ContainersReady condition"),
            };
            if seen.last() != Some(&s) {
                seen.push(s);
            }
            let values: Vec<bool> = seen.iter().map(|s| s.ready).collect();
            let mut dedup = values.clone();
            dedup.dedup();
            if dedup.len() >= want.len() {
                assert_eq!(dedup[..want.len()], *want, "seen {seen:?}");
                return seen;
            }
        }
        assert!(
            Instant::now() < deadline,
            "ready did not go through {want:?} within {TIMEOUT:?}; seen {seen:?}; log {}:\n{}",
            agent.log_path().display(),
            agent.log_tail(40)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The conditions follow `ready`, and change their transition time with it.
fn assert_conditions_follow(seen: &[Seen]) {
    for s in seen {
        let want = if s.ready { "True" } else { "False" };
        assert_eq!(s.ready_condition.0, want, "{seen:?}");
        assert_eq!(s.containers_ready.0, want, "{seen:?}");
    }
    let flips: Vec<&Seen> = seen
        .windows(2)
        .filter(|w| w[0].ready != w[1].ready)
        .map(|w| &w[1])
        .collect();
    for w in flips.windows(2) {
        assert!(
            w[1].ready_condition.1 > w[0].ready_condition.1,
            "Ready's transition time must move with each flip: {seen:?}"
        );
    }
}

/// The value of `swiftlet_prober_probe_total{probe_type=kind,result=result}` (0 when absent).
fn probe_count(agent: &Agent, kind: &str, result: &str) -> u64 {
    let (status, body) = agent.get("/metrics");
    assert_eq!(status, 200);
    let labels =
        format!("swiftlet_prober_probe_total{{probe_type=\"{kind}\",result=\"{result}\"}}");
    body.lines()
        .find_map(|l| l.strip_prefix(&labels))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Not ready 3 s, ready 5 s, not ready 5 s, then ready: what `path` holds while it exists.
fn toggle(path: &str) -> String {
    format!(
        "rm -f {path}; sleep 3; echo ok > {path}; sleep 5; rm {path}; sleep 5; echo ok > {path}; \
         while true; do sleep 1; done"
    )
}

#[test]
fn exec_readiness_fails_and_recovers() {
    let Some(agent) = start_agent("probe-exec") else {
        return;
    };
    let probes = r#"    readinessProbe:
      exec: {command: ["test", "-f", "/tmp/ready"]}
      periodSeconds: 1
      failureThreshold: 1
"#;
    let m = manifest(&agent, "exec", false, &toggle("/tmp/ready"), probes);
    agent.write_manifest("exec.yaml", &m);
    let pod = agent.static_pod_name("exec");
    let seen = watch_readiness(&agent, &pod, &[false, true, false, true]);
    assert_conditions_follow(&seen);
    assert!(probe_count(&agent, "Readiness", "successful") > 0);
    assert!(probe_count(&agent, "Readiness", "failed") > 0);
}

#[test]
fn http_readiness_fails_and_recovers() {
    let Some(agent) = start_agent("probe-http") else {
        return;
    };
    let port = xtask::free_loopback_port().expect("a free port");
    // A host-network pod serving /www on loopback; the probe uses the named port.
    let script = format!(
        "mkdir -p /www; busybox httpd -p 127.0.0.1:{port} -h /www; {}",
        toggle("/www/healthz")
    );
    let probes = format!(
        r#"    ports: [{{name: web, containerPort: {port}}}]
    readinessProbe:
      httpGet: {{host: 127.0.0.1, port: web, path: /healthz, httpHeaders: [{{name: X-Test, value: probe}}]}}
      periodSeconds: 1
      timeoutSeconds: 2
      failureThreshold: 1
"#
    );
    let m = manifest(&agent, "http", true, &script, &probes);
    agent.write_manifest("http.yaml", &m);
    let pod = agent.static_pod_name("http");
    let seen = watch_readiness(&agent, &pod, &[false, true, false, true]);
    assert_conditions_follow(&seen);
}

#[test]
fn http_readiness_on_the_pod_ip() {
    let Some(agent) = start_agent("probe-http-podip") else {
        return;
    };
    // A pod-network pod (created by this test): no host in the probe, so it goes to the pod IP.
    let script = format!(
        "mkdir -p /www; busybox httpd -p 8080 -h /www; {}",
        toggle("/www/healthz")
    );
    let probes = r#"    readinessProbe:
      httpGet: {port: 8080, path: /healthz}
      periodSeconds: 1
      failureThreshold: 1
"#;
    let m = manifest(&agent, "podip", false, &script, probes);
    agent.write_manifest("podip.yaml", &m);
    let pod = agent.static_pod_name("podip");
    let seen = watch_readiness(&agent, &pod, &[false, true, false, true]);
    assert_conditions_follow(&seen);
    let list = agent.pods();
    let ip = list
        .get(&pod)
        .and_then(|p| p.status.as_ref()?.pod_ip.clone())
        .expect("a pod IP");
    assert!(!ip.starts_with("127."), "{ip}");
}

#[test]
fn tcp_readiness_follows_a_listener() {
    let Some(agent) = start_agent("probe-tcp") else {
        return;
    };
    let port = xtask::free_loopback_port().expect("a free port");
    let probes = format!(
        r#"    readinessProbe:
      tcpSocket: {{host: 127.0.0.1, port: {port}}}
      periodSeconds: 1
      failureThreshold: 2
"#
    );
    let m = manifest(
        &agent,
        "tcp",
        false,
        "while true; do sleep 1; done",
        &probes,
    );
    agent.write_manifest("tcp.yaml", &m);
    let pod = agent.static_pod_name("tcp");
    // Nothing listens: running but not ready.
    let first = agent.wait_for(|l| container(l, &pod).is_some_and(is_running), TIMEOUT);
    let id = container(&first, &pod).and_then(|c| c.container_id.clone());
    std::thread::sleep(Duration::from_secs(3));
    let c = container(&agent.pods(), &pod)
        .cloned()
        .expect("the container");
    assert!(!c.ready, "{c:?}");
    assert!(probe_count(&agent, "Readiness", "failed") >= 2);
    // The test listens: ready; stops: not ready; listens again: ready.
    let listener = std::net::TcpListener::bind(("127.0.0.1", port)).expect("binding");
    agent.wait_for(|l| container(l, &pod).is_some_and(|c| c.ready), TIMEOUT);
    drop(listener);
    agent.wait_for(|l| container(l, &pod).is_some_and(|c| !c.ready), TIMEOUT);
    let listener = std::net::TcpListener::bind(("127.0.0.1", port)).expect("binding again");
    let list = agent.wait_for(|l| container(l, &pod).is_some_and(|c| c.ready), TIMEOUT);
    let c = container(&list, &pod).expect("the container");
    assert_eq!(c.container_id, id, "readiness never restarts: {c:?}");
    assert_eq!(c.restart_count, 0, "readiness never restarts: {c:?}");
    let p = list.get(&pod).expect("the pod");
    assert_eq!(condition(p, "Ready").map(|c| c.0).as_deref(), Some("True"));
    drop(listener);
}

/// Waits until the pod's running container has `ready == want`; the container ID and the pod.
fn wait_ready(agent: &Agent, pod: &str, want: bool) -> (Option<String>, Pod) {
    let list = agent.wait_for(
        |l| container(l, pod).is_some_and(|c| is_running(c) && c.ready == want),
        TIMEOUT,
    );
    let id = container(&list, pod).and_then(|c| c.container_id.clone());
    (id, list.get(pod).cloned().expect("the pod"))
}

/// The HTTPS and gRPC servers run in this process on the host, bound to 0.0.0.0: busybox serves
/// neither TLS nor gRPC. The pods are host-network, so their IP is the node's and the probes (with
/// no host of their own) reach these servers there.
fn host_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("a tokio runtime for the test's servers")
}

/// Runs host-network pod `name` with a readiness probe `handler` (one line of YAML; period 1 s,
/// timeout 2 s, one failure), flips the health of the test's server with `set_healthy` and waits
/// for the pod's `ready` to follow each flip (not ready, ready, not ready, ready) without a
/// restart. Returns the pod's IP, which must be the node's.
fn readiness_follows_on_the_host(
    agent: &Agent,
    name: &str,
    handler: &str,
    set_healthy: impl Fn(bool),
) -> String {
    let probes = format!(
        "    readinessProbe:\n      {handler}\n      periodSeconds: 1\n      timeoutSeconds: 2\n      failureThreshold: 1\n"
    );
    let m = manifest(agent, name, true, "while true; do sleep 1; done", &probes);
    agent.write_manifest(&format!("{name}.yaml"), &m);
    let pod = agent.static_pod_name(name);
    set_healthy(false);
    let (id, _) = wait_ready(agent, &pod, false);
    for healthy in [true, false, true] {
        set_healthy(healthy);
        let (now, _) = wait_ready(agent, &pod, healthy);
        assert_eq!(now, id, "readiness never restarts the container");
    }
    let (_, p) = wait_ready(agent, &pod, true);
    assert_eq!(condition(&p, "Ready").map(|c| c.0).as_deref(), Some("True"));
    let status = p.status.as_ref().expect("a status");
    let ip = status.pod_ip.clone().expect("a pod IP");
    assert_eq!(
        Some(&ip),
        status.host_ip.as_ref(),
        "a host-network pod's IP is the node's: {status:?}"
    );
    ip
}

#[test]
fn https_readiness_follows_a_server_with_a_self_signed_certificate() {
    let Some(agent) = start_agent("probe-https") else {
        return;
    };
    let rt = host_runtime();
    let dir = tempfile::tempdir().expect("a temp dir");
    let server = rt
        .block_on(HttpsServer::start("0.0.0.0", dir.path()))
        .expect("the HTTPS server");
    let handler = format!(
        "httpGet: {{scheme: HTTPS, port: {}, path: /ready, httpHeaders: [{{name: X-Test, value: tls}}]}}",
        server.port
    );
    let ip =
        readiness_follows_on_the_host(&agent, "https-ready", &handler, |h| server.set_healthy(h));
    let seen = server.seen();
    let last = seen.last().expect("requests").head.to_lowercase();
    assert!(last.starts_with("get /ready http/1.1"), "{last}");
    assert!(
        last.contains(&format!("host: {ip}:{}", server.port)),
        "{last}"
    );
    assert!(last.contains("x-test: tls"), "{last}");
    assert!(seen.iter().all(|s| s.sni.is_none()), "no SNI for an IP");
}

#[test]
fn grpc_readiness_follows_the_health_service() {
    let Some(agent) = start_agent("probe-grpc") else {
        return;
    };
    let rt = host_runtime();
    let server = rt
        .block_on(GrpcServer::start("0.0.0.0", Some("swiftlet.test")))
        .expect("the gRPC server");
    let handler = format!("grpc: {{port: {}, service: swiftlet.test}}", server.port);
    readiness_follows_on_the_host(&agent, "grpc-ready", &handler, |s| server.set_serving(s));
    assert!(probe_count(&agent, "Readiness", "failed") > 0);
    assert!(probe_count(&agent, "Readiness", "successful") > 0);
    assert!(
        agent.log().contains("service unhealthy (responded with"),
        "the kubelet's message in the log"
    );
}

/// Restart count and whether the last state is a termination.
fn restarted(list: &PodList, pod: &str) -> Option<(i32, bool)> {
    let c = container(list, pod)?;
    let last = c
        .last_state
        .as_ref()
        .is_some_and(|s| s.terminated.is_some());
    Some((c.restart_count, last))
}

#[test]
fn liveness_and_startup_failures_restart_the_container() {
    let Some(agent) = start_agent("probe-liveness") else {
        return;
    };
    // Alive 3 s, then its liveness probe fails twice: killed and restarted.
    let live = r#"    livenessProbe:
      exec: {command: ["test", "-f", "/tmp/alive"]}
      periodSeconds: 1
      failureThreshold: 2
"#;
    let script = "touch /tmp/alive; sleep 3; rm /tmp/alive; while true; do sleep 1; done";
    agent.write_manifest("live.yaml", &manifest(&agent, "live", false, script, live));
    // A startup probe that never succeeds: killed after 3 failures.
    let startup = r#"    startupProbe:
      exec: {command: ["false"]}
      periodSeconds: 1
      failureThreshold: 3
"#;
    let m = manifest(
        &agent,
        "boot",
        false,
        "while true; do sleep 1; done",
        startup,
    );
    agent.write_manifest("boot.yaml", &m);
    // A probe command that outlives its timeout fails.
    let slow = r#"    livenessProbe:
      exec: {command: ["sleep", "5"]}
      timeoutSeconds: 1
      periodSeconds: 1
      failureThreshold: 1
"#;
    let m = manifest(&agent, "slow", false, "while true; do sleep 1; done", slow);
    agent.write_manifest("slow.yaml", &m);
    let (live, boot, slow) = (
        agent.static_pod_name("live"),
        agent.static_pod_name("boot"),
        agent.static_pod_name("slow"),
    );
    let first = agent.wait_for(|l| container(l, &live).is_some_and(is_running), TIMEOUT);
    let first_id = container(&first, &live).and_then(|c| c.container_id.clone());
    let list = agent.wait_for(
        |l| {
            [&live, &boot, &slow]
                .iter()
                .all(|p| restarted(l, p).is_some_and(|(n, last)| n >= 1 && last))
        },
        TIMEOUT,
    );
    let c = container(&list, &live).expect("live");
    assert_ne!(c.container_id, first_id, "a new container: {c:?}");
    let log = agent.log();
    assert!(log.contains("Container main failed liveness probe, will be restarted"));
    assert!(log.contains("Container main failed startup probe, will be restarted"));
    let timed_out = log
        .lines()
        .find(|l| l.contains("probe result changed") && l.contains(slow.as_str()))
        .unwrap_or_default();
    assert!(
        timed_out.contains("timed out") || timed_out.contains("exec:"),
        "the slow probe's failure: {timed_out}"
    );
    let b = container(&list, &boot).expect("boot");
    assert_eq!(b.started, Some(false), "never started: {b:?}");
    assert!(!b.ready);
    // Killed again and again: crash-loop back-off from the third kill on (the newest exited
    // instance ended less than 10 s before), as the kubelet does.
    agent.wait_for(
        |l| {
            container(l, &boot).is_some_and(|c| {
                c.state
                    .as_ref()
                    .and_then(|s| s.waiting.as_ref())
                    .and_then(|w| w.reason.as_deref())
                    == Some("CrashLoopBackOff")
            })
        },
        TIMEOUT,
    );
    assert!(probe_count(&agent, "Startup", "failed") >= 3);
    assert!(probe_count(&agent, "Liveness", "failed") >= 2);
}

#[test]
fn startup_probe_gates_readiness() {
    let Some(agent) = start_agent("probe-startup") else {
        return;
    };
    let probes = r#"    startupProbe:
      exec: {command: ["test", "-f", "/tmp/started"]}
      periodSeconds: 1
      failureThreshold: 30
    readinessProbe:
      exec: {command: ["true"]}
      periodSeconds: 1
"#;
    let script = "sleep 4; touch /tmp/started; while true; do sleep 1; done";
    agent.write_manifest(
        "gate.yaml",
        &manifest(&agent, "gate", false, script, probes),
    );
    let pod = agent.static_pod_name("gate");
    let first = agent.wait_for(|l| container(l, &pod).is_some_and(is_running), TIMEOUT);
    let c = container(&first, &pod).expect("the container");
    assert_eq!((c.started, c.ready), (Some(false), false), "{c:?}");
    // Until the startup probe succeeds (4 s after the start), readiness is not probed.
    std::thread::sleep(Duration::from_secs(2));
    let list = agent.pods();
    let c = container(&list, &pod).expect("the container");
    assert_eq!((c.started, c.ready), (Some(false), false), "{c:?}");
    assert_eq!(probe_count(&agent, "Readiness", "successful"), 0);
    assert_eq!(probe_count(&agent, "Readiness", "failed"), 0);
    assert!(probe_count(&agent, "Startup", "failed") >= 1);
    let list = agent.wait_for(|l| container(l, &pod).is_some_and(|c| c.ready), TIMEOUT);
    let c = container(&list, &pod).expect("the container");
    assert_eq!(c.started, Some(true));
    assert_eq!(c.restart_count, 0);
    assert!(probe_count(&agent, "Startup", "failed") >= 2);
    assert!(probe_count(&agent, "Readiness", "successful") >= 1);
}
