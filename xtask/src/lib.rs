//! xtask library: shared with the integration tests (runtime fixture, images).
//!
//! The binary (`cargo xtask <cmd>`) is a thin clap layer over these modules:
//! - [`setup`]: installs the machine prerequisites idempotently;
//! - [`images`]: builds the local OCI images from the static busybox and imports them;
//! - [`runtime`]: a private containerd (`up`, `down`, `status`);
//! - [`demo`] and [`testrun`]: the `demo` and `test` commands;
//! - [`report`]: `cargo xtask report`, pod startup breakdowns from the eBPF timelines;
//! - [`compare`] and [`figures`]: `cargo xtask bench-compare`, a revision's benches against the
//!   working tree's and the ratios;
//! - [`vm`]: a Debian VM with systemd and a chosen cgroup layout, to run commands in;
//! - [`http`]: a tiny blocking HTTP/1.0 GET client for loopback endpoints.

pub mod agent;
pub mod compare;
pub mod demo;
pub mod deps;
pub mod figures;
pub mod http;
pub mod images;
pub mod layout;
pub mod progress;
pub mod report;
pub mod runtime;
pub mod setup;
pub mod testrun;
pub mod vm;

use std::path::PathBuf;

/// The pause (sandbox) image the private containerd uses as `sandbox_image`.
pub const PAUSE_IMAGE: &str = "localhost/swiftlet/pause:v1";
/// The busybox image the example pods and the tests run.
pub const BUSYBOX_IMAGE: &str = "localhost/swiftlet/busybox:v1";
/// The CRI endpoint of the private containerd started by [`runtime::up`].
pub const DEFAULT_ENDPOINT: &str = "unix:///run/swiftlet-dev/containerd.sock";
/// The containerd namespace the CRI plugin uses.
pub const CRI_NAMESPACE: &str = "k8s.io";
/// Label the agent puts on every sandbox it creates, valued with its node name.
pub const NODE_NAME_LABEL: &str = "swiftlet.io/node-name";

/// The workspace root (the folder holding the top-level `Cargo.toml`).
/// An I/O error with what was being done and to which path.
#[derive(Debug, thiserror::Error)]
#[error("{action} {path}: {source}", path = path.display())]
pub struct PathIoError {
    pub action: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// Wraps an I/O error with `action` and `path` (for `map_err`).
pub fn io_err<'a>(
    action: &'static str,
    path: &'a std::path::Path,
) -> impl FnOnce(std::io::Error) -> PathIoError + 'a {
    move |source| PathIoError {
        action,
        path: path.to_owned(),
        source,
    }
}

pub fn workspace_root() -> PathBuf {
    let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map(PathBuf::from)
        .unwrap_or(manifest_dir)
}

/// The cargo target directory (`CARGO_TARGET_DIR` or `<workspace>/target`).
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                dir
            } else {
                workspace_root().join(dir)
            }
        }
        _ => workspace_root().join("target"),
    }
}

/// The cargo executable to run (`CARGO` as set by cargo, else `cargo` from `PATH`).
pub fn cargo_bin() -> PathBuf {
    std::env::var_os("CARGO")
        .filter(|c| !c.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("cargo"))
}

/// The executables that cargo's `--message-format=json` output `messages` names for the targets
/// `names` (tests or benches), in that order.
pub fn executables_named(messages: &str, names: &[&str]) -> anyhow::Result<Vec<PathBuf>> {
    use anyhow::Context;
    let messages: Vec<serde_json::Value> = messages
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    names
        .iter()
        .map(|name| {
            messages
                .iter()
                .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == *name)
                .find_map(|m| m["executable"].as_str().map(PathBuf::from))
                .with_context(|| format!("cargo named no executable for {name}"))
        })
        .collect()
}

/// Whether this process runs as root (effective uid 0).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// A free loopback TCP port: bound to 127.0.0.1:0, read, released.
pub fn free_loopback_port() -> std::io::Result<u16> {
    // The kernel may hand the same ephemeral port to two binds in a row once the first listener
    // is closed: a port is given out at most once per process, so the two ports of one agent
    // (healthz and read-only) never collide.
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    for _ in 0..64 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())?;
        let mut given = GIVEN
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !given.contains(&port) {
            given.push(port);
            return Ok(port);
        }
    }
    Err(std::io::Error::other(
        "no loopback port not given out before in 64 tries",
    ))
}

/// A static pod whose one container `main` (the local busybox image) loops until SIGTERM and then
/// exits with `exit_code`, so it stops at once; `grace_secs` is its termination grace period.
/// `labels` go beside `app: <name>`. The one looping test pod of the demo report, the tests and
/// the benches.
pub fn looping_pod_manifest(
    name: &str,
    grace_secs: u32,
    exit_code: u8,
    labels: &[(&str, &str)],
) -> String {
    let extra: String = labels
        .iter()
        .map(|(k, v)| format!("    {k}: {v:?}\n"))
        .collect();
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: default
  labels:
    app: {name}
{extra}spec:
  terminationGracePeriodSeconds: {grace_secs}
  containers:
  - name: main
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: Never
    command: ["sh", "-c", "trap 'exit {exit_code}' TERM; while true; do sleep 1; done"]
"#
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn loopback_ports_are_given_out_once() {
        let mut ports: Vec<u16> = (0..200)
            .map(|_| super::free_loopback_port().unwrap())
            .collect();
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), 200);
    }

    #[test]
    fn looping_pod_manifest_carries_its_parameters() {
        let m = super::looping_pod_manifest("p", 3, 7, &[("version", "v2")]);
        assert!(m.contains("name: p\n"), "{m}");
        assert!(m.contains("terminationGracePeriodSeconds: 3\n"), "{m}");
        assert!(m.contains("trap 'exit 7' TERM"), "{m}");
        assert!(m.contains("    version: \"v2\"\n"), "{m}");
    }
}
