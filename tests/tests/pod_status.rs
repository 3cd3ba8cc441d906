//! Pod status write-back against the in-process API server (no kube-apiserver can run here;
//! the server keeps the API's semantics for status patches and graceful deletes): the status
//! of a pod from the API reaches the server with its phase, IPs and container states, keeps the
//! conditions others own, is written only when it changes, reaches a terminal phase, and a pod
//! deleted through the API (with kubectl) is stopped and then removed by the node.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use swiftlet_tests::api_server::{ApiServer, Cluster};
use swiftlet_tests::{AgentOptions, Runtime, busybox_api_pod, pod_cri_objects};

const TIMEOUT: Duration = Duration::from_secs(90);

fn start(rt: &Runtime, name: &str) -> Cluster {
    Cluster::start(rt, AgentOptions::new(name), |_| {})
}

/// The server's copy of pod `default/name` once `done` holds for it.
fn server_pod(c: &Cluster, name: &str, what: &str, done: impl Fn(&Pod) -> bool) -> Pod {
    c.agent.eventually(what, TIMEOUT, || {
        let pod = c.server.pod_named("default", name).ok_or("no pod")?;
        if done(&pod) {
            Ok(pod)
        } else {
            Err(format!("status {:?}", pod.status))
        }
    })
}

fn phase(p: &Pod) -> Option<&str> {
    p.status.as_ref()?.phase.as_deref()
}

fn status_writes(server: &ApiServer, name: &str) -> usize {
    let key = format!("default/{name}");
    server
        .pod_writes()
        .iter()
        .filter(|(_, verb, pod, _)| *verb == "status" && *pod == key)
        .count()
}

#[test]
fn an_api_pods_status_reaches_the_server_once_per_change_and_keeps_others_conditions() {
    let Some(rt) = Runtime::shared() else {
        return;
    };
    let c = start(rt, "pod-status");
    let node = c.agent.node_name().to_owned();
    // Ready only after 3 s: the server first sees Ready False (ContainersNotReady), then True.
    let mut pod = busybox_api_pod(
        &node,
        "web",
        "",
        "",
        "sleep 3; touch /tmp/ready; sleep 3600 & wait",
        "    readinessProbe: {exec: {command: [test, -f, /tmp/ready]}, periodSeconds: 1}\n",
    );
    // A condition another component owns (a readiness gate's): the node must keep it.
    pod.status = Some(
        serde_json::from_value(serde_json::json!({
            "conditions": [{"type": "example.com/gate", "status": "True"}],
        }))
        .expect("a status"),
    );
    c.server.put(pod);
    let running = server_pod(&c, "web", "the pod Running and Ready on the server", |p| {
        phase(p) == Some("Running")
            && p.status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .is_some_and(|cs| cs.iter().all(|c| c.ready))
    });
    let st = running.status.clone().expect("a status");
    assert!(st.pod_ip.is_some_and(|ip| !ip.is_empty()), "a pod IP");
    assert!(st.start_time.is_some());
    let cs = &st.container_statuses.clone().unwrap_or_default()[0];
    assert_eq!(cs.name, "main");
    assert!(cs.state.as_ref().and_then(|s| s.running.as_ref()).is_some());
    assert!(
        cs.container_id
            .as_deref()
            .unwrap_or("")
            .starts_with("containerd://")
    );
    let conditions: Vec<(String, String)> = st
        .conditions
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|c| (c.type_, c.status))
        .collect();
    for want in [
        "example.com/gate",
        "Ready",
        "ContainersReady",
        "Initialized",
    ] {
        assert!(
            conditions.iter().any(|(t, s)| t == want && s == "True"),
            "{want} True in {conditions:?}"
        );
    }
    // Ready was False (reason ContainersNotReady) before it turned True: the reason and
    // message went with it on the server (a patch that never deletes keeps them).
    assert!(
        c.server.pod_writes().iter().any(|(_, _, _, body)| {
            body["status"]["conditions"]
                .as_array()
                .is_some_and(|cs| cs.iter().any(|c| c["reason"] == "ContainersNotReady"))
        }),
        "Ready False was written first"
    );
    for c in st.conditions.clone().unwrap_or_default() {
        if c.type_ == "Ready" || c.type_ == "ContainersReady" {
            assert_eq!(
                (c.reason, c.message),
                (None, None),
                "{} on the server",
                c.type_
            );
        }
    }
    // Every write carried the pod's UID as a precondition.
    let uid = format!("web-{node}");
    assert!(
        c.server
            .pod_writes()
            .iter()
            .all(|(_, _, _, body)| body["metadata"]["uid"] == uid.as_str()),
        "UID preconditions"
    );
    // Nothing changes now: no write for longer than a reconcile period.
    std::thread::sleep(Duration::from_secs(2));
    let before = status_writes(&c.server, "web");
    std::thread::sleep(Duration::from_secs(12));
    assert_eq!(
        status_writes(&c.server, "web"),
        before,
        "an unchanged status is not written"
    );
    // The agent's own view agrees with the server's.
    let local = c.agent.pods();
    assert_eq!(local.phase("web"), Some("Running"));
}

#[test]
fn a_finished_pod_reaches_a_terminal_phase_on_the_server() {
    let Some(rt) = Runtime::shared() else {
        return;
    };
    let c = start(rt, "pod-status-done");
    let node = c.agent.node_name().to_owned();
    c.server.put(busybox_api_pod(
        &node,
        "job",
        "",
        "  restartPolicy: Never\n",
        "sleep 3; exit 3",
        "",
    ));
    server_pod(&c, "job", "the pod Running on the server", |p| {
        phase(p) == Some("Running")
    });
    let done = server_pod(&c, "job", "the pod Failed on the server", |p| {
        phase(p) == Some("Failed")
    });
    let cs = done
        .status
        .and_then(|s| s.container_statuses)
        .unwrap_or_default();
    let state = cs[0].state.clone().unwrap_or_default();
    let terminated = state.terminated.clone().expect("terminated");
    assert_eq!(terminated.exit_code, 3);
    // Only one state: the server dropped `running` when the container stopped.
    assert!(
        state.running.is_none() && state.waiting.is_none(),
        "one state on the server: {state:?}"
    );
}

#[test]
fn a_pod_deleted_with_kubectl_is_stopped_then_removed_by_the_node() {
    let Some(rt) = Runtime::shared() else {
        return;
    };
    let Some(kubectl) = swiftlet_tests::find_tool("kubectl", "apt-get install kubectl") else {
        return;
    };
    let c = start(rt, "pod-delete");
    let node = c.agent.node_name().to_owned();
    let uid = format!("web-{node}");
    c.server.put(busybox_api_pod(
        &node,
        "web",
        "",
        "",
        "trap 'exit 0' TERM; sleep 3600 & wait",
        "",
    ));
    server_pod(&c, "web", "the pod Running on the server", |p| {
        phase(p) == Some("Running")
    });
    let (_dir, kubeconfig) = c.server.kubeconfig_file();
    let asked = Instant::now();
    let args: Vec<String> = ["delete", "pod", "web", "-n", "default", "--wait=false"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    let out = swiftlet_tests::kubectl_output(&kubectl, &kubeconfig, &args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The pod's grace period (2 s) and then the node's delete: gone from the server.
    c.agent
        .eventually("the pod gone from the server", TIMEOUT, || {
            match c.server.pod_named("default", "web") {
                Some(p) => Err(format!(
                    "still there, deletionTimestamp {:?}",
                    p.metadata.deletion_timestamp
                )),
                None => Ok(()),
            }
        });
    assert!(asked.elapsed() < Duration::from_secs(60));
    let deletes: Vec<serde_json::Value> = c
        .server
        .pod_writes()
        .into_iter()
        .filter(|(_, verb, _, _)| *verb == "delete")
        .map(|(_, _, _, body)| body)
        .collect();
    let by_node = deletes
        .iter()
        .find(|d| d["gracePeriodSeconds"] == 0)
        .unwrap_or_else(|| panic!("no delete with grace 0 in {deletes:?}"));
    assert_eq!(by_node["preconditions"]["uid"], uid.as_str());
    // Its containers were stopped before it went.
    let (_, containers) = pod_cri_objects(c.agent.endpoint(), &uid).expect("CRI");
    assert!(
        containers
            .iter()
            .all(|ct| ct.state != k8s_cri::v1::ContainerState::ContainerRunning as i32),
        "{containers:?}"
    );
    // kubectl agrees.
    let args: Vec<String> = ["get", "pod", "web", "-n", "default"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    let out = swiftlet_tests::kubectl_output(&kubectl, &kubeconfig, &args);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found"));
}

/// A pod past its `activeDeadlineSeconds` fails at once on the node, but its container ignores
/// SIGTERM and runs out a 10 s grace period: all that while the server keeps seeing it Running
/// (a controller acting on Failed would start a replacement beside it); once the container is
/// stopped the server sees Failed with `DeadlineExceeded`. Evictions and preemptions go through
/// the same hold (unit test `a_terminal_phase_waits_until_the_containers_are_stopped`).
#[test]
fn a_failed_pod_stays_running_on_the_server_until_its_containers_stop() {
    let Some(rt) = Runtime::shared() else {
        return;
    };
    let c = start(rt, "pod-status-hold");
    let node = c.agent.node_name().to_owned();
    let mut pod = busybox_api_pod(
        &node,
        "slow",
        "",
        "  activeDeadlineSeconds: 4\n",
        "trap '' TERM; while true; do sleep 1; done",
        "",
    );
    if let Some(spec) = pod.spec.as_mut() {
        spec.termination_grace_period_seconds = Some(10);
    }
    c.server.put(pod);
    server_pod(&c, "slow", "the pod Running on the server", |p| {
        phase(p) == Some("Running")
    });
    c.agent
        .eventually("the pod Failed on the node", TIMEOUT, || {
            let list = c.agent.pods();
            (list.phase("slow") == Some("Failed"))
                .then_some(())
                .ok_or_else(|| list.summary())
        });
    let uid = format!("slow-{node}");
    let running = |uid: &str| swiftlet_tests::has_running_container(c.agent.endpoint(), uid);
    // The server's phase is read before the runtime's state: Failed there while the container
    // still runs afterwards is a terminal phase shown too early.
    let mut seen_running = 0;
    let until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < until {
        let on_server = c.server.pod_named("default", "slow");
        let server_phase = on_server.as_ref().and_then(phase).map(str::to_owned);
        if running(&uid) {
            seen_running += 1;
            assert_ne!(
                server_phase.as_deref(),
                Some("Failed"),
                "the server shows Failed while the container runs"
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(seen_running > 0, "the container ran out its grace period");
    let done = server_pod(&c, "slow", "the pod Failed on the server", |p| {
        phase(p) == Some("Failed")
    });
    assert!(!running(&uid), "Failed on the server only once stopped");
    let status = done.status.unwrap_or_default();
    assert_eq!(status.reason.as_deref(), Some("DeadlineExceeded"));
}

/// A restarted agent continues from the statuses the server holds. A pod that failed before the
/// restart, its sandbox since removed from the runtime, stays Failed on the node too and no
/// longer counts for admission (with `--max-pods 2`, a new pod is admitted beside the running
/// one). A running pod is never written back as Pending while its worker's first read of the
/// runtime is slow (every `PodSandboxStatus` delayed 15 s, past the writer's 10 s reconcile).
#[test]
fn a_restarted_agent_continues_from_the_servers_status() {
    use swiftlet_tests::cri_proxy::{CriProxy, Fault, Share};
    let Some(rt) = Runtime::shared() else {
        return;
    };
    let proxy = CriProxy::start(&rt.endpoint, 7).unwrap_or_else(|e| panic!("{e}"));
    let mut opts = AgentOptions::new("pod-status-restart");
    opts.cri_endpoint = Some(proxy.endpoint());
    opts.extra_args
        .extend(["--max-pods".to_owned(), "2".to_owned()]);
    let mut c = Cluster::start(rt, opts, |_| {});
    let node = c.agent.node_name().to_owned();
    let never = "  restartPolicy: Never\n";
    c.server
        .put(busybox_api_pod(&node, "failed", "", never, "exit 3", ""));
    c.server
        .put(busybox_api_pod(&node, "up", "", "", "sleep 3600", ""));
    server_pod(&c, "failed", "the pod Failed on the server", |p| {
        phase(p) == Some("Failed")
    });
    server_pod(&c, "up", "the pod Running on the server", |p| {
        phase(p) == Some("Running")
    });
    // Its worker finished it: written once its sandbox stopped.
    std::thread::sleep(Duration::from_secs(2));
    c.agent.kill();
    let failed_uid = format!("failed-{node}");
    let endpoint = rt.endpoint.clone();
    let removed = swiftlet_tests::block_on(async move {
        let mut client = swiftlet_tests::runtime_client(&endpoint)?;
        let sandboxes = swiftlet_tests::sandboxes_with_labels(
            &mut client,
            &[(swiftlet_tests::POD_UID_LABEL, &failed_uid)],
        )
        .await?;
        for sb in &sandboxes {
            let id = sb.id.clone();
            let _ = client
                .remove_pod_sandbox(k8s_cri::v1::RemovePodSandboxRequest { pod_sandbox_id: id })
                .await;
        }
        Ok::<_, swiftlet_tests::Error>(sandboxes.len())
    });
    assert!(matches!(removed, Ok(Ok(1))), "{removed:?}");
    proxy.inject(
        "PodSandboxStatus",
        Fault::Delay(Duration::from_secs(15)),
        Share::ALL,
    );
    let restarted = Instant::now();
    c.agent.restart_after_sigkill();
    c.server
        .put(busybox_api_pod(&node, "late", "", "", "sleep 3600", ""));
    std::thread::sleep(Duration::from_secs(16));
    proxy.clear();
    server_pod(&c, "up", "the running pod's status read again", |p| {
        p.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.restart_count == 0))
    });
    let pending_writes: Vec<String> = c
        .server
        .pod_writes()
        .into_iter()
        .filter(|(at, verb, pod, body)| {
            *at > restarted
                && *verb == "status"
                && pod == "default/up"
                && body["status"]["phase"] == "Pending"
        })
        .map(|(_, _, _, body)| body.to_string())
        .collect();
    assert!(
        pending_writes.is_empty(),
        "the running pod was written back as Pending: {pending_writes:?}"
    );
    let up = c.server.pod_named("default", "up").expect("the pod");
    assert_eq!(phase(&up), Some("Running"));
    server_pod(&c, "late", "the new pod Running on the server", |p| {
        phase(p) == Some("Running")
    });
    let failed = c.server.pod_named("default", "failed").expect("the pod");
    assert_eq!(phase(&failed), Some("Failed"));
    assert_eq!(c.agent.pods().phase("failed"), Some("Failed"));
}
