//! `dispatch`: the cost of `PodWorkers::update_pod` (the kubelet's `UpdatePod`) for a pod whose
//! worker exists and is busy, so the update is coalesced into its pending slot. Budget (docs/architecture.md):
//! <= 200 ns per update and no heap allocation per coalesced update.
//!
//! The workers live on a tokio runtime that is entered but never driven, so no worker runs and
//! every update lands in a pending slot, exactly the coalescing path. A counting global allocator
//! checks the allocation budget before criterion measures time; the bench fails if it is broken.
use criterion::{Criterion, black_box, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::Pod;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use swiftlet::pod_workers::{PodSyncer, PodWorkers, Synced, UpdateType, Work};
use swiftlet::runtime;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Counts every allocation (and reallocation) of the process.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every method forwards to the system allocator with the caller's arguments unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded as is; the caller upholds `GlobalAlloc::alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above; `ptr` came from this allocator, which is System underneath.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// A runtime that is never called (the workers never run).
struct Idle;

impl PodSyncer for Idle {
    async fn sync_pod(
        &self,
        _uid: &str,
        _pod: &Pod,
        _cancel: &CancellationToken,
        _superseded: &CancellationToken,
    ) -> Result<Synced, runtime::Error> {
        Ok(Synced::default())
    }
    async fn sync_terminating_pod(
        &self,
        _uid: &str,
        _pod: &Pod,
        _grace: i64,
    ) -> Result<(), runtime::Error> {
        Ok(())
    }
    async fn sync_terminated_pod(&self, _uid: &str, _pod: &Pod) -> Result<(), runtime::Error> {
        Ok(())
    }
}

fn pods(n: usize) -> Vec<(String, Arc<Pod>)> {
    (0..n)
        .map(|i| {
            let uid = format!("{i:032x}");
            let mut p = Pod::default();
            p.metadata.uid = Some(uid.clone());
            p.metadata.name = Some(format!("pod-{i}"));
            p.metadata.namespace = Some("default".into());
            (uid, Arc::new(p))
        })
        .collect()
}

/// Allocations per update over `rounds` updates spread over `pods`.
fn allocations_per_update(
    workers: &mut PodWorkers<Idle>,
    pods: &[(String, Arc<Pod>)],
    rounds: usize,
) -> f64 {
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for i in 0..rounds {
        let (uid, pod) = &pods[i % pods.len()];
        workers.update_pod(uid, Work::new(UpdateType::Update, pod.clone()));
    }
    (ALLOCATIONS.load(Ordering::Relaxed) - before) as f64 / rounds as f64
}

fn dispatch(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a tokio runtime");
    let _entered = rt.enter();
    let (done_tx, _done_rx) = tokio::sync::mpsc::unbounded_channel();
    let cancel = CancellationToken::new();
    let mut workers = PodWorkers::new(Idle, done_tx, TaskTracker::new(), cancel.clone());
    let all = pods(10_000);
    for (uid, pod) in &all {
        workers.update_pod(uid, Work::new(UpdateType::Create, pod.clone()));
    }
    let one = &all[..1];

    for (what, set) in [("one pod", one), ("10,000 pods", &all[..])] {
        let per = allocations_per_update(&mut workers, set, 100_000);
        println!("dispatch ({what}): {per} heap allocations per coalesced update");
        assert!(
            per == 0.0,
            "coalesced updates allocate ({what}): {per} per update"
        );
    }

    let mut group = c.benchmark_group("dispatch");
    let (uid, pod) = &one[0];
    group.bench_function("update_pod_one_pod", |b| {
        b.iter(|| workers.update_pod(black_box(uid), Work::new(UpdateType::Update, pod.clone())))
    });
    let mut i = 0;
    group.bench_function("update_pod_10000_pods", |b| {
        b.iter(|| {
            let (uid, pod) = &all[i];
            i = (i + 1) % all.len();
            workers.update_pod(black_box(uid), Work::new(UpdateType::Update, pod.clone()))
        })
    });
    group.finish();
    cancel.cancel();
}

criterion_group!(benches, dispatch);
criterion_main!(benches);
