//! Security contexts on a real containerd: what a pod asks for is what its processes get (read
//! from the kernel under /proc), and what the node does not allow is refused with a reason.

use std::time::Duration;

use swiftlet_tests::{Agent, busybox_pod_manifest, container_pid, start_agent};

const TIMEOUT: Duration = Duration::from_secs(60);

/// Field `key` of `/proc/<pid>/status` (`Uid`, `CapEff` ...), whitespace-normalised.
fn status_field(pid: u32, key: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("reading /proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"))
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// The mount options of mount point `point` in the process's mount namespace.
fn mount_options(pid: u32, point: &str) -> Option<String> {
    let info = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).ok()?;
    info.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(4) == Some(&point)).then(|| f.get(5).map(|s| (*s).to_owned()))?
    })
}

/// Waits for pod `name` (a static pod of `agent`) to run; returns its UID and its container's pid.
fn running(agent: &Agent, name: &str) -> (String, u32) {
    let pod = agent.static_pod_name(name);
    let list = agent.wait_for(|l| l.is_running(&pod), TIMEOUT);
    let uid = list.uid(&pod).expect("uid").to_owned();
    let pid = agent.eventually("the container's pid", TIMEOUT, || {
        container_pid(agent.endpoint(), &uid, "main").ok_or_else(|| "no running container".into())
    });
    (uid, pid)
}

#[test]
fn a_restricted_pod_runs_as_its_user_without_capabilities_on_a_read_only_root() {
    let Some(agent) = start_agent("security-restricted") else {
        return;
    };
    let spec = "  securityContext:
    runAsUser: 1000
    runAsGroup: 3000
    fsGroup: 2000
    supplementalGroups: [4000]
    sysctls:
    - {name: kernel.shm_rmid_forced, value: \"1\"}
";
    let container = "    securityContext:
      readOnlyRootFilesystem: true
      allowPrivilegeEscalation: false
      capabilities: {drop: [ALL]}
";
    agent.write_manifest(
        "restricted.yaml",
        &busybox_pod_manifest(
            "name: restricted, namespace: default",
            spec,
            "echo shm=$(cat /proc/sys/kernel/shm_rmid_forced); sleep 3600",
            container,
        ),
    );
    let (_, pid) = running(&agent, "restricted");
    assert_eq!(status_field(pid, "Uid"), "1000 1000 1000 1000");
    assert_eq!(status_field(pid, "Gid"), "3000 3000 3000 3000");
    let groups = status_field(pid, "Groups");
    assert!(
        groups.split(' ').any(|g| g == "2000") && groups.split(' ').any(|g| g == "4000"),
        "fsGroup and supplementalGroups: {groups}"
    );
    assert_eq!(status_field(pid, "CapEff"), "0000000000000000");
    assert_eq!(status_field(pid, "CapBnd"), "0000000000000000");
    assert_eq!(status_field(pid, "NoNewPrivs"), "1");
    let root = mount_options(pid, "/").expect("a root mount");
    assert!(root.split(',').any(|o| o == "ro"), "root mounted {root}");
    // The default proc mount: /proc/keys hidden (every masked path that exists on this kernel
    // is), /proc/sys read-only.
    assert!(
        mount_options(pid, "/proc/keys").is_some(),
        "/proc/keys is masked"
    );
    let sys = mount_options(pid, "/proc/sys").expect("/proc/sys is a mount");
    assert!(sys.split(',').any(|o| o == "ro"), "/proc/sys mounted {sys}");
    // The sysctl is set in the pod's IPC namespace (a process reads its own namespace's value,
    // so the container reports it in its log).
    let logs = agent.root_dir().join("pod-logs");
    let log = agent.eventually("the container's log line", TIMEOUT, || {
        let dir = std::fs::read_dir(&logs)
            .map_err(|e| e.to_string())?
            .flatten()
            .find(|e| e.file_name().to_string_lossy().contains("_restricted-"))
            .ok_or("no pod log dir")?;
        let text =
            std::fs::read_to_string(dir.path().join("main/0.log")).map_err(|e| e.to_string())?;
        text.contains("shm=")
            .then_some(text)
            .ok_or_else(|| "not yet".into())
    });
    assert!(log.contains("shm=1"), "{log}");
    // BestEffort: the kubelet's 1000.
    let adj = std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj")).expect("oom_score_adj");
    assert_eq!(adj.trim(), "1000");
}

#[test]
fn host_namespaces_and_burstable_oom_scores_are_applied() {
    let Some(agent) = start_agent("security-host-ns") else {
        return;
    };
    let container = "    resources:
      requests: {memory: 64Mi}
";
    agent.write_manifest(
        "hostns.yaml",
        &busybox_pod_manifest(
            "name: hostns, namespace: default",
            "  hostPID: true\n  hostIPC: true\n",
            "sleep 3600",
            container,
        ),
    );
    let (_, pid) = running(&agent, "hostns");
    let ns = |pid: &str, kind: &str| {
        std::fs::read_link(format!("/proc/{pid}/ns/{kind}"))
            .unwrap_or_else(|e| panic!("/proc/{pid}/ns/{kind}: {e}"))
    };
    let me = std::process::id().to_string();
    assert_eq!(ns(&pid.to_string(), "pid"), ns(&me, "pid"), "hostPID");
    assert_eq!(ns(&pid.to_string(), "ipc"), ns(&me, "ipc"), "hostIPC");
    // Burstable: 1000 - 1000 * request / the machine's memory.
    let meminfo = std::fs::read_to_string("/proc/meminfo").expect("meminfo");
    let total_kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("MemTotal");
    let want = 1000 - (1000 * (64 << 20)) / (total_kib * 1024);
    let adj = std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj")).expect("oom_score_adj");
    assert_eq!(adj.trim(), want.to_string());
}

#[test]
fn what_the_node_does_not_allow_is_refused_with_a_reason() {
    let Some(agent) = start_agent("security-refused") else {
        return;
    };
    // The test image runs as root: runAsNonRoot cannot hold.
    agent.write_manifest(
        "nonroot.yaml",
        &busybox_pod_manifest(
            "name: nonroot, namespace: default",
            "  securityContext: {runAsNonRoot: true}\n",
            "sleep 3600",
            "",
        ),
    );
    // An unsafe sysctl without --allowed-unsafe-sysctls.
    agent.write_manifest(
        "sysctl.yaml",
        &busybox_pod_manifest(
            "name: sysctl, namespace: default",
            "  securityContext:\n    sysctls: [{name: kernel.msgmax, value: \"65536\"}]\n",
            "sleep 3600",
            "",
        ),
    );
    let (reason, message) = agent.waiting("nonroot");
    assert_eq!(reason, "CreateContainerConfigError");
    assert!(
        message.contains("container has runAsNonRoot and image will run as root"),
        "{message}"
    );
    let (reason, message) = agent.waiting("sysctl");
    assert_eq!(reason, "SysctlForbidden");
    assert!(
        message.contains("forbidden sysctl: \"kernel.msgmax\""),
        "{message}"
    );
    // Neither pod got a container; the refused sysctl not even a sandbox.
    let list = agent.pods();
    let cri_objects = |name: &str| {
        let uid = list.uid(&agent.static_pod_name(name)).expect("uid");
        swiftlet_tests::pod_cri_objects(agent.endpoint(), uid).expect("CRI list")
    };
    let (sandboxes, containers) = cri_objects("sysctl");
    assert!(sandboxes.is_empty() && containers.is_empty());
    let (_, containers) = cri_objects("nonroot");
    assert!(containers.is_empty(), "no container was created");
}
