//! What an operator installs: the systemd unit in `deploy/` passes `systemd-analyze verify`
//! (with the agent binary in its `ExecStart`). The example configuration beside it is loaded by
//! the agent's own flag parser in the cli unit tests.

use std::path::PathBuf;

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

#[test]
fn the_systemd_unit_verifies_cleanly() {
    let Some(analyze) = swiftlet_tests::find_tool("systemd-analyze", "apt-get install systemd")
    else {
        return;
    };
    let unit = std::fs::read_to_string(deploy_dir().join("swiftlet.service")).expect("the unit");
    assert!(unit.contains("\nType=notify\n"), "{unit}");
    let binary = swiftlet_tests::agent_binary();
    let unit = unit.replace("/usr/local/bin/swiftlet", &binary.display().to_string());
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("swiftlet.service");
    std::fs::write(&path, unit).expect("write the unit");
    let out = std::process::Command::new(analyze)
        .arg("verify")
        .arg(&path)
        .output()
        .expect("run systemd-analyze");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Dependencies this machine lacks (containerd.service) are not the unit's fault.
    let complaints: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.contains("containerd.service"))
        .collect();
    assert!(
        out.status.success() && complaints.is_empty(),
        "systemd-analyze verify: {}\n{stderr}",
        out.status
    );
}
