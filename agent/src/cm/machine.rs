//! Facts about the machine the agent runs on, as the kubelet reads them for its node: its
//! addresses, CPUs and the capacity of its root filesystem. (Its memory is
//! [`super::machine_memory_bytes`].)
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::path::Path;

/// The node's addresses, as its Node shows them and its pods' `status.hostIP(s)`: the ones
/// configured (`--node-ip`, the first is the primary) when there are any, else the detected
/// ones ([`detected_ips`]).
pub fn node_ips(configured: &[IpAddr]) -> Vec<IpAddr> {
    if configured.is_empty() {
        detected_ips()
    } else {
        configured.to_vec()
    }
}

/// The machine's addresses: per IP family, the source address the kernel would use to reach
/// outside (the address of the default route's interface), IPv4 first. No packet is sent.
/// Empty when the machine has no default route.
pub fn detected_ips() -> Vec<IpAddr> {
    let outside: [(IpAddr, IpAddr); 2] = [
        (
            Ipv4Addr::UNSPECIFIED.into(),
            Ipv4Addr::new(192, 0, 2, 1).into(),
        ),
        (
            Ipv6Addr::UNSPECIFIED.into(),
            Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1).into(),
        ),
    ];
    outside
        .iter()
        .filter_map(|&(any, target)| {
            let sock = UdpSocket::bind(SocketAddr::new(any, 0)).ok()?;
            sock.connect(SocketAddr::new(target, 9)).ok()?;
            sock.local_addr().ok().map(|a| a.ip())
        })
        .collect()
}

/// The machine's host name: uname(2)'s node name, which is what glibc's gethostname(2) returns.
pub fn hostname() -> std::io::Result<String> {
    let uts = rustix::system::uname();
    String::from_utf8(uts.nodename().to_bytes().to_vec())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// The CPUs online (the node's cpu capacity).
pub fn machine_cpus() -> u64 {
    // SAFETY: sysconf takes a name by value and returns a number: no pointers, no memory
    // effects. (rustix has no equivalent: glibc counts the online CPUs from sysfs.)
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if n > 0 {
        n as u64
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get() as u64)
    }
}

/// The size in bytes of the filesystem holding `path` (the node's ephemeral-storage capacity
/// when `path` is the agent's root directory); `None` when it cannot be read.
pub fn filesystem_bytes(path: &Path) -> Option<u64> {
    filesystem_space(path).ok().map(|(capacity, _)| capacity)
}

/// The size of the file system holding `path` and the space available to unprivileged users,
/// in bytes (`statvfs`).
pub fn filesystem_space(path: &Path) -> std::io::Result<(u64, u64)> {
    filesystem_stats(path).map(|s| (s.capacity_bytes, s.available_bytes))
}

/// Space and inodes of a file system.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsSpace {
    pub capacity_bytes: u64,
    /// Available to unprivileged users.
    pub available_bytes: u64,
    /// Capacity minus the free blocks (the reserved ones count as used).
    pub used_bytes: u64,
    pub inodes: u64,
    pub inodes_free: u64,
}

/// [`FsSpace`] of the file system holding `path` (`statvfs`).
pub fn filesystem_stats(path: &Path) -> std::io::Result<FsSpace> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    let st = rustix::fs::statvfs(c.as_c_str())?;
    let frsize = st.f_frsize;
    let capacity_bytes = st.f_blocks.saturating_mul(frsize);
    Ok(FsSpace {
        capacity_bytes,
        available_bytes: st.f_bavail.saturating_mul(frsize),
        used_bytes: capacity_bytes.saturating_sub(st.f_bfree.saturating_mul(frsize)),
        inodes: st.f_files,
        inodes_free: st.f_ffree,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_machine_has_cpus_a_root_filesystem_and_ipv4_first() {
        assert!(machine_cpus() >= 1);
        assert!(filesystem_bytes(Path::new("/")).is_some_and(|b| b > 0));
        assert_eq!(filesystem_bytes(Path::new("/nonexistent/x")), None);
        let ips = detected_ips();
        if ips.len() == 2 {
            assert!(ips[0].is_ipv4() && ips[1].is_ipv6(), "{ips:?}");
        }
        assert_eq!(node_ips(&[]), ips);
        let configured: Vec<IpAddr> = vec!["10.9.8.7".parse().unwrap(), "fd00::7".parse().unwrap()];
        assert_eq!(
            node_ips(&configured),
            configured,
            "--node-ip wins over detection"
        );
    }
}
