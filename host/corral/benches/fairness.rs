//! The fairness benchmark (not a test): does one tenant's heavy load slow
//! another tenant's activities? (`cargo bench -p corral --bench fairness`;
//! needs the `temporal` CLI and `examples/build.sh`.)
//!
//! One `corral serve` on a Temporal dev server, four tenants:
//! - `light` runs short CPU-bound activities (`burn`, about 60 ms of
//!   guest work) one after another and measures each from start to result:
//!   alone, then beside `busy`, then beside `evil`;
//! - `busy` keeps 8 tasks per core of legitimate CPU-bound work (about
//!   1.5 s each) running;
//! - `evil` runs the soak's hostile mix (spinning past deadlines, host-call
//!   loops, memory hogs, floods) at twice the cores;
//! - `heavy` (weight 300) and `busy` (weight 100) both saturate the host
//!   for the weights phase; their CPU shares come from the host's own
//!   `corral_tenant_cpu_seconds_total`.
//!
//! `CORRAL_BENCH_BIN_B=<another corral build>` runs the same phases against
//! it, one build after the other, and prints both side by side (a build
//! without CPU weights runs `heavy` at an equal share and has no CPU
//! metrics to read). `CORRAL_FAIRNESS_LIGHT` sets how many light
//! activities each phase runs (default 200: of fewer, the p99 is the
//! slowest one or two, and one slow task moves it by half).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use temporalio_client::errors::ActivityResultError;
use temporalio_client::{ActivityStartOptions, Client, ClientOptions, GrpcCompression};
use temporalio_common::data_converters::RawValue;
use temporalio_common::{RetryPolicy, UntypedActivity};
use tokio::sync::Semaphore;

use corral::connectors::temporal::payloads;

#[path = "common/mod.rs"]
mod common;
use common::{Process, connect, dev_server, percentile, serve_ready};

/// Rounds of `burn` for a light activity (about 60 ms here) and a busy one
/// (about 1.5 s).
const LIGHT_ROUNDS: u64 = 33_000_000;
const BUSY_ROUNDS: u64 = 800_000_000;
const BURN: &str = "demo:hostile/api.burn";

/// The soak's hostile kinds that end by themselves within a few seconds.
const HOSTILE: [(&str, &[&str]); 6] = [
    ("demo:misbehave/api.spin", &[]),
    ("demo:hostile/api.random-forever", &["1048576"]),
    ("demo:misbehave/api.allocate", &["64"]),
    ("demo:misbehave/api.recurse", &["1000000000"]),
    ("demo:hostile/api.blank-lines", &["200000"]),
    ("demo:misbehave/api.big-output", &["1048576"]),
];

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// The configuration of one build's run; `weights`: the build knows
/// `cpu_weight`.
fn config(address: &str, build: &str, root: &Path, metrics: u16, weights: bool) -> String {
    let hostile = root.join("tests/guests/dist/hostile.wasm");
    let misbehave = root.join("examples/dist/misbehave.wasm");
    let tenant = |name: &str, concurrent: usize, timeout: &str, extra: &str| {
        format!(
            r#"
[[tenant]]
name = "{name}"
temporal = {{ address = "http://{address}", task_queue = "{name}-{build}", compression = "none" }}
limits = {{ max_concurrent = {concurrent}, timeout = "{timeout}", memory = "64MiB" }}
components = ["{}", "{}"]
{extra}
"#,
            hostile.display(),
            misbehave.display()
        )
    };
    let heavy = if weights { "cpu_weight = 300" } else { "" };
    format!(
        "[host]\nmax_concurrent = 256\nmetrics_listen = \"127.0.0.1:{metrics}\"\n{}{}{}{}",
        tenant("light", 4, "120s", ""),
        tenant("busy", 8 * cores(), "600s", ""),
        tenant("heavy", 8 * cores(), "600s", heavy),
        tenant("evil", 2 * cores(), "2s", ""),
    )
}

/// Runs one activity; its latency, or why it did not complete (a hostile
/// kind's failure is its expected ending).
async fn once(
    client: &Client,
    queue: &str,
    ty: &str,
    args: &[&str],
    id: String,
) -> Result<Duration, String> {
    let input = RawValue {
        payloads: args
            .iter()
            .map(|a| payloads::from_json(&serde_json::from_str(a).unwrap_or_default()))
            .collect(),
    };
    let options =
        ActivityStartOptions::with_start_to_close_timeout(queue, id, Duration::from_secs(900))
            .retry_policy(RetryPolicy::builder().maximum_attempts(1).build())
            .build();
    let started = Instant::now();
    let handle = client
        .start_activity(UntypedActivity::new(ty), input, options)
        .await
        .map_err(|e| format!("start: {e}"))?;
    match handle.result().await {
        Ok(_) => Ok(started.elapsed()),
        Err(ActivityResultError::ActivityFailed(e)) => Err(e.failure().message.clone()),
        Err(e) => Err(e.to_string()),
    }
}

/// Keeps `concurrency` activities of `queue` running until `stop`, then
/// waits for those in flight; how many completed.
async fn saturate(
    client: Arc<Client>,
    queue: String,
    kinds: Vec<(&'static str, Vec<String>)>,
    concurrency: usize,
    stop: Arc<AtomicBool>,
) -> Result<usize> {
    let permits = Arc::new(Semaphore::new(concurrency));
    let mut tasks = tokio::task::JoinSet::new();
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) {
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => permit?,
            () = tokio::time::sleep(Duration::from_millis(200)) => continue,
        };
        let (client, queue) = (client.clone(), queue.clone());
        let (ty, args) = kinds[i % kinds.len()].clone();
        let id = format!("{queue}-{i}-{}", std::process::id());
        i += 1;
        tasks.spawn(async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let done = once(&client, &queue, ty, &args, id).await;
            drop(permit);
            done.is_ok()
        });
    }
    let mut completed = 0;
    while let Some(done) = tasks.join_next().await {
        completed += usize::from(done?);
    }
    Ok(completed)
}

/// `light`'s latencies for `n` activities one after another.
async fn light(client: &Client, build: &str, phase: &str, n: usize) -> Result<Vec<Duration>> {
    let queue = format!("light-{build}");
    let rounds = LIGHT_ROUNDS.to_string();
    let mut latencies = Vec::with_capacity(n);
    for i in 0..n {
        let id = format!("{queue}-{phase}-{i}-{}", std::process::id());
        match once(client, &queue, BURN, &[&rounds], id).await {
            Ok(latency) => latencies.push(latency),
            Err(e) => bail!("light activity {i} of {phase} failed: {e}"),
        }
    }
    latencies.sort();
    Ok(latencies)
}

/// How many of light's tasks took corral longer than 100 ms (from the
/// task's start in the host to its outcome), and how many it ran.
fn light_over_100ms(port: u16) -> Result<(u64, u64)> {
    let text = common::scrape(port)?;
    let count = |le: &str| -> u64 {
        text.lines()
            .filter(|l| {
                l.starts_with("corral_task_duration_seconds_bucket{tenant=\"light\"")
                    && l.contains(&format!("le=\"{le}\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    let (within, all) = (count("0.1"), count("+Inf"));
    Ok((all - within, all))
}

/// `heavy`'s and `busy`'s `corral_tenant_cpu_seconds_total`, each summed
/// over types, from one reading.
fn cpu_seconds(port: u16) -> Result<(f64, f64)> {
    let text = common::scrape(port)?;
    let of = |tenant| -> Result<f64> {
        let sum = common::tenants_sum(&text, "corral_tenant_cpu_seconds_total", &[tenant])?;
        Ok(sum.unwrap_or(0.0))
    };
    Ok((of("heavy")?, of("busy")?))
}

/// `corral serve` with `config` written to `path`, once it says it is
/// ready; or what it said when it was not.
fn start(binary: &std::ffi::OsStr, path: &Path, config: &str) -> Result<Result<Process, String>> {
    std::fs::write(path, config)?;
    serve_ready(binary, path)
}

/// What one build did.
struct Run {
    build: String,
    alone: Vec<Duration>,
    beside_busy: Vec<Duration>,
    beside_evil: Vec<Duration>,
    /// Per phase, light's tasks that took the host itself over 100 ms.
    slow_in_host: Vec<(u64, u64)>,
    /// heavy's share of heavy and busy's CPU when both saturate the host.
    heavy_share: Option<f64>,
}

async fn run_build(
    client: &Arc<Client>,
    address: &str,
    dir: &Path,
    root: &Path,
    build: &str,
    binary: &std::ffi::OsStr,
    n: usize,
) -> Result<Run> {
    let metrics = corral::dev_server::free_loopback_port()?;
    let path = dir.join(format!("{build}.toml"));
    // A build that refuses `cpu_weight` runs without it.
    let (corral, weights) =
        match start(binary, &path, &config(address, build, root, metrics, true))? {
            Ok(corral) => (corral, true),
            Err(said) if said.contains("cpu_weight") => {
                let corral = start(binary, &path, &config(address, build, root, metrics, false))?
                    .map_err(|said| anyhow::anyhow!("{build} did not start: {said}"))?;
                (corral, false)
            }
            Err(said) => bail!("{build} did not start: {said}"),
        };
    // Warm-up: every tenant compiles and fills its pool.
    let rounds = LIGHT_ROUNDS.to_string();
    for tenant in ["light", "busy", "heavy"] {
        let queue = format!("{tenant}-{build}");
        once(
            client,
            &queue,
            BURN,
            &[&rounds],
            format!("{queue}-warm-{}", std::process::id()),
        )
        .await
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("{build}: warming {tenant}"))?;
    }

    let mut slow_in_host = Vec::new();
    let mut mark = light_over_100ms(metrics)?;
    let mut phase_mark = |slow: &mut Vec<(u64, u64)>| -> Result<()> {
        let now = light_over_100ms(metrics)?;
        slow.push((now.0 - mark.0, now.1 - mark.1));
        mark = now;
        Ok(())
    };
    let alone = light(client, build, "alone", n).await?;
    phase_mark(&mut slow_in_host)?;

    let busy_kinds = vec![(BURN, vec![BUSY_ROUNDS.to_string()])];
    let stop = Arc::new(AtomicBool::new(false));
    let busy = tokio::spawn(saturate(
        client.clone(),
        format!("busy-{build}"),
        busy_kinds.clone(),
        8 * cores(),
        stop.clone(),
    ));
    let beside_busy = light(client, build, "busy", n).await?;
    phase_mark(&mut slow_in_host)?;
    stop.store(true, Ordering::Relaxed);
    busy.await??;

    let evil_kinds = HOSTILE
        .iter()
        .map(|(ty, args)| (*ty, args.iter().map(|a| (*a).to_owned()).collect()))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let evil = tokio::spawn(saturate(
        client.clone(),
        format!("evil-{build}"),
        evil_kinds,
        2 * cores(),
        stop.clone(),
    ));
    let beside_evil = light(client, build, "evil", n).await?;
    phase_mark(&mut slow_in_host)?;
    stop.store(true, Ordering::Relaxed);
    evil.await??;

    // Weights: both saturate; their CPU from the host's own count, over
    // 15 s once both are running.
    let stop = Arc::new(AtomicBool::new(false));
    let both = [
        tokio::spawn(saturate(
            client.clone(),
            format!("busy-{build}"),
            busy_kinds.clone(),
            8 * cores(),
            stop.clone(),
        )),
        tokio::spawn(saturate(
            client.clone(),
            format!("heavy-{build}"),
            busy_kinds,
            8 * cores(),
            stop.clone(),
        )),
    ];
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = if weights {
        cpu_seconds(metrics).ok()
    } else {
        None
    };
    tokio::time::sleep(Duration::from_secs(15)).await;
    let after = if weights {
        cpu_seconds(metrics).ok()
    } else {
        None
    };
    stop.store(true, Ordering::Relaxed);
    for side in both {
        side.await??;
    }
    let heavy_share = match (before, after) {
        (Some(before), Some(after)) => {
            let (heavy, busy) = (after.0 - before.0, after.1 - before.1);
            Some(heavy / (heavy + busy))
        }
        _ => None,
    };
    drop(corral);
    Ok(Run {
        build: build.to_owned(),
        alone,
        beside_busy,
        beside_evil,
        slow_in_host,
        heavy_share,
    })
}

async fn bench() -> Result<()> {
    let n = std::env::var("CORRAL_FAIRNESS_LIGHT")
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|&n: &usize| n >= 5)
        .unwrap_or(200);
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    for needed in [
        "tests/guests/dist/hostile.wasm",
        "examples/dist/misbehave.wasm",
    ] {
        anyhow::ensure!(
            root.join(needed).exists(),
            "{needed} is missing: build the examples first (examples/build.sh)"
        );
    }
    let dir = std::env::temp_dir().join(format!("corral-fairness-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let (_server, address) = dev_server()?;
    let client = Arc::new(Client::new(
        connect(&address, GrpcCompression::None).await?,
        ClientOptions::new("default").build(),
    )?);
    let mut builds = vec![(
        "this".to_owned(),
        std::ffi::OsString::from(env!("CARGO_BIN_EXE_corral")),
    )];
    if let Some(other) = std::env::var_os("CORRAL_BENCH_BIN_B") {
        builds.push(("b".to_owned(), other));
    }
    println!(
        "fairness: {} cores; light: {n} activities of ~60 ms one after another, per phase",
        cores()
    );
    let mut runs = Vec::new();
    for (build, binary) in &builds {
        runs.push(run_build(&client, &address, &dir, &root, build, binary, n).await?);
    }
    for run in &runs {
        let (p50, p99) = (percentile(&run.alone, 0.5), percentile(&run.alone, 0.99));
        println!("\n{}: light's latency, start to result", run.build);
        let slow = |i: usize| {
            run.slow_in_host
                .get(i)
                .map_or(String::new(), |(slow, all)| {
                    format!("  ({slow} of {all} over 100 ms in the host)")
                })
        };
        println!(
            "  alone         p50 {:>8.1?}  p99 {:>8.1?}{}",
            p50,
            p99,
            slow(0)
        );
        for (i, (phase, latencies)) in [
            ("beside busy", &run.beside_busy),
            ("beside evil", &run.beside_evil),
        ]
        .into_iter()
        .enumerate()
        {
            let (q50, q99) = (percentile(latencies, 0.5), percentile(latencies, 0.99));
            println!(
                "  {phase}   p50 {:>8.1?}  p99 {:>8.1?}  ratio to alone: p50 {:.2}x  p99 {:.2}x{}",
                q50,
                q99,
                q50.as_secs_f64() / p50.as_secs_f64(),
                q99.as_secs_f64() / p99.as_secs_f64(),
                slow(i + 1)
            );
        }
        match run.heavy_share {
            Some(share) => println!(
                "  weights 300:100, both saturating: heavy got {:.1} % of their CPU (its weight's share: 75.0 %)",
                share * 100.0
            ),
            None => println!("  weights: this build has no per-tenant CPU count"),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn main() -> Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(bench())
}
