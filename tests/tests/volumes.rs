//! Volumes on a real containerd, seen from inside the containers (CRI ExecSync): an emptyDir
//! shared by two containers, a Memory emptyDir that is a tmpfs of its size, hostPath files and
//! directories with their content, readOnly and subPath mounts; hostPath content outliving the
//! pod and an agent killed with SIGKILL; nothing of a volume left (no mount, no directory) once
//! the pod is gone, even when it went while the agent was down; and a hostPath type mismatch
//! keeping the pod waiting with the reason. configMap, secret, downwardAPI and projected
//! volumes of pods from the in-process API server: their content and modes, a configMap update
//! arriving in the running container, the token, a pod waiting on a missing configMap, a
//! static pod naming a configMap rejected, two pods sharing a configMap and a secret that are
//! each listed once and then followed by one watch that ends with the last pod, and a projected
//! service account token requested again before it expires and seen by the running container.
//! persistentVolumeClaim volumes: a pod waiting for its claim to be bound, then writing to a
//! local PersistentVolume that the next pod reads (read-only) after the first is gone, a
//! hostPath PersistentVolume used in place, a generic ephemeral volume used once its claim is
//! the pod's own, and a volume whose node affinity names another node keeping its pod waiting.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod, PodSecurityContext,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use swiftlet_tests::api_server::{config_map, opaque_secret, service_account};
use swiftlet_tests::{Agent, BUSYBOX_IMAGE, PodList, exec, start_agent};

const TIMEOUT: Duration = Duration::from_secs(60);

/// A static pod `name` (UID `<name>-<node>`) with containers `main` and `other` running `sleep`,
/// the volumes `volumes` (YAML lines indented by two spaces) and each container's mounts.
fn pod(agent: &Agent, name: &str, volumes: &str, main_mounts: &str, other_mounts: &str) -> String {
    let node = agent.node_name();
    let (main, other) = (
        looping_container("main", "", main_mounts),
        looping_container("other", "", other_mounts),
    );
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default, uid: {name}-{node}}}
spec:
  terminationGracePeriodSeconds: 2
  volumes:
{volumes}  containers:
{main}{other}"#
    )
}

/// Container `name` of a pod's `containers` (indented by two spaces): busybox looping until
/// SIGTERM, with `extra` fields (lines indented by four spaces) and `mounts` (by four).
fn looping_container(name: &str, extra: &str, mounts: &str) -> String {
    format!(
        r#"  - name: {name}
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: Never
    command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]
{extra}    volumeMounts:
{mounts}"#
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
    // (A configMap volume is refused earlier, in a static pod: see below.)
    let refused = "  - {name: cfg, nfs: {server: nfs.example, path: /}}
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
        message.contains("volume \"cfg\": type nfs is not supported yet"),
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

// ---------------------------------------------------------------------------------------------
// configMap, secret, downwardAPI and projected volumes, from the in-process API server

/// An agent taking pods from its own in-process API server, which serves the configMaps,
/// secrets, service account (`robot`) and tokens; pods are synced every 3 s
/// (`--sync-frequency`) unless said otherwise.
struct ApiSetup {
    agent: Agent,
    server: swiftlet_tests::api_server::ApiServer,
    _tokio: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
}

fn api_setup(name: &str) -> Option<ApiSetup> {
    api_setup_syncing_every(name, "3s")
}

/// [`api_setup`] with pods synced every `sync_frequency`.
fn api_setup_syncing_every(name: &str, sync_frequency: &str) -> Option<ApiSetup> {
    let runtime = swiftlet_tests::Runtime::shared()?;
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let server = tokio.block_on(swiftlet_tests::api_server::ApiServer::start());
    let mut opts = swiftlet_tests::AgentOptions::new(name);
    opts.extra_args = vec!["--sync-frequency".into(), sync_frequency.into()];
    let dir = server.point_agent(&mut opts);
    // The pods' service account.
    server.put_object(service_account("robot"));
    Some(ApiSetup {
        agent: Agent::start(runtime, opts),
        server,
        _tokio: tokio,
        _dir: dir,
    })
}

impl ApiSetup {
    /// Deletes API pod `uid` and waits until nothing of its volumes is left (no mount, no
    /// directory).
    fn delete_pod(&self, uid: &str) {
        self.server.delete(uid);
        volumes_gone(&self.agent, uid);
    }
}

/// An API pod `name` (UID `<name>-<node>`, label `app: web`) whose container `main` loops with
/// a 64Mi memory limit; `volumes` and `mounts` are YAML lines indented by two and four spaces.
fn api_pod(agent: &Agent, name: &str, volumes: &str, mounts: &str) -> Pod {
    let node = agent.node_name();
    let main = looping_container(
        "main",
        "    resources: {limits: {memory: 64Mi}, requests: {memory: 64Mi}}\n",
        mounts,
    );
    let yaml = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default, uid: {name}-{node}, labels: {{app: web}}}}
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 2
  serviceAccountName: robot
  volumes:
{volumes}  containers:
{main}"#
    );
    serde_saphyr::from_str(&yaml).expect("a pod")
}

/// Waits until container `main` of API pod `name` runs; returns its UID.
fn api_running(agent: &Agent, name: &str) -> String {
    let list = agent.wait_for(
        |l| {
            l.container(name, "main")
                .is_some_and(swiftlet_tests::is_running)
        },
        TIMEOUT,
    );
    list.uid(name).expect("uid").to_owned()
}

/// Whether `path` is a tmpfs mount point inside container `main` of `pod`.
fn tmpfs_inside(agent: &Agent, pod: &str, path: &str) -> bool {
    let mounts = sh_ok(agent, pod, "main", "cat /proc/mounts");
    mounts.lines().any(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        f.get(1) == Some(&path) && f.get(2) == Some(&"tmpfs")
    })
}

#[test]
fn api_volumes_show_their_objects_inside_the_container_follow_updates_and_go_with_the_pod() {
    let Some(s) = api_setup("api-volumes") else {
        return;
    };
    let (agent, server) = (&s.agent, &s.server);
    let name = "apivol";
    let mut cm = config_map(&format!("{name}-cm"), &[("greeting", "hello")]);
    cm.binary_data = Some([("blob".to_owned(), ByteString(vec![0, 1, 2, 255]))].into());
    server.put_object(cm);
    server.put_secret(opaque_secret(
        &format!("{name}-secret"),
        &[("password", b"hunter2")],
    ));
    let volumes = format!(
        r#"  - {{name: cfg, configMap: {{name: {name}-cm}}}}
  - {{name: picked, configMap: {{name: {name}-cm, items: [{{key: greeting, path: dir/hello, mode: 384}}]}}}}
  - {{name: creds, secret: {{secretName: {name}-secret, defaultMode: 256}}}}
  - {{name: none, configMap: {{name: {name}-absent, optional: true}}}}
  - name: info
    downwardAPI:
      items:
      - {{path: name, fieldRef: {{fieldPath: metadata.name}}}}
      - {{path: labels, fieldRef: {{fieldPath: metadata.labels}}}}
      - {{path: mem, resourceFieldRef: {{containerName: main, resource: limits.memory, divisor: 1Mi}}}}
  - name: all
    projected:
      sources:
      - configMap: {{name: {name}-cm, items: [{{key: greeting, path: greeting}}]}}
      - secret: {{name: {name}-secret}}
      - serviceAccountToken: {{path: token, audience: vault, expirationSeconds: 3600}}
      - downwardAPI: {{items: [{{path: uid, fieldRef: {{fieldPath: metadata.uid}}}}]}}
"#
    );
    let mounts = r#"    - {name: cfg, mountPath: /cfg}
    - {name: picked, mountPath: /picked}
    - {name: creds, mountPath: /creds}
    - {name: none, mountPath: /none}
    - {name: info, mountPath: /info}
    - {name: all, mountPath: /all}
    - {name: cfg, mountPath: /pinned/greeting, subPath: greeting}
"#;
    let mut pod = api_pod(agent, name, &volumes, mounts);
    // The pod's fsGroup: the files are given to it, with group read.
    pod.spec.as_mut().expect("spec").security_context =
        Some(serde_json::from_value(serde_json::json!({"fsGroup": 2345})).expect("context"));
    server.put(pod);
    let uid = api_running(agent, name);
    let inside = |script: &str| sh_ok(agent, name, "main", script);

    // Content and modes, through the ..data symlinks.
    assert_eq!(inside("cat /cfg/greeting"), "hello");
    assert_eq!(
        inside("od -An -tu1 /cfg/blob")
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["0", "1", "2", "255"]
    );
    assert_eq!(inside("readlink /cfg/greeting"), "..data/greeting\n");
    assert_eq!(inside("stat -L -c %a /cfg/greeting"), "644\n");
    assert_eq!(inside("cat /picked/dir/hello"), "hello");
    assert_eq!(inside("stat -L -c '%a %g' /picked/dir/hello"), "640 2345\n");
    assert_eq!(inside("ls /picked"), "dir\n", "only the items asked for");
    assert_eq!(inside("cat /creds/password"), "hunter2");
    assert_eq!(inside("stat -L -c '%a %g' /creds/password"), "440 2345\n");
    assert_eq!(
        inside("ls /none"),
        "",
        "a missing optional configMap: an empty volume"
    );
    assert_eq!(inside("cat /info/name"), name);
    assert_eq!(inside("cat /info/labels"), "app=\"web\"");
    assert_eq!(inside("cat /info/mem"), "64");
    assert_eq!(inside("cat /all/greeting"), "hello");
    assert_eq!(inside("cat /all/password"), "hunter2");
    assert_eq!(inside("cat /all/uid"), uid);
    let token = inside("cat /all/token");
    assert!(token.contains(".test-signature-"), "{token}");
    assert_eq!(
        inside("stat -L -c '%a %g' /all/token"),
        "640 2345\n",
        "with an fsGroup: 0600, then the group's read"
    );
    assert_eq!(inside("cat /pinned/greeting"), "hello");
    // Secrets, downwardAPI and projected volumes are tmpfs; a configMap is on disk. All are
    // read-only.
    for p in ["/creds", "/info", "/all"] {
        assert!(tmpfs_inside(agent, name, p), "{p} is not a tmpfs");
    }
    assert!(!tmpfs_inside(agent, name, "/cfg"));
    let (code, _) = sh(agent, name, "main", "touch /cfg/new");
    assert_ne!(code, 0, "a configMap volume is read-only");
    // The token was asked for the pod's service account, bound to the pod.
    let requests = server.token_requests();
    let (ns, account, spec) = requests.last().expect("a TokenRequest");
    assert_eq!((ns.as_str(), account.as_str()), ("default", "robot"));
    assert_eq!(spec["audiences"], serde_json::json!(["vault"]));
    assert_eq!(spec["expirationSeconds"], 3600);
    assert_eq!(spec["boundObjectRef"]["kind"], "Pod");
    assert_eq!(spec["boundObjectRef"]["name"], name);
    assert_eq!(spec["boundObjectRef"]["uid"], uid.as_str());

    // An update reaches the running container within a sync period; the subPath mount keeps
    // what it had, as on the kubelet; the token is not requested again.
    server.put_object(config_map(
        &format!("{name}-cm"),
        &[("greeting", "hi again")],
    ));
    agent.eventually("the configMap update inside the container", TIMEOUT, || {
        let (code, out) = sh(agent, name, "main", "cat /cfg/greeting /all/greeting");
        (code == 0 && out == "hi againhi again")
            .then_some(())
            .ok_or(out)
    });
    assert_eq!(inside("ls /cfg"), "greeting\n", "the gone key went");
    assert_eq!(inside("cat /pinned/greeting"), "hello");
    assert_eq!(server.token_requests().len(), requests.len());
    // Neither the secret's value (as it is or as the API sends it, base64) nor the token
    // reaches the agent's own log, at debug level.
    let log = agent.log();
    for (what, value) in [
        ("the secret's value", "hunter2"),
        ("the secret's value in base64", "aHVudGVyMg=="),
        ("the service account token", token.trim()),
    ] {
        assert!(
            !log.contains(value),
            "{what} is in {}",
            agent.log_path().display()
        );
    }

    s.delete_pod(&uid);
}

#[test]
fn a_static_pod_naming_api_objects_is_rejected_with_the_kubelets_message() {
    let Some(agent) = start_agent("static-api-refs") else {
        return;
    };
    let volumes = "  - {name: cfg, configMap: {name: settings}}\n";
    let mounts = "    - {name: cfg, mountPath: /cfg}\n";
    agent.write_manifest("refs.yaml", &pod(&agent, "refs", volumes, mounts, mounts));
    agent.eventually("the rejection in the log", TIMEOUT, || {
        agent
            .log()
            .contains("static pods may not reference configmaps")
            .then_some(())
            .ok_or_else(|| "not yet".to_owned())
    });
    let (status, body) = agent.get("/debug/manifests");
    assert_eq!(status, 200);
    assert!(
        body.contains("static pods may not reference configmaps"),
        "{body}"
    );
    assert!(agent.pods().items.is_empty(), "{}", agent.pods().summary());
}

#[test]
fn a_pod_waits_for_a_missing_config_map_with_nothing_mounted_and_starts_when_it_appears() {
    let Some(s) = api_setup("api-volumes-wait") else {
        return;
    };
    let name = "apivol-late";
    let agent = &s.agent;
    let volumes = format!(
        "  - {{name: scratch, emptyDir: {{medium: Memory}}}}\n  - {{name: cfg, configMap: {{name: {name}-cm}}}}\n"
    );
    let mounts = "    - {name: scratch, mountPath: /scratch}\n    - {name: cfg, mountPath: /cfg}\n";
    // Nothing mounted (not even the Memory emptyDir) and no sandbox.
    let uid = put_and_see_it_wait(
        &s,
        api_pod(agent, name, &volumes, mounts),
        &format!("MountVolume.SetUp failed for volume \"cfg\" : configmap \"{name}-cm\" not found"),
    );
    s.server
        .put_object(config_map(&format!("{name}-cm"), &[("k", "v")]));
    api_running(agent, name);
    assert_eq!(sh_ok(agent, name, "main", "cat /cfg/k"), "v");
    s.delete_pod(&uid);
}

#[test]
fn pods_sharing_a_config_map_and_a_secret_read_each_once_through_its_watch_until_the_last_goes() {
    let Some(s) = api_setup("api-volumes-watch") else {
        return;
    };
    let (agent, server) = (&s.agent, &s.server);
    let name = "shared";
    server.put_object(config_map(&format!("{name}-cm"), &[("mode", "fast")]));
    server.put_secret(opaque_secret(&format!("{name}-secret"), &[("pw", b"x")]));
    let volumes = format!(
        "  - {{name: cfg, configMap: {{name: {name}-cm}}}}\n  - {{name: creds, secret: {{secretName: {name}-secret}}}}\n"
    );
    let mounts = "    - {name: cfg, mountPath: /cfg}\n    - {name: creds, mountPath: /creds}\n";
    let uids: Vec<String> = ["shared-a", "shared-b"]
        .iter()
        .map(|pod| {
            let mut p = api_pod(agent, pod, &volumes, mounts);
            // The configMap in the environment too: one watch serves both readers.
            p.spec.as_mut().expect("spec").containers[0].env = Some(
                serde_json::from_value(serde_json::json!([{"name": "MODE", "valueFrom":
                    {"configMapKeyRef": {"name": format!("{name}-cm"), "key": "mode"}}}]))
                .expect("env"),
            );
            server.put(p);
            api_running(agent, pod)
        })
        .collect();
    for pod in ["shared-a", "shared-b"] {
        assert_eq!(
            sh_ok(agent, pod, "main", "cat /cfg/mode; echo $MODE"),
            "fastfast\n"
        );
        assert_eq!(sh_ok(agent, pod, "main", "cat /creds/pw"), "x");
    }
    // Several syncs later (every 3 s): each object was listed once and is watched, never read
    // one by one.
    std::thread::sleep(Duration::from_secs(7));
    for resource in ["configmaps", "secrets"] {
        let reads = server.object_reads(resource);
        assert_eq!((reads.lists, reads.gets), (1, 0), "{resource}: {reads:?}");
        assert!(reads.watches >= 1, "{resource}: {reads:?}");
    }
    assert_eq!(server.open_object_watches(), 2);

    // A change arrives by the watch and reaches both pods' volumes.
    server.put_object(config_map(&format!("{name}-cm"), &[("mode", "slow")]));
    for pod in ["shared-a", "shared-b"] {
        agent.eventually("the update in the volume", TIMEOUT, || {
            let (code, out) = sh(agent, pod, "main", "cat /cfg/mode");
            (code == 0 && out == "slow").then_some(()).ok_or(out)
        });
    }
    assert_eq!(server.object_reads("configmaps").lists, 1);

    // The watches live while a pod names the objects, and end with the last one.
    server.delete(&uids[0]);
    let first = agent.root_dir().join("pods").join(&uids[0]);
    agent.eventually("the first pod's volumes to go", TIMEOUT, || {
        (!first.exists())
            .then_some(())
            .ok_or_else(|| format!("mounts: {:?}", mounts_below(&first)))
    });
    assert_eq!(server.open_object_watches(), 2);
    s.delete_pod(&uids[1]);
    agent.eventually("the watches ended", TIMEOUT, || {
        let open = server.open_object_watches();
        (open == 0).then_some(()).ok_or(format!("{open} open"))
    });
}

#[test]
fn a_projected_token_is_requested_again_before_it_expires_and_reaches_the_running_container() {
    let Some(s) = api_setup("api-volumes-token") else {
        return;
    };
    let (agent, server) = (&s.agent, &s.server);
    // Tokens of 20 s whatever is asked for: the agent must ask again once 80% of that has
    // passed (less up to 10 s of jitter), and the next sync (every 3 s) writes the new one.
    server.cap_token_lifetime(20);
    let name = "tokrot";
    let volumes = "  - name: all\n    projected:\n      sources:\n      - serviceAccountToken: {path: token, audience: vault, expirationSeconds: 3600}\n";
    let mounts = "    - {name: all, mountPath: /all}\n";
    server.put(api_pod(agent, name, volumes, mounts));
    let uid = api_running(agent, name);
    let first = sh_ok(agent, name, "main", "cat /all/token");
    let issued = std::time::Instant::now();
    assert!(first.contains(".test-signature-"), "{first}");
    let requested = server.token_requests().len();
    agent.eventually("a new token in the running container", TIMEOUT, || {
        let now = sh_ok(agent, name, "main", "cat /all/token");
        (now != first && now.contains(".test-signature-"))
            .then_some(())
            .ok_or(now)
    });
    let after = issued.elapsed();
    let requests = server.token_requests();
    assert!(requests.len() > requested, "{requests:?}");
    let (_, account, spec) = requests.last().expect("a request");
    assert_eq!(account, "robot");
    assert_eq!(spec["audiences"], serde_json::json!(["vault"]));
    assert_eq!(spec["boundObjectRef"]["uid"], uid.as_str());
    // Not while most of its life was left: 16 s less at most 10 s of jitter (and the second
    // or so between its issue and the first read).
    assert!(
        after >= Duration::from_secs(4),
        "the token was replaced {after:?} after its issue"
    );
    s.delete_pod(&uid);
}

#[test]
fn a_changed_config_map_reaches_the_volume_without_waiting_for_a_sync_period() {
    // Pods are synced every 10 minutes (jittered: at least 5): only the watch of the configMap
    // can bring its change within the 30 s allowed below.
    let Some(s) = api_setup_syncing_every("api-volumes-prompt", "10m") else {
        return;
    };
    let (agent, server) = (&s.agent, &s.server);
    let name = "prompt";
    server.put_object(config_map(&format!("{name}-cm"), &[("mode", "fast")]));
    let volumes = format!("  - {{name: cfg, configMap: {{name: {name}-cm}}}}\n");
    let mounts = "    - {name: cfg, mountPath: /cfg}\n";
    server.put(api_pod(agent, name, &volumes, mounts));
    let uid = api_running(agent, name);
    assert_eq!(sh_ok(agent, name, "main", "cat /cfg/mode"), "fast");
    server.put_object(config_map(&format!("{name}-cm"), &[("mode", "slow")]));
    agent.eventually("the change in the volume", Duration::from_secs(30), || {
        let (code, out) = sh(agent, name, "main", "cat /cfg/mode");
        (code == 0 && out == "slow").then_some(()).ok_or(out)
    });
    s.delete_pod(&uid);
}

// ---------------------------------------------------------------------------------------------
// persistentVolumeClaim volumes bound to local and hostPath PersistentVolumes

/// Claim `default/name`, unbound (`Pending`), as a user creates it.
fn claim(name: &str) -> PersistentVolumeClaim {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        "status": {"phase": "Pending"},
    }))
    .expect("a claim")
}

/// PersistentVolume `name` backed by `backing` (`{"local": ...}` or `{"hostPath": ...}`), whose
/// node affinity asks for the node with hostname label `node`.
fn persistent_volume(name: &str, backing: serde_json::Value, node: &str) -> PersistentVolume {
    let mut spec = serde_json::json!({
        "capacity": {"storage": "1Gi"},
        "accessModes": ["ReadWriteOnce"],
        "volumeMode": "Filesystem",
        "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
        ]}]}},
    });
    for (k, v) in backing.as_object().expect("an object") {
        spec[k] = v.clone();
    }
    serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "spec": spec}))
        .expect("a PersistentVolume")
}

/// Binds claim `default/claim` to PersistentVolume `pv` both ways, as the PersistentVolume
/// controller does: the volume's claimRef names the claim and its UID, the claim's volumeName
/// names the volume and its phase is `Bound`.
fn bind(server: &swiftlet_tests::api_server::ApiServer, claim: &str, mut pv: PersistentVolume) {
    let mut pvc: PersistentVolumeClaim = server.object("default", claim).expect("the claim");
    let pv_name = pv.metadata.name.clone().expect("named");
    pv.spec.as_mut().expect("spec").claim_ref = Some(ObjectReference {
        kind: Some("PersistentVolumeClaim".into()),
        namespace: Some("default".into()),
        name: Some(claim.into()),
        uid: pvc.metadata.uid.clone(),
        ..Default::default()
    });
    server.put_cluster_object(pv);
    pvc.spec.get_or_insert_default().volume_name = Some(pv_name);
    pvc.status.get_or_insert_default().phase = Some("Bound".into());
    server.put_object(pvc);
}

/// Puts claim `default/claim` and PersistentVolume `pv` backed by `backing` for node `node`,
/// bound to each other.
fn bound_claim(s: &ApiSetup, claim_name: &str, pv: &str, backing: serde_json::Value, node: &str) {
    s.server.put_object(claim(claim_name));
    bind(&s.server, claim_name, persistent_volume(pv, backing, node));
}

/// Puts API pod `pod` (see [`api_pod`]), and waits until its container `main` waits with
/// reason `ContainerCreating` and a message holding `expected`; asserts that no sandbox and no
/// mount was made for the pod. Returns its UID.
fn put_and_see_it_wait(s: &ApiSetup, pod: Pod, expected: &str) -> String {
    let agent = &s.agent;
    let name = pod.metadata.name.clone().expect("named");
    let name = name.as_str();
    s.server.put(pod);
    let list = agent.wait_for(
        |l| {
            l.container(name, "main")
                .and_then(|c| c.state.as_ref()?.waiting.as_ref()?.message.clone())
                .is_some_and(|m| !m.is_empty())
        },
        TIMEOUT,
    );
    let waiting = list
        .container(name, "main")
        .and_then(|c| c.state.as_ref()?.waiting.clone())
        .expect("waiting");
    assert_eq!(waiting.reason.as_deref(), Some("ContainerCreating"));
    let message = waiting.message.unwrap_or_default();
    assert!(message.contains(expected), "{message}");
    let uid = list.uid(name).expect("uid").to_owned();
    let pod_dir = agent.root_dir().join("pods").join(&uid);
    assert_eq!(mounts_below(&pod_dir), Vec::<String>::new());
    let (sandboxes, _) = swiftlet_tests::pod_cri_objects(agent.endpoint(), &uid).expect("CRI");
    assert!(sandboxes.is_empty(), "{sandboxes:?}");
    uid
}

#[test]
fn a_claim_waits_until_bound_and_its_local_volume_keeps_data_for_the_next_pod() {
    let Some(s) = api_setup("pvc-local") else {
        return;
    };
    let agent = &s.agent;
    let node = agent.node_name();
    let disk = tempfile::tempdir().expect("tempdir");
    s.server.put_object(claim("db-data"));
    let volumes = "  - {name: data, persistentVolumeClaim: {claimName: db-data}}\n";
    let mounts = "    - {name: data, mountPath: /data}\n";
    // The writer runs as a user of its own; the fsGroup gives it the volume.
    let mut writer = api_pod(agent, "pvc-writer", volumes, mounts);
    writer.spec.as_mut().expect("spec").security_context = Some(PodSecurityContext {
        run_as_user: Some(1000),
        fs_group: Some(2000),
        ..Default::default()
    });
    // Unbound: the pod waits with the kubelet's reason, nothing made for it.
    let uid = put_and_see_it_wait(
        &s,
        writer,
        "PVC default/db-data has non-bound phase (\"Pending\") or empty pvc.Spec.VolumeName (\"\")",
    );

    // Bound: the pod starts, the volume is a bind at the kubelet's path, writes reach the disk.
    let pv = persistent_volume(
        "local-pv-1",
        serde_json::json!({"local": {"path": disk.path()}}),
        node,
    );
    bind(&s.server, "db-data", pv);
    api_running(agent, "pvc-writer");
    let bound = agent
        .root_dir()
        .join("pods")
        .join(&uid)
        .join("volumes/kubernetes.io~local-volume/local-pv-1");
    let bound = bound.canonicalize().expect("the volume's directory");
    assert_eq!(
        mounts_below(&agent.root_dir().join("pods").join(&uid)),
        vec![bound.to_string_lossy().into_owned()]
    );
    sh_ok(agent, "pvc-writer", "main", "echo kept > /data/note");
    assert_holds(&disk.path().join("note"), "kept\n");
    use std::os::unix::fs::MetadataExt;
    let note = std::fs::metadata(disk.path().join("note")).expect("stat");
    assert_eq!(
        (note.uid(), note.gid()),
        (1000, 2000),
        "written by the pod's user, in its group"
    );

    // Its use, as the kubelet reports a claim's: in the summary with its claim, measured from
    // the disk's file system, and as `kubelet_volume_stats_*` of the claim.
    let capacity = swiftlet::cm::filesystem_stats(disk.path())
        .expect("statvfs")
        .capacity_bytes;
    let series = "kubelet_volume_stats_capacity_bytes{namespace=\"default\",persistentvolumeclaim=\"db-data\"}";
    agent.eventually(
        "the claim's volume in the summary and the metrics",
        TIMEOUT,
        || {
            let (_, body) = agent.get("/stats/summary");
            let summary: serde_json::Value =
                serde_json::from_str(&body).map_err(|e| e.to_string())?;
            let volume = summary["pods"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|p| p["podRef"]["name"] == "pvc-writer")
                .flat_map(|p| p["volume"].as_array().cloned().unwrap_or_default())
                .find(|v| v["name"] == "data")
                .ok_or("no volume entry yet")?;
            if volume["pvcRef"] != serde_json::json!({"name": "db-data", "namespace": "default"})
                || volume["capacityBytes"].as_u64() != Some(capacity)
                || volume["usedBytes"].as_u64().unwrap_or(0) == 0
            {
                return Err(format!("{volume}"));
            }
            let metric = agent.metric(series);
            if metric != capacity as f64 {
                return Err(format!("{series} is {metric}, not {capacity}"));
            }
            Ok(())
        },
    );

    // The container restarts: the volume is set up again, its bind kept (not made twice),
    // and the new instance reads the data.
    sh(agent, "pvc-writer", "main", "kill 1");
    agent.wait_for(
        |l| {
            l.container("pvc-writer", "main")
                .is_some_and(|c| c.restart_count >= 1 && swiftlet_tests::is_running(c))
        },
        TIMEOUT,
    );
    assert_eq!(
        sh_ok(agent, "pvc-writer", "main", "cat /data/note"),
        "kept\n"
    );
    assert_eq!(
        mounts_below(&agent.root_dir().join("pods").join(&uid)),
        vec![bound.to_string_lossy().into_owned()]
    );

    // The pod goes: its bind goes, the data stays, and so do its series.
    s.delete_pod(&uid);
    assert_holds(&disk.path().join("note"), "kept\n");
    assert!(!agent.get("/metrics").1.contains(series));

    // The next pod of the claim, mounting it read-only, reads it and cannot write.
    let volumes = "  - {name: data, persistentVolumeClaim: {claimName: db-data, readOnly: true}}\n";
    s.server.put(api_pod(agent, "pvc-reader", volumes, mounts));
    let uid = api_running(agent, "pvc-reader");
    assert_eq!(
        sh_ok(agent, "pvc-reader", "main", "cat /data/note"),
        "kept\n"
    );
    let (code, out) = sh(agent, "pvc-reader", "main", "echo x > /data/other");
    assert_ne!(code, 0, "{out}");
    assert!(!disk.path().join("other").exists());
    s.delete_pod(&uid);
    assert_holds(&disk.path().join("note"), "kept\n");
}

#[test]
fn host_path_and_ephemeral_volumes_are_used_and_a_volume_of_another_node_keeps_its_pod_waiting() {
    let Some(s) = api_setup("pvc-affinity") else {
        return;
    };
    let agent = &s.agent;
    let node = agent.node_name();
    let host = tempfile::tempdir().expect("tempdir");
    let dir = host.path().join("made");

    // A hostPath volume: made (DirectoryOrCreate) and used in place.
    let backing = serde_json::json!({"hostPath": {"path": dir, "type": "DirectoryOrCreate"}});
    bound_claim(&s, "logs", "host-pv-1", backing, node);
    let volumes = "  - {name: logs, persistentVolumeClaim: {claimName: logs}}\n";
    let mounts = "    - {name: logs, mountPath: /logs}\n";
    s.server.put(api_pod(agent, "pvc-host", volumes, mounts));
    let uid = api_running(agent, "pvc-host");
    sh_ok(agent, "pvc-host", "main", "echo line > /logs/app.log");
    assert_holds(&dir.join("app.log"), "line\n");
    s.delete_pod(&uid);
    assert_holds(&dir.join("app.log"), "line\n");

    // A generic ephemeral volume: its claim, named after the pod and the volume, is used only
    // once it is the pod's own (the ephemeral volume controller makes it so).
    let backing = serde_json::json!({"hostPath": {"path": host.path().join("eph"), "type": "DirectoryOrCreate"}});
    bound_claim(&s, "pvc-eph-scratch", "host-pv-2", backing, node);
    let volumes = "  - name: scratch\n    ephemeral: {volumeClaimTemplate: {spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}}}\n";
    let mounts = "    - {name: scratch, mountPath: /data}\n";
    let uid = put_and_see_it_wait(
        &s,
        api_pod(agent, "pvc-eph", volumes, mounts),
        "PVC default/pvc-eph-scratch was not created for pod default/pvc-eph (pod is not owner)",
    );
    let mut owned: PersistentVolumeClaim = s
        .server
        .object("default", "pvc-eph-scratch")
        .expect("the claim");
    owned.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: "pvc-eph".into(),
        uid: uid.clone(),
        controller: Some(true),
        ..Default::default()
    }]);
    s.server.put_object(owned);
    api_running(agent, "pvc-eph");
    sh_ok(agent, "pvc-eph", "main", "echo tmp > /data/t");
    assert_holds(&host.path().join("eph/t"), "tmp\n");
    s.delete_pod(&uid);

    // A volume whose node affinity names another node is never mounted here.
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let backing = serde_json::json!({"local": {"path": elsewhere.path()}});
    bound_claim(&s, "far", "local-pv-far", backing, "another-node");
    let volumes = "  - {name: data, persistentVolumeClaim: {claimName: far}}\n";
    let far = api_pod(
        agent,
        "pvc-far",
        volumes,
        "    - {name: data, mountPath: /d}\n",
    );
    let uid = put_and_see_it_wait(
        &s,
        far,
        "MountVolume.NodeAffinity check failed for PV \"local-pv-far\": no matching NodeSelectorTerms",
    );
    s.delete_pod(&uid);
}
