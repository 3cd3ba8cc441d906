//! `cargo xtask demo`: the whole thing on this machine, end to end.
//!
//! setup -> private containerd -> images -> build swiftlet -> start it -> write the example
//! manifests -> wait until every pod is Running (timed from the moment the manifests were
//! written) -> status table -> Ctrl-C (or `--once`) -> remove manifests, wait for the pods to go,
//! stop the agent, stop the runtime.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::agent::RunningAgent;
use crate::progress::{Progress, note};
use crate::runtime::Layout;

/// The agent's healthz port in the demo.
pub const HEALTHZ_PORT: u16 = 10248;
/// The agent's read-only port in the demo (`/pods`, `/metrics`, `/debug/...`).
pub const READ_ONLY_PORT: u16 = 10255;
/// The demo's cgroup root.
pub const CGROUP_ROOT: &str = "/swiftlet-demo";

/// Errors of the demo, with the step's context.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Setup(#[from] crate::setup::Error),
    #[error(transparent)]
    Runtime(#[from] crate::runtime::Error),
    #[error(transparent)]
    Images(#[from] crate::images::Error),
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Agent(#[from] crate::agent::Error),
    #[error("timed out after {timeout:?} waiting for {what}; agent log: {log}", log = log.display())]
    Timeout {
        what: String,
        timeout: Duration,
        log: PathBuf,
    },
    #[error("interrupted")]
    Interrupted,
    #[error("installing the Ctrl-C handler: {0}")]
    Signal(std::io::Error),
}

/// Options of `cargo xtask demo`.
#[derive(Debug, Clone)]
pub struct Options {
    /// Build and run the release profile.
    pub release: bool,
    /// Tear down at once instead of waiting for Ctrl-C.
    pub once: bool,
    /// How long to wait for the pods to run (and later to go).
    pub timeout: Duration,
    /// Where the example manifests are.
    pub examples_dir: PathBuf,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            release: false,
            once: false,
            timeout: Duration::from_secs(120),
            examples_dir: crate::workspace_root().join("examples/pods"),
        }
    }
}

/// Sleeps that a Ctrl-C (SIGINT) or SIGTERM cuts short.
pub struct Interrupt {
    rt: tokio::runtime::Runtime,
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Interrupt {
    /// Installs the handlers (from now on Ctrl-C no longer kills this process).
    pub fn install() -> std::io::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (int, term) = rt.block_on(async {
            Ok::<_, std::io::Error>((
                signal(SignalKind::interrupt())?,
                signal(SignalKind::terminate())?,
            ))
        })?;
        Ok(Self { rt, int, term })
    }

    /// Sleeps `d`; true when interrupted meanwhile.
    pub fn sleep(&mut self, d: Duration) -> bool {
        let Self { rt, int, term } = self;
        rt.block_on(async {
            tokio::select! {
                _ = int.recv() => true,
                _ = term.recv() => true,
                _ = tokio::time::sleep(d) => false,
            }
        })
    }

    /// Waits until interrupted.
    pub fn wait(&mut self) {
        while !self.sleep(Duration::from_secs(3600)) {}
    }
}

fn io_err<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> Error + 'a {
    move |source| Error::Io {
        action,
        path: path.to_owned(),
        source,
    }
}

/// One row of the status table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRow {
    pub name: String,
    pub phase: String,
    pub ready: usize,
    pub total: usize,
    pub restarts: i64,
    pub ip: String,
}

/// Rows of a `PodList` JSON value (`/pods`).
pub fn pod_rows(list: &serde_json::Value) -> Vec<PodRow> {
    let empty = Vec::new();
    let items = list["items"].as_array().unwrap_or(&empty);
    let mut rows: Vec<PodRow> = items
        .iter()
        .map(|pod| {
            let statuses = pod["status"]["containerStatuses"]
                .as_array()
                .unwrap_or(&empty);
            let total = pod["spec"]["containers"]
                .as_array()
                .map(Vec::len)
                .unwrap_or(statuses.len());
            PodRow {
                name: pod["metadata"]["name"].as_str().unwrap_or("?").to_owned(),
                phase: pod["status"]["phase"].as_str().unwrap_or("-").to_owned(),
                ready: statuses
                    .iter()
                    .filter(|s| s["ready"].as_bool() == Some(true))
                    .count(),
                total,
                restarts: statuses
                    .iter()
                    .filter_map(|s| s["restartCount"].as_i64())
                    .sum(),
                ip: pod["status"]["podIP"].as_str().unwrap_or("-").to_owned(),
            }
        })
        .collect();
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    rows
}

/// The status table as text.
pub fn format_table(rows: &[PodRow]) -> String {
    let name_w = rows.iter().map(|r| r.name.len()).max().unwrap_or(0).max(3);
    let mut out = format!(
        "{:<name_w$}  {:<10}  {:>5}  {:>8}  {}\n",
        "POD", "PHASE", "READY", "RESTARTS", "IP"
    );
    for r in rows {
        out.push_str(&format!(
            "{:<name_w$}  {:<10}  {:>5}  {:>8}  {}\n",
            r.name,
            r.phase,
            format!("{}/{}", r.ready, r.total),
            r.restarts,
            r.ip
        ));
    }
    out
}

fn get_json(port: u16, path: &str) -> Option<(u16, serde_json::Value)> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let resp = crate::http::get(addr, path, Duration::from_secs(5)).ok()?;
    let value = serde_json::from_str(&resp.body).unwrap_or(serde_json::Value::Null);
    Some((resp.status, value))
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_lowercase())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// Runs the demo.
pub fn run(opts: &Options) -> Result<(), Error> {
    let layout = Layout::default();
    let mut interrupt = Interrupt::install().map_err(Error::Signal)?;
    let mut progress = Progress::new(7);
    progress.step("setup", || crate::setup::ensure_all().map(|_| ()))?;
    progress.step("runtime up", || crate::runtime::up(&layout))?;
    progress.step("images", || crate::images::ensure(&layout))?;
    let binary = progress.step("cargo build -p swiftlet", || {
        crate::agent::build_agent(opts.release)
    })?;

    let lib_dir = PathBuf::from("/var/lib/swiftlet-dev");
    let manifest_dir = lib_dir.join("demo-manifests");
    let agent_log = lib_dir.join("agent.log");
    let mut agent = progress.step("start swiftlet", || {
        start_agent(&binary, &manifest_dir, &agent_log, &mut interrupt)
    })?;

    let result = run_pods(
        opts,
        &manifest_dir,
        &mut agent,
        &mut interrupt,
        &mut progress,
    );
    if let Err(e) = &result {
        eprintln!("demo: {e}");
    }
    teardown(
        &layout,
        &manifest_dir,
        &mut agent,
        opts.timeout,
        &mut interrupt,
    );
    result
}

fn start_agent(
    binary: &Path,
    manifest_dir: &Path,
    log: &Path,
    interrupt: &mut Interrupt,
) -> Result<RunningAgent, Error> {
    if manifest_dir.exists() {
        std::fs::remove_dir_all(manifest_dir).map_err(io_err("clearing", manifest_dir))?;
    }
    std::fs::create_dir_all(manifest_dir).map_err(io_err("creating", manifest_dir))?;
    let spec = crate::agent::Spec {
        binary: binary.to_owned(),
        manifest_dir: manifest_dir.to_owned(),
        endpoint: crate::DEFAULT_ENDPOINT.to_owned(),
        root_dir: PathBuf::from("/var/lib/swiftlet-dev/agent"),
        pod_logs_dir: None,
        node: hostname(),
        cgroup_root: CGROUP_ROOT.to_owned(),
        healthz_port: HEALTHZ_PORT,
        read_only_port: READ_ONLY_PORT,
        kubelet_port: 0,
        file_check_frequency: "5s".to_owned(),
        extra_args: Vec::new(),
        log: log.to_owned(),
        own_process_group: true,
        die_with_parent: false,
    };
    let mut agent = spec.spawn(false)?;
    note(format!("pid {}, log {}", agent.child.id(), log.display()));
    let up = crate::agent::wait_healthy(
        &mut agent,
        spec.healthz_addr(),
        Duration::from_secs(30),
        || interrupt.sleep(Duration::from_millis(100)),
    )?;
    if !up {
        return Err(Error::Interrupted);
    }
    Ok(agent)
}

fn run_pods(
    opts: &Options,
    manifest_dir: &Path,
    agent: &mut RunningAgent,
    interrupt: &mut Interrupt,
    progress: &mut Progress,
) -> Result<(), Error> {
    let mut examples: Vec<PathBuf> = std::fs::read_dir(&opts.examples_dir)
        .map_err(io_err("reading", &opts.examples_dir))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    examples.sort();
    let expected = examples.len();
    let (written_at, elapsed) = progress.step(
        &format!("write {expected} manifests and wait until every pod is Running"),
        || {
            let written_at = Instant::now();
            for src in &examples {
                let Some(name) = src.file_name() else {
                    continue;
                };
                let dst = manifest_dir.join(name);
                std::fs::copy(src, &dst).map_err(io_err("copying", src))?;
            }
            loop {
                if let Some((200, list)) = get_json(READ_ONLY_PORT, "/pods") {
                    let rows = pod_rows(&list);
                    if rows.len() >= expected && rows.iter().all(|r| r.phase == "Running") {
                        return Ok((written_at, written_at.elapsed()));
                    }
                }
                if let Some(e) = agent.exited() {
                    return Err(e.into());
                }
                if written_at.elapsed() > opts.timeout {
                    if let Some((_, list)) = get_json(READ_ONLY_PORT, "/pods") {
                        eprintln!("\n{}", format_table(&pod_rows(&list)));
                    }
                    return Err(Error::Timeout {
                        what: "every pod Running".into(),
                        timeout: opts.timeout,
                        log: agent.log.clone(),
                    });
                }
                if interrupt.sleep(Duration::from_millis(20)) {
                    return Err(Error::Interrupted);
                }
            }
        },
    )?;
    let _ = written_at;
    if let Some((_, list)) = get_json(READ_ONLY_PORT, "/pods") {
        println!("\n{}", format_table(&pod_rows(&list)));
    }
    println!(
        "all {expected} pods Running {:.2} s after the manifests were written",
        elapsed.as_secs_f64()
    );
    print_ebpf_summary();
    if !opts.once {
        println!(
            "\nswiftlet is running (log {}). Ctrl-C to tear down.",
            agent.log.display()
        );
        interrupt.wait();
    }
    Ok(())
}

/// Where each pod's start went: the agent's timelines (agent marks, CRI calls and eBPF-observed
/// kernel events on one clock), per pod and as a phase table.
fn print_ebpf_summary() {
    if let Some((200, serde_json::Value::Array(events))) =
        get_json(READ_ONLY_PORT, "/debug/ebpf/cgroups")
    {
        println!("\neBPF saw {} cgroup events", events.len());
    }
    // A container's first exec can land just after Running is observed: give it a moment.
    let deadline = Instant::now() + Duration::from_secs(3);
    let view = loop {
        let view = match get_json(READ_ONLY_PORT, "/debug/trace/pods") {
            Some((200, v)) => v,
            _ => return,
        };
        let complete = view["pods"]
            .as_array()
            .is_some_and(|p| p.iter().all(|t| t["complete"].as_bool() == Some(true)));
        if complete || Instant::now() >= deadline {
            break view;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let report = match crate::report::build_report(&view, |_| true) {
        Ok(r) if !r.pods.is_empty() => r,
        Ok(_) => return,
        Err(e) => {
            note(format!("no startup breakdown: {e}"));
            return;
        }
    };
    println!("\nstartup breakdown (ms; `swiftlet trace list` shows the same):");
    for p in &report.pods {
        let phases: Vec<String> = p
            .phases
            .iter()
            .map(|ph| format!("{} {:.1}", ph.phase, ph.ms))
            .collect();
        println!(
            "  {:<12} {:>7.1}  = {}",
            p.name,
            p.e2e_ms,
            phases.join(", ")
        );
    }
    println!("\n{}", crate::report::phase_table(&report));
}

fn teardown(
    layout: &Layout,
    manifest_dir: &Path,
    agent: &mut RunningAgent,
    timeout: Duration,
    interrupt: &mut Interrupt,
) {
    let mut progress = Progress::new(3);
    let _ = progress.step("remove manifests and wait for the pods to go", || {
        if let Ok(rd) = std::fs::read_dir(manifest_dir) {
            for e in rd.filter_map(Result::ok) {
                let _ = std::fs::remove_file(e.path());
            }
        }
        let start = Instant::now();
        loop {
            match get_json(READ_ONLY_PORT, "/pods") {
                Some((200, list)) if pod_rows(&list).is_empty() => return Ok(()),
                None => return Err("the agent no longer answers".to_owned()),
                _ => {}
            }
            if start.elapsed() > timeout {
                return Err(format!("pods still listed after {timeout:?}"));
            }
            if interrupt.sleep(Duration::from_millis(100)) {
                return Err("interrupted".to_owned());
            }
        }
    });
    let _ = progress.step("stop swiftlet", || {
        if !agent.stop(Duration::from_secs(15)) {
            note("swiftlet did not exit within 15s of SIGTERM: killed");
        }
        Ok::<_, String>(())
    });
    let _ = progress.step("runtime down", || {
        crate::runtime::down(layout).map(|r| note(r.to_string()))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_come_from_a_pod_list() {
        let list = serde_json::json!({
            "kind": "PodList", "apiVersion": "v1", "metadata": {},
            "items": [
                {"metadata": {"name": "web-node"}, "spec": {"containers": [{"name": "a"}, {"name": "b"}]},
                 "status": {"phase": "Running", "podIP": "10.99.0.7", "containerStatuses": [
                    {"name": "a", "ready": true, "restartCount": 1},
                    {"name": "b", "ready": false, "restartCount": 2}]}},
                {"metadata": {"name": "app-node"}, "spec": {"containers": [{"name": "c"}]},
                 "status": {"phase": "Pending"}}
            ]
        });
        let rows = pod_rows(&list);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].name, "app-node");
        assert_eq!((rows[0].ready, rows[0].total), (0, 1));
        assert_eq!(rows[1].restarts, 3);
        assert_eq!((rows[1].ready, rows[1].total), (1, 2));
        assert_eq!(rows[1].ip, "10.99.0.7");
        let table = format_table(&rows);
        assert!(table.lines().nth(2).unwrap().contains("1/2"), "{table}");
        assert!(pod_rows(&serde_json::json!({})).is_empty());
    }
}
