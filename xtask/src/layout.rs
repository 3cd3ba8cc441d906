//! Where the private containerd, its images and the agents started by xtask keep their files:
//! one place every xtask command, the integration tests and the benches take paths from.
use std::path::{Path, PathBuf};

/// The pod subnet of the default layout's CNI bridge network.
pub const POD_SUBNET: &str = "10.99.0.0/16";
/// The bridge the default layout's CNI config creates.
pub const BRIDGE_NAME: &str = "swiftlet0";
/// Top-level cgroups with this prefix belong to swiftlet's demo and tests.
pub const CGROUP_PREFIX: &str = "swiftlet-";

/// Where the private containerd keeps everything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The gRPC socket (CRI endpoint).
    pub socket: PathBuf,
    /// The ttrpc socket (distinct from the system containerd's).
    pub ttrpc_socket: PathBuf,
    /// containerd `state`.
    pub state: PathBuf,
    /// containerd `root` (content store, snapshots: images survive `down`).
    pub root: PathBuf,
    /// The generated containerd config file.
    pub config: PathBuf,
    /// CNI config dir.
    pub cni_conf_dir: PathBuf,
    /// CNI plugin binaries.
    pub cni_bin_dir: PathBuf,
    /// host-local IPAM data dir.
    pub cni_ipam_dir: PathBuf,
    /// containerd's stdout/stderr.
    pub log: PathBuf,
    /// containerd's pid.
    pub pid_file: PathBuf,
    /// Lock serialising `up`/`down`/image imports between processes.
    pub lock_file: PathBuf,
    /// Where the image archives are written before import.
    pub images_dir: PathBuf,
    /// containerd's registry host configs (`<dir>/<host:port>/hosts.toml`), read on every pull,
    /// so a registry a test or bench starts is usable without restarting containerd.
    pub registry_hosts_dir: PathBuf,
    /// The CNI bridge's name (at most 15 bytes: a Linux interface name).
    pub bridge: String,
    /// The pod subnet of the bridge network (host-local IPAM).
    pub pod_subnet: String,
    /// `down` removes every top-level cgroup with this prefix (the demo's and the tests'
    /// cgroup roots); `None`: it removes no cgroup (a layout beside the default one, whose
    /// cgroups belong to others).
    pub cgroup_prefix: Option<String>,
    /// runc places containers through systemd (`SystemdCgroup = true`): the runtime's half of
    /// the agent's `--cgroup-driver systemd`, which only works where systemd is the init.
    pub systemd_cgroup: bool,
}

impl Default for Layout {
    fn default() -> Self {
        let run = Path::new("/run/swiftlet-dev");
        let lib = Path::new("/var/lib/swiftlet-dev");
        Self {
            socket: run.join("containerd.sock"),
            ttrpc_socket: run.join("containerd.sock.ttrpc"),
            state: run.join("state"),
            root: lib.join("containerd"),
            config: lib.join("containerd.toml"),
            cni_conf_dir: lib.join("cni/net.d"),
            cni_bin_dir: PathBuf::from("/usr/lib/cni"),
            cni_ipam_dir: lib.join("cni/ipam"),
            log: lib.join("containerd.log"),
            pid_file: run.join("containerd.pid"),
            lock_file: run.join("lock"),
            images_dir: lib.join("images"),
            registry_hosts_dir: lib.join("registry-hosts"),
            bridge: BRIDGE_NAME.to_owned(),
            pod_subnet: POD_SUBNET.to_owned(),
            cgroup_prefix: Some(CGROUP_PREFIX.to_owned()),
            systemd_cgroup: false,
        }
    }
}

impl Layout {
    /// A second private containerd with every file of its own under `dir` (socket, state,
    /// root, config, CNI config and IPAM data, log, lock, images), its own bridge `bridge`
    /// (at most 15 bytes) and pod subnet `pod_subnet`, neither shared with the default layout.
    /// Its `down` removes no cgroup. The CNI plugin binaries are the default layout's.
    pub fn under(dir: &Path, bridge: &str, pod_subnet: &str) -> Self {
        let run = dir.join("run");
        Self {
            socket: run.join("containerd.sock"),
            ttrpc_socket: run.join("containerd.sock.ttrpc"),
            state: run.join("state"),
            root: dir.join("containerd"),
            config: dir.join("containerd.toml"),
            cni_conf_dir: dir.join("cni/net.d"),
            cni_bin_dir: PathBuf::from("/usr/lib/cni"),
            cni_ipam_dir: dir.join("cni/ipam"),
            log: dir.join("containerd.log"),
            pid_file: run.join("containerd.pid"),
            lock_file: run.join("lock"),
            images_dir: dir.join("images"),
            registry_hosts_dir: dir.join("registry-hosts"),
            bridge: bridge.to_owned(),
            pod_subnet: pod_subnet.to_owned(),
            cgroup_prefix: None,
            systemd_cgroup: false,
        }
    }
}
