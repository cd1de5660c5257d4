//! Instruction counts, repeatable where wall time on a shared machine is
//! not: `sandbox count N …` runs N tasks for valgrind to count, and
//! `sandbox callgrind` runs it under valgrind itself to print the CPU
//! scheduler's instructions per task beside the direct path's.

use std::process::Command;
use std::sync::Arc;

use anyhow::{Context, Result};
use corral_core::metrics::{Metrics, TypeCpu};
use corral_core::sandbox::{LoadedComponent, PreparedTenant, Sandbox, SandboxConfig, Task};
use corral_core::session::cpu::CpuScheduler;
use corral_core::share::CpuShare;
use serde_json::json;

use crate::raw::RawFloor;
use crate::{GUESTS, bench_tenant, example, small_tenant};

/// `sandbox count N [LANGUAGE [raw|scheduled]]`, from its arguments.
pub fn count_from_args(args: &[String]) -> Result<()> {
    let n = args
        .first()
        .and_then(|n| n.parse().ok())
        .context("count N [LANGUAGE [raw|scheduled]]")?;
    let path = match args.get(2).map(String::as_str) {
        None => CountPath::Direct,
        Some("raw") => CountPath::Raw,
        Some("scheduled") => CountPath::Scheduled,
        Some(other) => anyhow::bail!("count N LANGUAGE [raw|scheduled], not `{other}`"),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let counting = Counting::new(args.get(1).map(String::as_str), path)?;
    counted(&runtime, &counting, n)
}

/// The tasks, and nothing before them: what `callgrind` counts
/// (`--toggle-collect=sandbox::count::counted`), so that the compile, whose
/// count varies from run to run by thousands a task, is left out.
#[inline(never)]
fn counted(runtime: &tokio::runtime::Runtime, counting: &Counting, n: usize) -> Result<()> {
    runtime.block_on(counting.tasks(n))
}

/// The task counts `callgrind` runs at: the difference of their
/// instruction counts over the difference of N leaves out the fixed cost
/// (the compile, the engine).
const FEW: usize = 200;
const MANY: usize = 1200;

/// Runs of each path: glibc's `malloc` takes a few hundred instructions a
/// task more or less from one run to the next (the heap's layout as the
/// threads left it), as much as a change to the scheduler may save, so
/// `callgrind` prints every run and the median.
const RUNS: usize = 5;

/// `sandbox callgrind`: the Rust guest's task directly and under the CPU
/// scheduler, each at two counts under `valgrind --tool=callgrind`, the
/// two paths in turn [`RUNS`] times; prints the instructions per task of
/// both in each run and the median of the scheduler's share. valgrind
/// runs one thread at a time and counts user-space instructions only: the
/// clock's system calls, and a hand-off's context switches, are not in it
/// (the `overhead` bench's CPU time has them).
pub fn scheduler_instructions() -> Result<()> {
    let bench = std::env::current_exe().context("finding this bench's binary")?;
    let per_task =
        |path: Option<&str>| -> Result<f64> {
            let mut counts = Vec::new();
            for n in [FEW, MANY] {
                let out = Command::new("valgrind")
                    .args(["--tool=callgrind", "--callgrind-out-file=/dev/null"])
                    .args([
                        "--collect-atstart=no",
                        "--toggle-collect=sandbox::count::counted",
                    ])
                    .arg(&bench)
                    .args(["count", &n.to_string(), "rust"])
                    .args(path)
                    .output()
                    .context("running valgrind (apt-get install valgrind)")?;
                let stderr = String::from_utf8_lossy(&out.stderr);
                anyhow::ensure!(out.status.success(), "valgrind … count {n}: {stderr}");
                counts.push(instructions(&stderr).with_context(|| {
                    format!("no instruction count in valgrind's output: {stderr}")
                })?);
            }
            Ok((counts[1] - counts[0]) as f64 / (MANY - FEW) as f64)
        };
    println!(
        "Instructions per task (callgrind, the Rust guest's string activity, {FEW} and {MANY} \
         tasks, {RUNS} runs of each path in turn):"
    );
    let mut runs = Vec::new();
    for _ in 0..RUNS {
        let direct = per_task(None)?;
        let scheduled = per_task(Some("scheduled"))?;
        println!(
            "  direct {direct:.0}, under the CPU scheduler {scheduled:.0}: the scheduler's \
             {:.0} a task, {:.1} % of the direct path's",
            scheduled - direct,
            (scheduled - direct) * 100.0 / direct,
        );
        runs.push((scheduled - direct, direct));
    }
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (median, direct) = runs[RUNS / 2];
    println!(
        "  median: the scheduler's {median:.0} a task, {:.1} % of the direct path's",
        median * 100.0 / direct
    );
    Ok(())
}

/// The total of valgrind's `I   refs:      1,234,567` line.
fn instructions(stderr: &str) -> Option<i64> {
    let line = stderr.lines().find(|l| l.contains("I   refs:"))?;
    let digits: String = line
        .rsplit(':')
        .next()?
        .chars()
        .filter(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// `sandbox count N`: N tasks of corral's full path on one thread, with a
/// pool small enough for valgrind to reserve, and nothing else; run under
/// `valgrind --tool=callgrind` at two counts, the difference of the
/// instruction counts over the difference of N is the instructions per
/// task, repeatable where wall time is not.
///
/// `sandbox count N LANGUAGE` runs that language's string activity of the
/// `overhead` bench instead of `echo-u32`, with the default memory limit;
/// `sandbox count N LANGUAGE raw` runs the raw floor of the same activity,
/// so the two paths compare instruction by instruction;
/// `sandbox count N LANGUAGE scheduled` runs corral's path under the
/// session's CPU scheduler, as `serve` does, so the difference from the
/// direct run is the scheduler's cost per task.
struct Counting {
    sandbox: Arc<Sandbox>,
    component: Arc<LoadedComponent>,
    tenant: PreparedTenant,
    /// The raw floor instead of corral's path.
    raw: Option<RawFloor>,
    activity: &'static str,
    input: serde_json::Value,
    expected: serde_json::Value,
    /// Two slots, as on this machine: a task's first poll runs on this
    /// thread, as a short task's does in `serve`.
    scheduler: Option<Arc<CpuScheduler>>,
}

impl Counting {
    fn new(language: Option<&str>, path: CountPath) -> Result<Counting> {
        let guest = match language {
            Some(language) => Some(
                GUESTS
                    .iter()
                    .find(|g| g.language.eq_ignore_ascii_case(language))
                    .with_context(|| format!("no guest in {language}"))?,
            ),
            None => None,
        };
        let sandbox = Sandbox::new(SandboxConfig {
            max_instances: 4,
            // No warm instances' slots either: valgrind refuses a
            // reservation of hundreds of GiB.
            max_warm: 0,
            max_memory: if guest.is_some() { 1 << 30 } else { 16 << 20 },
            ..SandboxConfig::default()
        })?;
        let file = guest.map_or("echo", |g| g.file);
        let component = sandbox
            .load_file(&example(file))
            .context("run examples/build.sh first")?;
        let tenant = match guest {
            Some(_) => bench_tenant(&sandbox)?,
            None => small_tenant(&sandbox)?,
        };
        let raw = match (guest, path) {
            (Some(guest), CountPath::Raw) => Some(RawFloor::new(&sandbox, &component, guest)?),
            _ => None,
        };
        let (activity, input, expected) = match guest {
            Some(g) => (g.activity, json!("hello"), json!(g.expected)),
            None => ("demo:echo/api.echo-u32", json!(7), json!(7)),
        };
        let scheduler = (path == CountPath::Scheduled)
            .then(|| CpuScheduler::new(2, Arc::new(Metrics::default())));
        Ok(Counting {
            sandbox,
            component,
            tenant,
            raw,
            activity,
            input,
            expected,
            scheduler,
        })
    }

    async fn tasks(&self, n: usize) -> Result<()> {
        if let Some(raw) = &self.raw {
            for _ in 0..n {
                raw.task(self.sandbox.engine()).await?;
            }
            return Ok(());
        }
        let name: Arc<str> = Arc::from("bench");
        // As a session's route keeps its type's CPU counters.
        let counters = Arc::new(TypeCpu::default());
        for _ in 0..n {
            let task = Task::new(self.activity, vec![self.input.clone()]);
            // The same work either way, so the difference is the
            // scheduler's.
            let (sandbox, component, tenant) = (
                self.sandbox.clone(),
                self.component.clone(),
                self.tenant.clone(),
            );
            let work = move || async move { sandbox.execute(&component, &tenant, task).await };
            let out = match &self.scheduler {
                None => work().await,
                Some(scheduler) => {
                    // As a session passes its route's: the tenant's name
                    // and the activity type's counters, shared.
                    let share = CpuShare::default();
                    scheduler
                        .execute(name.clone(), counters.clone(), share, work)
                        .await
                        .0
                }
            };
            anyhow::ensure!(out == Ok(self.expected.clone()), "{out:?}");
        }
        Ok(())
    }
}

/// How `sandbox count` runs its tasks.
#[derive(Clone, Copy, PartialEq)]
enum CountPath {
    /// corral's full path, called directly.
    Direct,
    /// The raw wasmtime floor (a guest's only).
    Raw,
    /// corral's full path under the session's CPU scheduler.
    Scheduled,
}
