//! `/stats/summary` with N running pods (default 100), against the real containerd: the latency
//! of one GET on the read-only port (the kubelet API serves the same handler behind TLS), and
//! the agent CPU each costs (utime + stime of the agent over all the GETs, divided by their
//! count). The paths a monitoring scrape reads (`/metrics/cadvisor`, `/metrics`,
//! `/metrics/resource`) are measured the same way beside it, in alternating blocks, so that
//! their figures compare within one run.
//!
//! `cargo bench -p swiftlet-benches --bench stats_summary [-- --pods N --requests M]`.
//! Builds and runs the release agent.
use std::process::ExitCode;
use std::time::Instant;
use swiftlet_benches::cpu_ms;
use swiftlet_tests::Runtime;

fn main() -> ExitCode {
    let (mut pods, mut requests) = (100usize, 300usize);
    if let Err(code) = swiftlet_benches::count_args(
        "stats_summary",
        &mut [("pods", &mut pods), ("requests", &mut requests)],
    ) {
        return code;
    }
    let Some(rt) = Runtime::shared() else {
        eprintln!("stats_summary: skipped (needs root and containerd; see the SKIPPED line above)");
        return ExitCode::SUCCESS;
    };
    let (agent, _) = swiftlet_tests::release_agent_with_pods(rt, "bench-stats", pods, "");
    // Warm: the sandbox pids are looked up once, the cpu rates need a first read.
    for _ in 0..3 {
        let (code, body) = agent.get("/stats/summary");
        assert_eq!(code, 200, "{body}");
    }
    let (_, body) = agent.get("/stats/summary");
    let doc: serde_json::Value = serde_json::from_str(&body).expect("a JSON summary");
    let listed = doc["pods"].as_array().map_or(0, Vec::len);
    println!("summary: {listed} pods, {} bytes", body.len());
    let pid = agent.pid().expect("the agent runs");
    const PATHS: [&str; 4] = [
        "/stats/summary",
        "/metrics/cadvisor",
        "/metrics",
        "/metrics/resource",
    ];
    // Per path: each request's time, and the agent CPU of its blocks.
    let mut ms: Vec<Vec<f64>> = vec![Vec::with_capacity(requests); PATHS.len()];
    let mut spent_ms = [0.0f64; PATHS.len()];
    const ROUNDS: usize = 2;
    for round in 0..ROUNDS {
        for (i, path) in PATHS.iter().enumerate() {
            let block = requests / ROUNDS + usize::from(round < requests % ROUNDS);
            let t0 = cpu_ms(pid).unwrap_or_default();
            for _ in 0..block {
                let start = Instant::now();
                let (code, _) = agent.get(path);
                ms[i].push(start.elapsed().as_secs_f64() * 1000.0);
                assert_eq!(code, 200, "{path}");
            }
            spent_ms[i] += (cpu_ms(pid).unwrap_or_default() - t0).max(0.0);
        }
    }
    for (i, path) in PATHS.iter().enumerate() {
        let ms = &mut ms[i];
        ms.sort_by(f64::total_cmp);
        let pct = |p: f64| ms[((ms.len() - 1) as f64 * p).round() as usize];
        println!(
            "{path} with {pods} running pods: n = {}, p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, \
             max {:.2} ms (budget: p99 <= 10 ms for the summary, 20 ms for the metrics); agent \
             CPU {:.2} ms per request",
            ms.len(),
            pct(0.5),
            pct(0.9),
            pct(0.99),
            pct(1.0),
            spent_ms[i] / ms.len() as f64
        );
    }
    swiftlet_tests::remove_bench_pods(&agent, pods);
    ExitCode::SUCCESS
}
