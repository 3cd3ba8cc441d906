//! `spec.activeDeadlineSeconds` end to end: static pods on the real containerd fail with reason
//! `DeadlineExceeded` at their deadline, are stopped and never restart; a shortened deadline, a
//! start time already past it and an agent restart (the start time recomputed from the runtime's
//! sandbox) fail the pod the same way. Each test runs its own agent and pod names.

use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use swiftlet_tests::{
    Agent, BUSYBOX_IMAGE, PodList, looping_pod_manifest, pod_cri_objects, script_pod_manifest,
    start_agent,
};

const RUNNING_TIMEOUT: Duration = Duration::from_secs(90);
/// How long after its deadline a pod may be reported failed: the worker's requeue at the
/// deadline is handed out by the sync loop's 1 s tick, then one sync (a CRI read) runs.
const REPORT_SLACK: Duration = Duration::from_secs(4);
const MESSAGE: &str = "Pod was active on the node longer than the specified deadline";

/// Phase, reason and message of pod `name`.
fn outcome(list: &PodList, name: &str) -> (String, String, String) {
    let st = list
        .get(name)
        .and_then(|p| p.status.clone())
        .unwrap_or_default();
    (
        st.phase.unwrap_or_default(),
        st.reason.unwrap_or_default(),
        st.message.unwrap_or_default(),
    )
}

fn deadline_exceeded(list: &PodList, name: &str) -> bool {
    outcome(list, name) == ("Failed".into(), "DeadlineExceeded".into(), MESSAGE.into())
}

fn start_time(list: &PodList, name: &str) -> Timestamp {
    list.get(name)
        .and_then(|p| p.status.as_ref()?.start_time.as_ref())
        .map(|t| t.0)
        .unwrap_or_else(|| panic!("{name} has no startTime: {}", list.summary()))
}

/// Waits for pod `pod` to fail its deadline, at most [`REPORT_SLACK`] after `since`, with its
/// start time at most `drift` away from `started`.
fn fails_within_slack(
    agent: &Agent,
    pod: &str,
    since: Instant,
    started: Timestamp,
    drift: SignedDuration,
) -> PodList {
    let failed = agent.wait_for(|l| deadline_exceeded(l, pod), Duration::from_secs(30));
    let took = since.elapsed();
    assert!(took <= REPORT_SLACK, "failed {took:?} after the change");
    let now_started = start_time(&failed, pod);
    assert!(
        now_started.duration_since(started).abs() <= drift,
        "the start time moved: {started} -> {now_started}"
    );
    failed
}

/// The pod's containers in the runtime, once none of them runs any more.
fn wait_stopped(agent: &Agent, uid: &str, timeout: Duration) -> Vec<cri::Container> {
    agent.eventually("the pod's containers to stop", timeout, || {
        let (sandboxes, containers) =
            pod_cri_objects(agent.endpoint(), uid).map_err(|e| e.to_string())?;
        let running = containers
            .iter()
            .any(|c| c.state != cri::ContainerState::ContainerExited as i32);
        let ready = sandboxes
            .iter()
            .any(|s| s.state == cri::PodSandboxState::SandboxReady as i32);
        if running || ready {
            Err(format!(
                "sandboxes {sandboxes:?}, containers {containers:?}"
            ))
        } else {
            Ok(containers)
        }
    })
}

/// `sleep 3600` under restart policy Always with an explicit UID (an edit updates the pod in
/// place) and `activeDeadlineSeconds: <secs>`.
fn deadline_manifest(agent: &Agent, name: &str, secs: i64) -> String {
    let extra = format!("  activeDeadlineSeconds: {secs}\n");
    script_pod_manifest(agent.node_name(), name, "Always", "sleep 3600", &extra)
}

/// A running pod from [`deadline_manifest`], as (pod name, UID, start time).
fn running_deadline_pod(agent: &Agent, name: &str, secs: i64) -> (String, String, Timestamp) {
    agent.write_manifest("p.yaml", &deadline_manifest(agent, name, secs));
    let pod = agent.static_pod_name(name);
    let list = agent.wait_for(|l| l.is_running(&pod), RUNNING_TIMEOUT);
    let uid = list.uid(&pod).expect("a UID").to_owned();
    let started = start_time(&list, &pod);
    (pod, uid, started)
}

#[test]
fn a_pod_past_its_active_deadline_fails_is_stopped_and_never_restarts() {
    let Some(agent) = start_agent("deadline") else {
        return;
    };
    let timed = "deadline-sleep";
    let plain = "deadline-none";
    agent.write_manifest("timed.yaml", &deadline_manifest(&agent, timed, 3));
    agent.write_manifest("plain.yaml", &looping_pod_manifest(plain, &[]));
    let (timed, plain) = (agent.static_pod_name(timed), agent.static_pod_name(plain));
    let timed = timed.as_str();
    let list = agent.wait_for(
        |l| l.is_running(timed) && l.is_running(&plain),
        RUNNING_TIMEOUT,
    );
    let uid = list.uid(timed).expect("a UID").to_owned();
    let started = start_time(&list, timed);

    let failed = agent.wait_for(|l| deadline_exceeded(l, timed), Duration::from_secs(30));
    let after = Timestamp::now().duration_since(started);
    assert!(
        after >= SignedDuration::from_secs(3),
        "failed {after:?} after its start"
    );
    assert!(
        after <= SignedDuration::from_secs(3) + SignedDuration::try_from(REPORT_SLACK).unwrap(),
        "reported {after:?} after its start, over 3 s + {REPORT_SLACK:?}"
    );
    assert_eq!(
        start_time(&failed, timed),
        started,
        "the start time never moves"
    );
    let st = failed
        .get(timed)
        .and_then(|p| p.status.clone())
        .unwrap_or_default();
    let ready = st.conditions.iter().flatten().find(|c| c.type_ == "Ready");
    assert_eq!(ready.and_then(|c| c.reason.as_deref()), Some("PodFailed"));

    // `sleep` as the container's first process ignores SIGTERM: it is killed at the end of the
    // pod's 5 s grace period, and the sandbox is stopped.
    let containers = wait_stopped(&agent, &uid, Duration::from_secs(20));
    assert_eq!(containers.len(), 1, "{containers:?}");
    let first = containers[0].id.clone();
    // Restart policy Always, but nothing restarts: the same one container, still Failed.
    std::thread::sleep(Duration::from_secs(4));
    let (_, containers) = pod_cri_objects(agent.endpoint(), &uid).expect("CRI");
    let ids: Vec<&str> = containers.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, [first.as_str()], "a container was started again");
    let list = agent.pods();
    assert!(
        deadline_exceeded(&list, timed),
        "{:?}",
        outcome(&list, timed)
    );
    let main = list.container(timed, "main").expect("main's status");
    assert_eq!(main.restart_count, 0);
    assert!(
        main.state.as_ref().is_some_and(|s| s.terminated.is_some()),
        "{main:?}"
    );
    assert!(
        agent.log().contains(&format!("pod failed: {MESSAGE}")),
        "no log line"
    );

    // The pod without the field keeps running.
    assert!(list.is_running(&plain), "{}", list.summary());
    assert_eq!(outcome(&list, &plain).1, "");
}

#[test]
fn a_shortened_deadline_fails_a_running_pod_at_its_next_sync() {
    let Some(agent) = start_agent("deadline-edit") else {
        return;
    };
    let name = "deadline-edit";
    let (pod, uid, started) = running_deadline_pod(&agent, name, 3600);
    std::thread::sleep(Duration::from_secs(3));
    assert!(agent.pods().is_running(&pod));

    // The same UID: the edit updates this pod instead of replacing it.
    agent.write_manifest("p.yaml", &deadline_manifest(&agent, name, 2));
    let failed = fails_within_slack(&agent, &pod, Instant::now(), started, SignedDuration::ZERO);
    assert_eq!(failed.uid(&pod), Some(uid.as_str()), "the same pod");
    wait_stopped(&agent, &uid, Duration::from_secs(20));
}

#[test]
fn a_pod_that_arrives_past_its_deadline_fails_at_once_without_running() {
    let Some(agent) = start_agent("deadline-late") else {
        return;
    };
    let name = "deadline-late";
    // A start time the pod brings in its status (as an API server's record of a pod does)
    // counts: an hour ago, with a 60 s deadline.
    let start = Timestamp::now() - SignedDuration::from_secs(3600);
    let manifest = format!(
        "{}status:\n  startTime: \"{start}\"\n",
        deadline_manifest(&agent, name, 60)
    );
    agent.write_manifest("p.yaml", &manifest);
    let pod = agent.static_pod_name(name);
    let failed = agent.wait_for(|l| deadline_exceeded(l, &pod), Duration::from_secs(30));
    let uid = failed.uid(&pod).expect("a UID").to_owned();
    assert_eq!(start_time(&failed, &pod).as_second(), start.as_second());
    // Nothing was created for it, and nothing is later.
    std::thread::sleep(Duration::from_secs(3));
    let (sandboxes, containers) = pod_cri_objects(agent.endpoint(), &uid).expect("CRI");
    assert!(
        sandboxes.is_empty() && containers.is_empty(),
        "{sandboxes:?} {containers:?}"
    );
    assert!(deadline_exceeded(&agent.pods(), &pod));
}

#[test]
fn after_an_agent_restart_the_deadline_counts_from_the_pods_sandbox() {
    let Some(mut agent) = start_agent("deadline-restart") else {
        return;
    };
    let (pod, uid, started) = running_deadline_pod(&agent, "deadline-restart", 6);
    // The agent dies before the deadline and comes back after it: the status it kept in
    // memory is gone, and the start time is the creation of the pod's sandbox.
    let pid = agent.pid().expect("the agent runs");
    // SAFETY: kill(2) on the agent process this test started; it is reaped by the restart.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) }, 0);
    let left = SignedDuration::from_secs(7) - Timestamp::now().duration_since(started);
    if left.is_positive() {
        std::thread::sleep(Duration::try_from(left).unwrap_or_default());
    }
    assert!(
        pod_cri_objects(agent.endpoint(), &uid)
            .expect("CRI")
            .1
            .iter()
            .all(|c| c.state == cri::ContainerState::ContainerRunning as i32),
        "the container ran on without the agent"
    );
    agent.restart_after_sigkill();
    // The start time is recomputed from the sandbox. The first status stamped "now" just before
    // the sandbox was created, and statuses carry whole seconds, so the two may straddle a
    // second boundary: one second of drift, no more.
    fails_within_slack(
        &agent,
        &pod,
        Instant::now(),
        started,
        SignedDuration::from_secs(1),
    );
    let containers = wait_stopped(&agent, &uid, Duration::from_secs(20));
    assert_eq!(containers.len(), 1, "{containers:?}");
}

#[test]
fn a_pod_stuck_in_its_init_container_fails_its_deadline_the_same_way() {
    let Some(agent) = start_agent("deadline-init") else {
        return;
    };
    let name = "deadline-init";
    let init = format!(
        "  activeDeadlineSeconds: 3\n  initContainers:\n  - name: init\n    image: {BUSYBOX_IMAGE}\n    imagePullPolicy: Never\n    command: [\"sleep\", \"3600\"]\n"
    );
    let manifest = script_pod_manifest(agent.node_name(), name, "Always", "sleep 3600", &init);
    agent.write_manifest("p.yaml", &manifest);
    let pod = agent.static_pod_name(name);
    let init_running = |l: &PodList| {
        let st = l.get(&pod).and_then(|p| p.status.as_ref());
        st.and_then(|s| s.init_container_statuses.as_ref())
            .and_then(|c| c.first()?.state.as_ref()?.running.as_ref())
            .is_some()
    };
    let list = agent.wait_for(init_running, RUNNING_TIMEOUT);
    assert_eq!(list.phase(&pod), Some("Pending"));
    let uid = list.uid(&pod).expect("a UID").to_owned();
    let started = start_time(&list, &pod);
    let since = Instant::now()
        + Duration::try_from(
            SignedDuration::from_secs(3) - Timestamp::now().duration_since(started),
        )
        .unwrap_or_default();
    fails_within_slack(&agent, &pod, since, started, SignedDuration::ZERO);
    // The init container is stopped and the app container never ran.
    let containers = wait_stopped(&agent, &uid, Duration::from_secs(20));
    let names: Vec<&str> = containers
        .iter()
        .filter_map(|c| c.metadata.as_ref().map(|m| m.name.as_str()))
        .collect();
    assert_eq!(names, ["init"], "{containers:?}");
}
