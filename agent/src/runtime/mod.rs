//! Runtime manager: turns a pod spec into CRI calls (`sync_pod`), stops pods (`kill_pod`) and reads
//! back what the runtime holds (`pod_state`, `relist`). Every call goes through [`crate::cri::Cri`].
pub mod actions;
pub mod backoff;
pub mod fresh;
pub mod hash;

use crate::cm::{self, ContainerManager};
use crate::cri::{self, Cri};
use crate::pod::state::is_live;
use crate::pod::{
    ContainerKind, ListedPod, PodState, RelistEntry, full_name, grace_period_secs, labels,
};
use k8s_cri::v1 as api;
use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("pod {pod}: {source}")]
    Cri {
        pod: String,
        #[source]
        source: cri::Error,
    },
    #[error("pod {pod}: {source}")]
    Cgroup {
        pod: String,
        #[source]
        source: cm::Error,
    },
    #[error("pod {pod}: {what} is not supported yet")]
    Unsupported { pod: String, what: String },
    #[error(
        "pod {pod} container {container}: image {image:?} is not present and imagePullPolicy is Never"
    )]
    ImageNeverPull {
        pod: String,
        container: String,
        image: String,
    },
    #[error(
        "pod {pod} container {container}: back-off pulling image {image:?} ({}s left)",
        left.as_secs()
    )]
    ImagePullBackOff {
        pod: String,
        container: String,
        image: String,
        left: Duration,
    },
    #[error("pod {pod} container {container}: pulling image {image:?}: {source}")]
    ImagePull {
        pod: String,
        container: String,
        image: String,
        #[source]
        source: cri::Error,
    },
    #[error("pod {0} has no spec")]
    NoSpec(String),
}

impl Error {
    /// The waiting reason the status shows for a container that could not start because of this.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::ImageNeverPull { .. } => "ErrImageNeverPull",
            Error::ImagePull { .. } => "ErrImagePull",
            Error::ImagePullBackOff { .. } => "ImagePullBackOff",
            Error::Unsupported { .. } => "CreateContainerConfigError",
            _ => "CreateContainerError",
        }
    }
}

impl Error {
    /// When to try again after this error stopped a container from starting.
    pub fn retry_after(&self) -> Duration {
        match self {
            Error::ImagePullBackOff { left, .. } => *left,
            // Look again soon, so the status shows the back-off that follows.
            Error::ImagePull { .. } => Duration::from_secs(1),
            _ => CRASH_BACKOFF_INITIAL,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything needed to start containers in one pod's sandbox during one sync.
struct StartTarget<'a> {
    pod: &'a Pod,
    name: &'a str,
    uid: &'a str,
    state: &'a PodState,
    sandbox_id: &'a str,
    sandbox_config: &'a api::PodSandboxConfig,
}

/// Crash-loop and image-pull back-offs, per pod and container (or image).
#[derive(Debug)]
struct Backoffs {
    crash: backoff::Backoff,
    image: backoff::Backoff,
}

impl Backoffs {
    fn forget_prefix(&mut self, prefix: &str) {
        self.crash.forget_prefix(prefix);
        self.image.forget_prefix(prefix);
    }
}

impl Default for Backoffs {
    fn default() -> Self {
        Self {
            crash: backoff::Backoff::new(CRASH_BACKOFF_INITIAL, CRASH_BACKOFF_MAX),
            image: backoff::Backoff::new(CRASH_BACKOFF_INITIAL, CRASH_BACKOFF_MAX),
        }
    }
}

/// What one full relist listed, by pod UID, and the read token taken before it: a changed
/// pod's read can start from it ([`Manager::pod_state_listed`]).
pub struct Listing {
    pub token: fresh::ReadToken,
    pub pods: HashMap<String, ListedPod>,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub node_name: String,
    pub pod_logs_dir: PathBuf,
}

/// The outcome of one sync: when to look at the pod again even without an event.
#[derive(Debug, Default)]
pub struct SyncOutcome {
    pub requeue_after: Option<Duration>,
    /// Per container name: why it is waiting (image errors, back-off), for the status.
    pub waiting: HashMap<String, (String, String)>,
    /// Every container finished and none will run again (phase Succeeded or Failed): the pod
    /// needs no more syncs.
    pub terminal: bool,
    /// What this sync decided.
    pub actions: actions::PodActions,
    /// What the runtime holds for the pod after this sync, when the sync knows it without asking
    /// again: the state it read (nothing was changed) or that state plus the sandbox and
    /// containers it started. `None` when it stopped something or a start failed: then the
    /// caller reads the runtime.
    pub state: Option<PodState>,
    /// The containers this sync started, in start order, as the runtime would report them now.
    started: Vec<api::ContainerStatus>,
    /// The runtime held nothing for the pod before this sync: `state` is exactly what this sync
    /// created, as of its end.
    from_nothing: bool,
}

impl SyncOutcome {
    /// Records why container `name` waits, and to look again within `retry`.
    fn wait(&mut self, name: &str, reason: &str, message: String, retry: Duration) {
        self.waiting
            .insert(name.to_owned(), (reason.to_owned(), message));
        self.requeue(retry);
    }

    fn requeue(&mut self, after: Duration) {
        self.requeue_after = Some(self.requeue_after.map_or(after, |d| d.min(after)));
    }
}

#[derive(Clone)]
pub struct Manager {
    cri: Cri,
    cm: ContainerManager,
    cfg: Config,
    backoff: Arc<Mutex<Backoffs>>,
    /// Liveness and startup results: a failed probe kills its container.
    probes: crate::pod::probe_results::Results,
    known: Arc<Mutex<Known>>,
    resize: Arc<Mutex<ResizeState>>,
    /// The PLEG's pod reads handed to the pods' syncs, and the pods being stopped.
    fresh: Arc<Mutex<fresh::Fresh>>,
}

/// Marks a mutation of one pod (or the stop of one container) for as long as it lives.
struct Mutating {
    fresh: Arc<Mutex<fresh::Fresh>>,
    uid: String,
    kill: bool,
    container: Option<String>,
}

impl Drop for Mutating {
    fn drop(&mut self) {
        let mut f = self.fresh.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(id) = &self.container {
            f.container_stop(id, false);
        }
        f.end(&self.uid, self.kill);
    }
}

/// Which pods the runtime can hold, as far as the agent knows without asking it: a pod the last
/// full relist did not have and this agent has not started a sandbox for since holds nothing
/// (only this agent creates objects with its node name). A new pod's first sync then skips the
/// read of its runtime state, which under load queues behind other pods' RunPodSandbox.
#[derive(Debug, Default)]
struct Known {
    /// UIDs of the last successful relist; `None` before the first (nothing is known then:
    /// a previous agent may have left pods to adopt).
    relisted: Option<HashSet<String>>,
    /// UIDs this agent ran a sandbox for, until `kill_pod` removed everything of the pod.
    created: HashSet<String>,
}

impl Known {
    fn holds_nothing(&self, uid: &str) -> bool {
        self.relisted
            .as_ref()
            .is_some_and(|r| !r.contains(uid) && !self.created.contains(uid))
    }
}

/// What in-place resizes left behind (annotations cannot change after create).
#[derive(Default)]
struct ResizeState {
    /// Container ID -> the resources label applied by UpdateContainerResources.
    applied: HashMap<String, String>,
    /// Pod UID -> why its last resize was refused or failed.
    errors: HashMap<String, String>,
}

const CRASH_BACKOFF_INITIAL: Duration = Duration::from_secs(10);
const CRASH_BACKOFF_MAX: Duration = Duration::from_secs(300);
const MIN_GRACE_SECS: i64 = 2;

fn now_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or_default()
}

impl Manager {
    pub fn new(cri: Cri, cm: ContainerManager, cfg: Config) -> Self {
        Self {
            cri,
            cm,
            cfg,
            backoff: Arc::default(),
            probes: crate::pod::probe_results::Results::default(),
            known: Arc::default(),
            resize: Arc::default(),
            fresh: Arc::default(),
        }
    }

    fn fresh(&self) -> std::sync::MutexGuard<'_, fresh::Fresh> {
        self.fresh.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks a mutation of pod `uid` (`kill`: stopping the whole pod; `container`: stopping
    /// that one container) until the returned guard drops.
    fn mutating(&self, uid: &str, kill: bool, container: Option<&str>) -> Mutating {
        let mut f = self.fresh();
        f.begin(uid, kill);
        if let Some(id) = container {
            f.container_stop(id, true);
        }
        Mutating {
            fresh: self.fresh.clone(),
            uid: uid.to_owned(),
            kill,
            container: container.map(str::to_owned),
        }
    }

    /// Whether this agent is stopping pod `uid` as a whole, or its container `container`,
    /// right now: the stopping code reads (or forgets) the pod when done.
    pub fn is_stopping(&self, uid: &str, container: Option<&str>) -> bool {
        self.fresh().is_stopping(uid, container)
    }

    /// Reads pod `uid` for its next sync (the PLEG's read): counted as `source`, and stored for
    /// the pod's next sync when no mutation of the pod began since the read began.
    pub async fn pod_state_for_sync(
        &self,
        uid: &str,
        source: &'static str,
    ) -> cri::Result<PodState> {
        let token = self.fresh().token(uid);
        let state = self.pod_state_counted(uid, source).await?;
        self.hand_over(uid, token, &state);
        Ok(state)
    }

    /// Stores `state`, read from a start at `token`, for pod `uid`'s next sync (the store
    /// rejects it when the pod was mutated since `token`; `None`: not to be stored).
    fn hand_over(&self, uid: &str, token: Option<fresh::ReadToken>, state: &PodState) {
        if let Some(token) = token {
            self.fresh()
                .store(uid, token, state.clone(), Instant::now());
        }
    }

    /// [`Manager::pod_state`], counted in `swiftlet_runtime_pod_state_reads_total` as `source`.
    pub async fn pod_state_counted(
        &self,
        uid: &str,
        source: &'static str,
    ) -> cri::Result<PodState> {
        self.count_read(source);
        self.pod_state(uid).await
    }

    /// A read of pod `uid` that a sync (or the status after it) uses itself, counted as
    /// `source`: stored reads older than it are not used after it.
    pub async fn pod_state_own_read(
        &self,
        uid: &str,
        source: &'static str,
    ) -> cri::Result<PodState> {
        let seq = self.fresh().own_read();
        let state = self.pod_state_counted(uid, source).await?;
        self.fresh().used(uid, seq);
        Ok(state)
    }

    /// Records a container exit the kernel saw before the runtime recorded it, for the pod's
    /// next status ([`Manager::with_kernel_exits`]).
    pub fn record_kernel_exit(&self, uid: &str, id: &str, code: i32, finished_ns: i64) {
        self.fresh().kernel_exit(uid, id, code, finished_ns);
    }

    /// `state` with the container exits the kernel saw and the runtime has not recorded yet,
    /// and whether there were any.
    pub fn with_kernel_exits(&self, uid: &str, mut state: PodState) -> (PodState, bool) {
        let overlaid = self.fresh().overlay(uid, &mut state);
        (state, overlaid)
    }

    fn count_read(&self, source: &'static str) {
        self.cri
            .metrics()
            .runtime_pod_state_reads_total
            .get_or_create(&crate::metrics::SourceLabel { source })
            .inc();
    }

    /// Lets failed liveness and startup probes kill their containers.
    pub fn with_probe_results(mut self, probes: crate::pod::probe_results::Results) -> Self {
        self.probes = probes;
        self
    }

    fn known(&self) -> std::sync::MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn cri(&self) -> &Cri {
        &self.cri
    }

    fn node_selector(&self) -> HashMap<String, String> {
        HashMap::from([(labels::NODE_NAME.to_owned(), self.cfg.node_name.clone())])
    }

    fn cri_err(pod: &str) -> impl FnOnce(cri::Error) -> Error + '_ {
        move |source| Error::Cri {
            pod: pod.to_owned(),
            source,
        }
    }

    /// Sandboxes and containers of this agent matching `extra` labels: two CRI calls.
    async fn list(
        &self,
        extra: Option<(&str, &str)>,
    ) -> cri::Result<(Vec<api::PodSandbox>, Vec<api::Container>)> {
        let mut selector = self.node_selector();
        if let Some((k, v)) = extra {
            selector.insert(k.to_owned(), v.to_owned());
        }
        let sandboxes = self
            .cri
            .list_pod_sandbox(Some(api::PodSandboxFilter {
                label_selector: selector.clone(),
                ..Default::default()
            }))
            .await?;
        let containers = self
            .cri
            .list_containers(Some(api::ContainerFilter {
                label_selector: selector,
                ..Default::default()
            }))
            .await?;
        Ok((sandboxes, containers))
    }

    /// Every pod this agent has in the runtime, by UID, and what the listing said of each
    /// (for [`Manager::pod_state_listed`]).
    pub async fn relist(&self) -> cri::Result<(HashMap<String, RelistEntry>, Listing)> {
        let token = self.fresh().token_for_all();
        let (sandboxes, containers) = self.list(None).await?;
        let mut listing = Listing {
            token,
            pods: HashMap::new(),
        };
        for s in sandboxes {
            if let Some(uid) = s.labels.get(labels::POD_UID) {
                listing.pods.entry(uid.clone()).or_default().0.push(s);
            }
        }
        for c in containers {
            if let Some(uid) = c.labels.get(labels::POD_UID) {
                listing.pods.entry(uid.clone()).or_default().1.push(c);
            }
        }
        let out: HashMap<String, RelistEntry> = listing
            .pods
            .iter()
            .map(|(uid, (sandboxes, containers))| {
                let mut e = RelistEntry {
                    sandboxes: sandboxes.iter().map(|s| (s.id.clone(), s.state)).collect(),
                    containers: containers.iter().map(|c| (c.id.clone(), c.state)).collect(),
                };
                e.sandboxes.sort();
                e.containers.sort();
                (uid.clone(), e)
            })
            .collect();
        self.known().relisted = Some(out.keys().cloned().collect());
        // Forget the fresh reads and mutation records of pods gone from the runtime.
        self.fresh().retain(|uid| out.contains_key(uid), token);
        Ok((out, listing))
    }

    /// The PLEG's read of pod `uid` right after a relist: the relist already listed the pod's
    /// sandboxes and containers (`listed`, taken from its [`Listing`]), so only their statuses
    /// are asked for (2 CRI calls fewer than [`Manager::pod_state`]). Counted and handed to the
    /// pod's next sync as [`Manager::pod_state_for_sync`] does; without `listed`, it is that.
    pub async fn pod_state_listed(
        &self,
        uid: &str,
        listed: Option<ListedPod>,
        token: fresh::ReadToken,
        source: &'static str,
    ) -> cri::Result<PodState> {
        let Some((sandboxes, containers)) = listed else {
            return self.pod_state_for_sync(uid, source).await;
        };
        self.count_read(source);
        let state = self.state_of(uid, sandboxes, containers).await?;
        self.hand_over(uid, Some(token), &state);
        Ok(state)
    }

    /// Everything the runtime knows about one pod.
    pub async fn pod_state(&self, uid: &str) -> cri::Result<PodState> {
        let (sandboxes, listed) = self.list(Some((labels::POD_UID, uid))).await?;
        self.state_of(uid, sandboxes, listed).await
    }

    /// A pod's state from its listed sandboxes and containers: their statuses read.
    async fn state_of(
        &self,
        uid: &str,
        mut sandboxes: Vec<api::PodSandbox>,
        listed: Vec<api::Container>,
    ) -> cri::Result<PodState> {
        sandboxes.sort_by_key(|s| std::cmp::Reverse(s.created_at));
        let sandbox_status = match sandboxes.first() {
            Some(s) => match self.cri.pod_sandbox_status(&s.id).await {
                Ok(st) => st,
                Err(e) if e.is_not_found() => None,
                Err(e) => return Err(e),
            },
            None => None,
        };
        let mut containers = Vec::with_capacity(listed.len());
        for c in listed {
            match self.cri.container_status(&c.id).await {
                Ok(Some(st)) => containers.push(st),
                Ok(None) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        containers.sort_by_key(|c| std::cmp::Reverse(c.created_at));
        let resize_error = self.overlay_resized(uid, &mut containers);
        Ok(PodState {
            sandboxes,
            sandbox_status,
            containers,
            resize_error,
        })
    }

    /// Brings the runtime in line with the pod spec: [`actions::compute_pod_actions`], then the
    /// kills, the sandbox, init containers and app containers (the kubelet's `SyncPod`).
    pub async fn sync_pod(&self, pod: &Pod) -> Result<SyncOutcome> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let outcome = cri::with_pod(&uid, self.sync_pod_traced(pod, &uid)).await;
        if let Ok(o) = &outcome
            && o.from_nothing
            && let Some(state) = &o.state
        {
            // A new pod's start: what it created is all the pod has, known as of now (its
            // mutation ended). The PLEG's events for these very starts sync the pod again, and
            // its read of them, if it overlapped the start, is rejected: that sync takes this
            // instead of reading back what was just made.
            let token = self.fresh().token(&uid);
            self.hand_over(&uid, token, state);
        }
        outcome
    }

    async fn sync_pod_traced(&self, pod: &Pod, uid: &str) -> Result<SyncOutcome> {
        let name = full_name(pod);
        let spec = pod
            .spec
            .as_ref()
            .ok_or_else(|| Error::NoSpec(name.clone()))?;
        if spec.volumes.as_ref().is_some_and(|v| !v.is_empty()) {
            return Err(Error::Unsupported {
                pod: name,
                what: "volumes".into(),
            });
        }
        let known_empty = self.known().holds_nothing(uid);
        let handed = if known_empty {
            None
        } else {
            self.fresh().take(uid, Instant::now())
        };
        let state = match handed {
            Some(state) => {
                self.count_read("handoff");
                state
            }
            None if known_empty => PodState::default(),
            None => self
                .pod_state_own_read(uid, "sync")
                .await
                .map_err(Self::cri_err(&name))?,
        };
        let held_nothing = state.sandboxes.is_empty() && state.containers.is_empty();
        let actions =
            actions::compute_pod_actions_with(pod, &state, &|id| self.probes.kill_reason(id));
        tracing::debug!(pod = %name, ?actions, "computed pod actions");
        let mut outcome = SyncOutcome {
            terminal: actions.terminal,
            ..Default::default()
        };
        // The sync changes what already runs: the state read before it is stale afterwards. A
        // new pod's actions say kill_pod too (the kubelet's computePodActions kills whenever it
        // creates a sandbox), but with nothing live the kill stops nothing.
        let kills_live = actions.kill_pod && state.anything_live();
        let stops = kills_live
            || !actions.containers_to_kill.is_empty()
            || !actions.containers_to_resize.is_empty();
        // From here on the runtime may change: a read that began before is stale.
        let changes = stops
            || actions.create_sandbox
            || !actions.init_to_start.is_empty()
            || !actions.containers_to_start.is_empty();
        let _mutating = changes.then(|| self.mutating(uid, false, None));

        if actions.kill_pod {
            if actions.create_sandbox && actions.sandbox_id.is_some() {
                tracing::info!(pod = %name, attempt = actions.attempt, "sandbox changed, killing the pod to recreate it");
            } else if actions.terminal {
                tracing::info!(pod = %name, "pod finished: stopping what is left");
            }
            if kills_live {
                let _killing = self.mutating(uid, true, None);
                self.stop_runtime_pod(&name, &state, grace_period_secs(pod), false)
                    .await?;
            }
            if actions.qos_changed {
                self.leave_old_qos_cgroup(pod, uid, &name)?;
            }
        } else {
            let started = Instant::now();
            for k in &actions.containers_to_kill {
                tracing::info!(pod = %name, container = %k.name, reason = k.reason, message = %k.message, "killing container");
                if let Some(st) = state.containers.iter().find(|c| c.id == k.id) {
                    let _stopping = self.mutating(uid, false, Some(&st.id));
                    let grace = k.grace.unwrap_or_else(|| grace_period_secs(pod));
                    self.kill_container(&name, st, grace, started).await?;
                }
            }
        }
        if !actions.kill_pod && !actions.containers_to_resize.is_empty() {
            self.resize_in_place(pod, uid, &name, &state, &actions.containers_to_resize)
                .await;
        }
        if !actions.create_sandbox
            && actions.init_to_start.is_empty()
            && actions.containers_to_start.is_empty()
        {
            outcome.actions = actions;
            if !stops {
                outcome.state = Some(state);
            }
            return Ok(outcome);
        }

        let cgroup = self
            .cm
            .ensure_pod_cgroup(pod, uid)
            .map_err(|source| Error::Cgroup {
                pod: name.clone(),
                source,
            })?;
        let mut after = (!stops).then(|| state.clone());
        let (sandbox_id, sandbox_config) = match (&actions.sandbox_id, actions.create_sandbox) {
            (Some(id), false) => (
                id.clone(),
                self.sandbox_config(pod, uid, actions.attempt, &cgroup),
            ),
            _ => {
                self.known().created.insert(uid.to_owned());
                let config = self.sandbox_config(pod, uid, actions.attempt, &cgroup);
                // The log directory is first needed by CreateContainer: it is made while
                // containerd runs the sandbox, after every other pod ready to start has sent its
                // RunPodSandbox (the yield puts this task behind them), not before this one's.
                let log_dir = PathBuf::from(&config.log_directory);
                let make_log_dir = async {
                    tokio::task::yield_now().await;
                    if let Err(e) = std::fs::create_dir_all(&log_dir) {
                        tracing::warn!(pod = %name, dir = %log_dir.display(), %e, "creating pod log directory");
                    }
                };
                let (id, ()) = tokio::join!(self.cri.run_pod_sandbox(config.clone()), make_log_dir);
                let id = id.map_err(Self::cri_err(&name))?;
                tracing::info!(pod = %name, sandbox = %id, attempt = actions.attempt, "sandbox started");
                if let Some(a) = &mut after
                    && !self.add_started_sandbox(pod, &id, &config, a).await
                {
                    after = None;
                }
                (id, config)
            }
        };
        let target = StartTarget {
            pod,
            name: &name,
            uid,
            state: &state,
            sandbox_id: &sandbox_id,
            sandbox_config: &sandbox_config,
        };

        let inits = spec.init_containers.as_deref().unwrap_or_default();
        let mut sidecar_started = false;
        for &i in &actions.init_to_start {
            let Some(c) = inits.get(i) else { continue };
            let kind = if crate::pod::is_sidecar(c) {
                ContainerKind::Sidecar
            } else {
                ContainerKind::Init
            };
            match self
                .start_with_backoff(&target, c, kind, &mut outcome)
                .await
            {
                Ok(started) => sidecar_started |= started && kind == ContainerKind::Sidecar,
                // A sidecar that fails to start does not stop the next; a regular init does.
                Err(()) if kind == ContainerKind::Sidecar => {}
                Err(()) => break,
            }
        }
        if sidecar_started && actions.containers_to_start.is_empty() {
            // The next init container may go as soon as this sidecar runs: look again at once.
            outcome.requeue(Duration::ZERO);
        }
        for &i in &actions.containers_to_start {
            if let Some(c) = spec.containers.get(i) {
                // Failures are recorded in the outcome; the other containers still start.
                let _ = self
                    .start_with_backoff(&target, c, ContainerKind::App, &mut outcome)
                    .await;
            }
        }
        outcome.actions = actions;
        if let Some(mut after) = after.filter(|_| outcome.waiting.is_empty()) {
            // Newest first, as `pod_state` orders them.
            after
                .containers
                .splice(0..0, outcome.started.drain(..).rev());
            outcome.state = Some(after);
            outcome.from_nothing = held_nothing;
        }
        Ok(outcome)
    }

    /// Adds the sandbox this sync just ran to `after`. Its status is read only for a pod-network
    /// pod (for the pod IP); a host-network sandbox's status holds nothing the pod status shows.
    /// False when that read failed: then `after` is not known.
    async fn add_started_sandbox(
        &self,
        pod: &Pod,
        id: &str,
        config: &api::PodSandboxConfig,
        after: &mut PodState,
    ) -> bool {
        let created_at = now_nanos();
        after.sandboxes.insert(
            0,
            api::PodSandbox {
                id: id.to_owned(),
                metadata: config.metadata.clone(),
                state: api::PodSandboxState::SandboxReady as i32,
                created_at,
                labels: config.labels.clone(),
                annotations: config.annotations.clone(),
                ..Default::default()
            },
        );
        after.sandbox_status = if Self::host_network(pod) {
            Some(api::PodSandboxStatus {
                id: id.to_owned(),
                metadata: config.metadata.clone(),
                state: api::PodSandboxState::SandboxReady as i32,
                created_at,
                ..Default::default()
            })
        } else {
            self.cri.pod_sandbox_status(id).await.ok().flatten()
        };
        after.sandbox_status.is_some()
    }

    /// Starts one container unless it is in crash-loop back-off. `Ok(true)` when started,
    /// `Ok(false)` when backing off; `Err` when starting failed (recorded in `outcome`).
    async fn start_with_backoff(
        &self,
        t: &StartTarget<'_>,
        c: &Container,
        kind: ContainerKind,
        outcome: &mut SyncOutcome,
    ) -> std::result::Result<bool, ()> {
        let hash = hash::container_hash(c);
        let prev = t.state.newest(&c.name);
        // The kubelet's doBackOff: from the newest instance that exited, even when a newer one
        // was running (killed for a failed liveness probe, it backs off from its predecessor).
        let exited = t.state.containers.iter().find(|s| {
            s.state == api::ContainerState::ContainerExited as i32
                && s.metadata.as_ref().is_some_and(|m| m.name == c.name)
        });
        if let Some(prev) = exited {
            let key = format!("{}_{}_{}", t.uid, c.name, hash::hash_label(hash));
            let now = now_nanos();
            let mut backoffs = self.backoff.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(left) = backoffs.crash.remaining(&key, prev.finished_at, now) {
                let delay = backoffs.crash.delay(&key).unwrap_or(left);
                drop(backoffs);
                outcome.wait(
                    &c.name,
                    "CrashLoopBackOff",
                    format!(
                        "back-off {}s restarting failed container={} pod={}",
                        delay.as_secs(),
                        c.name,
                        t.name
                    ),
                    left,
                );
                return Ok(false);
            }
            backoffs.crash.next(&key, prev.finished_at, now);
        }
        let restart_count = prev
            .and_then(|p| p.metadata.as_ref())
            .map_or(0, |m| m.attempt + 1);
        match self.start_container(t, c, kind, restart_count, hash).await {
            Ok(started) => {
                outcome.started.push(started);
                Ok(true)
            }
            Err(e) => {
                tracing::warn!(pod = %t.name, container = %c.name, error = %e, "starting container");
                let retry = e.retry_after();
                outcome.wait(&c.name, e.reason(), e.to_string(), retry);
                Err(())
            }
        }
    }

    async fn start_container(
        &self,
        t: &StartTarget<'_>,
        container: &Container,
        kind: ContainerKind,
        restart_count: u32,
        hash: u64,
    ) -> Result<api::ContainerStatus> {
        let image = container.image.clone().unwrap_or_default();
        let image_ref = self.ensure_image(t.name, t.uid, container, &image).await?;
        let config = self.container_config(t.pod, t.uid, container, kind, restart_count, hash)?;
        let id = self
            .cri
            .create_container(t.sandbox_id, config.clone(), t.sandbox_config.clone())
            .await
            .map_err(Self::cri_err(t.name))?;
        let created_at = now_nanos();
        self.cri
            .start_container(&id)
            .await
            .map_err(Self::cri_err(t.name))?;
        tracing::info!(pod = %t.name, container = %container.name, id = %id, restart_count, kind = kind.as_str(), "container started");
        // What ContainerStatus would say now (StartContainer returned: the container runs). The
        // next relist replaces it with the runtime's own answer.
        Ok(api::ContainerStatus {
            id,
            metadata: config.metadata,
            state: api::ContainerState::ContainerRunning as i32,
            created_at,
            started_at: now_nanos(),
            image: config.image,
            image_ref,
            labels: config.labels,
            annotations: config.annotations,
            log_path: config.log_path,
            ..Default::default()
        })
    }

    /// Makes the image present as the pull policy says (default IfNotPresent). A failed pull
    /// backs off per pod and image (10 s doubling to 300 s): ErrImagePull, then ImagePullBackOff.
    /// Returns the image's reference (its id) as the runtime knows it.
    async fn ensure_image(
        &self,
        pod: &str,
        uid: &str,
        container: &Container,
        image: &str,
    ) -> Result<String> {
        let policy = container
            .image_pull_policy
            .as_deref()
            .unwrap_or("IfNotPresent");
        let found = if policy == "Always" {
            None
        } else {
            self.cri
                .image_status(image)
                .await
                .map_err(Self::cri_err(pod))?
                .map(|i| i.id)
        };
        if let Some(id) = found {
            return Ok(id);
        }
        if policy != "Never" {
            let key = format!("{uid}_{image}");
            let now = now_nanos();
            let left = self
                .backoff
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .image
                .remaining_since_update(&key, now);
            if let Some(left) = left {
                return Err(Error::ImagePullBackOff {
                    pod: pod.to_owned(),
                    container: container.name.clone(),
                    image: image.to_owned(),
                    left,
                });
            }
            let res = self.cri.pull_image(image).await;
            let mut backoffs = self.backoff.lock().unwrap_or_else(|p| p.into_inner());
            match res {
                Ok(image_ref) => {
                    backoffs.image.forget(&key);
                    Ok(image_ref)
                }
                Err(source) => {
                    backoffs.image.next(&key, now, now_nanos());
                    Err(Error::ImagePull {
                        pod: pod.to_owned(),
                        container: container.name.clone(),
                        image: image.to_owned(),
                        source,
                    })
                }
            }
        } else {
            Err(Error::ImageNeverPull {
                pod: pod.to_owned(),
                container: container.name.clone(),
                image: image.to_owned(),
            })
        }
    }

    fn pod_labels(&self, pod: &Pod, uid: &str) -> HashMap<String, String> {
        HashMap::from([
            (
                labels::POD_NAME.to_owned(),
                pod.metadata.name.clone().unwrap_or_default(),
            ),
            (
                labels::POD_NAMESPACE.to_owned(),
                pod.metadata
                    .namespace
                    .clone()
                    .unwrap_or_else(|| "default".into()),
            ),
            (labels::POD_UID.to_owned(), uid.to_owned()),
            (labels::NODE_NAME.to_owned(), self.cfg.node_name.clone()),
        ])
    }

    fn host_network(pod: &Pod) -> bool {
        pod.spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false)
    }

    fn namespace_options(pod: &Pod) -> api::NamespaceOption {
        let share_pid = pod
            .spec
            .as_ref()
            .and_then(|s| s.share_process_namespace)
            .unwrap_or(false);
        api::NamespaceOption {
            network: if Self::host_network(pod) {
                api::NamespaceMode::Node
            } else {
                api::NamespaceMode::Pod
            } as i32,
            pid: if share_pid {
                api::NamespaceMode::Pod
            } else {
                api::NamespaceMode::Container
            } as i32,
            ipc: api::NamespaceMode::Pod as i32,
            ..Default::default()
        }
    }

    pub fn sandbox_config(
        &self,
        pod: &Pod,
        uid: &str,
        attempt: u32,
        cgroup_parent: &str,
    ) -> api::PodSandboxConfig {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let namespace = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let spec = pod.spec.as_ref();
        // Host-network pods share the node's UTS namespace: the runtime refuses to set a hostname.
        let hostname = if Self::host_network(pod) {
            String::new()
        } else {
            spec.and_then(|s| s.hostname.clone())
                .unwrap_or_else(|| name.chars().take(63).collect())
        };
        let mut labels = pod
            .metadata
            .labels
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect::<HashMap<_, _>>();
        labels.extend(self.pod_labels(pod, uid));
        let mut annotations: HashMap<String, String> = pod
            .metadata
            .annotations
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect();
        if let Ok(qos) = cm::pod_qos(pod) {
            annotations.insert(labels::POD_QOS_CLASS.to_owned(), qos.as_str().to_owned());
        }
        let port_mappings = spec
            .map(|s| s.containers.as_slice())
            .unwrap_or_default()
            .iter()
            .flat_map(|c| c.ports.iter().flatten())
            .filter(|p| p.host_port.is_some_and(|h| h > 0))
            .map(|p| api::PortMapping {
                protocol: match p.protocol.as_deref() {
                    Some("UDP") => api::Protocol::Udp,
                    Some("SCTP") => api::Protocol::Sctp,
                    _ => api::Protocol::Tcp,
                } as i32,
                container_port: p.container_port,
                host_port: p.host_port.unwrap_or_default(),
                host_ip: p.host_ip.clone().unwrap_or_default(),
            })
            .collect();
        let privileged = spec
            .map(|s| s.containers.as_slice())
            .unwrap_or_default()
            .iter()
            .any(|c| {
                c.security_context
                    .as_ref()
                    .and_then(|s| s.privileged)
                    .unwrap_or(false)
            });
        api::PodSandboxConfig {
            metadata: Some(api::PodSandboxMetadata {
                name: name.clone(),
                uid: uid.to_owned(),
                namespace: namespace.clone(),
                attempt,
            }),
            hostname,
            log_directory: self
                .cfg
                .pod_logs_dir
                .join(format!("{namespace}_{name}_{uid}"))
                .to_string_lossy()
                .into_owned(),
            dns_config: None,
            port_mappings,
            labels,
            annotations,
            linux: Some(api::LinuxPodSandboxConfig {
                cgroup_parent: cgroup_parent.to_owned(),
                security_context: Some(api::LinuxSandboxSecurityContext {
                    namespace_options: Some(Self::namespace_options(pod)),
                    privileged,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            windows: None,
        }
    }

    /// The requests a new pod's first start sends, built as its sync builds them: the sandbox
    /// config (its pod cgroup named, not created) and each regular container's config (attempt
    /// 0), in start order. The `pod_startup` bench's CRI floor issues exactly these, so that
    /// containerd is asked for the same work by the floor as by swiftlet.
    pub fn first_start_requests(
        &self,
        pod: &Pod,
        uid: &str,
    ) -> Result<(api::PodSandboxConfig, Vec<api::ContainerConfig>)> {
        let cgroup = cm::pod_qos(pod)
            .and_then(|qos| self.cm.pod_cgroup_name(uid, qos))
            .map_err(|source| Error::Cgroup {
                pod: full_name(pod),
                source,
            })?;
        let containers = pod
            .spec
            .iter()
            .flat_map(|s| &s.containers)
            .map(|c| {
                let hash = hash::container_hash(c);
                self.container_config(pod, uid, c, ContainerKind::App, 0, hash)
            })
            .collect::<Result<_>>()?;
        Ok((self.sandbox_config(pod, uid, 0, &cgroup), containers))
    }

    fn container_config(
        &self,
        pod: &Pod,
        uid: &str,
        c: &Container,
        kind: ContainerKind,
        restart_count: u32,
        hash: u64,
    ) -> Result<api::ContainerConfig> {
        let name = full_name(pod);
        let unsupported = |what: &str| Error::Unsupported {
            pod: name.clone(),
            what: format!("container {}: {what}", c.name),
        };
        let mut envs = Vec::new();
        for e in c.env.iter().flatten() {
            if e.value_from.is_some() {
                return Err(unsupported(&format!("env {} valueFrom", e.name)));
            }
            envs.push(api::KeyValue {
                key: e.name.clone(),
                value: e.value.clone().unwrap_or_default(),
            });
        }
        if c.env_from.as_ref().is_some_and(|v| !v.is_empty()) {
            return Err(unsupported("envFrom"));
        }
        let mut labels = self.pod_labels(pod, uid);
        labels.insert(labels::CONTAINER_NAME.to_owned(), c.name.clone());
        let mut annotations = HashMap::from([
            (labels::CONTAINER_TYPE.to_owned(), kind.as_str().to_owned()),
            (labels::CONTAINER_HASH.to_owned(), hash::hash_label(hash)),
            (
                labels::CONTAINER_RESTART_COUNT.to_owned(),
                restart_count.to_string(),
            ),
            (
                labels::POD_TERMINATION_GRACE_PERIOD.to_owned(),
                grace_period_secs(pod).to_string(),
            ),
            (
                labels::TERMINATION_MESSAGE_PATH.to_owned(),
                c.termination_message_path
                    .clone()
                    .unwrap_or_else(|| "/dev/termination-log".into()),
            ),
        ]);
        if let Some(pre_stop) = c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref())
            && let Ok(json) = serde_json::to_string(pre_stop)
        {
            annotations.insert(labels::PRE_STOP_HANDLER.to_owned(), json);
        }
        let resources = cm::container_resources(c).map_err(|source| Error::Cgroup {
            pod: name.clone(),
            source,
        })?;
        annotations.insert(
            labels::CONTAINER_RESOURCES.to_owned(),
            cm::resources_label(&resources),
        );
        let sc = c.security_context.as_ref();
        Ok(api::ContainerConfig {
            metadata: Some(api::ContainerMetadata {
                name: c.name.clone(),
                attempt: restart_count,
            }),
            image: Some(cri::image_spec(c.image.as_deref().unwrap_or_default())),
            command: c.command.clone().unwrap_or_default(),
            args: c.args.clone().unwrap_or_default(),
            working_dir: c.working_dir.clone().unwrap_or_default(),
            envs,
            labels,
            annotations,
            log_path: format!("{}/{restart_count}.log", c.name),
            stdin: c.stdin.unwrap_or(false),
            stdin_once: c.stdin_once.unwrap_or(false),
            tty: c.tty.unwrap_or(false),
            linux: Some(api::LinuxContainerConfig {
                resources: Some(resources),
                security_context: Some(api::LinuxContainerSecurityContext {
                    namespace_options: Some(Self::namespace_options(pod)),
                    privileged: sc.and_then(|s| s.privileged).unwrap_or(false),
                    run_as_user: sc
                        .and_then(|s| s.run_as_user)
                        .map(|value| api::Int64Value { value }),
                    run_as_group: sc
                        .and_then(|s| s.run_as_group)
                        .map(|value| api::Int64Value { value }),
                    readonly_rootfs: sc
                        .and_then(|s| s.read_only_root_filesystem)
                        .unwrap_or(false),
                    ..Default::default()
                }),
            }),
            ..Default::default()
        })
    }

    async fn stop_container(&self, pod: &str, id: &str, grace: i64) -> Result<()> {
        match self.cri.stop_container(id, grace.max(MIN_GRACE_SECS)).await {
            Err(e) if !e.is_not_found() => Err(Self::cri_err(pod)(e)),
            _ => Ok(()),
        }
    }

    /// Stops one container within what is left of `grace` seconds counted from `since`: its
    /// preStop hook (from the container's annotation) first, then StopContainer with the whole
    /// seconds that remain (at least 2).
    async fn kill_container(
        &self,
        pod: &str,
        st: &api::ContainerStatus,
        grace: i64,
        since: Instant,
    ) -> Result<()> {
        let name = st.metadata.as_ref().map_or("", |m| m.name.as_str());
        let left = |since: Instant| {
            Duration::from_secs(grace.max(0).unsigned_abs()).saturating_sub(since.elapsed())
        };
        if st.state == api::ContainerState::ContainerRunning as i32
            && let Some(handler) = st
                .annotations
                .get(labels::PRE_STOP_HANDLER)
                .and_then(|j| serde_json::from_str::<LifecycleHandler>(j).ok())
            && !left(since).is_zero()
        {
            self.pre_stop(pod, name, &st.id, &handler, left(since))
                .await;
        }
        // Whole seconds elapsed are taken off the grace period, as the kubelet does.
        let remaining = grace - i64::try_from(since.elapsed().as_secs()).unwrap_or(i64::MAX);
        tracing::debug!(pod, container = name, remaining, "stopping container");
        self.stop_container(pod, &st.id, remaining).await
    }

    /// Runs a preStop hook, waiting at most `budget`. Failures are logged: the container is
    /// stopped anyway.
    async fn pre_stop(
        &self,
        pod: &str,
        container: &str,
        id: &str,
        handler: &LifecycleHandler,
        budget: Duration,
    ) {
        let started = Instant::now();
        if let Some(cmd) = handler.exec.as_ref().and_then(|e| e.command.clone()) {
            let timeout = i64::try_from(budget.as_secs().max(1)).unwrap_or(i64::MAX);
            match tokio::time::timeout(budget, self.cri.exec_sync(id, cmd, timeout)).await {
                Ok(Ok(r)) if r.exit_code == 0 => {}
                Ok(Ok(r)) => {
                    tracing::warn!(pod, container, exit_code = r.exit_code, stderr = %String::from_utf8_lossy(&r.stderr), "preStop hook failed")
                }
                Ok(Err(e)) => tracing::warn!(pod, container, error = %e, "preStop hook failed"),
                Err(_) => tracing::warn!(
                    pod,
                    container,
                    ?budget,
                    "preStop hook did not finish within the grace period"
                ),
            }
        } else if let Some(sleep) = &handler.sleep {
            let d = Duration::from_secs(sleep.seconds.max(0).unsigned_abs()).min(budget);
            tokio::time::sleep(d).await;
        } else {
            tracing::warn!(
                pod,
                container,
                "preStop hook: only exec and sleep handlers are supported yet"
            );
        }
        tracing::info!(pod, container, elapsed = ?started.elapsed(), "preStop hook done");
    }

    /// Stops every live container within the grace period (app and init containers in parallel,
    /// then sidecars one at a time in reverse start order), then the sandboxes: the ready ones, or
    /// with `remove` every one, removed as well.
    async fn stop_runtime_pod(
        &self,
        name: &str,
        state: &PodState,
        grace: i64,
        remove: bool,
    ) -> Result<()> {
        let since = Instant::now();
        let live = |c: &&api::ContainerStatus| is_live(c);
        let is_sidecar = |c: &&api::ContainerStatus| {
            c.annotations
                .get(labels::CONTAINER_TYPE)
                .map(String::as_str)
                == Some(ContainerKind::Sidecar.as_str())
        };
        let uid = cri::current_pod();
        let mut stops = tokio::task::JoinSet::new();
        for c in state
            .containers
            .iter()
            .filter(live)
            .filter(|c| !is_sidecar(c))
        {
            let (this, name, st, uid) = (self.clone(), name.to_owned(), c.clone(), uid.clone());
            stops.spawn(async move {
                let kill = this.kill_container(&name, &st, grace, since);
                match uid {
                    Some(uid) => cri::with_pod(&uid, kill).await,
                    None => kill.await,
                }
            });
        }
        let mut first_err = None;
        while let Some(res) = stops.join_next().await {
            if let Ok(Err(e)) = res {
                first_err.get_or_insert(e);
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        let mut sidecars: Vec<&api::ContainerStatus> = state
            .containers
            .iter()
            .filter(live)
            .filter(is_sidecar)
            .collect();
        sidecars.sort_by_key(|c| std::cmp::Reverse(c.created_at));
        for c in sidecars {
            self.kill_container(name, c, grace, since).await?;
        }
        for s in &state.sandboxes {
            let ready = s.state == api::PodSandboxState::SandboxReady as i32;
            if ready || remove {
                self.ignore_not_found(name, self.cri.stop_pod_sandbox(&s.id).await)?;
            }
            if remove {
                self.ignore_not_found(name, self.cri.remove_pod_sandbox(&s.id).await)?;
            }
        }
        Ok(())
    }

    fn ignore_not_found(&self, pod: &str, r: cri::Result<()>) -> Result<()> {
        match r {
            Err(e) if !e.is_not_found() => Err(Self::cri_err(pod)(e)),
            _ => Ok(()),
        }
    }

    /// Terminates a pod: containers within `grace` seconds (preStop hooks inside it, sidecars
    /// last), then its sandboxes (stopped and removed), then its cgroup and log directory, and
    /// forgets its back-offs. Works from the UID alone (hooks and order come from the containers'
    /// annotations), so orphans can be killed too.
    pub async fn kill_pod(&self, name: &str, uid: &str, grace: i64) -> Result<()> {
        let killing = self.mutating(uid, true, None);
        let result = cri::with_pod(uid, self.kill_pod_traced(name, uid, grace)).await;
        drop(killing);
        if result.is_ok() {
            self.fresh().forget(uid);
        }
        result
    }

    /// Stops a pod that finished (Succeeded or Failed) without removing anything: its containers
    /// stay for their status and logs, as the kubelet leaves them to container GC. Removal comes
    /// with `kill_pod` once no source wants the pod.
    pub async fn stop_pod(&self, name: &str, uid: &str, grace: i64) -> Result<()> {
        let _killing = self.mutating(uid, true, None);
        let state = self
            .pod_state_counted(uid, "kill")
            .await
            .map_err(Self::cri_err(name))?;
        self.stop_runtime_pod(name, &state, grace, false).await
    }

    /// Puts the resources applied by in-place resizes over the create-time annotation of each
    /// container, forgets containers that are gone; returns the pod's resize error.
    fn overlay_resized(
        &self,
        uid: &str,
        containers: &mut [api::ContainerStatus],
    ) -> Option<String> {
        let r = self.resize.lock().unwrap_or_else(|p| p.into_inner());
        if r.applied.is_empty() && r.errors.is_empty() {
            return None;
        }
        for c in containers.iter_mut() {
            if let Some(applied) = r.applied.get(&c.id) {
                c.annotations
                    .insert(labels::CONTAINER_RESOURCES.to_owned(), applied.clone());
            }
        }
        r.errors.get(uid).cloned()
    }

    /// After a QoS class change: the pod's cgroups under other classes go (the kubelet leaves
    /// the old one behind until the pod is deleted).
    fn leave_old_qos_cgroup(&self, pod: &Pod, uid: &str, name: &str) -> Result<()> {
        let err = |source| Error::Cgroup {
            pod: name.to_owned(),
            source,
        };
        let qos = cm::pod_qos(pod).map_err(err)?;
        tracing::info!(pod = %name, qos = qos.as_str(), "QoS class changed: pod recreated under the new QoS cgroup");
        self.cm
            .destroy_pod_cgroups_except(uid, Some(qos))
            .map_err(err)
    }

    /// In-place resize (KEP-1287): the pod cgroup and each container's resources through CRI
    /// `UpdateContainerResources`, no restart. A pod memory limit below what the pod uses now is
    /// refused. The outcome is kept for the status.
    async fn resize_in_place(
        &self,
        pod: &Pod,
        uid: &str,
        name: &str,
        state: &PodState,
        indices: &[usize],
    ) {
        let result = self.try_resize(pod, uid, state, indices).await;
        let mut r = self.resize.lock().unwrap_or_else(|p| p.into_inner());
        match result {
            Ok(applied) => {
                tracing::info!(pod = %name, containers = applied.len(), "resized in place");
                r.errors.remove(uid);
                let live: std::collections::HashSet<&str> =
                    state.containers.iter().map(|c| c.id.as_str()).collect();
                r.applied.retain(|id, _| live.contains(id.as_str()));
                r.applied.extend(applied);
            }
            Err(message) => {
                tracing::warn!(pod = %name, %message, "resize not done");
                r.errors.insert(uid.to_owned(), message);
            }
        }
    }

    async fn try_resize(
        &self,
        pod: &Pod,
        uid: &str,
        state: &PodState,
        indices: &[usize],
    ) -> std::result::Result<Vec<(String, String)>, String> {
        let spec = pod.spec.as_ref().ok_or("no spec")?;
        let qos = cm::pod_qos(pod).map_err(|e| e.to_string())?;
        let cgroup = self
            .cm
            .pod_cgroup_name(uid, qos)
            .map_err(|e| e.to_string())?;
        let rc = cm::resource_config_for_pod(pod).map_err(|e| e.to_string())?;
        if let Some(limit) = rc.memory_limit {
            let usage = self.cm.memory_usage(&cgroup).map_err(|e| e.to_string())?;
            if limit < usage {
                return Err(format!(
                    "pod memory limit {limit} is below the pod's current memory usage {usage}: resize refused"
                ));
            }
        }
        let mut updates = Vec::new();
        for &i in indices {
            let Some(c) = spec.containers.get(i) else {
                continue;
            };
            let Some(st) = state.newest(&c.name) else {
                continue;
            };
            updates.push((
                st.id.clone(),
                cm::container_resources(c).map_err(|e| e.to_string())?,
            ));
        }
        // First the pod cgroup's limits that grow, then the containers, then the pod cgroup's
        // limits that shrink: a parent's limit must hold its children's.
        let grown = self
            .cm
            .grown_config(&cgroup, &rc)
            .map_err(|e| format!("reading the pod cgroup: {e}"))?;
        self.cm
            .apply(&cgroup, &grown)
            .map_err(|e| format!("updating the pod cgroup: {e}"))?;
        let mut applied = Vec::new();
        for (id, res) in updates {
            let label = cm::resources_label(&res);
            self.cri
                .update_container_resources(&id, res)
                .await
                .map_err(|e| format!("UpdateContainerResources {id}: {e}"))?;
            applied.push((id, label));
        }
        self.cm
            .ensure_pod_cgroup(pod, uid)
            .map_err(|e| format!("updating the pod cgroup: {e}"))?;
        Ok(applied)
    }

    /// The container manager (pod cgroups).
    pub fn cm(&self) -> &ContainerManager {
        &self.cm
    }

    /// Forgets back-off entries untouched for ten minutes (for housekeeping; a killed pod's
    /// entries are forgotten by `kill_pod` already).
    pub fn gc_backoffs(&self) {
        let now = now_nanos();
        let mut b = self.backoff.lock().unwrap_or_else(|p| p.into_inner());
        b.crash.gc(now);
        b.image.gc(now);
    }

    /// [`Manager::kill_pod`] for a known pod: the grace period is `grace_override`, else the pod's
    /// deletion grace period, else its `terminationGracePeriodSeconds`, else 30 s (at least 2 s).
    pub async fn kill_pod_for(&self, pod: &Pod, grace_override: Option<i64>) -> Result<()> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let grace = grace_override
            .unwrap_or_else(|| grace_period_secs(pod))
            .max(MIN_GRACE_SECS);
        self.kill_pod(&full_name(pod), &uid, grace).await
    }

    async fn kill_pod_traced(&self, name: &str, uid: &str, grace: i64) -> Result<()> {
        let state = self
            .pod_state_counted(uid, "kill")
            .await
            .map_err(Self::cri_err(name))?;
        self.stop_runtime_pod(name, &state, grace, true).await?;
        // Without the spec (orphans) the QoS class is unknown: try the pod's place under each.
        self.cm
            .destroy_pod_cgroups_async(uid)
            .await
            .map_err(|source| Error::Cgroup {
                pod: name.to_owned(),
                source,
            })?;
        for s in &state.sandboxes {
            if let Some(m) = &s.metadata {
                let dir = self
                    .cfg
                    .pod_logs_dir
                    .join(format!("{}_{}_{}", m.namespace, m.name, m.uid));
                if let Err(e) = std::fs::remove_dir_all(&dir)
                    && e.kind() != std::io::ErrorKind::NotFound
                {
                    tracing::warn!(pod = %name, dir = %dir.display(), %e, "removing pod log directory");
                }
            }
        }
        self.backoff
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .forget_prefix(&format!("{uid}_"));
        self.known().created.remove(uid);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{Config, Known, Manager, hash};
    use crate::pod::labels;
    use crate::{cm, cri::Cri, metrics::Metrics};
    use std::collections::HashSet;

    #[tokio::test]
    async fn first_start_requests_are_what_a_new_pods_sync_sends() {
        let mount = tempfile::tempdir().expect("tempdir");
        let manager = Manager::new(
            Cri::new("unix:///nonexistent/cri.sock", Metrics::new()).expect("lazy client"),
            cm::ContainerManager::new(cm::Config {
                cgroup_root: "/t".into(),
                cgroups_per_qos: true,
                mount: mount.path().into(),
                pod_pids_limit: -1,
            }),
            Config {
                node_name: "n1".into(),
                pod_logs_dir: "/logs".into(),
            },
        );
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "ns"},
            "spec": {"containers": [
                {"name": "a", "image": "img:1", "resources": {"requests": {"cpu": "250m"}}},
                {"name": "b", "image": "img:2"}
            ]}
        }))
        .expect("pod");
        let (sandbox, containers) = manager.first_start_requests(&pod, "u1").expect("requests");
        let linux = sandbox.linux.as_ref().expect("linux");
        // Burstable (a request, no limits): the pod cgroup the sync creates, named, not made.
        assert_eq!(linux.cgroup_parent, "/t/kubepods/burstable/podu1");
        let made = std::fs::read_dir(mount.path()).expect("mount").count();
        assert_eq!(made, 0, "nothing is created under the cgroup mount");
        assert_eq!(sandbox.log_directory, "/logs/ns_web_u1");
        assert_eq!(
            sandbox.labels.get(labels::NODE_NAME).map(String::as_str),
            Some("n1")
        );
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(containers.len(), 2);
        for (config, c) in containers.iter().zip(&spec.containers) {
            let meta = config.metadata.as_ref().expect("metadata");
            assert_eq!((meta.name.as_str(), meta.attempt), (c.name.as_str(), 0));
            assert_eq!(config.log_path, format!("{}/0.log", c.name));
            assert_eq!(
                config.annotations.get(labels::CONTAINER_HASH),
                Some(&hash::hash_label(hash::container_hash(c)))
            );
        }
        let shares = |i: usize| {
            containers[i]
                .linux
                .as_ref()
                .and_then(|l| l.resources.as_ref())
                .map(|r| r.cpu_shares)
        };
        assert_eq!((shares(0), shares(1)), (Some(256), Some(2)));
    }

    #[test]
    fn a_pod_holds_nothing_only_when_the_last_relist_and_our_own_starts_say_so() {
        let mut k = Known::default();
        // Before the first relist a previous agent's pods may be there to adopt.
        assert!(!k.holds_nothing("a"));
        k.relisted = Some(HashSet::from(["b".to_owned()]));
        assert!(k.holds_nothing("a"));
        assert!(!k.holds_nothing("b"), "the relist found it");
        // A sandbox started after the relist listed the runtime.
        k.created.insert("a".to_owned());
        assert!(!k.holds_nothing("a"));
        k.created.remove("a");
        assert!(k.holds_nothing("a"));
    }
}
