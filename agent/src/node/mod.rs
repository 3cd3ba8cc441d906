//! Cluster membership, when `--kubeconfig` names an API server: the agent registers its Node
//! (`--register-node`, default on), keeps the Node's status (capacity, allocatable, addresses,
//! node info and the conditions Ready, MemoryPressure, DiskPressure, PIDPressure) and renews its
//! Lease.
//!
//! - Registration creates the Node with the default labels (`kubernetes.io/hostname`, `/os`,
//!   `/arch`), `--node-labels`, `--register-with-taints` and a first status. A Node of the same
//!   name that already exists is adopted: its default labels are brought back when they differ,
//!   everything else is left as it is (as the kubelet does). Failures are retried with a
//!   backoff from 100 ms to 7 s; static pods run meanwhile.
//! - Every `--node-status-update-frequency` (10 s) the status is computed, without a CRI call:
//!   the runtime's health, version and images come from the record [`crate::runtime_health`] keeps
//!   (a task of its own checking CRI `Status` every 5 s; the node is NotReady, "container
//!   runtime is down", once the runtime's last good answer is 30 s old), so a runtime that
//!   hangs never holds a status update back. The status is written (a
//!   strategic merge patch of `nodes/<name>/status` that leaves other components' conditions
//!   alone, see [`status_patch`]) only when it says something new, heartbeats aside,
//!   or `nodeStatusReportFrequency` (5 m) has passed since the last write. A status write that
//!   finds the Node gone registers it again (the Go kubelet only does so on a restart).
//! - The Lease (see [`lease`]) is renewed on its own schedule, whatever the status writes do.
//! - Both heartbeats, the status writes and the Lease renewals, go through a client of their own
//!   whose requests are bounded by the heartbeat timeout and whose connections are replaced after
//!   repeated failures (see [`heartbeat`]).
//! - The pods' statuses are written back, and pods deleted through the API are removed once
//!   terminated (see [`pod_status`]).
//!
//! Every request's outcome is counted in `swiftlet_node_api_requests_total{operation,result}`;
//! 401 and 403 are logged as credential problems.
pub mod heartbeat;
pub mod informer;
pub mod lease;
pub mod pod_status;
pub mod status;
pub mod status_diff;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, NodeStatus, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

pub use crate::config::api::error_result;
use crate::metrics::Metrics;
use crate::pleg::RuntimeState;

/// The node as admission checks pods against it: its name, labels (the defaults and
/// `--node-labels`), `--register-with-taints`, and allocatable cpu and memory (unchecked when
/// the machine's could not be read).
pub fn admission_node(cfg: &Config, machine: &status::Machine) -> crate::pod::admission::Node {
    let mut labels = cfg.labels.clone();
    labels.extend(status::default_labels(cfg, machine));
    let (cpu, memory) = status::allocatable_cpu_memory(cfg, machine);
    crate::pod::admission::Node {
        name: cfg.node_name.clone(),
        labels,
        taints: cfg.taints.clone(),
        cpu_millis: (machine.cpus > 0).then_some(cpu),
        memory_bytes: (machine.memory_bytes > 0).then_some(memory),
    }
}

/// The settings, kubelet-named.
#[derive(Debug, Clone, Default)]
pub struct Config {
    pub node_name: String,
    /// The node's hostname, its `Hostname` address: `--hostname-override` when given, else the
    /// machine's host name, lowercased (the kubelet's rule; the node name is the same without a
    /// cloud provider, which swiftlet never has).
    pub hostname: String,
    /// `--register-node`: create the Node (else only an existing one's status is kept).
    pub register: bool,
    /// `--node-labels`.
    pub labels: BTreeMap<String, String>,
    /// `--register-with-taints`.
    pub taints: Vec<Taint>,
    /// `--node-ip`; empty: the machine's address of its default route.
    pub node_ips: Vec<IpAddr>,
    pub max_pods: u32,
    pub root_dir: PathBuf,
    /// The kubelet API's port, published as the daemon endpoint (0 when it is off).
    pub kubelet_port: u16,
    /// `--node-status-update-frequency`.
    pub status_update_frequency: Duration,
    /// `nodeStatusReportFrequency`.
    pub status_report_frequency: Duration,
    /// `nodeLeaseDurationSeconds`.
    pub lease_duration: Duration,
    /// `--node-status-max-images`: the largest images listed in the status; -1: all.
    pub max_images: i32,
    /// `--system-reserved` + `--kube-reserved`.
    pub reserved: crate::eviction::Reserved,
    /// `--eviction-hard` (allocatable is also less its memory and nodefs thresholds).
    pub eviction_hard: Vec<crate::eviction::Threshold>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("--node-labels {0:?}: expected <key>=<value>[,...]")]
    LabelSyntax(String),
    #[error("--node-labels: {0}")]
    Label(String),
    #[error("--register-with-taints {0:?}: expected <key>[=<value>]:<effect>[,...]")]
    TaintSyntax(String),
    #[error(
        "--register-with-taints {0:?}: the effect must be NoSchedule, PreferNoSchedule or NoExecute"
    )]
    TaintEffect(String),
}

/// Label keys outside the reserved namespaces' allowed prefixes a node agent may still set.
const ALLOWED_RESERVED_LABELS: [&str; 12] = [
    "kubernetes.io/hostname",
    "kubernetes.io/instance-type",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "beta.kubernetes.io/instance-type",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "node.kubernetes.io/instance-type",
];

/// A label name or value part: at most 63 characters, alphanumerics at both ends, `-`, `_`,
/// `.` inside.
fn valid_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Checks a label key: syntax, and that a key in the `kubernetes.io` or `k8s.io` namespaces is
/// one a node may set itself (prefix `kubelet.kubernetes.io` or `node.kubernetes.io`, or an
/// allowed well-known key), as the kubelet refuses the rest.
pub fn check_label(key: &str, value: &str) -> Result<(), Error> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if !valid_name_part(name)
        || prefix.is_some_and(|p| crate::config::manifest::dns1123_subdomain(p).is_some())
    {
        return Err(Error::Label(format!("{key:?} is not a valid label key")));
    }
    if !value.is_empty() && !valid_name_part(value) {
        return Err(Error::Label(format!(
            "{value:?} (of {key:?}) is not a valid label value"
        )));
    }
    if let Some(p) = prefix {
        let reserved = ["kubernetes.io", "k8s.io"]
            .iter()
            .any(|ns| p == *ns || p.ends_with(&format!(".{ns}")));
        let allowed_prefix = ["kubelet.kubernetes.io", "node.kubernetes.io"]
            .iter()
            .any(|ns| p == *ns || p.ends_with(&format!(".{ns}")));
        if reserved && !allowed_prefix && !ALLOWED_RESERVED_LABELS.contains(&key) {
            return Err(Error::Label(format!(
                "{key:?}: a node may only set labels of the kubernetes.io and k8s.io namespaces \
                 with the prefixes kubelet.kubernetes.io or node.kubernetes.io, or the \
                 well-known keys ({})",
                ALLOWED_RESERVED_LABELS.join(", ")
            )));
        }
    }
    Ok(())
}

/// Parses `--node-labels`' entries, each `key=value` (an empty value is allowed; blank entries
/// are skipped, see [`crate::eviction::nonblank`]).
pub fn parse_labels(entries: &[impl AsRef<str>]) -> Result<BTreeMap<String, String>, Error> {
    let mut out = BTreeMap::new();
    for part in crate::eviction::nonblank(entries) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| Error::LabelSyntax(part.to_owned()))?;
        check_label(k.trim(), v.trim())?;
        out.insert(k.trim().to_owned(), v.trim().to_owned());
    }
    Ok(out)
}

/// Parses `--register-with-taints`' entries, each `key=value:Effect` or `key:Effect` (blank
/// entries are skipped).
pub fn parse_taints(entries: &[impl AsRef<str>]) -> Result<Vec<Taint>, Error> {
    let mut out = Vec::new();
    for part in crate::eviction::nonblank(entries) {
        let (kv, effect) = part
            .rsplit_once(':')
            .ok_or_else(|| Error::TaintSyntax(part.to_owned()))?;
        if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
            return Err(Error::TaintEffect(part.to_owned()));
        }
        let (key, value) = match kv.split_once('=') {
            Some((k, v)) => (k, Some(v.to_owned())),
            None => (kv, None),
        };
        check_label(key, value.as_deref().unwrap_or(""))
            .map_err(|_| Error::TaintSyntax(part.to_owned()))?;
        out.push(Taint {
            key: key.to_owned(),
            value,
            effect: effect.to_owned(),
            time_added: None,
        });
    }
    Ok(out)
}

fn log_failure(what: &'static str, node: &str, e: &kube::Error) {
    let result = error_result(e);
    if matches!(result, "unauthorized" | "forbidden") {
        tracing::error!(
            node,
            error = %e,
            result,
            "{what}: the API server refused the kubeconfig's credentials"
        );
    } else if result == "tls" {
        tracing::error!(
            node,
            error = %e,
            result,
            "{what}: TLS with the API server failed (check the kubeconfig's certificate-authority and client certificate)"
        );
    } else {
        tracing::warn!(node, error = %e, result, "{what} failed");
    }
}

/// What the status is computed from besides the machine.
#[derive(Clone)]
pub struct Inputs {
    /// The runtime's health, version and images, as the checks of [`crate::runtime_health::run`] last
    /// saw them.
    pub runtime: watch::Receiver<crate::runtime_health::RuntimeHealth>,
    /// The PLEG's health (its relists).
    pub health: RuntimeState,
    /// The conditions the eviction manager holds under pressure.
    pub pressure: watch::Receiver<Vec<&'static str>>,
    pub metrics: Metrics,
    /// The pods' statuses, written back to the API server ([`pod_status`]).
    pub status: crate::status::StatusManager,
    /// The mirror pods the API source sees.
    pub mirrors: crate::config::api::MirrorPods,
    /// What admission checks pods against: the Node's labels and taints as the API server has
    /// them are put here ([`informer`]).
    pub admission: watch::Sender<crate::pod::admission::Node>,
}

impl Inputs {
    /// Observes the runtime (the record of its checks: no CRI call, so a runtime that does not
    /// answer never holds the status back), the PLEG and the eviction manager.
    fn observe(&self, cfg: &Config) -> status::Observed {
        let now = tokio::time::Instant::now();
        let (mut not_ready, runtime_version, images) = {
            let runtime = self.runtime.borrow();
            (
                runtime.not_ready(now),
                runtime.version.clone(),
                // Kept from the last answer when the runtime does not answer.
                runtime.images.clone(),
            )
        };
        let health = self.health.health(
            now,
            Duration::MAX, // only the PLEG's check is read here
        );
        for (name, check) in health {
            if let ("runtime", Err(why)) = (name, check) {
                not_ready.push(format!("PLEG is not healthy: {why}"));
            }
        }
        let addresses = crate::cm::node_ips(&cfg.node_ips);
        status::Observed {
            not_ready,
            pressure: self.pressure.borrow().clone(),
            runtime_version,
            addresses,
            images,
            // Set by the status loop, which holds the Node watch's view.
            stored: status::Stored::default(),
        }
    }
}

/// Creates the Node, or adopts the existing one of that name (bringing its default labels
/// back). Returns the Node as stored and whether it was created.
async fn register(
    api: &Api<Node>,
    cfg: &Config,
    machine: &status::Machine,
    node: &Node,
) -> Result<(Node, bool), kube::Error> {
    match api.create(&PostParams::default(), node).await {
        Ok(n) => return Ok((n, true)),
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e),
    }
    let existing = api.get(&cfg.node_name).await?;
    let labels = existing.metadata.labels.clone().unwrap_or_default();
    let stale: BTreeMap<String, String> = status::default_labels(cfg, machine)
        .into_iter()
        .filter(|(k, v)| labels.get(k) != Some(v))
        .collect();
    if stale.is_empty() {
        return Ok((existing, false));
    }
    tracing::info!(node = cfg.node_name, labels = ?stale, "bringing the node's default labels back");
    let patch = serde_json::json!({"metadata": {"labels": stale}});
    let n = api
        .patch(
            &cfg.node_name,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    Ok((n, false))
}

/// Waits `d`; false when `cancel` fired first.
async fn sleep(d: Duration, cancel: &CancellationToken) -> bool {
    tokio::select! {
        () = cancel.cancelled() => false,
        () = tokio::time::sleep(d) => true,
    }
}

/// The strategic merge patch that writes `new` over the Node's status, as the kubelet's status
/// patch does: the API server merges `conditions` by `type`, so the conditions other components
/// own (`NetworkUnavailable` from the network plugin, node-problem-detector's) stay; maps such as
/// `capacity` merge key by key. `addresses` are sent only when they differ from `prev` (the
/// status last written; `None`: nothing written yet), and then whole, with the `replace`
/// directive: their schema's merge key `type` is not unique (two `InternalIP`s would merge into
/// one). Each resource of `removed` is deleted from `allocatable` (a `null`).
fn status_patch(
    prev: Option<&NodeStatus>,
    new: &NodeStatus,
    removed: &[String],
) -> serde_json::Value {
    let mut status = serde_json::to_value(new).unwrap_or_default();
    if let Some(fields) = status.as_object_mut() {
        if !removed.is_empty() {
            let allocatable = fields
                .entry("allocatable")
                .or_insert_with(|| serde_json::json!({}));
            if let Some(map) = allocatable.as_object_mut() {
                for name in removed {
                    map.insert(name.clone(), serde_json::Value::Null);
                }
            }
        }
        let addresses = fields.remove("addresses");
        if prev.is_none_or(|p| p.addresses != new.addresses) {
            let mut list = vec![serde_json::json!({"$patch": "replace"})];
            if let Some(serde_json::Value::Array(items)) = addresses {
                list.extend(items);
            }
            fields.insert("addresses".into(), serde_json::Value::Array(list));
        }
    }
    serde_json::json!({ "status": status })
}

/// Registration backoff: from 100 ms, doubling, at most 7 s (the kubelet's).
const REGISTER_FIRST: Duration = Duration::from_millis(100);
const REGISTER_MAX: Duration = Duration::from_secs(7);

/// The Node's side of membership: registration, then status updates, until `cancel`.
struct NodeStatusLoop {
    /// Registration's client.
    api: Api<Node>,
    /// The status writes' client (bounded, replaced when its connections die).
    heartbeats: heartbeat::Heartbeats,
    cfg: Config,
    machine: status::Machine,
    inputs: Inputs,
    owner: watch::Sender<Option<String>>,
    /// The status last written and when.
    last: Option<(NodeStatus, tokio::time::Instant)>,
    /// Notified when the Node is deleted from the API server.
    gone: Arc<Notify>,
    /// The Node's capacity and allocatable as the API server has them ([`informer`]).
    stored: watch::Receiver<status::Stored>,
}

impl NodeStatusLoop {
    fn now() -> Time {
        Time(k8s_openapi::jiff::Timestamp::now())
    }

    /// Registers (or, with `--register-node=false`, finds) the Node, retrying until it works.
    async fn join(&mut self, cancel: &CancellationToken) -> bool {
        let mut backoff = REGISTER_FIRST;
        loop {
            let outcome = if self.cfg.register {
                // The first status waits a little for the runtime's first check and refresh,
                // so a node whose runtime answers registers Ready, with its images.
                let checked = self
                    .inputs
                    .runtime
                    .wait_for(crate::runtime_health::RuntimeHealth::observed);
                let _ = tokio::time::timeout(crate::runtime_health::CHECK_PERIOD, checked).await;
                let observed = self.observe();
                let mut node = status::initial_node(&self.cfg, &self.machine);
                let first =
                    status::node_status(&self.cfg, &self.machine, &observed, None, &Self::now());
                node.status = Some(first.clone());
                register(&self.api, &self.cfg, &self.machine, &node)
                    .await
                    .map(|(n, created)| (n, created.then_some(first)))
            } else {
                self.api.get(&self.cfg.node_name).await.map(|n| (n, None))
            };
            match outcome {
                Ok((node, written)) => {
                    self.inputs.metrics.node_api_request("register", "ok");
                    tracing::info!(
                        node = self.cfg.node_name,
                        created = written.is_some(),
                        "node registered"
                    );
                    self.last = written.map(|s| (s, tokio::time::Instant::now()));
                    self.owner.send_replace(node.metadata.uid);
                    return true;
                }
                Err(e) => {
                    self.inputs
                        .metrics
                        .node_api_request("register", error_result(&e));
                    log_failure("registering the node", &self.cfg.node_name, &e);
                }
            }
            if !sleep(backoff, cancel).await {
                return false;
            }
            backoff = (backoff * 2).min(REGISTER_MAX);
        }
    }

    /// What the status is computed from: the inputs' observations and the Node as stored.
    fn observe(&self) -> status::Observed {
        let mut observed = self.inputs.observe(&self.cfg);
        observed.stored = self.stored.borrow().clone();
        observed
    }

    /// Computes the status and writes it when due. `Err` with the Node gone: join again.
    async fn update(&mut self) -> Result<(), ()> {
        let observed = self.observe();
        let prev = self.last.as_ref().map(|(s, _)| s);
        let new = status::node_status(&self.cfg, &self.machine, &observed, prev, &Self::now());
        let removed = status::stale_allocatable(&observed.stored, &new);
        let due = !removed.is_empty()
            || self.last.as_ref().is_none_or(|(s, at)| {
                status::changed(s, &new) || at.elapsed() >= self.cfg.status_report_frequency
            });
        if !due {
            return Ok(());
        }
        let patch = status_patch(prev, &new, &removed);
        let name = &self.cfg.node_name;
        let sent = self
            .heartbeats
            .request(|client| async move {
                Api::<Node>::all(client)
                    .patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
                    .await
            })
            .await;
        match sent {
            Ok(_) => {
                self.inputs.metrics.node_api_request("status", "ok");
                self.last = Some((new, tokio::time::Instant::now()));
                Ok(())
            }
            Err(e) => {
                self.inputs
                    .metrics
                    .node_api_request("status", error_result(&e));
                log_failure("updating the node status", &self.cfg.node_name, &e);
                match e {
                    kube::Error::Api(s) if s.code == 404 => Err(()),
                    _ => Ok(()),
                }
            }
        }
    }

    async fn run(mut self, cancel: CancellationToken) {
        'join: loop {
            if !self.join(&cancel).await {
                return;
            }
            loop {
                if self.update().await.is_err() {
                    tracing::warn!(
                        node = self.cfg.node_name,
                        "the Node is gone from the API server: registering it again"
                    );
                    self.last = None;
                    continue 'join;
                }
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(self.cfg.status_update_frequency) => {}
                    () = self.gone.notified() => {
                        tracing::warn!(
                            node = self.cfg.node_name,
                            "the Node was deleted: registering it again"
                        );
                        self.last = None;
                        continue 'join;
                    }
                }
            }
        }
    }
}

/// Cluster membership for the API server of `kubeconfig` until `cancel` (`machine`: the facts
/// [`status::Machine::read`] found): builds the client
/// (retrying while the kubeconfig is unusable), then registers the Node, keeps its status and
/// renews its Lease.
pub async fn run(
    cfg: Config,
    machine: status::Machine,
    kubeconfig: PathBuf,
    inputs: Inputs,
    cancel: CancellationToken,
) {
    let mut backoff = REGISTER_FIRST;
    let heartbeat_timeout = heartbeat::timeout(cfg.status_update_frequency, cfg.lease_duration);
    let (client, heartbeats) = loop {
        let clients = match crate::config::api::client_config(&kubeconfig).await {
            Ok(config) => crate::metrics::rest_client::client(
                config.clone(),
                &inputs.metrics.rest_client_requests,
            )
            .and_then(|client| {
                let hb =
                    heartbeat::Heartbeats::new(config, heartbeat_timeout, inputs.metrics.clone())?;
                Ok((client, hb))
            })
            .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match clients {
            Ok(c) => break c,
            Err(error) => {
                inputs.metrics.node_api_request("register", "kubeconfig");
                tracing::error!(%error, "cluster membership: cannot build the API client");
            }
        }
        if !sleep(backoff, &cancel).await {
            return;
        }
        backoff = (backoff * 2).min(REGISTER_MAX);
    };
    let (owner_tx, owner_rx) = watch::channel(None);
    let leases = lease::run(
        heartbeats.clone(),
        cfg.node_name.clone(),
        cfg.lease_duration,
        owner_rx.clone(),
        inputs.metrics.clone(),
        cancel.clone(),
    );
    let pods = pod_status::run(
        client.clone(),
        inputs.status.clone(),
        inputs.mirrors.clone(),
        (cfg.node_name.clone(), owner_rx.clone()),
        inputs.metrics.clone(),
        cancel.clone(),
    );
    let gone = Arc::new(Notify::new());
    let (stored_tx, stored) = watch::channel(status::Stored::default());
    let informer = informer::run(
        Api::all(client.clone()),
        cfg.node_name.clone(),
        inputs.admission.clone(),
        stored_tx,
        gone.clone(),
        inputs.metrics.clone(),
        cancel.clone(),
    );
    let node = NodeStatusLoop {
        api: Api::all(client),
        heartbeats,
        cfg,
        machine,
        inputs,
        owner: owner_tx,
        last: None,
        gone,
        stored,
    };
    tokio::join!(leases, pods, informer, node.run(cancel));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_patch_sends_addresses_whole_and_only_when_they_change() {
        use k8s_openapi::api::core::v1::{NodeAddress, NodeCondition};
        let address = |a: &str| NodeAddress {
            type_: "InternalIP".into(),
            address: a.into(),
        };
        let status = |addresses: Vec<NodeAddress>| NodeStatus {
            addresses: Some(addresses),
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let a = status(vec![address("10.0.0.1"), address("10.0.0.2")]);
        let first = status_patch(None, &a, &[]);
        assert_eq!(
            first["status"]["addresses"],
            serde_json::json!([
                {"$patch": "replace"},
                {"type": "InternalIP", "address": "10.0.0.1"},
                {"type": "InternalIP", "address": "10.0.0.2"},
            ])
        );
        assert_eq!(first["status"]["conditions"][0]["type"], "Ready");
        let same = status_patch(Some(&a), &a, &[]);
        assert!(same["status"].get("addresses").is_none(), "{same}");
        assert_eq!(same["status"]["conditions"][0]["type"], "Ready");
        let moved = status_patch(Some(&a), &status(vec![address("10.0.0.3")]), &[]);
        assert_eq!(moved["status"]["addresses"][1]["address"], "10.0.0.3");
        assert!(moved["status"].get("allocatable").is_none(), "{moved}");
        // An extended resource whose capacity is gone is deleted from allocatable.
        let removed = status_patch(Some(&a), &a, &["example.com/dongle".to_owned()]);
        assert_eq!(
            removed["status"]["allocatable"],
            serde_json::json!({"example.com/dongle": null})
        );
    }

    #[test]
    fn node_labels_parse_and_reserved_namespaces_are_guarded() {
        let l = parse_labels(&[
            "zone=a",
            " node.kubernetes.io/pool=x",
            "kubernetes.io/arch=amd64",
            "e=",
            "",
        ])
        .unwrap();
        assert_eq!(l["zone"], "a");
        assert_eq!(l["node.kubernetes.io/pool"], "x");
        assert_eq!(l["e"], "");
        assert!(matches!(
            parse_labels(&["node-role.kubernetes.io/master="]),
            Err(Error::Label(_))
        ));
        assert!(matches!(
            parse_labels(&["a.k8s.io/x=y"]),
            Err(Error::Label(_))
        ));
        assert!(matches!(
            parse_labels(&["novalue"]),
            Err(Error::LabelSyntax(_))
        ));
        assert!(matches!(parse_labels(&["bad key=v"]), Err(Error::Label(_))));
        assert!(matches!(parse_labels(&["k=-bad"]), Err(Error::Label(_))));
        assert!(parse_labels(&[format!("k={}", "a".repeat(64))]).is_err());
    }

    #[test]
    fn taints_parse_with_and_without_values() {
        let t = parse_taints(&["dedicated=db:NoSchedule", "gpu:NoExecute"]).unwrap();
        assert_eq!(
            (
                t[0].key.as_str(),
                t[0].value.as_deref(),
                t[0].effect.as_str()
            ),
            ("dedicated", Some("db"), "NoSchedule")
        );
        assert_eq!((t[1].key.as_str(), t[1].value.as_deref()), ("gpu", None));
        assert!(matches!(
            parse_taints(&["a=b:Sometimes"]),
            Err(Error::TaintEffect(_))
        ));
        assert!(matches!(parse_taints(&["a=b"]), Err(Error::TaintSyntax(_))));
    }
}
