//! The wasmtime engine shared by every tenant: Cranelift, the pooling
//! instance allocator, fuel metering (a budget per tenant, and the yield
//! points that let a busy guest be timed out), and one linker holding every
//! interface a guest may import.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::config::{SandboxConfig, wasm_config};
use super::context::{TaskState, add_context_to_linker};

/// How old a compile's half-written artifact of a host that looks gone
/// must be to be removed: a host in another pid namespace sharing the cache
/// looks gone, and its compiles may take as long as its own configuration
/// says, which this host does not know.
const ABANDONED_AFTER: Duration = Duration::from_secs(24 * 3600);

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
    /// Instances kept between a reusing tenant's tasks (see `warm`).
    pub(crate) warm: Arc<super::warm::WarmHost>,
    /// Advances the epoch while tasks run: slices by the clock (see
    /// `ticker`).
    pub(crate) ticker: super::ticker::Ticker,
}

pub(crate) type LoadedByDigest =
    std::collections::HashMap<String, std::sync::Weak<super::LoadedComponent>>;

impl Sandbox {
    /// Releases the memory the pool keeps resident for its free slots, if
    /// no task has started for `idle` and none is running; the bytes
    /// released, or `None` when the host is not idle (see `idle`).
    pub fn release_idle_memory(&self, idle: std::time::Duration) -> Option<usize> {
        self.activity.release(&self.engine, idle)
    }

    /// Retires the warm instances left unused past their tenant's `idle`
    /// at `now`; how many. A host calls it every second or so.
    pub fn retire_idle_instances(&self, now: std::time::Instant) -> usize {
        self.warm.retire_idle(now)
    }

    /// Warm instances kept now, waiting for their tenant's next task.
    pub fn warm_instances(&self) -> usize {
        self.warm.idle()
    }

    /// Builds the engine and links WASI 0.2 and `corral:activity`.
    pub fn new(config: SandboxConfig) -> Result<Arc<Sandbox>> {
        if config.max_instances == 0 {
            anyhow::bail!("sandbox: max_instances must be at least 1");
        }
        if config.yield_every_fuel == 0 {
            anyhow::bail!("sandbox: yield_every_fuel must be at least 1");
        }
        // Idle warm instances hold slots too: the pool has room for them
        // beyond the instances tasks hold.
        let n = config.max_instances.saturating_add(config.max_warm);
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
            .table_keep_resident(config.table_keep_resident)
            // On where the kernel has `PAGEMAP_SCAN` (Linux 6.7): a freed
            // memory's reset finds the pages its guest wrote, present or
            // swapped out, and resets only those in place (up to
            // `memory_keep_resident`, `table_keep_resident`), decommitting
            // the rest. wasmtime 50.0.2 is the first with both: 48 missed
            // swapped-out pages (the next instance read them back), and
            // 50.0.0 and 50.0.1 took every never-touched page for a written
            // one on current kernels, so a reset zeroed the whole
            // kept-resident budget (`host/corral/benches/README.md`,
            // "wasmtime 50").
            .pagemap_scan(Enabled::Auto);

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
            // Owner-only: tenants' compiled code.
            crate::private::dir(dir)
                .with_context(|| format!("creating the compile cache `{}`", dir.display()))?;
            // Abandoned artifacts go once a day old, or older than this
            // host's own compiles may take if that is longer.
            let own = config.compile.as_ref().map_or(Duration::ZERO, |c| c.time);
            let age = own
                .saturating_add(Duration::from_secs(60))
                .max(ABANDONED_AFTER);
            super::cache::remove_abandoned_artifacts(dir, age);
        }
        Ok(Arc::new(Sandbox {
            ticker: super::ticker::Ticker::start(engine.clone()),
            engine,
            linker,
            loaded: Default::default(),
            activity: Default::default(),
            warm: Arc::new(super::warm::WarmHost::new(config.max_warm)),
            config,
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
            .precompile_component(&wat::parse_str("(component (core module))").unwrap())
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
