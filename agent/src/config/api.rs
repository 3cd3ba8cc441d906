//! The API-server pod source (`--kubeconfig`): a `kube` watcher of the pods bound to this node
//! (`spec.nodeName=<node>`), fed to the mux as source `api`.
//!
//! - A (re)list (the watcher's `Init` .. `InitDone`) becomes one SET, so pods deleted while the
//!   agent was not watching are removed; `Apply` events become UPDATEs and `Delete` events REMOVEs
//!   (the mux re-derives ADD/UPDATE/DELETE from content, so the op sent does not matter).
//! - The watcher resumes from the last resourceVersion seen, bookmarks included, when a watch
//!   connection ends; a 410 Gone (history compacted) makes it relist; errors back off
//!   exponentially (kube's default: 0.8 s doubling to 30 s). Each error is logged and counted in
//!   `swiftlet_config_errors_total{source="api"}` (reason `watch_expired` for 410, else `watch`).
//! - A pod whose content did not change across a relist is re-sent as the same [`StoredPod`], so
//!   the mux's merge of it is a pointer check.
//!
//! Testing: no kube-apiserver can be installed on the build machine, so this source is tested
//! against an in-process server (`tests/src/api_server.rs` in the tests crate) that speaks list/watch the way the API
//! server does (resourceVersions, field selectors, bookmarks, 410 Gone on compacted history,
//! dropped connections). It has not run against a real API server. https:// servers are served
//! by rustls (the agent's default `api-tls` cargo feature).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{ErrorCounter, SourceUpdate, StoredPod};

/// Longest wait between attempts to build the API client from the kubeconfig.
const MAX_CLIENT_RETRY: Duration = Duration::from_secs(30);

/// Configuration of the API-server source.
#[derive(Debug, Clone)]
pub struct Config {
    pub kubeconfig: PathBuf,
    pub node_name: String,
    /// Where the mirror pods the watch sees are kept (they are never sent to the mux).
    pub mirrors: MirrorPods,
    /// `rest_client_requests_total`.
    pub requests: crate::metrics::rest_client::Requests,
}

/// A mirror pod on the API server: the API's copy of a static pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mirror {
    pub uid: String,
    /// Its `kubernetes.io/config.mirror` annotation: the hash of the static pod it mirrors.
    pub hash: String,
    /// It has a deletion timestamp.
    pub deleting: bool,
}

/// The mirror pods bound to this node, by (namespace, name), as the pod watch last saw them.
/// Mirror pods are never run: the watch keeps them here instead of sending them to the mux.
#[derive(Debug, Clone, Default)]
pub struct MirrorPods(Arc<Mutex<BTreeMap<(String, String), Mirror>>>);

impl MirrorPods {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, String), Mirror>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The mirror pod `namespace/name`, if the watch has seen one.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Mirror> {
        self.lock()
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Every mirror pod seen: ((namespace, name), mirror).
    pub fn all(&self) -> Vec<((String, String), Mirror)> {
        self.lock()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// The key and the mirror of `pod` when it is a mirror pod.
    fn of(pod: &Pod) -> Option<((String, String), Mirror)> {
        let m = &pod.metadata;
        let hash = m
            .annotations
            .as_ref()?
            .get(crate::pod::annotations::CONFIG_MIRROR)?;
        let key = (
            m.namespace.clone().unwrap_or_else(|| "default".to_owned()),
            m.name.clone().unwrap_or_default(),
        );
        let mirror = Mirror {
            uid: m.uid.clone().unwrap_or_default(),
            hash: hash.clone(),
            deleting: m.deletion_timestamp.is_some(),
        };
        Some((key, mirror))
    }

    fn replace(&self, all: BTreeMap<(String, String), Mirror>) {
        *self.lock() = all;
    }

    pub fn upsert(&self, key: (String, String), mirror: Mirror) {
        self.lock().insert(key, mirror);
    }

    fn remove(&self, key: &(String, String), uid: &str) {
        let mut map = self.lock();
        if map.get(key).is_some_and(|m| m.uid == uid) {
            map.remove(key);
        }
    }
}

/// Why the API client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: reading kubeconfig: {source}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("{path}: building the API client: {source}")]
    Client {
        path: PathBuf,
        #[source]
        source: kube::Error,
    },
}

/// The `result` label of a failed API request: the HTTP status's name for the answers an agent
/// reacts to, `tls` when the TLS handshake failed (the server's certificate is not trusted, or
/// it refused the client certificate), else `unreachable`.
pub fn error_result(e: &kube::Error) -> &'static str {
    match e {
        kube::Error::Api(s) => match s.code {
            401 => "unauthorized",
            403 => "forbidden",
            404 => "not_found",
            409 => "conflict",
            500..=599 => "server_error",
            _ => "error",
        },
        kube::Error::Service(inner) if inner.is::<TimedOut>() => "timeout",
        other if is_tls_failure(other) => "tls",
        _ => "unreachable",
    }
}

/// Whether a rustls error is somewhere in `e`'s chain of causes (an `io::Error` hides the error
/// it wraps from `source()`, so those are unwrapped instead).
fn is_tls_failure(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(err) = next {
        if err.is::<rustls::Error>() {
            return true;
        }
        next = match err.downcast_ref::<std::io::Error>() {
            Some(io) => io
                .get_ref()
                .map(|inner| inner as &(dyn std::error::Error + 'static)),
            None => err.source(),
        };
    }
    false
}

/// A request that did not finish within the time it was given (the node's heartbeats are
/// bounded so), as the `kube::Error::Service` it fails with holds it.
#[derive(Debug, thiserror::Error)]
#[error("no answer from the API server within {0:?}")]
pub struct TimedOut(pub std::time::Duration);

/// Builds a client from the kubeconfig file, its requests counted in `requests`.
pub async fn client(
    kubeconfig: &std::path::Path,
    requests: &crate::metrics::rest_client::Requests,
) -> Result<Client, Error> {
    let config = client_config(kubeconfig).await?;
    crate::metrics::rest_client::client(config, requests).map_err(|source| Error::Client {
        path: kubeconfig.to_path_buf(),
        source,
    })
}

/// The client settings the kubeconfig file gives (server, credentials, trust).
pub async fn client_config(kubeconfig: &std::path::Path) -> Result<kube::Config, Error> {
    let path = || kubeconfig.to_path_buf();
    let kc =
        kube::config::Kubeconfig::read_from(kubeconfig).map_err(|source| Error::Kubeconfig {
            path: path(),
            source,
        })?;
    let options = kube::config::KubeConfigOptions::default();
    kube::Config::from_custom_kubeconfig(kc, &options)
        .await
        .map_err(|source| Error::Kubeconfig {
            path: path(),
            source,
        })
}

/// Runs the API-server source until `cancel` fires or the mux's receiver is gone: builds the
/// client (retrying with backoff while the kubeconfig is unusable), then [`run`]s the watcher.
pub async fn watch(
    cfg: Config,
    tx: mpsc::Sender<SourceUpdate>,
    errors: ErrorCounter,
    cancel: CancellationToken,
) {
    let mut delay = Duration::from_secs(1);
    let client = loop {
        match client(&cfg.kubeconfig, &cfg.requests).await {
            Ok(c) => break c,
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?delay, "API-server pod source cannot start");
                errors.inc("kubeconfig");
            }
        }
        tokio::select! {
            biased;
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(MAX_CLIENT_RETRY);
    };
    run(client, &cfg.node_name, cfg.mirrors, tx, errors, cancel).await;
}

/// Watches the pods bound to `node_name` and feeds the mux.
pub async fn run(
    client: Client,
    node_name: &str,
    mirrors: MirrorPods,
    tx: mpsc::Sender<SourceUpdate>,
    errors: ErrorCounter,
    cancel: CancellationToken,
) {
    let api: Api<Pod> = Api::all(client);
    let wc = watcher::Config::default().fields(&format!("spec.nodeName={node_name}"));
    let mut events = std::pin::pin!(watcher::watcher(api, wc).default_backoff());
    let mut source = Source {
        mirrors,
        ..Source::default()
    };
    loop {
        let next = tokio::select! {
            biased;
            _ = cancel.cancelled() => return,
            next = events.next() => next,
        };
        let update = match next {
            None => return,
            Some(Ok(event)) => source.handle(event),
            Some(Err(e)) => {
                watch_failed(&e, &errors);
                None
            }
        };
        let Some(update) = update else { continue };
        if !super::send(&tx, update, &cancel).await {
            return;
        }
    }
}

/// Logs and counts a failed list or watch: a 410 relists quietly, refused credentials and TLS
/// failures are errors an operator must fix (counted as `unauthorized`, `forbidden`, `tls`),
/// anything else a warning (`watch`).
fn watch_failed(e: &watcher::Error, errors: &ErrorCounter) {
    let result = match e {
        watcher::Error::WatchError(s) if s.code == 410 => {
            tracing::info!(error = %e, "API-server watch expired (410 Gone); relisting");
            errors.inc("watch_expired");
            return;
        }
        watcher::Error::WatchError(s) => error_result(&kube::Error::Api(s.clone())),
        watcher::Error::InitialListFailed(k)
        | watcher::Error::WatchStartFailed(k)
        | watcher::Error::WatchFailed(k) => error_result(k),
        _ => "watch",
    };
    match result {
        "unauthorized" | "forbidden" => {
            tracing::error!(error = %e, result, "API-server pod watch: the API server refused the kubeconfig's credentials; retrying with backoff");
            errors.inc(result);
        }
        "tls" => {
            tracing::error!(error = %e, "API-server pod watch: TLS with the API server failed (check the kubeconfig's certificate-authority and client certificate); retrying with backoff");
            errors.inc(result);
        }
        _ => {
            tracing::warn!(error = %e, "API-server pod watch failed; retrying with backoff");
            errors.inc("watch");
        }
    }
}

/// Turns watcher events into mux updates, keeping the pods last sent.
#[derive(Default)]
struct Source {
    /// By UID: what the mux was last told.
    pods: HashMap<String, StoredPod>,
    /// A list in progress (between `Init` and `InitDone`), in list order.
    listing: Option<Vec<StoredPod>>,
    /// The mirror pods of a list in progress.
    listing_mirrors: BTreeMap<(String, String), Mirror>,
    mirrors: MirrorPods,
}

impl Source {
    fn handle(&mut self, event: Event<Pod>) -> Option<SourceUpdate> {
        match event {
            Event::Init => {
                self.listing = Some(Vec::new());
                self.listing_mirrors.clear();
                None
            }
            Event::InitApply(pod) => {
                if let Some((key, mirror)) = MirrorPods::of(&pod) {
                    self.listing_mirrors.insert(key, mirror);
                    return None;
                }
                let pod = self.ingest(pod)?;
                self.listing.get_or_insert_with(Vec::new).push(pod);
                None
            }
            Event::InitDone => {
                self.mirrors
                    .replace(std::mem::take(&mut self.listing_mirrors));
                let listed = self.listing.take().unwrap_or_default();
                self.pods = listed
                    .iter()
                    .map(|p| (p.uid().to_owned(), p.clone()))
                    .collect();
                Some(SourceUpdate::Set(listed))
            }
            Event::Apply(pod) => {
                if let Some((key, mirror)) = MirrorPods::of(&pod) {
                    self.mirrors.upsert(key, mirror);
                    return None;
                }
                let pod = self.ingest(pod)?;
                self.pods.insert(pod.uid().to_owned(), pod.clone());
                Some(SourceUpdate::Update(vec![pod]))
            }
            Event::Delete(pod) => {
                if let Some((key, mirror)) = MirrorPods::of(&pod) {
                    self.mirrors.remove(&key, &mirror.uid);
                    return None;
                }
                let uid = pod.metadata.uid.as_deref().unwrap_or_default();
                let gone = match self.pods.remove(uid) {
                    Some(stored) => stored,
                    None => StoredPod::new(pod),
                };
                Some(SourceUpdate::Remove(vec![gone]))
            }
        }
    }

    /// The pod as a `StoredPod`: the one sent before if its content is unchanged.
    fn ingest(&self, pod: Pod) -> Option<StoredPod> {
        if pod.metadata.uid.as_deref().is_none_or(str::is_empty) {
            tracing::warn!(pod = ?pod.metadata.name, "API server sent a pod without a UID; ignored");
            return None;
        }
        let new = StoredPod::new(pod);
        match self.pods.get(new.uid()) {
            Some(old) if old.fingerprints() == new.fingerprints() => Some(old.clone()),
            _ => Some(new),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, name: &str, mirror: Option<&str>) -> Pod {
        let mut p = Pod::default();
        p.metadata.uid = Some(uid.into());
        p.metadata.name = Some(name.into());
        p.metadata.namespace = Some("default".into());
        if let Some(hash) = mirror {
            p.metadata.annotations = Some(
                [(
                    crate::pod::annotations::CONFIG_MIRROR.to_owned(),
                    hash.to_owned(),
                )]
                .into(),
            );
        }
        p
    }

    fn uids(update: Option<SourceUpdate>) -> Vec<String> {
        match update {
            Some(
                SourceUpdate::Set(v)
                | SourceUpdate::Add(v)
                | SourceUpdate::Update(v)
                | SourceUpdate::Remove(v)
                | SourceUpdate::Delete(v),
            ) => v.iter().map(|p| p.uid().to_owned()).collect(),
            None => Vec::new(),
        }
    }

    #[test]
    fn mirror_pods_are_kept_apart_and_never_sent_to_the_mux() {
        let mirrors = MirrorPods::default();
        let mut source = Source {
            mirrors: mirrors.clone(),
            ..Source::default()
        };
        assert!(source.handle(Event::Init).is_none());
        assert!(
            source
                .handle(Event::InitApply(pod("u1", "web", None)))
                .is_none()
        );
        assert!(
            source
                .handle(Event::InitApply(pod("m1", "s", Some("h1"))))
                .is_none()
        );
        assert_eq!(uids(source.handle(Event::InitDone)), ["u1"]);
        let m = mirrors.get("default", "s").expect("the mirror");
        assert_eq!((m.uid.as_str(), m.hash.as_str()), ("m1", "h1"));
        // A new mirror of the same pod replaces it; the old one's deletion does not remove it.
        assert!(
            source
                .handle(Event::Apply(pod("m2", "s", Some("h2"))))
                .is_none()
        );
        assert!(
            source
                .handle(Event::Delete(pod("m1", "s", Some("h1"))))
                .is_none()
        );
        assert_eq!(
            mirrors.get("default", "s").map(|m| m.uid),
            Some("m2".into())
        );
        assert!(
            source
                .handle(Event::Delete(pod("m2", "s", Some("h2"))))
                .is_none()
        );
        assert!(mirrors.all().is_empty());
        // A relist forgets the mirrors it no longer finds.
        source.handle(Event::Apply(pod("m3", "t", Some("h3"))));
        source.handle(Event::Init);
        assert_eq!(uids(source.handle(Event::InitDone)), Vec::<String>::new());
        assert!(mirrors.all().is_empty());
    }

    #[test]
    fn failed_requests_are_named_by_what_an_operator_must_fix() {
        let status = |code| {
            kube::Error::Api(Box::new(kube::core::Status {
                code,
                ..Default::default()
            }))
        };
        assert_eq!(error_result(&status(401)), "unauthorized");
        assert_eq!(error_result(&status(403)), "forbidden");
        assert_eq!(error_result(&status(409)), "conflict");
        assert_eq!(error_result(&status(503)), "server_error");
        // What hyper's connector hands back for an untrusted server certificate: the rustls
        // error inside two io::Errors.
        let untrusted = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let wrapped = std::io::Error::other(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            untrusted,
        ));
        assert_eq!(
            error_result(&kube::Error::Service(Box::new(wrapped))),
            "tls"
        );
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(
            error_result(&kube::Error::Service(Box::new(refused))),
            "unreachable"
        );
    }
}
