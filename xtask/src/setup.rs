//! `cargo xtask setup`: installs what is missing, idempotently, saying what it did.

use std::process::{Command, Stdio};

use crate::progress::{Progress, note};

/// Debian packages the runtime, the images and the build need.
pub const APT_PACKAGES: &[&str] = &[
    "containerd",
    "runc",
    "containernetworking-plugins",
    "busybox-static",
    "protobuf-compiler",
    "iproute2",
    // The font `cargo xtask report` draws its charts' text with.
    "fonts-dejavu-core",
    // The pull-credential tests' private registry (TLS, htpasswd) and the push into it.
    "docker-registry",
    "skopeo",
    "apache2-utils",
    "openssl",
    // The real clients of the API server stand-in and of the metrics endpoints (tests/api_*.rs,
    // tests/prometheus.rs).
    "kubectl",
    "prometheus",
    // `systemd-analyze verify` of the unit file in deploy/ (tests/deploy.rs).
    "systemd",
    // The VM the cgroup tests run in on the unified v2 hierarchy (`cargo xtask vm`).
    "qemu-system-x86",
    "debootstrap",
];
/// The bpf-linker version that links through the nightly's LLVM (see docs/machine.md).
pub const BPF_LINKER_VERSION: &str = "0.10.0";

/// Errors of the set-up, each naming the command that failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "setup must run as root (it installs Debian packages); run `sudo -E cargo xtask setup`, \
         or install by hand: `apt-get update && apt-get install -y {packages}`, \
         `rustup toolchain install <the channel of agent-ebpf/rust-toolchain.toml> --profile \
         minimal --component rust-src`, \
         `cargo install bpf-linker --version {BPF_LINKER_VERSION} --locked`",
        packages = APT_PACKAGES.join(" ")
    )]
    NotRoot,
    #[error("could not run `{command}`: {source}")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{command}` failed with {status}")]
    Failed {
        command: String,
        status: std::process::ExitStatus,
    },
}

/// What one `setup` run did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// Debian packages that were installed by this run.
    pub installed_packages: Vec<String>,
    /// Whether `rust-src` was added to the nightly toolchain.
    pub added_rust_src: bool,
    /// Whether bpf-linker was installed.
    pub installed_bpf_linker: bool,
}

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs `cmd` with inherited stdio (stdout moved to stderr so progress stays readable).
pub(crate) fn run(cmd: &mut Command) -> Result<(), Error> {
    let command = describe(cmd);
    let status = cmd
        .stdin(Stdio::null())
        .status()
        .map_err(|source| Error::Spawn {
            command: command.clone(),
            source,
        })?;
    if status.success() {
        Ok(())
    } else {
        Err(Error::Failed { command, status })
    }
}

/// Runs `cmd` quietly and says whether it exited 0 (false when it cannot run at all).
pub(crate) fn succeeds(cmd: &mut Command) -> bool {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs `cmd` and returns its stdout when it exits 0.
pub(crate) fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Debian packages of [`APT_PACKAGES`] that `dpkg -s` does not report as installed.
pub fn missing_packages() -> Vec<&'static str> {
    APT_PACKAGES
        .iter()
        .copied()
        .filter(|p| {
            output(Command::new("dpkg").args(["-s", p])).is_none_or(|o| {
                !o.lines()
                    .any(|l| l.trim() == "Status: install ok installed")
            })
        })
        .collect()
}

/// The dated nightly the probes build with: the `channel` of `agent-ebpf/rust-toolchain.toml`
/// (agent/build.rs reads the same line).
pub fn pinned_nightly() -> String {
    let file = crate::workspace_root().join("agent-ebpf/rust-toolchain.toml");
    std::fs::read_to_string(&file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().strip_prefix("channel"))
        .filter_map(|l| l.trim_start().strip_prefix('='))
        .map(|v| v.trim().trim_matches('"').to_owned())
        .find(|v| v.starts_with("nightly-"))
        .unwrap_or_else(|| "nightly".to_owned())
}

fn rust_src_installed(toolchain: &str) -> bool {
    output(Command::new("rustup").args([
        "component",
        "list",
        "--toolchain",
        toolchain,
        "--installed",
    ]))
    .is_some_and(|o| o.lines().any(|l| l.trim().starts_with("rust-src")))
}

fn bpf_linker_installed() -> bool {
    output(Command::new("bpf-linker").arg("--version"))
        .is_some_and(|o| o.contains(BPF_LINKER_VERSION))
}

/// Installs the Debian packages only (what the runtime and the images need).
pub fn ensure_packages(report: &mut Report) -> Result<(), Error> {
    let missing = missing_packages();
    if missing.is_empty() {
        note("apt packages: all present");
        return Ok(());
    }
    if !crate::is_root() {
        return Err(Error::NotRoot);
    }
    note(format!("apt packages: installing {}", missing.join(" ")));
    run(Command::new("apt-get").arg("update").stdout(Stdio::null()))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdout(Stdio::null()))?;
    report
        .installed_packages
        .extend(missing.iter().map(|s| s.to_string()));
    Ok(())
}

/// Installs the pinned nightly with `rust-src` when missing (the probes build with
/// `-Z build-std`).
pub fn ensure_rust_src(report: &mut Report) -> Result<(), Error> {
    let toolchain = pinned_nightly();
    if rust_src_installed(&toolchain) {
        note(format!("{toolchain} with rust-src: present"));
        return Ok(());
    }
    note(format!("{toolchain} with rust-src: installing"));
    run(Command::new("rustup").args([
        "toolchain",
        "install",
        &toolchain,
        "--profile",
        "minimal",
        "--component",
        "rust-src",
    ]))?;
    report.added_rust_src = true;
    Ok(())
}

/// Installs bpf-linker when missing.
pub fn ensure_bpf_linker(report: &mut Report) -> Result<(), Error> {
    if bpf_linker_installed() {
        note(format!("bpf-linker {BPF_LINKER_VERSION}: present"));
        return Ok(());
    }
    note(format!("bpf-linker {BPF_LINKER_VERSION}: installing"));
    run(Command::new(crate::cargo_bin()).args([
        "install",
        "bpf-linker",
        "--version",
        BPF_LINKER_VERSION,
        "--locked",
    ]))?;
    report.installed_bpf_linker = true;
    Ok(())
}

/// Installs everything that is missing, without progress lines of its own (for use inside
/// another command's step). Fails with [`Error::NotRoot`] when not root.
pub fn ensure_all() -> Result<Report, Error> {
    if !crate::is_root() {
        return Err(Error::NotRoot);
    }
    let mut report = Report::default();
    ensure_packages(&mut report)?;
    ensure_rust_src(&mut report)?;
    ensure_bpf_linker(&mut report)?;
    Ok(report)
}

/// Installs everything that is missing: apt packages, nightly rust-src, bpf-linker.
///
/// Fails with [`Error::NotRoot`] (explaining what to run) when not root.
pub fn run_all(progress: &mut Progress) -> Result<Report, Error> {
    if !crate::is_root() {
        return Err(Error::NotRoot);
    }
    let mut report = Report::default();
    progress.step("apt packages", || ensure_packages(&mut report))?;
    progress.step("the probes' nightly with rust-src", || {
        ensure_rust_src(&mut report)
    })?;
    progress.step("bpf-linker", || ensure_bpf_linker(&mut report))?;
    Ok(report)
}
