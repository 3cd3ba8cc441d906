//! Reading the API objects a pod refers to but does not contain (its image pull secrets, its
//! RuntimeClass, the configMaps and secrets its volumes and environment name, the
//! PersistentVolumeClaims and PersistentVolumes of its claim volumes, the services whose links
//! it gets, its service account's tokens) from the API server named by `--kubeconfig`.
//!
//! The client is built on first use (or by [`ApiObjects::warm_up`] at the agent's start) and
//! kept. Without a kubeconfig every lookup is [`Error::NoApiServer`], so a pod that needs an
//! object it cannot have waits with a reason saying so instead of running without it.
//!
//! The configMaps and secrets a pod names are watched while the pod exists
//! ([`ApiObjects::register_pod`], `watched.rs`), and every service of the cluster is listed once
//! and then watched for as long as the agent runs ([`ApiObjects::services`], `services.rs`):
//! reads of them are answered from memory.
mod services;
mod watched;

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolume, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::PostParams;
use kube::{Api, Client};
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::OnceCell;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{kind} {name:?} is needed but swiftlet has no API server (--kubeconfig is not set)")]
    NoApiServer { kind: &'static str, name: String },
    #[error(transparent)]
    Client(#[from] crate::config::api::Error),
    #[error("{kind} {name:?} not found")]
    NotFound { kind: &'static str, name: String },
    #[error("reading {kind} {name:?} from the API server: {source}")]
    Api {
        kind: &'static str,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("reading {kind} {name:?} from the API server: {message}")]
    Watch {
        kind: &'static str,
        name: String,
        message: String,
    },
    /// The list of every object of a kind has not come back whole yet: the last attempt failed.
    #[error("listing every {kind} from the API server: {message}")]
    List { kind: &'static str, message: String },
}

impl Error {
    /// The object does not exist (as opposed to: it could not be read).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::NotFound { .. })
    }
}

/// Lookups of API objects by name; cheap to clone.
#[derive(Clone, Default)]
pub struct ApiObjects {
    kubeconfig: Option<PathBuf>,
    /// Where the client built from `kubeconfig` counts its requests.
    requests: crate::metrics::rest_client::Requests,
    client: Arc<OnceCell<Client>>,
    watched: Arc<Watched>,
}

/// The configMaps and secrets registered pods name, each with its watch, and every service.
struct Watched {
    config_maps: watched::Watched<ConfigMap>,
    secrets: watched::Watched<Secret>,
    services: services::Services,
}

impl Watched {
    fn new(changes: watched::Changes) -> Self {
        Self {
            config_maps: watched::Watched::new("ConfigMap", changes.clone()),
            secrets: watched::Watched::new("Secret", changes),
            services: services::Services::default(),
        }
    }
}

impl Default for Watched {
    /// Nobody is told of changes.
    fn default() -> Self {
        Self::new(None)
    }
}

impl std::fmt::Debug for ApiObjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiObjects")
            .field("kubeconfig", &self.kubeconfig)
            .finish_non_exhaustive()
    }
}

impl ApiObjects {
    /// Lookups through the API server of `kubeconfig`; `None`: there is no API server. Changes
    /// of the watched objects are told to nobody (lookups only, with no sync loop to resync the
    /// pods that name them): the agent uses [`ApiObjects::reporting_changes`].
    pub fn new(kubeconfig: Option<PathBuf>) -> Self {
        Self {
            kubeconfig,
            requests: Default::default(),
            client: Arc::default(),
            watched: Arc::default(),
        }
    }

    /// [`ApiObjects::new`] that sends the UID of each pod that names a watched object to
    /// `changes` when the object changes (once per change and pod); its client counts its
    /// requests in `requests`.
    pub fn reporting_changes(
        kubeconfig: Option<PathBuf>,
        changes: tokio::sync::mpsc::UnboundedSender<String>,
        requests: crate::metrics::rest_client::Requests,
    ) -> Self {
        Self {
            kubeconfig,
            requests,
            client: Arc::default(),
            watched: Arc::new(Watched::new(Some(changes))),
        }
    }

    /// Lookups through an existing client.
    pub fn with_client(client: Client) -> Self {
        Self {
            kubeconfig: None,
            requests: Default::default(),
            client: Arc::new(OnceCell::new_with(Some(client))),
            watched: Arc::default(),
        }
    }

    /// Builds the client now, in the background, so that the first pod that needs an object
    /// does not wait for the kubeconfig to be read and the TLS set-up to be made, and starts
    /// the list and watch of the services, so that the first container start finds them read.
    pub fn warm_up(&self) {
        if !self.has_api_server() {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            match this.client("client", "").await {
                Ok(client) => {
                    this.watched.services.start(&client);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "building the API client for the objects pods name");
                }
            }
        });
    }

    /// Pod `pod` names the configMaps and secrets it names (`pod::api_references::
    /// named_objects`) until [`ApiObjects::release_pod`]: each is watched from now on (the watch
    /// of one that another pod named already is shared), and reads of it are answered from
    /// what its watch has seen. Without an API server nothing is watched (reads say why).
    pub async fn register_pod(&self, pod: &Pod) {
        let named = crate::pod::api_references::named_objects(pod);
        if named.is_empty() {
            return;
        }
        let Ok(client) = self.client("client", "").await else {
            return;
        };
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        for name in &named.config_maps {
            self.watched.config_maps.register(&client, ns, name, uid);
        }
        for name in &named.secrets {
            self.watched.secrets.register(&client, ns, name, uid);
        }
    }

    /// Pod `uid` has gone: the watches no other pod needs stop.
    pub fn release_pod(&self, uid: &str) {
        let stopped =
            self.watched.config_maps.unregister(uid) + self.watched.secrets.unregister(uid);
        if stopped > 0 {
            tracing::debug!(
                pod_uid = uid,
                stopped,
                "stopped watching objects no pod names"
            );
        }
    }

    /// How many configMaps and secrets are watched.
    pub fn watched(&self) -> usize {
        self.watched.config_maps.len() + self.watched.secrets.len()
    }

    /// Whether an API server is configured (a kubeconfig or a client was given).
    pub fn has_api_server(&self) -> bool {
        self.kubeconfig.is_some() || self.client.get().is_some()
    }

    async fn client(&self, kind: &'static str, name: &str) -> Result<Client, Error> {
        if let Some(c) = self.client.get() {
            return Ok(c.clone());
        }
        let Some(path) = &self.kubeconfig else {
            return Err(Error::NoApiServer {
                kind,
                name: name.to_owned(),
            });
        };
        let c = self
            .client
            .get_or_try_init(|| crate::config::api::client(path, &self.requests))
            .await?;
        Ok(c.clone())
    }

    async fn get<K>(
        &self,
        api: impl FnOnce(Client) -> Api<K>,
        kind: &'static str,
        name: &str,
    ) -> Result<K, Error>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let api = api(self.client(kind, name).await?);
        match api.get_opt(name).await {
            Ok(Some(o)) => Ok(o),
            Ok(None) => Err(Error::NotFound {
                kind,
                name: name.to_owned(),
            }),
            Err(source) => Err(Error::Api {
                kind,
                name: name.to_owned(),
                source: Box::new(source),
            }),
        }
    }

    /// The secret `namespace/name`.
    pub async fn secret(&self, namespace: &str, name: &str) -> Result<Secret, Error> {
        if let Some(got) = self.watched.secrets.get(namespace, name).await {
            return got;
        }
        self.get(|c| Api::namespaced(c, namespace), "Secret", name)
            .await
    }

    /// The configMap `namespace/name`.
    pub async fn config_map(&self, namespace: &str, name: &str) -> Result<ConfigMap, Error> {
        if let Some(got) = self.watched.config_maps.get(namespace, name).await {
            return got;
        }
        self.get(|c| Api::namespaced(c, namespace), "ConfigMap", name)
            .await
    }

    /// The service account `namespace/name`.
    pub async fn service_account(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<ServiceAccount, Error> {
        self.get(|c| Api::namespaced(c, namespace), "ServiceAccount", name)
            .await
    }

    /// The services of the cluster (all namespaces) that `wanted` picks, from the store one
    /// list and then one watch of them keep (`services.rs`; started here unless
    /// [`ApiObjects::warm_up`] started it). Before the first list has come back this waits for
    /// it; while it has failed, and no list succeeded yet, this fails naming why ([`Error::List`]).
    pub async fn services(
        &self,
        wanted: impl Fn(&Service) -> bool,
    ) -> Result<Vec<Arc<Service>>, Error> {
        let client = self.client("Service", "*").await?;
        self.watched.services.start(&client).read(wanted).await
    }

    /// A token for the service account `namespace/name` (the TokenRequest API: `POST
    /// .../serviceaccounts/{name}/token`); the answer's status holds the token and its expiry.
    pub async fn create_token(
        &self,
        namespace: &str,
        name: &str,
        request: &TokenRequest,
    ) -> Result<TokenRequest, Error> {
        let kind = "ServiceAccount token";
        let api: Api<ServiceAccount> = Api::namespaced(self.client(kind, name).await?, namespace);
        match api
            .create_subresource("token", name, &PostParams::default(), request)
            .await
        {
            Ok(t) => Ok(t),
            Err(kube::Error::Api(e)) if e.code == 404 => Err(Error::NotFound {
                kind: "ServiceAccount",
                name: name.to_owned(),
            }),
            Err(source) => Err(Error::Api {
                kind,
                name: name.to_owned(),
                source: Box::new(source),
            }),
        }
    }

    /// The PersistentVolumeClaim `namespace/name`.
    pub async fn persistent_volume_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<PersistentVolumeClaim, Error> {
        self.get(
            |c| Api::namespaced(c, namespace),
            "PersistentVolumeClaim",
            name,
        )
        .await
    }

    /// The PersistentVolume `name` (cluster-scoped).
    pub async fn persistent_volume(&self, name: &str) -> Result<PersistentVolume, Error> {
        self.get(Api::all, "PersistentVolume", name).await
    }

    /// The RuntimeClass `name` (cluster-scoped).
    pub async fn runtime_class(&self, name: &str) -> Result<RuntimeClass, Error> {
        self.get(Api::all, "RuntimeClass", name).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn without_an_api_server_lookups_say_so() {
        let o = ApiObjects::new(None);
        let e = o.secret("default", "regcred").await.unwrap_err();
        assert!(matches!(e, Error::NoApiServer { .. }), "{e}");
        assert!(e.to_string().contains("--kubeconfig"), "{e}");
        let e = o.config_map("default", "settings").await.unwrap_err();
        assert!(e.to_string().contains("ConfigMap \"settings\""), "{e}");
        let e = o.services(|_| true).await.unwrap_err();
        assert!(matches!(e, Error::NoApiServer { .. }), "{e}");
        let e = o.runtime_class("gvisor").await.unwrap_err();
        assert!(e.to_string().contains("RuntimeClass \"gvisor\""), "{e}");
    }
}
