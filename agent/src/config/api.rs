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
//! against an in-process server (`api_test_server.rs`) that speaks list/watch the way the API
//! server does (resourceVersions, field selectors, bookmarks, 410 Gone on compacted history,
//! dropped connections). It has not run against a real API server. https:// servers need the
//! agent's `api-tls` cargo feature.

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::api_test_server::{ApiServer, pod};
    use std::sync::Arc;

    const NODE: &str = "node-a";
    const WAIT: Duration = Duration::from_secs(10);

    struct Harness {
        server: ApiServer,
        rx: mpsc::Receiver<SourceUpdate>,
        errors: ErrorCounter,
        cancel: CancellationToken,
    }

    impl Harness {
        async fn start(server: ApiServer) -> Harness {
            let (tx, rx) = mpsc::channel(64);
            let errors = ErrorCounter::detached(crate::config::API);
            let cancel = CancellationToken::new();
            let client = server.client();
            tokio::spawn({
                let (errors, cancel) = (errors.clone(), cancel.clone());
                async move { run(client, NODE, tx, errors, cancel).await }
            });
            Harness {
                server,
                rx,
                errors,
                cancel,
            }
        }

        async fn next(&mut self) -> SourceUpdate {
            match tokio::time::timeout(WAIT, self.rx.recv()).await {
                Ok(Some(u)) => u,
                Ok(None) => panic!("source stopped"),
                Err(_) => panic!("no update in time"),
            }
        }

        async fn next_set(&mut self) -> Vec<StoredPod> {
            match self.next().await {
                SourceUpdate::Set(pods) => pods,
                other => panic!("expected a SET, got {other:?}"),
            }
        }
    }

    use crate::config::test_names as names;

    fn one(update: SourceUpdate) -> (&'static str, StoredPod) {
        let (op, pods) = match update {
            SourceUpdate::Update(p) => ("update", p),
            SourceUpdate::Remove(p) => ("remove", p),
            SourceUpdate::Add(p) => ("add", p),
            SourceUpdate::Delete(p) => ("delete", p),
            SourceUpdate::Set(p) => ("set", p),
        };
        assert_eq!(pods.len(), 1, "{op}");
        let pod = pods.into_iter().next().expect("one pod");
        (op, pod)
    }

    #[tokio::test]
    async fn list_then_watch_adds_modifies_deletes_for_this_node_only() {
        let server = ApiServer::start().await;
        server.put(pod("u1", "web", NODE, "x:1"));
        server.put(pod("u2", "other-node-pod", "node-b", "x:1"));
        let mut h = Harness::start(server).await;
        assert_eq!(names(&h.next_set().await), ["web"]);
        assert!(
            h.server
                .requests()
                .iter()
                .any(|q| q.contains("fieldSelector=spec.nodeName%3Dnode-a")),
            "{:?}",
            h.server.requests()
        );

        h.server.put(pod("u3", "db", NODE, "x:1"));
        h.server.put(pod("u4", "elsewhere", "node-b", "x:1"));
        let (op, p) = one(h.next().await);
        assert_eq!((op, p.metadata.name.as_deref()), ("update", Some("db")));

        h.server.put(pod("u1", "web", NODE, "x:2"));
        let (op, p) = one(h.next().await);
        assert_eq!((op, p.uid()), ("update", "u1"));
        let image = p.spec.as_ref().and_then(|s| s.containers[0].image.clone());
        assert_eq!(image.as_deref(), Some("x:2"));

        h.server.delete("u3");
        let (op, p) = one(h.next().await);
        assert_eq!((op, p.uid()), ("remove", "u3"));
        assert_eq!(h.server.lists(), 1);
        assert_eq!(h.errors.total(), 0);
        h.cancel.cancel();
    }

    #[tokio::test]
    async fn dropped_connection_resumes_without_losing_events_or_relisting() {
        let server = ApiServer::start().await;
        server.put(pod("u1", "web", NODE, "x:1"));
        let mut h = Harness::start(server).await;
        assert_eq!(names(&h.next_set().await), ["web"]);
        h.server.wait_watchers(1).await;
        // The connection drops; a pod arrives before the watcher is back.
        h.server.drop_watches();
        h.server.put(pod("u2", "db", NODE, "x:1"));
        let (op, p) = one(h.next().await);
        assert_eq!((op, p.uid()), ("update", "u2"));
        assert_eq!(
            h.server.lists(),
            1,
            "resumed from its resourceVersion, no relist"
        );
        h.cancel.cancel();
    }

    #[tokio::test]
    async fn bookmark_lets_the_watch_resume_past_compacted_history() {
        let server = ApiServer::start().await;
        server.put(pod("u1", "web", NODE, "x:1"));
        let mut h = Harness::start(server).await;
        assert_eq!(names(&h.next_set().await), ["web"]);
        h.server.wait_watchers(1).await;
        // Other nodes' pods move the resourceVersion on; this watch sees none of it...
        for i in 0..5 {
            h.server
                .put(pod(&format!("o{i}"), &format!("o{i}"), "node-b", "x:1"));
        }
        // ...until a bookmark tells it where history stands.
        h.server.bookmark();
        h.server.wait_bookmarks_sent(1).await;
        // History up to now is compacted and the connection drops: resuming from the bookmark's
        // resourceVersion works; resuming from the last pod event would be 410.
        h.server.compact();
        h.server.drop_watches();
        h.server.put(pod("u2", "db", NODE, "x:1"));
        let (op, p) = one(h.next().await);
        assert_eq!((op, p.uid()), ("update", "u2"));
        assert_eq!(h.server.lists(), 1, "no relist: the bookmark was used");
        assert_eq!(h.errors.get("watch_expired"), 0);
        h.cancel.cancel();
    }

    #[tokio::test]
    async fn gone_410_relists_and_resends_unchanged_pods_as_the_same_stored_pod() {
        let server = ApiServer::start().await;
        server.put(pod("u1", "web", NODE, "x:1"));
        server.put(pod("u2", "db", NODE, "x:1"));
        let mut h = Harness::start(server).await;
        let first = h.next_set().await;
        assert_eq!(names(&first), ["db", "web"]);
        h.server.wait_watchers(1).await;
        // Disconnected, the client misses db's deletion and an added pod; history is compacted.
        h.server.drop_watches_and_hold();
        h.server.delete("u2");
        h.server.put(pod("u3", "cache", NODE, "x:1"));
        h.server.compact();
        h.server.release();
        // The resumed watch gets 410 Gone; the watcher relists: one SET with the current state.
        let set = h.next_set().await;
        assert_eq!(names(&set), ["cache", "web"]);
        assert_eq!(h.server.lists(), 2);
        assert!(h.errors.get("watch_expired") >= 1);
        let web = |pods: &[StoredPod]| {
            pods.iter()
                .find(|p| p.uid() == "u1")
                .map(|p| p.arc().clone())
                .expect("web listed")
        };
        assert!(
            Arc::ptr_eq(&web(&first), &web(&set)),
            "unchanged pod re-sent as is"
        );
        h.cancel.cancel();
    }

    #[tokio::test]
    async fn kubeconfig_is_read_and_a_bad_one_is_counted_not_fatal() {
        let server = ApiServer::start().await;
        server.put(pod("u1", "web", NODE, "x:1"));
        let dir = tempfile::tempdir().expect("tempdir");
        let good = dir.path().join("kubeconfig");
        std::fs::write(&good, server.kubeconfig()).expect("write");
        let (tx, mut rx) = mpsc::channel(8);
        let errors = ErrorCounter::detached(crate::config::API);
        let cancel = CancellationToken::new();
        let cfg = Config {
            kubeconfig: good,
            node_name: NODE.to_owned(),
        };
        tokio::spawn(watch(cfg, tx, errors.clone(), cancel.clone()));
        match tokio::time::timeout(WAIT, rx.recv()).await {
            Ok(Some(SourceUpdate::Set(pods))) => assert_eq!(names(&pods), ["web"]),
            other => panic!("expected a SET, got {other:?}"),
        }
        cancel.cancel();

        let bad = dir.path().join("bad");
        std::fs::write(&bad, "apiVersion: v1\nclusters: [").expect("write");
        let Err(e) = client(&bad).await else {
            panic!("a bad kubeconfig gave a client");
        };
        assert!(e.to_string().contains("bad"), "{e}");
        let (tx, _rx) = mpsc::channel(8);
        let errors = ErrorCounter::detached(crate::config::API);
        let cancel = CancellationToken::new();
        let cfg = Config {
            kubeconfig: bad,
            node_name: NODE.to_owned(),
        };
        let task = tokio::spawn(watch(cfg, tx, errors.clone(), cancel.clone()));
        let deadline = tokio::time::Instant::now() + WAIT;
        while errors.get("kubeconfig") < 1 {
            assert!(tokio::time::Instant::now() < deadline, "not counted");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        cancel.cancel();
        tokio::time::timeout(WAIT, task)
            .await
            .expect("stops on cancel")
            .expect("no panic");
    }
}
