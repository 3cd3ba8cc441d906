//! A container's environment, built as the kubelet builds it when it creates the container
//! (after the pod's sandbox runs, so the pod's IPs are known):
//!
//! 1. the service variables of the pod's namespace (`enableServiceLinks`, default true) and of
//!    the `kubernetes` service of the `default` namespace (always), when there is an API server,
//!    from the services store the API objects keep by one list and then a watch ([`services`];
//!    before the services have been read once a pod's container start fails, a static pod's
//!    waits at most [`STATIC_POD_SERVICE_WAIT`] and then starts without them);
//! 2. `envFrom` in order (`configMapRef`, `secretRef`, each key with `prefix`), later sources
//!    replacing earlier ones;
//! 3. `env` in order: a `value` has its `$(VAR)` references expanded against the variables so far
//!    and the service variables; a `valueFrom` is resolved (`fieldRef`, `resourceFieldRef`,
//!    `configMapKeyRef`, `secretKeyRef`) and not expanded;
//! 4. the service variables no explicit variable set.
//!
//! `command` and `args` are expanded against the whole result ([`expand_all`]). A configMap or
//! secret (or key) that is missing and not `optional` is an [`Error`] whose message is the
//! kubelet's; the container waits with `CreateContainerConfigError` and its start is retried.
//! The order of the result is the order of first definition (the kubelet's is a map's), then the
//! remaining service variables by name.
use crate::api_objects::{self, ApiObjects};
use k8s_openapi::api::core::v1::{ConfigMap, Container, ObjectFieldSelector, Pod, Secret, Service};
use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kubelet without an API client says the same.
    #[error(
        "couldn't get {kind} {namespace}/{name}, swiftlet has no API server (--kubeconfig is not set)"
    )]
    NoApiServer {
        kind: &'static str,
        namespace: String,
        name: String,
    },
    /// `kind` is spelled as the kubelet's object caches spell it (`configmap`, `secret`).
    #[error("{kind} {name:?} not found")]
    NotFound { kind: &'static str, name: String },
    #[error("couldn't find key {key} in {kind} {namespace}/{name}")]
    MissingKey {
        kind: &'static str,
        namespace: String,
        name: String,
        key: String,
    },
    #[error(transparent)]
    Read(api_objects::Error),
    /// The kubelet's words when its service informer has not synced.
    #[error("services have not yet been read at least once, cannot construct envvars: {0}")]
    Services(api_objects::Error),
    /// A `valueFrom` swiftlet cannot resolve: the reason names what is wrong.
    #[error("env {name}: {reason}")]
    Invalid { name: String, reason: Invalid },
}

/// Why a `valueFrom` cannot be resolved.
#[derive(Debug, thiserror::Error)]
pub enum Invalid {
    #[error("unsupported pod version: {0}")]
    PodVersion(String),
    /// `status.hostIP(s)` (the path) without a known node address.
    #[error("{0}: the node's IP address is not known (the machine has no default route)")]
    NoHostIp(String),
    #[error("unsupported fieldPath: {0}")]
    FieldPath(String),
    #[error(transparent)]
    Resource(#[from] crate::pod::downward::Error),
    #[error("valueFrom names no source")]
    NoSource,
    /// The environment was asked for where API objects cannot be read.
    #[error("first_start_requests cannot read API objects")]
    FirstStart,
}

pub use crate::pod::downward::Allocatable;

/// What the environment is built from besides the pod and its API objects.
#[derive(Debug, Clone, Default)]
pub struct Context {
    /// The pod's IPs from its sandbox's status (the node's for a host-network pod).
    pub pod_ips: Vec<String>,
    /// The node's addresses, IPv4 first.
    pub host_ips: Vec<IpAddr>,
    /// `None`: not needed (no `resourceFieldRef`), so not read.
    pub allocatable: Option<Allocatable>,
}

/// Whether a container's environment needs the node's allocatable resources.
pub fn needs_allocatable(c: &Container) -> bool {
    c.env.iter().flatten().any(|e| {
        e.value_from
            .as_ref()
            .is_some_and(|v| v.resource_field_ref.is_some())
    })
}

/// Whether a container's environment needs the node's addresses.
pub fn needs_host_ips(c: &Container) -> bool {
    c.env.iter().flatten().any(|e| {
        e.value_from
            .as_ref()
            .and_then(|v| v.field_ref.as_ref())
            .is_some_and(|f| f.field_path.starts_with("status.hostIP"))
    })
}

/// How long a static pod's container waits for the services to be read before it starts
/// without them.
pub const STATIC_POD_SERVICE_WAIT: Duration = Duration::from_secs(2);

/// The services whose variables a container of `pod` gets ([`service_env`] picks among them),
/// from the store the API objects keep by one list and one watch of every service: at once once
/// the services have been read, else after the first list; while that list has failed, an
/// error (the container waits with `CreateContainerConfigError` and its start is retried).
pub async fn services(objects: &ApiObjects, pod: &Pod) -> Result<Vec<Arc<Service>>, Error> {
    let (namespace, links) = (namespace(pod), service_links(pod));
    objects
        .services(|s| sees(namespace, links, s))
        .await
        .map_err(Error::Services)
}

/// The services for a static pod's container: as [`services`], but a static pod does not
/// depend on the API server (the kubelet starts it with whatever its service cache holds):
/// when the services have not been read within [`STATIC_POD_SERVICE_WAIT`] (or their first
/// list failed), it gets none (no service variables), and the reason is returned. Once they
/// have been read they are always at hand, whatever becomes of the watch.
pub async fn services_for_static_pod(
    objects: &ApiObjects,
    pod: &Pod,
) -> (Option<Vec<Arc<Service>>>, Option<String>) {
    match tokio::time::timeout(STATIC_POD_SERVICE_WAIT, services(objects, pod)).await {
        Ok(Ok(list)) => (Some(list), None),
        Ok(Err(e)) => (None, Some(e.to_string())),
        Err(_) => (
            None,
            Some(format!(
                "the services have not been read within {STATIC_POD_SERVICE_WAIT:?}"
            )),
        ),
    }
}

/// Where configMaps and secrets are read (the API server; a table in tests).
pub(crate) trait Objects {
    /// `Ok(None)`: it does not exist.
    async fn config_map(&self, namespace: &str, name: &str) -> Result<Option<ConfigMap>, Error>;
    async fn secret(&self, namespace: &str, name: &str) -> Result<Option<Secret>, Error>;
}

fn found<T>(
    r: Result<T, api_objects::Error>,
    kind: &'static str,
    namespace: &str,
    name: &str,
) -> Result<Option<T>, Error> {
    match r {
        Ok(o) => Ok(Some(o)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(api_objects::Error::NoApiServer { .. }) => Err(Error::NoApiServer {
            kind,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }),
        Err(e) => Err(Error::Read(e)),
    }
}

impl Objects for ApiObjects {
    async fn config_map(&self, namespace: &str, name: &str) -> Result<Option<ConfigMap>, Error> {
        let r = ApiObjects::config_map(self, namespace, name).await;
        found(r, "configMap", namespace, name)
    }
    async fn secret(&self, namespace: &str, name: &str) -> Result<Option<Secret>, Error> {
        let r = ApiObjects::secret(self, namespace, name).await;
        found(r, "secret", namespace, name)
    }
}

/// The configMaps and secrets one container's environment read, each once.
struct Fetched<'o, O> {
    objects: &'o O,
    namespace: &'o str,
    config_maps: HashMap<String, Option<BTreeMap<String, String>>>,
    secrets: HashMap<String, Option<BTreeMap<String, String>>>,
}

impl<O: Objects> Fetched<'_, O> {
    /// The data of configMap (`secret` false) or secret `name`; `None` when it does not exist.
    async fn data(
        &mut self,
        secret: bool,
        name: &str,
    ) -> Result<Option<&BTreeMap<String, String>>, Error> {
        let cache = if secret {
            &mut self.secrets
        } else {
            &mut self.config_maps
        };
        if !cache.contains_key(name) {
            let data = if secret {
                self.objects.secret(self.namespace, name).await?.map(|s| {
                    s.data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
                        .collect()
                })
            } else {
                self.objects
                    .config_map(self.namespace, name)
                    .await?
                    .map(|c| c.data.unwrap_or_default())
            };
            cache.insert(name.to_owned(), data);
        }
        Ok(cache.get(name).and_then(Option::as_ref))
    }

    /// Like [`Self::data`], but a missing object is an error unless `optional`.
    async fn required(
        &mut self,
        secret: bool,
        name: &str,
        optional: bool,
    ) -> Result<Option<&BTreeMap<String, String>>, Error> {
        let data = self.data(secret, name).await?;
        if data.is_none() && !optional {
            return Err(Error::NotFound {
                kind: if secret { "secret" } else { "configmap" },
                name: name.to_owned(),
            });
        }
        Ok(data)
    }
}

/// Variables in order of first definition; a later definition replaces the value in place.
#[derive(Debug, Default)]
struct Vars {
    list: Vec<(String, String)>,
    index: HashMap<String, usize>,
}

impl Vars {
    fn set(&mut self, name: String, value: String) {
        match self.index.get(&name) {
            Some(&i) => self.list[i].1 = value,
            None => {
                self.index.insert(name.clone(), self.list.len());
                self.list.push((name, value));
            }
        }
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.index.get(name).map(|&i| self.list[i].1.as_str())
    }
}

/// Whether `name` can be an environment variable's name (the API's rule since relaxed
/// validation: printable ASCII but `=`).
pub fn is_env_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| (0x20..0x7f).contains(&b) && b != b'=')
}

/// Container `c`'s environment (see the module docs). `services`: the services of the cluster
/// (at least those [`services`] picks for the pod), `None` without an API server.
pub(crate) async fn build<O: Objects, S: Borrow<Service>>(
    objects: &O,
    services: Option<&[S]>,
    ctx: &Context,
    pod: &Pod,
    uid: &str,
    c: &Container,
) -> Result<Vec<(String, String)>, Error> {
    let namespace = namespace(pod);
    let links = service_links(pod);
    let service_env = services
        .map(|s| service_env(namespace, links, s))
        .unwrap_or_default();
    let mut fetched = Fetched {
        objects,
        namespace,
        config_maps: HashMap::new(),
        secrets: HashMap::new(),
    };
    let mut vars = Vars::default();
    for from in c.env_from.iter().flatten() {
        let prefix = from.prefix.as_deref().unwrap_or_default();
        let (secret, name, optional) = match (&from.config_map_ref, &from.secret_ref) {
            (Some(r), _) => (false, &r.name, r.optional.unwrap_or(false)),
            (None, Some(r)) => (true, &r.name, r.optional.unwrap_or(false)),
            (None, None) => continue,
        };
        let Some(data) = fetched.required(secret, name, optional).await? else {
            continue;
        };
        let mut skipped = Vec::new();
        for (k, v) in data {
            let k = format!("{prefix}{k}");
            if is_env_name(&k) {
                vars.set(k, v.clone());
            } else {
                skipped.push(k);
            }
        }
        if !skipped.is_empty() {
            tracing::warn!(container = %c.name, object = %name, keys = ?skipped, "envFrom keys skipped: not valid environment variable names");
        }
    }
    for e in c.env.iter().flatten() {
        let value = match (e.value.as_deref(), &e.value_from) {
            (Some(v), _) if !v.is_empty() => expand(v, |name| {
                vars.get(name)
                    .or_else(|| service_env.get(name).map(String::as_str))
            }),
            (_, Some(from)) => {
                let invalid = |reason: Invalid| Error::Invalid {
                    name: e.name.clone(),
                    reason,
                };
                if let Some(f) = &from.field_ref {
                    field_ref(f, pod, uid, ctx).map_err(invalid)?
                } else if let Some(r) = &from.resource_field_ref {
                    crate::pod::downward::resource_field_ref(r, pod, c, ctx.allocatable.as_ref())
                        .map_err(|e| invalid(e.into()))?
                } else if let Some(r) = &from.config_map_key_ref {
                    let optional = r.optional.unwrap_or(false);
                    match key_of(&mut fetched, false, &r.name, &r.key, optional).await? {
                        Some(v) => v,
                        None => continue,
                    }
                } else if let Some(r) = &from.secret_key_ref {
                    let optional = r.optional.unwrap_or(false);
                    match key_of(&mut fetched, true, &r.name, &r.key, optional).await? {
                        Some(v) => v,
                        None => continue,
                    }
                } else {
                    return Err(invalid(Invalid::NoSource));
                }
            }
            _ => String::new(),
        };
        vars.set(e.name.clone(), value);
    }
    let mut env = vars.list;
    env.extend(
        service_env
            .into_iter()
            .filter(|(k, _)| !vars.index.contains_key(k)),
    );
    Ok(env)
}

/// Key `key` of configMap (or secret) `name`: `None` when it or the object is missing and
/// `optional`.
async fn key_of<O: Objects>(
    fetched: &mut Fetched<'_, O>,
    secret: bool,
    name: &str,
    key: &str,
    optional: bool,
) -> Result<Option<String>, Error> {
    let namespace = fetched.namespace.to_owned();
    let Some(data) = fetched.required(secret, name, optional).await? else {
        return Ok(None);
    };
    match data.get(key) {
        Some(v) => Ok(Some(v.clone())),
        None if optional => Ok(None),
        None => Err(Error::MissingKey {
            kind: if secret { "Secret" } else { "ConfigMap" },
            namespace,
            name: name.to_owned(),
            key: key.to_owned(),
        }),
    }
}

fn namespace(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("default")
}

/// `enableServiceLinks` (default true).
fn service_links(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.enable_service_links)
        .unwrap_or(true)
}

/// `$(VAR)` expansion as the kubelet does it: `$(NAME)` becomes `mapping(NAME)`, or stays as
/// written when the mapping has no such name; `$$` becomes `$` (so `$$(VAR)` is `$(VAR)`); a
/// `$` before anything else, a `$(` never closed and a trailing `$` stay as they are.
pub fn expand<'a>(input: &str, mapping: impl Fn(&str) -> Option<&'a str>) -> String {
    let bytes = input.as_bytes();
    let mut out = String::with_capacity(input.len());
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'$' || i + 1 == bytes.len() {
            i += 1;
            continue;
        }
        out.push_str(&input[copied..i]);
        match bytes[i + 1] {
            b'$' => {
                out.push('$');
                i += 2;
            }
            b'(' => match input[i + 2..].find(')') {
                Some(len) => {
                    let name = &input[i + 2..i + 2 + len];
                    match mapping(name) {
                        Some(v) => out.push_str(v),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    i += 3 + len;
                }
                None => {
                    out.push_str("$(");
                    i += 2;
                }
            },
            // `$` then another character: both kept (the character is copied with what follows).
            _ => {
                out.push('$');
                i += 1;
            }
        }
        copied = i;
    }
    out.push_str(&input[copied..]);
    out
}

/// Expands every string of `items` against the whole environment `env` (command and args).
pub fn expand_all(items: &[String], env: &[(String, String)]) -> Vec<String> {
    let map: HashMap<&str, &str> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    items
        .iter()
        .map(|s| expand(s, |name| map.get(name).copied()))
        .collect()
}

/// `valueFrom.fieldRef` (the paths the API allows in `env`).
fn field_ref(
    f: &ObjectFieldSelector,
    pod: &Pod,
    uid: &str,
    ctx: &Context,
) -> Result<String, Invalid> {
    if let Some(v) = f
        .api_version
        .as_deref()
        .filter(|v| !v.is_empty() && *v != "v1")
    {
        return Err(Invalid::PodVersion(v.to_owned()));
    }
    let path = f.field_path.as_str();
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let host_ips = || {
        if ctx.host_ips.is_empty() {
            Err(Invalid::NoHostIp(path.to_owned()))
        } else {
            Ok(ctx
                .host_ips
                .iter()
                .map(IpAddr::to_string)
                .collect::<Vec<_>>())
        }
    };
    let subscript = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|s| s.strip_prefix("['"))
            .and_then(|s| s.strip_suffix("']"))
            .map(str::to_owned)
    };
    Ok(match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => namespace(pod).to_owned(),
        "metadata.uid" => uid.to_owned(),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.hostIP" => host_ips()?.swap_remove(0),
        "status.hostIPs" => host_ips()?.join(","),
        "status.podIP" => ctx.pod_ips.first().cloned().unwrap_or_default(),
        "status.podIPs" => ctx.pod_ips.join(","),
        _ => {
            if let Some(k) = subscript("metadata.labels") {
                meta.labels
                    .as_ref()
                    .and_then(|l| l.get(&k).cloned())
                    .unwrap_or_default()
            } else if let Some(k) = subscript("metadata.annotations") {
                meta.annotations
                    .as_ref()
                    .and_then(|l| l.get(&k).cloned())
                    .unwrap_or_default()
            } else {
                return Err(Invalid::FieldPath(path.to_owned()));
            }
        }
    })
}

/// Whether a pod of `namespace` sees service `s`'s variables: the `kubernetes` service of
/// `default` always, its namespace's services with `links`.
fn sees(namespace: &str, links: bool, s: &Service) -> bool {
    let ns = s.metadata.namespace.as_deref().unwrap_or("default");
    (links && ns == namespace)
        || (ns == "default" && s.metadata.name.as_deref() == Some("kubernetes"))
}

/// The service variables a pod of `namespace` sees: of the `kubernetes` service of `default`
/// always, of its namespace's services with `links`; services without a cluster IP (headless
/// or none) and without ports give none.
pub fn service_env<S: Borrow<Service>>(
    namespace: &str,
    links: bool,
    services: &[S],
) -> BTreeMap<String, String> {
    let mut chosen: BTreeMap<&str, &Service> = BTreeMap::new();
    for s in services {
        let s = s.borrow();
        let ip = s.spec.as_ref().and_then(|s| s.cluster_ip.as_deref());
        if matches!(ip, None | Some("" | "None")) || !sees(namespace, links, s) {
            continue;
        }
        let name = s.metadata.name.as_deref().unwrap_or_default();
        let ns = s.metadata.namespace.as_deref().unwrap_or("default");
        if ns == "default" && name == "kubernetes" {
            chosen.entry(name).or_insert(s);
        } else {
            chosen.insert(name, s);
        }
    }
    let mut env = BTreeMap::new();
    for (name, s) in chosen {
        service_vars(name, s, &mut env);
    }
    env
}

fn env_name(s: &str) -> String {
    s.replace('-', "_").to_uppercase()
}

/// The variables of one service: `<NAME>_SERVICE_HOST`, `<NAME>_SERVICE_PORT` (the first port),
/// `<NAME>_SERVICE_PORT_<PORTNAME>` per named port, and the Docker link variables
/// `<NAME>_PORT` (the first port's URL) and `<NAME>_PORT_<port>_<PROTO>[_PROTO|_PORT|_ADDR]`.
fn service_vars(name: &str, s: &Service, env: &mut BTreeMap<String, String>) {
    let Some(spec) = s.spec.as_ref() else { return };
    let ip = spec.cluster_ip.clone().unwrap_or_default();
    let ports = spec.ports.as_deref().unwrap_or_default();
    let Some(first) = ports.first() else { return };
    let prefix = env_name(name);
    env.insert(format!("{prefix}_SERVICE_HOST"), ip.clone());
    env.insert(format!("{prefix}_SERVICE_PORT"), first.port.to_string());
    for p in ports {
        if let Some(n) = p.name.as_deref().filter(|n| !n.is_empty()) {
            env.insert(
                format!("{prefix}_SERVICE_PORT_{}", env_name(n)),
                p.port.to_string(),
            );
        }
    }
    let host = match ip.parse::<IpAddr>() {
        Ok(IpAddr::V6(_)) => format!("[{ip}]"),
        _ => ip.clone(),
    };
    for (i, p) in ports.iter().enumerate() {
        let proto = p.protocol.as_deref().unwrap_or("TCP");
        let lower = proto.to_lowercase();
        let url = format!("{lower}://{host}:{}", p.port);
        if i == 0 {
            env.insert(format!("{prefix}_PORT"), url.clone());
        }
        let port_prefix = format!("{prefix}_PORT_{}_{}", p.port, proto.to_uppercase());
        env.insert(format!("{port_prefix}_PROTO"), lower);
        env.insert(format!("{port_prefix}_PORT"), p.port.to_string());
        env.insert(format!("{port_prefix}_ADDR"), ip.clone());
        env.insert(port_prefix, url);
    }
}

#[cfg(test)]
mod tests;
