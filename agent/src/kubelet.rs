//! The sync loop: one task that owns the desired pods and hands work to pod workers
//! (the kubelet's `syncLoop`). It selects over config updates, PLEG events, finished workers, a
//! 1 s tick that hands out due work (resyncs and retries from the work queue) and 2 s
//! housekeeping (only once every source has reported). While the runtime reports an error it
//! backs off, 100 ms doubling to 5 s, before each iteration.
use crate::config::{Op, PodRef, PodUpdate, SourcesReady};
use crate::pleg::RuntimePods;
use crate::pod_registry::PodRegistry;
use crate::pod_workers::{PodSyncer, PodWorkers, UpdateType, Work, WorkerContext};
use crate::status::StatusManager;
use k8s_openapi::api::core::v1::Pod;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const SYNC_TICK: Duration = Duration::from_secs(1);
const HOUSEKEEPING: Duration = Duration::from_secs(2);
const HOUSEKEEPING_WARNING: Duration = Duration::from_secs(1);
const BACKOFF_BASE: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Pods whose workers finished lately, by UID, with when.
type Finished = HashMap<String, tokio::time::Instant>;

/// Exponential back-off of the sync loop while the runtime is failing: 100 ms doubling to 5 s.
#[derive(Debug)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { next: BACKOFF_BASE }
    }
}

impl Backoff {
    /// The delay to wait now; the next one is twice as long, up to the maximum.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        d
    }

    pub fn reset(&mut self) {
        self.next = BACKOFF_BASE;
    }
}

pub struct SyncLoop<S: PodSyncer = WorkerContext> {
    pub config_rx: mpsc::Receiver<PodUpdate>,
    pub sources_ready: SourcesReady,
    pub pleg_rx: mpsc::Receiver<crate::pleg::Event>,
    pub done_rx: mpsc::UnboundedReceiver<String>,
    /// Probe results that changed.
    pub probe_rx: mpsc::UnboundedReceiver<crate::prober::Update>,
    /// The UIDs of pods a watched configMap or secret of which changed (`ApiObjects`).
    pub objects_rx: mpsc::UnboundedReceiver<String>,
    pub runtime_pods: RuntimePods,
    pub runtime_state: crate::pleg::RuntimeState,
    pub workers: PodWorkers<S>,
    /// The desired and rejected pods: the sync loop is the registry's only writer.
    pub registry: PodRegistry,
    pub status: StatusManager,
    pub metrics: crate::metrics::Metrics,
    pub tracer: crate::trace::Tracer,
    /// `--max-pods`: admission rejects a new pod beyond this many active ones.
    pub max_pods: usize,
    /// The node as admission sees it (labels, taints, allocatable cpu and memory); the node
    /// module keeps its labels and taints those of the Node in the API server.
    pub node: tokio::sync::watch::Receiver<crate::pod::admission::Node>,
    /// The node conditions the eviction manager holds under pressure, sorted: admission refuses
    /// pods under them (`pod::admission::admit_under_pressure`).
    pub pressure: tokio::sync::watch::Receiver<Vec<&'static str>>,
}

fn uid_of(pod: &PodRef) -> Option<String> {
    Some(pod.uid().to_owned()).filter(|u| !u.is_empty())
}

/// The whole pod of `pod` (decoded when it is packed); `None`, logged, when it cannot be decoded.
fn whole(pod: PodRef) -> Option<Arc<Pod>> {
    match pod.whole() {
        Ok(pod) => Some(pod),
        Err(e) => {
            tracing::error!(error = %e, "pod update dropped");
            None
        }
    }
}

impl<S: PodSyncer> SyncLoop<S> {
    pub async fn run(mut self, cancel: CancellationToken) {
        let mut pods: HashMap<String, Arc<Pod>> = HashMap::new();
        let mut finished = Finished::new();
        let mut sync_tick = tokio::time::interval(SYNC_TICK);
        sync_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut housekeeping = tokio::time::interval(HOUSEKEEPING);
        housekeeping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut backoff = Backoff::default();
        loop {
            if let Some(error) = self.runtime_state.error() {
                let delay = backoff.next_delay();
                tracing::warn!(%error, ?delay, "container runtime is failing; sync loop backing off");
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(delay) => {}
                }
                continue;
            }
            backoff.reset();
            self.runtime_state.sync_loop_ran();
            tokio::select! {
                _ = cancel.cancelled() => return,
                update = self.config_rx.recv() => match update {
                    Some(u) => self.handle_config(&mut pods, u),
                    None => return,
                },
                Some(event) = self.pleg_rx.recv() => {
                    if event.is_sync_worthy()
                        && let Some(pod) = pods.get(&event.uid)
                    {
                        self.workers.update_pod(&event.uid, Work::new(UpdateType::Sync, pod.clone()));
                    }
                }
                Some(u) = self.probe_rx.recv() => self.handle_probe(&pods, u),
                Some(uid) = self.objects_rx.recv() => {
                    // A configMap or secret it names changed: its volumes are rewritten now.
                    if let Some(pod) = pods.get(&uid) {
                        self.workers.update_pod(&uid, Work::new(UpdateType::Sync, pod.clone()));
                    }
                }
                Some(uid) = self.done_rx.recv() => {
                    let purged = self.workers.on_finished(&uid, &pods);
                    self.handle_purged(&pods, purged, &mut finished);
                }
                _ = sync_tick.tick() => {
                    for uid in self.workers.queue().get_work() {
                        if let Some(pod) = pods.get(&uid) {
                            self.workers.update_pod(&uid, Work::new(UpdateType::Sync, pod.clone()));
                        }
                    }
                    // Once a tick, not at every turn of the loop: the count walks every pod,
                    // and an idle 250-pod node turns the loop several times per resync.
                    self.metrics
                        .running_pods
                        .set(self.status.running_count() as i64);
                }
                _ = housekeeping.tick() => self.housekeeping(&mut pods, &mut finished),
            }
        }
    }

    fn handle_config(&mut self, pods: &mut HashMap<String, Arc<Pod>>, u: PodUpdate) {
        tracing::debug!(op = ?u.op, source = u.source, n = u.pods.len(), "config update");
        let mut list = u.pods;
        match u.op {
            Op::Add => {
                // In creation-time order (a stable sort: the source's order among equals). The
                // pods may be packed: only the ones admitted are decoded, one at a time.
                list.sort_by_key(|p| p.metadata().creation_timestamp.as_ref().map(|t| t.0));
                // Pods holding resources: admitted, not rejected, not terminated.
                let mut used = self.status.holding_resources(pods.keys()).len();
                for pod in list {
                    let Some(uid) = uid_of(&pod) else { continue };
                    // A rejected pod stays rejected, kept as its source has it now.
                    let Err(pod) = self.registry.update_rejected(&uid, pod) else {
                        continue;
                    };
                    let known = pods.contains_key(&uid);
                    let Some(whole_pod) = whole(pod.clone()) else {
                        continue;
                    };
                    // A pod its source shows finished already (an API pod that ended before an
                    // agent restart) is not judged and holds nothing, as in the kubelet: its
                    // worker only finishes it.
                    let finished = crate::pod::source_phase_is_terminal(&whole_pod);
                    if !known && !finished {
                        match self.admit(pods, &whole_pod, used) {
                            Ok(preempted) => self.sync_now(pods, preempted),
                            Err(why) => {
                                self.reject(&uid, pod, why.reason, &why.message);
                                continue;
                            }
                        }
                    }
                    let pod = whole_pod;
                    pods.insert(uid.clone(), pod.clone());
                    used += usize::from(!known && !finished);
                    self.registry.set_pod(&uid, pod.clone());
                    self.tracer.pod_admitted(&uid, &pod);
                    self.workers
                        .update_pod(&uid, Work::new(UpdateType::Create, pod));
                }
            }
            Op::Update | Op::Delete => {
                for pod in list {
                    if let Some((uid, pod)) = self.changed(pods, pod) {
                        // A deletion timestamp moves the worker to terminating by itself.
                        self.workers
                            .update_pod(&uid, Work::new(UpdateType::Update, pod));
                    }
                }
            }
            Op::Remove => {
                for pod in list {
                    let Some(uid) = uid_of(&pod) else { continue };
                    let held = pods.remove(&uid);
                    if self.registry.remove_rejected(&uid) {
                        // It never ran: nothing to kill.
                        continue;
                    }
                    if !self.sources_ready.all_ready() {
                        // Housekeeping kills it once every source has reported: killing before then could kill pods of a source that has not reported yet.
                        continue;
                    }
                    let Some(pod) = held.or_else(|| whole(pod)) else {
                        continue;
                    };
                    self.workers.update_pod(&uid, Work::kill(pod, None));
                }
            }
            Op::Reconcile => {
                for pod in list {
                    self.changed(pods, pod);
                }
            }
        }
    }

    /// A known pod changed at its source: a rejected one stays rejected (its source must delete
    /// it) and is kept as it is now; any other becomes the desired pod, returned whole with its
    /// UID.
    fn changed(
        &mut self,
        pods: &mut HashMap<String, Arc<Pod>>,
        pod: PodRef,
    ) -> Option<(String, Arc<Pod>)> {
        let uid = uid_of(&pod)?;
        let pod = whole(self.registry.update_rejected(&uid, pod).err()?)?;
        pods.insert(uid.clone(), pod.clone());
        self.registry.set_pod(&uid, pod.clone());
        Some((uid, pod))
    }

    /// Syncs the pods of `uids` now (pods admission preempted: their workers stop them).
    fn sync_now(&mut self, pods: &HashMap<String, Arc<Pod>>, uids: Vec<String>) {
        for uid in uids {
            if let Some(pod) = pods.get(&uid) {
                self.workers
                    .update_pod(&uid, Work::new(UpdateType::Sync, pod.clone()));
            }
        }
    }

    /// The kubelet's admission (`pod::admission`) of a new pod: first the eviction manager's
    /// (node pressure refuses pods), then beside the pods holding resources
    /// (`StatusManager::holding_resources`: admitted and not yet terminated, whether finished,
    /// evicted or preempted; `used` of them count against `--max-pods`): the pod
    /// count (OutOfpods), resources against allocatable, node selector and affinity, node name,
    /// host ports, NoExecute taints. A critical pod refused only for want of pods, cpu or memory
    /// is admitted by preempting others ([`SyncLoop::preempt`]); their UIDs are returned.
    fn admit(
        &self,
        pods: &HashMap<String, Arc<Pod>>,
        pod: &Pod,
        used: usize,
    ) -> Result<Vec<String>, crate::pod::admission::Rejection> {
        use crate::pod::admission::{Rejection, admit, admit_under_pressure};
        // The eviction manager's admission comes first, as in the kubelet.
        admit_under_pressure(pod, &self.pressure.borrow())?;
        let active: Vec<(&String, &Pod)> = self
            .status
            .holding_resources(pods.keys())
            .into_iter()
            .filter_map(|uid| Some((uid, pods.get(uid)?.as_ref())))
            .collect();
        let node = self.node.borrow().clone();
        let refusal = if used >= self.max_pods {
            Rejection {
                reason: "OutOfpods",
                message: format!(
                    "Node didn't have enough resource: pods, requested: 1, used: {used}, \
                     capacity: {}",
                    self.max_pods
                ),
            }
        } else {
            match admit(pod, active.iter().map(|(_, p)| *p), &node) {
                Ok(()) => return Ok(Vec::new()),
                Err(why) => why,
            }
        };
        let for_resources = matches!(refusal.reason, "OutOfpods" | "OutOfcpu" | "OutOfmemory");
        if !for_resources || !crate::pod::is_critical(pod) {
            return Err(refusal);
        }
        self.preempt(pod, &active, &node)
    }

    /// Makes room for the critical `pod` as the kubelet's critical pod admission does: a
    /// predicate other than resources that fails is the rejection; else the pods to preempt are
    /// picked among `active` (`pod::admission::preemption_victims`) and marked evicted (phase
    /// Failed, reason `Preempting`), and their UIDs returned. A pod being stopped already
    /// (evicted or preempted earlier, still holding its resources) can be picked: it frees them
    /// as it ends and is not marked again. When no set of pods frees enough,
    /// the rejection is the kubelet's `UnexpectedAdmissionError`, and nothing is preempted.
    fn preempt(
        &self,
        pod: &Pod,
        active: &[(&String, &Pod)],
        node: &crate::pod::admission::Node,
    ) -> Result<Vec<String>, crate::pod::admission::Rejection> {
        use crate::pod::admission;
        let others: Vec<&Pod> = active.iter().map(|(_, p)| *p).collect();
        let unlimited = admission::Node {
            cpu_millis: None,
            memory_bytes: None,
            ..node.clone()
        };
        admission::admit(pod, others.iter().copied(), &unlimited)?;
        let needs = admission::shortfalls(pod, &others, node, self.max_pods);
        let victims = admission::preemption_victims(pod, &others, &needs).map_err(|e| {
            admission::Rejection {
                reason: "UnexpectedAdmissionError",
                message: format!(
                    "Unexpected error while attempting to recover from admission failure: \
                     preemption: error finding a set of pods to preempt: {e}"
                ),
            }
        })?;
        let is_victim = |p: &Pod| victims.iter().any(|v| std::ptr::eq(*v, p));
        let mut preempted = Vec::new();
        for (uid, victim) in active.iter().filter(|(_, p)| is_victim(p)) {
            if self.status.is_evicted(uid) {
                // Already being stopped (evicted or preempted before): what it holds is freed
                // as it ends.
                continue;
            }
            tracing::warn!(
                pod = %crate::pod::full_name(victim),
                critical_pod = %crate::pod::full_name(pod),
                "preempting a pod to admit a critical pod"
            );
            if self.status.evict_as(
                uid,
                crate::status::PREEMPTING,
                crate::status::PREEMPTED_MESSAGE,
            ) {
                self.metrics.admission_rejection(crate::status::PREEMPTING);
                preempted.push((*uid).clone());
            }
        }
        Ok(preempted)
    }

    /// A pod admission rejects fails at once without a worker, as the kubelet rejects it: phase
    /// Failed, `reason`, "Pod was rejected: `message`". Admission is the one writer of status
    /// besides the pod worker: a rejected pod never gets one. It is kept as the mux handed it
    /// (packed, for a manifest URL's pods) with its reason and message, not among the desired
    /// pods.
    fn reject(&mut self, uid: &str, pod: PodRef, reason: &'static str, message: &str) {
        let meta = pod.metadata();
        tracing::warn!(
            pod = %format!(
                "{}_{}",
                meta.name.as_deref().unwrap_or_default(),
                meta.namespace.as_deref().unwrap_or_default()
            ),
            reason,
            %message,
            "pod rejected"
        );
        self.metrics.admission_rejection(reason);
        self.registry.reject(uid, pod, reason, message);
        // A status kept from an earlier admission of the same UID no longer counts.
        self.status.forget(uid);
    }

    /// A probe result changed: sync the pod (kubelet `handleProbeSync`), so its status shows the
    /// readiness and a failed liveness or startup probe restarts the container. A liveness
    /// result back to success needs no sync.
    fn handle_probe(&mut self, pods: &HashMap<String, Arc<Pod>>, u: crate::prober::Update) {
        use crate::prober::{Kind, ProbeResult};
        if u.kind == Kind::Liveness && u.result != ProbeResult::Failure {
            return;
        }
        if let Some(pod) = pods.get(&u.pod_uid) {
            self.workers
                .update_pod(&u.pod_uid, Work::new(UpdateType::Sync, pod.clone()));
        }
    }

    /// Purged workers: forget the status of pods gone from every source, create afresh the ones
    /// that were asked to start again while terminating.
    fn handle_purged(
        &mut self,
        pods: &HashMap<String, Arc<Pod>>,
        purged: Vec<crate::pod_workers::Purged>,
        finished: &mut Finished,
    ) {
        let now = tokio::time::Instant::now();
        for p in purged {
            match pods.get(&p.uid) {
                Some(pod) if p.restart_requested => {
                    tracing::debug!(uid = %p.uid, "restarting a pod that was wanted again while terminating");
                    self.workers
                        .update_pod(&p.uid, Work::new(UpdateType::Create, pod.clone()));
                }
                Some(_) => {}
                None => {
                    self.registry.remove_pod(&p.uid);
                    self.status.forget(&p.uid);
                    finished.insert(p.uid, now);
                }
            }
        }
    }

    /// kubelet `HandlePodCleanups`, once every source has reported: purge workers, drive workers of
    /// pods no source wants to termination, and kill runtime pods no worker knows.
    fn housekeeping(&mut self, pods: &mut HashMap<String, Arc<Pod>>, finished: &mut Finished) {
        if !self.sources_ready.all_ready() {
            return;
        }
        // A source is marked ready once its first SET's updates are in the channel: take them
        // in before judging which runtime pods no source knows (a restarted agent's relist can
        // beat its own config to the sync loop).
        while let Ok(u) = self.config_rx.try_recv() {
            self.handle_config(pods, u);
        }
        let start = tokio::time::Instant::now();
        let purged = self.workers.sync_known_pods(pods);
        self.workers.runtime_housekeeping();
        self.handle_purged(pods, purged, finished);
        // A finished pod is not taken for an orphan until a relist begun after it finished has
        // left it out: an older one can still show the pod its worker has just removed (the
        // relist may be a minute apart, see `pleg`).
        if let Ok(r) = self.runtime_pods.read() {
            finished.retain(|_, at| r.relisted.is_none_or(|relisted| relisted <= *at));
        }
        let orphans: Vec<String> = match self.runtime_pods.read() {
            Ok(r) => r
                .uids
                .iter()
                .filter(|uid| {
                    !pods.contains_key(*uid)
                        && !self.workers.is_known(uid)
                        && !finished.contains_key(*uid)
                })
                .cloned()
                .collect(),
            Err(_) => Vec::new(),
        };
        for uid in orphans {
            tracing::info!(uid = %uid, "killing runtime pod that no source knows");
            self.workers.update_pod(&uid, Work::orphan_kill(&uid));
        }
        // Pod cgroups and pod log directories of no desired, known, lately finished or running
        // pod (each waits for a second pass before removing one, so a worker creating or
        // removing it now is left alone).
        // The scan and the removals run on a blocking thread: it gets the known UIDs as a set.
        if let Ok(running) = self.runtime_pods.read() {
            let known: HashSet<String> = pods
                .keys()
                .chain(finished.keys())
                .chain(running.uids.iter())
                .cloned()
                .chain(self.workers.known_uids())
                .collect();
            self.workers.cleanup_orphans(known);
        }
        let took = start.elapsed();
        if took > HOUSEKEEPING_WARNING {
            tracing::warn!(?took, "housekeeping took too long");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod_workers::tests::{Call, Fake, Inner, pod};
    use tokio_util::task::TaskTracker;

    struct Running {
        config_tx: mpsc::Sender<PodUpdate>,
        runtime_state: crate::pleg::RuntimeState,
        runtime_pods: RuntimePods,
        fake: Fake,
        status: StatusManager,
        pods: crate::pod_registry::Pods,
        pressure: tokio::sync::watch::Sender<Vec<&'static str>>,
        _cancel: tokio_util::sync::DropGuard,
    }

    fn start(inner: Inner) -> Running {
        start_with(inner, 110)
    }

    fn start_with(inner: Inner, max_pods: usize) -> Running {
        let fake = Fake(Arc::new(inner));
        let (config_tx, config_rx) = mpsc::channel(50);
        let (_pleg_tx, pleg_rx) = mpsc::channel(1);
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let (_probe_tx, probe_rx) = mpsc::unbounded_channel();
        let (_objects_tx, objects_rx) = mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        let metrics = crate::metrics::Metrics::new();
        let runtime_state = crate::pleg::RuntimeState::default();
        let runtime_pods = RuntimePods::default();
        let registry = PodRegistry::new();
        let pods = registry.reader();
        let status = StatusManager::new(
            metrics.clone(),
            registry.reader(),
            crate::pod::probe_results::Results::default(),
            Vec::new(),
        );
        let (pressure, pressure_rx) = tokio::sync::watch::channel(Vec::new());
        let sync_loop = SyncLoop {
            config_rx,
            sources_ready: SourcesReady::default(),
            pleg_rx,
            done_rx,
            probe_rx,
            objects_rx,
            runtime_pods: runtime_pods.clone(),
            runtime_state: runtime_state.clone(),
            workers: PodWorkers::new(fake.clone(), done_tx, TaskTracker::new(), cancel.clone()),
            registry,
            status: status.clone(),
            tracer: crate::trace::Tracer::new(metrics.clone(), None),
            metrics,
            max_pods,
            node: tokio::sync::watch::channel(crate::pod::admission::Node::default()).1,
            pressure: pressure_rx,
        };
        tokio::spawn(sync_loop.run(cancel.clone()));
        Running {
            config_tx,
            runtime_state,
            runtime_pods,
            fake,
            status,
            pods,
            pressure,
            _cancel: cancel.drop_guard(),
        }
    }

    fn add(p: Arc<Pod>) -> PodUpdate {
        PodUpdate {
            op: Op::Add,
            pods: vec![p.into()],
            source: crate::config::FILE,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_one_second_tick_hands_out_due_resyncs() {
        let r = start(Inner {
            requeue_after: Some(Duration::from_millis(2500)),
            ..Default::default()
        });
        r.config_tx.send(add(pod("u1", "web"))).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(r.fake.syncs_of("u1").len(), 1);
        // Due at 2.5 s, handed out by the tick at 3 s; then due at 5.5 s, handed out at 6 s.
        tokio::time::sleep(Duration::from_millis(2800)).await;
        assert_eq!(r.fake.syncs_of("u1").len(), 1);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(r.fake.syncs_of("u1").len(), 2);
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(r.fake.syncs_of("u1").len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_runtime_holds_the_loop_with_growing_back_off() {
        let r = start(Inner::default());
        r.runtime_state.set(Some("relist failed".into()));
        tokio::time::sleep(Duration::from_millis(1)).await;
        r.config_tx.send(add(pod("u1", "web"))).await.unwrap();
        // Back-off sleeps of 0.1+0.2+0.4+0.8+1.6+3.2 s = 6.3 s pass; nothing is dispatched.
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert!(r.fake.calls().is_empty());
        r.runtime_state.set(None);
        // The loop wakes at the end of its current back-off (5 s at most) and catches up.
        let cleared = tokio::time::Instant::now();
        while r.fake.calls().is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let waited = cleared.elapsed();
        assert!(waited <= Duration::from_secs(5), "{waited:?}");
        assert_eq!(r.fake.syncs_of("u1").len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn pods_over_max_pods_are_rejected_and_never_run() {
        let r = start_with(Inner::default(), 2);
        for (uid, name) in [("u1", "a"), ("u2", "b"), ("u3", "c")] {
            r.config_tx.send(add(pod(uid, name))).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(r.fake.syncs_of("u1").len(), 1);
        assert_eq!(r.fake.syncs_of("u2").len(), 1);
        assert!(r.fake.syncs_of("u3").is_empty());
        let st = r.status.status("u3").expect("a rejected pod has a status");
        assert_eq!(st.phase.as_deref(), Some("Failed"));
        assert_eq!(st.reason.as_deref(), Some("OutOfpods"));
        assert_eq!(
            st.message.as_deref(),
            Some(
                "Pod was rejected: Node didn't have enough resource: pods, requested: 1, used: 2, capacity: 2"
            )
        );
        // An update does not bring it back, and its removal leaves nothing.
        let u3 = |op| PodUpdate {
            op,
            pods: vec![pod("u3", "c").into()],
            source: crate::config::FILE,
        };
        r.config_tx.send(u3(Op::Update)).await.unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(r.fake.syncs_of("u3").is_empty());
        let about_u3 = |c: &Call| match c {
            Call::Sync(u, _)
            | Call::Superseded(u, _)
            | Call::Terminating(u, _)
            | Call::Terminated(u) => u == "u3",
        };
        assert!(!r.fake.calls().iter().any(about_u3), "{:?}", r.fake.calls());
        r.config_tx.send(u3(Op::Remove)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(r.status.status("u3").is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn an_evicted_pod_holds_its_slot_until_its_worker_terminated_it() {
        let r = start_with(Inner::default(), 1);
        r.config_tx.send(add(pod("u1", "a"))).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            r.status
                .evict("u1", "The node was low on resource: memory. ")
        );
        // Its worker's next status shows it Failed while its containers are being stopped.
        let state = crate::pod::PodState::default();
        r.status.update("u1", &state, &HashMap::new());
        assert!(r.status.is_terminal("u1"));
        r.config_tx.send(add(pod("u2", "b"))).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let reason = |uid| r.status.status(uid).and_then(|s| s.reason);
        assert_eq!(reason("u2").as_deref(), Some("OutOfpods"), "u1 still runs");
        assert!(r.fake.syncs_of("u2").is_empty());
        // Its worker stopped it: the slot is free.
        r.status.terminated("u1");
        r.config_tx.send(add(pod("u3", "c"))).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(r.fake.syncs_of("u3").len(), 1);
        assert_eq!(reason("u3"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_pod_its_source_shows_finished_is_not_judged_and_holds_no_slot() {
        let r = start_with(Inner::default(), 1);
        let mut done = Pod::clone(&pod("u1", "done"));
        done.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Failed".into()),
            ..Default::default()
        });
        let update = PodUpdate {
            op: Op::Add,
            pods: vec![Arc::new(done).into(), pod("u2", "next").into()],
            source: crate::config::API,
        };
        r.config_tx.send(update).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!r.pods.is_rejected("u1") && !r.pods.is_rejected("u2"));
        assert_eq!(r.fake.syncs_of("u2").len(), 1, "the slot is free");
    }

    #[tokio::test(start_paused = true)]
    async fn node_pressure_rejects_new_pods_with_reason_evicted() {
        let r = start(Inner::default());
        r.pressure.send_replace(vec!["DiskPressure"]);
        r.config_tx.send(add(pod("u1", "a"))).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(r.fake.syncs_of("u1").is_empty());
        let st = r.status.status("u1").expect("a rejected pod has a status");
        assert_eq!(
            (st.reason.as_deref(), st.message.as_deref()),
            (
                Some("Evicted"),
                Some("Pod was rejected: The node had condition: [DiskPressure]. ")
            )
        );
        r.pressure.send_replace(Vec::new());
        r.config_tx.send(add(pod("u2", "b"))).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(r.fake.syncs_of("u2").len(), 1);
    }

    #[test]
    fn backoff_doubles_to_five_seconds_and_resets() {
        let mut b = Backoff::default();
        let got: Vec<u64> = (0..8).map(|_| b.next_delay().as_millis() as u64).collect();
        assert_eq!(got, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(100));
    }

    #[tokio::test(start_paused = true)]
    async fn a_pod_just_finished_is_not_killed_again_as_an_orphan() {
        let r = start(Inner::default());
        let p = pod("u1", "web");
        r.config_tx.send(add(p.clone())).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let remove = PodUpdate {
            op: Op::Remove,
            pods: vec![p.into()],
            source: crate::config::FILE,
        };
        r.config_tx.send(remove).await.unwrap();
        // The PLEG's snapshot, taken before the pod finished, still shows the pod its worker has
        // just stopped and removed: however long ago that relist was, it is no orphan.
        let before = tokio::time::Instant::now() - Duration::from_millis(50);
        *r.runtime_pods.write().unwrap() = crate::pleg::RuntimeList {
            relisted: Some(before),
            uids: ["u1".to_owned()].into(),
        };
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(r.fake.graces_of("u1"), [30], "killed again as an orphan");
        // A relist begun after it finished still shows it: then it is an orphan.
        r.runtime_pods.write().unwrap().relisted = Some(tokio::time::Instant::now());
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(r.fake.graces_of("u1"), [30, 1]);
    }

    /// `pod` packed, created `secs` after the epoch.
    fn packed_at(uid: &str, name: &str, secs: i64) -> PodRef {
        let mut p = Pod::clone(&pod(uid, name));
        p.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::from_second(secs).expect("valid time"),
        ));
        PodRef::packed(p).expect("packs")
    }

    #[tokio::test(start_paused = true)]
    async fn a_large_packed_add_admits_the_oldest_and_keeps_the_rest_packed() {
        let r = start_with(Inner::default(), 3);
        // 1,000 packed pods, newest first: admission goes by creation time, not list order.
        let n = 1_000;
        let pods: Vec<PodRef> = (0..n)
            .map(|i| packed_at(&format!("u{i}"), &format!("p{i}"), 10_000 - i64::from(i)))
            .collect();
        let update = PodUpdate {
            op: Op::Add,
            pods,
            source: crate::config::HTTP,
        };
        r.config_tx.send(update).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let oldest = [n - 1, n - 2, n - 3].map(|i| format!("u{i}"));
        for uid in &oldest {
            assert_eq!(r.fake.syncs_of(uid).len(), 1, "{uid} runs");
            assert!(!r.pods.is_rejected(uid));
        }
        assert!(r.fake.syncs_of("u0").is_empty());
        let st = r.status.status("u0").expect("a rejected pod has a status");
        assert_eq!(st.reason.as_deref(), Some("OutOfpods"));
        assert_eq!(
            st.message.as_deref(),
            Some(
                "Pod was rejected: Node didn't have enough resource: pods, requested: 1, used: 3, capacity: 3"
            )
        );
        // The rejected pods stay packed (the registry keeps what the mux handed on).
        assert_eq!(r.pods.rejected_packed(), (n - 3) as usize);
        // An update of a rejected pod keeps it rejected; its removal leaves nothing.
        let one = |op, p: PodRef| PodUpdate {
            op,
            pods: vec![p],
            source: crate::config::HTTP,
        };
        r.config_tx
            .send(one(Op::Update, packed_at("u0", "p0-new", 1)))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(r.fake.syncs_of("u0").is_empty());
        assert!(r.pods.is_rejected("u0"));
        r.config_tx
            .send(one(Op::Remove, packed_at("u0", "p0-new", 1)))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(r.status.status("u0").is_none());
        assert!(r.fake.calls().iter().all(|c| match c {
            Call::Sync(u, _)
            | Call::Superseded(u, _)
            | Call::Terminating(u, _)
            | Call::Terminated(u) => oldest.contains(u),
        }));
    }
}
