//! The kubelet-managed `/etc/hosts`: the file `<root-dir>/pods/<uid>/etc-hosts`, written before
//! each container of the pod is created and bind-mounted at `/etc/hosts` in every container that
//! does not mount something there itself. A pod-network pod's file names localhost, the pod's IPs
//! with its hostname (and FQDN with a subdomain) and its `hostAliases`; a host-network pod's is the
//! node's hosts file with the `hostAliases` appended.
use k8s_openapi::api::core::v1::{Container, HostAlias, Pod};
use std::path::{Path, PathBuf};

/// Where containers see the file.
pub const CONTAINER_PATH: &str = "/etc/hosts";
const MANAGED_HEADER: &str = "# Kubernetes-managed hosts file.\n";
const HOST_NETWORK_HEADER: &str = "# Kubernetes-managed hosts file (host network).\n";

/// `<pods_dir>/<uid>/etc-hosts`: under the pod's directory, so it goes with it.
pub fn path(pods_dir: &Path, uid: &str) -> PathBuf {
    pods_dir.join(uid).join("etc-hosts")
}

/// A pod-network pod's hosts file: localhost (IPv4 and IPv6), the IPv6 multicast names, each pod
/// IP with `<hostname>.<domain> <hostname>` (or just the hostname without a domain), then the
/// host aliases.
pub fn managed(pod_ips: &[String], hostname: &str, domain: &str, aliases: &[HostAlias]) -> String {
    let mut out = String::from(MANAGED_HEADER);
    out.push_str("127.0.0.1\tlocalhost\n");
    out.push_str("::1\tlocalhost ip6-localhost ip6-loopback\n");
    out.push_str("fe00::0\tip6-localnet\n");
    out.push_str("fe00::0\tip6-mcastprefix\n");
    out.push_str("fe00::1\tip6-allnodes\n");
    out.push_str("fe00::2\tip6-allrouters\n");
    for ip in pod_ips {
        if domain.is_empty() {
            out.push_str(&format!("{ip}\t{hostname}\n"));
        } else {
            out.push_str(&format!("{ip}\t{hostname}.{domain}\t{hostname}\n"));
        }
    }
    out.push_str(&alias_entries(aliases));
    out
}

/// A host-network pod's hosts file: the node's hosts file as it is, then the host aliases.
pub fn host_network(node_hosts: &str, aliases: &[HostAlias]) -> String {
    format!(
        "{HOST_NETWORK_HEADER}{node_hosts}{}",
        alias_entries(aliases)
    )
}

/// The host aliases under their own header, one line per entry: its IP and its hostnames.
fn alias_entries(aliases: &[HostAlias]) -> String {
    if aliases.is_empty() {
        return String::new();
    }
    let mut out = String::from("\n# Entries added by HostAliases.\n");
    for a in aliases {
        let names = a.hostnames.as_deref().unwrap_or_default().join("\t");
        out.push_str(&format!("{}\t{names}\n", a.ip));
    }
    out
}

/// Whether container `c` mounts something at `/etc/hosts` itself (then it keeps that).
pub fn mounted_by(c: &Container) -> bool {
    c.volume_mounts
        .iter()
        .flatten()
        .any(|m| m.mount_path == CONTAINER_PATH)
}

/// What pod `pod`'s hosts file holds: see [`managed`] and [`host_network`]; `None` for a
/// pod-network pod whose IP is not known (then no file is mounted, as with the kubelet).
pub fn content(
    settings: &super::Settings,
    pod: &Pod,
    pod_ips: &[String],
) -> Result<Option<String>, super::Error> {
    let spec = pod.spec.as_ref();
    let aliases = spec
        .and_then(|s| s.host_aliases.as_deref())
        .unwrap_or_default();
    if spec.and_then(|s| s.host_network).unwrap_or(false) {
        let node = std::fs::read_to_string(&settings.node_hosts).map_err(|source| {
            super::Error::NodeHosts {
                path: settings.node_hosts.clone(),
                source,
            }
        })?;
        return Ok(Some(host_network(&node, aliases)));
    }
    if pod_ips.is_empty() {
        return Ok(None);
    }
    let (hostname, domain) = super::hostname_and_domain(pod, &settings.cluster_domain)?;
    Ok(Some(managed(pod_ips, &hostname, &domain, aliases)))
}

/// Writes `content` to `path` (mode 0644), in place: containers that already bind-mount the file
/// see the new content.
pub fn write(path: &Path, content: &str) -> Result<(), super::Error> {
    use std::os::unix::fs::PermissionsExt;
    let err = |source| super::Error::WriteHosts {
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent() {
        crate::pod::pod_dirs(dir).map_err(err)?;
    }
    std::fs::write(path, content).map_err(err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).map_err(err)
}
