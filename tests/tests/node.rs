//! Cluster membership against the in-process API server (no kube-apiserver can run here; the
//! server keeps the API's write semantics: resourceVersions, 409s, merge patches): the agent
//! registers its Node (labels, taints, capacity, allocatable, addresses, node info, the
//! kubelet's conditions), renews its Lease, turns NotReady when the runtime fails or hangs
//! (within 40 s, whatever the CRI request timeout) and Ready again after, writes the status only when it changes, adopts an existing Node,
//! registers again when its Node is deleted, and catches up when the API server was down at
//! its start while its static pods ran anyway. kubectl reads the result.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, NodeCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use swiftlet_tests::api_server::{ApiServer, Cluster};
use swiftlet_tests::cri_proxy::{CriProxy, Fault, Share};
use swiftlet_tests::{Agent, AgentOptions, Runtime};

const TIMEOUT: Duration = Duration::from_secs(30);

/// A KubeletConfiguration with a 4 s lease (renewed every second) and a status report every
/// `report` (an unchanged status is written that often).
fn fast_config(dir: &std::path::Path, report: &str) -> Vec<String> {
    let path = dir.join("config.yaml");
    std::fs::write(
        &path,
        format!(
            "kind: KubeletConfiguration\napiVersion: kubelet.config.k8s.io/v1beta1\n\
             nodeLeaseDurationSeconds: 4\n\
             nodeStatusReportFrequency: {report}\n"
        ),
    )
    .expect("write the config");
    vec![
        "--config".into(),
        path.display().to_string(),
        "--node-status-update-frequency".into(),
        "1s".into(),
    ]
}

/// Polls `check` every 50 ms until it gives a value.
fn eventually<T>(agent: &Agent, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    agent.eventually(what, TIMEOUT, || {
        check().ok_or_else(|| "not yet".to_owned())
    })
}

fn condition(node: &Node, type_: &str) -> Option<NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .cloned()
}

fn is_ready(node: &Node) -> bool {
    condition(node, "Ready").is_some_and(|c| c.status == "True")
}

/// An agent pointed at a new API server with `args`; `before` runs on the server first.
fn start(
    rt: &Runtime,
    name: &str,
    args: Vec<String>,
    cri: Option<String>,
    before: impl FnOnce(&ApiServer),
) -> Cluster {
    let mut opts = AgentOptions::new(name);
    opts.extra_args.extend(args);
    opts.cri_endpoint = cri;
    Cluster::start(rt, opts, before)
}

/// kubectl, or None when it is not installed (then `SWIFTLET_REQUIRE_RUNTIME=1` fails).
fn kubectl() -> Option<std::path::PathBuf> {
    swiftlet_tests::find_tool("kubectl", "apt-get install kubectl")
}

#[test]
fn the_node_registers_with_its_labels_resources_and_ready_condition() {
    let Some(rt) = Runtime::shared() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let mut args = fast_config(dir.path(), "5m");
    args.extend([
        "--node-labels".into(),
        "topology.kubernetes.io/zone=zone-a,pool=blue".into(),
        "--register-with-taints".into(),
        "dedicated=db:NoSchedule".into(),
        "--node-ip".into(),
        "192.0.2.10".into(),
        "--kube-reserved".into(),
        "cpu=100m,memory=100Mi".into(),
    ]);
    let c = start(rt, "node-register", args, None, |_| {});
    let name = c.agent.node_name().to_owned();
    let node = eventually(&c.agent, "the node to be Ready", || {
        c.server.node(&name).filter(is_ready)
    });
    let labels = node.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels["kubernetes.io/hostname"], name);
    assert_eq!(labels["kubernetes.io/os"], "linux");
    assert_eq!(labels["topology.kubernetes.io/zone"], "zone-a");
    assert_eq!(labels["pool"], "blue");
    let taints = node.spec.clone().and_then(|s| s.taints).unwrap_or_default();
    assert_eq!(
        taints
            .iter()
            .map(|t| (t.key.as_str(), t.value.as_deref(), t.effect.as_str()))
            .collect::<Vec<_>>(),
        [("dedicated", Some("db"), "NoSchedule")]
    );
    let status = node.status.clone().expect("a status");
    let capacity = status.capacity.expect("capacity");
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(capacity["cpu"].0, cpus.to_string());
    assert_eq!(capacity["pods"].0, "110");
    let memory_kib = swiftlet::cm::machine_memory_bytes().expect("MemTotal") / 1024;
    assert_eq!(capacity["memory"].0, format!("{memory_kib}Ki"));
    let allocatable = status.allocatable.expect("allocatable");
    // Huge pages (none pre-allocated is `hugepages-2Mi: 0`) are capacity, and not memory.
    let hugepages =
        swiftlet::node::status::hugepages(std::path::Path::new("/sys/kernel/mm/hugepages"));
    let mut hugepage_kib = 0;
    for (resource, bytes) in &hugepages {
        assert_eq!(capacity[resource].0, format!("{}Ki", bytes / 1024));
        assert_eq!(allocatable[resource].0, format!("{}Ki", bytes / 1024));
        hugepage_kib += bytes / 1024;
    }
    // The default memory.available<100Mi threshold and the 100Mi reservation.
    assert_eq!(
        allocatable["memory"].0,
        format!("{}Ki", memory_kib - 200 * 1024 - hugepage_kib)
    );
    // The runtime's images, the largest first, each with its names.
    let images = status.images.clone().unwrap_or_default();
    assert!(!images.is_empty(), "the node's images are listed");
    let sizes: Vec<i64> = images.iter().map(|i| i.size_bytes.unwrap_or(0)).collect();
    assert!(sizes.windows(2).all(|w| w[0] >= w[1]), "{sizes:?}");
    assert!(
        images.iter().all(|i| i
            .names
            .as_ref()
            .is_some_and(|n| !n.is_empty() && n.len() <= 5)),
        "{images:?}"
    );
    assert_eq!(allocatable["cpu"].0, format!("{}m", cpus * 1000 - 100));
    let addresses: Vec<(String, String)> = status
        .addresses
        .unwrap_or_default()
        .into_iter()
        .map(|a| (a.type_, a.address))
        .collect();
    assert_eq!(addresses[0], ("InternalIP".into(), "192.0.2.10".into()));
    assert!(
        addresses.iter().any(|(t, _)| t == "Hostname"),
        "{addresses:?}"
    );
    let info = status.node_info.expect("nodeInfo");
    assert!(
        info.container_runtime_version.starts_with("containerd://"),
        "{}",
        info.container_runtime_version
    );
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").expect("boot id");
    assert_eq!(info.boot_id, boot_id.trim());
    assert!(
        info.kubelet_version.contains("swiftlet"),
        "{}",
        info.kubelet_version
    );
    let ready = condition(&node, "Ready").expect("Ready");
    assert_eq!(ready.reason.as_deref(), Some("KubeletReady"));
    for (t, reason) in [
        ("MemoryPressure", "KubeletHasSufficientMemory"),
        ("DiskPressure", "KubeletHasNoDiskPressure"),
        ("PIDPressure", "KubeletHasSufficientPID"),
    ] {
        let cond = condition(&node, t).unwrap_or_else(|| panic!("{t}"));
        assert_eq!(
            (cond.status.as_str(), cond.reason.as_deref()),
            ("False", Some(reason))
        );
    }
    assert_eq!(
        status
            .daemon_endpoints
            .and_then(|d| d.kubelet_endpoint)
            .map(|e| e.port),
        Some(0),
        "the test agents run without the kubelet API"
    );

    // The lease: held by the node, owned by the Node, renewed every second.
    let uid = node.metadata.uid.clone().expect("a UID");
    let lease = eventually(&c.agent, "the lease to name its Node as owner", || {
        c.server.lease("kube-node-lease", &name).filter(|l| {
            l.metadata
                .owner_references
                .as_ref()
                .is_some_and(|o| !o.is_empty())
        })
    });
    let owner = &lease.metadata.owner_references.clone().unwrap_or_default()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("Node", uid.as_str())
    );
    let spec = lease.spec.clone().expect("a spec");
    assert_eq!(spec.holder_identity.as_deref(), Some(name.as_str()));
    assert_eq!(spec.lease_duration_seconds, Some(4));
    let first = spec.renew_time.expect("renewed").0;
    let renewed = eventually(&c.agent, "the lease to be renewed", || {
        let t = c
            .server
            .lease("kube-node-lease", &name)?
            .spec?
            .renew_time?
            .0;
        (t > first).then_some(t)
    });
    assert!(renewed.duration_since(first).as_secs_f64() < 3.0);

    // Someone else writes the lease: the agent's next renewal conflicts (409), it reads the
    // lease again and keeps renewing.
    let _in_runtime = c.tokio.enter();
    let client = c.server.client();
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(client, "kube-node-lease");
    let mut theirs = c.server.lease("kube-node-lease", &name).expect("the lease");
    theirs
        .metadata
        .labels
        .get_or_insert_default()
        .insert("touched".into(), "yes".into());
    c.tokio
        .block_on(leases.replace(&name, &Default::default(), &theirs))
        .expect("replace the lease");
    let after = k8s_openapi::jiff::Timestamp::now();
    eventually(&c.agent, "a renewal after the conflict", || {
        let l = c.server.lease("kube-node-lease", &name)?;
        let t = l.spec?.renew_time?.0;
        (t > after && l.metadata.labels?.contains_key("touched")).then_some(())
    });

    // kubectl sees the node Ready and reads the lease.
    let Some(kubectl) = kubectl() else {
        return;
    };
    let (_kubeconfig_dir, kubeconfig) = c.server.kubeconfig_file();
    let run = |args: &[&str]| {
        let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
        let out = swiftlet_tests::kubectl_output(&kubectl, &kubeconfig, &args);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "kubectl {args:?}: {stderr}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let table = run(&["get", "nodes"]);
    let row = table
        .lines()
        .find(|l| l.starts_with(&name))
        .unwrap_or_else(|| panic!("no row for {name}:\n{table}"));
    assert!(
        row.split_whitespace().nth(1) == Some("Ready"),
        "kubectl get nodes:\n{table}"
    );
    let json: serde_json::Value = serde_json::from_str(&run(&[
        "get",
        "lease",
        "-n",
        "kube-node-lease",
        &name,
        "-o",
        "json",
    ]))
    .expect("JSON");
    assert_eq!(json["spec"]["holderIdentity"], name.as_str());
}

#[test]
fn a_runtime_that_stops_answering_turns_the_node_not_ready_and_back() {
    let Some(ProxiedNode {
        _dir,
        proxy,
        c,
        name,
        ready_since,
    }) = ready_behind_a_proxy("node-not-ready", 7)
    else {
        return;
    };
    proxy.inject("Status", Fault::Fail(tonic::Code::Unavailable), Share::ALL);
    // Failing checks are tolerated until the last good answer is 30 s old.
    assert_runtime_down(&c, &name, ready_since, DOWN_WITHIN);
    // The PLEG's relists fail too: the runtime is not ready in /metrics.
    proxy.inject(
        "ListPodSandbox",
        Fault::Fail(tonic::Code::Unavailable),
        Share::ALL,
    );
    eventually(&c.agent, "swiftlet_runtime_ready 0", || {
        c.agent
            .get("/metrics")
            .1
            .contains("\nswiftlet_runtime_ready 0\n")
            .then_some(())
    });
    proxy.clear();
    eventually(&c.agent, "the node to be Ready again", || {
        c.server.node(&name).filter(is_ready)
    });
    eventually(&c.agent, "swiftlet_runtime_ready 1", || {
        c.agent
            .get("/metrics")
            .1
            .contains("\nswiftlet_runtime_ready 1\n")
            .then_some(())
    });
    let metrics = c.agent.get("/metrics").1;
    assert!(
        metrics.contains("swiftlet_node_api_requests_total{operation=\"status\",result=\"ok\"}"),
        "{metrics}"
    );
}

/// A Ready node whose agent reaches the runtime through a fault-injecting proxy. Bound with
/// `_dir` first and `c` after `proxy`: bindings drop in reverse, so the agent stops before the
/// proxy goes, and both before the config's directory.
struct ProxiedNode {
    proxy: CriProxy,
    c: Cluster,
    name: String,
    /// The Ready condition's transition time, its second already past
    /// ([`past_the_transition_second`]).
    ready_since: Option<Time>,
    /// The agent's config directory.
    _dir: tempfile::TempDir,
}

/// An agent with [`fast_config`] (report every 5 m) joined to a new API server, its CRI
/// endpoint a [`CriProxy`] seeded `seed`, once its node is Ready (`None` without a runtime).
fn ready_behind_a_proxy(name: &str, seed: u64) -> Option<ProxiedNode> {
    let rt = Runtime::shared()?;
    let proxy = CriProxy::start(&rt.endpoint, seed).unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().expect("tempdir");
    let c = start(
        rt,
        name,
        fast_config(dir.path(), "5m"),
        Some(proxy.endpoint()),
        |_| {},
    );
    let name = c.agent.node_name().to_owned();
    let ready = eventually(&c.agent, "the node to be Ready", || {
        c.server.node(&name).filter(is_ready)
    });
    let ready_since = past_the_transition_second(&ready);
    Some(ProxiedNode {
        proxy,
        c,
        name,
        ready_since,
        _dir: dir,
    })
}

/// How soon a node whose runtime stops answering turns NotReady: the 30 s the last good
/// answer to CRI `Status` may age, a status update (1 s with [`fast_config`]) and margin.
const DOWN_WITHIN: Duration = Duration::from_secs(40);

/// The Ready condition's transition time of `ready`, once the second it names has passed: a
/// transition time has whole seconds, so a fault injected within the second of the Ready
/// transition would make an honest new transition look like the old one.
fn past_the_transition_second(ready: &Node) -> Option<Time> {
    let since = condition(ready, "Ready").and_then(|c| c.last_transition_time);
    if let Some(since) = &since {
        let next = since.0 + Duration::from_millis(1_100);
        while k8s_openapi::jiff::Timestamp::now() < next {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    since
}

/// Waits at most `within` for node `name` to turn NotReady because its runtime is down (a new
/// transition after `ready_since`); returns how long it took.
fn assert_runtime_down(
    c: &Cluster,
    name: &str,
    ready_since: Option<Time>,
    within: Duration,
) -> Duration {
    let start = Instant::now();
    let down = c.agent.eventually("the node to be NotReady", within, || {
        c.server
            .node(name)
            .filter(|n| !is_ready(n))
            .ok_or_else(|| "still Ready".to_owned())
    });
    let took = start.elapsed();
    let cond = condition(&down, "Ready").expect("Ready");
    assert_eq!(cond.status, "False");
    assert_eq!(cond.reason.as_deref(), Some("KubeletNotReady"));
    let message = cond.message.unwrap_or_default();
    assert!(
        message.starts_with("container runtime is down"),
        "{message}"
    );
    assert_ne!(cond.last_transition_time, ready_since, "a new transition");
    took
}

#[test]
fn a_hung_runtime_turns_the_node_not_ready_within_40_s_and_back() {
    // The default --runtime-request-timeout (2 min): a status that waited for the runtime's
    // answers would stay Ready for minutes.
    let Some(ProxiedNode {
        _dir,
        proxy,
        c,
        name,
        ready_since,
    }) = ready_behind_a_proxy("node-hung-runtime", 11)
    else {
        return;
    };
    // Every CRI call hangs: no answer, no error, the connection open.
    proxy.inject("*", Fault::Hang, Share::ALL);
    let took = assert_runtime_down(&c, &name, ready_since, DOWN_WITHIN);
    eprintln!("NotReady {took:?} after the runtime hung");
    assert!(
        proxy.injected("Status") > 0,
        "the status checks reached the hang"
    );
    proxy.clear();
    eventually(&c.agent, "the node to be Ready again", || {
        c.server.node(&name).filter(is_ready)
    });
}

/// An agent with [`fast_config`] (`report`: the report frequency) joined to a new API server,
/// once its node is Ready: the cluster, the node's name and the config's directory (`None`
/// without a runtime).
fn ready_node(name: &str, report: &str) -> Option<(Cluster, String, tempfile::TempDir)> {
    let rt = Runtime::shared()?;
    let dir = tempfile::tempdir().expect("tempdir");
    let c = start(rt, name, fast_config(dir.path(), report), None, |_| {});
    let name = c.agent.node_name().to_owned();
    eventually(&c.agent, "the node to be Ready", || {
        c.server.node(&name).filter(is_ready)
    });
    Some((c, name, dir))
}

/// Count of status writes of node `name` so far.
fn status_writes(server: &ApiServer, name: &str) -> usize {
    let path = format!("/api/v1/nodes/{name}/status");
    server
        .request_log()
        .iter()
        .filter(|(_, method, p)| method != "GET" && *p == path)
        .count()
}

#[test]
fn an_unchanged_status_is_written_only_at_the_report_frequency() {
    let Some((c, name, _dir)) = ready_node("node-quiet", "4s") else {
        return;
    };
    // Computed every second for 9 s, nothing changing: written about every 4 s, never every
    // second.
    let before = status_writes(&c.server, &name);
    let heartbeat = |n: &Node| condition(n, "Ready").and_then(|c| c.last_heartbeat_time);
    let first_beat = c.server.node(&name).and_then(|n| heartbeat(&n));
    std::thread::sleep(Duration::from_secs(9));
    let writes = status_writes(&c.server, &name) - before;
    assert!((1..=3).contains(&writes), "{writes} status writes in 9 s");
    let later_beat = c.server.node(&name).and_then(|n| heartbeat(&n));
    assert!(
        later_beat > first_beat,
        "the heartbeat moves with the reports"
    );
    // Lease renewals go on at their own pace meanwhile: about 9 in 9 s.
    let since = Instant::now() - Duration::from_secs(9);
    let lease_path =
        format!("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}");
    let renewals = c
        .server
        .request_log()
        .iter()
        .filter(|(at, m, p)| *at >= since && m == "PUT" && *p == lease_path)
        .count();
    assert!(
        (6..=12).contains(&renewals),
        "{renewals} lease renewals in 9 s"
    );
}

/// Whether `version` is `v1.<minor>.<patch>+swiftlet-...`: the Kubernetes version whose API the
/// agent implements, then its own after the `+`.
fn is_kubernetes_version_with_swiftlets(version: &str) -> bool {
    let Some((kubernetes, swiftlet)) = version.split_once('+') else {
        return false;
    };
    let parts: Vec<&str> = kubernetes.split('.').collect();
    parts.len() == 3
        && parts[0] == "v1"
        && parts[1..]
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        && swiftlet.starts_with("swiftlet-")
}

/// The Node says what the kubelet's says: an extended resource another component advertised in
/// the Node's capacity (as `kubectl patch node --subresource=status` or a device plugin's
/// kubelet puts it there) becomes allocatable, and leaves allocatable when it leaves capacity;
/// the Hostname address is `--hostname-override`, not the machine's host name; `kubeletVersion`
/// is the Kubernetes version swiftlet implements with swiftlet's after a `+`.
#[test]
fn the_node_reports_extended_resources_the_hostname_override_and_the_kubernetes_version() {
    let Some((c, name, _dir)) = ready_node("node-facts", "5m") else {
        return;
    };
    let node = c.server.node(&name).expect("the node");
    let status = node.status.clone().expect("a status");
    let machine = swiftlet::cm::hostname().expect("the host name");
    assert_ne!(
        machine.to_lowercase(),
        name,
        "the override differs from the host name"
    );
    let hostnames: Vec<String> = status
        .addresses
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|a| a.type_ == "Hostname")
        .map(|a| a.address)
        .collect();
    assert_eq!(
        hostnames,
        std::slice::from_ref(&name),
        "the Hostname address is the override"
    );
    let version = status.node_info.expect("nodeInfo").kubelet_version;
    assert!(is_kubernetes_version_with_swiftlets(&version), "{version}");
    assert_eq!(version, swiftlet::VERSION);
    assert!(!is_kubernetes_version_with_swiftlets("v0.1.0+swiftlet"));

    let client = c.tokio.block_on(async { c.server.client() });
    let nodes: kube::Api<Node> = kube::Api::all(client);
    let patch = |capacity: serde_json::Value| {
        c.tokio
            .block_on(nodes.patch_status(
                &name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&serde_json::json!({"status": {"capacity": capacity}})),
            ))
            .expect("patching the Node's capacity");
    };
    let resources = |node: &Node| {
        let s = node.status.clone().unwrap_or_default();
        (
            s.capacity.unwrap_or_default(),
            s.allocatable.unwrap_or_default(),
        )
    };
    patch(serde_json::json!({"example.com/dongle": "4"}));
    let node = eventually(&c.agent, "the dongles to be allocatable", || {
        c.server.node(&name).filter(|n| {
            resources(n)
                .1
                .get("example.com/dongle")
                .map(|q| q.0.as_str())
                == Some("4")
        })
    });
    let (capacity, allocatable) = resources(&node);
    assert_eq!(capacity["example.com/dongle"].0, "4", "capacity is kept");
    assert_eq!(
        capacity["cpu"], allocatable["cpu"],
        "the agent's own numbers stay"
    );
    patch(serde_json::json!({"example.com/dongle": null}));
    eventually(&c.agent, "the dongles to leave allocatable", || {
        c.server
            .node(&name)
            .filter(|n| !resources(n).1.contains_key("example.com/dongle"))
    });
}

/// The status writes merge: a condition and an address another component put on the Node
/// (the network plugin's `NetworkUnavailable`, a cloud controller's `ExternalIP`) survive ten
/// of the agent's status writes, while the agent's own conditions go on being written.
#[test]
fn another_components_condition_and_address_survive_the_status_writes() {
    let Some((c, name, _dir)) = ready_node("node-merge", "1s") else {
        return;
    };
    let client = c.tokio.block_on(async { c.server.client() });
    let nodes: kube::Api<Node> = kube::Api::all(client);
    let theirs = serde_json::json!({"status": {
        "conditions": [{
            "type": "NetworkUnavailable", "status": "False", "reason": "RouteCreated",
            "message": "the route controller made a route",
            "lastHeartbeatTime": "2026-01-01T00:00:00Z",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }],
        "addresses": [{"type": "ExternalIP", "address": "192.0.2.200"}],
    }});
    c.tokio
        .block_on(nodes.patch_status(
            &name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Strategic(&theirs),
        ))
        .expect("the third party's status patch");
    let before = status_writes(&c.server, &name);
    let first_beat = c
        .server
        .node(&name)
        .and_then(|n| condition(&n, "Ready"))
        .and_then(|c| c.last_heartbeat_time);
    eventually(&c.agent, "ten more status writes", || {
        (status_writes(&c.server, &name) >= before + 10).then_some(())
    });
    let node = c.server.node(&name).expect("the node");
    let network = condition(&node, "NetworkUnavailable").expect("NetworkUnavailable kept");
    assert_eq!(
        (network.status.as_str(), network.reason.as_deref()),
        ("False", Some("RouteCreated"))
    );
    let addresses = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.clone())
        .unwrap_or_default();
    assert!(
        addresses
            .iter()
            .any(|a| a.type_ == "ExternalIP" && a.address == "192.0.2.200"),
        "{addresses:?}"
    );
    assert!(
        addresses.iter().any(|a| a.type_ == "InternalIP"),
        "{addresses:?}"
    );
    let ready = condition(&node, "Ready").expect("Ready");
    assert!(
        ready.last_heartbeat_time > first_beat,
        "the agent's own condition is written"
    );
    for own in ["MemoryPressure", "DiskPressure", "PIDPressure"] {
        assert!(condition(&node, own).is_some(), "{own}");
    }
}

/// The lease's last renewal time.
fn renewed_at(server: &ApiServer, name: &str) -> Option<k8s_openapi::jiff::Timestamp> {
    let lease = server.lease("kube-node-lease", name)?;
    Some(lease.spec?.renew_time?.0)
}

/// The API server stops answering without closing anything for 60 s (its connections are dead
/// for good, as after a load balancer's failover); once it answers new connections again, the
/// heartbeats are back within 20 s: each was bounded by the heartbeat timeout and the agent
/// dialled anew. From then on the Lease never lags by more than its duration. A pod that
/// finished meanwhile (its status write went unanswered) reaches Succeeded on the server within
/// 45 s: the pod status writer abandoned its unanswered writes.
#[test]
fn heartbeats_survive_an_api_server_that_stops_answering() {
    let Some((c, name, _dir)) = ready_node("node-blackhole", "1s") else {
        return;
    };
    eventually(&c.agent, "a renewed lease", || renewed_at(&c.server, &name));
    let never = "  restartPolicy: Never\n";
    c.server.put(swiftlet_tests::busybox_api_pod(
        &name, "brief", "", never, "sleep 20", "",
    ));
    let phase = |c: &Cluster| {
        c.server
            .pod_named("default", "brief")
            .and_then(|p| p.status?.phase)
    };
    eventually(&c.agent, "the pod Running on the server", || {
        phase(&c).filter(|p| p == "Running")
    });
    c.server.black_hole(true);
    std::thread::sleep(Duration::from_secs(60));
    c.server.black_hole(false);
    let answering = k8s_openapi::jiff::Timestamp::now();
    let since = Instant::now();
    let renewed = c.agent.eventually(
        "a lease renewal after the API server answers again",
        Duration::from_secs(20),
        || {
            renewed_at(&c.server, &name)
                .filter(|t| *t > answering)
                .ok_or_else(|| "not yet".to_owned())
        },
    );
    eprintln!(
        "lease renewed {:?} after the API server answered again ({renewed})",
        since.elapsed()
    );
    c.agent.eventually(
        "a status write after the API server answers again",
        Duration::from_secs(20),
        || {
            let node = c.server.node(&name).ok_or_else(|| "no node".to_owned())?;
            let beat = condition(&node, "Ready").and_then(|c| c.last_heartbeat_time);
            beat.filter(|t| t.0 > answering)
                .map(|_| ())
                .ok_or_else(|| "not yet".to_owned())
        },
    );
    c.agent.eventually(
        "the pod that finished meanwhile Succeeded on the server",
        Duration::from_secs(45),
        || {
            phase(&c)
                .filter(|p| p == "Succeeded")
                .map(|_| ())
                .ok_or_else(|| format!("{:?}", phase(&c)))
        },
    );
    // The lease duration is 4 s: for 10 s the last renewal is never older than that.
    let lease_duration = k8s_openapi::jiff::SignedDuration::from_secs(4);
    for _ in 0..20 {
        let last = renewed_at(&c.server, &name).expect("a lease");
        let age = k8s_openapi::jiff::Timestamp::now().duration_since(last);
        assert!(age < lease_duration, "the lease is {age:?} old");
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn an_existing_node_is_adopted_and_a_deleted_one_registered_again() {
    let Some(rt) = Runtime::shared() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    // The server is down until the operator's Node exists, so the agent's registration finds it.
    // Reports every 2 s: a deleted Node is found at the next status write.
    let c = start(
        rt,
        "node-adopt",
        fast_config(dir.path(), "2s"),
        None,
        |server| server.set_available(false),
    );
    let name = c.agent.node_name().to_owned();
    let theirs: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": "old", "team": "infra"}},
    }))
    .expect("a node");
    let uid = c.server.create_node(&theirs);
    c.server.set_available(true);
    let adopted = eventually(&c.agent, "the hostname label brought back", || {
        c.server.node(&name).filter(|n| {
            n.metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.get("kubernetes.io/hostname") == Some(&name))
        })
    });
    assert_eq!(
        adopted.metadata.uid.as_deref(),
        Some(uid.as_str()),
        "the same Node"
    );
    assert_eq!(
        adopted.metadata.labels.clone().unwrap_or_default()["team"],
        "infra",
        "the operator's label stays"
    );
    eventually(&c.agent, "the adopted node to be Ready", || {
        c.server.node(&name).filter(is_ready)
    });
    let lease = eventually(&c.agent, "the lease owned by the adopted Node", || {
        c.server.lease("kube-node-lease", &name).filter(|l| {
            l.metadata
                .owner_references
                .as_ref()
                .is_some_and(|o| o.iter().any(|o| o.uid == uid))
        })
    });
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some(name.as_str())
    );
    // Deleted: the next status write (at most a report period away) finds it gone and the
    // agent registers anew.
    c.server.delete_node(&name);
    let again = eventually(&c.agent, "a new registration", || {
        c.server
            .node(&name)
            .filter(|n| n.metadata.uid.as_deref() != Some(uid.as_str()))
    });
    let labels = again.metadata.labels.unwrap_or_default();
    assert!(!labels.contains_key("team"), "a new Node: {labels:?}");
}

#[test]
fn with_the_api_server_down_at_start_static_pods_run_and_the_node_catches_up() {
    let Some(rt) = Runtime::shared() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let c = start(
        rt,
        "node-api-down",
        fast_config(dir.path(), "5m"),
        None,
        |server| server.set_available(false),
    );
    let name = c.agent.node_name().to_owned();
    let manifest = c.agent.busybox_pod("web", "", "sleep 3600", "");
    c.agent.write_manifest("web.yaml", &manifest);
    let pod = c.agent.static_pod_name("web");
    c.agent
        .wait_for(|l| l.is_running(&pod), Duration::from_secs(90));
    assert!(c.server.node(&name).is_none());
    let refused = c
        .server
        .request_log()
        .iter()
        .filter(|(_, m, p)| m == "POST" && p == "/api/v1/nodes")
        .count();
    assert!(refused >= 2, "registration is retried ({refused} attempts)");
    c.server.set_available(true);
    eventually(&c.agent, "the node registered and Ready", || {
        c.server.node(&name).filter(is_ready)
    });
    eventually(&c.agent, "the lease", || {
        c.server.lease("kube-node-lease", &name)
    });
    let metrics = c.agent.get("/metrics").1;
    assert!(
        metrics
            .contains("swiftlet_node_api_requests_total{operation=\"register\",result=\"ok\"} 1"),
        "{metrics}"
    );
}
