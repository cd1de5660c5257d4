//! `corral inspect <file.wasm | oci://…> [--json]`.

use std::process::ExitCode;

use serde_json::json;

use corral_core::sandbox::Sandbox;

use super::{CacheArgs, RegistryArgs, error_exit, read_component, usage_error};

#[derive(clap::Args)]
pub struct Args {
    /// The component: a file, or oci://REGISTRY/REPOSITORY:TAG (or @sha256:…).
    file: String,
    /// Print `{"activities":[{"name","params":[{"name","type"}],"result"}],"imports":[…]}`.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    cache: CacheArgs,
    #[command(flatten)]
    registry: RegistryArgs,
}

pub async fn inspect(args: Args) -> ExitCode {
    let sandbox = match Sandbox::new(args.cache.sandbox_config()) {
        Ok(sandbox) => sandbox,
        Err(e) => return usage_error(format!("{e:#}")),
    };
    let bytes = match read_component(&args.file, &args.registry).await {
        Ok(bytes) => bytes,
        Err(e) => return error_exit(&e),
    };
    let component = match sandbox.load(&bytes) {
        Ok(component) => component,
        Err(e) => return usage_error(format!("cannot load `{}`: {e}", args.file)),
    };
    if args.json {
        let activities: Vec<_> = component.activities.iter().map(|a| a.describe()).collect();
        let doc = json!({
            "digest": component.digest,
            "activities": activities,
            "unsupported": component.unsupported,
            "imports": component.imports,
        });
        println!("{doc}");
        return ExitCode::SUCCESS;
    }
    println!("{} ({})", args.file, component.digest);
    println!("activity types:");
    for activity in &component.activities {
        println!("  {}: {}", activity.name, activity.signature());
    }
    if !component.unsupported.is_empty() {
        println!("exports that cannot run as activities:");
        for u in &component.unsupported {
            println!("  {}: {}", u.name, u.reason);
        }
    }
    if component
        .imports
        .iter()
        .any(|i| i.starts_with("wasi:http/"))
    {
        println!(
            "outbound HTTP: imports wasi:http; requests reach only the hosts a tenant \
             grants (capabilities.http_hosts; corral run --http-host), none by default"
        );
    }
    println!("imports:");
    for import in &component.imports {
        println!("  {import}");
    }
    ExitCode::SUCCESS
}
