//! Volumes on a real containerd, seen from inside the containers (CRI ExecSync): an emptyDir
//! shared by two containers, a Memory emptyDir that is a tmpfs of its size, hostPath files and
//! directories with their content, readOnly and subPath mounts; hostPath content outliving the
//! pod and an agent killed with SIGKILL; nothing of a volume left (no mount, no directory) once
//! the pod is gone, even when it went while the agent was down; and a hostPath type mismatch
//! keeping the pod waiting with the reason.

use std::path::{Path, PathBuf};
use std::time::Duration;

use swiftlet_tests::{Agent, BUSYBOX_IMAGE, PodList, exec, start_agent};

const TIMEOUT: Duration = Duration::from_secs(60);

/// A static pod `name` (UID `<name>-<node>`) with containers `main` and `other` running `sleep`,
/// the volumes `volumes` (YAML lines indented by two spaces) and each container's mounts.
fn pod(agent: &Agent, name: &str, volumes: &str, main_mounts: &str, other_mounts: &str) -> String {
    let node = agent.node_name();
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default, uid: {name}-{node}}}
spec:
  terminationGracePeriodSeconds: 2
  volumes:
{volumes}  containers:
  - name: main
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: Never
    command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]
    volumeMounts:
{main_mounts}  - name: other
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: Never
    command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]
    volumeMounts:
{other_mounts}"#
    )
}

/// Waits for both containers of pod `name` to run; returns the pod's full name and UID.
fn running(agent: &Agent, name: &str) -> (String, String) {
    let pod = agent.static_pod_name(name);
    let list = agent.wait_for(
        |l| {
            ["main", "other"]
                .iter()
                .all(|c| l.container(&pod, c).is_some_and(swiftlet_tests::is_running))
        },
        TIMEOUT,
    );
    let uid = list.uid(&pod).expect("uid").to_owned();
    (pod, uid)
}

/// Runs `script` with `sh -c` in container `container` of pod `pod`: exit code and output.
fn sh(agent: &Agent, pod: &str, container: &str, script: &str) -> (i32, String) {
    let list: PodList = agent.pods();
    let id = list
        .container(pod, container)
        .and_then(|c| c.container_id.clone())
        .unwrap_or_else(|| panic!("no container {container} in {pod}: {}", list.summary()));
    exec(agent.endpoint(), &id, &["sh", "-c", script]).expect("ExecSync")
}

/// Like [`sh`], but the script must succeed; returns its output.
fn sh_ok(agent: &Agent, pod: &str, container: &str, script: &str) -> String {
    let (code, out) = sh(agent, pod, container, script);
    assert_eq!(code, 0, "{container}: {script}: {out}");
    out
}

/// The mount points below `dir` in the test's (the host's) mount table.
fn mounts_below(dir: &Path) -> Vec<String> {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_owned))
        .filter(|p| Path::new(p).starts_with(&dir))
        .collect()
}

/// Asserts that file `path` holds `content`.
fn assert_holds(path: &Path, content: &str) {
    let read = std::fs::read_to_string(path);
    assert_eq!(
        read.as_deref().ok(),
        Some(content),
        "{}: {read:?}",
        path.display()
    );
}

/// Waits until pod `uid` has no directory below `<root>/pods` and no mount below the root dir.
fn volumes_gone(agent: &Agent, uid: &str) {
    let dir: PathBuf = agent.root_dir().join("pods").join(uid);
    agent.eventually("the pod's volumes to go", TIMEOUT, || {
        let mounts = mounts_below(agent.root_dir());
        if !mounts.is_empty() {
            return Err(format!("mounts left: {mounts:?}"));
        }
        if dir.exists() {
            return Err(format!("{} is still there", dir.display()));
        }
        Ok(())
    });
}

#[test]
fn volumes_hold_what_the_pod_asks_for_seen_from_inside_and_go_with_the_pod() {
    let Some(agent) = start_agent("volumes-inside") else {
        return;
    };
    let host = tempfile::tempdir().expect("tempdir");
    let host_dir = host.path().join("dir");
    std::fs::create_dir(&host_dir).expect("mkdir");
    std::fs::write(host_dir.join("hello"), "from the host\n").expect("write");
    let host_file = host.path().join("config");
    std::fs::write(&host_file, "key=value\n").expect("write");
    let volumes = format!(
        "  - {{name: shared, emptyDir: {{}}}}
  - {{name: mem, emptyDir: {{medium: Memory, sizeLimit: 16Mi}}}}
  - {{name: hdir, hostPath: {{path: {dir}, type: Directory}}}}
  - {{name: hfile, hostPath: {{path: {file}, type: File}}}}
",
        dir = host_dir.display(),
        file = host_file.display()
    );
    let main = "    - {name: shared, mountPath: /shared}
    - {name: mem, mountPath: /mem}
    - {name: hdir, mountPath: /hdir}
    - {name: hfile, mountPath: /etc/app.conf, readOnly: true}
    - {name: shared, mountPath: /sub, subPath: deep/er}
";
    let other = "    - {name: shared, mountPath: /data}
    - {name: hdir, mountPath: /ro, readOnly: true}
";
    agent.write_manifest("inside.yaml", &pod(&agent, "inside", &volumes, main, other));
    let (pod, uid) = running(&agent, "inside");

    // One emptyDir, two containers: what one writes the other reads.
    sh_ok(&agent, &pod, "main", "echo written-by-main > /shared/note");
    assert_eq!(
        sh_ok(&agent, &pod, "other", "cat /data/note"),
        "written-by-main\n"
    );
    // The subPath is a directory inside the same volume, made when missing.
    sh_ok(&agent, &pod, "main", "echo in-sub > /sub/f");
    assert_eq!(
        sh_ok(&agent, &pod, "other", "cat /data/deep/er/f"),
        "in-sub\n"
    );
    // The Memory emptyDir is a tmpfs of sizeLimit.
    let mounts = sh_ok(&agent, &pod, "main", "grep ' /mem ' /proc/mounts");
    assert!(
        mounts.starts_with("tmpfs /mem tmpfs ") && mounts.contains("size=16384k"),
        "{mounts}"
    );
    let df = sh_ok(&agent, &pod, "main", "df -k /mem | tail -1");
    assert_eq!(df.split_whitespace().nth(1), Some("16384"), "{df}");
    // hostPath: the directory and the file with their content; the container's write reaches
    // the host.
    assert_eq!(
        sh_ok(&agent, &pod, "main", "cat /hdir/hello"),
        "from the host\n"
    );
    assert_eq!(
        sh_ok(&agent, &pod, "main", "cat /etc/app.conf"),
        "key=value\n"
    );
    sh_ok(&agent, &pod, "main", "echo from-the-pod > /hdir/written");
    assert_holds(&host_dir.join("written"), "from-the-pod\n");
    // readOnly mounts refuse writes.
    let (code, out) = sh(&agent, &pod, "other", "echo x > /ro/nope");
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("Read-only file system"), "{out}");
    let (code, out) = sh(&agent, &pod, "main", "echo x >> /etc/app.conf");
    assert_ne!(code, 0, "{out}");
    assert_holds(&host_file, "key=value\n");
    assert_eq!(
        sh_ok(&agent, &pod, "other", "cat /ro/hello"),
        "from the host\n"
    );
    // The volumes are where the kubelet keeps them, and the tmpfs is mounted on the node.
    let empty_dirs = agent
        .root_dir()
        .join("pods")
        .join(&uid)
        .join("volumes/kubernetes.io~empty-dir");
    assert_holds(&empty_dirs.join("shared/note"), "written-by-main\n");
    // On the node: the tmpfs, and the subPath bound below volume-subpaths as the kubelet binds it.
    let mut mounts = mounts_below(agent.root_dir());
    mounts.sort();
    let root = agent.root_dir().canonicalize().expect("canonical");
    let pod_dir = root.join("pods").join(&uid);
    assert_eq!(
        mounts,
        [
            pod_dir.join("volume-subpaths/shared/main/4"),
            pod_dir.join("volumes/kubernetes.io~empty-dir/mem"),
        ]
        .map(|p| p.display().to_string()),
    );

    // Deleted: nothing of the volumes is left, the hostPath content is.
    agent.remove_manifest("inside.yaml");
    volumes_gone(&agent, &uid);
    assert_holds(&host_dir.join("hello"), "from the host\n");
    assert!(host_dir.join("written").exists());
    assert_holds(&host_file, "key=value\n");
}

#[test]
fn volumes_outlive_an_agent_killed_with_sigkill_and_host_paths_outlive_the_pod() {
    let Some(mut agent) = start_agent("volumes-restart") else {
        return;
    };
    let host = tempfile::tempdir().expect("tempdir");
    let created = host.path().join("made/by/the/agent");
    let volumes = format!(
        "  - {{name: mem, emptyDir: {{medium: Memory}}}}
  - {{name: state, hostPath: {{path: {dir}, type: DirectoryOrCreate}}}}
",
        dir = created.display()
    );
    let mounts = "    - {name: mem, mountPath: /mem}
    - {name: state, mountPath: /state}
";
    agent.write_manifest(
        "restart.yaml",
        &pod(&agent, "restart", &volumes, mounts, mounts),
    );
    let (pod, uid) = running(&agent, "restart");
    assert!(created.is_dir(), "DirectoryOrCreate made the directory");
    sh_ok(
        &agent,
        &pod,
        "main",
        "echo kept > /mem/f; echo durable > /state/f",
    );

    agent.restart_after_sigkill();
    // The restarted agent adopts the pod: same containers, the tmpfs mounted once, its data kept.
    let list = agent.wait_for(|l| l.is_running(&pod), TIMEOUT);
    assert!(
        ["main", "other"].iter().all(|c| list
            .container(&pod, c)
            .is_some_and(|s| s.restart_count == 0)),
        "{}",
        list.summary()
    );
    assert_eq!(
        sh_ok(&agent, &pod, "other", "cat /mem/f /state/f"),
        "kept\ndurable\n"
    );
    assert_eq!(mounts_below(agent.root_dir()).len(), 1, "one tmpfs");

    agent.remove_manifest("restart.yaml");
    volumes_gone(&agent, &uid);
    assert_holds(&created.join("f"), "durable\n");
}

#[test]
fn the_volumes_of_a_pod_deleted_while_the_agent_was_down_are_removed() {
    let Some(mut agent) = start_agent("volumes-orphan") else {
        return;
    };
    let volumes = "  - {name: mem, emptyDir: {medium: Memory, sizeLimit: 1Mi}}
  - {name: disk, emptyDir: {}}
";
    let mounts = "    - {name: mem, mountPath: /mem}
    - {name: disk, mountPath: /disk}
";
    agent.write_manifest(
        "orphan.yaml",
        &pod(&agent, "orphan", volumes, mounts, mounts),
    );
    let (pod, uid) = running(&agent, "orphan");
    sh_ok(&agent, &pod, "main", "echo x > /mem/f; echo y > /disk/f");
    // Down, the pod deleted, and the runtime loses it: only the volumes remain on the node.
    agent.kill();
    agent.remove_manifest("orphan.yaml");
    let (endpoint, node) = (agent.endpoint().to_owned(), agent.node_name().to_owned());
    swiftlet_tests::block_on(async move {
        swiftlet_tests::remove_node_sandboxes(&endpoint, &node).await
    })
    .expect("runtime")
    .expect("sandboxes removed");
    assert_eq!(mounts_below(agent.root_dir()).len(), 1, "the tmpfs is left");
    agent.restart_after_sigkill();
    // Housekeeping's orphan pass unmounts the tmpfs and removes the pod's directory.
    volumes_gone(&agent, &uid);
}

#[test]
fn a_volume_that_cannot_be_set_up_keeps_the_pod_waiting_with_the_reason() {
    let Some(agent) = start_agent("volumes-mismatch") else {
        return;
    };
    let host = tempfile::tempdir().expect("tempdir");
    let file = host.path().join("a-file");
    std::fs::write(&file, "not a directory").expect("write");
    let volumes = format!(
        "  - {{name: logs, hostPath: {{path: {file}, type: Directory}}}}
",
        file = file.display()
    );
    let mounts = "    - {name: logs, mountPath: /logs}
";
    agent.write_manifest(
        "mismatch.yaml",
        &pod(&agent, "mismatch", &volumes, mounts, mounts),
    );
    let missing = "  - {name: there, emptyDir: {}}
";
    let bad_mount = "    - {name: not-there, mountPath: /x}
";
    agent.write_manifest(
        "missing.yaml",
        &pod(&agent, "missing", missing, bad_mount, bad_mount),
    );
    let refused = "  - {name: cfg, configMap: {name: app}}
";
    let cfg = "    - {name: cfg, mountPath: /cfg}
";
    agent.write_manifest("refused.yaml", &pod(&agent, "refused", refused, cfg, cfg));

    let (reason, message) = agent.waiting("mismatch");
    assert_eq!(reason, "ContainerCreating", "{message}");
    assert!(
        message.contains(&format!(
            "MountVolume.SetUp failed for volume \"logs\" : hostPath type check failed: {} is not a directory, it's a File",
            file.display()
        )),
        "{message}"
    );
    let (reason, message) = agent.waiting("missing");
    assert_eq!(reason, "CreateContainerConfigError", "{message}");
    assert!(
        message.contains("cannot find volume \"not-there\" to mount into container \"main\""),
        "{message}"
    );
    let (reason, message) = agent.waiting("refused");
    assert_eq!(reason, "CreateContainerConfigError", "{message}");
    assert!(
        message.contains("volume \"cfg\": type configMap is not supported yet"),
        "{message}"
    );
    // None of them got a sandbox, and the file is as it was.
    for name in ["mismatch", "missing", "refused"] {
        let uid = format!("{name}-{}", agent.node_name());
        let (sandboxes, containers) =
            swiftlet_tests::pod_cri_objects(agent.endpoint(), &uid).expect("runtime");
        assert_eq!((sandboxes.len(), containers.len()), (0, 0), "{name}");
    }
    assert_holds(&file, "not a directory");

    // Fixed on the node: the pod starts.
    std::fs::remove_file(&file).expect("rm");
    std::fs::create_dir(&file).expect("mkdir");
    running(&agent, "mismatch");
}

#[test]
fn the_example_pod_with_volumes_does_what_its_comment_says() {
    let Some(agent) = start_agent("volumes-example") else {
        return;
    };
    let path = xtask::workspace_root().join("examples/pods/50-volumes.yaml");
    let manifest = std::fs::read_to_string(&path).expect("the example");
    agent.write_manifest("volumes.yaml", &manifest);
    let pod = agent.static_pod_name("volumes");
    agent.wait_for(|l| l.is_running(&pod), TIMEOUT);
    let demo = Path::new("/tmp/swiftlet-demo");
    let hostname = std::fs::read_to_string("/etc/hostname").expect("hostname");
    // The reader copies what the writer left in the shared emptyDir (through a subPath) to the
    // hostPath, with the node's hostname the writer read from its read-only mount.
    agent.eventually("the message on the node", TIMEOUT, || {
        let msg = std::fs::read_to_string(demo.join("last-message")).map_err(|e| e.to_string())?;
        msg.trim_end()
            .ends_with(&format!("from {}", hostname.trim()))
            .then_some(())
            .ok_or(msg)
    });
    agent.eventually("the cache's size on the node", TIMEOUT, || {
        let df = std::fs::read_to_string(demo.join("cache-size")).map_err(|e| e.to_string())?;
        (df.split_whitespace().nth(1) == Some("16384"))
            .then_some(())
            .ok_or(df)
    });
}

#[test]
fn a_finished_pod_kept_for_its_status_has_its_volumes_torn_down() {
    let Some(agent) = start_agent("volumes-finished") else {
        return;
    };
    let spec = "  restartPolicy: Never
  volumes:
  - {name: mem, emptyDir: {medium: Memory}}
";
    let mounts = "    volumeMounts:
    - {name: mem, mountPath: /mem}
";
    agent.write_manifest(
        "done.yaml",
        &agent.busybox_pod("done", spec, "echo x > /mem/f && sleep 1", mounts),
    );
    let pod = agent.static_pod_name("done");
    let list = agent.wait_for(|l| l.phase(&pod) == Some("Succeeded"), TIMEOUT);
    let uid = list.uid(&pod).expect("uid").to_owned();
    let volumes = agent.root_dir().join("pods").join(&uid).join("volumes");
    agent.eventually("the finished pod's volumes to go", TIMEOUT, || {
        let mounts = mounts_below(agent.root_dir());
        match (mounts.is_empty(), volumes.exists()) {
            (true, false) => Ok(()),
            _ => Err(format!("mounts {mounts:?}, {} there", volumes.display())),
        }
    });
    // The pod itself stays, for its status.
    assert_eq!(agent.pods().phase(&pod), Some("Succeeded"));
}
