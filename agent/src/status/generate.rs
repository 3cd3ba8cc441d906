//! A pod's status from what the runtime holds: the kubelet's `generateAPIPodStatus` (phase by
//! `getPhase`, the pod conditions with their reasons and messages, one status per container,
//! the resources applied by an in-place resize).
use crate::pod::is_sidecar;
use crate::pod::state::{ContainerIndex, Instances};
use crate::pod::{Phase, PodState, RestartPolicy, deadline, labels};
use k8s_cri::v1 as api;
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
    ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

pub(super) fn ts(nanos: i64) -> Option<Time> {
    (nanos > 0)
        .then(|| Timestamp::from_nanosecond(i128::from(nanos)).ok().map(Time))
        .flatten()
}

/// A condition's value: True, or False with the kubelet's reason and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Cond {
    ok: bool,
    reason: Option<&'static str>,
    message: Option<String>,
}

impl Cond {
    const TRUE: Cond = Cond {
        ok: true,
        reason: None,
        message: None,
    };

    fn from(ok: bool) -> Self {
        Cond { ok, ..Self::TRUE }
    }

    fn reason(ok: bool, reason: &'static str) -> Self {
        Cond {
            ok,
            reason: Some(reason),
            message: None,
        }
    }
}

pub(super) fn condition(kind: &str, c: Cond, prev: Option<&PodStatus>, now: &Time) -> PodCondition {
    let status = if c.ok { "True" } else { "False" };
    // Keep the transition time while the value stays the same (the status manager's
    // updateLastTransitionTime): reason or message changes are not transitions.
    let since = prev
        .and_then(|p| p.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == kind))
        .filter(|c| c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    PodCondition {
        type_: kind.to_owned(),
        status: status.to_owned(),
        last_transition_time: Some(since),
        reason: c.reason.map(str::to_owned),
        message: c.message,
        ..Default::default()
    }
}

pub(super) fn terminated(n: &api::ContainerStatus, c: &Container) -> ContainerState {
    let runtime_message = (!n.message.is_empty()).then(|| n.message.clone());
    let message = match (runtime_message, termination_message(n, c)) {
        (Some(r), Some(t)) => Some(format!("{r}: {t}")),
        (r, t) => r.or(t),
    };
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: n.exit_code,
            reason: Some(if n.reason.is_empty() {
                if n.exit_code == 0 {
                    "Completed".into()
                } else {
                    "Error".into()
                }
            } else {
                n.reason.clone()
            }),
            message,
            started_at: ts(n.started_at),
            finished_at: ts(n.finished_at),
            container_id: Some(format!("containerd://{}", n.id)),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The most of a termination message file that is read (its end), as the kubelet reads it.
pub const MAX_TERMINATION_MESSAGE: usize = 4096;
/// With `FallbackToLogsOnError`: the log's last lines and bytes that make the message.
pub const FALLBACK_LOG_LINES: usize = 80;
pub const FALLBACK_LOG_BYTES: usize = 2048;

/// What an exited container left as its termination message: the end of the file mounted at
/// its `terminationMessagePath` (found among the instance's mounts), or, with
/// `FallbackToLogsOnError`, an empty file and a non-zero exit, the end of its log.
fn termination_message(n: &api::ContainerStatus, c: &Container) -> Option<String> {
    let path = n.annotations.get(labels::TERMINATION_MESSAGE_PATH)?;
    let file = n.mounts.iter().find(|m| &m.container_path == path)?;
    let from_file = read_end(
        std::path::Path::new(&file.host_path),
        MAX_TERMINATION_MESSAGE,
    )
    .filter(|m| !m.is_empty());
    let fallback = c.termination_message_policy.as_deref() == Some("FallbackToLogsOnError")
        && n.exit_code != 0;
    match from_file {
        Some(m) => Some(m),
        None if fallback => last_log_lines(std::path::Path::new(&n.log_path)),
        None => None,
    }
}

/// The last `max` bytes of a file, as text (invalid UTF-8 replaced).
fn read_end(path: &std::path::Path, max: usize) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    let from = len.saturating_sub(max as u64);
    f.seek(SeekFrom::Start(from)).ok()?;
    let mut buf = Vec::with_capacity((len - from) as usize);
    f.take(max as u64).read_to_end(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// The content of the last [`FALLBACK_LOG_LINES`] lines of a CRI log file
/// (`<time> <stream> <P|F> <content>`, a `P` line continued by the next), cut to its last
/// [`FALLBACK_LOG_BYTES`] bytes.
fn last_log_lines(path: &std::path::Path) -> Option<String> {
    // Enough of the end for 80 lines of the message limit, with the per-line prefixes.
    const READ: usize = 64 * 1024;
    let tail = read_end(path, READ)?;
    let mut lines: Vec<&str> = tail.lines().collect();
    if std::fs::metadata(path).is_ok_and(|m| m.len() > READ as u64) && !lines.is_empty() {
        // The first line read is the end of a longer one.
        lines.remove(0);
    }
    let mut out = String::new();
    let start = lines.len().saturating_sub(FALLBACK_LOG_LINES);
    for line in &lines[start..] {
        let mut parts = line.splitn(4, ' ');
        let (_time, _stream, tag) = (parts.next(), parts.next(), parts.next());
        out.push_str(parts.next().unwrap_or(""));
        if tag != Some("P") {
            out.push('\n');
        }
    }
    let cut = out.len().saturating_sub(FALLBACK_LOG_BYTES);
    let cut = (cut..=out.len())
        .find(|&i| out.is_char_boundary(i))
        .unwrap_or(out.len());
    Some(out[cut..].to_owned()).filter(|m| !m.is_empty())
}

/// The status of one spec container from its two newest runtime instances: its state (a waiting
/// reason from `waiting` wins over an exited instance: that one is then the last state), the last
/// state (the previous instance's end), restart count, readiness (from `probes` when the
/// container has readiness or startup probes).
pub(super) fn container_status(
    c: &Container,
    index: &ContainerIndex<'_>,
    waiting: &HashMap<String, (String, String)>,
    default_reason: &str,
    probes: Option<&crate::pod::probe_results::Results>,
) -> ContainerStatus {
    let Instances {
        newest, previous, ..
    } = index.get(&c.name);
    let exited = |n: &api::ContainerStatus| n.state == api::ContainerState::ContainerExited as i32;
    let restart_count = newest
        .and_then(|n| n.annotations.get(labels::CONTAINER_RESTART_COUNT))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut st = ContainerStatus {
        name: c.name.clone(),
        image: c.image.clone().unwrap_or_default(),
        image_id: newest.map(|n| n.image_ref.clone()).unwrap_or_default(),
        container_id: newest.map(|n| format!("containerd://{}", n.id)),
        restart_count,
        ready: false,
        started: Some(false),
        ..Default::default()
    };
    let waiting_state = |reason: &str, message: Option<String>| ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.to_owned()),
            message,
        }),
        ..Default::default()
    };
    let reason = waiting.get(&c.name);
    let (now, last) = match newest {
        Some(n) if n.state == api::ContainerState::ContainerRunning as i32 => {
            let (ready, started) = probes.map_or((true, true), |p| p.ready_and_started(c, &n.id));
            st.ready = ready;
            st.started = Some(started);
            let running = ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: ts(n.started_at),
                }),
                ..Default::default()
            };
            (running, previous.filter(|p| exited(p)))
        }
        Some(n) if exited(n) && reason.is_none() => {
            (terminated(n, c), previous.filter(|p| exited(p)))
        }
        Some(n) => {
            let w = match reason {
                Some((r, m)) => waiting_state(r, Some(m.clone())),
                None => waiting_state(default_reason, None),
            };
            // Waiting to restart: the instance that ended is the last state.
            (
                w,
                Some(n)
                    .filter(|n| exited(n))
                    .or(previous.filter(|p| exited(p))),
            )
        }
        None => match reason {
            Some((r, m)) => (waiting_state(r, Some(m.clone())), None),
            None => (waiting_state(default_reason, None), None),
        },
    };
    st.state = Some(now);
    st.last_state = last.map(|l| terminated(l, c));
    st.allocated_resources = c.resources.as_ref().and_then(|r| r.requests.clone());
    st.resources = newest
        .filter(|n| n.state == api::ContainerState::ContainerRunning as i32)
        .and_then(|n| applied_resources(c, n));
    st
}

/// The resources a running container has now (`containerStatuses[].resources`): the spec's when
/// they are what is applied (created so, or resized in place), else the applied cgroup values read
/// back as quantities (a resize not done yet, or refused).
pub(super) fn applied_resources(
    c: &Container,
    n: &api::ContainerStatus,
) -> Option<ResourceRequirements> {
    let applied = n.annotations.get(labels::CONTAINER_RESOURCES)?;
    let wanted = crate::cm::container_resources(c).ok()?;
    if crate::cm::resources_label(&wanted) == *applied {
        return Some(c.resources.clone().unwrap_or_default());
    }
    // "shares quota period memory"
    let v: Vec<i64> = applied.split(' ').map(|v| v.parse().unwrap_or(0)).collect();
    let (shares, quota, period, memory) = (v.first()?, v.get(1)?, v.get(2)?, v.get(3)?);
    let q = |s: String| Quantity(s);
    let mut requests = BTreeMap::new();
    let mut limits = BTreeMap::new();
    if *shares > 2 {
        // SharesToMilliCPU: ceil(shares * 1000 / 1024).
        requests.insert(
            "cpu".to_owned(),
            q(format!("{}m", (shares * 1000 + 1023) / 1024)),
        );
    }
    if *quota > 0 && *period > 0 {
        limits.insert("cpu".to_owned(), q(format!("{}m", quota * 1000 / period)));
    }
    if *memory > 0 {
        limits.insert("memory".to_owned(), q(memory.to_string()));
    }
    if let Some(m) = c
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("memory"))
    {
        requests.insert("memory".to_owned(), m.clone());
    }
    Some(ResourceRequirements {
        requests: (!requests.is_empty()).then_some(requests),
        limits: (!limits.is_empty()).then_some(limits),
        ..Default::default()
    })
}

/// The reason of the Ready and ContainersReady conditions of a pod being killed.
pub const TERMINATING_REASON: &str = "PodTerminating";

/// The kubelet's rules for a status that follows `old` (the pod's last status; at first the one
/// its source gave it, the API server's after an agent restart): a terminal phase is never left
/// (`old`'s wins, else the one `pod` came with), whatever the runtime now holds (a restarted
/// agent finds a finished pod's containers removed); while the phase stays, so do its reason and
/// message when `status` has none; and the `DisruptionTarget` condition an eviction or a
/// preemption set stays.
pub(super) fn continue_from(status: &mut PodStatus, old: &PodStatus, pod: &Pod) {
    let terminal = |s: &PodStatus| Phase::of(s.phase.as_deref()).filter(|p| p.is_terminal());
    if terminal(status).is_none()
        && let Some(phase) = terminal(old).or(pod.status.as_ref().and_then(terminal))
    {
        status.phase = Some(phase.as_str().to_owned());
    }
    if status.phase == old.phase && status.reason.is_none() {
        status.reason.clone_from(&old.reason);
        status.message.clone_from(&old.message);
    }
    let target = |s: &PodStatus| {
        s.conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == DISRUPTION_TARGET)
            .cloned()
    };
    if target(status).is_none()
        && let Some(c) = target(old)
    {
        status.conditions.get_or_insert_with(Vec::new).push(c);
    }
}

/// A pod being killed: no container is ready, and the Ready and ContainersReady conditions turn
/// False with reason [`TERMINATING_REASON`] (their transition time kept when they already were).
/// The condition on a pod the node itself stops (evicted, preempted): Jobs' pod failure
/// policies and disruption budgets tell such failures from the pod's own by it.
pub const DISRUPTION_TARGET: &str = "DisruptionTarget";

/// Sets the pod's `DisruptionTarget` condition: True, reason `TerminationByKubelet`, `message`
/// saying why (replacing one the status had).
pub(super) fn disruption_target(status: &mut PodStatus, message: &str, prev: Option<&PodStatus>) {
    let value = Cond {
        ok: true,
        reason: Some("TerminationByKubelet"),
        message: Some(message.to_owned()),
    };
    let cond = condition(DISRUPTION_TARGET, value, prev, &Time(Timestamp::now()));
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    conditions.retain(|c| c.type_ != DISRUPTION_TARGET);
    conditions.push(cond);
}

pub(super) fn not_ready(status: &mut PodStatus, prev: Option<&PodStatus>) {
    let now = Time(Timestamp::now());
    for c in status
        .container_statuses
        .iter_mut()
        .chain(status.init_container_statuses.iter_mut())
        .flatten()
    {
        c.ready = false;
    }
    for cond in status.conditions.iter_mut().flatten() {
        if cond.type_ == "Ready" || cond.type_ == "ContainersReady" {
            let value = Cond {
                ok: false,
                reason: Some(TERMINATING_REASON),
                message: Some("the pod is being terminated".to_owned()),
            };
            *cond = condition(&cond.type_.clone(), value, prev, &now);
        }
    }
}

/// A refused or failed in-place resize: the `PodResizeInProgress` condition with reason `Error`
/// and the message, as the kubelet reports a resize it could not carry out.
pub(super) fn resize_condition(
    status: &mut PodStatus,
    state: &PodState,
    prev: Option<&PodStatus>,
    now: &Time,
) {
    let Some(message) = &state.resize_error else {
        return;
    };
    let cond = Cond {
        ok: true,
        reason: Some("Error"),
        message: Some(message.clone()),
    };
    let cond = condition("PodResizeInProgress", cond, prev, now);
    status.conditions.get_or_insert_with(Vec::new).push(cond);
}

/// `status.hostIPs`: every address of the node, primary first (`None` when it has none).
pub(super) fn host_ip_list(ips: &[IpAddr]) -> Option<Vec<HostIP>> {
    (!ips.is_empty()).then(|| ips.iter().map(|ip| HostIP { ip: ip.to_string() }).collect())
}

/// Builds a PodStatus (phase, conditions, init and app container statuses) from the spec and
/// runtime state, ignoring probes.
pub fn generate(
    pod: &Pod,
    state: &PodState,
    waiting: &HashMap<String, (String, String)>,
    prev: Option<&PodStatus>,
    host_ips: &[IpAddr],
) -> PodStatus {
    generate_probed(pod, state, waiting, prev, host_ips, None)
}

/// [`generate`] with readiness and startup probe results.
pub fn generate_probed(
    pod: &Pod,
    state: &PodState,
    waiting: &HashMap<String, (String, String)>,
    prev: Option<&PodStatus>,
    host_ips: &[IpAddr],
    probes: Option<&crate::pod::probe_results::Results>,
) -> PodStatus {
    let now = Time(Timestamp::now());
    let spec = pod.spec.as_ref();
    let spec_containers = spec.map(|s| s.containers.as_slice()).unwrap_or_default();
    let inits = spec
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default();
    let policy = RestartPolicy::of(pod);
    let uid = pod.metadata.uid.as_ref();
    let sandbox_id = state.ready_sandbox().map(|s| s.id.clone());

    // Containers the runtime does not hold yet wait for the pod's initialisation (when it has
    // init containers) or for their creation.
    let default_reason = if inits.is_empty() {
        "ContainerCreating"
    } else {
        "PodInitializing"
    };
    // The pod's own instances by name, in one pass (a scan per container would make a pod of n
    // containers cost O(n^2) per status).
    let index = state.index_where(|s| s.labels.get(labels::POD_UID) == uid);
    let init_statuses: Vec<ContainerStatus> = inits
        .iter()
        .map(|c| container_status(c, &index, waiting, default_reason, probes))
        .collect();
    let statuses: Vec<ContainerStatus> = spec_containers
        .iter()
        .map(|c| container_status(c, &index, waiting, default_reason, probes))
        .collect();
    let start_time = start_time(pod, state, prev).unwrap_or_else(|| now.clone());
    let past_deadline = fails_deadline(pod, &start_time, &now, prev);
    let phase = if past_deadline {
        Phase::Failed
    } else {
        get_phase(policy, inits, &init_statuses, &statuses)
    };
    let ready_to_start = !crate::pod::state::sandbox_changed(pod, state).0;
    let initialized = initialized_condition(inits, &init_statuses, &statuses, phase);
    let containers_ready =
        containers_ready_condition(inits, &init_statuses, spec_containers, &statuses, phase);
    let ready = ready_condition(pod, containers_ready.clone());
    let host_net = spec.and_then(|s| s.host_network).unwrap_or(false);
    let pod_ip = state
        .sandbox_status
        .as_ref()
        .filter(|s| s.state == api::PodSandboxState::SandboxReady as i32)
        .and_then(|s| s.network.as_ref())
        .map(|n| n.ip.clone())
        .filter(|ip| !ip.is_empty())
        .or_else(|| {
            (host_net && sandbox_id.is_some())
                .then(|| super::host_ip(host_ips))
                .flatten()
        })
        // A stopped sandbox has no IP any more: the pod keeps the one it had (as the kubelet).
        .or_else(|| prev.and_then(|p| p.pod_ip.clone()));
    let mut status = PodStatus {
        phase: Some(phase.as_str().to_owned()),
        conditions: Some(vec![
            condition(
                "PodReadyToStartContainers",
                Cond::from(ready_to_start),
                prev,
                &now,
            ),
            condition("Initialized", initialized, prev, &now),
            condition("Ready", ready, prev, &now),
            condition("ContainersReady", containers_ready, prev, &now),
            condition("PodScheduled", Cond::TRUE, prev, &now),
        ]),
        host_ip: super::host_ip(host_ips),
        host_ips: host_ip_list(host_ips),
        pod_ip: pod_ip.clone(),
        pod_ips: pod_ip.map(|ip| vec![PodIP { ip }]),
        qos_class: crate::pod::pod_qos(pod).ok().map(|q| q.as_str().to_owned()),
        start_time: Some(start_time),
        reason: past_deadline.then(|| deadline::REASON.to_owned()),
        message: past_deadline.then(|| deadline::MESSAGE.to_owned()),
        container_statuses: Some(statuses),
        init_container_statuses: (!init_statuses.is_empty()).then_some(init_statuses),
        ..Default::default()
    };
    resize_condition(&mut status, state, prev, &now);
    status
}

/// The pod's start time, which never changes once set: the one its status has, else the one
/// the pod came with (the API server's record of it, which outlives an agent restart, as the
/// kubelet's status manager starts from it), else the creation of the oldest sandbox the runtime
/// holds for it (a pod adopted after a restart of the agent; for a new pod, its first sandbox,
/// created on its first sync), else none yet (the caller uses now, the kubelet's first status).
pub(super) fn start_time(pod: &Pod, state: &PodState, prev: Option<&PodStatus>) -> Option<Time> {
    prev.and_then(|p| p.start_time.clone())
        .or_else(|| pod.status.as_ref().and_then(|s| s.start_time.clone()))
        .or_else(|| state.sandboxes.last().and_then(|s| ts(s.created_at)))
}

/// The kubelet's active deadline eviction: a pod past `startTime + activeDeadlineSeconds`
/// fails with reason `DeadlineExceeded`, whatever its containers do, and stays so. A pod that
/// had already finished otherwise (Succeeded, or Failed for another reason) keeps that.
pub(super) fn fails_deadline(
    pod: &Pod,
    start: &Time,
    now: &Time,
    prev: Option<&PodStatus>,
) -> bool {
    let prev_phase = prev.and_then(|p| Phase::of(p.phase.as_deref()));
    let prev_reason = prev.and_then(|p| p.reason.as_deref());
    if prev_phase.is_some_and(Phase::is_terminal) {
        return prev_phase == Some(Phase::Failed) && prev_reason == Some(deadline::REASON);
    }
    deadline::check(pod, Some(start.0), now.0) == deadline::Deadline::Exceeded
}

/// How the kubelet's `getPhase` reads one container status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Seen {
    Running,
    Terminated(i32),
    /// Waiting, with the exit code of the run before when there was one.
    Waiting(Option<i32>),
}

pub(super) fn seen(s: &ContainerStatus) -> Seen {
    let state = s.state.as_ref();
    if state.is_some_and(|s| s.running.is_some()) {
        return Seen::Running;
    }
    if let Some(t) = state.and_then(|s| s.terminated.as_ref()) {
        return Seen::Terminated(t.exit_code);
    }
    Seen::Waiting(
        s.last_state
            .as_ref()
            .and_then(|l| l.terminated.as_ref())
            .map(|t| t.exit_code),
    )
}

/// The kubelet's `HasAnyRegularContainerStarted`: an app container runs or has finished.
pub(super) fn any_app_started(statuses: &[ContainerStatus]) -> bool {
    statuses
        .iter()
        .any(|s| matches!(seen(s), Seen::Running | Seen::Terminated(_)))
}

/// The kubelet's `getPhase` (kubelet_pods.go): pending regular init containers (or unstarted
/// sidecars before any app container started) or app containers never started keep the pod
/// Pending; a failed init container under `Never` fails it; then Running while any container
/// runs, else by the restart policy and the exit codes.
pub(super) fn get_phase(
    policy: RestartPolicy,
    inits: &[Container],
    init_statuses: &[ContainerStatus],
    statuses: &[ContainerStatus],
) -> Phase {
    let (mut pending_init, mut pending_sidecars, mut failed_init) = (0, 0, 0);
    let (mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0);
    for (c, s) in inits.iter().zip(init_statuses) {
        match (is_sidecar(c), seen(s)) {
            (false, Seen::Running | Seen::Waiting(None)) => pending_init += 1,
            (false, Seen::Terminated(code) | Seen::Waiting(Some(code))) => {
                failed_init += usize::from(code != 0);
            }
            (true, Seen::Running) => {
                pending_sidecars += usize::from(s.started != Some(true));
                running += 1;
            }
            (true, Seen::Waiting(None)) => {
                pending_sidecars += 1;
                waiting += 1;
            }
            // A sidecar that ended is ignored.
            (true, Seen::Terminated(_) | Seen::Waiting(Some(_))) => {}
        }
    }
    for s in statuses {
        match seen(s) {
            Seen::Running => running += 1,
            Seen::Terminated(code) => {
                stopped += 1;
                succeeded += usize::from(code == 0);
            }
            Seen::Waiting(Some(_)) => stopped += 1,
            Seen::Waiting(None) => waiting += 1,
        }
    }
    if failed_init > 0 && policy == RestartPolicy::Never {
        return Phase::Failed;
    }
    if pending_init > 0 || (pending_sidecars > 0 && !any_app_started(statuses)) {
        return Phase::Pending;
    }
    pod_phase(waiting, running, stopped, succeeded, policy)
}

/// The tail of `getPhase`, from counts of app containers (and running sidecars).
pub(super) fn pod_phase(
    waiting: usize,
    running: usize,
    stopped: usize,
    succeeded: usize,
    policy: RestartPolicy,
) -> Phase {
    if waiting > 0 {
        Phase::Pending
    } else if running > 0 {
        Phase::Running
    } else if stopped == 0 {
        Phase::Pending
    } else if policy == RestartPolicy::Always {
        // Every container is on its way to a restart.
        Phase::Running
    } else if stopped == succeeded {
        Phase::Succeeded
    } else if policy == RestartPolicy::Never {
        Phase::Failed
    } else {
        // OnFailure with a failed container: it will be restarted.
        Phase::Running
    }
}

/// Go's `%s` of a `[]string`: `[a b]`.
pub(super) fn go_list(names: &[&str]) -> String {
    format!("[{}]", names.join(" "))
}

/// The kubelet's `GeneratePodInitializedCondition`: every regular init container exited 0 and
/// every sidecar started, or an app container has started already.
pub(super) fn initialized_condition(
    inits: &[Container],
    init_statuses: &[ContainerStatus],
    statuses: &[ContainerStatus],
    phase: Phase,
) -> Cond {
    let incomplete: Vec<&str> = inits
        .iter()
        .zip(init_statuses)
        .filter(|(c, s)| {
            if is_sidecar(c) {
                s.started != Some(true)
            } else {
                seen(s) != Seen::Terminated(0)
            }
        })
        .map(|(c, _)| c.name.as_str())
        .collect();
    if phase == Phase::Succeeded {
        return Cond::reason(true, "PodCompleted");
    }
    if incomplete.is_empty() || any_app_started(statuses) {
        return Cond::TRUE;
    }
    Cond {
        ok: false,
        reason: Some("ContainersNotInitialized"),
        message: Some(format!(
            "containers with incomplete status: {}",
            go_list(&incomplete)
        )),
    }
}

/// The kubelet's `GenerateContainersReadyCondition`: every app container and sidecar is ready;
/// False with `PodCompleted` / `PodFailed` once the pod is terminal.
pub(super) fn containers_ready_condition(
    inits: &[Container],
    init_statuses: &[ContainerStatus],
    apps: &[Container],
    statuses: &[ContainerStatus],
    phase: Phase,
) -> Cond {
    let unready: Vec<&str> = inits
        .iter()
        .zip(init_statuses)
        .filter(|(c, s)| is_sidecar(c) && !s.ready)
        .chain(apps.iter().zip(statuses).filter(|(_, s)| !s.ready))
        .map(|(c, _)| c.name.as_str())
        .collect();
    match phase {
        Phase::Succeeded => Cond::reason(false, "PodCompleted"),
        Phase::Failed => Cond::reason(false, "PodFailed"),
        _ if unready.is_empty() => Cond::TRUE,
        _ => Cond {
            ok: false,
            reason: Some("ContainersNotReady"),
            message: Some(format!(
                "containers with unready status: {}",
                go_list(&unready)
            )),
        },
    }
}

/// The kubelet's `GeneratePodReadyCondition`: ContainersReady, then every readiness gate's
/// condition (set by others on the pod's status) True.
pub(super) fn ready_condition(pod: &Pod, containers_ready: Cond) -> Cond {
    if !containers_ready.ok {
        return containers_ready;
    }
    let conditions = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let unready: Vec<String> = pod
        .spec
        .iter()
        .flat_map(|s| s.readiness_gates.iter().flatten())
        .filter_map(
            |g| match conditions.iter().find(|c| c.type_ == g.condition_type) {
                None => Some(format!(
                    "corresponding condition of pod readiness gate {:?} does not exist.",
                    g.condition_type
                )),
                Some(c) if c.status != "True" => Some(format!(
                    "the status of pod readiness gate {:?} is not \"True\", but {}",
                    g.condition_type, c.status
                )),
                Some(_) => None,
            },
        )
        .collect();
    if unready.is_empty() {
        return Cond::TRUE;
    }
    Cond {
        ok: false,
        reason: Some("ReadinessGatesNotReady"),
        message: Some(unready.join(", ")),
    }
}
