//! Pod starts exported as OpenTelemetry traces over OTLP/gRPC (`tracing.endpoint`,
//! `tracing.samplingRatePerMillion` of the config file, as the kubelet's fields).
//!
//! Each sampled pod start is one trace, sent once its timeline is complete (when it feeds the
//! phase histograms): a root span `pod_start` from the source's first sight of the pod to the
//! end of its breakdown, a child span for every phase of the breakdown (consecutive, so they add
//! up to the root's duration) and a client span for every CRI call made for the pod, named as
//! the gRPC method (`runtime.v1.RuntimeService/RunPodSandbox`). Spans carry the pod's name,
//! namespace and UID, and a container's name where the phase is one container's.
//!
//! The sync path only offers a copy of the record to a bounded queue (never waits); a task
//! batches records and exports them with a deadline. A record that finds the queue full, or a
//! batch the collector does not take, is dropped and its spans counted
//! (`swiftlet_otlp_spans_dropped_total{reason}`): traces are worth less than the pods.
use super::timeline::{Phase, PodRecord};
use crate::metrics::Metrics;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, span, status};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Pod records waiting for export; more are dropped.
const QUEUE: usize = 512;
/// Records sent in one export at most.
const BATCH: usize = 64;
/// How long the first record of a batch waits for others.
const BATCH_WAIT: Duration = Duration::from_millis(500);
/// The deadline of one export.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("tracing.endpoint {endpoint:?}: {source}")]
    Endpoint {
        endpoint: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("tracing.samplingRatePerMillion {0} is over 1000000")]
    SamplingRate(u32),
}

/// Where the offered records go. Cheap to clone.
#[derive(Clone)]
pub struct Sink {
    tx: mpsc::Sender<PodRecord>,
    sampling_per_million: u32,
    metrics: Metrics,
}

/// Whether the pod `uid`'s start is sampled at `per_million`: a stable choice by the UID, so a
/// pod is in or out whichever record of it is offered.
fn sampled(uid: &str, per_million: u32) -> bool {
    if per_million >= 1_000_000 {
        return true;
    }
    fnv1a(FNV_OFFSET, uid.bytes()) % 1_000_000 < u64::from(per_million)
}

/// FNV-1a's starting value.
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a of `bytes` from `h`: stable across builds and runs, unlike the std hasher's keys.
fn fnv1a(mut h: u64, bytes: impl IntoIterator<Item = u8>) -> u64 {
    for b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

impl Sink {
    /// Queues `pod`'s start for export when it is sampled; never waits.
    pub fn offer(&self, pod: &PodRecord) {
        if !sampled(&pod.uid, self.sampling_per_million) {
            return;
        }
        if let Err(e) = self.tx.try_send(pod.clone()) {
            let pod = e.into_inner();
            self.dropped("queue_full", spans_of(&pod));
        }
    }

    fn dropped(&self, reason: &'static str, spans: usize) {
        self.metrics
            .otlp_spans_dropped_total
            .get_or_create(&crate::metrics::ReasonLabel { reason })
            .inc_by(spans as u64);
    }
}

/// Starts the exporter to `endpoint` (`host:port`, or a URL), sampling `per_million` of pod
/// starts; it stops with `cancel`.
pub fn start(
    endpoint: &str,
    per_million: u32,
    node_name: &str,
    metrics: Metrics,
    tracker: &tokio_util::task::TaskTracker,
    cancel: CancellationToken,
) -> Result<Sink, Error> {
    if per_million > 1_000_000 {
        return Err(Error::SamplingRate(per_million));
    }
    let url = if endpoint.contains("://") {
        endpoint.to_owned()
    } else {
        format!("http://{endpoint}")
    };
    let channel = tonic::transport::Endpoint::from_shared(url)
        .map_err(|source| Error::Endpoint {
            endpoint: endpoint.to_owned(),
            source,
        })?
        .connect_timeout(EXPORT_TIMEOUT)
        .timeout(EXPORT_TIMEOUT)
        .connect_lazy();
    let (tx, rx) = mpsc::channel(QUEUE);
    let sink = Sink {
        tx,
        sampling_per_million: per_million,
        metrics,
    };
    let exporter = Exporter {
        client: TraceServiceClient::new(channel),
        resource: Resource {
            attributes: vec![
                attr("service.name", "swiftlet"),
                attr("host.name", node_name),
                attr("k8s.node.name", node_name),
            ],
            ..Default::default()
        },
        sink: sink.clone(),
    };
    tracker.spawn(exporter.run(rx, cancel));
    tracing::info!(endpoint, per_million, "exporting pod starts over OTLP");
    Ok(sink)
}

struct Exporter {
    client: TraceServiceClient<tonic::transport::Channel>,
    resource: Resource,
    sink: Sink,
}

impl Exporter {
    async fn run(mut self, mut rx: mpsc::Receiver<PodRecord>, cancel: CancellationToken) {
        loop {
            let first = tokio::select! {
                () = cancel.cancelled() => return,
                pod = rx.recv() => match pod {
                    Some(pod) => pod,
                    None => return,
                },
            };
            let mut batch = vec![first];
            let until = tokio::time::Instant::now() + BATCH_WAIT;
            while batch.len() < BATCH {
                match tokio::time::timeout_at(until, rx.recv()).await {
                    Ok(Some(pod)) => batch.push(pod),
                    _ => break,
                }
            }
            self.export(&batch).await;
        }
    }

    async fn export(&mut self, batch: &[PodRecord]) {
        let offset = unix_offset_ns();
        let spans: Vec<Span> = batch.iter().flat_map(|p| spans(p, offset)).collect();
        let n = spans.len();
        let request = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(self.resource.clone()),
                scope_spans: vec![ScopeSpans {
                    scope: Some(InstrumentationScope {
                        name: "swiftlet".into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                        ..Default::default()
                    }),
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        match self.client.export(request).await {
            Ok(_) => {
                self.sink.metrics.otlp_spans_exported_total.inc_by(n as u64);
            }
            Err(status) => {
                tracing::warn!(spans = n, error = %status, "OTLP export failed; these spans are dropped");
                self.sink.dropped("export_failed", n);
            }
        }
    }
}

/// What to add to a CLOCK_MONOTONIC time (the records' clock) to make it Unix time, now.
fn unix_offset_ns() -> i128 {
    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128);
    unix - i128::from(super::monotonic_ns())
}

fn attr(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.to_owned())),
        }),
        ..Default::default()
    }
}

/// An ID of `len` bytes for `what` of the pod start `seed` (FNV-1a over both, repeated).
fn id(seed: &str, what: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let mut h = FNV_OFFSET ^ what;
    let mut round = 0u8;
    while out.len() < len {
        h = fnv1a(h, seed.bytes().chain([round]));
        out.extend_from_slice(&h.to_be_bytes());
        round += 1;
    }
    out.truncate(len);
    out
}

/// How many spans the pod's trace has.
fn spans_of(pod: &PodRecord) -> usize {
    let phases = pod.breakdown();
    if phases.is_empty() {
        0
    } else {
        1 + phases.len() + pod.cri.iter().filter(|c| c.end_ns.is_some()).count()
    }
}

/// The gRPC service of a CRI method.
fn cri_service(method: &str) -> &'static str {
    match method {
        "PullImage" | "ImageStatus" | "ListImages" | "RemoveImage" | "ImageFsInfo" => {
            "runtime.v1.ImageService"
        }
        _ => "runtime.v1.RuntimeService",
    }
}

/// The container a phase is of (`exec/app` is `app`'s), if any.
fn phase_container(phase: &Phase) -> Option<&str> {
    let (_, last) = phase.name.rsplit_once('/')?;
    (phase.kind != phase.name).then_some(last)
}

/// The pod start's spans, times moved to Unix time by `offset`; none before the pod has a
/// breakdown.
pub fn spans(pod: &PodRecord, offset: i128) -> Vec<Span> {
    let phases = pod.breakdown();
    let (Some(first), Some(last)) = (phases.first(), phases.last()) else {
        return Vec::new();
    };
    let unix = |ns: u64| u64::try_from(i128::from(ns) + offset).unwrap_or_default();
    let seed = format!("{}/{}", pod.uid, pod.admitted_ns.unwrap_or_default());
    let trace_id = id(&seed, 0, 16);
    let root_id = id(&seed, 1, 8);
    let pod_attrs = [
        attr("k8s.pod.name", &pod.name),
        attr("k8s.namespace.name", &pod.namespace),
        attr("k8s.pod.uid", &pod.uid),
    ];
    let child = |n: u64, name: String, start: u64, end: u64, mut attributes: Vec<KeyValue>| {
        attributes.extend(pod_attrs.iter().cloned());
        Span {
            trace_id: trace_id.clone(),
            span_id: id(&seed, n, 8),
            parent_span_id: root_id.clone(),
            name,
            kind: span::SpanKind::Internal as i32,
            start_time_unix_nano: unix(start),
            end_time_unix_nano: unix(end),
            attributes,
            ..Default::default()
        }
    };
    let mut out = Vec::with_capacity(1 + phases.len() + pod.cri.len());
    out.push(Span {
        trace_id: trace_id.clone(),
        span_id: root_id.clone(),
        name: "pod_start".into(),
        kind: span::SpanKind::Internal as i32,
        start_time_unix_nano: unix(first.start_ns),
        end_time_unix_nano: unix(last.end_ns),
        attributes: pod_attrs.to_vec(),
        ..Default::default()
    });
    let mut n = 2;
    for phase in &phases {
        let mut attributes = vec![
            attr("swiftlet.phase", &phase.kind),
            attr("swiftlet.observer", phase.observer.as_str()),
        ];
        if let Some(c) = phase_container(phase) {
            attributes.push(attr("k8s.container.name", c));
        }
        out.push(child(
            n,
            phase.name.clone(),
            phase.start_ns,
            phase.end_ns,
            attributes,
        ));
        n += 1;
    }
    for call in &pod.cri {
        let Some(end) = call.end_ns else { continue };
        let service = cri_service(call.method);
        let mut span = child(
            n,
            format!("{service}/{}", call.method),
            call.begin_ns,
            end,
            vec![
                attr("rpc.system", "grpc"),
                attr("rpc.service", service),
                attr("rpc.method", call.method),
            ],
        );
        span.kind = span::SpanKind::Client as i32;
        if call.ok == Some(false) {
            span.status = Some(opentelemetry_proto::tonic::trace::v1::Status {
                code: status::StatusCode::Error as i32,
                ..Default::default()
            });
        }
        out.push(span);
        n += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::timeline::CriSpan;

    fn record() -> PodRecord {
        let mut p = PodRecord::new("0f1e2d3c-aaaa-bbbb-cccc-000000000001");
        p.name = "web".into();
        p.namespace = "shop".into();
        p.containers = vec!["app".into()];
        p.source_seen_ns = Some(1_000);
        p.admitted_ns = Some(2_000);
        p.worker_started_ns = Some(3_000);
        p.cri = vec![
            CriSpan {
                method: "RunPodSandbox",
                begin_ns: 4_000,
                end_ns: Some(9_000),
                ok: Some(true),
            },
            CriSpan {
                method: "PullImage",
                begin_ns: 9_500,
                end_ns: Some(9_800),
                ok: Some(false),
            },
            CriSpan {
                method: "CreateContainer",
                begin_ns: 10_000,
                end_ns: Some(12_000),
                ok: Some(true),
            },
            CriSpan {
                method: "StartContainer",
                begin_ns: 12_500,
                end_ns: Some(15_000),
                ok: Some(true),
            },
        ];
        p.running_observed_ns = Some(20_000);
        p
    }

    fn value(s: &Span, key: &str) -> Option<String> {
        s.attributes.iter().find(|a| a.key == key).and_then(|a| {
            match a.value.as_ref()?.value.as_ref()? {
                any_value::Value::StringValue(v) => Some(v.clone()),
                _ => None,
            }
        })
    }

    #[test]
    fn a_pod_start_is_one_trace_whose_phases_add_up_to_the_root() {
        let pod = record();
        let spans = spans(&pod, 1_000_000_000);
        let root = &spans[0];
        assert_eq!(root.name, "pod_start");
        assert_eq!(root.start_time_unix_nano, 1_000_001_000);
        assert_eq!(root.end_time_unix_nano, 1_000_020_000);
        assert_eq!(
            value(root, "k8s.pod.uid").as_deref(),
            Some(pod.uid.as_str())
        );
        assert_eq!(root.trace_id.len(), 16);
        assert_eq!(root.span_id.len(), 8);
        let phases: Vec<&Span> = spans
            .iter()
            .filter(|s| value(s, "swiftlet.phase").is_some())
            .collect();
        assert_eq!(phases.len(), pod.breakdown().len());
        let sum: u64 = phases
            .iter()
            .map(|s| s.end_time_unix_nano - s.start_time_unix_nano)
            .sum();
        assert_eq!(sum, root.end_time_unix_nano - root.start_time_unix_nano);
        let ids: std::collections::HashSet<&Vec<u8>> = spans.iter().map(|s| &s.span_id).collect();
        assert_eq!(ids.len(), spans.len(), "span IDs are unique");
        for s in &spans[1..] {
            assert_eq!(s.trace_id, root.trace_id);
            assert_eq!(s.parent_span_id, root.span_id);
        }
        let pull = spans
            .iter()
            .find(|s| s.name == "runtime.v1.ImageService/PullImage")
            .expect("the pull's span");
        assert_eq!(pull.kind, span::SpanKind::Client as i32);
        assert_eq!(
            pull.status.as_ref().map(|s| s.code),
            Some(status::StatusCode::Error as i32)
        );
        let create = spans
            .iter()
            .find(|s| s.name == "CreateContainer/app")
            .expect("the create phase");
        assert_eq!(value(create, "k8s.container.name").as_deref(), Some("app"));
        assert_eq!(spans_of(&pod), spans.len());
    }

    #[test]
    fn sampling_is_by_the_uid_and_near_its_rate() {
        let uids: Vec<String> = (0..10_000).map(|i| format!("uid-{i}")).collect();
        let n = uids.iter().filter(|u| sampled(u, 250_000)).count();
        assert!((2_000..3_000).contains(&n), "{n} of 10000 sampled at 25 %");
        assert!(uids.iter().all(|u| sampled(u, 1_000_000)));
        assert!(!uids.iter().any(|u| sampled(u, 0)));
        assert_eq!(sampled("uid-7", 250_000), sampled("uid-7", 250_000));
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_and_never_waits() {
        let metrics = Metrics::new();
        let (tx, _rx) = mpsc::channel(1);
        let sink = Sink {
            tx,
            sampling_per_million: 1_000_000,
            metrics: metrics.clone(),
        };
        let pod = record();
        sink.offer(&pod);
        sink.offer(&pod);
        let dropped = metrics
            .otlp_spans_dropped_total
            .get_or_create(&crate::metrics::ReasonLabel {
                reason: "queue_full",
            })
            .get();
        assert_eq!(dropped, spans_of(&pod) as u64);
    }
}
