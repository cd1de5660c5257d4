//! corral: a WebAssembly-sandboxed activity host for durable-workflow
//! engines. See `DESIGN.md` for the architecture.

pub mod sandbox;
pub mod testing;
