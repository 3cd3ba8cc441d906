//! criterion benches of the agent's hot path. Budgets are in DESIGN.md; results in BENCHMARKS.md.
use criterion::{Criterion, black_box, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::{Container, ContainerPort, EnvVar, Pod};
use std::sync::Arc;
use std::time::Instant;
use swiftlet::pod_workers::{UpdateType, Work, coalesce};
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

fn hash(c: &mut Criterion) {
    let container = typical_container();
    c.bench_function("container_hash/typical", |b| {
        b.iter(|| container_hash(black_box(&container)))
    });
}

fn dispatch(c: &mut Criterion) {
    let pod = Arc::new(Pod::default());
    let mut pending = None;
    c.bench_function("dispatch/coalesce_one_pod", |b| {
        b.iter(|| {
            let w = Work {
                kind: UpdateType::Update,
                pod: pod.clone(),
                grace: None,
                received: Instant::now(),
            };
            coalesce(black_box(&mut pending), w);
        })
    });
}

criterion_group!(benches, hash, dispatch);
criterion_main!(benches);
