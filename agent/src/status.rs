//! Status manager: the pods the agent was asked to run and the status it computed for each, as a
//! snapshot readers (the `/pods` endpoint) can take without waiting on any task.
use crate::pod::is_sidecar;
use crate::pod::{Phase, PodState, annotations, labels};
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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockWriteGuard};

struct Entry {
    pod: Arc<Pod>,
    status: PodStatus,
    running_observed: bool,
}

/// Shared, cheap to clone. Writers: the sync loop (the desired pods: [`StatusManager::set_pod`],
/// [`StatusManager::remove_pod`]) and the pod's worker, the only writer of a pod's status
/// ([`StatusManager::update`]). Everyone else only reads.
#[derive(Clone)]
pub struct StatusManager {
    inner: Arc<RwLock<BTreeMap<String, Entry>>>,
    /// Bumped while `inner`'s write lock is held by every writer that changed what `/pods` shows
    /// (a pod or a status): the served answer is stale exactly when this moved.
    version: Arc<AtomicU64>,
    /// `/pods` as last served, with the `version` it shows. Pollers (monitoring, the benches,
    /// tests) ask far more often than statuses change: serving the same bytes again costs a
    /// reference count instead of a deep copy and a serialisation of every pod.
    pods_json: Arc<Mutex<Option<(u64, bytes::Bytes)>>>,
    host_ip: Option<IpAddr>,
    metrics: crate::metrics::Metrics,
    /// Readiness and startup probe results, for `ready` and `started`.
    probes: Option<crate::pod::probe_results::Results>,
}

const EMPTY_POD_LIST: &str = r#"{"apiVersion":"v1","kind":"PodList","items":[],"metadata":{}}"#;

/// `/pods` borrowing the entries (a `v1` `PodList`, fields in `k8s_openapi::List`'s order).
#[derive(serde::Serialize)]
struct PodListView<'a> {
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    kind: &'static str,
    items: Vec<PodView<'a>>,
    metadata: EmptyMeta,
}

/// One pod of [`PodListView`]: the desired pod with its status.
#[derive(serde::Serialize)]
struct PodView<'a> {
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    kind: &'static str,
    metadata: &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    #[serde(skip_serializing_if = "Option::is_none")]
    spec: Option<&'a k8s_openapi::api::core::v1::PodSpec>,
    status: &'a PodStatus,
}

#[derive(serde::Serialize)]
struct EmptyMeta {}

fn ts(nanos: i64) -> Option<Time> {
    (nanos > 0)
        .then(|| Timestamp::from_nanosecond(i128::from(nanos)).ok().map(Time))
        .flatten()
}

/// A condition's value: True, or False with the kubelet's reason and message.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Cond {
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

fn condition(kind: &str, c: Cond, prev: Option<&PodStatus>, now: &Time) -> PodCondition {
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

impl StatusManager {
    pub fn new(metrics: crate::metrics::Metrics) -> Self {
        Self {
            inner: Arc::default(),
            version: Arc::default(),
            pods_json: Arc::default(),
            host_ip: host_ip(),
            metrics,
            probes: None,
        }
    }

    /// The write lock on every entry. A writer that changes what `/pods` shows calls
    /// [`Self::changed`] before releasing it.
    fn write(&self) -> Option<RwLockWriteGuard<'_, BTreeMap<String, Entry>>> {
        self.inner.write().ok()
    }

    /// What `/pods` shows changed. Call with the write lock held.
    fn changed(&self) {
        self.version.fetch_add(1, Ordering::Release);
    }

    /// Lets probe results decide the containers' `ready` and `started`.
    pub fn with_probe_results(mut self, probes: crate::pod::probe_results::Results) -> Self {
        self.probes = Some(probes);
        self
    }

    /// A copy of the pod's last computed status (probe workers read it).
    pub fn pod_status(&self, uid: &str) -> Option<PodStatus> {
        self.inner.read().ok()?.get(uid).map(|e| e.status.clone())
    }

    /// Adds or replaces the desired pod, keeping its status.
    pub fn set_pod(&self, uid: &str, pod: Arc<Pod>) {
        let Some(mut map) = self.write() else {
            return;
        };
        match map.get_mut(uid) {
            Some(e) => {
                if !Arc::ptr_eq(&e.pod, &pod) && *e.pod != *pod {
                    self.changed();
                }
                e.pod = pod;
            }
            None => {
                self.changed();
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
        if let Some(mut map) = self.write()
            && map.remove(uid).is_some()
        {
            self.changed();
        }
    }

    /// Recomputes a pod's status from what the runtime holds, with the waiting reasons of the
    /// sync that read it. Called only from the pod's worker. True when this update is the first
    /// to see the pod Running.
    pub fn update(
        &self,
        uid: &str,
        state: &PodState,
        waiting: &HashMap<String, (String, String)>,
    ) -> bool {
        let Some(mut map) = self.write() else {
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
        if Phase::of(status.phase.as_deref()) == Some(Phase::Running) && !entry.running_observed {
            entry.running_observed = true;
            first_running = true;
            self.observe_start(&entry.pod);
        }
        if status != entry.status {
            self.changed();
            entry.status = status;
        }
        first_running
    }

    /// Feeds `swiftlet_pod_start_duration_seconds`: from the source's first sight of the pod to
    /// Running observed.
    fn observe_start(&self, pod: &Pod) {
        let Some(seen) = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(annotations::CONFIG_SEEN))
            .and_then(|s| s.parse::<Timestamp>().ok())
        else {
            return;
        };
        let secs = Timestamp::now().duration_since(seen).as_secs_f64();
        self.metrics
            .pod_start_duration_seconds
            .observe(secs.max(0.0));
        tracing::info!(
            pod = pod.metadata.name.as_deref().unwrap_or_default(),
            seconds = secs,
            "pod observed Running"
        );
    }

    /// The pods with their statuses as owned values: what [`StatusManager::pods_json`]
    /// serialises without copying (its tests compare the two).
    #[cfg(test)]
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

    /// `/pods` as JSON: a `v1` `PodList` of the pods with their statuses, the same document
    /// `List { items: self.pods() }` serialises to. Served from the last answer while no status
    /// changed since; else serialised straight from the entries, without copying them.
    pub fn pods_json(&self) -> bytes::Bytes {
        let mut cache = self
            .pods_json
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let current = self.version.load(Ordering::Acquire);
        if let Some((version, body)) = cache.as_ref()
            && *version == current
        {
            return body.clone();
        }
        let Ok(map) = self.inner.read() else {
            return bytes::Bytes::from_static(EMPTY_POD_LIST.as_bytes());
        };
        // Writers bump the version only while holding the write lock: under the read lock it
        // names exactly what is serialised.
        let version = self.version.load(Ordering::Acquire);
        let list = PodListView {
            api_version: "v1",
            kind: "PodList",
            items: map
                .values()
                .map(|e| PodView {
                    api_version: "v1",
                    kind: "Pod",
                    metadata: &e.pod.metadata,
                    spec: e.pod.spec.as_ref(),
                    status: &e.status,
                })
                .collect(),
            metadata: EmptyMeta {},
        };
        let body = match serde_json::to_vec(&list) {
            Ok(v) => bytes::Bytes::from(v),
            Err(e) => {
                tracing::warn!(error = %e, "serialising /pods");
                return bytes::Bytes::from_static(EMPTY_POD_LIST.as_bytes());
            }
        };
        drop(map);
        *cache = Some((version, body.clone()));
        body
    }

    /// Whether the pod is one the agent was asked to run.
    pub fn knows(&self, uid: &str) -> bool {
        self.inner.read().is_ok_and(|m| m.contains_key(uid))
    }

    /// The pod's last computed status.
    pub fn status(&self, uid: &str) -> Option<PodStatus> {
        self.inner.read().ok()?.get(uid).map(|e| e.status.clone())
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
    probes: Option<&crate::pod::probe_results::Results>,
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
    let cond = Cond {
        ok: true,
        reason: Some("Error"),
        message: Some(message.clone()),
    };
    let cond = condition("PodResizeInProgress", cond, prev, now);
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
    probes: Option<&crate::pod::probe_results::Results>,
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

    // Containers the runtime does not hold yet wait for the pod's initialisation (when it has
    // init containers) or for their creation.
    let default_reason = if inits.is_empty() {
        "ContainerCreating"
    } else {
        "PodInitializing"
    };
    let init_statuses: Vec<ContainerStatus> = inits
        .iter()
        .map(|c| container_status(c, uid, state, waiting, default_reason, probes))
        .collect();
    let statuses: Vec<ContainerStatus> = spec_containers
        .iter()
        .map(|c| container_status(c, uid, state, waiting, default_reason, probes))
        .collect();
    let phase = get_phase(policy, inits, &init_statuses, &statuses);
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
                .then(|| host_ip.map(|ip| ip.to_string()))
                .flatten()
        })
        // A stopped sandbox has no IP any more: the pod keeps the one it had (as the kubelet).
        .or_else(|| prev.and_then(|p| p.pod_ip.clone()));
    let start_time = prev
        .and_then(|p| p.start_time.clone())
        .or_else(|| state.sandboxes.last().and_then(|s| ts(s.created_at)))
        .or_else(|| Some(now.clone()));
    let host_ip = host_ip.map(|ip| ip.to_string());
    let mut status = PodStatus {
        phase: Some(phase.to_owned()),
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
        host_ips: host_ip.clone().map(|ip| vec![HostIP { ip }]),
        host_ip,
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

/// How the kubelet's `getPhase` reads one container status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    Running,
    Terminated(i32),
    /// Waiting, with the exit code of the run before when there was one.
    Waiting(Option<i32>),
}

fn seen(s: &ContainerStatus) -> Seen {
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
fn any_app_started(statuses: &[ContainerStatus]) -> bool {
    statuses
        .iter()
        .any(|s| matches!(seen(s), Seen::Running | Seen::Terminated(_)))
}

/// The kubelet's `getPhase` (kubelet_pods.go): pending regular init containers (or unstarted
/// sidecars before any app container started) or app containers never started keep the pod
/// Pending; a failed init container under `Never` fails it; then Running while any container
/// runs, else by the restart policy and the exit codes.
fn get_phase(
    policy: &str,
    inits: &[Container],
    init_statuses: &[ContainerStatus],
    statuses: &[ContainerStatus],
) -> &'static str {
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
    if failed_init > 0 && policy == "Never" {
        return "Failed";
    }
    if pending_init > 0 || (pending_sidecars > 0 && !any_app_started(statuses)) {
        return "Pending";
    }
    pod_phase(waiting, running, stopped, succeeded, policy)
}

/// The tail of `getPhase`, from counts of app containers (and running sidecars).
fn pod_phase(
    waiting: usize,
    running: usize,
    stopped: usize,
    succeeded: usize,
    policy: &str,
) -> &'static str {
    if waiting > 0 {
        "Pending"
    } else if running > 0 {
        "Running"
    } else if stopped == 0 {
        "Pending"
    } else if policy == "Always" {
        // Every container is on its way to a restart.
        "Running"
    } else if stopped == succeeded {
        "Succeeded"
    } else if policy == "Never" {
        "Failed"
    } else {
        // OnFailure with a failed container: it will be restarted.
        "Running"
    }
}

/// Go's `%s` of a `[]string`: `[a b]`.
fn go_list(names: &[&str]) -> String {
    format!("[{}]", names.join(" "))
}

/// The kubelet's `GeneratePodInitializedCondition`: every regular init container exited 0 and
/// every sidecar started, or an app container has started already.
fn initialized_condition(
    inits: &[Container],
    init_statuses: &[ContainerStatus],
    statuses: &[ContainerStatus],
    phase: &str,
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
    if phase == "Succeeded" {
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
fn containers_ready_condition(
    inits: &[Container],
    init_statuses: &[ContainerStatus],
    apps: &[Container],
    statuses: &[ContainerStatus],
    phase: &str,
) -> Cond {
    let unready: Vec<&str> = inits
        .iter()
        .zip(init_statuses)
        .filter(|(c, s)| is_sidecar(c) && !s.ready)
        .chain(apps.iter().zip(statuses).filter(|(_, s)| !s.ready))
        .map(|(c, _)| c.name.as_str())
        .collect();
    match phase {
        "Succeeded" => Cond::reason(false, "PodCompleted"),
        "Failed" => Cond::reason(false, "PodFailed"),
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
fn ready_condition(pod: &Pod, containers_ready: Cond) -> Cond {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases() {
        // (waiting, running, stopped, succeeded, policy)
        assert_eq!(pod_phase(1, 1, 0, 0, "Always"), "Pending");
        assert_eq!(pod_phase(0, 2, 0, 0, "Always"), "Running");
        assert_eq!(pod_phase(0, 0, 1, 0, "Always"), "Running");
        assert_eq!(pod_phase(0, 0, 1, 1, "Never"), "Succeeded");
        assert_eq!(pod_phase(0, 0, 2, 1, "Never"), "Failed");
        assert_eq!(pod_phase(0, 1, 1, 0, "Never"), "Running");
        assert_eq!(pod_phase(0, 0, 1, 0, "OnFailure"), "Running");
        assert_eq!(pod_phase(0, 0, 1, 1, "OnFailure"), "Succeeded");
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
        let s3 = generate(
            &p,
            &sandboxed(false, done),
            &HashMap::new(),
            Some(&s2),
            None,
        );
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
                None,
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
        let m = StatusManager::new(crate::metrics::Metrics::new());
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
        m.set_pod("u", Arc::new(pod("Always", vec![], vec![spec("a", false)])));
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
        m.set_pod("u", Arc::new(pod("Always", vec![], vec![spec("a", false)])));
        m.remove_pod("nobody");
        assert!(
            after_update.as_ptr() == m.pods_json().as_ptr(),
            "writes that change nothing shown keep the served bytes"
        );
        m.set_pod("u", Arc::new(pod("Never", vec![], vec![spec("a", false)])));
        assert_eq!(served(&m), as_list(&m), "after the pod changed");
        assert_eq!(served(&m)["items"][0]["spec"]["restartPolicy"], "Never");
        m.set_pod("u", Arc::new(pod("Always", vec![], vec![spec("a", false)])));
        let restarted = sandboxed(
            true,
            vec![inst("a", 1, RUNNING, 0), inst("a", 0, EXITED, 1)],
        );
        m.update("u", &restarted, &HashMap::new());
        assert_eq!(served(&m), as_list(&m), "after a restart");
        let mut exited = restarted.clone();
        assert!(exited.apply_kernel_exit("a-1", 2, i64::MAX));
        m.update("u", &exited, &HashMap::new());
        assert_eq!(served(&m), as_list(&m), "after a kernel-seen exit");
        m.remove_pod("u");
        assert_eq!(served(&m)["items"], serde_json::json!([]), "removed");
    }

    #[test]
    fn a_kernel_seen_exit_shows_until_the_runtime_reports_it() {
        let m = StatusManager::new(crate::metrics::Metrics::new());
        m.set_pod("u", Arc::new(pod("Never", vec![], vec![spec("a", false)])));
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
        assert!(seen.apply_kernel_exit("a-0", 3, 5_000_000_000));
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
}
