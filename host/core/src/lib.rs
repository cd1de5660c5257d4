//! corral's engine-independent core: the sandbox that runs one activity
//! component per task, the session loop that admits, watches and reports
//! tasks, and the host test harness ([`testing`]) that drives both with an
//! in-process engine. `corral` adds the engine connectors, the control
//! plane and the command line on top.
//!
//! Activity authors depend on this crate (not on `corral`) for their
//! tests: it builds without Temporal's core, tonic or protobuf.

// An `Outcome`'s error is a whole classified `Failure` by design: one per
// finished task, never on a hot path, so its size does not matter.
#![allow(clippy::result_large_err)]

#[doc(hidden)]
pub mod backoff;
pub mod local;
pub mod metrics;
pub mod name;
pub mod private;
pub mod sandbox;
pub mod session;
pub mod share;
pub mod shown;
#[doc(hidden)]
pub mod sync;
pub mod testing;
pub mod trace;
