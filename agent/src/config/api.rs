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

use std::collections::HashMap;
use std::path::PathBuf;
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

/// Builds a client from the kubeconfig file.
pub async fn client(kubeconfig: &std::path::Path) -> Result<Client, Error> {
    let path = || kubeconfig.to_path_buf();
    let kc =
        kube::config::Kubeconfig::read_from(kubeconfig).map_err(|source| Error::Kubeconfig {
            path: path(),
            source,
        })?;
    let options = kube::config::KubeConfigOptions::default();
    let config = kube::Config::from_custom_kubeconfig(kc, &options)
        .await
        .map_err(|source| Error::Kubeconfig {
            path: path(),
            source,
        })?;
    Client::try_from(config).map_err(|source| Error::Client {
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
        match client(&cfg.kubeconfig).await {
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
    run(client, &cfg.node_name, tx, errors, cancel).await;
}

/// Watches the pods bound to `node_name` and feeds the mux.
pub async fn run(
    client: Client,
    node_name: &str,
    tx: mpsc::Sender<SourceUpdate>,
    errors: ErrorCounter,
    cancel: CancellationToken,
) {
    let api: Api<Pod> = Api::all(client);
    let wc = watcher::Config::default().fields(&format!("spec.nodeName={node_name}"));
    let mut events = std::pin::pin!(watcher::watcher(api, wc).default_backoff());
    let mut source = Source::default();
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
                let expired = matches!(&e, watcher::Error::WatchError(s) if s.code == 410);
                if expired {
                    tracing::info!(error = %e, "API-server watch expired (410 Gone); relisting");
                    errors.inc("watch_expired");
                } else {
                    tracing::warn!(error = %e, "API-server pod watch failed; retrying with backoff");
                    errors.inc("watch");
                }
                None
            }
        };
        let Some(update) = update else { continue };
        if !super::send(&tx, update, &cancel).await {
            return;
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
}

impl Source {
    fn handle(&mut self, event: Event<Pod>) -> Option<SourceUpdate> {
        match event {
            Event::Init => {
                self.listing = Some(Vec::new());
                None
            }
            Event::InitApply(pod) => {
                let pod = self.ingest(pod)?;
                self.listing.get_or_insert_with(Vec::new).push(pod);
                None
            }
            Event::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                self.pods = listed
                    .iter()
                    .map(|p| (p.uid().to_owned(), p.clone()))
                    .collect();
                Some(SourceUpdate::Set(listed))
            }
            Event::Apply(pod) => {
                let pod = self.ingest(pod)?;
                self.pods.insert(pod.uid().to_owned(), pod.clone());
                Some(SourceUpdate::Update(vec![pod]))
            }
            Event::Delete(pod) => {
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
