//! `--image-maximum-gc-age` on a real containerd: with disk-based collection off (high
//! threshold 100%), an image no container uses is removed once it has gone unused longer than
//! the maximum age, and not before; the image of a running container and the pinned sandbox image
//! stay.
//!
//! A file of its own: cargo runs test files one after the other, so no other test's images are
//! taken while this agent collects old unused images.

use std::time::{Duration, Instant};

use swiftlet_tests::{Agent, AgentOptions, BUSYBOX_IMAGE, PAUSE_IMAGE, image_present};

const MAX_AGE: Duration = Duration::from_secs(8);

#[test]
fn an_image_unused_longer_than_the_maximum_age_goes_whatever_the_disk_use() {
    let Some(runtime) = swiftlet_tests::Runtime::shared() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let reference = swiftlet_tests::import_test_image(runtime, dir.path(), "aged");
    let present = |image: &str| image_present(&runtime.endpoint, image).expect("ImageStatus");
    assert!(present(&reference));

    let mut opts = AgentOptions::new("image-gc-age");
    opts.extra_args = [
        "--image-gc-high-threshold",
        "100",
        "--image-minimum-gc-age",
        "1s",
        "--image-maximum-gc-age",
        "8s",
        "--image-gc-period",
        "1s",
    ]
    .map(String::from)
    .into();
    let started = Instant::now();
    let agent = Agent::start(runtime, opts);
    let node = agent.node_name();
    agent.write_manifest("user.yaml", &swiftlet_tests::image_user_manifest(node));
    let pod = agent.static_pod_name("user");
    agent.wait_for(
        |l| {
            l.container(&pod, "main")
                .is_some_and(swiftlet_tests::is_running)
        },
        MAX_AGE - Duration::from_secs(3),
    );
    agent.eventually("the aged image collected", Duration::from_secs(60), || {
        (!present(&reference))
            .then_some(())
            .ok_or_else(|| "still there".into())
    });
    assert!(
        started.elapsed() >= MAX_AGE,
        "collected {:?} after the agent's start, before the maximum age",
        started.elapsed()
    );
    assert!(present(BUSYBOX_IMAGE), "the image of a running container");
    assert!(present(PAUSE_IMAGE), "the pinned sandbox image");
    // The agent logs the removal once RemoveImage has answered, which can be just after the
    // image was seen gone above.
    agent.eventually(
        "the removal's reason in the log",
        Duration::from_secs(10),
        || {
            agent
                .log()
                .contains("unused longer than --image-maximum-gc-age")
                .then_some(())
                .ok_or_else(|| "not logged".into())
        },
    );
}
