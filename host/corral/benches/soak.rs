//! The soak benchmark (not a test): 10,000 Temporal activities through one
//! `corral serve`, from three tenants on one dev server
//! (`cargo bench -p corral --bench soak`; needs the `temporal` CLI and
//! `examples/build.sh`). `CORRAL_SOAK_TOTAL` scales the run;
//! `CORRAL_BENCH_BIN` runs another corral build (an older commit) instead;
//! `CORRAL_SOAK_EVIL_CPU_MAX` caps the hostile tenant's cores (`cpu_max`).
//!
//! Tenants `good-a` (echo) and `good-b` (greeter) behave; tenant `evil`
//! runs a mix of hostile guests (spinning and host-call loops past their
//! deadline, memory hogs, stack overflows, panics, wild reads, oversized
//! results, output floods, its own failures) at its `max_concurrent` of 4,
//! twice the cores here. The run has two phases: the good tenants alone
//! (the baseline), then the good tenants beside the hostile load.
//!
//! Printed: every activity's ending against the one expected of it (zero
//! lost, zero unexpected is the bar), the good tenants' p50/p99 latency in
//! each phase and the ratio, and the host's resident memory and open file
//! descriptors after warm-up and at the end. Then, for each phase, where the
//! good tenants' time went by the engine's own timestamps (read once the run
//! is over: `common/timeline.rs`): to scheduled, queued for a worker, at the
//! worker, and from the outcome to the client's result.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Result;
use temporalio_client::errors::ActivityResultError;
use temporalio_client::{ActivityStartOptions, Client, ClientOptions, GrpcCompression};
use temporalio_common::data_converters::RawValue;
use temporalio_common::protos::temporal::api::failure::v1::{Failure, failure::FailureInfo};
use temporalio_common::{RetryPolicy, UntypedActivity};
use tokio::sync::Semaphore;

use corral::connectors::temporal::payloads;

#[path = "common/mod.rs"]
mod common;
use common::{dev_server, percentile, serve_or_fail};

const TOTAL: usize = 10_000;
/// Of every ten activities, this many are the hostile tenant's in phase 2.
const HOSTILE_PER_TEN: usize = 1;
/// The good tenants' calls in flight, each.
const GOOD_CONCURRENCY: usize = 12;
/// The hostile tenant's: twice its `max_concurrent`, so its tasks queue too.
const HOSTILE_CONCURRENCY: usize = 8;

/// One kind of activity: tenant (task queue), type, JSON arguments, and the
/// ending expected (`completed`, or the failure's type).
struct Kind {
    tenant: &'static str,
    ty: &'static str,
    args: &'static [&'static str],
    expected: &'static str,
}

const GOOD: [Kind; 2] = [
    Kind {
        tenant: "good-a",
        ty: "demo:echo/api.echo-u32",
        args: &["7"],
        expected: "completed",
    },
    Kind {
        tenant: "good-b",
        ty: "demo:greeter/api.greet",
        args: &[r#"{"name":"Ada","language":"english"}"#, r#""casual""#],
        expected: "completed",
    },
];

const HOSTILE: [Kind; 10] = [
    Kind {
        tenant: "evil",
        ty: "demo:misbehave/api.spin",
        args: &[],
        expected: "Timeout",
    },
    Kind {
        tenant: "evil",
        ty: "demo:hostile/api.random-forever",
        args: &["1048576"],
        expected: "Timeout",
    },
    Kind {
        tenant: "evil",
        ty: "demo:misbehave/api.allocate",
        args: &["64"],
        expected: "ResourceExhausted",
    },
    Kind {
        tenant: "evil",
        ty: "demo:misbehave/api.recurse",
        args: &["1000000000"],
        expected: "Trap",
    },
    Kind {
        tenant: "evil",
        ty: "demo:misbehave/api.panic",
        args: &[r#""soak""#],
        expected: "Panic",
    },
    Kind {
        tenant: "evil",
        ty: "demo:misbehave/api.wild-read",
        args: &[],
        expected: "Trap",
    },
    Kind {
        tenant: "evil",
        ty: "demo:hostile/api.big-list",
        args: &["4000000"],
        expected: "InvalidOutput",
    },
    Kind {
        tenant: "evil",
        ty: "demo:misbehave/api.big-output",
        args: &["1048576"],
        expected: "InvalidOutput",
    },
    Kind {
        tenant: "evil",
        ty: "demo:hostile/api.blank-lines",
        args: &["200000"],
        expected: "completed",
    },
    Kind {
        tenant: "evil",
        ty: "demo:misbehave/api.fail",
        args: &[r#""Nope""#, "false"],
        expected: "Nope",
    },
];

/// One activity's ending and how long it took from start to result.
struct Ending {
    kind: usize,
    ending: String,
    latency: Duration,
    /// Its id, and when it was sent and its result came (for the engine's
    /// account of where the time went, read after the run).
    sent: common::timeline::Sent,
}

/// The type of a failure: the application failure's, found through causes.
fn failure_type(failure: &Failure) -> String {
    match &failure.failure_info {
        Some(FailureInfo::ApplicationFailureInfo(info)) => info.r#type.clone(),
        Some(FailureInfo::TimeoutFailureInfo(_)) => "engine timeout".to_owned(),
        _ => match &failure.cause {
            Some(cause) => failure_type(cause),
            None => format!("unclassified: {}", failure.message),
        },
    }
}

async fn run_one(client: &Client, kind: &Kind, id: String) -> String {
    let input = RawValue {
        payloads: kind
            .args
            .iter()
            .map(|a| {
                let value: serde_json::Value =
                    serde_json::from_str(a).unwrap_or(serde_json::Value::Null);
                payloads::from_json(&value)
            })
            .collect(),
    };
    let options =
        ActivityStartOptions::with_start_to_close_timeout(kind.tenant, id, Duration::from_secs(60))
            .retry_policy(RetryPolicy::builder().maximum_attempts(1).build())
            .build();
    let handle = match client
        .start_activity(UntypedActivity::new(kind.ty), input, options)
        .await
    {
        Ok(handle) => handle,
        Err(e) => return format!("lost: start: {e}"),
    };
    match handle.result().await {
        Ok(_) => "completed".to_owned(),
        Err(ActivityResultError::ActivityFailed(e)) => failure_type(e.failure()),
        Err(e) => format!("lost: {e}"),
    }
}

/// Runs `count` activities cycling through `kinds` (indices into `all`),
/// `concurrency` at a time.
async fn drive(
    client: Arc<Client>,
    kinds: Vec<usize>,
    count: usize,
    concurrency: usize,
    phase: &'static str,
) -> Result<Vec<Ending>> {
    let permits = Arc::new(Semaphore::new(concurrency));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..count {
        let permit = permits.clone().acquire_owned().await?;
        let client = client.clone();
        let kind = kinds[i % kinds.len()];
        let id = format!("{phase}-{}-{i}-{}", all()[kind].tenant, std::process::id());
        tasks.spawn(async move {
            let (started, sent) = (Instant::now(), SystemTime::now());
            let ending = run_one(&client, &all()[kind], id.clone()).await;
            drop(permit);
            Ending {
                kind,
                ending,
                latency: started.elapsed(),
                sent: common::timeline::Sent {
                    id,
                    sent,
                    received: SystemTime::now(),
                },
            }
        });
    }
    let mut endings = Vec::with_capacity(count);
    while let Some(done) = tasks.join_next().await {
        endings.push(done?);
    }
    Ok(endings)
}

fn all() -> &'static [Kind] {
    static ALL: std::sync::OnceLock<Vec<Kind>> = std::sync::OnceLock::new();
    ALL.get_or_init(|| GOOD.into_iter().chain(HOSTILE).collect())
}

/// Resident memory (KiB) and open file descriptors of a process.
fn footprint(pid: u32) -> Result<(u64, usize)> {
    Ok((common::status(pid, "VmRSS")?, common::descriptors(pid)?))
}

/// The good tenants' tasks as the host counts them: how many, and the
/// seconds they took in it (start to outcome), used of CPU and waited for
/// a core; each none where the host did not say (an older build, or
/// `/metrics` not answering: the run goes on).
#[derive(Clone, Copy, Default)]
struct InHost {
    tasks: Option<f64>,
    took: Option<f64>,
    cpu: Option<f64>,
    waited: Option<f64>,
}

impl InHost {
    fn now(metrics: u16) -> InHost {
        let Ok(text) = common::scrape(metrics) else {
            return InHost::default();
        };
        let sum = |metric| {
            common::tenants_sum(&text, metric, &["good-a", "good-b"])
                .ok()
                .flatten()
        };
        InHost {
            tasks: sum("corral_task_duration_seconds_count"),
            took: sum("corral_task_duration_seconds_sum"),
            cpu: sum("corral_tenant_cpu_seconds_total"),
            waited: sum("corral_tenant_cpu_wait_seconds_total"),
        }
    }

    /// What was counted between `before` and this, per task, in ms.
    fn per_task_since(self, before: InHost) -> String {
        let tasks = match (self.tasks, before.tasks) {
            (Some(now), Some(then)) => (now - then).max(1.0),
            _ => return "n/a (no task counts from the host)".to_owned(),
        };
        let ms = |now: Option<f64>, then: Option<f64>| match (now, then) {
            (Some(now), Some(then)) => format!("{:.2} ms", (now - then) * 1e3 / tasks),
            _ => "n/a".to_owned(),
        };
        format!(
            "{} (CPU {}, waiting for a core {})",
            ms(self.took, before.took),
            ms(self.cpu, before.cpu),
            ms(self.waited, before.waited)
        )
    }
}

/// The CPU the engine's server and corral have used so far, and when.
struct Cores {
    at: Instant,
    server: Duration,
    corral: Duration,
    client: Duration,
}

impl Cores {
    fn now(server: u32, corral: u32) -> Result<Cores> {
        Ok(Cores {
            at: Instant::now(),
            server: common::cpu_time(server)?,
            corral: common::cpu_time(corral)?,
            client: common::cpu_time(std::process::id())?,
        })
    }

    /// The cores each used on average between `before` and this.
    fn since(&self, before: &Cores) -> String {
        let wall = self.at.duration_since(before.at).as_secs_f64().max(1e-9);
        format!(
            "engine's server {:.2}, corral {:.2}, this bench's client {:.2}",
            (self.server - before.server).as_secs_f64() / wall,
            (self.corral - before.corral).as_secs_f64() / wall,
            (self.client - before.client).as_secs_f64() / wall
        )
    }
}

async fn connect(address: &str) -> Result<Client> {
    let connection = common::connect(address, GrpcCompression::Gzip).await?;
    Ok(Client::new(
        connection,
        ClientOptions::new("default").build(),
    )?)
}

fn config(
    address: &str,
    dist: &std::path::Path,
    hostile: &std::path::Path,
    metrics: u16,
    evil_cpu_max: Option<f64>,
) -> String {
    let file = |name: &str| {
        format!(
            "{:?}",
            dist.join(format!("{name}.wasm")).display().to_string()
        )
    };
    let mut text = format!(
        "[host]\nmax_concurrent = 32\nshutdown_grace = \"5s\"\n\
         metrics_listen = \"127.0.0.1:{metrics}\"\n"
    );
    for (tenant, limits, components) in [
        ("good-a", "max_concurrent = 12", vec![file("echo")]),
        ("good-b", "max_concurrent = 12", vec![file("greeter")]),
        (
            "evil",
            "max_concurrent = 4, memory = \"32MiB\", timeout = \"2s\", max_output = \"64KiB\"",
            vec![
                file("misbehave"),
                format!("{:?}", hostile.display().to_string()),
            ],
        ),
    ] {
        let cap = match (evil_cpu_max, tenant) {
            (Some(cap), "evil") => format!("cpu_max = {cap}\n"),
            _ => String::new(),
        };
        text.push_str(&format!(
            "\n[[tenant]]\nname = \"{tenant}\"\n{cap}\
             temporal = {{ address = \"http://{address}\", task_queue = \"{tenant}\" }}\n\
             limits = {{ {limits} }}\ncomponents = [{}]\n",
            components.join(", ")
        ));
    }
    text
}

async fn soak() -> Result<()> {
    let total = std::env::var("CORRAL_SOAK_TOTAL")
        .ok()
        .and_then(|t| t.parse().ok())
        .filter(|&t: &usize| t >= 100)
        .unwrap_or(TOTAL);
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dist = root.join("examples/dist");
    let hostile = root.join("tests/guests/dist/hostile.wasm");
    for needed in [dist.join("misbehave.wasm"), hostile.clone()] {
        anyhow::ensure!(
            needed.exists(),
            "{} is missing: build the examples first (examples/build.sh)",
            needed.display()
        );
    }
    let dir = std::env::temp_dir().join(format!("corral-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let (server, address) = dev_server()?;
    let client = Arc::new(connect(&address).await?);
    let config_path = dir.join("corral.toml");
    let metrics = corral::dev_server::free_loopback_port()?;
    // CORRAL_SOAK_EVIL_CPU_MAX: a cap on the hostile tenant's cores, to
    // tell what its guests' CPU costs the good tenants from what its
    // activities cost the engine.
    let evil_cpu_max = match std::env::var("CORRAL_SOAK_EVIL_CPU_MAX") {
        Ok(cap) => Some(cap.parse::<f64>().map_err(|e| {
            anyhow::anyhow!("CORRAL_SOAK_EVIL_CPU_MAX {cap:?} is not a number of cores: {e}")
        })?),
        Err(_) => None,
    };
    std::fs::write(
        &config_path,
        config(&address, &dist, &hostile, metrics, evil_cpu_max),
    )?;
    // CORRAL_BENCH_BIN: another build (an older commit) under the same load.
    let binary = std::env::var_os("CORRAL_BENCH_BIN")
        .unwrap_or_else(|| std::ffi::OsString::from(env!("CARGO_BIN_EXE_corral")));
    let corral = serve_or_fail(&binary, &config_path)?;
    let pid = corral.0.id();
    let good: Vec<usize> = (0..GOOD.len()).collect();
    let hostile_kinds: Vec<usize> = (GOOD.len()..all().len()).collect();

    // Warm-up: every kind once (the host compiles, the pools fill).
    let mut warm = drive(client.clone(), good.clone(), 50, 8, "warm").await?;
    warm.extend(drive(client.clone(), hostile_kinds.clone(), 10, 10, "warm").await?);
    let start = footprint(pid)?;
    let warmed = InHost::now(metrics);
    let cores_warmed = Cores::now(server.0.id(), pid)?;

    // Phase 1: the good tenants alone.
    let under_attack_good = total * (10 - HOSTILE_PER_TEN) / 10 * 7 / 9;
    let hostile_count = total * HOSTILE_PER_TEN / 10;
    let alone_count = total - under_attack_good - hostile_count;
    let began = Instant::now();
    let alone = drive(
        client.clone(),
        good.clone(),
        alone_count,
        2 * GOOD_CONCURRENCY,
        "alone",
    )
    .await?;
    let alone_time = began.elapsed();
    let after_alone = InHost::now(metrics);
    let cores_alone = Cores::now(server.0.id(), pid)?;

    // Phase 2: the same beside the hostile tenant, saturated throughout.
    let began = Instant::now();
    let (beside, attack) = tokio::join!(
        drive(
            client.clone(),
            good.clone(),
            under_attack_good,
            2 * GOOD_CONCURRENCY,
            "beside",
        ),
        drive(
            client.clone(),
            hostile_kinds,
            hostile_count,
            HOSTILE_CONCURRENCY,
            "attack",
        ),
    );
    let (beside, attack) = (beside?, attack?);
    let attack_time = began.elapsed();
    let end = footprint(pid)?;
    let after_beside = InHost::now(metrics);
    let cores_beside = Cores::now(server.0.id(), pid)?;
    drop(corral);

    report(
        &[&warm, &alone, &beside, &attack],
        (alone_time, attack_time),
        (start, end),
    );
    println!(
        "  good tenants in the host, per activity: alone {}; beside the hostile load {}",
        after_alone.per_task_since(warmed),
        after_beside.per_task_since(after_alone)
    );
    println!(
        "  cores used, of {}: alone {}; beside the hostile load {}",
        std::thread::available_parallelism().map_or(1, usize::from),
        cores_alone.since(&cores_warmed),
        cores_beside.since(&cores_alone)
    );
    // Where the good tenants' time went, by the engine's own timestamps:
    // read now, no load on the phases they describe.
    for (phase, endings) in [("alone", alone), ("beside the hostile load", beside)] {
        let sent = endings.into_iter().map(|e| e.sent).collect();
        let (stages, missing) = common::timeline::read(&client, sent, 16).await;
        println!("  good tenants {phase}, by the engine's times:");
        for line in common::timeline::summary(&stages, missing) {
            println!("    {line}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn report(
    phases: &[&Vec<Ending>; 4],
    times: (Duration, Duration),
    footprints: ((u64, usize), (u64, usize)),
) {
    let [warm, alone, beside, attack] = *phases;
    println!(
        "{} activities to warm up; {} good alone in {:.1} s; {} good beside {} hostile in {:.1} s",
        warm.len(),
        alone.len(),
        times.0.as_secs_f64(),
        beside.len(),
        attack.len(),
        times.1.as_secs_f64()
    );
    // Accounting: per kind, what each ending was.
    let mut table: BTreeMap<usize, BTreeMap<&str, usize>> = BTreeMap::new();
    let (mut lost, mut unexpected) = (0, 0);
    for ending in phases.iter().flat_map(|p| p.iter()) {
        let kind = &all()[ending.kind];
        *table
            .entry(ending.kind)
            .or_default()
            .entry(ending.ending.as_str())
            .or_default() += 1;
        if ending.ending.starts_with("lost") {
            lost += 1;
        } else if ending.ending != kind.expected {
            unexpected += 1;
        }
    }
    println!(
        "  {:<8} {:<34} {:<18} endings",
        "tenant", "activity type", "expected"
    );
    for (kind, endings) in &table {
        let k = &all()[*kind];
        let endings: Vec<String> = endings.iter().map(|(e, n)| format!("{e} × {n}")).collect();
        println!(
            "  {:<8} {:<34} {:<18} {}",
            k.tenant,
            k.ty,
            k.expected,
            endings.join(", ")
        );
    }
    println!("  lost: {lost}; ended otherwise than expected: {unexpected}");
    let latencies = |phase: &Vec<Ending>| -> Vec<Duration> {
        let mut sorted: Vec<Duration> = phase.iter().map(|e| e.latency).collect();
        sorted.sort_unstable();
        sorted
    };
    let (a, b) = (latencies(alone), latencies(beside));
    let (a50, a99) = (percentile(&a, 0.5), percentile(&a, 0.99));
    let (b50, b99) = (percentile(&b, 0.5), percentile(&b, 0.99));
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "  good tenants' latency, start to result: alone p50 {:.1} ms, p99 {:.1} ms; \
         beside the hostile load p50 {:.1} ms, p99 {:.1} ms (p99 ratio {:.2})",
        ms(a50),
        ms(a99),
        ms(b50),
        ms(b99),
        ms(b99) / ms(a99)
    );
    let ((rss0, fds0), (rss1, fds1)) = footprints;
    println!(
        "  host after warm-up: {:.1} MiB resident, {fds0} open descriptors; at the end: \
         {:.1} MiB, {fds1} descriptors",
        rss0 as f64 / 1024.0,
        rss1 as f64 / 1024.0
    );
}

fn main() -> Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(soak())
}
