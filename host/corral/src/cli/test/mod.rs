//! `corral test [FILE…]`: the host test harness for guests in any language.
//! Each file names a component, the tenant's limits and capabilities, and
//! cases with expectations (see `spec`). Every case runs through
//! `corral_core::testing` — the sandbox, limits, classification and session loop
//! of `corral serve` — the cases of a file in parallel. One line per case,
//! `N passed, N failed`, exit 1 on a failure; `--junit FILE` for CI.

mod junit;
mod spec;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use corral_core::testing::TestHost;

use super::{CacheArgs, RegistryArgs, read_component, usage_error};
use spec::Spec;

#[derive(clap::Args)]
pub struct Args {
    /// Test files [default: every *.test.toml in the current directory].
    files: Vec<PathBuf>,
    /// Also write the results as JUnit XML to this file.
    #[arg(long)]
    junit: Option<PathBuf>,
    /// Cases of a file run at once [default: 2 per core].
    #[arg(long)]
    jobs: Option<usize>,
    /// Test this component instead of the one a file names: a file, or
    /// oci://… (the same cases against a pushed artifact).
    #[arg(long, value_name = "FILE|oci://…")]
    component: Option<String>,
    #[command(flatten)]
    registry: RegistryArgs,
    #[command(flatten)]
    cache: CacheArgs,
}

/// How one case ended.
pub struct CaseResult {
    pub name: String,
    pub elapsed: Duration,
    /// Empty when it passed.
    pub problems: Vec<String>,
}

/// One file's cases, or why the file could not run.
pub struct FileResult {
    pub path: PathBuf,
    pub cases: Vec<CaseResult>,
    pub error: Option<String>,
}

pub async fn test(args: Args) -> ExitCode {
    let files = if args.files.is_empty() {
        super::files_named(Path::new("."), ".test.toml")
    } else {
        args.files
    };
    if files.is_empty() {
        return usage_error(
            "no test files: name them (corral test FILE…) or put NAME.test.toml here",
        );
    }
    let jobs = args
        .jobs
        .unwrap_or_else(|| 2 * std::thread::available_parallelism().map_or(1, usize::from));
    let mut results = Vec::with_capacity(files.len());
    for path in files {
        let result = run_file(
            &path,
            jobs,
            args.component.as_deref(),
            &args.registry,
            &args.cache,
        )
        .await;
        print_file(&result);
        results.push(result);
    }
    let passed = results
        .iter()
        .flat_map(|f| &f.cases)
        .filter(|c| c.problems.is_empty())
        .count();
    let failed = results
        .iter()
        .map(|f| {
            f.cases.iter().filter(|c| !c.problems.is_empty()).count()
                + usize::from(f.error.is_some())
        })
        .sum::<usize>();
    println!("\n{passed} passed, {failed} failed");
    if let Some(out) = &args.junit
        && let Err(e) = std::fs::write(out, junit::render(&results))
    {
        return usage_error(format!("writing `{}`: {e}", out.display()));
    }
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

async fn run_file(
    path: &Path,
    jobs: usize,
    component: Option<&str>,
    registry: &RegistryArgs,
    cache: &CacheArgs,
) -> FileResult {
    let failed = |error: String| FileResult {
        path: path.to_owned(),
        cases: Vec::new(),
        error: Some(error),
    };
    let spec = match Spec::read(path) {
        Ok(spec) => spec,
        Err(e) => return failed(e.to_string()),
    };
    // Compiled once per component digest (and engine), as `serve` and `run`
    // do: re-running the tests of an unchanged component compiles nothing.
    let mut builder = TestHost::builder()
        .policy(spec.tenant.clone())
        .max_concurrent(jobs);
    if let Some(dir) = cache.sandbox_config().cache_dir {
        builder = builder.cache_dir(dir);
    }
    let host = match builder.build() {
        Ok(host) => host,
        Err(e) => return failed(format!("`{}`: {e:#}", path.display())),
    };
    let source = component.unwrap_or(&spec.component);
    let bytes = match read_component(source, registry).await {
        Ok(bytes) => bytes,
        Err(e) => return failed(corral::error_chain(&e)),
    };
    let component = match host.load_bytes(&bytes) {
        Ok(component) => component,
        Err(e) => return failed(format!("`{source}`: {e}")),
    };
    let permits = Arc::new(tokio::sync::Semaphore::new(jobs.max(1)));
    let mut running = tokio::task::JoinSet::new();
    for (i, case) in spec.cases.iter().enumerate() {
        let call = case.call(&component);
        let permits = permits.clone();
        running.spawn(async move {
            let _permit = permits.acquire_owned().await;
            (i, call.run().await)
        });
    }
    let mut runs = Vec::with_capacity(spec.cases.len());
    while let Some(done) = running.join_next().await {
        match done {
            Ok(run) => runs.push(run),
            Err(e) => return failed(format!("`{}`: a case did not finish: {e}", path.display())),
        }
    }
    runs.sort_by_key(|(i, _)| *i);
    let cases = runs
        .into_iter()
        .zip(&spec.cases)
        .map(|((_, run), case)| CaseResult {
            name: case.name.clone(),
            elapsed: run.elapsed,
            problems: case.mismatches(&run),
        })
        .collect();
    FileResult {
        path: path.to_owned(),
        cases,
        error: None,
    }
}

fn print_file(result: &FileResult) {
    let file = result.path.display();
    if let Some(error) = &result.error {
        println!("FAIL {file}: {error}");
        return;
    }
    for case in &result.cases {
        let ms = case.elapsed.as_secs_f64() * 1e3;
        if case.problems.is_empty() {
            println!("ok   {file}: {} ({ms:.0} ms)", case.name);
        } else {
            println!("FAIL {file}: {} ({ms:.0} ms)", case.name);
            for problem in &case.problems {
                println!("       {problem}");
            }
        }
    }
}
