//! corral against native Rust activity workers, on one Temporal dev server
//! in one run (`cargo bench -p corral --bench temporal`; needs the `temporal`
//! CLI and `examples/build.sh`).
//!
//! The same trivial activity (`demo:echo/api.echo-u32`: return the input) is
//! served by `corral serve` running the echo component, and answered in Rust
//! by two native workers (see `native.rs`): one on the Temporal Rust SDK
//! (`temporalio-sdk` 1.1.1, the baseline the target is set against) and one
//! on the bare worker core it wraps (`temporalio-sdk-core` 0.10.1, the least
//! any worker can do). A load generator in this process starts standalone
//! activities with bounded concurrency and waits for every result. Printed:
//! throughput, and each worker process's CPU time per activity (from /proc),
//! with corral's ratios against both baselines. `CORRAL_BENCH_GUESTS=1`
//! (or a list: `rust,python`) measures corral alone per guest language
//! instead (`guests.rs`), and
//! `CORRAL_BENCH_CALLGRIND=1` counts instructions per activity under
//! valgrind instead (`callgrind.rs`).

mod callgrind;
#[path = "../common/mod.rs"]
mod common;
mod guests;
mod native;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};
use temporalio_client::{Client, ClientOptions, GrpcCompression};

pub(crate) use common::connect;

/// The tests' OTLP receiver: the traced corral exports to it.
#[allow(dead_code)]
#[path = "../../tests/common/otlp.rs"]
mod otlp;
use common::{Process, cpu_time, dev_server, page_faults, peak_rss_kib, serve_or_fail};

pub(crate) const ACTIVITY: &str = "demo:echo/api.echo-u32";
pub(crate) const CONCURRENCY: usize = 32;
const PER_ROUND: usize = 400;
/// Rounds unless `CORRAL_BENCH_ROUNDS` says otherwise: more rounds tell
/// smaller differences from the noise.
const ROUNDS: usize = 6;
/// The worker of `CORRAL_BENCH_BIN_B`, and its task queue.
const CORRAL_B: &str = "corral-b";

fn rounds() -> usize {
    std::env::var("CORRAL_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .filter(|&r| r > 0)
        .unwrap_or(ROUNDS)
}

/// Per thread name: CPU time and context switches (voluntary +
/// involuntary) so far, summed over the threads that carry the name.
fn threads(pid: u32) -> Result<BTreeMap<String, (Duration, u64)>> {
    let mut by_name = BTreeMap::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let dir = entry?.path();
        let (Ok(stat), Ok(status)) = (
            std::fs::read_to_string(dir.join("stat")),
            std::fs::read_to_string(dir.join("status")),
        ) else {
            continue; // the thread ended meanwhile
        };
        let (name, fields) = common::stat_fields(&stat)?;
        let cpu = common::stat_cpu(&fields)?;
        let switches: u64 = status
            .lines()
            .filter(|l| l.contains("ctxt_switches"))
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum();
        let slot = by_name
            .entry(name.to_owned())
            .or_insert((Duration::ZERO, 0));
        slot.0 += cpu;
        slot.1 += switches;
    }
    Ok(by_name)
}

/// Prints where a worker's CPU went between two [`threads`] snapshots.
fn print_threads(
    who: &str,
    before: &BTreeMap<String, (Duration, u64)>,
    after: &BTreeMap<String, (Duration, u64)>,
    n: f64,
) {
    for (name, (cpu, switches)) in after {
        let (cpu0, switches0) = before.get(name).copied().unwrap_or_default();
        let cpu = cpu.saturating_sub(cpu0).as_secs_f64() * 1e6 / n;
        let switches = switches.saturating_sub(switches0) as f64 / n;
        if cpu > 0.0 || switches > 0.05 {
            println!(
                "    {who} thread {name:<18} {cpu:7.1} µs CPU, {switches:5.2} context switches per activity"
            );
        }
    }
}

/// `CORRAL_BENCH_COMPRESSION=none` turns gRPC compression off for both
/// workers (corral's `temporal.compression`); gzip, the SDK's default,
/// otherwise.
fn compression() -> &'static str {
    match std::env::var("CORRAL_BENCH_COMPRESSION").as_deref() {
        Ok("none") => "none",
        _ => "gzip",
    }
}

/// A `corral serve` configuration: one tenant serving the `echo`
/// component on `queue`, `concurrency` at a time (the host's and the
/// tenant's limit), with `host_extra` added to `[host]`.
pub(crate) fn serve_config(
    echo: &std::path::Path,
    address: &str,
    queue: &str,
    concurrency: usize,
    host_extra: &str,
) -> String {
    format!(
        "[host]\nmax_concurrent = {concurrency}\n{host_extra}[[tenant]]\nname = \"bench\"\n\
         temporal = {{ address = \"http://{address}\", task_queue = \"{queue}\", \
         compression = \"{}\" }}\n\
         limits = {{ max_concurrent = {concurrency} }}\ncomponents = [{:?}]\n",
        compression(),
        echo.display().to_string()
    )
}

/// [`compression`] as the client library spells it.
fn grpc_compression() -> GrpcCompression {
    match compression() {
        "none" => GrpcCompression::None,
        _ => GrpcCompression::Gzip,
    }
}

/// Runs `n` echo activities on `queue`, `CONCURRENCY` at a time; returns
/// the wall time.
async fn load(client: &Arc<Client>, queue: &str, n: usize, round: &str) -> Result<Duration> {
    let seven = serde_json::json!(7);
    common::load(
        client,
        queue,
        (ACTIVITY, &seven, &seven),
        n,
        CONCURRENCY,
        round,
    )
    .await
}

/// One worker process under load, and what it has used.
struct Worker {
    /// Its name in the report, and its task queue.
    name: &'static str,
    process: Process,
    /// Wall time spent on its rounds, and the CPU it used meanwhile.
    time: Duration,
    cpu: Duration,
    /// CPU used per second while idle (timers, pollers waiting).
    idle: f64,
    faults: u64,
    threads: BTreeMap<String, (Duration, u64)>,
}

impl Worker {
    fn new(name: &'static str, process: Process) -> Self {
        Worker {
            name,
            process,
            time: Duration::ZERO,
            cpu: Duration::ZERO,
            idle: 0.0,
            faults: 0,
            threads: BTreeMap::new(),
        }
    }

    fn pid(&self) -> u32 {
        self.process.0.id()
    }
}

async fn bench() -> Result<()> {
    let echo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/dist/echo.wasm");
    anyhow::ensure!(echo.exists(), "build the examples first: examples/build.sh");
    let dir = std::env::temp_dir().join(format!("corral-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let (_server, address) = dev_server()?;
    let client = Arc::new(Client::new(
        connect(&address, GrpcCompression::Gzip).await?,
        ClientOptions::new("default").build(),
    )?);

    // CORRAL_BENCH_BIN runs another build (an older commit) against the
    // same baselines; CORRAL_BENCH_BIN_B adds a second corral build to the
    // same run, for a paired comparison of two builds round by round.
    let this_build = std::ffi::OsString::from(env!("CARGO_BIN_EXE_corral"));
    let mut corrals = vec![(
        "corral",
        std::env::var_os("CORRAL_BENCH_BIN").unwrap_or(this_build),
    )];
    // CORRAL_BENCH_GUESTS=1 (every language) or a list of languages: per
    // guest language instead (see `guests`); empty or 0 is off.
    if let Ok(languages) = std::env::var("CORRAL_BENCH_GUESTS")
        && !matches!(languages.as_str(), "" | "0")
    {
        let other = std::env::var_os("CORRAL_BENCH_BIN_B").filter(|b| !b.is_empty());
        let binaries = guests::Binaries {
            this: &corrals[0].1,
            other: other.as_deref(),
        };
        let guests = guests::chosen(&languages)?;
        guests::bench(&client, &address, &dir, binaries, &guests, rounds()).await?;
        let _ = std::fs::remove_dir_all(&dir);
        return Ok(());
    }
    // CORRAL_BENCH_CALLGRIND=1: instruction counts instead (see `callgrind`).
    if std::env::var("CORRAL_BENCH_CALLGRIND").is_ok_and(|v| v == "1") {
        callgrind::bench(&client, &address, &dir, &corrals[0].1).await?;
        let _ = std::fs::remove_dir_all(&dir);
        return Ok(());
    }
    if let Some(other) = std::env::var_os("CORRAL_BENCH_BIN_B") {
        corrals.push((CORRAL_B, other));
    }
    // CORRAL_BENCH_TRACING=1: the second corral is this build exporting
    // every task's spans over OTLP (to a receiver in this process), so the
    // pair measures what tracing costs.
    let traced = std::env::var("CORRAL_BENCH_TRACING").is_ok_and(|v| v == "1");
    let receiver = traced.then(otlp::Receiver::start);
    if let Some(receiver) = &receiver {
        corrals.truncate(1);
        corrals.push((CORRAL_B, corrals[0].1.clone()));
        println!(
            "corral-b: the same build with tracing on (OTLP to 127.0.0.1:{})",
            receiver.port
        );
    }
    let mut workers = Vec::new();
    for (name, binary) in corrals {
        let config = dir.join(format!("{name}.toml"));
        let tracing = match &receiver {
            Some(r) if name == CORRAL_B => {
                format!(
                    "tracing = {{ otlp_endpoint = \"http://127.0.0.1:{}\" }}\n",
                    r.port
                )
            }
            _ => String::new(),
        };
        std::fs::write(
            &config,
            serve_config(&echo, &address, name, CONCURRENCY, &tracing),
        )?;
        workers.push(Worker::new(name, serve_or_fail(&binary, &config)?));
    }
    for kind in native::Kind::ALL {
        workers.push(Worker::new(
            kind.name(),
            Process(
                Command::new(std::env::current_exe()?)
                    .args(["--native-worker", kind.name(), &address, kind.name()])
                    .stdout(Stdio::null())
                    .spawn()?,
            ),
        ));
    }
    // Warm each up (and wait for it to be polling).
    for w in &workers {
        load(&client, w.name, 100, "warm").await?;
    }

    // What each process burns while idle, to tell per-activity work from
    // background cost when the dev server, not the workers, bounds
    // throughput.
    let idle = Duration::from_secs(5);
    let before: Vec<Duration> = workers
        .iter()
        .map(|w| cpu_time(w.pid()))
        .collect::<Result<_>>()?;
    tokio::time::sleep(idle).await;
    for (w, before) in workers.iter_mut().zip(before) {
        w.idle = (cpu_time(w.pid())? - before).as_secs_f64() / idle.as_secs_f64();
        w.threads = threads(w.pid())?;
        w.faults = page_faults(w.pid())?;
    }

    // Per round, corral's CPU ratio against each baseline.
    let mut round_ratios = vec![Vec::new(); workers.len()];
    for round in 0..rounds() {
        let name = format!("r{round}");
        // Each worker goes first in turn, so none always runs on a dev
        // server another has just warmed (or tired).
        let count = workers.len();
        let mut cpu = vec![Duration::ZERO; count];
        for i in (0..count).map(|i| (round + i) % count) {
            let w = &mut workers[i];
            let before = cpu_time(w.pid())?;
            w.time += load(&client, w.name, PER_ROUND, &name).await?;
            cpu[i] = cpu_time(w.pid())? - before;
            w.cpu += cpu[i];
        }
        for (ratios, baseline) in round_ratios.iter_mut().zip(&cpu) {
            ratios.push(cpu[0].as_secs_f64() / baseline.as_secs_f64());
        }
    }
    report(&workers, &mut round_ratios, receiver.as_ref())?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn report(
    workers: &[Worker],
    round_ratios: &mut [Vec<f64>],
    receiver: Option<&otlp::Receiver>,
) -> Result<()> {
    let n = (rounds() * PER_ROUND) as f64;
    let throughput = |w: &Worker| n / w.time.as_secs_f64();
    let per_activity = |w: &Worker| w.cpu.as_secs_f64() * 1e6 / n;
    // Background CPU (measured idle, per second) spread over the run.
    let working =
        |w: &Worker| (w.cpu.as_secs_f64() - w.idle * w.time.as_secs_f64()).max(0.0) * 1e6 / n;
    println!(
        "{} rounds × {PER_ROUND} standalone activities, {CONCURRENCY} at a time, one dev server, \
         {} gRPC compression:",
        rounds(),
        compression()
    );
    for w in workers {
        println!(
            "  {:<7} {:7.1} activities/s, {:7.1} µs worker CPU per activity ({:.1} µs without idle CPU of {:.1} ms/s), \
             {:.1} page faults per activity, {:.1} MiB peak RSS",
            w.name,
            throughput(w),
            per_activity(w),
            working(w),
            w.idle * 1e3,
            (page_faults(w.pid())? - w.faults) as f64 / n,
            peak_rss_kib(w.pid())? as f64 / 1024.0,
        );
    }
    let corral = &workers[0];
    for (w, ratios) in workers.iter().zip(round_ratios.iter_mut()).skip(1) {
        let (what, targets) = match native::Kind::parse(w.name) {
            Some(native::Kind::Sdk) => (
                "the Temporal Rust SDK worker, the baseline of the targets",
                [" (target ≥ 0.95)", " (target ≤ 1.1)"],
            ),
            Some(native::Kind::Core) => (
                "the bare worker core, stricter than the targets ask",
                [" (target ≥ 0.95)", " (target ≤ 1.1)"],
            ),
            None if receiver.is_some() => ("the same build with tracing on", ["", ""]),
            None => ("the corral build of CORRAL_BENCH_BIN_B", ["", ""]),
        };
        println!("  corral against {what}:");
        println!(
            "    throughput ratio {:.3}{}, CPU per activity ratio {:.3}{}",
            throughput(corral) / throughput(w),
            targets[0],
            per_activity(corral) / per_activity(w),
            targets[1]
        );
        let rounds: Vec<String> = ratios.iter().map(|r| format!("{r:.3}")).collect();
        ratios.sort_by(f64::total_cmp);
        println!(
            "    CPU ratio per round: {}; median {:.3}",
            rounds.join(" "),
            ratios[ratios.len() / 2]
        );
    }
    if let Some(receiver) = receiver {
        println!("corral-b exported {} spans", receiver.received());
    }
    for w in workers {
        print_threads(w.name, &w.threads, &threads(w.pid())?, n);
    }
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    if args.get(1).map(String::as_str) == Some("--native-worker") {
        let (Some(kind), Some(address), Some(queue)) = (
            args.get(2).and_then(|k| native::Kind::parse(k)),
            args.get(3),
            args.get(4),
        ) else {
            bail!("usage: --native-worker sdk|core ADDRESS QUEUE");
        };
        return runtime.block_on(native::serve(kind, address, queue));
    }
    runtime.block_on(bench())
}
