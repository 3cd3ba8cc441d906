//! The Node object and its status, computed from what the machine, the runtime and the eviction
//! manager say: pure functions, so every rule is unit-tested without an API server.
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;

use k8s_openapi::api::core::v1::{
    ContainerImage, DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints,
    NodeSpec, NodeStatus, NodeSystemInfo,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use super::Config;

/// Facts about the machine that do not change while the agent runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Machine {
    pub cpus: u64,
    pub memory_bytes: u64,
    /// Size of the file system of the root directory (the node's ephemeral storage).
    pub ephemeral_bytes: u64,
    pub machine_id: String,
    pub system_uuid: String,
    pub boot_id: String,
    pub kernel_version: String,
    pub os_image: String,
    /// The architecture in Go's naming (`amd64`, `arm64`), as node labels and nodeInfo use it.
    pub architecture: String,
    /// Pre-allocated huge pages: (resource name such as `hugepages-2Mi`, bytes).
    pub hugepages: Vec<(String, u64)>,
}

/// The first line of file `path`, trimmed; empty when it cannot be read.
fn first_line(path: impl AsRef<Path>) -> String {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.lines().next().map(|l| l.trim().to_owned()))
        .unwrap_or_default()
}

/// `PRETTY_NAME` of an os-release file's text, unquoted; "Linux" without one.
pub fn os_image(os_release: &str) -> String {
    os_release
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim().trim_matches('"').to_owned())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "Linux".to_owned())
}

/// Go's name for the architecture Rust calls `arch`.
pub fn go_arch(arch: &str) -> String {
    match arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        "loongarch64" => "loong64",
        other => other,
    }
    .to_owned()
}

impl Machine {
    /// Reads the machine: CPUs, memory, the root directory's file system, IDs, kernel, OS.
    pub fn read(root_dir: &Path) -> Self {
        Self {
            cpus: crate::cm::machine_cpus(),
            memory_bytes: crate::cm::machine_memory_bytes().unwrap_or(0),
            ephemeral_bytes: crate::cm::filesystem_bytes(root_dir).unwrap_or(0),
            machine_id: first_line("/etc/machine-id"),
            system_uuid: first_line("/sys/class/dmi/id/product_uuid"),
            boot_id: first_line("/proc/sys/kernel/random/boot_id"),
            kernel_version: first_line("/proc/sys/kernel/osrelease"),
            os_image: os_image(&std::fs::read_to_string("/etc/os-release").unwrap_or_default()),
            architecture: go_arch(std::env::consts::ARCH),
            hugepages: hugepages(Path::new("/sys/kernel/mm/hugepages")),
        }
    }
}

/// The huge pages pre-allocated on the machine, from `dir` (`/sys/kernel/mm/hugepages`: one
/// `hugepages-<size>kB` directory a page size, its `nr_hugepages`), by page size.
pub fn hugepages(dir: &Path) -> Vec<(String, u64)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<(String, u64)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let kib: u64 = name
                .to_str()?
                .strip_prefix("hugepages-")?
                .strip_suffix("kB")?
                .parse()
                .ok()?;
            let pages: u64 = first_line(e.path().join("nr_hugepages")).parse().ok()?;
            Some((hugepage_resource(kib), pages.saturating_mul(kib * 1024)))
        })
        .collect();
    out.sort();
    out
}

/// The resource name of huge pages of `kib` KiB: `hugepages-2Mi`, `hugepages-1Gi`.
fn hugepage_resource(kib: u64) -> String {
    let size = if kib.is_multiple_of(1 << 20) {
        format!("{}Gi", kib >> 20)
    } else if kib.is_multiple_of(1024) {
        format!("{}Mi", kib >> 10)
    } else {
        format!("{kib}Ki")
    };
    format!("hugepages-{size}")
}

/// Most names one image carries in the node status (the kubelet's limit).
const MAX_NAMES_PER_IMAGE: usize = 5;

/// The node status's images: the largest first, at most `max` of them (-1: all), each named by
/// its digests then its tags (at most five names), as the kubelet lists them.
pub fn node_images(mut images: Vec<k8s_cri::v1::Image>, max: i32) -> Vec<ContainerImage> {
    images.sort_by_key(|i| std::cmp::Reverse(i.size));
    if let Ok(max) = usize::try_from(max) {
        images.truncate(max);
    }
    images
        .into_iter()
        .map(|i| {
            let mut names = i.repo_digests;
            names.extend(i.repo_tags);
            names.truncate(MAX_NAMES_PER_IMAGE);
            ContainerImage {
                names: Some(names),
                size_bytes: i64::try_from(i.size).ok(),
            }
        })
        .collect()
}

/// The labels swiftlet keeps on its Node: hostname, OS and architecture (a registration of an
/// existing Node brings them back when they differ).
pub fn default_labels(cfg: &Config, machine: &Machine) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("kubernetes.io/hostname".to_owned(), cfg.node_name.clone()),
        ("kubernetes.io/os".to_owned(), "linux".to_owned()),
        (
            "kubernetes.io/arch".to_owned(),
            machine.architecture.clone(),
        ),
    ])
}

/// The Node to create: the default labels and `--node-labels`, `--register-with-taints`.
pub fn initial_node(cfg: &Config, machine: &Machine) -> Node {
    let mut labels = cfg.labels.clone();
    labels.extend(default_labels(cfg, machine));
    Node {
        metadata: ObjectMeta {
            name: Some(cfg.node_name.clone()),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(
                "volumes.kubernetes.io/controller-managed-attach-detach".to_owned(),
                "true".to_owned(),
            )])),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: (!cfg.taints.is_empty()).then(|| cfg.taints.clone()),
            ..Default::default()
        }),
        status: None,
    }
}

/// A byte count as the kubelet writes it: in Ki when it divides evenly.
pub fn bytes_quantity(bytes: u64) -> Quantity {
    if bytes.is_multiple_of(1024) {
        Quantity(format!("{}Ki", bytes / 1024))
    } else {
        Quantity(bytes.to_string())
    }
}

/// A CPU amount in millicores as the kubelet writes it: whole cores without a unit.
pub fn cpu_quantity(millis: u64) -> Quantity {
    if millis.is_multiple_of(1000) {
        Quantity((millis / 1000).to_string())
    } else {
        Quantity(format!("{millis}m"))
    }
}

/// The largest hard eviction threshold of `signal` for a resource of `capacity`.
fn hard_threshold(cfg: &Config, signal: crate::eviction::Signal, capacity: u64) -> u64 {
    cfg.eviction_hard
        .iter()
        .filter(|t| t.signal == signal)
        .map(|t| t.amount.of(capacity))
        .max()
        .unwrap_or(0)
}

/// Allocatable cpu (millicores) and memory (bytes), as [`resources`] computes them (memory is
/// also less the pre-allocated huge pages, which pods cannot use as ordinary memory).
pub fn allocatable_cpu_memory(cfg: &Config, machine: &Machine) -> (u64, u64) {
    let memory = machine.memory_bytes;
    let threshold = hard_threshold(cfg, crate::eviction::Signal::MemoryAvailable, memory);
    let hugepages: u64 = machine.hugepages.iter().map(|(_, b)| b).sum();
    (
        (machine.cpus * 1000).saturating_sub(cfg.reserved.cpu_millis),
        memory
            .saturating_sub(cfg.reserved.memory)
            .saturating_sub(threshold)
            .saturating_sub(hugepages),
    )
}

/// Capacity and allocatable: capacity less `--kube-reserved` and `--system-reserved`, and for
/// memory and ephemeral storage less the hard eviction threshold of `memory.available` and
/// `nodefs.available` (the kubelet's formula).
pub fn resources(
    cfg: &Config,
    machine: &Machine,
) -> (BTreeMap<String, Quantity>, BTreeMap<String, Quantity>) {
    let cpu_millis = machine.cpus * 1000;
    let memory = machine.memory_bytes;
    let storage = machine.ephemeral_bytes;
    let (alloc_cpu, alloc_memory) = allocatable_cpu_memory(cfg, machine);
    let pods = Quantity(cfg.max_pods.to_string());
    let mut capacity = BTreeMap::from([
        ("cpu".to_owned(), cpu_quantity(cpu_millis)),
        ("memory".to_owned(), bytes_quantity(memory)),
        ("ephemeral-storage".to_owned(), bytes_quantity(storage)),
        ("pods".to_owned(), pods.clone()),
    ]);
    let mut allocatable = BTreeMap::from([
        ("cpu".to_owned(), cpu_quantity(alloc_cpu)),
        ("memory".to_owned(), bytes_quantity(alloc_memory)),
        (
            "ephemeral-storage".to_owned(),
            bytes_quantity(
                storage
                    .saturating_sub(cfg.reserved.ephemeral_storage)
                    .saturating_sub(hard_threshold(
                        cfg,
                        crate::eviction::Signal::NodeFsAvailable,
                        storage,
                    )),
            ),
        ),
        ("pods".to_owned(), pods),
    ]);
    for (name, bytes) in &machine.hugepages {
        capacity.insert(name.clone(), bytes_quantity(*bytes));
        allocatable.insert(name.clone(), bytes_quantity(*bytes));
    }
    (capacity, allocatable)
}

/// The Node's `status.capacity` and `status.allocatable` as the API server holds them (the Node
/// watch's last sight): other components advertise resources swiftlet does not count itself
/// by patching them into the Node's capacity (extended resources such as `example.com/dongle`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stored {
    pub capacity: BTreeMap<String, Quantity>,
    pub allocatable: BTreeMap<String, Quantity>,
}

impl Stored {
    /// The resources of `node`'s status.
    pub fn of(node: &Node) -> Self {
        let status = node.status.as_ref();
        Self {
            capacity: status.and_then(|s| s.capacity.clone()).unwrap_or_default(),
            allocatable: status
                .and_then(|s| s.allocatable.clone())
                .unwrap_or_default(),
        }
    }
}

/// Whether `name` is an extended resource: a name outside the `kubernetes.io` domains with a
/// domain prefix (`example.com/dongle`), not a quota's `requests.` name, as the kubelet tells
/// them apart from native resources (`cpu`, `hugepages-2Mi`, `kubernetes.io/...`).
pub fn is_extended_resource(name: &str) -> bool {
    name.contains('/') && !name.contains("kubernetes.io/") && !name.starts_with("requests.")
}

/// The resources of the Node's capacity that swiftlet does not count itself (`own`: its
/// capacity), carried into allocatable whole, as the kubelet computes allocatable from every
/// resource of the Node's capacity: the reservations and eviction thresholds only concern cpu,
/// memory and ephemeral storage, which swiftlet counts.
fn carried(own: &BTreeMap<String, Quantity>, stored: &Stored) -> BTreeMap<String, Quantity> {
    stored
        .capacity
        .iter()
        .filter(|(name, _)| !own.contains_key(*name))
        .map(|(name, q)| (name.clone(), q.clone()))
        .collect()
}

/// The extended resources the API server's allocatable still has that `new` (the allocatable
/// computed) does not: their capacity is gone, so the status write removes them, as the kubelet
/// removes an extended resource from allocatable once it is no longer in capacity.
pub fn stale_allocatable(stored: &Stored, new: &NodeStatus) -> Vec<String> {
    let empty = BTreeMap::new();
    let new = new.allocatable.as_ref().unwrap_or(&empty);
    stored
        .allocatable
        .keys()
        .filter(|k| is_extended_resource(k) && !new.contains_key(*k))
        .cloned()
        .collect()
}

/// What was observed for one status: the runtime's and the PLEG's problems (none: ready), the
/// pressure conditions the eviction manager holds, the runtime's version.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// Why the node is not ready; empty: it is.
    pub not_ready: Vec<String>,
    /// Conditions under pressure (`MemoryPressure`, `DiskPressure`, `PIDPressure`).
    pub pressure: Vec<&'static str>,
    /// `<runtime name>://<version>`, when the runtime answered.
    pub runtime_version: Option<String>,
    pub addresses: Vec<IpAddr>,
    /// The runtime's images, when it answered.
    pub images: Option<Vec<k8s_cri::v1::Image>>,
    /// The Node's resources as the API server has them.
    pub stored: Stored,
}

/// The node's addresses: `--node-ip` (or the machine's) as InternalIP, then `hostname` (the
/// node's hostname, `--hostname-override` when given) as Hostname, as the kubelet lists them.
pub fn addresses(ips: &[IpAddr], hostname: &str) -> Vec<NodeAddress> {
    let mut out: Vec<NodeAddress> = ips
        .iter()
        .map(|ip| NodeAddress {
            type_: "InternalIP".to_owned(),
            address: ip.to_string(),
        })
        .collect();
    if !hostname.is_empty() {
        out.push(NodeAddress {
            type_: "Hostname".to_owned(),
            address: hostname.to_owned(),
        });
    }
    out
}

/// (type, reason and message when true, reason and message when false) of the pressure
/// conditions, in the kubelet's order and words.
const PRESSURE: [(&str, [&str; 2], [&str; 2]); 3] = [
    (
        "MemoryPressure",
        [
            "KubeletHasInsufficientMemory",
            "kubelet has insufficient memory available",
        ],
        [
            "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available",
        ],
    ),
    (
        "DiskPressure",
        ["KubeletHasDiskPressure", "kubelet has disk pressure"],
        ["KubeletHasNoDiskPressure", "kubelet has no disk pressure"],
    ),
    (
        "PIDPressure",
        [
            "KubeletHasInsufficientPID",
            "kubelet has insufficient PID available",
        ],
        [
            "KubeletHasSufficientPID",
            "kubelet has sufficient PID available",
        ],
    ),
];

/// Condition `type_` now: its transition time stays what `prev` had while its status does not
/// change; its heartbeat is `now`.
fn condition(
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    prev: Option<&NodeStatus>,
    now: &Time,
) -> NodeCondition {
    let status = if status { "True" } else { "False" }.to_owned();
    let transition = prev
        .and_then(|p| p.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == type_))
        .filter(|c| c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    NodeCondition {
        type_: type_.to_owned(),
        status,
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(transition),
    }
}

/// The node's status at `now`; `prev` is the status last written (transition times carry over).
pub fn node_status(
    cfg: &Config,
    machine: &Machine,
    observed: &Observed,
    prev: Option<&NodeStatus>,
    now: &Time,
) -> NodeStatus {
    let (capacity, mut allocatable) = resources(cfg, machine);
    // The other resources of the Node's capacity are allocatable too; they are not written to
    // capacity, which their owners keep (writing back what was last seen could undo a newer
    // value).
    allocatable.extend(carried(&capacity, &observed.stored));
    let mut conditions: Vec<NodeCondition> = PRESSURE
        .iter()
        .map(|(type_, on, off)| {
            let under = observed.pressure.contains(type_);
            let [reason, message] = if under { on } else { off };
            condition(type_, under, reason, message, prev, now)
        })
        .collect();
    let ready = observed.not_ready.is_empty();
    let message = if ready {
        "swiftlet is posting ready status".to_owned()
    } else {
        observed.not_ready.join("; ")
    };
    let reason = if ready {
        "KubeletReady"
    } else {
        "KubeletNotReady"
    };
    conditions.push(condition("Ready", ready, reason, &message, prev, now));
    let runtime_version = observed
        .runtime_version
        .clone()
        .or_else(|| {
            prev.and_then(|p| p.node_info.as_ref())
                .map(|i| i.container_runtime_version.clone())
        })
        .unwrap_or_default();
    let images = match &observed.images {
        Some(images) => node_images(images.clone(), cfg.max_images),
        None => prev.and_then(|p| p.images.clone()).unwrap_or_default(),
    };
    NodeStatus {
        capacity: Some(capacity),
        images: Some(images),
        allocatable: Some(allocatable),
        conditions: Some(conditions),
        addresses: Some(addresses(&observed.addresses, &cfg.hostname)),
        daemon_endpoints: Some(NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint {
                port: i32::from(cfg.kubelet_port),
            }),
        }),
        node_info: Some(NodeSystemInfo {
            machine_id: machine.machine_id.clone(),
            system_uuid: machine.system_uuid.clone(),
            boot_id: machine.boot_id.clone(),
            kernel_version: machine.kernel_version.clone(),
            os_image: machine.os_image.clone(),
            container_runtime_version: runtime_version,
            kubelet_version: crate::VERSION.to_owned(),
            operating_system: "linux".to_owned(),
            architecture: machine.architecture.clone(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Whether `new` says something `old` did not, heartbeat times aside (the kubelet writes an
/// unchanged status only once the report frequency has passed).
pub fn changed(old: &NodeStatus, new: &NodeStatus) -> bool {
    let strip = |s: &NodeStatus| {
        let mut s = s.clone();
        for c in s.conditions.iter_mut().flatten() {
            c.last_heartbeat_time = None;
        }
        s
    };
    strip(old) != strip(new)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> Config {
        Config {
            node_name: "n1".into(),
            hostname: "n1".into(),
            max_pods: 110,
            kubelet_port: 10250,
            ..Config::default()
        }
    }

    fn machine() -> Machine {
        Machine {
            cpus: 4,
            memory_bytes: 8 << 30,
            ephemeral_bytes: 100 << 30,
            architecture: "amd64".into(),
            ..Machine::default()
        }
    }

    fn at(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    fn cond<'a>(s: &'a NodeStatus, t: &str) -> &'a NodeCondition {
        s.conditions
            .as_ref()
            .and_then(|cs| cs.iter().find(|c| c.type_ == t))
            .expect("condition")
    }

    #[test]
    fn allocatable_is_capacity_less_reservations_and_hard_thresholds() {
        let mut c = cfg();
        c.reserved = crate::eviction::Reserved {
            memory: 1 << 30,
            cpu_millis: 500,
            ephemeral_storage: 0,
        };
        c.eviction_hard =
            crate::eviction::parse_thresholds(&["memory.available<100Mi", "nodefs.available<10%"])
                .unwrap();
        let (cap, alloc) = resources(&c, &machine());
        assert_eq!(cap["cpu"].0, "4");
        assert_eq!(cap["memory"].0, "8388608Ki");
        assert_eq!(cap["pods"].0, "110");
        assert_eq!(alloc["cpu"].0, "3500m");
        // 8 GiB - 1 GiB - 100 MiB.
        assert_eq!(alloc["memory"].0, format!("{}Ki", (7 << 20) - 100 * 1024));
        // 100 GiB - 10%.
        assert_eq!(
            alloc["ephemeral-storage"].0,
            bytes_quantity((100u64 << 30) - (100u64 << 30) / 10).0
        );
    }

    #[test]
    fn resources_of_the_nodes_capacity_that_swiftlet_does_not_count_are_allocatable() {
        let q = |s: &str| Quantity(s.to_owned());
        let stored = Stored {
            capacity: BTreeMap::from([
                ("example.com/dongle".to_owned(), q("4")),
                // swiftlet's own resources are its own numbers, whatever the Node says.
                ("cpu".to_owned(), q("999")),
                ("memory".to_owned(), q("1Ki")),
            ]),
            allocatable: BTreeMap::from([
                ("example.com/dongle".to_owned(), q("4")),
                ("example.com/gone".to_owned(), q("1")),
                ("hugepages-32Mi".to_owned(), q("0")),
            ]),
        };
        let observed = Observed {
            stored: stored.clone(),
            ..Observed::default()
        };
        let s = node_status(&cfg(), &machine(), &observed, None, &at(1));
        let (capacity, allocatable) = (s.capacity.clone().unwrap(), s.allocatable.clone().unwrap());
        assert_eq!(allocatable["example.com/dongle"], q("4"));
        assert_eq!(allocatable["cpu"], q("4"));
        assert_eq!(allocatable["memory"], bytes_quantity(8 << 30));
        assert!(
            !capacity.contains_key("example.com/dongle"),
            "capacity is left to the resource's owner"
        );
        // An extended resource gone from capacity is removed from allocatable; a native one is
        // not (the kubelet's rule).
        assert_eq!(stale_allocatable(&stored, &s), ["example.com/gone"]);
        let without = Observed::default();
        let s = node_status(&cfg(), &machine(), &without, None, &at(2));
        assert!(!s.allocatable.unwrap().contains_key("example.com/dongle"));
        assert_eq!(
            stale_allocatable(
                &stored,
                &node_status(&cfg(), &machine(), &without, None, &at(3))
            ),
            ["example.com/dongle", "example.com/gone"]
        );
        for (name, extended) in [
            ("example.com/dongle", true),
            ("nvidia.com/gpu", true),
            ("cpu", false),
            ("hugepages-2Mi", false),
            ("kubernetes.io/something", false),
            ("requests.example.com/x", false),
        ] {
            assert_eq!(is_extended_resource(name), extended, "{name}");
        }
    }

    #[test]
    fn the_hostname_address_is_the_configured_hostname() {
        let c = Config {
            hostname: "override-name".into(),
            ..cfg()
        };
        let obs = Observed {
            addresses: vec!["10.0.0.5".parse().unwrap()],
            ..Observed::default()
        };
        let s = node_status(&c, &machine(), &obs, None, &at(1));
        let addresses = s.addresses.clone().unwrap_or_default();
        assert_eq!(addresses.len(), 2, "{addresses:?}");
        assert_eq!(
            (addresses[1].type_.as_str(), addresses[1].address.as_str()),
            ("Hostname", "override-name")
        );
        assert_eq!(s.node_info.unwrap().kubelet_version, crate::VERSION);
    }

    #[test]
    fn ready_and_pressure_conditions_use_the_kubelets_reasons() {
        let s = node_status(&cfg(), &machine(), &Observed::default(), None, &at(100));
        let ready = cond(&s, "Ready");
        assert_eq!(ready.status, "True");
        assert_eq!(ready.reason.as_deref(), Some("KubeletReady"));
        let mem = cond(&s, "MemoryPressure");
        assert_eq!(
            (mem.status.as_str(), mem.reason.as_deref()),
            ("False", Some("KubeletHasSufficientMemory"))
        );
        let types: Vec<&str> = s
            .conditions
            .iter()
            .flatten()
            .map(|c| c.type_.as_str())
            .collect();
        assert_eq!(
            types,
            ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
        );

        let bad = Observed {
            not_ready: vec![
                "container runtime is down".into(),
                "PLEG is not healthy".into(),
            ],
            pressure: vec!["DiskPressure"],
            ..Observed::default()
        };
        let s2 = node_status(&cfg(), &machine(), &bad, Some(&s), &at(110));
        let ready = cond(&s2, "Ready");
        assert_eq!(ready.status, "False");
        assert_eq!(ready.reason.as_deref(), Some("KubeletNotReady"));
        assert_eq!(
            ready.message.as_deref(),
            Some("container runtime is down; PLEG is not healthy")
        );
        assert_eq!(ready.last_transition_time, Some(at(110)));
        let disk = cond(&s2, "DiskPressure");
        assert_eq!(
            (disk.status.as_str(), disk.reason.as_deref()),
            ("True", Some("KubeletHasDiskPressure"))
        );
        // Unchanged conditions keep their transition time and get a new heartbeat.
        let mem = cond(&s2, "MemoryPressure");
        assert_eq!(mem.last_transition_time, Some(at(100)));
        assert_eq!(mem.last_heartbeat_time, Some(at(110)));
    }

    #[test]
    fn a_new_heartbeat_alone_is_no_change() {
        let obs = Observed {
            runtime_version: Some("containerd://2.0".into()),
            ..Observed::default()
        };
        let a = node_status(&cfg(), &machine(), &obs, None, &at(100));
        let b = node_status(&cfg(), &machine(), &obs, Some(&a), &at(110));
        assert!(!changed(&a, &b));
        let c = node_status(
            &cfg(),
            &machine(),
            &Observed {
                pressure: vec!["MemoryPressure"],
                ..obs.clone()
            },
            Some(&b),
            &at(120),
        );
        assert!(changed(&b, &c));
        // A runtime that does not answer keeps the version it last reported.
        let d = node_status(&cfg(), &machine(), &Observed::default(), Some(&a), &at(130));
        assert_eq!(
            d.node_info.unwrap().container_runtime_version,
            "containerd://2.0"
        );
    }

    #[test]
    fn node_has_default_and_configured_labels_and_taints() {
        let mut c = cfg();
        c.labels.insert("zone".into(), "a".into());
        c.labels
            .insert("kubernetes.io/hostname".into(), "spoofed".into());
        c.taints = vec![k8s_openapi::api::core::v1::Taint {
            key: "dedicated".into(),
            value: Some("db".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        }];
        let n = initial_node(&c, &machine());
        let labels = n.metadata.labels.unwrap();
        assert_eq!(labels["zone"], "a");
        assert_eq!(labels["kubernetes.io/hostname"], "n1", "the default wins");
        assert_eq!(labels["kubernetes.io/arch"], "amd64");
        assert_eq!(n.spec.unwrap().taints.unwrap()[0].key, "dedicated");
    }

    #[test]
    fn os_image_and_arch_names() {
        assert_eq!(
            os_image("NAME=\"Debian\"\nPRETTY_NAME=\"Debian GNU/Linux 13 (trixie)\"\n"),
            "Debian GNU/Linux 13 (trixie)"
        );
        assert_eq!(os_image(""), "Linux");
        assert_eq!(go_arch("x86_64"), "amd64");
        assert_eq!(go_arch("aarch64"), "arm64");
        assert_eq!(
            addresses(&["10.0.0.5".parse().unwrap()], "h")
                .iter()
                .map(|a| (a.type_.as_str(), a.address.as_str()))
                .collect::<Vec<_>>(),
            [("InternalIP", "10.0.0.5"), ("Hostname", "h")]
        );
    }

    #[test]
    fn huge_pages_are_capacity_and_come_out_of_allocatable_memory() {
        let dir = tempfile::tempdir().unwrap();
        for (size, pages) in [("2048kB", "512"), ("1048576kB", "2"), ("64kB", "junk")] {
            let d = dir.path().join(format!("hugepages-{size}"));
            std::fs::create_dir(&d).unwrap();
            std::fs::write(d.join("nr_hugepages"), format!("{pages}\n")).unwrap();
        }
        std::fs::create_dir(dir.path().join("unrelated")).unwrap();
        let pages = hugepages(dir.path());
        assert_eq!(
            pages,
            [
                ("hugepages-1Gi".to_owned(), 2 << 30),
                ("hugepages-2Mi".to_owned(), 1 << 30)
            ]
        );
        assert_eq!(hugepage_resource(64), "hugepages-64Ki");
        assert!(hugepages(&dir.path().join("missing")).is_empty());
        let m = Machine {
            hugepages: pages,
            ..machine()
        };
        let (capacity, allocatable) = resources(&cfg(), &m);
        assert_eq!(capacity["hugepages-2Mi"], bytes_quantity(1 << 30));
        assert_eq!(allocatable["hugepages-1Gi"], bytes_quantity(2 << 30));
        assert_eq!(capacity["memory"], bytes_quantity(8 << 30));
        assert_eq!(
            allocatable["memory"],
            bytes_quantity(5 << 30),
            "8Gi less 3Gi of huge pages"
        );
        assert_eq!(allocatable_cpu_memory(&cfg(), &m).1, 5 << 30);
    }

    #[test]
    fn images_are_listed_largest_first_with_digests_then_tags() {
        let image = |size: u64, tags: &[&str], digests: &[&str]| k8s_cri::v1::Image {
            size,
            repo_tags: tags.iter().map(|t| (*t).to_owned()).collect(),
            repo_digests: digests.iter().map(|d| (*d).to_owned()).collect(),
            ..Default::default()
        };
        let images = vec![
            image(10, &["small:1"], &[]),
            image(
                300,
                &["big:1", "big:2", "big:3", "big:4"],
                &["big@sha256:a", "big@sha256:b"],
            ),
            image(200, &["mid:1"], &["mid@sha256:c"]),
        ];
        let listed = node_images(images.clone(), 50);
        let names: Vec<Vec<String>> = listed.iter().map(|i| i.names.clone().unwrap()).collect();
        assert_eq!(
            names,
            [
                vec!["big@sha256:a", "big@sha256:b", "big:1", "big:2", "big:3"],
                vec!["mid@sha256:c", "mid:1"],
                vec!["small:1"],
            ]
        );
        assert_eq!(listed[0].size_bytes, Some(300));
        assert_eq!(node_images(images.clone(), 2).len(), 2);
        assert_eq!(node_images(images.clone(), 0).len(), 0);
        assert_eq!(node_images(images.clone(), -1).len(), 3);
        // The runtime not answering keeps the images last listed.
        let mut c = cfg();
        c.max_images = 50;
        let observed = Observed {
            images: Some(images),
            ..Observed::default()
        };
        let first = node_status(&c, &machine(), &observed, None, &at(1));
        let later = node_status(&c, &machine(), &Observed::default(), Some(&first), &at(2));
        assert_eq!(later.images.as_ref().map(Vec::len), Some(3));
    }
}
