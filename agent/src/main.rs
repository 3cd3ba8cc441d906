use swiftlet::cli;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

fn init_logging(verbosity: u8, format: &str) {
    use std::io::IsTerminal;
    let default = match verbosity {
        0..=2 => "info",
        3..=4 => "swiftlet=debug,info",
        _ => "swiftlet=trace,debug",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if format == "json" {
        logs.json().flatten_event(true).init();
    } else {
        logs.with_ansi(std::io::stderr().is_terminal()).init();
    }
}

/// Raises the soft open-file limit to the hard one, as the Go runtime does for the kubelet at
/// its start: the agent holds a socket per stream and, for the stats summary, cgroup files kept
/// open (a quarter of the limit at most).
fn raise_open_file_limit() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        let raised = Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        if let Err(e) = setrlimit(Resource::Nofile, raised) {
            tracing::warn!(error = %e, "raising the open-file limit to the hard limit");
        }
    }
}

fn main() -> std::process::ExitCode {
    // Before any thread or large allocation: large blocks go back to the system when freed, and
    // few arenas keep what was freed.
    swiftlet::memory::fix_allocator();
    // `swiftlet trace ...` is the timeline client; everything else is the agent's kubelet flags.
    if std::env::args_os().nth(1).is_some_and(|a| a == "trace") {
        let args = std::iter::once(std::ffi::OsString::from("swiftlet trace"))
            .chain(std::env::args_os().skip(2));
        return swiftlet::trace::cli::main(args);
    }
    let (flags, config) = match cli::parse(std::env::args_os()) {
        Ok(parsed) => parsed,
        // --help, --version and refused flags, printed and exited as clap does.
        Err(cli::Error::Usage(e)) => e.exit(),
        Err(e) => {
            eprintln!("swiftlet: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    init_logging(flags.verbosity, &flags.logging_format);
    raise_open_file_limit();
    let cfg = match cli::AgentConfig::new(flags, config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("swiftlet: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("swiftlet: starting the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    rt.block_on(async move {
        let cancel = CancellationToken::new();
        let signals = cancel.clone();
        tokio::spawn(async move {
            use tokio::signal::unix::{SignalKind, signal};
            let (Ok(mut term), Ok(mut int)) = (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) else {
                tracing::error!("cannot install signal handlers");
                return;
            };
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
                _ = int.recv() => tracing::info!("SIGINT: shutting down"),
            }
            signals.cancel();
        });
        match swiftlet::agent::run(cfg, cancel).await {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!("{e}");
                eprintln!("swiftlet: {e}");
                std::process::ExitCode::FAILURE
            }
        }
    })
}
