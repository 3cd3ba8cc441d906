//! Per-pod startup timelines on one clock (CLOCK_MONOTONIC, the clock of `bpf_ktime_get_ns`).
//!
//! The [`Tracer`] joins three observers:
//! - the agent's own marks: source seen (from the `kubernetes.io/config.seen` annotation),
//!   admitted (handed to a worker), worker started, Running observed;
//! - the CRI calls, from the uprobes on the `swiftlet_cri_call_begin`/`_end` markers ([`crate::cri`]);
//! - what the kernel saw: pod cgroup created/removed, each container's first exec and its exit.
//!
//! Kernel events arrive through the [`crate::ebpf::Config::events`] sink and are consumed by
//! [`Tracer::run`]. Timelines are exposed as the `swiftlet_pod_start_phase_duration_seconds{phase}`
//! histograms, on the `swiftlet.v1.PodTrace` gRPC service ([`server`]) and as JSON on
//! `/debug/trace/pods`.

pub mod cli;
pub mod otlp;
pub mod server;
pub mod timeline;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::Pod;
use swiftlet_proto::v1 as proto;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use crate::ebpf::exits::pod_of_path;
use crate::ebpf::{CgroupEventKind, KernelEvent, Monitor};
use crate::metrics::{Metrics, PhaseLabel};
pub use timeline::{Mark, Observer, Phase, PodRecord};

/// How many pods the tracer remembers at most; the oldest are forgotten first.
pub const MAX_PODS: usize = 4096;
/// How many bytes the remembered timelines may take (their records and what they point to, as
/// [`PodRecord::heap_bytes`] counts them); the oldest are forgotten first. A pod's start takes
/// about 2 KiB, so this keeps the last thousand or so: enough for every pod of a node at once.
pub const MAX_BYTES: usize = 2 << 20;
/// CRI calls kept per pod: the startup's come first; a pod that lives long (every sync reads
/// it) stops adding calls once this many are kept.
pub const MAX_CRI_SPANS: usize = 256;
/// Exec cgroups kept per pod (a crash-looping container adds one per restart).
pub const MAX_EXECS: usize = 64;
/// Capacity of the update channel behind [`Tracer::subscribe`].
pub const UPDATES_CAPACITY: usize = 1024;

pub use crate::ebpf::exits::monotonic_ns;

/// The monotonic time of a wall-clock `config.seen` stamp: now minus how long ago it was.
fn seen_monotonic(pod: &Pod, now_mono: u64) -> Option<u64> {
    let seen: jiff::Timestamp = pod
        .metadata
        .annotations
        .as_ref()?
        .get(crate::pod::annotations::CONFIG_SEEN)?
        .parse()
        .ok()?;
    let ago = jiff::Timestamp::now().duration_since(seen).as_nanos();
    let ago = u64::try_from(ago.max(0)).ok()?;
    Some(now_mono.saturating_sub(ago))
}

#[derive(Default)]
struct State {
    pods: HashMap<String, PodRecord>,
    /// The sum of [`PodRecord::heap_bytes`] over `pods`.
    bytes: usize,
    /// cgroup2 id of a container cgroup -> (pod UID, when it was created), from `cgroup_mkdir`
    /// on the cgroup2 hierarchy.
    cgroup_owner: HashMap<u64, (String, u64)>,
}

impl State {
    /// Forgets the oldest timelines until at most [`MAX_PODS`] taking at most [`MAX_BYTES`]
    /// are left.
    fn evict(&mut self) {
        while self.pods.len() > MAX_PODS || self.bytes > MAX_BYTES {
            let Some(oldest) = self
                .pods
                .values()
                .min_by_key(|p| p.source_seen_ns.unwrap_or(0))
                .map(|p| p.uid.clone())
            else {
                return;
            };
            if let Some(gone) = self.pods.remove(&oldest) {
                self.bytes = self.bytes.saturating_sub(gone.heap_bytes());
            }
            self.cgroup_owner.retain(|_, (uid, _)| *uid != oldest);
        }
        // A map that once held more entries keeps their room: give it back once it is mostly
        // empty, so its size follows what it holds.
        if self.pods.capacity() > 4 * self.pods.len().max(64) {
            self.pods.shrink_to_fit();
        }
        if self.cgroup_owner.capacity() > 4 * self.cgroup_owner.len().max(64) {
            self.cgroup_owner.shrink_to_fit();
        }
    }

    /// Bytes held now (tests).
    #[cfg(test)]
    fn counted_bytes(&self) -> usize {
        self.pods.values().map(PodRecord::heap_bytes).sum()
    }
}

struct Shared {
    state: Mutex<State>,
    updates: broadcast::Sender<proto::PodTimeline>,
    metrics: Metrics,
    /// The loaded probes; `None` when they are off (`--ebpf=off`, or not loadable where that
    /// is allowed): the timelines then hold the agent's marks and CRI calls only, as they should.
    monitor: Option<Monitor>,
    /// Whether the probes are loaded (fixed at construction, but for tests).
    kernel: AtomicBool,
    /// Where complete pod starts are exported (`tracing.endpoint`), once set.
    otlp: std::sync::OnceLock<otlp::Sink>,
    /// Timelines copied for publishing (tests).
    #[cfg(test)]
    copies: std::sync::atomic::AtomicUsize,
}

/// Handle on the timelines. Cheap to clone.
#[derive(Clone)]
pub struct Tracer {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer").finish_non_exhaustive()
    }
}

/// The hierarchy id of cgroup2 (`0::/...` in `/proc/<pid>/cgroup`).
const CGROUP2_HIERARCHY: u32 = 0;

impl Tracer {
    /// The timelines; `monitor`: the loaded probes, whose loss counter is reported and whose
    /// phases a timeline waits for before counting as complete (`None`: the probes are off).
    pub fn new(metrics: Metrics, monitor: Option<Monitor>) -> Self {
        let (updates, _) = broadcast::channel(UPDATES_CAPACITY);
        let kernel = monitor.is_some();
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                updates,
                metrics,
                monitor,
                kernel: AtomicBool::new(kernel),
                otlp: std::sync::OnceLock::new(),
                #[cfg(test)]
                copies: Default::default(),
            }),
        }
    }

    /// Exports every complete pod start to `sink` from now on (set once).
    pub fn export_to(&self, sink: otlp::Sink) {
        let _ = self.shared.otlp.set(sink);
    }

    #[cfg(test)]
    fn set_monitor_for_test(&self) {
        self.shared.kernel.store(true, Ordering::Release);
    }

    pub fn probes_loaded(&self) -> bool {
        self.shared.kernel.load(Ordering::Acquire)
    }

    pub fn events_lost(&self) -> u64 {
        self.shared.monitor.as_ref().map_or(0, Monitor::events_lost)
    }

    pub fn events_seen(&self) -> u64 {
        self.shared.monitor.as_ref().map_or(0, Monitor::events_seen)
    }

    fn with_pod(&self, uid: &str, f: impl FnOnce(&mut PodRecord)) {
        let mut guard = self
            .shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let state = &mut *guard;
        let Some(pod) = state.pods.get_mut(uid) else {
            return;
        };
        let before = pod.heap_bytes();
        f(pod);
        pod.cri.truncate(MAX_CRI_SPANS);
        pod.execs.truncate(MAX_EXECS);
        let first_complete = !pod.observed && pod.complete(self.probes_loaded());
        // Copied only when something is published: a copy per event would cost a pod of n
        // containers n strings at every exec, exit and CRI call of its start.
        let watched = pod.running_observed_ns.is_some() && self.shared.updates.receiver_count() > 0;
        let snapshot = (first_complete || watched).then(|| pod.clone());
        #[cfg(test)]
        self.shared
            .copies
            .fetch_add(usize::from(snapshot.is_some()), Ordering::Relaxed);
        if first_complete {
            pod.observed = true;
        }
        state.bytes = (state.bytes + pod.heap_bytes()).saturating_sub(before);
        state.evict();
        drop(guard);
        if let Some(snapshot) = snapshot {
            self.publish(&snapshot, first_complete);
        }
    }

    /// Sends the timeline to watchers once the pod is Running (every change after that), and on
    /// the first complete timeline feeds the phase histograms.
    fn publish(&self, pod: &PodRecord, first_complete: bool) {
        if first_complete {
            for phase in pod.breakdown() {
                self.shared
                    .metrics
                    .pod_start_phase_duration_seconds
                    .get_or_create(&PhaseLabel {
                        phase: phase.kind.clone(),
                    })
                    .observe(phase.ms() / 1e3);
            }
            if let Some(sink) = self.shared.otlp.get() {
                sink.offer(pod);
            }
        }
        // Built only for a watcher: with none (the usual case), a start costs no copy of its
        // timeline per change.
        if pod.running_observed_ns.is_some() && self.shared.updates.receiver_count() > 0 {
            // A watcher gone since is fine.
            let _ = self.shared.updates.send(self.to_proto(pod));
        }
    }

    /// The sync loop saw a new pod from a source (`admitted`: it hands it to a worker now).
    pub fn pod_admitted(&self, uid: &str, pod: &Pod) {
        let now = monotonic_ns();
        {
            let mut state = self
                .shared
                .state
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if state.pods.contains_key(uid) {
                return;
            }
            let mut record = PodRecord::new(uid);
            record.name = pod.metadata.name.clone().unwrap_or_default();
            record.namespace = pod.metadata.namespace.clone().unwrap_or_default();
            record.containers = pod
                .spec
                .iter()
                .flat_map(|s| &s.containers)
                .map(|c| c.name.clone())
                .collect();
            record.source_seen_ns = Some(seen_monotonic(pod, now).unwrap_or(now).min(now));
            record.admitted_ns = Some(now);
            state.bytes += record.heap_bytes();
            state.pods.insert(uid.to_owned(), record);
            state.evict();
        }
    }

    /// The pod's worker started syncing it (first time only).
    pub fn worker_started(&self, uid: &str) {
        let now = monotonic_ns();
        self.with_pod(uid, |p| {
            p.worker_started_ns.get_or_insert(now);
        });
    }

    /// The pod's volumes were set up, at `at_ns` (first time only).
    pub fn volumes_set_up(&self, uid: &str, at_ns: u64) {
        self.with_pod(uid, |p| {
            p.volumes_ns.get_or_insert(at_ns);
        });
    }

    /// The status manager saw the pod Running for the first time.
    pub fn running_observed(&self, uid: &str) {
        let now = monotonic_ns();
        self.with_pod(uid, |p| {
            p.running_observed_ns.get_or_insert(now);
        });
    }

    /// Feeds one event from the probes.
    pub fn kernel_event(&self, event: &KernelEvent) {
        match event {
            KernelEvent::Cgroup(e) => {
                let Some((uid, child)) = pod_of_path(&e.path) else {
                    return;
                };
                let uid = uid.into_owned();
                match (e.kind, child) {
                    (CgroupEventKind::Mkdir, None) => self.with_pod(&uid, |p| {
                        p.pod_cgroup_ns.get_or_insert(e.ktime_ns);
                    }),
                    (CgroupEventKind::Rmdir, None) => self.with_pod(&uid, |p| {
                        p.pod_cgroup_removed_ns.get_or_insert(e.ktime_ns);
                    }),
                    (CgroupEventKind::Mkdir, Some(_)) if e.hierarchy_id == CGROUP2_HIERARCHY => {
                        let mut state = self
                            .shared
                            .state
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner);
                        if state.pods.contains_key(&uid) {
                            state.cgroup_owner.insert(e.cgroup_id, (uid, e.ktime_ns));
                        }
                    }
                    (CgroupEventKind::Rmdir, Some(_)) if e.hierarchy_id == CGROUP2_HIERARCHY => {
                        let mut state = self
                            .shared
                            .state
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner);
                        state.cgroup_owner.remove(&e.cgroup_id);
                    }
                    _ => {}
                }
            }
            KernelEvent::Exec(e) => {
                let Some((uid, created_ns)) = self.owner(e.cgroup_id) else {
                    return;
                };
                let exec = timeline::ExecCgroup {
                    cgroup_id: e.cgroup_id,
                    created_ns: Some(created_ns),
                    first_exec_ns: e.ktime_ns,
                    pid: e.tgid,
                    comm: e.comm.clone(),
                    exit: None,
                };
                self.with_pod(&uid, |p| {
                    match p.execs.iter_mut().find(|x| x.cgroup_id == e.cgroup_id) {
                        None => p.execs.push(exec),
                        // A process that exited before another one exec'd in its cgroup was not
                        // the container's (whose exit ends the container): runc's first stage
                        // re-executes itself after joining the cgroup and exits once the
                        // container's init is set up. The container's own exec replaces it.
                        Some(x) if x.exit.is_some() => *x = exec,
                        Some(_) => {}
                    }
                });
            }
            KernelEvent::Exit(e) => {
                let Some((uid, _)) = self.owner(e.cgroup_id) else {
                    return;
                };
                self.with_pod(&uid, |p| {
                    if let Some(x) = p
                        .execs
                        .iter_mut()
                        .find(|x| x.cgroup_id == e.cgroup_id && x.pid == e.tgid && x.exit.is_none())
                    {
                        x.exit = Some((e.ktime_ns, e.exit_code));
                    }
                });
            }
            KernelEvent::Cri(m) => {
                if m.uid.is_empty() {
                    return;
                }
                self.with_pod(&m.uid, |p| match m.ok {
                    None => p.cri.push(timeline::CriSpan {
                        method: m.method,
                        begin_ns: m.ktime_ns,
                        end_ns: None,
                        ok: None,
                    }),
                    Some(ok) => {
                        if let Some(span) = p
                            .cri
                            .iter_mut()
                            .rev()
                            .find(|s| s.method == m.method && s.end_ns.is_none())
                        {
                            span.end_ns = Some(m.ktime_ns);
                            span.ok = Some(ok);
                        }
                    }
                });
            }
        }
    }

    fn owner(&self, cgroup_id: u64) -> Option<(String, u64)> {
        let state = self
            .shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        state.cgroup_owner.get(&cgroup_id).cloned()
    }

    /// Consumes the probes' events until `cancel` fires or the sender is gone.
    pub async fn run(
        self,
        mut events: mpsc::UnboundedReceiver<KernelEvent>,
        cancel: CancellationToken,
    ) {
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                event = events.recv() => match event {
                    Some(event) => self.kernel_event(&event),
                    None => return,
                },
            }
        }
    }

    /// One pod's record.
    pub fn pod(&self, uid: &str) -> Option<PodRecord> {
        let state = self
            .shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        state.pods.get(uid).cloned()
    }

    /// Every pod's record, oldest first.
    pub fn pods(&self) -> Vec<PodRecord> {
        let state = self.lock_state();
        let mut pods: Vec<PodRecord> = state.pods.values().cloned().collect();
        pods.sort_by_key(|p| p.source_seen_ns);
        pods
    }

    /// Timeline updates (sent once a pod is Running, then on every change).
    pub fn subscribe(&self) -> broadcast::Receiver<proto::PodTimeline> {
        self.shared.updates.subscribe()
    }

    pub fn to_proto(&self, pod: &PodRecord) -> proto::PodTimeline {
        let phases = pod.breakdown();
        proto::PodTimeline {
            uid: pod.uid.clone(),
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            e2e_ms: pod.e2e_ms_of(&phases).unwrap_or(0.0),
            phases: phases
                .into_iter()
                .map(|p| proto::Phase {
                    name: p.name,
                    start_ns: p.start_ns,
                    end_ns: p.end_ns,
                    observer: p.observer.as_str().to_owned(),
                })
                .collect(),
            marks: pod
                .marks()
                .into_iter()
                .map(|m| proto::Mark {
                    name: m.name,
                    at_ns: m.at_ns,
                    observer: m.observer.as_str().to_owned(),
                    detail: m.detail,
                })
                .collect(),
            complete: pod.complete(self.probes_loaded()),
        }
    }
}

/// JSON view of one timeline, for `/debug/trace/pods`.
#[derive(Debug, serde::Serialize)]
pub struct PodView {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub e2e_ms: Option<f64>,
    /// End-to-end minus the time a CRI call for the pod was in flight.
    pub agent_ms: Option<f64>,
    pub complete: bool,
    pub phases: Vec<PhaseView>,
    pub marks: Vec<Mark>,
}

#[derive(Debug, serde::Serialize)]
pub struct PhaseView {
    pub phase: String,
    pub ms: f64,
    pub start_ns: u64,
    pub observer: Observer,
}

/// JSON view of every timeline.
#[derive(Debug, serde::Serialize)]
pub struct TraceView {
    pub probes_loaded: bool,
    pub events_seen: u64,
    pub events_lost: u64,
    pub pods: Vec<PodView>,
}

impl Tracer {
    pub fn view(&self) -> TraceView {
        let kernel = self.probes_loaded();
        TraceView {
            probes_loaded: kernel,
            events_seen: self.events_seen(),
            events_lost: self.events_lost(),
            pods: self
                .pods()
                .into_iter()
                .map(|p| pod_view(p, kernel))
                .collect(),
        }
    }

    /// [`Tracer::view`] as JSON text in pieces, each made when it is taken: the head, then one
    /// pod at a time (in the view's order; a pod forgotten meanwhile is left out), then the
    /// tail. A reader of `/debug/trace/pods` thus holds one pod's view at a time instead of a
    /// copy of every timeline and its whole view. The text is what serializing the view gives.
    pub fn view_json_pieces(&self) -> impl Iterator<Item = Vec<u8>> + Send + 'static {
        let kernel = self.probes_loaded();
        let head = format!(
            "{{\"probes_loaded\":{kernel},\"events_seen\":{},\"events_lost\":{},\"pods\":[",
            self.events_seen(),
            self.events_lost()
        );
        let order: Vec<String> = {
            let state = self.lock_state();
            let mut order: Vec<(Option<u64>, &String)> = state
                .pods
                .iter()
                .map(|(uid, p)| (p.source_seen_ns, uid))
                .collect();
            order.sort_by_key(|(seen, _)| *seen);
            order.into_iter().map(|(_, uid)| uid.clone()).collect()
        };
        let tracer = self.clone();
        let mut first = true;
        let pods = order.into_iter().filter_map(move |uid| {
            let record = tracer.lock_state().pods.get(&uid).cloned()?;
            let mut piece = if first { Vec::new() } else { vec![b','] };
            first = false;
            serde_json::to_writer(&mut piece, &pod_view(record, kernel)).ok()?;
            Some(piece)
        });
        std::iter::once(head.into_bytes())
            .chain(pods)
            .chain(std::iter::once(b"]}".to_vec()))
    }

    fn lock_state(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// The JSON view of timeline `p` (`kernel`: the probes are loaded).
fn pod_view(p: PodRecord, kernel: bool) -> PodView {
    let phases = p.breakdown();
    PodView {
        e2e_ms: p.e2e_ms_of(&phases),
        agent_ms: p.agent_ms_of(&phases),
        complete: p.complete(kernel),
        phases: phases
            .into_iter()
            .map(|ph| PhaseView {
                ms: ph.ms(),
                phase: ph.name,
                start_ns: ph.start_ns,
                observer: ph.observer,
            })
            .collect(),
        marks: p.marks(),
        uid: p.uid,
        namespace: p.namespace,
        name: p.name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ebpf::{CgroupEvent, CriMark, ProcessEvent};

    fn pod(name: &str, uid: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": uid},
            "spec": {"containers": [{"name": "app", "image": "i"}]}
        }))
        .expect("valid pod")
    }

    fn cgroup(
        kind: CgroupEventKind,
        path: &str,
        hierarchy_id: u32,
        id: u64,
        at: u64,
    ) -> KernelEvent {
        KernelEvent::Cgroup(CgroupEvent {
            kind,
            path: path.into(),
            level: 3,
            ktime_ns: at,
            hierarchy_id,
            cgroup_id: id,
        })
    }

    fn cri(method: &'static str, uid: &str, at: u64, ok: Option<bool>) -> KernelEvent {
        KernelEvent::Cri(CriMark {
            ktime_ns: at,
            method,
            uid: uid.into(),
            ok,
        })
    }

    fn process(cgroup_id: u64, at: u64, exit_code: Option<i32>) -> ProcessEvent {
        ProcessEvent {
            ktime_ns: at,
            pid: 50,
            tgid: 50,
            cgroup_id,
            comm: "sleep".into(),
            exit_code,
        }
    }

    #[test]
    fn the_view_written_in_pieces_is_the_view() {
        let tracer = Tracer::new(Metrics::new(), None);
        let whole = |t: &Tracer| {
            String::from_utf8(t.view_json_pieces().collect::<Vec<_>>().concat()).expect("utf-8")
        };
        assert_eq!(
            whole(&tracer),
            serde_json::to_string(&tracer.view()).expect("json")
        );
        for (name, uid) in [("a", "u1"), ("b", "u2"), ("c", "u3")] {
            tracer.pod_admitted(uid, &pod(name, uid));
            tracer.worker_started(uid);
        }
        let pieces: Vec<Vec<u8>> = tracer.view_json_pieces().collect();
        assert_eq!(pieces.len(), 5, "the head, one piece per pod, the tail");
        let text = whole(&tracer);
        assert_eq!(text, serde_json::to_string(&tracer.view()).expect("json"));
        let parsed: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
        assert_eq!(parsed["pods"].as_array().map(Vec::len), Some(3));
    }

    /// Joins agent marks, CRI markers and kernel events into one timeline, ignoring other pods'
    /// and other hierarchies' events, and feeds the histograms once.
    #[test]
    fn joins_the_observers() {
        let metrics = Metrics::new();
        let tracer = Tracer::new(metrics.clone(), None);
        let mut updates = tracer.subscribe();
        tracer.pod_admitted("u1", &pod("p", "u1"));
        tracer.worker_started("u1");
        let t0 = tracer
            .pod("u1")
            .and_then(|p| p.worker_started_ns)
            .expect("mark");
        let events = [
            cgroup(
                CgroupEventKind::Mkdir,
                "/kubepods/besteffort/podu1",
                4,
                1,
                t0 + 1,
            ),
            cri("RunPodSandbox", "u1", t0 + 2, None),
            // The sandbox's cgroup on cgroup2 and on a v1 hierarchy (same id, other hierarchy).
            cgroup(
                CgroupEventKind::Mkdir,
                "/kubepods/besteffort/podu1/s",
                0,
                10,
                t0 + 3,
            ),
            cgroup(
                CgroupEventKind::Mkdir,
                "/kubepods/besteffort/podu1/s",
                4,
                11,
                t0 + 3,
            ),
            KernelEvent::Exec(process(10, t0 + 4, None)),
            KernelEvent::Exec(process(11, t0 + 4, None)),
            cri("RunPodSandbox", "u1", t0 + 5, Some(true)),
            cri("ImageStatus", "", t0 + 6, None),
            cri("CreateContainer", "u1", t0 + 7, None),
            cri("CreateContainer", "u1", t0 + 8, Some(true)),
            cri("StartContainer", "u1", t0 + 9, None),
            cgroup(
                CgroupEventKind::Mkdir,
                "/kubepods/besteffort/podu1/c",
                0,
                20,
                t0 + 10,
            ),
            KernelEvent::Exec(process(20, t0 + 11, None)),
            cri("StartContainer", "u1", t0 + 12, Some(true)),
            // Another pod's events are ignored.
            cgroup(CgroupEventKind::Mkdir, "/kubepods/podother", 4, 2, t0 + 12),
        ];
        for e in &events {
            tracer.kernel_event(e);
        }
        tracer.set_monitor_for_test();
        assert!(
            updates.try_recv().is_err(),
            "nothing published before Running"
        );
        tracer.running_observed("u1");
        let record = tracer.pod("u1").expect("known");
        assert!(record.complete(true), "{record:?}");
        let names: Vec<String> = record.breakdown().into_iter().map(|p| p.name).collect();
        assert!(names.contains(&"pod_cgroup".to_owned()), "{names:?}");
        assert!(names.contains(&"exec/app".to_owned()), "{names:?}");
        assert_eq!(record.execs.len(), 2, "the v1 id 11 is not a pod cgroup2");
        let update = updates.try_recv().expect("published when Running");
        assert_eq!(update.uid, "u1");
        assert!(update.complete);
        let text = metrics.encode();
        assert!(
            text.contains("swiftlet_pod_start_phase_duration_seconds_count{phase=\"exec\"} 1"),
            "{text}"
        );

        // Later: the container exits with 3, the pod cgroup goes away.
        tracer.kernel_event(&KernelEvent::Exit(process(20, t0 + 100, Some(3))));
        tracer.kernel_event(&cgroup(
            CgroupEventKind::Rmdir,
            "/kubepods/besteffort/podu1",
            4,
            1,
            t0 + 200,
        ));
        let marks = tracer.pod("u1").expect("known").marks();
        assert!(
            marks
                .iter()
                .any(|m| m.name == "exit/app" && m.detail == "exit code 3")
        );
        assert!(marks.iter().any(|m| m.name == "pod_cgroup_removed"));
        let text = metrics.encode();
        assert!(
            text.contains("swiftlet_pod_start_phase_duration_seconds_count{phase=\"exec\"} 1"),
            "histograms are fed once: {text}"
        );
    }

    #[test]
    fn unknown_pods_and_duplicates_are_ignored() {
        let tracer = Tracer::new(Metrics::new(), None);
        tracer.worker_started("nobody");
        tracer.kernel_event(&cri("RunPodSandbox", "nobody", 1, None));
        assert!(tracer.pods().is_empty());
        tracer.pod_admitted("u", &pod("p", "u"));
        let first = tracer.pod("u").and_then(|p| p.admitted_ns);
        tracer.pod_admitted("u", &pod("p", "u"));
        assert_eq!(tracer.pod("u").and_then(|p| p.admitted_ns), first);
    }

    /// runc's first stage can join the container's cgroup before it re-executes itself, and exit
    /// before the container's process execs there: the exit mark is that of the container's
    /// process, not the first one seen.
    #[test]
    fn a_process_that_exited_before_the_containers_exec_is_not_the_container() {
        let tracer = Tracer::new(Metrics::new(), None);
        tracer.pod_admitted("u1", &pod("p", "u1"));
        let proc_at = |pid: u32, comm: &str, at: u64, code: Option<i32>| ProcessEvent {
            ktime_ns: at,
            pid,
            tgid: pid,
            cgroup_id: 20,
            comm: comm.into(),
            exit_code: code,
        };
        let events = [
            cri("StartContainer", "u1", 9, None),
            cgroup(
                CgroupEventKind::Mkdir,
                "/kubepods/besteffort/podu1/c",
                0,
                20,
                10,
            ),
            KernelEvent::Exec(proc_at(40, "runc", 11, None)),
            KernelEvent::Exit(proc_at(40, "runc", 12, Some(0))),
            KernelEvent::Exec(proc_at(42, "sh", 13, None)),
            cri("StartContainer", "u1", 14, Some(true)),
            KernelEvent::Exec(proc_at(43, "sleep", 15, None)),
            KernelEvent::Exit(proc_at(43, "sleep", 16, Some(0))),
            KernelEvent::Exit(proc_at(42, "sh", 17, Some(7))),
        ];
        for e in &events {
            tracer.kernel_event(e);
        }
        let marks = tracer.pod("u1").expect("known").marks();
        let exec = marks
            .iter()
            .find(|m| m.name == "first_exec/app")
            .expect("exec mark");
        assert_eq!((exec.at_ns, exec.detail.as_str()), (13, "pid 42 sh"));
        let exits: Vec<_> = marks.iter().filter(|m| m.name == "exit/app").collect();
        assert_eq!(exits.len(), 1, "{marks:?}");
        assert_eq!(exits[0].detail, "exit code 7");
    }

    /// A start's worth of CRI calls for `uid` (a begin and an end each).
    fn start_calls(tracer: &Tracer, uid: &str, n: u64) {
        for i in 0..n {
            tracer.kernel_event(&cri("ContainerStatus", uid, 10 + 2 * i, None));
            tracer.kernel_event(&cri("ContainerStatus", uid, 11 + 2 * i, Some(true)));
        }
    }

    #[test]
    fn the_timelines_are_bounded_by_their_bytes() {
        let tracer = Tracer::new(Metrics::new(), None);
        // Pods that made many CRI calls each: far more bytes than the budget, far fewer pods than
        // MAX_PODS.
        let n = 3_000;
        for i in 0..n {
            let uid = format!("uid-{i:05}");
            tracer.pod_admitted(&uid, &pod(&format!("p{i}"), &uid));
            start_calls(&tracer, &uid, 40);
        }
        let state = tracer.shared.state.lock().unwrap();
        assert_eq!(
            state.bytes,
            state.counted_bytes(),
            "the running sum drifted"
        );
        assert!(state.bytes <= MAX_BYTES, "{} bytes kept", state.bytes);
        assert!(state.pods.len() < n, "nothing forgotten");
        assert!(state.pods.len() > 100, "only {} kept", state.pods.len());
        // The newest are kept, the oldest forgotten.
        assert!(state.pods.contains_key(&format!("uid-{:05}", n - 1)));
        assert!(!state.pods.contains_key("uid-00000"));
        // The map gives back the room of what it forgot.
        assert!(state.pods.capacity() <= 4 * state.pods.len().max(64) * 2);
    }

    /// A timeline is copied only to be published: a pod of 1,000 containers' start (an event per
    /// CRI call, exec and exit) copied its 1,000 names at every event before.
    #[test]
    fn a_timeline_is_copied_only_for_a_watcher_or_its_first_completion() {
        let tracer = Tracer::new(Metrics::new(), None);
        let containers: Vec<serde_json::Value> = (0..1_000)
            .map(|i| serde_json::json!({"name": format!("c{i}"), "image": "i"}))
            .collect();
        let huge: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "huge", "namespace": "default", "uid": "u"},
            "spec": {"containers": containers}
        }))
        .expect("valid pod");
        tracer.set_monitor_for_test();
        tracer.pod_admitted("u", &huge);
        tracer.worker_started("u");
        start_calls(&tracer, "u", 500);
        tracer.running_observed("u");
        start_calls(&tracer, "u", 500);
        let copies = || tracer.shared.copies.load(Ordering::Relaxed);
        assert_eq!(
            copies(),
            0,
            "no watcher, never complete (1,000 starts not seen)"
        );
        // A watcher gets every change once the pod runs: a copy each.
        let mut updates = tracer.subscribe();
        start_calls(&tracer, "u", 3);
        assert_eq!(copies(), 6);
        assert!(updates.try_recv().is_ok());
    }

    #[test]
    fn a_long_lived_pod_stops_adding_calls_at_the_cap() {
        let tracer = Tracer::new(Metrics::new(), None);
        tracer.pod_admitted("u", &pod("p", "u"));
        start_calls(&tracer, "u", 10 * MAX_CRI_SPANS as u64);
        let record = tracer.pod("u").expect("kept");
        assert_eq!(record.cri.len(), MAX_CRI_SPANS);
        // The first calls (the start's) are the ones kept.
        assert_eq!(record.cri[0].begin_ns, 10);
        assert!(record.heap_bytes() < MAX_BYTES / 100);
    }
}
