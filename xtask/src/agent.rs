//! A swiftlet process started by xtask's commands (the demo, the reports), the integration tests
//! or the benches: building it, the flags it is started with, waiting for it to answer, its log,
//! stopping it.
use std::ffi::OsString;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Errors of an agent process, with what was being done.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Io(#[from] crate::PathIoError),
    #[error("`cargo build -p swiftlet --bin {bin}` failed with {status}")]
    Build {
        bin: String,
        status: std::process::ExitStatus,
    },
    #[error(
        "{path} is not built ({PREBUILT_ENV} is set: nothing is built here; build it on the \
         host first)",
        path = path.display()
    )]
    NotBuilt { path: PathBuf },
    #[error("swiftlet exited ({status}); last lines of {log}:\n{tail}", log = log.display())]
    AgentExited {
        status: std::process::ExitStatus,
        log: PathBuf,
        tail: String,
    },
    #[error("timed out after {timeout:?} waiting for {what}; last lines of {log}:\n{tail}", log = log.display())]
    Timeout {
        what: String,
        timeout: Duration,
        log: PathBuf,
        tail: String,
    },
}

/// Set (to anything) where there is no cargo, as in the VM: [`build`] then only finds the
/// binary the host built beforehand in the target directory.
pub const PREBUILT_ENV: &str = "SWIFTLET_PREBUILT";

/// Builds binary `bin` of the swiftlet package with cargo (debug, or `--release`); returns its
/// path. Cargo's progress goes to stderr; cargo makes a fresh build quick.
pub fn build(bin: &str, release: bool) -> Result<PathBuf, Error> {
    let profile = if release { "release" } else { "debug" };
    let path = crate::target_dir().join(profile).join(bin);
    if std::env::var_os(PREBUILT_ENV).is_some() {
        return if path.is_file() {
            Ok(path)
        } else {
            Err(Error::NotBuilt { path })
        };
    }
    let mut cmd = Command::new(crate::cargo_bin());
    cmd.current_dir(crate::workspace_root())
        .args(["build", "-p", "swiftlet", "--bin", bin]);
    if release {
        cmd.arg("--release");
    }
    let status = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .map_err(crate::io_err("running", Path::new("cargo")))?;
    if !status.success() {
        return Err(Error::Build {
            bin: bin.to_owned(),
            status,
        });
    }
    Ok(path)
}

/// Builds the agent binary (`swiftlet`); returns its path.
pub fn build_agent(release: bool) -> Result<PathBuf, Error> {
    build("swiftlet", release)
}

/// How an agent is started: the flags every agent started from this workspace is given, and
/// where its output goes.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The agent binary.
    pub binary: PathBuf,
    /// `--pod-manifest-path`.
    pub manifest_dir: PathBuf,
    /// `--container-runtime-endpoint`.
    pub endpoint: String,
    /// `--root-dir`.
    pub root_dir: PathBuf,
    /// `--pod-logs-dir`; `None`: the agent's default.
    pub pod_logs_dir: Option<PathBuf>,
    /// `--hostname-override`.
    pub node: String,
    /// `--cgroup-root`.
    pub cgroup_root: String,
    /// `--healthz-port` (on loopback).
    pub healthz_port: u16,
    /// `--read-only-port` (on loopback).
    pub read_only_port: u16,
    /// `--port` of the kubelet API (TLS, on 127.0.0.1); 0: off, so that agents started side by
    /// side do not all ask for 10250.
    pub kubelet_port: u16,
    /// `--file-check-frequency`.
    pub file_check_frequency: String,
    /// Flags after the ones above.
    pub extra_args: Vec<String>,
    /// The file stdout and stderr go to.
    pub log: PathBuf,
    /// Start the agent in a process group of its own, so that a Ctrl-C in the terminal reaches
    /// the caller (which then tears down in order) and not the agent.
    pub own_process_group: bool,
    /// SIGTERM the agent when the thread that started it ends (`PR_SET_PDEATHSIG`): a test or
    /// bench killed by a signal takes its agent with it instead of leaving it to recreate its
    /// pods beside the next run's. Only for callers that start and stop an agent on one thread.
    pub die_with_parent: bool,
}

impl Spec {
    /// The command-line arguments (without the binary).
    pub fn args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = Vec::with_capacity(24);
        let mut flag = |name: &str, value: OsString| {
            args.push(name.into());
            args.push(value);
        };
        flag("--pod-manifest-path", self.manifest_dir.clone().into());
        flag("--container-runtime-endpoint", self.endpoint.clone().into());
        flag("--root-dir", self.root_dir.clone().into());
        if let Some(dir) = &self.pod_logs_dir {
            flag("--pod-logs-dir", dir.clone().into());
        }
        flag("--hostname-override", self.node.clone().into());
        flag("--cgroup-root", self.cgroup_root.clone().into());
        flag("--healthz-port", self.healthz_port.to_string().into());
        flag("--read-only-port", self.read_only_port.to_string().into());
        flag("--port", self.kubelet_port.to_string().into());
        if self.kubelet_port != 0 {
            flag("--address", "127.0.0.1".into());
        }
        flag(
            "--file-check-frequency",
            self.file_check_frequency.clone().into(),
        );
        args.extend(self.extra_args.iter().map(OsString::from));
        args
    }

    /// The healthz server's address.
    pub fn healthz_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.healthz_port))
    }

    /// The read-only server's address (`/pods`, `/metrics`, `/debug/...`).
    pub fn read_only_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.read_only_port))
    }

    /// Starts the agent; its output truncates the log file, or is appended to it when `append`.
    pub fn spawn(&self, append: bool) -> Result<RunningAgent, Error> {
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(&self.log)
            .map_err(crate::io_err("opening", &self.log))?;
        let log_err = log_file
            .try_clone()
            .map_err(crate::io_err("opening", &self.log))?;
        let mut cmd = Command::new(&self.binary);
        cmd.args(self.args())
            .stdin(Stdio::null())
            .stdout(log_file)
            .stderr(log_err);
        if self.own_process_group {
            cmd.process_group(0);
        }
        if self.die_with_parent {
            // SAFETY: prctl(2) is async-signal-safe and touches no memory of the parent.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = cmd
            .spawn()
            .map_err(crate::io_err("starting", &self.binary))?;
        Ok(RunningAgent {
            child,
            log: self.log.clone(),
        })
    }

    /// Starts the agent (see [`Spec::spawn`]) and waits up to `timeout` for its healthz to
    /// answer `ok`, polling every 50 ms (the agent is stopped when it does not).
    pub fn start(&self, append: bool, timeout: Duration) -> Result<RunningAgent, Error> {
        let mut agent = self.spawn(append)?;
        wait_healthy(&mut agent, self.healthz_addr(), timeout, || {
            std::thread::sleep(Duration::from_millis(50));
            false
        })?;
        Ok(agent)
    }
}

/// A running swiftlet process, with its log file.
#[derive(Debug)]
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
                tail: tail(&self.log, 40),
            }),
            _ => None,
        }
    }

    /// SIGTERM, then SIGKILL when it has not exited within `timeout`. False when it had to be
    /// killed.
    pub fn stop(&mut self, timeout: Duration) -> bool {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: kill(2) on our own child's pid (> 1); no memory is involved.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        false
    }

    /// SIGKILL (the agent cleans nothing up), and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }
}

/// The last `lines` lines of the file at `path` (empty when it cannot be read).
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Whether the agent's healthz endpoint at `addr` answers `ok` now.
pub fn healthy(addr: SocketAddr) -> bool {
    crate::http::get(addr, "/healthz", Duration::from_secs(2))
        .is_ok_and(|r| r.status == 200 && r.body.trim() == "ok")
}

/// Polls the agent's healthz at `addr` until it answers `ok`, the agent exits, or `timeout`
/// passes (then the agent is stopped). `interrupted` is asked between polls (and is where the
/// caller pauses); when it says yes the agent is stopped and `Ok(false)` returned.
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
            agent.stop(Duration::from_secs(15));
            return Err(Error::Timeout {
                what: format!("GET http://{addr}/healthz == ok"),
                timeout,
                log: agent.log.clone(),
                tail: agent.log_tail(40),
            });
        }
        if interrupted() {
            agent.stop(Duration::from_secs(15));
            return Ok(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> Spec {
        Spec {
            binary: PathBuf::from("/bin/swiftlet"),
            manifest_dir: PathBuf::from("/m"),
            endpoint: "unix:///run/c.sock".into(),
            root_dir: PathBuf::from("/r"),
            pod_logs_dir: None,
            node: "n1".into(),
            cgroup_root: "/cg".into(),
            healthz_port: 11,
            read_only_port: 12,
            kubelet_port: 0,
            file_check_frequency: "1s".into(),
            extra_args: vec!["-v".into(), "4".into()],
            log: PathBuf::from("/tmp/l"),
            own_process_group: false,
            die_with_parent: false,
        }
    }

    #[test]
    fn the_flags_follow_the_spec() {
        let mut s = spec();
        let args = |s: &Spec| -> Vec<String> {
            s.args()
                .into_iter()
                .map(|a| a.into_string().unwrap())
                .collect()
        };
        assert_eq!(
            args(&s).join(" "),
            "--pod-manifest-path /m --container-runtime-endpoint unix:///run/c.sock \
             --root-dir /r --hostname-override n1 --cgroup-root /cg --healthz-port 11 \
             --read-only-port 12 --port 0 --file-check-frequency 1s -v 4"
        );
        s.pod_logs_dir = Some(PathBuf::from("/r/logs"));
        assert!(
            args(&s)
                .join(" ")
                .contains("--root-dir /r --pod-logs-dir /r/logs --hostname")
        );
        assert_eq!(s.read_only_addr().to_string(), "127.0.0.1:12");
    }

    #[test]
    fn a_process_that_exits_is_reported_with_its_log() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("agent.sh");
        std::fs::write(&script, "#!/bin/sh\necho \"started with $*\"\nexit 3\n").unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let mut s = spec();
        s.binary = script;
        s.log = dir.path().join("agent.log");
        s.healthz_port = crate::free_loopback_port().unwrap();
        let err = s.start(false, Duration::from_secs(20)).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("swiftlet exited (exit status: 3)"), "{text}");
        assert!(
            text.contains("started with --pod-manifest-path /m"),
            "{text}"
        );
        // Appending keeps the first run's output.
        let _ = s.start(true, Duration::from_secs(20)).unwrap_err();
        let log = std::fs::read_to_string(&s.log).unwrap();
        assert_eq!(log.matches("started with").count(), 2, "{log}");
    }
}
