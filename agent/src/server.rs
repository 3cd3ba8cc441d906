//! HTTP endpoints: `/healthz` on the healthz address; `/pods`, `/metrics`, `/healthz` and the
//! `/debug/...` views on the read-only port (127.0.0.1 only).
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
    pub status: StatusManager,
    pub metrics: Metrics,
    pub rejections: Rejections,
    pub ebpf: Option<Monitor>,
    pub tracer: crate::trace::Tracer,
}

async fn healthz() -> &'static str {
    "ok"
}

async fn pods(State(s): State<AppState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        s.status.pods_json(),
    )
}

/// Brings a counter mirroring a count kept elsewhere up to `value`.
fn catch_up(counter: &Counter, value: u64) {
    let counted = counter.get();
    if value > counted {
        counter.inc_by(value - counted);
    }
}

async fn metrics(State(s): State<AppState>) -> impl IntoResponse {
    if let Some(m) = &s.ebpf {
        let (drains, empty) = m.reader_drains();
        catch_up(&s.metrics.ebpf_events_total, m.events_seen());
        catch_up(&s.metrics.ebpf_reader_drains_total, drains);
        catch_up(&s.metrics.ebpf_reader_empty_drains_total, empty);
    }
    let alive = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    s.metrics
        .tokio_alive_tasks
        .set(i64::try_from(alive).unwrap_or(i64::MAX));
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.metrics.encode(),
    )
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

async fn trace_pods(State(s): State<AppState>) -> Json<crate::trace::TraceView> {
    Json(s.tracer.view())
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
    if let Some(addr) = healthz_addr {
        let listener = bind(addr).await?;
        let app = Router::new().route("/healthz", get(healthz));
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
    if let Some(addr) = read_only_addr {
        let listener = bind(addr).await?;
        tracing::warn!(%addr, "the read-only port is on: it serves pod specs (env values included) without authentication to every local user");
        let app = Router::new()
            .route("/healthz", get(healthz))
            .route("/pods", get(pods))
            .route("/metrics", get(metrics))
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
