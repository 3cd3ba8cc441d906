//! criterion benches of the config mux's merge (budget in docs/architecture.md: a SET of 10,000 unchanged pods
//! in <= 1 ms, <= 100 ns a pod). Results in BENCHMARKS.md.
//!
//! The pods are real static pods (parsed and defaulted by `manifest::parse`), ingested once as
//! `StoredPod`s the way a source does; each SET re-sends the same `StoredPod`s, as the file and API
//! sources do for unchanged pods (the mux compares their fingerprints).
use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use std::path::Path;
use std::time::{Duration, Instant};
use swiftlet::config::{FILE, Mux, SourceUpdate, StoredPod, manifest};

fn static_pod(i: usize, image: &str) -> StoredPod {
    let text = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p{i}\n  uid: uid-{i}\n  labels: {{app: bench}}\nspec:\n  containers:\n  - name: c\n    image: {image}\n    command: [sleep, '3600']\n"
    );
    let path = format!("/m/p{i}.yaml");
    match manifest::parse(Path::new(&path), text.as_bytes(), "node") {
        Ok(pod) => StoredPod::new(pod),
        Err(e) => panic!("bench manifest does not parse: {e}"),
    }
}

fn pods(n: usize) -> Vec<StoredPod> {
    (0..n)
        .map(|i| static_pod(i, "localhost/swiftlet/busybox:v1"))
        .collect()
}

fn mux_with(set: &[StoredPod]) -> Mux {
    let mut mux = Mux::new();
    mux.register(FILE);
    mux.merge(FILE, SourceUpdate::Set(set.to_vec()));
    mux
}

fn merge(c: &mut Criterion) {
    let mut group = c.benchmark_group("merge");
    group.sample_size(20);

    for n in [1_000, 10_000] {
        let set = pods(n);
        let mut mux = mux_with(&set);
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::new("set_unchanged", n), &set, |b, set| {
            b.iter_batched(
                || set.clone(),
                |set| {
                    let out = mux.merge(FILE, SourceUpdate::Set(set));
                    assert!(out.is_empty());
                },
                BatchSize::LargeInput,
            )
        });
    }

    // 10,000 pods, one of which alternates between two images: every SET yields one UPDATE.
    let n = 10_000;
    let base = pods(n);
    let mut other = base.clone();
    other[n / 2] = static_pod(n / 2, "localhost/swiftlet/busybox:v2");
    let mut mux = mux_with(&base);
    let mut flip = false;
    group.throughput(Throughput::Elements(n as u64));
    group.bench_function(BenchmarkId::new("set_one_changed", n), |b| {
        b.iter_batched(
            || {
                flip = !flip;
                if flip { other.clone() } else { base.clone() }
            },
            |set| {
                let out = mux.merge(FILE, SourceUpdate::Set(set));
                assert_eq!(out.len(), 1);
            },
            BatchSize::LargeInput,
        )
    });

    // Incremental: one ADD of one new pod into a source holding 10,000 (the REMOVE that undoes
    // it is not timed).
    let mut mux = mux_with(&base);
    let fresh: Vec<StoredPod> = (n..n + 1_000)
        .map(|i| static_pod(i, "localhost/swiftlet/busybox:v1"))
        .collect();
    group.throughput(Throughput::Elements(1));
    group.bench_function(BenchmarkId::new("add_one_into", n), |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for i in 0..iters {
                let pod = fresh[(i as usize) % fresh.len()].clone();
                let start = Instant::now();
                let out = mux.merge(FILE, SourceUpdate::Add(vec![pod.clone()]));
                total += start.elapsed();
                assert_eq!(out.len(), 1);
                mux.merge(FILE, SourceUpdate::Remove(vec![pod]));
            }
            total
        })
    });
    group.finish();
}

criterion_group!(benches, merge);
criterion_main!(benches);
