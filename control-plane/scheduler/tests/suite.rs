//! Every integration test of this crate in one binary: each file below
//! was its own, and each linked the whole API server again (CI's disk
//! held ~90 such binaries). Run one file's tests with
//! `cargo test -p CRATE --test suite FILE::`.

// Shared by the test modules below.
#[path = "support/mod.rs"]
mod support;

mod affinity;
mod preemption;
mod profiles;
mod restart;
mod scheduling;
mod scores;
mod volumes;
