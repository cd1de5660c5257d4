//! Shared by the integration tests: the example components, built once.

#![allow(dead_code)]

pub mod activities;
pub mod admin;
pub mod aion;
pub mod egress;
pub mod http;
pub mod otlp;
pub mod processes;
pub mod registry;
pub mod signing;
pub mod temporal;

// The guests and the test host, from `corral-core`'s tests: one source.
#[path = "../../../core/tests/common/mod.rs"]
mod guests;
pub use guests::*;

/// The repository's root.
pub fn repo() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}
