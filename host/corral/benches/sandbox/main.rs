//! Sandbox benchmarks (`cargo bench -p corral --bench sandbox`; needs
//! `examples/build.sh` first).
//!
//! 1. Per-task overhead: corral's full path (dispatch, fresh store and
//!    instance, JSON→WIT, call, WIT→JSON, classify, teardown) for a trivial
//!    activity (a string in, a string out) of a Rust, a Python
//!    (componentize-py) and a JavaScript (componentize-js) guest, against a
//!    raw wasmtime loop (fresh store + instantiate from an `InstancePre` +
//!    typed call) on the very same engine, interleaved in one run. Prints
//!    both in µs and page faults per task, and their ratio (of the medians,
//!    and the median of each round against the raw round before it); then, per
//!    guest, what one task dirties for the pool to reset (linear memory,
//!    tables) and the native stack it touches.
//!    `CORRAL_BENCH_GUESTS=rust,python` measures only those;
//!    `CORRAL_BENCH_KEEP_RESIDENT=BYTES` adds a sandbox keeping that much of
//!    each freed linear memory resident, side by side. The same tasks also
//!    run through the session's CPU scheduler (a slot, the guest threads,
//!    the CPU count), interleaved with the direct path: its cost per task,
//!    in wall time and in the whole process's CPU time.
//! 2. Many in flight: N tasks (default 10,000; `CORRAL_BENCH_INFLIGHT`)
//!    sleeping on the WASI clock at once; prints the host's resident memory
//!    per in-flight task beyond the guest's own linear memory.

#[path = "../common/mod.rs"]
mod common;
mod count;
mod raw;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use corral_core::metrics::Metrics;
use corral_core::sandbox::{
    Limits, PreparedTenant, Sandbox, SandboxConfig, Task, Tenant, fiber_stack_size,
};
use corral_core::session::cpu::{CpuScheduler, host_slots};
use corral_core::share::CpuShare;
use serde_json::json;

use crate::raw::RawFloor;

const ROUNDS: usize = 7;
const TASKS_PER_ROUND: usize = 2000;

fn example(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../../examples/dist/{name}.wasm"))
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// One guest language's trivial activity: a string in, a string out, no
/// host call.
struct Guest {
    language: &'static str,
    file: &'static str,
    /// The activity type, and where raw wasmtime finds the function.
    activity: &'static str,
    interface: Option<&'static str>,
    function: &'static str,
    /// Whether it returns `result<string, failure>` rather than `string`.
    fallible: bool,
    expected: &'static str,
}

const GUESTS: [Guest; 3] = [
    Guest {
        language: "Rust",
        file: "echo",
        activity: "demo:echo/api.echo-string",
        interface: Some("demo:echo/api"),
        function: "echo-string",
        fallible: false,
        expected: "hello",
    },
    Guest {
        language: "Python",
        file: "python-shout",
        activity: "shout-checked",
        interface: None,
        function: "shout-checked",
        fallible: true,
        expected: "HELLO",
    },
    Guest {
        language: "JavaScript",
        file: "js-greeter",
        activity: "demo:js-greeter/api.shout",
        interface: Some("demo:js-greeter/api"),
        function: "shout",
        fallible: false,
        expected: "HELLO",
    },
];

/// Minor page faults this process has taken so far.
fn page_faults() -> Result<u64> {
    common::page_faults(std::process::id())
}

/// This process's CPU time so far, all threads (to the nanosecond, where
/// /proc counts clock ticks).
fn process_cpu() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    if unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut now) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        u64::try_from(now.tv_sec).unwrap_or(0),
        u32::try_from(now.tv_nsec).unwrap_or(0),
    )
}

/// A per-task figure: µs (wall and CPU) and page faults, medians over
/// rounds.
#[derive(Default)]
struct PerTask {
    micros: Vec<f64>,
    cpu_micros: Vec<f64>,
    faults: Vec<f64>,
}

impl PerTask {
    async fn round<F, Fut>(&mut self, tasks: usize, task: F) -> Result<()>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<()>>,
    {
        let faults = page_faults()?;
        let (start, cpu) = (Instant::now(), process_cpu());
        for _ in 0..tasks {
            task().await?;
        }
        self.micros
            .push(start.elapsed().as_secs_f64() * 1e6 / tasks as f64);
        self.cpu_micros
            .push((process_cpu() - cpu).as_secs_f64() * 1e6 / tasks as f64);
        self.faults
            .push((page_faults()? - faults) as f64 / tasks as f64);
        Ok(())
    }

    fn medians(&self) -> (f64, f64) {
        (median(self.micros.clone()), median(self.faults.clone()))
    }
}

/// corral's full path against raw wasmtime for one guest, on a sandbox of
/// `config`; prints µs and page faults per task for both.
async fn overhead_of(guest: &Guest, config: SandboxConfig, label: &str) -> Result<f64> {
    let sandbox = Arc::new(Sandbox::new(config)?);
    let component = sandbox
        .load_file(&example(guest.file))
        .with_context(|| format!("{}: run examples/build.sh first", guest.file))?;
    let tenant = bench_tenant(&sandbox)?;

    // The raw floor: same engine (pooling, fuel), same component.
    let raw = RawFloor::new(&sandbox, &component, guest)?;
    let raw_task = || raw.task(sandbox.engine());
    let corral_task = || async {
        let task = Task::new(guest.activity, vec![json!("hello")]);
        let out = sandbox.execute(&component, &tenant, task).await;
        anyhow::ensure!(out == Ok(json!(guest.expected)), "{out:?}");
        Ok::<_, anyhow::Error>(())
    };
    // The same task as a session runs it: under the CPU scheduler, on a
    // guest thread.
    let scheduler = CpuScheduler::new(host_slots(), Arc::new(Metrics::default()));
    let (activity, expected) = (guest.activity, guest.expected);
    let scheduled_task = || {
        let (sandbox, component, tenant) = (sandbox.clone(), component.clone(), tenant.clone());
        let scheduler = scheduler.clone();
        async move {
            let task = Task::new(activity, vec![json!("hello")]);
            let work = move || async move { sandbox.execute(&component, &tenant, task).await };
            let (out, _) = scheduler
                .execute(
                    Arc::from("bench"),
                    Arc::default(),
                    CpuShare::default(),
                    work,
                )
                .await;
            anyhow::ensure!(out == Ok(json!(expected)), "{out:?}");
            Ok::<_, anyhow::Error>(())
        }
    };

    // Fewer tasks per round for the interpreters, whose tasks cost more.
    let tasks = if guest.file == "echo" {
        TASKS_PER_ROUND
    } else {
        TASKS_PER_ROUND / 10
    };
    // Warm up both paths.
    for _ in 0..tasks / 10 {
        raw_task().await?;
        corral_task().await?;
        scheduled_task().await?;
    }
    let (mut raw, mut full, mut scheduled) =
        (PerTask::default(), PerTask::default(), PerTask::default());
    for _ in 0..ROUNDS {
        raw.round(tasks, raw_task).await?;
        full.round(tasks, corral_task).await?;
        scheduled.round(tasks, scheduled_task).await?;
    }
    let ((raw_us, raw_faults), (full_us, full_faults)) = (raw.medians(), full.medians());
    // Each round's corral figure against the raw round just before it: the
    // machine's speed drifts between rounds more than within a pair.
    let paired: Vec<f64> = full
        .micros
        .iter()
        .zip(&raw.micros)
        .map(|(full, raw)| full / raw)
        .collect();
    let (low, high) = paired
        .iter()
        .fold((f64::MAX, f64::MIN), |(l, h), r| (l.min(*r), h.max(*r)));
    println!(
        "  {:<10} {label:<22} raw {raw_us:9.2} µs {raw_faults:7.1} faults | corral \
         {full_us:9.2} µs {full_faults:7.1} faults | ratio {:.3}, per round median {:.3} \
         ({low:.3}–{high:.3})",
        guest.language,
        full_us / raw_us,
        median(paired),
    );
    // The scheduler's cost: each round against the direct round before it.
    let per_round =
        |of: &[f64], against: &[f64]| median(of.iter().zip(against).map(|(a, b)| a / b).collect());
    let scheduled_us = median(scheduled.micros.clone());
    let (scheduled_cpu, full_cpu) = (
        median(scheduled.cpu_micros.clone()),
        median(full.cpu_micros.clone()),
    );
    println!(
        "  {:<10} {label:<22} under the CPU scheduler: {scheduled_us:9.2} µs ({:.3} of direct, \
         per round {:.3}), CPU {scheduled_cpu:9.2} µs a task against {full_cpu:.2} µs direct \
         ({:.3}, per round {:.3})",
        guest.language,
        scheduled_us / full_us,
        per_round(&scheduled.micros, &full.micros),
        scheduled_cpu / full_cpu,
        per_round(&scheduled.cpu_micros, &full.cpu_micros),
    );
    Ok(full_us)
}

/// What a task of `guest` leaves for the pool to reset, and the stack it
/// touches, measured on a one-slot sandbox that keeps every freed page
/// resident: the pool's own count of the linear-memory and table bytes it
/// reset after the task (the pages the task dirtied), and the resident pages
/// of its one fiber stack (the pool leaves used stack pages resident), found
/// by the guard page its creation added and read from
/// `/proc/self/pagemap`; after the third task.
async fn footprint(guest: &Guest) -> Result<()> {
    let config = SandboxConfig {
        max_instances: 1,
        memory_keep_resident: 1 << 30,
        table_keep_resident: 1 << 30,
        ..SandboxConfig::default()
    };
    let stack_size = fiber_stack_size(config.max_wasm_stack);
    let guards = stack_guards()?;
    let sandbox = Sandbox::new(config)?;
    let new_guards: Vec<u64> = stack_guards()?
        .into_iter()
        .filter(|g| !guards.contains(g))
        .collect();
    let component = sandbox.load_file(&example(guest.file))?;
    let tenant = bench_tenant(&sandbox)?;
    let metrics = sandbox
        .engine()
        .pooling_allocator_metrics()
        .context("the sandbox's engine has no pool")?;
    for _ in 0..3 {
        let task = Task::new(guest.activity, vec![json!("hello")]);
        let out = sandbox.execute(&component, &tenant, task).await;
        anyhow::ensure!(out == Ok(json!(guest.expected)), "{out:?}");
    }
    let stack = match new_guards[..] {
        [guard_end] => format!(
            "{:6.1} KiB",
            present_bytes(guard_end, stack_size)? as f64 / 1024.0
        ),
        _ => "unknown (no single new stack guard page)".to_owned(),
    };
    println!(
        "  {:<10} per task: linear memory dirtied and reset {:8.1} KiB, table {:6.1} KiB, \
         stack touched {stack}",
        guest.language,
        metrics.unused_memory_bytes_resident() as f64 / 1024.0,
        metrics.unused_table_bytes_resident() as f64 / 1024.0,
    );
    Ok(())
}

/// Where each stack in this process starts: the end of every 4 KiB
/// inaccessible mapping directly below a read-write one (a guard page).
fn stack_guards() -> Result<Vec<u64>> {
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    let mut mappings = Vec::new();
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let range = fields.next().context("maps")?;
        let permissions = fields.next().context("maps")?;
        let (start, end) = range.split_once('-').context("maps")?;
        let (start, end) = (
            u64::from_str_radix(start, 16)?,
            u64::from_str_radix(end, 16)?,
        );
        mappings.push((start, end, permissions.starts_with("---")));
    }
    Ok(mappings
        .windows(2)
        .filter(|pair| {
            let ((start, end, none), (above, _, none_above)) = (pair[0], pair[1]);
            none && end - start == 4096 && above == end && !none_above
        })
        .map(|pair| pair[0].1)
        .collect())
}

/// The bytes of `[start, start + len)` mapped to memory now, from
/// `/proc/self/pagemap` (bit 63 of each page's entry: present).
fn present_bytes(start: u64, len: usize) -> Result<u64> {
    use std::io::{Read, Seek, SeekFrom};
    const PAGE: u64 = 4096;
    let pages = len as u64 / PAGE;
    let mut pagemap = std::fs::File::open("/proc/self/pagemap")?;
    pagemap.seek(SeekFrom::Start(start / PAGE * 8))?;
    let mut entries = vec![0u8; usize::try_from(pages * 8)?];
    pagemap.read_exact(&mut entries)?;
    let present = entries.chunks_exact(8).filter(|e| e[7] & 0x80 != 0).count();
    Ok(present as u64 * PAGE)
}

/// The sandbox settings measured: corral's defaults, and with
/// `CORRAL_BENCH_KEEP_RESIDENT=BYTES` the defaults with that much of each
/// freed linear memory kept resident, side by side.
fn variants() -> Vec<(String, SandboxConfig)> {
    let mut variants = vec![("defaults".to_owned(), SandboxConfig::default())];
    if let Some(bytes) = std::env::var("CORRAL_BENCH_KEEP_RESIDENT")
        .ok()
        .and_then(|b| b.parse::<usize>().ok())
    {
        variants.push((
            format!("keep {} MiB resident", bytes >> 20),
            SandboxConfig {
                memory_keep_resident: bytes,
                ..SandboxConfig::default()
            },
        ));
    }
    variants
}

async fn overhead() -> Result<()> {
    println!(
        "per-task cost, corral's full path (JSON in/out, classify) against raw wasmtime (store, \
         instantiate, typed call) on the same engine and component ({ROUNDS} rounds, medians; \
         page faults per task, whole process):"
    );
    let only: Option<Vec<String>> = std::env::var("CORRAL_BENCH_GUESTS")
        .ok()
        .map(|g| g.split(',').map(str::to_lowercase).collect());
    for guest in &GUESTS {
        if only
            .as_ref()
            .is_some_and(|o| !o.contains(&guest.language.to_lowercase()))
        {
            continue;
        }
        let mut times = Vec::new();
        for (label, config) in variants() {
            times.push(overhead_of(guest, config, &label).await?);
        }
        if let [defaults, other] = times[..] {
            println!(
                "  {:<10} corral, kept resident / defaults: {:.3}",
                guest.language,
                other / defaults
            );
        }
        footprint(guest).await?;
    }
    Ok(())
}

/// The bench tenant with the default limits.
fn bench_tenant(sandbox: &Sandbox) -> Result<PreparedTenant> {
    Ok(sandbox.prepare(Tenant {
        name: "bench".into(),
        ..Tenant::default()
    })?)
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
    Ok(common::status(std::process::id(), "VmRSS")? * 1024)
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

fn main() -> Result<()> {
    // The `corral` binary's allocator settings and `corral serve`'s log,
    // so both paths run as they would in it.
    corral::tune_the_allocator();
    corral::log::init_server_log();
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("count") => return count::count_from_args(&args[2..]),
        Some("callgrind") => return count::scheduler_instructions(),
        _ => {}
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
