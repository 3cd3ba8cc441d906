//! An in-process API server for tests of the API-server pod source: no kube-apiserver can be
//! installed on the build machine, so this speaks the part of the protocol a pod watcher uses,
//! the way the real server does:
//!
//! - `GET /api/v1/pods?fieldSelector=spec.nodeName=N`: a `PodList` whose `metadata.resourceVersion`
//!   is the store's current version.
//! - `GET /api/v1/pods?watch=true&resourceVersion=R[&allowWatchBookmarks=true]`: a stream of
//!   newline-delimited `{"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object": ...}` events,
//!   replaying every change after R from history, then live changes. Every change bumps one
//!   global resourceVersion (changes to other nodes' pods too, which a filtered watch does not
//!   see; bookmarks carry the version past them).
//! - After [`ApiServer::compact`], a watch from a version older than the compaction answers with
//!   an `ERROR` event holding a `Status` with code 410 (`Expired`), as etcd compaction does.
//! - [`ApiServer::drop_watches`] ends every open watch response (a dropped connection).
//! - `GET /api/v1/persistentvolumes[/{name}]`: the PersistentVolumes put with
//!   [`ApiServer::put_cluster_object`] (or a 404 `Status`); their claims are namespaced objects
//!   (`persistentvolumeclaims`, below). Binding a claim to a volume is a test's step, as the
//!   PersistentVolume controller's.
//! - `GET /apis/node.k8s.io/v1/runtimeclasses/{name}`: the RuntimeClass put with
//!   [`ApiServer::put_runtime_class`], or a 404 `Status` (reason `NotFound`) as the API answers.
//! - `GET /api/v1/namespaces/{ns}/{secrets|configmaps|services|serviceaccounts|persistentvolumeclaims}/{name}`: an
//!   object put with [`ApiServer::put_object`] (or [`ApiServer::put_secret`]), or 404 with a
//!   `NotFound` `Status`, as for a missing pod. Every put bumps the object's resourceVersion.
//! - `GET /api/v1/services` and `GET /api/v1/namespaces/{ns}/services`: a `ServiceList`; the
//!   first with `watch=true&resourceVersion=R`, the changes of every namespace's services after
//!   R (ADDED, MODIFIED, DELETED) as for pods, bookmarks, 410 and dropped watches too (the
//!   agent's services store lists and then watches them so).
//! - `GET /api/v1/namespaces/{ns}/{resource}?fieldSelector=metadata.name=N`: the list of that
//!   one object (empty when it does not exist); with `watch=true&resourceVersion=R`, its changes
//!   after R (ADDED, MODIFIED, DELETED) as for pods, bookmarks, 410 and dropped watches too.
//! - `POST /api/v1/namespaces/{ns}/serviceaccounts/{name}/token`: the TokenRequest API. The
//!   account must exist (else 404); `spec.expirationSeconds` below 600 is refused with 422 as
//!   the API refuses it; the answer carries a new token (a JWT-shaped string naming the account,
//!   the audiences, the bound pod and the expiry) and `status.expirationTimestamp`, for at most
//!   the lifetime set with [`ApiServer::cap_token_lifetime`].
//! - Nodes (`/api/v1/nodes`, with `/status`) and Leases
//!   (`/apis/coordination.k8s.io/v1/namespaces/{ns}/leases`) are writable, with the API's
//!   create, replace (409 on a stale resourceVersion), merge and strategic-merge patch and
//!   delete-with-preconditions semantics (see the `writable` module).
//! - Pods take status patches and graceful deletes as the API does (see the `pod_writes`
//!   module).
//! - [`ApiServer::set_available`]`(false)` answers every request with 503, an API server that
//!   is down; every request's method and path is logged ([`ApiServer::request_log`]).
//! - [`ApiServer::black_hole`]`(true)` stops answering without closing anything, as a load
//!   balancer failing over or a dropped NAT entry does: requests on the connections open then or
//!   made meanwhile are never answered (they are logged), and those connections stay dead for
//!   good after `black_hole(false)`; only connections made after it are answered again.
//! - [`ApiServer::start_tls`] serves HTTPS and authenticates every request (client certificate
//!   or bearer token, else 401; see the `tls` module); [`ApiServer::forbid`] answers requests to
//!   matching paths with 403, as RBAC or the node authorizer refuses them. A node's
//!   credentials (`system:node:<name>`) read only the claims and PersistentVolumes its own pods
//!   use, as the node authorizer's graph allows (the `node_authorizer` module).
//! - TokenReviews and SubjectAccessReviews answer a kubelet API's webhooks from what a test set
//!   (see the `reviews` module).

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Pod, PodSpec, Secret, Service, ServiceAccount, ServicePort, ServiceSpec,
};
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio::sync::{mpsc, watch};

mod node_authorizer;
mod pod_writes;
mod reviews;
mod tls;
mod writable;

pub use pod_writes::PodWrite;
pub use tls::{CERT_USER, Credential, Material, TOKEN_USER};

/// A pod named `name` with UID `uid`, bound to `node`, one container running `image`.
pub fn pod(uid: &str, name: &str, node: &str, image: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some("default".to_owned()),
            uid: Some(uid.to_owned()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.to_owned()),
            containers: vec![Container {
                name: "c".to_owned(),
                image: Some(image.to_owned()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    }
}

/// The metadata of object `default/name`.
fn default_meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some("default".to_owned()),
        ..Default::default()
    }
}

/// A configMap `default/name` holding `data`.
pub fn config_map(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: default_meta(name),
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        ),
        ..Default::default()
    }
}

/// An `Opaque` secret `default/name` holding `data`.
pub fn opaque_secret(name: &str, data: &[(&str, &[u8])]) -> Secret {
    Secret {
        metadata: default_meta(name),
        type_: Some("Opaque".to_owned()),
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).to_owned(), k8s_openapi::ByteString(v.to_vec())))
                .collect(),
        ),
        ..Default::default()
    }
}

/// A ClusterIP service `namespace/name` at `ip` with one TCP port.
pub fn service(name: &str, namespace: &str, ip: &str, port: i32) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some(ip.to_owned()),
            ports: Some(vec![ServicePort {
                port,
                protocol: Some("TCP".to_owned()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

/// A service account `default/name`.
pub fn service_account(name: &str) -> ServiceAccount {
    ServiceAccount {
        metadata: default_meta(name),
        ..Default::default()
    }
}

/// A RuntimeClass named `name` whose pods run with the CRI runtime handler `handler`.
pub fn runtime_class(name: &str, handler: &str) -> RuntimeClass {
    RuntimeClass {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        handler: handler.to_owned(),
        overhead: None,
        scheduling: None,
    }
}

/// A change of a namespaced object: (resourceVersion, event type, (plural resource name,
/// namespace, name), the object).
type ObjectEvent = (
    u64,
    &'static str,
    (String, String, String),
    serde_json::Value,
);

#[derive(Default)]
struct Store {
    rv: u64,
    pods: BTreeMap<String, Pod>,
    /// Namespaced objects as JSON, by (plural resource name, namespace, name).
    objects: BTreeMap<(String, String, String), serde_json::Value>,
    /// Nodes and leases, as JSON (see the `writable` module).
    writable: BTreeMap<writable::Key, serde_json::Value>,
    /// Their changes: (resourceVersion, event type, key, object).
    writable_history: Vec<(u64, &'static str, writable::Key, serde_json::Value)>,
    /// UIDs given out so far.
    uids: u64,
    /// Answer every request with 503 while set.
    unavailable: bool,
    /// Connections accepted so far (each request carries its connection's number, [`Conn`]).
    connections: u64,
    /// Never answer a request while set ([`ApiServer::black_hole`]).
    black_hole: bool,
    /// Never answer a request on a connection numbered below this (connections a black hole
    /// killed).
    dead_below: u64,
    /// Requests whose path contains one of these get 403.
    forbidden: Vec<String>,
    /// HTTPS only: requests by the user they authenticated as (`""`: refused with 401).
    users: BTreeMap<String, usize>,
    /// (when, method, path) of every request.
    request_log: Vec<(std::time::Instant, String, String)>,
    /// Every pod status patch and pod delete.
    pod_writes: Vec<PodWrite>,
    /// Every TokenRequest answered: (namespace, service account, the request's spec).
    token_requests: Vec<(String, String, serde_json::Value)>,
    /// The longest token lifetime granted, in seconds (the API server's
    /// `--service-account-max-token-expiration`); `None`: what is asked for.
    max_token_seconds: Option<i64>,
    /// Cluster-scoped: by name.
    runtime_classes: BTreeMap<String, RuntimeClass>,
    runtime_class_gets: usize,
    /// (resourceVersion, event type, object) of every change after `compacted`.
    history: Vec<(u64, &'static str, Pod)>,
    /// The same for the namespaced objects: (resourceVersion, event type, key, object).
    object_history: Vec<ObjectEvent>,
    /// Watches from a version older than this get 410.
    compacted: u64,
    /// Bumped to end every open watch.
    epoch: u64,
    /// Bumped to ask open watches for a bookmark.
    bookmark_seq: u64,
    bookmarks_sent: usize,
    /// New watch requests wait while this is set.
    hold: bool,
    lists: usize,
    open_watches: usize,
    /// Open watches of namespaced objects (configMaps, secrets ...), apart from pod watches.
    open_object_watches: usize,
    /// Open watches of one resource in every namespace (`GET /api/v1/services?watch=true`).
    open_cluster_wide_watches: usize,
    /// Open watches of Nodes and Leases.
    open_writable_watches: usize,
    /// Reads of namespaced objects, by plural resource name.
    object_reads: BTreeMap<String, ObjectReads>,
    requests: Vec<String>,
    reviews: reviews::Reviews,
}

/// How often objects of one resource were read: GETs of one object, lists, watch requests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ObjectReads {
    pub gets: usize,
    pub lists: usize,
    pub watches: usize,
}

/// An agent pointed at a new in-process API server, with what keeps them alive (the server's
/// tokio runtime and the kubeconfig's directory).
pub struct Cluster {
    pub tokio: tokio::runtime::Runtime,
    pub server: ApiServer,
    _kubeconfig: tempfile::TempDir,
    pub agent: crate::Agent,
}

impl Cluster {
    /// Starts the server, runs `before` on it, then the agent with `opts` and `--kubeconfig`.
    pub fn start(
        rt: &crate::Runtime,
        opts: crate::AgentOptions,
        before: impl FnOnce(&ApiServer),
    ) -> Cluster {
        Self::start_with(rt, opts, None, before)
    }

    /// [`Cluster::start`], with an HTTPS server (see [`ApiServer::start_tls`]) and a kubeconfig
    /// carrying `credential` when `tls` is given.
    pub fn start_with(
        rt: &crate::Runtime,
        mut opts: crate::AgentOptions,
        tls: Option<Credential>,
        before: impl FnOnce(&ApiServer),
    ) -> Cluster {
        let tokio = tokio::runtime::Runtime::new().expect("a tokio runtime");
        let server = match tls {
            None => tokio.block_on(ApiServer::start()),
            Some(_) => tokio.block_on(ApiServer::start_tls()),
        };
        before(&server);
        let kubeconfig = server.point_agent_as(&mut opts, tls.unwrap_or(Credential::Token));
        let agent = crate::Agent::start(rt, opts);
        Cluster {
            tokio,
            server,
            _kubeconfig: kubeconfig,
            agent,
        }
    }
}

#[derive(Clone)]
pub struct ApiServer {
    store: Arc<Mutex<Store>>,
    /// Pinged on every change to the store.
    changed: Arc<watch::Sender<u64>>,
    addr: std::net::SocketAddr,
    /// The certificates of an HTTPS server.
    tls: Option<Arc<Material>>,
}

impl ApiServer {
    pub async fn start() -> ApiServer {
        Self::start_on(None).await
    }

    /// An HTTPS server with new certificates (see [`Material`]): every request must carry the
    /// client certificate or the bearer token of [`ApiServer::kubeconfig_as`].
    pub async fn start_tls() -> ApiServer {
        let material = Material::make().expect("test certificates (openssl)");
        Self::start_on(Some(Arc::new(material))).await
    }

    async fn start_on(tls: Option<Arc<Material>>) -> ApiServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let server = ApiServer {
            store: Arc::default(),
            changed: Arc::new(watch::channel(0).0),
            addr,
            tls,
        };
        let app = axum::Router::new()
            .route("/api", axum::routing::get(api_versions))
            .route("/apis", axum::routing::get(api_groups))
            .route("/api/v1", axum::routing::get(api_resources))
            .route("/api/v1/pods", axum::routing::get(pods))
            .route("/api/v1/services", axum::routing::get(all_services))
            .route(
                "/api/v1/namespaces/{ns}/{resource}",
                axum::routing::get(namespaced_list).post(pod_writes::create),
            )
            .route(
                "/api/v1/namespaces/{ns}/{resource}/{name}",
                axum::routing::get(one_namespaced).delete(pod_writes::delete),
            )
            .route(
                "/api/v1/namespaces/{ns}/{resource}/{name}/status",
                axum::routing::patch(pod_writes::patch_status),
            )
            .route(
                "/api/v1/namespaces/{ns}/serviceaccounts/{name}/token",
                axum::routing::post(create_token),
            )
            .route(
                "/apis/authentication.k8s.io/v1/tokenreviews",
                axum::routing::post(reviews::token_review),
            )
            .route(
                "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                axum::routing::post(reviews::access_review),
            )
            .route("/apis/node.k8s.io/v1", axum::routing::get(node_resources))
            .route(
                "/apis/coordination.k8s.io/v1",
                axum::routing::get(coordination_resources),
            )
            .merge(writable::routes(writable::NODES, "/api/v1/nodes"))
            .merge(writable::routes(
                writable::LEASES,
                "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases",
            ))
            .route(
                "/apis/node.k8s.io/v1/runtimeclasses/{name}",
                axum::routing::get(one_runtime_class),
            )
            .route(
                "/api/v1/persistentvolumes",
                axum::routing::get(persistent_volumes),
            )
            .route(
                "/api/v1/persistentvolumes/{name}",
                axum::routing::get(one_persistent_volume),
            )
            .layer(axum::middleware::from_fn_with_state(
                server.clone(),
                log_and_gate,
            ))
            .with_state(server.clone());
        match &server.tls {
            Some(material) => material.serve(listener, app, server.clone()),
            None => {
                let numbering = server.clone();
                tokio::spawn(async move {
                    while let Ok((tcp, _)) = listener.accept().await {
                        let conn = numbering.connection_opened();
                        let svc = tower::ServiceExt::map_request(
                            app.clone(),
                            move |mut r: axum::http::Request<hyper::body::Incoming>| {
                                r.extensions_mut().insert(conn);
                                r
                            },
                        );
                        let svc = hyper_util::service::TowerToHyperService::new(svc);
                        tokio::spawn(async move {
                            let _ = hyper::server::conn::http1::Builder::new()
                                .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                                .with_upgrades()
                                .await;
                        });
                    }
                });
            }
        }
        server
    }

    fn lock(&self) -> MutexGuard<'_, Store> {
        self.store
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn notify(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    /// A client of this server.
    pub fn client(&self) -> kube::Client {
        let url = format!("http://{}", self.addr).parse().expect("url");
        kube::Client::try_from(kube::Config::new(url)).expect("client")
    }

    /// A kubeconfig naming this server (for an HTTPS server: with its bearer token).
    pub fn kubeconfig(&self) -> String {
        self.kubeconfig_as(Credential::Token)
    }

    /// A kubeconfig naming this server; for an HTTPS server, with the CA and `credential`.
    pub fn kubeconfig_as(&self, credential: Credential) -> String {
        let (cluster, user) = match &self.tls {
            None => (format!("server: http://{}", self.addr), "{}".to_owned()),
            Some(material) => {
                let (ca, user) = material.kubeconfig_parts(credential);
                let cluster = format!(
                    "server: https://{}\n    certificate-authority-data: {ca}",
                    self.addr
                );
                (cluster, user)
            }
        };
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    {cluster}\n\
             users:\n- name: test\n  user: {user}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: test\n\
             current-context: test\n"
        )
    }

    /// [`ApiServer::kubeconfig`] written to `kubeconfig` in a new temporary directory (keep it
    /// while the file is used).
    pub fn kubeconfig_file(&self) -> (tempfile::TempDir, std::path::PathBuf) {
        self.kubeconfig_file_as(Credential::Token)
    }

    /// [`ApiServer::kubeconfig_as`] written to a file, as [`ApiServer::kubeconfig_file`].
    pub fn kubeconfig_file_as(
        &self,
        credential: Credential,
    ) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, self.kubeconfig_as(credential)).expect("write kubeconfig");
        (dir, kubeconfig)
    }

    /// Points an agent at this server: writes [`ApiServer::kubeconfig`] into a new temporary
    /// directory and adds `--kubeconfig` to `opts`. Keep the directory while the agent runs.
    pub fn point_agent(&self, opts: &mut crate::AgentOptions) -> tempfile::TempDir {
        self.point_agent_as(opts, Credential::Token)
    }

    /// [`ApiServer::point_agent`] with a kubeconfig carrying `credential`.
    pub fn point_agent_as(
        &self,
        opts: &mut crate::AgentOptions,
        credential: Credential,
    ) -> tempfile::TempDir {
        let (dir, kubeconfig) = self.kubeconfig_file_as(credential);
        opts.extra_args
            .extend(["--kubeconfig".into(), kubeconfig.display().to_string()]);
        dir
    }

    /// The pod `namespace/name`, as stored.
    pub fn pod_named(&self, namespace: &str, name: &str) -> Option<Pod> {
        self.lock()
            .pods
            .values()
            .find(|p| {
                p.metadata.name.as_deref() == Some(name)
                    && p.metadata.namespace.as_deref().unwrap_or("default") == namespace
            })
            .cloned()
    }

    /// The node named `name`, as stored.
    pub fn node(&self, name: &str) -> Option<k8s_openapi::api::core::v1::Node> {
        let v = self.writable(writable::NODES, "", name)?;
        Some(serde_json::from_value(v).expect("a stored node parses"))
    }

    /// The lease `namespace/name`, as stored.
    pub fn lease(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<k8s_openapi::api::coordination::v1::Lease> {
        let v = self.writable(writable::LEASES, namespace, name)?;
        Some(serde_json::from_value(v).expect("a stored lease parses"))
    }

    /// Creates `node` as a client would (the server sets its UID, which is returned).
    ///
    /// # Panics
    /// When a Node of that name exists.
    pub fn create_node(&self, node: &k8s_openapi::api::core::v1::Node) -> String {
        let v = serde_json::to_value(node).expect("a node serializes");
        let created = self
            .create_object(writable::NODES, "", v)
            .unwrap_or_else(|e| panic!("creating the node: {e:?}"));
        created["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// Removes node `name` (as `kubectl delete node` would).
    pub fn delete_node(&self, name: &str) {
        let mut s = self.lock();
        s.rv += 1;
        let key = ("nodes", String::new(), name.to_owned());
        if let Some(mut gone) = s.writable.remove(&key) {
            let rv = s.rv;
            gone["metadata"]["resourceVersion"] = rv.to_string().into();
            s.writable_history.push((rv, "DELETED", key, gone));
        }
        drop(s);
        self.notify();
    }

    /// `false`: every request is answered with 503 Service Unavailable until set back.
    pub fn set_available(&self, available: bool) {
        self.lock().unavailable = !available;
    }

    /// `true`: stop answering, leaving every connection open. `false`: answer again on new
    /// connections; the ones open during the black hole stay unanswered for good.
    pub fn black_hole(&self, on: bool) {
        let mut s = self.lock();
        s.black_hole = on;
        if !on {
            s.dead_below = s.connections;
        }
    }

    /// Numbers a new connection.
    pub(crate) fn connection_opened(&self) -> Conn {
        let mut s = self.lock();
        s.connections += 1;
        Conn(s.connections - 1)
    }

    /// (when, method, path) of every request so far.
    pub fn request_log(&self) -> Vec<(std::time::Instant, String, String)> {
        self.lock().request_log.clone()
    }

    /// Answers requests whose path contains `fragment` with 403 from now on.
    pub fn forbid(&self, fragment: &str) {
        self.lock().forbidden.push(fragment.to_owned());
    }

    /// Undoes [`ApiServer::forbid`]`(fragment)`: such requests are answered again.
    pub fn unforbid(&self, fragment: &str) {
        self.lock().forbidden.retain(|f| f != fragment);
    }

    /// HTTPS only: how many requests each user made (`""`: refused with 401).
    pub fn users(&self) -> BTreeMap<String, usize> {
        self.lock().users.clone()
    }

    /// The address the server listens on.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// Creates or replaces a pod (ADDED or MODIFIED); its `creationTimestamp` is set at
    /// creation when it has none, and kept by a replacement that has none.
    pub fn put(&self, mut pod: Pod) {
        let mut s = self.lock();
        s.rv += 1;
        let rv = s.rv;
        pod.metadata.resource_version = Some(rv.to_string());
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        // Set at creation and kept, as the API server does (the kubelet admits by it).
        let created = s
            .pods
            .get(&uid)
            .and_then(|p| p.metadata.creation_timestamp.clone());
        let kind = if created.is_some() || s.pods.contains_key(&uid) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        if pod.metadata.creation_timestamp.is_none() {
            pod.metadata.creation_timestamp = created.or_else(|| {
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::now(),
                ))
            });
        }
        s.pods.insert(uid, pod.clone());
        s.history.push((rv, kind, pod));
        drop(s);
        self.notify();
    }

    /// Creates or replaces a secret (its namespace defaults to `default`).
    pub fn put_secret(&self, secret: Secret) {
        self.put_object(secret);
    }

    /// Creates or replaces a namespaced core object (a secret, configMap, service or service
    /// account; its namespace defaults to `default`), with a new resourceVersion and, on
    /// creation, a UID.
    pub fn put_object<K>(&self, object: K)
    where
        K: kube::Resource<DynamicType = ()> + serde::Serialize,
    {
        let mut v = serde_json::to_value(&object).expect("object serializes");
        let meta = &mut v["metadata"];
        if meta["namespace"].is_null() {
            meta["namespace"] = "default".into();
        }
        self.store_object::<K>(v);
    }

    /// Creates or replaces a cluster-scoped core object (a PersistentVolume), as
    /// [`ApiServer::put_object`] does a namespaced one.
    pub fn put_cluster_object<K>(&self, object: K)
    where
        K: kube::Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope>
            + serde::Serialize,
    {
        let mut v = serde_json::to_value(&object).expect("object serializes");
        v["metadata"]
            .as_object_mut()
            .expect("metadata")
            .remove("namespace");
        self.store_object::<K>(v);
    }

    /// The stored object of kind `K` named `namespace/name` (`namespace` empty for a
    /// cluster-scoped one).
    pub fn object<K>(&self, namespace: &str, name: &str) -> Option<K>
    where
        K: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned,
    {
        let key = (
            K::plural(&()).into_owned(),
            namespace.to_owned(),
            name.to_owned(),
        );
        let v = self.lock().objects.get(&key).cloned()?;
        Some(serde_json::from_value(v).expect("a stored object decodes"))
    }

    fn store_object<K: kube::Resource<DynamicType = ()>>(&self, mut v: serde_json::Value) {
        v["kind"] = K::kind(&()).as_ref().into();
        v["apiVersion"] = K::api_version(&()).as_ref().into();
        let plural = K::plural(&()).into_owned();
        let meta = &v["metadata"];
        let ns = meta["namespace"].as_str().unwrap_or_default().to_owned();
        let name = meta["name"].as_str().unwrap_or_default().to_owned();
        let mut s = self.lock();
        s.rv += 1;
        v["metadata"]["resourceVersion"] = s.rv.to_string().into();
        let key = (plural, ns, name);
        let uid = s.objects.get(&key).map_or_else(
            || format!("{}-{}-{}", key.0, key.1, key.2),
            |old| {
                old["metadata"]["uid"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            },
        );
        v["metadata"]["uid"] = uid.into();
        let kind = if s.objects.contains_key(&key) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        let rv = s.rv;
        s.object_history.push((rv, kind, key.clone(), v.clone()));
        s.objects.insert(key, v);
        drop(s);
        self.notify();
    }

    /// Deletes the namespaced object of kind `K` named `namespace/name`.
    pub fn delete_object<K: kube::Resource<DynamicType = ()>>(&self, namespace: &str, name: &str) {
        let mut s = self.lock();
        let key = (
            K::plural(&()).into_owned(),
            namespace.to_owned(),
            name.to_owned(),
        );
        if let Some(mut gone) = s.objects.remove(&key) {
            s.rv += 1;
            let rv = s.rv;
            gone["metadata"]["resourceVersion"] = rv.to_string().into();
            s.object_history.push((rv, "DELETED", key, gone));
            drop(s);
            self.notify();
        }
    }

    /// Grants tokens of at most `seconds` (the answer's `spec.expirationSeconds` and expiry say
    /// so), as an API server with a maximum token expiration does.
    pub fn cap_token_lifetime(&self, seconds: i64) {
        self.lock().max_token_seconds = Some(seconds);
    }

    /// Every TokenRequest answered so far: (namespace, service account, the request's spec).
    pub fn token_requests(&self) -> Vec<(String, String, serde_json::Value)> {
        self.lock().token_requests.clone()
    }

    /// Deletes a pod (DELETED, carrying the deletion's resourceVersion).
    pub fn delete(&self, uid: &str) {
        let mut s = self.lock();
        let Some(mut pod) = s.pods.remove(uid) else {
            return;
        };
        s.rv += 1;
        pod.metadata.resource_version = Some(s.rv.to_string());
        let rv = s.rv;
        s.history.push((rv, "DELETED", pod));
        drop(s);
        self.notify();
    }

    /// Creates or replaces a RuntimeClass. Its change bumps the one resourceVersion the whole
    /// store shares, as every change does on a real API server (pod watches do not see it).
    pub fn put_runtime_class(&self, mut class: RuntimeClass) {
        let mut s = self.lock();
        s.rv += 1;
        class.metadata.resource_version = Some(s.rv.to_string());
        let name = class.metadata.name.clone().unwrap_or_default();
        class
            .metadata
            .uid
            .get_or_insert_with(|| format!("runtimeclass-{name}"));
        s.runtime_classes.insert(name, class);
    }

    /// Deletes the RuntimeClass `name`.
    pub fn delete_runtime_class(&self, name: &str) {
        let mut s = self.lock();
        if s.runtime_classes.remove(name).is_some() {
            s.rv += 1;
        }
    }

    /// How many `GET .../runtimeclasses/{name}` the server answered.
    pub fn runtime_class_gets(&self) -> usize {
        self.lock().runtime_class_gets
    }

    /// Forgets all history: watches from older versions get 410 Gone.
    pub fn compact(&self) {
        let mut s = self.lock();
        s.history.clear();
        s.object_history.clear();
        s.writable_history.clear();
        s.compacted = s.rv;
    }

    /// Ends every open watch response.
    pub fn drop_watches(&self) {
        self.lock().epoch += 1;
        self.notify();
    }

    /// Ends every open watch and makes new watch requests wait until [`ApiServer::release`].
    pub fn drop_watches_and_hold(&self) {
        let mut s = self.lock();
        s.hold = true;
        s.epoch += 1;
        drop(s);
        self.notify();
    }

    pub fn release(&self) {
        self.lock().hold = false;
        self.notify();
    }

    /// Asks every open watch that allows bookmarks for one.
    pub fn bookmark(&self) {
        self.lock().bookmark_seq += 1;
        self.notify();
    }

    pub fn lists(&self) -> usize {
        self.lock().lists
    }

    pub fn requests(&self) -> Vec<String> {
        self.lock().requests.clone()
    }

    /// How often the namespaced `resource` (plural: `configmaps`, `secrets` ...) was read.
    pub fn object_reads(&self, resource: &str) -> ObjectReads {
        self.lock()
            .object_reads
            .get(resource)
            .copied()
            .unwrap_or_default()
    }

    /// Open watches of namespaced objects (pod watches apart).
    pub fn open_object_watches(&self) -> usize {
        self.lock().open_object_watches
    }

    /// Open watches of one resource in every namespace (services).
    pub fn open_cluster_wide_watches(&self) -> usize {
        self.lock().open_cluster_wide_watches
    }

    async fn until(&self, what: &str, mut done: impl FnMut(&Store) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !done(&self.lock()) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "server never saw {what}"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    pub async fn wait_watchers(&self, n: usize) {
        self.until("the watchers", |s| s.open_watches >= n).await;
    }

    pub async fn wait_bookmarks_sent(&self, n: usize) {
        self.until("the bookmarks sent", |s| s.bookmarks_sent >= n)
            .await;
    }
}

fn on_node(pod: &Pod, node: Option<&str>) -> bool {
    node.is_none_or(|n| pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(n))
}

fn line(kind: &str, object: &impl serde::Serialize) -> Bytes {
    let mut v = serde_json::to_vec(&serde_json::json!({ "type": kind, "object": object }))
        .expect("event serializes");
    v.push(b'\n');
    Bytes::from(v)
}

/// Discovery, as a client such as kubectl asks it first: the core group's versions.
async fn api_versions() -> Response {
    axum::Json(serde_json::json!({
        "kind": "APIVersions", "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}],
    }))
    .into_response()
}

/// Every request is logged; while the server is unavailable it is answered with 503.
/// The number of the connection a request came on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Conn(u64);

async fn log_and_gate(
    State(server): State<ApiServer>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let user = server.tls.as_ref().map(|_| {
        let authorization = request
            .headers()
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        Material::authenticate(request.extensions().get(), authorization).unwrap_or_default()
    });
    let path = request.uri().path().to_owned();
    let conn = request.extensions().get::<Conn>().map_or(0, |c| c.0);
    let node = user
        .as_deref()
        .and_then(|u| u.strip_prefix("system:node:"))
        .filter(|_| request.method() == axum::http::Method::GET);
    let (unavailable, forbidden, dead, not_related) = {
        let mut s = server.lock();
        let not_related = node.and_then(|n| node_authorizer::refuses(&s, n, &path));
        let entry = (
            std::time::Instant::now(),
            request.method().to_string(),
            path.clone(),
        );
        s.request_log.push(entry);
        if let Some(user) = &user {
            *s.users.entry(user.clone()).or_default() += 1;
        }
        let forbidden = s.forbidden.iter().any(|f| path.contains(f.as_str()));
        let dead = s.black_hole || conn < s.dead_below;
        (s.unavailable, forbidden, dead, not_related)
    };
    if dead {
        // Black-holed: no answer, the connection left open.
        return std::future::pending().await;
    }
    if unavailable {
        return axum::http::StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    let user = match user.as_deref() {
        Some("") => {
            let code = axum::http::StatusCode::UNAUTHORIZED;
            return writable::error(code, "Unauthorized", "Unauthorized".into()).into_response();
        }
        Some(u) => u,
        None => "system:anonymous",
    };
    if forbidden {
        let why = format!(
            "forbidden: User \"{user}\" cannot {} {path}",
            request.method()
        );
        return writable::error(axum::http::StatusCode::FORBIDDEN, "Forbidden", why)
            .into_response();
    }
    if let Some(why) = not_related {
        return writable::error(axum::http::StatusCode::FORBIDDEN, "Forbidden", why)
            .into_response();
    }
    next.run(request).await
}

/// Discovery: the named API groups served, `node.k8s.io` and `coordination.k8s.io`.
async fn api_groups() -> Response {
    let groups: Vec<serde_json::Value> = ["node.k8s.io", "coordination.k8s.io"]
        .iter()
        .map(|name| {
            let v1 = serde_json::json!({"groupVersion": format!("{name}/v1"), "version": "v1"});
            serde_json::json!({"name": name, "versions": [v1], "preferredVersion": v1})
        })
        .collect();
    axum::Json(serde_json::json!({
        "kind": "APIGroupList", "apiVersion": "v1", "groups": groups,
    }))
    .into_response()
}

/// Discovery: `coordination.k8s.io/v1` serves leases.
async fn coordination_resources() -> Response {
    axum::Json(serde_json::json!({
        "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "coordination.k8s.io/v1",
        "resources": [{
            "name": "leases", "singularName": "lease", "namespaced": true, "kind": "Lease",
            "verbs": ["create", "delete", "get", "list", "patch", "update"],
        }],
    }))
    .into_response()
}

/// Discovery: `node.k8s.io/v1` serves runtimeclasses (get).
async fn node_resources() -> Response {
    axum::Json(serde_json::json!({
        "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "node.k8s.io/v1",
        "resources": [{
            "name": "runtimeclasses", "singularName": "runtimeclass", "namespaced": false,
            "kind": "RuntimeClass", "verbs": ["get"],
        }],
    }))
    .into_response()
}

/// The API's answer to a GET of an object that does not exist: 404 with a `Status` whose
/// reason is `NotFound` (what clients such as kube's `get_opt` look for).
fn not_found(group: &str, resource: &str, name: &str) -> Response {
    let qualified = if group.is_empty() {
        resource.to_owned()
    } else {
        format!("{resource}.{group}")
    };
    (
        axum::http::StatusCode::NOT_FOUND,
        axum::Json(serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("{qualified} \"{name}\" not found"), "reason": "NotFound",
            "details": {"name": name, "group": group, "kind": resource}, "code": 404,
        })),
    )
        .into_response()
}

/// `GET /apis/node.k8s.io/v1/runtimeclasses/{name}`: the class, or a 404 `Status`.
async fn one_runtime_class(
    State(server): State<ApiServer>,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> Response {
    let mut s = server.lock();
    s.runtime_class_gets += 1;
    match s.runtime_classes.get(&name) {
        // k8s-openapi writes the kind and apiVersion.
        Some(c) => axum::Json(c.clone()).into_response(),
        None => not_found("node.k8s.io", "runtimeclasses", &name),
    }
}

/// `GET /api/v1/persistentvolumes`: every stored PersistentVolume.
async fn persistent_volumes(State(server): State<ApiServer>) -> Response {
    object_list(&server.lock(), "persistentvolumes", Some(""), None)
}

/// `GET /api/v1/persistentvolumes/{name}`: the PersistentVolume, or a 404 `Status`.
async fn one_persistent_volume(
    State(server): State<ApiServer>,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> Response {
    let mut s = server.lock();
    let resource = "persistentvolumes".to_owned();
    s.object_reads.entry(resource.clone()).or_default().gets += 1;
    match s.objects.get(&(resource, String::new(), name.clone())) {
        Some(o) => axum::Json(o.clone()).into_response(),
        None => not_found("", "persistentvolumes", &name),
    }
}

/// Discovery: the core group serves pods (get, list, watch).
async fn api_resources() -> Response {
    axum::Json(serde_json::json!({
        "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "v1",
        "resources": [{
            "name": "nodes", "singularName": "node", "namespaced": false, "kind": "Node",
            "verbs": ["create", "delete", "get", "list", "patch", "update"], "shortNames": ["no"],
        }, {
            "name": "nodes/status", "singularName": "", "namespaced": false, "kind": "Node",
            "verbs": ["get", "patch", "update"],
        }, {
            "name": "pods", "singularName": "pod", "namespaced": true, "kind": "Pod",
            "verbs": ["get", "list", "watch"], "shortNames": ["po"],
        }, {
            "name": "secrets", "singularName": "secret", "namespaced": true, "kind": "Secret",
            "verbs": ["get", "list"],
        }, {
            "name": "configmaps", "singularName": "configmap", "namespaced": true,
            "kind": "ConfigMap", "verbs": ["get", "list"], "shortNames": ["cm"],
        }, {
            "name": "services", "singularName": "service", "namespaced": true, "kind": "Service",
            "verbs": ["get", "list", "watch"], "shortNames": ["svc"],
        }, {
            "name": "persistentvolumeclaims", "singularName": "persistentvolumeclaim",
            "namespaced": true, "kind": "PersistentVolumeClaim", "verbs": ["get", "list"],
            "shortNames": ["pvc"],
        }, {
            "name": "persistentvolumes", "singularName": "persistentvolume", "namespaced": false,
            "kind": "PersistentVolume", "verbs": ["get", "list"], "shortNames": ["pv"],
        }, {
            "name": "serviceaccounts", "singularName": "serviceaccount", "namespaced": true,
            "kind": "ServiceAccount", "verbs": ["get", "list"], "shortNames": ["sa"],
        }, {
            "name": "serviceaccounts/token", "singularName": "", "namespaced": true,
            "group": "authentication.k8s.io", "version": "v1", "kind": "TokenRequest",
            "verbs": ["create"],
        }],
    }))
    .into_response()
}

/// `GET /api/v1/namespaces/{ns}/{resource}/{name}`: the pod or stored object, or a 404
/// `Status` as the API answers.
async fn one_namespaced(
    State(server): State<ApiServer>,
    axum::extract::Path((ns, resource, name)): axum::extract::Path<(String, String, String)>,
) -> Response {
    let mut s = server.lock();
    s.object_reads.entry(resource.clone()).or_default().gets += 1;
    if resource == "pods" {
        let found = s.pods.values().find(|p| {
            p.metadata.name.as_deref() == Some(name.as_str())
                && p.metadata.namespace.as_deref().unwrap_or("default") == ns
        });
        return match found {
            Some(p) => axum::Json(p.clone()).into_response(),
            None => not_found("", "pods", &name),
        };
    }
    match s.objects.get(&(resource.clone(), ns, name.clone())) {
        Some(o) => axum::Json(o.clone()).into_response(),
        None => not_found("", &resource, &name),
    }
}

/// A `<Kind>List` of the stored `resource` objects, of one namespace or of all, and of one name
/// when `name` is given (`fieldSelector=metadata.name=N`).
fn object_list(s: &Store, resource: &str, ns: Option<&str>, name: Option<&str>) -> Response {
    let items: Vec<&serde_json::Value> = s
        .objects
        .iter()
        .filter(|((r, n, o), _)| {
            r == resource && ns.is_none_or(|ns| ns == n) && name.is_none_or(|name| name == o)
        })
        .map(|(_, v)| v)
        .collect();
    let kind = items
        .first()
        .and_then(|v| v["kind"].as_str())
        .map_or_else(|| "List".to_owned(), |k| format!("{k}List"));
    axum::Json(serde_json::json!({
        "kind": kind, "apiVersion": "v1",
        "metadata": { "resourceVersion": s.rv.to_string() },
        "items": items,
    }))
    .into_response()
}

/// `GET /api/v1/services`: every service of every namespace; with `watch=true`, a watch of them.
async fn all_services(
    State(server): State<ApiServer>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    list_or_watch(server, q, "services".to_owned(), None, None).await
}

/// `GET /api/v1/namespaces/{ns}/{resource}[?fieldSelector=metadata.name=N]`: the namespace's
/// stored objects of that resource (of that name); with `watch=true`, a watch of them.
async fn namespaced_list(
    State(server): State<ApiServer>,
    axum::extract::Path((ns, resource)): axum::extract::Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let name = q
        .get("fieldSelector")
        .and_then(|f| f.strip_prefix("metadata.name="))
        .map(str::to_owned);
    list_or_watch(server, q, resource, Some(ns), name).await
}

/// The stored `resource` objects of namespace `ns` (every namespace when `None`) and of name
/// `name` (any when `None`) as a list, or with `watch=true` their changes after the request's
/// resourceVersion (see [`watch_response`]). Counted in [`ApiServer::object_reads`].
async fn list_or_watch(
    server: ApiServer,
    q: HashMap<String, String>,
    resource: String,
    ns: Option<String>,
    name: Option<String>,
) -> Response {
    let watching = q.get("watch").is_some_and(|w| w == "true" || w == "1");
    if !watching {
        let mut s = server.lock();
        s.object_reads.entry(resource.clone()).or_default().lists += 1;
        return object_list(&s, &resource, ns.as_deref(), name.as_deref());
    }
    server
        .lock()
        .object_reads
        .entry(resource.clone())
        .or_default()
        .watches += 1;
    let kind = match resource.as_str() {
        "configmaps" => "ConfigMap",
        "secrets" => "Secret",
        "services" => "Service",
        "serviceaccounts" => "ServiceAccount",
        _ => return not_found("", &resource, ""),
    };
    let open: fn(&mut Store) -> &mut usize = if ns.is_some() {
        |s| &mut s.open_object_watches
    } else {
        |s| &mut s.open_cluster_wide_watches
    };
    let select = move |s: &Store, after: u64| {
        let events = s
            .object_history
            .iter()
            .filter(|(rv, _, (r, n, o), _)| {
                *rv > after
                    && *r == resource
                    && ns.as_ref().is_none_or(|x| x == n)
                    && name.as_ref().is_none_or(|x| x == o)
            })
            .map(|(_, kind, _, v)| line(kind, v))
            .collect();
        (events, s.object_history.last().map_or(0, |(rv, ..)| *rv))
    };
    watch_response(server, &q, kind, open, select).await
}

/// `POST /api/v1/namespaces/{ns}/serviceaccounts/{name}/token`: a new token for the account.
async fn create_token(
    State(server): State<ApiServer>,
    axum::extract::Path((ns, name)): axum::extract::Path<(String, String)>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    let protobuf = headers.get("content-type").is_some_and(|v| {
        v.as_bytes()
            .starts_with(b"application/vnd.kubernetes.protobuf")
    });
    let request = if protobuf {
        proto::token_request(&body)
    } else {
        serde_json::from_slice::<serde_json::Value>(&body).ok()
    };
    let Some(request) = request else {
        return (
            axum::http::StatusCode::BAD_REQUEST,
            "the body is not a TokenRequest",
        )
            .into_response();
    };
    let mut s = server.lock();
    let key = ("serviceaccounts".to_owned(), ns.clone(), name.clone());
    if !s.objects.contains_key(&key) {
        return not_found("", "serviceaccounts", &name);
    }
    let spec = request["spec"].clone();
    let seconds = spec["expirationSeconds"].as_i64().unwrap_or(3600);
    if seconds < 600 {
        return (
            axum::http::StatusCode::UNPROCESSABLE_ENTITY,
            axum::Json(serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "spec.expirationSeconds: Invalid value: may not specify a duration less than 10 minutes",
                "reason": "Invalid", "code": 422,
            })),
        )
            .into_response();
    }
    let seconds = s.max_token_seconds.map_or(seconds, |max| seconds.min(max));
    s.rv += 1;
    let serial = s.token_requests.len();
    s.token_requests
        .push((ns.clone(), name.clone(), spec.clone()));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let exp = now + u64::try_from(seconds).unwrap_or(3600);
    let expiry = rfc3339(exp);
    let claims = serde_json::json!({
        "sub": format!("system:serviceaccount:{ns}:{name}"),
        "aud": spec["audiences"], "exp": exp, "iat": now, "serial": serial,
        "pod": spec["boundObjectRef"]["name"],
    });
    let b64 = |v: &serde_json::Value| {
        use base64::Engine as _;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    };
    let token = format!(
        "{}.{}.test-signature-{serial}",
        b64(&serde_json::json!({"alg": "none", "typ": "JWT"})),
        b64(&claims)
    );
    let mut answer = request;
    answer["kind"] = "TokenRequest".into();
    answer["apiVersion"] = "authentication.k8s.io/v1".into();
    answer["spec"]["expirationSeconds"] = seconds.into();
    answer["status"] = serde_json::json!({"token": token, "expirationTimestamp": expiry});
    (axum::http::StatusCode::CREATED, axum::Json(answer)).into_response()
}

/// Seconds since the epoch as the API's RFC 3339 time (UTC, whole seconds).
fn rfc3339(secs: u64) -> String {
    let t = std::time::UNIX_EPOCH + Duration::from_secs(secs);
    k8s_openapi::jiff::Timestamp::try_from(t)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

async fn pods(
    State(server): State<ApiServer>,
    Query(q): Query<HashMap<String, String>>,
    headers: axum::http::HeaderMap,
) -> Response {
    let raw: Vec<String> = {
        let mut pairs: Vec<_> = q.iter().collect();
        pairs.sort();
        pairs
            .iter()
            .map(|(k, v)| format!("{k}={}", v.replace('=', "%3D")))
            .collect()
    };
    server.lock().requests.push(raw.join("&"));
    let node = q
        .get("fieldSelector")
        .and_then(|f| f.strip_prefix("spec.nodeName="))
        .map(str::to_owned);
    let watching = q.get("watch").is_some_and(|w| w == "true" || w == "1");
    if !watching {
        let mut s = server.lock();
        s.lists += 1;
        let items: Vec<&Pod> = s
            .pods
            .values()
            .filter(|p| on_node(p, node.as_deref()))
            .collect();
        if writable::wants_table(&headers) {
            let items: Vec<serde_json::Value> = items
                .iter()
                .map(|p| serde_json::to_value(p).unwrap_or_default())
                .collect();
            return axum::Json(writable::pod_table(&items, s.rv)).into_response();
        }
        let body = serde_json::json!({
            "kind": "PodList", "apiVersion": "v1",
            "metadata": { "resourceVersion": s.rv.to_string() },
            "items": items,
        });
        return axum::Json(body).into_response();
    }
    let select = move |s: &Store, after: u64| {
        let events = s
            .history
            .iter()
            .filter(|(rv, _, p)| *rv > after && on_node(p, node.as_deref()))
            .map(|(_, kind, p)| line(kind, p))
            .collect();
        (events, s.history.last().map_or(0, |(rv, _, _)| *rv))
    };
    watch_response(server, &q, "Pod", |s| &mut s.open_watches, select).await
}

/// A watch response: every change after the request's `resourceVersion` that `select` picks
/// (given the store and the last version sent, it answers the events and the newest version
/// of its history), then the live ones, each as a line; a bookmark (of `kind`) when asked for
/// and allowed; 410 `Expired` from a compacted version; held while [`ApiServer::release`] is
/// awaited; ended by [`ApiServer::drop_watches`]. `open` counts the open watches of its kind.
async fn watch_response(
    server: ApiServer,
    q: &HashMap<String, String>,
    kind: &'static str,
    open: fn(&mut Store) -> &mut usize,
    select: impl Fn(&Store, u64) -> (Vec<Bytes>, u64) + Send + 'static,
) -> Response {
    let from: u64 = q
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let bookmarks = q.get("allowWatchBookmarks").is_some_and(|b| b == "true");

    // Held requests wait here (the client is "disconnected").
    let mut changed = server.changed.subscribe();
    while server.lock().hold {
        if changed.changed().await.is_err() {
            break;
        }
    }

    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let (epoch, mut seen_bookmark) = {
        let s = server.lock();
        (s.epoch, s.bookmark_seq)
    };
    if from < server.lock().compacted {
        let status = serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("too old resource version: {from}"), "reason": "Expired", "code": 410,
        });
        let _ = tx.send(line("ERROR", &status)).await;
    } else {
        *open(&mut server.lock()) += 1;
        let server = server.clone();
        tokio::spawn(async move {
            let mut sent = from;
            loop {
                let (events, bookmark, ended) = {
                    let mut s = server.lock();
                    let ended = s.epoch != epoch;
                    let (events, newest) = select(&s, sent);
                    sent = sent.max(newest);
                    let bookmark = (bookmarks && s.bookmark_seq != seen_bookmark).then(|| {
                        seen_bookmark = s.bookmark_seq;
                        s.bookmarks_sent += 1;
                        sent = s.rv;
                        let mark = serde_json::json!({
                            "kind": kind, "apiVersion": "v1",
                            "metadata": { "resourceVersion": s.rv.to_string() },
                        });
                        line("BOOKMARK", &mark)
                    });
                    (events, bookmark, ended)
                };
                if ended {
                    break;
                }
                for ev in events.into_iter().chain(bookmark) {
                    if tx.send(ev).await.is_err() {
                        break;
                    }
                }
                // Until the next change, or until the client goes (as the API server notices a
                // closed connection without waiting for an event to send).
                tokio::select! {
                    r = changed.changed() => if r.is_err() { break },
                    () = tx.closed() => break,
                }
            }
            *open(&mut server.lock()) -= 1;
        });
    }
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    });
    axum::body::Body::from_stream(stream).into_response()
}

/// The protobuf encoding clients such as kubectl use for `TokenRequest`: the `k8s\0` magic, then
/// an `Unknown` envelope whose `raw` field holds the object. Only the fields the server reads are
/// declared; the rest are skipped as unknown fields.
mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    struct Unknown {
        #[prost(bytes = "vec", tag = "2")]
        raw: Vec<u8>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    struct TokenRequest {
        #[prost(message, optional, tag = "2")]
        spec: Option<Spec>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    struct Spec {
        #[prost(string, repeated, tag = "1")]
        audiences: Vec<String>,
        #[prost(message, optional, tag = "3")]
        bound_object_ref: Option<BoundObject>,
        #[prost(int64, optional, tag = "4")]
        expiration_seconds: Option<i64>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    struct BoundObject {
        #[prost(string, optional, tag = "1")]
        kind: Option<String>,
        #[prost(string, optional, tag = "3")]
        name: Option<String>,
        #[prost(string, optional, tag = "4")]
        uid: Option<String>,
    }

    /// The request as the JSON the rest of the server reads, or `None` if it does not decode.
    pub(super) fn token_request(body: &[u8]) -> Option<serde_json::Value> {
        use prost::Message as _;
        let envelope = Unknown::decode(body.strip_prefix(b"k8s\0")?).ok()?;
        let spec = TokenRequest::decode(envelope.raw.as_slice()).ok()?.spec?;
        let bound = spec
            .bound_object_ref
            .map(|b| serde_json::json!({"kind": b.kind, "name": b.name, "uid": b.uid}));
        Some(serde_json::json!({
            "metadata": {},
            "spec": {
                "audiences": spec.audiences,
                "expirationSeconds": spec.expiration_seconds,
                "boundObjectRef": bound,
            },
        }))
    }
}
