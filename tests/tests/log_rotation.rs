//! Container log rotation on the real containerd: a container writing fast to stdout under
//! `--container-log-max-size 64Ki`, `--container-log-max-files 3` and the shortest monitor
//! interval the kubelet allows (3s) ends up with its current log and at most two rotated files,
//! the older of them gzip-compressed and holding CRI log lines, no leftover of a compression, and
//! the container (the same one, never restarted) still logging into the current file containerd
//! reopened. The rotations are counted in `/metrics`. The container starts after a pass listed
//! none, with the eBPF probes reporting every exit: the start makes the passes list again. A
//! current log removed by someone else is reopened by the runtime at the next pass. A rotation the
//! runtime refuses to reopen (an exited container) is undone: the log is renamed back and nothing
//! else is left. The dead instances of a crash-looping container that are collected take their
//! log files (rotated ones included) with them.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_cri::v1::ContainerStatus;
use swiftlet::logs::{LogManager, Policy, RotateError};
use swiftlet::metrics::Metrics;
use swiftlet_tests::{
    Agent, AgentOptions, Runtime, block_on, container_statuses, script_pod_manifest, start_agent,
};

const MAX_FILES: usize = 3;
const TIMEOUT: Duration = Duration::from_secs(90);

/// The files of the container's log directory, sorted by name.
fn files(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// The timestamps of the rotated files (`0.log.<stamp>[.gz|.tmp]`), each once, sorted.
fn rotations(files: &[String]) -> Vec<String> {
    let mut out: Vec<String> = files
        .iter()
        .filter_map(|f| f.strip_prefix("0.log."))
        .map(|rest| rest.split('.').next().unwrap_or_default().to_owned())
        .collect();
    out.dedup();
    out
}

/// The batch numbers of CRI log lines (`<RFC 3339 time> stdout F batch <n> ...`); panics on a
/// line that is not one.
fn batches(text: &str, what: &str) -> Vec<u64> {
    text.lines()
        .map(|line| {
            let mut parts = line.splitn(4, ' ');
            let (time, stream, tag, msg) = (
                parts.next().unwrap_or_default(),
                parts.next().unwrap_or_default(),
                parts.next().unwrap_or_default(),
                parts.next().unwrap_or_default(),
            );
            assert!(
                time.len() > 20 && time.contains('T') && stream == "stdout" && tag == "F",
                "{what}: not a CRI log line: {line:?}"
            );
            msg.strip_prefix("batch ")
                .and_then(|m| m.split(' ').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("{what}: not the container's output: {line:?}"))
        })
        .collect()
}

fn gunzip(path: &Path) -> String {
    let mut out = String::new();
    let file =
        std::fs::File::open(path).unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
    flate2::read::GzDecoder::new(file)
        .read_to_string(&mut out)
        .unwrap_or_else(|e| panic!("decompressing {}: {e}", path.display()));
    out
}

/// Writes static pod `name` (one container `main` running `script` under `policy`); returns its
/// UID and its container's log directory.
fn start_pod(agent: &Agent, name: &str, policy: &str, script: &str) -> (String, PathBuf) {
    agent.write_manifest(
        &format!("{name}.yaml"),
        &script_pod_manifest(agent.node_name(), name, policy, script, ""),
    );
    let pod = agent.static_pod_name(name);
    let uid = format!("{name}-{}", agent.node_name());
    let dir = agent
        .root_dir()
        .join("pod-logs")
        .join(format!("default_{pod}_{uid}"))
        .join("main");
    (uid, dir)
}

/// Waits for a container of pod `uid` in `state`; returns its runtime status.
fn container_in(agent: &Agent, uid: &str, state: k8s_cri::v1::ContainerState) -> ContainerStatus {
    agent.eventually(&format!("a container {state:?}"), TIMEOUT, || {
        container_statuses(agent.endpoint(), uid)
            .map_err(|e| e.to_string())?
            .into_iter()
            .find(|c| c.state == state as i32)
            .ok_or_else(|| "none yet".to_owned())
    })
}

/// Waits for the current log to hold a batch after `after`; returns the newest batch in it.
fn newer_lines_in_current_log(agent: &Agent, dir: &Path, after: u64) -> u64 {
    agent.eventually("newer lines in the current log", TIMEOUT, || {
        let current = std::fs::read_to_string(dir.join("0.log")).map_err(|e| e.to_string())?;
        // The line the runtime is writing now may be incomplete.
        let complete = &current[..current.rfind('\n').map_or(0, |i| i + 1)];
        let newest = batches(complete, "the current log").into_iter().max();
        newest
            .filter(|b| *b > after)
            .ok_or_else(|| format!("no batch after {after} yet"))
    })
}

fn rotations_counted(agent: &Agent) -> u64 {
    agent.metric("swiftlet_container_log_rotations_total") as u64
}

/// Waits until the eBPF probes report every exit (the relist is a safety net) and a rotation
/// pass has listed the running containers since: the passes after it reuse that listing until
/// a container starts, stops or exits.
fn wait_for_a_trusted_listing(agent: &Agent) {
    const PASSES: &str = "swiftlet_container_log_rotation_pass_duration_seconds_count";
    let trusted_at = agent.eventually("the relist to become a safety net", TIMEOUT, || {
        if agent.metric("swiftlet_pleg_safety_net") == 1.0 {
            Ok(agent.metric(PASSES))
        } else {
            Err("not yet".to_owned())
        }
    });
    agent.eventually("a rotation pass since", TIMEOUT, || {
        let passes = agent.metric(PASSES);
        if passes >= trusted_at + 2.0 {
            Ok(())
        } else {
            Err(format!("{passes} passes"))
        }
    });
}

#[test]
fn a_fast_logging_container_has_its_log_rotated_compressed_and_reopened() {
    let Some(rt) = Runtime::shared() else { return };
    let mut opts = AgentOptions::new("log-rotation");
    opts.extra_args = vec![
        "--container-log-max-size=64Ki".to_owned(),
        format!("--container-log-max-files={MAX_FILES}"),
        "--container-log-monitor-interval=3s".to_owned(),
    ];
    let agent = Agent::start(rt, opts);
    // The pod starts after a pass listed no container: the start must make the passes list
    // again rather than reuse that listing.
    wait_for_a_trusted_listing(&agent);
    let name = "logrot";
    // About 100 KiB of log lines a second, in numbered batches.
    let script = "n=0; while true; do n=$((n+1)); yes \"batch $n of the log rotation test\" | head -n 1000; sleep 0.5; done";
    let (uid, dir) = start_pod(&agent, name, "Always", script);
    let first_id = container_in(&agent, &uid, k8s_cri::v1::ContainerState::ContainerRunning).id;

    // Wait for enough rotations that the oldest rotated files have been removed; no sample ever
    // shows more than max-files - 1 rotated files.
    agent.eventually("four rotations", TIMEOUT, || {
        let now = files(&dir);
        let rotated = rotations(&now);
        assert!(
            rotated.len() < MAX_FILES,
            "more than {} rotated files: {now:?}",
            MAX_FILES - 1
        );
        let counted = rotations_counted(&agent);
        if counted >= 4 {
            Ok(())
        } else {
            Err(format!("{counted} rotations counted; files {now:?}"))
        }
    });

    // Between rotations: the current file, one compressed and one uncompressed rotated file.
    let (older, newest) = agent.eventually("a settled log directory", TIMEOUT, || {
        let now = files(&dir);
        let rotated = rotations(&now);
        match (rotated.as_slice(), now.len()) {
            ([older, newest], 3)
                if now.contains(&"0.log".to_owned())
                    && now.contains(&format!("0.log.{older}.gz"))
                    && now.contains(&format!("0.log.{newest}")) =>
            {
                Ok((older.clone(), newest.clone()))
            }
            _ => Err(format!("files {now:?}")),
        }
    });
    for stamp in [&older, &newest] {
        assert!(
            stamp.len() == 15 && stamp.as_bytes()[8] == b'-',
            "rotated name not in the kubelet's YYYYmmdd-HHMMSS form: {stamp}"
        );
    }
    assert!(older < newest);
    let compressed = batches(&gunzip(&dir.join(format!("0.log.{older}.gz"))), "the .gz");
    let uncompressed = batches(
        &std::fs::read_to_string(dir.join(format!("0.log.{newest}"))).unwrap(),
        "the newest rotated file",
    );
    assert!(!compressed.is_empty() && !uncompressed.is_empty());
    assert!(
        compressed.last() <= uncompressed.first(),
        "rotated files out of order"
    );
    let last_rotated = *uncompressed.last().unwrap();

    // The container keeps writing, into the current file the runtime reopened.
    let newest_current = newer_lines_in_current_log(&agent, &dir, last_rotated);
    // A current log removed behind the runtime's back is reopened by the next pass.
    std::fs::remove_file(dir.join("0.log")).unwrap();
    newer_lines_in_current_log(&agent, &dir, newest_current);
    let statuses = container_statuses(agent.endpoint(), &uid).unwrap();
    assert_eq!(
        statuses.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
        [first_id.as_str()],
        "the container was restarted"
    );
    assert_eq!(
        statuses[0].state,
        k8s_cri::v1::ContainerState::ContainerRunning as i32
    );
    agent.remove_manifest(&format!("{name}.yaml"));
}

#[test]
fn a_rotation_the_runtime_cannot_reopen_is_renamed_back() {
    let Some(agent) = start_agent("log-rotation-undo") else {
        return;
    };
    let name = "logundo";
    // About 200 KiB of log, then the container exits (and stays exited).
    let script = "yes \"batch 1 of a log that cannot be reopened\" | head -n 4000";
    let (uid, dir) = start_pod(&agent, name, "Never", script);
    let exited = container_in(&agent, &uid, k8s_cri::v1::ContainerState::ContainerExited);
    let log = PathBuf::from(&exited.log_path);
    assert_eq!(log, dir.join("0.log"));
    let before = std::fs::read(&log).unwrap();
    assert!(
        before.len() >= 64 << 10,
        "only {} bytes logged",
        before.len()
    );

    let endpoint = agent.endpoint().to_owned();
    let node = agent.node_name().to_owned();
    let pods_logs = agent.root_dir().join("pod-logs");
    let metrics = Metrics::new();
    let counted = metrics.clone();
    let result = block_on(async move {
        let cri = swiftlet::cri::Cri::new(&endpoint, metrics.clone()).unwrap();
        let policy = Policy::new("64Ki", 3, Duration::from_secs(10), 1).unwrap();
        LogManager::new(cri, policy, node, pods_logs, metrics, Default::default())
            .rotate_if_due(&exited.id, None)
            .await
    })
    .unwrap();
    // containerd refuses to reopen the log of a container that is not running.
    match result {
        Err(RotateError::Cri(e)) => assert!(e.to_string().contains("ReopenContainerLog"), "{e}"),
        other => panic!("expected the runtime's refusal, got {other:?}"),
    }
    assert_eq!(
        std::fs::read(&log).unwrap(),
        before,
        "the log was not renamed back whole"
    );
    assert_eq!(files(&dir), ["0.log"], "a rotated file was left behind");
    let encoded = counted.encode();
    assert!(
        encoded.contains("swiftlet_container_log_rotations_total 0"),
        "{encoded}"
    );
    agent.remove_manifest(&format!("{name}.yaml"));
}

#[test]
fn a_collected_dead_containers_log_files_go_with_it() {
    let Some(agent) = start_agent("log-rotation-gc") else {
        return;
    };
    let name = "loggc";
    let (uid, dir) = start_pod(&agent, name, "Always", "echo started; exit 1");
    // A rotated file of the first instance's log, as a rotation would have left it.
    let rotated = dir.join("0.log.20240101-000000.gz");
    agent.eventually("the first instance's log", TIMEOUT, || {
        if dir.join("0.log").exists() {
            std::fs::write(&rotated, b"old").map_err(|e| e.to_string())
        } else {
            Err(format!("files {:?}", files(&dir)))
        }
    });
    // Restarted twice (back-off 10 s, then 20 s), the first instance is collected (one dead
    // instance is kept): its log files go, those of the instances still there stay.
    agent.eventually(
        "the first instance collected with its logs",
        TIMEOUT * 2,
        || {
            let logs: Vec<String> = container_statuses(agent.endpoint(), &uid)
                .map_err(|e| e.to_string())?
                .iter()
                .filter_map(|c| {
                    Some(
                        Path::new(&c.log_path)
                            .file_name()?
                            .to_string_lossy()
                            .into_owned(),
                    )
                })
                .collect();
            let now = files(&dir);
            let mut expected = logs.clone();
            expected.sort();
            if !logs.contains(&"0.log".to_owned()) && now == expected && !logs.is_empty() {
                Ok(())
            } else {
                Err(format!("runtime's logs {logs:?}, files {now:?}"))
            }
        },
    );
    assert!(!rotated.exists());
    agent.remove_manifest(&format!("{name}.yaml"));
}
