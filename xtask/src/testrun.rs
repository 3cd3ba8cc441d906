//! `cargo xtask test`: runtime up, images, `cargo test --workspace` (less the probe crate),
//! runtime down (always), the cgroup tests again in a VM on cgroup v2, then the agent built
//! without its eBPF feature.

use std::process::{Command, Stdio};

use crate::progress::{Progress, note};
use crate::runtime::Layout;

/// Set for the tests: a missing prerequisite fails instead of skipping.
pub const REQUIRE_RUNTIME_ENV: &str = "SWIFTLET_REQUIRE_RUNTIME";

/// Errors of the test command.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Setup(#[from] crate::setup::Error),
    #[error(transparent)]
    Runtime(#[from] crate::runtime::Error),
    #[error(transparent)]
    Images(#[from] crate::images::Error),
    #[error("running cargo test: {0}")]
    Cargo(std::io::Error),
}

/// Whether the tests must fail (not skip) when the runtime is unavailable.
pub fn require_runtime() -> bool {
    let set = |k: &str| std::env::var(k).is_ok_and(|v| !v.is_empty() && v != "0" && v != "false");
    set(REQUIRE_RUNTIME_ENV) || std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Runs the workspace tests against the private containerd; returns cargo test's exit code.
pub fn run(extra_args: &[String]) -> Result<i32, Error> {
    let layout = Layout::default();
    let require = require_runtime();
    let prepared = if crate::is_root() {
        let mut progress = Progress::new(3);
        progress.step("setup", || crate::setup::ensure_all().map(|_| ()))?;
        progress.step("runtime up", || crate::runtime::up(&layout))?;
        progress.step("images", || crate::images::ensure(&layout))?;
        true
    } else if require {
        return Err(crate::setup::Error::NotRoot.into());
    } else {
        note("not root: the runtime tests will skip (run as root to include them)");
        false
    };

    let mut cmd = Command::new(crate::cargo_bin());
    cmd.current_dir(crate::workspace_root())
        // The probe crate builds only for bpfel-unknown-none (the agent's build.rs builds it).
        .args(["test", "--workspace", "--exclude", "swiftlet-ebpf"])
        .args(["--no-fail-fast"])
        .args(extra_args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    if require {
        cmd.env(REQUIRE_RUNTIME_ENV, "1");
    }
    eprintln!(
        "running cargo test --workspace --exclude swiftlet-ebpf {}",
        extra_args.join(" ")
    );
    let mut totals = Totals::default();
    let status = cmd.spawn().and_then(|mut child| {
        if let Some(out) = child.stdout.take() {
            // Echo every line and add up cargo's per-binary `test result:` lines.
            for line in std::io::BufRead::lines(std::io::BufReader::new(out)).map_while(Result::ok)
            {
                println!("{line}");
                totals.add_line(&line);
            }
        }
        child.wait()
    });

    if prepared {
        let mut progress = Progress::new(1);
        let _ = progress.step("runtime down", || {
            crate::runtime::down(&layout).map(|r| note(r.to_string()))
        });
    }
    let status = status.map_err(Error::Cargo)?;
    let mut code = status.code().unwrap_or(1);
    let skip_vm = std::env::var(VM_ENV).is_ok_and(|v| v == "0");
    if prepared && extra_args.is_empty() && !skip_vm {
        match in_vm(&mut totals) {
            Ok(rc) => code = code.max(rc),
            Err(e) => {
                eprintln!("the tests in the VM: {e:#}");
                code = code.max(1);
            }
        }
    }
    let mut progress = Progress::new(1);
    if let Err(e) = progress.step("build without eBPF", without_ebpf) {
        eprintln!("{e}");
        code = code.max(1);
    }
    // The closing line: the whole workspace's count, after the tear-down output.
    println!(
        "summary: {} passed, {} failed, {} skipped",
        totals.passed, totals.failed, totals.ignored
    );
    Ok(code)
}

/// The integration tests run again in the VM: those that read and write cgroup files, on the
/// unified v2 hierarchy (this machine's own is hybrid and cannot be switched: docs/machine.md),
/// and the installation as a service, which needs systemd as PID 1.
pub const VM_TESTS: &[&str] = &["cgroups", "deploy", "systemd_driver"];
/// Those of [`VM_TESTS`] run a second time on a guest booted with the v1 hierarchies: the
/// systemd cgroup driver, whose unit properties differ per layout (the cgroupfs driver's v1
/// layout is this machine's own, tested on the host).
pub const VM_V1_TESTS: &[&str] = &["systemd_driver"];
/// Set to `0` to leave the VM out of `cargo xtask test`.
pub const VM_ENV: &str = "SWIFTLET_VM_TESTS";

/// Builds what the guest runs (it has no cargo), boots the VM with cgroup v2 and runs
/// [`VM_TESTS`] there, then with v1 for [`VM_V1_TESTS`]; their `test result:` lines join
/// `totals`. Returns the first failed job's exit code, or 0.
pub fn in_vm(totals: &mut Totals) -> anyhow::Result<i32> {
    use anyhow::Context;
    let mut progress = Progress::new(3);
    let exes = progress.step("build the agent and the VM's test binaries", || {
        let status = Command::new(crate::cargo_bin())
            .current_dir(crate::workspace_root())
            .args(["build", "-p", "swiftlet", "--bin", "swiftlet", "--bin"])
            .arg("swiftlet-trace")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status()
            .context("running cargo build")?;
        anyhow::ensure!(status.success(), "cargo build failed ({status})");
        test_executables(VM_TESTS)
    })?;
    let img = crate::vm::image()?;
    let mut rc = 0;
    for (cgroups, layout, names) in [
        (crate::vm::Cgroups::V2, "cgroup v2", VM_TESTS),
        (crate::vm::Cgroups::V1, "cgroup v1", VM_V1_TESTS),
    ] {
        let mut command = String::from("rc=0\n");
        for (exe, _) in exes.iter().zip(VM_TESTS).filter(|(_, n)| names.contains(n)) {
            command.push_str(&format!("{} 2>&1 || rc=1\n", exe.to_string_lossy()));
        }
        command.push_str("exit $rc");
        let target = crate::target_dir();
        let job = crate::vm::Job {
            command,
            cwd: crate::workspace_root(),
            shares: vec![target.clone()],
            env: vec![
                (crate::agent::PREBUILT_ENV.to_owned(), "1".to_owned()),
                (
                    "CARGO_TARGET_DIR".to_owned(),
                    target.to_string_lossy().into(),
                ),
                (REQUIRE_RUNTIME_ENV.to_owned(), "1".to_owned()),
            ],
            cgroups,
            kvm: false,
            timeout: std::time::Duration::from_secs(40 * 60),
            memory_mib: 4096,
            cpus: 2,
        };
        let (code, out) = progress.step(
            &format!("the VM's tests ({layout}, systemd): {names:?}"),
            || crate::vm::run(&img, &job),
        )?;
        for line in out.lines() {
            totals.add_line(line);
        }
        if code != 0 && rc == 0 {
            rc = code;
        }
    }
    Ok(rc)
}

/// The executables of integration tests `names` of the tests crate, built by one cargo call
/// with the packages of [`run`]'s own (`--workspace`): the same features, so the executables
/// the host ran are found fresh instead of the whole dependency graph rebuilt for `-p`.
fn test_executables(names: &[&str]) -> anyhow::Result<Vec<std::path::PathBuf>> {
    use anyhow::Context;
    let mut cmd = Command::new(crate::cargo_bin());
    cmd.current_dir(crate::workspace_root()).args([
        "test",
        "--workspace",
        "--exclude",
        "swiftlet-ebpf",
        "--no-run",
        "--message-format=json",
    ]);
    for name in names {
        cmd.args(["--test", name]);
    }
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .context("running cargo test --no-run")?;
    anyhow::ensure!(
        out.status.success(),
        "cargo test --no-run {names:?} failed ({})",
        out.status
    );
    crate::executables_named(&String::from_utf8_lossy(&out.stdout), names)
}

/// The agent without its `ebpf` feature (no nightly toolchain, no bpf-linker needed): it must
/// build, and `--ebpf on` must refuse to start, saying why.
fn without_ebpf() -> Result<(), String> {
    let out = Command::new(crate::cargo_bin())
        .current_dir(crate::workspace_root())
        .args(["run", "-q", "-p", "swiftlet", "--bin", "swiftlet"])
        .args(["--no-default-features", "--features", "api-tls", "--"])
        .args(["--ebpf", "on"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running cargo run: {e}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let refused = out.status.code() == Some(2)
        && stderr.contains("built without its eBPF probes (cargo feature `ebpf` off)");
    if refused {
        Ok(())
    } else {
        Err(format!(
            "the agent without eBPF: expected --ebpf on to be refused (exit 2), got {}:\n{stderr}",
            out.status
        ))
    }
}

/// Test counts summed over cargo's `test result: ok. 3 passed; 0 failed; 1 ignored; ...` lines.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub passed: u64,
    pub failed: u64,
    pub ignored: u64,
}

impl Totals {
    pub fn add_line(&mut self, line: &str) {
        let Some(rest) = line.trim().strip_prefix("test result: ") else {
            return;
        };
        for part in rest.split(['.', ';']) {
            let mut words = part.split_whitespace();
            let (Some(n), Some(what)) = (words.next(), words.next()) else {
                continue;
            };
            let Ok(n) = n.parse::<u64>() else { continue };
            match what {
                "passed" => self.passed += n,
                "failed" => self.failed += n,
                "ignored" => self.ignored += n,
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Totals;

    #[test]
    fn sums_cargo_test_result_lines() {
        let mut t = Totals::default();
        t.add_line("test result: ok. 72 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.59s");
        t.add_line(
            "test result: FAILED. 3 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out",
        );
        t.add_line("test foo ... ok");
        t.add_line("running 4 tests");
        assert_eq!(
            t,
            Totals {
                passed: 75,
                failed: 2,
                ignored: 1
            }
        );
    }
}
