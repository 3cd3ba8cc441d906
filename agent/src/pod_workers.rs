//! Pod workers: one task per pod UID with a single pending slot (the kubelet's `podWorkers`).
//!
//! * [`PodWorkers::update_pod`] puts the newest update into the pod's pending slot, replacing the
//!   one waiting there (coalescing: a burst of edits costs at most one more sync).
//! * A pod's lifecycle is sync -> terminating -> terminated. What a worker does next is derived from
//!   that state, not from the kind of the update that woke it, so a later Update or Sync can never
//!   undo a kill. A move to terminating (a kill, a deletion, a terminal phase) cancels a sync in
//!   progress at its next safe point (CRI calls already sent finish first, as in the kubelet) and
//!   a kill in progress when the grace period shrinks. The grace period only shrinks and never
//!   goes below 1 s.
//! * A terminated UID does not start again: a Create for it only sets `restart_requested`;
//!   housekeeping ([`PodWorkers::sync_known_pods`]) purges finished workers and tells the sync loop
//!   which ones to create afresh. Finished workers are removed.
//! * Static pods with the same full name run one at a time, first come first served. Unlike the
//!   kubelet (which retries a waiting static pod after a jittered 10 s back-off), the next one
//!   starts as soon as the previous one has finished.
//! * Runtime pods that no source knows are killed with a 1 s grace period (`Work::orphan_kill`).
//! * `activeDeadlineSeconds`: a sync of a pod whose deadline lies ahead requeues it at the time
//!   left ([`Synced::deadline_in`]); a pod past it is not synced with the runtime any more: its
//!   status turns Failed (`DeadlineExceeded`), which ends it like any terminal phase.
//!
//! Each worker marks its pod's timeline ([`Marks`]) for the eBPF report, readable through
//! [`Timelines`]. Runtime calls go through [`PodSyncer`], so the state machine is tested without
//! containerd. The worker is the only place that changes a pod's runtime state.
use crate::pod::deadline::Deadline;
use crate::runtime::{self, Manager};
use crate::status::StatusManager;
use crate::work_queue::WorkQueue;
use k8s_openapi::api::core::v1::Pod;
use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::Duration;
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateType {
    Create,
    Update,
    Sync,
    Kill,
}

impl UpdateType {
    pub fn as_str(self) -> &'static str {
        match self {
            UpdateType::Create => "create",
            UpdateType::Update => "update",
            UpdateType::Sync => "sync",
            UpdateType::Kill => "kill",
        }
    }
}

/// What a worker does with its pod, derived from the pod's lifecycle state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkType {
    Sync,
    Terminating,
    Terminated,
}

/// One update for a pod worker.
#[derive(Debug, Clone)]
pub struct Work {
    pub kind: UpdateType,
    pub pod: Arc<Pod>,
    /// Kill only: grace period override in seconds.
    pub grace: Option<i64>,
    /// Kill only: the pod is known only from the runtime (`pod` is a placeholder with its UID
    /// and name).
    pub runtime_only: bool,
    /// When the update was made ([`monotonic_ns`]).
    pub received: u64,
}

impl Work {
    pub fn new(kind: UpdateType, pod: Arc<Pod>) -> Self {
        Self {
            kind,
            pod,
            grace: None,
            runtime_only: false,
            received: monotonic_ns(),
        }
    }

    /// A kill with an optional grace-period override.
    pub fn kill(pod: Arc<Pod>, grace: Option<i64>) -> Self {
        Self {
            grace,
            ..Self::new(UpdateType::Kill, pod)
        }
    }

    /// A kill of a pod only the runtime knows, with the kubelet's 1 s grace period.
    pub fn orphan_kill(uid: &str) -> Self {
        let mut pod = Pod::default();
        pod.metadata.uid = Some(uid.to_owned());
        pod.metadata.name = Some(format!("orphan-{uid}"));
        Self {
            grace: Some(ORPHAN_GRACE),
            runtime_only: true,
            ..Self::new(UpdateType::Kill, Arc::new(pod))
        }
    }
}

/// Nanoseconds of CLOCK_MONOTONIC: the clock eBPF's `bpf_ktime_get_ns` reads, so marks line up
/// with kernel events.
pub fn monotonic_ns() -> u64 {
    // CLOCK_MONOTONIC always exists on Linux: this cannot fail.
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// A pod's timeline as its worker saw it, in [`monotonic_ns`] (0 = not yet).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Marks {
    pub first_update_received: u64,
    pub update_received: u64,
    pub first_sync_started: u64,
    pub sync_started: u64,
    pub first_sync_finished: u64,
    pub sync_finished: u64,
    /// Updates handed to the worker, and pieces of work it ran.
    pub updates: u64,
    pub syncs: u64,
}

impl Marks {
    fn update_received(&mut self, t: u64) {
        if self.first_update_received == 0 {
            self.first_update_received = t;
        }
        self.update_received = t;
        self.updates += 1;
    }

    fn sync_started(&mut self, t: u64) {
        if self.first_sync_started == 0 {
            self.first_sync_started = t;
        }
        self.sync_started = t;
        self.syncs += 1;
    }

    fn sync_finished(&mut self, t: u64) {
        if self.first_sync_finished == 0 {
            self.first_sync_finished = t;
        }
        self.sync_finished = t;
    }
}

/// Minimum grace period a pod worker applies to a kill.
pub const MIN_GRACE: i64 = 1;
/// Grace period for runtime pods no source knows.
pub const ORPHAN_GRACE: i64 = 1;
/// Periodic resync of a healthy pod (the kubelet's syncFrequency, `--sync-frequency`; this is
/// its default), jittered by up to 50 %.
pub const RESYNC: Duration = crate::work_queue::DEFAULT_RESYNC;
/// Retry delay after a failed piece of work, jittered by up to 50 % (the kubelet's). A pod that
/// keeps failing costs one sync every 10-15 s, however many such pods a source sends.
pub const ERROR_BACKOFF: Duration = Duration::from_secs(10);
/// A pod's failure repeated with the same error is logged again only after this long (with how
/// many times it failed meanwhile); a new error is logged at once.
pub const REPEAT_WARNING: Duration = Duration::from_secs(300);
const JITTER: f64 = 0.5;
/// Quick in-worker retries of a failed kill: 100 ms doubling while <= 800 ms (1.5 s in all).
const KILL_RETRY_BASE: Duration = Duration::from_millis(100);
const KILL_RETRY_MAX: Duration = Duration::from_millis(800);

/// What a successful sync found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Synced {
    /// The pod reached Succeeded or Failed: it is terminated and never synced again.
    pub terminal: bool,
    /// Look again this soon (for example when a crash-loop back-off ends).
    pub requeue_after: Option<Duration>,
    /// The pod's `activeDeadlineSeconds` passes this soon: it is synced again then at the
    /// latest, whatever `requeue_after` or the periodic resync say.
    pub deadline_in: Option<Duration>,
    /// A terminal pod is stopped with this grace period rather than its own (an eviction's).
    pub grace_override: Option<i64>,
}

/// The runtime calls a worker makes. [`WorkerContext`] is the real one; tests use a fake.
pub trait PodSyncer: Send + Sync + 'static {
    /// Brings the runtime in line with the pod and refreshes its status. `cancel` fires when the
    /// pod starts terminating: the sync should stop at its next safe point. CRI calls already sent
    /// must be let finish (as the kubelet runs the runtime's SyncPod without cancellation): a
    /// RunPodSandbox cut off mid-way leaves runc's cgroups behind. Each call still ends by its
    /// deadline (`--runtime-request-timeout`, see `cri`), so a runtime that never answers fails
    /// the sync instead of holding the worker.
    ///
    /// `superseded` fires when an update with another spec is waiting: the sync should not
    /// create or start containers for the spec it was given (the next sync has the newer one).
    fn sync_pod(
        &self,
        uid: &str,
        pod: &Pod,
        cancel: &CancellationToken,
        superseded: &CancellationToken,
    ) -> impl Future<Output = Result<Synced, runtime::Error>> + Send;
    /// Stops everything the pod runs within `grace` seconds.
    fn sync_terminating_pod(
        &self,
        uid: &str,
        pod: &Pod,
        grace: i64,
    ) -> impl Future<Output = Result<(), runtime::Error>> + Send;
    /// Last step once nothing runs.
    fn sync_terminated_pod(
        &self,
        uid: &str,
        pod: &Pod,
    ) -> impl Future<Output = Result<(), runtime::Error>> + Send;
    /// One piece of work done, `secs` after its update was received.
    fn observe(&self, _op: UpdateType, _secs: f64) {}
    /// Housekeeping's share of the runtime's bookkeeping (back-off tables).
    fn housekeeping(&self) {}
    /// Housekeeping: remove the pod cgroups and pod log directories of pods not in `known`,
    /// off the caller's thread.
    fn cleanup_orphans(&self, _known: HashSet<String>) {}
}

/// How often a pod's status is refreshed from the runtime while its kill runs.
const STATUS_DURING_KILL: Duration = Duration::from_secs(1);

/// The real runtime calls.
#[derive(Clone)]
pub struct WorkerContext {
    pub runtime: Manager,
    /// The pod cache, read for the container exits the kernel saw before the runtime did.
    pub pod_cache: crate::pod_cache::PodCache,
    /// The container garbage collector housekeeping starts.
    pub container_gc: crate::container_gc::ContainerGc,
    /// Housekeeping's finder of pod cgroups and directories no pod owns.
    pub orphans: crate::orphans::Orphans,
    pub status: StatusManager,
    pub metrics: crate::metrics::Metrics,
    pub tracer: crate::trace::Tracer,
    pub probes: crate::prober::Manager,
}

impl PodSyncer for WorkerContext {
    async fn sync_pod(
        &self,
        uid: &str,
        pod: &Pod,
        cancel: &CancellationToken,
        superseded: &CancellationToken,
    ) -> Result<Synced, runtime::Error> {
        // `Manager::sync_pod`'s safe points: a postStart hook still running is abandoned when
        // the pod starts terminating, and no container is created or started once a newer spec
        // waits. Everything else runs to its end (see the trait).
        let name = crate::pod::full_name(pod);
        if self.status.active_deadline(uid, pod) == Deadline::Exceeded
            || self.status.is_evicted(uid)
        {
            // Past its deadline or evicted: its status turns Failed, and the terminal pod is
            // stopped.
            return self.fail_deadline(uid, pod).await;
        }
        // The pod's timeline: only the first sync counts.
        self.tracer.worker_started(uid);
        self.probes.add_pod(uid, pod);
        let mut result = self.runtime.sync_pod(pod, cancel, superseded).await;
        if let Some(at) = result.as_ref().ok().and_then(|o| o.volumes_set_up) {
            // An Instant is CLOCK_MONOTONIC too: the mark is that long before now.
            let ago = u64::try_from(at.elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.tracer
                .volumes_set_up(uid, monotonic_ns().saturating_sub(ago));
        }
        // The state after the sync, when the sync knows it; else it is read back.
        let known = result.as_mut().ok().and_then(|o| o.state.take());
        let waiting = match &result {
            Ok(outcome) => outcome.waiting.clone(),
            Err(e) => {
                let reason = (e.reason().to_owned(), e.to_string());
                pod.spec
                    .iter()
                    .flat_map(|s| &s.containers)
                    .map(|c| (c.name.clone(), reason.clone()))
                    .collect()
            }
        };
        let state = match known {
            Some(state) => Ok(state),
            None => self.runtime.pod_state_own_read(uid, "worker").await,
        };
        // The pod worker is the only writer of a pod's status: the PLEG writes the pod cache
        // (its reads, the exits the kernel saw) and sends events that sync the pod here.
        let mut kernel_seen = false;
        match state {
            Ok(state) => {
                let (state, overlaid) = self.with_kernel_exits(uid, state);
                kernel_seen = overlaid;
                if self.status.update(uid, &state, &waiting) {
                    self.tracer.running_observed(uid);
                }
            }
            Err(e) => tracing::warn!(pod = %name, error = %e, "reading pod state"),
        }
        let outcome = result?;
        let deadline = self.status.active_deadline(uid, pod);
        // An exit only the kernel has seen shows in the status at once, but the pod is acted on
        // (terminated) once the runtime has recorded it: the PLEG's relist syncs it again then.
        // A pod past its deadline is stopped whatever its containers do.
        let terminal = outcome.terminal
            || ((!kernel_seen || deadline == Deadline::Exceeded) && self.status.is_terminal(uid));
        Ok(Synced {
            terminal,
            requeue_after: outcome.requeue_after,
            deadline_in: match deadline {
                Deadline::In(left) => Some(left),
                _ => None,
            },
            grace_override: None,
        })
    }

    async fn sync_terminating_pod(
        &self,
        uid: &str,
        pod: &Pod,
        grace: i64,
    ) -> Result<(), runtime::Error> {
        let name = crate::pod::full_name(pod);
        self.probes.stop_liveness_and_startup(uid);
        if self.status.is_terminal(uid) && pod.metadata.deletion_timestamp.is_none() {
            // Finished but still wanted: stop, keep the containers for status and logs.
            self.runtime.stop_pod(&name, uid, grace).await?;
            self.probes.remove_pod(uid);
            // The final status shows the stopped sandbox (the kubelet's SyncTerminatingPod).
            match self.runtime.pod_state_own_read(uid, "kill").await {
                Ok(state) => {
                    self.status.update(uid, &state, &HashMap::new());
                }
                Err(e) => tracing::warn!(pod = %name, error = %e, "reading the stopped pod"),
            }
            tracing::info!(pod = %name, grace, "finished pod stopped");
            return Ok(());
        }
        // Not Ready from now on; the containers show terminated as they stop (the status is
        // refreshed every STATUS_DURING_KILL while the kill runs).
        self.status.terminating(uid);
        let refresh = async {
            let mut every = tokio::time::interval(STATUS_DURING_KILL);
            every.tick().await;
            loop {
                every.tick().await;
                if let Ok(state) = self.runtime.pod_state_own_read(uid, "kill").await {
                    self.status.update(uid, &state, &HashMap::new());
                }
            }
        };
        // Both run at once; the refresh (possibly mid-read) ends with the kill.
        tokio::select! {
            r = self.runtime.kill_pod(&name, uid, grace) => r?,
            () = refresh => {}
        }
        self.probes.remove_pod(uid);
        tracing::info!(pod = %name, grace, "pod terminated");
        Ok(())
    }

    async fn sync_terminated_pod(&self, uid: &str, _pod: &Pod) -> Result<(), runtime::Error> {
        // kill_pod already removed the pod cgroup and its logs directory; the status keeps the
        // last phase it showed.
        self.probes.remove_pod(uid);
        self.runtime.release_api_objects(uid);
        self.status.terminated(uid);
        Ok(())
    }

    fn housekeeping(&self) {
        self.runtime.gc_backoffs();
        self.runtime.images().gc_backoffs();
        self.container_gc.collect_stale_sandboxes_in_background(
            self.metrics.stale_sandbox_objects_removed_total.clone(),
        );
    }

    fn cleanup_orphans(&self, known: HashSet<String>) {
        // Only when an orphan can have appeared (a pod left, one to confirm, or the period).
        if !self.orphans.begin_scan(&known) {
            return;
        }
        let orphans = self.orphans.clone();
        // Walking the cgroup tree and the log directory, killing leftovers, rmdir retries and
        // removing files block: off the sync loop's thread.
        tokio::task::spawn_blocking(move || {
            orphans.scan(&known);
            // What pods and large inputs freed goes back to the system (at most every 10 s;
            // a scan runs at least that often).
            crate::memory::release_free_memory();
        });
    }

    fn observe(&self, op: UpdateType, secs: f64) {
        self.metrics.pod_worker(op.as_str(), secs);
    }
}

impl WorkerContext {
    /// `state` with the container exits the kernel saw and the runtime has not recorded yet,
    /// and whether there were any.
    fn with_kernel_exits(
        &self,
        uid: &str,
        mut state: crate::pod::PodState,
    ) -> (crate::pod::PodState, bool) {
        let overlaid = self.pod_cache.lock().overlay(uid, &mut state);
        (state, overlaid)
    }

    /// A pod past its active deadline: nothing is started or restarted any more. Its status,
    /// from what the runtime holds now, shows phase Failed with reason `DeadlineExceeded`, and
    /// the pod is terminal, so the worker stops it with its grace period (the kubelet's syncPod
    /// returns before the runtime's sync once the status it generated is terminal).
    async fn fail_deadline(&self, uid: &str, pod: &Pod) -> Result<Synced, runtime::Error> {
        let state = self
            .runtime
            .pod_state_own_read(uid, "worker")
            .await
            .map_err(|source| runtime::Error::Cri {
                pod: crate::pod::full_name(pod),
                source,
            })?;
        let (state, _) = self.with_kernel_exits(uid, state);
        self.status.update(uid, &state, &HashMap::new());
        Ok(Synced {
            terminal: self.status.is_terminal(uid),
            grace_override: self.status.eviction_grace(uid),
            ..Default::default()
        })
    }
}

/// Per-UID state (the kubelet's `podSyncStatus`), shared by the sync loop and the pod's worker.
#[derive(Debug, Default)]
struct PodStatus {
    full_name: String,
    /// The newest update not yet taken by the worker.
    pending: Option<Work>,
    /// The pod of the last update handed to a sync function.
    active: Option<Arc<Pod>>,
    /// The worker task exists (static pods wait for their turn before it is spawned).
    spawned: bool,
    /// The worker has run work for this pod.
    started: bool,
    terminating: bool,
    terminated: bool,
    /// Effective grace period in seconds once terminating (0 = not computed yet).
    grace: i64,
    finished: bool,
    restart_requested: bool,
    runtime_only: bool,
    /// Cancels the work in progress.
    cancel: Option<CancellationToken>,
    /// Tells the sync in progress that an update with another spec is waiting.
    superseded: Option<CancellationToken>,
    marks: Marks,
    warned: Warned,
}

/// The last failure a pod's worker logged, to keep a failing pod from filling the log.
#[derive(Debug, Default)]
struct Warned {
    error: String,
    /// When it was logged (monotonic ns).
    at: u64,
    /// Failures with the same error not logged since.
    suppressed: u32,
}

impl Warned {
    /// Whether failure `error` at `now` is logged; `Some(n)` says `n` were held back before it.
    fn should_log(&mut self, error: &str, now: u64) -> Option<u32> {
        let due = now.saturating_sub(self.at) >= REPEAT_WARNING.as_nanos() as u64;
        if self.error != error || due || self.at == 0 {
            let held = self.suppressed;
            *self = Warned {
                error: error.to_owned(),
                at: now.max(1),
                suppressed: 0,
            };
            Some(held)
        } else {
            self.suppressed += 1;
            None
        }
    }
}

impl PodStatus {
    fn work_type(&self) -> WorkType {
        if self.terminated {
            WorkType::Terminated
        } else if self.terminating {
            WorkType::Terminating
        } else {
            WorkType::Sync
        }
    }

    /// Re-queues the last update so the worker runs the next step of the lifecycle.
    fn requeue_last(&mut self) {
        if self.pending.is_none()
            && let Some(pod) = &self.active
        {
            let mut w = Work::new(UpdateType::Sync, pod.clone());
            w.runtime_only = self.runtime_only;
            self.pending = Some(w);
        }
    }
}

struct Slot {
    state: Mutex<PodStatus>,
    notify: Notify,
}

impl Slot {
    fn lock(&self) -> MutexGuard<'_, PodStatus> {
        // Every update leaves the state consistent; a poisoned lock still holds valid data.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The effective grace period (kubelet `calculateEffectiveGracePeriod`): it only shrinks, never
/// below [`MIN_GRACE`]. Returns `(grace, shortened)`.
pub fn effective_grace(current: i64, pod: &Pod, over: Option<i64>) -> (i64, bool) {
    let mut gp = current;
    let mut overridden = false;
    for candidate in [pod.metadata.deletion_grace_period_seconds, over]
        .into_iter()
        .flatten()
    {
        if gp == 0 || candidate < gp {
            gp = candidate;
            overridden = true;
        }
    }
    if !overridden && gp == 0 {
        gp = pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(30);
    }
    let gp = gp.max(MIN_GRACE);
    (gp, current != 0 && gp != current)
}

/// What `accept` did with an update.
#[derive(Debug, PartialEq, Eq)]
enum Accepted {
    Ignored,
    /// Queued; cancel the work in progress (a move to terminating, or a shorter grace period).
    Queued {
        cancel: bool,
    },
}

/// `UpdatePod` steps 3-10 on one pod's state (the kubelet's `podWorkers.UpdatePod`).
fn accept(st: &mut PodStatus, mut work: Work, first: bool) -> Accepted {
    if work.runtime_only {
        // A pod a source gave us is a better description than the runtime's placeholder.
        let known = st
            .pending
            .as_ref()
            .filter(|w| !w.runtime_only)
            .map(|w| w.pod.clone())
            .or_else(|| st.active.clone().filter(|_| !st.runtime_only));
        if let Some(pod) = known {
            work.pod = pod;
            work.runtime_only = false;
        }
    } else {
        st.runtime_only = false;
    }
    if !first && st.terminating && work.kind == UpdateType::Create {
        st.restart_requested = true;
        return Accepted::Ignored;
    }
    if st.finished {
        return Accepted::Ignored;
    }
    // Runtime-only pods, deleted pods, terminal pods and kills all start terminating.
    let became_terminating = !st.terminating
        && (work.runtime_only
            || work.pod.metadata.deletion_timestamp.is_some()
            || crate::pod::source_phase_is_terminal(&work.pod)
            || work.kind == UpdateType::Kill);
    st.terminating |= became_terminating;
    let mut shortened = false;
    if st.terminated {
        if work.runtime_only {
            return Accepted::Ignored;
        }
    } else if st.terminating {
        let over = if work.kind == UpdateType::Kill {
            work.grace
        } else {
            None
        };
        let (gp, s) = effective_grace(st.grace, &work.pod, over);
        st.grace = gp;
        shortened = s;
    }
    st.marks.update_received(work.received);
    if let Some(p) = &st.pending {
        // Keep the earliest receipt time for latency accounting.
        work.received = work.received.min(p.received);
    }
    st.pending = Some(work);
    Accepted::Queued {
        cancel: became_terminating || shortened,
    }
}

/// A finished or purged worker, as [`PodWorkers::sync_known_pods`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Purged {
    pub uid: String,
    /// A Create arrived while it was terminating: the sync loop creates it afresh if still wanted.
    pub restart_requested: bool,
}

/// Reads pod timelines from any task.
#[derive(Clone, Default)]
pub struct Timelines {
    slots: Arc<RwLock<HashMap<String, Arc<Slot>>>>,
}

impl Timelines {
    /// The marks of the pod with this UID, while its worker exists.
    pub fn get(&self, uid: &str) -> Option<Marks> {
        let slots = self.slots.read().unwrap_or_else(PoisonError::into_inner);
        slots.get(uid).map(|s| s.lock().marks)
    }

    /// Every pod's marks.
    pub fn all(&self) -> Vec<(String, Marks)> {
        let slots = self.slots.read().unwrap_or_else(PoisonError::into_inner);
        slots
            .iter()
            .map(|(uid, s)| (uid.clone(), s.lock().marks))
            .collect()
    }
}

/// Hashes pod UIDs for the workers map: a multiply-rotate over 8-byte words with a per-process
/// random seed. SipHash (the std default) costs about 20 ns for a 36-byte UID; UIDs are UUIDs or
/// content hashes, so the cheaper hash suffices (the seed keeps collisions unpredictable).
#[derive(Clone, Copy, Debug)]
pub struct UidHash {
    seed: u64,
}

impl Default for UidHash {
    fn default() -> Self {
        let seed = monotonic_ns() ^ u64::from(std::process::id()).rotate_left(32);
        Self { seed: seed | 1 }
    }
}

impl std::hash::BuildHasher for UidHash {
    type Hasher = UidHasher;
    fn build_hasher(&self) -> UidHasher {
        UidHasher(self.seed)
    }
}

/// The hasher of [`UidHash`].
#[derive(Debug)]
pub struct UidHasher(u64);

impl UidHasher {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;

    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(Self::K);
    }
}

impl std::hash::Hasher for UidHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 59));
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    fn finish(&self) -> u64 {
        // Final avalanche so the low bits the table uses depend on every input bit.
        let mut z = self.0;
        z = (z ^ (z >> 33)).wrapping_mul(0xFF51_AFD7_ED55_8CCD);
        z ^ (z >> 33)
    }
}

/// Owned by the sync loop.
pub struct PodWorkers<S: PodSyncer = WorkerContext> {
    workers: HashMap<String, Arc<Slot>, UidHash>,
    syncer: Arc<S>,
    queue: WorkQueue,
    done_tx: mpsc::UnboundedSender<String>,
    tracker: TaskTracker,
    cancel: CancellationToken,
    /// Static pods: the one started per full name, and the ones waiting (FIFO).
    started_static: HashMap<String, String>,
    waiting_static: HashMap<String, VecDeque<String>>,
    timelines: Timelines,
}

impl<S: PodSyncer> PodWorkers<S> {
    /// Lets the runtime side do its periodic bookkeeping (called from housekeeping).
    pub fn runtime_housekeeping(&self) {
        self.syncer.housekeeping();
    }

    /// The UIDs of every pod that has a worker.
    pub fn known_uids(&self) -> impl Iterator<Item = String> + '_ {
        self.workers.keys().cloned()
    }

    pub fn cleanup_orphans(&self, known: HashSet<String>) {
        self.syncer.cleanup_orphans(known);
    }

    /// `done_tx` receives the UID of each worker that finished its pod (terminated).
    pub fn new(
        syncer: S,
        done_tx: mpsc::UnboundedSender<String>,
        tracker: TaskTracker,
        cancel: CancellationToken,
    ) -> Self {
        Self {
            workers: HashMap::default(),
            syncer: Arc::new(syncer),
            queue: WorkQueue::new(),
            done_tx,
            tracker,
            cancel,
            started_static: HashMap::new(),
            waiting_static: HashMap::new(),
            timelines: Timelines::default(),
        }
    }

    /// Syncs healthy pods every `resync` (jittered) instead of every minute.
    pub fn with_sync_frequency(mut self, resync: Duration) -> Self {
        self.queue = self.queue.with_resync(resync);
        self
    }

    /// The queue of resyncs and retries; the sync loop's 1 s tick drains it.
    pub fn queue(&self) -> &WorkQueue {
        &self.queue
    }

    pub fn timelines(&self) -> Timelines {
        self.timelines.clone()
    }

    pub fn is_known(&self, uid: &str) -> bool {
        self.workers.contains_key(uid)
    }

    /// Termination was requested (kubelet `IsPodTerminationRequested`).
    pub fn is_terminating(&self, uid: &str) -> bool {
        self.workers.get(uid).is_some_and(|s| s.lock().terminating)
    }

    /// The pod's worker has finished it (kubelet `ShouldPodBeFinished` for a known UID).
    pub fn is_finished(&self, uid: &str) -> bool {
        self.workers.get(uid).is_some_and(|s| s.lock().finished)
    }

    pub fn len(&self) -> usize {
        self.workers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// Hands an update to the pod's worker, creating the worker if needed (kubelet `UpdatePod`).
    pub fn update_pod(&mut self, uid: &str, work: Work) {
        if let Some(slot) = self.workers.get(uid) {
            let mut st = slot.lock();
            let Accepted::Queued { cancel } = accept(&mut st, work, false) else {
                return;
            };
            if !st.spawned {
                if st.terminating {
                    // A static pod killed before its turn: it never starts.
                    drop(st);
                    self.cleanup_unstarted(uid);
                }
                return;
            }
            if cancel && let Some(t) = &st.cancel {
                t.cancel();
            } else if let Some(t) = &st.superseded
                && !st.terminating
                && spec_differs(st.pending.as_ref().map(|w| &w.pod), st.active.as_ref())
            {
                // A sync runs for an older spec: it stops before starting anything for it.
                t.cancel();
            }
            drop(st);
            slot.notify.notify_one();
            return;
        }
        if work.runtime_only && work.kind != UpdateType::Kill {
            return;
        }
        let is_static = !work.runtime_only && crate::pod::is_static(&work.pod);
        let mut st = PodStatus {
            full_name: crate::pod::full_name(&work.pod),
            runtime_only: work.runtime_only,
            ..Default::default()
        };
        if accept(&mut st, work, true) == Accepted::Ignored {
            return;
        }
        let full_name = st.full_name.clone();
        let terminating = st.terminating;
        let slot = Arc::new(Slot {
            state: Mutex::new(st),
            notify: Notify::new(),
        });
        self.workers.insert(uid.to_owned(), slot.clone());
        self.timelines
            .slots
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(uid.to_owned(), slot);
        if is_static {
            self.waiting_static
                .entry(full_name.clone())
                .or_default()
                .push_back(uid.to_owned());
            if terminating {
                // Terminal or killed before it ever started: it never starts.
                self.cleanup_unstarted(uid);
            } else {
                self.start_next_static(&full_name);
            }
        } else {
            self.spawn(uid);
        }
    }

    fn spawn(&mut self, uid: &str) {
        let Some(slot) = self.workers.get(uid) else {
            return;
        };
        slot.lock().spawned = true;
        let worker = Worker {
            uid: uid.to_owned(),
            slot: slot.clone(),
            syncer: self.syncer.clone(),
            queue: self.queue.clone(),
            done_tx: self.done_tx.clone(),
            cancel: self.cancel.clone(),
        };
        self.tracker.spawn(worker.run());
    }

    /// Starts the first live static pod waiting for `full_name`, unless one is started.
    fn start_next_static(&mut self, full_name: &str) {
        if self.started_static.contains_key(full_name) {
            return;
        }
        loop {
            let Some(uid) = self
                .waiting_static
                .get_mut(full_name)
                .and_then(VecDeque::pop_front)
            else {
                self.waiting_static.remove(full_name);
                return;
            };
            let live = self
                .workers
                .get(&uid)
                .is_some_and(|s| !s.lock().terminating);
            if live {
                self.started_static
                    .insert(full_name.to_owned(), uid.clone());
                self.spawn(&uid);
                return;
            }
        }
    }

    /// A pod whose termination was requested before it ever started: finished without syncing.
    fn cleanup_unstarted(&mut self, uid: &str) {
        let Some(slot) = self.workers.get(uid) else {
            return;
        };
        let full_name = {
            let mut st = slot.lock();
            st.terminated = true;
            st.finished = true;
            st.pending = None;
            st.full_name.clone()
        };
        if let Some(q) = self.waiting_static.get_mut(&full_name) {
            q.retain(|u| u != uid);
        }
        let _ = self.done_tx.send(uid.to_owned());
    }

    fn release_static(&mut self, uid: &str, full_name: &str) {
        if self.started_static.get(full_name).is_some_and(|u| u == uid) {
            self.started_static.remove(full_name);
        }
        if let Some(q) = self.waiting_static.get_mut(full_name) {
            q.retain(|u| u != uid);
        }
        self.start_next_static(full_name);
    }

    /// Housekeeping's purge (kubelet `SyncKnownPods`): drives workers of pods no longer desired to
    /// termination, removes finished workers that are orphans or asked to restart, and returns
    /// those removed.
    pub fn sync_known_pods<V>(&mut self, desired: &HashMap<String, V>) -> Vec<Purged> {
        self.purge(desired, None)
    }

    /// A worker reported its pod finished: its static slot goes to the next pod with that name,
    /// and the worker is purged at once if no longer desired or asked to restart.
    pub fn on_finished<V>(&mut self, uid: &str, desired: &HashMap<String, V>) -> Vec<Purged> {
        let Some(slot) = self.workers.get(uid) else {
            return Vec::new();
        };
        let (full_name, finished) = {
            let st = slot.lock();
            (st.full_name.clone(), st.finished)
        };
        if !finished {
            // A late report about a worker purged and created afresh since.
            return Vec::new();
        }
        self.release_static(uid, &full_name);
        self.purge(desired, Some(uid))
    }

    fn purge<V>(&mut self, desired: &HashMap<String, V>, only: Option<&str>) -> Vec<Purged> {
        let mut purged = Vec::new();
        let mut wake = Vec::new();
        let one = only.and_then(|u| self.workers.get_key_value(u));
        let all: Box<dyn Iterator<Item = (&String, &Arc<Slot>)>> = match (only, one) {
            (Some(_), Some(kv)) => Box::new(std::iter::once(kv)),
            (Some(_), None) => Box::new(std::iter::empty()),
            (None, _) => Box::new(self.workers.iter()),
        };
        for (uid, slot) in all {
            let orphan = !desired.contains_key(uid);
            let mut st = slot.lock();
            if !(st.restart_requested || orphan) {
                continue;
            }
            if st.finished {
                purged.push(Purged {
                    uid: uid.clone(),
                    restart_requested: st.restart_requested,
                });
                continue;
            }
            if !orphan {
                continue;
            }
            if !st.spawned || (!st.started && !st.terminating) {
                // Never started: nothing to stop.
                st.finished = true;
                st.terminated = true;
                st.pending = None;
                purged.push(Purged {
                    uid: uid.clone(),
                    restart_requested: st.restart_requested,
                });
                wake.push(slot.clone());
                continue;
            }
            if !st.terminating {
                st.terminating = true;
                let pod = st
                    .active
                    .clone()
                    .or_else(|| st.pending.as_ref().map(|w| w.pod.clone()));
                st.grace = pod.map_or(MIN_GRACE, |p| effective_grace(0, &p, None).0);
                if let Some(t) = &st.cancel {
                    t.cancel();
                }
            }
            st.requeue_last();
            wake.push(slot.clone());
        }
        for slot in wake {
            slot.notify.notify_one();
        }
        for p in &purged {
            self.remove(&p.uid);
        }
        purged
    }

    /// Forgets a worker (its task has ended or is ending).
    fn remove(&mut self, uid: &str) {
        if let Some(slot) = self.workers.remove(uid) {
            let full_name = slot.lock().full_name.clone();
            self.release_static(uid, &full_name);
        }
        self.timelines
            .slots
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(uid);
        self.queue.forget(uid);
    }
}

struct Worker<S> {
    uid: String,
    slot: Arc<Slot>,
    syncer: Arc<S>,
    queue: WorkQueue,
    done_tx: mpsc::UnboundedSender<String>,
    cancel: CancellationToken,
}

/// One piece of work taken from the pending slot.
struct Step {
    work_type: WorkType,
    kind: UpdateType,
    pod: Arc<Pod>,
    grace: i64,
    received: u64,
    token: CancellationToken,
    superseded: CancellationToken,
}

enum Outcome {
    Cancelled,
    Failed(runtime::Error),
    Synced(Synced),
    Done,
}

impl<S: PodSyncer> Worker<S> {
    /// kubelet `startPodSync`: takes the pending update, or None when there is nothing to do.
    fn start(&self) -> Option<Step> {
        let mut st = self.slot.lock();
        if st.finished {
            return None;
        }
        let work = st.pending.take()?;
        if !(work.runtime_only && st.active.is_some()) {
            st.active = Some(work.pod.clone());
        }
        st.started = true;
        let token = self.cancel.child_token();
        st.cancel = Some(token.clone());
        let superseded = CancellationToken::new();
        st.superseded = Some(superseded.clone());
        st.marks.sync_started(monotonic_ns());
        Some(Step {
            work_type: st.work_type(),
            kind: work.kind,
            pod: st.active.clone().unwrap_or(work.pod),
            grace: st.grace.max(MIN_GRACE),
            received: work.received,
            token,
            superseded,
        })
    }

    async fn run(self) {
        loop {
            while let Some(step) = self.start() {
                let outcome = self.execute(&step).await;
                if self.complete(&step, outcome) {
                    let _ = self.done_tx.send(self.uid.clone());
                    return;
                }
            }
            if self.slot.lock().finished {
                return;
            }
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                _ = self.slot.notify.notified() => {}
            }
        }
    }

    async fn execute(&self, step: &Step) -> Outcome {
        let uid = self.uid.as_str();
        let pod = step.pod.as_ref();
        let result = match step.work_type {
            WorkType::Sync => {
                let r = self
                    .syncer
                    .sync_pod(uid, pod, &step.token, &step.superseded)
                    .await;
                if step.token.is_cancelled() {
                    return Outcome::Cancelled;
                }
                r.map(Outcome::Synced)
            }
            WorkType::Terminating => {
                // A cancelled sync can leave a CRI call in flight, and containerd refuses to
                // remove a container that is still starting: retry the kill quickly a few times
                // before leaving it to the work queue's slower back-off.
                let mut retry = KILL_RETRY_BASE;
                loop {
                    let r = tokio::select! {
                        _ = step.token.cancelled() => return Outcome::Cancelled,
                        r = self.syncer.sync_terminating_pod(uid, pod, step.grace) => r,
                    };
                    match r {
                        Err(e) if retry <= KILL_RETRY_MAX => {
                            tracing::debug!(pod = uid, error = %e, ?retry, "killing pod; retrying");
                            tokio::select! {
                                _ = step.token.cancelled() => return Outcome::Cancelled,
                                _ = tokio::time::sleep(retry) => {}
                            }
                            retry *= 2;
                        }
                        r => break r.map(|()| Outcome::Done),
                    }
                }
            }
            WorkType::Terminated => self
                .syncer
                .sync_terminated_pod(uid, pod)
                .await
                .map(|()| Outcome::Done),
        };
        result.unwrap_or_else(Outcome::Failed)
    }

    /// Records the outcome (kubelet `completeWork` and friends); true when the worker is done.
    fn complete(&self, step: &Step, outcome: Outcome) -> bool {
        let now = monotonic_ns();
        self.syncer
            .observe(step.kind, now.saturating_sub(step.received) as f64 / 1e9);
        let mut st = self.slot.lock();
        st.cancel = None;
        st.marks.sync_finished(now);
        if matches!(outcome, Outcome::Synced(_) | Outcome::Done) {
            // Recovered: the next failure is news again.
            st.warned = Warned::default();
        }
        let delay = match (step.work_type, outcome) {
            (_, Outcome::Cancelled) => None,
            (_, Outcome::Failed(e)) => {
                // The sync loop's tick retries a desired pod; housekeeping retries an orphan.
                if let Some(held) = st.warned.should_log(&e.to_string(), now) {
                    tracing::warn!(pod = %st.full_name, work = ?step.work_type, error = %e, repeated_meanwhile = held, "pod work failed; will retry");
                }
                Some(self.queue.jitter(ERROR_BACKOFF, JITTER))
            }
            (WorkType::Terminated, _) => {
                st.finished = true;
                return true;
            }
            (WorkType::Terminating, _) if st.runtime_only => {
                st.terminated = true;
                st.finished = true;
                return true;
            }
            (WorkType::Terminating, _) => {
                st.terminated = true;
                st.requeue_last();
                None
            }
            (WorkType::Sync, Outcome::Synced(s)) if s.terminal => {
                st.terminating = true;
                if st.grace == 0 {
                    st.grace = st
                        .active
                        .as_ref()
                        .map_or(MIN_GRACE, |p| effective_grace(0, p, s.grace_override).0);
                }
                st.requeue_last();
                None
            }
            (WorkType::Sync, Outcome::Synced(s)) => {
                let next = s
                    .requeue_after
                    .unwrap_or_else(|| self.queue.jitter(self.queue.resync(), JITTER));
                Some(s.deadline_in.map_or(next, |d| next.min(d)))
            }
            (WorkType::Sync, Outcome::Done) => Some(self.queue.jitter(self.queue.resync(), JITTER)),
        };
        drop(st);
        if let Some(d) = delay {
            self.queue.enqueue(&self.uid, d);
        }
        false
    }
}

/// Whether a waiting update's pod has another spec than the one its running sync was given
/// (the same `Arc`, as for a resync or a runtime event, is the same spec without a look).
fn spec_differs(pending: Option<&Arc<Pod>>, active: Option<&Arc<Pod>>) -> bool {
    match (pending, active) {
        (Some(p), Some(a)) => !Arc::ptr_eq(p, a) && p.spec != a.spec,
        (p, a) => p.is_some() != a.is_some(),
    }
}

#[cfg(test)]
pub(crate) mod tests;
