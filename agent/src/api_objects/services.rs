//! Every service of the cluster, kept current by one list and then one watch of all namespaces
//! (`GET /api/v1/services`, then `?watch=true` from the list's resourceVersion), as the
//! kubelet's service informer keeps them for the containers' service link variables. It starts
//! once, when the agent starts with an API server (`ApiObjects::warm_up`) or on the first read,
//! and runs for as long as the agent: a container start reads memory, never the API server, so a
//! burst of starts costs the API server nothing.
//!
//! kube's reflector does the bookkeeping: a watch that ends is made again from the last
//! resourceVersion seen, a watch whose version has expired (410) or that fails is followed by a
//! new list (with the watcher's back-off), and a new list replaces what is held only once it
//! has come back whole, so reads never see half a list. What the environment never reads
//! (managed fields, annotations, the status) is dropped as objects arrive.
//!
//! Reads before the first list has come back wait for it; when it failed they fail, naming why,
//! until a list succeeds (the kubelet refuses to build an environment before its informer has
//! synced once). After that, reads answer what is held, whatever becomes of the watch.
use super::Error;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use std::sync::{Arc, OnceLock};
use tokio::sync::watch;

/// Where the store is with its first list.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Listed {
    /// The first list has not come back yet.
    Pending,
    /// The last list failed, and none has succeeded yet (the reflector keeps trying).
    Failed(String),
    /// A list came back whole: the store holds every service from then on.
    Synced,
}

/// The services store and its reflector task, started once.
#[derive(Default)]
pub(super) struct Services {
    started: OnceLock<Started>,
}

/// The store and the task that fills it.
pub(super) struct Started {
    store: Store<Service>,
    listed: watch::Receiver<Listed>,
    task: tokio::task::AbortHandle,
}

impl Drop for Started {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Services {
    /// Starts the list and watch through `client` unless they run already (a tokio runtime must
    /// be current).
    pub(super) fn start(&self, client: &Client) -> &Started {
        self.started.get_or_init(|| {
            let (store, writer) = reflector::store();
            let (tx, listed) = watch::channel(Listed::Pending);
            let task = tokio::spawn(reflect(Api::all(client.clone()), writer, tx)).abort_handle();
            Started {
                store,
                listed,
                task,
            }
        })
    }
}

impl Started {
    /// The services `wanted` picks, once a list has come back (a read before waits for the
    /// first list); an error naming why while the first list has failed and none succeeded.
    pub(super) async fn read(
        &self,
        wanted: impl Fn(&Service) -> bool,
    ) -> Result<Vec<Arc<Service>>, Error> {
        let mut listed = self.listed.clone();
        // The sender lives as long as the task, which lives as long as `self`.
        let now = listed
            .wait_for(|l| *l != Listed::Pending)
            .await
            .map_or(Listed::Pending, |l| l.clone());
        let message = match now {
            Listed::Synced => return Ok(self.store.state_filter(wanted)),
            Listed::Failed(message) => message,
            Listed::Pending => "the list and watch of services stopped".to_owned(),
        };
        Err(Error::List {
            kind: "Service",
            message,
        })
    }
}

/// Lists and watches every service into `writer` for as long as the task runs, telling `tx`
/// how the first list went.
async fn reflect(
    api: Api<Service>,
    writer: reflector::store::Writer<Service>,
    tx: watch::Sender<Listed>,
) {
    let events = watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(trim)
        .reflect(writer);
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::InitDone) => {
                if *tx.borrow() != Listed::Synced {
                    tracing::debug!("every service listed; watching them from now on");
                    tx.send_replace(Listed::Synced);
                }
            }
            Ok(_) => {}
            Err(e) => {
                let synced = *tx.borrow() == Listed::Synced;
                if synced {
                    tracing::debug!(error = %e, "watching the services (the last list is kept)");
                } else {
                    tracing::warn!(error = %e, "listing the services for the service link variables");
                    tx.send_replace(Listed::Failed(e.to_string()));
                }
            }
        }
    }
}

/// Drops what the environment never reads of a service, so that a large cluster's services
/// cost the agent less memory.
fn trim(s: &mut Service) {
    s.metadata.managed_fields = None;
    s.metadata.annotations = None;
    s.status = None;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trimming_keeps_what_the_variables_need() {
        let mut s: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "db", "namespace": "shop", "resourceVersion": "7",
                         "annotations": {"a": "b"}, "managedFields": [{"manager": "m"}]},
            "spec": {"clusterIP": "10.0.0.7", "ports": [{"port": 5432}]},
            "status": {"loadBalancer": {}},
        }))
        .unwrap();
        let spec = s.spec.clone();
        trim(&mut s);
        assert_eq!(s.metadata.name.as_deref(), Some("db"));
        assert_eq!(s.metadata.namespace.as_deref(), Some("shop"));
        assert_eq!(s.metadata.resource_version.as_deref(), Some("7"));
        assert!(s.metadata.annotations.is_none() && s.metadata.managed_fields.is_none());
        assert!(s.status.is_none());
        assert_eq!(s.spec, spec);
    }
}
