//! The container garbage collector: clean-up of what a live pod leaves behind in the runtime, the
//! sandboxes it no longer uses and the exited containers in them (the kubelet's container garbage
//! collection). [`ContainerGc`] owns its state; housekeeping starts it, the eviction manager's
//! disk reclaim runs it, and it skips every pod a worker is changing (the pod cache says which).
//!
//! A pod whose sandbox dies (its pause process killed, or the runtime restarted half-way through
//! creating it) gets a new sandbox from its next sync; the old one stays not ready, and until it is
//! stopped it holds its network namespace, its `/dev/shm` mount and its shim. A sandbox is
//! collected as the kubelet collects one: it is not ready, it is not the pod's newest sandbox,
//! and no container is left in it. The containers in it go first when they have exited and a newer
//! container of the same name exists (the kubelet keeps one dead instance per container, and so
//! does this: the newest one carries the restart count and the last termination state). A stale
//! sandbox that must stay for such a container is at least stopped, once.
//!
//! In the sandboxes a pod still uses, dead instances of a container (exited, or created and never
//! started, as after a failed `StartContainer`) are held to [`MAX_DEAD_PER_CONTAINER`] per
//! container name, the newest kept, as the kubelet's container garbage collection does with its
//! default `--maximum-dead-containers-per-container`; without it a crash loop or a runtime that
//! keeps failing starts would leave one more container behind each time. A container's log files
//! (its `<restart>.log` and the files rotated from it, see `crate::logs`) are removed just before
//! the container, as the kubelet removes them, so a crash loop does not leave a log per restart;
//! its log link (`crate::logs::links`) goes with them, and each collection ends by removing the
//! log links that lead to nothing.
//! (A container the runtime created while its CreateContainer answer was lost, as when the
//! runtime dies during the call, is such a dead instance: it goes once a newer one of its name is
//! dead too, or stays as the one dead instance kept.)
use crate::cri::{self, Cri};
use crate::pod::labels;
use crate::pod_cache::PodCache;
use k8s_cri::v1 as api;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Time between two collections (the kubelet's is a minute; a node recovering from a runtime
/// restart should not hold dead sandboxes that long).
pub const GC_PERIOD: Duration = Duration::from_secs(10);

/// Time between two collections while nothing changed since the last one found nothing to do
/// (the kubelet's period): with the kernel path trusted, no mutation, no pod dropped and no exit
/// seen, and no `--minimum-container-ttl-duration` (under which time alone makes a dead
/// container collectable), a collection can only find what was changed behind the agent's back.
pub const QUIET_GC_PERIOD: Duration = Duration::from_secs(60);

/// Dead (not running) instances kept per container name of a pod, the newest ones (the kubelet's
/// default `--maximum-dead-containers-per-container`).
pub const MAX_DEAD_PER_CONTAINER: usize = 1;

/// The kubelet's container garbage collection policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// `--minimum-container-ttl-duration`: a dead container younger than this is never removed
    /// nor counted.
    pub min_age: Duration,
    /// `--maximum-dead-containers-per-container`: dead instances kept per container name of a
    /// pod (`None`: no limit).
    pub max_per_container: Option<usize>,
    /// `--maximum-dead-containers`: dead containers kept on the node in all (`None`: no limit).
    pub max_containers: Option<usize>,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            min_age: Duration::ZERO,
            max_per_container: Some(MAX_DEAD_PER_CONTAINER),
            max_containers: None,
        }
    }
}

/// The collector's own state, shared by its clones.
#[derive(Debug, Default)]
struct GcState {
    /// A collection is running (housekeeping never starts a second one).
    running: bool,
    last: Option<Instant>,
    /// The pod cache's mark from before the last collection, kept when that collection found
    /// nothing to do (see [`QUIET_GC_PERIOD`]).
    quiet: Option<crate::pod_cache::QuietMark>,
    /// Stale sandboxes already stopped by this agent (stopped again only after a restart).
    stopped: HashSet<String>,
}

/// Why one pod's collection stopped (logged; the next collection tries again).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("pod {pod}: {source}")]
    Cri {
        pod: String,
        #[source]
        source: cri::Error,
    },
    #[error("pod {pod}: removing a dead container's log files: {source}")]
    ContainerLogs {
        pod: String,
        #[source]
        source: std::io::Error,
    },
}

/// The container garbage collector (cheap to clone: clones share its state).
#[derive(Clone)]
pub struct ContainerGc {
    cri: Cri,
    /// Only this agent's sandboxes and containers are collected.
    node_name: String,
    policy: Policy,
    /// Which pods a worker is changing (skipped), and the mark a collection holds on the pod
    /// it changes.
    pod_cache: PodCache,
    /// The containers' log links (`crate::logs::links`).
    links_dir: PathBuf,
    state: Arc<Mutex<GcState>>,
}

/// What one pod's collection does.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Exited containers in stale sandboxes with a newer instance of the same name, and dead
    /// instances beyond [`MAX_DEAD_PER_CONTAINER`] in the sandboxes the pod still uses.
    pub remove_containers: Vec<String>,
    /// Stale sandboxes left with no container: stopped, then removed.
    pub remove_sandboxes: Vec<String>,
    /// Stale sandboxes that keep a container: stopped only.
    pub stop_sandboxes: Vec<String>,
}

/// What a collection did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Collected {
    pub containers: usize,
    pub sandboxes: usize,
    pub stopped: usize,
}

/// Whether a collection is due at `now`, the last one having ended at `last`:
/// [`GC_PERIOD`] after it, or [`QUIET_GC_PERIOD`] after it when it found nothing to do and
/// nothing changed since (`unchanged`).
pub fn due(last: Option<Instant>, now: Instant, unchanged: bool) -> bool {
    let Some(last) = last else {
        return true;
    };
    let since = now.saturating_duration_since(last);
    since >= QUIET_GC_PERIOD || (since >= GC_PERIOD && !unchanged)
}

/// The collection plan for one pod from its listed sandboxes and containers, with the default
/// policy.
pub fn plan(sandboxes: &[api::PodSandbox], containers: &[api::Container]) -> Plan {
    plan_with(sandboxes, containers, &Policy::default(), i64::MAX)
}

/// A container's creation time (CRI nanoseconds) is at most `newest` when `min_age` allows it to
/// go at `now_ns`.
fn newest_evictable(policy: &Policy, now_ns: i64) -> i64 {
    now_ns.saturating_sub(i64::try_from(policy.min_age.as_nanos()).unwrap_or(i64::MAX))
}

/// [`plan`] under `policy` at `now_ns` (CRI nanoseconds).
pub fn plan_with(
    sandboxes: &[api::PodSandbox],
    containers: &[api::Container],
    policy: &Policy,
    now_ns: i64,
) -> Plan {
    let mut plan = Plan::default();
    let Some(newest) = sandboxes
        .iter()
        .max_by_key(|s| (s.created_at, s.id.as_str()))
    else {
        return plan;
    };
    // The newest instance of each container name, whichever sandbox holds it.
    let mut newest_of: HashMap<&str, &api::Container> = HashMap::new();
    for c in containers {
        let name = c.metadata.as_ref().map_or("", |m| m.name.as_str());
        let e = newest_of.entry(name).or_insert(c);
        if (c.created_at, c.id.as_str()) > (e.created_at, e.id.as_str()) {
            *e = c;
        }
    }
    let exited = api::ContainerState::ContainerExited as i32;
    let created = api::ContainerState::ContainerCreated as i32;
    let ready = api::PodSandboxState::SandboxReady as i32;
    let is_newest = |c: &api::Container| {
        let name = c.metadata.as_ref().map_or("", |m| m.name.as_str());
        newest_of.get(name).is_some_and(|n| n.id == c.id)
    };
    let newest_ok = newest_evictable(policy, now_ns);
    let old_enough = |c: &api::Container| c.created_at <= newest_ok;
    for s in sandboxes {
        if s.id == newest.id || s.state == ready {
            continue;
        }
        let mut kept = 0;
        for c in containers.iter().filter(|c| c.pod_sandbox_id == s.id) {
            if (c.state == exited || c.state == created) && !is_newest(c) && old_enough(c) {
                plan.remove_containers.push(c.id.clone());
            } else {
                kept += 1;
            }
        }
        if kept == 0 {
            plan.remove_sandboxes.push(s.id.clone());
        } else {
            plan.stop_sandboxes.push(s.id.clone());
        }
    }
    // Dead instances of each name, newest first; past the ones kept, those in a sandbox the pod
    // still uses go (a stale sandbox's are the rule above's).
    let in_use = |sandbox: &str| {
        sandbox == newest.id
            || sandboxes
                .iter()
                .any(|s| s.id == sandbox && s.state == ready)
    };
    let running = api::ContainerState::ContainerRunning as i32;
    let mut dead: HashMap<&str, Vec<&api::Container>> = HashMap::new();
    for c in containers
        .iter()
        .filter(|c| c.state != running && old_enough(c))
    {
        let name = c.metadata.as_ref().map_or("", |m| m.name.as_str());
        dead.entry(name).or_default().push(c);
    }
    let keep = policy.max_per_container.unwrap_or(usize::MAX);
    let mut surplus: Vec<&api::Container> = dead
        .into_values()
        .flat_map(|mut of_name| {
            of_name
                .sort_by(|a, b| (b.created_at, b.id.as_str()).cmp(&(a.created_at, a.id.as_str())));
            of_name.into_iter().skip(keep)
        })
        .filter(|c| in_use(&c.pod_sandbox_id))
        .collect();
    surplus.sort_by_key(|c| (c.created_at, c.id.as_str()));
    plan.remove_containers
        .extend(surplus.into_iter().map(|c| c.id.clone()));
    plan
}

/// The plan for a pod that has finished (phase Succeeded or Failed) but is still wanted, when
/// disk pressure asks for everything that can go: every dead container old enough for `policy`,
/// none kept for status or logs, and then its sandboxes (the kubelet's reclaim removes a
/// terminated pod's containers whether or not the pod was deleted). Its final status stays with
/// the status manager.
pub fn plan_finished(
    sandboxes: &[api::PodSandbox],
    containers: &[api::Container],
    policy: &Policy,
    now_ns: i64,
) -> Plan {
    let running = api::ContainerState::ContainerRunning as i32;
    let ready = api::PodSandboxState::SandboxReady as i32;
    let newest_ok = newest_evictable(policy, now_ns);
    let mut plan = Plan::default();
    let mut kept: HashSet<&str> = HashSet::new();
    for c in containers {
        if c.state != running && c.created_at <= newest_ok {
            plan.remove_containers.push(c.id.clone());
        } else {
            kept.insert(&c.pod_sandbox_id);
        }
    }
    for s in sandboxes.iter().filter(|s| s.state != ready) {
        if kept.contains(s.id.as_str()) {
            plan.stop_sandboxes.push(s.id.clone());
        } else {
            plan.remove_sandboxes.push(s.id.clone());
        }
    }
    plan
}

/// One pod's dead instances of one container name (the kubelet's evict unit): (created at,
/// container ID), any order.
pub type Unit = Vec<(i64, String)>;

/// The kubelet's `--maximum-dead-containers`: when the units hold more than `max` dead
/// containers, each keeps its `max / units` newest (at least one), then the oldest of the rest
/// go until `max` are left. Answers the IDs to remove.
pub fn over_node_cap(units: Vec<Unit>, max: usize) -> Vec<String> {
    let total: usize = units.iter().map(Vec::len).sum();
    if total <= max {
        return Vec::new();
    }
    let per_unit = (max / units.len().max(1)).max(1);
    let (mut out, mut kept) = (Vec::new(), Vec::new());
    for mut unit in units {
        unit.sort_by(|a, b| b.cmp(a));
        let rest = unit.split_off(per_unit.min(unit.len()));
        out.extend(rest.into_iter().map(|(_, id)| id));
        kept.extend(unit);
    }
    if kept.len() > max {
        kept.sort();
        let excess = kept.len() - max;
        out.extend(kept.into_iter().take(excess).map(|(_, id)| id));
    }
    out
}

/// The dead containers a pod holds after `plan`, by container name, old enough for `policy`.
fn remaining_units(
    containers: &[api::Container],
    plan: &Plan,
    policy: &Policy,
    now_ns: i64,
) -> Vec<Unit> {
    let running = api::ContainerState::ContainerRunning as i32;
    let newest_ok = newest_evictable(policy, now_ns);
    let mut units: HashMap<&str, Unit> = HashMap::new();
    for c in containers.iter().filter(|c| {
        c.state != running && c.created_at <= newest_ok && !plan.remove_containers.contains(&c.id)
    }) {
        let name = c.metadata.as_ref().map_or("", |m| m.name.as_str());
        units
            .entry(name)
            .or_default()
            .push((c.created_at, c.id.clone()));
    }
    units.into_values().collect()
}

impl ContainerGc {
    /// A collector of agent `node_name`'s sandboxes and containers by `policy`, and of the
    /// dangling container log links in `links_dir`.
    pub fn new(
        cri: Cri,
        node_name: String,
        policy: Policy,
        pod_cache: PodCache,
        links_dir: PathBuf,
    ) -> Self {
        Self {
            cri,
            node_name,
            policy,
            pod_cache,
            links_dir,
            state: Arc::default(),
        }
    }

    fn state(&self) -> MutexGuard<'_, GcState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts a collection off the caller's task when one is due ([`due`]) and none is running;
    /// what it collected is logged and counted.
    pub fn collect_stale_sandboxes_in_background(
        &self,
        counter: prometheus_client::metrics::counter::Counter,
    ) {
        let mark = self.pod_cache.lock().quiet_mark();
        {
            let mut gc = self.state();
            let unchanged = mark.is_some() && gc.quiet == mark;
            if gc.running || !due(gc.last, Instant::now(), unchanged) {
                return;
            }
            gc.running = true;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let result = this.collect_stale_sandboxes().await;
            let mut gc = this.state();
            gc.running = false;
            gc.last = Some(Instant::now());
            gc.quiet = None;
            match result {
                Ok(done) => {
                    counter.inc_by((done.sandboxes + done.containers) as u64);
                    // With a minimum age, time alone makes dead containers collectable.
                    if done == Collected::default() && this.policy.min_age.is_zero() {
                        gc.quiet = mark;
                    }
                }
                Err(e) => tracing::warn!(%e, "collecting stale sandboxes"),
            }
        });
    }

    /// One collection over every pod of this agent that is not being changed right now. Pods no
    /// source wants are left to `kill_pod`, which removes all of their sandboxes.
    pub async fn collect_stale_sandboxes(&self) -> cri::Result<Collected> {
        self.collect_containers(&|_| false).await
    }

    /// A collection that also removes everything of the pods `finished` answers true for
    /// ([`plan_finished`]): disk pressure's reclaim, which cannot wait for those pods' deletion.
    pub async fn collect_containers(
        &self,
        finished: &(dyn Fn(&str) -> bool + Sync),
    ) -> cri::Result<Collected> {
        let (sandboxes, containers) = labels::node_filters(&self.node_name, None);
        let (sandboxes, containers) = tokio::try_join!(
            self.cri.list_pod_sandbox(Some(sandboxes)),
            self.cri.list_containers(Some(containers))
        )?;
        let pods =
            crate::pod::state::by_pod(sandboxes, containers, |c| c.labels.get(labels::POD_UID));
        let live: HashSet<String> = pods
            .values()
            .flat_map(|(s, _)| s.iter().map(|s| s.id.clone()))
            .collect();
        self.state().stopped.retain(|id| live.contains(id));
        let policy = self.policy;
        let now_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
        let mut plans: Vec<(String, Vec<api::PodSandbox>, Plan)> = Vec::with_capacity(pods.len());
        let mut units: Vec<Unit> = Vec::new();
        // Container ID -> the index of its pod's plan.
        let mut owner: HashMap<String, usize> = HashMap::new();
        for (uid, (sandboxes, containers)) in pods {
            let plan = if finished(&uid) {
                plan_finished(&sandboxes, &containers, &policy, now_ns)
            } else {
                plan_with(&sandboxes, &containers, &policy, now_ns)
            };
            if policy.max_containers.is_some() {
                for unit in remaining_units(&containers, &plan, &policy, now_ns) {
                    owner.extend(unit.iter().map(|(_, id)| (id.clone(), plans.len())));
                    units.push(unit);
                }
            }
            plans.push((uid, sandboxes, plan));
        }
        // The node-wide cap takes from every pod's remaining dead containers.
        if let Some(max) = policy.max_containers {
            let over = over_node_cap(units, max);
            if !over.is_empty() {
                tracing::info!(
                    removing = over.len(),
                    max,
                    "more dead containers than --maximum-dead-containers"
                );
            }
            for id in over {
                if let Some(&i) = owner.get(&id) {
                    plans[i].2.remove_containers.push(id);
                }
            }
        }
        let mut done = Collected::default();
        for (uid, sandboxes, plan) in plans {
            if plan == Plan::default() || self.pod_cache.lock().is_mutating(&uid) {
                continue;
            }
            let _changing = self.pod_cache.mutating(&uid, false, None);
            let pod = sandboxes
                .first()
                .and_then(|s| s.metadata.as_ref())
                .map_or_else(|| uid.clone(), |m| format!("{}_{}", m.name, m.namespace));
            match self.apply_plan(&pod, &plan).await {
                Ok(n) => {
                    done.containers += n.containers;
                    done.sandboxes += n.sandboxes;
                    done.stopped += n.stopped;
                }
                Err(e) => tracing::warn!(%pod, %e, "collecting stale sandboxes"),
            }
        }
        self.remove_dangling_links().await;
        Ok(done)
    }

    /// Removes the container log links whose log file is gone (`crate::logs::links`), as the
    /// kubelet's container log collection does, except those of containers the runtime reports
    /// not exited (a rotation renames a running container's log for a moment) or cannot say
    /// about (tried again next time).
    async fn remove_dangling_links(&self) {
        use crate::logs::links;
        let dir = self.links_dir.clone();
        let found = match tokio::task::spawn_blocking(move || links::dangling(&dir)).await {
            Ok(Ok(found)) => found,
            Ok(Err(e)) => {
                tracing::warn!(dir = %self.links_dir.display(), %e, "listing container log links");
                return;
            }
            Err(e) => {
                tracing::warn!(%e, "listing container log links");
                return;
            }
        };
        let exited = api::ContainerState::ContainerExited as i32;
        let mut due = Vec::with_capacity(found.len());
        for link in found {
            if let Some(id) = links::id_of(&link) {
                match self.cri.container_status(id).await {
                    Ok(Some(status)) if status.state != exited => continue,
                    Ok(_) => {}
                    Err(e) if e.is_not_found() => {}
                    Err(e) => {
                        tracing::debug!(%link, %e, "a dangling container log link's container");
                        continue;
                    }
                }
            }
            due.push(link);
        }
        if due.is_empty() {
            return;
        }
        let dir = self.links_dir.clone();
        let removed = tokio::task::spawn_blocking(move || {
            for link in due {
                match links::remove_if_dangling(&dir, &link) {
                    Ok(true) => tracing::info!(%link, "removed a dangling container log link"),
                    Ok(false) => {}
                    Err(e) => tracing::warn!(%link, %e, "removing a dangling container log link"),
                }
            }
        });
        if let Err(e) = removed.await {
            tracing::warn!(%e, "removing dangling container log links");
        }
    }

    /// Removes the log files of container `id` (its log and the files rotated from it) and its
    /// log link; a container the runtime does not know any more has none left to find (a link
    /// left behind is removed once found dangling).
    async fn remove_container_logs(&self, pod: &str, id: &str) -> Result<(), Error> {
        let status = match self.cri.container_status(id).await {
            Ok(status) => status,
            Err(e) if e.is_not_found() => None,
            Err(source) => {
                return Err(Error::Cri {
                    pod: pod.to_owned(),
                    source,
                });
            }
        };
        let Some(status) = status else {
            return Ok(());
        };
        let link = crate::logs::links::name_of(&status);
        let log = Some(status.log_path)
            .filter(|p| !p.is_empty())
            .map(PathBuf::from);
        let (links_dir, owner) = (self.links_dir.clone(), pod.to_owned());
        let removed = tokio::task::spawn_blocking(move || {
            // A link that cannot be removed now is found dangling later.
            if let Some(link) = link
                && let Err(e) = crate::logs::links::remove(&links_dir, &link)
            {
                tracing::warn!(pod = %owner, %link, %e, "removing a container's log link");
            }
            log.map_or(Ok(0), |log| crate::logs::remove_container_logs(&log))
        })
        .await;
        match removed {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(Error::ContainerLogs {
                pod: pod.to_owned(),
                source: e,
            }),
            Err(e) => Err(Error::ContainerLogs {
                pod: pod.to_owned(),
                source: std::io::Error::other(e.to_string()),
            }),
        }
    }

    async fn apply_plan(&self, pod: &str, plan: &Plan) -> Result<Collected, Error> {
        let mut done = Collected::default();
        for id in &plan.remove_containers {
            // Its log files first, as the kubelet does: a failure keeps the container, so that
            // the next collection tries both again.
            self.remove_container_logs(pod, id).await?;
            ignore_not_found(pod, self.cri.remove_container(id).await)?;
            tracing::info!(%pod, container = %id, "removed a superseded container (exited in a stale sandbox, or never started)");
            done.containers += 1;
        }
        for id in &plan.remove_sandboxes {
            // Stopped first: a sandbox the runtime lost half-way may never have been stopped.
            ignore_not_found(pod, self.cri.stop_pod_sandbox(id).await)?;
            ignore_not_found(pod, self.cri.remove_pod_sandbox(id).await)?;
            tracing::info!(%pod, sandbox = %id, "removed a stale sandbox");
            done.sandboxes += 1;
        }
        for id in &plan.stop_sandboxes {
            let first = self.state().stopped.insert(id.clone());
            if first {
                ignore_not_found(pod, self.cri.stop_pod_sandbox(id).await)?;
                tracing::info!(%pod, sandbox = %id, "stopped a stale sandbox that still holds a container");
                done.stopped += 1;
            }
        }
        Ok(done)
    }
}

/// `r`, with an object the runtime no longer knows taken as already removed.
fn ignore_not_found(pod: &str, r: cri::Result<()>) -> Result<(), Error> {
    match r {
        Err(e) if !e.is_not_found() => Err(Error::Cri {
            pod: pod.to_owned(),
            source: e,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(id: &str, created_at: i64, ready: bool) -> api::PodSandbox {
        api::PodSandbox {
            id: id.to_owned(),
            created_at,
            state: if ready {
                api::PodSandboxState::SandboxReady
            } else {
                api::PodSandboxState::SandboxNotready
            } as i32,
            ..Default::default()
        }
    }

    fn container(
        id: &str,
        sandbox: &str,
        name: &str,
        created_at: i64,
        running: bool,
    ) -> api::Container {
        api::Container {
            id: id.to_owned(),
            pod_sandbox_id: sandbox.to_owned(),
            created_at,
            state: if running {
                api::ContainerState::ContainerRunning
            } else {
                api::ContainerState::ContainerExited
            } as i32,
            metadata: Some(api::ContainerMetadata {
                name: name.to_owned(),
                attempt: 0,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_collection_waits_the_kubelets_minute_only_while_nothing_changes() {
        let last = Instant::now();
        assert!(due(None, last, true), "the first one at once");
        assert!(!due(Some(last), last + GC_PERIOD / 2, false));
        assert!(
            due(Some(last), last + GC_PERIOD, false),
            "something changed"
        );
        assert!(!due(Some(last), last + GC_PERIOD, true), "nothing changed");
        assert!(!due(Some(last), last + QUIET_GC_PERIOD / 2, true));
        assert!(
            due(Some(last), last + QUIET_GC_PERIOD, true),
            "the kubelet's period"
        );
    }

    #[test]
    fn a_dead_sandbox_replaced_by_a_newer_one_goes_with_its_superseded_containers() {
        let sandboxes = [sandbox("old", 1, false), sandbox("new", 2, true)];
        let containers = [
            container("c0", "old", "app", 1, false),
            container("c1", "new", "app", 2, true),
        ];
        let p = plan(&sandboxes, &containers);
        assert_eq!(p.remove_containers, ["c0"]);
        assert_eq!(p.remove_sandboxes, ["old"]);
        assert!(p.stop_sandboxes.is_empty());
    }

    #[test]
    fn a_finished_pod_under_disk_pressure_loses_every_dead_container_and_sandbox() {
        let sandboxes = [sandbox("s1", 1, false), sandbox("s2", 2, false)];
        let containers = [
            container("init", "s2", "init", 2, false),
            container("app", "s2", "app", 3, false),
            container("old", "s1", "app", 1, false),
        ];
        // The usual plan keeps the newest instances and the newest sandbox.
        let usual = plan(&sandboxes, &containers);
        assert_eq!(usual.remove_containers, ["old"]);
        assert_eq!(usual.remove_sandboxes, ["s1"]);
        let p = plan_finished(&sandboxes, &containers, &Policy::default(), i64::MAX);
        assert_eq!(p.remove_containers, ["init", "app", "old"]);
        assert_eq!(p.remove_sandboxes, ["s1", "s2"]);
        assert!(p.stop_sandboxes.is_empty());
        // Too young for the minimum age: kept, and its sandbox only stopped.
        let policy = Policy {
            min_age: Duration::from_nanos(2),
            ..Policy::default()
        };
        let p = plan_finished(&sandboxes, &containers, &policy, 4);
        assert_eq!(p.remove_containers, ["init", "old"]);
        assert_eq!(p.remove_sandboxes, ["s1"]);
        assert_eq!(p.stop_sandboxes, ["s2"]);
    }

    #[test]
    fn the_newest_sandbox_and_the_newest_instance_of_a_container_stay() {
        // Only sandbox, not ready (the next sync replaces it): untouched.
        let p = plan(
            &[sandbox("only", 1, false)],
            &[container("c", "only", "app", 1, false)],
        );
        assert_eq!(p, Plan::default());
        // A stale sandbox holding the only instance of "init": stopped, not removed.
        let sandboxes = [sandbox("old", 1, false), sandbox("new", 2, false)];
        let containers = [
            container("i0", "old", "init", 1, false),
            container("a0", "old", "app", 1, false),
            container("a1", "new", "app", 3, false),
        ];
        let p = plan(&sandboxes, &containers);
        assert_eq!(p.remove_containers, ["a0"]);
        assert!(p.remove_sandboxes.is_empty());
        assert_eq!(p.stop_sandboxes, ["old"]);
        // A container still running in a stale sandbox is never removed.
        let containers = [
            container("a0", "old", "app", 1, true),
            container("a1", "new", "app", 3, false),
        ];
        let p = plan(&sandboxes, &containers);
        assert!(p.remove_containers.is_empty());
        assert_eq!(p.stop_sandboxes, ["old"]);
        // Created but never started, superseded by a newer instance (the runtime died during
        // its CreateContainer): in a stale sandbox it goes with the sandbox; in the newest one it
        // is the one dead instance kept of its name (as the kubelet's container GC keeps one);
        // the newest instance stays even when it is only created (its start may be under way).
        let mut never_started = container("a0", "new", "app", 1, false);
        never_started.state = api::ContainerState::ContainerCreated as i32;
        let mut starting = container("b1", "new", "side", 4, false);
        starting.state = api::ContainerState::ContainerCreated as i32;
        let mut stale_created = container("i0", "old", "init", 1, false);
        stale_created.state = api::ContainerState::ContainerCreated as i32;
        let containers = [
            never_started,
            container("a1", "new", "app", 3, true),
            stale_created,
            container("i1", "new", "init", 2, false),
            starting,
        ];
        let p = plan(
            &[sandbox("old", 1, false), sandbox("new", 2, true)],
            &containers,
        );
        assert_eq!(p.remove_containers, ["i0"]);
        assert_eq!(p.remove_sandboxes, ["old"]);
        // A ready sandbox that is not the newest is left to the pod's sync.
        let p = plan(&[sandbox("a", 1, true), sandbox("b", 2, true)], &[]);
        assert_eq!(p, Plan::default());
        // Empty stale sandboxes go, however many.
        let sandboxes = [
            sandbox("x", 1, false),
            sandbox("y", 2, false),
            sandbox("z", 3, true),
        ];
        assert_eq!(plan(&sandboxes, &[]).remove_sandboxes, ["x", "y"]);
    }

    #[test]
    fn a_live_sandbox_keeps_one_dead_instance_per_container() {
        let created = |id: &str, name: &str, at: i64| {
            let mut c = container(id, "s", name, at, false);
            c.state = api::ContainerState::ContainerCreated as i32;
            c
        };
        // Two starts failed (created, never started), then one ran: the newest dead one stays.
        let sandboxes = [sandbox("s", 1, true)];
        let containers = [
            created("a0", "app", 1),
            created("a1", "app", 2),
            container("a2", "s", "app", 3, true),
            container("b0", "s", "side", 1, false),
        ];
        let p = plan(&sandboxes, &containers);
        assert_eq!(p.remove_containers, ["a0"]);
        assert!(p.remove_sandboxes.is_empty() && p.stop_sandboxes.is_empty());
        // A crash loop: exited instances beyond the newest go, oldest first.
        let containers = [
            container("c0", "s", "app", 1, false),
            container("c1", "s", "app", 2, false),
            container("c2", "s", "app", 3, false),
        ];
        assert_eq!(
            plan(&sandboxes, &containers).remove_containers,
            ["c0", "c1"]
        );
        // One dead instance beside the running one: nothing to do.
        let containers = [
            container("d0", "s", "app", 1, false),
            container("d1", "s", "app", 2, true),
        ];
        assert_eq!(plan(&sandboxes, &containers), Plan::default());
    }

    #[test]
    fn the_policy_sets_how_many_dead_instances_stay_and_how_young_ones_are_spared() {
        let sandboxes = [sandbox("s", 1, true)];
        let containers = [
            container("c0", "s", "app", 10, false),
            container("c1", "s", "app", 20, false),
            container("c2", "s", "app", 30, false),
            container("c3", "s", "app", 40, false),
        ];
        let policy = |min_age_ns: u64, keep: Option<usize>| Policy {
            min_age: Duration::from_nanos(min_age_ns),
            max_per_container: keep,
            max_containers: None,
        };
        // Two kept: the two oldest go.
        assert_eq!(
            plan_with(&sandboxes, &containers, &policy(0, Some(2)), 100).remove_containers,
            ["c0", "c1"]
        );
        // No limit: nothing goes.
        assert_eq!(
            plan_with(&sandboxes, &containers, &policy(0, None), 100),
            Plan::default()
        );
        // At 45 with a minimum age of 20, only c0 and c1 (created at or before 25) count: of
        // those the newest stays.
        assert_eq!(
            plan_with(&sandboxes, &containers, &policy(20, Some(1)), 45).remove_containers,
            ["c0"]
        );
    }

    #[test]
    fn the_node_cap_evens_out_the_units_then_takes_the_oldest() {
        let unit = |name: &str, times: &[i64]| -> Unit {
            times.iter().map(|t| (*t, format!("{name}{t}"))).collect()
        };
        let mut out = over_node_cap(vec![unit("a", &[1, 2, 3]), unit("b", &[4, 5])], 5);
        assert!(out.is_empty(), "at the cap: {out:?}");
        // Cap 2 over two units: each keeps its newest (a3, b5).
        out = over_node_cap(vec![unit("a", &[1, 2, 3]), unit("b", &[4, 5])], 2);
        out.sort();
        assert_eq!(out, ["a1", "a2", "b4"]);
        // Cap 1 over three units: each keeps one, then the oldest of those go (a3, b5).
        out = over_node_cap(
            vec![unit("a", &[1, 2, 3]), unit("b", &[4, 5]), unit("c", &[6])],
            1,
        );
        out.sort();
        assert_eq!(out, ["a1", "a2", "a3", "b4", "b5"]);
        // Cap 0: everything goes.
        assert_eq!(over_node_cap(vec![unit("a", &[1])], 0), ["a1"]);
    }
}
