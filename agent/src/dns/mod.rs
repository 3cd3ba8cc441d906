//! A pod's name resolution, set up as the kubelet sets it up: its `resolv.conf` (the DNS
//! configurer: `dnsPolicy`, `dnsConfig`, `--cluster-dns`, `--cluster-domain`, `--resolv-conf`),
//! handed to the runtime as the sandbox's CRI `DNSConfig`, and its `/etc/hosts` ([`hosts`]: the
//! kubelet-managed file with the pod's IPs, hostname and `hostAliases`). The pod's hostname and
//! domain ([`hostname_and_domain`]) come from `hostname`, `subdomain` and the cluster domain.
//!
//! Pure functions of the pod and the node's files; uses no other swiftlet module.
pub mod hosts;

use k8s_cri::v1 as api;
use k8s_openapi::api::core::v1::{Pod, PodSpec};
use std::io::Read;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// At most this many nameservers reach the pod (the resolver reads no more).
pub const MAX_NAMESERVERS: usize = 3;
/// At most this many search domains reach the pod.
pub const MAX_SEARCHES: usize = 32;
/// The search line (domains joined by spaces) is cut to at most this many characters.
pub const MAX_SEARCH_CHARS: usize = 2048;
/// A search domain longer than this is dropped (some resolvers abort on it).
const MAX_DOMAIN_CHARS: usize = 253;
/// A `--resolv-conf` file larger than this is refused.
const MAX_RESOLV_CONF_BYTES: u64 = 10 << 20;
/// The options a ClusterFirst pod gets.
const CLUSTER_OPTIONS: &[&str] = &["ndots:5"];
pub const DEFAULT_RESOLV_CONF: &str = "/etc/resolv.conf";
/// The node's hosts file, the base of a host-network pod's `/etc/hosts`.
pub const NODE_HOSTS: &str = "/etc/hosts";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading the resolver configuration (--resolv-conf) {path}: {source}")]
    ResolvConf {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the resolver configuration (--resolv-conf) {path} is larger than 10 MiB")]
    ResolvConfTooLarge { path: PathBuf },
    #[error("reading the node's hosts file {path} for a host-network pod: {source}")]
    NodeHosts {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing the pod's hosts file {path}: {source}")]
    WriteHosts {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A spec field the API server would have rejected.
    #[error("{0}")]
    Invalid(String),
}

impl Error {
    /// The waiting reason the status shows: a node file that cannot be read keeps the sandbox
    /// from being created (the kubelet's `ContainerCreating`); the rest is the pod's config.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::ResolvConf { .. } | Error::ResolvConfTooLarge { .. } => "ContainerCreating",
            _ => "CreateContainerConfigError",
        }
    }
}

/// The node's DNS settings: the kubelet's `--cluster-dns`, `--cluster-domain` and `--resolv-conf`.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `--cluster-dns`: the nameservers of ClusterFirst pods; empty: ClusterFirst falls back to
    /// Default.
    pub cluster_dns: Vec<IpAddr>,
    /// `--cluster-domain` (e.g. `cluster.local`); empty: no cluster search domains.
    pub cluster_domain: String,
    /// `--resolv-conf`; `None` (the flag set to ""): no host resolver configuration, Default
    /// pods get `nameserver 127.0.0.1` and `search .`.
    pub resolv_conf: Option<PathBuf>,
    /// The node's hosts file ([`NODE_HOSTS`]; another file in tests).
    pub node_hosts: PathBuf,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            cluster_dns: Vec::new(),
            cluster_domain: String::new(),
            resolv_conf: Some(PathBuf::from(DEFAULT_RESOLV_CONF)),
            node_hosts: PathBuf::from(NODE_HOSTS),
        }
    }
}

/// A parsed `resolv.conf`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResolvConf {
    pub nameservers: Vec<String>,
    /// Without trailing dots (`example.com.` and `example.com` are one domain).
    pub searches: Vec<String>,
    /// `name` or `name:value`, in the order first seen.
    pub options: Vec<String>,
    /// Lines that could not be used (a `nameserver` without an address).
    pub warnings: Vec<String>,
}

/// Parses a `resolv.conf` as the resolver reads it: `#` and `;` start comment lines, `nameserver`
/// lines accumulate, the last `search` or `domain` line wins (`domain x` is a search list of one),
/// `options` accumulate with a later option of the same name replacing an earlier one; other
/// keywords (`sortlist`, unknown ones) are ignored.
pub fn parse_resolv_conf(text: &str) -> ResolvConf {
    let mut rc = ResolvConf::default();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let mut fields = line.split_whitespace();
        let Some(keyword) = fields.next() else {
            continue;
        };
        let domain = |s: &str| s.trim_end_matches('.').to_owned();
        match keyword {
            "nameserver" => match fields.next() {
                Some(ns) => rc.nameservers.push(ns.to_owned()),
                None => rc
                    .warnings
                    .push(format!("line {}: nameserver without an address", i + 1)),
            },
            "search" => rc.searches = fields.map(domain).filter(|d| !d.is_empty()).collect(),
            "domain" => rc.searches = fields.next().map(domain).into_iter().collect(),
            "options" => {
                let opts = fields.map(str::to_owned).collect::<Vec<_>>();
                rc.options = merge_options(std::mem::take(&mut rc.options), opts);
            }
            _ => {}
        }
    }
    rc
}

/// Reads and parses resolver configuration file `path`.
pub fn read_resolv_conf(path: &Path) -> Result<ResolvConf, Error> {
    let err = |source| Error::ResolvConf {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(err)?;
    let mut text = String::new();
    file.take(MAX_RESOLV_CONF_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(err)?;
    if text.len() as u64 > MAX_RESOLV_CONF_BYTES {
        return Err(Error::ResolvConfTooLarge {
            path: path.to_owned(),
        });
    }
    Ok(parse_resolv_conf(&text))
}

/// Options by name: each of `more` replaces the option of its name in `base` (in place) or is
/// appended.
fn merge_options(mut base: Vec<String>, more: impl IntoIterator<Item = String>) -> Vec<String> {
    let name = |o: &str| o.split_once(':').map_or(o, |(n, _)| n).to_owned();
    for o in more {
        let n = name(&o);
        match base.iter_mut().find(|b| name(b) == n) {
            Some(b) => *b = o,
            None => base.push(o),
        }
    }
    base
}

/// `v` without repeats, first occurrence kept.
fn dedup(v: Vec<String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(v.len());
    for s in v {
        if !out.contains(&s) {
            out.push(s);
        }
    }
    out
}

/// Which base a pod's DNS configuration starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// The cluster's DNS servers and search domains (ClusterFirst, ClusterFirstWithHostNet).
    Cluster,
    /// The node's resolver configuration (Default; ClusterFirst on the host network).
    Host,
    /// Only the pod's `dnsConfig` (None).
    None,
}

/// The pod's policy as the kubelet maps `dnsPolicy` (default ClusterFirst): a host-network pod
/// with ClusterFirst gets Default; ClusterFirstWithHostNet gets the cluster's DNS anyway.
pub fn policy(spec: &PodSpec) -> Result<Policy, Error> {
    let host_network = spec.host_network.unwrap_or(false);
    match spec.dns_policy.as_deref().unwrap_or("ClusterFirst") {
        "None" => Ok(Policy::None),
        "ClusterFirstWithHostNet" => Ok(Policy::Cluster),
        "ClusterFirst" | "" if !host_network => Ok(Policy::Cluster),
        "ClusterFirst" | "" | "Default" => Ok(Policy::Host),
        other => Err(Error::Invalid(format!(
            "spec.dnsPolicy {other:?}: expected ClusterFirst, ClusterFirstWithHostNet, Default or None"
        ))),
    }
}

/// Whether `s` is a DNS-1123 label: 1 to 63 lowercase letters, digits and `-`, starting and ending
/// with a letter or digit.
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Whether `s` is a DNS-1123 subdomain: dot-separated labels, at most 253 characters.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= MAX_DOMAIN_CHARS && s.split('.').all(is_dns_label)
}

/// Checks what the API server would have checked of the pod's DNS and hosts fields (static and
/// URL pods reach the node unchecked): the policy, `dnsConfig` (required with None; nameservers
/// are IP addresses, search domains one word each, options named), `hostname` and `subdomain`
/// (DNS labels), and `hostAliases` (an IP address and DNS names each).
pub fn check(spec: &PodSpec) -> Result<(), Error> {
    let invalid = |m: String| Err(Error::Invalid(m));
    let policy = policy(spec)?;
    if policy == Policy::None && spec.dns_config.is_none() {
        return invalid("spec.dnsConfig: required when spec.dnsPolicy is None".into());
    }
    if let Some(dc) = &spec.dns_config {
        for (i, ns) in dc.nameservers.iter().flatten().enumerate() {
            if ns.parse::<IpAddr>().is_err() {
                return invalid(format!(
                    "spec.dnsConfig.nameservers[{i}] {ns:?}: not an IP address"
                ));
            }
        }
        for (i, s) in dc.searches.iter().flatten().enumerate() {
            if s.is_empty() || s.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return invalid(format!(
                    "spec.dnsConfig.searches[{i}] {s:?}: not a domain name"
                ));
            }
        }
        for (i, o) in dc.options.iter().flatten().enumerate() {
            let name = o.name.as_deref().unwrap_or_default();
            let value = o.value.as_deref().unwrap_or_default();
            if name.is_empty() || format!("{name}{value}").chars().any(char::is_whitespace) {
                return invalid(format!(
                    "spec.dnsConfig.options[{i}] {name:?}: an option needs a name, and neither name nor value may hold spaces"
                ));
            }
        }
    }
    for (field, v) in [("hostname", &spec.hostname), ("subdomain", &spec.subdomain)] {
        if let Some(v) = v.as_deref().filter(|v| !v.is_empty())
            && !is_dns_label(v)
        {
            return invalid(format!("spec.{field} {v:?}: not a valid DNS label"));
        }
    }
    for (i, a) in spec.host_aliases.iter().flatten().enumerate() {
        let ip = a.ip.as_str();
        if ip.parse::<IpAddr>().is_err() {
            return invalid(format!(
                "spec.hostAliases[{i}].ip {ip:?}: not an IP address"
            ));
        }
        if let Some(h) = a.hostnames.iter().flatten().find(|h| !is_dns_subdomain(h)) {
            return invalid(format!(
                "spec.hostAliases[{i}].hostnames {h:?}: not a valid DNS name"
            ));
        }
    }
    Ok(())
}

/// A pod's hostname and domain as the kubelet makes them: `spec.hostname`, else the pod's name
/// cut to 63 characters (without trailing `-` or `.`); the domain
/// `<subdomain>.<namespace>.svc.<cluster-domain>` when `spec.subdomain` is set, else empty.
pub fn hostname_and_domain(pod: &Pod, cluster_domain: &str) -> Result<(String, String), Error> {
    let spec = pod.spec.as_ref();
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let hostname = match spec.and_then(|s| s.hostname.as_deref()) {
        Some(h) if !h.is_empty() => h,
        _ => name,
    };
    let hostname = if hostname.len() > 63 {
        let cut: String = hostname.chars().take(63).collect();
        cut.trim_end_matches(['-', '.']).to_owned()
    } else {
        hostname.to_owned()
    };
    if hostname.is_empty() {
        return Err(Error::Invalid(format!(
            "pod {name:?}: no valid hostname can be made of it"
        )));
    }
    let domain = match spec.and_then(|s| s.subdomain.as_deref()) {
        Some(sub) if !sub.is_empty() => {
            let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
            format!("{sub}.{ns}.svc.{cluster_domain}")
        }
        _ => String::new(),
    };
    Ok((hostname, domain))
}

/// A pod's DNS configuration for the runtime, and what the kubelet would have warned about
/// (records as events) while forming it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodDns {
    pub config: api::DnsConfig,
    pub warnings: Vec<String>,
}

impl Settings {
    /// The node's resolver configuration: `--resolv-conf` read, or without one (the flag set to
    /// "") `nameserver 127.0.0.1` and `search .` (no lookups beyond the node itself).
    fn host_config(&self, warnings: &mut Vec<String>) -> Result<api::DnsConfig, Error> {
        let Some(path) = &self.resolv_conf else {
            return Ok(api::DnsConfig {
                servers: vec!["127.0.0.1".into()],
                searches: vec![".".into()],
                options: Vec::new(),
            });
        };
        let rc = read_resolv_conf(path)?;
        warnings.extend(
            rc.warnings
                .into_iter()
                .map(|w| format!("{}: {w}", path.display())),
        );
        Ok(api::DnsConfig {
            servers: rc.nameservers,
            searches: rc.searches,
            options: rc.options,
        })
    }

    /// The node's search domains (none without `--resolv-conf`).
    fn host_searches(&self, warnings: &mut Vec<String>) -> Result<Vec<String>, Error> {
        match &self.resolv_conf {
            Some(_) => Ok(self.host_config(warnings)?.searches),
            None => Ok(Vec::new()),
        }
    }

    /// The pod's DNS configuration, as the kubelet's DNS configurer forms it: the policy's base
    /// (cluster: `--cluster-dns`, the cluster search domains before the node's, `ndots:5`;
    /// host: the node's resolver configuration; None: nothing), then `dnsConfig` appended
    /// (nameservers and searches without repeats, options replacing those of the same name),
    /// then the resolver's limits (3 nameservers, 32 search domains of at most 253 characters,
    /// 2048 characters of search line), trimmed with a warning.
    pub fn pod_dns(&self, pod: &Pod) -> Result<PodDns, Error> {
        let Some(spec) = pod.spec.as_ref() else {
            return Ok(PodDns::default());
        };
        let mut warnings = Vec::new();
        let mut config = match policy(spec)? {
            Policy::None => api::DnsConfig::default(),
            Policy::Cluster if !self.cluster_dns.is_empty() => api::DnsConfig {
                servers: self.cluster_dns.iter().map(IpAddr::to_string).collect(),
                searches: self.cluster_searches(pod, self.host_searches(&mut warnings)?),
                options: CLUSTER_OPTIONS.iter().map(|&o| o.to_owned()).collect(),
            },
            Policy::Cluster => {
                warnings.push(
                    "MissingClusterDNS: the node has no cluster DNS configured (--cluster-dns) \
                     and cannot run a pod with the \"ClusterFirst\" DNS policy: falling back to \
                     the \"Default\" policy"
                        .to_owned(),
                );
                self.host_config(&mut warnings)?
            }
            Policy::Host => self.host_config(&mut warnings)?,
        };
        if let Some(dc) = &spec.dns_config {
            config
                .servers
                .extend(dc.nameservers.iter().flatten().cloned());
            config.servers = dedup(std::mem::take(&mut config.servers));
            config
                .searches
                .extend(dc.searches.iter().flatten().cloned());
            config.searches = dedup(std::mem::take(&mut config.searches));
            let opts = dc.options.iter().flatten().map(|o| {
                let name = o.name.clone().unwrap_or_default();
                match o.value.as_deref() {
                    Some(v) if !v.is_empty() => format!("{name}:{v}"),
                    _ => name,
                }
            });
            config.options = merge_options(std::mem::take(&mut config.options), opts);
        }
        fit_limits(&mut config, &mut warnings);
        Ok(PodDns { config, warnings })
    }

    /// `<ns>.svc.<domain> svc.<domain> <domain>` before the node's search domains, without
    /// repeats; only the node's without a cluster domain.
    fn cluster_searches(&self, pod: &Pod, host: Vec<String>) -> Vec<String> {
        let d = &self.cluster_domain;
        if d.is_empty() {
            return host;
        }
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let mut s = vec![format!("{ns}.svc.{d}"), format!("svc.{d}"), d.clone()];
        s.extend(host);
        dedup(s)
    }

    /// What is wrong with `--resolv-conf` for the pods of this node, checked at the agent's start
    /// (the kubelet's `CheckLimitsForResolvConf`): unreadable, or more search domains (or longer
    /// ones) than a pod can be given beside the cluster's.
    pub fn check_resolv_conf(&self) -> Vec<String> {
        let Some(path) = &self.resolv_conf else {
            return Vec::new();
        };
        let rc = match read_resolv_conf(path) {
            Ok(rc) => rc,
            Err(e) => return vec![e.to_string()],
        };
        let p = path.display();
        let mut out: Vec<String> = rc.warnings.iter().map(|w| format!("{p}: {w}")).collect();
        let limit = MAX_SEARCHES - if self.cluster_domain.is_empty() { 0 } else { 3 };
        if rc.searches.len() > limit {
            out.push(format!(
                "{p}: its search line has more than {limit} domains: pods get the first ones"
            ));
        }
        if rc.searches.iter().any(|s| s.len() > MAX_DOMAIN_CHARS) {
            out.push(format!(
                "{p}: a search domain is longer than {MAX_DOMAIN_CHARS} characters: pods do not get it"
            ));
        }
        if rc.searches.join(" ").len() > MAX_SEARCH_CHARS {
            out.push(format!(
                "{p}: its search line is longer than {MAX_SEARCH_CHARS} characters: pods get it cut"
            ));
        }
        out
    }
}

/// Trims `config` to the resolver's limits, as the kubelet does, warning when it did.
fn fit_limits(config: &mut api::DnsConfig, warnings: &mut Vec<String>) {
    if config.servers.len() > MAX_NAMESERVERS {
        config.servers.truncate(MAX_NAMESERVERS);
        warnings.push(format!(
            "DNSConfigForming: nameserver limits were exceeded, some nameservers have been \
             omitted, the applied nameserver line is: {}",
            config.servers.join(" ")
        ));
    }
    let s = &mut config.searches;
    let mut exceeded = s.len() > MAX_SEARCHES;
    s.truncate(MAX_SEARCHES);
    let before = s.len();
    s.retain(|d| d.len() <= MAX_DOMAIN_CHARS);
    exceeded |= s.len() != before;
    while s.join(" ").len() > MAX_SEARCH_CHARS {
        s.pop();
        exceeded = true;
    }
    if exceeded {
        warnings.push(format!(
            "DNSConfigForming: search line limits were exceeded, some search paths have been \
             omitted, the applied search line is: {}",
            s.join(" ")
        ));
    }
}

#[cfg(test)]
mod tests;
