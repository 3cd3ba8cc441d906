//! Pod workers: one task per pod UID, each with a single pending slot (kubelet-behaviour.md §1.4).
//!
//! * The newest update replaces the pending one (coalescing): a burst of edits costs one sync.
//! * A kill is never overwritten by a later non-kill update; of two kills the shorter grace period
//!   wins (never below 1 s).
//! * A kill cancels a sync in progress.
//! * Once a worker has started terminating, it finishes; the sync loop restarts the pod afterwards if
//!   it is still wanted.
//!
//! The worker is the only place that changes a pod's runtime state.
use crate::runtime::{self, Manager};
use crate::status::StatusManager;
use k8s_openapi::api::core::v1::Pod;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
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

#[derive(Debug, Clone)]
pub struct Work {
    pub kind: UpdateType,
    pub pod: Arc<Pod>,
    /// Kill only: grace period override in seconds.
    pub grace: Option<i64>,
    pub received: Instant,
}

/// Minimum grace period a pod worker applies to a kill.
const MIN_GRACE: i64 = 1;
/// Periodic resync of a healthy pod (the kubelet's syncFrequency).
const RESYNC: Duration = Duration::from_secs(60);
/// Retry delay after a failed sync.
const ERROR_BACKOFF: Duration = Duration::from_secs(2);

/// Puts `new` into the pending slot with the kill-priority rules.
pub fn coalesce(pending: &mut Option<Work>, new: Work) {
    match pending {
        Some(p) if p.kind == UpdateType::Kill && new.kind != UpdateType::Kill => {}
        Some(p) if p.kind == UpdateType::Kill => {
            p.grace = match (p.grace, new.grace) {
                (Some(a), Some(b)) => Some(a.min(b).max(MIN_GRACE)),
                (a, b) => a.or(b).map(|g| g.max(MIN_GRACE)),
            };
        }
        _ => *pending = Some(new),
    }
}

struct Slot {
    pending: Mutex<Option<Work>>,
    notify: Notify,
    sync_cancel: Mutex<CancellationToken>,
    terminating: AtomicBool,
}

/// Everything a worker needs.
#[derive(Clone)]
pub struct WorkerContext {
    pub runtime: Manager,
    pub status: StatusManager,
    pub metrics: crate::metrics::Metrics,
    pub tracer: crate::trace::Tracer,
}

pub struct PodWorkers {
    workers: HashMap<String, Arc<Slot>>,
    ctx: WorkerContext,
    done_tx: mpsc::UnboundedSender<String>,
    tracker: TaskTracker,
    cancel: CancellationToken,
}

impl PodWorkers {
    /// `done_tx` receives the UID of each worker that finished terminating its pod.
    pub fn new(
        ctx: WorkerContext,
        done_tx: mpsc::UnboundedSender<String>,
        tracker: TaskTracker,
        cancel: CancellationToken,
    ) -> Self {
        Self {
            workers: HashMap::new(),
            ctx,
            done_tx,
            tracker,
            cancel,
        }
    }

    pub fn is_known(&self, uid: &str) -> bool {
        self.workers.contains_key(uid)
    }

    pub fn is_terminating(&self, uid: &str) -> bool {
        self.workers
            .get(uid)
            .is_some_and(|s| s.terminating.load(Ordering::Acquire))
    }

    pub fn len(&self) -> usize {
        self.workers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// Hands an update to the pod's worker, starting one if needed.
    pub fn update_pod(&mut self, uid: &str, work: Work) {
        if let Some(slot) = self.workers.get(uid) {
            if slot.terminating.load(Ordering::Acquire) {
                // Terminating workers finish; the sync loop restarts the pod afterwards.
                return;
            }
            let is_kill = work.kind == UpdateType::Kill;
            if let Ok(mut p) = slot.pending.lock() {
                coalesce(&mut p, work);
            }
            if is_kill && let Ok(t) = slot.sync_cancel.lock() {
                t.cancel();
            }
            slot.notify.notify_one();
            return;
        }
        let slot = Arc::new(Slot {
            pending: Mutex::new(Some(work)),
            notify: Notify::new(),
            sync_cancel: Mutex::new(CancellationToken::new()),
            terminating: AtomicBool::new(false),
        });
        self.workers.insert(uid.to_owned(), slot.clone());
        let worker = Worker {
            uid: uid.to_owned(),
            slot,
            ctx: self.ctx.clone(),
            done_tx: self.done_tx.clone(),
            cancel: self.cancel.clone(),
        };
        self.tracker.spawn(worker.run());
    }

    /// Forgets a finished worker.
    pub fn remove(&mut self, uid: &str) {
        self.workers.remove(uid);
    }
}

struct Worker {
    uid: String,
    slot: Arc<Slot>,
    ctx: WorkerContext,
    done_tx: mpsc::UnboundedSender<String>,
    cancel: CancellationToken,
}

impl Worker {
    fn take(&self) -> Option<Work> {
        self.slot.pending.lock().ok().and_then(|mut p| p.take())
    }

    async fn run(self) {
        let mut last_pod: Option<Arc<Pod>> = None;
        let mut next_resync = tokio::time::Instant::now() + RESYNC;
        loop {
            let work = match self.take() {
                Some(w) => w,
                None => {
                    tokio::select! {
                        _ = self.cancel.cancelled() => return,
                        _ = self.slot.notify.notified() => continue,
                        _ = tokio::time::sleep_until(next_resync) => match &last_pod {
                            Some(pod) => Work { kind: UpdateType::Sync, pod: pod.clone(), grace: None, received: Instant::now() },
                            None => { next_resync += RESYNC; continue }
                        },
                    }
                }
            };
            let started = Instant::now();
            if work.kind != UpdateType::Kill {
                // Only the first one counts.
                self.ctx.tracer.worker_started(&self.uid);
            }
            if work.kind == UpdateType::Kill {
                self.slot.terminating.store(true, Ordering::Release);
                self.terminate(&work).await;
                self.observe(&work, started);
                let _ = self.done_tx.send(self.uid.clone());
                return;
            }
            let token = self.cancel.child_token();
            if let Ok(mut t) = self.slot.sync_cancel.lock() {
                *t = token.clone();
            }
            let delay = tokio::select! {
                _ = token.cancelled() => continue,
                d = self.sync(&work.pod) => d,
            };
            self.observe(&work, started);
            last_pod = Some(work.pod);
            next_resync = tokio::time::Instant::now() + delay;
        }
    }

    fn observe(&self, work: &Work, _started: Instant) {
        self.ctx
            .metrics
            .pod_worker_duration_seconds
            .get_or_create(&crate::metrics::OperationLabel {
                operation: work.kind.as_str(),
            })
            .observe(work.received.elapsed().as_secs_f64());
    }

    /// One sync: runtime actions, then a fresh status. Returns when to sync again unprompted.
    async fn sync(&self, pod: &Pod) -> Duration {
        let name = runtime::full_name(pod);
        let (waiting, delay) = match self.ctx.runtime.sync_pod(pod).await {
            Ok(outcome) => (outcome.waiting, outcome.requeue_after.unwrap_or(RESYNC)),
            Err(e) => {
                tracing::warn!(pod = %name, error = %e, "sync failed");
                let reason = (e.reason().to_owned(), e.to_string());
                let waiting = pod
                    .spec
                    .iter()
                    .flat_map(|s| &s.containers)
                    .map(|c| (c.name.clone(), reason.clone()))
                    .collect();
                (waiting, ERROR_BACKOFF)
            }
        };
        match self.ctx.runtime.pod_state(&self.uid).await {
            Ok(state) => {
                if self.ctx.status.update(&self.uid, &state, &waiting) {
                    self.ctx.tracer.running_observed(&self.uid);
                }
            }
            Err(e) => tracing::warn!(pod = %name, error = %e, "reading pod state"),
        }
        delay
    }

    /// Stops the pod, retrying until it is gone or the agent shuts down.
    async fn terminate(&self, work: &Work) {
        let name = runtime::full_name(&work.pod);
        let grace = work
            .grace
            .unwrap_or_else(|| runtime::grace_period_secs(&work.pod))
            .max(MIN_GRACE);
        let mut backoff = Duration::from_millis(100);
        loop {
            match self.ctx.runtime.kill_pod(&name, &self.uid, grace).await {
                Ok(()) => {
                    tracing::info!(pod = %name, grace, "pod terminated");
                    return;
                }
                Err(e) => tracing::warn!(pod = %name, error = %e, "terminating pod; retrying"),
            }
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn work(kind: UpdateType, grace: Option<i64>, name: &str) -> Work {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        Work {
            kind,
            pod: Arc::new(pod),
            grace,
            received: Instant::now(),
        }
    }

    fn name(w: &Option<Work>) -> Option<&str> {
        w.as_ref().and_then(|w| w.pod.metadata.name.as_deref())
    }

    #[test]
    fn newest_update_wins() {
        let mut p = None;
        coalesce(&mut p, work(UpdateType::Create, None, "a"));
        coalesce(&mut p, work(UpdateType::Update, None, "b"));
        coalesce(&mut p, work(UpdateType::Sync, None, "c"));
        assert_eq!(name(&p), Some("c"));
    }

    #[test]
    fn kill_is_never_overwritten_and_grace_only_shrinks() {
        let mut p = None;
        coalesce(&mut p, work(UpdateType::Create, None, "a"));
        coalesce(&mut p, work(UpdateType::Kill, Some(30), "k"));
        coalesce(&mut p, work(UpdateType::Update, None, "b"));
        assert_eq!(p.as_ref().map(|w| w.kind), Some(UpdateType::Kill));
        coalesce(&mut p, work(UpdateType::Kill, Some(5), "k2"));
        assert_eq!(p.as_ref().and_then(|w| w.grace), Some(5));
        coalesce(&mut p, work(UpdateType::Kill, Some(20), "k3"));
        assert_eq!(p.as_ref().and_then(|w| w.grace), Some(5));
        coalesce(&mut p, work(UpdateType::Kill, Some(0), "k4"));
        assert_eq!(p.as_ref().and_then(|w| w.grace), Some(MIN_GRACE));
    }
}
