//! Sandbox benchmarks (`cargo bench -p corral --bench sandbox`; needs
//! `examples/build.sh` first).
//!
//! 1. Per-task overhead: corral's full path (dispatch, fresh store and
//!    instance, JSON→WIT, call, WIT→JSON, classify, teardown) for a trivial
//!    activity, against a raw wasmtime loop (fresh store + instantiate from an
//!    `InstancePre` + typed call) on the very same engine, interleaved in one
//!    run. Prints both in µs/task and their ratio.
//! 2. Many in flight: N tasks (default 10,000; `CORRAL_BENCH_INFLIGHT`)
//!    sleeping on the WASI clock at once; prints the host's resident memory
//!    per in-flight task beyond the guest's own linear memory.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use corral::sandbox::{Limits, PreparedTenant, Sandbox, SandboxConfig, Task, Tenant};
use serde_json::json;
use wasmtime::Store;
use wasmtime::component::{Linker, ResourceTable};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

const ROUNDS: usize = 7;
const TASKS_PER_ROUND: usize = 2000;

fn example(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../examples/dist/{name}.wasm"))
}

struct Raw {
    wasi: WasiCtx,
    table: ResourceTable,
}

impl WasiView for Raw {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

async fn overhead() -> Result<()> {
    let sandbox = Sandbox::new(SandboxConfig::default())?;
    let echo = sandbox
        .load_file(&example("echo"))
        .context("run examples/build.sh first")?;
    let tenant = sandbox.prepare(Tenant {
        name: "bench".into(),
        ..Tenant::default()
    })?;

    // The raw floor: same engine (pooling, fuel), same component.
    let engine = sandbox.engine();
    let mut linker: Linker<Raw> = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    linker.define_unknown_imports_as_traps(echo.component())?;
    let pre = linker.instantiate_pre(echo.component())?;
    let api = echo
        .component()
        .get_export_index(None, "demo:echo/api")
        .context("api")?;
    let func = echo
        .component()
        .get_export_index(Some(&api), "echo-u32")
        .context("echo-u32")?;

    let raw_task = || async {
        let mut store = Store::new(
            engine,
            Raw {
                wasi: WasiCtx::builder().build(),
                table: ResourceTable::new(),
            },
        );
        store.set_fuel(u64::MAX)?;
        store.fuel_async_yield_interval(Some(SandboxConfig::default().yield_every_fuel))?;
        // The engine checks epochs (corral's watchdog uses them): a store
        // must set a deadline it never reaches, or it traps at once.
        store.set_epoch_deadline(1 << 62);
        let instance = pre.instantiate_async(&mut store).await?;
        let f = instance.get_typed_func::<(u32,), (u32,)>(&mut store, func)?;
        let (out,) = f.call_async(&mut store, (7,)).await?;
        anyhow::ensure!(out == 7);
        Ok::<_, anyhow::Error>(())
    };
    let corral_task = || async {
        let task = Task::new("demo:echo/api.echo-u32", vec![json!(7)]);
        let out = sandbox.execute(&echo, &tenant, task).await;
        anyhow::ensure!(out == Ok(json!(7)), "{out:?}");
        Ok::<_, anyhow::Error>(())
    };

    // Warm up both paths.
    for _ in 0..200 {
        raw_task().await?;
        corral_task().await?;
    }
    let (mut raw, mut full) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let start = Instant::now();
        for _ in 0..TASKS_PER_ROUND {
            raw_task().await?;
        }
        raw.push(start.elapsed().as_secs_f64() * 1e6 / TASKS_PER_ROUND as f64);
        let start = Instant::now();
        for _ in 0..TASKS_PER_ROUND {
            corral_task().await?;
        }
        full.push(start.elapsed().as_secs_f64() * 1e6 / TASKS_PER_ROUND as f64);
    }
    let (raw, full) = (median(raw), median(full));
    println!("per-task overhead ({ROUNDS} rounds × {TASKS_PER_ROUND} tasks, medians):");
    println!("  raw wasmtime (store + instantiate + typed call): {raw:8.2} µs/task");
    println!("  corral full path (JSON in/out, classify):        {full:8.2} µs/task");
    println!("  ratio corral / raw: {:.3} (target ≤ 1.3)", full / raw);
    Ok(())
}

/// The bench tenant with 16 MiB of memory, for the small pools.
fn small_tenant(sandbox: &Sandbox) -> Result<PreparedTenant> {
    Ok(sandbox.prepare(Tenant {
        name: "bench".into(),
        limits: Limits {
            memory: 16 << 20,
            ..Limits::default()
        },
        ..Tenant::default()
    })?)
}

fn resident_bytes() -> Result<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm")?;
    let pages: u64 = statm.split_whitespace().nth(1).context("statm")?.parse()?;
    Ok(pages * 4096)
}

async fn in_flight() -> Result<()> {
    let n: usize = std::env::var("CORRAL_BENCH_INFLIGHT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let sandbox = Sandbox::new(SandboxConfig {
        max_instances: u32::try_from(n)? + 16,
        max_memory: 16 << 20,
        ..SandboxConfig::default()
    })?;
    let misbehave = sandbox.load_file(&example("misbehave"))?;
    let tenant = small_tenant(&sandbox)?;
    let linear = match sandbox
        .execute(
            &misbehave,
            &tenant,
            Task::new("demo:misbehave/api.memory-size", vec![]),
        )
        .await
    {
        Ok(size) => size.as_u64().context("memory-size")?,
        Err(f) => anyhow::bail!("memory-size: {f}"),
    };
    let before = resident_bytes()?;
    let sleep_ms = 4000 + n as u64 / 2;
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let shared = std::sync::Arc::new((sandbox, misbehave, tenant));
    for _ in 0..n {
        let shared = shared.clone();
        tasks.spawn(async move {
            let (sandbox, misbehave, tenant) = &*shared;
            let task = Task::new("demo:misbehave/api.sleep", vec![json!(sleep_ms)]);
            sandbox.execute(misbehave, tenant, task).await
        });
    }
    // Sample while all tasks sleep.
    let mut peak = before;
    while started.elapsed() < Duration::from_millis(sleep_ms - 1000) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        peak = peak.max(resident_bytes()?);
    }
    let mut ok = 0;
    while let Some(done) = tasks.join_next().await {
        if done?.is_ok() {
            ok += 1;
        }
    }
    anyhow::ensure!(ok == n, "only {ok} of {n} tasks succeeded");
    let per_task = peak.saturating_sub(before) as f64 / n as f64 / 1024.0;
    println!("{n} tasks in flight at once, sleeping on the WASI clock (all completed):");
    println!(
        "  resident memory per in-flight task: {per_task:.1} KiB, guest pages included \
         (the guest's linear memory is {} KiB, mostly untouched)",
        linear / 1024
    );
    println!("  so the host's own memory per task is at most {per_task:.1} KiB (target ≤ 200 KiB)");
    Ok(())
}

/// `sandbox count N`: N tasks of corral's full path on one thread, with a
/// pool small enough for valgrind to reserve, and nothing else; run under
/// `valgrind --tool=callgrind` at two counts, the difference of the
/// instruction counts over the difference of N is the instructions per
/// task, repeatable where wall time is not.
async fn count(n: usize) -> Result<()> {
    let sandbox = Sandbox::new(SandboxConfig {
        max_instances: 4,
        max_memory: 16 << 20,
        ..SandboxConfig::default()
    })?;
    let echo = sandbox
        .load_file(&example("echo"))
        .context("run examples/build.sh first")?;
    let tenant = small_tenant(&sandbox)?;
    for _ in 0..n {
        let task = Task::new("demo:echo/api.echo-u32", vec![json!(7)]);
        let out = sandbox.execute(&echo, &tenant, task).await;
        anyhow::ensure!(out == Ok(json!(7)), "{out:?}");
    }
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("count") {
        let n = args
            .get(2)
            .and_then(|n| n.parse().ok())
            .context("count N")?;
        return tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(count(n));
    }
    let only = |name: &str| {
        !args.iter().skip(1).any(|a| !a.starts_with('-')) || args.iter().any(|a| a == name)
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    if only("overhead") {
        runtime.block_on(overhead())?;
    }
    if only("inflight") {
        runtime.block_on(in_flight())?;
    }
    Ok(())
}
