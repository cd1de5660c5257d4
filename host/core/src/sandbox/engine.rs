//! The wasmtime engine shared by every tenant: Cranelift, the pooling
//! instance allocator, fuel metering (a budget per tenant, and the yield
//! points that let a busy guest be timed out), and one linker holding every
//! interface a guest may import.

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context as _, Result};
use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::compile::CompileLimits;
use super::context::{TaskState, add_context_to_linker};

/// Host-wide settings of the sandbox. Per-tenant limits live in
/// [`Limits`](super::Limits); these bound what any tenant can be given.
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    /// Component instances alive at once, host-wide: the size of the pooling
    /// allocator. Each in-flight task holds one.
    pub max_instances: u32,
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
    /// Bytes at the start of a freed linear memory (and table) kept
    /// resident and reset in place for the next instance; the rest is
    /// decommitted. Every task pays a memset of this much, so it is small:
    /// 64 KiB was as fast as 0 or 256 KiB for every guest language and
    /// faster than 1 MiB (`host/benches/README.md`, "wasmtime 50").
    pub memory_keep_resident: usize,
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

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            max_instances: 1000,
            max_memory: 1 << 30,
            max_table_elements: 100_000,
            yield_every_fuel: 10_000_000,
            cache_dir: None,
            max_wasm_stack: 1 << 20,
            memory_keep_resident: 64 << 10,
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

/// The shared engine and linker.
pub struct Sandbox {
    pub(crate) engine: Engine,
    pub(crate) linker: Linker<TaskState>,
    pub(crate) config: SandboxConfig,
    /// Every component loaded and still in use, by digest: tenants that
    /// load the same bytes share one compiled component (its code mapped
    /// once, one memory image), so a thousand tenants of one component
    /// cost one component.
    pub(crate) loaded: std::sync::Mutex<LoadedByDigest>,
    /// Tasks running, and releases of idle pool memory (see `idle`).
    pub(crate) activity: super::idle::Activity,
}

pub(crate) type LoadedByDigest =
    std::collections::HashMap<String, std::sync::Weak<super::LoadedComponent>>;

impl Sandbox {
    /// Builds the engine and links WASI 0.2 and `corral:activity`.
    pub fn new(config: SandboxConfig) -> Result<Arc<Sandbox>> {
        if config.max_instances == 0 {
            anyhow::bail!("sandbox: max_instances must be at least 1");
        }
        if config.yield_every_fuel == 0 {
            anyhow::bail!("sandbox: yield_every_fuel must be at least 1");
        }
        let n = config.max_instances;
        let per = &config.per_component;
        let mut pool = PoolingAllocationConfig::new();
        // Every pool is sized for `n` components at their per-component
        // maximum, and a component above any maximum is refused at load (by
        // wasmtime, naming the count): so a task holding an instance slot
        // can always instantiate, whatever other tenants' tasks hold.
        pool.total_component_instances(n)
            .total_stacks(n)
            .total_core_instances(n.saturating_mul(per.core_instances))
            .total_memories(n.saturating_mul(per.memories))
            .total_tables(n.saturating_mul(per.tables))
            .max_core_instances_per_component(per.core_instances)
            .max_memories_per_component(per.memories)
            .max_tables_per_component(per.tables)
            .max_memory_size(usize::try_from(config.max_memory).context("max_memory")?)
            .table_elements(
                usize::try_from(config.max_table_elements).context("max_table_elements")?,
            )
            .max_component_instance_size(1 << 20)
            .max_core_instance_size(1 << 20)
            .linear_memory_keep_resident(config.memory_keep_resident)
            .table_keep_resident(config.memory_keep_resident)
            // Off. wasmtime 48's scan reset only the pages a guest dirtied,
            // but skipped dirtied pages that were swapped out (the next
            // instance read them back). wasmtime 50 finds those too, by no
            // longer asking for present pages, and so reports every page
            // of the memory: its "scan" resets the whole kept-resident
            // budget, as the plain reset does, after a syscall over the
            // whole memory. Without it, the pool memsets
            // `memory_keep_resident` and decommits the rest
            // (`host/benches/README.md`, "wasmtime 50").
            .pagemap_scan(Enabled::No);

        let mut wasm = wasm_config(config.max_wasm_stack);
        wasm.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&wasm)
            .map_err(anyhow::Error::from)
            .context("creating the wasmtime engine")?;

        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)
            .map_err(anyhow::Error::from)
            .context("linking WASI 0.2")?;
        // Linked for every component; a tenant without `http_hosts` cannot
        // load one that imports it, and every request is checked again.
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)
            .map_err(anyhow::Error::from)
            .context("linking wasi:http 0.2")?;
        // `wasi:config/store`: the tenant's and the deployment's settings,
        // and its secrets' placeholders.
        wasmtime_wasi_config::add_to_linker(&mut linker, |state: &mut TaskState| {
            wasmtime_wasi_config::WasiConfig::from(&*state.config)
        })
        .map_err(anyhow::Error::from)
        .context("linking wasi:config")?;
        add_context_to_linker::<TaskState, HasSelf<TaskState>>(&mut linker, |state| state)
            .map_err(anyhow::Error::from)
            .context("linking corral:activity/context")?;

        if let Some(dir) = &config.cache_dir {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("creating the compile cache `{}`", dir.display()))?;
        }
        Ok(Arc::new(Sandbox {
            engine,
            linker,
            config,
            loaded: Default::default(),
            activity: Default::default(),
        }))
    }

    /// The host-wide configuration.
    pub fn config(&self) -> &SandboxConfig {
        &self.config
    }

    /// The wasmtime engine every component is compiled for (for benchmarks
    /// that compare corral against raw wasmtime with identical settings).
    pub fn engine(&self) -> &wasmtime::Engine {
        &self.engine
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_compile_workers_engine_makes_code_the_host_loads() {
        let config = SandboxConfig::default();
        let host = Sandbox::new(config.clone()).unwrap();
        let worker = Engine::new(&wasm_config(config.max_wasm_stack)).unwrap();
        let hash = |engine: &Engine| {
            use std::hash::{DefaultHasher, Hash, Hasher};
            let mut hasher = DefaultHasher::new();
            engine.precompile_compatibility_hash().hash(&mut hasher);
            hasher.finish()
        };
        assert_eq!(hash(&host.engine), hash(&worker));
        let artifact = worker
            .precompile_component(b"(component (core module))")
            .unwrap();
        // SAFETY: compiled just above by an engine of the same settings.
        unsafe { wasmtime::component::Component::deserialize(&host.engine, &artifact) }.unwrap();
    }

    #[test]
    fn a_zero_yield_interval_is_refused_by_name() {
        let Err(e) = Sandbox::new(SandboxConfig {
            yield_every_fuel: 0,
            ..SandboxConfig::default()
        }) else {
            panic!("a guest that never yields cannot be timed out")
        };
        assert!(e.to_string().contains("yield_every_fuel"), "{e}");
    }
}
