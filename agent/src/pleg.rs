//! PLEG (the kubelet's generic PLEG): relists the runtime (two CRI calls) every period, compares
//! each pod's sandboxes and containers with its previous snapshot and generates per-container
//! events (started, died, removed, changed). For a pod with events it reads the pod's full state
//! (the kubelet's `GetPodStatus`) into the pod cache (`pod_cache`), then sends the events to
//! the sync loop, which hands the pod's worker a sync; the worker takes the cached read and writes
//! the pod's status. The PLEG never writes a status itself. A pod whose state read failed keeps
//! its old snapshot and is inspected again on the next relist, so no event is lost.
//!
//! Fast path: the eBPF exit detector (`ebpf::exits`) sees a container's main process exit, or its
//! cgroup go, the moment it happens; the exit goes into the pod cache (shown in the pod's status
//! from its worker's next write, until the runtime's own record replaces it), the pod's worker is
//! asked to sync at once, and that one pod is relisted (one read, no full relist). The runtime
//! reports the exit a little after the kernel (containerd's shim reaps the process, the CRI plugin
//! deletes the task, removing its cgroup, then records the exit; on a busy machine that takes tens
//! to hundreds of milliseconds), so a relist that finds no change yet is retried after 2 ms,
//! doubling to [`FAST_RETRY_MAX`], for up to [`FAST_RETRY_FOR`]. An exit from before the container
//! started is ignored (runc's own helper may exec in the container cgroup and exit first) unless
//! the container's cgroup is gone too: a process that fails at once can exit before the runtime
//! notes its start. Without eBPF the periodic relist alone keeps everything correct.
//!
//! The relist's cadence: while the kernel path reports every exit ([`KernelPath`]: probes and
//! process probes loaded, reader running, nothing lost), the periodic relist is only a safety
//! net and runs every `--pleg-safety-net-period` (60 s); it is what notices a change nobody made
//! through this agent (a container removed by hand). It goes back to every `--pleg-relist-period`
//! (1 s) at once, and for [`DISTRUST_HOLD`] after, when the kernel path lost an event or
//! stopped, a relist or pod read failed (the runtime is down or restarting), or the runtime had
//! not recorded an exit the kernel saw by the end of the fast path's retries (and again before
//! each hold ends while it still has not, for up to [`UNRECORDED_WATCH`]). The kubelet's
//! evented PLEG does the same with the runtime's events (its relist every 300 s).
use crate::ebpf::exits::{KernelExit, KernelPath};
use crate::metrics::{Metrics, ResultLabel};
use crate::pod::{PodState, RelistEntry};
use crate::pod_cache::PodCache;
use crate::runtime::Manager;
use crate::status::StatusManager;
use futures::StreamExt;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The pods the runtime held at the last successful relist, and when it began.
pub type RuntimePods = Arc<RwLock<RuntimeList>>;

/// The UIDs of the pods a relist found, and when it began (`None` before the first).
#[derive(Debug, Default)]
pub struct RuntimeList {
    pub relisted: Option<Instant>,
    pub uids: HashSet<String>,
}

/// After a reason to distrust the kernel path, the relist runs every `--pleg-relist-period`
/// for this long.
pub const DISTRUST_HOLD: Duration = Duration::from_secs(10);

/// When the PLEG relists: at every tick of `period` while the kernel path cannot be trusted,
/// every `safety_net` while it reports every exit (see the module docs).
struct Cadence {
    period: Duration,
    safety_net: Duration,
    /// The kernel path's missed count at the last look (`None`: it reports nothing).
    missed: Option<u64>,
    /// Relist every `period` until then.
    hold_until: Option<Instant>,
    /// Counts the distrusts: reads stored in an earlier epoch are not kept current by the
    /// kernel path (`pod_cache`).
    epoch: u64,
    metrics: Metrics,
}

impl Cadence {
    /// `safety_net` at or below `period` (0 included) turns the safety net off; `missed` is the
    /// kernel path's count now ([`KernelPath::missed`]).
    fn new(period: Duration, safety_net: Duration, missed: Option<u64>, metrics: Metrics) -> Self {
        Self {
            period,
            safety_net,
            missed,
            hold_until: None,
            epoch: 0,
            metrics,
        }
    }

    /// Whether the tick at `now` relists, given when the last successful relist began and the
    /// kernel path's count now.
    fn relist_due(&mut self, now: Instant, last: Option<Instant>, missed: Option<u64>) -> bool {
        match (self.missed, missed) {
            (Some(_), None) => self.distrust(now, "probes_stopped"),
            (Some(before), Some(after)) if after > before => self.distrust(now, "events_lost"),
            _ => {}
        }
        self.missed = missed;
        let trusted = self.trusted(now);
        self.metrics.pleg_safety_net.set(i64::from(trusted));
        match last {
            Some(last) if trusted => {
                // Ticks come every period: relist at the one nearest the safety net's due time.
                now.saturating_duration_since(last) + self.period / 2 >= self.safety_net
            }
            _ => true,
        }
    }

    fn trusted(&self, now: Instant) -> bool {
        self.safety_net > self.period
            && self.missed.is_some()
            && self.hold_until.is_none_or(|until| now >= until)
    }

    /// Relists every period for [`DISTRUST_HOLD`] from `now`.
    fn distrust(&mut self, now: Instant, reason: &'static str) {
        if self.safety_net <= self.period {
            return;
        }
        if self.trusted(now) {
            tracing::info!(
                reason,
                period = ?self.period,
                "PLEG: relisting every period again (the kernel path may have missed a change)"
            );
            self.metrics
                .pleg_kernel_path_distrusted_total
                .get_or_create(&crate::metrics::ReasonLabel { reason })
                .inc();
        }
        self.hold_until = Some(now + DISTRUST_HOLD);
        self.epoch += 1;
    }
}

/// The runtime's health as the PLEG last saw it (the kubelet's `runtimeState`), and when the
/// sync loop last ran (the kubelet's sync-loop monitor): what `/healthz` checks. Cheap to clone.
#[derive(Clone, Debug)]
pub struct RuntimeState {
    error: Arc<Mutex<Option<String>>>,
    times: Arc<Mutex<Times>>,
}

#[derive(Debug, Clone, Copy)]
struct Times {
    /// When the state was made (the agent's start).
    created: Instant,
    /// The last relist the runtime answered.
    relisted: Option<Instant>,
    /// The sync loop's last turn with a healthy runtime.
    sync_loop: Option<Instant>,
}

impl Default for RuntimeState {
    fn default() -> Self {
        Self {
            error: Arc::default(),
            times: Arc::new(Mutex::new(Times {
                created: Instant::now(),
                relisted: None,
                sync_loop: None,
            })),
        }
    }
}

/// The kubelet's PLEG threshold: the runtime is unhealthy when no relist succeeded for this
/// long.
pub const RELIST_THRESHOLD: Duration = Duration::from_secs(180);

/// The kubelet's sync-loop threshold for `--sync-frequency` `sync_frequency`: twice it, at
/// least 5 minutes.
pub fn sync_loop_threshold(sync_frequency: Duration) -> Duration {
    (sync_frequency * 2).max(Duration::from_secs(300))
}

impl RuntimeState {
    /// Records the runtime's latest error, or `None` once it answers again (a relist succeeded).
    pub fn set(&self, error: Option<String>) {
        if error.is_none() {
            self.lock_times().relisted = Some(Instant::now());
        }
        *self.error.lock().unwrap_or_else(PoisonError::into_inner) = error;
    }

    /// The sync loop took a turn with a healthy runtime.
    pub fn sync_loop_ran(&self) {
        self.lock_times().sync_loop = Some(Instant::now());
    }

    fn lock_times(&self) -> std::sync::MutexGuard<'_, Times> {
        self.times.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `/healthz`'s checks at `now`, as (name, `Err(why)` when failing): `syncloop` (the
    /// kubelet's: the loop ran within `sync_threshold`; a loop that has not run yet is
    /// healthy) and `runtime` (the kubelet's PLEG check: a relist succeeded within
    /// [`RELIST_THRESHOLD`], counted from the agent's start until the first one).
    pub fn health(
        &self,
        now: Instant,
        sync_threshold: Duration,
    ) -> Vec<(&'static str, Result<(), Unhealthy>)> {
        let t = *self.lock_times();
        let ago = |at: Instant| now.saturating_duration_since(at);
        let sync = match t.sync_loop {
            Some(at) if ago(at) > sync_threshold => Err(Unhealthy::SyncLoop {
                ago: ago(at),
                threshold: sync_threshold,
            }),
            _ => Ok(()),
        };
        let since = t.relisted.unwrap_or(t.created);
        let runtime = if ago(since) > RELIST_THRESHOLD {
            let (ago, error) = (ago(since), self.error());
            Err(match t.relisted {
                Some(_) => Unhealthy::Relist { ago, error },
                None => Unhealthy::NoRelist { ago, error },
            })
        } else {
            Ok(())
        };
        vec![("ping", Ok(())), ("syncloop", sync), ("runtime", runtime)]
    }

    pub fn error(&self) -> Option<String> {
        self.error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Why a `/healthz` check fails. `error`: the last relist's error, if it failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unhealthy {
    #[error("the sync loop last ran {ago:?} ago; threshold is {threshold:?}")]
    SyncLoop { ago: Duration, threshold: Duration },
    #[error(
        "the runtime last answered a relist {ago:?} ago; threshold is {RELIST_THRESHOLD:?}{}",
        colon(error)
    )]
    Relist {
        ago: Duration,
        error: Option<String>,
    },
    #[error(
        "the runtime has not answered a relist in the {ago:?} since the start; threshold is {RELIST_THRESHOLD:?}{}",
        colon(error)
    )]
    NoRelist {
        ago: Duration,
        error: Option<String>,
    },
}

/// `": <error>"`, or nothing.
fn colon(error: &Option<String>) -> String {
    error.as_ref().map(|e| format!(": {e}")).unwrap_or_default()
}

/// How many pods' states are read at once.
const READ_CONCURRENCY: usize = 8;
/// First retry of a fast-path relist that found no change yet.
const FAST_RETRY_FIRST: Duration = Duration::from_millis(2);
/// Retries double up to this delay. The status already shows the exit the kernel saw, so the
/// retries only wait for the runtime's own record; at 16 ms they cost ~15 pod reads (60 CRI
/// calls) per exit while containerd takes its ~200 ms (`pod_startup`'s CRI call counts).
const FAST_RETRY_MAX: Duration = Duration::from_millis(128);
/// A fast-path request gives up after this long; the periodic relist takes over.
const FAST_RETRY_FOR: Duration = Duration::from_secs(1);
/// While the runtime has not recorded an exit the kernel saw, the relist runs every period (it
/// is distrusted again before each [`DISTRUST_HOLD`] ends) for up to this long; then the
/// safety net is left to find it. containerd retries an exit it failed to handle with a
/// back-off that grows to minutes; until it records the exit, the kernel's is shown.
const UNRECORDED_WATCH: Duration = Duration::from_secs(300);

/// What happened to a container (or sandbox) between two relists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    ContainerStarted,
    ContainerDied,
    ContainerRemoved,
    /// A pod whose earlier state read failed was read now, with nothing new.
    PodSync,
    /// The container is in an unknown state (created, or the runtime cannot tell); not sent.
    ContainerChanged,
}

/// One PLEG event: a pod, what happened and the container (or sandbox) id it happened to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Event {
    pub uid: String,
    pub kind: EventType,
    pub id: String,
}

impl Event {
    /// Whether the pod's worker should sync on this event (the kubelet's `isSyncPodWorthy`).
    pub fn is_sync_worthy(&self) -> bool {
        self.kind != EventType::ContainerRemoved
    }
}

/// A container's or sandbox's state as the PLEG compares them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    Exited,
    Unknown,
    NonExistent,
}

fn container_state(state: i32) -> State {
    use k8s_cri::v1::ContainerState as C;
    match C::try_from(state) {
        Ok(C::ContainerRunning) => State::Running,
        Ok(C::ContainerExited) => State::Exited,
        _ => State::Unknown,
    }
}

fn sandbox_state(state: i32) -> State {
    use k8s_cri::v1::PodSandboxState as S;
    match S::try_from(state) {
        Ok(S::SandboxReady) => State::Running,
        Ok(S::SandboxNotready) => State::Exited,
        Err(_) => State::Unknown,
    }
}

/// The kubelet's `generateEvents` for one id.
fn generate_events(uid: &str, id: &str, old: State, new: State) -> Vec<Event> {
    let event = |kind| Event {
        uid: uid.to_owned(),
        kind,
        id: id.to_owned(),
    };
    match (old, new) {
        _ if old == new => Vec::new(),
        (_, State::Running) => vec![event(EventType::ContainerStarted)],
        (_, State::Exited) => vec![event(EventType::ContainerDied)],
        (_, State::Unknown) => vec![event(EventType::ContainerChanged)],
        // Its death was reported when it exited.
        (State::Exited, State::NonExistent) => vec![event(EventType::ContainerRemoved)],
        (_, State::NonExistent) => vec![
            event(EventType::ContainerDied),
            event(EventType::ContainerRemoved),
        ],
    }
}

/// Every event of one pod between two snapshots, over each sandbox and container id in either.
pub fn pod_events(uid: &str, old: Option<&RelistEntry>, new: Option<&RelistEntry>) -> Vec<Event> {
    let mut out = Vec::new();
    fn sandboxes(e: Option<&RelistEntry>) -> Option<&[(String, i32)]> {
        e.map(|e| e.sandboxes.as_slice())
    }
    fn containers(e: Option<&RelistEntry>) -> Option<&[(String, i32)]> {
        e.map(|e| e.containers.as_slice())
    }
    id_events(&mut out, uid, sandboxes(old), sandboxes(new), sandbox_state);
    id_events(
        &mut out,
        uid,
        containers(old),
        containers(new),
        container_state,
    );
    out
}

fn id_events(
    out: &mut Vec<Event>,
    uid: &str,
    old: Option<&[(String, i32)]>,
    new: Option<&[(String, i32)]>,
    state_of: fn(i32) -> State,
) {
    let (old, new) = (old.unwrap_or_default(), new.unwrap_or_default());
    // By id, so that a pod of n containers costs O(n log n) per relist, not O(n^2).
    fn by_id(list: &[(String, i32)]) -> HashMap<&str, i32> {
        list.iter().map(|(id, s)| (id.as_str(), *s)).collect()
    }
    let (old_by_id, new_by_id) = (by_id(old), by_id(new));
    let find = |list: &HashMap<&str, i32>, id: &str| {
        list.get(id).map_or(State::NonExistent, |s| state_of(*s))
    };
    let all: BTreeSet<&str> = old_by_id.keys().chain(new_by_id.keys()).copied().collect();
    for id in all {
        out.extend(generate_events(
            uid,
            id,
            find(&old_by_id, id),
            find(&new_by_id, id),
        ));
    }
}

/// A pod waiting for a fast-path relist.
#[derive(Debug, Clone)]
struct Pending {
    due: Instant,
    delay: Duration,
    until: Instant,
    /// Until then the pod is read again while the runtime has not recorded the exit.
    watch_until: Instant,
    /// The container whose exit asked for the relist.
    container: Option<String>,
}

/// What follows a fast-path read of a pod ([`Pending::after_read`]).
#[derive(Debug, PartialEq, Eq)]
enum AfterRead {
    /// Read it again soon.
    Retry,
    /// The runtime has not recorded the exit by the end of the retries: relist every period,
    /// and read the pod again before that ends.
    Unrecorded,
    /// Done: the change was seen, or it is left to the periodic relist.
    Done,
    /// The runtime has still not recorded the exit after [`UNRECORDED_WATCH`]: left to the
    /// safety net.
    GaveUp,
}

impl Pending {
    fn new(now: Instant, container: Option<String>) -> Self {
        Self {
            due: now,
            delay: FAST_RETRY_FIRST,
            until: now + FAST_RETRY_FOR,
            watch_until: now + UNRECORDED_WATCH,
            container,
        }
    }

    /// Plans the next read after one at `now` that found the pod `changed` or not, given its
    /// snapshot since (`entry`). A change is not enough while the snapshot still shows the
    /// exited container running: the read may have seen its start, not its end.
    fn after_read(
        &mut self,
        now: Instant,
        changed: bool,
        entry: Option<&RelistEntry>,
    ) -> AfterRead {
        let unrecorded = self
            .container
            .as_deref()
            .is_some_and(|id| still_running(entry, id));
        if changed && !unrecorded {
            return AfterRead::Done;
        }
        if now >= self.watch_until {
            return if unrecorded {
                AfterRead::GaveUp
            } else {
                AfterRead::Done
            };
        }
        if now < self.until {
            self.due = now + self.delay;
            self.delay = (self.delay * 2).min(FAST_RETRY_MAX);
            return AfterRead::Retry;
        }
        if !unrecorded {
            return AfterRead::Done;
        }
        self.due = (now + DISTRUST_HOLD / 2).min(self.watch_until);
        AfterRead::Unrecorded
    }
}

/// Each pod's snapshot, and the pods to read again (a pod whose read failed keeps its old snapshot, so no event is lost).
#[derive(Debug, Default)]
struct Snapshots {
    /// Each pod's snapshot as of the last relist that read it successfully.
    records: HashMap<String, RelistEntry>,
    /// Pods whose state read failed: read again on the next relist even without events.
    reinspect: HashSet<String>,
}

/// A pod's part in one relist.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// Read the pod's state; then [`Snapshots::read_ok`] or [`Snapshots::read_failed`].
    Read(String, RelistEntry, Vec<Event>),
    /// Nothing to read (a pod the agent does not report on, or one gone): send these.
    Send(Vec<Event>),
}

impl Snapshots {
    /// Compares a relist with the snapshots: pods with events or to inspect again are to be read
    /// (`reported` pods only); the others' snapshots advance at once.
    fn plan(
        &mut self,
        mut new: HashMap<String, RelistEntry>,
        reported: impl Fn(&str) -> bool,
    ) -> Vec<Step> {
        let uids: BTreeSet<String> = self.records.keys().chain(new.keys()).cloned().collect();
        let mut steps = Vec::new();
        for uid in uids {
            let events = pod_events(&uid, self.records.get(&uid), new.get(&uid));
            if events.is_empty() && !self.reinspect.contains(&uid) {
                continue;
            }
            match new.remove(&uid) {
                Some(entry) if reported(&uid) => steps.push(Step::Read(uid, entry, events)),
                Some(entry) => {
                    self.records.insert(uid, entry);
                    steps.push(Step::Send(events));
                }
                None => {
                    self.records.remove(&uid);
                    self.reinspect.remove(&uid);
                    steps.push(Step::Send(events));
                }
            }
        }
        steps
    }

    /// The read succeeded: the snapshot advances; the events to send (a `PodSync` when a
    /// reinspection found nothing new).
    fn read_ok(&mut self, uid: String, entry: RelistEntry, mut events: Vec<Event>) -> Vec<Event> {
        if events.is_empty() {
            events.push(Event {
                uid: uid.clone(),
                kind: EventType::PodSync,
                id: String::new(),
            });
        }
        self.reinspect.remove(&uid);
        self.records.insert(uid, entry);
        events
    }

    /// The read failed (or was put off): keep the old snapshot, so the events come again, and
    /// read it next time.
    fn read_failed(&mut self, uid: String) {
        self.reinspect.insert(uid);
    }
}

/// What the PLEG works with. Drive it with [`Pleg::run`].
pub struct Pleg {
    /// Read from: relists and pod reads.
    pub runtime: Manager,
    /// Written: the reads handed to the pods' next syncs, the exits the kernel saw.
    pub cache: PodCache,
    /// Read only: which pods the agent reports on (the PLEG never writes a status).
    pub status: StatusManager,
    /// The sync loop's PLEG channel.
    pub tx: mpsc::Sender<Event>,
    /// The UIDs of the runtime's pods, for housekeeping.
    pub pods: RuntimePods,
    pub health: RuntimeState,
    pub metrics: Metrics,
    /// Whether the eBPF probes report every exit (the relist's cadence follows it).
    pub kernel: KernelPath,
    /// The runtime's health checks: while one fails, the relist runs every period.
    pub runtime_health: tokio::sync::watch::Receiver<crate::runtime_health::RuntimeHealth>,
}

/// The PLEG task's own state.
struct Relister {
    p: Pleg,
    snap: Snapshots,
    pending: HashMap<String, Pending>,
    last_relist: Option<Instant>,
    cadence: Cadence,
}

impl Pleg {
    /// Relists every `period` (the first at once), or every `safety_net` while the kernel path
    /// is trusted ([`Cadence`]), and serves fast-path requests in between, until `cancel` fires.
    pub async fn run(
        self,
        period: Duration,
        safety_net: Duration,
        fast: mpsc::Receiver<KernelExit>,
        cancel: CancellationToken,
    ) {
        let cadence = Cadence::new(
            period,
            safety_net,
            self.kernel.missed(),
            self.metrics.clone(),
        );
        let r = Relister {
            p: self,
            snap: Snapshots::default(),
            pending: HashMap::new(),
            last_relist: None,
            cadence,
        };
        r.run(fast, cancel).await;
    }
}

impl Relister {
    async fn run(mut self, mut fast: mpsc::Receiver<KernelExit>, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(self.cadence.period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut fast_open = true;
        loop {
            let next_due = self.pending.values().map(|p| p.due).min();
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return,
                at = tick.tick() => {
                    if self.p.runtime_health.borrow().failure.is_some() {
                        self.cadence.distrust(at, "runtime_error");
                    }
                    let due = self.cadence.relist_due(at, self.last_relist, self.p.kernel.missed());
                    self.tell_cache(at);
                    if due {
                        self.relist().await;
                    }
                }
                exit = fast.recv(), if fast_open => match exit {
                    Some(exit) => {
                        self.request(exit);
                        // Take every request already queued, so a burst is read in one go.
                        while let Ok(exit) = fast.try_recv() {
                            self.request(exit);
                        }
                        self.relist_due().await;
                    }
                    None => fast_open = false,
                },
                () = sleep_until(next_due), if next_due.is_some() => self.relist_due().await,
            }
        }
    }

    /// Relists every period from `now` on for a while (see [`Cadence::distrust`]), and stops the
    /// pod cache keeping reads current.
    fn distrust(&mut self, now: Instant, reason: &'static str) {
        self.cadence.distrust(now, reason);
        self.tell_cache(now);
    }

    /// Tells the pod cache whether the kernel path keeps its reads current.
    fn tell_cache(&self, now: Instant) {
        let trusted = self.cadence.trusted(now);
        self.p.cache.lock().set_kernel(trusted, self.cadence.epoch);
    }

    /// Puts a kernel-observed exit into the pod cache, asks the pod's worker to sync (so its
    /// status shows the exit at once; the runtime's record replaces it when a relist sees the
    /// exit) and queues a relist of the pod.
    fn request(&mut self, exit: KernelExit) {
        let KernelExit {
            uid,
            container_id,
            exit,
            gone,
        } = exit;
        if !self.p.status.knows(&uid) {
            // Not a pod this agent runs (or one already gone): the periodic relist sees it.
            self.count_skipped(1);
            return;
        }
        if let (Some(id), Some((code, at))) = (&container_id, exit) {
            self.p.cache.lock().kernel_exit(&uid, id, code, at, gone);
        }
        if self
            .p
            .cache
            .lock()
            .is_stopping(&uid, container_id.as_deref())
        {
            // The worker stopping it reads (or forgets) the pod when the stop is done.
            tracing::debug!(%uid, ?container_id, ?exit, "PLEG fast path: the agent is stopping it; no relist");
            self.count_skipped(1);
            return;
        }
        tracing::debug!(%uid, ?container_id, ?exit, "PLEG fast path: relisting the pod");
        if let (Some(id), Some(_)) = (&container_id, exit) {
            // The worker shows the exit the kernel saw at once; the relist below follows with the
            // runtime's own record.
            self.send(vec![Event {
                uid: uid.clone(),
                kind: EventType::ContainerDied,
                id: id.clone(),
            }]);
        }
        self.pending
            .insert(uid, Pending::new(Instant::now(), container_id));
    }

    fn count_skipped(&self, n: usize) {
        if n == 0 {
            return;
        }
        self.p
            .metrics
            .pleg_fast_path_relists_total
            .get_or_create(&ResultLabel { result: "skipped" })
            .inc_by(n as u64);
    }

    /// Relists the pods whose fast-path relist is due, reading their states concurrently.
    /// A pod the agent started stopping meanwhile is left to the stopping code.
    async fn relist_due(&mut self) {
        let now = Instant::now();
        let before = self.pending.len();
        {
            let cache = self.p.cache.lock();
            self.pending.retain(|uid, _| !cache.is_stopping(uid, None));
        }
        self.count_skipped(before - self.pending.len());
        let due: Vec<String> = self
            .pending
            .iter()
            .filter(|(_, p)| p.due <= now)
            .map(|(uid, _)| uid.clone())
            .collect();
        if due.is_empty() {
            return;
        }
        let (runtime, cache) = (&self.p.runtime, &self.p.cache);
        let reads: Vec<_> = futures::stream::iter(due)
            .map(|uid| async move {
                let token = cache.lock().token(&uid);
                let state = runtime.pod_state_counted(&uid, "fast_path").await;
                if let (Some(token), Ok(state)) = (token, &state) {
                    cache
                        .lock()
                        .store(&uid, token, state.clone(), std::time::Instant::now());
                }
                (uid, state)
            })
            .buffer_unordered(READ_CONCURRENCY)
            .collect()
            .await;
        for (uid, read) in reads {
            let changed = match read {
                Ok(state) => self.relist_pod(&uid, &state),
                Err(error) => {
                    tracing::debug!(%uid, %error, "fast-path relist: reading the pod failed");
                    self.distrust(Instant::now(), "runtime_error");
                    false
                }
            };
            let result = if changed { "changed" } else { "unchanged" };
            tracing::debug!(%uid, result, "PLEG fast path: pod relisted");
            self.p
                .metrics
                .pleg_fast_path_relists_total
                .get_or_create(&ResultLabel { result })
                .inc();
            let now = Instant::now();
            let entry = self.snap.records.get(&uid);
            let next = self
                .pending
                .get_mut(&uid)
                .map_or(AfterRead::Done, |p| p.after_read(now, changed, entry));
            match next {
                AfterRead::Retry => {}
                AfterRead::Unrecorded => {
                    tracing::debug!(%uid, "PLEG fast path: the runtime has not recorded the exit");
                    self.distrust(now, "exit_unrecorded");
                }
                AfterRead::GaveUp => {
                    tracing::warn!(%uid, after = ?UNRECORDED_WATCH, "the runtime has not recorded a container exit the kernel saw; left to the periodic relist");
                    self.pending.remove(&uid);
                }
                AfterRead::Done => {
                    self.pending.remove(&uid);
                }
            }
        }
    }

    /// Compares one pod's fresh state (already in the pod cache) with its snapshot; on a change
    /// advances the snapshot and sends the events. True when something changed.
    fn relist_pod(&mut self, uid: &str, state: &PodState) -> bool {
        let entry = state.relist_entry();
        let gone = entry.sandboxes.is_empty() && entry.containers.is_empty();
        let new = (!gone).then_some(&entry);
        let events = pod_events(uid, self.snap.records.get(uid), new);
        if events.is_empty() {
            return false;
        }
        self.snap.reinspect.remove(uid);
        if gone {
            self.snap.records.remove(uid);
        } else {
            self.snap.records.insert(uid.to_owned(), entry);
        }
        self.send(events);
        true
    }

    /// One full relist (kubelet `Relist()`).
    async fn relist(&mut self) {
        let start = Instant::now();
        if let Some(last) = self.last_relist {
            self.p
                .metrics
                .relist_interval(start.duration_since(last).as_secs_f64());
        }
        // Taken before the listing: a changed pod's read, which starts from the listing, is
        // handed to its next sync only when nothing mutated the pod since.
        let token = self.p.cache.lock().token_for_all();
        let mut listed = match self.p.runtime.relist().await {
            Ok(n) => n,
            Err(e) => {
                // Keep every snapshot: the events are generated on the next good relist.
                tracing::warn!(error = %e, "relist failed");
                self.distrust(Instant::now(), "runtime_error");
                self.p.health.set(Some(e.to_string()));
                self.p.metrics.runtime_ready.set(0);
                return;
            }
        };
        self.p.health.set(None);
        self.p.metrics.runtime_ready.set(1);
        self.last_relist = Some(start);
        let unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.p
            .metrics
            .pleg_last_seen_seconds
            .set(i64::try_from(unix).unwrap_or(i64::MAX));
        let mut by_state = [0i64; 4];
        for (_, containers) in listed.values() {
            for (_, state) in containers {
                if let Some(n) = usize::try_from(*state)
                    .ok()
                    .and_then(|s| by_state.get_mut(s))
                {
                    *n += 1;
                }
            }
        }
        self.p.metrics.kubelet.set_running_containers(by_state);
        let new: HashMap<String, RelistEntry> = listed
            .iter()
            .map(|(uid, (sandboxes, containers))| {
                let sandboxes = sandboxes.iter().map(|s| (s.id.clone(), s.state)).collect();
                (
                    uid.clone(),
                    RelistEntry::sorted(sandboxes, containers.clone()),
                )
            })
            .collect();
        {
            let mut cache = self.p.cache.lock();
            cache.known.relisted = Some(new.keys().cloned().collect());
            // Forget the stored reads and mutation records of pods gone from the runtime.
            cache.retain(|uid| new.contains_key(uid), token);
        }
        if let Ok(mut p) = self.p.pods.write() {
            *p = RuntimeList {
                relisted: Some(start),
                uids: new.keys().cloned().collect(),
            };
        }

        let status = &self.p.status;
        let mut reads = Vec::new();
        for step in self.snap.plan(new, |uid| status.knows(uid)) {
            match step {
                Step::Read(uid, ..) if self.p.cache.lock().is_mutating(&uid) => {
                    // Its worker is changing it: a read now could not be handed to the next
                    // sync (the change makes it stale) and the busy worker cannot act on the
                    // events. The snapshot stays, so the first relist after the change reads
                    // the pod and sends them; a huge pod's start is then not read (all of its
                    // containers' statuses) once a period all along.
                    self.snap.read_failed(uid);
                }
                Step::Read(uid, entry, events) => {
                    let listed = listed.remove(&uid).unwrap_or_default();
                    reads.push((uid, entry, events, listed));
                }
                Step::Send(events) => self.send(events),
            }
        }
        let (runtime, cache) = (&self.p.runtime, &self.p.cache);
        let results: Vec<_> = futures::stream::iter(reads)
            .map(|(uid, entry, events, listed)| async move {
                let state = runtime.pod_state_listed(&uid, listed, "pleg").await;
                if let Ok(state) = &state {
                    cache
                        .lock()
                        .store(&uid, token, state.clone(), std::time::Instant::now());
                }
                (uid, entry, events, state)
            })
            .buffer_unordered(READ_CONCURRENCY)
            .collect()
            .await;
        for (uid, entry, events, state) in results {
            match state {
                Ok(_) => {
                    let events = self.snap.read_ok(uid, entry, events);
                    self.send(events);
                }
                Err(error) => {
                    tracing::warn!(%uid, %error, "PLEG: reading the pod failed; inspecting it again on the next relist");
                    self.snap.read_failed(uid);
                }
            }
        }
        self.p.metrics.relisted(start.elapsed().as_secs_f64());
    }

    /// Sends the events the sync loop acts on, never blocking; `ContainerChanged` is dropped.
    fn send(&self, events: Vec<Event>) {
        for e in events {
            if e.kind == EventType::ContainerChanged {
                continue;
            }
            if self.p.tx.try_send(e).is_err() {
                self.p.metrics.pleg_discard_events_total.inc();
                tracing::debug!("PLEG channel full; event dropped");
            }
        }
    }
}

/// True when the snapshot shows container (or sandbox) `id` still running.
fn still_running(entry: Option<&RelistEntry>, id: &str) -> bool {
    use k8s_cri::v1::{ContainerState, PodSandboxState};
    entry.is_some_and(|e| {
        e.containers
            .iter()
            .any(|(c, s)| c == id && *s == ContainerState::ContainerRunning as i32)
            || e.sandboxes
                .iter()
                .any(|(c, s)| c == id && *s == PodSandboxState::SandboxReady as i32)
    })
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use EventType::*;
    use k8s_cri::v1 as api;

    const RUNNING: i32 = api::ContainerState::ContainerRunning as i32;
    const EXITED: i32 = api::ContainerState::ContainerExited as i32;
    const CREATED: i32 = api::ContainerState::ContainerCreated as i32;
    const READY: i32 = api::PodSandboxState::SandboxReady as i32;

    /// The ticks of one `period` from `start` on, for `secs` seconds, at which `cadence`
    /// relists (as seconds from `start`), the kernel path's count at each tick given by `missed`.
    fn relists(
        cadence: &mut Cadence,
        start: Instant,
        secs: u64,
        missed: impl Fn(u64) -> Option<u64>,
    ) -> Vec<u64> {
        let mut last = None;
        let mut at = Vec::new();
        for t in 0..=secs {
            let now = start + Duration::from_secs(t);
            if cadence.relist_due(now, last, missed(t)) {
                last = Some(now);
                at.push(t);
            }
        }
        at
    }

    const SECOND: Duration = Duration::from_secs(1);

    /// A cadence of a 1 s period and a 60 s safety net, the kernel path trusted; its metrics
    /// and the start of its clock.
    fn trusted_cadence() -> (Cadence, Metrics, Instant) {
        let metrics = Metrics::new();
        let c = Cadence::new(SECOND, Duration::from_secs(60), Some(0), metrics.clone());
        (c, metrics, Instant::now())
    }

    fn distrusted(metrics: &Metrics, reason: &'static str) -> u64 {
        metrics
            .pleg_kernel_path_distrusted_total
            .get_or_create(&crate::metrics::ReasonLabel { reason })
            .get()
    }

    #[test]
    fn a_trusted_kernel_path_makes_the_relist_a_safety_net() {
        let (mut c, metrics, start) = trusted_cadence();
        assert_eq!(relists(&mut c, start, 130, |_| Some(0)), [0, 60, 120]);
        assert_eq!(metrics.pleg_safety_net.get(), 1);
        // Without the probes every tick relists.
        let mut c = Cadence::new(SECOND, Duration::from_secs(60), None, metrics.clone());
        assert_eq!(relists(&mut c, start, 5, |_| None), [0, 1, 2, 3, 4, 5]);
        assert_eq!(metrics.pleg_safety_net.get(), 0);
        // A safety net at or below the period is off.
        for off in [Duration::ZERO, SECOND] {
            let mut c = Cadence::new(SECOND, off, Some(0), metrics.clone());
            assert_eq!(relists(&mut c, start, 3, |_| Some(0)), [0, 1, 2, 3]);
        }
    }

    #[test]
    fn a_lost_event_or_stopped_probes_bring_the_period_back_at_once() {
        let (mut c, metrics, start) = trusted_cadence();
        // An event lost at 30 s: relists at once and every second for the hold, then a minute
        // after the last.
        let hold = DISTRUST_HOLD.as_secs();
        let got = relists(&mut c, start, 110, |t| Some(u64::from(t >= 30)));
        let mut want = vec![0];
        want.extend(30..30 + hold);
        want.push(30 + hold - 1 + 60);
        assert_eq!(got, want);
        assert_eq!(distrusted(&metrics, "events_lost"), 1);
        // Probes that stop leave the period for good.
        let (mut c, metrics, start) = trusted_cadence();
        let got = relists(&mut c, start, 40, |t| (t < 5).then_some(0));
        assert_eq!(got, [0].into_iter().chain(5..=40).collect::<Vec<_>>());
        assert_eq!(distrusted(&metrics, "probes_stopped"), 1);
    }

    #[test]
    fn a_runtime_error_holds_the_period_for_a_while() {
        let (mut c, metrics, start) = trusted_cadence();
        assert!(c.relist_due(start, None, Some(0)));
        let at = start + Duration::from_secs(20);
        assert!(!c.relist_due(at, Some(start), Some(0)));
        c.distrust(at, "runtime_error");
        let after = |s: u64| at + Duration::from_secs(s);
        assert!(c.relist_due(after(1), Some(start), Some(0)));
        assert!(c.relist_due(after(DISTRUST_HOLD.as_secs() - 1), Some(after(8)), Some(0)));
        assert!(!c.relist_due(after(DISTRUST_HOLD.as_secs()), Some(after(9)), Some(0)));
        assert_eq!(distrusted(&metrics, "runtime_error"), 1);
    }

    #[test]
    fn an_exit_the_snapshot_shows_running_is_unrecorded() {
        let entry = RelistEntry::sorted(
            vec![("s1".into(), READY)],
            vec![("c1".into(), RUNNING), ("c2".into(), EXITED)],
        );
        assert!(still_running(Some(&entry), "c1"));
        assert!(still_running(Some(&entry), "s1"));
        assert!(!still_running(Some(&entry), "c2"));
        assert!(!still_running(Some(&entry), "c3"));
        assert!(!still_running(None, "c1"));
    }

    #[test]
    fn a_fast_path_request_watches_until_the_runtime_records_the_exit() {
        let start = Instant::now();
        let running = RelistEntry::sorted(vec![], vec![("c1".into(), RUNNING)]);
        let exited = RelistEntry::sorted(vec![], vec![("c1".into(), EXITED)]);
        let mut p = Pending::new(start, Some("c1".into()));
        // A change that is the container's start, not its end: read again soon.
        assert_eq!(p.after_read(start, true, Some(&running)), AfterRead::Retry);
        assert_eq!(p.due, start + FAST_RETRY_FIRST);
        // The retries are over and the runtime still shows it running: relist every period
        // and look again before the hold ends.
        let later = start + FAST_RETRY_FOR;
        assert_eq!(
            p.after_read(later, false, Some(&running)),
            AfterRead::Unrecorded
        );
        assert!(p.due > later && p.due < later + DISTRUST_HOLD);
        let much_later = start + UNRECORDED_WATCH / 2;
        assert_eq!(
            p.after_read(much_later, false, Some(&running)),
            AfterRead::Unrecorded
        );
        // Recorded (by a full relist, say): done.
        assert_eq!(
            p.after_read(much_later, false, Some(&exited)),
            AfterRead::Done
        );
        assert_eq!(p.after_read(later, true, Some(&exited)), AfterRead::Done);
        // Never recorded: left to the safety net in the end.
        let end = start + UNRECORDED_WATCH;
        assert_eq!(p.after_read(end, false, Some(&running)), AfterRead::GaveUp);
        // A request whose container the snapshot does not show running ends with its retries.
        let mut q = Pending::new(start, None);
        assert_eq!(q.after_read(start, false, Some(&running)), AfterRead::Retry);
        assert_eq!(q.after_read(later, false, Some(&running)), AfterRead::Done);
        assert_eq!(q.after_read(start, true, Some(&running)), AfterRead::Done);
    }
    const NOT_READY: i32 = api::PodSandboxState::SandboxNotready as i32;

    fn entry(sandbox: i32, containers: &[(&str, i32)]) -> RelistEntry {
        RelistEntry {
            sandboxes: vec![("s".into(), sandbox)],
            containers: containers
                .iter()
                .map(|(id, s)| ((*id).to_owned(), *s))
                .collect(),
        }
    }

    fn kinds(events: &[Event]) -> Vec<(&str, EventType)> {
        events.iter().map(|e| (e.id.as_str(), e.kind)).collect()
    }

    #[test]
    fn events_per_container_and_sandbox() {
        let old = entry(READY, &[("a", RUNNING), ("b", RUNNING), ("c", EXITED)]);
        let new = entry(READY, &[("a", RUNNING), ("b", EXITED), ("d", CREATED)]);
        let events = pod_events("u", Some(&old), Some(&new));
        assert_eq!(
            kinds(&events),
            [
                ("b", ContainerDied),
                ("c", ContainerRemoved),
                ("d", ContainerChanged),
            ]
        );
        assert!(events.iter().all(|e| e.uid == "u"));
        assert!(pod_events("u", Some(&new), Some(&new)).is_empty());
    }

    #[test]
    fn a_new_pod_starts_and_a_gone_one_dies_then_is_removed() {
        let e = entry(READY, &[("a", RUNNING)]);
        assert_eq!(
            kinds(&pod_events("u", None, Some(&e))),
            [("s", ContainerStarted), ("a", ContainerStarted)]
        );
        assert_eq!(
            kinds(&pod_events("u", Some(&e), None)),
            [
                ("s", ContainerDied),
                ("s", ContainerRemoved),
                ("a", ContainerDied),
                ("a", ContainerRemoved),
            ]
        );
        let stopped = entry(NOT_READY, &[("a", EXITED)]);
        assert_eq!(
            kinds(&pod_events("u", Some(&e), Some(&stopped))),
            [("s", ContainerDied), ("a", ContainerDied)]
        );
    }

    #[test]
    fn removed_events_do_not_sync_the_pod() {
        let ev = |kind| Event {
            uid: "u".into(),
            kind,
            id: "c".into(),
        };
        assert!(ev(ContainerDied).is_sync_worthy());
        assert!(ev(ContainerStarted).is_sync_worthy());
        assert!(ev(PodSync).is_sync_worthy());
        assert!(!ev(ContainerRemoved).is_sync_worthy());
    }

    #[test]
    fn the_entry_of_a_pod_state_matches_the_relist() {
        let state = PodState {
            sandboxes: vec![api::PodSandbox {
                id: "s".into(),
                state: READY,
                ..Default::default()
            }],
            sandbox_status: None,
            containers: ["b", "a"]
                .into_iter()
                .map(|id| api::ContainerStatus {
                    id: id.into(),
                    state: RUNNING,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        assert_eq!(
            state.relist_entry(),
            entry(READY, &[("a", RUNNING), ("b", RUNNING)])
        );
    }

    #[test]
    fn a_failed_read_keeps_the_snapshot_so_no_event_is_lost() {
        let mut snap = Snapshots::default();
        let running = entry(READY, &[("a", RUNNING)]);
        let exited = entry(READY, &[("a", EXITED)]);
        let relist = |e: &RelistEntry| HashMap::from([("u".to_owned(), e.clone())]);
        let reads = |steps: Vec<Step>| -> Vec<(String, Vec<(String, EventType)>)> {
            steps
                .into_iter()
                .filter_map(|s| match s {
                    Step::Read(uid, _, ev) => {
                        Some((uid, ev.into_iter().map(|e| (e.id, e.kind)).collect()))
                    }
                    Step::Send(_) => None,
                })
                .collect()
        };
        let plan = reads(snap.plan(relist(&running), |_| true));
        assert_eq!(plan.len(), 1);
        snap.read_ok("u".into(), running.clone(), Vec::new());
        // The container dies; reading the pod fails.
        let died = vec![("u".to_owned(), vec![("a".to_owned(), ContainerDied)])];
        assert_eq!(reads(snap.plan(relist(&exited), |_| true)), died);
        snap.read_failed("u".into());
        // Nothing new in the runtime, yet the death is reported again.
        assert_eq!(reads(snap.plan(relist(&exited), |_| true)), died);
        let sent = snap.read_ok("u".into(), exited.clone(), vec![]);
        assert_eq!(
            sent[0].kind, PodSync,
            "a reinspection with no event syncs the pod"
        );
        assert!(snap.plan(relist(&exited), |_| true).is_empty());
        // A pod the agent does not report on is not read; one gone is forgotten.
        let steps = snap.plan(HashMap::new(), |_| true);
        assert!(matches!(&steps[..], [Step::Send(ev)] if ev.len() == 3));
        assert!(snap.records.is_empty());
        let steps = snap.plan(relist(&running), |_| false);
        assert!(matches!(&steps[..], [Step::Send(_)]));
        assert_eq!(snap.records.get("u"), Some(&running));
    }

    #[test]
    fn health_fails_when_the_sync_loop_or_the_runtime_has_been_quiet_too_long() {
        let state = RuntimeState::default();
        let t0 = state.lock_times().created;
        let sync = Duration::from_secs(300);
        let failing = |now: Instant| -> Vec<&'static str> {
            state
                .health(now, sync)
                .into_iter()
                .filter(|(_, r)| r.is_err())
                .map(|(n, _)| n)
                .collect()
        };
        // At the start: healthy, and for up to 3 minutes without a relist.
        assert!(failing(t0).is_empty());
        assert!(failing(t0 + Duration::from_secs(179)).is_empty());
        assert_eq!(failing(t0 + Duration::from_secs(181)), ["runtime"]);
        state.set(Some("connection refused".into()));
        let why = state.health(t0 + Duration::from_secs(181), sync)[2]
            .1
            .clone()
            .unwrap_err()
            .to_string();
        assert!(
            why.contains("since the start") && why.ends_with(": connection refused"),
            "{why}"
        );
        // A good relist and a turn of the loop; then both go quiet.
        state.set(None);
        state.sync_loop_ran();
        let t1 = Instant::now();
        assert!(failing(t1).is_empty());
        assert_eq!(failing(t1 + Duration::from_secs(200)), ["runtime"]);
        assert_eq!(
            failing(t1 + Duration::from_secs(301)),
            ["syncloop", "runtime"]
        );
        assert_eq!(
            sync_loop_threshold(Duration::from_secs(60)),
            Duration::from_secs(300)
        );
        assert_eq!(
            sync_loop_threshold(Duration::from_secs(200)),
            Duration::from_secs(400)
        );
    }
}
