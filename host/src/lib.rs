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

// The engine-independent core lives in `corral-harness` (so activity
// authors' tests build without the engines); corral re-exports it whole.
use corral_harness::{backoff, sync};
pub use corral_harness::{metrics, sandbox, session, testing};
