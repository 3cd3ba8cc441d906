//! criterion benches of the agent's hot path. Budgets are in docs/architecture.md; results in BENCHMARKS.md.
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

criterion_group!(benches, hash);
criterion_main!(benches);
