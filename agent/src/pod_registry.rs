//! The pod registry: the pods the agent was asked to run (the desired pods, kept until their
//! workers finish them) and the pods admission rejected, by UID.
//!
//! - [`PodRegistry`]: the one writer, owned by the sync loop. Each config operation (ADD,
//!   UPDATE, REMOVE, ...) talks to it once per pod.
//! - [`Pods`]: a cheap clonable read handle for everyone else (the status manager, which pairs
//!   each pod with its status; the kubelet API; stats; eviction).
//! - [`Changes`]: the feed of "what `/pods` shows of this pod changed", bumped by the registry
//!   when a pod changes and by the status manager when a status changes.
//!
//! A UID is in one map at most: a rejected pod is never desired until its source removes it.
use crate::config::PodRef;
use k8s_openapi::api::core::v1::Pod;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Instant;

/// A pod admission rejected: it never runs and no worker writes its status, so it is kept as
/// the mux handed it (packed, for a manifest URL's pods: a few hundred bytes instead of some
/// 5 KiB) with what its status says; the status manager makes its status when it is read.
pub struct Rejected {
    pod: PodRef,
    reason: &'static str,
    /// The status message (`Pod was rejected: ...`).
    message: Box<str>,
}

impl Rejected {
    /// The pod as its source has it now (packed or whole).
    pub fn pod(&self) -> &PodRef {
        &self.pod
    }

    /// The rejection's reason (`OutOfpods`, ...).
    pub fn reason(&self) -> &'static str {
        self.reason
    }

    /// The status message (`Pod was rejected: ...`).
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// The desired and the rejected pods, by UID.
#[derive(Default)]
pub struct Store {
    pods: BTreeMap<String, Arc<Pod>>,
    rejected: BTreeMap<String, Rejected>,
}

impl Store {
    /// The desired pod `uid`.
    pub fn desired(&self, uid: &str) -> Option<&Arc<Pod>> {
        self.pods.get(uid)
    }

    /// The rejected pod `uid`.
    pub fn rejected(&self, uid: &str) -> Option<&Rejected> {
        self.rejected.get(uid)
    }

    /// The desired pods in UID order.
    pub fn desired_pods(&self) -> impl Iterator<Item = (&String, &Arc<Pod>)> {
        self.pods.iter()
    }

    /// The rejected pods in UID order.
    pub fn rejected_pods(&self) -> impl Iterator<Item = (&String, &Rejected)> {
        self.rejected.iter()
    }

    /// How many pods are known, desired and rejected.
    pub fn len(&self) -> usize {
        self.pods.len() + self.rejected.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Which pods changed what `/pods` shows of them, and a version that moves with every change.
/// Every writer calls [`Changes::changed`] while it holds the write lock of what it changed, so
/// a reader holding the read locks of the registry and of the statuses sees exactly the version
/// that names what it reads. Cheap to clone.
#[derive(Clone, Default)]
pub struct Changes {
    version: Arc<AtomicU64>,
    /// The pods that changed since the API status writer last took them, with when each first
    /// changed since then.
    dirty: Arc<Mutex<BTreeMap<String, Instant>>>,
    /// Woken on every change of a pod.
    notify: Arc<tokio::sync::Notify>,
}

impl Changes {
    /// What `/pods` shows of pod `uid` changed. Call with the changed store's write lock held.
    pub fn changed(&self, uid: &str) {
        self.version.fetch_add(1, Ordering::Release);
        self.dirty
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(uid.to_owned())
            .or_insert_with(Instant::now);
        self.notify.notify_one();
    }

    /// The current version: it moves with every change.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// The pods that changed since the last call, with when each first changed.
    pub fn take(&self) -> Vec<(String, Instant)> {
        std::mem::take(&mut *self.dirty.lock().unwrap_or_else(PoisonError::into_inner))
            .into_iter()
            .collect()
    }

    /// Woken (at most one waiter) after a pod changed.
    pub fn notify(&self) -> Arc<tokio::sync::Notify> {
        self.notify.clone()
    }
}

struct Shared {
    store: RwLock<Store>,
    changes: Changes,
}

/// The registry's writer: the sync loop owns the only one (it is not `Clone`).
pub struct PodRegistry {
    shared: Arc<Shared>,
}

impl Default for PodRegistry {
    fn default() -> Self {
        Self::new()
    }
}

impl PodRegistry {
    pub fn new() -> Self {
        Self {
            shared: Arc::new(Shared {
                store: RwLock::default(),
                changes: Changes::default(),
            }),
        }
    }

    /// A read handle.
    pub fn reader(&self) -> Pods {
        Pods {
            shared: self.shared.clone(),
        }
    }

    fn write(&self) -> Option<RwLockWriteGuard<'_, Store>> {
        self.shared.store.write().ok()
    }

    fn changed(&self, uid: &str) {
        self.shared.changes.changed(uid);
    }

    /// Adds or replaces the desired pod. A rejected pod stays rejected until its source removes
    /// it: setting it changes nothing.
    pub fn set_pod(&self, uid: &str, pod: Arc<Pod>) {
        let Some(mut map) = self.write() else {
            return;
        };
        if map.rejected.contains_key(uid) {
            return;
        }
        match map.pods.get_mut(uid) {
            Some(held) => {
                if !Arc::ptr_eq(held, &pod) && **held != *pod {
                    self.changed(uid);
                }
                *held = pod;
            }
            None => {
                self.changed(uid);
                map.pods.insert(uid.to_owned(), pod);
            }
        }
    }

    /// Admission rejected the pod: it is no longer desired, and is kept as the mux handed it
    /// with `reason` and the status message `Pod was rejected: {message}` for as long as a
    /// source has it (kubelet `rejectPod`).
    pub fn reject(&self, uid: &str, pod: PodRef, reason: &'static str, message: &str) {
        let Some(mut map) = self.write() else {
            return;
        };
        map.pods.remove(uid);
        let rejected = Rejected {
            pod,
            reason,
            message: format!("Pod was rejected: {message}").into_boxed_str(),
        };
        map.rejected.insert(uid.to_owned(), rejected);
        self.changed(uid);
    }

    /// A pod's source has it as `pod` now: when admission rejected it, it stays rejected, shown
    /// as it is now, and `Ok`; any other pod is handed back.
    pub fn update_rejected(&self, uid: &str, pod: PodRef) -> Result<(), PodRef> {
        let Some(mut map) = self.write() else {
            return Err(pod);
        };
        let Some(r) = map.rejected.get_mut(uid) else {
            return Err(pod);
        };
        if !r.pod.ptr_eq(&pod) {
            r.pod = pod;
            self.changed(uid);
        }
        Ok(())
    }

    /// Forgets the pod when admission rejected it (it never ran: nothing to kill). False for
    /// any other pod, which is left as it is.
    pub fn remove_rejected(&self, uid: &str) -> bool {
        let Some(mut map) = self.write() else {
            return false;
        };
        if map.rejected.remove(uid).is_none() {
            return false;
        }
        self.changed(uid);
        true
    }

    /// Forgets the pod, desired or rejected (its worker finished it and no source has it).
    pub fn remove_pod(&self, uid: &str) {
        if let Some(mut map) = self.write() {
            let pod = map.pods.remove(uid).is_some();
            let rejected = map.rejected.remove(uid).is_some();
            if pod || rejected {
                self.changed(uid);
            }
        }
    }
}

/// A read handle on the registry. Cheap to clone.
#[derive(Clone)]
pub struct Pods {
    shared: Arc<Shared>,
}

impl Pods {
    /// The read lock on the whole registry; `None` when a writer panicked while holding it.
    /// Whoever also locks the statuses takes this lock first.
    pub fn read(&self) -> Option<RwLockReadGuard<'_, Store>> {
        self.shared.store.read().ok()
    }

    /// The feed of changes to what `/pods` shows.
    pub fn changes(&self) -> &Changes {
        &self.shared.changes
    }

    /// The desired pod `uid`.
    pub fn get(&self, uid: &str) -> Option<Arc<Pod>> {
        self.read()?.desired(uid).cloned()
    }

    /// Every pod known, desired or rejected, in UID order within each.
    pub fn uids(&self) -> Vec<String> {
        self.read().map_or_else(Vec::new, |m| {
            m.pods.keys().chain(m.rejected.keys()).cloned().collect()
        })
    }

    /// Whether the pod is one the agent was asked to run (desired or rejected).
    pub fn knows(&self, uid: &str) -> bool {
        self.read()
            .is_some_and(|m| m.pods.contains_key(uid) || m.rejected.contains_key(uid))
    }

    /// Whether admission rejected the pod.
    pub fn is_rejected(&self, uid: &str) -> bool {
        self.read().is_some_and(|m| m.rejected.contains_key(uid))
    }

    /// The UID of the desired pod called `name` in `namespace` (a rejected one never ran).
    /// Looked up by walking the pods: the kubelet API's requests are rare beside the syncs that
    /// use the UID index.
    pub fn find(&self, namespace: &str, name: &str) -> Option<String> {
        let map = self.read()?;
        map.pods.iter().find_map(|(uid, pod)| {
            let meta = &pod.metadata;
            (meta.name.as_deref() == Some(name)
                && meta.namespace.as_deref().unwrap_or("default") == namespace)
                .then(|| uid.clone())
        })
    }

    /// How many rejected pods are kept packed (tests).
    #[cfg(test)]
    pub fn rejected_packed(&self) -> usize {
        self.read().map_or(0, |m| {
            m.rejected.values().filter(|r| r.pod.is_packed()).count()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, policy: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.to_owned());
        p.metadata.namespace = Some("ns".to_owned());
        p.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            restart_policy: Some(policy.to_owned()),
            ..Default::default()
        });
        p
    }

    #[test]
    fn a_rejected_pod_stays_rejected_and_packed_until_removed() {
        let r = PodRegistry::new();
        let pods = r.reader();
        r.set_pod("b", Arc::new(pod("admitted", "Always")));
        let packed = PodRef::packed(pod("packed", "Never")).expect("packs");
        r.reject("a", packed, "OutOfpods", "no room");
        assert_eq!(pods.rejected_packed(), 1);
        assert_eq!(pods.uids(), ["b", "a"]);
        // A set_pod never makes it desired.
        r.set_pod("a", Arc::new(pod("packed", "Never")));
        assert!(pods.is_rejected("a"));
        assert!(pods.get("a").is_none());
        // Its source's newer copy replaces it, still packed and rejected.
        let newer = PodRef::packed(pod("packed-new", "Never")).expect("packs");
        assert!(r.update_rejected("a", newer).is_ok());
        assert_eq!(pods.rejected_packed(), 1);
        let map = pods.read().expect("readable");
        let held = map.rejected("a").expect("rejected");
        assert_eq!(held.pod().metadata().name.as_deref(), Some("packed-new"));
        assert_eq!(held.reason(), "OutOfpods");
        assert_eq!(held.message(), "Pod was rejected: no room");
        drop(map);
        // A desired pod is handed back.
        let back = r.update_rejected("b", pod("admitted", "Always").into());
        assert!(back.is_err());
        assert!(!r.remove_rejected("b"), "a desired pod is not removed so");
        assert!(pods.knows("b"));
        assert!(r.remove_rejected("a"));
        assert!(!pods.knows("a"));
    }

    #[test]
    fn lookups_by_name_and_the_change_feed() {
        let r = PodRegistry::new();
        let pods = r.reader();
        let p = Arc::new(pod("web", "Always"));
        let v0 = pods.changes().version();
        r.set_pod("u1", p.clone());
        assert_eq!(pods.find("ns", "web").as_deref(), Some("u1"));
        assert!(pods.find("default", "web").is_none());
        let v1 = pods.changes().version();
        assert!(v1 > v0);
        r.set_pod("u1", Arc::new(pod("web", "Always")));
        assert_eq!(pods.changes().version(), v1, "an equal pod is no change");
        r.remove_pod("nobody");
        assert_eq!(pods.changes().version(), v1);
        let taken: Vec<String> = pods.changes().take().into_iter().map(|(u, _)| u).collect();
        assert_eq!(taken, ["u1"]);
        r.remove_pod("u1");
        assert!(pods.get("u1").is_none());
        assert!(pods.changes().version() > v1);
    }
}
