//! `CORRAL_BENCH_GUESTS=1`: what a task costs corral per guest language
//! through Temporal. One `corral serve` (gRPC compression off) serves a
//! tenant per language, each the language's trivial activity (a string in,
//! a string out, no host call): `examples/echo` in Rust, `python-shout`
//! (componentize-py) and `js-greeter` (componentize-js). Rounds of 200
//! activities per guest, 16 at a time, guests in turn; printed: corral's
//! CPU per activity for each (from /proc), and each interpreter's extra
//! over the Rust guest.

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
const GUESTS: [(&str, &str, &str, &str); 3] = [
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
    for (language, file, _, _) in GUESTS {
        let component = dist.join(format!("{file}.wasm"));
        anyhow::ensure!(
            component.exists(),
            "build the examples first: examples/build.sh"
        );
        toml.push_str(&format!(
            "[[tenant]]\nname = \"{language}\"\ntemporal = {{ address = \"http://{address}\", \
             task_queue = \"guest-{language}\", compression = \"none\" }}\n\
             limits = {{ max_concurrent = {CONCURRENCY} }}\ncomponents = [{:?}]\n",
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
    let run = |i: usize, n: usize, round: String| {
        let (language, _, activity, expected) = GUESTS[i];
        let queue = format!("guest-{language}");
        let expected = json!(expected);
        let hello = hello.clone();
        async move {
            let activity = (activity, &hello, &expected);
            common::load(client, &queue, activity, n, CONCURRENCY, &round).await
        }
    };
    // Warm each up (and wait for its worker to poll).
    for i in 0..GUESTS.len() {
        run(i, 50, "warm".into()).await?;
    }
    let mut cpu = [Duration::ZERO; 3];
    for round in 0..rounds {
        for i in (0..GUESTS.len()).map(|i| (round + i) % GUESTS.len()) {
            let before = cpu_time(pid)?;
            run(i, PER_ROUND, format!("r{round}")).await?;
            cpu[i] += cpu_time(pid)? - before;
        }
    }
    let n = (rounds * PER_ROUND) as f64;
    let per = |i: usize| cpu[i].as_secs_f64() * 1e3 / n;
    println!(
        "{rounds} rounds × {PER_ROUND} activities per guest, {CONCURRENCY} at a time, no gRPC \
         compression: corral's CPU per activity"
    );
    for (i, (language, file, activity, _)) in GUESTS.iter().enumerate() {
        let extra = if i == 0 {
            String::new()
        } else {
            format!(", {:+.2} ms over Rust", per(i) - per(0))
        };
        println!(
            "  {language:<10} {file:<13} {activity:<27} {:6.2} ms{extra}",
            per(i)
        );
    }
    Ok(())
}
