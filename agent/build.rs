//! Builds the eBPF probes (`agent-ebpf`, crate `swiftlet-ebpf`) for `bpf{el,eb}-unknown-none` with
//! the nightly toolchain through aya-build, into `$OUT_DIR/swiftlet-ebpf`, which
//! `swiftlet::ebpf` embeds. With the `ebpf` feature (the default) a missing prerequisite fails
//! the build and names the fix; without it nothing is built (the agent then has no probes).
//!
//! It also sets `SWIFTLET_VERSION`, the version swiftlet reports (`kubeletVersion`, `--version`):
//! the Kubernetes version whose API the build implements, read from the k8s-openapi version
//! feature the workspace enables (k8s-openapi's build script publishes it to its dependents), as
//! `v1.<minor>.0`, then `+swiftlet-<crate version>` (see `swiftlet::VERSION`).

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

const PROBE_CRATE: &str = "swiftlet-ebpf";
const SETUP_HINT: &str = "run `cargo xtask setup` (it installs the pinned nightly with rust-src \
                          and bpf-linker 0.10.0)";

fn main() -> anyhow::Result<()> {
    let manifest_dir = PathBuf::from(
        env::var_os("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR not set by cargo")?,
    );
    let probe_dir = manifest_dir.join("..").join("agent-ebpf");
    let common_dir = probe_dir.join("common");
    println!("cargo:rerun-if-changed={}", common_dir.display());
    let toolchain_file = probe_dir.join("rust-toolchain.toml");
    println!("cargo:rerun-if-changed={}", toolchain_file.display());
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=PATH");
    println!("cargo:rustc-env=SWIFTLET_VERSION={}", version()?);
    if env::var_os("CARGO_FEATURE_EBPF").is_none() {
        return Ok(());
    }

    let toolchain = pinned_nightly(&toolchain_file)?;
    check_prerequisites(&toolchain)?;

    let probe_dir_str = probe_dir
        .to_str()
        .with_context(|| format!("probe crate path {} is not UTF-8", probe_dir.display()))?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: PROBE_CRATE,
            root_dir: probe_dir_str,
            ..Default::default()
        }],
        aya_build::Toolchain::Custom(&toolchain),
    )
    .with_context(|| {
        format!("building the eBPF probes ({PROBE_CRATE}); if a tool is missing, {SETUP_HINT}")
    })?;

    let out_dir = PathBuf::from(env::var_os("OUT_DIR").context("OUT_DIR not set by cargo")?);
    let object = out_dir.join(PROBE_CRATE);
    if !object.is_file() {
        bail!(
            "aya-build produced no {} (is AYA_BUILD_SKIP set? swiftlet is not built without its \
             probes; unset it, or {SETUP_HINT})",
            object.display()
        );
    }
    Ok(())
}

/// `v<major>.<minor>.0+swiftlet-<crate version>`: the Kubernetes version of the k8s-openapi
/// feature enabled, which k8s-openapi's build script gives its dependents as the metadata
/// `version` (`0x00MMmm00`: major, minor), seen here as `DEP_K8S_OPENAPI_<its version>_VERSION`.
fn version() -> anyhow::Result<String> {
    let encoded = env::vars()
        .find(|(k, _)| k.starts_with("DEP_K8S_OPENAPI_") && k.ends_with("_VERSION"))
        .map(|(_, v)| v)
        .context("k8s-openapi published no Kubernetes version (DEP_K8S_OPENAPI_*_VERSION)")?;
    let n: u32 = encoded
        .trim()
        .parse()
        .with_context(|| format!("k8s-openapi's Kubernetes version {encoded:?} is not a number"))?;
    let (major, minor) = ((n >> 16) & 0xff, (n >> 8) & 0xff);
    let crate_version = env::var("CARGO_PKG_VERSION").context("CARGO_PKG_VERSION not set")?;
    Ok(format!("v{major}.{minor}.0+swiftlet-{crate_version}"))
}

/// The dated nightly channel of `agent-ebpf/rust-toolchain.toml` (its `channel = "..."` line).
fn pinned_nightly(file: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("reading the probes' toolchain pin {}", file.display()))?;
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("channel"))
        .filter_map(|l| l.trim_start().strip_prefix('='))
        .map(|v| v.trim().trim_matches('"').to_owned())
        .find(|v| v.starts_with("nightly-"))
        .with_context(|| format!("{} names no dated nightly channel", file.display()))
}

/// Fails with a clear message when the pinned nightly toolchain, its `rust-src`, or `bpf-linker`
/// is missing (the errors from deep inside a nested cargo build are much harder to read).
fn check_prerequisites(toolchain: &str) -> anyhow::Result<()> {
    if find_in_path("bpf-linker").is_none() {
        bail!("bpf-linker was not found on PATH; {SETUP_HINT}");
    }
    let output = Command::new("rustup")
        .args(["run", toolchain, "rustc", "--print", "sysroot"])
        .output()
        .with_context(|| format!("running `rustup run {toolchain} rustc`; {SETUP_HINT}"))?;
    if !output.status.success() {
        bail!(
            "the {toolchain} toolchain is not usable ({}); {SETUP_HINT}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let sysroot = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    let core_src = sysroot.join("lib/rustlib/src/rust/library/core/Cargo.toml");
    if !core_src.is_file() {
        bail!(
            "the {toolchain} toolchain has no rust-src component ({} is missing); {SETUP_HINT}",
            core_src.display()
        );
    }
    Ok(())
}

fn find_in_path(program: &str) -> Option<PathBuf> {
    let path = env::var_os("PATH")?;
    env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
