//! Status manager: the pods the agent was asked to run and the status it computed for each, as a
//! snapshot readers (the `/pods` endpoint) can take without waiting on any task.
use crate::runtime::actions::is_sidecar;
use crate::runtime::{PodState, labels};
use k8s_cri::v1 as api;
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, Pod, PodCondition, PodIP, PodStatus,
    ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, RwLock};

struct Entry {
    pod: Arc<Pod>,
    status: PodStatus,
    running_observed: bool,
}

/// Shared, cheap to clone. Writers: the sync loop (pods) and pod workers / PLEG (statuses).
#[derive(Clone)]
pub struct StatusManager {
    inner: Arc<RwLock<BTreeMap<String, Entry>>>,
    host_ip: Option<IpAddr>,
    metrics: crate::metrics::Metrics,
    /// Readiness and startup probe results, for `ready` and `started`.
    probes: Option<crate::prober::Results>,
}

fn ts(nanos: i64) -> Option<Time> {
    (nanos > 0)
        .then(|| Timestamp::from_nanosecond(i128::from(nanos)).ok().map(Time))
        .flatten()
}

fn condition(kind: &str, ok: bool, prev: Option<&PodStatus>, now: &Time) -> PodCondition {
    let status = if ok { "True" } else { "False" };
    // Keep the transition time while the value stays the same.
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
        ..Default::default()
    }
}

impl StatusManager {
    pub fn new(metrics: crate::metrics::Metrics) -> Self {
        Self {
            inner: Arc::default(),
            host_ip: host_ip(),
            metrics,
            probes: None,
        }
    }

    /// Lets probe results decide the containers' `ready` and `started`.
    pub fn with_probe_results(mut self, probes: crate::prober::Results) -> Self {
        self.probes = Some(probes);
        self
    }

    /// A copy of the pod's last computed status (probe workers read it).
    pub fn pod_status(&self, uid: &str) -> Option<PodStatus> {
        self.inner.read().ok()?.get(uid).map(|e| e.status.clone())
    }

    /// Adds or replaces the desired pod, keeping its status.
    pub fn set_pod(&self, uid: &str, pod: Arc<Pod>) {
        let Ok(mut map) = self.inner.write() else {
            return;
        };
        match map.get_mut(uid) {
            Some(e) => e.pod = pod,
            None => {
                let status = PodStatus {
                    phase: Some("Pending".into()),
                    host_ip: self.host_ip.map(|ip| ip.to_string()),
                    qos_class: crate::cm::pod_qos(&pod).ok().map(|q| q.as_str().to_owned()),
                    ..Default::default()
                };
                map.insert(
                    uid.to_owned(),
                    Entry {
                        pod,
                        status,
                        running_observed: false,
                    },
                );
            }
        }
    }

    pub fn remove_pod(&self, uid: &str) {
        if let Ok(mut map) = self.inner.write() {
            map.remove(uid);
        }
    }

    /// Recomputes a pod's status from what the runtime holds. True when this update is the
    /// first to see the pod Running.
    pub fn update(
        &self,
        uid: &str,
        state: &PodState,
        waiting: &HashMap<String, (String, String)>,
    ) -> bool {
        let Ok(mut map) = self.inner.write() else {
            return false;
        };
        let Some(entry) = map.get_mut(uid) else {
            return false;
        };
        let mut first_running = false;
        let status = generate_probed(
            &entry.pod,
            state,
            waiting,
            Some(&entry.status),
            self.host_ip,
            self.probes.as_ref(),
        );
        if status.phase.as_deref() == Some("Running") && !entry.running_observed {
            entry.running_observed = true;
            first_running = true;
            if let Some(seen) = entry
                .pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("kubernetes.io/config.seen"))
                .and_then(|s| s.parse::<Timestamp>().ok())
            {
                let secs = Timestamp::now().duration_since(seen).as_secs_f64();
                self.metrics
                    .pod_start_duration_seconds
                    .observe(secs.max(0.0));
                tracing::info!(
                    pod = entry.pod.metadata.name.as_deref().unwrap_or_default(),
                    seconds = secs,
                    "pod observed Running"
                );
            }
        }
        entry.status = status;
        first_running
    }

    /// The pods with their statuses, for `/pods`.
    pub fn pods(&self) -> Vec<Pod> {
        let Ok(map) = self.inner.read() else {
            return Vec::new();
        };
        map.values()
            .map(|e| {
                let mut p = (*e.pod).clone();
                p.status = Some(e.status.clone());
                p
            })
            .collect()
    }

    /// Whether the pod's last computed phase is Succeeded or Failed.
    pub fn is_terminal(&self, uid: &str) -> bool {
        self.inner.read().is_ok_and(|m| {
            m.get(uid)
                .is_some_and(|e| matches!(e.status.phase.as_deref(), Some("Succeeded" | "Failed")))
        })
    }

    pub fn running_count(&self) -> usize {
        self.inner
            .read()
            .map(|m| {
                m.values()
                    .filter(|e| e.status.phase.as_deref() == Some("Running"))
                    .count()
            })
            .unwrap_or(0)
    }
}

fn host_ip() -> Option<IpAddr> {
    // The source address the kernel would use to reach outside; no packet is sent.
    let sock = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    sock.connect("192.0.2.1:9").ok()?;
    sock.local_addr().ok().map(|a| a.ip())
}

fn terminated(n: &api::ContainerStatus) -> ContainerState {
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
            message: (!n.message.is_empty()).then(|| n.message.clone()),
            started_at: ts(n.started_at),
            finished_at: ts(n.finished_at),
            container_id: Some(format!("containerd://{}", n.id)),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The status of one spec container from its two newest runtime instances: its state (a waiting
/// reason from `waiting` wins over an exited instance: that one is then the last state), the last
/// state (the previous instance's end), restart count, readiness (from `probes` when the
/// container has readiness or startup probes).
fn container_status(
    c: &Container,
    uid: Option<&String>,
    state: &PodState,
    waiting: &HashMap<String, (String, String)>,
    default_reason: &str,
    probes: Option<&crate::prober::Results>,
) -> ContainerStatus {
    let mut instances = state.containers.iter().filter(|s| {
        s.metadata.as_ref().is_some_and(|m| m.name == c.name)
            && s.labels.get(labels::POD_UID) == uid
    });
    let newest = instances.next();
    let previous = instances.next();
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
        Some(n) if exited(n) && reason.is_none() => (terminated(n), previous.filter(|p| exited(p))),
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
    st.last_state = last.map(terminated);
    st.allocated_resources = c.resources.as_ref().and_then(|r| r.requests.clone());
    st.resources = newest
        .filter(|n| n.state == api::ContainerState::ContainerRunning as i32)
        .and_then(|n| applied_resources(c, n));
    st
}

/// The resources a running container has now (`containerStatuses[].resources`): the spec's when
/// they are what is applied (created so, or resized in place), else the applied cgroup values read
/// back as quantities (a resize not done yet, or refused).
fn applied_resources(c: &Container, n: &api::ContainerStatus) -> Option<ResourceRequirements> {
    let applied = n.annotations.get(labels::CONTAINER_RESOURCES)?;
    let wanted = crate::runtime::container_resources(c).ok()?;
    if crate::runtime::resources_label(&wanted) == *applied {
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

/// A refused or failed in-place resize: the `PodResizeInProgress` condition with reason `Error`
/// and the message, as the kubelet reports a resize it could not carry out.
fn resize_condition(
    status: &mut PodStatus,
    state: &PodState,
    prev: Option<&PodStatus>,
    now: &Time,
) {
    let Some(message) = &state.resize_error else {
        return;
    };
    let mut cond = condition("PodResizeInProgress", true, prev, now);
    cond.reason = Some("Error".to_owned());
    cond.message = Some(message.clone());
    status.conditions.get_or_insert_with(Vec::new).push(cond);
}

/// Builds a PodStatus (phase, conditions, init and app container statuses) from the spec and
/// runtime state, ignoring probes.
pub fn generate(
    pod: &Pod,
    state: &PodState,
    waiting: &HashMap<String, (String, String)>,
    prev: Option<&PodStatus>,
    host_ip: Option<IpAddr>,
) -> PodStatus {
    generate_probed(pod, state, waiting, prev, host_ip, None)
}

/// [`generate`] with readiness and startup probe results.
pub fn generate_probed(
    pod: &Pod,
    state: &PodState,
    waiting: &HashMap<String, (String, String)>,
    prev: Option<&PodStatus>,
    host_ip: Option<IpAddr>,
    probes: Option<&crate::prober::Results>,
) -> PodStatus {
    let now = Time(Timestamp::now());
    let spec = pod.spec.as_ref();
    let spec_containers = spec.map(|s| s.containers.as_slice()).unwrap_or_default();
    let inits = spec
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default();
    let policy = spec
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always");
    let uid = pod.metadata.uid.as_ref();
    let sandbox_id = state.ready_sandbox().map(|s| s.id.clone());

    // Init containers: regular ones must have succeeded, sidecars must run.
    let mut init_statuses = Vec::with_capacity(inits.len());
    let (mut inits_done, mut init_failed) = (true, false);
    for c in inits {
        let st = container_status(c, uid, state, waiting, "PodInitializing", probes);
        let term = st.state.as_ref().and_then(|s| s.terminated.as_ref());
        let exited_code = term.map(|t| t.exit_code).or_else(|| {
            st.last_state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .filter(|_| st.state.as_ref().is_some_and(|s| s.waiting.is_some()))
                .map(|t| t.exit_code)
        });
        if is_sidecar(c) {
            inits_done &= st.started == Some(true);
        } else {
            match exited_code {
                Some(0) if term.is_some() => {}
                Some(code) if code != 0 => {
                    init_failed = true;
                    inits_done = false;
                }
                _ => inits_done = false,
            }
        }
        init_statuses.push(st);
    }
    // Any app container that ever started means the pod went past initialisation.
    let apps_started = spec_containers.iter().any(|c| {
        state.containers.iter().any(|s| {
            s.metadata.as_ref().is_some_and(|m| m.name == c.name)
                && s.labels.get(labels::POD_UID) == uid
        })
    });
    let initialized = inits_done || apps_started;
    let app_default = if initialized {
        "ContainerCreating"
    } else {
        "PodInitializing"
    };

    let mut statuses = Vec::with_capacity(spec_containers.len());
    let (mut running, mut waiting_n, mut succeeded) = (0, 0, 0);
    for c in spec_containers {
        let st = container_status(c, uid, state, waiting, app_default, probes);
        let s = st.state.as_ref();
        if s.is_some_and(|s| s.running.is_some()) {
            running += 1;
        } else if let Some(t) = s.and_then(|s| s.terminated.as_ref()) {
            succeeded += usize::from(t.exit_code == 0);
        } else if let Some(t) = st.last_state.as_ref().and_then(|l| l.terminated.as_ref()) {
            // Waiting to restart after a run: counts as that run's end for the phase.
            succeeded += usize::from(t.exit_code == 0);
        } else {
            waiting_n += 1;
        }
        statuses.push(st);
    }
    let total = spec_containers.len();
    let phase = if init_failed && policy == "Never" {
        "Failed"
    } else if !initialized {
        "Pending"
    } else {
        pod_phase(total, waiting_n, running, succeeded, policy)
    };
    let all_ready = total > 0
        && statuses.iter().all(|s| s.ready)
        && inits
            .iter()
            .zip(&init_statuses)
            .all(|(c, s)| !is_sidecar(c) || s.ready);
    let pod_ip = state
        .sandbox_status
        .as_ref()
        .filter(|s| s.state == api::PodSandboxState::SandboxReady as i32)
        .and_then(|s| s.network.as_ref())
        .map(|n| n.ip.clone())
        .filter(|ip| !ip.is_empty())
        .or_else(|| {
            let host_net = pod
                .spec
                .as_ref()
                .and_then(|s| s.host_network)
                .unwrap_or(false);
            (host_net && sandbox_id.is_some())
                .then(|| host_ip.map(|ip| ip.to_string()))
                .flatten()
        });
    let start_time = prev
        .and_then(|p| p.start_time.clone())
        .or_else(|| state.sandboxes.first().and_then(|s| ts(s.created_at)));
    let mut status = PodStatus {
        phase: Some(phase.to_owned()),
        conditions: Some(vec![
            condition(
                "PodReadyToStartContainers",
                sandbox_id.is_some(),
                prev,
                &now,
            ),
            condition("Initialized", initialized, prev, &now),
            condition("Ready", all_ready, prev, &now),
            condition("ContainersReady", all_ready, prev, &now),
            condition("PodScheduled", true, prev, &now),
        ]),
        host_ip: host_ip.map(|ip| ip.to_string()),
        pod_ip: pod_ip.clone(),
        pod_ips: pod_ip.map(|ip| vec![PodIP { ip }]),
        qos_class: crate::cm::pod_qos(pod).ok().map(|q| q.as_str().to_owned()),
        start_time,
        container_statuses: Some(statuses),
        init_container_statuses: (!init_statuses.is_empty()).then_some(init_statuses),
        ..Default::default()
    };
    resize_condition(&mut status, state, prev, &now);
    status
}

/// The kubelet's `getPhase` for pods without init containers: a container never started keeps the
/// pod Pending; then Running while any runs or the policy restarts them; else Succeeded / Failed.
fn pod_phase(
    total: usize,
    waiting: usize,
    running: usize,
    succeeded: usize,
    policy: &str,
) -> &'static str {
    if total == 0 || waiting > 0 {
        "Pending"
    } else if running > 0 || policy == "Always" {
        "Running"
    } else if succeeded == total {
        "Succeeded"
    } else if policy == "Never" {
        "Failed"
    } else {
        // OnFailure with a failed container: it will be restarted.
        "Running"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases() {
        assert_eq!(pod_phase(2, 1, 1, 0, "Always"), "Pending");
        assert_eq!(pod_phase(2, 0, 2, 0, "Always"), "Running");
        assert_eq!(pod_phase(1, 0, 0, 0, "Always"), "Running");
        assert_eq!(pod_phase(1, 0, 0, 1, "Never"), "Succeeded");
        assert_eq!(pod_phase(2, 0, 0, 1, "Never"), "Failed");
        assert_eq!(pod_phase(1, 0, 0, 0, "OnFailure"), "Running");
        assert_eq!(pod_phase(1, 0, 0, 1, "OnFailure"), "Succeeded");
        assert_eq!(pod_phase(0, 0, 0, 0, "Always"), "Pending");
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
        generate(p, s, &HashMap::new(), None, None)
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
        let st = generate(&p, &s, &waiting, None, None);
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
        let st = generate(&p, &PodState::default(), &waiting, None, None);
        let c = &st.container_statuses.unwrap_or_default()[0];
        assert_eq!(waiting_reason(c), Some("ImagePullBackOff"));
        assert_eq!(st.phase.as_deref(), Some("Pending"));
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
        let wanted = crate::runtime::container_resources(&c).unwrap();
        running.annotations.insert(
            labels::CONTAINER_RESOURCES.to_owned(),
            crate::runtime::resources_label(&wanted),
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
}
