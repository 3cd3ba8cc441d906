//! `swiftlet trace` (also installed as `swiftlet-trace`): print pod startup timelines from a
//! running swiftlet (the `swiftlet.v1.PodTrace` gRPC service on `<root-dir>/pod-trace.sock`).
//!
//! ```text
//! swiftlet trace list              # the same, as a subcommand of the agent binary
//! swiftlet-trace list              # every pod: end-to-end time and its phases
//! swiftlet-trace get <UID>         # one pod, with its raw marks (CRI calls, execs, exits)
//! swiftlet-trace watch             # timelines as pods start and stop
//! ```
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use swiftlet_proto::v1 as proto;
use swiftlet_proto::v1::pod_trace_client::PodTraceClient;

/// Print pod startup timelines (phases on the kernel's clock) from a running swiftlet.
#[derive(Debug, Parser)]
#[command(name = "swiftlet-trace", version)]
struct Args {
    /// The agent's --root-dir (the socket is <root-dir>/pod-trace.sock).
    #[arg(long, value_name = "DIR", default_value = "/var/lib/swiftlet")]
    root_dir: PathBuf,
    /// The PodTrace socket (overrides --root-dir).
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Print JSON (one timeline per line) instead of tables.
    #[arg(long)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Every timeline the agent holds.
    List,
    /// One pod's timeline, with its raw marks.
    Get { uid: String },
    /// Timelines as pods start and stop (Ctrl-C ends).
    Watch,
}

#[derive(Debug, thiserror::Error)]
enum Error {
    #[error(transparent)]
    Connect(#[from] crate::cri::Error),
    #[error("PodTrace at {socket}: {status}")]
    Call {
        socket: String,
        status: Box<tonic::Status>,
    },
    #[error("encoding JSON: {0}")]
    Json(#[from] serde_json::Error),
}

#[derive(serde::Serialize)]
struct PhaseJson<'a> {
    phase: &'a str,
    ms: f64,
    observer: &'a str,
}

#[derive(serde::Serialize)]
struct MarkJson<'a> {
    name: &'a str,
    at_ns: u64,
    observer: &'a str,
    detail: &'a str,
}

#[derive(serde::Serialize)]
struct TimelineJson<'a> {
    uid: &'a str,
    namespace: &'a str,
    name: &'a str,
    e2e_ms: f64,
    complete: bool,
    phases: Vec<PhaseJson<'a>>,
    marks: Vec<MarkJson<'a>>,
}

fn phase_ms(p: &proto::Phase) -> f64 {
    p.end_ns.saturating_sub(p.start_ns) as f64 / 1e6
}

fn to_json(t: &proto::PodTimeline) -> Result<String, Error> {
    Ok(serde_json::to_string(&TimelineJson {
        uid: &t.uid,
        namespace: &t.namespace,
        name: &t.name,
        e2e_ms: t.e2e_ms,
        complete: t.complete,
        phases: t
            .phases
            .iter()
            .map(|p| PhaseJson {
                phase: &p.name,
                ms: phase_ms(p),
                observer: &p.observer,
            })
            .collect(),
        marks: t
            .marks
            .iter()
            .map(|m| MarkJson {
                name: &m.name,
                at_ns: m.at_ns,
                observer: &m.observer,
                detail: &m.detail,
            })
            .collect(),
    })?)
}

/// A table of the phases with a bar scaled to the end-to-end time.
fn print_table(t: &proto::PodTimeline, marks: bool) {
    const WIDTH: f64 = 40.0;
    let state = if t.complete { "" } else { " (incomplete)" };
    println!(
        "{}/{} uid={} e2e={:.2} ms{state}",
        t.namespace, t.name, t.uid, t.e2e_ms
    );
    let total: f64 = t.phases.iter().map(phase_ms).sum::<f64>().max(1e-9);
    let mut offset = 0.0;
    for p in &t.phases {
        let ms = phase_ms(p);
        let lead = ((offset / total) * WIDTH).round() as usize;
        let len = (((ms / total) * WIDTH).round() as usize).max(1);
        println!(
            "  {:<34} {:>9.3} ms  {:<6} {}{}",
            p.name,
            ms,
            p.observer,
            " ".repeat(lead.min(WIDTH as usize)),
            "#".repeat(len)
        );
        offset += ms;
    }
    if marks {
        let start = t.phases.first().map_or(0, |p| p.start_ns);
        for m in &t.marks {
            let rel = (m.at_ns as f64 - start as f64) / 1e6;
            println!(
                "  @{rel:>+12.3} ms  {:<28} {:<6} {}",
                m.name, m.observer, m.detail
            );
        }
    }
}

fn show(t: &proto::PodTimeline, json: bool, marks: bool) -> Result<(), Error> {
    if json {
        println!("{}", to_json(t)?);
    } else {
        print_table(t, marks);
    }
    Ok(())
}

async fn run(args: Args) -> Result<(), Error> {
    let socket = args
        .socket
        .unwrap_or_else(|| crate::trace::server::socket_path(&args.root_dir));
    let shown = socket.display().to_string();
    let call_err = |status| Error::Call {
        socket: shown.clone(),
        status: Box::new(status),
    };
    let channel = crate::cri::channel(&format!("unix://{shown}"))?;
    let mut client = PodTraceClient::new(channel);
    match args.command {
        Command::List => {
            let list = client
                .list_pod_timelines(proto::ListPodTimelinesRequest {})
                .await
                .map_err(call_err)?
                .into_inner();
            if !args.json {
                println!(
                    "probes loaded: {}, events lost: {}",
                    list.probes_loaded, list.events_lost
                );
            }
            for t in &list.timelines {
                show(t, args.json, false)?;
            }
        }
        Command::Get { uid } => {
            let t = client
                .get_pod_timeline(proto::GetPodTimelineRequest { uid })
                .await
                .map_err(call_err)?
                .into_inner();
            show(&t, args.json, true)?;
        }
        Command::Watch => {
            let mut stream = client
                .watch_pod_timelines(proto::WatchPodTimelinesRequest {})
                .await
                .map_err(call_err)?
                .into_inner();
            while let Some(t) = stream.message().await.map_err(call_err)? {
                show(&t, args.json, false)?;
            }
        }
    }
    Ok(())
}

/// Runs the client on `args` (the first item is the program name, as with `std::env::args_os`).
pub fn main<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let args = Args::parse_from(args);
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("swiftlet-trace: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("swiftlet-trace: {e}");
            ExitCode::FAILURE
        }
    }
}
