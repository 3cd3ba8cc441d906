//! `cargo xtask report --pods N --out DIR`: where every millisecond of a pod start goes.
//!
//! Private containerd (reused when it already answers; stopped at the end only when this command
//! started it) -> images -> build swiftlet -> start it with `--ebpf on` -> write N static pod
//! manifests at once -> wait (progress bar) until every pod runs and its timeline is complete ->
//! read the timelines (`/debug/trace/pods`) -> write `report.json`, the waterfall chart
//! (`waterfall.svg`, `waterfall.png`) and print the phase table (hdrhistogram p50/p90/p99/max)
//! -> remove the manifests, wait for the pods to go, stop the agent.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::progress::{Progress, note};
use crate::runtime::{Layout, UpOutcome};

/// The report agent's cgroup root.
pub const CGROUP_ROOT: &str = "/swiftlet-report";
/// A TrueType font for the charts' text (Debian's fonts-dejavu-core).
pub const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("`cargo xtask report` needs root (containerd, cgroups, eBPF)")]
    NotRoot,
    #[error(transparent)]
    Setup(#[from] crate::setup::Error),
    #[error(transparent)]
    Runtime(#[from] crate::runtime::Error),
    #[error(transparent)]
    Images(#[from] crate::images::Error),
    #[error(transparent)]
    Agent(#[from] crate::agent::Error),
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("timed out after {timeout:?} waiting for {what}; agent log {log}", log = log.display())]
    Timeout {
        what: String,
        timeout: Duration,
        log: PathBuf,
    },
    #[error("the timelines from swiftlet are not what the report expects: {0}")]
    Timelines(String),
    #[error("drawing {path}: {message}", path = path.display())]
    Chart { path: PathBuf, message: String },
    #[error("encoding report.json: {0}")]
    Json(#[from] serde_json::Error),
}

fn io_err<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> Error + 'a {
    move |source| Error::Io {
        action,
        path: path.to_owned(),
        source,
    }
}

/// Options of `cargo xtask report`.
#[derive(Debug, Clone)]
pub struct Options {
    pub pods: usize,
    pub out: PathBuf,
    pub release: bool,
    /// How long to wait for every pod to run and its timeline to complete.
    pub timeout: Duration,
}

/// One phase of one pod.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PodPhase {
    pub phase: String,
    pub ms: f64,
    /// Not in report.json: where the phase starts, for the waterfall.
    #[serde(skip)]
    pub start_ms: f64,
}

/// One pod's breakdown.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PodReport {
    pub name: String,
    pub uid: String,
    pub e2e_ms: f64,
    pub phases: Vec<PodPhase>,
}

/// Percentiles of one phase over every pod.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PhaseStats {
    pub phase: String,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// `report.json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub pods: Vec<PodReport>,
    pub phases: Vec<PhaseStats>,
    pub events_lost: u64,
}

/// Builds the report from swiftlet's `/debug/trace/pods` view, keeping the pods whose names
/// `keep` accepts. Each pod's phases are consecutive and add up to its `e2e_ms` (the agent
/// computes them so; this checks it). Phase rows come in order of first appearance.
pub fn build_report(
    view: &serde_json::Value,
    keep: impl Fn(&str) -> bool,
) -> Result<Report, Error> {
    let bad = |what: &str| Error::Timelines(what.to_owned());
    let pods_json = view["pods"]
        .as_array()
        .ok_or_else(|| bad("no pods array"))?;
    let origin_ns = pods_json
        .iter()
        .filter(|p| p["name"].as_str().is_some_and(&keep))
        .filter_map(|p| p["phases"].get(0)?["start_ns"].as_u64())
        .min()
        .unwrap_or(0);
    let mut pods = Vec::new();
    for p in pods_json {
        let Some(name) = p["name"].as_str().filter(|n| keep(n)) else {
            continue;
        };
        let Some(e2e_ms) = p["e2e_ms"].as_f64() else {
            continue;
        };
        let mut phases = Vec::new();
        for ph in p["phases"]
            .as_array()
            .ok_or_else(|| bad("pod without phases"))?
        {
            let start_ns = ph["start_ns"]
                .as_u64()
                .ok_or_else(|| bad("phase start_ns"))?;
            phases.push(PodPhase {
                phase: ph["phase"]
                    .as_str()
                    .ok_or_else(|| bad("phase name"))?
                    .to_owned(),
                ms: ph["ms"].as_f64().ok_or_else(|| bad("phase ms"))?,
                start_ms: start_ns.saturating_sub(origin_ns) as f64 / 1e6,
            });
        }
        let sum: f64 = phases.iter().map(|p| p.ms).sum();
        if (sum - e2e_ms).abs() > 0.01 {
            return Err(Error::Timelines(format!(
                "{name}: phases add up to {sum} ms, e2e is {e2e_ms} ms"
            )));
        }
        pods.push(PodReport {
            name: name.to_owned(),
            uid: p["uid"].as_str().unwrap_or_default().to_owned(),
            e2e_ms,
            phases,
        });
    }
    pods.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Report {
        phases: phase_stats(&pods),
        pods,
        events_lost: view["events_lost"].as_u64().unwrap_or(0),
    })
}

/// hdrhistogram percentiles per phase (microsecond resolution), plus `e2e`.
pub fn phase_stats(pods: &[PodReport]) -> Vec<PhaseStats> {
    let mut order: Vec<String> = Vec::new();
    let mut samples: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for pod in pods {
        for ph in &pod.phases {
            if !samples.contains_key(&ph.phase) {
                order.push(ph.phase.clone());
            }
            samples.entry(ph.phase.clone()).or_default().push(ph.ms);
        }
    }
    order.push("e2e".to_owned());
    samples.insert("e2e".to_owned(), pods.iter().map(|p| p.e2e_ms).collect());
    order
        .into_iter()
        .filter_map(|phase| {
            let values = samples.get(&phase)?;
            // 1 µs .. 1 h at 3 significant digits.
            let mut h = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).ok()?;
            for &ms in values {
                let us = (ms * 1e3).round().max(1.0) as u64;
                h.saturating_record(us);
            }
            let at = |q: f64| h.value_at_quantile(q) as f64 / 1e3;
            Some(PhaseStats {
                p50_ms: at(0.5),
                p90_ms: at(0.9),
                p99_ms: at(0.99),
                max_ms: h.max() as f64 / 1e3,
                phase,
            })
        })
        .collect()
}

/// The phase table printed to the terminal.
pub fn phase_table(report: &Report) -> String {
    let width = report
        .phases
        .iter()
        .map(|p| p.phase.len())
        .max()
        .unwrap_or(5)
        .max(5);
    let mut out = format!(
        "{:<width$}  {:>9}  {:>9}  {:>9}  {:>9}\n",
        "phase", "p50 ms", "p90 ms", "p99 ms", "max ms"
    );
    for p in &report.phases {
        out.push_str(&format!(
            "{:<width$}  {:>9.3}  {:>9.3}  {:>9.3}  {:>9.3}\n",
            p.phase, p.p50_ms, p.p90_ms, p.p99_ms, p.max_ms
        ));
    }
    out.push_str(&format!(
        "{} pods, eBPF events lost: {}\n",
        report.pods.len(),
        report.events_lost
    ));
    out
}

/// `[#####.....] 5/10 label`.
pub fn progress_bar(done: usize, total: usize, width: usize, label: &str) -> String {
    let filled = (done * width)
        .checked_div(total)
        .unwrap_or(width)
        .min(width);
    format!(
        "[{}{}] {done}/{total} {label}",
        "#".repeat(filled),
        ".".repeat(width - filled)
    )
}

/// A phase's kind: its name without the container (`exec/main` -> `exec`,
/// `agent/CreateContainer/main` -> `agent/CreateContainer`).
pub fn phase_kind(name: &str) -> &str {
    let skip = if name.starts_with("agent/") { 6 } else { 0 };
    match name.get(skip..).and_then(|rest| rest.find('/')) {
        Some(i) => name.get(..skip + i).unwrap_or(name),
        None => name,
    }
}

/// Distinct colours, handed to phase kinds in order of first appearance.
const PALETTE: [(u8, u8, u8); 16] = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
    (0, 0, 128),
    (170, 110, 40),
    (128, 128, 0),
    (0, 128, 128),
    (250, 190, 212),
    (60, 60, 60),
];

fn colour_at(index: usize) -> plotters::style::RGBColor {
    let (r, g, b) = PALETTE[index % PALETTE.len()];
    plotters::style::RGBColor(r, g, b)
}

/// The phase kinds of a report in order of first appearance.
fn kinds_of(report: &Report) -> Vec<&str> {
    let mut kinds: Vec<&str> = Vec::new();
    for ph in report.pods.iter().flat_map(|p| &p.phases) {
        let kind = phase_kind(&ph.phase);
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    kinds
}

fn draw<DB: plotters::prelude::DrawingBackend>(
    root: plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
    report: &Report,
) -> Result<(), String> {
    use plotters::prelude::*;
    let end = report
        .pods
        .iter()
        .flat_map(|p| p.phases.last().map(|l| l.start_ms + l.ms))
        .fold(1.0f64, f64::max);
    let rows = report.pods.len().max(1);
    let kinds = kinds_of(report);
    let colour_of = |phase: &str| {
        let kind = phase_kind(phase);
        colour_at(kinds.iter().position(|k| *k == kind).unwrap_or(0))
    };
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let (chart_area, legend_area) =
        root.split_horizontally(root.dim_in_pixel().0.saturating_sub(260));
    let mut chart = ChartBuilder::on(&chart_area)
        .caption(
            "pod start waterfall (ms since the first pod was seen)",
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(140)
        .build_cartesian_2d(0.0..end * 1.02, -0.5..rows as f64 - 0.5)
        .map_err(|e| e.to_string())?;
    let names: Vec<String> = report.pods.iter().map(|p| p.name.clone()).collect();
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc("ms")
        .y_labels(rows.min(40))
        .y_label_formatter(&|y| {
            // Labels only on whole rows.
            if (y - y.round()).abs() > 1e-6 || *y < 0.0 {
                return String::new();
            }
            names.get(y.round() as usize).cloned().unwrap_or_default()
        })
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, pod) in report.pods.iter().enumerate() {
        let (y0, y1) = (i as f64 - 0.35, i as f64 + 0.35);
        chart
            .draw_series(pod.phases.iter().map(|ph| {
                let colour = colour_of(&ph.phase);
                Rectangle::new(
                    [(ph.start_ms, y0), (ph.start_ms + ph.ms, y1)],
                    colour.filled(),
                )
            }))
            .map_err(|e| e.to_string())?;
    }
    // Legend: one swatch per phase kind, in order of first appearance.
    for (i, kind) in kinds.iter().enumerate() {
        let y = 40 + 20 * i as i32;
        let colour = colour_at(i);
        legend_area
            .draw(&Rectangle::new([(10, y), (24, y + 12)], colour.filled()))
            .map_err(|e| e.to_string())?;
        legend_area
            .draw(&Text::new(kind.to_string(), (30, y), ("sans-serif", 13)))
            .map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())?;
    Ok(())
}

/// Writes `waterfall.svg` and `waterfall.png` into `dir`.
pub fn waterfall(report: &Report, dir: &Path) -> Result<(PathBuf, PathBuf), Error> {
    use plotters::prelude::*;
    let height = (80 + 22 * report.pods.len()).clamp(300, 4000) as u32;
    let size = (1400, height);
    let svg = dir.join("waterfall.svg");
    let png = dir.join("waterfall.png");
    // Both backends measure text with the registered font.
    let font = std::fs::read(FONT).map_err(io_err("reading the chart font", Path::new(FONT)))?;
    // plotters keeps a 'static reference to registered fonts; one leak per run.
    let font: &'static [u8] = Box::leak(font.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, font).map_err(|_| {
        Error::Chart {
            path: svg.clone(),
            message: format!("{FONT} is not a usable font"),
        }
    })?;
    draw(SVGBackend::new(&svg, size).into_drawing_area(), report).map_err(|message| {
        Error::Chart {
            path: svg.clone(),
            message,
        }
    })?;
    draw(BitMapBackend::new(&png, size).into_drawing_area(), report).map_err(|message| {
        Error::Chart {
            path: png.clone(),
            message,
        }
    })?;
    Ok((svg, png))
}

/// A static pod that sleeps until SIGTERM.
fn manifest(name: &str) -> String {
    crate::looping_pod_manifest(name, 2, 0, &[])
}

fn free_port() -> Result<u16, Error> {
    crate::free_loopback_port().map_err(io_err("binding a loopback port", Path::new("127.0.0.1:0")))
}

struct Agent {
    process: crate::agent::RunningAgent,
    read_only: SocketAddr,
}

impl Agent {
    fn get(&self, path: &str) -> Option<serde_json::Value> {
        let resp = crate::http::get(self.read_only, path, Duration::from_secs(5)).ok()?;
        (resp.status == 200)
            .then(|| serde_json::from_str(&resp.body).ok())
            .flatten()
    }

    fn exited(&mut self) -> Option<Error> {
        self.process.exited().map(Error::from)
    }

    fn stop(&mut self) {
        if !self.process.stop(Duration::from_secs(15)) {
            note("swiftlet did not exit within 15s of SIGTERM: killed");
        }
    }
}

fn start_agent(binary: &Path, work: &Path, node: &str) -> Result<Agent, Error> {
    let manifests = work.join("manifests");
    if manifests.exists() {
        std::fs::remove_dir_all(&manifests).map_err(io_err("clearing", &manifests))?;
    }
    std::fs::create_dir_all(&manifests).map_err(io_err("creating", &manifests))?;
    let spec = crate::agent::Spec {
        binary: binary.to_owned(),
        manifest_dir: manifests,
        endpoint: crate::DEFAULT_ENDPOINT.to_owned(),
        root_dir: work.join("root"),
        pod_logs_dir: Some(work.join("pod-logs")),
        node: node.to_owned(),
        cgroup_root: CGROUP_ROOT.to_owned(),
        healthz_port: free_port()?,
        read_only_port: free_port()?,
        kubelet_port: 0,
        file_check_frequency: "5s".to_owned(),
        extra_args: vec!["--ebpf".to_owned(), "on".to_owned()],
        log: work.join("agent.log"),
        own_process_group: false,
        die_with_parent: false,
    };
    let agent = Agent {
        process: spec.start(false, Duration::from_secs(30))?,
        read_only: spec.read_only_addr(),
    };
    Ok(agent)
}

/// Writes the manifests, then redraws the progress bar until every pod runs with a complete
/// timeline. Returns the `/debug/trace/pods` view.
fn start_pods(
    agent: &mut Agent,
    work: &Path,
    names: &[String],
    timeout: Duration,
) -> Result<serde_json::Value, Error> {
    let manifests = work.join("manifests");
    for name in names {
        let path = manifests.join(format!("{name}.yaml"));
        std::fs::write(&path, manifest(name)).map_err(io_err("writing", &path))?;
    }
    let started = Instant::now();
    let total = names.len();
    let mut last_line = String::new();
    loop {
        let view = agent
            .get("/debug/trace/pods")
            .unwrap_or(serde_json::Value::Null);
        let pods = view["pods"].as_array().cloned().unwrap_or_default();
        let ours = |p: &serde_json::Value| {
            p["name"]
                .as_str()
                .is_some_and(|n| names.iter().any(|m| n.starts_with(&format!("{m}-"))))
        };
        let running = pods
            .iter()
            .filter(|p| ours(p) && p["e2e_ms"].is_number())
            .count();
        let complete = pods
            .iter()
            .filter(|p| ours(p) && p["complete"] == true)
            .count();
        let line = progress_bar(running, total, 30, &format!("Running, {complete} traced"));
        if line != last_line {
            eprint!("\r      {line}");
            let _ = std::io::stderr().flush();
            last_line = line;
        }
        if complete >= total {
            eprintln!();
            return Ok(view);
        }
        if let Some(e) = agent.exited() {
            eprintln!();
            return Err(e);
        }
        if started.elapsed() > timeout {
            eprintln!();
            return Err(Error::Timeout {
                what: format!("{total} pods Running with complete timelines"),
                timeout,
                log: agent.process.log.clone(),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn stop_pods(agent: &Agent, work: &Path, timeout: Duration) {
    let manifests = work.join("manifests");
    if let Ok(rd) = std::fs::read_dir(&manifests) {
        for e in rd.filter_map(Result::ok) {
            let _ = std::fs::remove_file(e.path());
        }
    }
    let start = Instant::now();
    while start.elapsed() < timeout {
        match agent.get("/pods") {
            Some(list) if list["items"].as_array().is_none_or(Vec::is_empty) => return,
            None => return,
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    }
    note(format!("pods still listed after {timeout:?}"));
}

/// Runs the report. Returns the report written to `opts.out`.
pub fn run(opts: &Options) -> Result<Report, Error> {
    if !crate::is_root() {
        return Err(Error::NotRoot);
    }
    let layout = Layout::default();
    let mut progress = Progress::new(8);
    progress.step("setup", || crate::setup::ensure_all().map(|_| ()))?;
    let outcome = progress.step("runtime up (reused when already up)", || {
        crate::runtime::up(&layout)
    })?;
    let started_runtime = matches!(outcome, UpOutcome::Started { .. });
    let result = run_with_runtime(opts, &layout, &mut progress);
    if started_runtime {
        let _ = progress.step("runtime down (this command started it)", || {
            crate::runtime::down(&layout).map(|r| note(r.to_string()))
        });
    } else {
        note("the runtime was already up: left running");
    }
    result
}

fn run_with_runtime(
    opts: &Options,
    layout: &Layout,
    progress: &mut Progress,
) -> Result<Report, Error> {
    progress.step("images", || crate::images::ensure(layout))?;
    let binary = progress.step("cargo build -p swiftlet", || {
        crate::agent::build_agent(opts.release)
    })?;
    std::fs::create_dir_all(&opts.out).map_err(io_err("creating", &opts.out))?;
    let work = PathBuf::from("/var/lib/swiftlet-dev/report");
    let node = format!("report-{}", std::process::id());
    let mut agent = progress.step("start swiftlet --ebpf on", || {
        start_agent(&binary, &work, &node)
    })?;
    let names: Vec<String> = (0..opts.pods).map(|i| format!("report-{i:03}")).collect();
    let view = progress.step(&format!("start {} pods", opts.pods), || {
        start_pods(&mut agent, &work, &names, opts.timeout)
    });
    let mut events_seen = 0;
    let report = view.and_then(|view| {
        let suffix = format!("-{node}");
        events_seen = view["events_seen"].as_u64().unwrap_or(0);
        build_report(&view, |n| n.ends_with(&suffix))
    });
    let _ = progress.step("remove the pods, stop swiftlet", || {
        stop_pods(&agent, &work, Duration::from_secs(60));
        agent.stop();
        let removed = crate::runtime::remove_cgroup_root(CGROUP_ROOT);
        note(format!("{removed} leftover cgroup directories removed"));
        Ok::<_, Error>(())
    });
    let report = report?;
    let json_path = opts.out.join("report.json");
    let json = serde_json::to_vec_pretty(&report)?;
    std::fs::write(&json_path, json).map_err(io_err("writing", &json_path))?;
    let (svg, png) = progress.step("waterfall chart", || waterfall(&report, &opts.out))?;
    println!("\n{}", phase_table(&report));
    println!(
        "eBPF events delivered while the pods started: {events_seen} ({:.0} a pod)",
        events_seen as f64 / report.pods.len().max(1) as f64
    );
    println!(
        "wrote {}, {}, {}",
        json_path.display(),
        svg.display(),
        png.display()
    );
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view() -> serde_json::Value {
        serde_json::json!({
            "probes_loaded": true,
            "events_lost": 0,
            "pods": [
                {"name": "b-n", "uid": "ub", "e2e_ms": 3.0, "complete": true, "phases": [
                    {"phase": "admission", "ms": 1.0, "start_ns": 2_000_000u64, "observer": "agent"},
                    {"phase": "pod_cgroup", "ms": 0.5, "start_ns": 3_000_000u64, "observer": "kernel"},
                    {"phase": "exec/main", "ms": 1.5, "start_ns": 3_500_000u64, "observer": "kernel"}]},
                {"name": "a-n", "uid": "ua", "e2e_ms": 2.0, "complete": true, "phases": [
                    {"phase": "admission", "ms": 2.0, "start_ns": 1_000_000u64, "observer": "agent"}]},
                {"name": "other", "uid": "uo", "e2e_ms": 9.0, "phases": []},
                {"name": "pending-n", "uid": "up", "e2e_ms": null, "phases": []}
            ]
        })
    }

    #[test]
    fn report_matches_the_issue_format() {
        let report = build_report(&view(), |n| n.ends_with("-n")).expect("valid");
        let json = serde_json::to_value(&report).expect("serializes");
        assert_eq!(json["events_lost"], 0);
        let pods = json["pods"].as_array().expect("pods");
        assert_eq!(pods.len(), 2, "other node's and pending pods are left out");
        assert_eq!(pods[0]["name"], "a-n");
        assert_eq!(
            pods[1]["phases"][2],
            serde_json::json!({"phase": "exec/main", "ms": 1.5})
        );
        let names: Vec<&str> = json["phases"]
            .as_array()
            .expect("phases")
            .iter()
            .map(|p| p["phase"].as_str().expect("name"))
            .collect();
        assert_eq!(names, ["admission", "pod_cgroup", "exec/main", "e2e"]);
        let admission = &json["phases"][0];
        assert_eq!(admission["max_ms"], 2.0);
        assert!(admission["p50_ms"].as_f64().expect("p50") >= 1.0);
        for key in ["p90_ms", "p99_ms"] {
            assert!(admission[key].is_number(), "{key}");
        }
        // Waterfall offsets are relative to the earliest pod.
        assert_eq!(report.pods[0].phases[0].start_ms, 0.0);
        assert_eq!(report.pods[1].phases[0].start_ms, 1.0);
        let table = phase_table(&report);
        assert!(
            table.contains("exec/main") && table.contains("2 pods"),
            "{table}"
        );
    }

    #[test]
    fn phases_that_do_not_add_up_are_rejected() {
        let mut v = view();
        v["pods"][0]["e2e_ms"] = serde_json::json!(10.0);
        assert!(matches!(
            build_report(&v, |n| n.ends_with("-n")),
            Err(Error::Timelines(_))
        ));
        assert!(build_report(&serde_json::json!({}), |_| true).is_err());
    }

    #[test]
    fn phase_kinds_drop_the_container() {
        assert_eq!(phase_kind("exec/main"), "exec");
        assert_eq!(
            phase_kind("agent/CreateContainer/main"),
            "agent/CreateContainer"
        );
        assert_eq!(phase_kind("agent/RunPodSandbox"), "agent/RunPodSandbox");
        assert_eq!(phase_kind("pod_cgroup"), "pod_cgroup");
    }

    #[test]
    fn progress_bar_fills() {
        assert_eq!(progress_bar(0, 4, 4, "x"), "[....] 0/4 x");
        assert_eq!(progress_bar(2, 4, 4, "x"), "[##..] 2/4 x");
        assert_eq!(progress_bar(9, 4, 4, "x"), "[####] 9/4 x");
        assert_eq!(progress_bar(0, 0, 4, "x"), "[####] 0/0 x");
    }

    #[test]
    fn waterfall_writes_svg_and_png() {
        let report = build_report(&view(), |n| n.ends_with("-n")).expect("valid");
        let dir = tempfile::tempdir().expect("tempdir");
        if !Path::new(FONT).is_file() {
            eprintln!("skipping the PNG: {FONT} is missing");
            return;
        }
        let (svg, png) = waterfall(&report, dir.path()).expect("drawn");
        let svg_text = std::fs::read_to_string(svg).expect("svg");
        assert!(
            svg_text.contains("<svg") && svg_text.contains("a-n"),
            "{svg_text}"
        );
        let png_bytes = std::fs::read(png).expect("png");
        assert_eq!(&png_bytes[1..4], b"PNG");
    }
}
