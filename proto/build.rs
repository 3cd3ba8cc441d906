fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    tonic_prost_build::configure().compile_protos(
        &[
            "proto/swiftlet/v1/trace.proto",
            "proto/grpc/health/v1/health.proto",
        ],
        &["proto"],
    )?;
    Ok(())
}
