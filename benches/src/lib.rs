//! Benches live in `benches/`. This library holds what several of them measure the same way.

pub mod link;

/// A runtime manager as a bench drives it outside an agent: `cfg` with the agent's other
/// managers at their defaults (no probe results, no API objects, no pull limit, volumes under
/// `cfg.pods_dir`).
pub fn runtime_manager(
    cri: &swiftlet::cri::Cri,
    cm: swiftlet::cm::ContainerManager,
    cfg: swiftlet::runtime::Config,
) -> swiftlet::runtime::Manager {
    swiftlet::runtime::Manager::new(swiftlet::runtime::Deps {
        cri: cri.clone(),
        cm,
        images: swiftlet::images::Images::new(
            cri.clone(),
            Default::default(),
            Default::default(),
            None,
        ),
        volumes: swiftlet::volume::Manager::new(
            cfg.pods_dir.clone(),
            8 << 30,
            Default::default(),
            tokio::sync::watch::channel(Default::default()).1,
        ),
        cfg,
        probes: Default::default(),
        api_objects: Default::default(),
        pod_cache: Default::default(),
    })
}

/// A process's resident set size in KiB (`VmRSS` of `/proc/<pid>/status`).
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// A process's CPU time so far (all its threads, those that have exited included), in
/// milliseconds with nanosecond precision: the process's CPU-time clock
/// (`clock_getcpuclockid`), which the kernel keeps exactly. `/proc/<pid>/stat` gives the same
/// time in clock ticks of 10 ms, too coarse for a batch that costs the agent a few ticks.
pub fn cpu_ms(pid: u32) -> Option<f64> {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: `clock` is a valid out-pointer; the call only writes it.
    if unsafe { libc::clock_getcpuclockid(pid as libc::pid_t, &mut clock) } != 0 {
        return None;
    }
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; the call only writes it.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return None;
    }
    Some(ts.tv_sec as f64 * 1e3 + ts.tv_nsec as f64 / 1e6)
}

/// The CPU time (ms, see [`cpu_ms`]) process `pid` spends while this thread sleeps `window`.
pub fn cpu_ms_over(pid: u32, window: std::time::Duration) -> Option<f64> {
    let t0 = cpu_ms(pid)?;
    std::thread::sleep(window);
    Some((cpu_ms(pid)? - t0).max(0.0))
}

/// Clock ticks per second (`_SC_CLK_TCK`), the unit of [`system_busy_ticks`].
pub fn ticks_per_sec() -> f64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// CPU time the whole machine spent busy so far (every CPU's user, nice, system, irq, softirq
/// and steal from the `cpu` line of `/proc/stat`), in clock ticks.
pub fn system_busy_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    // user nice system idle iowait irq softirq steal ...
    Some([0, 1, 2, 5, 6, 7].iter().filter_map(|&i| f.get(i)).sum())
}

/// How long the process's threads have waited on a run queue so far (runnable, not running), in
/// nanoseconds: the second field of `/proc/<pid>/task/<tid>/schedstat`, summed over its threads
/// alive now.
pub fn run_queue_wait_ns(pid: u32) -> Option<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut total = 0;
    for t in tasks.flatten() {
        let Ok(s) = std::fs::read_to_string(t.path().join("schedstat")) else {
            continue;
        };
        total += s
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Some(total)
}

/// Confines every thread of process `pid` to the CPUs in `cpus` (`sched_setaffinity` on each task
/// in `/proc/<pid>/task`; threads and children created later inherit it). Returns how many
/// threads were moved.
pub fn set_affinity(pid: u32, cpus: &[usize]) -> std::io::Result<usize> {
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        // SAFETY: CPU_SET only writes inside `set` (it ignores CPUs beyond the set's size).
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    let mut moved = 0;
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let Some(tid) = t?.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        // SAFETY: `set` is a valid cpu_set_t of the size passed.
        let r = unsafe { libc::sched_setaffinity(tid, std::mem::size_of_val(&set), &set) };
        if r == 0 {
            moved += 1;
        } else {
            let e = std::io::Error::last_os_error();
            // A thread that exited meanwhile is not an error.
            if e.raw_os_error() != Some(libc::ESRCH) {
                return Err(e);
            }
        }
    }
    Ok(moved)
}

/// The CPUs process (or thread) `pid` may run on (`sched_getaffinity`), in ascending order.
pub fn affinity(pid: u32) -> std::io::Result<Vec<usize>> {
    let tid =
        i32::try_from(pid).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable cpu_set_t of the size passed.
    let r = unsafe { libc::sched_getaffinity(tid, std::mem::size_of_val(&set), &mut set) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let bits = 8 * std::mem::size_of_val(&set);
    // SAFETY: CPU_ISSET only reads inside `set`, and every index is below its size in bits.
    Ok((0..bits)
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect())
}

/// The cumulative buckets (upper bound in seconds, count) of histogram `name` in a Prometheus
/// text exposition, in order, and its sample count.
pub fn histogram_buckets(metrics: &str, name: &str) -> (Vec<(f64, u64)>, u64) {
    let prefix = format!("{name}_bucket{{le=\"");
    let mut buckets = Vec::new();
    let mut count = 0;
    for line in metrics.lines() {
        if let Some(rest) = line.strip_prefix(&prefix)
            && let Some((le, n)) = rest.split_once("\"} ")
        {
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().unwrap_or(f64::NAN)
            };
            buckets.push((le, n.trim().parse().unwrap_or(0)));
        } else if let Some(n) = line.strip_prefix(&format!("{name}_count ")) {
            count = n.trim().parse().unwrap_or(0);
        }
    }
    (buckets, count)
}

/// The upper bound of the bucket holding quantile `q` of a histogram's cumulative `buckets`
/// (a quantile is at most this), or `None` without samples.
pub fn bucket_quantile(buckets: &[(f64, u64)], count: u64, q: f64) -> Option<f64> {
    if count == 0 {
        return None;
    }
    let rank = (count as f64 * q).ceil() as u64;
    buckets.iter().find(|(_, n)| *n >= rank).map(|(le, _)| *le)
}

/// The comma-separated numbers `value` of option `flag` (e.g. `--pods 1,10,50`).
pub fn number_list(flag: &str, value: &str) -> Result<Vec<usize>, String> {
    value
        .split(',')
        .map(|n| {
            n.trim()
                .parse()
                .map_err(|_| format!("{flag}: bad number {n:?}"))
        })
        .collect()
}

/// Reads `--<name> N` options (positive counts) from the bench's arguments into `counts`,
/// leaving the defaults for the ones not given and ignoring other arguments (cargo's own).
/// `Err` with the exit code to end with (after saying why on stderr) for a value that is not a
/// positive number.
pub fn count_args(
    bench: &str,
    counts: &mut [(&str, &mut usize)],
) -> Result<(), std::process::ExitCode> {
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let Some((_, target)) = counts
            .iter_mut()
            .find(|(flag, _)| a.strip_prefix("--") == Some(*flag))
        else {
            continue;
        };
        match args.next().and_then(|v| v.parse().ok()) {
            Some(n) if n > 0 => **target = n,
            _ => {
                eprintln!("{bench}: {a} needs a positive number");
                return Err(std::process::ExitCode::from(2));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn affinity_reads_back_what_set_affinity_wrote() {
        let me = std::process::id();
        let before = affinity(me).expect("own affinity");
        // SAFETY: sched_getcpu takes no arguments and only returns a number.
        let now = unsafe { libc::sched_getcpu() };
        let now = usize::try_from(now).expect("sched_getcpu");
        assert!(
            before.contains(&now),
            "{before:?} lacks the CPU we run on ({now})"
        );
        let only = [before[before.len() - 1]];
        set_affinity(me, &only).expect("pin");
        let pinned = affinity(me);
        set_affinity(me, &before).expect("restore");
        assert_eq!(pinned.expect("pinned affinity"), only);
        assert_eq!(affinity(me).expect("restored affinity"), before);
    }

    #[test]
    fn histogram_quantiles_come_from_the_buckets() {
        let text = "x_bucket{le=\"0.001\"} 90\nx_bucket{le=\"0.002\"} 99\nx_bucket{le=\"0.004\"} 100\n\
                    x_bucket{le=\"+Inf\"} 100\nx_count 100\nx_sum 0.1\n";
        let (b, n) = histogram_buckets(text, "x");
        assert_eq!(n, 100);
        assert_eq!(b.len(), 4);
        assert_eq!(bucket_quantile(&b, n, 0.5), Some(0.001));
        assert_eq!(bucket_quantile(&b, n, 0.99), Some(0.002));
        assert_eq!(bucket_quantile(&b, n, 1.0), Some(0.004));
        assert_eq!(bucket_quantile(&b, 0, 0.5), None);
    }
}
