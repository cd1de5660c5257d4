//! `corral push FILE oci://…`: publishes a component as a Wasm OCI artifact,
//! its manifest annotated with corral's activity types and WIT signatures.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::json;

use corral::oci::{self, ACTIVITY_TYPES_ANNOTATION, OciRef};
use corral_core::sandbox::Sandbox;

use super::{CacheArgs, RegistryArgs, error_exit, usage_error};

#[derive(clap::Args)]
pub struct Args {
    /// The component file.
    file: PathBuf,
    /// Where to push it: oci://REGISTRY/REPOSITORY:TAG.
    reference: String,
    #[command(flatten)]
    registry: RegistryArgs,
    #[command(flatten)]
    cache: CacheArgs,
}

pub async fn push(args: Args) -> ExitCode {
    let reference: OciRef = match args.reference.parse() {
        Ok(reference) => reference,
        Err(e) => return error_exit(&e),
    };
    // Only what would load on a host is pushed: the same checks as `inspect`.
    let sandbox = match Sandbox::new(args.cache.sandbox_config()) {
        Ok(sandbox) => sandbox,
        Err(e) => return usage_error(format!("{e:#}")),
    };
    let bytes = match std::fs::read(&args.file) {
        Ok(bytes) => bytes,
        Err(e) => return usage_error(format!("cannot read `{}`: {e}", args.file.display())),
    };
    let component = match sandbox.load(&bytes) {
        Ok(component) => component,
        Err(e) => return usage_error(format!("cannot load `{}`: {e}", args.file.display())),
    };
    let activities: Vec<_> = component
        .activities
        .iter()
        .map(|a| json!({ "name": &*a.name, "signature": a.signature() }))
        .collect();
    let annotations = BTreeMap::from([(
        ACTIVITY_TYPES_ANNOTATION.to_owned(),
        serde_json::Value::from(activities).to_string(),
    )]);
    let registries = args.registry.registries();
    match oci::push(bytes, &reference, &registries, annotations).await {
        Ok(digest) => {
            println!("pushed {reference} ({digest})");
            println!("component {}", component.digest);
            ExitCode::SUCCESS
        }
        Err(e) => error_exit(&e),
    }
}
