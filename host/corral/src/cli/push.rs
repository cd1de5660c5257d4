//! `corral push FILE oci://…`: publishes a component as a Wasm OCI artifact,
//! its manifest annotated with corral's activity types and WIT signatures,
//! and with `--sign KEY` signed (`sign.rs`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::json;
use sha2::{Digest as _, Sha256};

use corral::oci::{self, ACTIVITY_TYPES_ANNOTATION, OciRef};
use corral_core::sandbox::Sandbox;

use super::{CacheArgs, RegistryArgs, error_exit, usage_error};

#[derive(clap::Args)]
pub struct Args {
    /// The component file.
    file: PathBuf,
    /// Where to push it: oci://REGISTRY/REPOSITORY:TAG.
    reference: String,
    /// Sign it too (as `corral sign` does) with this private key.
    #[arg(long, value_name = "KEY")]
    sign: Option<PathBuf>,
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
    // The key is read first: a wrong password pushes nothing.
    let key = match args.sign.as_deref().map(super::sign::signing_key) {
        Some(Ok(key)) => Some(key),
        Some(Err(code)) => return code,
        None => None,
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
    let layer = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
    match oci::push(bytes, &reference, &registries, annotations).await {
        Ok(digest) => {
            println!("pushed {reference} ({digest})");
            println!("component {}", component.digest);
        }
        Err(e) => return error_exit(&e),
    }
    let Some(key) = key else {
        return ExitCode::SUCCESS;
    };
    // What is signed is the manifest read back and checked to name the
    // bytes just pushed, its digest computed here: a registry naming
    // another digest (or a tag moved meanwhile) gets nothing signed.
    let digest = match oci::component_manifest(&reference, &registries).await {
        Ok((digest, found)) if found.digest == layer => digest,
        Ok(_) => {
            return usage_error(format!(
                "not signing: {reference} no longer names the component just pushed"
            ));
        }
        Err(e) => return error_exit(&e),
    };
    super::sign::sign_artifact(&reference, &digest, &key, &registries).await
}
