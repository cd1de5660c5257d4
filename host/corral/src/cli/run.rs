//! `corral run <file.wasm | oci://…> <activity-type> [ARG_JSON …]`.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use corral::connectors::local::{LocalLoop, Submission};
use corral_core::metrics::Metrics;
use corral_core::sandbox::{
    Capabilities, DirGrant, FailureClass, HttpGrant, LogLevel, Sandbox, Stream, TaskInfo,
    TaskObserver, Tenant, parse_bytes, parse_duration,
};
use corral_core::session::{Permits, Registry, Session};

use super::{CacheArgs, RegistryArgs, error_exit, key_value, read_component, usage_error};

#[derive(clap::Args)]
pub struct Args {
    /// The component: a file, or oci://REGISTRY/REPOSITORY:TAG (or @sha256:…).
    file: String,
    /// The activity type, e.g. `demo:greeter/api.greet`.
    activity_type: String,
    /// One JSON value per WIT parameter.
    #[arg(value_name = "ARG_JSON", allow_negative_numbers = true)]
    args: Vec<String>,
    /// Linear memory limit [default: a tenant's, 128MiB].
    #[arg(long, value_parser = parse_bytes)]
    memory: Option<u64>,
    /// Wall-clock deadline [default: a tenant's, 5m].
    #[arg(long, value_parser = parse_duration)]
    timeout: Option<Duration>,
    /// CPU budget in fuel units.
    #[arg(long)]
    fuel: Option<u64>,
    /// Grant a directory: HOST:GUEST[:ro|rw] (read-only by default).
    #[arg(long = "dir", value_name = "HOST:GUEST[:ro|rw]")]
    dirs: Vec<DirGrant>,
    /// Let the guest send HTTP requests to this host (`api.example.com`,
    /// `127.0.0.1:8080`, `*.example.com`); none by default.
    /// A name that resolves to a loopback or private address is refused
    /// unless the address itself is given.
    #[arg(long = "http-host", value_name = "HOST[:PORT]")]
    http_hosts: Vec<HttpGrant>,
    /// Set a `wasi:config` key the guest reads.
    #[arg(long = "config", value_name = "KEY=VALUE", value_parser = key_value)]
    config: Vec<(String, String)>,
    /// Set a guest environment variable (nothing is inherited).
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = key_value)]
    env: Vec<(String, String)>,
    /// The attempt number the guest sees.
    #[arg(long, default_value_t = 1)]
    attempt: u32,
    /// On failure print `{"class","kind","retryable","message","details"}` on stdout.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    cache: CacheArgs,
    #[command(flatten)]
    registry: RegistryArgs,
}

/// The tenant a local run belongs to (the guest's `info().tenant`).
const TENANT: &str = "local";

/// Heartbeats, guest logs and output go to stderr as they happen.
struct Stderr;

impl TaskObserver for Stderr {
    fn heartbeat(&self, count: u32, details: Option<&Value>) {
        match details {
            Some(details) => eprintln!("heartbeat #{count}: {details}"),
            None => eprintln!("heartbeat #{count}"),
        }
    }

    fn log(&self, level: LogLevel, message: &str) {
        eprintln!("[{level}] {message}");
    }

    fn output(&self, stream: Stream, line: &str) {
        eprintln!("[{stream}] {line}");
    }

    fn output_dropped(&self, bytes: u64) {
        eprintln!("({bytes} bytes of guest output dropped over the budget)");
    }
}

pub async fn run(args: Args) -> ExitCode {
    let mut json_args = Vec::with_capacity(args.args.len());
    for (i, text) in args.args.iter().enumerate() {
        match serde_json::from_str::<Value>(text) {
            Ok(value) => json_args.push(value),
            Err(e) => {
                return usage_error(format!(
                    "argument {} is not JSON ({e}): {text}\n(strings need quotes: '\"text\"')",
                    i + 1
                ));
            }
        }
    }
    let mut tenant = Tenant {
        name: TENANT.to_owned(),
        capabilities: Capabilities {
            dirs: args.dirs,
            env: args.env,
            http_hosts: args.http_hosts.into(),
            config: Arc::new(args.config.into_iter().collect()),
            secrets: Arc::default(),
        },
        ..Tenant::default()
    };
    // A tenant's defaults (`Limits::default()`) unless the flags say otherwise.
    if let Some(memory) = args.memory {
        tenant.limits.memory = memory;
    }
    if let Some(timeout) = args.timeout {
        tenant.limits.timeout = Some(timeout);
    }
    tenant.limits.fuel = args.fuel;

    let mut config = args.cache.sandbox_config();
    config.max_memory = config.max_memory.max(tenant.limits.memory);
    let sandbox = match Sandbox::new(config) {
        Ok(sandbox) => sandbox,
        Err(e) => return usage_error(format!("{e:#}")),
    };
    let tenant = match sandbox.prepare(tenant) {
        Ok(tenant) => tenant,
        Err(e) => return error_exit(&e),
    };
    let bytes = match read_component(&args.file, &args.registry).await {
        Ok(bytes) => bytes,
        Err(e) => return error_exit(&e),
    };
    let component = match sandbox.load(&bytes) {
        Ok(component) => component,
        Err(e) => return usage_error(format!("cannot load `{}`: {e}", args.file)),
    };
    // The session loop, as under `corral serve`, with this process as the
    // engine: one tenant, one component, one task at a time.
    let registry = Arc::new(Registry::default());
    if let Err(e) = registry.set_tenant(tenant, &[component], &[]) {
        return error_exit(&e);
    }
    let permits = Permits::new(1, [(TENANT.to_owned(), 1)]);
    let session = Session::new(sandbox, registry, Arc::new(Metrics::default()), permits);
    let running = LocalLoop::start(session);
    let submitted = running.local().submit(Submission {
        tenant: TENANT.to_owned(),
        activity_type: args.activity_type,
        args: corral_core::session::Args::Positional(json_args),
        info: TaskInfo {
            activity_id: "cli".to_owned(),
            attempt: args.attempt,
            ..TaskInfo::default()
        },
        deadline: None,
        observer: Some(Arc::new(Stderr)),
    });
    let pending = match submitted {
        Ok(pending) => pending,
        Err(e) => return error_exit(&e),
    };
    let canceller = pending.canceller();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("cancelling (Ctrl-C)…");
            canceller.cancel();
        }
    });
    match pending.outcome().await {
        Ok(value) => {
            println!("{value}");
            ExitCode::SUCCESS
        }
        // Naming an activity type the file lacks is a usage error.
        Err(failure) if failure.class == FailureClass::UnknownActivity && !args.json => {
            usage_error(format!("`{}`: {}", args.file, failure.message))
        }
        Err(failure) => {
            if args.json {
                println!("{}", failure.to_json());
            } else {
                eprintln!("activity failed: {failure}");
                if let Some(details) = &failure.details {
                    eprintln!("details: {details}");
                }
            }
            ExitCode::from(1)
        }
    }
}
