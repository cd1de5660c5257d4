//! `CORRAL_BENCH_CALLGRIND=1`: where a worker's instructions per activity
//! go, counted by `valgrind --tool=callgrind` (repeatable where CPU time on
//! a shared 2-core machine is not). corral (the echo component) and the two
//! native baselines each run under callgrind with instrumentation off; each
//! is warmed up, then instrumentation is switched on (`callgrind_control`)
//! for `CORRAL_BENCH_ACTIVITIES` activities (default 200) and the counts
//! dumped. Printed: instructions per activity by where they were spent
//! (each function's own instructions, grouped by its crate), and corral's
//! costliest functions.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use temporalio_client::Client;

use crate::common::Process;
use crate::{ACTIVITY, compression, native, serve_config};

/// Tasks at once: corral's host slots, so its instance pool (two 4 GiB
/// memory reservations a slot) fits in what valgrind can map.
const CONCURRENCY: usize = 4;
const WARM: usize = 20;

fn activities() -> usize {
    std::env::var("CORRAL_BENCH_ACTIVITIES")
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(200)
}

/// A worker under callgrind, and where its counts go.
struct Counted {
    name: &'static str,
    process: Process,
    out: PathBuf,
}

/// Runs `program` under callgrind, its children too: corral compiles
/// components in a child process, which must see the CPU valgrind
/// emulates (fewer features than the machine's) for its code to load.
fn under_callgrind(
    name: &'static str,
    dir: &Path,
    program: &[&std::ffi::OsStr],
) -> Result<Counted> {
    let out = dir.join(format!("{name}.callgrind"));
    let mut command = Command::new("valgrind");
    command
        .arg("--tool=callgrind")
        .arg("--trace-children=yes")
        .arg("--instr-atstart=no")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(format!(
            "--log-file={}",
            dir.join(format!("{name}.valgrind.log")).display()
        ))
        .args(program)
        .env("CORRAL_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    Ok(Counted {
        name,
        process: Process(command.spawn().context("starting valgrind")?),
        out,
    })
}

/// `callgrind_control ARGS PID`, which waits for the process to act.
fn control(pid: u32, args: &[&str]) -> Result<()> {
    let out = Command::new("callgrind_control")
        .args(args)
        .arg(pid.to_string())
        .output()
        .context("running callgrind_control")?;
    if !out.status.success() {
        bail!(
            "callgrind_control {args:?} {pid}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

pub async fn bench(
    client: &Arc<Client>,
    address: &str,
    dir: &Path,
    corral: &std::ffi::OsStr,
) -> Result<()> {
    let version = Command::new("valgrind").arg("--version").output();
    anyhow::ensure!(
        version.is_ok_and(|v| v.status.success()),
        "CORRAL_BENCH_CALLGRIND needs valgrind (apt-get install valgrind)"
    );
    let echo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/dist/echo.wasm");
    let config = dir.join("callgrind.toml");
    std::fs::write(
        &config,
        serve_config(&echo, address, "corral", CONCURRENCY, ""),
    )?;
    let me = std::env::current_exe()?;
    let mut workers = vec![under_callgrind(
        "corral",
        dir,
        &[
            corral,
            "serve".as_ref(),
            "--config".as_ref(),
            config.as_os_str(),
        ],
    )?];
    for kind in native::Kind::ALL {
        workers.push(under_callgrind(
            kind.name(),
            dir,
            &[
                me.as_os_str(),
                "--native-worker".as_ref(),
                kind.name().as_ref(),
                address.as_ref(),
                kind.name().as_ref(),
            ],
        )?);
    }
    let n = activities();
    let seven = serde_json::json!(7);
    let load = |queue: &'static str, n: usize, round: &'static str| {
        let seven = seven.clone();
        async move {
            let activity = (ACTIVITY, &seven, &seven);
            crate::common::load(client, queue, activity, n, CONCURRENCY, round).await
        }
    };
    let kept = Path::new(env!("CARGO_TARGET_TMPDIR")).join("callgrind");
    std::fs::create_dir_all(&kept)?;
    let mut counts = Vec::new();
    for w in &workers {
        // Started (under valgrind, slowly) and polling.
        load(w.name, WARM, "warm").await?;
        let pid = w.process.0.id();
        control(pid, &["--instr=on"])?;
        load(w.name, n, "counted").await?;
        control(pid, &["--dump"])?;
        control(pid, &["--instr=off"])?;
        // The first dump of `--callgrind-out-file=F` is `F.1`; kept for
        // `callgrind_annotate --tree=caller` and the like.
        let dump = kept.join(format!("{}.callgrind", w.name));
        std::fs::copy(format!("{}.1", w.out.display()), &dump)?;
        counts.push((w.name, functions(&dump)?));
    }
    report(&counts, n);
    println!("the counts: {}/*.callgrind", kept.display());
    Ok(())
}

/// One function's own instructions, as `callgrind_annotate` lists them.
struct Function {
    instructions: u64,
    name: String,
    object: String,
}

/// Every function's own (exclusive) instruction count in a dump.
fn functions(dump: &Path) -> Result<Vec<Function>> {
    let out = Command::new("callgrind_annotate")
        .args(["--threshold=100", "--auto=no", "--inclusive=no"])
        .arg(dump)
        .output()
        .context("running callgrind_annotate")?;
    anyhow::ensure!(
        out.status.success(),
        "callgrind_annotate {}: {}",
        dump.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text.lines().filter_map(parse_line).collect())
}

/// `  832,207 ( 2.67%)  FILE:FUNCTION [OBJECT]`; `None` for other lines.
fn parse_line(line: &str) -> Option<Function> {
    let line = line.trim_start();
    let (count, rest) = line.split_once(' ')?;
    let instructions = count.replace(',', "").parse().ok()?;
    let (_, rest) = rest.split_once(")  ")?;
    if rest.starts_with("PROGRAM TOTALS") || rest.starts_with('*') {
        return None;
    }
    let (location, object) = match rest.rsplit_once(" [") {
        Some((location, object)) => (location, object.trim_end_matches(']')),
        None => (rest, ""),
    };
    let name = location.split_once(':').map_or(location, |(_, f)| f);
    Some(Function {
        instructions,
        name: name.to_owned(),
        object: object.to_owned(),
    })
}

/// Where a function's instructions count: its crate, grouped.
fn category(f: &Function) -> &'static str {
    let object = f.object.rsplit('/').next().unwrap_or("");
    if object.starts_with("libc.so") || object.starts_with("ld-linux") {
        return match f.name.as_str() {
            n if n.contains("memset") || n.contains("memcpy") || n.contains("memmove") => {
                "libc memset/memcpy"
            }
            n if n.contains("malloc") || n.contains("free") || n.contains("calloc") => {
                "malloc/free"
            }
            _ => "libc other (locks, syscalls)",
        };
    }
    let mut name = f.name.trim_start_matches(['<', '&']);
    for wrapper in ["core::ptr::drop_in_place<", "alloc::sync::Arc<"] {
        name = name.strip_prefix(wrapper).unwrap_or(name);
    }
    let name = name.trim_start_matches(['<', '&']);
    if f.name.starts_with("0x") {
        return "unsymbolised (compiled wasm, trampolines)";
    }
    match name.split("::").next().unwrap_or("") {
        "miniz_oxide" | "flate2" | "crc32fast" => "gzip",
        "prost" | "prost_types" | "bytes" => "protobuf, buffers",
        "tonic" | "h2" | "hyper" | "hyper_util" | "http" | "http_body" | "http_body_util"
        | "tower" | "tower_service" | "tower_layer" | "httparse" => "gRPC, HTTP/2",
        "tokio" | "futures_util" | "futures_core" | "futures_channel" | "mio" | "parking_lot"
        | "parking_lot_core" | "crossbeam_channel" | "crossbeam_utils" | "async_channel" => {
            "async runtime"
        }
        n if n.starts_with("temporalio") || n.starts_with("temporal_") => {
            "Temporal worker core, SDK"
        }
        n if n.starts_with("wasmtime") || n.starts_with("cranelift") => "wasmtime",
        "corral" | "corral_core" => "corral",
        "serde_json" | "serde" => "JSON",
        n if n.starts_with("tracing") || n.starts_with("opentelemetry") => "tracing",
        "core" | "alloc" | "std" | "hashbrown" | "indexmap" | "memchr" | "smallvec" => {
            "Rust std, collections"
        }
        "temporal" => "the bench's native worker",
        _ => "other",
    }
}

fn report(counts: &[(&str, Vec<Function>)], n: usize) {
    let per = |i: u64| i as f64 / n as f64 / 1e3;
    let mut table: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for (i, (_, functions)) in counts.iter().enumerate() {
        for f in functions {
            table
                .entry(category(f))
                .or_insert_with(|| vec![0; counts.len()])[i] += f.instructions;
        }
    }
    let mut rows: Vec<_> = table.into_iter().collect();
    rows.sort_by_key(|(_, c)| std::cmp::Reverse(c[0]));
    println!(
        "callgrind: {n} activities each after {WARM} to warm up, {CONCURRENCY} at a time, {} \
         gRPC compression; thousands of instructions per activity, by where they were spent:",
        compression()
    );
    let names: Vec<String> = counts.iter().map(|(w, _)| format!("{w:>9}")).collect();
    println!("  {:<42} {}", "", names.join(" "));
    let mut totals = vec![0u64; counts.len()];
    for (category, c) in &rows {
        let cells: Vec<String> = c.iter().map(|&i| format!("{:9.1}", per(i))).collect();
        println!("  {category:<42} {}", cells.join(" "));
        for (t, i) in totals.iter_mut().zip(c) {
            *t += i;
        }
    }
    let cells: Vec<String> = totals.iter().map(|&i| format!("{:9.1}", per(i))).collect();
    println!("  {:<42} {}", "total", cells.join(" "));
    for (i, (w, _)) in counts.iter().enumerate().skip(1) {
        println!(
            "  corral / {w}: {:.3}",
            totals[0] as f64 / totals[i].max(1) as f64
        );
    }
    let mut corral: Vec<&Function> = counts[0].1.iter().collect();
    corral.sort_by_key(|f| std::cmp::Reverse(f.instructions));
    println!("corral's costliest functions (own instructions, thousands per activity):");
    for f in corral.iter().take(25) {
        let name: String = f.name.chars().take(110).collect();
        println!("  {:8.1}  {name}", per(f.instructions));
    }
}
