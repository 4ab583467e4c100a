//! Generates KEDA's external-scaler gRPC code (`proto/externalscaler.proto`, vendored from
//! kedacore/keda) with a pure-Rust protobuf compiler (protox), so building needs no `protoc`.

fn main() {
    let proto = "proto/externalscaler.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"]).expect("proto/externalscaler.proto does not compile");
    tonic_prost_build::configure().build_client(true).build_server(true).compile_fds(descriptors).expect("generating the external-scaler gRPC code failed");
}
