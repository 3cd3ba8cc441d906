//! Generated code for swiftlet's own gRPC API (`proto/swiftlet/v1/trace.proto`): the
//! `swiftlet.v1.PodTrace` service that streams per-pod startup timelines; and for the standard
//! health-checking service that gRPC probes call (`proto/grpc/health/v1/health.proto`:
//! `grpc.health.v1.Health/Check`, client and server).
#![allow(clippy::all, rust_2018_idioms)]

pub mod v1 {
    tonic::include_proto!("swiftlet.v1");
}

/// `grpc.health.v1`: the client gRPC probes use, and the server side for tests.
pub mod health {
    tonic::include_proto!("grpc.health.v1");
}

#[cfg(test)]
mod tests {
    use super::v1::{Phase, PodTimeline};
    use prost::Message;

    #[test]
    fn timeline_round_trips_through_the_wire_format() {
        let t = PodTimeline {
            uid: "u".into(),
            namespace: "default".into(),
            name: "p".into(),
            phases: vec![Phase {
                name: "RunPodSandbox".into(),
                start_ns: 1,
                end_ns: 5,
                observer: "cri".into(),
            }],
            e2e_ms: 4.0,
            ..Default::default()
        };
        let bytes = t.encode_to_vec();
        assert_eq!(PodTimeline::decode(bytes.as_slice()).unwrap(), t);
    }
}
