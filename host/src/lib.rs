//! corral: a WebAssembly-sandboxed activity host for durable-workflow
//! engines. See `docs/architecture.md` for the architecture.

// An `Outcome`'s error is a whole classified `Failure` by design: one per
// finished task, never on a hot path, so its size does not matter.
#![allow(clippy::result_large_err)]

pub mod config;
pub mod connectors;
pub mod control;
pub mod dev_server;
pub mod oci;
pub mod secrets;
pub mod telemetry;

/// An error and its causes, on one line (each cause once).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        source = cause.source();
    }
    text
}

// The engine-independent core lives in `corral-harness` (so activity
// authors' tests build without the engines); corral re-exports it whole.
use corral_harness::{backoff, sync};
pub use corral_harness::{metrics, sandbox, session, testing};
