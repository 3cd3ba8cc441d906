use super::*;
use serde_json::json;

fn pod(spec: serde_json::Value) -> Pod {
    let mut spec = spec;
    spec.as_object_mut()
        .expect("an object")
        .entry("containers")
        .or_insert_with(|| json!([{"name": "c", "image": "x"}]));
    serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": spec,
    }))
    .expect("a pod")
}

/// Settings with `resolv` as the node's resolv.conf (in `dir`).
fn settings(dir: &tempfile::TempDir, resolv: &str, cluster_dns: &[&str]) -> Settings {
    let path = dir.path().join("resolv.conf");
    std::fs::write(&path, resolv).expect("write");
    Settings {
        cluster_dns: cluster_dns.iter().map(|s| s.parse().expect("ip")).collect(),
        cluster_domain: "cluster.local".into(),
        resolv_conf: Some(path),
        node_hosts: dir.path().join("hosts"),
    }
}

const HOST: &str = "# the node's\nnameserver 192.0.2.53\nnameserver 192.0.2.54\n\
                    search corp.example lab.example.\noptions rotate timeout:2\n";

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

/// The cluster search domains of namespace `shop` in `cluster.local`, then `then`.
fn cluster_then(then: &[&str]) -> Vec<String> {
    let mut s = strs(&[
        "shop.svc.cluster.local",
        "svc.cluster.local",
        "cluster.local",
    ]);
    s.extend(strs(then));
    s
}

#[test]
fn resolv_conf_parsing_follows_the_resolver() {
    let rc = parse_resolv_conf(
        "; a comment\n# another\n\n  nameserver 10.0.0.1  \nnameserver\nsearch a.example b.example.\n\
         sortlist 130.155.160.0/255.255.240.0\nnameserver 10.0.0.2 # trailing\n\
         options ndots:2 rotate\ndomain only.example\noptions ndots:3 edns0\nbogus line\n",
    );
    assert_eq!(rc.nameservers, strs(&["10.0.0.1", "10.0.0.2"]));
    // The last of search and domain wins.
    assert_eq!(rc.searches, strs(&["only.example"]));
    // Options accumulate; a later one replaces the earlier of its name, in place.
    assert_eq!(rc.options, strs(&["ndots:3", "rotate", "edns0"]));
    assert_eq!(rc.warnings.len(), 1, "{:?}", rc.warnings);
    assert!(rc.warnings[0].contains("line 5"), "{:?}", rc.warnings);
    let rc = parse_resolv_conf("domain x.example\nsearch y.example. z.example\n");
    assert_eq!(rc.searches, strs(&["y.example", "z.example"]));
    assert_eq!(parse_resolv_conf(""), ResolvConf::default());
}

#[test]
fn a_missing_or_huge_resolv_conf_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("nope");
    let e = read_resolv_conf(&missing).unwrap_err();
    assert!(e.to_string().contains("--resolv-conf") && e.to_string().contains("nope"));
    assert_eq!(e.reason(), "ContainerCreating");
    let big = dir.path().join("big");
    std::fs::write(&big, "#".repeat((MAX_RESOLV_CONF_BYTES + 1) as usize)).expect("write");
    assert!(matches!(
        read_resolv_conf(&big),
        Err(Error::ResolvConfTooLarge { .. })
    ));
    let s = Settings {
        resolv_conf: Some(missing),
        ..Settings::default()
    };
    let e = s
        .pod_dns(&pod(json!({"dnsPolicy": "Default"})))
        .unwrap_err();
    assert!(matches!(e, Error::ResolvConf { .. }), "{e}");
    assert_eq!(s.check_resolv_conf().len(), 1);
}

#[test]
fn cluster_first_uses_the_cluster_dns_and_search_domains_then_the_nodes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = settings(&dir, HOST, &["10.96.0.10"]);
    for spec in [json!({}), json!({"dnsPolicy": "ClusterFirst"})] {
        let dns = s.pod_dns(&pod(spec)).expect("dns");
        assert_eq!(dns.config.servers, strs(&["10.96.0.10"]));
        assert_eq!(
            dns.config.searches,
            cluster_then(&["corp.example", "lab.example"])
        );
        assert_eq!(dns.config.options, strs(&["ndots:5"]));
        assert!(dns.warnings.is_empty(), "{:?}", dns.warnings);
    }
    // Without a cluster domain only the node's search domains.
    let s2 = Settings {
        cluster_domain: String::new(),
        ..s.clone()
    };
    let dns = s2.pod_dns(&pod(json!({}))).expect("dns");
    assert_eq!(dns.config.searches, strs(&["corp.example", "lab.example"]));
    // A cluster domain the node also searches is not repeated.
    let s3 = settings(&dir, "search cluster.local other\n", &["10.96.0.10"]);
    let dns = s3.pod_dns(&pod(json!({}))).expect("dns");
    assert_eq!(dns.config.searches, cluster_then(&["other"]));
}

#[test]
fn host_network_pods_get_default_unless_cluster_first_with_host_net() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = settings(&dir, HOST, &["10.96.0.10"]);
    let default = s
        .pod_dns(&pod(
            json!({"hostNetwork": true, "dnsPolicy": "ClusterFirst"}),
        ))
        .expect("dns");
    assert_eq!(default.config.servers, strs(&["192.0.2.53", "192.0.2.54"]));
    assert_eq!(
        default.config.searches,
        strs(&["corp.example", "lab.example"])
    );
    assert_eq!(default.config.options, strs(&["rotate", "timeout:2"]));
    let with = s
        .pod_dns(&pod(
            json!({"hostNetwork": true, "dnsPolicy": "ClusterFirstWithHostNet"}),
        ))
        .expect("dns");
    assert_eq!(with.config.servers, strs(&["10.96.0.10"]));
    assert_eq!(with.config.options, strs(&["ndots:5"]));
    // Default is the node's for a pod-network pod too.
    let d = s
        .pod_dns(&pod(json!({"dnsPolicy": "Default"})))
        .expect("dns");
    assert_eq!(d.config, default.config);
}

#[test]
fn cluster_first_without_cluster_dns_falls_back_to_default_with_a_warning() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = settings(&dir, HOST, &[]);
    let dns = s.pod_dns(&pod(json!({}))).expect("dns");
    assert_eq!(dns.config.servers, strs(&["192.0.2.53", "192.0.2.54"]));
    assert_eq!(dns.config.searches, strs(&["corp.example", "lab.example"]));
    assert_eq!(dns.warnings.len(), 1);
    assert!(
        dns.warnings[0].starts_with("MissingClusterDNS") && dns.warnings[0].contains("Default"),
        "{:?}",
        dns.warnings
    );
}

#[test]
fn no_resolv_conf_means_the_node_itself() {
    let s = Settings {
        resolv_conf: None,
        cluster_dns: vec!["10.96.0.10".parse().expect("ip")],
        cluster_domain: "cluster.local".into(),
        ..Settings::default()
    };
    let d = s
        .pod_dns(&pod(json!({"dnsPolicy": "Default"})))
        .expect("dns");
    assert_eq!(d.config.servers, strs(&["127.0.0.1"]));
    assert_eq!(d.config.searches, strs(&["."]));
    let c = s.pod_dns(&pod(json!({}))).expect("dns");
    assert_eq!(c.config.searches.len(), 3, "{:?}", c.config.searches);
    assert!(s.check_resolv_conf().is_empty());
}

#[test]
fn none_takes_only_dns_config_and_dns_config_merges_into_every_policy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = settings(&dir, HOST, &["10.96.0.10"]);
    let dns_config = json!({
        "nameservers": ["1.1.1.1", "10.96.0.10"],
        "searches": ["my.example", "svc.cluster.local"],
        "options": [{"name": "ndots", "value": "2"}, {"name": "edns0"}, {"name": "attempts", "value": ""}],
    });
    let none = s
        .pod_dns(&pod(json!({"dnsPolicy": "None", "dnsConfig": dns_config})))
        .expect("dns");
    assert_eq!(none.config.servers, strs(&["1.1.1.1", "10.96.0.10"]));
    assert_eq!(
        none.config.searches,
        strs(&["my.example", "svc.cluster.local"])
    );
    assert_eq!(none.config.options, strs(&["ndots:2", "edns0", "attempts"]));
    // Appended to ClusterFirst without repeats; ndots replaced by name.
    let cluster = s
        .pod_dns(&pod(json!({"dnsConfig": dns_config})))
        .expect("dns");
    assert_eq!(cluster.config.servers, strs(&["10.96.0.10", "1.1.1.1"]));
    assert_eq!(
        cluster.config.searches,
        cluster_then(&["corp.example", "lab.example", "my.example"])
    );
    assert_eq!(
        cluster.config.options,
        strs(&["ndots:2", "edns0", "attempts"])
    );
    // Appended to Default: the node's options stay unless replaced.
    let default = s
        .pod_dns(&pod(json!({"dnsPolicy": "Default", "dnsConfig": {
            "options": [{"name": "timeout", "value": "5"}]
        }})))
        .expect("dns");
    assert_eq!(default.config.options, strs(&["rotate", "timeout:5"]));
    // None with an empty dnsConfig is valid, and empty.
    let empty = pod(json!({"dnsPolicy": "None", "dnsConfig": {}}));
    assert_eq!(check(empty.spec.as_ref().expect("spec")).ok(), Some(()));
    assert_eq!(s.pod_dns(&empty).expect("dns"), PodDns::default());
}

#[test]
fn limits_trim_with_a_warning() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = settings(&dir, HOST, &["10.96.0.10", "10.96.0.11"]);
    let dns = s
        .pod_dns(&pod(
            json!({"dnsConfig": {"nameservers": ["1.1.1.1", "8.8.8.8"]}}),
        ))
        .expect("dns");
    assert_eq!(
        dns.config.servers,
        strs(&["10.96.0.10", "10.96.0.11", "1.1.1.1"])
    );
    assert!(
        dns.warnings.iter().any(|w| w.contains("nameserver limits")),
        "{:?}",
        dns.warnings
    );
    // 40 searches: 32 kept.
    let many: Vec<String> = (0..40).map(|i| format!("d{i}.example")).collect();
    let dns = s
        .pod_dns(&pod(
            json!({"dnsPolicy": "None", "dnsConfig": {"searches": many}}),
        ))
        .expect("dns");
    assert_eq!(dns.config.searches.len(), MAX_SEARCHES);
    assert_eq!(dns.config.searches[31], "d31.example");
    assert!(
        dns.warnings
            .iter()
            .any(|w| w.contains("search line limits"))
    );
    // A 254-character domain is dropped; the line is cut to 2048 characters from the end.
    let long = format!("{}.example", "a".repeat(246));
    assert_eq!(long.len(), 254);
    let label = |i: usize| format!("{}{i:02}.example", "b".repeat(90));
    let mut searches = vec![long.clone()];
    searches.extend((0..25).map(label));
    let dns = s
        .pod_dns(&pod(
            json!({"dnsPolicy": "None", "dnsConfig": {"searches": searches}}),
        ))
        .expect("dns");
    assert!(!dns.config.searches.contains(&long));
    let line = dns.config.searches.join(" ");
    assert!(line.len() <= MAX_SEARCH_CHARS, "{}", line.len());
    // 101 characters each with its space: 20 fit (2039), 21 do not (2140).
    assert_eq!(dns.config.searches.len(), 20);
    assert_eq!(dns.config.searches[19], label(19));
    // Within the limits: no warning.
    let ok = s.pod_dns(&pod(json!({}))).expect("dns");
    assert!(ok.warnings.is_empty(), "{:?}", ok.warnings);
}

#[test]
fn what_the_api_server_would_reject_is_a_clear_error() {
    let cases = [
        (
            json!({"dnsPolicy": "Sometimes"}),
            "spec.dnsPolicy \"Sometimes\"",
        ),
        (json!({"dnsPolicy": "None"}), "spec.dnsConfig: required"),
        (
            json!({"dnsConfig": {"nameservers": ["dns.example"]}}),
            "spec.dnsConfig.nameservers[0] \"dns.example\"",
        ),
        (
            json!({"dnsConfig": {"searches": ["a b"]}}),
            "spec.dnsConfig.searches[0]",
        ),
        (
            json!({"dnsConfig": {"options": [{"value": "1"}]}}),
            "spec.dnsConfig.options[0]",
        ),
        (json!({"hostname": "Not_A_Label"}), "spec.hostname"),
        (json!({"subdomain": "a.b"}), "spec.subdomain"),
        (
            json!({"hostAliases": [{"ip": "10.0.0.300", "hostnames": ["x"]}]}),
            "spec.hostAliases[0].ip",
        ),
        (
            json!({"hostAliases": [{"ip": "10.0.0.3", "hostnames": ["ok", "bad name\n1.2.3.4 evil"]}]}),
            "spec.hostAliases[0].hostnames",
        ),
    ];
    for (spec, what) in cases {
        let p = pod(spec.clone());
        let e = check(p.spec.as_ref().expect("spec")).unwrap_err();
        assert!(e.to_string().contains(what), "{spec}: {e}");
        assert_eq!(e.reason(), "CreateContainerConfigError");
    }
    let ok = pod(json!({
        "dnsPolicy": "ClusterFirstWithHostNet", "hostname": "h-1", "subdomain": "s",
        "hostAliases": [{"ip": "fd00::1", "hostnames": ["a.example", "b"]}],
        "dnsConfig": {"nameservers": ["::1"], "searches": ["x.example."], "options": [{"name": "ndots"}]},
    }));
    check(ok.spec.as_ref().expect("spec")).expect("valid");
}

#[test]
fn hostname_and_domain_as_the_kubelet_makes_them() {
    let p = pod(json!({}));
    assert_eq!(
        hostname_and_domain(&p, "cluster.local").expect("ok"),
        ("web".to_owned(), String::new())
    );
    let p = pod(json!({"hostname": "db-0", "subdomain": "db"}));
    assert_eq!(
        hostname_and_domain(&p, "cluster.local").expect("ok"),
        ("db-0".to_owned(), "db.shop.svc.cluster.local".to_owned())
    );
    // A long pod name is cut to 63 characters, without a trailing '-' or '.'.
    let mut long: Pod = pod(json!({}));
    long.metadata.name = Some(format!("{}-{}", "a".repeat(62), "b".repeat(10)));
    let (h, _) = hostname_and_domain(&long, "").expect("ok");
    assert_eq!(h, "a".repeat(62));
}

#[test]
fn the_managed_hosts_file_is_the_kubelets() {
    let aliases: Vec<k8s_openapi::api::core::v1::HostAlias> = serde_json::from_value(json!([
        {"ip": "10.1.2.3", "hostnames": ["foo.local", "bar.local"]},
        {"ip": "fd00::9", "hostnames": ["v6.local"]},
    ]))
    .expect("aliases");
    let text = hosts::managed(
        &strs(&["10.88.0.7"]),
        "db-0",
        "db.shop.svc.cluster.local",
        &aliases,
    );
    assert_eq!(
        text,
        "# Kubernetes-managed hosts file.\n\
         127.0.0.1\tlocalhost\n\
         ::1\tlocalhost ip6-localhost ip6-loopback\n\
         fe00::0\tip6-localnet\n\
         fe00::0\tip6-mcastprefix\n\
         fe00::1\tip6-allnodes\n\
         fe00::2\tip6-allrouters\n\
         10.88.0.7\tdb-0.db.shop.svc.cluster.local\tdb-0\n\
         \n\
         # Entries added by HostAliases.\n\
         10.1.2.3\tfoo.local\tbar.local\n\
         fd00::9\tv6.local\n"
    );
    let plain = hosts::managed(&strs(&["10.88.0.7", "fd00::7"]), "web", "", &[]);
    assert!(plain.ends_with("fe00::2\tip6-allrouters\n10.88.0.7\tweb\nfd00::7\tweb\n"));
    let host = hosts::host_network("127.0.0.1 localhost\n", &aliases[..1]);
    assert_eq!(
        host,
        "# Kubernetes-managed hosts file (host network).\n127.0.0.1 localhost\n\n\
         # Entries added by HostAliases.\n10.1.2.3\tfoo.local\tbar.local\n"
    );
}

#[test]
fn the_hosts_file_content_follows_the_network_and_is_written_under_the_pod_dir() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = settings(&dir, HOST, &[]);
    let p = pod(json!({"hostAliases": [{"ip": "10.1.2.3", "hostnames": ["foo"]}]}));
    // A pod-network pod without a known IP gets no file.
    assert_eq!(hosts::content(&s, &p, &[]).expect("ok"), None);
    let text = hosts::content(&s, &p, &strs(&["10.88.0.7"]))
        .expect("ok")
        .expect("some");
    assert!(text.contains("10.88.0.7\tweb\n") && text.contains("10.1.2.3\tfoo\n"));
    // A host-network pod: the node's file (missing: a clear error naming it), IPs unused.
    let hn = pod(
        json!({"hostNetwork": true, "hostAliases": [{"ip": "10.1.2.3", "hostnames": ["foo"]}]}),
    );
    let e = hosts::content(&s, &hn, &[]).unwrap_err();
    assert!(e.to_string().contains("hosts"), "{e}");
    std::fs::write(&s.node_hosts, "192.0.2.1 node\n").expect("write");
    let text = hosts::content(&s, &hn, &[]).expect("ok").expect("some");
    assert!(text.contains(
        "(host network).\n192.0.2.1 node\n\n# Entries added by HostAliases.\n10.1.2.3\tfoo\n"
    ));
    let path = hosts::path(dir.path(), "u1");
    assert_eq!(path, dir.path().join("u1").join("etc-hosts"));
    hosts::write(&path, &text).expect("write");
    hosts::write(&path, "short\n").expect("rewrite");
    assert_eq!(std::fs::read_to_string(&path).expect("read"), "short\n");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
    assert_eq!(mode & 0o777, 0o644);
}
