//! criterion bench of the container manager's cgroup writes on the real cgroupfs (budget in the
//! issue: <= 100 us to create and configure a pod cgroup; re-applying an unchanged config writes
//! nothing). Results in BENCHMARKS.md. Needs root and a cgroupfs at /sys/fs/cgroup; skips
//! otherwise. Uses its own cgroup root `/swiftlet-bench-<pid>` and removes it at the end.
use criterion::{Criterion, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::time::{Duration, Instant};
use swiftlet::cm::{self, ContainerManager};

/// A Guaranteed pod (all four values written: shares, period, quota, memory) and a Burstable one.
fn pod(cpu: &str, memory: &str, guaranteed: bool) -> Pod {
    let q = |pairs: &[(&str, &str)]| {
        Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                .collect(),
        )
    };
    let requests = q(&[("cpu", cpu), ("memory", memory)]);
    Pod {
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "c".into(),
                resources: Some(ResourceRequirements {
                    limits: if guaranteed { requests.clone() } else { None },
                    requests,
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn cgroup_write(c: &mut Criterion) {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !std::path::Path::new(cm::CGROUP_MOUNT).is_dir() {
        eprintln!(
            "cgroup_write: skipped (needs root and {})",
            cm::CGROUP_MOUNT
        );
        return;
    }
    let root = format!("/swiftlet-bench-{}", std::process::id());
    let cm = ContainerManager::new(cm::Config {
        cgroup_root: root.clone(),
        cgroups_per_qos: true,
        mount: cm::CGROUP_MOUNT.into(),
        pod_pids_limit: 1024,
    });
    if let Err(e) = cm.start() {
        panic!("cgroup_write: creating the QoS cgroups under {root}: {e}");
    }
    let guaranteed = pod("500m", "64Mi", true);
    let burstable = pod("250m", "32Mi", false);

    // Re-applying an unchanged config: 0 writes (checked here, and counted over both re-apply
    // benches).
    let uid = "bench-steady";
    for p in [&guaranteed, &burstable] {
        cm.ensure_pod_cgroup(p, uid)
            .expect("creating the pod cgroup");
        cm.destroy_pod_cgroups(uid)
            .expect("removing the pod cgroup");
    }
    cm.ensure_pod_cgroup(&guaranteed, uid)
        .expect("creating the pod cgroup");
    let before = cm.writes();
    cm.ensure_pod_cgroup(&guaranteed, uid)
        .expect("re-applying the config");
    assert_eq!(cm.writes(), before, "re-applying an unchanged config wrote");

    let mut group = c.benchmark_group("cgroup_write");
    group.measurement_time(Duration::from_secs(5));
    group.bench_function("reapply_unchanged", |b| {
        b.iter(|| cm.ensure_pod_cgroup(&guaranteed, uid).expect("re-applying"))
    });
    // What a restarted agent does: no memory of what it applied, so read and compare each file.
    let name = cm
        .pod_cgroup_name(uid, swiftlet::pod::QosClass::Guaranteed)
        .expect("a pod cgroup name");
    let rc = cm::resource_config_for_pod(&guaranteed).expect("the pod's config");
    group.bench_function("reapply_after_restart", |b| {
        b.iter(|| cm.apply(&name, &rc).expect("re-applying"))
    });
    let reapply_writes = cm.writes() - before;
    println!("cgroup_write/reapply_unchanged: {reapply_writes} writes over the whole run");
    assert_eq!(reapply_writes, 0, "re-applying an unchanged config wrote");

    // Create and configure a new pod cgroup; removing it is not timed.
    for (name, p) in [
        ("create_guaranteed", &guaranteed),
        ("create_burstable", &burstable),
    ] {
        let mut n = 0u64;
        let start_writes = cm.writes();
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    n += 1;
                    let uid = format!("bench-{n}");
                    let t = Instant::now();
                    cm.ensure_pod_cgroup(p, &uid)
                        .expect("creating the pod cgroup");
                    total += t.elapsed();
                    cm.destroy_pod_cgroups(&uid)
                        .expect("removing the pod cgroup");
                }
                total
            })
        });
        println!(
            "cgroup_write/{name}: {:.1} writes per pod cgroup (directories + files, with the burstable QoS shares)",
            (cm.writes() - start_writes) as f64 / n.max(1) as f64
        );
    }
    // The floor: the same 3 mkdirs and 4 writes with plain std::fs, nothing else.
    let base = std::path::Path::new(cm::CGROUP_MOUNT);
    let rel = root.trim_start_matches('/');
    let files = [
        ("cpu", "cpu.shares", "512"),
        ("cpu", "cpu.cfs_quota_us", "50000"),
        ("memory", "memory.limit_in_bytes", "67108864"),
        ("pids", "pids.max", "1024"),
    ];
    if base.join("cpu").is_dir() {
        let mut n = 0u64;
        group.bench_function("floor_std_fs", |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    n += 1;
                    let dir = |h: &str| base.join(h).join(rel).join(format!("floor-{n}"));
                    let dirs = ["cpu", "memory", "pids"].map(dir);
                    let t = Instant::now();
                    for d in &dirs {
                        std::fs::create_dir(d).expect("mkdir");
                    }
                    for (h, f, v) in files {
                        std::fs::write(dir(h).join(f), v).expect("write");
                    }
                    total += t.elapsed();
                    for d in &dirs {
                        std::fs::remove_dir(d).expect("rmdir");
                    }
                }
                total
            })
        });
    }
    group.finish();
    cm.destroy_pod_cgroups(uid)
        .expect("removing the pod cgroup");
    xtask::runtime::remove_cgroup_root(&root);
}

criterion_group!(benches, cgroup_write);
criterion_main!(benches);
