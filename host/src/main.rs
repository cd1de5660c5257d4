//! The `corral` command line.

mod cli;

fn main() -> std::process::ExitCode {
    keep_transient_buffers_in_the_heap();
    cli::main()
}

/// glibc serves every allocation above its mmap threshold (128 KiB at
/// first, raised only by freeing a larger mapped block) with a fresh `mmap`,
/// and trims the heap top above twice that. gzip's deflate state (about
/// 300 KB, built for every compressed gRPC request) was therefore mapped,
/// faulted in page by page and unmapped again on every request: about a
/// hundred page faults and about a third of the worker's CPU per activity. Fixed
/// thresholds keep such buffers in the heap, to be reused.
fn keep_transient_buffers_in_the_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; glibc takes its own
    // lock, and nothing here depends on the call succeeding (on failure the
    // defaults stay).
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 8 << 20);
    }
}
