//! The sync loop: one task that owns the desired pods and hands work to pod workers
//! (kubelet-behaviour.md §1.3). It selects over config updates, PLEG events, finished workers and
//! 2 s housekeeping.
use crate::config::{Op, PodUpdate, SourcesReady};
use crate::pleg::RuntimePods;
use crate::pod_workers::{PodWorkers, UpdateType, Work};
use crate::status::StatusManager;
use k8s_openapi::api::core::v1::Pod;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const HOUSEKEEPING: Duration = Duration::from_secs(2);
/// Grace period for runtime pods no source knows (the kubelet uses 1 s).
const ORPHAN_GRACE: i64 = 1;

pub struct SyncLoop {
    pub config_rx: mpsc::Receiver<PodUpdate>,
    pub sources_ready: SourcesReady,
    pub pleg_rx: mpsc::Receiver<String>,
    pub done_rx: mpsc::UnboundedReceiver<String>,
    pub runtime_pods: RuntimePods,
    pub workers: PodWorkers,
    pub status: StatusManager,
    pub metrics: crate::metrics::Metrics,
    pub tracer: crate::trace::Tracer,
}

fn uid_of(pod: &Pod) -> Option<String> {
    pod.metadata.uid.clone().filter(|u| !u.is_empty())
}

fn work(kind: UpdateType, pod: Arc<Pod>, grace: Option<i64>) -> Work {
    Work {
        kind,
        pod,
        grace,
        received: Instant::now(),
    }
}

impl SyncLoop {
    pub async fn run(mut self, cancel: CancellationToken) {
        let mut pods: HashMap<String, Arc<Pod>> = HashMap::new();
        let mut housekeeping = tokio::time::interval(HOUSEKEEPING);
        housekeeping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                update = self.config_rx.recv() => match update {
                    Some(u) => self.handle_config(&mut pods, u),
                    None => return,
                },
                Some(uid) = self.pleg_rx.recv() => {
                    if let Some(pod) = pods.get(&uid) {
                        self.workers.update_pod(&uid, work(UpdateType::Sync, pod.clone(), None));
                    }
                }
                Some(uid) = self.done_rx.recv() => {
                    self.workers.remove(&uid);
                    match pods.get(&uid) {
                        // Wanted again while it was terminating: start it anew.
                        Some(pod) => self.workers.update_pod(&uid, work(UpdateType::Create, pod.clone(), None)),
                        None => self.status.remove_pod(&uid),
                    }
                }
                _ = housekeeping.tick() => self.housekeeping(&pods),
            }
            self.metrics
                .running_pods
                .set(self.status.running_count() as i64);
        }
    }

    fn handle_config(&mut self, pods: &mut HashMap<String, Arc<Pod>>, u: PodUpdate) {
        tracing::debug!(op = ?u.op, source = u.source, n = u.pods.len(), "config update");
        let mut list = u.pods;
        match u.op {
            Op::Add => {
                list.sort_by(|a, b| {
                    a.metadata
                        .creation_timestamp
                        .as_ref()
                        .map(|t| t.0)
                        .cmp(&b.metadata.creation_timestamp.as_ref().map(|t| t.0))
                });
                for pod in list {
                    let Some(uid) = uid_of(&pod) else { continue };
                    pods.insert(uid.clone(), pod.clone());
                    self.status.set_pod(&uid, pod.clone());
                    self.tracer.pod_admitted(&uid, &pod);
                    self.workers
                        .update_pod(&uid, work(UpdateType::Create, pod, None));
                }
            }
            Op::Update | Op::Delete => {
                for pod in list {
                    let Some(uid) = uid_of(&pod) else { continue };
                    pods.insert(uid.clone(), pod.clone());
                    self.status.set_pod(&uid, pod.clone());
                    if pod.metadata.deletion_timestamp.is_some() {
                        let grace = pod.metadata.deletion_grace_period_seconds;
                        self.workers
                            .update_pod(&uid, work(UpdateType::Kill, pod, grace));
                    } else {
                        self.workers
                            .update_pod(&uid, work(UpdateType::Update, pod, None));
                    }
                }
            }
            Op::Remove => {
                for pod in list {
                    let Some(uid) = uid_of(&pod) else { continue };
                    pods.remove(&uid);
                    if !self.sources_ready.all_ready() {
                        // Housekeeping kills it once every source has reported (§4 trap 2).
                        continue;
                    }
                    self.workers
                        .update_pod(&uid, work(UpdateType::Kill, pod, None));
                }
            }
            Op::Reconcile => {
                for pod in list {
                    if let Some(uid) = uid_of(&pod) {
                        pods.insert(uid.clone(), pod.clone());
                        self.status.set_pod(&uid, pod);
                    }
                }
            }
        }
    }

    /// Kills runtime pods that no source knows and no worker owns, once all sources are seen.
    fn housekeeping(&mut self, pods: &HashMap<String, Arc<Pod>>) {
        if !self.sources_ready.all_ready() {
            return;
        }
        let orphans: Vec<String> = match self.runtime_pods.read() {
            Ok(r) => r
                .iter()
                .filter(|uid| !pods.contains_key(*uid) && !self.workers.is_known(uid))
                .cloned()
                .collect(),
            Err(_) => return,
        };
        for uid in orphans {
            tracing::info!(uid = %uid, "killing runtime pod that no source knows");
            let mut pod = Pod::default();
            pod.metadata.uid = Some(uid.clone());
            pod.metadata.name = Some(format!("orphan-{uid}"));
            self.workers.update_pod(
                &uid,
                work(UpdateType::Kill, Arc::new(pod), Some(ORPHAN_GRACE)),
            );
        }
    }
}
