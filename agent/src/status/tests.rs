//! Tests of the status: generation (phase, conditions, container statuses) and the manager.
use super::generate::*;
use super::*;
use crate::config::PodRef;
use crate::pod::{PodState, RestartPolicy, labels};
use k8s_cri::v1 as api;
use k8s_openapi::api::core::v1::{
    Container, ContainerStatus, Pod, PodCondition, PodStatus, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use std::collections::HashMap;
use std::sync::Arc;

/// A registry (the sync loop's side) and a status manager reading it.
fn manager() -> (crate::pod_registry::PodRegistry, StatusManager) {
    let r = crate::pod_registry::PodRegistry::new();
    let m = StatusManager::new(
        crate::metrics::Metrics::new(),
        r.reader(),
        crate::pod::probe_results::Results::default(),
        vec![
            "192.0.2.10".parse().unwrap(),
            "2001:db8::10".parse().unwrap(),
        ],
    );
    (r, m)
}

#[test]
fn phases() {
    // (waiting, running, stopped, succeeded, policy)
    assert_eq!(pod_phase(1, 1, 0, 0, RestartPolicy::Always), Phase::Pending);
    assert_eq!(pod_phase(0, 2, 0, 0, RestartPolicy::Always), Phase::Running);
    assert_eq!(pod_phase(0, 0, 1, 0, RestartPolicy::Always), Phase::Running);
    assert_eq!(
        pod_phase(0, 0, 1, 1, RestartPolicy::Never),
        Phase::Succeeded
    );
    assert_eq!(pod_phase(0, 0, 2, 1, RestartPolicy::Never), Phase::Failed);
    assert_eq!(pod_phase(0, 1, 1, 0, RestartPolicy::Never), Phase::Running);
    assert_eq!(
        pod_phase(0, 0, 1, 0, RestartPolicy::OnFailure),
        Phase::Running
    );
    assert_eq!(
        pod_phase(0, 0, 1, 1, RestartPolicy::OnFailure),
        Phase::Succeeded
    );
    assert_eq!(pod_phase(0, 0, 0, 0, RestartPolicy::Always), Phase::Pending);
}

fn spec(name: &str, sidecar: bool) -> Container {
    Container {
        name: name.into(),
        restart_policy: sidecar.then(|| "Always".into()),
        ..Default::default()
    }
}

fn pod(policy: &str, inits: Vec<Container>, apps: Vec<Container>) -> Pod {
    let mut p = Pod::default();
    p.metadata.uid = Some("u".into());
    p.spec = Some(k8s_openapi::api::core::v1::PodSpec {
        restart_policy: Some(policy.into()),
        init_containers: Some(inits),
        containers: apps,
        ..Default::default()
    });
    p
}

/// A runtime container `name` (restart `n`) in state `st`; newest first in the state.
fn inst(name: &str, n: u32, st: api::ContainerState, exit: i32) -> api::ContainerStatus {
    api::ContainerStatus {
        id: format!("{name}-{n}"),
        metadata: Some(api::ContainerMetadata {
            name: name.into(),
            attempt: n,
        }),
        state: st as i32,
        exit_code: exit,
        labels: [(labels::POD_UID.to_owned(), "u".to_owned())].into(),
        annotations: [(labels::CONTAINER_RESTART_COUNT.to_owned(), n.to_string())].into(),
        ..Default::default()
    }
}

fn state(containers: Vec<api::ContainerStatus>) -> PodState {
    PodState {
        containers,
        ..Default::default()
    }
}

use api::ContainerState::{ContainerExited as EXITED, ContainerRunning as RUNNING};

fn gen_state(p: &Pod, s: &PodState) -> PodStatus {
    generate(p, s, &HashMap::new(), None, &[])
}

fn status_of(p: &Pod, containers: Vec<api::ContainerStatus>) -> PodStatus {
    gen_state(p, &state(containers))
}

fn cond(s: &PodStatus, kind: &str) -> String {
    s.conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == kind)
        .map(|c| c.status.clone())
        .unwrap_or_default()
}

fn waiting_reason(s: &ContainerStatus) -> Option<&str> {
    s.state.as_ref()?.waiting.as_ref()?.reason.as_deref()
}

#[test]
fn init_container_running_keeps_pod_pending_and_apps_initializing() {
    let p = pod("Always", vec![spec("i", false)], vec![spec("a", false)]);
    let st = status_of(&p, vec![inst("i", 0, RUNNING, 0)]);
    assert_eq!(st.phase.as_deref(), Some("Pending"));
    assert_eq!(cond(&st, "Initialized"), "False");
    let inits = st.init_container_statuses.unwrap_or_default();
    assert!(inits[0].state.as_ref().is_some_and(|s| s.running.is_some()));
    let apps = st.container_statuses.unwrap_or_default();
    assert_eq!(waiting_reason(&apps[0]), Some("PodInitializing"));
}

#[test]
fn init_done_then_app_running() {
    let p = pod("Always", vec![spec("i", false)], vec![spec("a", false)]);
    let s = state(vec![inst("a", 0, RUNNING, 0), inst("i", 0, EXITED, 0)]);
    let st = gen_state(&p, &s);
    assert_eq!(st.phase.as_deref(), Some("Running"));
    assert_eq!(cond(&st, "Initialized"), "True");
    let inits = st.init_container_statuses.unwrap_or_default();
    let t = inits[0].state.as_ref().and_then(|s| s.terminated.as_ref());
    assert_eq!(t.and_then(|t| t.reason.as_deref()), Some("Completed"));
}

#[test]
fn failed_init_under_never_fails_the_pod() {
    let p = pod("Never", vec![spec("i", false)], vec![spec("a", false)]);
    let st = status_of(&p, vec![inst("i", 0, EXITED, 3)]);
    assert_eq!(st.phase.as_deref(), Some("Failed"));
    let p = pod("Always", vec![spec("i", false)], vec![spec("a", false)]);
    let st = status_of(&p, vec![inst("i", 0, EXITED, 3)]);
    assert_eq!(st.phase.as_deref(), Some("Pending"));
}

#[test]
fn crash_loop_shows_waiting_reason_and_last_state() {
    let p = pod("Always", vec![], vec![spec("a", false)]);
    let s = state(vec![inst("a", 2, EXITED, 1), inst("a", 1, EXITED, 1)]);
    let waiting = HashMap::from([(
        "a".to_owned(),
        ("CrashLoopBackOff".to_owned(), "back-off 20s".to_owned()),
    )]);
    let st = generate(&p, &s, &waiting, None, &[]);
    let c = &st.container_statuses.unwrap_or_default()[0];
    assert_eq!(waiting_reason(c), Some("CrashLoopBackOff"));
    assert_eq!(c.restart_count, 2);
    let last = c.last_state.as_ref().and_then(|l| l.terminated.as_ref());
    assert_eq!(last.map(|t| t.exit_code), Some(1));
    assert_eq!(
        last.and_then(|t| t.container_id.as_deref()),
        Some("containerd://a-2")
    );
    assert_eq!(st.phase.as_deref(), Some("Running"));
    // Running again: the last state is the previous run.
    let s = state(vec![inst("a", 3, RUNNING, 0), inst("a", 2, EXITED, 1)]);
    let st = gen_state(&p, &s);
    let c = &st.container_statuses.unwrap_or_default()[0];
    let last = c.last_state.as_ref().and_then(|l| l.terminated.as_ref());
    assert_eq!(
        last.and_then(|t| t.container_id.as_deref()),
        Some("containerd://a-2")
    );
}

#[test]
fn running_sidecar_counts_as_initialized_and_ready() {
    let p = pod("Always", vec![spec("s", true)], vec![spec("a", false)]);
    let s = state(vec![inst("a", 0, RUNNING, 0), inst("s", 0, RUNNING, 0)]);
    let st = gen_state(&p, &s);
    assert_eq!(st.phase.as_deref(), Some("Running"));
    assert_eq!(cond(&st, "Ready"), "True");
    let s = state(vec![inst("a", 0, RUNNING, 0), inst("s", 0, EXITED, 1)]);
    let st = gen_state(&p, &s);
    assert_eq!(
        cond(&st, "Ready"),
        "False",
        "a stopped sidecar is not ready"
    );
}

#[test]
fn image_pull_errors_are_the_waiting_reason() {
    let p = pod("Always", vec![], vec![spec("a", false)]);
    let waiting = HashMap::from([(
        "a".to_owned(),
        ("ImagePullBackOff".to_owned(), "back-off".to_owned()),
    )]);
    let st = generate(&p, &PodState::default(), &waiting, None, &[]);
    let c = &st.container_statuses.unwrap_or_default()[0];
    assert_eq!(waiting_reason(c), Some("ImagePullBackOff"));
    assert_eq!(st.phase.as_deref(), Some("Pending"));
}

fn sandboxed(ready: bool, containers: Vec<api::ContainerStatus>) -> PodState {
    let state = if ready {
        api::PodSandboxState::SandboxReady
    } else {
        api::PodSandboxState::SandboxNotready
    } as i32;
    PodState {
        sandboxes: vec![api::PodSandbox {
            id: "sb".into(),
            state,
            created_at: 1_000_000_000,
            ..Default::default()
        }],
        sandbox_status: Some(api::PodSandboxStatus {
            id: "sb".into(),
            state,
            network: ready.then(|| api::PodSandboxNetworkStatus {
                ip: "10.0.0.7".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        containers,
        ..Default::default()
    }
}

fn full_cond(s: &PodStatus, kind: &str) -> PodCondition {
    s.conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == kind)
        .cloned()
        .unwrap_or_default()
}

/// (status, reason, message) of a condition.
fn cond_of(s: &PodStatus, kind: &str) -> (String, Option<String>, Option<String>) {
    let c = full_cond(s, kind);
    (c.status, c.reason, c.message)
}

fn f(reason: &str, message: Option<&str>) -> (String, Option<String>, Option<String>) {
    (
        "False".into(),
        Some(reason.into()),
        message.map(str::to_owned),
    )
}

fn t() -> (String, Option<String>, Option<String>) {
    ("True".into(), None, None)
}

#[test]
fn conditions_follow_an_init_container_and_an_app_that_exits() {
    let p = pod("Never", vec![spec("i", false)], vec![spec("a", false)]);
    // Nothing in the runtime yet.
    let s0 = gen_state(&p, &PodState::default());
    assert_eq!(s0.phase.as_deref(), Some("Pending"));
    assert_eq!(
        cond_of(&s0, "PodReadyToStartContainers"),
        ("False".into(), None, None)
    );
    assert_eq!(
        cond_of(&s0, "Initialized"),
        f(
            "ContainersNotInitialized",
            Some("containers with incomplete status: [i]")
        )
    );
    let unready = f(
        "ContainersNotReady",
        Some("containers with unready status: [a]"),
    );
    assert_eq!(cond_of(&s0, "ContainersReady"), unready);
    assert_eq!(cond_of(&s0, "Ready"), unready);
    assert_eq!(cond_of(&s0, "PodScheduled"), t());
    let apps = s0.container_statuses.clone().unwrap_or_default();
    assert_eq!(waiting_reason(&apps[0]), Some("PodInitializing"));

    // Sandbox up, init container running.
    let s1 = gen_state(&p, &sandboxed(true, vec![inst("i", 0, RUNNING, 0)]));
    assert_eq!(cond_of(&s1, "PodReadyToStartContainers"), t());
    assert_eq!(cond_of(&s1, "Initialized").0, "False");
    assert_eq!(s1.phase.as_deref(), Some("Pending"));
    assert_eq!(s1.pod_ip.as_deref(), Some("10.0.0.7"));

    // Init done, app running.
    let s2 = gen_state(
        &p,
        &sandboxed(
            true,
            vec![inst("a", 0, RUNNING, 0), inst("i", 0, EXITED, 0)],
        ),
    );
    assert_eq!(s2.phase.as_deref(), Some("Running"));
    for kind in ["Initialized", "ContainersReady", "Ready", "PodScheduled"] {
        assert_eq!(cond_of(&s2, kind), t(), "{kind}");
    }

    // App exited 3 under Never: Failed; the sandbox is stopped, the pod keeps its IP.
    let done = vec![inst("a", 0, EXITED, 3), inst("i", 0, EXITED, 0)];
    let s3 = generate(&p, &sandboxed(false, done), &HashMap::new(), Some(&s2), &[]);
    assert_eq!(s3.phase.as_deref(), Some("Failed"));
    assert_eq!(cond_of(&s3, "ContainersReady"), f("PodFailed", None));
    assert_eq!(cond_of(&s3, "Ready"), f("PodFailed", None));
    assert_eq!(cond_of(&s3, "Initialized"), t());
    assert_eq!(cond_of(&s3, "PodReadyToStartContainers").0, "False");
    assert_eq!(s3.pod_ip.as_deref(), Some("10.0.0.7"));
    let a = &s3.container_statuses.unwrap_or_default()[0];
    let term = a.state.as_ref().and_then(|s| s.terminated.as_ref());
    assert_eq!(term.map(|t| t.exit_code), Some(3));
    assert_eq!(term.and_then(|t| t.reason.as_deref()), Some("Error"));
    assert!(!a.ready);

    // Exit 0 instead: Succeeded, Initialized carries PodCompleted.
    let ok = vec![inst("a", 0, EXITED, 0), inst("i", 0, EXITED, 0)];
    let s4 = gen_state(&p, &sandboxed(false, ok));
    assert_eq!(s4.phase.as_deref(), Some("Succeeded"));
    assert_eq!(
        cond_of(&s4, "Initialized"),
        ("True".into(), Some("PodCompleted".into()), None)
    );
    assert_eq!(cond_of(&s4, "ContainersReady"), f("PodCompleted", None));
}

#[test]
fn transition_time_changes_only_on_a_transition() {
    let p = pod("Always", vec![], vec![spec("a", false)]);
    let old = Time(Timestamp::from_second(1_000_000).unwrap_or(Timestamp::UNIX_EPOCH));
    let mut prev = gen_state(&p, &sandboxed(true, vec![inst("a", 0, RUNNING, 0)]));
    for c in prev.conditions.iter_mut().flatten() {
        c.last_transition_time = Some(old.clone());
    }
    let next = |prev: &PodStatus, c: api::ContainerStatus| {
        generate(
            &p,
            &sandboxed(true, vec![c]),
            &HashMap::new(),
            Some(prev),
            &[],
        )
    };
    // Same values: every time is kept.
    let same = next(&prev, inst("a", 0, RUNNING, 0));
    for c in same.conditions.iter().flatten() {
        assert_eq!(c.last_transition_time.as_ref(), Some(&old), "{}", c.type_);
    }
    // The container exits: Ready and ContainersReady move, the others keep their time.
    let exited = next(&same, inst("a", 0, EXITED, 1));
    for c in exited.conditions.iter().flatten() {
        let moved = matches!(c.type_.as_str(), "Ready" | "ContainersReady");
        assert_eq!(c.status == "False", moved, "{}", c.type_);
        assert_eq!(
            c.last_transition_time.as_ref() != Some(&old),
            moved,
            "{}",
            c.type_
        );
    }
    assert_eq!(
        exited.phase.as_deref(),
        Some("Running"),
        "Always restarts it"
    );
}

#[test]
fn readiness_gates_hold_ready_back() {
    let mut p = pod("Always", vec![], vec![spec("a", false)]);
    if let Some(s) = p.spec.as_mut() {
        s.readiness_gates = Some(vec![k8s_openapi::api::core::v1::PodReadinessGate {
            condition_type: "example.com/lb".into(),
        }]);
    }
    let s = sandboxed(true, vec![inst("a", 0, RUNNING, 0)]);
    let st = gen_state(&p, &s);
    assert_eq!(cond_of(&st, "ContainersReady"), t());
    assert_eq!(
        cond_of(&st, "Ready"),
        f(
            "ReadinessGatesNotReady",
            Some(
                "corresponding condition of pod readiness gate \"example.com/lb\" does not exist."
            )
        )
    );
    p.status = Some(PodStatus {
        conditions: Some(vec![PodCondition {
            type_: "example.com/lb".into(),
            status: "True".into(),
            ..Default::default()
        }]),
        ..Default::default()
    });
    assert_eq!(cond_of(&gen_state(&p, &s), "Ready"), t());
}

#[test]
fn sidecar_not_started_keeps_pod_pending_and_uninitialized() {
    let p = pod("Always", vec![spec("s", true)], vec![spec("a", false)]);
    let st = gen_state(&p, &sandboxed(true, vec![]));
    assert_eq!(st.phase.as_deref(), Some("Pending"));
    assert_eq!(
        cond_of(&st, "Initialized"),
        f(
            "ContainersNotInitialized",
            Some("containers with incomplete status: [s]")
        )
    );
    assert_eq!(
        cond_of(&st, "ContainersReady").2.as_deref(),
        Some("containers with unready status: [s a]")
    );
}

#[test]
fn pods_json_is_the_pod_list_and_follows_every_change() {
    let (r, m) = manager();
    let as_list = |m: &StatusManager| {
        serde_json::to_value(k8s_openapi::List {
            items: m.pods(),
            ..Default::default()
        })
        .unwrap_or_default()
    };
    let served = |m: &StatusManager| {
        serde_json::from_slice::<serde_json::Value>(&m.pods_json()).unwrap_or_default()
    };
    assert_eq!(served(&m), as_list(&m), "no pods");
    r.set_pod("u", Arc::new(pod("Always", vec![], vec![spec("a", false)])));
    assert_eq!(served(&m), as_list(&m), "a pending pod");
    let first = m.pods_json();
    assert!(
        first.as_ptr() == m.pods_json().as_ptr(),
        "unchanged: the same bytes again"
    );
    let running = sandboxed(true, vec![inst("a", 0, RUNNING, 0)]);
    m.update("u", &running, &HashMap::new());
    assert_eq!(served(&m), as_list(&m), "after an update");
    assert_eq!(served(&m)["items"][0]["status"]["phase"], "Running");
    // Writes that change nothing shown keep the served bytes.
    let after_update = m.pods_json();
    m.update("u", &running, &HashMap::new());
    r.set_pod("u", Arc::new(pod("Always", vec![], vec![spec("a", false)])));
    r.remove_pod("nobody");
    assert!(
        after_update.as_ptr() == m.pods_json().as_ptr(),
        "writes that change nothing shown keep the served bytes"
    );
    r.set_pod("u", Arc::new(pod("Never", vec![], vec![spec("a", false)])));
    assert_eq!(served(&m), as_list(&m), "after the pod changed");
    assert_eq!(served(&m)["items"][0]["spec"]["restartPolicy"], "Never");
    r.set_pod("u", Arc::new(pod("Always", vec![], vec![spec("a", false)])));
    let restarted = sandboxed(
        true,
        vec![inst("a", 1, RUNNING, 0), inst("a", 0, EXITED, 1)],
    );
    m.update("u", &restarted, &HashMap::new());
    assert_eq!(served(&m), as_list(&m), "after a restart");
    let mut exited = restarted.clone();
    assert!(exited.apply_kernel_exit("a-1", 2, i64::MAX, false));
    m.update("u", &exited, &HashMap::new());
    assert_eq!(served(&m), as_list(&m), "after a kernel-seen exit");
    r.remove_pod("u");
    assert_eq!(served(&m)["items"], serde_json::json!([]), "removed");
}

#[test]
fn a_kernel_seen_exit_shows_until_the_runtime_reports_it() {
    let (r, m) = manager();
    r.set_pod("u", Arc::new(pod("Never", vec![], vec![spec("a", false)])));
    let mut a = inst("a", 0, RUNNING, 0);
    a.started_at = 4_000_000_000;
    let running = sandboxed(true, vec![a]);
    m.update("u", &running, &HashMap::new());
    let term = |m: &StatusManager| {
        let st = m.status("u").unwrap_or_default();
        let c = st.container_statuses.unwrap_or_default().remove(0);
        let t = c.state.and_then(|s| s.terminated);
        (st.phase, t.map(|t| (t.exit_code, t.reason, t.finished_at)))
    };
    // What the worker writes: the runtime's read with the kernel-seen exit laid over it.
    let mut seen = running.clone();
    assert!(seen.apply_kernel_exit("a-0", 3, 5_000_000_000, false));
    m.update("u", &seen, &HashMap::new());
    let finished = ts(5_000_000_000);
    assert_eq!(
        term(&m),
        (
            Some("Failed".into()),
            Some((3, Some("Error".into()), finished.clone()))
        )
    );
    // The runtime's record replaces it once it has one.
    let mut exited = inst("a", 0, EXITED, 3);
    exited.reason = "OOMKilled".into();
    exited.finished_at = 5_001_000_000;
    m.update("u", &sandboxed(true, vec![exited]), &HashMap::new());
    assert_eq!(
        term(&m).1,
        Some((3, Some("OOMKilled".into()), ts(5_001_000_000)))
    );
}

#[test]
fn resize_shows_applied_resources_and_a_refusal() {
    let mut c = spec("a", false);
    let q = |v: &str| Quantity(v.to_owned());
    c.resources = Some(ResourceRequirements {
        requests: Some([("cpu".to_owned(), q("300m"))].into()),
        limits: Some([("memory".to_owned(), q("96Mi"))].into()),
        ..Default::default()
    });
    let p = pod("Always", vec![], vec![c.clone()]);
    let mut running = inst("a", 0, api::ContainerState::ContainerRunning, 0);
    // Applied as the spec says: the spec's quantities.
    let wanted = crate::cm::container_resources(&c).unwrap();
    running.annotations.insert(
        labels::CONTAINER_RESOURCES.to_owned(),
        crate::cm::resources_label(&wanted),
    );
    let st = status_of(&p, vec![running.clone()]);
    let cs = &st.container_statuses.unwrap()[0];
    assert_eq!(cs.resources, c.resources);
    assert_eq!(
        cs.allocated_resources,
        Some([("cpu".to_owned(), q("300m"))].into())
    );
    // Still the old values (102 shares, 128 MiB): read back from the cgroup numbers.
    running.annotations.insert(
        labels::CONTAINER_RESOURCES.to_owned(),
        format!("102 0 0 {}", 128u64 << 20),
    );
    let mut s = state(vec![running]);
    s.resize_error = Some("pod memory limit 1 is below".to_owned());
    let st = gen_state(&p, &s);
    let r = st.container_statuses.unwrap()[0].resources.clone().unwrap();
    assert_eq!(r.requests.unwrap()["cpu"], q("100m"));
    assert_eq!(r.limits.unwrap()["memory"], q(&(128u64 << 20).to_string()));
    let cond = st
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "PodResizeInProgress")
        .unwrap();
    assert_eq!(
        (cond.status.as_str(), cond.reason.as_deref()),
        ("True", Some("Error"))
    );
}

#[test]
fn the_termination_message_comes_from_the_file_or_with_fallback_from_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let msg = dir.path().join("msg");
    let log = dir.path().join("0.log");
    let exited = |file: &str, exit: i32| {
        let mut n = inst("c", 0, api::ContainerState::ContainerExited, exit);
        n.annotations.insert(
            labels::TERMINATION_MESSAGE_PATH.to_owned(),
            "/dev/termination-log".to_owned(),
        );
        n.mounts = vec![api::Mount {
            container_path: "/dev/termination-log".into(),
            host_path: file.into(),
            ..Default::default()
        }];
        n.log_path = log.to_string_lossy().into_owned();
        n
    };
    let message =
        |c: &Container, n: &api::ContainerStatus| terminated(n, c).terminated.unwrap().message;
    let file_policy = spec("c", false);
    let fallback = Container {
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..spec("c", false)
    };
    std::fs::write(
        &log,
        "2026-11-25T10:00:00.000000000Z stdout F first\n\
         2026-11-25T10:00:00.100000000Z stderr P part \n\
         2026-11-25T10:00:00.200000000Z stderr F one\n",
    )
    .unwrap();
    let m = msg.to_string_lossy().into_owned();
    // The file's content wins; only its last 4096 bytes are kept.
    std::fs::write(&msg, format!("{}bye", "x".repeat(5000))).unwrap();
    let got = message(&fallback, &exited(&m, 3)).unwrap();
    assert_eq!(got.len(), MAX_TERMINATION_MESSAGE);
    assert!(got.ends_with("xbye"));
    // Empty file: nothing with policy File; the log's lines with the fallback on an error exit.
    std::fs::write(&msg, "").unwrap();
    assert_eq!(message(&file_policy, &exited(&m, 3)), None);
    assert_eq!(
        message(&fallback, &exited(&m, 3)).as_deref(),
        Some("first\npart one\n")
    );
    // No fallback for a clean exit.
    assert_eq!(message(&fallback, &exited(&m, 0)), None);
    // The runtime's own message comes first.
    let mut oom = exited(&m, 137);
    oom.message = "OOMKilled".into();
    std::fs::write(&msg, "out of memory").unwrap();
    assert_eq!(
        message(&file_policy, &oom).as_deref(),
        Some("OOMKilled: out of memory")
    );
}

fn with_deadline(mut p: Pod, secs: i64) -> Pod {
    if let Some(s) = p.spec.as_mut() {
        s.active_deadline_seconds = Some(secs);
    }
    p
}

/// A previous status that started `ago` seconds before now, in `phase`.
fn started_ago(ago: i64, phase: &str, reason: Option<&str>) -> PodStatus {
    let start = Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(ago);
    PodStatus {
        phase: Some(phase.into()),
        reason: reason.map(str::to_owned),
        start_time: Some(Time(start)),
        ..Default::default()
    }
}

fn reason_and_message(st: &PodStatus) -> (Option<&str>, Option<&str>) {
    (st.reason.as_deref(), st.message.as_deref())
}

/// The status generated after `prev`, checked for its phase, reason and message.
fn next_status(
    p: &Pod,
    s: &PodState,
    prev: &PodStatus,
    phase: &str,
    why: (Option<&str>, Option<&str>),
) -> PodStatus {
    let st = generate(p, s, &HashMap::new(), Some(prev), &[]);
    assert_eq!(st.phase.as_deref(), Some(phase));
    assert_eq!(reason_and_message(&st), why);
    st
}

const EXCEEDED: (Option<&str>, Option<&str>) = (
    Some("DeadlineExceeded"),
    Some("Pod was active on the node longer than the specified deadline"),
);

#[test]
fn a_pod_past_its_active_deadline_fails_with_deadline_exceeded() {
    let p = with_deadline(pod("Always", vec![], vec![spec("a", false)]), 3);
    let running = sandboxed(true, vec![inst("a", 0, RUNNING, 0)]);
    // Two seconds in: still running, no reason.
    let prev = started_ago(2, "Running", None);
    let st = next_status(&p, &running, &prev, "Running", (None, None));
    assert_eq!(st.start_time, prev.start_time, "the start time never moves");
    // Four seconds in: Failed while the container still runs, and the conditions follow.
    let prev = started_ago(4, "Running", None);
    let st = next_status(&p, &running, &prev, "Failed", EXCEEDED);
    assert_eq!(cond_of(&st, "ContainersReady"), f("PodFailed", None));
    assert_eq!(cond_of(&st, "Ready"), f("PodFailed", None));
    // Once its containers are stopped (under Always, getPhase alone would say Running again),
    // and even with the deadline gone from the spec, the phase never goes back.
    let stopped = sandboxed(false, vec![inst("a", 0, EXITED, 137)]);
    for p in [p.clone(), pod("Always", vec![], vec![spec("a", false)])] {
        next_status(&p, &stopped, &st, "Failed", EXCEEDED);
    }
    // Without the field, time does not matter.
    let plain = pod("Always", vec![], vec![spec("a", false)]);
    let prev = started_ago(100_000, "Running", None);
    next_status(&plain, &running, &prev, "Running", (None, None));
}

#[test]
fn a_pod_stuck_in_init_past_its_deadline_fails_the_same_way() {
    let p = with_deadline(
        pod("Always", vec![spec("i", false)], vec![spec("a", false)]),
        5,
    );
    let init_running = sandboxed(true, vec![inst("i", 0, RUNNING, 0)]);
    let prev = started_ago(6, "Pending", None);
    next_status(&p, &init_running, &prev, "Failed", EXCEEDED);
}

#[test]
fn a_pod_that_finished_otherwise_keeps_its_phase_past_the_deadline() {
    let p = with_deadline(pod("Never", vec![], vec![spec("a", false)]), 3);
    let done = sandboxed(false, vec![inst("a", 0, EXITED, 0)]);
    let prev = started_ago(10, "Succeeded", None);
    next_status(&p, &done, &prev, "Succeeded", (None, None));
    let failed = sandboxed(false, vec![inst("a", 0, EXITED, 2)]);
    let prev = started_ago(10, "Failed", None);
    next_status(&p, &failed, &prev, "Failed", (None, None));
}

#[test]
fn the_start_time_comes_from_the_status_then_the_pod_then_the_oldest_sandbox() {
    let p = with_deadline(pod("Always", vec![], vec![spec("a", false)]), 60);
    let mut running = sandboxed(true, vec![inst("a", 0, RUNNING, 0)]);
    // The oldest sandbox (last: newest first) gives the start after an agent restart.
    running.sandboxes.push(api::PodSandbox {
        id: "old".into(),
        created_at: 500_000_000,
        ..Default::default()
    });
    let st = gen_state(&p, &running);
    assert_eq!(st.start_time, ts(500_000_000));
    assert_eq!(st.phase.as_deref(), Some("Failed"), "started in 1970");
    // The API server's record of the pod wins over the runtime's.
    let mut from_api = p.clone();
    let recorded = started_ago(10, "Running", None).start_time;
    from_api.status = Some(PodStatus {
        start_time: recorded.clone(),
        ..Default::default()
    });
    let st = gen_state(&from_api, &running);
    assert_eq!(st.start_time, recorded);
    assert_eq!(st.phase.as_deref(), Some("Running"));
    // Nothing known: now, and the deadline has all its time left.
    let st = gen_state(&p, &state(vec![inst("a", 0, RUNNING, 0)]));
    let start = st.start_time.expect("a start time").0;
    assert!(Timestamp::now().duration_since(start).as_secs() < 5);
    assert_eq!(st.phase.as_deref(), Some("Running"));
}

#[test]
fn the_manager_counts_the_deadline_from_the_status_start_time() {
    use crate::pod::deadline::Deadline;
    let (r, m) = manager();
    let p = with_deadline(pod("Always", vec![], vec![spec("a", false)]), 30);
    r.set_pod("u", Arc::new(p.clone()));
    // Admitted, not synced yet: no start time.
    assert_eq!(m.active_deadline("u", &p), Deadline::NotStarted);
    m.update("u", &state(vec![inst("a", 0, RUNNING, 0)]), &HashMap::new());
    match m.active_deadline("u", &p) {
        Deadline::In(left) => assert!(left.as_secs() >= 25 && left.as_secs() <= 30, "{left:?}"),
        other => panic!("expected time left, got {other:?}"),
    }
    // A shortened deadline counts at once from the same start.
    let shorter = with_deadline(p.clone(), 1);
    r.set_pod("u", Arc::new(shorter.clone()));
    std::thread::sleep(std::time::Duration::from_millis(1_100));
    assert_eq!(m.active_deadline("u", &shorter), Deadline::Exceeded);
    m.update("u", &state(vec![inst("a", 0, RUNNING, 0)]), &HashMap::new());
    let st = m.status("u").unwrap_or_default();
    assert_eq!(st.phase.as_deref(), Some("Failed"));
    assert_eq!(reason_and_message(&st), EXCEEDED);
    assert!(m.is_terminal("u"));
    // A pod with no deadline.
    assert_eq!(
        m.active_deadline("u", &pod("Always", vec![], vec![spec("a", false)])),
        Deadline::Unset
    );
}

#[test]
fn rejected_pods_are_served_in_uid_order_beside_admitted_ones() {
    let (r, m) = manager();
    let served = |m: &StatusManager| {
        serde_json::from_slice::<serde_json::Value>(&m.pods_json()).unwrap_or_default()
    };
    let with_name = |name: &str, policy: &str| {
        let mut p = pod(policy, vec![], vec![spec("a", false)]);
        p.metadata.name = Some(name.to_owned());
        p
    };
    r.set_pod("b", Arc::new(with_name("admitted", "Always")));
    let packed = PodRef::packed(with_name("packed", "Never")).expect("packs");
    r.reject("a", packed, "OutOfpods", "no room");
    r.reject(
        "c",
        with_name("whole", "OnFailure").into(),
        "OutOfpods",
        "no room",
    );
    let list = served(&m);
    let items = list["items"].as_array().expect("items");
    let names: Vec<&str> = items
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(names, ["packed", "admitted", "whole"]);
    // A packed pod shows its spec, decoded, and its rejection.
    assert_eq!(items[0]["spec"]["restartPolicy"], "Never");
    assert_eq!(items[0]["status"]["phase"], "Failed");
    assert_eq!(items[0]["status"]["reason"], "OutOfpods");
    assert_eq!(items[0]["status"]["message"], "Pod was rejected: no room");
    assert_eq!(items[2]["spec"]["restartPolicy"], "OnFailure");
    // The same document as the owned pods serialise to.
    let owned = serde_json::to_value(k8s_openapi::List {
        items: m.pods(),
        ..Default::default()
    })
    .unwrap_or_default();
    assert_eq!(list, owned);
    // A rejected pod is never made desired by a set_pod, counts as finished, and goes away
    // with its removal.
    r.set_pod("a", Arc::new(with_name("packed", "Never")));
    assert!(m.registry().is_rejected("a"));
    assert!(m.is_terminal("a"));
    let uids = ["a", "b", "c"].map(String::from);
    assert_eq!(m.holding_resources(uids.iter()), [&uids[1]]);
    r.remove_pod("a");
    assert!(!m.knows("a"));
    assert_eq!(served(&m)["items"].as_array().map(Vec::len), Some(2));
}

#[test]
fn an_evicted_pod_fails_with_reason_evicted_and_stays_so() {
    let (r, m) = manager();
    r.set_pod("u", Arc::new(pod("Always", vec![], vec![spec("a", false)])));
    let running = sandboxed(true, vec![inst("a", 0, RUNNING, 0)]);
    m.update("u", &running, &HashMap::new());
    assert!(!m.is_evicted("u") && !m.is_terminal("u"));
    assert!(!m.evict("nobody", "x"));
    assert!(m.evict("u", "The node was low on resource: memory. "));
    assert!(!m.evict("u", "a second message") || m.is_evicted("u"));
    m.update("u", &running, &HashMap::new());
    let st = m.status("u").unwrap_or_default();
    assert_eq!(st.phase.as_deref(), Some("Failed"));
    assert_eq!(
        reason_and_message(&st),
        (
            Some("Evicted"),
            Some("The node was low on resource: memory. ")
        )
    );
    assert!(m.is_terminal("u"));
}

/// The change feed the API status writer reads: every pod that changed once, a terminated pod
/// flagged, nothing for a write that changes nothing.
#[tokio::test]
async fn changed_pods_are_fed_to_the_writer_once() {
    let (r, m) = manager();
    let changes = m.changes();
    let p = Arc::new(pod("Always", vec![], vec![spec("c", false)]));
    r.set_pod("u1", p.clone());
    r.set_pod("u2", p.clone());
    tokio::time::timeout(std::time::Duration::from_secs(1), changes.notified())
        .await
        .expect("a change wakes the writer");
    let names = |v: Vec<(String, std::time::Instant)>| -> Vec<String> {
        v.into_iter().map(|(u, _)| u).collect()
    };
    assert_eq!(names(m.take_changed()), ["u1", "u2"]);
    assert!(m.take_changed().is_empty(), "taken once");
    r.set_pod("u1", p.clone());
    assert!(m.take_changed().is_empty(), "the same pod is no change");
    let (_, _, terminated) = m.api_view("u1").expect("known");
    assert!(!terminated);
    m.terminated("u1");
    assert_eq!(names(m.take_changed()), ["u1"]);
    assert!(m.api_view("u1").expect("known").2);
    assert_eq!(m.uids(), ["u1", "u2"]);
}

/// A status belongs to its pod while the registry holds it as desired: a rejection of the same
/// UID hides it, and once forgotten a new admission starts from Pending again.
#[test]
fn a_status_counts_only_while_its_pod_is_desired() {
    let (r, m) = manager();
    let p = Arc::new(pod("Always", vec![], vec![spec("a", false)]));
    assert!(!m.evict("u", "x"), "not desired: nothing to evict");
    r.set_pod("u", p.clone());
    let phase = |m: &StatusManager| m.status("u").and_then(|s| s.phase);
    assert_eq!(phase(&m).as_deref(), Some("Pending"));
    let running = sandboxed(true, vec![inst("a", 0, RUNNING, 0)]);
    assert!(
        m.update("u", &running, &HashMap::new()),
        "first seen Running"
    );
    m.terminated("u");
    assert_eq!(m.running_count(), 1);
    r.reject("u", Pod::clone(&p).into(), "OutOfpods", "no room");
    assert_eq!(m.running_count(), 0, "the earlier status no longer counts");
    assert_eq!(phase(&m).as_deref(), Some("Failed"));
    assert!(!m.update("u", &running, &HashMap::new()));
    r.remove_pod("u");
    m.forget("u");
    assert!(m.status("u").is_none());
    r.set_pod("u", p);
    let (_, st, terminated) = m.api_view("u").expect("desired again");
    assert!(st.is_none(), "nothing computed yet");
    assert_eq!(phase(&m).as_deref(), Some("Pending"));
    assert!(!terminated, "a new admission starts afresh");
    assert!(
        m.update("u", &running, &HashMap::new()),
        "seen Running afresh"
    );
}

#[test]
fn host_ips_are_the_nodes_addresses_primary_first() {
    let (r, m) = manager();
    let ips = |s: &PodStatus| {
        let all: Vec<String> = s.host_ips.iter().flatten().map(|h| h.ip.clone()).collect();
        (s.host_ip.clone().unwrap_or_default(), all)
    };
    let node = (
        "192.0.2.10".to_owned(),
        vec!["192.0.2.10".to_owned(), "2001:db8::10".to_owned()],
    );
    r.set_pod("u", Arc::new(pod("Always", vec![], vec![spec("a", false)])));
    assert_eq!(ips(&m.pod_status("u").unwrap_or_default()), node, "pending");
    m.update(
        "u",
        &sandboxed(true, vec![inst("a", 0, RUNNING, 0)]),
        &HashMap::new(),
    );
    let running = m.pod_status("u").unwrap_or_default();
    assert_eq!(ips(&running), node, "running");
    assert_eq!(running.pod_ip.as_deref(), Some("10.0.0.7"));

    // A host-network pod's IP is the node's primary address.
    let mut host = pod("Always", vec![], vec![spec("a", false)]);
    if let Some(s) = host.spec.as_mut() {
        s.host_network = Some(true);
    }
    let mut state = sandboxed(true, vec![inst("a", 0, RUNNING, 0)]);
    if let Some(s) = state.sandbox_status.as_mut() {
        s.network = None;
    }
    let node_ips: Vec<std::net::IpAddr> = vec!["192.0.2.10".parse().unwrap()];
    let st = generate(&host, &state, &HashMap::new(), None, &node_ips);
    assert_eq!(st.pod_ip.as_deref(), Some("192.0.2.10"));
    assert_eq!(st.host_ip.as_deref(), Some("192.0.2.10"));
    // Without an address there is no host IP at all (not an empty list).
    let st = generate(&host, &state, &HashMap::new(), None, &[]);
    assert_eq!((st.host_ip, st.host_ips, st.pod_ip), (None, None, None));
}

#[test]
fn evicted_and_preempted_pods_carry_the_disruption_target_condition() {
    let (r, m) = manager();
    let target = |m: &StatusManager, uid: &str| {
        m.pod_status(uid)
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == DISRUPTION_TARGET)
            .map(|c| {
                (
                    c.status,
                    c.reason.unwrap_or_default(),
                    c.message.unwrap_or_default(),
                )
            })
    };
    let running = sandboxed(true, vec![inst("a", 0, RUNNING, 0)]);
    for uid in ["ev", "pre", "plain"] {
        r.set_pod(uid, Arc::new(pod("Always", vec![], vec![spec("a", false)])));
        m.update(uid, &running, &HashMap::new());
    }
    assert!(m.evict("ev", "The node was low on resource: memory."));
    assert!(m.evict_as("pre", PREEMPTING, PREEMPTED_MESSAGE));
    for uid in ["ev", "pre", "plain"] {
        m.update(uid, &running, &HashMap::new());
    }
    let by_kubelet = |msg: &str| {
        Some((
            "True".to_owned(),
            "TerminationByKubelet".to_owned(),
            msg.to_owned(),
        ))
    };
    assert_eq!(
        target(&m, "ev"),
        by_kubelet("The node was low on resource: memory.")
    );
    assert_eq!(target(&m, "pre"), by_kubelet(PREEMPTED_BY_KUBELET));
    assert_eq!(target(&m, "plain"), None);
}

/// After an agent restart a pod's status continues from the one the API server holds: a
/// finished pod whose containers are gone stays Failed with its reason and DisruptionTarget
/// condition, and a running pod keeps its start time and its conditions' transition times. Nothing
/// is offered to the API writer before the worker's first status.
#[test]
fn a_status_continues_from_the_api_servers_after_a_restart() {
    let (r, m) = manager();
    let t0 = Time(Timestamp::from_second(1_700_000_000).expect("a time"));
    let cond = |type_: &str, status: &str| PodCondition {
        type_: type_.into(),
        status: status.into(),
        last_transition_time: Some(t0.clone()),
        reason: (type_ == DISRUPTION_TARGET).then(|| "TerminationByKubelet".into()),
        ..Default::default()
    };
    let mut failed = pod("Always", vec![], vec![spec("a", false)]);
    failed.status = Some(PodStatus {
        phase: Some("Failed".into()),
        reason: Some(EVICTED.into()),
        message: Some("The node was low on resource: memory. ".into()),
        conditions: Some(vec![
            cond(DISRUPTION_TARGET, "True"),
            cond("Ready", "False"),
        ]),
        start_time: Some(t0.clone()),
        ..Default::default()
    });
    r.set_pod("f", Arc::new(failed));
    let phase = |uid| m.status(uid).and_then(|s| s.phase);
    assert_eq!(
        phase("f").as_deref(),
        Some("Failed"),
        "shown from the start"
    );
    assert!(
        m.api_view("f").expect("known").1.is_none(),
        "nothing to write"
    );
    // The runtime holds nothing of it any more.
    m.update("f", &PodState::default(), &HashMap::new());
    let st = m.api_view("f").expect("known").1.expect("computed");
    assert_eq!(st.phase.as_deref(), Some("Failed"));
    assert_eq!(st.reason.as_deref(), Some(EVICTED));
    assert_eq!(st.start_time.as_ref(), Some(&t0));
    let types: Vec<&str> = st
        .conditions
        .iter()
        .flatten()
        .map(|c| c.type_.as_str())
        .collect();
    assert!(types.contains(&DISRUPTION_TARGET), "{types:?}");

    let mut running = pod("Always", vec![], vec![spec("a", false)]);
    running.status = Some(PodStatus {
        phase: Some("Running".into()),
        conditions: Some(vec![cond("Ready", "True"), cond("ContainersReady", "True")]),
        start_time: Some(t0.clone()),
        ..Default::default()
    });
    r.set_pod("r", Arc::new(running));
    let state = sandboxed(true, vec![inst("a", 0, RUNNING, 0)]);
    m.update("r", &state, &HashMap::new());
    let st = m.api_view("r").expect("known").1.expect("computed");
    assert_eq!(st.phase.as_deref(), Some("Running"));
    assert_eq!(st.start_time.as_ref(), Some(&t0));
    let ready = st.conditions.iter().flatten().find(|c| c.type_ == "Ready");
    assert_eq!(
        ready.map(|c| (c.status.as_str(), c.last_transition_time.as_ref())),
        Some(("True", Some(&t0))),
        "no transition: its time stays"
    );
}
