//! What an operator installs: the systemd unit in `deploy/` passes `systemd-analyze verify`
//! (with the agent binary in its `ExecStart`). The example configuration beside it is loaded by
//! the agent's own flag parser in the cli unit tests.

use std::path::{Path, PathBuf};

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

fn systemctl(args: &[&str]) -> std::process::Output {
    std::process::Command::new("systemctl")
        .args(args)
        .output()
        .expect("run systemctl")
}

fn systemctl_ok(args: &[&str]) {
    let out = systemctl(args);
    assert!(
        out.status.success(),
        "systemctl {args:?}: {}\n{}\njournal:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        journal()
    );
}

fn journal() -> String {
    let out = std::process::Command::new("journalctl")
        .args(["-u", "swiftlet", "--no-pager", "-n", "40"])
        .output()
        .expect("run journalctl");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The installation as docs/install.md tells it, on a real systemd (run in the VM by `cargo
/// xtask vm test`): the binary, the example configuration (pointed at the test's containerd),
/// the unit without `--kubeconfig` (static pods only), `systemctl enable --now`. The unit is
/// `Type=notify`, so `enable --now` returns once swiftlet said READY=1; a static pod then runs;
/// `systemctl stop` ends the agent cleanly and leaves the pod running; the next start adopts it
/// (the same container, no new sandbox).
#[test]
fn installed_as_a_systemd_service_it_runs_stops_and_adopts_its_pods() {
    if !swiftlet_tests::systemd_is_init() {
        eprintln!("skipping: systemd is not PID 1 here (this test runs in `cargo xtask vm test`)");
        return;
    }
    let Some(rt) = swiftlet_tests::Runtime::shared() else {
        return;
    };
    let node = std::fs::read_to_string("/etc/hostname").expect("the host name");
    let node = node.trim();
    let install = |from: &Path, to: &str, mode: &str| {
        let status = std::process::Command::new("install")
            .args(["-D", "-m", mode])
            .arg(from)
            .arg(to)
            .status()
            .expect("run install");
        assert!(status.success(), "install {} {to}", from.display());
    };
    install(
        swiftlet_tests::agent_binary(),
        "/usr/local/bin/swiftlet",
        "0755",
    );
    // The example configuration, edited as docs/install.md says for a node without a cluster
    // (no CA, no webhooks: both ask the API server) and pointed at the test's containerd.
    let config = std::fs::read_to_string(deploy_dir().join("kubelet-config.yaml"))
        .expect("the example configuration")
        .replace(
            "containerRuntimeEndpoint: unix:///run/containerd/containerd.sock",
            &format!("containerRuntimeEndpoint: {}", rt.endpoint),
        )
        .replace("    clientCAFile: /etc/kubernetes/pki/ca.crt\n", "")
        .replace("address: 0.0.0.0", "address: 127.0.0.1")
        .replace(
            "  webhook:\n    enabled: true\n",
            "  webhook:\n    enabled: false\n",
        )
        .replace("  mode: Webhook\n", "  mode: AlwaysAllow\n");
    std::fs::create_dir_all("/etc/swiftlet").expect("mkdir /etc/swiftlet");
    std::fs::write("/etc/swiftlet/config.yaml", config).expect("write the configuration");
    let unit = std::fs::read_to_string(deploy_dir().join("swiftlet.service"))
        .expect("the unit")
        .replace(" --kubeconfig /etc/swiftlet/kubeconfig", "");
    std::fs::write("/etc/systemd/system/swiftlet.service", unit).expect("write the unit");
    std::fs::create_dir_all("/etc/kubernetes/manifests").expect("mkdir the manifest dir");
    systemctl_ok(&["daemon-reload"]);
    systemctl_ok(&["enable", "--now", "swiftlet"]);
    let active = systemctl(&["is-active", "swiftlet"]);
    assert_eq!(
        String::from_utf8_lossy(&active.stdout).trim(),
        "active",
        "{}",
        journal()
    );

    let manifest = swiftlet_tests::looping_pod_manifest("deployed", &[]);
    std::fs::write("/etc/kubernetes/manifests/deployed.yaml", manifest).expect("write a pod");
    let running = || {
        swiftlet_tests::cri_objects_labelled(&rt.endpoint, swiftlet_tests::NODE_NAME_LABEL, node)
            .map(|(sandboxes, containers)| {
                let running: Vec<String> = containers
                    .iter()
                    .filter(|c| c.state == k8s_cri::v1::ContainerState::ContainerRunning as i32)
                    .map(|c| c.id.clone())
                    .collect();
                (sandboxes.len(), running)
            })
            .unwrap_or_default()
    };
    let deadline = std::time::Instant::now() + swiftlet_tests::VM_POD_TIMEOUT;
    let (sandboxes, first) = loop {
        let (s, r) = running();
        if r.len() == 1 {
            break (s, r);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the static pod did not run; journal:\n{}",
            journal()
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    };
    assert_eq!(sandboxes, 1);

    systemctl_ok(&["stop", "swiftlet"]);
    let result = systemctl(&["show", "swiftlet", "-p", "Result", "--value"]);
    assert_eq!(String::from_utf8_lossy(&result.stdout).trim(), "success");
    assert_eq!(
        running(),
        (1, first.clone()),
        "stopping the agent touched the pod"
    );

    systemctl_ok(&["start", "swiftlet"]);
    std::thread::sleep(std::time::Duration::from_secs(5));
    assert_eq!(
        running(),
        (1, first),
        "the restarted agent did not adopt its pod; journal:\n{}",
        journal()
    );

    // Clean-up: the pod goes with its manifest, then the service.
    std::fs::remove_file("/etc/kubernetes/manifests/deployed.yaml").expect("remove the pod");
    let deadline = std::time::Instant::now() + swiftlet_tests::VM_POD_TIMEOUT;
    while running().0 > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the pod was not removed"
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    systemctl_ok(&["disable", "--now", "swiftlet"]);
}
