//! `corral` subcommands. Exit codes are a contract scripts rely on: 0
//! success, 1 the activity failed (a classified failure), 2 usage or load
//! errors.

mod admin;
mod deploy;
mod dev;
mod diff;
mod inspect;
mod new;
mod push;
mod run;
mod serve;
mod sign;
mod status;
mod test;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use corral::error_chain;
pub(crate) use corral::log::{CLI_LOG, ExtraLayer, SERVER_LOG, init_tracing, init_tracing_with};
use corral_core::sandbox::SandboxConfig;
use corral_core::shown::Shown;

#[derive(Parser)]
#[command(
    name = "corral",
    version,
    about = "A WebAssembly-sandboxed activity host"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List a component's activity types with their WIT signatures, and its
    /// imports.
    Inspect(inspect::Args),
    /// What a new version of a component changes for its callers: activity
    /// types added, removed and changed (and which changes break a caller),
    /// imports added and removed.
    Diff(diff::Args),
    /// Run one activity of a component in the sandbox, with JSON arguments,
    /// through the same session loop as `serve`.
    Run(run::Args),
    /// Serve the configured tenants' activities to Temporal or Aion until
    /// SIGINT/SIGTERM.
    Serve(serve::Args),
    /// Start a Temporal dev server and serve components on it, printing
    /// ready-to-paste `temporal activity execute` lines. Ctrl-C stops both.
    Dev(dev::Args),
    /// Upload a component to a running host and (by default) activate it.
    Deploy(deploy::Args),
    /// List the stored versions of a tenant's components.
    Ls(admin::ConnOnly),
    /// Show one stored version: activity types with WIT signatures, imports.
    Describe(admin::DigestArgs),
    /// Remove a stored version.
    Rm(admin::RemoveArgs),
    /// Make a stored version the active one of its deployment (roll back or forward).
    Activate(admin::DigestArgs),
    /// Activate a version the tenant's rollout holds for approval (the
    /// operator's token only).
    Approve(admin::DigestArgs),
    /// In-flight tasks, permits and outcome counts.
    Status(admin::ConnOnly),
    /// Run one activity on a running host, outside any engine (a smoke test).
    Invoke(admin::InvokeArgs),
    /// Run the test cases of *.test.toml files (any guest language) in the
    /// sandbox, with the limits and session loop of `serve`.
    Test(test::Args),
    /// Publish a component to an OCI registry (the Wasm OCI artifact layout).
    Push(push::Args),
    /// Sign a component in cosign's format: in a registry (the signature
    /// pushed beside it) or a file (FILE.sig, as `cosign sign-blob`).
    Sign(sign::Args),
    /// Make a signing key pair (cosign's formats).
    Key(sign::KeyArgs),
    /// Create an activity project (Rust, Python or JavaScript) that builds
    /// and passes its own tests.
    New(new::Args),
    /// Generate an admin API token and the SHA-256 to put in corral.toml.
    Token(admin::TokenArgs),
    /// Compile the component on stdin to the artifact on stdout: the child
    /// process `serve` compiles tenants' components in, under its limits.
    #[command(hide = true)]
    CompileWorker(CompileWorkerArgs),
}

#[derive(clap::Args)]
struct CompileWorkerArgs {
    /// The engine's guest stack, which compiled code depends on.
    #[arg(long)]
    max_wasm_stack: usize,
    /// The host that started it: the worker stops if its parent is
    /// another (the host died as it started).
    #[arg(long)]
    host_pid: Option<u32>,
}

/// Options every command that loads components shares.
#[derive(clap::Args)]
struct CacheArgs {
    /// Where compiled components are cached [default: $CORRAL_CACHE_DIR, or
    /// ~/.cache/corral/compiled].
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// Compile without reading or writing the cache.
    #[arg(long)]
    no_cache: bool,
}

impl CacheArgs {
    fn sandbox_config(&self) -> SandboxConfig {
        let cache_dir = if self.no_cache {
            None
        } else {
            self.cache_dir.clone().or_else(default_cache_dir)
        };
        SandboxConfig {
            max_instances: 4,
            // One-off runs keep no warm instances.
            max_warm: 0,
            cache_dir,
            ..SandboxConfig::default()
        }
    }
}

/// How commands reach OCI registries.
#[derive(clap::Args)]
struct RegistryArgs {
    /// A registry that may be reached in plain HTTP, HOST[:PORT]; only these
    /// are (repeatable). Credentials come from CORRAL_REGISTRY_USERNAME and
    /// CORRAL_REGISTRY_PASSWORD.
    #[arg(
        long = "insecure-registry",
        value_name = "HOST[:PORT]",
        env = "CORRAL_INSECURE_REGISTRIES",
        value_delimiter = ','
    )]
    insecure: Vec<String>,
}

/// The largest component a command pulls.
const MAX_PULL: u64 = 256 << 20;

/// How long a command's exit waits for work left on the runtime's threads.
const EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

impl RegistryArgs {
    fn registries(&self) -> corral::oci::Registries {
        corral::oci::Registries::from_env(self.insecure.clone(), MAX_PULL)
    }
}

/// A `KEY=VALUE` option that has no `=` or no key.
#[derive(Debug, thiserror::Error)]
#[error("`{0}` is not KEY=VALUE")]
struct NotKeyValue(String);

/// The value parser of every `KEY=VALUE` option.
fn key_value(text: &str) -> Result<(String, String), NotKeyValue> {
    match text.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(NotKeyValue(text.to_owned())),
    }
}

/// `--reuse`: `MAX_TASKS,IDLE` (e.g. `1000,60s`), or `off`.
fn reuse_arg(text: &str) -> Result<corral::control::proto::Reuse, String> {
    use corral::control::proto;
    if text == "off" {
        return Ok(proto::Reuse {
            max_tasks: 0,
            idle_ms: 0,
        });
    }
    let (max_tasks, idle) = text
        .split_once(',')
        .ok_or_else(|| format!("`{text}` is not MAX_TASKS,IDLE (e.g. 1000,60s) or off"))?;
    let max_tasks: i64 = max_tasks
        .trim()
        .parse()
        .map_err(|_| format!("max_tasks: `{max_tasks}` is not a whole number"))?;
    let idle =
        corral_core::sandbox::parse_duration(idle.trim()).map_err(|e| format!("idle: {e}"))?;
    let reuse = corral_core::sandbox::Reuse::new(max_tasks, idle).map_err(|e| e.to_string())?;
    Ok(proto::Reuse {
        max_tasks: reuse.max_tasks(),
        idle_ms: u64::try_from(reuse.idle().as_millis()).unwrap_or(u64::MAX),
    })
}

/// Why the component a command names could not be read (shown with
/// [`error_chain`]: an OCI error's causes matter).
#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error("cannot read `{path}`: {source}")]
    File {
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Oci(#[from] corral::oci::OciError),
}

/// The bytes of the component `source` names: a file, or `oci://…`,
/// pulled (and said so on stderr).
async fn read_component(source: &str, registry: &RegistryArgs) -> Result<Vec<u8>, ReadError> {
    if !corral::oci::is_reference(source) {
        return std::fs::read(source).map_err(|e| ReadError::File {
            path: source.to_owned(),
            source: e,
        });
    }
    let reference: corral::oci::OciRef = source.parse()?;
    let staging = corral::staging::Staging::temporary().map_err(|e| ReadError::File {
        path: source.to_owned(),
        source: e,
    })?;
    let pulled = corral::oci::pull(&reference, &registry.registries(), &staging).await?;
    eprintln!("corral: pulled {reference} ({})", pulled.manifest_digest);
    std::fs::read(pulled.component.path()).map_err(|e| ReadError::File {
        path: source.to_owned(),
        source: e,
    })
}

pub(crate) fn default_cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("CORRAL_CACHE_DIR") {
        return Some(PathBuf::from(dir));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("corral").join("compiled"))
}

/// A usage or load error: the message, exit code 2.
pub(crate) fn usage_error(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("corral: {message}");
    ExitCode::from(2)
}

/// The most of its last error a server writes as it exits.
const MAX_LAST_WORDS: usize = 2 << 10;

/// A server's exit on an error, code 2: the error and its causes, which
/// can quote what an engine or a registry said (a refusal's message), so
/// escaped and cut to [`MAX_LAST_WORDS`]; a log event when the log is
/// JSON.
pub(crate) fn last_words(error: &anyhow::Error, json: bool) -> ExitCode {
    let said = format!("{error:#}");
    let said = Shown(&said, MAX_LAST_WORDS);
    if json {
        tracing::error!(target: "corral", "corral: {said}");
    } else {
        eprintln!("corral: {said}");
    }
    ExitCode::from(2)
}

/// A usage or load error that is an error value: it and its causes (a
/// library's own text is often only "transport error" or "I/O error"),
/// exit code 2.
pub(crate) fn error_exit(error: &(dyn std::error::Error + 'static)) -> ExitCode {
    usage_error(error_chain(error))
}

/// The files in `dir` whose names end with `suffix`, sorted (none when
/// `dir` cannot be read): the default inputs of `dev` and `test`.
fn files_named(dir: &std::path::Path, suffix: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        // `hello.test.toml`, not `./hello.test.toml`, for the current directory.
        .map(|e| match dir == std::path::Path::new(".") {
            true => PathBuf::from(e.file_name()),
            false => e.path(),
        })
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(suffix))
        })
        .collect();
    files.sort();
    files
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    // No runtime and no logs: it compiles one component and exits.
    if let Command::CompileWorker(args) = &cli.command {
        return corral_core::sandbox::compile_worker_main(args.max_wasm_stack, args.host_pid);
    }
    // The admin API's TLS, its clients and registry HTTPS all use ring, the
    // one TLS crypto provider linked; chosen here, before anything asks
    // rustls for its default.
    if rustls::crypto::ring::default_provider()
        .install_default()
        .is_err()
    {
        return usage_error("a TLS crypto provider was installed before corral chose one");
    }
    // A server logs what it does; one-shot commands print their own output.
    // `serve` sets up its logs once it has read the configuration's format.
    match cli.command {
        Command::Serve(_) => {}
        Command::Dev(_) => init_tracing(SERVER_LOG, false),
        _ => init_tracing(CLI_LOG, false),
    }
    // The host's own work; guests run on threads of their own
    // (`session::cpu`).
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return usage_error(format!("cannot start the async runtime: {e}")),
    };
    let code = runtime.block_on(async {
        match cli.command {
            Command::Inspect(args) => inspect::inspect(args).await,
            Command::Diff(args) => diff::diff(args).await,
            Command::Run(args) => run::run(args).await,
            Command::Serve(args) => serve::serve(args).await,
            Command::Dev(args) => dev::dev(args).await,
            Command::Deploy(args) => deploy::deploy(args).await,
            Command::Ls(args) => admin::list(args).await,
            Command::Describe(args) => admin::describe(args).await,
            Command::Rm(args) => admin::remove(args).await,
            Command::Activate(args) => admin::activate(args, false).await,
            Command::Approve(args) => admin::activate(args, true).await,
            Command::Status(args) => status::status(args).await,
            Command::Invoke(args) => admin::invoke(args).await,
            Command::Test(args) => test::test(args).await,
            Command::Token(args) => admin::token(args),
            Command::New(args) => new::new(args),
            Command::Push(args) => push::push(args).await,
            Command::Sign(args) => sign::sign(args).await,
            Command::Key(args) => sign::key(args),
            // Run before the runtime starts, above.
            Command::CompileWorker(_) => ExitCode::SUCCESS,
        }
    });
    // Everything a command does is done by now. What may be left on the
    // runtime's blocking threads is a compile the stop cut off (an upload
    // whose call ended with `serve`): dropping the runtime would wait for
    // it, up to `host.compile_timeout`, after "stopped". Its worker process
    // dies with this one (`compile_in_worker`).
    runtime.shutdown_timeout(EXIT_WAIT);
    code
}

#[cfg(test)]
mod tests {
    use super::{key_value, reuse_arg};

    #[test]
    fn reuse_is_max_tasks_and_idle_or_off_and_its_bounds_are_named() {
        let r = reuse_arg("1000, 90s").unwrap();
        assert_eq!((r.max_tasks, r.idle_ms), (1000, 90_000));
        assert_eq!(reuse_arg("off").unwrap().max_tasks, 0);
        for (bad, says) in [
            ("1000", "is not MAX_TASKS,IDLE"),
            ("many,60s", "max_tasks: `many` is not a whole number"),
            ("1,60s", "from 2 to 1000000, got 1"),
            ("10,5", "idle:"),
            ("10,2h", "at most 1h"),
        ] {
            let err = reuse_arg(bad).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn key_value_splits_at_the_first_equals_and_needs_a_key() {
        let pair = |k: &str, v: &str| Some((k.to_owned(), v.to_owned()));
        assert_eq!(key_value("a=b=c").ok(), pair("a", "b=c"));
        assert_eq!(key_value("a=").ok(), pair("a", ""));
        for bad in ["=x", "novalue", ""] {
            let err = key_value(bad).unwrap_err();
            assert_eq!(err.to_string(), format!("`{bad}` is not KEY=VALUE"));
        }
    }
}
