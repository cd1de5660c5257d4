//! `CORRAL_BENCH_GUESTS=1`: what a task costs corral per guest language
//! through Temporal (`CORRAL_BENCH_GUESTS=rust,python`: those languages
//! only, a list as the sandbox bench takes; one language alone is what a
//! profiler attached to the `corral serve` process sees of it). One `corral serve` (gRPC compression off) serves two
//! tenants per language, each the language's trivial activity (a string in,
//! a string out, no host call): `examples/echo` in Rust, `python-shout`
//! (componentize-py) and `js-greeter` (componentize-js); one tenant with a
//! fresh instance per task, one reusing warm instances (`reuse`). With
//! `CORRAL_BENCH_BIN_B`, a second `corral serve` of that build serves a
//! fresh-instance tenant per language beside it (an older build need not
//! know `reuse`). Rounds of 200 activities per tenant, 16 at a time,
//! tenants in turn; printed: corral's CPU per activity for each (from
//! /proc), each one's ratio to its build's Rust guest on fresh instances,
//! and for the second build each language's extra over Rust against this
//! build's.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use serde_json::json;
use temporalio_client::Client;

use crate::common::{self, Process, cpu_time};

const PER_ROUND: usize = 200;
const CONCURRENCY: usize = 16;

/// Language, component, activity type, result for "hello".
pub type Guest = (&'static str, &'static str, &'static str, &'static str);

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

/// The guests `CORRAL_BENCH_GUESTS` names: `1` for all of them, or a
/// comma-separated list of languages.
pub fn chosen(languages: &str) -> Result<Vec<Guest>> {
    if languages == "1" {
        return Ok(GUESTS.to_vec());
    }
    let mut chosen: Vec<Guest> = Vec::new();
    for language in languages.split(',') {
        let guest = GUESTS
            .iter()
            .find(|g| g.0.eq_ignore_ascii_case(language.trim()))
            .with_context(|| {
                format!(
                    "CORRAL_BENCH_GUESTS: no guest in `{language}` (1, or some of rust, python, \
                     javascript)"
                )
            })?;
        // Its tenants once: `corral serve` refuses a tenant named twice.
        anyhow::ensure!(
            !chosen.contains(guest),
            "CORRAL_BENCH_GUESTS: `{}` named twice",
            guest.0
        );
        chosen.push(*guest);
    }
    Ok(chosen)
}

/// The build measured, and optionally a second one beside it.
pub struct Binaries<'a> {
    pub this: &'a std::ffi::OsStr,
    pub other: Option<&'a std::ffi::OsStr>,
}

/// The tenants a build serves, each with its process's index.
struct Served {
    /// (tenant, guest, index into the processes)
    tenants: Vec<(String, Guest, usize)>,
    processes: Vec<Process>,
}

fn serve(
    served: &mut Served,
    address: &str,
    dir: &Path,
    binary: &std::ffi::OsStr,
    tenants: Vec<(String, Guest)>,
) -> Result<()> {
    let dist = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/dist");
    let mut toml = format!("[host]\nmax_concurrent = {CONCURRENCY}\n");
    for (tenant, (_, file, _, _)) in &tenants {
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
    let index = served.processes.len();
    let config = dir.join(format!("guests-{index}.toml"));
    std::fs::write(&config, toml)?;
    served
        .processes
        .push(common::serve_or_fail(binary, &config)?);
    served
        .tenants
        .extend(tenants.into_iter().map(|(t, g)| (t, g, index)));
    Ok(())
}

pub async fn bench(
    client: &Arc<Client>,
    address: &str,
    dir: &Path,
    binaries: Binaries<'_>,
    guests: &[Guest],
    rounds: usize,
) -> Result<()> {
    let mut served = Served {
        tenants: Vec::new(),
        processes: Vec::new(),
    };
    serve(&mut served, address, dir, binaries.this, tenants(guests))?;
    if let Some(other) = binaries.other {
        let fresh = guests
            .iter()
            .map(|guest| (format!("{}{OTHER}", guest.0), *guest))
            .collect();
        serve(&mut served, address, dir, other, fresh)?;
    }
    let pids: Vec<u32> = served.processes.iter().map(|p| p.0.id()).collect();
    let hello = json!("hello");
    let tenants = &served.tenants;
    let run = |i: usize, n: usize, round: String| {
        let (tenant, (_, _, activity, expected), _) = &tenants[i];
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
            let pid = pids[tenants[i].2];
            let before = cpu_time(pid)?;
            run(i, PER_ROUND, format!("r{round}")).await?;
            cpu[i] += cpu_time(pid)? - before;
        }
    }
    let n = (rounds * PER_ROUND) as f64;
    let per = |i: usize| cpu[i].as_secs_f64() * 1e3 / n;
    let index = |name: &str| tenants.iter().position(|t| t.0 == name);
    let rust = GUESTS[0].0;
    // Each build's Rust tenant on fresh instances, if Rust was chosen.
    let rust_of = |process: usize| {
        let name = if process == 0 {
            rust.to_owned()
        } else {
            format!("{rust}{OTHER}")
        };
        index(&name).map(per)
    };
    println!(
        "{rounds} rounds × {PER_ROUND} activities per tenant, {CONCURRENCY} at a time, no gRPC \
         compression: corral's CPU per activity, and its ratio to its build's Rust guest on \
         fresh instances"
    );
    for (i, (tenant, (_, file, activity, _), process)) in tenants.iter().enumerate() {
        let ratio =
            rust_of(*process).map_or("    -".to_owned(), |r| format!("{:5.2}x", per(i) / r));
        println!(
            "  {tenant:<15} {file:<13} {activity:<27} {:6.3} ms  {ratio}",
            per(i),
        );
    }
    // Both builds' Rust tenants: the second build served, and Rust chosen.
    let (Some(rust_this), Some(rust_that)) = (rust_of(0), rust_of(1)) else {
        return Ok(());
    };
    println!(
        "fresh instances, each language's extra over Rust: this build against \
         CORRAL_BENCH_BIN_B's (its tenants end in {OTHER})"
    );
    // Every language chosen but Rust, each build's fresh tenant.
    for guest in guests.iter().filter(|g| g.0 != rust) {
        let pair = (index(guest.0), index(&format!("{}{OTHER}", guest.0)));
        let (Some(this), Some(that)) = pair else {
            continue;
        };
        let (this, that) = (per(this) - rust_this, per(that) - rust_that);
        println!(
            "  {:<15} {this:6.3} ms against {that:6.3} ms: {:5.2}x",
            guest.0,
            this / that
        );
    }
    Ok(())
}

/// The suffix of the second build's tenants.
const OTHER: &str = "-b";

/// The suffix of the tenants that reuse warm instances.
const WARM: &str = "-warm";

/// Each guest's two tenants: fresh instances, then warm ones.
fn tenants(guests: &[Guest]) -> Vec<(String, Guest)> {
    guests
        .iter()
        .flat_map(|guest| {
            [
                (guest.0.to_owned(), *guest),
                (format!("{}{WARM}", guest.0), *guest),
            ]
        })
        .collect()
}
