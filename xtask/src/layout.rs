//! Where the private containerd, its images and the agents started by xtask keep their files:
//! one place every xtask command, the integration tests and the benches take paths from.
use std::path::{Path, PathBuf};

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
        }
    }
}
