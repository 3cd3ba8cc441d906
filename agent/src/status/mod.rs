//! Status manager: the status the agent computed for each pod of the registry
//! ([`crate::pod_registry`]), as a snapshot readers (the `/pods` endpoint) can take without
//! waiting on any task.
//!
//! - this file: [`StatusManager`], the statuses. The pod's worker is the only writer of a pod's
//!   status ([`StatusManager::update`]); the pods are the registry's, which the sync loop writes.
//! - [`generate`]: the status of a pod from what the runtime holds (the kubelet's
//!   `generateAPIPodStatus`: phase, conditions, container statuses).
//! - [`json`]: `/pods`, serialised from the store without copying it.
mod generate;
mod json;
#[cfg(test)]
mod tests;

pub use generate::{DISRUPTION_TARGET, generate, generate_probed};

use crate::pod::{Phase, PodState, annotations, deadline};
use crate::pod_registry::{Changes, Pods, Rejected};
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::jiff::Timestamp;
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// What the status manager keeps of a desired pod (the pod itself is the registry's).
struct Entry {
    status: PodStatus,
    running_observed: bool,
    /// The pod's worker is killing it: nothing of it is Ready any more.
    terminating: bool,
    /// The eviction manager evicted it (reason `Evicted`) or admission preempted it (reason
    /// `Preempting`), with this message: it fails so.
    evicted: Option<(&'static str, String)>,
    /// The grace period its containers are stopped with when it was evicted (`None`: its own).
    eviction_grace: Option<i64>,
    /// Its worker finished it: containers stopped, cgroup and directories removed.
    terminated: bool,
    /// Its worker has computed its status from the runtime at least once: before that the
    /// status is only where it continues from, not to be written anywhere.
    computed: bool,
}

impl Entry {
    fn new(status: PodStatus) -> Self {
        Self {
            status,
            running_observed: false,
            terminating: false,
            evicted: None,
            eviction_grace: None,
            terminated: false,
            computed: false,
        }
    }
}

/// The reason and message of a pod preempted to admit a critical pod (the kubelet's words).
pub const PREEMPTING: &str = "Preempting";
pub const PREEMPTED_MESSAGE: &str = "Preempted in order to admit critical pod";

/// The message of the `DisruptionTarget` condition of a pod preempted to admit a critical pod.
pub const PREEMPTED_BY_KUBELET: &str =
    "Pod was preempted by Kubelet to accommodate a critical pod.";

/// The reason of an evicted pod's status.
pub const EVICTED: &str = "Evicted";

/// `status.hostIP`: the node's primary address.
fn host_ip(ips: &[IpAddr]) -> Option<String> {
    ips.first().map(ToString::to_string)
}

/// The status of a pod admission rejected (kubelet `rejectPod`: phase Failed, the reason,
/// "Pod was rejected: ..."), made when it is read.
fn rejected_status(r: &Rejected, host_ips: &[IpAddr]) -> PodStatus {
    PodStatus {
        phase: Some(Phase::Failed.as_str().into()),
        reason: Some(r.reason().to_owned()),
        message: Some(r.message().to_owned()),
        host_ip: host_ip(host_ips),
        host_ips: generate::host_ip_list(host_ips),
        ..Default::default()
    }
}

/// The status of a desired pod no worker has written yet: the one its source gave it (the API
/// server's, which after an agent restart is where the pod's status continues from: its phase,
/// start time, conditions and their transition times), else Pending; with the node's IP and the
/// pod's QoS class.
fn initial_status(pod: &Pod, host_ips: &[IpAddr]) -> PodStatus {
    let mut status = pod.status.clone().unwrap_or_default();
    status
        .phase
        .get_or_insert_with(|| Phase::Pending.as_str().into());
    status.host_ip = host_ip(host_ips);
    status.host_ips = generate::host_ip_list(host_ips);
    status.qos_class = crate::pod::pod_qos(pod).ok().map(|q| q.as_str().to_owned());
    status
}

/// The statuses of the desired pods, by UID. An entry counts only while its pod is desired in
/// the registry; a desired pod without one shows its [`initial_status`].
type Statuses = BTreeMap<String, Entry>;

/// The status of desired pod `uid` (`pod`), from its entry or, before any, its initial one.
fn status_of(map: &Statuses, uid: &str, pod: &Pod, host_ips: &[IpAddr]) -> PodStatus {
    map.get(uid)
        .map_or_else(|| initial_status(pod, host_ips), |e| e.status.clone())
}

/// Shared, cheap to clone. The pod's worker is the only writer of a pod's status
/// ([`StatusManager::update`]); the pods themselves (desired and rejected) are the registry's,
/// read through its [`Pods`] handle. Everyone else only reads.
///
/// Locks: the registry's read lock is always taken before the statuses' lock.
#[derive(Clone)]
pub struct StatusManager {
    pods: Pods,
    inner: Arc<RwLock<Statuses>>,
    /// Bumped, while the changed store's write lock is held, by every writer that changed what
    /// `/pods` shows (a pod or a status): the served answer is stale exactly when it moved.
    changes: Changes,
    /// `/pods` as last served, with the `version` it shows. Pollers (monitoring, the benches,
    /// tests) ask far more often than statuses change: serving the same bytes again costs a
    /// reference count instead of a deep copy and a serialisation of every pod.
    pods_json: Arc<Mutex<Option<(u64, bytes::Bytes)>>>,
    /// [`Self::running_count`]'s last count, with the version it counted.
    running_counted: Arc<Mutex<Option<(u64, usize)>>>,
    /// The node's addresses (`--node-ip`, else detected), primary first: the pods'
    /// `status.hostIP(s)`.
    host_ips: Arc<[IpAddr]>,
    metrics: crate::metrics::Metrics,
    /// Readiness and startup probe results, for `ready` and `started`.
    probes: crate::pod::probe_results::Results,
}

impl StatusManager {
    /// The statuses of the pods `pods` holds; `probes` decide the containers' `ready` and
    /// `started`; `host_ips` are the node's addresses, primary first.
    pub fn new(
        metrics: crate::metrics::Metrics,
        pods: Pods,
        probes: crate::pod::probe_results::Results,
        host_ips: Vec<IpAddr>,
    ) -> Self {
        Self {
            changes: pods.changes().clone(),
            pods,
            inner: Arc::default(),
            pods_json: Arc::default(),
            running_counted: Arc::default(),
            host_ips: host_ips.into(),
            metrics,
            probes,
        }
    }

    /// The registry's read handle.
    pub fn registry(&self) -> &Pods {
        &self.pods
    }

    /// The read locks on the registry and on the statuses, in that order.
    fn read(
        &self,
    ) -> Option<(
        RwLockReadGuard<'_, crate::pod_registry::Store>,
        RwLockReadGuard<'_, Statuses>,
    )> {
        let reg = self.pods.read()?;
        let map = self.inner.read().ok()?;
        Some((reg, map))
    }

    /// Runs `f` on the entry of desired pod `uid` (made with its initial status when it has
    /// none) under the registry's read lock and the statuses' write lock; `None` when the pod
    /// is not desired. A writer that changes what `/pods` shows calls [`Self::changed`] in `f`.
    fn with_entry<T>(&self, uid: &str, f: impl FnOnce(&Pod, &mut Entry) -> T) -> Option<T> {
        let reg = self.pods.read()?;
        let pod = reg.desired(uid)?;
        let mut map: RwLockWriteGuard<'_, Statuses> = self.inner.write().ok()?;
        let entry = map
            .entry(uid.to_owned())
            .or_insert_with(|| Entry::new(initial_status(pod, &self.host_ips)));
        Some(f(pod, entry))
    }

    /// What `/pods` shows of pod `uid` changed. Call with the statuses' write lock held.
    fn changed(&self, uid: &str) {
        self.changes.changed(uid);
    }

    /// The pods that changed since the last call, with when each first changed (the API status
    /// writer's feed).
    pub fn take_changed(&self) -> Vec<(String, std::time::Instant)> {
        self.changes.take()
    }

    /// Woken (at most one waiter) after a pod changed.
    pub fn changes(&self) -> Arc<tokio::sync::Notify> {
        self.changes.notify()
    }

    /// Every pod known, admitted or rejected.
    pub fn uids(&self) -> Vec<String> {
        self.pods.uids()
    }

    /// What the API server is told of pod `uid`: the pod, its status (`None` until its worker
    /// computed one: the status a restarted agent starts from is the server's own, and what it
    /// would show before the runtime is read, Pending, is not the pod's), and whether its worker
    /// finished it (its resources are reclaimed).
    pub fn api_view(&self, uid: &str) -> Option<(Arc<Pod>, Option<PodStatus>, bool)> {
        let (reg, map) = self.read()?;
        if let Some(pod) = reg.desired(uid) {
            let entry = map.get(uid);
            let terminated = entry.is_some_and(|e| e.terminated);
            let status = entry.filter(|e| e.computed).map(|e| e.status.clone());
            return Some((pod.clone(), status, terminated));
        }
        let r = reg.rejected(uid)?;
        let pod = r.pod().whole().ok()?;
        Some((pod, Some(rejected_status(r, &self.host_ips)), true))
    }

    /// The pod's worker finished it: its containers are stopped and its cgroup and directories
    /// gone. Called only from the pod's worker.
    pub fn terminated(&self, uid: &str) {
        self.with_entry(uid, |_, e| {
            if !e.terminated {
                e.terminated = true;
                self.changed(uid);
            }
        });
    }

    /// A copy of the pod's last computed status (probe workers read it).
    pub fn pod_status(&self, uid: &str) -> Option<PodStatus> {
        self.status(uid)
    }

    /// Drops what is kept of pod `uid`'s status: the registry no longer holds it as desired
    /// (its worker finished it, or admission rejected it). Called only from the sync loop.
    pub fn forget(&self, uid: &str) {
        if let Ok(mut map) = self.inner.write() {
            map.remove(uid);
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
        self.with_entry(uid, |pod, entry| {
            let mut first_running = false;
            let mut status = generate_probed(
                pod,
                state,
                waiting,
                Some(&entry.status),
                &self.host_ips,
                Some(&self.probes),
            );
            if entry.terminating {
                generate::not_ready(&mut status, Some(&entry.status));
            }
            if let Some((reason, message)) = &entry.evicted {
                status.phase = Some(crate::pod::Phase::Failed.as_str().to_owned());
                status.reason = Some((*reason).to_owned());
                status.message = Some(message.clone());
                let why = if *reason == PREEMPTING {
                    PREEMPTED_BY_KUBELET
                } else {
                    message
                };
                generate::disruption_target(&mut status, why, Some(&entry.status));
            }
            generate::continue_from(&mut status, &entry.status, pod);
            entry.computed = true;
            if Phase::of(status.phase.as_deref()) == Some(Phase::Running) && !entry.running_observed
            {
                entry.running_observed = true;
                first_running = true;
                self.observe_start(pod);
            }
            if status.reason.as_deref() == Some(deadline::REASON)
                && entry.status.reason.as_deref() != Some(deadline::REASON)
            {
                tracing::info!(
                    pod = %crate::pod::full_name(pod),
                    active_deadline_seconds = deadline::seconds(pod),
                    start_time = ?status.start_time.as_ref().map(|t| t.0),
                    "pod failed: {}", deadline::MESSAGE
                );
            }
            if status != entry.status {
                self.changed(uid);
                entry.status = status;
            }
            first_running
        })
        .unwrap_or(false)
    }

    /// The pod's worker starts killing it: from now on its status shows no container ready and
    /// the Ready and ContainersReady conditions False (reason `PodTerminating`), whatever its
    /// containers still run; the phase stays what the containers make it, as the kubelet keeps
    /// it. Called only from the pod's worker.
    pub fn terminating(&self, uid: &str) {
        self.with_entry(uid, |_, entry| {
            entry.terminating = true;
            let mut status = entry.status.clone();
            generate::not_ready(&mut status, Some(&entry.status));
            if status != entry.status {
                entry.status = status;
                self.changed(uid);
            }
        });
    }

    /// The entry of pod `uid` while it is desired.
    fn entry<'a>(
        reg: &crate::pod_registry::Store,
        map: &'a Statuses,
        uid: &str,
    ) -> Option<&'a Entry> {
        reg.desired(uid).and(map.get(uid))
    }

    /// Where `pod` stands against its `activeDeadlineSeconds` now, counted from the start time of
    /// its last computed status, else the one the pod came with (the kubelet's
    /// `pastActiveDeadline`).
    pub fn active_deadline(&self, uid: &str, pod: &Pod) -> deadline::Deadline {
        if deadline::seconds(pod).is_none() {
            return deadline::Deadline::Unset;
        }
        let recorded = self.read().and_then(|(reg, map)| {
            Self::entry(&reg, &map, uid).and_then(|e| e.status.start_time.clone())
        });
        let start = recorded.or_else(|| pod.status.as_ref().and_then(|s| s.start_time.clone()));
        deadline::check(pod, start.map(|t| t.0), Timestamp::now())
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
        self.metrics.pod_started(secs.max(0.0));
        tracing::info!(
            pod = pod.metadata.name.as_deref().unwrap_or_default(),
            seconds = secs,
            "pod observed Running"
        );
    }

    /// Whether the pod is one the agent was asked to run.
    pub fn knows(&self, uid: &str) -> bool {
        self.pods.knows(uid)
    }

    /// The UID and last computed status of the pod called `name` in `namespace` (a desired pod;
    /// a rejected one never ran).
    pub fn find(&self, namespace: &str, name: &str) -> Option<(String, PodStatus)> {
        let uid = self.pods.find(namespace, name)?;
        let status = self.status(&uid)?;
        Some((uid, status))
    }

    /// Every desired pod with its UID and start time (the stats summary's pod list).
    pub fn pods_started(
        &self,
    ) -> Vec<(
        String,
        Arc<Pod>,
        Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    )> {
        let Some((reg, map)) = self.read() else {
            return Vec::new();
        };
        reg.desired_pods()
            .map(|(uid, pod)| {
                let started = map.get(uid).and_then(|e| e.status.start_time.clone());
                (uid.clone(), pod.clone(), started)
            })
            .collect()
    }

    /// Marks the pod evicted (the eviction manager): its next status update, and every one
    /// after, shows phase Failed, reason `Evicted` and `message`. False for an unknown pod.
    pub fn evict(&self, uid: &str, message: &str) -> bool {
        self.evict_as(uid, EVICTED, message)
    }

    /// [`StatusManager::evict`] with another reason (admission's `Preempting`).
    pub fn evict_as(&self, uid: &str, reason: &'static str, message: &str) -> bool {
        self.mark_evicted(uid, reason, message, None)
    }

    /// [`StatusManager::evict`] whose containers are stopped with `grace` seconds (the
    /// eviction manager's override), `None`: the pod's own.
    pub fn evict_with_grace(&self, uid: &str, message: &str, grace: Option<i64>) -> bool {
        self.mark_evicted(uid, EVICTED, message, grace)
    }

    fn mark_evicted(
        &self,
        uid: &str,
        reason: &'static str,
        message: &str,
        grace: Option<i64>,
    ) -> bool {
        self.with_entry(uid, |_, e| {
            if e.evicted.is_none() {
                e.evicted = Some((reason, message.to_owned()));
                e.eviction_grace = grace;
            }
        })
        .is_some()
    }

    /// The grace period an evicted pod is stopped with, when the eviction set one.
    pub fn eviction_grace(&self, uid: &str) -> Option<i64> {
        let (reg, map) = self.read()?;
        Self::entry(&reg, &map, uid).and_then(|e| e.eviction_grace)
    }

    /// Whether the eviction manager evicted the pod.
    pub fn is_evicted(&self, uid: &str) -> bool {
        self.read().is_some_and(|(reg, map)| {
            Self::entry(&reg, &map, uid).is_some_and(|e| e.evicted.is_some())
        })
    }

    /// The pod's last computed status.
    pub fn status(&self, uid: &str) -> Option<PodStatus> {
        let (reg, map) = self.read()?;
        match reg.desired(uid) {
            Some(pod) => Some(status_of(&map, uid, pod, &self.host_ips)),
            None => reg
                .rejected(uid)
                .map(|r| rejected_status(r, &self.host_ips)),
        }
    }

    /// Whether the pod's last computed phase is Succeeded or Failed.
    pub fn is_terminal(&self, uid: &str) -> bool {
        self.read().is_some_and(|(reg, map)| {
            reg.rejected(uid).is_some()
                || Self::entry(&reg, &map, uid).is_some_and(|e| {
                    Phase::of(e.status.phase.as_deref()).is_some_and(Phase::is_terminal)
                })
        })
    }

    /// The pods of `uids` admission counts as holding their resources (against allocatable and
    /// `--max-pods`), as the kubelet counts a pod until it is terminated: admitted (not
    /// rejected) and not yet finished by its worker. An evicted, preempted or deadline-exceeded
    /// pod counts until its containers have run out their grace period and its cgroup is gone;
    /// a pod its source already shows finished (an API pod that ended before an agent restart)
    /// does not. One read lock for all of them.
    pub fn holding_resources<'a>(&self, uids: impl Iterator<Item = &'a String>) -> Vec<&'a String> {
        let Some((reg, map)) = self.read() else {
            return Vec::new();
        };
        uids.filter(|uid| {
            reg.desired(uid).is_some_and(|pod| {
                !crate::pod::source_phase_is_terminal(pod)
                    && !map.get(uid.as_str()).is_some_and(|e| e.terminated)
            })
        })
        .collect()
    }

    /// How many desired pods show phase Running. Counted again only when what `/pods` shows
    /// has changed since the last count (every writer bumps the version under its write lock):
    /// an idle node's gauge costs an atomic load a second, not a walk of every pod.
    pub fn running_count(&self) -> usize {
        let version = self.changes.version();
        let mut counted = self
            .running_counted
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((at, n)) = *counted
            && at == version
        {
            return n;
        }
        let Some((reg, map)) = self.read() else {
            return 0;
        };
        let n = reg
            .desired_pods()
            .filter_map(|(uid, _)| map.get(uid))
            .filter(|e| Phase::of(e.status.phase.as_deref()) == Some(Phase::Running))
            .count();
        // The locks were taken after the version was read: the count holds every change up to
        // it, and a later change moves the version, so the next call counts again.
        *counted = Some((version, n));
        n
    }
}
