//! The sandbox's host-wide configuration and the engine settings that
//! decide compiled code: a leaf that the engine and the compile worker both
//! read, so neither depends on the other.

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Duration;

use wasmtime::Config;

/// Host-wide settings of the sandbox. Per-tenant limits live in
/// [`Limits`](super::Limits); these bound what any tenant can be given.
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    /// Component instances alive at once, host-wide: the size of the pooling
    /// allocator. Each in-flight task holds one.
    pub max_instances: u32,
    /// Warm instances kept between the tasks of tenants that reuse them
    /// (`Tenant::reuse`), host-wide; the pool has this many slots beyond
    /// `max_instances`. 0: no tenant's instances are reused.
    pub max_warm: u32,
    /// The largest linear memory any instance may have (the pool's slot
    /// size); a tenant's memory limit above it is refused.
    pub max_memory: u64,
    /// The largest table any instance may have, in elements.
    pub max_table_elements: u64,
    /// Fuel between two yields of a running guest to the async runtime:
    /// what lets a deadline or a cancel end a guest that never returns, and
    /// keeps one busy guest from holding a runtime thread. 10 million is
    /// about a millisecond of a tight loop, a few of typical code.
    pub yield_every_fuel: u64,
    /// Where compiled components are cached (`None`: compile every load).
    pub cache_dir: Option<PathBuf>,
    /// Native stack available to a guest before it traps with a stack
    /// overflow.
    pub max_wasm_stack: usize,
    /// Of a freed linear memory, the most bytes of its written pages that
    /// are reset in place and kept resident for the next instance; the rest
    /// is decommitted, to be faulted in again. The pool finds written pages
    /// with `PAGEMAP_SCAN`, and a page it kept counts as written at the next
    /// reset too, so a reset zeroes what the slot's tasks have written and
    /// kept, at most this much (where the kernel lacks the scan, every reset
    /// zeroes this much). A page kept above a later instance's smaller
    /// memory is not scanned again and stays resident, zeroed, until the
    /// host's idle release: a slot holds at most the largest memory it has
    /// had.
    pub memory_keep_resident: usize,
    /// The same for a freed table.
    pub table_keep_resident: usize,
    /// What one component may contain; a component needing more is refused
    /// at load.
    pub per_component: PerComponent,
    /// Compile in a worker process with these limits (`None`: in this
    /// process, for trusted components).
    pub compile: Option<CompileLimits>,
}

/// The most core instances, memories and tables one component may contain
/// (counted through all its nested modules): the pool holds this much for
/// every instance slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerComponent {
    pub core_instances: u32,
    pub memories: u32,
    pub tables: u32,
}

impl Default for PerComponent {
    /// Room for what the toolchains emit: componentize-py links a dozen
    /// shared libraries as core instances sharing one memory and table;
    /// Rust and JavaScript guests need a handful.
    fn default() -> Self {
        PerComponent {
            core_instances: 32,
            memories: 2,
            tables: 4,
        }
    }
}

/// The default `memory_keep_resident`: more than the interpreters' guests
/// keep written (about 200 KiB for Python's, 524 KiB for JavaScript's), so a
/// fresh instance faults in nothing its slot's last one touched
/// (`host/corral/benches/README.md`, "wasmtime 50").
const KEEP_RESIDENT: usize = 1 << 20;
/// The default `table_keep_resident`: more than the guests' tables (52 KiB
/// for Python's), far less than a full table slot (784 KiB at 100,000
/// elements), of which a pool has four per instance.
const TABLE_KEEP_RESIDENT: usize = 64 << 10;

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            max_instances: 1000,
            max_warm: 64,
            max_memory: 1 << 30,
            max_table_elements: 100_000,
            yield_every_fuel: 10_000_000,
            cache_dir: None,
            max_wasm_stack: 1 << 20,
            memory_keep_resident: KEEP_RESIDENT,
            table_keep_resident: TABLE_KEEP_RESIDENT,
            per_component: PerComponent::default(),
            compile: None,
        }
    }
}

/// The engine settings that decide compiled code, shared by the host and its
/// compile worker (`compile`), whose artifacts the host loads: everything but
/// the instance allocator.
pub(crate) fn wasm_config(max_wasm_stack: usize) -> Config {
    let mut wasm = Config::new();
    // Fuel, not epochs, bounds a busy guest: fuel needs no ticker thread
    // (waking one per task cost more CPU than the task), and it is
    // compiled in anyway for tenants' CPU budgets.
    // No component-model concurrency: a guest's subtasks, streams and
    // futures could outlive a call outside the resource table, which is
    // what a warm instance is checked by (see `execute`).
    wasm.concurrency_support(false);
    wasm.consume_fuel(true)
        // Never advanced: the epoch check is how the watchdog makes a
        // guest that lives in host calls yield (see `watchdog`).
        .epoch_interruption(true)
        .wasm_backtrace_max_frames(NonZeroUsize::new(64))
        .max_wasm_stack(max_wasm_stack)
        .async_stack_size(fiber_stack_size(max_wasm_stack));
    wasm
}

/// The native stack a task's guest runs on: the guest's own maximum and
/// room for the host functions it calls.
///
/// Fiber stacks are not zeroed between tasks (wasmtime's
/// `async_stack_zeroing`, a defence against its own bugs: guest code cannot
/// address the native stack), so a used stack's pages stay resident for its
/// pool slot's next task: at most this much per slot, 4–8 KiB for the
/// examples (`--bench sandbox`). Zeroing would cost a memset and a madvise
/// per task.
pub fn fiber_stack_size(max_wasm_stack: usize) -> usize {
    max_wasm_stack + (512 << 10)
}

/// How a host compiles in a worker process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileLimits {
    /// The `corral` binary to run as the worker.
    pub worker: PathBuf,
    /// Wall-clock time one compile may take.
    pub time: Duration,
    /// Writable memory of the worker (heap and thread stacks).
    pub memory: u64,
}
