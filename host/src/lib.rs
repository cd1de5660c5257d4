//! corral: a WebAssembly-sandboxed activity host for durable-workflow
//! engines. See `docs/architecture.md` for the architecture.

// An `Outcome`'s error is a whole classified `Failure` by design: one per
// finished task, never on a hot path, so its size does not matter.
#![allow(clippy::result_large_err)]

mod backoff;
pub mod config;
pub mod connectors;
pub mod control;
pub mod dev_server;
pub mod metrics;
pub mod sandbox;
pub mod session;
mod sync;
pub mod testing;
