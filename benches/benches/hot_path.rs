//! criterion benches of the agent's hot path (container hashing, the relist's listing decode). Budgets are in docs/architecture.md; results in BENCHMARKS.md.
use criterion::{Criterion, black_box, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::{Container, ContainerPort, EnvVar};
use swiftlet::runtime::hash::container_hash;

fn typical_container() -> Container {
    Container {
        name: "app".into(),
        image: Some("localhost/swiftlet/busybox:v1".into()),
        command: Some(vec!["sh".into(), "-c".into()]),
        args: Some(vec!["while true; do sleep 1; done".into()]),
        env: Some(
            (0..4)
                .map(|i| EnvVar {
                    name: format!("VAR_{i}"),
                    value: Some(format!("value-{i}")),
                    ..Default::default()
                })
                .collect(),
        ),
        ports: Some(vec![ContainerPort {
            container_port: 8080,
            name: Some("http".into()),
            ..Default::default()
        }]),
        working_dir: Some("/".into()),
        ..Default::default()
    }
}

/// The baseline the canonical encoding replaces: the same restart-relevant fields serialised to
/// JSON by serde into a fresh buffer, then FNV-1a (64-bit) a byte at a time.
fn json_then_hash(c: &Container) -> u64 {
    let view = (
        &c.name,
        &c.image,
        &c.command,
        &c.args,
        &c.working_dir,
        &c.env,
        &c.ports,
        &c.volume_mounts,
        &c.security_context,
        c.stdin,
        c.tty,
    );
    let bytes = serde_json::to_vec(&view).unwrap_or_default();
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn hash(c: &mut Criterion) {
    let container = typical_container();
    let mut group = c.benchmark_group("container_hash");
    group.bench_function("typical", |b| {
        b.iter(|| container_hash(black_box(&container)))
    });
    group.bench_function("json_then_hash_baseline", |b| {
        b.iter(|| json_then_hash(black_box(&container)))
    });
    group.finish();
}

/// `ListContainers`' answer for `n` containers, each shaped as the agent's own (its labels and
/// annotations, an image, the metadata), encoded as the runtime sends it.
fn listing_bytes(n: usize) -> Vec<u8> {
    use k8s_cri::v1 as cri;
    use prost::Message as _;
    use swiftlet::pod::labels;
    let containers =
        (0..n)
            .map(|i| {
                let pod = format!("pod-{i}");
                let uid = format!("4a3f2c1e-0000-4000-8000-{i:012}");
                let pairs = |kv: &[(&str, &str)]| {
                    kv.iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect()
                };
                cri::Container {
                id: format!("{i:064x}"),
                pod_sandbox_id: format!("{:064x}", i + 1_000_000),
                metadata: Some(cri::ContainerMetadata {
                    name: "app".into(),
                    attempt: 0,
                }),
                image: Some(cri::ImageSpec {
                    image: "sha256:03b376866e921da5aad19ac320aa542f22176a5dd8896233a2a7794932997c55"
                        .into(),
                    ..Default::default()
                }),
                image_ref: "sha256:03b376866e921da5aad19ac320aa542f22176a5dd8896233a2a7794932997c55"
                    .into(),
                state: cri::ContainerState::ContainerRunning as i32,
                created_at: 1_764_000_000_000_000_000 + i as i64,
                labels: pairs(&[
                    (labels::POD_NAME, &pod),
                    (labels::POD_NAMESPACE, "default"),
                    (labels::POD_UID, &uid),
                    (labels::NODE_NAME, "node-1"),
                    (labels::CONTAINER_NAME, "app"),
                    ("app", &pod),
                ]),
                annotations: pairs(&[
                    (labels::CONTAINER_TYPE, "app"),
                    (labels::CONTAINER_HASH, "9f1c2b3a"),
                    (labels::CONTAINER_RESTART_COUNT, "0"),
                    (labels::POD_TERMINATION_GRACE_PERIOD, "30"),
                    (labels::TERMINATION_MESSAGE_PATH, "/dev/termination-log"),
                    (labels::CONTAINER_RESOURCES, "cpu_shares=2,memory_limit=0,oom=1000"),
                ]),
                image_id: String::new(),
            }
            })
            .collect();
    cri::ListContainersResponse { containers }.encode_to_vec()
}

/// A relist's container listing decoded whole (`k8s_cri`'s `ListContainersResponse`) and as the
/// relist decodes it (`swiftlet::cri::BriefContainers`: id, state, creation time, labels).
fn listing(c: &mut Criterion) {
    use prost::Message as _;
    for n in [250usize, 1_000] {
        let bytes = listing_bytes(n);
        let mut group = c.benchmark_group(format!("relist_listing_{n}"));
        group.bench_function("full", |b| {
            b.iter(|| {
                k8s_cri::v1::ListContainersResponse::decode(black_box(bytes.as_slice()))
                    .map(|r| r.containers.len())
            })
        });
        group.bench_function("brief", |b| {
            b.iter(|| {
                swiftlet::cri::BriefContainers::decode(black_box(bytes.as_slice()))
                    .map(|r| r.containers.len())
            })
        });
        group.finish();
    }
}

/// A pod start's timeline as the agent records one (probes on): its marks, the CRI calls of a
/// start with one container, the sandbox's and the container's cgroups and first execs.
fn start_record() -> swiftlet::trace::PodRecord {
    use swiftlet::trace::timeline::{CriSpan, ExecCgroup};
    let mut p = swiftlet::trace::PodRecord::new("6d1c9a0e-5b7f-4c53-9f3e-2a8d7c1b0e44");
    p.name = "web-node-a".into();
    p.namespace = "default".into();
    p.containers = vec!["main".into()];
    p.source_seen_ns = Some(1_000_000);
    p.admitted_ns = Some(1_010_000);
    p.worker_started_ns = Some(1_030_000);
    p.volumes_ns = Some(1_100_000);
    p.pod_cgroup_ns = Some(1_300_000);
    let calls = [
        ("RunPodSandbox", 1_400_000, 60_000_000),
        ("PodSandboxStatus", 60_100_000, 60_400_000),
        ("ImageStatus", 60_500_000, 60_900_000),
        ("CreateContainer", 61_000_000, 75_000_000),
        ("StartContainer", 75_100_000, 95_000_000),
        ("ContainerStatus", 96_000_000, 96_300_000),
    ];
    p.cri = calls
        .iter()
        .map(|&(method, begin_ns, end)| CriSpan {
            method,
            begin_ns,
            end_ns: Some(end),
            ok: Some(true),
        })
        .collect();
    p.execs = vec![
        ExecCgroup {
            cgroup_id: 10,
            created_ns: Some(20_000_000),
            first_exec_ns: 40_000_000,
            pid: 4242,
            comm: "pause".into(),
            exit: None,
        },
        ExecCgroup {
            cgroup_id: 11,
            created_ns: Some(78_000_000),
            first_exec_ns: 94_000_000,
            pid: 4250,
            comm: "sh".into(),
            exit: None,
        },
    ];
    p.running_observed_ns = Some(99_000_000);
    p
}

/// What exporting one pod start over OTLP costs the agent besides the send: its spans built
/// from the timeline and protobuf-encoded.
fn otlp(c: &mut Criterion) {
    use prost::Message;
    let record = start_record();
    let n = swiftlet::trace::otlp::spans(&record, 0).len();
    let mut group = c.benchmark_group("otlp");
    group.bench_function(format!("spans_and_encode_one_start_{n}_spans"), |b| {
        let mut buf = Vec::with_capacity(16 << 10);
        b.iter(|| {
            buf.clear();
            for s in swiftlet::trace::otlp::spans(black_box(&record), 0) {
                s.encode(&mut buf).expect("a Vec grows");
            }
            buf.len()
        })
    });
    group.finish();
}

criterion_group!(benches, hash, listing, otlp);
criterion_main!(benches);
