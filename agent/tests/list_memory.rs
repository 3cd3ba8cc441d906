//! The memory a manifest URL's PodList holds, as `Packed::held_bytes` estimates it, against what
//! its pods really hold: every byte the allocator hands out while the list is parsed and not
//! freed afterwards is counted by this binary's allocator. The estimate bounds the list's
//! memory (`manifest::MAX_LIST_HELD`), so it must not fall short of the real figure, whatever
//! the pods' metadata holds; nor may it be so far above it that lists are cut for nothing.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use swiftlet::config::StoredPod;
use swiftlet::config::manifest::{self, parse_url};
use swiftlet::config::packed::HELD_PER_POD;

/// Bytes handed out and not yet freed, in this whole process.
static LIVE: AtomicIsize = AtomicIsize::new(0);

struct Counting;

fn signed(n: usize) -> isize {
    isize::try_from(n).unwrap_or(isize::MAX)
}

// SAFETY: every method forwards to the system allocator with the caller's arguments unchanged,
// and only counts sizes beside it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(signed(layout.size()), Ordering::Relaxed);
        // SAFETY: forwarded as is; the caller upholds `GlobalAlloc::alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(signed(layout.size()), Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(signed(new_size) - signed(layout.size()), Ordering::Relaxed);
        // SAFETY: as above; `ptr` came from this allocator, which is System underneath.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(signed(layout.size()), Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The metadata of a list's pod `i`.
type Meta = fn(usize) -> serde_json::Value;

const URL: &str = "http://127.0.0.1:1/pods";

/// A PodList of `n` pods whose metadata `meta(i)` gives, one container each.
fn list(n: usize, meta: Meta) -> String {
    let items: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            serde_json::json!({"metadata": meta(i),
                "spec": {"containers": [{"name": "c", "image": "registry.local/app:v1",
                                         "command": ["sh", "-c", "sleep 1000"]}]}})
        })
        .collect();
    serde_json::json!({"kind": "PodList", "apiVersion": "v1", "items": items}).to_string()
}

/// (bytes the parsed list really holds, the estimate of the same), without the agent's own
/// per-pod entries (`HELD_PER_POD`, held elsewhere) and the list's vector (not a pod's).
fn held(body: &str) -> (isize, isize, usize) {
    let before = LIVE.load(Ordering::SeqCst);
    let items = parse_url(URL, body.as_bytes(), "node-a").expect("the list parses");
    let real = LIVE.load(Ordering::SeqCst) - before
        - signed(items.capacity() * size_of::<manifest::Result<StoredPod>>())
        // The shared pointer's two counts, beside each pod.
        - signed(items.len() * 16);
    let pods: Vec<&StoredPod> = items.iter().flatten().collect();
    assert_eq!(pods.len(), items.len(), "every pod is valid");
    let estimate: usize = pods
        .iter()
        .map(|p| p.pod().held_bytes().expect("packed") - HELD_PER_POD)
        .sum();
    (real, signed(estimate), pods.len())
}

#[test]
fn the_estimate_of_a_lists_memory_is_never_short_of_what_its_pods_hold() {
    let shapes: [(&str, Meta); 4] = [
        (
            "a name alone",
            |i| serde_json::json!({"name": format!("p{i}")}),
        ),
        ("60 short labels", |i| {
            let labels: serde_json::Map<String, serde_json::Value> =
                (0..60).map(|l| (format!("l{l}"), "v".into())).collect();
            serde_json::json!({"name": format!("p{i}"), "labels": labels})
        }),
        ("long annotations, owners and finalizers", |i| {
            let notes: serde_json::Map<String, serde_json::Value> = (0..8)
                .map(|a| (format!("example.com/note-{a}"), "x".repeat(300).into()))
                .collect();
            serde_json::json!({"name": format!("p{i}"), "annotations": notes,
                    "finalizers": ["example.com/a", "example.com/b"],
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Node",
                                         "name": "node-a", "uid": "u-1"}]})
        }),
        ("managed fields", |i| {
            let fields: serde_json::Map<String, serde_json::Value> = (0..40)
                .map(|f| (format!("f:field{f}"), serde_json::json!({})))
                .collect();
            serde_json::json!({"name": format!("p{i}"), "managedFields": [{
                    "manager": "kubectl", "operation": "Apply", "apiVersion": "v1",
                    "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": fields}}]})
        }),
    ];
    for (what, meta) in &shapes {
        let (real, estimate, n) = held(&list(300, *meta));
        assert_eq!(n, 300, "{what}");
        // Never short: the budget holds whatever the metadata is made of.
        assert!(
            estimate >= real,
            "{what}: estimated {estimate} bytes, the pods hold {real}"
        );
        // Nor far above: a list is not cut at a fraction of what the budget allows.
        assert!(
            estimate <= 3 * real,
            "{what}: estimated {estimate} bytes, the pods hold only {real}"
        );
    }
}
