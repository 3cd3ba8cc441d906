//! Lifecycle hooks against a real containerd: a postStart exec hook finished before the status
//! first shows its container Running (while the container's own command ran beside it); a
//! failing postStart hook killing and restarting its container with the failure in the status,
//! and under restartPolicy Never failing the pod without a restart; postStart and preStop httpGet
//! hooks (a spec change restarts the container) reaching an HTTP server in a sidecar of the same
//! pod on the pod's IP and a named port, in order; a preStop httpGet hook reaching a server in
//! the test while the container still runs, after the pod's spec is gone (its port found by name
//! from the container's annotation); and a postStart hook that never ends holding up neither the
//! status (not Running) nor the pod's deletion. Each test runs its own agent.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{ContainerState, ContainerStateTerminated, ContainerStatus};
use swiftlet_tests::{
    Agent, BUSYBOX_IMAGE, PodList, container_statuses, exec, is_running, pod_cri_objects,
    start_agent,
};

const TIMEOUT: Duration = Duration::from_secs(60);

fn main_container<'a>(list: &'a PodList, pod: &str) -> Option<&'a ContainerStatus> {
    list.container(pod, "main")
}

/// The terminated state in `state` (the status `c`'s state or last state).
fn terminated<'a>(
    state: Option<&'a ContainerState>,
    c: &ContainerStatus,
) -> &'a ContainerStateTerminated {
    state
        .and_then(|s| s.terminated.as_ref())
        .unwrap_or_else(|| panic!("no terminated state: {c:?}"))
}

/// Polls `/pods` without pause until pod `pod`'s container `main` is first reported Running;
/// returns its container ID.
fn first_running(agent: &Agent, name: &str) -> String {
    let pod = agent.static_pod_name(name);
    let pod = pod.as_str();
    let mut id = None;
    let seen = agent.poll_pods(Duration::from_millis(5), TIMEOUT, |list, _| {
        id = main_container(list, pod)
            .filter(|c| is_running(c))
            .and_then(|c| c.container_id.clone());
        id.is_some()
    });
    assert!(seen, "{pod} never ran: {}", agent.log_tail(40));
    id.expect("container id")
}

#[test]
fn post_start_exec_hook_finishes_before_the_container_is_reported_running() {
    let Some(agent) = start_agent("hook-exec") else {
        return;
    };
    // The entrypoint notes whether the hook's file was there when it began: it starts at the
    // same time as the hook (as in the kubelet), so it is not.
    let script = "if [ -f /tmp/hooked ]; then echo after; else echo before; fi > /tmp/entry; \
                  while true; do sleep 0.2; done";
    let hook = "    lifecycle:\n      postStart:\n        exec:\n          command: \
                [\"sh\", \"-c\", \"sleep 2; touch /tmp/hooked\"]\n";
    agent.write_manifest(
        "hooked.yaml",
        &agent.busybox_pod("hooked", "", script, hook),
    );
    let id = first_running(&agent, "hooked");
    let (code, out) =
        exec(agent.endpoint(), &id, &["cat", "/tmp/hooked", "/tmp/entry"]).expect("ExecSync");
    assert_eq!(
        (code, out.trim()),
        (0, "before"),
        "at the first Running status the hook's file exists, and the entrypoint began before \
         the hook finished"
    );
    agent.remove_manifest("hooked.yaml");
}

#[test]
fn failing_post_start_hook_kills_and_restarts_the_container() {
    let Some(agent) = start_agent("hook-fail") else {
        return;
    };
    let hook = "    lifecycle:\n      postStart:\n        exec:\n          command: \
                [\"sh\", \"-c\", \"echo hook-broke; exit 3\"]\n";
    agent.write_manifest(
        "broken.yaml",
        // SIGTERM (the kill) ends it with 42.
        &agent.busybox_pod(
            "broken",
            "",
            "trap 'exit 42' TERM; while true; do sleep 0.2; done",
            hook,
        ),
    );
    // Every distinct waiting (reason, message) seen, until the container backs off after a
    // restart.
    let mut seen: Vec<(String, String)> = Vec::new();
    let mut last = None;
    let done = agent.poll_pods(Duration::from_millis(10), TIMEOUT, |list, _| {
        let Some(c) = main_container(list, &agent.static_pod_name("broken")) else {
            return false;
        };
        if let Some(w) = c.state.as_ref().and_then(|s| s.waiting.as_ref()) {
            let w = (
                w.reason.clone().unwrap_or_default(),
                w.message.clone().unwrap_or_default(),
            );
            if !seen.contains(&w) {
                seen.push(w);
            }
        }
        last = Some(c.clone());
        c.restart_count >= 1 && seen.iter().any(|(r, _)| r == "CrashLoopBackOff")
    });
    assert!(
        done,
        "no restart and back-off; seen {seen:?}, last {last:?}"
    );
    let (_, message) = seen
        .iter()
        .find(|(r, _)| r == "PostStartHookError")
        .unwrap_or_else(|| panic!("no PostStartHookError in the status; seen {seen:?}"));
    assert!(
        message.starts_with(
            "Exec lifecycle hook ([sh -c echo hook-broke; exit 3]) for Container \"main\""
        ) && message.contains("exited with 3")
            && message.contains("message: \"hook-broke\\n\""),
        "{message}"
    );
    let last = last.expect("a status");
    let ended = terminated(last.last_state.as_ref(), &last);
    assert_eq!(ended.exit_code, 42, "stopped by the agent: {ended:?}");
    assert!(
        agent.log().contains("FailedPostStartHook"),
        "no FailedPostStartHook in the log"
    );
    agent.remove_manifest("broken.yaml");
}

#[test]
fn http_hooks_reach_a_sidecar_on_the_pod_ip_in_order() {
    let Some(agent) = start_agent("hook-http") else {
        return;
    };
    // The sidecar serves a CGI script that appends each request's query to /tmp/requests; its own
    // postStart hook waits until the server answers, so the app container (and its hooks)
    // starts only then. It is stopped after the app container, so it also sees its preStop.
    let server = "mkdir -p /www/cgi-bin; echo ok > /www/index.html; \
                  printf '#!/bin/sh\\necho $QUERY_STRING >> /tmp/requests\\necho Content-Type: text/plain\\necho\\necho ok\\n' \
                  > /www/cgi-bin/hook; chmod +x /www/cgi-bin/hook; exec httpd -f -p 8080 -h /www";
    let wait = "until wget -q -O /dev/null http://127.0.0.1:8080/; do sleep 0.1; done";
    let sidecar = format!(
        "  initContainers:\n  - name: web\n    image: {BUSYBOX_IMAGE}\n    imagePullPolicy: Never\n    \
         restartPolicy: Always\n    command: [\"sh\", \"-c\", {server:?}]\n    lifecycle:\n      \
         postStart:\n        exec:\n          command: [\"sh\", \"-c\", {wait:?}]\n"
    );
    // No host: the pod's IP; the port by name.
    let hooks = "    ports:\n    - {name: web, containerPort: 8080}\n    lifecycle:\n      postStart:\n        \
                 httpGet: {path: /cgi-bin/hook?start, port: web}\n      preStop:\n        \
                 httpGet: {path: /cgi-bin/hook?stop, port: web}\n";
    let pod = |script: &str| agent.busybox_pod("web", &sidecar, script, hooks);
    agent.write_manifest("web.yaml", &pod("while true; do sleep 0.2; done"));
    let first = first_running(&agent, "web");
    let list = agent.pods();
    let sidecar_id = list
        .get(&agent.static_pod_name("web"))
        .and_then(|p| p.status.as_ref())
        .and_then(|s| s.init_container_statuses.as_ref())
        .and_then(|s| s.iter().find(|c| c.name == "web"))
        .and_then(|c| c.container_id.clone())
        .expect("the sidecar's container id");
    let requests = || exec(agent.endpoint(), &sidecar_id, &["cat", "/tmp/requests"]);
    assert_eq!(
        requests().expect("ExecSync"),
        (0, "start\n".to_owned()),
        "the postStart hook's request reached the sidecar before main was reported Running"
    );
    // A spec change restarts main: its preStop hook, then the new instance's postStart.
    agent.write_manifest("web.yaml", &pod("while true; do sleep 0.3; done"));
    let pod_name = agent.static_pod_name("web");
    agent.wait_for(
        |l| {
            main_container(l, &pod_name)
                .is_some_and(|c| is_running(c) && c.container_id.as_ref() != Some(&first))
        },
        TIMEOUT,
    );
    assert_eq!(
        requests().expect("ExecSync"),
        (0, "start\nstop\nstart\n".to_owned())
    );
    agent.remove_manifest("web.yaml");
}

#[test]
fn pre_stop_http_hook_runs_while_the_container_runs_without_the_spec() {
    let Some(agent) = start_agent("hook-prestop") else {
        return;
    };
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let hook = format!(
        "    ports:\n    - {{name: hook, containerPort: {port}}}\n    lifecycle:\n      preStop:\n        \
         httpGet: {{host: 127.0.0.1, path: /prestop, port: hook}}\n"
    );
    agent.write_manifest(
        "stopping.yaml",
        &agent
            .busybox_pod(
                "stopping",
                "  hostNetwork: true\n",
                "while true; do sleep 0.2; done",
                &hook,
            )
            .replace(
                "terminationGracePeriodSeconds: 2",
                "terminationGracePeriodSeconds: 20",
            ),
    );
    let id = first_running(&agent, "stopping");
    let endpoint = agent.endpoint().to_owned();
    // The server answers the hook's request after checking that the container still runs.
    let server = std::thread::spawn(move || {
        listener.set_nonblocking(true).expect("nonblocking");
        let deadline = std::time::Instant::now() + TIMEOUT;
        let mut s = loop {
            match listener.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    assert!(std::time::Instant::now() < deadline, "no preStop request");
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("accept: {e}"),
            }
        };
        s.set_nonblocking(false).expect("blocking");
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let mut buf = vec![0; 4096];
        let n = s.read(&mut buf).expect("read");
        let running = exec(&endpoint, &id, &["true"]).map(|(code, _)| code == 0);
        s.write_all(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n")
            .expect("write");
        (String::from_utf8_lossy(&buf[..n]).into_owned(), running)
    });
    // The spec goes away: the kill works from the containers' annotations.
    agent.remove_manifest("stopping.yaml");
    let (request, running) = server.join().expect("server");
    assert!(request.starts_with("GET /prestop HTTP/1.1"), "{request}");
    assert!(
        matches!(running, Ok(true)),
        "the container ran while its preStop hook was answered: {running:?}"
    );
    let pod = agent.static_pod_name("stopping");
    agent.wait_for(|l| l.get(&pod).is_none(), TIMEOUT);
    assert!(
        agent.log().contains("preStop hook done"),
        "no preStop in the log"
    );
}

#[test]
fn a_post_start_hook_still_running_does_not_hold_up_the_pods_deletion() {
    let Some(agent) = start_agent("hook-endless") else {
        return;
    };
    let hook = "    lifecycle:\n      postStart:\n        exec:\n          command: \
                [\"sleep\", \"3600\"]\n";
    agent.write_manifest(
        "endless.yaml",
        &agent.busybox_pod("endless", "", "while true; do sleep 0.2; done", hook),
    );
    let uid = format!("endless-{}", agent.node_name());
    // The container runs (its hook with it) ...
    agent.eventually("the container runs", TIMEOUT, || {
        match container_statuses(agent.endpoint(), &uid) {
            Ok(s)
                if s.iter()
                    .any(|c| c.state == cri::ContainerState::ContainerRunning as i32) =>
            {
                Ok(())
            }
            other => Err(format!("{other:?}")),
        }
    });
    // ... but the status does not say so while the hook has not finished.
    std::thread::sleep(Duration::from_secs(1));
    let pod = agent.static_pod_name("endless");
    let list = agent.pods();
    let main = main_container(&list, &pod);
    assert!(
        !main.is_some_and(is_running),
        "Running before the postStart hook finished: {main:?}"
    );
    let begun = Instant::now();
    agent.remove_manifest("endless.yaml");
    agent.eventually(
        "the pod is gone from the runtime",
        TIMEOUT,
        || match pod_cri_objects(agent.endpoint(), &uid) {
            Ok((s, c)) if s.is_empty() && c.is_empty() => Ok(()),
            other => Err(format!("{other:?}")),
        },
    );
    assert!(
        begun.elapsed() < Duration::from_secs(20),
        "the deletion waited for the hook: {:?}",
        begun.elapsed()
    );
    assert!(
        agent.log().contains("postStart hook abandoned"),
        "no abandoned hook in the log"
    );
}

#[test]
fn failing_post_start_hook_under_restart_policy_never_fails_the_pod() {
    let Some(agent) = start_agent("hook-never") else {
        return;
    };
    let hook = "    lifecycle:\n      postStart:\n        exec:\n          command: [\"false\"]\n";
    agent.write_manifest(
        "once.yaml",
        &agent.busybox_pod(
            "once",
            "  restartPolicy: Never\n",
            "trap 'exit 42' TERM; while true; do sleep 0.2; done",
            hook,
        ),
    );
    let pod = agent.static_pod_name("once");
    let mut waiting = Vec::new();
    let mut last = None;
    let failed = agent.poll_pods(Duration::from_millis(10), TIMEOUT, |list, _| {
        let c = main_container(list, &pod);
        if let Some(w) = c.and_then(|c| c.state.as_ref()?.waiting.clone()) {
            waiting.push(w);
        }
        last = c.cloned();
        list.phase(&pod) == Some("Failed")
    });
    assert!(failed, "the pod did not fail: {last:?}");
    // Not restarted, so never waiting for a restart with the hook's error (as the kubelet).
    assert!(
        !waiting
            .iter()
            .any(|w| w.reason.as_deref() == Some("PostStartHookError")),
        "{waiting:?}"
    );
    let last = last.expect("a status");
    let ended = terminated(last.state.as_ref(), &last);
    assert_eq!((ended.exit_code, last.restart_count), (42, 0), "{last:?}");
    agent.remove_manifest("once.yaml");
}
