//! Many tenants on one host (`cargo bench -p corral --bench tenants`; needs
//! the `temporal` CLI and `examples/build.sh`).
//!
//! For 1, 100 and 1,000 tenants (`CORRAL_BENCH_TENANTS=1,100,1000`), each
//! on a task queue of its own on one Temporal dev server and each serving
//! the echo component, `corral serve` is started and this prints: the time
//! from spawning it to its "ready" line, its resident memory and threads
//! once ready, its CPU over two spans of 10 idle seconds (the first holds
//! its workers' first polls), its open descriptors, and then
//! serves one activity for the last tenant and one for the first (proof
//! that every tenant's worker polls). Each tenant has `temporal.pollers =
//! 1`, what a host of many small tenants wants; `CORRAL_BENCH_POLLERS=N`
//! (or `default`, for builds without the key) sets another.
//! `CORRAL_BENCH_BIN=path/to/corral` measures another build.

#[path = "common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::json;
use temporalio_client::{Client, ClientOptions, GrpcCompression};

use common::{Process, connect, cpu_time, dev_server, serve_or_fail, status};

const IDLE: Duration = Duration::from_secs(10);

/// What `corral serve` with some number of tenants used.
struct Footprint {
    tenants: usize,
    start: Duration,
    rss_kib: u64,
    threads: u64,
    descriptors: usize,
    /// CPU used in the first 10 s after ready (its workers' first polls),
    /// and in the 10 s after that.
    idle_cpu: (Duration, Duration),
    first_activity: Duration,
}

/// A configuration of `n` tenants, `t0` … `t{n-1}`, each on its own task
/// queue and serving `echo`, with `pollers` (`temporal.pollers = 1` unless
/// `CORRAL_BENCH_POLLERS` says otherwise; `default` leaves it out).
fn config(n: usize, address: &str, echo: &Path, pollers: &str) -> String {
    let mut toml = String::from("[host]\nmax_concurrent = 16\n");
    let pollers = match pollers {
        "default" => String::new(),
        n => format!(", pollers = {n}"),
    };
    for i in 0..n {
        toml.push_str(&format!(
            "[[tenant]]\nname = \"t{i}\"\ntemporal = {{ address = \"http://{address}\", \
             task_queue = \"tenants-{n}-{i}\"{pollers} }}\ncomponents = [{:?}]\n",
            echo.display().to_string()
        ));
    }
    toml
}

/// Starts `corral serve` on `config`; returns the process once it printed
/// "ready", and how long that took.
fn serve(binary: &std::ffi::OsStr, config: &Path) -> Result<(Process, Duration)> {
    let started = Instant::now();
    let process = serve_or_fail(binary, config)?;
    Ok((process, started.elapsed()))
}

async fn measure(
    n: usize,
    binary: &std::ffi::OsStr,
    address: &str,
    client: &Arc<Client>,
    dir: &Path,
    echo: &Path,
) -> Result<Footprint> {
    let path = dir.join(format!("tenants-{n}.toml"));
    let pollers = std::env::var("CORRAL_BENCH_POLLERS").unwrap_or_else(|_| "1".into());
    std::fs::write(&path, config(n, address, echo, &pollers))?;
    let (process, start) = serve(binary, &path)?;
    let pid = process.0.id();
    let start_cpu = cpu_time(pid)?;
    tokio::time::sleep(IDLE).await;
    let settled = cpu_time(pid)?;
    tokio::time::sleep(IDLE).await;
    let idle_cpu = (settled - start_cpu, cpu_time(pid)? - settled);
    let (rss_kib, threads) = (status(pid, "VmRSS")?, status(pid, "Threads")?);
    let descriptors = common::descriptors(pid)?;
    let hello = json!("hello");
    let started = Instant::now();
    for i in [n - 1, 0] {
        let activity = ("demo:echo/api.echo-string", &hello, &hello);
        common::load(
            client,
            &format!("tenants-{n}-{i}"),
            activity,
            1,
            1,
            &format!("t{i}"),
        )
        .await
        .with_context(|| format!("an activity for tenant t{i} of {n}"))?;
    }
    Ok(Footprint {
        tenants: n,
        start,
        rss_kib,
        threads,
        descriptors,
        idle_cpu,
        first_activity: started.elapsed() / 2,
    })
}

async fn bench() -> Result<()> {
    let echo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/dist/echo.wasm");
    anyhow::ensure!(echo.exists(), "build the examples first: examples/build.sh");
    let counts: Vec<usize> = std::env::var("CORRAL_BENCH_TENANTS")
        .unwrap_or_else(|_| "1,100,1000".into())
        .split(',')
        .map(|n| {
            n.trim()
                .parse()
                .context("CORRAL_BENCH_TENANTS: counts, comma separated")
        })
        .collect::<Result<_>>()?;
    anyhow::ensure!(
        !counts.contains(&0),
        "CORRAL_BENCH_TENANTS: at least 1 tenant"
    );
    let binary = std::env::var_os("CORRAL_BENCH_BIN")
        .unwrap_or_else(|| std::ffi::OsString::from(env!("CARGO_BIN_EXE_corral")));
    let dir = tempfile::tempdir()?;
    let (_server, address) = dev_server()?;
    let client = Arc::new(Client::new(
        connect(&address, GrpcCompression::Gzip).await?,
        ClientOptions::new("default").build(),
    )?);
    let mut rows = Vec::new();
    for &n in &counts {
        rows.push(measure(n, &binary, &address, &client, dir.path(), &echo).await?);
    }
    println!(
        "corral serve with N idle tenants (each its own task queue, serving echo) on one dev server:"
    );
    println!(
        "  tenants  start to ready  resident  threads  descriptors  idle CPU (first, next 10 s)  one activity"
    );
    for f in &rows {
        println!(
            "  {:>7}  {:>11.2} s  {:>6.1} MiB  {:>7}  {:>11}  {:>11.2} %, {:>5.2} %      {:>9.1} ms",
            f.tenants,
            f.start.as_secs_f64(),
            f.rss_kib as f64 / 1024.0,
            f.threads,
            f.descriptors,
            f.idle_cpu.0.as_secs_f64() * 100.0 / IDLE.as_secs_f64(),
            f.idle_cpu.1.as_secs_f64() * 100.0 / IDLE.as_secs_f64(),
            f.first_activity.as_secs_f64() * 1e3,
        );
    }
    if let (Some(first), Some(last)) = (rows.first(), rows.last())
        && last.tenants > first.tenants
    {
        let per =
            (last.rss_kib as f64 - first.rss_kib as f64) / (last.tenants - first.tenants) as f64;
        println!(
            "  per tenant beyond the first: {per:.0} KiB resident (target ≤ 256 KiB), {:.3} threads",
            (last.threads as f64 - first.threads as f64) / (last.tenants - first.tenants) as f64
        );
    }
    Ok(())
}

fn main() -> Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(bench())
}
