//! DNS on a real containerd, seen from inside the containers (CRI ExecSync `cat`): each
//! `dnsPolicy`'s `/etc/resolv.conf` (ClusterFirst, ClusterFirstWithHostNet, Default, None with
//! `dnsConfig`, ClusterFirst on the host network), the managed `/etc/hosts` with the pod's IP, its
//! FQDN and `hostAliases`, a host-network pod's `/etc/hosts` (the node's plus its aliases), a
//! container's own `/etc/hosts` mount kept, the file going with the pod; ClusterFirst without
//! `--cluster-dns` falling back to the node's configuration with a warning; and an unreadable
//! `--resolv-conf` keeping the pods that need it waiting, naming the file. The node's resolver
//! configuration is a temporary file, so nothing depends on the machine's.

use std::collections::BTreeSet;
use std::time::Duration;

use swiftlet_tests::{Agent, AgentOptions, Runtime, exec};

const TIMEOUT: Duration = Duration::from_secs(60);

/// The node's resolver configuration the agents are given.
const NODE_RESOLV_CONF: &str = "# the test node's\n; another comment\nnameserver 192.0.2.53\n\
                                nameserver 192.0.2.54\ndomain old.example\n\
                                search corp.example lab.example.\noptions timeout:2 rotate\n";

/// An agent with `--resolv-conf` a temporary file holding `resolv` (or `missing`, a path that
/// does not exist) and `flags`.
fn agent(name: &str, resolv: Option<&str>, flags: &[&str]) -> Option<(Agent, tempfile::TempDir)> {
    let runtime = Runtime::shared()?;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("resolv.conf");
    if let Some(text) = resolv {
        std::fs::write(&path, text).expect("write resolv.conf");
    }
    let mut opts = AgentOptions::new(name);
    opts.extra_args = vec!["--resolv-conf".into(), path.display().to_string()];
    opts.extra_args
        .extend(flags.iter().map(|s| (*s).to_owned()));
    Some((Agent::start(runtime, opts), dir))
}

/// Waits for container `main` of static pod `name` to run; returns the pod's full name.
fn running(agent: &Agent, name: &str) -> String {
    let pod = agent.static_pod_name(name);
    agent.wait_for(
        |l| {
            l.container(&pod, "main")
                .is_some_and(swiftlet_tests::is_running)
        },
        TIMEOUT,
    );
    pod
}

/// `file` as container `main` of pod `pod` sees it.
fn read_inside(agent: &Agent, pod: &str, file: &str) -> String {
    let list = agent.pods();
    let id = list
        .container(pod, "main")
        .and_then(|c| c.container_id.clone())
        .unwrap_or_else(|| panic!("no container main in {pod}: {}", list.summary()));
    let (code, out) = exec(agent.endpoint(), &id, &["cat", file]).expect("ExecSync");
    assert_eq!(code, 0, "{pod}: cat {file}: {out}");
    out
}

/// The non-empty lines of a resolv.conf, in any order (the runtime decides the order).
fn lines(text: &str) -> BTreeSet<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

fn set(v: &[&str]) -> BTreeSet<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

/// The pod's IP in its status.
fn pod_ip(agent: &Agent, pod: &str) -> String {
    let list = agent.pods();
    list.get(pod)
        .and_then(|p| p.status.as_ref()?.pod_ip.clone())
        .unwrap_or_else(|| panic!("no pod IP for {pod}: {}", list.summary()))
}

/// The node's resolver configuration as a Default pod gets it.
const DEFAULT_LINES: &[&str] = &[
    "nameserver 192.0.2.53",
    "nameserver 192.0.2.54",
    "search corp.example lab.example",
    "options timeout:2 rotate",
];

#[test]
fn every_dns_policy_gives_its_resolv_conf_and_the_pod_its_hosts_file() {
    let Some((agent, _dir)) = agent(
        "dns-policies",
        Some(NODE_RESOLV_CONF),
        &[
            "--cluster-dns",
            "10.96.0.10",
            "--cluster-domain",
            "cluster.local",
        ],
    ) else {
        return;
    };
    let sleep = "while true; do sleep 1; done";
    let aliases = "  hostAliases:\n  - ip: 10.1.2.3\n    hostnames: [foo.local, bar.local]\n  \
                   - ip: fd00::9\n    hostnames: [v6.local]\n";
    // A file the `own` pod mounts at /etc/hosts itself.
    let own_hosts = _dir.path().join("own-hosts");
    std::fs::write(&own_hosts, "10.9.9.9 mine\n").expect("write");
    let pods = [
        (
            "dns-cluster",
            format!("  hostname: db-0\n  subdomain: db\n{aliases}"),
            String::new(),
        ),
        (
            "dns-default",
            "  dnsPolicy: Default\n".to_owned(),
            String::new(),
        ),
        (
            "dns-none",
            "  dnsPolicy: None\n  dnsConfig:\n    nameservers: [1.1.1.1, 8.8.8.8]\n    \
             searches: [my.example]\n    options:\n    - {name: ndots, value: \"2\"}\n    \
             - {name: edns0}\n"
                .to_owned(),
            String::new(),
        ),
        (
            "dns-hostnet",
            format!("  hostNetwork: true\n{aliases}"),
            String::new(),
        ),
        (
            "dns-hostnet-cluster",
            "  hostNetwork: true\n  dnsPolicy: ClusterFirstWithHostNet\n  dnsConfig:\n    \
             searches: [extra.example]\n"
                .to_owned(),
            String::new(),
        ),
        (
            "dns-own-hosts",
            format!(
                "  volumes:\n  - name: hosts\n    hostPath: {{path: {}, type: File}}\n",
                own_hosts.display()
            ),
            "    volumeMounts:\n    - {name: hosts, mountPath: /etc/hosts}\n".to_owned(),
        ),
    ];
    for (name, spec, container) in &pods {
        agent.write_manifest(
            &format!("{name}.yaml"),
            &agent.busybox_pod(name, spec, sleep, container),
        );
    }
    let cluster = running(&agent, "dns-cluster");
    let default = running(&agent, "dns-default");
    let none = running(&agent, "dns-none");
    let hostnet = running(&agent, "dns-hostnet");
    let hostnet_cluster = running(&agent, "dns-hostnet-cluster");
    let own = running(&agent, "dns-own-hosts");

    // ClusterFirst: the cluster's nameserver, the cluster's search domains then the node's.
    assert_eq!(
        lines(&read_inside(&agent, &cluster, "/etc/resolv.conf")),
        set(&[
            "nameserver 10.96.0.10",
            "search default.svc.cluster.local svc.cluster.local cluster.local corp.example lab.example",
            "options ndots:5",
        ])
    );
    // Its hosts file: the kubelet's, with the pod's IP, FQDN and aliases; its hostname set.
    let ip = pod_ip(&agent, &cluster);
    assert_eq!(
        read_inside(&agent, &cluster, "/etc/hosts"),
        format!(
            "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n\
             ::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\n\
             fe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n\
             {ip}\tdb-0.db.default.svc.cluster.local\tdb-0\n\n\
             # Entries added by HostAliases.\n10.1.2.3\tfoo.local\tbar.local\nfd00::9\tv6.local\n"
        )
    );
    assert_eq!(
        read_inside(&agent, &cluster, "/etc/hostname").trim(),
        "db-0"
    );
    let uid = agent.pods().uid(&cluster).expect("uid").to_owned();
    let hosts_file = agent.root_dir().join("pods").join(&uid).join("etc-hosts");
    assert!(hosts_file.is_file(), "{}", hosts_file.display());

    // Default: the node's configuration (the last of domain and search wins).
    assert_eq!(
        lines(&read_inside(&agent, &default, "/etc/resolv.conf")),
        set(DEFAULT_LINES)
    );
    let default_hosts = read_inside(&agent, &default, "/etc/hosts");
    // Without spec.hostname the pod's name is its hostname (cut to 63 characters, without a
    // trailing '-' or '.'); no subdomain, no aliases.
    let default_ip = pod_ip(&agent, &default);
    let cut: String = default.chars().take(63).collect();
    let hostname = cut.trim_end_matches(['-', '.']);
    assert!(
        default_hosts.ends_with(&format!(
            "fe00::2\tip6-allrouters\n{default_ip}\t{hostname}\n"
        )),
        "{default_hosts}"
    );

    // None: only dnsConfig.
    assert_eq!(
        lines(&read_inside(&agent, &none, "/etc/resolv.conf")),
        set(&[
            "nameserver 1.1.1.1",
            "nameserver 8.8.8.8",
            "search my.example",
            "options ndots:2 edns0",
        ])
    );

    // Host network with ClusterFirst: Default. Its hosts file is the node's plus the aliases.
    assert_eq!(
        lines(&read_inside(&agent, &hostnet, "/etc/resolv.conf")),
        set(DEFAULT_LINES)
    );
    let node_hosts = std::fs::read_to_string("/etc/hosts").expect("the node's /etc/hosts");
    assert_eq!(
        read_inside(&agent, &hostnet, "/etc/hosts"),
        format!(
            "# Kubernetes-managed hosts file (host network).\n{node_hosts}\n\
             # Entries added by HostAliases.\n10.1.2.3\tfoo.local\tbar.local\nfd00::9\tv6.local\n"
        )
    );
    // ClusterFirstWithHostNet: the cluster's DNS, dnsConfig appended.
    assert_eq!(
        lines(&read_inside(&agent, &hostnet_cluster, "/etc/resolv.conf")),
        set(&[
            "nameserver 10.96.0.10",
            "search default.svc.cluster.local svc.cluster.local cluster.local corp.example \
             lab.example extra.example",
            "options ndots:5",
        ])
    );

    // A container mounting /etc/hosts itself keeps its own.
    assert_eq!(read_inside(&agent, &own, "/etc/hosts"), "10.9.9.9 mine\n");

    // The hosts file goes with the pod's directory.
    agent.remove_manifest("dns-cluster.yaml");
    agent.wait_until_gone("the pod's hosts file", &hosts_file, TIMEOUT);
}

#[test]
fn cluster_first_without_cluster_dns_falls_back_to_the_nodes_configuration_with_a_warning() {
    let Some((agent, _dir)) = agent("dns-fallback", Some(NODE_RESOLV_CONF), &[]) else {
        return;
    };
    agent.write_manifest(
        "fallback.yaml",
        &agent.busybox_pod("fallback", "", "while true; do sleep 1; done", ""),
    );
    let pod = running(&agent, "fallback");
    assert_eq!(
        lines(&read_inside(&agent, &pod, "/etc/resolv.conf")),
        set(DEFAULT_LINES)
    );
    let log = agent.log();
    assert!(
        log.contains("MissingClusterDNS") && log.contains("forming the pod's DNS configuration"),
        "no fallback warning in the agent's log"
    );
}

#[test]
fn an_unreadable_resolv_conf_keeps_the_pods_needing_it_waiting_naming_it() {
    let Some((agent, dir)) = agent("dns-no-resolv", None, &[]) else {
        return;
    };
    let missing = dir.path().join("resolv.conf");
    agent.write_manifest(
        "needs.yaml",
        &agent.busybox_pod(
            "needs",
            "  dnsPolicy: Default\n",
            "while true; do sleep 1; done",
            "",
        ),
    );
    agent.write_manifest(
        "own.yaml",
        &agent.busybox_pod(
            "own",
            "  dnsPolicy: None\n  dnsConfig: {nameservers: [192.0.2.1]}\n",
            "while true; do sleep 1; done",
            "",
        ),
    );
    let (reason, message) = agent.waiting("needs");
    assert_eq!(reason, "ContainerCreating", "{message}");
    assert!(
        message.contains("--resolv-conf") && message.contains(&missing.display().to_string()),
        "{message}"
    );
    // A None pod needs no node configuration.
    let own = running(&agent, "own");
    assert_eq!(
        lines(&read_inside(&agent, &own, "/etc/resolv.conf")),
        set(&["nameserver 192.0.2.1"])
    );
    // The file appearing lets the waiting pod start.
    std::fs::write(&missing, NODE_RESOLV_CONF).expect("write");
    let needs = running(&agent, "needs");
    assert_eq!(
        lines(&read_inside(&agent, &needs, "/etc/resolv.conf")),
        set(DEFAULT_LINES)
    );
}
