use std::{
    mem::{offset_of, size_of},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use tokio::sync::broadcast::error::RecvError;

use super::*;

// ---- pure unit tests (no privileges) ----

#[test]
fn mode_parses_and_displays() {
    for (text, mode) in [("auto", Mode::Auto), ("on", Mode::On), ("off", Mode::Off)] {
        assert_eq!(text.parse::<Mode>(), Ok(mode));
        assert_eq!(mode.to_string(), text);
    }
    assert_eq!(Mode::default(), Mode::Auto);
    let err = "yes".parse::<Mode>().expect_err("not a mode");
    assert!(err.to_string().contains("\"yes\""), "{err}");
    assert!("On".parse::<Mode>().is_err(), "modes are lower case");
}

#[test]
fn event_serializes_with_tracepoint_names() {
    let event = CgroupEvent {
        kind: CgroupEventKind::Rmdir,
        path: "/kubepods/podx".into(),
        level: 2,
        ktime_ns: 5,
        hierarchy_id: 3,
        cgroup_id: 9,
    };
    let json = serde_json::to_value(&event).expect("serializes");
    assert_eq!(json["kind"], "cgroup_rmdir");
    assert_eq!(json["path"], "/kubepods/podx");
    assert_eq!(
        serde_json::to_value(CgroupEventKind::Mkdir).expect("serializes"),
        "cgroup_mkdir"
    );
}

/// The bytes a probe writes for a cgroup event, built field by field.
fn raw_cgroup_event(kind: u32, path: &[u8], ktime_ns: u64) -> Vec<u8> {
    use common::{CgroupEvent as Raw, EventHeader};
    let mut bytes = vec![0u8; size_of::<Raw>()];
    let mut put = |at: usize, v: &[u8]| bytes[at..at + v.len()].copy_from_slice(v);
    put(offset_of!(EventHeader, kind), &kind.to_ne_bytes());
    put(
        offset_of!(EventHeader, len),
        &u32::try_from(size_of::<Raw>())
            .expect("small")
            .to_ne_bytes(),
    );
    put(offset_of!(EventHeader, ktime_ns), &ktime_ns.to_ne_bytes());
    put(offset_of!(Raw, level), &1u32.to_ne_bytes());
    put(offset_of!(Raw, hierarchy_id), &4u32.to_ne_bytes());
    put(offset_of!(Raw, cgroup_id), &77u64.to_ne_bytes());
    put(
        offset_of!(Raw, path_len),
        &u32::try_from(path.len()).expect("small").to_ne_bytes(),
    );
    put(offset_of!(Raw, path), path);
    bytes
}

#[test]
fn record_decodes_keeps_and_broadcasts() {
    let shared = Shared::new(None);
    let mut rx = shared.tx.subscribe();
    shared.record(&raw_cgroup_event(common::KIND_CGROUP_MKDIR, b"/a/pod1", 10));
    shared.record(&raw_cgroup_event(
        common::KIND_CGROUP_RMDIR,
        b"/a/\xffbad",
        11,
    ));

    let first = rx.try_recv().expect("mkdir broadcast");
    assert_eq!(
        first,
        CgroupEvent {
            kind: CgroupEventKind::Mkdir,
            path: "/a/pod1".into(),
            level: 1,
            ktime_ns: 10,
            hierarchy_id: 4,
            cgroup_id: 77,
        }
    );
    let second = rx.try_recv().expect("rmdir broadcast");
    assert_eq!(second.kind, CgroupEventKind::Rmdir);
    assert_eq!(
        second.path, "/a/\u{fffd}bad",
        "invalid UTF-8 is replaced, not fatal"
    );
    assert_eq!(shared.seen.load(Ordering::Relaxed), 2);
    assert_eq!(shared.recent.lock().expect("not poisoned").len(), 2);
}

#[test]
fn record_counts_undecodable_bytes() {
    let shared = Shared::new(None);
    shared.record(&[1, 2, 3]);
    shared.record(&raw_cgroup_event(99, b"/x", 1));
    let mut truncated = raw_cgroup_event(common::KIND_CGROUP_MKDIR, b"/x", 1);
    truncated.truncate(100);
    shared.record(&truncated);
    assert_eq!(shared.undecodable.load(Ordering::Relaxed), 3);
    assert_eq!(shared.seen.load(Ordering::Relaxed), 0);
    assert!(shared.recent.lock().expect("not poisoned").is_empty());
}

#[test]
fn recent_events_are_bounded_oldest_dropped() {
    let shared = Shared::new(None);
    let total = RECENT_CAPACITY + 10;
    for i in 0..total {
        let ktime = u64::try_from(i).expect("small");
        shared.record(&raw_cgroup_event(common::KIND_CGROUP_MKDIR, b"/p", ktime));
    }
    let recent = shared.recent.lock().expect("not poisoned");
    assert_eq!(recent.len(), RECENT_CAPACITY);
    assert_eq!(recent.front().map(|e| e.ktime_ns), Some(10));
    assert_eq!(
        recent.back().map(|e| e.ktime_ns),
        Some(u64::try_from(total - 1).expect("small"))
    );
}

#[test]
fn off_loads_nothing_and_needs_no_runtime() {
    let started = Monitor::start(Mode::Off, Config::default(), CancellationToken::new())
        .expect("off never fails");
    assert!(started.is_none());
}

#[test]
fn on_outside_a_runtime_is_an_error_and_auto_is_not() {
    let err = Monitor::start(Mode::On, Config::default(), CancellationToken::new())
        .expect_err("no runtime");
    assert!(matches!(err, Error::NoRuntime), "{err}");
    let auto = Monitor::start(Mode::Auto, Config::default(), CancellationToken::new())
        .expect("auto never fails");
    assert!(auto.is_none());
}

// ---- real kernel tests (root) ----

/// True when this process may load probes. Without root the test is skipped loudly, unless
/// `SWIFTLET_REQUIRE_RUNTIME=1`, where it fails.
fn have_root(test: &str) -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var("SWIFTLET_REQUIRE_RUNTIME").as_deref() != Ok("1"),
        "{test}: SWIFTLET_REQUIRE_RUNTIME=1 but loading eBPF probes needs root"
    );
    eprintln!("SKIPPED {test}: loading eBPF probes needs root");
    false
}

/// A cgroup hierarchy we can make directories in: the cgroup2 mount (hybrid or unified), else the
/// v1 pids hierarchy.
fn cgroup_parent() -> PathBuf {
    [
        "/sys/fs/cgroup/unified",
        "/sys/fs/cgroup",
        "/sys/fs/cgroup/pids",
    ]
    .into_iter()
    .map(PathBuf::from)
    .find(|dir| dir.join("cgroup.procs").is_file())
    .expect("no writable cgroup hierarchy under /sys/fs/cgroup")
}

/// Removes the directory if the test stops half-way.
struct CgroupDir(PathBuf);

impl Drop for CgroupDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn unique_name(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{prefix}-{}-{nanos}", std::process::id())
}

async fn wait_for(
    rx: &mut broadcast::Receiver<CgroupEvent>,
    kind: CgroupEventKind,
    path: &str,
) -> CgroupEvent {
    let found = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match rx.recv().await {
                Ok(event) if event.kind == kind && event.path == path => return event,
                Ok(_) | Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => panic!("event channel closed"),
            }
        }
    })
    .await;
    found.unwrap_or_else(|_| panic!("no {kind} event for {path} within 5 s"))
}

/// The raw-tracepoint probes (offsets from BTF).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sees_cgroup_mkdir_and_rmdir() {
    if !have_root("sees_cgroup_mkdir_and_rmdir") {
        return;
    }
    cgroup_mkdir_and_rmdir(false).await;
}

/// The classic-tracepoint probes (offsets from the tracepoint format).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sees_cgroup_mkdir_and_rmdir_with_classic_tracepoints() {
    if !have_root("sees_cgroup_mkdir_and_rmdir_with_classic_tracepoints") {
        return;
    }
    cgroup_mkdir_and_rmdir(true).await;
}

async fn cgroup_mkdir_and_rmdir(classic: bool) {
    let cancel = CancellationToken::new();
    let config = Config {
        classic_cgroup_tracepoints: classic,
        ..Config::default()
    };
    let monitor = Monitor::start(Mode::On, config, cancel.clone())
        .expect("probes load as root")
        .expect("Mode::On returns a monitor");
    let mut rx = monitor.subscribe();

    let parent = cgroup_parent();
    let name = unique_name("swiftlet-ebpf-test");
    let dir = CgroupDir(parent.join(&name));
    let expected_path = format!("/{name}");

    std::fs::create_dir(&dir.0).expect("mkdir cgroup");
    let mkdir = wait_for(&mut rx, CgroupEventKind::Mkdir, &expected_path).await;
    assert_eq!(mkdir.level, 1);
    assert!(mkdir.ktime_ns > 0);

    std::fs::remove_dir(&dir.0).expect("rmdir cgroup");
    let rmdir = wait_for(&mut rx, CgroupEventKind::Rmdir, &expected_path).await;
    assert_eq!(rmdir.cgroup_id, mkdir.cgroup_id, "same cgroup");
    assert_eq!(rmdir.hierarchy_id, mkdir.hierarchy_id);
    assert!(rmdir.ktime_ns >= mkdir.ktime_ns);

    let recent = monitor.recent_cgroup_events();
    assert!(recent.contains(&mkdir) && recent.contains(&rmdir));
    assert!(monitor.events_seen() >= 2);
    assert_eq!(monitor.events_lost(), 0);
    cancel.cancel();
}

/// With a cgroup prefix the probes report the cgroups below it and nothing of the rest of the
/// host: a cgroup made beside the prefix (whose path is the prefix but its last byte) reaches the
/// agent as no record and no wake-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cgroup_probes_report_only_cgroups_below_the_prefix() {
    if !have_root("the_cgroup_probes_report_only_cgroups_below_the_prefix") {
        return;
    }
    let parent = cgroup_parent();
    let top = unique_name("swiftlet-ebpf-prefix");
    let prefix = format!("/{top}/kubepods");
    let cancel = CancellationToken::new();
    let monitor = Monitor::start(
        Mode::On,
        Config {
            cgroup_prefix: Some(prefix.clone()),
            ..Config::default()
        },
        cancel.clone(),
    )
    .expect("probes load as root")
    .expect("Mode::On returns a monitor");
    let mut rx = monitor.subscribe();
    // Removed in reverse order on drop.
    let top_dir = CgroupDir(parent.join(&top));
    std::fs::create_dir(&top_dir.0).expect("mkdir cgroup");
    let outside = CgroupDir(parent.join(&top).join("kubepod"));
    let root = CgroupDir(parent.join(&prefix[1..]));
    std::fs::create_dir(&root.0).expect("mkdir cgroup");
    // The prefix's own mkdir is reported: counted before the baseline is taken.
    wait_for(&mut rx, CgroupEventKind::Mkdir, &prefix).await;
    tokio::time::sleep(GATHER * 2).await;
    let inside = CgroupDir(root.0.join("podu1"));
    let before = (monitor.events_seen(), monitor.reader_wakeups());
    for _ in 0..20 {
        std::fs::create_dir(&outside.0).expect("mkdir cgroup");
        std::fs::remove_dir(&outside.0).expect("rmdir cgroup");
    }
    tokio::time::sleep(GATHER * 5).await;
    let after = (monitor.events_seen(), monitor.reader_wakeups());
    std::fs::create_dir(&inside.0).expect("mkdir cgroup");
    wait_for(&mut rx, CgroupEventKind::Mkdir, &format!("{prefix}/podu1")).await;
    let seen: Vec<String> = monitor
        .recent_cgroup_events()
        .into_iter()
        .map(|e| e.path)
        .filter(|p| p.starts_with(&format!("/{top}")))
        .collect();
    cancel.cancel();
    assert_eq!(
        seen,
        [prefix.clone(), format!("{prefix}/podu1")],
        "only the cgroups below the prefix are reported"
    );
    // Other tests' cgroups outside the prefix are filtered too: nothing arrived meanwhile.
    assert_eq!(
        after, before,
        "(events, wake-ups) for 40 cgroups outside the prefix"
    );
    drop((inside, root, outside, top_dir));
}

/// Probes loaded with the default configuration, or `None` (the test skips) without root.
fn default_monitor(test: &str) -> Option<(Monitor, CancellationToken)> {
    if !have_root(test) {
        return None;
    }
    let cancel = CancellationToken::new();
    let monitor = Monitor::start(Mode::On, Config::default(), cancel.clone())
        .expect("probes load as root")
        .expect("Mode::On returns a monitor");
    Some((monitor, cancel))
}

/// An idle reader sleeps: it drains only after the kernel woke it for records and for as long as
/// they keep coming, never on a short timer (a reader polling every `GATHER` would drain ~100
/// times a second, nearly always for nothing). Cgroups and processes of tests running alongside
/// may wake it; each such burst ends with one drain that finds nothing (that is how the reader
/// knows the burst is over), so empty drains cannot outnumber the drains that found records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_reader_is_not_woken_for_nothing() {
    let Some((monitor, cancel)) = default_monitor("an_idle_reader_is_not_woken_for_nothing") else {
        return;
    };
    let (drains_before, empty_before) = monitor.reader_drains();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (drains, empty) = monitor.reader_drains();
    cancel.cancel();
    let (drains, empty) = (drains - drains_before, empty - empty_before);
    // One more: a record committed while a drain runs can leave a wake-up for an already
    // drained ring (rare).
    assert!(
        empty <= drains - empty + 1,
        "{empty} of {drains} drains in 1 s found nothing"
    );
}

/// A burst of records costs one wake-up, not one per record: the reader polls while records
/// keep coming (the probes see its flag and send none), and once it is asleep again the next
/// record still wakes it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_polling_reader_is_not_woken_and_a_sleeping_one_is() {
    let Some((monitor, cancel)) =
        default_monitor("a_polling_reader_is_not_woken_and_a_sleeping_one_is")
    else {
        return;
    };
    let mut rx = monitor.subscribe();
    let parent = cgroup_parent();
    let prefix = unique_name("swiftlet-ebpf-poll");
    // Records 2 ms apart for 200 ms: with the kernel's rule alone the reader, which catches up at
    // every drain, would be woken again by the first record after each (about 20 times).
    let wakeups_before = monitor.reader_wakeups();
    for i in 0..100 {
        let dir = CgroupDir(parent.join(format!("{prefix}-{i}")));
        std::fs::create_dir(&dir.0).expect("mkdir cgroup");
        drop(dir);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let last = format!("/{prefix}-99");
    wait_for(&mut rx, CgroupEventKind::Rmdir, &last).await;
    let wakeups = monitor.reader_wakeups() - wakeups_before;
    // One for the burst; records of tests running alongside may add a few between their bursts.
    assert!(wakeups <= 5, "{wakeups} wake-ups for a 200 ms burst");
    // Asleep again (a quiet GATHER ended the polling): the next record wakes the reader.
    tokio::time::sleep(GATHER * 5).await;
    let dir = CgroupDir(parent.join(format!("{prefix}-after")));
    std::fs::create_dir(&dir.0).expect("mkdir cgroup");
    let woke = tokio::time::timeout(
        Duration::from_secs(2),
        wait_for(&mut rx, CgroupEventKind::Mkdir, &format!("/{prefix}-after")),
    )
    .await;
    assert!(
        woke.is_ok(),
        "a record after the reader went to sleep was not delivered within 2 s"
    );
    cancel.cancel();
}

/// Pushes a burst of cgroup creations/removals through the probes and checks none is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_of_cgroups_loses_nothing() {
    if !have_root("burst_of_cgroups_loses_nothing") {
        return;
    }
    const DIRS: usize = 1000;
    let cancel = CancellationToken::new();
    let monitor = Monitor::start(Mode::On, Config::default(), cancel.clone())
        .expect("probes load as root")
        .expect("Mode::On returns a monitor");
    let parent = cgroup_parent();
    let prefix = unique_name("swiftlet-ebpf-burst");
    let before = monitor.events_seen();
    // Kernel-side cost: run-time statistics are on while this fd is open (no timing assertion,
    // just a report).
    let stats = aya::sys::enable_stats(aya::sys::Stats::RunTime);

    let started = Instant::now();
    let parent_for_task = parent.clone();
    let prefix_for_task = prefix.clone();
    tokio::task::spawn_blocking(move || churn(&parent_for_task, &prefix_for_task, DIRS))
        .await
        .expect("churn task");
    let churn_time = started.elapsed();

    let want = before + 2 * u64::try_from(DIRS).expect("small");
    let ours = || {
        monitor
            .recent_cgroup_events()
            .into_iter()
            .filter(|e| e.path.starts_with(&format!("/{prefix}-")))
            .count()
    };
    // Wait for our own events: other processes on the machine make cgroups too, so the seen
    // counter alone can reach `want` before the last of ours is drained.
    let deadline = Instant::now() + Duration::from_secs(10);
    while (monitor.events_seen() < want || ours() < 2 * DIRS) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "burst: {} cgroup events in {churn_time:?} ({:.0} events/s), seen {}, lost {}",
        2 * DIRS,
        (2 * DIRS) as f64 / churn_time.as_secs_f64(),
        monitor.events_seen() - before,
        monitor.events_lost()
    );
    if stats.is_ok() {
        let (mut runs, mut time) = (0u64, Duration::ZERO);
        for info in aya::programs::loaded_programs().flatten() {
            if matches!(
                info.name_as_str(),
                Some("cgroup_mkdir" | "cgroup_rmdir" | "cg_mkdir_raw" | "cg_rmdir_raw")
            ) {
                runs += info.run_count();
                time += info.run_time();
            }
        }
        if let Some(ns) = time.as_nanos().checked_div(u128::from(runs)) {
            eprintln!("burst: probes ran {runs} times, {ns} ns per run on average");
        }
    }
    drop(stats);
    assert!(monitor.events_seen() >= want, "not every event arrived");
    assert_eq!(monitor.events_lost(), 0);
    assert_eq!(
        ours(),
        2 * DIRS,
        "every one of our events is in the recent ring"
    );
    cancel.cancel();
}

fn churn(parent: &Path, prefix: &str, dirs: usize) {
    for i in 0..dirs {
        let dir = CgroupDir(parent.join(format!("{prefix}-{i}")));
        std::fs::create_dir(&dir.0).expect("mkdir cgroup");
        std::fs::remove_dir(&dir.0).expect("rmdir cgroup");
    }
}

/// Waits for the first event on `rx` that `want` accepts.
async fn wait_kernel(
    rx: &mut mpsc::UnboundedReceiver<KernelEvent>,
    what: &str,
    mut want: impl FnMut(&KernelEvent) -> bool,
) -> KernelEvent {
    let found = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match rx.recv().await {
                Some(event) if want(&event) => return event,
                Some(_) => {}
                None => panic!("event sink closed"),
            }
        }
    })
    .await;
    found.unwrap_or_else(|_| panic!("no {what} within 5 s"))
}

/// A process started in a cgroup below the pod root yields an exec event with that cgroup's id
/// and an exit event with its exit code; one outside it yields nothing. The CRI markers called
/// from here yield begin/end events with the method and UID.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sees_pod_process_exec_exit_and_cri_markers() {
    use std::os::unix::fs::MetadataExt as _;
    if !have_root("sees_pod_process_exec_exit_and_cri_markers") {
        return;
    }
    let mount = cgroup2_mount().expect("a cgroup2 hierarchy is mounted");
    let root_name = unique_name("swiftlet-ebpf-proc");
    let pod_root = format!("/{root_name}/kubepods");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let cancel = CancellationToken::new();
    let _monitor = Monitor::start(
        Mode::On,
        Config {
            pod_root: Some(pod_root.clone()),
            cgroup_prefix: Some(pod_root.clone()),
            events: Some(tx),
            cri_markers: true,
            classic_cgroup_tracepoints: false,
        },
        cancel.clone(),
    )
    .expect("probes load as root")
    .expect("Mode::On returns a monitor");
    // Removed in reverse order on drop.
    let top = CgroupDir(mount.join(&root_name));
    let kubepods = CgroupDir(mount.join(&pod_root[1..]));
    let pod = CgroupDir(kubepods.0.join("podtest"));
    let container = CgroupDir(pod.0.join("ctr"));
    std::fs::create_dir_all(&container.0).expect("mkdir container cgroup");
    let container_id = std::fs::metadata(&container.0).expect("stat").ino();

    // Outside the pod root: filtered out in the kernel.
    let status = std::process::Command::new("/bin/sh")
        .args(["-c", "exit 0"])
        .status()
        .expect("run sh");
    assert!(status.success());
    // Inside: join the container cgroup, then exec a shell that exits with 3.
    let procs = container.0.join("cgroup.procs");
    let script = format!("echo $$ > {}; exec /bin/sh -c 'exit 3'", procs.display());
    let status = std::process::Command::new("/bin/sh")
        .args(["-c", &script])
        .status()
        .expect("run sh");
    assert_eq!(status.code(), Some(3));

    let exec = wait_kernel(
        &mut rx,
        "exec in the container cgroup",
        |e| matches!(e, KernelEvent::Exec(p) if p.cgroup_id == container_id),
    )
    .await;
    let exit = wait_kernel(
        &mut rx,
        "exit in the container cgroup",
        |e| matches!(e, KernelEvent::Exit(p) if p.cgroup_id == container_id),
    )
    .await;
    let (KernelEvent::Exec(exec), KernelEvent::Exit(exit)) = (exec, exit) else {
        unreachable!("matched above");
    };
    assert_eq!(exec.tgid, exit.tgid, "the same process");
    assert_eq!(exit.exit_code, Some(3));
    assert!(exit.ktime_ns >= exec.ktime_ns);

    // Three pairs: from the second hit on, a kernel that optimises uprobes on a five-byte
    // no-op enters through its trampoline instead of a trap, and the arguments must still
    // arrive whole.
    let uid = "0b5f1c6e-1111-2222-3333-444455556666";
    for (method_name, ok) in [
        ("StartContainer", true),
        ("CreateContainer", false),
        ("StopContainer", true),
    ] {
        let method = common::cri_method_index(method_name);
        crate::cri::swiftlet_cri_call_begin(method, uid.as_ptr(), uid.len());
        crate::cri::swiftlet_cri_call_end(method, uid.as_ptr(), uid.len(), u32::from(ok));
        let begin = wait_kernel(
            &mut rx,
            "CRI begin marker",
            |e| matches!(e, KernelEvent::Cri(m) if m.uid == uid && m.ok.is_none()),
        )
        .await;
        let end = wait_kernel(
            &mut rx,
            "CRI end marker",
            |e| matches!(e, KernelEvent::Cri(m) if m.uid == uid && m.ok.is_some()),
        )
        .await;
        let (KernelEvent::Cri(begin), KernelEvent::Cri(end)) = (begin, end) else {
            unreachable!("matched above");
        };
        assert_eq!((begin.method, end.method), (method_name, method_name));
        assert_eq!(end.ok, Some(ok));
        assert!(end.ktime_ns >= begin.ktime_ns);
    }

    cancel.cancel();
    drop((container, pod, kubepods, top));
}

#[test]
fn exit_codes_follow_the_container_convention() {
    assert_eq!(exit_code(3 << 8), Some(3));
    assert_eq!(exit_code(0), Some(0));
    assert_eq!(exit_code(9), Some(137), "SIGKILL");
    assert_eq!(exit_code(15 | 0x80), Some(143), "SIGTERM with a core flag");
    assert_eq!(exit_code(common::EXIT_CODE_UNKNOWN), None);
}

#[test]
fn finds_the_cgroup2_mount() {
    let hybrid = "25 30 0:22 / /sys/fs/cgroup ro - tmpfs tmpfs ro,mode=755\n\
                  26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n\
                  27 25 0:24 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory";
    assert_eq!(
        cgroup2_mount_in(hybrid),
        Some(PathBuf::from("/sys/fs/cgroup/unified"))
    );
    assert_eq!(
        cgroup2_mount_in("27 25 0:24 / /x rw - cgroup cgroup rw"),
        None
    );
}
