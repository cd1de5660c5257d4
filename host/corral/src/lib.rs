//! corral: a WebAssembly-sandboxed activity host for durable-workflow
//! engines. See `docs/architecture.md` for the architecture.

// An `Outcome`'s error is a whole classified `Failure` by design: one per
// finished task, never on a hot path, so its size does not matter.
#![allow(clippy::result_large_err)]

pub mod config;
pub mod connectors;
pub mod control;
pub mod descriptors;
pub mod dev_server;
pub mod health;
pub mod log;
pub mod oci;
pub mod secrets;
pub mod staging;
pub mod telemetry;
pub mod token;
pub mod trust;

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

/// glibc serves every allocation above its mmap threshold (128 KiB at
/// first, raised only by freeing a larger mapped block) with a fresh `mmap`,
/// and trims the heap top above twice that. gzip's deflate state (about
/// 300 KB, built for every compressed gRPC request) was therefore mapped,
/// faulted in page by page and unmapped again on every request: about a
/// hundred page faults and about a third of the worker's CPU per activity. Fixed
/// thresholds keep such buffers in the heap, to be reused.
///
/// glibc also parks freed small blocks that its per-thread cache (seven of
/// each size) cannot take in "fastbins", which it never merges until a
/// request of a kilobyte or more makes it walk them all. Every task asks
/// for such a block (its wasmtime store, about 1.9 KB), so every task paid
/// that walk for what the last one freed (`malloc_consolidate`, 0.7 % of a
/// Rust task's time under `perf`, against 0.03 % for raw wasmtime). With
/// fastbins off, those frees merge at once instead.
///
/// The binary calls this first thing; so does the sandbox bench, to
/// measure what ships.
pub fn tune_the_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; glibc takes its own
    // lock, and nothing here depends on the call succeeding (on failure the
    // defaults stay).
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 8 << 20);
        libc::mallopt(libc::M_MXFAST, 0);
    }
}
