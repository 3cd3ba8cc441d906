//! criterion benches of the agent's hot path. Budgets are in DESIGN.md; results in BENCHMARKS.md.
use criterion::{Criterion, black_box, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::{Container, ContainerPort, EnvVar, Pod};
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

/// A SET of 10,000 unchanged static pods (the merge budget: <= 1 ms, <= 100 ns a pod).
fn merge(c: &mut Criterion) {
    use swiftlet::config::{FILE, Mux, SourceUpdate, manifest};
    let pods: Vec<Pod> = (0..10_000)
        .map(|i| {
            let text = format!(
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p{i}\n  labels: {{app: bench}}\nspec:\n  containers:\n  - name: c\n    image: localhost/swiftlet/busybox:v1\n    command: [sleep, '3600']\n"
            );
            manifest::parse(std::path::Path::new(&format!("/m/p{i}.yaml")), text.as_bytes(), "node")
                .expect("bench manifest parses")
        })
        .collect();
    let mut mux = Mux::new();
    mux.register(FILE);
    mux.merge(FILE, SourceUpdate::Set(pods.clone()));
    let mut group = c.benchmark_group("merge");
    group.sample_size(10);
    group.bench_function("set_10000_unchanged", |b| {
        b.iter_batched(
            || pods.clone(),
            |set| mux.merge(FILE, SourceUpdate::Set(set)),
            criterion::BatchSize::LargeInput,
        )
    });
    group.finish();
}

criterion_group!(benches, hash, merge);
criterion_main!(benches);
