//! Generates the envd messages from `proto/` with protox (a pure-Rust protobuf
//! compiler, so no `protoc` install is needed), prost for the binary codec and
//! pbjson for the proto3 JSON mapping the E2B SDKs use.

use std::{env, path::PathBuf};

const PROTOS: &[&str] = &["process/process.proto", "filesystem/filesystem.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    println!("cargo:rerun-if-changed=proto");

    let descriptors = protox::compile(PROTOS, ["proto"])?;
    let descriptor_path = out_dir.join("envd_descriptor.bin");
    std::fs::write(
        &descriptor_path,
        prost::Message::encode_to_vec(&descriptors),
    )?;

    prost_build::Config::new()
        .compile_well_known_types()
        .extern_path(".google.protobuf", "::pbjson_types")
        .file_descriptor_set_path(&descriptor_path)
        .skip_protoc_run()
        .compile_fds(descriptors)?;

    let descriptor_set = std::fs::read(&descriptor_path)?;
    pbjson_build::Builder::new()
        .register_descriptors(&descriptor_set)?
        // The SDK decodes with ignore_unknown_fields; the agent must be as
        // lenient with newer clients that send fields it does not know.
        .ignore_unknown_fields()
        .build(&[".process", ".filesystem"])?;
    Ok(())
}
