//! Generates the admin API's Rust types from `proto/corral/v1/*.proto`, and
//! Aion's worker protocol from `proto/aion/worker.proto`,
//! with a pure-Rust protobuf compiler, so building corral needs no `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Read when the script runs, not baked in when it is compiled: a
    // checkout at another path sharing the target directory reuses this
    // script's binary.
    let proto_dir =
        std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
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
