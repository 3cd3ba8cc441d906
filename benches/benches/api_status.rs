//! A node in a cluster: N pods from the API server (the tests crate's in-process server; default
//! 100) start on the real containerd, and then nothing changes for a while.
//!
//! - Status write delay: from a pod's status change in the agent to the API server's answer to
//!   its patch (`swiftlet_pod_status_write_delay_seconds`, read as bucket bounds: the quantile is
//!   at most the bound printed), over every write of the start-up (the busiest moment).
//! - Idle requests: every request the API server receives over `--idle-secs` (default 60) once
//!   every pod's Running status is written, per second, by kind (lease renewals, node status,
//!   pod status, other). Budget: at most 0.2 per second.
//!
//! `cargo bench -p swiftlet-benches --bench api_status [-- --pods N --idle-secs S]`. Builds and
//! runs the release agent.
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use swiftlet_benches::{bucket_quantile, histogram_buckets};
use swiftlet_tests::api_server::ApiServer;
use swiftlet_tests::{Agent, AgentOptions, Runtime, busybox_api_pod};

fn main() -> ExitCode {
    let (mut pods, mut idle_secs) = (100usize, 60usize);
    if let Err(code) = swiftlet_benches::count_args(
        "api_status",
        &mut [("pods", &mut pods), ("idle-secs", &mut idle_secs)],
    ) {
        return code;
    }
    let Some(rt) = Runtime::shared() else {
        eprintln!("api_status: skipped (needs root and containerd; see the SKIPPED line above)");
        return ExitCode::SUCCESS;
    };
    let tokio = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let server = tokio.block_on(ApiServer::start());
    let mut opts = AgentOptions::new("bench-api");
    opts.verbosity = 0;
    opts.binary = Some(swiftlet_tests::release_agent_binary());
    let _kubeconfig = server.point_agent(&mut opts);
    let agent = Agent::start(rt, opts);
    let node = agent.node_name().to_owned();
    println!("starting {pods} pods from the API server ...");
    for i in 0..pods {
        server.put(busybox_api_pod(
            &node,
            &format!("p{i}"),
            "",
            "",
            "sleep 3600 & wait",
            "",
        ));
    }
    let written_running = |server: &ApiServer| {
        (0..pods)
            .filter(|i| {
                server
                    .pod_named("default", &format!("p{i}"))
                    .and_then(|p| p.status?.phase)
                    .as_deref()
                    == Some("Running")
            })
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(600);
    while written_running(&server) < pods {
        assert!(
            Instant::now() < deadline,
            "the pods did not all run in 600 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Let the last readiness changes settle.
    std::thread::sleep(Duration::from_secs(5));
    let metrics = agent.get("/metrics").1;
    let (buckets, count) = histogram_buckets(&metrics, "swiftlet_pod_status_write_delay_seconds");
    let ms = |q: f64| bucket_quantile(&buckets, count, q).map_or(f64::NAN, |s| s * 1000.0);
    println!(
        "status write delay over the start of {pods} pods: {count} writes, p50 <= {:.1} ms, \
         p90 <= {:.1} ms, p99 <= {:.1} ms, max <= {:.1} ms (budget: p99 <= 100 ms)",
        ms(0.5),
        ms(0.9),
        ms(0.99),
        ms(1.0)
    );
    println!("idle for {idle_secs} s ...");
    let since = Instant::now();
    std::thread::sleep(Duration::from_secs(idle_secs as u64));
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for (at, method, path) in server.request_log() {
        if at < since {
            continue;
        }
        let kind = if path.contains("/leases") {
            "lease"
        } else if path.starts_with("/api/v1/nodes") {
            "node"
        } else if path.contains("/pods/") && method != "GET" {
            "pod write"
        } else {
            "other (reads, watches)"
        };
        *kinds.entry(kind).or_default() += 1;
    }
    let total: usize = kinds.values().sum();
    println!(
        "idle with {pods} running pods: {total} API requests in {idle_secs} s = {:.3} per second \
         (budget: <= 0.2); {kinds:?}",
        total as f64 / idle_secs as f64
    );
    for i in 0..pods {
        server.delete(&format!("p{i}-{node}"));
    }
    agent.wait_for(|l| l.items.is_empty(), Duration::from_secs(600));
    ExitCode::SUCCESS
}
