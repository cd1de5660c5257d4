//! `CORRAL_BENCH_GUESTS=1`: what a task costs corral per guest language
//! through Temporal. One `corral serve` (gRPC compression off) serves two
//! tenants per language, each the language's trivial activity (a string in,
//! a string out, no host call): `examples/echo` in Rust, `python-shout`
//! (componentize-py) and `js-greeter` (componentize-js); one tenant with a
//! fresh instance per task, one reusing warm instances (`reuse`). Rounds of
//! 200 activities per tenant, 16 at a time, tenants in turn; printed:
//! corral's CPU per activity for each (from /proc), and each one's ratio to
//! the Rust guest's on fresh instances.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use serde_json::json;
use temporalio_client::Client;

use crate::common::{self, Process, cpu_time};

const PER_ROUND: usize = 200;
const CONCURRENCY: usize = 16;

/// Language, component, activity type, result for "hello".
type Guest = (&'static str, &'static str, &'static str, &'static str);

const GUESTS: [Guest; 3] = [
    ("rust", "echo", "demo:echo/api.echo-string", "hello"),
    ("python", "python-shout", "shout-checked", "HELLO"),
    (
        "javascript",
        "js-greeter",
        "demo:js-greeter/api.shout",
        "HELLO",
    ),
];

pub async fn bench(
    client: &Arc<Client>,
    address: &str,
    dir: &Path,
    binary: &std::ffi::OsStr,
    rounds: usize,
) -> Result<()> {
    let dist = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/dist");
    let mut toml = format!("[host]\nmax_concurrent = {CONCURRENCY}\n");
    for (tenant, (_, file, _, _)) in tenants() {
        let reuse = if tenant.ends_with(WARM) {
            "reuse = { max_tasks = 100000, idle = \"60s\" }\n".to_owned()
        } else {
            String::new()
        };
        let component = dist.join(format!("{file}.wasm"));
        anyhow::ensure!(
            component.exists(),
            "build the examples first: examples/build.sh"
        );
        toml.push_str(&format!(
            "[[tenant]]\nname = \"{tenant}\"\ntemporal = {{ address = \"http://{address}\", \
             task_queue = \"guest-{tenant}\", compression = \"none\" }}\n\
             limits = {{ max_concurrent = {CONCURRENCY} }}\ncomponents = [{:?}]\n{reuse}",
            component.display().to_string()
        ));
    }
    let config = dir.join("guests.toml");
    std::fs::write(&config, toml)?;
    let corral = Process(
        Command::new(binary)
            .args(["serve", "--config", &config.display().to_string()])
            .env("CORRAL_LOG", "warn")
            .stderr(Stdio::null())
            .spawn()?,
    );
    let pid = corral.0.id();
    let hello = json!("hello");
    let tenants = tenants();
    let run = |i: usize, n: usize, round: String| {
        let (tenant, (_, _, activity, expected)) = &tenants[i];
        let queue = format!("guest-{tenant}");
        let expected = json!(expected);
        let hello = hello.clone();
        async move {
            let activity = (*activity, &hello, &expected);
            common::load(client, &queue, activity, n, CONCURRENCY, &round).await
        }
    };
    // Warm each up (and wait for its worker to poll).
    for i in 0..tenants.len() {
        run(i, 50, "warm".into()).await?;
    }
    let mut cpu = vec![Duration::ZERO; tenants.len()];
    for round in 0..rounds {
        for i in (0..tenants.len()).map(|i| (round + i) % tenants.len()) {
            let before = cpu_time(pid)?;
            run(i, PER_ROUND, format!("r{round}")).await?;
            cpu[i] += cpu_time(pid)? - before;
        }
    }
    let n = (rounds * PER_ROUND) as f64;
    let per = |i: usize| cpu[i].as_secs_f64() * 1e3 / n;
    println!(
        "{rounds} rounds × {PER_ROUND} activities per tenant, {CONCURRENCY} at a time, no gRPC \
         compression: corral's CPU per activity, and its ratio to Rust's on fresh instances"
    );
    for (i, (tenant, (_, file, activity, _))) in tenants.iter().enumerate() {
        println!(
            "  {tenant:<15} {file:<13} {activity:<27} {:6.3} ms  {:5.2}x",
            per(i),
            per(i) / per(0)
        );
    }
    Ok(())
}

/// The suffix of the tenants that reuse warm instances.
const WARM: &str = "-warm";

/// Each guest's two tenants: fresh instances, then warm ones.
fn tenants() -> Vec<(String, Guest)> {
    GUESTS
        .iter()
        .flat_map(|guest| {
            [
                (guest.0.to_owned(), *guest),
                (format!("{}{WARM}", guest.0), *guest),
            ]
        })
        .collect()
}
