//! `cargo bench --bench pod_startup`: pod-startup latency of swiftlet side by side with the limit it
//! cannot beat, the container runtime itself, measured in one run on one private containerd.
//!
//! For each N (default 1, 10, 50) and each repetition:
//! 1. **CRI floor**: the CRI calls on swiftlet's start path (ImageStatus, RunPodSandbox,
//!    CreateContainer, StartContainer) for N host-network pods, issued directly, all N at once
//!    (swiftlet runs one worker per pod, so its concurrency is N too). The requests are the ones
//!    swiftlet sends: the same manifests, parsed by its file source and built by its runtime
//!    manager (`first_start_requests`), so containerd does the same work in both. Per pod: from
//!    the first call to StartContainer returning.
//! 2. **swiftlet**: N manifests written into the agent's manifest directory; per pod: from its
//!    manifest written to the pod first seen `Running` on `/pods` (polled every 10 ms, so about
//!    5 ms of the difference is the poll itself). The poller keeps one HTTP/1.1 connection and
//!    reads only names and phases: a new connection per poll cost the agent 5x the CPU of the
//!    answer, and parsing whole pods cost the bench more than the agent's answer.
//! 3. **podman** `kube play` of the same pods, where podman is installed.
//!
//! For each N, the CPU the batch cost: the whole machine busy (`/proc/stat`), containerd and the
//! agent (`/proc/<pid>/stat` utime+stime), so a gap to the floor can be charged to the agent's own
//! work, to the runtime work it asked for, or to neither; and how long the agent's threads waited
//! for a CPU while runnable (`/proc/<pid>/task/*/schedstat`), the part of its added time that is
//! the machine's contention rather than its own work.
//!
//! After each N, the phase table of those pods' starts from the agent's timelines
//! (`/debug/trace/pods`, eBPF events included when the probes are loaded).
//!
//! Then the agent's own cost: RSS and CPU time idle and with 100 pods running (from
//! `/proc/<pid>/status` VmRSS and `/proc/<pid>/stat` utime+stime).
//!
//! With `--reserved-core`, the largest N's swiftlet batches run again with the agent on the first
//! CPU it may run on and the runtime (containerd, shims, runc, the pods) and the bench on the other
//! CPUs it may run on: the agent-added time when the agent does not queue for a CPU behind the
//! runtime.
//!
//! With `--volumes`, then the same N as pods from an in-process API server on an agent of their
//! own, without volumes and with an emptyDir, a configMap and a secret volume each: the
//! `volumes` phase of the timelines is what setting up the three volumes added to each start.
//!
//! With `--otlp`, the agent exports every pod start as a trace (`--tracing-endpoint`, every start
//! sampled) to an OTLP/gRPC receiver in this process (`swiftlet_tests::otlp`), and the spans it
//! received are counted at the end: run with and without it, the "CPU per pod started" lines
//! show what the export costs a start.
//!
//! With `--cold` (instead of all of the above), every run pulls its images: `--images` (default
//! 10) generated images of 19-37 MB in four layers, some layers shared
//! (`xtask::images::cold_start_set`), pushed with `skopeo` to the test registry (Debian's
//! `docker-registry` on loopback, TLS and basic auth), pod i running image i mod the count, and
//! every image removed from containerd before each run. The floor is then the kubelet's order
//! sent straight to CRI: per pod the sandbox, the image's status, its pull queued behind every
//! other pull (the kubelet's default `serializeImagePulls: true`), create and start. podman pulls
//! from the same registry, its own copies removed first. N defaults to 1 and 20. With `--link
//! RTT_MS,CONNECTION_MBIT,TOTAL_MBIT` every pull goes through a relay that behaves like a network
//! link to a remote registry (`swiftlet_benches::link`): on loopback a pull costs only CPU, and
//! on 2 cores the CPU is what every order runs out of.
//!
//! Options (after `--`): `--pods 1,10,50`, `--reps 3`, `--no-cost`, `--cost-secs 60`,
//! `--cost-pods 100`, `--reserved-core`, `--volumes`, `--cold`, `--images 10`, `--link`. Without root or
//! containerd it says so and exits 0, unless `SWIFTLET_REQUIRE_RUNTIME=1`, where it fails.
use hdrhistogram::Histogram;
use k8s_cri::v1 as api;
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use swiftlet::cri::Cri;
use swiftlet::metrics::Metrics;
use swiftlet_benches::{
    cpu_ms, cpu_ms_over, rss_kib, run_queue_wait_ns, system_busy_ticks, ticks_per_sec,
};
use swiftlet_tests::api_server::{ApiServer, config_map};
use swiftlet_tests::registry::Registry;
use swiftlet_tests::{Agent, AgentOptions, Runtime};

const IMAGE: &str = "localhost/swiftlet/busybox:v1";
/// A container that exits at once on SIGTERM (so tear-down is quick).
const COMMAND: &str = "trap 'exit 0' TERM; while true; do sleep 1; done";
const FLOOR_NODE: &str = "bench-floor";
const FLOOR_CGROUP_ROOT: &str = "/swiftlet-bench-floor";
const FLOOR_LOGS: &str = "/tmp/swiftlet-bench-floor";
const POLL: Duration = Duration::from_millis(10);
const TIMEOUT: Duration = Duration::from_secs(300);

struct Opts {
    pods: Vec<usize>,
    reps: usize,
    cost: bool,
    cost_secs: u64,
    cost_pods: usize,
    reserved_core: bool,
    volumes: bool,
    cold: bool,
    images: usize,
    link: Option<swiftlet_benches::link::Shape>,
    /// Export every start over OTLP to a receiver in this process.
    otlp: bool,
}

fn parse_opts() -> Result<Opts, String> {
    let mut o = Opts {
        pods: vec![1, 10, 50],
        reps: 3,
        cost: true,
        cost_secs: 60,
        cost_pods: 100,
        reserved_core: false,
        volumes: false,
        cold: false,
        images: 10,
        link: None,
        otlp: false,
    };
    let mut pods_given = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "--pods" => {
                pods_given = true;
                o.pods = swiftlet_benches::number_list("--pods", &value("--pods")?)?;
            }
            "--reps" => o.reps = value("--reps")?.parse().map_err(|_| "--reps: bad number")?,
            "--cost-secs" => {
                o.cost_secs = value("--cost-secs")?
                    .parse()
                    .map_err(|_| "--cost-secs: bad number")?
            }
            "--cost-pods" => {
                o.cost_pods = value("--cost-pods")?
                    .parse()
                    .map_err(|_| "--cost-pods: bad number")?
            }
            "--no-cost" => o.cost = false,
            "--reserved-core" => o.reserved_core = true,
            "--volumes" => o.volumes = true,
            "--cold" => o.cold = true,
            "--otlp" => o.otlp = true,
            "--link" => o.link = Some(swiftlet_benches::link::Shape::parse(&value("--link")?)?),
            "--images" => {
                o.images = value("--images")?
                    .parse()
                    .map_err(|_| "--images: bad number")?
            }
            // cargo bench passes --bench; criterion-style filters are ignored too.
            _ => {}
        }
    }
    if o.cold && !pods_given {
        o.pods = vec![1, 20];
    }
    if o.pods.is_empty() || o.reps == 0 || o.images == 0 {
        return Err("--pods, --reps and --images must be non-empty / positive".into());
    }
    Ok(o)
}

/// Per-pod latencies, the batch wall time and the CPU spent during one run.
struct Sample {
    per_pod: Vec<Duration>,
    wall: Duration,
    cpu: CpuUse,
}

/// The processes whose CPU time a run is charged with.
#[derive(Clone, Copy)]
struct Pids {
    containerd: Option<u32>,
    agent: Option<u32>,
}

/// CPU time spent during one run: the whole machine busy (containerd, its shims, runc, the
/// pods, the agent, the bench; clock ticks), containerd itself and the agent (ms, exact); and
/// how long the agent's threads waited for a CPU (ns).
#[derive(Clone, Copy, Default)]
struct CpuUse {
    system: u64,
    containerd_ms: f64,
    agent_ms: f64,
    agent_wait_ns: u64,
    /// This process (ms): the floor's CRI client, or the `/pods` poller watching swiftlet.
    bench_ms: f64,
}

impl CpuUse {
    fn now(pids: Pids) -> CpuUse {
        let of = |pid: Option<u32>| pid.and_then(cpu_ms).unwrap_or(0.0);
        CpuUse {
            system: system_busy_ticks().unwrap_or(0),
            containerd_ms: of(pids.containerd),
            agent_ms: of(pids.agent),
            agent_wait_ns: pids.agent.and_then(run_queue_wait_ns).unwrap_or(0),
            bench_ms: of(Some(std::process::id())),
        }
    }

    /// What was spent since `start` (taken with [`CpuUse::now`]).
    fn since(start: CpuUse, pids: Pids) -> CpuUse {
        let end = CpuUse::now(pids);
        CpuUse {
            system: end.system.saturating_sub(start.system),
            containerd_ms: (end.containerd_ms - start.containerd_ms).max(0.0),
            agent_ms: (end.agent_ms - start.agent_ms).max(0.0),
            agent_wait_ns: end.agent_wait_ns.saturating_sub(start.agent_wait_ns),
            bench_ms: (end.bench_ms - start.bench_ms).max(0.0),
        }
    }
}

fn progress(msg: &str) {
    eprint!("{msg}");
    let _ = std::io::stderr().flush();
}

// ---------------------------------------------------------------------------------------------
// 1. The CRI floor.

/// swiftlet's own request builder, pointed at the floor's node name, cgroup root and log
/// directory: the floor sends containerd the very requests a swiftlet start sends.
fn floor_builder(cri: &Cri) -> swiftlet::runtime::Manager {
    let cm = swiftlet::cm::ContainerManager::new(swiftlet::cm::Config {
        cgroup_root: FLOOR_CGROUP_ROOT.into(),
        cgroups_per_qos: true,
        mount: swiftlet::cm::CGROUP_MOUNT.into(),
        pod_pids_limit: -1,
    });
    swiftlet_benches::runtime_manager(
        cri,
        cm,
        swiftlet::runtime::Config {
            node_name: FLOOR_NODE.into(),
            node_ips: Vec::new(),
            pod_logs_dir: FLOOR_LOGS.into(),
            pods_dir: std::path::Path::new(FLOOR_LOGS).join("pods"),
            // As the agent sets them, so that the floor's requests equal swiftlet's.
            security: swiftlet::runtime::security::Settings {
                apparmor: swiftlet::runtime::security::Settings::apparmor_enabled(),
                ..Default::default()
            },
            memory_capacity: swiftlet::cm::machine_memory_bytes().unwrap_or(u64::MAX),
            dns: swiftlet::dns::Settings::default(),
        },
    )
}

/// One floor pod's requests: the manifest swiftlet's run writes, parsed by swiftlet's file
/// source and built into CRI requests by swiftlet's runtime manager, and the image its one
/// container's ImageStatus call asks about.
struct FloorPod {
    image: String,
    sandbox: api::PodSandboxConfig,
    container: api::ContainerConfig,
}

fn floor_pod(builder: &swiftlet::runtime::Manager, name: &str, manifest: &str) -> FloorPod {
    let path = PathBuf::from(format!("{name}.yaml"));
    let pod = swiftlet::config::manifest::parse(&path, manifest.as_bytes(), FLOOR_NODE)
        .unwrap_or_else(|e| panic!("the floor's manifest: {e}"));
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let (sandbox, containers) = builder
        .first_start_requests(&pod, &uid)
        .unwrap_or_else(|e| panic!("the floor's requests: {e}"));
    let [container] = <[_; 1]>::try_from(containers).expect("one container per pod");
    FloorPod {
        image: container
            .image
            .as_ref()
            .map(|i| i.image.clone())
            .unwrap_or_default(),
        sandbox,
        container,
    }
}

async fn floor_one(cri: Cri, pod: FloorPod) -> Result<Duration, swiftlet::cri::Error> {
    let _ = std::fs::create_dir_all(&pod.sandbox.log_directory);
    let start = Instant::now();
    cri.image_status(&pod.image).await?;
    let sandbox = cri
        .run_pod_sandbox(pod.sandbox.clone(), String::new())
        .await?;
    let id = cri
        .create_container(&sandbox, pod.container, pod.sandbox)
        .await?;
    cri.start_container(&id).await?;
    Ok(start.elapsed())
}

async fn floor(
    cri: &Cri,
    n: usize,
    run: usize,
    pids: Pids,
) -> Result<Sample, swiftlet::cri::Error> {
    let builder = floor_builder(cri);
    let pods: Vec<FloorPod> = (0..n)
        .map(|i| {
            let name = format!("floor{run}-{i}");
            floor_pod(&builder, &name, &manifest(&name))
        })
        .collect();
    floor_batch(pods, pids, |pod| floor_one(cri.clone(), pod)).await
}

/// Starts every pod of `pods` at once with `start_one`; each pod's time is what it returns.
async fn floor_batch<F, Fut>(
    pods: Vec<FloorPod>,
    pids: Pids,
    start_one: F,
) -> Result<Sample, swiftlet::cri::Error>
where
    F: Fn(FloorPod) -> Fut,
    Fut: std::future::Future<Output = Result<Duration, swiftlet::cri::Error>> + Send + 'static,
{
    let n = pods.len();
    let cpu = CpuUse::now(pids);
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for pod in pods {
        set.spawn(start_one(pod));
    }
    let mut per_pod = Vec::with_capacity(n);
    while let Some(r) = set.join_next().await {
        match r {
            Ok(r) => per_pod.push(r?),
            Err(e) => panic!("floor task: {e}"),
        }
    }
    let wall = start.elapsed();
    Ok(Sample {
        per_pod,
        wall,
        cpu: CpuUse::since(cpu, pids),
    })
}

async fn floor_cleanup(cri: &Cri) -> Result<(), swiftlet::cri::Error> {
    let sandboxes = cri
        .list_pod_sandbox(Some(api::PodSandboxFilter {
            label_selector: HashMap::from([("swiftlet.io/node-name".into(), FLOOR_NODE.into())]),
            ..Default::default()
        }))
        .await?;
    for s in sandboxes {
        cri.stop_pod_sandbox(&s.id).await?;
        cri.remove_pod_sandbox(&s.id).await?;
    }
    xtask::runtime::remove_cgroup_root(FLOOR_CGROUP_ROOT);
    let _ = std::fs::remove_dir_all(FLOOR_LOGS);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 2. swiftlet.

fn manifest(name: &str) -> String {
    manifest_with(name, IMAGE)
}

/// [`manifest`]'s pod running `image` (pulled when absent).
fn manifest_with(name: &str, image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostNetwork: true\n  \
         terminationGracePeriodSeconds: 2\n  containers:\n  - name: main\n    image: {image}\n    \
         imagePullPolicy: IfNotPresent\n    command: [\"sh\", \"-c\", \"{COMMAND}\"]\n"
    )
}

/// What the poller reads of `/pods`: each pod's name and phase.
#[derive(serde::Deserialize)]
struct PhaseList {
    items: Vec<PhaseItem>,
}

#[derive(serde::Deserialize)]
struct PhaseItem {
    metadata: PhaseMeta,
    status: Option<PhaseStatus>,
}

#[derive(serde::Deserialize)]
struct PhaseMeta {
    name: Option<String>,
}

#[derive(serde::Deserialize)]
struct PhaseStatus {
    phase: Option<String>,
}

/// `GET /pods` on the poller's kept connection, names and phases only.
fn phases(poller: &xtask::http::Client) -> PhaseList {
    let r = poller
        .get("/pods")
        .unwrap_or_else(|e| panic!("polling /pods: {e}"));
    assert_eq!(r.status, 200, "GET /pods answered {}: {}", r.status, r.body);
    serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("GET /pods is not a pod list ({e})"))
}

/// Where a run's pods come from.
#[derive(Clone, Copy)]
enum Source<'a> {
    /// Manifest files in the agent's manifest directory (static pods).
    Files,
    /// Manifest files whose pod `<prefix><i>` runs `images[i % images.len()]`.
    Cold { images: &'a [String] },
    /// The in-process API server the agent watches; with `volumes`, each pod mounts an emptyDir,
    /// a configMap and a secret volume.
    Api {
        server: &'a ApiServer,
        volumes: bool,
    },
}

impl Source<'_> {
    /// The name pods of run `run` start with.
    fn prefix(self, run: usize) -> String {
        match self {
            Source::Files => format!("s{run}-"),
            Source::Cold { .. } => format!("c{run}-"),
            Source::Api { volumes: true, .. } => format!("v{run}-"),
            Source::Api { volumes: false, .. } => format!("a{run}-"),
        }
    }

    /// Adds pod `name` to the agent's desired pods.
    fn add(self, agent: &Agent, name: &str) {
        match self {
            Source::Files => agent.write_manifest(&format!("{name}.yaml"), &manifest(name)),
            Source::Cold { images } => {
                agent.write_manifest(&format!("{name}.yaml"), &cold_manifest(name, images));
            }
            Source::Api { server, volumes } => server.put(api_pod(agent, name, volumes)),
        }
    }

    /// Takes pod `name` away again.
    fn remove(self, agent: &Agent, name: &str) {
        match self {
            Source::Files | Source::Cold { .. } => {
                agent.remove_manifest(&format!("{name}.yaml"));
            }
            Source::Api { server, .. } => server.delete(&api_uid(name)),
        }
    }

    /// The pod's name on `/pods`.
    fn pod_name(self, agent: &Agent, name: &str) -> String {
        match self {
            Source::Files | Source::Cold { .. } => agent.static_pod_name(name),
            Source::Api { .. } => name.to_owned(),
        }
    }
}

fn api_uid(name: &str) -> String {
    format!("{name}-uid")
}

/// The API pod `name` bound to the agent's node: [`manifest`]'s pod, with an emptyDir, the
/// configMap `bench-config` and the secret `bench-secret` mounted when `volumes`.
fn api_pod(agent: &Agent, name: &str, volumes: bool) -> k8s_openapi::api::core::v1::Pod {
    let mut pod = serde_json::json!({
        "metadata": {"name": name, "namespace": "default", "uid": api_uid(name)},
        "spec": {
            "nodeName": agent.node_name(),
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": "main", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", COMMAND],
            }],
        },
    });
    if volumes {
        pod["spec"]["volumes"] = serde_json::json!([
            {"name": "scratch", "emptyDir": {}},
            {"name": "config", "configMap": {"name": "bench-config"}},
            {"name": "creds", "secret": {"secretName": "bench-secret"}},
        ]);
        pod["spec"]["containers"][0]["volumeMounts"] = serde_json::json!([
            {"name": "scratch", "mountPath": "/scratch"},
            {"name": "config", "mountPath": "/etc/config"},
            {"name": "creds", "mountPath": "/etc/creds"},
        ]);
    }
    serde_json::from_value(pod).expect("an API pod")
}

fn swiftlet_run(agent: &Agent, n: usize, run: usize, pids: Pids) -> Sample {
    swiftlet_run_from(agent, Source::Files, n, run, pids)
}

fn swiftlet_run_from(
    agent: &Agent,
    source: Source<'_>,
    n: usize,
    run: usize,
    pids: Pids,
) -> Sample {
    let prefix = source.prefix(run);
    let names: Vec<String> = (0..n).map(|i| format!("{prefix}{i}")).collect();
    let pods: Vec<String> = names.iter().map(|m| source.pod_name(agent, m)).collect();
    let cpu = CpuUse::now(pids);
    let start = Instant::now();
    let mut written = Vec::with_capacity(n);
    for m in &names {
        written.push(Instant::now());
        source.add(agent, m);
    }
    let mut running: Vec<Option<Instant>> = vec![None; n];
    let index: HashMap<&str, usize> = pods
        .iter()
        .enumerate()
        .map(|(i, p)| (p.as_str(), i))
        .collect();
    let poller = xtask::http::Client::new(agent.read_only_addr(), TIMEOUT);
    let deadline = start + TIMEOUT;
    while running.iter().any(Option::is_none) {
        assert!(
            Instant::now() < deadline,
            "pods not Running within {TIMEOUT:?}"
        );
        let list = phases(&poller);
        let now = Instant::now();
        for pod in list.items {
            let Some(&i) = pod.metadata.name.as_deref().and_then(|n| index.get(n)) else {
                continue;
            };
            if running[i].is_none()
                && pod.status.and_then(|s| s.phase).as_deref() == Some("Running")
            {
                running[i] = Some(now);
            }
        }
        std::thread::sleep(POLL);
    }
    let cpu = CpuUse::since(cpu, pids);
    let last = running.iter().flatten().max().copied().unwrap_or(start);
    let per_pod = running
        .iter()
        .zip(&written)
        .map(|(r, w)| r.unwrap_or(*w).duration_since(*w))
        .collect();
    for m in &names {
        source.remove(agent, m);
    }
    agent.wait_for(|l| l.items.is_empty(), TIMEOUT);
    Sample {
        per_pod,
        wall: last.duration_since(start),
        cpu,
    }
}

// ---------------------------------------------------------------------------------------------
// 3. podman.

/// The containers.conf podman 4.3 needs here: rlimits no higher than this machine's hard limits
/// (see docs/machine.md).
const PODMAN_CONF: &str =
    "[containers]\ndefault_ulimits = [\"nofile=1024:1024\", \"nproc=4096:4096\"]\n";

struct Podman {
    dir: tempfile::TempDir,
}

impl Podman {
    fn command(&self) -> Command {
        let mut c = Command::new("podman");
        c.env("CONTAINERS_CONF", self.dir.path().join("containers.conf"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        c
    }

    fn run(&self, args: &[&str]) -> Result<(), String> {
        let out = self
            .command()
            .args(args)
            .output()
            .map_err(|e| format!("podman {args:?}: {e}"))?;
        if out.status.success() {
            return Ok(());
        }
        Err(format!(
            "podman {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }

    /// Podman with the test image loaded from the archive `cargo xtask images` wrote; None (with
    /// the reason printed) when podman is missing or cannot run here.
    fn setup(rt: &Runtime) -> Option<Podman> {
        let installed = Command::new("podman")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !installed {
            println!("podman: not installed (apt-get install podman): skipped");
            return None;
        }
        let dir = tempfile::tempdir().ok()?;
        std::fs::write(dir.path().join("containers.conf"), PODMAN_CONF).ok()?;
        let p = Podman { dir };
        if p.run(&["image", "exists", IMAGE]).is_err() {
            let archive = rt.layout.images_dir.join("swiftlet-busybox-v1.tar");
            if let Err(e) = p.run(&["load", "-i", &archive.to_string_lossy()]) {
                println!("podman: cannot load the test image: {e}: skipped");
                return None;
            }
        }
        Some(p)
    }

    /// `podman kube play` of n pods: the wall time until it returns (every container started).
    fn play(&self, n: usize, run: usize) -> Result<Duration, String> {
        let docs: Vec<String> = (0..n).map(|i| manifest(&format!("p{run}-{i}"))).collect();
        self.play_docs(&docs, run, &[])
    }

    /// `podman kube play` (with `extra` arguments) of the pods in `docs`, then `kube down`.
    fn play_docs(&self, docs: &[String], run: usize, extra: &[&str]) -> Result<Duration, String> {
        let file = self.dir.path().join(format!("play-{run}.yaml"));
        std::fs::write(&file, docs.join("---\n")).map_err(|e| e.to_string())?;
        let file = file.to_string_lossy().into_owned();
        let mut args = vec!["kube", "play"];
        args.extend_from_slice(extra);
        args.push(&file);
        let start = Instant::now();
        let played = self.run(&args);
        let wall = start.elapsed();
        self.run(&["kube", "down", &file])?;
        played.map(|()| wall)
    }

    /// Cold: n pods over `images`, each pulled from the test registry with its login.
    fn play_cold(
        &self,
        n: usize,
        run: usize,
        images: &[String],
        registry: &Registry,
    ) -> Result<Duration, String> {
        for image in images {
            // Absent already is fine: only what is present must go.
            let _ = self.run(&["rmi", "-f", image]);
        }
        let docs: Vec<String> = (0..n)
            .map(|i| cold_manifest(&format!("pc{run}-{i}"), images))
            .collect();
        let creds = format!("--creds={}:{}", registry.username, registry.password);
        let certs = format!("--cert-dir={}", registry.dir().join("certs").display());
        self.play_docs(&docs, run, &[&creds, &certs])
    }
}

// ---------------------------------------------------------------------------------------------
// 4. Cold starts (`--cold`): every image pulled from the test registry in every run.

/// Pod `<prefix><i>` of a cold run: [`manifest_with`] the image `images[i % images.len()]`.
fn cold_manifest(name: &str, images: &[String]) -> String {
    let i: usize = name
        .rsplit('-')
        .next()
        .and_then(|i| i.parse().ok())
        .unwrap_or(0);
    manifest_with(name, &images[i % images.len()])
}

/// The cold-start images (`xtask::images::cold_start_set`), generated and pushed to the test
/// registry, and the agent given the registry's login; `None` when the registry cannot run here.
fn cold_images(
    rt: &Runtime,
    agent: &Agent,
    count: usize,
) -> Option<(&'static Registry, Vec<String>)> {
    let registry = Registry::shared(rt)?;
    registry.write_node_config(agent.root_dir());
    let set = xtask::images::cold_start_set(count);
    let dir = registry.dir().join("cold");
    let mut images = Vec::with_capacity(count);
    for (k, image) in set.iter().enumerate() {
        progress(&format!(
            "\rgenerating and pushing the cold-start images: {}/{count}",
            k + 1
        ));
        let reference = format!(
            "{}/{}:{}",
            registry.host,
            image.repository,
            swiftlet_tests::registry::TAG
        );
        let archive = xtask::images::write_generated_archive(
            image,
            &reference,
            Path::new(xtask::images::BUSYBOX_PATH),
            &dir,
        )
        .unwrap_or_else(|e| panic!("generating {reference}: {e}"));
        images.push(registry.push_archive(&image.repository, &archive));
        let _ = std::fs::remove_file(&archive);
    }
    eprintln!(" done");
    let mut distinct: HashMap<&str, usize> = HashMap::new();
    for image in &set {
        for (label, size) in &image.layers {
            distinct.insert(label, *size);
        }
    }
    let sizes: Vec<usize> = set
        .iter()
        .map(|i| i.generated_bytes() / 1_000_000)
        .collect();
    println!(
        "cold-start images: {count} on {} (TLS, basic auth), 4 layers each (busybox and 3 generated), \
         {}-{} MB each plus busybox, {} MB of distinct generated layers",
        registry.host,
        sizes.iter().min().unwrap_or(&0),
        sizes.iter().max().unwrap_or(&0),
        distinct.values().sum::<usize>() / 1_000_000
    );
    Some((registry, images))
}

/// Removes every image of `images` from the runtime (containerd drops their content and
/// unpacked snapshots with the last reference) and checks that none is left.
async fn remove_images(cri: &Cri, images: &[String]) -> Result<(), swiftlet::cri::Error> {
    for image in images {
        if cri.image_status(image).await?.is_some() {
            cri.remove_image(image).await?;
        }
        assert!(
            cri.image_status(image).await?.is_none(),
            "{image} is still present after RemoveImage"
        );
    }
    Ok(())
}

/// One pod in the kubelet's order, straight to CRI: the sandbox; then the image's status and,
/// when absent, its pull, queued behind every other pull (`serializeImagePulls: true`, the
/// kubelet's default; a pod whose image another pod is pulling queues a pull of its own, as the
/// kubelet's does); then create and start.
async fn kubelet_order_one(
    cri: Cri,
    pod: FloorPod,
    pulls: Arc<tokio::sync::Mutex<()>>,
    auth: api::AuthConfig,
) -> Result<Duration, swiftlet::cri::Error> {
    let _ = std::fs::create_dir_all(&pod.sandbox.log_directory);
    let start = Instant::now();
    let sandbox = cri
        .run_pod_sandbox(pod.sandbox.clone(), String::new())
        .await?;
    if cri.image_status(&pod.image).await?.is_none() {
        let _one_at_a_time = pulls.lock().await;
        cri.pull_image(&pod.image, Some(auth)).await?;
    }
    let id = cri
        .create_container(&sandbox, pod.container, pod.sandbox)
        .await?;
    cri.start_container(&id).await?;
    Ok(start.elapsed())
}

/// The kubelet-order floor of a cold run: n pods over `images`, all at once.
async fn kubelet_order(
    cri: &Cri,
    n: usize,
    run: usize,
    pids: Pids,
    images: &[String],
    auth: &api::AuthConfig,
) -> Result<Sample, swiftlet::cri::Error> {
    let builder = floor_builder(cri);
    let pods: Vec<FloorPod> = (0..n)
        .map(|i| {
            let name = format!("kfloor{run}-{i}");
            floor_pod(&builder, &name, &cold_manifest(&name, images))
        })
        .collect();
    let pulls = Arc::new(tokio::sync::Mutex::new(()));
    floor_batch(pods, pids, |pod| {
        kubelet_order_one(cri.clone(), pod, pulls.clone(), auth.clone())
    })
    .await
}

/// The cold mode: for each N and repetition, the images removed, then the kubelet-order floor;
/// removed again, then swiftlet; removed from podman's store, then podman.
fn cold(
    rt: &Runtime,
    agent: &Agent,
    tokio: &tokio::runtime::Runtime,
    cri: &Cri,
    podman: Option<&Podman>,
    opts: &Opts,
    pids: Pids,
) {
    let Some((registry, mut images)) = cold_images(rt, agent, opts.images) else {
        println!("cold: the test registry cannot run here (see the SKIPPED line above): skipped");
        return;
    };
    // Kept until the end: the relay runs on a thread of its own.
    let _link = opts.link.map(|shape| {
        let target = registry.host.parse().expect("the registry's address");
        let link = swiftlet_benches::link::Link::start(target, shape).expect("the link relay");
        let alias = format!("127.0.0.1:{}", link.addr.port());
        registry
            .add_alias(rt, &alias)
            .unwrap_or_else(|e| panic!("{e}"));
        registry.write_node_config(agent.root_dir());
        for image in &mut images {
            *image = image.replacen(&registry.host, &alias, 1);
        }
        println!("pulls go through a link emulator at {alias}: {shape}");
        link
    });
    let auth = api::AuthConfig {
        username: registry.username.clone(),
        password: registry.password.clone(),
        ..Default::default()
    };
    println!(
        "cold starts: pod i runs image i mod {}; every image removed before each run; \
         kubelet = the kubelet's order sent straight to CRI (sandbox, image status, pulls one at a \
         time, create, start)",
        images.len()
    );
    let mut ratios = Vec::new();
    for &n in &opts.pods {
        let (mut floors, mut swift, mut plays) = (Vec::new(), Vec::new(), Vec::new());
        let calls_before = cri_calls(agent);
        for rep in 0..opts.reps {
            let run = n * 1000 + rep;
            progress(&format!(
                "N={n} rep {}/{}: kubelet order",
                rep + 1,
                opts.reps
            ));
            tokio
                .block_on(remove_images(cri, &images))
                .expect("removing the images");
            floors.push(
                tokio
                    .block_on(kubelet_order(cri, n, run, pids, &images, &auth))
                    .expect("kubelet-order run"),
            );
            tokio
                .block_on(floor_cleanup(cri))
                .expect("cleaning up the floor pods");
            progress(", swiftlet");
            tokio
                .block_on(remove_images(cri, &images))
                .expect("removing the images");
            let source = Source::Cold { images: &images };
            swift.push(swiftlet_run_from(agent, source, n, run, pids));
            if let Some(p) = podman {
                progress(", podman");
                match p.play_cold(n, run, &images, registry) {
                    Ok(w) => plays.push(w),
                    Err(e) => eprintln!("\n  podman kube play failed: {e}"),
                }
            }
            eprintln!(" done");
        }
        let prefixes: Vec<String> = (0..opts.reps)
            .map(|rep| format!("c{}-", n * 1000 + rep))
            .collect();
        let batch = Batch {
            floor_label: "kubelet",
            floors,
            swift,
            plays,
        };
        ratios.push((
            n,
            report_batch(agent, n, opts.reps, &batch, &prefixes, &calls_before),
        ));
    }
    println!("\nsummary, cold (swiftlet wall / kubelet-order floor wall):");
    for (n, r) in &ratios {
        println!("  N={n:<4} {r:.2}x");
    }
}

// ---------------------------------------------------------------------------------------------
// Reporting.

fn histogram(samples: &[Sample]) -> Histogram<u64> {
    let mut h =
        Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds");
    for s in samples {
        for d in &s.per_pod {
            let _ = h.record((d.as_micros() as u64).max(1));
        }
    }
    h
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

fn mean_wall(samples: &[Sample]) -> Duration {
    let total: Duration = samples.iter().map(|s| s.wall).sum();
    total / samples.len().max(1) as u32
}

/// Mean per run, in ms, of one [`CpuUse`] field read with `f` (ms per unit: `scale`).
fn mean_ms(samples: &[Sample], f: fn(&CpuUse) -> f64, scale: f64) -> f64 {
    samples.iter().map(|s| f(&s.cpu)).sum::<f64>() / samples.len().max(1) as f64 * scale
}

fn cpu_row(what: &str, samples: &[Sample]) {
    let tick = 1000.0 / ticks_per_sec();
    let system = mean_ms(samples, |c| c.system as f64, tick);
    let containerd = mean_ms(samples, |c| c.containerd_ms, 1.0);
    let agent = mean_ms(samples, |c| c.agent_ms, 1.0);
    let wait = mean_ms(samples, |c| c.agent_wait_ns as f64, 1e-6);
    let bench = mean_ms(samples, |c| c.bench_ms, 1.0);
    println!(
        "  {what:<10} {system:>12.0} {containerd:>12.1} {agent:>12.1} {wait:>16.1} {bench:>8.1}"
    );
}

/// p50, p90, p99 and max of a histogram of microseconds, in ms.
fn quantiles_ms(h: &Histogram<u64>) -> [f64; 4] {
    [
        ms(h.value_at_quantile(0.5)),
        ms(h.value_at_quantile(0.9)),
        ms(h.value_at_quantile(0.99)),
        ms(h.max()),
    ]
}

/// The column heads of the latency rows [`row`] prints.
fn header() {
    println!(
        "  {:<10} {:>8} {:>8} {:>8} {:>8} {:>10}",
        "", "p50", "p90", "p99", "max", "wall"
    );
}

fn row(what: &str, h: &Histogram<u64>, wall: Duration) {
    let [p50, p90, p99, max] = quantiles_ms(h);
    println!(
        "  {what:<10} {p50:>8.1} {p90:>8.1} {p99:>8.1} {max:>8.1} {:>10.1}",
        wall.as_secs_f64() * 1000.0
    );
}

// ---------------------------------------------------------------------------------------------
// The agent's own cost.

/// (RSS MiB at the end, CPU % of one core over the window).
fn measure_cost(pid: u32, window: Duration) -> Option<(f64, f64)> {
    let cpu = cpu_ms_over(pid, window)? / 1000.0 / window.as_secs_f64() * 100.0;
    Some((rss_kib(pid)? as f64 / 1024.0, cpu))
}

/// The agent's cost with no pods, measured right after it started (before any pod ran, so the
/// allocator holds nothing from earlier work).
fn idle_cost(agent: &Agent) -> Option<(f64, f64)> {
    measure_cost(agent.pid()?, Duration::from_secs(10))
}

fn cost(agent: &Agent, opts: &Opts, idle: Option<(f64, f64)>) {
    let Some(pid) = agent.pid() else { return };
    println!(
        "\nagent cost (pid {pid}; VmRSS from /proc/{pid}/status, utime+stime from /proc/{pid}/stat)"
    );
    if let Some((rss, cpu)) = idle {
        println!(
            "  idle, no pods, over 10 s after start: RSS {rss:.1} MiB, CPU {cpu:.2} % of a core"
        );
    }
    progress(&format!("  starting {} pods ...", opts.cost_pods));
    let names: Vec<String> = (0..opts.cost_pods).map(|i| format!("cost-{i}")).collect();
    for m in &names {
        agent.write_manifest(&format!("{m}.yaml"), &manifest(m));
    }
    let pods: Vec<String> = names.iter().map(|m| agent.static_pod_name(m)).collect();
    agent.wait_for(|l| pods.iter().all(|p| l.is_running(p)), TIMEOUT);
    eprintln!(" running");
    let window = Duration::from_secs(opts.cost_secs);
    if let Some((rss, cpu)) = measure_cost(pid, window) {
        println!(
            "  {} pods running, over {} s: RSS {rss:.1} MiB, CPU {cpu:.2} % of a core",
            opts.cost_pods, opts.cost_secs
        );
    }
    for m in &names {
        agent.remove_manifest(&format!("{m}.yaml"));
    }
    agent.wait_for(|l| l.items.is_empty(), TIMEOUT);
}

/// The agent's counters so far by one label: `series` is the metric name with `_count` or
/// `_total` and `label` the label whose values key the map (the first label of the series).
fn counters(agent: &Agent, series: &str, label: &str) -> HashMap<String, u64> {
    let (_, body) = agent.get("/metrics");
    let open = format!("{series}{{");
    let key = format!("{label}=\"");
    body.lines()
        .filter_map(|l| l.strip_prefix(open.as_str()))
        .filter_map(|l| {
            let (labels, count) = l.split_once("} ")?;
            let value = labels.split_once(key.as_str())?.1.split('"').next()?;
            Some((value.to_owned(), count.trim().parse().ok()?))
        })
        .collect()
}

/// The agent's CRI calls (by operation) and pod reads (by who read: the PLEG, its fast path, a
/// sync, a kill, or `handoff` for a sync that took the PLEG's read instead) so far.
fn cri_calls(agent: &Agent) -> (HashMap<String, u64>, HashMap<String, u64>) {
    (
        counters(
            agent,
            "swiftlet_runtime_operations_duration_seconds_count",
            "operation",
        ),
        counters(agent, "swiftlet_runtime_pod_state_reads_total", "source"),
    )
}

/// `after - before` per key, as "key n, ..." in key order (zeros left out).
fn deltas(before: &HashMap<String, u64>, after: &HashMap<String, u64>) -> String {
    let mut ops: Vec<(&String, u64)> = after
        .iter()
        .map(|(op, n)| (op, n - before.get(op).copied().unwrap_or(0).min(*n)))
        .filter(|(_, n)| *n > 0)
        .collect();
    ops.sort();
    let list: Vec<String> = ops.iter().map(|(op, n)| format!("{op} {n}")).collect();
    list.join(", ")
}

/// The agent's CRI calls and pod reads, as [`cri_calls`] returns them.
type Calls = (HashMap<String, u64>, HashMap<String, u64>);

/// CRI calls and pod reads the agent made while starting and removing `pods` pods (the floor
/// makes four calls per pod to start it: ImageStatus, RunPodSandbox, CreateContainer,
/// StartContainer).
fn print_cri_calls(before: &Calls, after: &Calls, pods: usize) {
    println!(
        "  swiftlet's CRI calls for {pods} pods started and removed (incl. its 1 s relists): {}",
        deltas(&before.0, &after.0)
    );
    println!(
        "  swiftlet's pod reads by who read (handoff: a sync took the PLEG's read): {}",
        deltas(&before.1, &after.1)
    );
}

/// Where the swiftlet pods of this N spent their start, from the agent's timelines
/// (`/debug/trace/pods`: the agent's own marks, its CRI calls and, with probes loaded, what the
/// kernel saw), as the phase table `cargo xtask report` prints.
fn phase_summary(agent: &Agent, n: usize, runs: &[usize]) {
    let prefixes: Vec<String> = runs.iter().map(|run| format!("s{run}-")).collect();
    phase_summary_of(agent, n, &prefixes);
}

/// [`phase_summary`] of the pods whose names start with one of `prefixes`; returns the report.
fn phase_summary_of(agent: &Agent, n: usize, prefixes: &[String]) -> Option<xtask::report::Report> {
    let (status, body) = agent.get("/debug/trace/pods");
    let view: serde_json::Value = match serde_json::from_str(&body) {
        Ok(v) if status == 200 => v,
        _ => {
            println!("  (no phase breakdown: /debug/trace/pods answered {status})");
            return None;
        }
    };
    match xtask::report::build_report(&view, |name| {
        prefixes.iter().any(|p| name.starts_with(p.as_str()))
    }) {
        Ok(r) if !r.pods.is_empty() => {
            let probes = if view["probes_loaded"].as_bool() == Some(true) {
                "eBPF probes loaded"
            } else {
                "no eBPF probes: agent marks and CRI calls only"
            };
            println!(
                "  where swiftlet's starts went ({} pods, {probes}; events lost: {}):",
                r.pods.len(),
                r.events_lost
            );
            for line in xtask::report::phase_table(&r).lines() {
                println!("    {line}");
            }
            let mut agent = Histogram::<u64>::new(3).expect("histogram");
            let mut before_cri = Histogram::<u64>::new(3).expect("histogram");
            for p in view["pods"].as_array().into_iter().flatten() {
                let kept = p["name"]
                    .as_str()
                    .is_some_and(|name| prefixes.iter().any(|x| name.starts_with(x.as_str())));
                if let Some(ms) = p["agent_ms"].as_f64().filter(|_| kept) {
                    let _ = agent.record((ms * 1000.0).round() as u64);
                    if let Some(pre) = ms_before_first_cri_call(p) {
                        let _ = before_cri.record((pre.min(ms) * 1000.0).round() as u64);
                    }
                }
            }
            if !agent.is_empty() {
                let [p50, p90, p99, max] = quantiles_ms(&agent);
                println!(
                    "  agent-added per pod (end-to-end minus the pod's CRI calls in flight): p50 {p50:.2} ms, p90 {p90:.2} ms, p99 {p99:.2} ms, max {max:.2} ms"
                );
            }
            if !before_cri.is_empty() {
                let [p50, p90, p99, max] = quantiles_ms(&before_cri);
                println!(
                    "    of which before the pod's first CRI call (admission, dispatch, pod cgroup, sandbox config): p50 {p50:.2} ms, p90 {p90:.2} ms, p99 {p99:.2} ms, max {max:.2} ms"
                );
            }
            Some(r)
        }
        Ok(_) => {
            println!("  (no complete pod timelines for N = {n})");
            None
        }
        Err(e) => {
            println!("  (no phase breakdown: {e})");
            None
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 4. What volumes add (`--volumes`).

/// N pods from the API server with an emptyDir, a configMap and a secret volume each, beside N
/// pods without volumes, on an agent of their own watching the in-process API server (static
/// pods may not name configMaps or secrets). Prints both sets' latencies and phase tables, and
/// the `volumes` phase (set-up of the three volumes, before the pod's cgroup and sandbox) against
/// its budget of 2 ms p99.
fn volumes(rt: &Runtime, tokio: &tokio::runtime::Runtime, binary: PathBuf, opts: &Opts) {
    let server = tokio.block_on(ApiServer::start());
    server.put_object(config_map(
        "bench-config",
        &[("mode", "fast"), ("level", "3")],
    ));
    server.put_secret(
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "bench-secret", "namespace": "default"},
            "data": {"password": "aHVudGVyMg=="},
        }))
        .expect("a secret"),
    );
    let mut agent_opts = AgentOptions::new("bench-volumes");
    agent_opts.binary = Some(binary);
    agent_opts.verbosity = 0;
    let _kubeconfig_dir = server.point_agent(&mut agent_opts);
    let agent = Agent::start(rt, agent_opts);
    let pids = Pids {
        containerd: rt.layout.pid().and_then(|p| u32::try_from(p).ok()),
        agent: agent.pid(),
    };
    println!("
volumes: API-server pods with an emptyDir, a configMap and a secret volume each, beside the same pods without volumes");
    for &n in &opts.pods {
        let (mut with, mut without) = (Vec::new(), Vec::new());
        let (mut with_runs, mut without_runs) = (Vec::new(), Vec::new());
        for rep in 0..opts.reps {
            progress(&format!("volumes N={n} rep {}/{}", rep + 1, opts.reps));
            let run = n * 1000 + rep;
            let plain = Source::Api {
                server: &server,
                volumes: false,
            };
            let mounted = Source::Api {
                server: &server,
                volumes: true,
            };
            without.push(swiftlet_run_from(&agent, plain, n, run, pids));
            without_runs.push(plain.prefix(run));
            with.push(swiftlet_run_from(&agent, mounted, n, run, pids));
            with_runs.push(mounted.prefix(run));
            eprintln!(" done");
        }
        println!(
            "
N = {n}: per-pod latency (ms) and batch wall time (ms, mean of {} runs)",
            opts.reps
        );
        header();
        row("no volumes", &histogram(&without), mean_wall(&without));
        row("3 volumes", &histogram(&with), mean_wall(&with));
        println!("  pods without volumes:");
        phase_summary_of(&agent, n, &without_runs);
        println!("  pods with volumes:");
        let report = phase_summary_of(&agent, n, &with_runs);
        match report
            .as_ref()
            .and_then(|r| r.phases.iter().find(|p| p.phase == "volumes"))
        {
            Some(v) => println!(
                "  volume set-up (emptyDir + configMap + secret): p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms (budget: 2 ms p99)",
                v.p50_ms, v.p90_ms, v.p99_ms, v.max_ms
            ),
            None => println!("  (no volumes phase in the timelines)"),
        }
    }
}

/// From the start of a pod's breakdown (source seen) to the first CRI call made for it, in ms:
/// the part of the agent-added time spent before containerd had anything to do for the pod.
fn ms_before_first_cri_call(pod: &serde_json::Value) -> Option<f64> {
    let start = pod["phases"].as_array()?.first()?["start_ns"].as_u64()?;
    let first = pod["marks"]
        .as_array()?
        .iter()
        .filter(|m| {
            m["observer"] == "cri" && m["name"].as_str().is_some_and(|n| n.ends_with(":begin"))
        })
        .filter_map(|m| m["at_ns"].as_u64())
        .min()?;
    Some(first.saturating_sub(start) as f64 / 1e6)
}

// ---------------------------------------------------------------------------------------------

/// Puts each process back on the CPUs it had before when dropped, also when a run panics.
struct RestoreAffinity {
    before: Vec<(u32, Vec<usize>)>,
}

impl Drop for RestoreAffinity {
    fn drop(&mut self) {
        for (pid, cpus) in &self.before {
            if let Err(e) = swiftlet_benches::set_affinity(*pid, cpus) {
                eprintln!("--reserved-core: restoring the CPU affinity of pid {pid}: {e}");
            }
        }
    }
}

/// "CPU 3" or "CPUs 1,2,5".
fn cpu_list(cpus: &[usize]) -> String {
    let list: Vec<String> = cpus.iter().map(usize::to_string).collect();
    match list.len() {
        1 => format!("CPU {}", list[0]),
        _ => format!("CPUs {}", list.join(",")),
    }
}

/// swiftlet's batches again with the agent on a core of its own (the first CPU it may run on) and
/// containerd, its shims, runc, the pods and this bench on the others, as an operator reserves
/// CPUs for node daemons: what the agent adds per pod when it does not wait for a CPU behind the
/// runtime. Containerd's batch is slower on fewer cores, so no ratio to the floor is printed.
fn reserved_core(agent: &Agent, n: usize, reps: usize, pids: Pids) {
    let (Some(agent_pid), Some(containerd)) = (pids.agent, pids.containerd) else {
        return;
    };
    let me = std::process::id();
    let mut before = Vec::new();
    for pid in [agent_pid, containerd, me] {
        match swiftlet_benches::affinity(pid) {
            Ok(cpus) => before.push((pid, cpus)),
            Err(e) => {
                println!("\n--reserved-core: reading the CPU affinity of pid {pid}: {e}");
                return;
            }
        }
    }
    // The CPUs the agent may run on (its cpuset): the first is reserved, the rest are the runtime's.
    let allowed = before[0].1.clone();
    let [reserved, ref rest @ ..] = allowed[..] else {
        println!("\n--reserved-core: the agent may run on no CPU");
        return;
    };
    if rest.is_empty() {
        println!(
            "\n--reserved-core: needs 2 CPUs or more, the agent may run on {}",
            cpu_list(&allowed)
        );
        return;
    }
    let (mine, others) = (cpu_list(&[reserved]), cpu_list(rest));
    // Made first, so that a pin failing half-way is undone too.
    let pinned = RestoreAffinity { before };
    for (pid, set) in [(agent_pid, &[reserved][..]), (containerd, rest), (me, rest)] {
        if let Err(e) = swiftlet_benches::set_affinity(pid, set) {
            panic!("--reserved-core: setting the CPU affinity of pid {pid}: {e}");
        }
    }
    let mut samples = Vec::new();
    let mut runs = Vec::new();
    for rep in 0..reps {
        progress(&format!(
            "N={n} rep {}/{reps}: swiftlet, the agent on {mine}, the runtime on {others}",
            rep + 1
        ));
        let run = n * 1000 + 500 + rep;
        samples.push(swiftlet_run(agent, n, run, pids));
        runs.push(run);
        eprintln!(" done");
    }
    drop(pinned);
    println!(
        "\nN = {n}, the agent on a reserved core ({mine}; the runtime, the pods and the bench on {others}):"
    );
    header();
    row("swiftlet", &histogram(&samples), mean_wall(&samples));
    phase_summary(agent, n, &runs);
}

/// The runs of one N: the floor's, swiftlet's and podman's.
struct Batch {
    floor_label: &'static str,
    floors: Vec<Sample>,
    swift: Vec<Sample>,
    plays: Vec<Duration>,
}

/// Prints the runs of one N (latencies, wall times, CPU, the phase table of the swiftlet pods
/// whose names start with one of `prefixes`, the agent's CRI calls since `calls_before`);
/// returns swiftlet's mean wall time over the floor's.
fn report_batch(
    agent: &Agent,
    n: usize,
    reps: usize,
    batch: &Batch,
    prefixes: &[String],
    calls_before: &Calls,
) -> f64 {
    let (hf, hs) = (histogram(&batch.floors), histogram(&batch.swift));
    let (wf, ws) = (mean_wall(&batch.floors), mean_wall(&batch.swift));
    println!("\nN = {n}: per-pod latency (ms) and batch wall time (ms, mean of {reps} runs)");
    header();
    row(batch.floor_label, &hf, wf);
    row("swiftlet", &hs, ws);
    if !batch.plays.is_empty() {
        let wall: Duration = batch.plays.iter().sum::<Duration>() / batch.plays.len() as u32;
        println!(
            "  {:<10} {:>8} {:>8} {:>8} {:>8} {:>10.1}   (kube play returns once, for the batch)",
            "podman",
            "-",
            "-",
            "-",
            "-",
            wall.as_secs_f64() * 1000.0
        );
    }
    println!(
        "  CPU during the batch (ms, mean of {reps} runs; the machine's in clock ticks of {:.0} ms):",
        1000.0 / ticks_per_sec()
    );
    println!(
        "  {:<10} {:>12} {:>12} {:>12} {:>16} {:>8}",
        "", "machine", "containerd", "agent", "agent runq wait", "bench"
    );
    cpu_row(batch.floor_label, &batch.floors);
    cpu_row("swiftlet", &batch.swift);
    let per_pod = |samples: &[Sample], f: fn(&CpuUse) -> f64| mean_ms(samples, f, 1.0) / n as f64;
    println!(
        "  CPU per pod started: swiftlet's agent {:.2} ms (its eBPF reader included); the \
         client of the `{}` row {:.2} ms (this process sending the floor's CRI calls through \
         swiftlet's own CRI client, nothing else)",
        per_pod(&batch.swift, |c| c.agent_ms),
        batch.floor_label,
        per_pod(&batch.floors, |c| c.bench_ms),
    );
    phase_summary_of(agent, n, prefixes);
    print_cri_calls(calls_before, &cri_calls(agent), n * reps);
    let ratio = ws.as_secs_f64() / wf.as_secs_f64().max(1e-9);
    println!(
        "  swiftlet / {} (wall): {ratio:.2}x; per-pod latency swiftlet - {}: p50 {:+.1} ms, p99 {:+.1} ms",
        batch.floor_label,
        batch.floor_label,
        ms(hs.value_at_quantile(0.5)) - ms(hf.value_at_quantile(0.5)),
        ms(hs.value_at_quantile(0.99)) - ms(hf.value_at_quantile(0.99)),
    );
    ratio
}

fn release_agent() -> PathBuf {
    progress("building the agent (release) ...");
    let path = swiftlet_tests::release_agent_binary();
    eprintln!(" done");
    path
}

fn main() -> ExitCode {
    let opts = match parse_opts() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("pod_startup: {e}");
            return ExitCode::from(2);
        }
    };
    // Runtime::shared prints `SKIPPED: why` (or panics when SWIFTLET_REQUIRE_RUNTIME=1).
    let Some(rt) = Runtime::shared() else {
        eprintln!("pod_startup: skipped (needs root and containerd; see the SKIPPED line above)");
        return ExitCode::SUCCESS;
    };
    let binary = release_agent();
    let mut agent_opts = AgentOptions::new("bench");
    agent_opts.binary = Some(binary.clone());
    agent_opts.verbosity = 0;
    agent_opts.file_check_frequency = "20s".into();
    // With --otlp, every start is exported to a receiver here, which counts the spans it gets.
    let exported = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    if opts.otlp {
        let receiver = swiftlet_tests::otlp::Receiver::start();
        agent_opts.extra_args.extend([
            "--tracing-endpoint".to_owned(),
            receiver.addr.to_string(),
            "--tracing-sampling-rate-per-million".to_owned(),
            "1000000".to_owned(),
        ]);
        let exported = exported.clone();
        std::thread::spawn(move || {
            for request in receiver.requests {
                let spans: usize = request
                    .resource_spans
                    .iter()
                    .flat_map(|r| &r.scope_spans)
                    .map(|s| s.spans.len())
                    .sum();
                exported.fetch_add(spans, std::sync::atomic::Ordering::Relaxed);
            }
        });
    }
    let agent = Agent::start(rt, agent_opts);
    let idle = if opts.cost {
        progress("measuring the idle agent for 10 s ...");
        let idle = idle_cost(&agent);
        eprintln!(" done");
        idle
    } else {
        None
    };
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let cri = tokio
        .block_on(async { Cri::new(&rt.endpoint, Metrics::new()) })
        .expect("CRI client");
    let podman = Podman::setup(rt);
    let pids = Pids {
        containerd: rt.layout.pid().and_then(|p| u32::try_from(p).ok()),
        agent: agent.pid(),
    };

    println!(
        "pod_startup: host-network pods, one container each; {} repetition(s) per N",
        opts.reps
    );
    println!(
        "machine: {} cores; runtime {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        rt.endpoint
    );
    if opts.cold {
        cold(rt, &agent, &tokio, &cri, podman.as_ref(), &opts, pids);
        return ExitCode::SUCCESS;
    }
    let mut ratios = Vec::new();
    for &n in &opts.pods {
        let (mut floors, mut swift, mut pods_play) = (Vec::new(), Vec::new(), Vec::new());
        let calls_before = cri_calls(&agent);
        for rep in 0..opts.reps {
            progress(&format!("N={n} rep {}/{}: floor", rep + 1, opts.reps));
            let run = n * 1000 + rep;
            let s = tokio
                .block_on(floor(&cri, n, run, pids))
                .expect("CRI floor run");
            tokio
                .block_on(floor_cleanup(&cri))
                .expect("cleaning up the floor pods");
            floors.push(s);
            progress(", swiftlet");
            swift.push(swiftlet_run(&agent, n, run, pids));
            if let Some(p) = &podman {
                progress(", podman");
                match p.play(n, run) {
                    Ok(w) => pods_play.push(w),
                    Err(e) => eprintln!("\n  podman kube play failed: {e}"),
                }
            }
            eprintln!(" done");
        }
        let prefixes: Vec<String> = (0..opts.reps)
            .map(|rep| format!("s{}-", n * 1000 + rep))
            .collect();
        let batch = Batch {
            floor_label: "CRI floor",
            floors,
            swift,
            plays: pods_play,
        };
        let ratio = report_batch(&agent, n, opts.reps, &batch, &prefixes, &calls_before);
        ratios.push((n, ratio));
    }
    if opts.reserved_core
        && let Some(&n) = opts.pods.iter().max()
    {
        reserved_core(&agent, n, opts.reps, pids);
    }
    println!("\nsummary (swiftlet wall / CRI floor wall):");
    for (n, r) in &ratios {
        println!("  N={n:<4} {r:.2}x");
    }
    if opts.otlp {
        // The last batch's spans may still be in the exporter's queue (it sends once a second).
        std::thread::sleep(std::time::Duration::from_secs(3));
        println!(
            "OTLP: {} spans received; the agent's swiftlet_otlp_spans_exported_total {}, dropped \
             (queue full, export failed) {} / {}",
            exported.load(std::sync::atomic::Ordering::Relaxed),
            agent.metric("swiftlet_otlp_spans_exported_total"),
            agent.metric("swiftlet_otlp_spans_dropped_total{reason=\"queue_full\"}"),
            agent.metric("swiftlet_otlp_spans_dropped_total{reason=\"export_failed\"}"),
        );
    }
    if opts.cost {
        cost(&agent, &opts, idle);
    }
    if opts.volumes {
        drop(agent);
        volumes(rt, &tokio, binary, &opts);
    }
    ExitCode::SUCCESS
}
