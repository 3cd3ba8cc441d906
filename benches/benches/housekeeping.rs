//! The CPU one housekeeping pass costs the agent with N running pods (default 100), against the
//! real containerd: the work the sync loop's housekeeping starts every 2 s, done here in the
//! bench's process with the agent's own code on the release agent's pods:
//!
//! - the crash-loop back-offs' clean-up (`gc_backoffs`),
//! - the container garbage collection (`collect_stale_sandboxes`: `ListPodSandbox`,
//!   `ListContainers`, the per-pod plan; each pod keeps the exited instance of its init
//!   container, so every plan looks at a dead container and keeps it),
//! - the orphaned pod cgroup scan and the orphaned pod directory scan (nothing is orphaned).
//!
//! Measured as this thread's CPU time (`getrusage(RUSAGE_THREAD)`, user + system) around each
//! pass on a single-threaded tokio runtime, so the CRI client's protobuf decoding and its I/O
//! count, and containerd's own work does not.
//!
//! `cargo bench -p swiftlet-benches --bench housekeeping [-- --pods N --passes M]`.
use std::process::ExitCode;
use std::time::Duration;
use swiftlet_tests::Runtime;

/// This thread's user + system CPU time so far.
fn thread_cpu() -> Duration {
    // SAFETY: getrusage fills the struct before it is read.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    tv(u.ru_utime) + tv(u.ru_stime)
}

fn main() -> ExitCode {
    let (mut pods, mut passes) = (100usize, 200usize);
    if let Err(code) = swiftlet_benches::count_args(
        "housekeeping",
        &mut [("pods", &mut pods), ("passes", &mut passes)],
    ) {
        return code;
    }
    let Some(rt) = Runtime::shared() else {
        eprintln!("housekeeping: skipped (needs root and containerd; see the SKIPPED line above)");
        return ExitCode::SUCCESS;
    };
    let init = format!(
        "  initContainers:\n  - name: init\n    image: {}\n    imagePullPolicy: Never\n    \
         command: [\"true\"]\n",
        swiftlet_tests::BUSYBOX_IMAGE
    );
    let (agent, list) =
        swiftlet_tests::release_agent_with_pods(rt, "bench-housekeeping", pods, &init);
    let known: std::collections::HashSet<String> = list
        .items
        .iter()
        .filter_map(|p| p.metadata.uid.clone())
        .collect();

    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    // The CRI client's channel spawns its connection task on the runtime it is made in.
    let _entered = tokio.enter();
    let metrics = swiftlet::metrics::Metrics::new();
    let cri = swiftlet::cri::Cri::new(&rt.endpoint, metrics).expect("a CRI client");
    let cm = swiftlet::cm::ContainerManager::new(swiftlet::cm::Config {
        cgroup_root: agent.cgroup_root().to_owned(),
        cgroups_per_qos: true,
        mount: swiftlet::cm::CGROUP_MOUNT.into(),
        pod_pids_limit: -1,
    });
    let manager = swiftlet_benches::runtime_manager(
        &cri,
        cm.clone(),
        swiftlet::runtime::Config {
            node_name: agent.node_name().to_owned(),
            node_ips: Vec::new(),
            pod_logs_dir: agent.root_dir().join("pod-logs"),
            pods_dir: agent.root_dir().join("pods"),
            security: swiftlet::runtime::security::Settings::default(),
            memory_capacity: swiftlet::cm::machine_memory_bytes().unwrap_or(8 << 30),
            dns: swiftlet::dns::Settings::default(),
        },
    );
    let container_gc = swiftlet::container_gc::ContainerGc::new(
        cri.clone(),
        agent.node_name().to_owned(),
        Default::default(),
        Default::default(),
        swiftlet::logs::links::dir_for(&agent.root_dir().join("pod-logs")),
    );
    let orphans = swiftlet::orphans::Orphans::new(
        cm.clone(),
        agent.root_dir().join("pod-logs"),
        agent.root_dir().join("pods"),
    );
    let is_known = |uid: &str| known.contains(uid);
    let pass = || {
        tokio.block_on(async {
            manager.gc_backoffs();
            let collected = container_gc
                .collect_stale_sandboxes()
                .await
                .expect("listing the runtime");
            assert_eq!(
                collected.containers + collected.sandboxes,
                0,
                "nothing to collect"
            );
        });
        let due = cm.orphaned_pod_cgroups(&is_known).unwrap_or_default();
        assert!(due.is_empty(), "no orphaned cgroups: {due:?}");
        assert_eq!(orphans.remove_orphaned_pod_dirs(&is_known), 0);
    };
    for _ in 0..3 {
        pass();
    }
    let mut ms: Vec<f64> = Vec::with_capacity(passes);
    for _ in 0..passes {
        let before = thread_cpu();
        pass();
        ms.push((thread_cpu() - before).as_secs_f64() * 1000.0);
    }
    let total: f64 = ms.iter().sum();
    ms.sort_by(f64::total_cmp);
    let pct = |p: f64| ms[((ms.len() - 1) as f64 * p).round() as usize];
    println!(
        "housekeeping pass with {pods} running pods: n = {passes}, CPU p50 {:.2} ms, p90 {:.2} ms, \
         p99 {:.2} ms, mean {:.2} ms (budget: <= 5 ms)",
        pct(0.5),
        pct(0.9),
        pct(0.99),
        total / passes as f64
    );
    swiftlet_tests::remove_bench_pods(&agent, pods);
    ExitCode::SUCCESS
}
