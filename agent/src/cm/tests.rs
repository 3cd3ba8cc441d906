//! Tests of the container manager: resource math and cgroup files on temp-dir fixtures.
use super::resources::{MAX_SHARES, MIN_QUOTA_US};
use super::*;
use crate::pod::resources::tests::{
    Res, app_pod as pod, container, list, pod_of, sidecar, sidecar_pod,
};

const MI: u64 = 1 << 20;

#[test]
fn sidecar_init_and_app_pod_gets_the_kubelets_numbers() {
    // Requests 500m/300Mi, limits 1000m/428Mi (worked in `crate::pod::resources`); requests
    // differ from limits: Burstable, every container declares both limits.
    assert_eq!(
        resource_config_for_pod(&sidecar_pod()).unwrap(),
        ResourceConfig {
            cpu_shares: 512,
            cpu_quota: Some(100_000),
            cpu_period: Some(100_000),
            memory_limit: Some(428 * MI),
        }
    );
    // The integration test's pod: sidecar 50m/64Mi requests, 100m/128Mi limits; app
    // 100m/128Mi, 200m/256Mi. Shares of 150m = 150 * 1024 / 1000 = 153; quota of 300m =
    // 30000 us; memory 128Mi + 256Mi = 384Mi (not max(256Mi, 128Mi)).
    let pod = pod_of(
        vec![sidecar(
            "proxy",
            &[("cpu", "50m"), ("memory", "64Mi")],
            &[("cpu", "100m"), ("memory", "128Mi")],
        )],
        vec![container(
            "app",
            &[("cpu", "100m"), ("memory", "128Mi")],
            &[("cpu", "200m"), ("memory", "256Mi")],
        )],
    );
    assert_eq!(
        resource_config_for_pod(&pod).unwrap(),
        ResourceConfig {
            cpu_shares: 153,
            cpu_quota: Some(30_000),
            cpu_period: Some(100_000),
            memory_limit: Some(384 * MI),
        }
    );
}

#[test]
fn overhead_is_in_the_pod_cgroup() {
    // Guaranteed 250m/64Mi plus overhead 100m/32Mi: shares of 350m = 358, quota 35000 us,
    // memory 96Mi.
    let g: Res<'_> = &[("cpu", "250m"), ("memory", "64Mi")];
    let mut p = pod(&[(g, g)]);
    if let Some(spec) = p.spec.as_mut() {
        spec.overhead = list(&[("cpu", "100m"), ("memory", "32Mi")]);
    }
    assert_eq!(
        resource_config_for_pod(&p).unwrap(),
        ResourceConfig {
            cpu_shares: 358,
            cpu_quota: Some(35_000),
            cpu_period: Some(100_000),
            memory_limit: Some(96 * MI),
        }
    );
}

#[test]
fn overhead_of_burstable_and_best_effort_pods() {
    let with_overhead = |containers: &[(Res<'_>, Res<'_>)], overhead: Res<'_>| {
        let mut p = pod(containers);
        if let Some(spec) = p.spec.as_mut() {
            spec.overhead = list(overhead);
        }
        p
    };
    let oh: Res<'_> = &[("cpu", "50m"), ("memory", "16Mi")];
    // Burstable, a cpu request and a memory limit: shares of 100m + 50m = 153; the cpu limit is
    // not declared, so overhead makes no quota; memory 128Mi + 16Mi.
    let b = with_overhead(&[(&[("cpu", "100m")], &[("memory", "128Mi")])], oh);
    assert_eq!(
        resource_config_for_pod(&b).unwrap(),
        ResourceConfig {
            cpu_shares: 153,
            cpu_quota: None,
            cpu_period: None,
            memory_limit: Some(144 * MI),
        }
    );
    // BestEffort stays BestEffort: minimum shares and no limits, overhead or not.
    let be = with_overhead(&[(&[], &[])], oh);
    assert_eq!(
        resource_config_for_pod(&be).unwrap(),
        ResourceConfig {
            cpu_shares: MIN_SHARES,
            ..Default::default()
        }
    );
    // An overhead that does not parse is an error naming it.
    let bad = with_overhead(&[(&[], &[])], &[("cpu", "lots")]);
    let e = resource_config_for_pod(&bad).unwrap_err().to_string();
    assert!(e.contains("spec.overhead.cpu"), "{e}");
}

#[test]
fn limits_only_pod() {
    // As written (no defaulting): Burstable, no cpu request (2 shares), quota and memory
    // limit from the limits, which every container declares.
    let l: Res<'_> = &[("cpu", "500m"), ("memory", "64Mi")];
    let raw = pod(&[(&[], l)]);
    assert_eq!(pod_qos(&raw).unwrap(), QosClass::Burstable);
    assert_eq!(
        resource_config_for_pod(&raw).unwrap(),
        ResourceConfig {
            cpu_shares: 2,
            cpu_quota: Some(50_000),
            cpu_period: Some(100_000),
            memory_limit: Some(64 * MI),
        }
    );
    // Parsed as a static pod, the requests default to the limits: Guaranteed, 512 shares,
    // directly under kubepods.
    let manifest = "apiVersion: v1\nkind: Pod\nmetadata: {name: lim}\nspec:\n  containers:\n  \
                    - name: c\n    image: x\n    resources: {limits: {cpu: 500m, memory: 64Mi}}\n";
    let parsed =
        crate::config::manifest::parse(Path::new("/p.yaml"), manifest.as_bytes(), "n").unwrap();
    assert_eq!(pod_qos(&parsed).unwrap(), QosClass::Guaranteed);
    assert_eq!(
        resource_config_for_pod(&parsed).unwrap(),
        ResourceConfig {
            cpu_shares: 512,
            cpu_quota: Some(50_000),
            cpu_period: Some(100_000),
            memory_limit: Some(64 * MI),
        }
    );
    let (_tmp, cm) = v1_fixture("/lim");
    assert_eq!(
        cm.ensure_pod_cgroup(&parsed, "u1").unwrap(),
        "/lim/kubepods/podu1"
    );
}

#[test]
fn huge_amounts_saturate_instead_of_wrapping() {
    assert_eq!(milli_cpu_to_shares(u64::MAX), MAX_SHARES);
    assert_eq!(
        milli_cpu_to_quota(u64::MAX, QUOTA_PERIOD_US),
        u64::MAX / 1000
    );
    assert_eq!(saturating_i64(u64::MAX), i64::MAX);
    // Two memory limits of 7Ei add up beyond i64: the pod limit stays a (huge) limit.
    let big: Res<'_> = &[("memory", "7Ei")];
    let rc = resource_config_for_pod(&pod(&[(&[], big), (&[], big)])).unwrap();
    assert_eq!(rc.memory_limit, Some(14 << 60));
    assert_eq!(saturating_i64(14 << 60), i64::MAX);
}

#[test]
fn resource_math() {
    assert_eq!(milli_cpu_to_shares(0), 2);
    assert_eq!(milli_cpu_to_shares(1), 2);
    assert_eq!(milli_cpu_to_shares(1000), 1024);
    assert_eq!(milli_cpu_to_shares(10_000_000), MAX_SHARES);
    assert_eq!(milli_cpu_to_quota(5, QUOTA_PERIOD_US), MIN_QUOTA_US);
    assert_eq!(milli_cpu_to_quota(500, QUOTA_PERIOD_US), 50_000);
    let g: &[(&str, &str)] = &[("cpu", "500m"), ("memory", "64Mi")];
    let rc = resource_config_for_pod(&pod(&[(g, g)])).unwrap();
    assert_eq!(
        rc,
        ResourceConfig {
            cpu_shares: 512,
            cpu_quota: Some(50_000),
            cpu_period: Some(100_000),
            memory_limit: Some(64 << 20)
        }
    );
    let rc = resource_config_for_pod(&pod(&[
        (&[("cpu", "100m")], &[("memory", "1Gi")]),
        (&[], &[]),
    ]))
    .unwrap();
    assert_eq!(
        rc,
        ResourceConfig {
            cpu_shares: 102,
            ..Default::default()
        }
    );
    assert_eq!(shares_to_weight(2), 1);
    assert_eq!(shares_to_weight(262_144), 10_000);
    assert_eq!(shares_to_weight(1024), 39);
}

/// A started container manager over a directory laid out like a cgroup v1 mount.
fn v1_fixture(cgroup_root: &str) -> (tempfile::TempDir, ContainerManager) {
    let tmp = tempfile::tempdir().unwrap();
    for c in V1_CONTROLLERS {
        fs::create_dir_all(tmp.path().join(c)).unwrap();
    }
    let cm = ContainerManager::new(Config {
        cgroup_root: cgroup_root.into(),
        cgroups_per_qos: true,
        mount: tmp.path().into(),
        pod_pids_limit: 100,
    });
    assert_eq!(cm.hierarchy(), Hierarchy::V1);
    cm.start().unwrap();
    (tmp, cm)
}

#[test]
fn node_allocatable_is_written_on_kubepods() {
    let (tmp, cm) = v1_fixture("/test");
    cm.enforce_node_allocatable(3800, 7 << 30).unwrap();
    let read = |f: &str| fs::read_to_string(tmp.path().join(f)).unwrap();
    assert_eq!(read("cpu/test/kubepods/cpu.shares"), "3891");
    assert_eq!(
        read("memory/test/kubepods/memory.limit_in_bytes"),
        (7u64 << 30).to_string()
    );
    // Written again only when it differs.
    let before = cm.writes();
    cm.enforce_node_allocatable(3800, 7 << 30).unwrap();
    assert_eq!(cm.writes(), before);
}

/// `kubelet_cgroup_manager_duration_seconds`: a pod cgroup's creation, a change to it, the QoS
/// cgroups' update and its removal are each observed once; what finds nothing to do is not.
#[test]
fn cgroup_operations_are_timed_by_the_kubelets_operation_types() {
    let (tmp, cm) = v1_fixture("/test");
    let durations = crate::metrics::kubelet::CgroupManagerDurations::new_with_constructor(|| {
        prometheus_client::metrics::histogram::Histogram::new([1.0])
    });
    let cm = cm.with_durations(durations.clone());
    let count = |op: &'static str| {
        let mut text = String::new();
        let mut reg = prometheus_client::registry::Registry::default();
        reg.register("d", "", durations.clone());
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        let want = format!("d_count{{operation_type=\"{op}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(want.as_str()))
            .map_or(0, |n| n.parse::<u64>().unwrap())
    };
    let g: &[(&str, &str)] = &[("cpu", "500m"), ("memory", "64Mi")];
    cm.ensure_pod_cgroup(&pod(&[(g, g)]), "u1").unwrap();
    assert_eq!(count("create"), 1);
    cm.ensure_pod_cgroup(&pod(&[(g, g)]), "u1").unwrap();
    assert_eq!((count("create"), count("update")), (1, 0), "nothing to do");
    let b: &[(&str, &str)] = &[("cpu", "250m")];
    cm.ensure_pod_cgroup(&pod(&[(b, &[])]), "u2").unwrap();
    assert_eq!(count("create"), 2);
    assert_eq!(count("update"), 1, "the burstable QoS cgroup's shares");
    // (A fixture's directories hold plain files, which only cgroupfs lets rmdir pass: an empty
    // one stands in for the pod cgroup.)
    fs::create_dir_all(tmp.path().join("cpu/test/kubepods/podu9")).unwrap();
    cm.destroy_pod_cgroup("/test/kubepods/podu9").unwrap();
    cm.destroy_pod_cgroup("/test/kubepods/podu10").unwrap();
    assert_eq!(count("destroy"), 1, "what was not there is not counted");
}

#[test]
fn cgroup_names_and_files_v1_fixture() {
    let (tmp, cm) = v1_fixture("/test");
    assert_eq!(
        fs::read_to_string(tmp.path().join("cpu/test/kubepods/besteffort/cpu.shares")).unwrap(),
        "2"
    );
    let g: &[(&str, &str)] = &[("cpu", "500m"), ("memory", "64Mi")];
    let name = cm.ensure_pod_cgroup(&pod(&[(g, g)]), "u1").unwrap();
    assert_eq!(name, "/test/kubepods/podu1");
    assert_eq!(
        fs::read_to_string(tmp.path().join("cpu/test/kubepods/podu1/cpu.cfs_quota_us")).unwrap(),
        "50000"
    );
    assert_eq!(
        fs::read_to_string(
            tmp.path()
                .join("memory/test/kubepods/podu1/memory.limit_in_bytes")
        )
        .unwrap(),
        (64u64 << 20).to_string()
    );
    assert_eq!(
        fs::read_to_string(tmp.path().join("pids/test/kubepods/podu1/pids.max")).unwrap(),
        "100"
    );
    // Re-applying the same config writes nothing.
    let before = cm.writes();
    cm.ensure_pod_cgroup(&pod(&[(g, g)]), "u1").unwrap();
    assert_eq!(cm.writes(), before);
    // Burstable pods' cpu requests add up in the burstable QoS cgroup's shares.
    let b: &[(&str, &str)] = &[("cpu", "250m")];
    cm.ensure_pod_cgroup(&pod(&[(b, &[])]), "u2").unwrap();
    cm.ensure_pod_cgroup(&pod(&[(b, &[]), (b, &[])]), "u3")
        .unwrap();
    let qos_shares =
        || fs::read_to_string(tmp.path().join("cpu/test/kubepods/burstable/cpu.shares")).unwrap();
    assert_eq!(qos_shares(), milli_cpu_to_shares(750).to_string());
    let mut found = cm.list_pod_cgroups();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        found,
        vec![
            ("u1".to_owned(), QosClass::Guaranteed),
            ("u2".to_owned(), QosClass::Burstable),
            ("u3".to_owned(), QosClass::Burstable),
        ]
    );
    // Orphans: due only on the second pass that sees them unknown; known pods never.
    let known = |uid: &str| uid == "u1";
    assert_eq!(cm.orphaned_pod_cgroups(&known), Some(vec![]));
    let mut due = cm.orphaned_pod_cgroups(&known).unwrap();
    due.sort();
    assert_eq!(due, vec!["u2".to_owned(), "u3".to_owned()]);
    // Their shares left the burstable QoS cgroup; no new pass starts before the removal ran.
    assert_eq!(qos_shares(), "2");
    assert_eq!(cm.orphaned_pod_cgroups(&known), None);
    // Unsafe names never leave the directory.
    assert!(cm.pod_cgroup_name("../x", QosClass::BestEffort).is_err());
    assert!(safe_join(tmp.path(), "a/../../b").is_err());
    // Files written by a test fixture are plain files, so remove_dir fails on a non-empty dir:
    // destroy is exercised against the real cgroupfs in the integration tests.
}

#[test]
fn concurrent_pod_workers_leave_the_burstable_qos_shares_at_the_full_sum() {
    let (tmp, cm) = v1_fixture("/race");
    let shares = tmp.path().join("cpu/race/kubepods/burstable/cpu.shares");
    for round in 0..20 {
        let pods = 8;
        std::thread::scope(|s| {
            for i in 0..pods {
                let cm = cm.clone();
                s.spawn(move || {
                    let b: &[(&str, &str)] = &[("cpu", "100m")];
                    cm.ensure_pod_cgroup(&pod(&[(b, &[])]), &format!("r{round}p{i}"))
                        .unwrap();
                });
            }
        });
        let want = milli_cpu_to_shares(100 * pods * (round + 1));
        assert_eq!(
            fs::read_to_string(&shares).unwrap(),
            want.to_string(),
            "round {round}"
        );
    }
}

#[test]
fn v2_fixture_uses_v2_file_names() {
    let tmp = tempfile::tempdir().unwrap();
    fs::write(tmp.path().join("cgroup.controllers"), "cpu memory pids").unwrap();
    let cm = ContainerManager::new(Config {
        cgroup_root: "/".into(),
        cgroups_per_qos: true,
        mount: tmp.path().into(),
        pod_pids_limit: 100,
    });
    assert_eq!(cm.hierarchy(), Hierarchy::V2);
    cm.start().unwrap();
    // What the kernel puts in a new cgroup2 directory.
    let dir = tmp.path().join("kubepods/burstable/podu2");
    fs::create_dir_all(&dir).unwrap();
    for (f, v) in [
        ("cpu.max", "max 100000"),
        ("cpu.weight", "100"),
        ("memory.max", "max"),
        ("pids.max", "max"),
    ] {
        fs::write(dir.join(f), v).unwrap();
    }
    let b: &[(&str, &str)] = &[("cpu", "1")];
    let name = cm
        .ensure_pod_cgroup(&pod(&[(b, &[("cpu", "2"), ("memory", "1Gi")])]), "u2")
        .unwrap();
    assert_eq!(name, "/kubepods/burstable/podu2");
    let dir = tmp.path().join("kubepods/burstable/podu2");
    assert_eq!(fs::read_to_string(dir.join("cpu.weight")).unwrap(), "39");
    assert_eq!(
        fs::read_to_string(dir.join("cpu.max")).unwrap(),
        "200000 100000"
    );
    assert_eq!(
        fs::read_to_string(dir.join("memory.max")).unwrap(),
        (1u64 << 30).to_string()
    );
    assert_eq!(fs::read_to_string(dir.join("pids.max")).unwrap(), "100");
    // The burstable QoS cgroup's weight is converted from shares too.
    assert_eq!(
        fs::read_to_string(tmp.path().join("kubepods/burstable/cpu.weight")).unwrap(),
        shares_to_weight(1024).to_string()
    );
    let before = cm.writes();
    let p = pod(&[(b, &[("cpu", "2"), ("memory", "1Gi")])]);
    cm.ensure_pod_cgroup(&p, "u2").unwrap();
    assert_eq!(cm.writes(), before);
    // After a restart (nothing remembered) the files are read and still nothing is written.
    let cm = ContainerManager::new(cm.cfg.clone());
    cm.ensure_pod_cgroup(&p, "u2").unwrap();
    assert_eq!(cm.writes(), 0);
}

#[test]
fn v2_parents_hand_their_controllers_down() {
    let tmp = tempfile::tempdir().unwrap();
    fs::write(
        tmp.path().join("cgroup.controllers"),
        "cpuset cpu memory pids",
    )
    .unwrap();
    fs::write(tmp.path().join("cgroup.subtree_control"), "").unwrap();
    let cm = ContainerManager::new(Config {
        cgroup_root: "/".into(),
        cgroups_per_qos: true,
        mount: tmp.path().into(),
        pod_pids_limit: 0,
    });
    // The fixture's kubepods is a cgroup too: it offers what the root enables (the kernel
    // fills cgroup.controllers; the fixture does it by hand before the QoS levels appear).
    fs::create_dir(tmp.path().join("kubepods")).unwrap();
    fs::write(
        tmp.path().join("kubepods/cgroup.controllers"),
        "cpu memory pids",
    )
    .unwrap();
    cm.start().unwrap();
    // The last write is what a cgroupfs file keeps; the fixture's plain file shows the one
    // write that enabled all four at once.
    assert_eq!(
        fs::read_to_string(tmp.path().join("cgroup.subtree_control")).unwrap(),
        "+cpuset +cpu +memory +pids"
    );
    assert_eq!(
        fs::read_to_string(tmp.path().join("kubepods/cgroup.subtree_control")).unwrap(),
        "+cpu +memory +pids"
    );
    // A parent that lacks a required controller is named in the error.
    fs::write(tmp.path().join("kubepods/cgroup.controllers"), "cpu pids").unwrap();
    let err = super::driver::delegate_controllers(&tmp.path().join("kubepods")).unwrap_err();
    assert!(err.to_string().contains("memory controller"), "{err}");
}

/// The host's real cgroup2 mount (`/sys/fs/cgroup` on a unified host, `/sys/fs/cgroup/unified`
/// on a hybrid one): a cgroup made there gets what its parent offers enabled for its children,
/// and a required controller still held by a v1 hierarchy is reported by name.
#[test]
fn the_real_cgroup2_mount_delegates_what_it_offers() {
    let Some(mount) = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .into_iter()
        .map(Path::new)
        .find(|m| m.join("cgroup.controllers").is_file())
    else {
        eprintln!("skipping: no cgroup2 mount");
        return;
    };
    let dir = mount.join(format!("swiftlet-unit-delegate-{}", std::process::id()));
    if let Err(e) = fs::create_dir(&dir) {
        eprintln!(
            "skipping: cannot create a cgroup in {}: {e}",
            mount.display()
        );
        return;
    }
    let offered = fs::read_to_string(dir.join("cgroup.controllers")).unwrap();
    let result = super::driver::delegate_controllers(&dir);
    let enabled = fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap();
    let _ = fs::remove_dir(&dir);
    let offered: Vec<&str> = offered.split_whitespace().collect();
    let enabled: Vec<&str> = enabled.split_whitespace().collect();
    // The kernel may refuse a controller that is not required (none here do): what is
    // required must be on, and nothing is enabled that was not offered.
    assert!(enabled.iter().all(|c| offered.contains(c)), "{enabled:?}");
    match super::driver::REQUIRED_V2
        .iter()
        .find(|c| !offered.contains(c))
    {
        None => {
            result.unwrap();
            for c in super::driver::REQUIRED_V2 {
                assert!(enabled.contains(&c), "{c} not enabled: {enabled:?}");
            }
        }
        Some(c) => {
            let err = result.unwrap_err().to_string();
            assert!(err.contains(&format!("the {c} controller")), "{err}");
            assert_eq!(enabled, offered, "what is offered is enabled all the same");
        }
    }
}
