//! Generates the admin API's Rust types from `proto/corral/v1/*.proto`, and
//! Aion's worker protocol from `proto/aion/worker.proto`,
//! with a pure-Rust protobuf compiler, so building corral needs no `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto");
    let admin = proto_dir.join("corral/v1/admin.proto");
    let aion = proto_dir.join("aion/worker.proto");
    for file in [&admin, &aion] {
        println!("cargo:rerun-if-changed={}", file.display());
    }
    tonic_prost_build::configure().compile_fds(protox::compile([&admin], [&proto_dir])?)?;
    // The server side serves the connector's unit tests.
    tonic_prost_build::configure().compile_fds(protox::compile([&aion], [&proto_dir])?)?;
    Ok(())
}
