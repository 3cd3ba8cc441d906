//! Image garbage collection on a real containerd: images of distinct content (built and
//! imported with `ctr` here) that no container uses are removed once they are older than
//! `--image-minimum-gc-age`, while the image of a running container and the pinned sandbox image
//! stay, and an image first seen later stays until it is old enough too.
//!
//! One test in a file of its own: cargo runs test files one after the other, so no other test
//! shares the runtime while this agent collects its unused images (with thresholds of 1% and
//! 0% it removes every image that is old enough and unused).

use std::time::{Duration, Instant};

use swiftlet_tests::{Agent, AgentOptions, BUSYBOX_IMAGE, PAUSE_IMAGE, image_present};

const MIN_AGE: Duration = Duration::from_secs(15);

#[test]
fn unused_images_are_collected_when_old_enough_and_used_or_pinned_ones_stay() {
    let Some(runtime) = swiftlet_tests::Runtime::shared() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let import = |name: &str| swiftlet_tests::import_test_image(runtime, dir.path(), name);
    let old = import("old");
    let present = |image: &str| image_present(&runtime.endpoint, image).expect("ImageStatus");
    assert!(present(&old));

    let mut opts = AgentOptions::new("image-gc");
    opts.extra_args = [
        "--image-gc-high-threshold",
        "1",
        "--image-gc-low-threshold",
        "0",
        "--image-minimum-gc-age",
        "15s",
        "--image-gc-period",
        "1s",
    ]
    .map(String::from)
    .into();
    let started = Instant::now();
    let agent = Agent::start(runtime, opts);
    // A running container uses busybox (it must run well before busybox is old enough).
    let node = agent.node_name();
    agent.write_manifest("user.yaml", &swiftlet_tests::image_user_manifest(node));
    let pod = agent.static_pod_name("user");
    agent.wait_for(
        |l| {
            l.container(&pod, "main")
                .is_some_and(swiftlet_tests::is_running)
        },
        MIN_AGE - Duration::from_secs(5),
    );
    // First seen now: young for MIN_AGE from here.
    let young = import("young");
    let young_seen = Instant::now();

    agent.eventually("the old image collected", Duration::from_secs(60), || {
        (!present(&old))
            .then_some(())
            .ok_or_else(|| "still there".into())
    });
    assert!(
        started.elapsed() >= MIN_AGE,
        "collected {:?} after the agent's start",
        started.elapsed()
    );
    let young_age = young_seen.elapsed();
    let young_there = present(&young);
    if young_age + Duration::from_secs(1) < MIN_AGE {
        assert!(
            young_there,
            "an image first seen {young_age:?} ago was collected"
        );
    }
    agent.eventually("the young image collected", Duration::from_secs(60), || {
        (!present(&young))
            .then_some(())
            .ok_or_else(|| "still there".into())
    });
    assert!(young_seen.elapsed() >= MIN_AGE);
    assert!(present(BUSYBOX_IMAGE), "the image of a running container");
    assert!(present(PAUSE_IMAGE), "the pinned sandbox image");

    // The counter moves once RemoveImage has returned, a moment after the image is gone.
    agent.eventually(
        "swiftlet_image_garbage_collected_total >= 2",
        Duration::from_secs(10),
        || {
            let (_, metrics) = agent.get("/metrics");
            let removed: f64 = metrics
                .lines()
                .find_map(|l| l.strip_prefix("swiftlet_image_garbage_collected_total "))
                .and_then(|v| v.trim().parse().ok())
                .ok_or_else(|| format!("no image_garbage_collected_total in {metrics}"))?;
            (removed >= 2.0)
                .then_some(())
                .ok_or_else(|| format!("{removed}"))
        },
    );
    assert!(
        agent.log().contains("image removed by garbage collection"),
        "nothing in the log"
    );
}
