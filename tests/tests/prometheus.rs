//! A real Prometheus (the `prometheus` of the Debian package) scrapes the kubelet API of an agent
//! on the real containerd the way a cluster's monitoring does: over TLS, with a client
//! certificate signed by `--client-ca-file`, one job per endpoint (`/metrics`,
//! `/metrics/cadvisor`, `/metrics/probes`, `/metrics/resource`) every second. Every target is up,
//! and the PromQL queries of a kubelet dashboard answer what the test's two pods make true: the
//! node's name, the running pods and containers, the pod start and PLEG relist histograms, the
//! sandboxes run, the agent's own process, each container's CPU and working set with its image
//! and id (cAdvisor's names and labels), the successful readiness probes of the probed pod, and
//! the resource metrics' working set. `promtool check metrics` passes on each endpoint's body.
//!
//! Without `prometheus` or `promtool` on PATH the test is skipped, unless
//! `SWIFTLET_REQUIRE_RUNTIME=1`, where it fails.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use swiftlet_tests::kubelet_client::{client, current_thread, kubelet_api_options, request};
use swiftlet_tests::{Agent, Runtime, find_tool};

/// How long the pods may take to run, and Prometheus to answer every query as it should.
const TIMEOUT: Duration = Duration::from_secs(60);

/// The scrape jobs: a job's name and the endpoint it scrapes.
const JOBS: [(&str, &str); 4] = [
    ("metrics", "/metrics"),
    ("cadvisor", "/metrics/cadvisor"),
    ("probes", "/metrics/probes"),
    ("resource", "/metrics/resource"),
];

/// One series of an instant query's answer.
#[derive(Debug)]
struct Sample {
    labels: BTreeMap<String, String>,
    value: f64,
}

impl Sample {
    /// Label `name`'s value ("" when it has none).
    fn label(&self, name: &str) -> &str {
        self.labels.get(name).map_or("", String::as_str)
    }
}

/// A Prometheus server of the test's own, on a free loopback port; killed when dropped.
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
}

impl Prometheus {
    /// Starts `binary` with its config, data and log in `dir`, scraping every job of [`JOBS`]
    /// from `target` with the CA and alice's certificate of [`kubelet_api_options`] (in `dir`).
    fn start(binary: &Path, dir: &Path, target: SocketAddr) -> Prometheus {
        let file = |name: &str| format!("{:?}", dir.join(name).display().to_string());
        let tls = format!(
            "{{ca_file: {}, cert_file: {}, key_file: {}}}",
            file("ca.pem"),
            file("alice.pem"),
            file("alice.key")
        );
        let jobs: String = JOBS
            .iter()
            .map(|(job, path)| {
                format!(
                    "- job_name: {job}\n  metrics_path: {path}\n  scheme: https\n  \
                     tls_config: {tls}\n  static_configs: [{{targets: ['{target}']}}]\n"
                )
            })
            .collect();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!("global: {{scrape_interval: 1s, scrape_timeout: 1s}}\nscrape_configs:\n{jobs}"),
        )
        .expect("writing prometheus.yml");
        let port = xtask::free_loopback_port().expect("a free port");
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let log = dir.join("prometheus.log");
        let out = std::fs::File::create(&log).expect("creating prometheus.log");
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("a second handle of prometheus.log"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
        Prometheus { child, addr, log }
    }

    /// `GET path` on its HTTP API: the body of a 200.
    fn get(&self, path: &str) -> Result<String, String> {
        let r = xtask::http::get(self.addr, path, Duration::from_secs(10))
            .map_err(|e| e.to_string())?;
        if r.status == 200 {
            Ok(r.body)
        } else {
            Err(format!("GET {path} answered {}: {}", r.status, r.body))
        }
    }

    /// The series of the instant query `query` (a vector's, or a scalar's as one series without
    /// labels).
    fn query(&self, query: &str) -> Result<Vec<Sample>, String> {
        let body = self.get(&format!("/api/v1/query?query={}", encode(query)))?;
        let v: serde_json::Value =
            serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
        let data = &v["data"];
        let results = match data["resultType"].as_str() {
            Some("vector") => data["result"].as_array().cloned().unwrap_or_default(),
            Some("scalar") => vec![serde_json::json!({"metric": {}, "value": data["result"]})],
            _ => return Err(format!("not a vector or a scalar: {body}")),
        };
        results
            .iter()
            .map(|r| {
                let labels = r["metric"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                    .collect();
                let value = r["value"][1]
                    .as_str()
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| format!("a series without a value: {r}"))?;
                Ok(Sample { labels, value })
            })
            .collect()
    }

    /// What a failed query is read with: the `up` series and each target's health and last
    /// scrape error, or why they could not be read (and the end of Prometheus' log).
    fn explain(&mut self) -> String {
        let up = match self.query("up") {
            Ok(series) => series
                .iter()
                .map(|s| format!("{}={}", s.label("job"), s.value))
                .collect::<Vec<_>>()
                .join(" "),
            Err(e) => e,
        };
        let targets = match self.get("/api/v1/targets") {
            Ok(body) => serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["data"]["activeTargets"].as_array().cloned())
                .unwrap_or_default()
                .iter()
                .map(|t| {
                    format!(
                        "{} {} lastError={:?}",
                        t["labels"]["job"].as_str().unwrap_or_default(),
                        t["health"].as_str().unwrap_or_default(),
                        t["lastError"].as_str().unwrap_or_default()
                    )
                })
                .collect::<Vec<_>>()
                .join("; "),
            Err(e) => e,
        };
        let exited = match self.child.try_wait() {
            Ok(Some(status)) => format!("prometheus exited ({status}); "),
            _ => String::new(),
        };
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(15).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        format!(
            "{exited}up: [{up}]; targets: [{targets}]; {}:\n{}",
            self.log.display(),
            tail.join("\n")
        )
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `s` percent-encoded for a query string (every byte but the unreserved ones).
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// What a query's answer must hold.
type Holds = dyn Fn(&[Sample]) -> bool;

/// A query and what its answer must hold.
struct Check {
    query: String,
    /// What is expected, for the failure message.
    want: String,
    holds: Box<Holds>,
}

impl Check {
    fn new(query: String, want: &str, holds: impl Fn(&[Sample]) -> bool + 'static) -> Self {
        Check {
            query,
            want: want.to_owned(),
            holds: Box::new(holds),
        }
    }

    /// A series of `query` with a value of `min` or more.
    fn at_least(query: String, min: f64) -> Self {
        let want = format!("a series of {min} or more");
        Check::new(query, &want, move |s| s.iter().any(|s| s.value >= min))
    }

    /// A series of `query` with a value above 0.
    fn positive(query: String) -> Self {
        Check::new(query, "a series above 0", |s| {
            s.iter().any(|s| s.value > 0.0)
        })
    }
}

#[test]
fn prometheus_scrapes_the_kubelet_api_and_answers_a_dashboards_queries() {
    let install = "apt-get install prometheus";
    let (Some(prometheus), Some(promtool)) = (
        find_tool("prometheus", install),
        find_tool("promtool", install),
    ) else {
        return;
    };
    let Some(rt) = Runtime::shared() else { return };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (mut opts, port) = kubelet_api_options(d, "prometheus");
    // The PLEG relists every second, as the kubelet's does, also while the eBPF probes report
    // every exit (it then relists once a minute by default, and the dashboard's quantile of the
    // relist histogram's rate over a minute would have nothing to read).
    opts.extra_args
        .extend(["--pleg-safety-net-period".to_owned(), "0s".to_owned()]);
    let agent = Agent::start(rt, opts);
    let target = SocketAddr::from(([127, 0, 0, 1], port));
    let node = agent.node_name().to_owned();
    let readiness =
        "    readinessProbe:\n      exec: {command: [\"true\"]}\n      periodSeconds: 1\n";
    // The sleeper has a cpu limit and spins a moment first, so the CFS quota holds it back.
    agent.write_manifest(
        "sleeper.yaml",
        &agent.busybox_pod(
            "sleeper",
            "",
            "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; sleep 3600 & wait",
            "    resources:\n      limits: {cpu: 100m}\n",
        ),
    );
    // The probed pod has an emptyDir, whose set-up the storage operation histogram times.
    agent.write_manifest(
        "probed.yaml",
        &agent.busybox_pod(
            "probed",
            "  volumes:\n  - {name: scratch, emptyDir: {}}\n",
            "sleep 3600 & wait",
            &format!(
                "{readiness}    volumeMounts:\n    - {{name: scratch, mountPath: /scratch}}\n"
            ),
        ),
    );
    let sleeper = agent.static_pod_name("sleeper");
    let probed = agent.static_pod_name("probed");
    agent.wait_for(|l| l.is_running(&sleeper) && l.is_running(&probed), TIMEOUT);

    let mut server = Prometheus::start(&prometheus, d, target);
    let mut checks = vec![
        Check::new("up".to_owned(), "1 for each of the four jobs", |s| {
            JOBS.iter()
                .all(|(job, _)| s.iter().any(|s| s.label("job") == *job && s.value == 1.0))
        }),
        Check::new(
            "kubelet_node_name".to_owned(),
            "1 for the agent's node",
            move |s| s.iter().any(|s| s.label("node") == node && s.value == 1.0),
        ),
        Check::at_least("kubelet_running_pods".to_owned(), 2.0),
        Check::new(
            "histogram_quantile(0.99, sum(rate(kubelet_pleg_relist_duration_seconds_bucket[1m])) by (le))"
                .to_owned(),
            "a finite number",
            |s| s.iter().any(|s| s.value.is_finite()),
        ),
        Check::at_least("kubelet_pod_start_duration_seconds_count".to_owned(), 2.0),
        Check::at_least(
            r#"kubelet_runtime_operations_total{operation_type="run_podsandbox"}"#.to_owned(),
            2.0,
        ),
        Check::at_least(
            r#"kubelet_running_containers{container_state="running"}"#.to_owned(),
            2.0,
        ),
    ];
    // The kubelet dashboard's storage operation rate.
    checks.push(Check::positive(
        r#"sum(storage_operation_duration_seconds_count{job="metrics",operation_name="volume_mount",volume_plugin="kubernetes.io/empty-dir",status="success"})"#
            .to_owned(),
    ));
    for name in ["process_resident_memory_bytes", "process_cpu_seconds_total"] {
        checks.push(Check::positive(format!(r#"{name}{{job="metrics"}}"#)));
    }
    for pod in [&sleeper, &probed] {
        checks.push(Check::new(
            format!(
                r#"container_cpu_usage_seconds_total{{job="cadvisor",namespace="default",pod="{pod}",container="main"}}"#
            ),
            "a series of 0 or more with non-empty `image` and `id` labels",
            |s| {
                s.iter().any(|s| {
                    s.value >= 0.0 && !s.label("image").is_empty() && !s.label("id").is_empty()
                })
            },
        ));
        checks.push(Check::positive(format!(
            r#"container_memory_working_set_bytes{{job="cadvisor",pod="{pod}",container="main"}}"#
        )));
        checks.push(Check::positive(format!(
            r#"container_memory_working_set_bytes{{job="resource",pod="{pod}"}}"#
        )));
    }
    // The throttling the CPUThrottlingHigh alert divides, on either cgroup hierarchy.
    for name in [
        "container_cpu_cfs_periods_total",
        "container_cpu_cfs_throttled_periods_total",
    ] {
        checks.push(Check::positive(format!(
            r#"{name}{{job="cadvisor",pod="{sleeper}",container="main"}}"#
        )));
    }
    checks.push(Check::new(
        format!(
            r#"prober_probe_total{{job="probes",probe_type="Readiness",result="successful",namespace="default",pod="{probed}",container="main"}}"#
        ),
        "a series above 0 with a `pod_uid` label",
        |s| s.iter().any(|s| s.value > 0.0 && !s.label("pod_uid").is_empty()),
    ));

    // Every check is asked again until it holds; those still failing at the deadline are
    // reported together.
    let started = Instant::now();
    let mut remaining: Vec<&Check> = checks.iter().collect();
    let answered = agent.try_eventually(TIMEOUT, || {
        let mut failing = Vec::new();
        remaining.retain(|check| {
            let last = match server.query(&check.query) {
                Ok(series) if (check.holds)(&series) => return false,
                Ok(series) => format!("{series:?}"),
                Err(e) => e,
            };
            failing.push(format!(
                "`{}` should answer {}; its last answer: {last}",
                check.query, check.want
            ));
            true
        });
        if failing.is_empty() {
            Ok(())
        } else {
            Err(failing.join("\n"))
        }
    });
    if let Err(why) = answered {
        panic!(
            "within {TIMEOUT:?} of Prometheus' start:\n{why}\n{}",
            server.explain()
        );
    }
    println!(
        "every query answered as it should {:?} after Prometheus' start",
        started.elapsed()
    );

    // Each endpoint's body as alice fetches it, through promtool's linter (every endpoint's
    // findings in one failure).
    let alice = client(d, Some("alice"));
    let tokio = current_thread();
    let mut findings = Vec::new();
    for (job, path) in JOBS {
        let (code, body) = tokio
            .block_on(request(&alice, target, "GET", path))
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        assert_eq!(code, 200, "GET {path}: {body}");
        // Beside the agent's log, where it outlives the test.
        let file = agent.log_path().with_extension(format!("{job}.txt"));
        std::fs::write(&file, &body).expect("writing a body");
        let out = Command::new(&promtool)
            .args(["check", "metrics"])
            .stdin(std::fs::File::open(&file).expect("opening a body"))
            .output()
            .expect("promtool runs");
        if !out.status.success() {
            findings.push(format!(
                "promtool check metrics on {path} (body in {}) {}:\n{}{}",
                file.display(),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    assert!(findings.is_empty(), "{}", findings.join("\n"));
}
