//! Cost of swiftlet's eBPF probes per kernel event, measured as the issue asks: the same work with
//! the probes off, then on, side by side in one process (the difference is the probes' cost, all
//! in: tracepoint dispatch, the program, the ring buffer; the reader's draining is on another
//! thread). Needs root; without it the bench says so and measures nothing.
//!
//! - `cgroup/mkdir_rmdir`: one cgroup2 directory created and removed = 2 cgroup events.
//! - `process/spawn_outside_pods`: fork + exec + exit of `/bin/true` outside the pod root: the
//!   exec/exit probes fire and filter it out in the kernel.
//! - `process/spawn_in_pod`: the same inside a cgroup below the pod root: exec + exit reported.
//! - `cri/marker_pair`: `swiftlet_cri_call_begin` + `swiftlet_cri_call_end` (two uprobes).
//!
//! Between "off" and "on", a `baseline` round: the same work with programs that do nothing
//! attached at the same points, so that the kernel's per-program run time of an empty program
//! (the machine's floor for any program there) is printed beside the probes' own; and, on the
//! CRI markers, programs that each do one part of a probe's work (read the clock; reserve and
//! submit a record; the same with a wake-up of the reader), so the parts' costs can be read off
//! against the empty program's.
//!
//! `cargo bench -p swiftlet-benches --bench ebpf -- --warm-up-time 1 --measurement-time 5`
use criterion::{Criterion, criterion_group, criterion_main};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use swiftlet::ebpf::{Config, Mode, Monitor};
use tokio_util::sync::CancellationToken;

fn cgroup2() -> Option<PathBuf> {
    ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .into_iter()
        .map(PathBuf::from)
        .find(|d| d.join("cgroup.procs").is_file() && !d.join("memory.limit_in_bytes").exists())
}

fn mkdir_rmdir(dir: &Path) {
    if std::fs::create_dir(dir).is_ok() {
        let _ = std::fs::remove_dir(dir);
    }
}

fn spawn_true(cgroup_procs: Option<&Path>) {
    let mut cmd = Command::new("/bin/true");
    if let Some(procs) = cgroup_procs {
        let procs = procs.to_path_buf();
        // SAFETY: the closure only writes to a file (async-signal-safe enough for a bench; the
        // child is single-threaded between fork and exec).
        unsafe {
            cmd.pre_exec(move || std::fs::write(&procs, b"0"));
        }
    }
    let _ = cmd.status();
}

fn marker_pair() {
    let uid = "0b5f1c6e-1111-2222-3333-444455556666";
    swiftlet::cri::swiftlet_cri_call_begin(7, uid.as_ptr(), uid.len());
    swiftlet::cri::swiftlet_cri_call_end(7, uid.as_ptr(), uid.len(), 1);
}

fn bench(c: &mut Criterion) {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED ebpf bench: loading eBPF probes needs root");
        return;
    }
    let Some(mount) = cgroup2() else {
        eprintln!("SKIPPED ebpf bench: no cgroup2 hierarchy");
        return;
    };
    let top_name = format!("swiftlet-bench-{}", std::process::id());
    let top = mount.join(&top_name);
    let pod = top.join("kubepods/podbench/ctr");
    if let Err(e) = std::fs::create_dir_all(&pod) {
        eprintln!("SKIPPED ebpf bench: creating {}: {e}", pod.display());
        return;
    }
    let scratch = top.join("scratch");
    let procs = pod.join("cgroup.procs");

    let run = |c: &mut Criterion, state: &str| {
        let mut g = c.benchmark_group(format!("ebpf_{state}"));
        g.bench_function("cgroup/mkdir_rmdir", |b| b.iter(|| mkdir_rmdir(&scratch)));
        g.bench_function("process/spawn_outside_pods", |b| {
            b.iter(|| spawn_true(None))
        });
        g.bench_function("process/spawn_in_pod", |b| {
            b.iter(|| spawn_true(Some(&procs)))
        });
        g.bench_function("cri/marker_pair", |b| b.iter(marker_pair));
        g.finish();
    };

    run(c, "off");
    // Before anything attaches a tracepoint: aya looks for tracefs once per process and
    // remembers a miss, and a fresh machine may not have it mounted yet.
    if let Err(e) = swiftlet::ebpf::tracefs::ensure_mounted() {
        eprintln!("ebpf bench: tracefs: {e}");
    }
    baseline(c, &run);

    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("SKIPPED ebpf bench: tokio runtime: {e}");
            return;
        }
    };
    for (state, classic) in [("on_classic", true), ("on", false)] {
        let before: Vec<u32> = aya::programs::loaded_programs()
            .flatten()
            .map(|p| p.id())
            .collect();
        let cancel = CancellationToken::new();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let started = rt.block_on(async {
            Monitor::start(
                Mode::On,
                Config {
                    pod_root: Some(format!("/{top_name}/kubepods")),
                    // Every cgroup, as the probes were measured before they filtered.
                    cgroup_prefix: None,
                    events: Some(tx),
                    cri_markers: true,
                    classic_cgroup_tracepoints: classic,
                },
                cancel.clone(),
            )
        });
        let monitor = match started {
            Ok(Some(m)) => m,
            other => {
                eprintln!("SKIPPED the probes-{state} half: {other:?}");
                continue;
            }
        };
        // Drain the sink so the channel does not grow.
        rt.spawn(async move { while rx.recv().await.is_some() {} });
        // In-kernel run time of each of our programs (the ones loaded since `before`).
        let stats = aya::sys::enable_stats(aya::sys::Stats::RunTime);
        run(c, state);
        if stats.is_ok() {
            for info in aya::programs::loaded_programs().flatten() {
                if before.contains(&info.id()) || info.run_count() == 0 {
                    continue;
                }
                eprintln!(
                    "ebpf bench ({state}): program {:<14} {:>9} runs, {:>6} ns a run in the kernel",
                    info.name_as_str().unwrap_or("?"),
                    info.run_count(),
                    info.run_time().as_nanos() / u128::from(info.run_count())
                );
            }
        }
        drop(stats);
        eprintln!(
            "ebpf bench ({state}): events seen {}, lost {}, reader woken {} times",
            monitor.events_seen(),
            monitor.events_lost(),
            monitor.reader_wakeups()
        );
        cancel.cancel();
        // Let the reader task drop the object (detaching the probes) before the next round.
        rt.block_on(async { tokio::time::sleep(std::time::Duration::from_millis(200)).await });
    }
    drop(rt);
    for dir in [
        pod.clone(),
        top.join("kubepods/podbench"),
        top.join("kubepods"),
        top,
    ] {
        let _ = std::fs::remove_dir(dir);
    }
}

/// The same work with programs that do nothing (`noop_*` in the probe object) attached where the
/// probes attach, one loaded copy of the object per attach point so that each program's
/// counters are one point's: what the kernel charges for running any program there, the floor
/// under the probes' own time.
fn baseline(c: &mut Criterion, run: &dyn Fn(&mut Criterion, &str)) {
    let Some(object) = swiftlet::ebpf::probe_object() else {
        eprintln!("SKIPPED the baseline: this build carries no probe object");
        return;
    };
    let load = || aya::EbpfLoader::new().load(object);
    let attached = (|| -> Result<Vec<(&str, aya::Ebpf)>, Box<dyn std::error::Error>> {
        let mut out = Vec::new();
        for (label, category, points) in [
            (
                "cgroup (classic)",
                "cgroup",
                ["cgroup_mkdir", "cgroup_rmdir"],
            ),
            (
                "exec/exit",
                "sched",
                ["sched_process_exec", "sched_process_exit"],
            ),
        ] {
            let mut ebpf = load()?;
            swiftlet::ebpf::attach_tracepoint(&mut ebpf, "noop_tp", category, &points)?;
            out.push((label, ebpf));
        }
        let mut ebpf = load()?;
        swiftlet::ebpf::attach_raw_tracepoint(
            &mut ebpf,
            "noop_raw",
            &["cgroup_mkdir", "cgroup_rmdir"],
        )?;
        out.push(("cgroup (raw)", ebpf));
        let mut ebpf = load()?;
        swiftlet::ebpf::attach_uprobe(
            &mut ebpf,
            "noop_uprobe",
            &["swiftlet_cri_call_begin", "swiftlet_cri_call_end"],
            std::path::Path::new("/proc/self/exe"),
        )?;
        out.push(("CRI markers (uprobe)", ebpf));
        // The parts of a probe, one per loaded copy (each copy has its own ring buffer).
        for (name, label) in [
            ("cost_clock", "markers: clock read"),
            ("cost_record", "markers: record"),
            ("cost_wakeup", "markers: record+wake"),
        ] {
            let mut ebpf = load()?;
            swiftlet::ebpf::attach_uprobe(
                &mut ebpf,
                name,
                &["swiftlet_cri_call_begin", "swiftlet_cri_call_end"],
                std::path::Path::new("/proc/self/exe"),
            )?;
            out.push((label, ebpf));
        }
        Ok(out)
    })();
    let mut attached = match attached {
        Ok(a) => a,
        Err(e) => {
            eprintln!("SKIPPED the baseline: attaching the no-op programs: {e}");
            return;
        }
    };
    // Keep the rings of the part programs that write records drained (a full ring would make
    // their reservations fail early and cheaply): one thread polling them, so the wake-ups
    // `cost_wakeup` sends wake no one and the other rounds' work is not shared with more threads.
    let rings: Vec<_> = attached
        .iter_mut()
        .filter(|(label, _)| label.starts_with("markers: record"))
        .filter_map(|(_, ebpf)| ebpf.take_map("EVENTS"))
        .filter_map(|map| aya::maps::RingBuf::try_from(map).ok())
        .collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let drain = {
        let stop = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut rings = rings;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for ring in &mut rings {
                    while ring.next().is_some() {}
                }
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        })
    };
    let stats = aya::sys::enable_stats(aya::sys::Stats::RunTime);
    run(c, "baseline");
    if stats.is_ok() {
        for (label, ebpf) in &attached {
            for (name, program) in ebpf.programs() {
                let Ok(info) = program.info() else {
                    continue;
                };
                if info.run_count() == 0 {
                    continue;
                }
                eprintln!(
                    "ebpf bench (baseline): {name:<12} on {label:<21} {:>9} runs, {:>6} ns a run in the kernel",
                    info.run_count(),
                    info.run_time().as_nanos() / u128::from(info.run_count())
                );
            }
        }
    }
    drop(stats);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = drain.join();
}

criterion_group!(benches, bench);
criterion_main!(benches);
