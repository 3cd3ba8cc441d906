//! The figures of `cargo xtask bench-compare`: read from what the benches print (pod_startup's
//! per-N tables and criterion's `time:` lines), paired base against new, and shown as one table
//! of ratios new / base per round and their median.

/// One figure a bench printed. Every figure is lower-is-better (a time, a CPU cost, a size).
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    /// What was measured, e.g. `N=10 swiftlet p99` or `container_hash/typical`.
    pub metric: String,
    /// `ms`, `ns`, `MiB`, `%` (of a core) or `x` (a ratio).
    pub unit: &'static str,
    pub value: f64,
}

impl Figure {
    fn new(metric: impl Into<String>, unit: &'static str, value: f64) -> Self {
        Self {
            metric: metric.into(),
            unit,
            value,
        }
    }
}

/// The figures of one run of pod_startup, in the order printed: per N the CRI floor's and
/// swiftlet's per-pod p50 and p99 and batch wall time, swiftlet's wall over the floor's, the
/// agent-added time per pod (p50, p99) and the agent's CPU per pod started; then the agent's
/// RSS and CPU idle and with pods running when the cost part ran. Lines it does not know are
/// skipped: a figure that is not found is missing, never zero.
pub fn parse_pod_startup(out: &str) -> Vec<Figure> {
    let mut figures = Vec::new();
    // The section of the last unindented line: `N=10`, `N=10 reserved core`, or none.
    let mut section: Option<String> = None;
    // Inside the CPU table of a batch, whose rows look like the latency rows.
    let mut cpu_table = false;
    for line in out.lines() {
        if line.trim().is_empty() {
            continue;
        }
        if !line.starts_with(' ') {
            cpu_table = false;
            section = line.strip_prefix("N = ").and_then(|rest| {
                let n: String = rest.chars().take_while(char::is_ascii_digit).collect();
                let reserved = rest.contains("reserved core");
                (!n.is_empty())
                    .then(|| format!("N={n}{}", if reserved { " reserved core" } else { "" }))
            });
            continue;
        }
        let text = line.trim();
        if let Some(cost) = cost_figures(text) {
            figures.extend(cost);
            continue;
        }
        let Some(n) = &section else { continue };
        if text.starts_with("CPU during the batch") {
            cpu_table = true;
        } else if text.starts_with("CPU per pod started") {
            cpu_table = false;
        }
        for who in ["CRI floor", "swiftlet"].into_iter().filter(|_| !cpu_table) {
            let Some(values) = text.strip_prefix(who).and_then(numbers::<5>) else {
                continue;
            };
            let [p50, _, p99, _, wall] = values;
            let metric = |what: &str| format!("{n} {who} {what}");
            figures.push(Figure::new(metric("p50"), "ms", p50));
            figures.push(Figure::new(metric("p99"), "ms", p99));
            figures.push(Figure::new(metric("wall"), "ms", wall));
        }
        if let Some(rest) = text.strip_prefix("swiftlet / CRI floor (wall): ")
            && let Some(r) = rest.split('x').next().and_then(|r| r.parse().ok())
        {
            figures.push(Figure::new(format!("{n} swiftlet / floor wall"), "x", r));
        } else if let Some(rest) = text.strip_prefix("agent-added per pod") {
            for q in ["p50", "p99"] {
                if let Some(v) = value_after(rest, &format!("{q} "), " ms") {
                    figures.push(Figure::new(format!("{n} agent-added {q}"), "ms", v));
                }
            }
        } else if let Some(rest) = text.strip_prefix("CPU per pod started: swiftlet's agent ")
            && let Some(v) = value_after(rest, "", " ms")
        {
            figures.push(Figure::new(format!("{n} agent CPU per pod"), "ms", v));
        }
    }
    figures
}

/// `idle, no pods, ...: RSS 17.1 MiB, CPU 0.12 % of a core` and `100 pods running, over 60 s:
/// RSS ...`: the agent's RSS and CPU.
fn cost_figures(text: &str) -> Option<[Figure; 2]> {
    let (what, rest) = text.split_once(": RSS ")?;
    let who = if what.starts_with("idle") {
        "idle".to_owned()
    } else {
        let pods = what.split_once(" pods running")?.0;
        format!("{pods} pods")
    };
    let rss = value_after(rest, "", " MiB")?;
    let cpu = value_after(rest, "CPU ", " %")?;
    Some([
        Figure::new(format!("agent RSS, {who}"), "MiB", rss),
        Figure::new(format!("agent CPU, {who}"), "%", cpu),
    ])
}

/// The number between `before` (its first occurrence) and the next `after` in `text`.
fn value_after(text: &str, before: &str, after: &str) -> Option<f64> {
    let start = text.find(before)? + before.len();
    let rest = &text[start..];
    rest[..rest.find(after)?].trim().parse().ok()
}

/// Exactly `N` whitespace-separated numbers.
fn numbers<const N: usize>(text: &str) -> Option<[f64; N]> {
    let values: Vec<f64> = text
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    values.try_into().ok()
}

/// The figures of one criterion run: per benchmark its `time:   [low estimate high]` line's
/// estimate, in ns. Criterion prints a long id on a line of its own before the `time:` line;
/// the `time:` lines of its `change:` block (percentages) are not figures.
pub fn parse_criterion(out: &str) -> Vec<Figure> {
    let mut figures = Vec::new();
    let mut previous = "";
    for line in out.lines() {
        if let Some((id, rest)) = line.split_once("time:")
            && !rest.contains("(p =")
        {
            let id = if id.trim().is_empty() { previous } else { id }.trim();
            let values: Vec<&str> = rest
                .trim()
                .trim_matches(['[', ']'])
                .split_whitespace()
                .collect();
            if let [_, _, mid, unit, _, _] = values[..]
                && let (Ok(mid), Some(scale)) = (mid.parse::<f64>(), ns_per(unit))
                && !id.is_empty()
            {
                figures.push(Figure::new(id, "ns", mid * scale));
            }
        }
        if !line.trim().is_empty() {
            previous = line;
        }
    }
    figures
}

/// Nanoseconds per one of criterion's time units.
fn ns_per(unit: &str) -> Option<f64> {
    Some(match unit {
        "ps" => 1e-3,
        "ns" => 1.0,
        "µs" | "us" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        _ => return None,
    })
}

/// new / base, or `None` when base is not positive.
pub fn ratio(base: f64, new: f64) -> Option<f64> {
    (base > 0.0 && base.is_finite() && new.is_finite()).then(|| new / base)
}

/// The median (the mean of the middle two for an even count), or `None` for none.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    match v.len() {
        0 => None,
        n if n % 2 == 1 => Some(v[mid]),
        _ => Some((v[mid - 1] + v[mid]) / 2.0),
    }
}

/// A median ratio this far from 1 is marked in the table (`slower` / `faster`).
pub const MARK_AT: f64 = 0.10;

/// The figures of one round: base's run, then new's.
pub type Round = (Vec<Figure>, Vec<Figure>);

/// The comparison table of one bench: a row per metric (in the order first printed), per round
/// the base and new figures and their ratio, then the median ratio over the rounds, marked when
/// it is [`MARK_AT`] or more from 1. A figure a run did not print shows as `missing`, listed
/// under the table.
pub fn table(bench: &str, rounds: &[Round]) -> String {
    let mut metrics: Vec<(&str, &str)> = Vec::new();
    for f in rounds.iter().flat_map(|(b, n)| b.iter().chain(n)) {
        if !metrics.iter().any(|(m, _)| *m == f.metric) {
            metrics.push((&f.metric, f.unit));
        }
    }
    let find = |figures: &[Figure], metric: &str| {
        figures.iter().find(|f| f.metric == metric).map(|f| f.value)
    };
    let width = metrics
        .iter()
        .map(|(m, u)| m.len() + u.len().max(4) + 3)
        .max()
        .unwrap_or(0)
        .max(bench.len());
    let mut out = format!("{bench:<width$}");
    for r in 1..=rounds.len() {
        out.push_str(&format!(
            " {:>10} {:>10} {:>8}",
            format!("base r{r}"),
            format!("new r{r}"),
            "new/base"
        ));
    }
    out.push_str(&format!(" {:>8}\n", "median"));
    let mut missing = Vec::new();
    for (metric, unit) in &metrics {
        let label = if *unit == "ns" {
            format!("{metric} (time)")
        } else {
            format!("{metric} ({unit})")
        };
        out.push_str(&format!("{label:<width$}"));
        let mut ratios = Vec::new();
        for (r, (base, new)) in rounds.iter().enumerate() {
            let (b, n) = (find(base, metric), find(new, metric));
            for (side, v) in [("base", b), ("new", n)] {
                if v.is_none() {
                    missing.push(format!("{metric}: {side} r{}", r + 1));
                }
                out.push_str(&format!(
                    " {:>10}",
                    v.map_or("missing".to_owned(), |v| value(v, unit))
                ));
            }
            let q = b.zip(n).and_then(|(b, n)| ratio(b, n));
            ratios.extend(q);
            out.push_str(&format!(
                " {:>8}",
                q.map_or("-".to_owned(), |q| format!("{q:.2}x"))
            ));
        }
        match median(&ratios) {
            Some(m) => {
                let mark = if m >= 1.0 + MARK_AT {
                    "  slower"
                } else if m <= 1.0 - MARK_AT {
                    "  faster"
                } else {
                    ""
                };
                out.push_str(&format!(" {:>8}{mark}\n", format!("{m:.2}x")));
            }
            None => out.push_str(&format!(" {:>8}\n", "-")),
        }
    }
    if !missing.is_empty() {
        out.push_str(&format!(
            "not found in the bench's output (see its log): {}\n",
            missing.join("; ")
        ));
    }
    out
}

/// A figure as shown: times in ns scaled to a readable unit, the rest to 2 decimals.
fn value(v: f64, unit: &str) -> String {
    match unit {
        "ns" if v >= 1e6 => format!("{:.3} ms", v / 1e6),
        "ns" if v >= 1e3 => format!("{:.3} us", v / 1e3),
        "ns" => format!("{v:.1} ns"),
        _ => format!("{v:.2}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stdout and stderr of `pod_startup -- --pods 20 --reps 3`, as printed (some of the
    /// phase table left out).
    const POD_STARTUP: &str = "\
building the agent (release) ... done
measuring the idle agent for 10 s ... done
podman: not installed (apt-get install podman): skipped
pod_startup: host-network pods, one container each; 3 repetition(s) per N
machine: 2 cores; runtime unix:///run/swiftlet-dev/containerd.sock
N=20 rep 1/3: floor, swiftlet done
N=20 rep 2/3: floor, swiftlet done
N=20 rep 3/3: floor, swiftlet done

N = 20: per-pod latency (ms) and batch wall time (ms, mean of 3 runs)
                  p50      p90      p99      max       wall
  CRI floor    1399.8   1590.3   1607.7   1607.7     1553.3
  swiftlet     1529.9   1685.5   1774.6   1774.6     1697.8
  CPU during the batch (ms, mean of 3 runs; the machine's in clock ticks of 10 ms):
                  machine   containerd        agent  agent runq wait    bench
  CRI floor          2897        453.8          0.9             36.4     24.6
  swiftlet           3140        481.9         88.2            297.1     49.6
  CPU per pod started: swiftlet's agent 4.41 ms (its eBPF reader included); the client of the `CRI floor` row 1.23 ms (this process sending the floor's CRI calls through swiftlet's own CRI client, nothing else)
  where swiftlet's starts went (60 pods, eBPF probes loaded; events lost: 0):
    phase                          p50 ms     p90 ms     p99 ms     max ms
    admission                       0.119      0.345      0.514      0.514
    e2e                          1515.519   1674.239   1764.351   1764.351
    60 pods, eBPF events lost: 0
  agent-added per pod (end-to-end minus the pod's CRI calls in flight): p50 3.73 ms, p90 6.01 ms, p99 17.55 ms, max 17.55 ms
    of which before the pod's first CRI call (admission, dispatch, pod cgroup, sandbox config): p50 1.84 ms, p90 3.54 ms, p99 4.81 ms, max 4.81 ms
  swiftlet's CRI calls for 60 pods started and removed (incl. its 1 s relists): ContainerStatus 79, CreateContainer 60, ImageStatus 60, ListContainers 133, ListPodSandbox 132, PodSandboxStatus 121, RemovePodSandbox 60, RunPodSandbox 60, StartContainer 60, StopContainer 60, StopPodSandbox 60
  swiftlet's pod reads by who read (handoff: a sync took the PLEG's read): handoff 10, kill 111, pleg 10
  swiftlet / CRI floor (wall): 1.09x; per-pod latency swiftlet - CRI floor: p50 +130.0 ms, p99 +166.9 ms

summary (swiftlet wall / CRI floor wall):
  N=20   1.09x

agent cost (pid 2052; VmRSS from /proc/2052/status, utime+stime from /proc/2052/stat)
  idle, no pods, over 10 s after start: RSS 17.2 MiB, CPU 0.08 % of a core
  starting 100 pods ... running
  100 pods running, over 20 s: RSS 31.3 MiB, CPU 0.78 % of a core
";

    fn pairs(figures: &[Figure]) -> Vec<(&str, f64)> {
        figures
            .iter()
            .map(|f| (f.metric.as_str(), f.value))
            .collect()
    }

    #[test]
    fn reads_pod_startup_figures() {
        assert_eq!(
            pairs(&parse_pod_startup(POD_STARTUP)),
            [
                ("N=20 CRI floor p50", 1399.8),
                ("N=20 CRI floor p99", 1607.7),
                ("N=20 CRI floor wall", 1553.3),
                ("N=20 swiftlet p50", 1529.9),
                ("N=20 swiftlet p99", 1774.6),
                ("N=20 swiftlet wall", 1697.8),
                ("N=20 agent CPU per pod", 4.41),
                ("N=20 agent-added p50", 3.73),
                ("N=20 agent-added p99", 17.55),
                ("N=20 swiftlet / floor wall", 1.09),
                ("agent RSS, idle", 17.2),
                ("agent CPU, idle", 0.08),
                ("agent RSS, 100 pods", 31.3),
                ("agent CPU, 100 pods", 0.78),
            ]
        );
    }

    #[test]
    fn keeps_the_reserved_core_rows_apart() {
        let out = "\
N = 10: per-pod latency (ms) and batch wall time (ms, mean of 3 runs)
  swiftlet       20.0     21.0     22.0     23.0       30.0

N = 10, the agent on a reserved core (0; the runtime, the pods and the bench on 1):
                  p50      p90      p99      max       wall
  swiftlet       10.0     11.0     12.0     13.0       15.0
summary (swiftlet wall / CRI floor wall):
  swiftlet       99.0     99.0     99.0     99.0       99.0
";
        let figures = parse_pod_startup(out);
        let metrics: Vec<&str> = figures.iter().map(|f| f.metric.as_str()).collect();
        assert_eq!(
            metrics,
            [
                "N=10 swiftlet p50",
                "N=10 swiftlet p99",
                "N=10 swiftlet wall",
                "N=10 reserved core swiftlet p50",
                "N=10 reserved core swiftlet p99",
                "N=10 reserved core swiftlet wall",
            ]
        );
    }

    #[test]
    fn reads_nothing_from_an_unknown_format() {
        assert!(parse_pod_startup("pod_startup: skipped\nN=1 rep 1/3: floor\n").is_empty());
        assert!(parse_criterion("running 0 tests\n").is_empty());
    }

    /// criterion's stdout (the Benchmarking lines go to stderr): a short id on the `time:` line,
    /// a long one on the line before it, and a `change:` block against an earlier run.
    const CRITERION: &str = "\
container_hash/typical  time:   [216.62 ns 219.27 ns 222.36 ns]
                        change: [-2.1% +0.4% +3.0%] (p = 0.77 > 0.05)
                        No change in performance detected.
Found 4 outliers among 100 measurements (4.00%)
  3 (3.00%) high mild
  1 (1.00%) high severe
container_hash/json_then_hash_baseline
                        time:   [1.1020 µs 1.1093 µs 1.1171 µs]
relist_listing_250/full time:   [1.5012 ms 1.5263 ms 1.5540 ms]
relist_listing_250/brief
                        time:   [612.40 us 618.90 us 625.00 us]
                        thrpt:  [1.0000 Kelem/s 1.0100 Kelem/s 1.0200 Kelem/s]
";

    #[test]
    fn reads_criterion_estimates_in_ns() {
        let figures = parse_criterion(CRITERION);
        let got: Vec<(&str, String)> = figures
            .iter()
            .map(|f| (f.metric.as_str(), format!("{:.1}", f.value)))
            .collect();
        let want = [
            ("container_hash/typical", "219.3"),
            ("container_hash/json_then_hash_baseline", "1109.3"),
            ("relist_listing_250/full", "1526300.0"),
            ("relist_listing_250/brief", "618900.0"),
        ];
        let want: Vec<(&str, String)> = want.iter().map(|(m, v)| (*m, (*v).to_owned())).collect();
        assert_eq!(got, want);
        assert!(figures.iter().all(|f| f.unit == "ns"));
    }

    #[test]
    fn ratio_and_median() {
        assert_eq!(ratio(2.0, 3.0), Some(1.5));
        assert_eq!(ratio(0.0, 3.0), None);
        assert_eq!(ratio(2.0, f64::NAN), None);
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0]), Some(3.0));
        assert_eq!(median(&[5.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[f64::NAN, 2.0]), Some(2.0));
    }

    fn fig(metric: &str, unit: &'static str, value: f64) -> Figure {
        Figure::new(metric, unit, value)
    }

    #[test]
    fn table_shows_ratios_medians_and_what_is_missing() {
        let rounds = [
            (
                vec![
                    fig("N=1 swiftlet p50", "ms", 10.0),
                    fig("hash", "ns", 200.0),
                ],
                vec![
                    fig("N=1 swiftlet p50", "ms", 12.0),
                    fig("hash", "ns", 100.0),
                ],
            ),
            (
                vec![
                    fig("N=1 swiftlet p50", "ms", 10.0),
                    fig("hash", "ns", 2000.0),
                ],
                vec![fig("N=1 swiftlet p50", "ms", 14.0)],
            ),
        ];
        let t = table("pod_startup", &rounds);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4, "{t}");
        let words = |l: &str| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(
            words(lines[0]),
            [
                "pod_startup",
                "base",
                "r1",
                "new",
                "r1",
                "new/base",
                "base",
                "r2",
                "new",
                "r2",
                "new/base",
                "median"
            ]
        );
        // 1.2x and 1.4x: the median 1.3x is marked.
        assert!(
            lines[1].starts_with("N=1 swiftlet p50 (ms)")
                && lines[1].ends_with(
                    " 10.00      12.00    1.20x      10.00      14.00    1.40x    1.30x  slower"
                ),
            "{t}"
        );
        // The second round's new figure is missing: the median is the first round's alone.
        assert!(
            lines[2].starts_with("hash (time)")
                && lines[2].ends_with(
                    "200.0 ns   100.0 ns    0.50x   2.000 us    missing        -    0.50x  faster"
                ),
            "{t}"
        );
        assert_eq!(
            lines[3],
            "not found in the bench's output (see its log): hash: new r2"
        );
    }
}
