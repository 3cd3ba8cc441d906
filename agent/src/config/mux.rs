//! The config mux: merges every source's updates into one ordered stream of [`PodUpdate`]s.
//!
//! Implements the kubelet's `podStorage.merge` in incremental mode (the only mode the kubelet
//! uses): per-source storage keyed by UID, the op a source sends re-derived from content, REMOVE
//! only from a REMOVE or a UID missing from a SET, output in the order REMOVE, ADD, UPDATE, DELETE,
//! (empty ADD on a source's first SET with nothing else), RECONCILE.
//!
//! Comparisons use two fingerprints per pod computed once when a source ingests the pod (a 128-bit
//! XXH3 over the serialized semantically relevant fields, and one over the status, carried in a
//! [`StoredPod`]) instead of deep comparisons: an unchanged pod costs a fingerprint comparison and
//! one map lookup.
//!
//! Memory: the mux holds one copy of each pod, the stored one, shared (`Arc`) with the sync loop,
//! the status manager and the pod workers. A new or changed pod becomes the stored one in place
//! when the source kept no reference to it (the HTTP source keeps none); a source that keeps its
//! pods (file, API) costs a second copy, the stamped one. A pod the source packed
//! ([`super::packed`]) is kept and handed on packed: stamping changes only its metadata, and
//! only an update or a status change of it decodes it.

use std::collections::{BTreeSet, HashMap, HashSet};

use hashbrown::HashTable;
use std::future::poll_fn;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use xxhash_rust::xxh3::Xxh3DefaultBuilder;

use super::{
    CONFIG_MIRROR_ANNOTATION, CONFIG_SEEN_ANNOTATION, CONFIG_SOURCE_ANNOTATION, Fingerprints, Op,
    PodRef, PodUpdate, SourceUpdate, StoredPod,
};

/// Capacity of the outbound channel, like the kubelet's.
const OUT_BUFFER: usize = 50;
/// Capacity of each source's inbound channel.
const IN_BUFFER: usize = 50;

/// Merges pod updates from registered sources. See the module docs.
pub struct Mux {
    inputs: Vec<(&'static str, mpsc::Receiver<SourceUpdate>)>,
    storage: HashMap<&'static str, SourceState>,
    ready: SourcesReady,
    generation: u64,
}

#[derive(Default)]
struct SourceState {
    /// Keyed by UID, filed under the UID hash computed at ingestion ([`StoredPod`]).
    pods: HashTable<Entry>,
    sent_set: bool,
}

struct Entry {
    uid: String,
    uid_hash: u64,
    /// The stored pod (local annotations stamped), shared with the sync loop.
    pod: PodRef,
    /// The fingerprints of the pod as the source last sent it.
    fp: Fingerprints,
    /// The SET generation that last saw this UID.
    generation: u64,
}

/// Tells whether every registered source has sent at least one SET (kubelet trap: an ADD alone
/// does not make a source seen). Cheap to clone; shared with the merge task.
#[derive(Clone, Debug, Default)]
pub struct SourcesReady {
    inner: Arc<Mutex<ReadyState>>,
}

#[derive(Debug, Default)]
struct ReadyState {
    registered: BTreeSet<&'static str>,
    seen: BTreeSet<&'static str>,
}

impl SourcesReady {
    /// True when every registered source has sent a SET (vacuously true with none registered).
    pub fn all_ready(&self) -> bool {
        let s = self.lock();
        s.registered.is_subset(&s.seen)
    }

    /// True when `source` has sent a SET.
    pub fn seen(&self, source: &str) -> bool {
        self.lock().seen.contains(source)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ReadyState> {
        // The state is two sets updated by single inserts: a poisoned lock still holds valid data.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[derive(Default)]
struct Outputs {
    adds: Vec<PodRef>,
    updates: Vec<PodRef>,
    deletes: Vec<PodRef>,
    removes: Vec<PodRef>,
    reconciles: Vec<PodRef>,
}

impl Default for Mux {
    fn default() -> Self {
        Self::new()
    }
}

impl Mux {
    pub fn new() -> Self {
        Mux {
            inputs: Vec::new(),
            storage: HashMap::new(),
            ready: SourcesReady::default(),
            generation: 0,
        }
    }

    /// Registers `source`; returns the sender the source task writes to.
    pub fn channel(&mut self, source: &'static str) -> mpsc::Sender<SourceUpdate> {
        let (tx, rx) = mpsc::channel(IN_BUFFER);
        self.register(source);
        self.inputs.push((source, rx));
        tx
    }

    /// Registers `source` without a channel (for driving [`Mux::merge`] directly).
    pub fn register(&mut self, source: &'static str) {
        self.ready.lock().registered.insert(source);
        self.storage.entry(source).or_default();
    }

    /// The readiness handle (also returned by [`Mux::run`]).
    pub fn sources_ready(&self) -> SourcesReady {
        self.ready.clone()
    }

    /// Spawns the merge task; returns the outbound channel (buffer 50) and a handle to ask whether
    /// all registered sources are seen (have sent a SET). The task ends on `cancel`, when the
    /// receiver is dropped, or when every source's sender is dropped.
    pub fn run(self, cancel: CancellationToken) -> (mpsc::Receiver<PodUpdate>, SourcesReady) {
        let (tx, rx) = mpsc::channel(OUT_BUFFER);
        let ready = self.ready.clone();
        tokio::spawn(self.merge_loop(tx, cancel));
        (rx, ready)
    }

    async fn merge_loop(mut self, tx: mpsc::Sender<PodUpdate>, cancel: CancellationToken) {
        let mut inputs: Vec<Option<(&'static str, mpsc::Receiver<SourceUpdate>)>> =
            std::mem::take(&mut self.inputs)
                .into_iter()
                .map(Some)
                .collect();
        let mut start = 0;
        loop {
            let next = tokio::select! {
                biased;
                _ = cancel.cancelled() => return,
                next = poll_fn(|cx| poll_inputs(&mut inputs, &mut start, cx)) => next,
            };
            let Some((source, update)) = next else {
                tracing::debug!("every pod source closed its channel; config mux stops");
                return;
            };
            let (outs, set) = self.merge_unmarked(source, update);
            for out in outs {
                tokio::select! {
                    biased;
                    _ = cancel.cancelled() => return,
                    sent = tx.send(out) => if sent.is_err() { return },
                }
            }
            if set {
                self.ready.lock().seen.insert(source);
            }
        }
    }

    /// Merges one update from `source` into the storage and returns what to tell the sync loop,
    /// in order. Pure apart from reading the clock for `config.seen`; the running mux calls it for
    /// every message, tests and benches call it directly.
    pub fn merge(&mut self, source: &'static str, update: SourceUpdate) -> Vec<PodUpdate> {
        let (out, set) = self.merge_unmarked(source, update);
        if set {
            self.ready.lock().seen.insert(source);
        }
        out
    }

    /// [`Self::merge`] without marking the source seen: true when the update was a SET, which
    /// the caller marks once the updates it made have been handed on (the sync loop must never
    /// find every source ready while a first SET's pods are not yet in its channel).
    fn merge_unmarked(
        &mut self,
        source: &'static str,
        update: SourceUpdate,
    ) -> (Vec<PodUpdate>, bool) {
        let is_set = matches!(update, SourceUpdate::Set(_));
        let Mux {
            storage,
            generation,
            ..
        } = self;
        let state = storage.entry(source).or_default();
        let seen_before = state.sent_set;
        let mut out = Outputs::default();
        match update {
            SourceUpdate::Set(pods) => {
                state.sent_set = true;
                *generation += 1;
                let current = *generation;
                merge_pods(state, source, pods, current, &mut out);
                state.pods.retain(|e| {
                    let keep = e.generation == current;
                    if !keep {
                        out.removes.push(e.pod.clone());
                    }
                    keep
                });
            }
            SourceUpdate::Add(pods) | SourceUpdate::Update(pods) | SourceUpdate::Delete(pods) => {
                merge_pods(state, source, pods, *generation, &mut out);
            }
            SourceUpdate::Remove(pods) => {
                for pod in pods {
                    let uid = pod.uid();
                    if let Ok(e) = state.pods.find_entry(pod.uid_hash, |e| e.uid == uid) {
                        out.removes.push(e.remove().0.pod);
                    }
                }
            }
        }
        let first_set = !seen_before && state.sent_set;

        let mut result = Vec::with_capacity(2);
        let mut emit = |op, pods: Vec<PodRef>| {
            if !pods.is_empty() {
                result.push(PodUpdate { op, pods, source });
            }
        };
        let nothing = out.adds.is_empty() && out.updates.is_empty() && out.deletes.is_empty();
        emit(Op::Remove, out.removes);
        emit(Op::Add, out.adds);
        emit(Op::Update, out.updates);
        emit(Op::Delete, out.deletes);
        if first_set && nothing {
            result.push(PodUpdate {
                op: Op::Add,
                pods: Vec::new(),
                source,
            });
        }
        if !out.reconciles.is_empty() {
            result.push(PodUpdate {
                op: Op::Reconcile,
                pods: out.reconciles,
                source,
            });
        }
        (result, is_set)
    }
}

fn poll_inputs(
    inputs: &mut [Option<(&'static str, mpsc::Receiver<SourceUpdate>)>],
    start: &mut usize,
    cx: &mut Context<'_>,
) -> Poll<Option<(&'static str, SourceUpdate)>> {
    let n = inputs.len();
    let mut open = 0;
    // Start after the source served last, so a busy source cannot starve the others.
    for i in 0..n {
        let idx = (*start + i) % n;
        let Some((source, rx)) = &mut inputs[idx] else {
            continue;
        };
        match rx.poll_recv(cx) {
            Poll::Ready(Some(update)) => {
                *start = idx + 1;
                return Poll::Ready(Some((*source, update)));
            }
            Poll::Ready(None) => inputs[idx] = None,
            Poll::Pending => open += 1,
        }
    }
    if open == 0 {
        Poll::Ready(None)
    } else {
        Poll::Pending
    }
}

/// The per-pod logic shared by SET and ADD/UPDATE/DELETE (kubelet `merge` + `checkAndUpdatePod`).
fn merge_pods(
    state: &mut SourceState,
    source: &'static str,
    pods: Vec<StoredPod>,
    generation: u64,
    out: &mut Outputs,
) {
    let keep = duplicates(&pods, source);
    let mut now: Option<String> = None;
    for (i, incoming) in pods.into_iter().enumerate() {
        if keep.as_ref().is_some_and(|k| !k[i]) {
            continue;
        }
        let uid = incoming.uid();
        let hash = incoming.uid_hash;
        let found = state.pods.find_mut(hash, |e| e.uid == uid);
        match found {
            // The fast path: a pod with equal content.
            Some(e) if e.fp == incoming.fp => {
                e.generation = generation;
            }
            None => {
                let uid = uid.to_owned();
                let fp = incoming.fingerprints();
                let seen = now.get_or_insert_with(timestamp).clone();
                // Stamped in place when the source kept no reference, else on a copy: the
                // source's pod is never changed under it.
                let mut pod = incoming.pod;
                let ann = pod
                    .metadata_mut()
                    .annotations
                    .get_or_insert_with(Default::default);
                ann.insert(CONFIG_SOURCE_ANNOTATION.to_owned(), source.to_owned());
                ann.insert(CONFIG_SEEN_ANNOTATION.to_owned(), seen);
                out.adds.push(pod.clone());
                state.pods.insert_unique(
                    hash,
                    Entry {
                        uid,
                        uid_hash: hash,
                        pod,
                        fp,
                        generation,
                    },
                    |e| e.uid_hash,
                );
            }
            Some(e) => {
                e.generation = generation;
                let fp = incoming.fingerprints();
                let form = incoming.pod.clone();
                let (existing, incoming) = match (e.pod.whole(), incoming.pod.into_pod()) {
                    (Ok(existing), Ok(incoming)) => (existing, incoming),
                    (Err(err), _) | (_, Err(err)) => {
                        // The agent's own encoding failed: keep what is stored, say so.
                        tracing::error!(source, error = %err, "pod update dropped");
                        continue;
                    }
                };
                let changed = if e.fp.semantic == fp.semantic {
                    // Status alone changed: a RECONCILE carrying the new status.
                    let mut pod = Pod::clone(&existing);
                    pod.status = incoming.status;
                    pod
                } else {
                    updated(&existing, incoming, source)
                };
                drop(existing);
                let changed = match form.like(changed) {
                    Ok(changed) => changed,
                    Err(err) => {
                        tracing::error!(source, error = %err, "pod update dropped");
                        continue;
                    }
                };
                if e.fp.semantic == fp.semantic {
                    e.pod = changed;
                    e.fp.status = fp.status;
                    out.reconciles.push(e.pod.clone());
                    continue;
                }
                let deleting = changed.metadata().deletion_timestamp.is_some();
                e.pod = changed;
                e.fp = fp;
                if deleting {
                    out.deletes.push(e.pod.clone());
                } else {
                    out.updates.push(e.pod.clone());
                }
            }
        }
    }
}

/// The stored pod after a semantic change: the existing object with the incoming spec, labels,
/// deletion fields, status and annotations (local annotations kept from the existing pod).
fn updated(existing: &Pod, incoming: Pod, source: &'static str) -> Pod {
    let Pod {
        metadata: m,
        spec,
        status,
    } = incoming;
    let mut annotations = m.annotations.unwrap_or_default();
    annotations.insert(CONFIG_SOURCE_ANNOTATION.to_owned(), source.to_owned());
    let old = existing.metadata.annotations.as_ref();
    for key in [
        CONFIG_SOURCE_ANNOTATION,
        CONFIG_MIRROR_ANNOTATION,
        CONFIG_SEEN_ANNOTATION,
    ] {
        if let Some(v) = old.and_then(|a| a.get(key)) {
            annotations.insert(key.to_owned(), v.clone());
        }
    }
    let e = &existing.metadata;
    Pod {
        metadata: ObjectMeta {
            annotations: Some(annotations),
            labels: m.labels,
            deletion_timestamp: m.deletion_timestamp,
            deletion_grace_period_seconds: m.deletion_grace_period_seconds,
            creation_timestamp: e.creation_timestamp.clone(),
            finalizers: e.finalizers.clone(),
            generate_name: e.generate_name.clone(),
            generation: e.generation,
            managed_fields: e.managed_fields.clone(),
            name: e.name.clone(),
            namespace: e.namespace.clone(),
            owner_references: e.owner_references.clone(),
            resource_version: e.resource_version.clone(),
            self_link: e.self_link.clone(),
            uid: e.uid.clone(),
        },
        spec,
        status,
    }
}

/// `None` when all full names are distinct, else which pods to keep (the first of each full name).
///
/// The common case (no duplicates) is decided on the full-name keys computed at ingestion: sorted,
/// no two equal means no two equal names. Only when keys repeat are the names compared.
fn duplicates(pods: &[StoredPod], source: &str) -> Option<Vec<bool>> {
    if pods.len() < 2 {
        return None;
    }
    let mut keys: Vec<u64> = pods.iter().map(StoredPod::name_key).collect();
    keys.sort_unstable();
    if keys.windows(2).all(|w| w[0] != w[1]) {
        return None;
    }
    let mut names: HashSet<(&str, &str), Xxh3DefaultBuilder> =
        HashSet::with_capacity_and_hasher(pods.len(), Xxh3DefaultBuilder);
    let mut keep: Option<Vec<bool>> = None;
    for (i, pod) in pods.iter().enumerate() {
        let name = pod.metadata().name.as_deref().unwrap_or_default();
        let ns = pod.metadata().namespace.as_deref().unwrap_or_default();
        if !names.insert((name, ns)) {
            tracing::warn!(
                source,
                pod = format!("{name}_{ns}"),
                reason = "FailedValidation",
                "duplicate pod full name in one update; ignoring the later pod"
            );
            keep.get_or_insert_with(|| vec![true; pods.len()])[i] = false;
        }
    }
    keep
}

fn timestamp() -> String {
    format!("{:.9}", jiff::Timestamp::now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::fingerprint::fingerprints;
    use crate::config::{API, FILE, HTTP};
    use k8s_openapi::api::core::v1::{Container, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn pod(uid: &str, name: &str) -> StoredPod {
        raw(uid, name).into()
    }

    fn raw(uid: &str, name: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                uid: Some(uid.to_owned()),
                name: Some(name.to_owned()),
                namespace: Some("default".to_owned()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".to_owned(),
                    image: Some("busybox:1".to_owned()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: None,
        }
    }

    fn with_image(p: StoredPod, image: &str) -> StoredPod {
        let mut p = p.into_ref().into_pod().expect("whole");
        if let Some(s) = p.spec.as_mut() {
            s.containers[0].image = Some(image.to_owned());
        }
        p.into()
    }

    fn with_phase(p: StoredPod, phase: &str) -> StoredPod {
        let mut p = p.into_ref().into_pod().expect("whole");
        p.status.get_or_insert_with(PodStatus::default).phase = Some(phase.to_owned());
        p.into()
    }

    fn ann(p: &PodRef, key: &str) -> Option<String> {
        p.metadata().annotations.as_ref()?.get(key).cloned()
    }

    /// The phase in the pod's status.
    fn phase_of(p: &PodRef) -> Option<String> {
        p.whole().expect("whole").status.as_ref()?.phase.clone()
    }

    /// Where the pod is kept.
    fn ptr(p: &PodRef) -> *const () {
        match p {
            PodRef::Whole(a) => Arc::as_ptr(a).cast(),
            PodRef::Packed(a) => Arc::as_ptr(a).cast(),
        }
    }

    /// (op, uids) of each update.
    fn summary(updates: &[PodUpdate]) -> Vec<(Op, Vec<String>)> {
        updates
            .iter()
            .map(|u| {
                let uids = u.pods.iter().map(|p| p.uid().to_owned()).collect();
                (u.op, uids)
            })
            .collect()
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    fn mux() -> Mux {
        let mut m = Mux::new();
        m.register(FILE);
        m
    }

    #[test]
    fn first_set_adds_pods_and_stamps_annotations() {
        let mut m = mux();
        let out = m.merge(FILE, SourceUpdate::Set(vec![pod("1", "a"), pod("2", "b")]));
        assert_eq!(summary(&out), vec![(Op::Add, s(&["1", "2"]))]);
        assert!(out.iter().all(|u| u.source == FILE));
        let p = &out[0].pods[0];
        assert_eq!(ann(p, CONFIG_SOURCE_ANNOTATION).as_deref(), Some("file"));
        let seen = ann(p, CONFIG_SEEN_ANNOTATION).expect("seen stamped");
        let parsed: jiff::Timestamp = seen.parse().expect("rfc3339");
        assert!(seen.contains('.'), "nanoseconds in {seen}");
        assert!(parsed.as_second() > 0);
        assert_eq!(
            seen.split(['.', 'Z']).nth(1).map(str::len),
            Some(9),
            "{seen}"
        );
    }

    #[test]
    fn first_empty_set_sends_empty_add_once() {
        let mut m = mux();
        let out = m.merge(FILE, SourceUpdate::Set(vec![]));
        assert_eq!(summary(&out), vec![(Op::Add, vec![])]);
        assert!(m.merge(FILE, SourceUpdate::Set(vec![])).is_empty());
    }

    #[test]
    fn first_set_with_only_reconcile_or_remove_still_sends_empty_add() {
        let mut m = mux();
        // ADD before the first SET: the source is not seen yet.
        m.merge(FILE, SourceUpdate::Add(vec![pod("1", "a"), pod("2", "b")]));
        let out = m.merge(
            FILE,
            SourceUpdate::Set(vec![with_phase(pod("1", "a"), "Running")]),
        );
        assert_eq!(
            summary(&out),
            vec![
                (Op::Remove, s(&["2"])),
                (Op::Add, vec![]),
                (Op::Reconcile, s(&["1"]))
            ]
        );
    }

    #[test]
    fn unchanged_set_emits_nothing() {
        let mut m = mux();
        m.merge(FILE, SourceUpdate::Set(vec![pod("1", "a")]));
        assert!(
            m.merge(FILE, SourceUpdate::Set(vec![pod("1", "a")]))
                .is_empty()
        );
    }

    #[test]
    fn uid_missing_from_set_is_removed() {
        let mut m = mux();
        m.merge(FILE, SourceUpdate::Set(vec![pod("1", "a"), pod("2", "b")]));
        let out = m.merge(FILE, SourceUpdate::Set(vec![pod("2", "b")]));
        assert_eq!(summary(&out), vec![(Op::Remove, s(&["1"]))]);
        // The removed pod is the stored one (annotations stamped).
        assert_eq!(
            ann(&out[0].pods[0], CONFIG_SOURCE_ANNOTATION).as_deref(),
            Some("file")
        );
        // Gone for good: a new SET with it is an ADD again.
        let out = m.merge(FILE, SourceUpdate::Set(vec![pod("1", "a"), pod("2", "b")]));
        assert_eq!(summary(&out), vec![(Op::Add, s(&["1"]))]);
    }

    #[test]
    fn remove_op_removes_known_and_ignores_unknown() {
        let mut m = mux();
        m.merge(FILE, SourceUpdate::Set(vec![pod("1", "a")]));
        let out = m.merge(
            FILE,
            SourceUpdate::Remove(vec![pod("1", "a"), pod("9", "z")]),
        );
        assert_eq!(summary(&out), vec![(Op::Remove, s(&["1"]))]);
        assert!(
            m.merge(FILE, SourceUpdate::Remove(vec![pod("1", "a")]))
                .is_empty()
        );
    }

    #[test]
    fn op_is_not_trusted() {
        // Trap 1: ADD/UPDATE/DELETE are derived from content per UID.
        let mut m = mux();
        m.merge(FILE, SourceUpdate::Set(vec![pod("1", "a")]));
        // An "UPDATE" of an unknown UID is an ADD.
        let out = m.merge(FILE, SourceUpdate::Update(vec![pod("2", "b")]));
        assert_eq!(summary(&out), vec![(Op::Add, s(&["2"]))]);
        // An "ADD" of a known, changed UID is an UPDATE.
        let out = m.merge(
            FILE,
            SourceUpdate::Add(vec![with_image(pod("1", "a"), "x:2")]),
        );
        assert_eq!(summary(&out), vec![(Op::Update, s(&["1"]))]);
        // A "DELETE" of an unchanged pod produces nothing (and removes nothing).
        assert!(
            m.merge(FILE, SourceUpdate::Delete(vec![pod("2", "b")]))
                .is_empty()
        );
        // Non-SET ops never remove pods missing from them.
        assert!(m.merge(FILE, SourceUpdate::Add(vec![])).is_empty());
        let out = m.merge(
            FILE,
            SourceUpdate::Set(vec![with_image(pod("1", "a"), "x:2"), pod("2", "b")]),
        );
        assert!(out.is_empty(), "{:?}", summary(&out));
    }

    #[test]
    fn spec_change_is_update_keeping_seen() {
        let mut m = mux();
        let first = m.merge(FILE, SourceUpdate::Set(vec![pod("1", "a")]));
        let seen = ann(&first[0].pods[0], CONFIG_SEEN_ANNOTATION);
        let out = m.merge(
            FILE,
            SourceUpdate::Set(vec![with_image(pod("1", "a"), "x:2")]),
        );
        assert_eq!(summary(&out), vec![(Op::Update, s(&["1"]))]);
        let p = &out[0].pods[0];
        assert_eq!(ann(p, CONFIG_SEEN_ANNOTATION), seen);
        assert_eq!(ann(p, CONFIG_SOURCE_ANNOTATION).as_deref(), Some("file"));
        let p = p.whole().expect("whole");
        let image = p.spec.as_ref().and_then(|s| s.containers[0].image.clone());
        assert_eq!(image.as_deref(), Some("x:2"));
    }

    #[test]
    fn label_and_annotation_changes_are_updates() {
        let mut m = mux();
        m.merge(FILE, SourceUpdate::Set(vec![pod("1", "a")]));
        let mut p = raw("1", "a");
        p.metadata.labels = Some([("k".to_owned(), "v".to_owned())].into());
        let out = m.merge(FILE, SourceUpdate::Set(vec![p.clone().into()]));
        assert_eq!(summary(&out), vec![(Op::Update, s(&["1"]))]);
        p.metadata.annotations = Some([("team".to_owned(), "x".to_owned())].into());
        let out = m.merge(FILE, SourceUpdate::Set(vec![p.into()]));
        assert_eq!(summary(&out), vec![(Op::Update, s(&["1"]))]);
    }

    #[test]
    fn local_annotations_ignored_in_comparison() {
        let mut m = mux();
        let first = m.merge(FILE, SourceUpdate::Set(vec![pod("1", "a")]));
        let seen = ann(&first[0].pods[0], CONFIG_SEEN_ANNOTATION);
        let mut p = raw("1", "a");
        p.metadata.annotations = Some(
            [
                (CONFIG_SOURCE_ANNOTATION.to_owned(), "http".to_owned()),
                (CONFIG_SEEN_ANNOTATION.to_owned(), "yesterday".to_owned()),
                (CONFIG_MIRROR_ANNOTATION.to_owned(), "m".to_owned()),
            ]
            .into(),
        );
        assert!(
            m.merge(FILE, SourceUpdate::Set(vec![p.clone().into()]))
                .is_empty()
        );
        // When an update happens, the stored local values win and the source is re-stamped.
        let p = with_image(p.into(), "x:3");
        let out = m.merge(FILE, SourceUpdate::Set(vec![p]));
        let stored = &out[0].pods[0];
        assert_eq!(ann(stored, CONFIG_SEEN_ANNOTATION), seen);
        assert_eq!(
            ann(stored, CONFIG_SOURCE_ANNOTATION).as_deref(),
            Some("file")
        );
        // No stored mirror value: the incoming one is kept, as in the kubelet.
        assert_eq!(ann(stored, CONFIG_MIRROR_ANNOTATION).as_deref(), Some("m"));
    }

    #[test]
    fn status_only_change_is_reconcile() {
        let mut m = mux();
        m.merge(FILE, SourceUpdate::Set(vec![pod("1", "a")]));
        let out = m.merge(
            FILE,
            SourceUpdate::Set(vec![with_phase(pod("1", "a"), "Running")]),
        );
        assert_eq!(summary(&out), vec![(Op::Reconcile, s(&["1"]))]);
        let phase = phase_of(&out[0].pods[0]);
        assert_eq!(phase.as_deref(), Some("Running"));
        assert!(ann(&out[0].pods[0], CONFIG_SEEN_ANNOTATION).is_some());
        // Same status again: nothing.
        let again = m.merge(
            FILE,
            SourceUpdate::Set(vec![with_phase(pod("1", "a"), "Running")]),
        );
        assert!(again.is_empty());
        // Spec and status change together: UPDATE (carrying the status), no RECONCILE.
        let both = with_phase(with_image(pod("1", "a"), "x:9"), "Failed");
        let out = m.merge(FILE, SourceUpdate::Set(vec![both]));
        assert_eq!(summary(&out), vec![(Op::Update, s(&["1"]))]);
        let phase = phase_of(&out[0].pods[0]);
        assert_eq!(phase.as_deref(), Some("Failed"));
    }

    #[test]
    fn deletion_timestamp_is_delete_not_update() {
        let mut m = mux();
        m.merge(API, SourceUpdate::Set(vec![pod("1", "a")]));
        let mut p = raw("1", "a");
        p.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        p.metadata.deletion_grace_period_seconds = Some(30);
        let out = m.merge(API, SourceUpdate::Update(vec![p.clone().into()]));
        assert_eq!(summary(&out), vec![(Op::Delete, s(&["1"]))]);
        assert_eq!(
            out[0].pods[0].metadata().deletion_grace_period_seconds,
            Some(30)
        );
        // Grace period shortened: another DELETE.
        p.metadata.deletion_grace_period_seconds = Some(0);
        let out = m.merge(API, SourceUpdate::Update(vec![p.into()]));
        assert_eq!(summary(&out), vec![(Op::Delete, s(&["1"]))]);
    }

    #[test]
    fn duplicate_full_names_in_one_message_keep_the_first() {
        let mut m = mux();
        let out = m.merge(
            FILE,
            SourceUpdate::Set(vec![pod("1", "a"), pod("2", "a"), pod("3", "b")]),
        );
        assert_eq!(summary(&out), vec![(Op::Add, s(&["1", "3"]))]);
        // Same name in another namespace is a different full name.
        let mut other = raw("4", "a");
        other.metadata.namespace = Some("kube-system".to_owned());
        let out = m.merge(FILE, SourceUpdate::Add(vec![other.into()]));
        assert_eq!(summary(&out), vec![(Op::Add, s(&["4"]))]);
    }

    #[test]
    fn duplicate_full_names_of_known_pods_are_still_caught() {
        // Two UIDs with one full name, each added alone (no duplicate within either message)...
        let mut m = mux();
        m.merge(FILE, SourceUpdate::Add(vec![pod("1", "a")]));
        m.merge(FILE, SourceUpdate::Add(vec![pod("2", "a")]));
        // ...then re-sent unchanged in one SET: the later one is dropped, so it is removed.
        let (a, b) = (pod("1", "a"), pod("2", "a"));
        let out = m.merge(FILE, SourceUpdate::Set(vec![a.clone(), b.clone()]));
        assert_eq!(
            summary(&out),
            vec![(Op::Remove, s(&["2"])), (Op::Add, vec![])]
        );
        // The same StoredPods again (the pointer fast path): still no second "a".
        let out = m.merge(FILE, SourceUpdate::Set(vec![b, a]));
        assert_eq!(
            summary(&out),
            vec![(Op::Remove, s(&["1"])), (Op::Add, s(&["2"]))]
        );
    }

    #[test]
    fn resent_stored_pod_is_unchanged_and_a_new_version_is_not() {
        let mut m = mux();
        let p = pod("1", "a");
        m.merge(FILE, SourceUpdate::Set(vec![p.clone()]));
        assert!(m.merge(FILE, SourceUpdate::Set(vec![p.clone()])).is_empty());
        let changed = with_image(p, "x:2");
        let out = m.merge(FILE, SourceUpdate::Set(vec![changed.clone()]));
        assert_eq!(summary(&out), vec![(Op::Update, s(&["1"]))]);
        assert!(m.merge(FILE, SourceUpdate::Set(vec![changed])).is_empty());
    }

    #[test]
    fn output_order_remove_add_update_delete_reconcile() {
        let mut m = mux();
        m.merge(
            FILE,
            SourceUpdate::Set(vec![
                pod("u", "u"),
                pod("d", "d"),
                pod("r", "r"),
                pod("gone", "g"),
            ]),
        );
        let mut del = raw("d", "d");
        del.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        let out = m.merge(
            FILE,
            SourceUpdate::Set(vec![
                with_phase(pod("r", "r"), "Running"),
                del.into(),
                with_image(pod("u", "u"), "new"),
                pod("new", "n"),
            ]),
        );
        assert_eq!(
            summary(&out),
            vec![
                (Op::Remove, s(&["gone"])),
                (Op::Add, s(&["new"])),
                (Op::Update, s(&["u"])),
                (Op::Delete, s(&["d"])),
                (Op::Reconcile, s(&["r"])),
            ]
        );
    }

    #[test]
    fn sources_are_independent() {
        let mut m = mux();
        m.register(HTTP);
        m.merge(FILE, SourceUpdate::Set(vec![pod("1", "a")]));
        // The same UID from another source is that source's own ADD, stamped with its name.
        let out = m.merge(HTTP, SourceUpdate::Set(vec![pod("1", "a")]));
        assert_eq!(summary(&out), vec![(Op::Add, s(&["1"]))]);
        assert_eq!(out[0].source, HTTP);
        assert_eq!(
            ann(&out[0].pods[0], CONFIG_SOURCE_ANNOTATION).as_deref(),
            Some("http")
        );
        // An empty SET from http removes only http's pods.
        let out = m.merge(HTTP, SourceUpdate::Set(vec![]));
        assert_eq!(summary(&out), vec![(Op::Remove, s(&["1"]))]);
        assert_eq!(out[0].source, HTTP);
        assert!(
            m.merge(FILE, SourceUpdate::Set(vec![pod("1", "a")]))
                .is_empty()
        );
    }

    #[test]
    fn source_seen_only_after_set() {
        // Trap 2: an ADD alone does not make a source seen.
        let mut m = mux();
        m.register(API);
        let ready = m.sources_ready();
        assert!(!ready.all_ready());
        m.merge(FILE, SourceUpdate::Add(vec![pod("1", "a")]));
        assert!(!ready.seen(FILE));
        m.merge(FILE, SourceUpdate::Set(vec![pod("1", "a")]));
        assert!(ready.seen(FILE));
        assert!(!ready.all_ready(), "api has not sent a SET");
        m.merge(API, SourceUpdate::Update(vec![pod("2", "b")]));
        assert!(!ready.all_ready());
        let out = m.merge(API, SourceUpdate::Set(vec![pod("2", "b")]));
        // First SET, pod already known from the UPDATE: just the empty "source ready" ADD.
        assert_eq!(summary(&out), vec![(Op::Add, vec![])]);
        assert!(ready.all_ready());
        assert!(SourcesReady::default().all_ready());
    }

    #[test]
    fn stored_pods_shared_with_consumers_are_not_mutated() {
        let mut m = mux();
        let first = m.merge(FILE, SourceUpdate::Set(vec![pod("1", "a")]));
        let held = first[0].pods[0].clone();
        m.merge(
            FILE,
            SourceUpdate::Set(vec![with_phase(pod("1", "a"), "Running")]),
        );
        assert_eq!(
            held.whole().expect("whole").status,
            None,
            "consumer's copy unchanged"
        );
    }

    #[test]
    fn a_pod_a_source_hands_over_is_stamped_without_a_copy_and_sent_again_packed() {
        let mut m = mux();
        // The source keeps its pod to send it again: it hands over the whole one and keeps a
        // packed copy.
        let mut kept = pod("1", "a");
        let sent = kept.hand_over();
        let at = ptr(sent.pod());
        assert!(kept.pod().is_packed() && !sent.pod().is_packed());
        assert_eq!(kept.fingerprints(), sent.fingerprints());
        let out = m.merge(FILE, SourceUpdate::Set(vec![sent]));
        assert_eq!(ptr(&out[0].pods[0]), at, "stamped in place");
        assert!(ann(&out[0].pods[0], CONFIG_SEEN_ANNOTATION).is_some());
        let stored = out[0].pods[0].clone();
        drop(out);
        // Sent again, the packed copy is an unchanged pod; the mux keeps its whole one.
        let again = kept.hand_over();
        assert!(again.pod().ptr_eq(kept.pod()), "a packed pod is shared");
        assert!(m.merge(FILE, SourceUpdate::Set(vec![again])).is_empty());
        assert_eq!(stored.holders(), 2, "the mux and this test");
    }

    #[test]
    fn a_pod_no_source_holds_is_stored_without_a_copy() {
        let mut m = mux();
        // The source kept no reference: the stored pod is the very allocation it sent.
        let sent = pod("1", "a");
        let at = ptr(sent.pod());
        let out = m.merge(FILE, SourceUpdate::Set(vec![sent]));
        assert_eq!(ptr(&out[0].pods[0]), at);
        assert!(ann(&out[0].pods[0], CONFIG_SEEN_ANNOTATION).is_some());
        // The source kept it: the stored pod is a stamped copy, the source's is unchanged.
        let kept = pod("2", "b");
        let out = m.merge(FILE, SourceUpdate::Add(vec![kept.clone()]));
        assert!(!out[0].pods[0].ptr_eq(kept.pod()));
        assert!(ann(&out[0].pods[0], CONFIG_SEEN_ANNOTATION).is_some());
        assert_eq!(ann(kept.pod(), CONFIG_SEEN_ANNOTATION), None);
        // A later equal pod is dropped; the stored one stays the only copy in the mux.
        let stored = out[0].pods[0].clone();
        drop(out);
        assert!(
            m.merge(FILE, SourceUpdate::Add(vec![pod("2", "b")]))
                .is_empty()
        );
        assert_eq!(stored.holders(), 2, "the mux and this test");
    }

    #[test]
    fn fingerprints_cover_semantic_fields() {
        let mut buf = Vec::new();
        let base = fingerprints(&raw("1", "a"), &mut buf);
        assert_eq!(base, fingerprints(&raw("1", "a"), &mut buf));
        let mut p = raw("1", "a");
        p.metadata.deletion_grace_period_seconds = Some(1);
        assert_ne!(base.semantic, fingerprints(&p, &mut buf).semantic);
        let p = with_phase(pod("1", "a"), "Running");
        let fp = fingerprints(&p.pod().whole().expect("whole"), &mut buf);
        assert_eq!(base.semantic, fp.semantic);
        assert_ne!(base.status, fp.status);
        // Annotation key/value boundaries are unambiguous.
        let mut a = raw("1", "a");
        a.metadata.annotations = Some([("ab".to_owned(), "c".to_owned())].into());
        let mut b = raw("1", "a");
        b.metadata.annotations = Some([("a".to_owned(), "bc".to_owned())].into());
        assert_ne!(
            fingerprints(&a, &mut buf).semantic,
            fingerprints(&b, &mut buf).semantic
        );
    }

    #[tokio::test]
    async fn run_merges_sources_in_order_and_stops_on_cancel() {
        let mut m = Mux::new();
        let file_tx = m.channel(FILE);
        let http_tx = m.channel(HTTP);
        let cancel = CancellationToken::new();
        let (mut rx, ready) = m.run(cancel.clone());
        assert!(!ready.all_ready());
        file_tx
            .send(SourceUpdate::Set(vec![pod("1", "a")]))
            .await
            .expect("send");
        let u = rx.recv().await.expect("update");
        assert_eq!((u.op, u.source, u.pods.len()), (Op::Add, FILE, 1));
        http_tx.send(SourceUpdate::Set(vec![])).await.expect("send");
        let u = rx.recv().await.expect("update");
        assert_eq!((u.op, u.source, u.pods.len()), (Op::Add, HTTP, 0));
        assert!(ready.all_ready());
        file_tx.send(SourceUpdate::Set(vec![])).await.expect("send");
        let u = rx.recv().await.expect("update");
        assert_eq!((u.op, u.source), (Op::Remove, FILE));
        cancel.cancel();
        assert!(
            rx.recv().await.is_none(),
            "task ended and dropped its sender"
        );
    }

    #[tokio::test]
    async fn run_ends_when_all_sources_close() {
        let mut m = Mux::new();
        let tx = m.channel(FILE);
        let (mut rx, _) = m.run(CancellationToken::new());
        drop(tx);
        assert!(rx.recv().await.is_none());
    }

    fn packed(uid: &str, name: &str, image: &str, phase: Option<&str>) -> StoredPod {
        let p = with_image(pod(uid, name), image);
        let p = match phase {
            Some(phase) => with_phase(p, phase),
            None => p,
        };
        StoredPod::packed(p.into_ref().into_pod().expect("whole")).expect("packs")
    }

    #[test]
    fn packed_pods_are_kept_and_handed_on_packed() {
        let mut m = mux();
        m.register(HTTP);
        let out = m.merge(
            HTTP,
            SourceUpdate::Set(vec![
                packed("1", "a", "x:1", None),
                packed("2", "b", "x:1", None),
            ]),
        );
        assert_eq!(summary(&out), vec![(Op::Add, s(&["1", "2"]))]);
        let added = &out[0].pods[0];
        assert!(added.is_packed());
        // Stamped without decoding: the metadata is kept whole.
        assert_eq!(
            ann(added, CONFIG_SOURCE_ANNOTATION).as_deref(),
            Some("http")
        );
        let seen = ann(added, CONFIG_SEEN_ANNOTATION);
        assert!(seen.is_some());
        // The same pods again: nothing.
        let again = vec![packed("1", "a", "x:1", None), packed("2", "b", "x:1", None)];
        assert!(m.merge(HTTP, SourceUpdate::Set(again)).is_empty());
        // A new image is an UPDATE of a packed pod carrying the new spec and the stored stamps.
        let out = m.merge(
            HTTP,
            SourceUpdate::Set(vec![
                packed("1", "a", "x:2", None),
                packed("2", "b", "x:1", None),
            ]),
        );
        assert_eq!(summary(&out), vec![(Op::Update, s(&["1"]))]);
        let updated = &out[0].pods[0];
        assert!(updated.is_packed());
        assert_eq!(ann(updated, CONFIG_SEEN_ANNOTATION), seen);
        let whole = updated.whole().expect("unpacks");
        let spec = whole.spec.as_ref().expect("spec");
        assert_eq!(spec.containers[0].image.as_deref(), Some("x:2"));
        // A status alone: a packed RECONCILE with it.
        let out = m.merge(
            HTTP,
            SourceUpdate::Set(vec![
                packed("1", "a", "x:2", Some("Running")),
                packed("2", "b", "x:1", None),
            ]),
        );
        assert_eq!(summary(&out), vec![(Op::Reconcile, s(&["1"]))]);
        assert!(out[0].pods[0].is_packed());
        assert_eq!(phase_of(&out[0].pods[0]).as_deref(), Some("Running"));
        // Gone from the SET: a REMOVE of the stored packed pod.
        let out = m.merge(HTTP, SourceUpdate::Set(vec![packed("2", "b", "x:1", None)]));
        assert_eq!(summary(&out), vec![(Op::Remove, s(&["1"]))]);
        assert!(out[0].pods[0].is_packed());
    }
}
