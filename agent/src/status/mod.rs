//! Status manager: the pods the agent was asked to run and the status it computed for each, as a
//! snapshot readers (the `/pods` endpoint) can take without waiting on any task.
//!
//! - this file: [`StatusManager`], the store. The sync loop sets and removes the desired pods;
//!   the pod's worker is the only writer of a pod's status ([`StatusManager::update`]).
//! - [`generate`]: the status of a pod from what the runtime holds (the kubelet's
//!   `generateAPIPodStatus`: phase, conditions, container statuses).
//! - [`json`]: `/pods`, serialised from the store without copying it.
mod generate;
mod json;
#[cfg(test)]
mod tests;

pub use generate::{generate, generate_probed};

use crate::config::PodRef;
use crate::pod::{Phase, PodState, annotations, deadline};
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::jiff::Timestamp;
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockWriteGuard};

struct Entry {
    pod: Arc<Pod>,
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
}

impl Entry {
    fn new(pod: Arc<Pod>, status: PodStatus) -> Self {
        Self {
            pod,
            status,
            running_observed: false,
            terminating: false,
            evicted: None,
            eviction_grace: None,
            terminated: false,
        }
    }
}

/// The reason and message of a pod preempted to admit a critical pod (the kubelet's words).
pub const PREEMPTING: &str = "Preempting";
pub const PREEMPTED_MESSAGE: &str = "Preempted in order to admit critical pod";

/// The reason of an evicted pod's status.
pub const EVICTED: &str = "Evicted";

/// A pod admission rejected: it never runs and no worker writes its status, so it is kept as
/// the mux handed it (packed, for a manifest URL's pods: a few hundred bytes instead of some
/// 5 KiB) with what its status says, and its status is made when it is read.
struct Rejected {
    pod: PodRef,
    reason: &'static str,
    /// The status message (`Pod was rejected: ...`).
    message: Box<str>,
}

impl Rejected {
    fn status(&self, host_ip: Option<IpAddr>) -> PodStatus {
        PodStatus {
            phase: Some(Phase::Failed.as_str().into()),
            reason: Some(self.reason.to_owned()),
            message: Some(self.message.to_string()),
            host_ip: host_ip.map(|ip| ip.to_string()),
            ..Default::default()
        }
    }
}

/// The pods the agent was asked to run, by UID: the admitted ones and the rejected ones (a UID is
/// in one map at most).
#[derive(Default)]
struct Store {
    pods: BTreeMap<String, Entry>,
    rejected: BTreeMap<String, Rejected>,
}

/// Shared, cheap to clone. Writers: the sync loop (the desired pods: [`StatusManager::set_pod`],
/// [`StatusManager::remove_pod`]) and the pod's worker, the only writer of a pod's status
/// ([`StatusManager::update`]); admission writes the status of a pod it rejects, which never
/// gets a worker ([`StatusManager::reject`]). Everyone else only reads.
#[derive(Clone)]
pub struct StatusManager {
    inner: Arc<RwLock<Store>>,
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
    /// The pods whose status (or pod) changed since the API status writer last took them, with
    /// when each first changed since then.
    dirty: Arc<Mutex<BTreeMap<String, std::time::Instant>>>,
    /// Woken on every change of a pod.
    notify: Arc<tokio::sync::Notify>,
}

impl StatusManager {
    pub fn new(metrics: crate::metrics::Metrics) -> Self {
        Self {
            inner: Arc::default(),
            version: Arc::default(),
            pods_json: Arc::default(),
            host_ip: crate::cm::node_ip(),
            metrics,
            probes: None,
            dirty: Arc::default(),
            notify: Arc::default(),
        }
    }

    /// The write lock on every entry. A writer that changes what `/pods` shows calls
    /// [`Self::changed`] before releasing it.
    fn write(&self) -> Option<RwLockWriteGuard<'_, Store>> {
        self.inner.write().ok()
    }

    /// What `/pods` shows of pod `uid` changed. Call with the write lock held.
    fn changed(&self, uid: &str) {
        self.version.fetch_add(1, Ordering::Release);
        self.dirty
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(uid.to_owned())
            .or_insert_with(std::time::Instant::now);
        self.notify.notify_one();
    }

    /// The pods that changed since the last call, with when each first changed (the API status
    /// writer's feed).
    pub fn take_changed(&self) -> Vec<(String, std::time::Instant)> {
        std::mem::take(
            &mut *self
                .dirty
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
        .into_iter()
        .collect()
    }

    /// Woken (at most one waiter) after a pod changed.
    pub fn changes(&self) -> Arc<tokio::sync::Notify> {
        self.notify.clone()
    }

    /// Every pod known, admitted or rejected.
    pub fn uids(&self) -> Vec<String> {
        self.inner.read().map_or_else(
            |_| Vec::new(),
            |m| m.pods.keys().chain(m.rejected.keys()).cloned().collect(),
        )
    }

    /// What the API server is told of pod `uid`: the pod, its status, and whether its worker
    /// finished it (its resources are reclaimed).
    pub fn api_view(&self, uid: &str) -> Option<(Arc<Pod>, PodStatus, bool)> {
        let map = self.inner.read().ok()?;
        if let Some(e) = map.pods.get(uid) {
            return Some((e.pod.clone(), e.status.clone(), e.terminated));
        }
        let r = map.rejected.get(uid)?;
        let pod = r.pod.whole().ok()?;
        Some((pod, r.status(self.host_ip), true))
    }

    /// The pod's worker finished it: its containers are stopped and its cgroup and directories
    /// gone. Called only from the pod's worker.
    pub fn terminated(&self, uid: &str) {
        let Some(mut map) = self.write() else {
            return;
        };
        if let Some(e) = map.pods.get_mut(uid)
            && !e.terminated
        {
            e.terminated = true;
            self.changed(uid);
        }
    }

    /// Lets probe results decide the containers' `ready` and `started`.
    pub fn with_probe_results(mut self, probes: crate::pod::probe_results::Results) -> Self {
        self.probes = Some(probes);
        self
    }

    /// A copy of the pod's last computed status (probe workers read it).
    pub fn pod_status(&self, uid: &str) -> Option<PodStatus> {
        self.status(uid)
    }

    /// Adds or replaces the desired pod, keeping its status.
    pub fn set_pod(&self, uid: &str, pod: Arc<Pod>) {
        let Some(mut map) = self.write() else {
            return;
        };
        if map.rejected.contains_key(uid) {
            // A rejected pod stays rejected until its source removes it.
            return;
        }
        match map.pods.get_mut(uid) {
            Some(e) => {
                if !Arc::ptr_eq(&e.pod, &pod) && *e.pod != *pod {
                    self.changed(uid);
                }
                e.pod = pod;
            }
            None => {
                self.changed(uid);
                let status = PodStatus {
                    phase: Some(Phase::Pending.as_str().into()),
                    host_ip: self.host_ip.map(|ip| ip.to_string()),
                    qos_class: crate::pod::pod_qos(&pod)
                        .ok()
                        .map(|q| q.as_str().to_owned()),
                    ..Default::default()
                };
                map.pods.insert(uid.to_owned(), Entry::new(pod, status));
            }
        }
    }

    /// Admission rejected the pod: it never runs, and its status says why for as long as a
    /// source has it (kubelet `rejectPod`: phase Failed, the reason, "Pod was rejected: ...").
    pub fn reject(&self, uid: &str, pod: PodRef, reason: &'static str, message: &str) {
        let Some(mut map) = self.write() else {
            return;
        };
        map.pods.remove(uid);
        let rejected = Rejected {
            pod,
            reason,
            message: format!("Pod was rejected: {message}").into_boxed_str(),
        };
        map.rejected.insert(uid.to_owned(), rejected);
        self.changed(uid);
    }

    /// A rejected pod's source changed it: it stays rejected, shown as it is now.
    pub fn set_rejected_pod(&self, uid: &str, pod: PodRef) {
        let Some(mut map) = self.write() else {
            return;
        };
        if let Some(r) = map.rejected.get_mut(uid)
            && !r.pod.ptr_eq(&pod)
        {
            r.pod = pod;
            self.changed(uid);
        }
    }

    /// How many rejected pods are kept packed (tests).
    #[cfg(test)]
    pub fn rejected_packed(&self) -> usize {
        self.inner.read().map_or(0, |m| {
            m.rejected.values().filter(|r| r.pod.is_packed()).count()
        })
    }

    /// Whether admission rejected the pod.
    pub fn is_rejected(&self, uid: &str) -> bool {
        self.inner
            .read()
            .is_ok_and(|m| m.rejected.contains_key(uid))
    }

    pub fn remove_pod(&self, uid: &str) {
        if let Some(mut map) = self.write() {
            let pod = map.pods.remove(uid).is_some();
            let rejected = map.rejected.remove(uid).is_some();
            if pod || rejected {
                self.changed(uid);
            }
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
        let Some(entry) = map.pods.get_mut(uid) else {
            return false;
        };
        let mut first_running = false;
        let mut status = generate_probed(
            &entry.pod,
            state,
            waiting,
            Some(&entry.status),
            self.host_ip,
            self.probes.as_ref(),
        );
        if entry.terminating {
            generate::not_ready(&mut status, Some(&entry.status));
        }
        if let Some((reason, message)) = &entry.evicted {
            status.phase = Some(crate::pod::Phase::Failed.as_str().to_owned());
            status.reason = Some((*reason).to_owned());
            status.message = Some(message.clone());
        }
        if Phase::of(status.phase.as_deref()) == Some(Phase::Running) && !entry.running_observed {
            entry.running_observed = true;
            first_running = true;
            self.observe_start(&entry.pod);
        }
        if status.reason.as_deref() == Some(deadline::REASON)
            && entry.status.reason.as_deref() != Some(deadline::REASON)
        {
            tracing::info!(
                pod = %crate::pod::full_name(&entry.pod),
                active_deadline_seconds = deadline::seconds(&entry.pod),
                start_time = ?status.start_time.as_ref().map(|t| t.0),
                "pod failed: {}", deadline::MESSAGE
            );
        }
        if status != entry.status {
            self.changed(uid);
            entry.status = status;
        }
        first_running
    }

    /// The pod's worker starts killing it: from now on its status shows no container ready and
    /// the Ready and ContainersReady conditions False (reason `PodTerminating`), whatever its
    /// containers still run; the phase stays what the containers make it, as the kubelet keeps
    /// it. Called only from the pod's worker.
    pub fn terminating(&self, uid: &str) {
        let Some(mut map) = self.write() else {
            return;
        };
        let Some(entry) = map.pods.get_mut(uid) else {
            return;
        };
        entry.terminating = true;
        let mut status = entry.status.clone();
        generate::not_ready(&mut status, Some(&entry.status));
        if status != entry.status {
            entry.status = status;
            self.changed(uid);
        }
    }

    /// Where `pod` stands against its `activeDeadlineSeconds` now, counted from the start time of
    /// its last computed status, else the one the pod came with (the kubelet's
    /// `pastActiveDeadline`).
    pub fn active_deadline(&self, uid: &str, pod: &Pod) -> deadline::Deadline {
        if deadline::seconds(pod).is_none() {
            return deadline::Deadline::Unset;
        }
        let recorded = self
            .inner
            .read()
            .ok()
            .and_then(|m| m.pods.get(uid).and_then(|e| e.status.start_time.clone()));
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
        self.metrics
            .pod_start_duration_seconds
            .observe(secs.max(0.0));
        tracing::info!(
            pod = pod.metadata.name.as_deref().unwrap_or_default(),
            seconds = secs,
            "pod observed Running"
        );
    }

    /// Whether the pod is one the agent was asked to run.
    pub fn knows(&self, uid: &str) -> bool {
        self.inner
            .read()
            .is_ok_and(|m| m.pods.contains_key(uid) || m.rejected.contains_key(uid))
    }

    /// The UID and last computed status of the pod called `name` in `namespace` (a desired pod;
    /// a rejected one never ran). Looked up by walking the pods: the kubelet API's requests are
    /// rare beside the syncs that use the UID index.
    pub fn find(&self, namespace: &str, name: &str) -> Option<(String, PodStatus)> {
        let map = self.inner.read().ok()?;
        map.pods.iter().find_map(|(uid, e)| {
            let meta = &e.pod.metadata;
            (meta.name.as_deref() == Some(name)
                && meta.namespace.as_deref().unwrap_or("default") == namespace)
                .then(|| (uid.clone(), e.status.clone()))
        })
    }

    /// Every desired pod with its UID and start time (the stats summary's pod list).
    pub fn pods_started(
        &self,
    ) -> Vec<(
        String,
        Arc<Pod>,
        Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    )> {
        let Ok(map) = self.inner.read() else {
            return Vec::new();
        };
        map.pods
            .iter()
            .map(|(uid, e)| (uid.clone(), e.pod.clone(), e.status.start_time.clone()))
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
        let Some(mut map) = self.write() else {
            return false;
        };
        match map.pods.get_mut(uid) {
            Some(e) => {
                if e.evicted.is_none() {
                    e.evicted = Some((reason, message.to_owned()));
                    e.eviction_grace = grace;
                }
                true
            }
            None => false,
        }
    }

    /// The grace period an evicted pod is stopped with, when the eviction set one.
    pub fn eviction_grace(&self, uid: &str) -> Option<i64> {
        self.inner
            .read()
            .ok()
            .and_then(|m| m.pods.get(uid).and_then(|e| e.eviction_grace))
    }

    /// Whether the eviction manager evicted the pod.
    pub fn is_evicted(&self, uid: &str) -> bool {
        self.inner
            .read()
            .is_ok_and(|m| m.pods.get(uid).is_some_and(|e| e.evicted.is_some()))
    }

    /// The pod's last computed status.
    pub fn status(&self, uid: &str) -> Option<PodStatus> {
        let map = self.inner.read().ok()?;
        match map.pods.get(uid) {
            Some(e) => Some(e.status.clone()),
            None => map.rejected.get(uid).map(|r| r.status(self.host_ip)),
        }
    }

    /// Whether the pod's last computed phase is Succeeded or Failed.
    pub fn is_terminal(&self, uid: &str) -> bool {
        self.inner.read().is_ok_and(|m| {
            m.rejected.contains_key(uid)
                || m.pods.get(uid).is_some_and(|e| {
                    Phase::of(e.status.phase.as_deref()).is_some_and(Phase::is_terminal)
                })
        })
    }

    /// How many of `uids` are not known to have finished (phase neither Succeeded nor Failed):
    /// the pods admission counts against `--max-pods`. One read lock for all of them.
    pub fn count_active<'a>(&self, uids: impl Iterator<Item = &'a String>) -> usize {
        let Ok(map) = self.inner.read() else {
            return 0;
        };
        uids.filter(|uid| {
            !map.rejected.contains_key(*uid)
                && !map.pods.get(*uid).is_some_and(|e| {
                    Phase::of(e.status.phase.as_deref()).is_some_and(Phase::is_terminal)
                })
        })
        .count()
    }

    pub fn running_count(&self) -> usize {
        self.inner
            .read()
            .map(|m| {
                m.pods
                    .values()
                    .filter(|e| Phase::of(e.status.phase.as_deref()) == Some(Phase::Running))
                    .count()
            })
            .unwrap_or(0)
    }
}
