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
