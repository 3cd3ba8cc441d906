//! The runtime manager against a real containerd: restart policies by exit code, crash-loop
//! back-off growth, spec changes (restart) versus label changes (none), init and sidecar
//! containers in order, image pull errors, termination with a grace period and a preStop hook, and
//! adoption of running pods after the agent is killed with SIGKILL.
//! Each test runs its own agent (own node name, ports, manifest dir and cgroup root).

use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::ContainerStatus;
use swiftlet_tests::{
    Agent, AgentOptions, BUSYBOX_IMAGE, PodList, Runtime, container_statuses, pod_cri_objects,
    script_pod_manifest,
};

const TIMEOUT: Duration = Duration::from_secs(90);

fn start(name: &str) -> Option<Agent> {
    let rt = Runtime::shared()?;
    Some(Agent::start(rt, AgentOptions::new(name)))
}

/// A pod manifest with an explicit UID (so edits keep the same pod), one app container running
/// `script`, and optional extra spec lines (already indented by two spaces).
fn manifest(agent: &Agent, name: &str, policy: &str, script: &str, extra: &str) -> String {
    script_pod_manifest(agent.node_name(), name, policy, script, extra)
}

fn status<'a>(list: &'a PodList, pod: &str, container: &str) -> Option<&'a ContainerStatus> {
    list.container(pod, container)
}

fn init_status<'a>(list: &'a PodList, pod: &str, container: &str) -> Option<&'a ContainerStatus> {
    list.get(pod)?
        .status
        .as_ref()?
        .init_container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == container)
}

fn waiting_reason(c: &ContainerStatus) -> Option<&str> {
    c.state.as_ref()?.waiting.as_ref()?.reason.as_deref()
}

fn exit_code(c: &ContainerStatus) -> Option<i32> {
    c.state.as_ref()?.terminated.as_ref().map(|t| t.exit_code)
}

/// Full CRI statuses of every container of pod `uid`, oldest first.
fn cri_statuses(endpoint: &str, uid: &str) -> Vec<cri::ContainerStatus> {
    container_statuses(endpoint, uid)
        .unwrap_or_else(|e| panic!("reading container statuses of {uid}: {e}"))
}

fn named<'a>(all: &'a [cri::ContainerStatus], name: &str) -> Vec<&'a cri::ContainerStatus> {
    all.iter()
        .filter(|s| s.metadata.as_ref().is_some_and(|m| m.name == name))
        .collect()
}

fn secs(nanos: i64) -> f64 {
    nanos as f64 / 1e9
}

#[test]
fn restart_policies_follow_exit_codes() {
    let Some(agent) = start("restart-policies") else {
        return;
    };
    let cases = [
        ("always-ok", "Always", "exit 0"),
        ("onfailure-ok", "OnFailure", "exit 0"),
        ("onfailure-fail", "OnFailure", "sleep 1; exit 1"),
        ("never-fail", "Never", "exit 3"),
    ];
    for (name, policy, script) in cases {
        agent.write_manifest(
            &format!("{name}.yaml"),
            &manifest(&agent, name, policy, script, ""),
        );
    }
    // A failing init container under Never fails the pod; its app container never starts.
    let init_fail = format!(
        "  initContainers:\n  - name: setup\n    image: {BUSYBOX_IMAGE}\n    imagePullPolicy: Never\n    command: [\"sh\", \"-c\", \"exit 2\"]\n"
    );
    agent.write_manifest(
        "init-fail.yaml",
        &manifest(&agent, "init-fail", "Never", "sleep 1000", &init_fail),
    );
    let pod = |n: &str| agent.static_pod_name(n);
    let list = agent.wait_for(
        |l| {
            let restarted =
                |n: &str| status(l, &pod(n), "main").is_some_and(|c| c.restart_count >= 1);
            restarted("always-ok")
                && restarted("onfailure-fail")
                && l.phase(&pod("onfailure-ok")) == Some("Succeeded")
                && l.phase(&pod("never-fail")) == Some("Failed")
                && l.phase(&pod("init-fail")) == Some("Failed")
        },
        TIMEOUT,
    );
    // The finished pods were not restarted and show how their container ended.
    let ok = status(&list, &pod("onfailure-ok"), "main").expect("status");
    assert_eq!(ok.restart_count, 0);
    assert_eq!(exit_code(ok), Some(0));
    let failed = status(&list, &pod("never-fail"), "main").expect("status");
    assert_eq!(failed.restart_count, 0);
    assert_eq!(exit_code(failed), Some(3));
    for n in ["onfailure-ok", "never-fail"] {
        let uid = list.uid(&pod(n)).expect("uid");
        let all = cri_statuses(agent.endpoint(), uid);
        assert_eq!(all.len(), 1, "{n}: exactly one container ever: {all:?}");
    }
    let setup = init_status(&list, &pod("init-fail"), "setup").expect("init status");
    assert_eq!(exit_code(setup), Some(2));
    let uid = list.uid(&pod("init-fail")).expect("uid");
    let all = cri_statuses(agent.endpoint(), uid);
    assert!(
        named(&all, "main").is_empty(),
        "the app container never ran: {all:?}"
    );
    // A restarted container remembers how the previous run ended.
    let restarted = status(&list, &pod("onfailure-fail"), "main").expect("status");
    let last = restarted
        .last_state
        .as_ref()
        .and_then(|l| l.terminated.as_ref());
    assert_eq!(last.map(|t| t.exit_code), Some(1), "{restarted:?}");
}

/// `--maximum-dead-containers` and `--minimum-container-ttl-duration`: two finished pods hold
/// six dead containers (two init containers and the app container each, one instance per name,
/// which the per-container rule keeps); none goes while younger than the minimum age, then the
/// two oldest go so that four are left on the node, and the collection stops there.
#[test]
fn the_node_wide_dead_container_cap_takes_the_oldest_once_they_are_old_enough() {
    let Some(rt) = Runtime::shared() else {
        return;
    };
    const MIN_AGE: Duration = Duration::from_secs(20);
    let mut opts = AgentOptions::new("dead-cap");
    opts.extra_args.extend([
        "--maximum-dead-containers".to_owned(),
        "4".to_owned(),
        "--minimum-container-ttl-duration".to_owned(),
        format!("{}s", MIN_AGE.as_secs()),
    ]);
    let agent = Agent::start(rt, opts);
    let init = |name: &str| {
        format!(
            "  - name: {name}\n    image: {BUSYBOX_IMAGE}\n    imagePullPolicy: Never\n    \
             command: [\"true\"]\n"
        )
    };
    let inits = format!("  initContainers:\n{}{}", init("first"), init("second"));
    for name in ["done-a", "done-b"] {
        agent.write_manifest(
            &format!("{name}.yaml"),
            &manifest(&agent, name, "Never", "true", &inits),
        );
    }
    let pod = |n: &str| agent.static_pod_name(n);
    let list = agent.wait_for(
        |l| {
            l.phase(&pod("done-a")) == Some("Succeeded")
                && l.phase(&pod("done-b")) == Some("Succeeded")
        },
        TIMEOUT,
    );
    let uids: Vec<String> = ["done-a", "done-b"]
        .iter()
        .map(|n| list.uid(&pod(n)).expect("uid").to_owned())
        .collect();
    let dead = || -> Vec<cri::Container> {
        let mut all: Vec<cri::Container> = uids
            .iter()
            .flat_map(|uid| {
                pod_cri_objects(agent.endpoint(), uid)
                    .expect("CRI answers")
                    .1
            })
            .collect();
        all.sort_by_key(|c| (c.created_at, c.id.clone()));
        all
    };
    let before = dead();
    assert_eq!(before.len(), 6, "{before:?}");
    // Until the youngest is MIN_AGE old less a margin, nothing may go (the collection runs
    // every 10 s; the oldest two become old enough first).
    let oldest = before[0].created_at;
    let until = oldest + i64::try_from(MIN_AGE.as_nanos()).unwrap_or(i64::MAX) - 2_000_000_000;
    while swiftlet_tests::unix_nanos() < until {
        assert_eq!(dead().len(), 6, "removed before the minimum age");
        std::thread::sleep(Duration::from_millis(500));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut now = dead();
    while now.len() > 4 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        now = dead();
    }
    let ids = |cs: &[cri::Container]| cs.iter().map(|c| c.id.clone()).collect::<Vec<_>>();
    assert_eq!(
        ids(&now),
        ids(&before[2..]),
        "the two oldest went, the node keeps four"
    );
    // The cap is reached: two more collections remove nothing.
    std::thread::sleep(Duration::from_secs(21));
    assert_eq!(ids(&dead()), ids(&before[2..]));
    let list = agent.pods();
    assert_eq!(list.phase(&pod("done-a")), Some("Succeeded"));
    assert_eq!(list.phase(&pod("done-b")), Some("Succeeded"));
}

#[test]
fn crash_loop_back_off_grows() {
    let Some(agent) = start("crash-loop") else {
        return;
    };
    agent.write_manifest(
        "crash.yaml",
        &manifest(&agent, "crash", "Always", "exit 1", ""),
    );
    let pod = agent.static_pod_name("crash");
    let mut saw_backoff = false;
    // Every instance the runtime held, as last seen: the collector keeps only the newest dead
    // instance of a container (as the kubelet's container GC), so older runs are gone by the end.
    let mut seen: std::collections::BTreeMap<String, cri::ContainerStatus> = Default::default();
    agent.wait_for(
        |l| {
            if let Some(uid) = l.uid(&pod) {
                for s in cri_statuses(agent.endpoint(), uid) {
                    seen.insert(s.id.clone(), s);
                }
            }
            let c = status(l, &pod, "main");
            saw_backoff |= c.and_then(waiting_reason) == Some("CrashLoopBackOff");
            c.is_some_and(|c| c.restart_count >= 3)
        },
        TIMEOUT,
    );
    assert!(saw_backoff, "CrashLoopBackOff was never the waiting reason");
    let all: Vec<cri::ContainerStatus> = seen.into_values().collect();
    let mut runs = named(&all, "main");
    runs.sort_by_key(|r| r.created_at);
    assert!(runs.len() >= 4, "{runs:?}");
    // The gap between one run's end and the next run's start: the first restart is immediate,
    // then 10 s, then 20 s (the kubelet's `doBackOff`).
    let gap = |i: usize| secs(runs[i + 1].started_at - runs[i].finished_at);
    let gaps: Vec<f64> = (0..3).map(gap).collect();
    assert!(gaps[0] < 9.0, "first restart should not wait: {gaps:?}");
    assert!(gaps[1] >= 9.5, "second restart waits 10 s: {gaps:?}");
    assert!(gaps[2] >= 19.5, "third restart waits 20 s: {gaps:?}");
    assert!(gaps[2] > gaps[1], "{gaps:?}");
}

#[test]
fn spec_change_restarts_and_label_change_does_not() {
    let Some(agent) = start("spec-change") else {
        return;
    };
    let loop_script = "trap 'exit 0' TERM; while true; do sleep 1; done";
    agent.write_manifest(
        "web.yaml",
        &manifest(&agent, "web", "Always", loop_script, ""),
    );
    let pod = agent.static_pod_name("web");
    let running = |l: &PodList| {
        status(l, &pod, "main")
            .is_some_and(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
    };
    let list = agent.wait_for(running, TIMEOUT);
    let uid = list.uid(&pod).expect("uid").to_owned();
    let updates = |agent: &Agent| -> u64 {
        let (_, body) = agent.get("/metrics");
        body.lines()
            .find(|l| {
                l.starts_with("swiftlet_pod_worker_duration_seconds_count")
                    && l.contains("operation=\"update\"")
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let before = updates(&agent);

    // A label change: synced, but the container keeps running.
    let labelled = manifest(&agent, "web", "Always", loop_script, "").replace(
        "namespace: default,",
        "namespace: default, labels: {tier: front},",
    );
    assert!(labelled.contains("tier: front"));
    agent.write_manifest("web.yaml", &labelled);
    let deadline = Instant::now() + TIMEOUT;
    while updates(&agent) <= before {
        assert!(
            Instant::now() < deadline,
            "the label change was never synced"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let all = cri_statuses(agent.endpoint(), &uid);
    assert_eq!(all.len(), 1, "a label change must not restart: {all:?}");
    assert_eq!(all[0].state, cri::ContainerState::ContainerRunning as i32);

    // A command change: the container is replaced.
    let changed = labelled.replace(
        "while true; do sleep 1; done",
        "while true; do sleep 2; done",
    );
    agent.write_manifest("web.yaml", &changed);
    let list = agent.wait_for(
        |l| running(l) && status(l, &pod, "main").is_some_and(|c| c.restart_count == 1),
        TIMEOUT,
    );
    assert_eq!(list.uid(&pod), Some(uid.as_str()), "same pod");
    let all = cri_statuses(agent.endpoint(), &uid);
    assert_eq!(all.len(), 2, "{all:?}");
    assert_eq!(all[0].state, cri::ContainerState::ContainerExited as i32);
    assert_eq!(all[1].state, cri::ContainerState::ContainerRunning as i32);
}

#[test]
fn init_containers_run_in_order_before_app_containers() {
    let Some(agent) = start("init-order") else {
        return;
    };
    let node = agent.node_name().to_owned();
    let text = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: init
  namespace: default
  uid: init-{node}
spec:
  terminationGracePeriodSeconds: 5
  initContainers:
  - name: first
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: Never
    command: ["sh", "-c", "sleep 1"]
  - name: side
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: Never
    restartPolicy: Always
    command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]
  - name: second
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: Never
    command: ["sh", "-c", "sleep 1"]
  containers:
  - name: main
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: Never
    command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]
"#
    );
    agent.write_manifest("init.yaml", &text);
    let pod = agent.static_pod_name("init");
    let mut saw_pending = false;
    let list = agent.wait_for(
        |l| {
            saw_pending |= l.phase(&pod) == Some("Pending");
            l.is_running(&pod)
                && status(l, &pod, "main").is_some_and(|c| c.ready)
                && init_status(l, &pod, "side").is_some_and(|c| c.ready)
        },
        TIMEOUT,
    );
    assert!(saw_pending, "the pod is Pending while it initialises");
    for n in ["first", "second"] {
        let c = init_status(&list, &pod, n).expect("init status");
        assert_eq!(exit_code(c), Some(0), "{n}: {c:?}");
    }
    let uid = list.uid(&pod).expect("uid");
    let all = cri_statuses(agent.endpoint(), uid);
    let one = |n: &str| {
        let v = named(&all, n);
        assert_eq!(v.len(), 1, "{n} ran once: {all:?}");
        v[0].clone()
    };
    let (first, side, second, main) = (one("first"), one("side"), one("second"), one("main"));
    assert!(
        first.finished_at <= side.created_at,
        "first ends before side starts"
    );
    assert!(
        side.started_at <= second.created_at,
        "side runs before second starts"
    );
    assert!(
        second.finished_at <= main.created_at,
        "second ends before main starts"
    );
    assert_eq!(
        side.state,
        cri::ContainerState::ContainerRunning as i32,
        "the sidecar keeps running"
    );

    // Termination stops the app container before the sidecar.
    agent.remove_manifest("init.yaml");
    let deadline = Instant::now() + TIMEOUT;
    while pod_cri_objects(agent.endpoint(), uid)
        .map(|(s, c)| s.len() + c.len())
        .unwrap_or(1)
        > 0
    {
        assert!(Instant::now() < deadline, "the pod never went away");
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = agent.log();
    let stop_line = |name: &str| {
        log.lines().position(|l| {
            // The log may be coloured: match the quoted value, not `key=value`.
            l.contains("stopping container") && l.contains(&format!("\"{name}\""))
        })
    };
    let (main_at, side_at) = (stop_line("main"), stop_line("side"));
    assert!(
        main_at.is_some() && side_at.is_some(),
        "no stop lines in {}",
        agent.log_path().display()
    );
    assert!(
        main_at < side_at,
        "main must stop before the sidecar: {main_at:?} {side_at:?}"
    );
}

#[test]
fn missing_image_gives_err_image_pull_then_back_off() {
    let Some(agent) = start("missing-image") else {
        return;
    };
    let text = manifest(&agent, "ghost", "Always", "sleep 1000", "")
        .replace(BUSYBOX_IMAGE, "localhost:1/swiftlet/no-such-image:v1")
        .replace("imagePullPolicy: Never", "imagePullPolicy: IfNotPresent");
    agent.write_manifest("ghost.yaml", &text);
    let pod = agent.static_pod_name("ghost");
    let mut reasons = Vec::<String>::new();
    agent.wait_for(
        |l| {
            if let Some(r) = status(l, &pod, "main").and_then(waiting_reason)
                && reasons.last().map(String::as_str) != Some(r)
            {
                reasons.push(r.to_owned());
            }
            reasons.iter().any(|r| r == "ImagePullBackOff")
        },
        TIMEOUT,
    );
    let list = agent.pods();
    assert_eq!(list.phase(&pod), Some("Pending"), "{reasons:?}");
    assert!(
        reasons.iter().all(
            |r| ["ContainerCreating", "ErrImagePull", "ImagePullBackOff"].contains(&r.as_str())
        ),
        "{reasons:?}"
    );
    let uid = list.uid(&pod).expect("uid");
    assert!(
        cri_statuses(agent.endpoint(), uid).is_empty(),
        "no container was created"
    );
}

#[test]
fn termination_honours_grace_period_and_pre_stop_hook() {
    let Some(agent) = start("grace") else {
        return;
    };
    // Ignores SIGTERM: only SIGKILL at the end of the 3 s grace period stops it.
    let stubborn = manifest(
        &agent,
        "stubborn",
        "Always",
        "trap '' TERM; while true; do sleep 1; done",
        "",
    )
    .replace(
        "terminationGracePeriodSeconds: 5",
        "terminationGracePeriodSeconds: 3",
    );
    // Ignores SIGTERM too, but its preStop hook makes it exit long before its 60 s grace period.
    let hooked = manifest(
        &agent,
        "hooked",
        "Always",
        "trap '' TERM; while [ ! -f /tmp/stop ]; do sleep 0.2; done",
        "",
    )
    .replace(
        "terminationGracePeriodSeconds: 5",
        "terminationGracePeriodSeconds: 60",
    ) + "    lifecycle:\n      preStop:\n        exec:\n          command: [\"touch\", \"/tmp/stop\"]\n";
    agent.write_manifest("stubborn.yaml", &stubborn);
    agent.write_manifest("hooked.yaml", &hooked);
    let pods = [
        agent.static_pod_name("stubborn"),
        agent.static_pod_name("hooked"),
    ];
    let list = agent.wait_for(|l| pods.iter().all(|p| l.is_running(p)), TIMEOUT);
    let uids: Vec<String> = pods
        .iter()
        .map(|p| list.uid(p).expect("uid").to_owned())
        .collect();

    let gone_after = |file: &str, uid: &str| {
        let t0 = Instant::now();
        agent.remove_manifest(file);
        loop {
            let (sandboxes, containers) = pod_cri_objects(agent.endpoint(), uid).expect("CRI");
            if sandboxes.is_empty() && containers.is_empty() {
                return t0.elapsed();
            }
            assert!(t0.elapsed() < TIMEOUT, "{file}: pod never went away");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let stubborn_took = gone_after("stubborn.yaml", &uids[0]);
    assert!(
        stubborn_took >= Duration::from_millis(2900),
        "a container ignoring SIGTERM is stopped only after its 3 s grace: {stubborn_took:?}"
    );
    let hooked_took = gone_after("hooked.yaml", &uids[1]);
    assert!(
        hooked_took < Duration::from_secs(30),
        "the preStop hook should have made it exit well inside its 60 s grace: {hooked_took:?}"
    );
    assert!(
        agent.log().contains("preStop hook done"),
        "no preStop in the log"
    );
}

#[test]
fn sigkilled_agent_adopts_running_pods_without_restarts() {
    let Some(mut agent) = start("adoption") else {
        return;
    };
    let loop_script = "trap 'exit 0' TERM; while true; do sleep 1; done";
    for n in ["keep-a", "keep-b"] {
        agent.write_manifest(
            &format!("{n}.yaml"),
            &manifest(&agent, n, "Always", loop_script, ""),
        );
    }
    let pods = [
        agent.static_pod_name("keep-a"),
        agent.static_pod_name("keep-b"),
    ];
    let list = agent.wait_for(|l| pods.iter().all(|p| l.is_running(p)), TIMEOUT);
    let before: Vec<_> = pods
        .iter()
        .map(|p| {
            let uid = list.uid(p).expect("uid").to_owned();
            let objs = pod_cri_objects(agent.endpoint(), &uid).expect("CRI");
            (uid, objs)
        })
        .collect();

    agent.restart_after_sigkill();
    agent.wait_for(
        |l| {
            pods.iter()
                .all(|p| l.is_running(p) && status(l, p, "main").is_some_and(|c| c.ready))
        },
        TIMEOUT,
    );
    for (uid, (sandboxes, containers)) in &before {
        let (sb_after, c_after) = pod_cri_objects(agent.endpoint(), uid).expect("CRI");
        let ids = |v: &[cri::PodSandbox]| v.iter().map(|s| s.id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(&sb_after), ids(sandboxes), "no new sandbox for {uid}");
        let cids = |v: &[cri::Container]| v.iter().map(|c| c.id.clone()).collect::<Vec<_>>();
        assert_eq!(
            cids(&c_after),
            cids(containers),
            "no restarted container for {uid}"
        );
        assert!(
            c_after
                .iter()
                .all(|c| c.state == cri::ContainerState::ContainerRunning as i32),
            "{c_after:?}"
        );
    }
    let list = agent.pods();
    for p in &pods {
        assert_eq!(
            status(&list, p, "main").map(|c| c.restart_count),
            Some(0),
            "{p}"
        );
    }
}

#[test]
fn container_output_lands_in_the_pods_log_directory() {
    let Some(agent) = start("logs") else {
        return;
    };
    // The pod log directory is made while containerd runs the sandbox, not before: the
    // container's log file must still be there, in the kubelet's layout, with what it printed.
    let text = manifest(
        &agent,
        "talker",
        "Always",
        "echo hello-from-talker; sleep 1000",
        "",
    );
    agent.write_manifest("talker.yaml", &text);
    let pod = agent.static_pod_name("talker");
    let list = agent.wait_for(|l| l.phase(&pod) == Some("Running"), TIMEOUT);
    let uid = list.uid(&pod).expect("uid").to_owned();
    let dir = agent
        .root_dir()
        .join("pod-logs")
        .join(format!("default_{pod}_{uid}"));
    let file = dir.join("main").join("0.log");
    agent.eventually("the container's output in its log file", TIMEOUT, || {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        // CRI log format: <RFC3339 time> <stream> <P|F> <text>.
        if text
            .lines()
            .any(|l| l.ends_with(" stdout F hello-from-talker"))
        {
            Ok(())
        } else {
            Err(format!("{} holds {text:?}", file.display()))
        }
    });
    // Removing the pod removes its log directory.
    agent.remove_manifest("talker.yaml");
    agent.wait_until_gone("the pod's log directory", &dir, TIMEOUT);
}

#[test]
fn termination_messages_come_from_the_file_and_with_fallback_from_the_log() {
    let Some(agent) = start("term-message") else {
        return;
    };
    let node = agent.node_name().to_owned();
    let uid = format!("msg-{node}");
    // A non-root user writes the file (it is mounted writable by any user), then fails.
    let manifest = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: msg, namespace: default, uid: {uid}}}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 2
  containers:
  - name: file
    image: {image}
    imagePullPolicy: Never
    securityContext: {{runAsUser: 1000}}
    command: ["sh", "-c", "printf 'bye from file' > /dev/termination-log; exit 3"]
  - name: logs
    image: {image}
    imagePullPolicy: Never
    terminationMessagePath: /tmp/message
    terminationMessagePolicy: FallbackToLogsOnError
    command: ["sh", "-c", "echo first >&2; echo oops >&2; exit 1"]
"#,
        image = BUSYBOX_IMAGE
    );
    agent.write_manifest("msg.yaml", &manifest);
    let name = agent.static_pod_name("msg");
    let list = agent.wait_for(|l| l.phase(&name) == Some("Failed"), TIMEOUT);
    let message = |list: &swiftlet_tests::PodList, c: &str| {
        list.container(&name, c)
            .and_then(|s| s.state.as_ref())
            .and_then(|s| s.terminated.as_ref())
            .map(|t| (t.exit_code, t.message.clone()))
    };
    // The file's message is there from the first status showing the exit, even when that is
    // the kernel's (the runtime records exits later under load): the agent's record of the
    // start keeps the message file's mount.
    let file_message = Some((3, Some("bye from file".to_owned())));
    assert_eq!(
        message(&list, "file"),
        file_message,
        "the message file holds {:?}",
        std::fs::read_to_string(
            agent
                .root_dir()
                .join("pods")
                .join(&uid)
                .join("containers/file/0")
        ),
    );
    // The fallback reads the log the runtime writes, complete once the runtime recorded the
    // exit: the final status has it.
    agent.eventually("both termination messages", TIMEOUT, || {
        let list = agent.pods();
        let got = (message(&list, "file"), message(&list, "logs"));
        let want = (
            file_message.clone(),
            Some((1, Some("first\noops\n".to_owned()))),
        );
        if got == want {
            Ok(())
        } else {
            Err(format!("{got:?}"))
        }
    });
    let state_dir = agent.root_dir().join("pods").join(&uid);
    assert!(state_dir.is_dir(), "{}", state_dir.display());
    // The pod's directories are the kubelet's 0750: no other local user may rewrite a
    // container's termination-message file (0666, for the container's user) and so its status.
    use std::os::unix::fs::PermissionsExt as _;
    for dir in [
        state_dir.clone(),
        state_dir.join("containers"),
        state_dir.join("containers").join("file"),
    ] {
        let mode = std::fs::metadata(&dir)
            .expect("the pod's directory")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o750, "{}: {mode:o}", dir.display());
    }

    // The pod's files go with the pod.
    agent.remove_manifest("msg.yaml");
    agent.wait_until_gone("the pod's state directory", &state_dir, TIMEOUT);
}
