//! An OTLP/gRPC trace receiver on loopback (the OpenTelemetry protobuf definitions served with
//! tonic): what a collector would be sent, for the trace tests and the benches that export.
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};

/// A receiver serving on a thread of its own until the process ends: every export request it
/// is sent, in order, on `requests`.
pub struct Receiver {
    pub addr: std::net::SocketAddr,
    pub requests: std::sync::mpsc::Receiver<ExportTraceServiceRequest>,
}

struct Collector(std::sync::Mutex<std::sync::mpsc::Sender<ExportTraceServiceRequest>>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let _ = self
            .0
            .lock()
            .expect("the collector's sender")
            .send(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Receiver {
    /// # Panics
    /// When no loopback port can be had.
    pub fn start() -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        listener.set_nonblocking(true).expect("non-blocking");
        let addr = listener.local_addr().expect("its address");
        let (tx, requests) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a tokio runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                let _ = tonic::transport::Server::builder()
                    .add_service(TraceServiceServer::new(Collector(std::sync::Mutex::new(
                        tx,
                    ))))
                    .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                    .await;
            });
        });
        Self { addr, requests }
    }
}
