//! A summary as Prometheus text: `/metrics/resource` (what metrics-server scrapes) and
//! `/metrics/cadvisor` (what the dashboards and alerts written for the kubelet read of each
//! container), each sample with the time it was read. Both come from the summary's cgroup reads:
//! there is no second collector.
use super::{ContainerStats, CpuStats, MemoryStats, NetworkStats, NodeStats, PodStats, Summary};
use std::fmt::Write;

/// Milliseconds since the epoch of an RFC 3339 time (the samples' timestamps). A summary's
/// readings mostly share one time, so the last one parsed is kept: a page of 300 subjects
/// parsed the same string about 2,000 times.
fn millis(time: &str) -> Option<i64> {
    thread_local! {
        static LAST: std::cell::RefCell<(String, Option<i64>)> =
            const { std::cell::RefCell::new((String::new(), None)) };
    }
    LAST.with_borrow_mut(|(text, ms)| {
        if text != time {
            *ms = time
                .parse::<jiff::Timestamp>()
                .ok()
                .map(|t| t.as_millisecond());
            text.clear();
            text.push_str(time);
        }
        *ms
    })
}

/// One sample: its value and when it was read (ms since the epoch).
type Sample = Option<(f64, Option<i64>)>;

/// A family's name and help, and which field of a reading it shows.
type Field<T> = (&'static str, &'static str, fn(&T) -> u64);

/// Escapes a label value of the Prometheus text format.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Text of the Prometheus format, a family at a time.
#[derive(Default)]
struct Families(String);

impl Families {
    /// A family: its help and type, then each sample (`labels` written as `{...}` or empty).
    fn family<L: AsRef<str>>(
        &mut self,
        name: &str,
        kind: &str,
        help: &str,
        samples: impl IntoIterator<Item = (L, f64, Option<i64>)>,
    ) {
        let out = &mut self.0;
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, v, at) in samples {
            let labels = labels.as_ref();
            let _ = match at {
                Some(ms) => writeln!(out, "{name}{labels} {v} {ms}"),
                None => writeln!(out, "{name}{labels} {v}"),
            };
        }
    }
}

fn cpu_seconds(c: &Option<CpuStats>) -> Sample {
    c.as_ref()
        .and_then(|c| Some((c.usage_core_nano_seconds? as f64 / 1e9, millis(&c.time))))
}

fn memory(m: &Option<MemoryStats>, f: fn(&MemoryStats) -> u64) -> Sample {
    m.as_ref().map(|m| (f(m) as f64, millis(&m.time)))
}

fn pod_labels(p: &PodStats) -> String {
    format!(
        "namespace=\"{}\",pod=\"{}\"",
        label(&p.pod_ref.namespace),
        label(&p.pod_ref.name)
    )
}

/// What a cAdvisor series describes: a container, a pod's cgroup or the node's root cgroup.
enum Subject<'a> {
    Container(&'a PodStats, &'a ContainerStats),
    Pod(&'a PodStats),
    Root(&'a NodeStats),
}

impl<'a> Subject<'a> {
    fn cpu(&self) -> &'a Option<CpuStats> {
        match self {
            Subject::Container(_, c) => &c.cpu,
            Subject::Pod(p) => &p.usage.cpu,
            Subject::Root(n) => &n.usage.cpu,
        }
    }

    fn memory(&self) -> &'a Option<MemoryStats> {
        match self {
            Subject::Container(_, c) => &c.memory,
            Subject::Pod(p) => &p.usage.memory,
            Subject::Root(n) => &n.usage.memory,
        }
    }

    /// cAdvisor's labels: `container`, `id` (the cgroup), `image`, `name` (the runtime's
    /// container), `namespace` and `pod`; a pod's cgroup has no container, image or name, the
    /// root only its `id`.
    fn labels(&self) -> String {
        match self {
            Subject::Container(p, c) => {
                let r = c.runtime.clone().unwrap_or_default();
                format!(
                    "{{container=\"{}\",id=\"{}\",image=\"{}\",name=\"{}\",{}}}",
                    label(&c.name),
                    label(&r.cgroup),
                    label(&r.image),
                    label(&r.id),
                    pod_labels(p)
                )
            }
            Subject::Pod(p) => format!(
                "{{container=\"\",id=\"{}\",image=\"\",name=\"\",{}}}",
                label(p.cgroup.as_deref().unwrap_or_default()),
                pod_labels(p)
            ),
            Subject::Root(_) => "{id=\"/\"}".to_owned(),
        }
    }
}

impl Summary {
    /// `/metrics/resource`: the kubelet's resource metrics.
    pub fn resource_metrics(&self) -> String {
        let mut out = Families::default();
        let containers = |f: &dyn Fn(&ContainerStats) -> Sample| {
            self.pods
                .iter()
                .flat_map(|p| {
                    p.containers.iter().filter_map(move |c| {
                        let (v, at) = f(c)?;
                        Some((
                            format!("{{container=\"{}\",{}}}", label(&c.name), pod_labels(p)),
                            v,
                            at,
                        ))
                    })
                })
                .collect::<Vec<_>>()
        };
        out.family(
            "container_cpu_usage_seconds_total",
            "counter",
            "Cumulative cpu time consumed by the container in core-seconds",
            containers(&|c| cpu_seconds(&c.cpu)),
        );
        out.family(
            "container_memory_working_set_bytes",
            "gauge",
            "Current working set of the container in bytes",
            containers(&|c| memory(&c.memory, |m| m.working_set_bytes)),
        );
        let pods = |f: &dyn Fn(&PodStats) -> Sample| {
            self.pods
                .iter()
                .filter_map(|p| {
                    let (v, at) = f(p)?;
                    Some((format!("{{{}}}", pod_labels(p)), v, at))
                })
                .collect::<Vec<_>>()
        };
        out.family(
            "pod_cpu_usage_seconds_total",
            "counter",
            "Cumulative cpu time consumed by the pod in core-seconds",
            pods(&|p| cpu_seconds(&p.usage.cpu)),
        );
        out.family(
            "pod_memory_working_set_bytes",
            "gauge",
            "Current working set of the pod in bytes",
            pods(&|p| memory(&p.usage.memory, |m| m.working_set_bytes)),
        );
        let node = |v: Sample| v.map(|(v, at)| (String::new(), v, at));
        out.family(
            "node_cpu_usage_seconds_total",
            "counter",
            "Cumulative cpu time consumed by the node in core-seconds",
            node(cpu_seconds(&self.node.usage.cpu)),
        );
        out.family(
            "node_memory_working_set_bytes",
            "gauge",
            "Current working set of the node in bytes",
            node(memory(&self.node.usage.memory, |m| m.working_set_bytes)),
        );
        out.family(
            "resource_scrape_error",
            "gauge",
            "1 if there was an error while getting container metrics, 0 otherwise",
            [(
                String::new(),
                if self.container_stats_failed {
                    1.0
                } else {
                    0.0
                },
                None,
            )],
        );
        out.0
    }

    /// Every subject of `/metrics/cadvisor`: each running container, each pod's cgroup, and
    /// the root.
    fn subjects(&self) -> Vec<Subject<'_>> {
        let mut all = Vec::new();
        for p in &self.pods {
            all.extend(p.containers.iter().map(|c| Subject::Container(p, c)));
            all.push(Subject::Pod(p));
        }
        all.push(Subject::Root(&self.node));
        all
    }

    /// `/metrics/cadvisor`: cAdvisor's container metrics that the dashboards and alerts
    /// written for the kubelet read, with cAdvisor's labels.
    pub fn cadvisor_metrics(&self) -> String {
        let mut out = Families::default();
        // Each subject's label set, formatted once for all of its families.
        let subjects: Vec<(Subject<'_>, String)> = self
            .subjects()
            .into_iter()
            .map(|s| {
                let labels = s.labels();
                (s, labels)
            })
            .collect();
        let each = |f: &dyn Fn(&Subject<'_>) -> Sample| {
            subjects
                .iter()
                .filter_map(|(s, labels)| {
                    let (v, at) = f(s)?;
                    Some((labels.as_str(), v, at))
                })
                .collect::<Vec<_>>()
        };
        out.family(
            "container_cpu_usage_seconds_total",
            "counter",
            "Cumulative cpu time consumed in seconds.",
            each(&|s| cpu_seconds(s.cpu())),
        );
        let memory_families: [Field<MemoryStats>; 4] = [
            (
                "container_memory_working_set_bytes",
                "Current working set in bytes.",
                |m| m.working_set_bytes,
            ),
            (
                "container_memory_usage_bytes",
                "Current memory usage in bytes, including all memory regardless of when it was \
                 accessed",
                |m| m.usage_bytes,
            ),
            ("container_memory_rss", "Size of RSS in bytes.", |m| {
                m.rss_bytes
            }),
            (
                "container_memory_cache",
                "Number of bytes of page cache memory.",
                |m| m.cache_bytes,
            ),
        ];
        for (name, help, f) in memory_families {
            out.family(name, "gauge", help, each(&|s| memory(s.memory(), f)));
        }
        // The CFS quota's throttling: only of what has a quota (the periods count only then),
        // and on cgroup v2 (where the usage's own read has it).
        let throttling_families: [Field<crate::cm::CpuThrottling>; 2] = [
            (
                "container_cpu_cfs_periods_total",
                "Number of elapsed enforcement period intervals.",
                |t| t.periods,
            ),
            (
                "container_cpu_cfs_throttled_periods_total",
                "Number of throttled period intervals.",
                |t| t.throttled_periods,
            ),
        ];
        let throttling = |s: &Subject<'_>| {
            let c = s.cpu().as_ref()?;
            Some((c.throttling.filter(|t| t.periods > 0)?, millis(&c.time)))
        };
        for (name, help, f) in throttling_families {
            out.family(
                name,
                "counter",
                help,
                each(&|s| throttling(s).map(|(t, at)| (f(&t) as f64, at))),
            );
        }
        out.family(
            "container_cpu_cfs_throttled_seconds_total",
            "counter",
            "Total time duration the container has been throttled.",
            each(&|s| throttling(s).map(|(t, at)| (t.throttled_nanos as f64 / 1e9, at))),
        );
        out.family(
            "container_start_time_seconds",
            "gauge",
            "Start time of the container since unix epoch in seconds.",
            each(&|s| match s {
                Subject::Container(_, c) => {
                    let ms = millis(c.start_time.as_deref()?)?;
                    Some((ms as f64 / 1000.0, None))
                }
                _ => None,
            }),
        );
        out.family(
            "container_fs_usage_bytes",
            "gauge",
            "Number of bytes that are consumed by the container on this filesystem.",
            each(&|s| match s {
                Subject::Container(_, c) => {
                    let fs = c.rootfs.as_ref()?;
                    Some((fs.used_bytes? as f64, millis(&fs.time)))
                }
                _ => None,
            }),
        );
        // The pod's network, on its cgroup's series (every container of a pod shares it).
        let network = |f: fn(&super::InterfaceStats) -> u64| {
            self.pods
                .iter()
                .filter_map(|p| Some((p, p.usage.network.as_ref()?)))
                .flat_map(|(p, n): (&PodStats, &NetworkStats)| {
                    let base = Subject::Pod(p).labels();
                    let at = millis(&n.time);
                    n.interfaces.iter().map(move |i| {
                        let labels = format!(
                            "{},interface=\"{}\"}}",
                            base.trim_end_matches('}'),
                            label(&i.name)
                        );
                        (labels, f(i) as f64, at)
                    })
                })
                .collect::<Vec<_>>()
        };
        let network_families: [Field<super::InterfaceStats>; 4] = [
            (
                "container_network_receive_bytes_total",
                "Cumulative count of bytes received",
                |i| i.rx_bytes,
            ),
            (
                "container_network_transmit_bytes_total",
                "Cumulative count of bytes transmitted",
                |i| i.tx_bytes,
            ),
            (
                "container_network_receive_errors_total",
                "Cumulative count of errors encountered while receiving",
                |i| i.rx_errors,
            ),
            (
                "container_network_transmit_errors_total",
                "Cumulative count of errors encountered while transmitting",
                |i| i.tx_errors,
            ),
        ];
        for (name, help, f) in network_families {
            out.family(name, "counter", help, network(f));
        }
        out.0
    }
}
