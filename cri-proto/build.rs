//! Compiles the CRI proto with protox (pure Rust, so no system `protoc` is
//! needed) and generates prost messages plus tonic clients; servers only with
//! the `server` feature.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const PROTO: &str = "proto/runtime/v1/api.proto";
    println!("cargo:rerun-if-changed={PROTO}");

    let fds = protox::compile([PROTO], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(std::env::var_os("CARGO_FEATURE_SERVER").is_some())
        // Fakes implement only the RPCs they need; the rest answer Unimplemented,
        // like a runtime that predates them.
        .generate_default_stubs(true)
        // Upstream marks the secrets `debug_redact`, which prost ignores: we
        // write AuthConfig's Debug by hand (src/v1.rs) so tokens never reach logs.
        .skip_debug([".runtime.v1.AuthConfig"])
        .compile_fds(fds)?;
    Ok(())
}
