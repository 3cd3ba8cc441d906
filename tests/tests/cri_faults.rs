//! CRI deadlines (`--runtime-request-timeout`) against the real containerd, with the
//! fault-injecting CRI proxy (`swiftlet_tests::cri_proxy`) between the agent and the runtime.
use std::time::{Duration, Instant};

use swiftlet_tests::cri_proxy::{CriProxy, Fault, Share};
use swiftlet_tests::{Agent, AgentOptions, Runtime, looping_pod_manifest};

/// Polls `done` every 50 ms; false after `timeout`.
fn wait(mut done: impl FnMut() -> bool, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while !done() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

/// A `RunPodSandbox` the runtime never answers fails at its deadline (twice the request timeout,
/// as in the kubelet), is counted, and the pod starts on the worker's retry; meanwhile another
/// pod starts as if nothing hung.
#[test]
fn a_hung_run_pod_sandbox_fails_at_its_deadline_while_other_pods_start() {
    let Some(rt) = Runtime::shared() else { return };
    let proxy = CriProxy::start(&rt.endpoint, 1).unwrap_or_else(|e| panic!("{e}"));
    let mut opts = AgentOptions::new("cri-deadline-hang");
    opts.cri_endpoint = Some(proxy.endpoint());
    opts.extra_args = vec!["--runtime-request-timeout".into(), "4s".into()];
    let agent = Agent::start(rt, opts);
    let deadline = Duration::from_secs(8);

    proxy.inject("RunPodSandbox", Fault::Hang, Share::Next(1));
    agent.write_manifest("hung.yaml", &looping_pod_manifest("hung", &[]));
    assert!(
        wait(
            || proxy.injected("RunPodSandbox") == 1,
            Duration::from_secs(20)
        ),
        "the agent never asked for the sandbox"
    );
    let hung_at = Instant::now();

    // Another pod starts while the first one's call hangs.
    agent.write_manifest("free.yaml", &looping_pod_manifest("free", &[]));
    let free = agent.static_pod_name("free");
    agent.wait_for(|p| p.is_running(&free), deadline);
    assert!(
        hung_at.elapsed() < deadline,
        "the free pod only started after the hung call's deadline ({:?})",
        hung_at.elapsed()
    );

    // The hung pod's call fails at its deadline, and the retry starts it.
    let hung = agent.static_pod_name("hung");
    agent.wait_for(|p| p.is_running(&hung), Duration::from_secs(60));
    assert!(hung_at.elapsed() >= deadline, "{:?}", hung_at.elapsed());
    let (_, metrics) = agent.get("/metrics");
    assert!(
        metrics.contains("swiftlet_cri_deadline_exceeded_total{method=\"RunPodSandbox\"} 1"),
        "{metrics}"
    );
    let log = agent.log();
    assert!(
        log.contains("CRI RunPodSandbox: no answer within its deadline of 8s"),
        "{}",
        agent.log_tail(40)
    );
    // One sandbox in the end: the abandoned call never reached the runtime.
    assert!(proxy.calls("RunPodSandbox") >= 2);
    let uid = agent.pods().get(&hung).and_then(|p| p.metadata.uid.clone());
    let uid = uid.unwrap_or_else(|| panic!("{hung} has no UID"));
    let (sandboxes, _) =
        swiftlet_tests::pod_cri_objects(agent.endpoint(), &uid).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(sandboxes.len(), 1, "{sandboxes:#?}");
}

/// Starts an agent (request timeout 4 s) behind a proxy that lets the runtime perform the next
/// `method` call but answers it 12 s late, after the agent's deadline; writes a pod that needs
/// the call, waits for it to run and for its CRI objects to settle, and returns the agent, the
/// proxy and the pod's UID.
fn pod_behind_a_late_answer(method: &str, name: &str) -> (Agent, CriProxy, String) {
    let rt = Runtime::shared().expect("runtime");
    let proxy = CriProxy::start(&rt.endpoint, 2).unwrap_or_else(|e| panic!("{e}"));
    let mut opts = AgentOptions::new(&format!("cri-late-{name}"));
    opts.cri_endpoint = Some(proxy.endpoint());
    opts.extra_args = vec!["--runtime-request-timeout".into(), "4s".into()];
    let agent = Agent::start(rt, opts);
    proxy.inject(method, Fault::Late(Duration::from_secs(12)), Share::Next(1));
    agent.write_manifest(&format!("{name}.yaml"), &looping_pod_manifest(name, &[]));
    assert!(
        wait(|| proxy.injected(method) == 1, Duration::from_secs(20)),
        "the agent never called {method}"
    );
    let pod = agent.static_pod_name(name);
    agent.wait_for(|p| p.is_running(&pod), Duration::from_secs(90));
    let uid = agent.pods().get(&pod).and_then(|p| p.metadata.uid.clone());
    let uid = uid.unwrap_or_else(|| panic!("{pod} has no UID"));
    let (_, metrics) = agent.get("/metrics");
    assert!(
        metrics.contains(&format!(
            "swiftlet_cri_deadline_exceeded_total{{method=\"{method}\"}} 1"
        )),
        "the late {method} was not given up on at its deadline: {metrics}"
    );
    (agent, proxy, uid)
}

/// The pod's sandboxes and containers once no sandbox but one ready one and no container but one
/// running one and at most one exited one remain (within 60 s), or a panic naming what stayed.
fn settled_objects(agent: &Agent, uid: &str) -> (Vec<k8s_cri::v1::PodSandbox>, usize) {
    let mut last = None;
    let settled = wait(
        || {
            let (sandboxes, containers) = swiftlet_tests::pod_cri_objects(agent.endpoint(), uid)
                .unwrap_or_else(|e| panic!("{e}"));
            let running = containers.iter().filter(|c| c.state == 1).count();
            let done = sandboxes.len() == 1 && sandboxes[0].state == 0 && running == 1;
            last = Some((sandboxes, containers));
            done
        },
        Duration::from_secs(60),
    );
    let (sandboxes, containers) = last.expect("listed once");
    assert!(
        settled,
        "left behind: {sandboxes:#?} {containers:#?}\n{}",
        agent.log_tail(40)
    );
    (sandboxes, containers.len())
}

/// A `RunPodSandbox` the runtime performs but answers after the agent's deadline: the agent gives
/// up on it, and in the end the pod runs in exactly one ready sandbox (the one the abandoned call
/// made, found by the next relist, or a new one with the first removed): never two.
#[test]
fn a_run_pod_sandbox_answered_after_its_deadline_leaves_one_sandbox() {
    if Runtime::shared().is_none() {
        return;
    }
    let (agent, _proxy, uid) = pod_behind_a_late_answer("RunPodSandbox", "late-sandbox");
    settled_objects(&agent, &uid);
}

/// A `CreateContainer` the runtime performs but answers after the agent's deadline: the pod ends
/// with one running container and no more than one other instance (the created, never-started
/// container of the abandoned call is collected like any dead instance).
#[test]
fn a_create_container_answered_after_its_deadline_leaves_one_running_container() {
    if Runtime::shared().is_none() {
        return;
    }
    let (agent, proxy, uid) = pod_behind_a_late_answer("CreateContainer", "late-create");
    assert!(
        proxy.calls("CreateContainer") >= 2,
        "the agent never retried"
    );
    let (_, containers) = settled_objects(&agent, &uid);
    assert!(containers <= 2, "{containers} container instances");
}
