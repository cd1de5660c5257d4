//! Generates the admin API's Rust types from `proto/corral/v1/*.proto` with a
//! pure-Rust protobuf compiler, so building corral needs no `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto");
    let file = proto_dir.join("corral/v1/admin.proto");
    println!("cargo:rerun-if-changed={}", file.display());
    let descriptors = protox::compile([&file], [&proto_dir])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
