//! Generated code for swiftlet's gRPC API.
