//! The configMaps and secrets that the agent's pods reference, each kept current by one watch of
//! that one object (`fieldSelector=metadata.name=<name>`), as the kubelet's `Watch` strategy for
//! configMaps and secrets keeps them. A pod registers what it references when it is first
//! synced and lets go of it when it has terminated; the watch of an object lives while some pod
//! references it. Reads of a registered object are answered from memory once its first list
//! has come back (a read before waits for that list, and every pod that shares the object waits
//! for the same one), so a pod start and every later sync of its volumes and environment cost
//! the API server nothing, and a change reaches the agent as soon as the server sends it.
//!
//! When a watched object changes, the UIDs of the pods that name it are sent to the channel
//! given to `ApiObjects::reporting_changes` (the sync loop then syncs those pods, which rewrites
//! their volumes at once instead of at their next periodic sync).
//!
//! An object nobody registered is read with a GET, as before (see `ApiObjects`).
use super::Error;
use futures::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::watch;

/// What the watch of one object has seen.
#[derive(Debug)]
enum Seen<K> {
    /// The object as last listed or changed.
    Found(Arc<K>),
    /// The list found no object of that name, or the object was deleted.
    Missing,
    /// The first list failed (the watch keeps trying; a later list replaces this).
    Failed(String),
}

impl<K> Clone for Seen<K> {
    fn clone(&self) -> Self {
        match self {
            Seen::Found(k) => Seen::Found(Arc::clone(k)),
            Seen::Missing => Seen::Missing,
            Seen::Failed(e) => Seen::Failed(e.clone()),
        }
    }
}

/// Where the UIDs of the pods that name a changed object are sent; `None`: nobody is told (an
/// `ApiObjects` made for lookups only, with no sync loop to resync the pods).
pub(super) type Changes = Option<tokio::sync::mpsc::UnboundedSender<String>>;

struct Entry<K> {
    /// The UIDs of the pods that reference the object (shared with its watch task, which
    /// sends them to [`Changes`] when the object changes).
    users: Arc<Mutex<HashSet<String>>>,
    /// `None` until the first list has come back.
    seen: watch::Receiver<Option<Seen<K>>>,
    task: tokio::task::AbortHandle,
}

impl<K> Drop for Entry<K> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The watched objects of one kind, by (namespace, name).
pub(super) struct Watched<K> {
    kind: &'static str,
    entries: Mutex<HashMap<(String, String), Entry<K>>>,
    changes: Changes,
}

impl<K> Watched<K>
where
    K: kube::Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    pub(super) fn new(kind: &'static str, changes: Changes) -> Self {
        Self {
            kind,
            entries: Mutex::default(),
            changes,
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<(String, String), Entry<K>>> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Pod `uid` references `namespace/name`: its watch starts unless it runs already.
    pub(super) fn register(&self, client: &Client, namespace: &str, name: &str, uid: &str) {
        let mut entries = self.lock();
        let key = (namespace.to_owned(), name.to_owned());
        if let Some(e) = entries.get_mut(&key) {
            let mut users = lock(&e.users);
            if !users.contains(uid) {
                users.insert(uid.to_owned());
            }
            return;
        }
        let (tx, seen) = watch::channel(None);
        let api: Api<K> = Api::namespaced(client.clone(), namespace);
        let users = Arc::new(Mutex::new(HashSet::from([uid.to_owned()])));
        let tell = Tell {
            users: users.clone(),
            changes: self.changes.clone(),
        };
        let task = tokio::spawn(reflect(api, self.kind, name.to_owned(), tx, tell)).abort_handle();
        entries.insert(key, Entry { users, seen, task });
    }

    /// Pod `uid` is gone: the watches only it needed stop. Answers how many stopped.
    pub(super) fn unregister(&self, uid: &str) -> usize {
        let mut entries = self.lock();
        let before = entries.len();
        entries.retain(|_, e| {
            let mut users = lock(&e.users);
            users.remove(uid);
            !users.is_empty()
        });
        before - entries.len()
    }

    /// How many objects are watched.
    pub(super) fn len(&self) -> usize {
        self.lock().len()
    }

    /// `namespace/name` from its watch, once the first list has come back; `None` when no pod
    /// registered it.
    pub(super) async fn get(&self, namespace: &str, name: &str) -> Option<Result<K, Error>> {
        let mut seen = self
            .lock()
            .get(&(namespace.to_owned(), name.to_owned()))?
            .seen
            .clone();
        // The sender lives as long as the watch task: a watch stopped meanwhile (its pods
        // gone) answers as if unregistered.
        let got = seen.wait_for(Option::is_some).await.ok()?.clone()?;
        Some(match got {
            Seen::Found(k) => Ok(K::clone(&k)),
            Seen::Missing => Err(Error::NotFound {
                kind: self.kind,
                name: name.to_owned(),
            }),
            Seen::Failed(message) => Err(Error::Watch {
                kind: self.kind,
                name: name.to_owned(),
                message,
            }),
        })
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Tells the pods that name an object that it changed.
struct Tell {
    users: Arc<Mutex<HashSet<String>>>,
    changes: Changes,
}

impl Tell {
    fn changed(&self) {
        let Some(tx) = &self.changes else { return };
        for uid in lock(&self.users).iter() {
            let _ = tx.send(uid.clone());
        }
    }
}

/// Lists and watches the one object `name` for as long as the task runs (it is aborted when
/// no pod references the object any more), publishing what it sees on `tx`. Failures are
/// retried with the watcher's back-off; after a good list, a failure keeps the last object
/// seen (the kubelet keeps a volume's files when the API cannot be read).
async fn reflect<K>(
    api: Api<K>,
    kind: &'static str,
    name: String,
    tx: watch::Sender<Option<Seen<K>>>,
    tell: Tell,
) where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher(api, config).default_backoff().boxed();
    let mut listed: Option<K> = None;
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => listed = None,
            Ok(watcher::Event::InitApply(k)) => listed = Some(k),
            Ok(watcher::Event::InitDone) => {
                let now = listed
                    .take()
                    .map_or(Seen::Missing, |k| Seen::Found(Arc::new(k)));
                // A re-list after a broken watch may bring a change too.
                let changed = match (&*tx.borrow(), &now) {
                    (None | Some(Seen::Failed(_)), _) | (Some(Seen::Missing), Seen::Missing) => {
                        false
                    }
                    (Some(Seen::Found(a)), Seen::Found(b)) => {
                        a.meta().resource_version != b.meta().resource_version
                    }
                    _ => true,
                };
                tx.send_replace(Some(now));
                if changed {
                    tell.changed();
                }
            }
            Ok(watcher::Event::Apply(k)) => {
                tx.send_replace(Some(Seen::Found(Arc::new(k))));
                tell.changed();
            }
            Ok(watcher::Event::Delete(_)) => {
                tx.send_replace(Some(Seen::Missing));
                tell.changed();
            }
            Err(e) => {
                tracing::debug!(kind, %name, error = %e, "watching an object a pod references");
                let good = matches!(&*tx.borrow(), Some(Seen::Found(_) | Seen::Missing));
                if !good {
                    tx.send_replace(Some(Seen::Failed(e.to_string())));
                }
            }
        }
    }
}
