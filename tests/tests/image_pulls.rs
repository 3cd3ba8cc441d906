//! Image pulls against the test registry (`swiftlet_tests::registry`) through the CRI proxy
//! (`swiftlet_tests::cri_proxy`), which counts the agent's calls and holds the answers to
//! `RunPodSandbox` back: a pod's image is pulled while its sandbox is being created (the pull
//! reaches the runtime before any sandbox is answered), and three pods asking for one absent
//! image at once get it from a single `PullImage`.

use std::time::{Duration, Instant};

use swiftlet_tests::cri_proxy::{CriProxy, Fault, Share};
use swiftlet_tests::registry::Registry;
use swiftlet_tests::{
    Agent, AgentOptions, BUSYBOX_IMAGE, Runtime, image_present, script_pod_manifest,
};

const TIMEOUT: Duration = Duration::from_secs(90);

/// A static pod `name` (its UID named) with one looping container running `image`, pulled when
/// absent.
fn pod(agent: &Agent, name: &str, image: &str) -> String {
    script_pod_manifest(
        agent.node_name(),
        name,
        "Always",
        "trap 'exit 0' TERM; while true; do sleep 1; done",
        "",
    )
    .replace(BUSYBOX_IMAGE, image)
    .replace("imagePullPolicy: Never", "imagePullPolicy: IfNotPresent")
}

fn wait(mut done: impl FnMut() -> bool, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    done()
}

#[test]
fn one_pull_serves_every_pod_asking_and_runs_while_the_sandboxes_are_made() {
    let Some(rt) = Runtime::shared() else {
        return;
    };
    let Some(registry) = Registry::shared(rt) else {
        return;
    };
    let proxy = CriProxy::start(&rt.endpoint, 7).unwrap_or_else(|e| panic!("{e}"));
    let mut opts = AgentOptions::new("image-pulls");
    opts.cri_endpoint = Some(proxy.endpoint());
    let agent = Agent::start(rt, opts);
    registry.write_node_config(agent.root_dir());
    let image = registry.fresh_image(agent.endpoint(), "pulls/shared");
    // Every sandbox is made at once but answered 4 s later.
    proxy.inject(
        "RunPodSandbox",
        Fault::Late(Duration::from_secs(4)),
        Share::Next(3),
    );
    let names = ["shared-a", "shared-b", "shared-c"];
    for name in names {
        agent.write_manifest(&format!("{name}.yaml"), &pod(&agent, name, &image));
    }
    assert!(
        wait(|| proxy.calls("PullImage") >= 1, Duration::from_secs(30)),
        "no pull reached the runtime"
    );
    assert!(
        !agent.log().contains("sandbox started"),
        "the pull began only after a sandbox was answered"
    );
    let pods: Vec<String> = names.iter().map(|n| agent.static_pod_name(n)).collect();
    agent.wait_for(|l| pods.iter().all(|p| l.is_running(p)), TIMEOUT);
    assert_eq!(proxy.injected("RunPodSandbox"), 3, "each sandbox was held");
    assert_eq!(
        proxy.calls("PullImage"),
        1,
        "three pods asking at once, one pull"
    );
    assert!(image_present(agent.endpoint(), &image).expect("ImageStatus"));
}
