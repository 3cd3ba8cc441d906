//! `spec.runtimeClassName` end to end: pods from the in-process API server (which also serves
//! the RuntimeClasses) run on the real containerd, whose second runc handler
//! (`xtask::runtime::ALT_RUNTIME_HANDLER`) a class can name. CRI's ListPodSandbox shows the
//! handler each sandbox was run with.
use std::time::Duration;

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{ContainerStateWaiting, Pod};
use swiftlet_tests::api_server::{ApiServer, runtime_class};
use swiftlet_tests::{
    Agent, AgentOptions, PodList, Runtime, busybox_pod_manifest, pod_cri_objects,
};
use xtask::runtime::ALT_RUNTIME_HANDLER;

const RUNNING_TIMEOUT: Duration = Duration::from_secs(60);
/// The worker retries a failed sync after 10-15 s; the class cache answers for 5 s.
const RETRY_TIMEOUT: Duration = Duration::from_secs(60);

/// A pod for the agent's node from the API server: one busybox container `main` that sleeps
/// until SIGTERM, in RuntimeClass `class`.
fn api_pod(node: &str, name: &str, class: &str) -> Pod {
    let manifest = busybox_pod_manifest(
        &format!("name: {name}, namespace: default, uid: {name}-{node}"),
        &format!("  nodeName: {node}\n  runtimeClassName: {class}\n"),
        "sleep 3600 & wait",
        "",
    );
    serde_saphyr::from_str(&manifest).expect("a pod")
}

/// The agent's pod `name`'s sandboxes as CRI lists them.
fn sandboxes(agent: &Agent, list: &PodList, name: &str) -> Vec<cri::PodSandbox> {
    let uid = list.uid(name).expect("listed with a UID");
    pod_cri_objects(agent.endpoint(), uid).expect("CRI lists").0
}

fn waiting(list: &PodList, pod: &str) -> Option<ContainerStateWaiting> {
    list.container(pod, "main")?.state.as_ref()?.waiting.clone()
}

/// Waits until the container of `pod` waits with a message containing `needle`.
fn wait_waiting_for(agent: &Agent, pod: &str, needle: &str) -> ContainerStateWaiting {
    let list = agent.wait_for(
        |l| {
            waiting(l, pod)
                .and_then(|w| w.message)
                .is_some_and(|m| m.contains(needle))
        },
        RETRY_TIMEOUT,
    );
    waiting(&list, pod).expect("waiting")
}

#[test]
fn runtime_classes_pick_the_sandbox_handler_and_an_unknown_class_waits_until_it_appears() {
    let Some(rt) = Runtime::shared() else {
        return;
    };
    let tokio = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let server = tokio.block_on(ApiServer::start());
    server.put_runtime_class(runtime_class("alt", ALT_RUNTIME_HANDLER));
    let mut opts = AgentOptions::new("rt-class");
    let _dir = server.point_agent(&mut opts);
    let agent = Agent::start(rt, opts);
    let node = agent.node_name().to_owned();

    // A known class: the sandbox runs with its handler.
    server.put(api_pod(&node, "rc-alt", "alt"));
    // An unknown class: the pod waits, naming the class, and nothing is created in the runtime.
    server.put(api_pod(&node, "rc-late", "late"));
    let list = agent.wait_for(|l| l.is_running("rc-alt"), RUNNING_TIMEOUT);
    let alt = sandboxes(&agent, &list, "rc-alt");
    assert_eq!(alt.len(), 1, "{alt:?}");
    assert_eq!(alt[0].runtime_handler, ALT_RUNTIME_HANDLER);

    let w = wait_waiting_for(&agent, "rc-late", "RuntimeClass \"late\" not found");
    assert_eq!(w.reason.as_deref(), Some("ContainerCreating"), "{w:?}");
    let list = agent.pods();
    assert_eq!(list.phase("rc-late"), Some("Pending"));
    assert!(sandboxes(&agent, &list, "rc-late").is_empty());

    // The class appears (naming the default runc handler explicitly): the pod starts at its
    // next retry.
    server.put_runtime_class(runtime_class("late", "runc"));
    let list = agent.wait_for(|l| l.is_running("rc-late"), RETRY_TIMEOUT);
    let late = sandboxes(&agent, &list, "rc-late");
    assert_eq!(late.len(), 1, "{late:?}");
    assert_eq!(late[0].runtime_handler, "runc");

    // The class's handler changes to one containerd does not have: a new pod of the class
    // fails on it (so the agent has seen the change), while the running pod keeps its sandbox
    // through a sync of its own.
    server.put_runtime_class(runtime_class("alt", "no-such-handler"));
    server.put(api_pod(&node, "rc-after", "alt"));
    wait_waiting_for(&agent, "rc-after", "no-such-handler");
    let mut updated = api_pod(&node, "rc-alt", "alt");
    updated.metadata.labels = Some([("synced".to_owned(), "again".to_owned())].into());
    server.put(updated);
    agent.wait_for(
        |l| {
            l.get("rc-alt")
                .and_then(|p| p.metadata.labels.as_ref())
                .is_some_and(|labels| labels.contains_key("synced"))
        },
        RUNNING_TIMEOUT,
    );
    // The update's sync is done within a few seconds; give it that long to do anything wrong.
    std::thread::sleep(Duration::from_secs(3));
    let list = agent.pods();
    assert!(list.is_running("rc-alt"), "{}", list.summary());
    let now = sandboxes(&agent, &list, "rc-alt");
    assert_eq!(now.len(), 1, "{now:?}");
    assert_eq!(
        (now[0].id.as_str(), now[0].runtime_handler.as_str()),
        (alt[0].id.as_str(), ALT_RUNTIME_HANDLER)
    );
    assert_eq!(now[0].state, cri::PodSandboxState::SandboxReady as i32);
    drop(agent);
    drop(tokio);
}

#[test]
fn a_static_pod_naming_a_class_without_an_api_server_waits_saying_so() {
    let Some(agent) = swiftlet_tests::start_agent("rt-class-no-api") else {
        return;
    };
    agent.write_manifest(
        "kata.yaml",
        &busybox_pod_manifest(
            "name: kata, namespace: default",
            "  runtimeClassName: kata\n",
            "sleep 3600 & wait",
            "",
        ),
    );
    let pod = agent.static_pod_name("kata");
    let w = wait_waiting_for(&agent, &pod, "--kubeconfig");
    assert_eq!(w.reason.as_deref(), Some("ContainerCreating"), "{w:?}");
    let message = w.message.unwrap_or_default();
    assert!(message.contains("RuntimeClass \"kata\""), "{message}");
    let list = agent.pods();
    assert_eq!(list.phase(&pod), Some("Pending"));
    assert!(sandboxes(&agent, &list, &pod).is_empty());
}
