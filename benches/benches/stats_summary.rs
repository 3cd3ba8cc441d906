//! `/stats/summary` with N running pods (default 100), against the real containerd: the latency
//! of one GET on the read-only port (the kubelet API serves the same handler behind TLS), and
//! the agent CPU each costs (utime + stime of the agent over all the GETs, divided by their
//! count).
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
    let t0 = cpu_ms(pid).unwrap_or_default();
    let mut ms: Vec<f64> = Vec::with_capacity(requests);
    for _ in 0..requests {
        let start = Instant::now();
        let (code, _) = agent.get("/stats/summary");
        ms.push(start.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(code, 200);
    }
    let spent_ms = (cpu_ms(pid).unwrap_or_default() - t0).max(0.0);
    ms.sort_by(f64::total_cmp);
    let pct = |p: f64| ms[((ms.len() - 1) as f64 * p).round() as usize];
    println!(
        "/stats/summary with {pods} running pods: n = {requests}, p50 {:.2} ms, p90 {:.2} ms, \
         p99 {:.2} ms, max {:.2} ms (budget: p99 <= 10 ms); agent CPU {:.2} ms per request",
        pct(0.5),
        pct(0.9),
        pct(0.99),
        pct(1.0),
        spent_ms / requests as f64
    );
    swiftlet_tests::remove_bench_pods(&agent, pods);
    ExitCode::SUCCESS
}
