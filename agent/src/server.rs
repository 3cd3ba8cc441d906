//! HTTP endpoints: `/healthz` on the healthz address; `/pods`, `/metrics`, `/healthz` and the
//! `/debug/...` views on the read-only port (127.0.0.1 only); the kubelet API over TLS
//! ([`kubelet_api`]).
pub mod container_logs;
pub mod kubelet_api;
pub mod streaming;
pub mod tls;
pub mod webhook;

use crate::config::file::Rejections;
use crate::ebpf::Monitor;
use crate::metrics::Metrics;
use crate::status::StatusManager;
use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::metrics::counter::Counter;
use std::net::SocketAddr;
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
#[error("binding {addr}: {source}")]
pub struct Error {
    addr: SocketAddr,
    #[source]
    source: std::io::Error,
}

#[derive(Clone)]
pub struct AppState {
    /// `/stats/summary`; `None` where the agent serves no stats (tests of other endpoints).
    pub stats: Option<crate::stats::Provider>,
    /// What `/healthz` checks, and the sync loop's threshold.
    pub health: crate::pleg::RuntimeState,
    pub sync_loop_threshold: std::time::Duration,
    pub status: StatusManager,
    pub metrics: Metrics,
    pub rejections: Rejections,
    pub ebpf: Option<Monitor>,
    pub tracer: crate::trace::Tracer,
}

/// The kubelet's `/healthz`: `ok` while every check passes; otherwise 500 and each check's
/// result (`[+]name ok`, `[-]name failed: why`). `?verbose` lists the checks when all pass too.
async fn healthz(State(s): State<AppState>, uri: axum::http::Uri) -> impl IntoResponse {
    let verbose = uri.query().is_some_and(|q| {
        q.split('&')
            .any(|kv| kv.split('=').next() == Some("verbose"))
    });
    let checks = s
        .health
        .health(tokio::time::Instant::now(), s.sync_loop_threshold);
    render_health(&checks, verbose)
}

fn render_health(
    checks: &[(&'static str, Result<(), crate::pleg::Unhealthy>)],
    verbose: bool,
) -> (axum::http::StatusCode, String) {
    let healthy = checks.iter().all(|(_, r)| r.is_ok());
    if healthy && !verbose {
        return (axum::http::StatusCode::OK, "ok".to_owned());
    }
    let mut body = String::new();
    for (name, r) in checks {
        match r {
            Ok(()) => body.push_str(&format!("[+]{name} ok\n")),
            Err(why) => body.push_str(&format!("[-]{name} failed: {why}\n")),
        }
    }
    if healthy {
        body.push_str("healthz check passed\n");
        (axum::http::StatusCode::OK, body)
    } else {
        body.push_str("healthz check failed\n");
        (axum::http::StatusCode::INTERNAL_SERVER_ERROR, body)
    }
}

async fn pods(State(s): State<AppState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        s.status.pods_json(),
    )
}

/// How old a summary the metric paths may serve: cAdvisor's housekeeping period, the age of
/// the kubelet's own answers there.
const METRICS_READING_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(10);

/// The pods a summary covers.
fn summary_pods(s: &AppState) -> Vec<crate::stats::PodEntry> {
    s.status
        .pods_started()
        .into_iter()
        .map(|(uid, pod, start)| crate::stats::PodEntry {
            uid,
            pod,
            start_time: start.map(|t| t.0),
        })
        .collect()
}

fn no_stats() -> axum::response::Response {
    (StatusCode::NOT_FOUND, "no stats provider\n").into_response()
}

/// `/stats/summary`: the node's and the pods' usage now (`crate::stats`).
async fn stats_summary(State(s): State<AppState>) -> axum::response::Response {
    match &s.stats {
        Some(provider) => Json(&*provider.summary(summary_pods(&s)).await).into_response(),
        None => no_stats(),
    }
}

/// A body in the Prometheus text format written from a summary at most
/// [`METRICS_READING_MAX_AGE`] old, shared by the metric paths.
async fn summary_metrics(
    s: &AppState,
    body: fn(&crate::stats::Summary) -> String,
) -> axum::response::Response {
    let Some(provider) = &s.stats else {
        return no_stats();
    };
    let summary = provider
        .recent(summary_pods(s), METRICS_READING_MAX_AGE)
        .await;
    (
        [(header::CONTENT_TYPE, crate::metrics::PROMETHEUS_TEXT)],
        body(&summary),
    )
        .into_response()
}

/// `/metrics/resource`: the same usage as the kubelet's resource metrics.
async fn resource_metrics(State(s): State<AppState>) -> axum::response::Response {
    summary_metrics(&s, crate::stats::Summary::resource_metrics).await
}

/// `/metrics/cadvisor`: cAdvisor's container metrics, from the same reads.
async fn cadvisor_metrics(State(s): State<AppState>) -> axum::response::Response {
    summary_metrics(&s, crate::stats::Summary::cadvisor_metrics).await
}

/// An OpenMetrics body as the request's `Accept` header asks: OpenMetrics, or else the
/// Prometheus text format.
fn negotiated(headers: &axum::http::HeaderMap, openmetrics: String) -> axum::response::Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    if crate::metrics::wants_openmetrics(accept) {
        (
            [(header::CONTENT_TYPE, crate::metrics::OPENMETRICS)],
            openmetrics,
        )
            .into_response()
    } else {
        (
            [(header::CONTENT_TYPE, crate::metrics::PROMETHEUS_TEXT)],
            crate::metrics::to_prometheus_text(&openmetrics),
        )
            .into_response()
    }
}

/// `/metrics/probes`: the prober's metrics of every probed container.
async fn probe_metrics(
    State(s): State<AppState>,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    negotiated(&headers, s.metrics.probes.encode())
}

/// Brings a counter mirroring a count kept elsewhere up to `value`.
fn catch_up(counter: &Counter, value: u64) {
    let counted = counter.get();
    if value > counted {
        counter.inc_by(value - counted);
    }
}

async fn metrics(
    State(s): State<AppState>,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    if let Some(m) = &s.ebpf {
        let (drains, empty) = m.reader_drains();
        catch_up(&s.metrics.ebpf_events_total, m.events_seen());
        catch_up(&s.metrics.ebpf_reader_drains_total, drains);
        catch_up(&s.metrics.ebpf_reader_empty_drains_total, empty);
        catch_up(&s.metrics.ebpf_reader_wakeups_total, m.reader_wakeups());
    }
    let alive = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    s.metrics
        .tokio_alive_tasks
        .set(i64::try_from(alive).unwrap_or(i64::MAX));
    if let Some(provider) = &s.stats {
        let claims: Vec<_> = provider
            .claim_volumes(&summary_pods(&s))
            .into_iter()
            .filter_map(|v| {
                let r = v.pvc_ref?;
                Some(crate::metrics::kubelet::ClaimVolume {
                    labels: crate::metrics::kubelet::ClaimLabels {
                        namespace: r.namespace,
                        persistentvolumeclaim: r.name,
                    },
                    values: [
                        v.capacity_bytes,
                        v.available_bytes,
                        v.used_bytes,
                        v.inodes,
                        v.inodes_free,
                        v.inodes_used,
                    ],
                })
            })
            .collect();
        s.metrics.kubelet.volume_stats.set(&claims);
    }
    negotiated(&headers, s.metrics.encode())
}

#[derive(serde::Serialize)]
struct Rejection {
    path: String,
    error: String,
}

async fn manifests(State(s): State<AppState>) -> Json<Vec<Rejection>> {
    let list = s
        .rejections
        .read()
        .map(|r| {
            r.iter()
                .map(|(p, e)| Rejection {
                    path: p.display().to_string(),
                    error: e.clone(),
                })
                .collect()
        })
        .unwrap_or_default();
    Json(list)
}

async fn ebpf_cgroups(State(s): State<AppState>) -> impl IntoResponse {
    match &s.ebpf {
        Some(m) => Json(m.recent_cgroup_events()).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            "eBPF probes are not loaded (see --ebpf)\n",
        )
            .into_response(),
    }
}

/// Written one pod at a time (`Tracer::view_json_pieces`): the timelines can hold thousands of
/// pods, and a read must not copy them all.
async fn trace_pods(State(s): State<AppState>) -> impl IntoResponse {
    let pieces = s
        .tracer
        .view_json_pieces()
        .map(|p| Ok::<_, std::convert::Infallible>(bytes::Bytes::from(p)));
    (
        [(header::CONTENT_TYPE, "application/json")],
        axum::body::Body::from_stream(futures::stream::iter(pieces)),
    )
}

/// Binds both servers (so a taken port fails the start) and serves until `cancel`.
pub async fn start(
    healthz_addr: Option<SocketAddr>,
    read_only_addr: Option<SocketAddr>,
    state: AppState,
    tracker: &tokio_util::task::TaskTracker,
    cancel: CancellationToken,
) -> Result<(), Error> {
    let bind = |addr: SocketAddr| async move {
        tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| Error { addr, source })
    };
    // Both ports listen before either serves: a client that saw /healthz answer can reach the
    // read-only port at once (its connections wait in the backlog until it serves).
    let healthz_listener = match healthz_addr {
        Some(addr) => Some((addr, bind(addr).await?)),
        None => None,
    };
    let read_only_listener = match read_only_addr {
        Some(addr) => Some((addr, bind(addr).await?)),
        None => None,
    };
    if let Some((addr, listener)) = healthz_listener {
        let app = Router::new()
            .route("/healthz", get(healthz))
            .with_state(state.clone());
        let c = cancel.clone();
        tracker.spawn(async move {
            if let Err(e) = axum::serve(listener, app)
                .with_graceful_shutdown(c.cancelled_owned())
                .await
            {
                tracing::error!(%e, "healthz server");
            }
        });
        tracing::info!(%addr, "healthz server listening");
    }
    if let Some((addr, listener)) = read_only_listener {
        tracing::warn!(%addr, "the read-only port is on: it serves pod specs (env values included) without authentication to every local user");
        let app = Router::new()
            .route("/healthz", get(healthz))
            .route("/pods", get(pods))
            .route("/metrics", get(metrics))
            .route("/stats/summary", get(stats_summary))
            .route("/metrics/resource", get(resource_metrics))
            .route("/metrics/cadvisor", get(cadvisor_metrics))
            .route("/metrics/probes", get(probe_metrics))
            .route("/debug/manifests", get(manifests))
            .route("/debug/ebpf/cgroups", get(ebpf_cgroups))
            .route("/debug/trace/pods", get(trace_pods))
            .with_state(state);
        tracker.spawn(async move {
            if let Err(e) = axum::serve(listener, app)
                .with_graceful_shutdown(cancel.cancelled_owned())
                .await
            {
                tracing::error!(%e, "read-only server");
            }
        });
        tracing::info!(%addr, "read-only server listening");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthz_says_ok_or_lists_the_checks_with_the_failing_ones_reason() {
        let ok: Vec<(&'static str, Result<(), crate::pleg::Unhealthy>)> =
            vec![("ping", Ok(())), ("syncloop", Ok(())), ("runtime", Ok(()))];
        assert_eq!(
            render_health(&ok, false),
            (axum::http::StatusCode::OK, "ok".into())
        );
        let (code, body) = render_health(&ok, true);
        assert_eq!(code, axum::http::StatusCode::OK);
        assert_eq!(
            body,
            "[+]ping ok\n[+]syncloop ok\n[+]runtime ok\nhealthz check passed\n"
        );
        let bad = vec![
            ("ping", Ok(())),
            (
                "runtime",
                Err(crate::pleg::Unhealthy::Relist {
                    ago: std::time::Duration::from_secs(240),
                    error: None,
                }),
            ),
        ];
        let (code, body) = render_health(&bad, false);
        assert_eq!(code, axum::http::StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            body,
            "[+]ping ok\n[-]runtime failed: the runtime last answered a relist 240s ago; threshold is 180s\nhealthz check failed\n"
        );
    }
}
