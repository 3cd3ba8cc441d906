//! Pod cgroups on the real cgroupfs: the kubelet's numbers per QoS class, the QoS level cgroups,
//! orphan clean-up by housekeeping, QoS class changes and in-place resize. The same tests run on
//! the v1 hierarchies and, in the VM (`cargo xtask vm run`), on the unified v2 hierarchy: each
//! expected value is written in its v1 spelling and checked in the host's own.
//! Each test runs its own agent (own node name, manifest dir and cgroup root).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use swiftlet_tests::{Agent, AgentOptions, Runtime, pod_cgroup_uids};

const RUNNING_TIMEOUT: Duration = swiftlet_tests::VM_POD_TIMEOUT;
const GONE_TIMEOUT: Duration = swiftlet_tests::VM_POD_TIMEOUT;
const CGROUP: &str = "/sys/fs/cgroup";

/// The looping test pod (its one container is the manifest's last item) with `resources` (YAML
/// lines at the container's `resources:` level, may be empty) and an optional fixed UID.
fn manifest(name: &str, uid: Option<&str>, resources: &str) -> String {
    let mut m = swiftlet_tests::looping_pod_manifest(name, &[]);
    if let Some(uid) = uid {
        m = m.replacen(
            "  namespace: default\n",
            &format!("  namespace: default\n  uid: {uid}\n"),
            1,
        );
    }
    if !resources.is_empty() {
        m.push_str("    resources:\n");
        for l in resources.lines() {
            m.push_str(&format!("      {l}\n"));
        }
    }
    m
}

/// Whether the host runs the unified hierarchy only (the VM's layout); else the v1 controllers
/// are under `/sys/fs/cgroup/<controller>`.
fn unified() -> bool {
    Path::new(CGROUP).join("cgroup.controllers").is_file()
}

fn start(name: &str, extra: &[&str]) -> Option<Agent> {
    if !unified() && !Path::new(CGROUP).join("cpu").is_dir() {
        assert!(
            !swiftlet_tests::runtime_required(),
            "no cgroup v1 cpu hierarchy and no unified hierarchy at {CGROUP}"
        );
        eprintln!("skipping: neither cgroup layout");
        return None;
    }
    let rt = Runtime::shared()?;
    let mut opts = AgentOptions::new(name);
    opts.extra_args = extra.iter().map(|s| s.to_string()).collect();
    Some(Agent::start(rt, opts))
}

/// `/sys/fs/cgroup/<hierarchy>/<cgroup root>/<rel>` (v1), `/sys/fs/cgroup/<cgroup root>/<rel>`
/// (v2: one tree, `hierarchy` does not matter).
fn path(agent: &Agent, hierarchy: &str, rel: &str) -> PathBuf {
    let base = if unified() {
        PathBuf::from(CGROUP)
    } else {
        Path::new(CGROUP).join(hierarchy)
    };
    base.join(agent.cgroup_root().trim_start_matches('/'))
        .join(rel)
}

fn read(agent: &Agent, hierarchy: &str, rel: &str) -> String {
    let p = path(agent, hierarchy, rel);
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
        .trim()
        .to_owned()
}

/// The v1 spelling of "no memory limit" in what [`value`] compares.
const UNLIMITED: &str = "unlimited";

/// cgroup v2 weight of v1 cpu shares, as runc and the kubelet convert them.
fn weight(shares: &str) -> String {
    let s: u64 = shares.parse::<u64>().expect("shares").clamp(2, 262_144);
    (1 + (s - 2) * 9999 / 262_142).to_string()
}

/// The value of v1 file `rel` (`<dir>/<v1 file>`) as the host spells it, and what `want` (a v1
/// value, or [`UNLIMITED`] for memory) is there. On v2 the file is its v2 counterpart: shares
/// are a `cpu.weight`, quota and period the two fields of `cpu.max`, the memory limit
/// `memory.max`.
fn value(agent: &Agent, hierarchy: &str, rel: &str, want: &str) -> (String, String) {
    let (dir, file) = rel.rsplit_once('/').unwrap_or(("", rel));
    if !unified() {
        let got = read(agent, hierarchy, rel);
        if want == UNLIMITED {
            // v1 shows "no limit" as the largest page-aligned counter value.
            let unlimited = got.parse::<u64>().is_ok_and(|v| v >= 1 << 62);
            return (
                if unlimited { want.to_owned() } else { got },
                want.to_owned(),
            );
        }
        return (got, want.to_owned());
    }
    let at = |f: &str| read(agent, hierarchy, &format!("{dir}/{f}"));
    let field = |f: &str, i: usize| {
        at(f)
            .split_whitespace()
            .nth(i)
            .unwrap_or_default()
            .to_owned()
    };
    match file {
        "cpu.shares" => (at("cpu.weight"), weight(want)),
        "cpu.cfs_quota_us" => (
            field("cpu.max", 0),
            if want == "-1" { "max" } else { want }.to_owned(),
        ),
        "cpu.cfs_period_us" => (field("cpu.max", 1), want.to_owned()),
        "memory.limit_in_bytes" => (
            at("memory.max"),
            if want == UNLIMITED { "max" } else { want }.to_owned(),
        ),
        _ => (at(file), want.to_owned()),
    }
}

/// Whether v1 file `rel` holds `want` (see [`value`]).
fn is(agent: &Agent, hierarchy: &str, rel: &str, want: &str) -> bool {
    let (got, want) = value(agent, hierarchy, rel, want);
    got == want
}

/// Asserts that v1 file `rel` holds `want` (see [`value`]).
fn assert_is(agent: &Agent, hierarchy: &str, rel: &str, want: &str) {
    let (got, want) = value(agent, hierarchy, rel, want);
    assert_eq!(got, want, "{rel} (or its v2 counterpart)");
}

/// Asserts `(hierarchy, file below dir, value)` for the cgroup `dir`.
fn check(agent: &Agent, dir: &str, want: &[(&str, &str, &str)]) {
    for (h, file, v) in want {
        assert_is(agent, h, &format!("{dir}/{file}"), v);
    }
}

/// The BestEffort pod `uid`'s cgroup: minimum shares, no quota, no memory limit.
fn check_best_effort(agent: &Agent, uid: &str) {
    let dir = format!("kubepods/besteffort/pod{uid}");
    check(
        agent,
        &dir,
        &[
            ("cpu", "cpu.shares", "2"),
            ("cpu", "cpu.cfs_quota_us", "-1"),
            ("memory", "memory.limit_in_bytes", UNLIMITED),
        ],
    );
}

fn running_uid(agent: &Agent, name: &str) -> String {
    let pod = agent.static_pod_name(name);
    let list = agent.wait_for(|l| l.is_running(&pod), RUNNING_TIMEOUT);
    list.uid(&pod).expect("a static pod has a UID").to_owned()
}

fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn each_qos_class_gets_the_kubelets_cgroup_values() {
    let Some(agent) = start("cg-qos", &["--pod-max-pids", "300"]) else {
        return;
    };
    agent.write_manifest(
        "g.yaml",
        &manifest(
            "guaranteed",
            None,
            "requests: {cpu: 500m, memory: 64Mi}\nlimits: {cpu: 500m, memory: 64Mi}",
        ),
    );
    agent.write_manifest(
        "b.yaml",
        &manifest(
            "burstable",
            None,
            "requests: {cpu: 250m}\nlimits: {memory: 128Mi}",
        ),
    );
    agent.write_manifest(
        "b2.yaml",
        &manifest("burstable-two", None, "requests: {cpu: 100m}"),
    );
    agent.write_manifest("be.yaml", &manifest("besteffort", None, ""));
    let g = running_uid(&agent, "guaranteed");
    let b = running_uid(&agent, "burstable");
    let b2 = running_uid(&agent, "burstable-two");
    let be = running_uid(&agent, "besteffort");

    // Guaranteed: directly under kubepods; shares, quota/period and memory limit from the limits.
    let mem64 = (64u64 << 20).to_string();
    check(
        &agent,
        &format!("kubepods/pod{g}"),
        &[
            ("cpu", "cpu.shares", "512"),
            ("cpu", "cpu.cfs_quota_us", "50000"),
            ("cpu", "cpu.cfs_period_us", "100000"),
            ("memory", "memory.limit_in_bytes", &mem64),
            ("pids", "pids.max", "300"),
        ],
    );
    // Burstable: shares from the request; no cpu limit -> no quota; memory limit declared by
    // every container -> set.
    let mem128 = (128u64 << 20).to_string();
    check(
        &agent,
        &format!("kubepods/burstable/pod{b}"),
        &[
            ("cpu", "cpu.shares", "256"),
            ("cpu", "cpu.cfs_quota_us", "-1"),
            ("memory", "memory.limit_in_bytes", &mem128),
            ("pids", "pids.max", "300"),
        ],
    );
    let dir = format!("kubepods/burstable/pod{b2}");
    check(
        &agent,
        &dir,
        &[
            ("cpu", "cpu.shares", "102"),
            ("memory", "memory.limit_in_bytes", UNLIMITED),
        ],
    );
    // BestEffort: minimum shares, nothing else.
    check_best_effort(&agent, &be);

    // QoS level: burstable = shares of the summed burstable requests (350m), besteffort = 2.
    assert_is(
        &agent,
        "cpu",
        "kubepods/burstable/cpu.shares",
        &(350 * 1024 / 1000).to_string(),
    );
    assert_is(&agent, "cpu", "kubepods/besteffort/cpu.shares", "2");

    // A burstable pod leaving takes its share with it.
    agent.remove_manifest("b.yaml");
    wait_until("the burstable QoS shares to drop", GONE_TIMEOUT, || {
        is(&agent, "cpu", "kubepods/burstable/cpu.shares", "102")
    });
}

#[test]
fn housekeeping_removes_orphaned_pod_cgroups_and_kills_leftovers() {
    let Some(agent) = start("cg-orphans", &[]) else {
        return;
    };
    agent.write_manifest("keep.yaml", &manifest("keep", None, ""));
    let keep = running_uid(&agent, "keep");

    // A pod cgroup no pod owns, with a child cgroup and a process in it, in three hierarchies.
    let orphan = "0rphan00-0000-4000-8000-000000000000";
    let rel = format!("kubepods/besteffort/pod{orphan}");
    for h in ["cpu", "memory", "pids"] {
        std::fs::create_dir_all(path(&agent, h, &format!("{rel}/child"))).unwrap();
    }
    let mut sleeper = std::process::Command::new("sleep")
        .arg("600")
        .spawn()
        .expect("spawning sleep");
    let pid = sleeper.id().to_string();
    for h in ["cpu", "pids"] {
        std::fs::write(path(&agent, h, &format!("{rel}/child/cgroup.procs")), &pid).unwrap();
    }
    assert!(pod_cgroup_uids(agent.cgroup_root()).contains(orphan));

    wait_until("the orphaned pod cgroup to go", GONE_TIMEOUT, || {
        !pod_cgroup_uids(agent.cgroup_root()).contains(orphan)
    });
    let status = sleeper.wait().expect("waiting for sleep");
    assert!(!status.success(), "the leftover process was not killed");

    // The running pod's cgroup is untouched, and so is the pod.
    assert!(pod_cgroup_uids(agent.cgroup_root()).contains(&keep));
    assert!(agent.pods().is_running(&agent.static_pod_name("keep")));
    assert!(
        agent.log().contains("removed orphaned pod cgroup"),
        "{}",
        agent.log_tail(30)
    );
}

#[test]
fn create_delete_cycles_leave_no_pod_cgroup() {
    let Some(agent) = start("cg-cycles", &[]) else {
        return;
    };
    let resources = [
        "",
        "requests: {cpu: 100m}",
        "requests: {cpu: 100m, memory: 16Mi}\nlimits: {cpu: 100m, memory: 16Mi}",
    ];
    let mut seen = std::collections::BTreeSet::new();
    for round in 0..3 {
        for (i, r) in resources.iter().enumerate() {
            agent.write_manifest(
                &format!("p{i}.yaml"),
                &manifest(&format!("cycle{i}-r{round}"), None, r),
            );
        }
        for i in 0..resources.len() {
            seen.insert(running_uid(&agent, &format!("cycle{i}-r{round}")));
        }
        for i in 0..resources.len() {
            agent.remove_manifest(&format!("p{i}.yaml"));
        }
        agent.wait_for(|l| l.items.is_empty(), GONE_TIMEOUT);
    }
    assert_eq!(seen.len(), 9);
    wait_until("every pod cgroup to go", GONE_TIMEOUT, || {
        pod_cgroup_uids(agent.cgroup_root()).is_empty()
    });
    // The QoS level cgroups stay, and the burstable shares are back at the minimum.
    assert_is(&agent, "cpu", "kubepods/burstable/cpu.shares", "2");
}

/// Pod `name` as the agent reports it on /pods (Null when not listed).
fn pod_json(agent: &Agent, name: &str) -> serde_json::Value {
    let pods: serde_json::Value =
        serde_json::from_str(&agent.get("/pods").1).expect("/pods is JSON");
    let pod = agent.static_pod_name(name);
    pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["metadata"]["name"] == pod.as_str())
        .cloned()
        .unwrap_or_default()
}

/// The static pod `name`'s `status.qosClass` as `/pods` shows it.
fn qos_class(agent: &Agent, name: &str) -> Option<String> {
    pod_json(agent, name)["status"]["qosClass"]
        .as_str()
        .map(str::to_owned)
}

fn unique_uid(tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{tag}-{}-{nanos}", std::process::id())
}

#[test]
fn qos_class_change_recreates_the_pod_under_the_new_qos_cgroup() {
    let Some(agent) = start("cg-qos-change", &[]) else {
        return;
    };
    let uid = unique_uid("qos");
    let g = "requests: {cpu: 200m, memory: 64Mi}\nlimits: {cpu: 200m, memory: 64Mi}";
    agent.write_manifest("p.yaml", &manifest("mover", Some(&uid), g));
    assert_eq!(running_uid(&agent, "mover"), uid);
    let pod = pod_json(&agent, "mover");
    assert_eq!(pod["status"]["qosClass"], "Guaranteed");
    let old_id = pod["status"]["containerStatuses"][0]["containerID"].clone();
    assert!(path(&agent, "cpu", &format!("kubepods/pod{uid}")).is_dir());

    // Limits dropped: Burstable.
    let b = "requests: {cpu: 200m, memory: 64Mi}";
    agent.write_manifest("p.yaml", &manifest("mover", Some(&uid), b));
    let mut pod = serde_json::Value::Null;
    wait_until("the pod to run again as Burstable", RUNNING_TIMEOUT, || {
        pod = pod_json(&agent, "mover");
        let c = &pod["status"]["containerStatuses"][0];
        pod["status"]["qosClass"] == "Burstable"
            && c["containerID"] != old_id
            && c["state"]["running"].is_object()
    });
    // Recreated under the new QoS directory with the new numbers; the old pod cgroup is gone
    // from every hierarchy.
    check(
        &agent,
        &format!("kubepods/burstable/pod{uid}"),
        &[
            ("cpu", "cpu.shares", "204"),
            ("cpu", "cpu.cfs_quota_us", "-1"),
        ],
    );
    for h in std::fs::read_dir(CGROUP).unwrap().flatten() {
        let old = h
            .path()
            .join(agent.cgroup_root().trim_start_matches('/'))
            .join(format!("kubepods/pod{uid}"));
        assert!(
            !old.exists(),
            "old pod cgroup left behind: {}",
            old.display()
        );
    }
    // The container was restarted once (a new sandbox, like a sandbox change).
    assert_eq!(pod["status"]["containerStatuses"][0]["restartCount"], 1);
    assert_is(&agent, "cpu", "kubepods/burstable/cpu.shares", "204");
}

#[test]
fn in_place_resize_updates_cgroups_without_restarting() {
    let Some(agent) = start("cg-resize", &[]) else {
        return;
    };
    // A fixed UID: a static pod's UID is otherwise a hash of its manifest, and an edit would
    // make it another pod.
    let uid = unique_uid("resize");
    let r1 = "requests: {cpu: 100m, memory: 32Mi}\nlimits: {cpu: 200m, memory: 128Mi}";
    agent.write_manifest("p.yaml", &manifest("elastic", Some(&uid), r1));
    assert_eq!(running_uid(&agent, "elastic"), uid);
    let pod = pod_json(&agent, "elastic");
    let c0 = pod["status"]["containerStatuses"][0].clone();
    let id = c0["containerID"]
        .as_str()
        .and_then(|s| s.strip_prefix("containerd://"))
        .expect("a container ID")
        .to_owned();
    let pod_dir = format!("kubepods/burstable/pod{uid}");
    let ctr_dir = format!("{pod_dir}/{id}");
    check(&agent, &pod_dir, &[("cpu", "cpu.shares", "102")]);
    check(
        &agent,
        &ctr_dir,
        &[
            ("cpu", "cpu.shares", "102"),
            ("cpu", "cpu.cfs_quota_us", "20000"),
        ],
    );

    // Raise cpu, lower the memory limit (above what it uses): same QoS class, resized in place.
    let r2 = "requests: {cpu: 300m, memory: 32Mi}\nlimits: {cpu: 400m, memory: 96Mi}";
    agent.write_manifest("p.yaml", &manifest("elastic", Some(&uid), r2));
    wait_until("the pod cgroup's shares to change", GONE_TIMEOUT, || {
        is(&agent, "cpu", &format!("{pod_dir}/cpu.shares"), "307")
    });
    let mem96 = (96u64 << 20).to_string();
    wait_until("the container's cgroup to change", GONE_TIMEOUT, || {
        is(&agent, "cpu", &format!("{ctr_dir}/cpu.shares"), "307")
            && is(
                &agent,
                "memory",
                &format!("{ctr_dir}/memory.limit_in_bytes"),
                &mem96,
            )
    });
    check(&agent, &ctr_dir, &[("cpu", "cpu.cfs_quota_us", "40000")]);
    // The pod cgroup takes the new (lower) memory limit after its containers have theirs.
    wait_until("the pod cgroup's limits to change", GONE_TIMEOUT, || {
        is(
            &agent,
            "cpu",
            &format!("{pod_dir}/cpu.cfs_quota_us"),
            "40000",
        ) && is(
            &agent,
            "memory",
            &format!("{pod_dir}/memory.limit_in_bytes"),
            &mem96,
        )
    });
    let mut c = serde_json::Value::Null;
    wait_until("the status to show the resize", GONE_TIMEOUT, || {
        c = pod_json(&agent, "elastic")["status"]["containerStatuses"][0].clone();
        c["resources"]["requests"]["cpu"] == "300m"
    });
    assert_eq!(
        c["containerID"], c0["containerID"],
        "container was replaced"
    );
    assert_eq!(c["restartCount"], 0);
    assert_eq!(c["resources"]["limits"]["memory"], "96Mi");
    assert_eq!(c["allocatedResources"]["cpu"], "300m");

    // A memory limit below what the pod uses is refused, with the reason in the status.
    let r3 = "requests: {cpu: 300m, memory: 32Mi}\nlimits: {cpu: 400m, memory: 100Ki}";
    agent.write_manifest("p.yaml", &manifest("elastic", Some(&uid), r3));
    let mut pod = serde_json::Value::Null;
    wait_until("the refusal in the status", GONE_TIMEOUT, || {
        pod = pod_json(&agent, "elastic");
        pod["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "PodResizeInProgress" && c["reason"] == "Error")
    });
    let cond = pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "PodResizeInProgress")
        .cloned()
        .unwrap_or_default();
    assert!(
        cond["message"]
            .as_str()
            .unwrap_or("")
            .contains("below the pod's current memory usage"),
        "{cond}"
    );
    check(
        &agent,
        &ctr_dir,
        &[("memory", "memory.limit_in_bytes", &mem96)],
    );
    let c = &pod["status"]["containerStatuses"][0];
    assert_eq!(c["containerID"], c0["containerID"]);
    assert_eq!(c["restartCount"], 0);
    // The status shows what is applied, not the refused limit.
    assert_eq!(c["resources"]["limits"]["memory"], mem96.as_str());
}

/// The kubelet's pod resource math on the real cgroupfs: a sidecar (an init container with
/// `restartPolicy: Always`) runs beside the app, so its limits add to the app's; and a static pod
/// that sets only limits is requested at its limits (Guaranteed, directly under `kubepods`).
#[test]
fn a_sidecar_adds_to_the_pod_cgroup_and_a_limits_only_pod_is_guaranteed() {
    let Some(agent) = start("cg-sidecar", &[]) else {
        return;
    };
    let image = swiftlet_tests::BUSYBOX_IMAGE;
    let loop_ = r#"command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]"#;
    let sidecar = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: sidecar, namespace: default}}\nspec:\n  \
         terminationGracePeriodSeconds: 5\n  initContainers:\n  - name: proxy\n    \
         image: {image}\n    imagePullPolicy: Never\n    restartPolicy: Always\n    {loop_}\n    \
         resources: {{requests: {{cpu: 100m, memory: 64Mi}}, limits: {{cpu: 200m, memory: 128Mi}}}}\n  \
         containers:\n  - name: app\n    image: {image}\n    imagePullPolicy: Never\n    {loop_}\n    \
         resources: {{requests: {{cpu: 250m, memory: 128Mi}}, limits: {{cpu: 2.007, memory: 256Mi}}}}\n"
    );
    agent.write_manifest("sidecar.yaml", &sidecar);
    agent.write_manifest(
        "limits.yaml",
        &manifest("limits-only", None, "limits: {cpu: 300m, memory: 96Mi}"),
    );
    let s = running_uid(&agent, "sidecar");
    let l = running_uid(&agent, "limits-only");
    // Sidecar pod, Burstable: shares from 100m + 250m = 350m; limits 200m + 2007m = 2207m of cpu
    // (2.007 is 2007m exactly) and 128Mi + 256Mi = 384Mi of memory, not max(128Mi, 256Mi).
    let mem384 = (384u64 << 20).to_string();
    check(
        &agent,
        &format!("kubepods/burstable/pod{s}"),
        &[
            ("cpu", "cpu.shares", &(350 * 1024 / 1000).to_string()),
            ("cpu", "cpu.cfs_quota_us", "220700"),
            ("cpu", "cpu.cfs_period_us", "100000"),
            ("memory", "memory.limit_in_bytes", &mem384),
        ],
    );
    // Limits only: Guaranteed, under kubepods, shares from the defaulted 300m request.
    let mem96 = (96u64 << 20).to_string();
    check(
        &agent,
        &format!("kubepods/pod{l}"),
        &[
            ("cpu", "cpu.shares", &(300 * 1024 / 1000).to_string()),
            ("cpu", "cpu.cfs_quota_us", "30000"),
            ("memory", "memory.limit_in_bytes", &mem96),
        ],
    );
    assert_eq!(
        qos_class(&agent, "limits-only").as_deref(),
        Some("Guaranteed")
    );
    assert_eq!(qos_class(&agent, "sidecar").as_deref(), Some("Burstable"));
}

/// The looping test pod with `spec.overhead` (a flow mapping such as `{cpu: 100m}`) and
/// `resources` as [`manifest`] takes them.
fn manifest_with_overhead(name: &str, overhead: &str, resources: &str) -> String {
    manifest(name, None, resources).replacen(
        "\nspec:\n",
        &format!("\nspec:\n  overhead: {overhead}\n"),
        1,
    )
}

/// `spec.overhead` (what the API's RuntimeClass admission copies from the class) is added as the
/// kubelet adds it: to the requests behind the pod's cpu shares and the Burstable QoS cgroup's,
/// and to the limits that are set (an unset limit stays unset); the QoS class ignores it.
#[test]
fn overhead_is_added_to_the_pod_cgroup_and_to_the_burstable_shares() {
    let Some(agent) = start("cg-overhead", &[]) else {
        return;
    };
    agent.write_manifest(
        "g.yaml",
        &manifest_with_overhead(
            "guaranteed-oh",
            "{cpu: 100m, memory: 32Mi}",
            "requests: {cpu: 250m, memory: 64Mi}\nlimits: {cpu: 250m, memory: 64Mi}",
        ),
    );
    agent.write_manifest(
        "b.yaml",
        &manifest_with_overhead(
            "burstable-oh",
            "{cpu: 50m, memory: 16Mi}",
            "requests: {cpu: 100m}\nlimits: {memory: 128Mi}",
        ),
    );
    agent.write_manifest(
        "be.yaml",
        &manifest_with_overhead("besteffort-oh", "{cpu: 70m, memory: 8Mi}", ""),
    );
    let g = running_uid(&agent, "guaranteed-oh");
    let b = running_uid(&agent, "burstable-oh");
    let be = running_uid(&agent, "besteffort-oh");

    // Guaranteed (requests equal limits, overhead aside): 250m + 100m = 350m of shares and
    // quota, 64Mi + 32Mi of memory.
    check(
        &agent,
        &format!("kubepods/pod{g}"),
        &[
            ("cpu", "cpu.shares", &(350 * 1024 / 1000).to_string()),
            ("cpu", "cpu.cfs_quota_us", "35000"),
            (
                "memory",
                "memory.limit_in_bytes",
                &(96u64 << 20).to_string(),
            ),
        ],
    );
    // Burstable: shares of 100m + 50m; no cpu limit, so no quota however much overhead; memory
    // 128Mi + 16Mi.
    check(
        &agent,
        &format!("kubepods/burstable/pod{b}"),
        &[
            ("cpu", "cpu.shares", &(150 * 1024 / 1000).to_string()),
            ("cpu", "cpu.cfs_quota_us", "-1"),
            (
                "memory",
                "memory.limit_in_bytes",
                &(144u64 << 20).to_string(),
            ),
        ],
    );
    // The Burstable QoS cgroup sums its pods' requests, overhead included.
    assert_is(
        &agent,
        "cpu",
        "kubepods/burstable/cpu.shares",
        &(150 * 1024 / 1000).to_string(),
    );
    // BestEffort stays BestEffort with an overhead: minimum shares, no limits.
    check_best_effort(&agent, &be);
    assert_eq!(
        qos_class(&agent, "guaranteed-oh").as_deref(),
        Some("Guaranteed")
    );
    assert_eq!(
        qos_class(&agent, "burstable-oh").as_deref(),
        Some("Burstable")
    );
    assert_eq!(
        qos_class(&agent, "besteffort-oh").as_deref(),
        Some("BestEffort")
    );
}
