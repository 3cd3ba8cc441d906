//! `--cgroup-driver systemd` against a real systemd (PID 1 of the VM's guest: `cargo xtask vm
//! test` runs this file there; elsewhere it says why it skips). A containerd of the test's own
//! places containers through systemd (`SystemdCgroup = true`), as a kubeadm node's does.
//!
//! What must hold: each pod cgroup is a slice unit named as the kubelet names it, active, with
//! the kubelet's numbers as unit properties and in the files; the QoS level slices carry their
//! shares; the pod's containers are scopes inside its slice (the runtime got the slice as the
//! cgroup parent); a `systemctl daemon-reload` (systemd re-applying its units) leaves the values
//! alone; an agent killed and started again adopts its pod and its slice, and removes the slice
//! of a pod deleted meanwhile; a deleted pod's slice is stopped and gone.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use swiftlet::pod::cgroup_name::{slice_dir, slice_unit};
use swiftlet_tests::{Agent, AgentOptions, Runtime};

const CGROUP: &str = "/sys/fs/cgroup";
const TIMEOUT: Duration = swiftlet_tests::VM_POD_TIMEOUT;

/// `systemctl show --value -p <property> <unit>`.
fn show(unit: &str, property: &str) -> String {
    let out = Command::new("systemctl")
        .args(["show", "--value", "-p", property, unit])
        .output()
        .expect("run systemctl");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Whether systemd has the unit stopped: unloaded, or (a slice name systemd can always load
/// again, without a unit file) loaded by the question itself and inactive.
fn stopped(unit: &str) -> bool {
    show(unit, "LoadState") == "not-found" || show(unit, "ActiveState") == "inactive"
}

fn unified() -> bool {
    Path::new(CGROUP).join("cgroup.controllers").is_file()
}

/// The directory of slice path `dir` (relative) in the hierarchy holding `v1_controller`.
fn cgroup_dir(v1_controller: &str, dir: &str) -> PathBuf {
    if unified() {
        Path::new(CGROUP).join(dir)
    } else {
        Path::new(CGROUP).join(v1_controller).join(dir)
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
        .trim()
        .to_owned()
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < TIMEOUT, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Stops the agent's root slice (and with it every slice below) when the test ends, passed or
/// not.
struct StopSlice(String);

impl Drop for StopSlice {
    fn drop(&mut self) {
        let _ = Command::new("systemctl").args(["stop", &self.0]).status();
    }
}

#[test]
fn pod_cgroups_are_systemd_slices_with_the_kubelets_numbers() {
    if !swiftlet_tests::systemd_is_init() {
        eprintln!("skipping: systemd is not PID 1 here (this test runs in `cargo xtask vm test`)");
        return;
    }
    let mut layout = xtask::runtime::Layout::under(
        Path::new("/var/lib/swiftlet-systemd-driver"),
        "swl-sd0",
        "10.96.0.0/16",
    );
    layout.systemd_cgroup = true;
    let rt = Runtime::private_layout(layout).unwrap_or_else(|e| panic!("{e}"));
    let mut opts = AgentOptions::new("sd");
    opts.extra_args = vec!["--cgroup-driver".into(), "systemd".into()];
    let mut agent = Agent::start(&rt, opts);
    let root = agent.cgroup_root().to_owned();
    let _stop = StopSlice(slice_unit(&root).expect("a slice name"));

    let resources = "    resources:\n      requests: {cpu: 250m, memory: 32Mi}\n      \
                     limits: {cpu: 500m, memory: 64Mi}\n";
    let burstable = swiftlet_tests::busybox_pod_manifest(
        "name: sd-burstable, namespace: default, uid: sd-burstable-1",
        "",
        "sleep 3600",
        resources,
    );
    // A static pod: the agent names it after the node.
    let pod = format!("sd-burstable-{}", agent.node_name());
    agent.write_manifest("burstable.yaml", &burstable);
    agent.wait_for(|pods| pods.is_running(&pod), TIMEOUT);

    // The pod's slice, named as the kubelet names it ('-' of the UID spelled '_').
    let pod_path = format!("{root}/kubepods/burstable/podsd-burstable-1");
    let unit = slice_unit(&pod_path).expect("a slice name");
    assert!(
        unit.ends_with("-kubepods-burstable-podsd_burstable_1.slice"),
        "{unit}"
    );
    assert_eq!(show(&unit, "ActiveState"), "active", "{unit}");
    // 250m requested: 256 shares (weight 10 on v2); 500m limit: 50 ms per 100 ms; 64 MiB.
    let v2 = unified();
    if v2 {
        assert_eq!(show(&unit, "CPUWeight"), "10");
    } else {
        assert_eq!(show(&unit, "CPUShares"), "256");
    }
    assert_eq!(show(&unit, "CPUQuotaPerSecUSec"), "500ms");
    let memory_property = if v2 { "MemoryMax" } else { "MemoryLimit" };
    assert_eq!(show(&unit, memory_property), (64u64 << 20).to_string());
    assert_eq!(show(&unit, "TasksMax"), "infinity");
    let dir = slice_dir(&pod_path).expect("a slice dir");
    let files = |when: &str| {
        if v2 {
            let d = cgroup_dir("", &dir);
            assert_eq!(read(&d.join("cpu.max")), "50000 100000", "{when}");
            assert_eq!(read(&d.join("cpu.weight")), "10", "{when}");
            assert_eq!(read(&d.join("memory.max")), "67108864", "{when}");
        } else {
            let cpu = cgroup_dir("cpu", &dir);
            assert_eq!(read(&cpu.join("cpu.cfs_quota_us")), "50000", "{when}");
            assert_eq!(read(&cpu.join("cpu.shares")), "256", "{when}");
            let memory = cgroup_dir("memory", &dir);
            assert_eq!(
                read(&memory.join("memory.limit_in_bytes")),
                "67108864",
                "{when}"
            );
        }
    };
    files("after the start");

    // The QoS level slices: burstable has the shares of the one Burstable pod's 250m.
    let burstable_qos = slice_unit(&format!("{root}/kubepods/burstable")).expect("a slice name");
    assert_eq!(show(&burstable_qos, "ActiveState"), "active");
    let besteffort_qos = slice_unit(&format!("{root}/kubepods/besteffort")).expect("a slice");
    if v2 {
        assert_eq!(show(&burstable_qos, "CPUWeight"), "10");
        assert_eq!(show(&besteffort_qos, "CPUWeight"), "1");
    } else {
        assert_eq!(show(&burstable_qos, "CPUShares"), "256");
        assert_eq!(show(&besteffort_qos, "CPUShares"), "2");
    }

    // The container runs in a scope of containerd's inside the pod's slice.
    let memory_dir = cgroup_dir("memory", &dir);
    let scopes: Vec<PathBuf> = std::fs::read_dir(&memory_dir)
        .unwrap_or_else(|e| panic!("listing {}: {e}", memory_dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("cri-containerd-") && n.ends_with(".scope"))
        })
        .collect();
    assert!(
        scopes
            .iter()
            .any(|s| !read(&s.join("cgroup.procs")).is_empty()),
        "no containerd scope with processes in {}: {scopes:?}",
        memory_dir.display()
    );

    // systemd re-applying its units puts back what it was told: the numbers stay.
    let reload = Command::new("systemctl")
        .arg("daemon-reload")
        .status()
        .expect("run systemctl");
    assert!(reload.success());
    files("after a daemon-reload");

    // The agent killed; meanwhile a second pod's manifest goes. The restarted agent adopts the
    // first pod (same container, slice untouched) and removes the second's slice as an orphan.
    let best_effort = swiftlet_tests::busybox_pod_manifest(
        "name: sd-orphan, namespace: default, uid: sd-orphan-1",
        "",
        "sleep 3600",
        "",
    );
    let orphan = format!("sd-orphan-{}", agent.node_name());
    agent.write_manifest("orphan.yaml", &best_effort);
    agent.wait_for(|pods| pods.is_running(&orphan), TIMEOUT);
    let orphan_path = format!("{root}/kubepods/besteffort/podsd-orphan-1");
    let orphan_unit = slice_unit(&orphan_path).expect("a slice name");
    assert_eq!(show(&orphan_unit, "ActiveState"), "active", "{orphan_unit}");
    let container_id = |pods: &swiftlet_tests::PodList| {
        pods.container(&pod, "main")
            .and_then(|c| c.container_id.clone())
    };
    let before = container_id(&agent.pods()).expect("the container's ID");
    agent.kill();
    agent.remove_manifest("orphan.yaml");
    agent.restart_after_sigkill();
    let pods = agent.wait_for(
        |pods| pods.is_running(&pod) && pods.get(&orphan).is_none(),
        TIMEOUT,
    );
    assert_eq!(
        container_id(&pods),
        Some(before),
        "the container was restarted"
    );
    wait_until("the orphan's slice to go", || {
        stopped(&orphan_unit)
            && !cgroup_dir("memory", &slice_dir(&orphan_path).expect("a dir")).exists()
    });
    assert_eq!(show(&unit, "ActiveState"), "active", "{unit}");
    files("after the agent's restart");

    // Deleted: the slice is stopped and its directory gone.
    agent.remove_manifest("burstable.yaml");
    agent.wait_for(|pods| pods.get(&pod).is_none(), TIMEOUT);
    wait_until("the pod's slice to go", || {
        stopped(&unit) && !cgroup_dir("memory", &dir).exists()
    });
}
