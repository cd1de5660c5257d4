//! The wasmtime engine shared by every tenant: Cranelift, the pooling
//! instance allocator, epoch interruption driven by a host ticker, and one
//! linker holding every interface a guest may import.

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context as _, Result};
use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

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
    /// Epoch tick: how often a busy guest yields to the runtime, and the
    /// resolution of deadlines and cancellation.
    pub epoch_tick: Duration,
    /// Where compiled components are cached (`None`: compile every load).
    pub cache_dir: Option<PathBuf>,
    /// Native stack available to a guest before it traps with a stack
    /// overflow.
    pub max_wasm_stack: usize,
    /// Whether fuel metering is compiled in (needed for per-tenant CPU
    /// budgets; costs some speed).
    pub fuel: bool,
    /// Bytes of a freed linear memory kept resident for the next instance
    /// (cheaper than faulting pages back in).
    pub memory_keep_resident: usize,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            max_instances: 1000,
            max_memory: 1 << 30,
            max_table_elements: 100_000,
            epoch_tick: Duration::from_millis(10),
            cache_dir: None,
            max_wasm_stack: 1 << 20,
            fuel: true,
            memory_keep_resident: 1 << 20,
        }
    }
}

/// The shared engine, linker and epoch ticker.
pub struct Sandbox {
    pub(crate) engine: Engine,
    pub(crate) linker: Linker<TaskState>,
    pub(crate) config: SandboxConfig,
    ticker: EpochTicker,
}

impl Sandbox {
    /// Builds the engine and links WASI 0.2 and `corral:activity`.
    pub fn new(config: SandboxConfig) -> Result<Arc<Sandbox>> {
        if config.max_instances == 0 {
            anyhow::bail!("sandbox: max_instances must be at least 1");
        }
        let n = config.max_instances;
        let mut pool = PoolingAllocationConfig::new();
        pool.total_component_instances(n)
            .total_stacks(n)
            // A component is several core instances (componentize-py links
            // a dozen shared libraries), usually sharing one memory.
            .total_core_instances(n.saturating_mul(16))
            .total_memories(n.saturating_mul(2))
            .total_tables(n.saturating_mul(2))
            .max_core_instances_per_component(200)
            .max_memories_per_component(8)
            .max_tables_per_component(8)
            .max_memory_size(usize::try_from(config.max_memory).context("max_memory")?)
            .table_elements(
                usize::try_from(config.max_table_elements).context("max_table_elements")?,
            )
            .max_component_instance_size(1 << 20)
            .max_core_instance_size(1 << 20)
            .linear_memory_keep_resident(config.memory_keep_resident)
            .table_keep_resident(config.memory_keep_resident)
            .async_stack_keep_resident(64 << 10)
            // Reset only the pages a guest dirtied (Linux 6.7+), so keeping
            // them resident costs no blanket memset and saves the page
            // faults of re-touching them in the next task.
            .pagemap_scan(Enabled::Auto);

        let mut wasm = Config::new();
        wasm.epoch_interruption(true)
            .consume_fuel(config.fuel)
            .wasm_backtrace_max_frames(NonZeroUsize::new(64))
            .max_wasm_stack(config.max_wasm_stack)
            .async_stack_size(config.max_wasm_stack + (512 << 10))
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
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
        add_context_to_linker::<TaskState, HasSelf<TaskState>>(&mut linker, |state| state)
            .map_err(anyhow::Error::from)
            .context("linking corral:activity/context")?;

        if let Some(dir) = &config.cache_dir {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("creating the compile cache `{}`", dir.display()))?;
        }
        let ticking = engine.clone();
        let ticker = EpochTicker::start(config.epoch_tick, move || ticking.increment_epoch())?;
        Ok(Arc::new(Sandbox {
            engine,
            linker,
            config,
            ticker,
        }))
    }

    /// The host-wide configuration.
    pub fn config(&self) -> &SandboxConfig {
        &self.config
    }

    /// Keeps the epoch ticking while the returned guard lives: taken for
    /// every task's whole run.
    pub(crate) fn running(&self) -> Running {
        self.ticker.running()
    }

    /// The wasmtime engine every component is compiled for (for benchmarks
    /// that compare corral against raw wasmtime with identical settings).
    pub fn engine(&self) -> &wasmtime::Engine {
        &self.engine
    }
}

/// Increments the engine's epoch every tick while any guest runs, until
/// dropped. Every running guest yields to the async runtime at each tick,
/// which is what lets deadlines and cancellation end a guest stuck in a
/// loop. With no guest running the thread sleeps, so an idle host does not
/// wake up a hundred times a second.
struct EpochTicker {
    state: Arc<TickerState>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct TickerState {
    /// Guests running now, and whether the ticker should stop.
    running: Mutex<(usize, bool)>,
    wake: Condvar,
}

impl TickerState {
    fn lock(&self) -> MutexGuard<'_, (usize, bool)> {
        crate::sync::lock(&self.running)
    }
}

/// Held while a guest runs: the ticker ticks while any is held.
pub(crate) struct Running(Arc<TickerState>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.lock().0 -= 1;
    }
}

impl EpochTicker {
    fn start(tick: Duration, on_tick: impl Fn() + Send + 'static) -> Result<Self> {
        let state = Arc::new(TickerState::default());
        let shared = state.clone();
        let thread = std::thread::Builder::new()
            .name("corral-epoch".into())
            .spawn(move || {
                loop {
                    {
                        let mut running = shared.lock();
                        while running.0 == 0 && !running.1 {
                            running = shared.wake.wait(running).unwrap_or_else(|p| p.into_inner());
                        }
                        if running.1 {
                            return;
                        }
                    }
                    std::thread::sleep(tick);
                    on_tick();
                }
            })
            .context("starting the epoch ticker thread")?;
        Ok(EpochTicker {
            state,
            thread: Some(thread),
        })
    }

    fn running(&self) -> Running {
        let mut running = self.state.lock();
        running.0 += 1;
        if running.0 == 1 {
            self.state.wake.notify_one();
        }
        Running(self.state.clone())
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.state.lock().1 = true;
        self.state.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn the_ticker_ticks_only_while_a_guest_runs() {
        let ticks = Arc::new(AtomicUsize::new(0));
        let counted = ticks.clone();
        let ticker = EpochTicker::start(Duration::from_millis(1), move || {
            counted.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(ticks.load(Ordering::SeqCst), 0, "idle: no ticks");
        let running = ticker.running();
        let also = ticker.running();
        std::thread::sleep(Duration::from_millis(100));
        assert!(ticks.load(Ordering::SeqCst) > 0);
        drop(running);
        let before = ticks.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            ticks.load(Ordering::SeqCst) > before,
            "one guest still runs"
        );
        drop(also);
        std::thread::sleep(Duration::from_millis(20));
        let settled = ticks.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(ticks.load(Ordering::SeqCst), settled, "idle again");
        drop(ticker); // joins the thread
    }
}
