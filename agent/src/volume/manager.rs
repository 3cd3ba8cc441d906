//! The volume manager: one owner for everything the node does with a pod's volumes. The runtime
//! manager asks it to set a pod's volumes up before the sandbox ([`Manager::set_up`]), to
//! refresh them at each sync ([`Manager::refresh`]), for a container's mounts
//! ([`Manager::mounts`]) and to tear them down once nothing runs in the pod any more
//! ([`Manager::tear_down`]); it holds the service account tokens of projected volumes and the
//! PersistentVolumes each pod's claims were resolved to, and reads the API objects the volumes
//! name.
use super::{Error, Source, Volume, atomic::Payload, claims, projection, token::Tokens};
use crate::api_objects::ApiObjects;
use crate::metrics::kubelet::{StorageOperations, observe_storage_operation};
use crate::pod::admission;
use k8s_cri::v1 as api;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tokio::sync::watch;

/// Pod UID -> volume name -> the PersistentVolume its claim was resolved to.
type Claims = HashMap<String, HashMap<String, Source>>;

/// The claims the volume manager resolved, by pod: what the stats provider reads to measure a
/// claim's volume. Cheap to clone; clones share them.
#[derive(Clone, Default)]
pub struct ResolvedClaims(Arc<Mutex<Claims>>);

impl ResolvedClaims {
    fn lock(&self) -> MutexGuard<'_, Claims> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Pod `uid`'s resolved claims: volume name -> its [`Source::Persistent`].
    pub fn of(&self, uid: &str) -> HashMap<String, Source> {
        self.lock().get(uid).cloned().unwrap_or_default()
    }
}

/// The volume manager (cheap to clone: clones share the token cache and the resolved claims).
#[derive(Clone)]
pub struct Manager {
    /// `<root-dir>/pods`: each pod's volumes are below `<uid>/volumes`.
    pods_dir: PathBuf,
    /// The machine's memory (a memory-backed emptyDir's default size limit).
    node_memory: u64,
    /// Where the volumes' configMaps, secrets and service account tokens are read.
    api: ApiObjects,
    /// The service account tokens of projected volumes, refreshed as the kubelet's token manager
    /// refreshes them.
    tokens: Tokens,
    /// The node as admission sees it: a PersistentVolume's node affinity is matched against
    /// its labels.
    node: watch::Receiver<admission::Node>,
    /// The claims of each pod, resolved once (as the kubelet processes a pod's volumes once):
    /// a container restarted later mounts the same volume without asking the API again, even
    /// while the claim is being deleted (its protection keeps it while the pod uses it).
    claims: ResolvedClaims,
    /// `storage_operation_duration_seconds`: each volume's set-up, timed.
    operations: Option<StorageOperations>,
}

impl Manager {
    pub fn new(
        pods_dir: PathBuf,
        node_memory: u64,
        api: ApiObjects,
        node: watch::Receiver<admission::Node>,
    ) -> Self {
        Self {
            pods_dir,
            node_memory,
            api,
            tokens: Tokens::default(),
            node,
            claims: ResolvedClaims::default(),
            operations: None,
        }
    }

    /// Times each volume's set-up into `operations` (`storage_operation_duration_seconds`,
    /// operation `volume_mount`, by plugin and outcome).
    pub fn with_operations(mut self, operations: StorageOperations) -> Self {
        self.operations = Some(operations);
        self
    }

    fn claims(&self) -> MutexGuard<'_, Claims> {
        self.claims.lock()
    }

    /// The claims this manager resolved (shared, read by the stats provider).
    pub fn resolved_claims(&self) -> ResolvedClaims {
        self.claims.clone()
    }

    /// The pod's volumes ([`super::plan`]) with each claim this manager resolved for pod `uid`
    /// in place of its [`Source::Claim`].
    fn volumes(&self, spec: &PodSpec, uid: &str) -> Result<Vec<Volume>, Error> {
        let mut volumes = super::plan(spec)?;
        if volumes
            .iter()
            .any(|v| matches!(v.source, Source::Claim { .. }))
        {
            let claims = self.claims();
            if let Some(resolved) = claims.get(uid) {
                for v in &mut volumes {
                    if let Some(s) = resolved.get(&v.name) {
                        v.source = s.clone();
                    }
                }
            }
        }
        Ok(volumes)
    }

    /// Resolves each claim of `volumes` not resolved yet for pod `uid` ([`claims::resolve`]),
    /// remembering it; the first that cannot be is the error (the pod waits with it).
    async fn resolve_claims(
        &self,
        pod: &Pod,
        uid: &str,
        volumes: &mut [Volume],
    ) -> Result<(), Error> {
        let Some(spec) = pod.spec.as_ref() else {
            return Ok(());
        };
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
        for v in volumes.iter_mut() {
            let Source::Claim { claim, read_only } = &v.source else {
                continue;
            };
            // An ephemeral volume's claim (no name given) must be the pod's own.
            let owner = claim
                .is_none()
                .then_some(pod.metadata.uid.as_deref())
                .flatten();
            let claim = super::claim_name(pod_name, &v.name, claim.as_deref());
            let mounted = spec
                .containers
                .iter()
                .chain(spec.init_containers.iter().flatten())
                .flat_map(|c| c.volume_mounts.iter().flatten())
                .any(|m| m.name == v.name);
            let wanted = claims::Wanted {
                namespace,
                pod: pod_name,
                volume: &v.name,
                claim: &claim,
                read_only: *read_only,
                mounted,
                owner,
            };
            let node = self.node.borrow().clone();
            let source = claims::resolve(&self.api, wanted, &node).await?;
            tracing::info!(pod = %pod_name, volume = %v.name, claim = %claim, resolved = ?source, "claim resolved");
            self.claims()
                .entry(uid.to_owned())
                .or_default()
                .insert(v.name.clone(), source.clone());
            v.source = source;
        }
        Ok(())
    }

    /// Checks the pod's volumes and every container's mounts of them, computes the files of its
    /// configMap, secret, downwardAPI and projected volumes (reading their objects: one missing
    /// stops the set-up before anything is made), and sets the volumes up (`volume::set_up`,
    /// idempotent) in place ([`blocking_here`]). `name` names the pod in the log.
    pub async fn set_up(&self, pod: &Pod, uid: &str, name: &str) -> Result<(), Error> {
        let Some(spec) = pod.spec.as_ref() else {
            return Ok(());
        };
        let mut volumes = self.volumes(spec, uid)?;
        let init = spec.init_containers.iter().flatten();
        for c in spec.containers.iter().chain(init) {
            super::check_mounts(&volumes, c)?;
        }
        if volumes.is_empty() {
            return Ok(());
        }
        self.resolve_claims(pod, uid, &mut volumes).await?;
        let mut payloads = HashMap::new();
        for (volume, payload) in self.payloads(pod, &volumes).await {
            match payload {
                Ok(p) => {
                    payloads.insert(volume, p);
                }
                // Set up before (the pod runs): it keeps its files, as the kubelet keeps a
                // mounted volume whose remount failed, and the containers still start.
                Err(e) if super::is_written(&self.pods_dir, uid, &volumes, &volume) => {
                    tracing::warn!(pod = %name, error = %e, "volume not updated");
                }
                Err(e) => return Err(e),
            }
        }
        let ctx = super::Context {
            node_memory: self.node_memory,
            pod_memory_limit: crate::cm::resource_config_for_pod(pod)
                .ok()
                .and_then(|r| r.memory_limit),
            fs_group: spec.security_context.as_ref().and_then(|s| s.fs_group),
            fs_group_on_root_mismatch: spec
                .security_context
                .as_ref()
                .and_then(|s| s.fs_group_change_policy.as_deref())
                == Some("OnRootMismatch"),
        };
        // Here, not on the blocking pool: a few file-system calls and mounts, on the start's
        // critical path, where the hand-over to a pool thread and back costs more on a busy
        // node than the work itself.
        blocking_here(|| {
            for v in &volumes {
                let started = std::time::Instant::now();
                let done =
                    super::set_up(&self.pods_dir, uid, std::slice::from_ref(v), ctx, &payloads);
                if let Some(o) = &self.operations {
                    let seconds = started.elapsed().as_secs_f64();
                    observe_storage_operation(o, v.plugin(), "volume_mount", done.is_ok(), seconds);
                }
                done?;
            }
            Ok(())
        })
    }

    /// The files of each configMap, secret, downwardAPI and projected volume of the pod, by
    /// volume name, in the pod's order: for a volume whose objects are missing (and not
    /// optional) or unreadable, the kubelet's `MountVolume.SetUp failed` error naming it.
    async fn payloads(
        &self,
        pod: &Pod,
        volumes: &[Volume],
    ) -> Vec<(String, Result<Payload, Error>)> {
        let projections: Vec<(&str, &projection::Projection)> = volumes
            .iter()
            .filter_map(|v| match &v.source {
                Source::Projection(p) => Some((v.name.as_str(), p)),
                _ => None,
            })
            .collect();
        if projections.is_empty() {
            return Vec::new();
        }
        let all: Vec<&projection::Projection> = projections.iter().map(|(_, p)| *p).collect();
        let objects = projection::fetch(&self.api, &self.tokens, pod, &all).await;
        let node = projection::NodeContext {
            allocatable: crate::cm::node_allocatable(self.node_memory, &self.pods_dir),
            fs_user: projection::fs_user(pod),
            fs_group: pod
                .spec
                .as_ref()
                .and_then(|s| s.security_context.as_ref())
                .and_then(|s| s.fs_group)
                .and_then(|g| u32::try_from(g).ok()),
        };
        projections
            .into_iter()
            .map(|(name, p)| {
                let payload =
                    projection::payload(pod, p, &objects, &node).map_err(|e| Error::SetUp {
                        volume: name.to_owned(),
                        message: e.to_string(),
                    });
                (name.to_owned(), payload)
            })
            .collect()
    }

    /// Rewrites the pod's configMap, secret, downwardAPI and projected volumes that are set up,
    /// with what their objects hold now (the atomic writer leaves an unchanged volume alone).
    /// A volume whose objects cannot be read keeps its files (logged), as the kubelet keeps a
    /// volume whose remount failed.
    pub async fn refresh(&self, pod: &Pod, uid: &str, name: &str) {
        let Some(spec) = pod.spec.as_ref() else {
            return;
        };
        let Ok(volumes) = super::plan(spec) else {
            return;
        };
        if !volumes
            .iter()
            .any(|v| matches!(v.source, Source::Projection(_)))
        {
            return;
        }
        let mut payloads = HashMap::new();
        for (volume, payload) in self.payloads(pod, &volumes).await {
            match payload {
                Ok(p) => {
                    payloads.insert(volume, p);
                }
                Err(e) => tracing::warn!(pod = %name, error = %e, "volume not updated"),
            }
        }
        let fs_group = spec.security_context.as_ref().and_then(|s| s.fs_group);
        let (pods_dir, uid) = (self.pods_dir.clone(), uid.to_owned());
        let done = tokio::task::spawn_blocking(move || {
            super::refresh(&pods_dir, &uid, &volumes, fs_group, &payloads)
        })
        .await;
        match done {
            Ok(Ok(changed)) if !changed.is_empty() => {
                tracing::info!(pod = %name, volumes = ?changed, "volumes updated");
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(pod = %name, error = %e, "refreshing volumes"),
            Err(e) => tracing::warn!(pod = %name, %e, "refreshing volumes"),
        }
    }

    /// The CRI mounts of container `c` of pod `uid`: its `volumeMounts` of the pod's volumes.
    pub fn mounts(&self, pod: &Pod, uid: &str, c: &Container) -> Result<Vec<api::Mount>, Error> {
        let volumes = pod
            .spec
            .as_ref()
            .map(|s| self.volumes(s, uid))
            .transpose()?
            .unwrap_or_default();
        super::container_mounts(&self.pods_dir, uid, &volumes, c)
    }

    /// Tears the volumes of pod `uid` down (nothing runs in it any more; a hostPath is left as
    /// it is), off the async threads. Failures are logged: the pod directory's removal, later,
    /// leaves a mount point alone.
    pub async fn tear_down(&self, uid: &str, name: &str) {
        let (pods_dir, uid) = (self.pods_dir.clone(), uid.to_owned());
        match tokio::task::spawn_blocking(move || super::tear_down(&pods_dir, &uid)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(pod = %name, error = %e, "tearing down volumes"),
            Err(e) => tracing::warn!(pod = %name, %e, "tearing down volumes"),
        }
    }

    /// Forgets what it holds for pod `uid` (its tokens and resolved claims): the pod is gone.
    pub fn forget(&self, uid: &str) {
        self.tokens.forget(uid);
        self.claims().remove(uid);
    }
}

/// Runs short blocking work on this very thread, telling a multi-threaded runtime so
/// (`block_in_place`) that its other tasks move to another worker meanwhile; on a
/// current-thread runtime (unit tests) it simply runs.
fn blocking_here<T>(work: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    if Handle::try_current().is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::MultiThread) {
        tokio::task::block_in_place(work)
    } else {
        work()
    }
}
