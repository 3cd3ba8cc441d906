//! The `swiftlet.v1.PodTrace` gRPC service, served on a unix socket (`<root-dir>/pod-trace.sock`).

use std::path::{Path, PathBuf};
use std::pin::Pin;

use swiftlet_proto::v1 as proto;
use swiftlet_proto::v1::pod_trace_server::{PodTrace, PodTraceServer};
use tokio_stream::{Stream, StreamExt as _, wrappers::BroadcastStream};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::Tracer;

/// File name of the socket under the agent's root directory.
pub const SOCKET_NAME: &str = "pod-trace.sock";

/// The socket of the agent whose root directory is `root_dir`.
pub fn socket_path(root_dir: &Path) -> PathBuf {
    root_dir.join(SOCKET_NAME)
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("binding the PodTrace socket {path}: {source}")]
    Bind {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The service implementation over a [`Tracer`].
#[derive(Clone, Debug)]
pub struct Service {
    tracer: Tracer,
}

impl Service {
    pub fn new(tracer: Tracer) -> Self {
        Self { tracer }
    }
}

type TimelineStream = Pin<Box<dyn Stream<Item = Result<proto::PodTimeline, Status>> + Send>>;

#[tonic::async_trait]
impl PodTrace for Service {
    async fn get_pod_timeline(
        &self,
        request: Request<proto::GetPodTimelineRequest>,
    ) -> Result<Response<proto::PodTimeline>, Status> {
        let uid = request.into_inner().uid;
        match self.tracer.pod(&uid) {
            Some(pod) => Ok(Response::new(self.tracer.to_proto(&pod))),
            None => Err(Status::not_found(format!(
                "no timeline for pod UID {uid:?}"
            ))),
        }
    }

    async fn list_pod_timelines(
        &self,
        _request: Request<proto::ListPodTimelinesRequest>,
    ) -> Result<Response<proto::ListPodTimelinesResponse>, Status> {
        Ok(Response::new(proto::ListPodTimelinesResponse {
            timelines: self
                .tracer
                .pods()
                .iter()
                .map(|p| self.tracer.to_proto(p))
                .collect(),
            events_lost: self.tracer.events_lost(),
            probes_loaded: self.tracer.probes_loaded(),
        }))
    }

    type WatchPodTimelinesStream = TimelineStream;

    async fn watch_pod_timelines(
        &self,
        _request: Request<proto::WatchPodTimelinesRequest>,
    ) -> Result<Response<Self::WatchPodTimelinesStream>, Status> {
        // Subscribe first so nothing falls between the snapshot and the live updates.
        let live = BroadcastStream::new(self.tracer.subscribe()).filter_map(|item| match item {
            Ok(timeline) => Some(Ok(timeline)),
            // A slow watcher misses updates; later ones carry the full timeline anyway.
            Err(_lagged) => None,
        });
        let known: Vec<_> = self
            .tracer
            .pods()
            .iter()
            .filter(|p| p.running_observed_ns.is_some())
            .map(|p| Ok(self.tracer.to_proto(p)))
            .collect();
        let stream = tokio_stream::iter(known).chain(live);
        Ok(Response::new(Box::pin(stream)))
    }
}

/// Binds the socket (replacing a stale one) and serves until `cancel`.
pub fn start(
    path: &Path,
    tracer: Tracer,
    tracker: &tokio_util::task::TaskTracker,
    cancel: CancellationToken,
) -> Result<(), Error> {
    let bind_err = |source| Error::Bind {
        path: path.to_path_buf(),
        source,
    };
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(bind_err(e)),
    }
    let listener = tokio::net::UnixListener::bind(path).map_err(bind_err)?;
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    let service = PodTraceServer::new(Service::new(tracer));
    let shown = path.display().to_string();
    let socket = path.to_path_buf();
    tracker.spawn(async move {
        let served = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(incoming, cancel.cancelled_owned())
            .await;
        if let Err(error) = served {
            tracing::error!(%error, "PodTrace gRPC server");
        }
        let _ = std::fs::remove_file(&socket);
    });
    tracing::info!(socket = %shown, "PodTrace gRPC server listening");
    Ok(())
}
