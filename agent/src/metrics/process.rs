//! The `process_*` metrics every Prometheus client library exports for its process, read from
//! `/proc/self` when `/metrics` is served: CPU seconds, resident and virtual memory, open and
//! most file descriptors, and the start time.
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// The machine's boot time, seconds since the epoch (`btime` of `/proc/stat`).
pub fn boot_time_seconds() -> Option<i64> {
    static BOOT: std::sync::OnceLock<Option<i64>> = std::sync::OnceLock::new();
    *BOOT.get_or_init(|| {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        stat.lines()
            .find_map(|l| l.strip_prefix("btime "))?
            .trim()
            .parse()
            .ok()
    })
}

/// What `/proc/self/stat` says of the process.
#[derive(Debug, PartialEq)]
struct Stat {
    /// User and system time, in clock ticks.
    cpu_ticks: u64,
    /// Start, in clock ticks after boot.
    start_ticks: u64,
    virtual_bytes: u64,
    resident_pages: u64,
}

/// Parses `/proc/<pid>/stat`: the fields after the command name's closing parenthesis (which
/// may itself hold spaces and parentheses).
fn parse_stat(text: &str) -> Option<Stat> {
    let (_, rest) = text.rsplit_once(')')?;
    // rest starts with the state, field 3 of proc(5); field n is at index n - 3.
    let f: Vec<&str> = rest.split_whitespace().collect();
    let num = |n: usize| f.get(n - 3)?.parse::<u64>().ok();
    Some(Stat {
        cpu_ticks: num(14)? + num(15)?,
        start_ticks: num(22)?,
        virtual_bytes: num(23)?,
        resident_pages: num(24)?,
    })
}

/// The collector registered in the agent's registry.
#[derive(Debug)]
pub struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(stat) = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|t| parse_stat(&t))
        else {
            return Ok(());
        };
        let ticks = rustix::param::clock_ticks_per_second() as f64;
        let page = rustix::param::page_size() as u64;
        let mut counter = |name: &str, help: &str, v: f64| -> Result<(), std::fmt::Error> {
            let c = ConstCounter::new(v);
            c.encode(encoder.encode_descriptor(name, help, None, c.metric_type())?)
        };
        counter(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            stat.cpu_ticks as f64 / ticks,
        )?;
        let mut gauge = |name: &str, help: &str, v: f64| -> Result<(), std::fmt::Error> {
            let g = ConstGauge::new(v);
            g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)
        };
        gauge(
            "process_resident_memory_bytes",
            "Resident memory size in bytes",
            (stat.resident_pages * page) as f64,
        )?;
        gauge(
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes",
            stat.virtual_bytes as f64,
        )?;
        if let Some(boot) = boot_time_seconds() {
            gauge(
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                boot as f64 + stat.start_ticks as f64 / ticks,
            )?;
        }
        if let Some(fds) = open_fds() {
            gauge(
                "process_open_fds",
                "Number of open file descriptors",
                fds as f64,
            )?;
        }
        if let Some(max) = rustix::process::getrlimit(rustix::process::Resource::Nofile).current {
            gauge(
                "process_max_fds",
                "Maximum number of open file descriptors",
                max as f64,
            )?;
        }
        Ok(())
    }
}

/// How many file descriptors this process has open. Linux gives the count as the size of
/// `/proc/self/fd` (since 6.2); listing the directory instead costs a directory entry per file,
/// and the agent keeps thousands of cgroup files open at a full node (a scrape of `/metrics`
/// spent 3 ms on that listing at 250 pods). Older kernels report size 0, and are listed.
fn open_fds() -> Option<u64> {
    match std::fs::metadata("/proc/self/fd") {
        Ok(m) if m.len() > 0 => Some(m.len()),
        _ => Some(std::fs::read_dir("/proc/self/fd").ok()?.count() as u64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_read_after_a_command_name_with_spaces_and_parentheses() {
        let text = "4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 900 0 0 0 \
                    150 70 0 0 20 0 12 0 123456 98765432 2048 18446744073709551615";
        assert_eq!(
            parse_stat(text),
            Some(Stat {
                cpu_ticks: 220,
                start_ticks: 123456,
                virtual_bytes: 98765432,
                resident_pages: 2048,
            })
        );
        assert_eq!(parse_stat("4242 (truncated) S 1"), None);
    }

    #[test]
    fn open_files_are_counted() {
        let before = open_fds().unwrap();
        let files: Vec<std::fs::File> = (0..64)
            .map(|_| std::fs::File::open("/proc/self/stat").unwrap())
            .collect();
        let during = open_fds().unwrap();
        // Other tests' threads open and close files meanwhile: a margin, not an exact count.
        assert!(during >= before + 56, "{before} then {during}");
        drop(files);
        assert!(open_fds().unwrap() + 56 <= during, "the 64 closed");
    }

    #[test]
    fn the_process_metrics_are_read_from_this_process() {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(ProcessCollector));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let value = |name: &str| -> f64 {
            let line = text
                .lines()
                .find(|l| l.starts_with(&format!("{name} ")))
                .unwrap_or_else(|| panic!("no {name} in:\n{text}"));
            line.rsplit(' ').next().unwrap().parse().unwrap()
        };
        assert!(value("process_resident_memory_bytes") > 1e6, "{text}");
        assert!(value("process_open_fds") >= 3.0, "{text}");
        let start = value("process_start_time_seconds");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(
            start <= now + 1.0 && start > now - 86_400.0 * 365.0,
            "{text}"
        );
        assert!(value("process_cpu_seconds_total") >= 0.0, "{text}");
    }
}
