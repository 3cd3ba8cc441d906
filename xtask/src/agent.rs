//! A swiftlet process started by an xtask command (the demo, the reports): building the agent,
//! waiting for it to answer, its log, stopping it.
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::progress::note;

/// Errors of an agent process, with what was being done.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Io(#[from] crate::PathIoError),
    #[error("`cargo build -p swiftlet` failed with {0}")]
    Build(std::process::ExitStatus),
    #[error("swiftlet exited ({status}); last lines of {log}:\n{tail}", log = log.display())]
    AgentExited {
        status: std::process::ExitStatus,
        log: PathBuf,
        tail: String,
    },
    #[error("timed out after {timeout:?} waiting for {what}; agent log: {log}", log = log.display())]
    Timeout {
        what: String,
        timeout: Duration,
        log: PathBuf,
    },
}

/// A swiftlet process started by an xtask command, with its log file.
pub struct RunningAgent {
    pub child: Child,
    pub log: PathBuf,
}

impl RunningAgent {
    /// The error describing its exit, once it has exited.
    pub fn exited(&mut self) -> Option<Error> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(Error::AgentExited {
                status,
                log: self.log.clone(),
                tail: tail(&self.log, 30),
            }),
            _ => None,
        }
    }

    /// SIGTERM, then SIGKILL after 15 s.
    pub fn stop(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: kill(2) on our own child's pid (> 1); no memory is involved.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        note("swiftlet did not exit within 15s of SIGTERM: killing it");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Builds the agent with cargo; returns the binary path.
pub fn build_agent(release: bool) -> Result<PathBuf, Error> {
    let mut cmd = Command::new(crate::cargo_bin());
    cmd.current_dir(crate::workspace_root())
        .args(["build", "-p", "swiftlet", "--bin", "swiftlet"]);
    if release {
        cmd.arg("--release");
    }
    let status = cmd
        .stdin(Stdio::null())
        .status()
        .map_err(crate::io_err("running", Path::new("cargo")))?;
    if !status.success() {
        return Err(Error::Build(status));
    }
    let profile = if release { "release" } else { "debug" };
    Ok(crate::target_dir().join(profile).join("swiftlet"))
}

/// Whether the agent's healthz endpoint at `addr` answers `ok` now.
pub fn healthy(addr: SocketAddr) -> bool {
    crate::http::get(addr, "/healthz", Duration::from_secs(2))
        .is_ok_and(|r| r.status == 200 && r.body.trim() == "ok")
}

/// Polls the agent's healthz at `addr` every `every` until it answers `ok`, the agent exits, or
/// `timeout` passes (then the agent is stopped). `interrupted` is asked between polls; when it says
/// yes the agent is stopped and `Ok(false)` returned.
pub fn wait_healthy(
    agent: &mut RunningAgent,
    addr: SocketAddr,
    timeout: Duration,
    mut interrupted: impl FnMut() -> bool,
) -> Result<bool, Error> {
    let deadline = Instant::now() + timeout;
    loop {
        if healthy(addr) {
            return Ok(true);
        }
        if let Some(e) = agent.exited() {
            return Err(e);
        }
        if Instant::now() >= deadline {
            agent.stop();
            return Err(Error::Timeout {
                what: "GET /healthz == ok".into(),
                timeout,
                log: agent.log.clone(),
            });
        }
        if interrupted() {
            agent.stop();
            return Ok(false);
        }
    }
}
