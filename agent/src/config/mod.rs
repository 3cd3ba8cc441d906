//! Pod configuration: sources and the merge mux.
//!
//! Sources (the static-pod [`file`] source, later HTTP and the API server) each send
//! [`SourceUpdate`]s on a channel obtained from [`Mux::channel`]. The [`Mux`] merges them with the
//! kubelet's incremental semantics into [`PodUpdate`]s for the
//! sync loop.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::metrics::ConfigErrorLabel;

pub mod api;
pub mod file;
mod fingerprint;
pub mod http;
pub mod manifest;
mod mux;
pub mod packed;

pub use fingerprint::Fingerprints;
pub use mux::{Mux, SourcesReady};
pub use packed::{PackError, PodRef};

/// Source name of static pods read from files.
pub const FILE: &str = crate::pod::annotations::FILE_SOURCE;
/// Source name of static pods fetched from a URL.
pub const HTTP: &str = crate::pod::annotations::HTTP_SOURCE;
/// Source name of pods from the API server.
pub const API: &str = crate::pod::annotations::API_SOURCE;

/// Annotation naming the source a pod came from (stamped by the mux).
pub const CONFIG_SOURCE_ANNOTATION: &str = crate::pod::annotations::CONFIG_SOURCE;
/// Annotation holding when the mux first saw a pod's UID (RFC 3339 with nanoseconds).
pub const CONFIG_SEEN_ANNOTATION: &str = crate::pod::annotations::CONFIG_SEEN;
/// Annotation on mirror pods.
pub const CONFIG_MIRROR_ANNOTATION: &str = crate::pod::annotations::CONFIG_MIRROR;
/// Annotation holding a static pod's hash (its UID).
pub const CONFIG_HASH_ANNOTATION: &str = crate::pod::annotations::CONFIG_HASH;

/// The annotations the node adds locally; ignored when comparing pods.
pub const LOCAL_ANNOTATIONS: [&str; 3] = [
    CONFIG_SOURCE_ANNOTATION,
    CONFIG_MIRROR_ANNOTATION,
    CONFIG_SEEN_ANNOTATION,
];

/// Runs `work` on `state` on one of tokio's blocking threads (directory walks, file reads, large
/// parses) and hands the state back with the result; `None` (logged, naming `what`) if the
/// work panicked, which ends the source.
pub(crate) async fn off_thread<S: Send + 'static, R: Send + 'static>(
    mut state: S,
    what: &'static str,
    work: impl FnOnce(&mut S) -> R + Send + 'static,
) -> Option<(S, R)> {
    let ran = tokio::task::spawn_blocking(move || {
        let r = work(&mut state);
        (state, r)
    })
    .await;
    match ran {
        Ok(done) => Some(done),
        Err(e) => {
            tracing::error!(error = %e, source = what, "a pod source stopped");
            None
        }
    }
}

/// Sends `update` to the mux unless `cancel` fires first; false when the source should stop
/// (cancelled, or the mux is gone).
pub(crate) async fn send(
    tx: &tokio::sync::mpsc::Sender<SourceUpdate>,
    update: SourceUpdate,
    cancel: &tokio_util::sync::CancellationToken,
) -> bool {
    tokio::select! {
        biased;
        _ = cancel.cancelled() => false,
        sent = tx.send(update) => {
            if sent.is_err() {
                tracing::debug!("config mux gone; pod source stops");
            }
            sent.is_ok()
        }
    }
}

/// Counts rejected configuration for one source in `swiftlet_config_errors_total{source,reason}`.
/// Cheap to clone; clones share the counts.
#[derive(Clone, Debug)]
pub struct ErrorCounter {
    family: Family<ConfigErrorLabel, Counter>,
    source: &'static str,
    total: Counter,
}

impl ErrorCounter {
    /// Counts into `family` under `source`.
    pub fn new(family: Family<ConfigErrorLabel, Counter>, source: &'static str) -> Self {
        ErrorCounter {
            family,
            source,
            total: Counter::default(),
        }
    }

    /// A counter not exported anywhere (tests, benches).
    pub fn detached(source: &'static str) -> Self {
        Self::new(Family::default(), source)
    }

    /// Counts one error with `reason`.
    pub fn inc(&self, reason: &'static str) {
        self.family
            .get_or_create(&ConfigErrorLabel {
                source: self.source,
                reason,
            })
            .inc();
        self.total.inc();
    }

    /// How many errors this handle (and its clones) counted, over all reasons.
    pub fn total(&self) -> u64 {
        self.total.get()
    }

    /// How many errors with `reason` were counted for this source.
    pub fn get(&self, reason: &'static str) -> u64 {
        self.family
            .get_or_create(&ConfigErrorLabel {
                source: self.source,
                reason,
            })
            .get()
    }
}

/// A pod as a source hands it to the mux: shared, with its fingerprints and full-name key computed
/// once when the source ingested it, so merging an unchanged pod costs a fingerprint comparison
/// and one map lookup, never a walk over the pod. A source that keeps no reference to the pods it
/// sends lets the mux keep them without a copy. Whole, or packed ([`packed`]) by a source that
/// can be handed many pods at once (the manifest URL).
#[derive(Debug, Clone)]
pub struct StoredPod {
    pod: PodRef,
    fp: Fingerprints,
    /// Hash of (name, namespace), for the cheap duplicate-name pre-check.
    name_key: u64,
    /// Hash of the UID, so the mux looks the pod up without hashing its UID again.
    uid_hash: u64,
}

impl StoredPod {
    /// Takes ownership of `pod` and fingerprints it.
    pub fn new(pod: Pod) -> Self {
        let (fp, name_key, uid_hash) = Self::keys(&pod);
        StoredPod {
            pod: pod.into(),
            fp,
            name_key,
            uid_hash,
        }
    }

    /// Fingerprints `pod` and keeps it packed.
    pub fn packed(pod: Pod) -> Result<Self, PackError> {
        let (fp, name_key, uid_hash) = Self::keys(&pod);
        Ok(StoredPod {
            pod: PodRef::packed(pod)?,
            fp,
            name_key,
            uid_hash,
        })
    }

    fn keys(pod: &Pod) -> (Fingerprints, u64, u64) {
        let fp = fingerprint::of_pod(pod);
        let name_key = fingerprint::name_key(pod);
        let uid_hash = fingerprint::uid_hash(pod.metadata.uid.as_deref().unwrap_or_default());
        (fp, name_key, uid_hash)
    }

    /// This pod to send on, and this one kept packed from now on: a source that keeps its pods
    /// to send them again sends the only whole copy, which the mux then stamps in place instead
    /// of copying it (a static pod of megabytes of env vars would otherwise exist twice). An
    /// unchanged pod sent again costs the mux a fingerprint comparison, never a decode. A pod
    /// already packed, or one that cannot be (an agent fault, logged), is shared as before.
    pub fn hand_over(&mut self) -> StoredPod {
        if let PodRef::Whole(pod) = &self.pod {
            match packed::Packed::copy_of(pod) {
                Ok(copy) => {
                    let whole = std::mem::replace(&mut self.pod, PodRef::Packed(Arc::new(copy)));
                    return StoredPod {
                        pod: whole,
                        ..*self
                    };
                }
                Err(error) => tracing::error!(%error, "keeping a pod packed"),
            }
        }
        self.clone()
    }

    /// The shared pod.
    pub fn pod(&self) -> &PodRef {
        &self.pod
    }

    /// The shared pod, taken over.
    pub fn into_ref(self) -> PodRef {
        self.pod
    }

    /// The pod's metadata.
    pub fn metadata(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        self.pod.metadata()
    }

    /// The fingerprints computed at ingestion.
    pub fn fingerprints(&self) -> Fingerprints {
        self.fp
    }

    pub(crate) fn name_key(&self) -> u64 {
        self.name_key
    }

    /// The UID (empty if unset).
    pub fn uid(&self) -> &str {
        self.pod.uid()
    }
}

impl From<Pod> for StoredPod {
    fn from(pod: Pod) -> Self {
        StoredPod::new(pod)
    }
}

/// What a source sends to the mux. Only `Set` (the source's full state) and `Remove` are taken at
/// face value: `Add`, `Update` and `Delete` are all handled alike, the pod's content deciding the
/// outcome (kubelet trap: the op a source sends is not trusted).
#[derive(Debug, Clone)]
pub enum SourceUpdate {
    Set(Vec<StoredPod>),
    Add(Vec<StoredPod>),
    Update(Vec<StoredPod>),
    Remove(Vec<StoredPod>),
    Delete(Vec<StoredPod>),
}

/// The operation of a merged update sent to the sync loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// Pods new to the node (or, empty, a source reporting for the first time).
    Add,
    /// Pods whose spec, labels or non-local annotations changed.
    Update,
    /// Pods given a deletion timestamp (graceful deletion).
    Delete,
    /// Pods gone from their source.
    Remove,
    /// Pods whose status alone changed.
    Reconcile,
}

/// One merged update: an op over pods from one source.
#[derive(Debug, Clone)]
pub struct PodUpdate {
    pub op: Op,
    pub pods: Vec<PodRef>,
    pub source: &'static str,
}

/// A minimal valid manifest (one container `c`), for tests.
#[cfg(test)]
pub(crate) fn test_manifest(name: &str, image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n  - name: c\n    image: {image}\n"
    )
}

/// The sorted names of `pods`, for tests.
#[cfg(test)]
pub(crate) fn test_names(pods: &[StoredPod]) -> Vec<String> {
    let mut v: Vec<String> = pods
        .iter()
        .map(|p| p.metadata().name.clone().unwrap_or_default())
        .collect();
    v.sort();
    v
}
