//! `corral deploy`: uploads a component (a file, its bytes streamed with
//! its signature if it has one; or `oci://…`, for the host to pull and
//! verify) and prints what the host stored: its state, activity types and
//! the changes against the active version.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::{Value, json};

use corral::control::api::UPLOAD_CHUNK;
use corral::control::proto::{self, upload_request};
use corral::control::rollout::{DEFAULT_MARGIN, DEFAULT_MIN_TASKS, Ramp};

use super::admin::{
    Conn, call, component_json, print_activity_types, print_held, print_outbound_http, print_signer,
};
use super::{error_exit, key_value, usage_error};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    conn: Conn,
    /// The component to upload: a file, or oci://REGISTRY/REPOSITORY:TAG
    /// (or @sha256:…) for the host to pull from a registry the tenant may use.
    file: String,
    /// The file's signature: what `corral sign FILE` or `cosign sign-blob`
    /// wrote (a tenant whose trust requires signatures needs one) [default:
    /// FILE.sig, where it exists]. A registry's component is verified by
    /// the signatures in its registry.
    #[arg(long, value_name = "FILE.sig")]
    signature: Option<PathBuf>,
    /// The deployment it is a version of [default: the file's stem].
    #[arg(long)]
    name: Option<String>,
    /// An alias served while this version is active: NAME=ACTIVITY_TYPE.
    #[arg(long = "alias", value_name = "NAME=TYPE", value_parser = key_value)]
    aliases: Vec<(String, String)>,
    /// A label kept with the version: KEY=VALUE.
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = key_value)]
    labels: Vec<(String, String)>,
    /// A `wasi:config` key of this deployment, over the tenant's: KEY=VALUE.
    #[arg(long = "config", value_name = "KEY=VALUE", value_parser = key_value)]
    config: Vec<(String, String)>,
    /// This deployment's warm instances, over the tenant's `reuse`:
    /// MAX_TASKS,IDLE (e.g. 1000,60s), or off.
    #[arg(long, value_name = "MAX_TASKS,IDLE", value_parser = super::reuse_arg)]
    reuse: Option<proto::Reuse>,
    /// Store it without activating it.
    #[arg(long)]
    inactive: bool,
    /// Ramp it up as a canary over the active version: the percents of the
    /// deployment's tasks it takes in turn and each step's time (e.g.
    /// 10,50/5m), then all of them.
    #[arg(
        long,
        value_name = "PERCENTS/EVERY",
        value_parser = Ramp::parse,
        conflicts_with = "inactive"
    )]
    canary: Option<Ramp>,
    /// Roll the canary back when its rate of a failure class is more than
    /// this many points over the active version's [default: 5].
    #[arg(long, value_name = "POINTS", requires = "canary")]
    canary_margin: Option<u32>,
    /// The canary's own tasks before it may be rolled back [default: 20].
    #[arg(long, value_name = "N", requires = "canary")]
    canary_min_tasks: Option<u32>,
}

pub async fn deploy(args: Args) -> ExitCode {
    // `oci://…`: no bytes travel; the host pulls it (from registries the
    // tenant may use). A file: its bytes follow the header.
    let (default_name, oci_reference, bytes, signature) = if corral::oci::is_reference(&args.file) {
        if args.signature.is_some() {
            return usage_error(
                "--signature is for a file: a registry's component is verified by the signatures in its registry",
            );
        }
        let reference: corral::oci::OciRef = match args.file.parse() {
            Ok(reference) => reference,
            Err(e) => return error_exit(&e),
        };
        let name = reference.repository_name().to_owned();
        (name, reference.to_string(), Vec::new(), String::new())
    } else {
        let bytes = match std::fs::read(&args.file) {
            Ok(bytes) => bytes,
            Err(e) => return usage_error(format!("reading `{}`: {e}", args.file)),
        };
        let stem = std::path::Path::new(&args.file).file_stem().map_or_else(
            || "component".to_owned(),
            |s| s.to_string_lossy().into_owned(),
        );
        let signature = match signature_of(&args.file, args.signature.as_deref()) {
            Ok(signature) => signature,
            Err(code) => return code,
        };
        (stem, String::new(), bytes, signature)
    };
    let header = proto::UploadHeader {
        tenant: args.conn.tenant(),
        name: args.name.clone().unwrap_or(default_name),
        aliases: args.aliases.into_iter().collect(),
        labels: args.labels.into_iter().collect(),
        size: bytes.len() as u64,
        inactive: args.inactive,
        oci_reference,
        signature,
        config: args.config.into_iter().collect(),
        reuse: args.reuse,
        canary: match args.canary.map(|ramp| {
            ramp.with_rollback(
                args.canary_margin.unwrap_or(DEFAULT_MARGIN),
                args.canary_min_tasks.unwrap_or(DEFAULT_MIN_TASKS),
            )
        }) {
            Some(Ok(ramp)) => Some(proto::Canary {
                steps_percent: ramp.steps().to_vec(),
                every_ms: u64::try_from(ramp.every().as_millis()).unwrap_or(u64::MAX),
                margin_percent: ramp.margin(),
                min_tasks: ramp.min_tasks(),
            }),
            Some(Err(e)) => return usage_error(format!("--canary: {e}")),
            None => None,
        },
    };
    let mut messages = vec![proto::UploadRequest {
        part: Some(upload_request::Part::Header(header)),
    }];
    messages.extend(
        bytes
            .chunks(UPLOAD_CHUNK)
            .map(|chunk| proto::UploadRequest {
                part: Some(upload_request::Part::Chunk(chunk.to_vec())),
            }),
    );
    let response = call!(args.conn, upload, tokio_stream::iter(messages));
    let Some(component) = response.component else {
        return usage_error("the host answered without the stored component");
    };
    if args.conn.json {
        let mut value = component_json(&component);
        value["already_stored"] = json!(response.already_stored);
        value["changes"] = response
            .changes
            .as_ref()
            .map_or(Value::Null, super::diff::changes_json);
        println!("{value}");
    } else {
        let canary = format!(
            "a canary taking {}% of its deployment's tasks",
            component.canary_percent
        );
        let state = if component.active {
            "active"
        } else if component.canary_percent > 0 {
            &canary
        } else if !component.held.is_empty() {
            "stored, held for an operator's approval (corral approve)"
        } else {
            "stored, inactive"
        };
        let again = if response.already_stored {
            " (already stored)"
        } else {
            ""
        };
        println!(
            "{} {} of `{}`: {state}{again}",
            component.tenant, component.digest, component.name
        );
        print_held(&component);
        print_signer(&component);
        print_activity_types(&component);
        print_outbound_http(&component);
        if let Some(changes) = &response.changes {
            if changes.against.is_empty() {
                println!("no active version to compare with; replayed against the recording:");
            } else {
                println!("changes against {}:", changes.against);
            }
            super::diff::print(changes);
        }
    }
    ExitCode::SUCCESS
}

/// The signature to send with the file at `file`: `given`'s, or else
/// `FILE.sig`'s where that exists; empty for none. At most
/// [`corral::trust::file::MAX_SIGNATURE`] bytes of UTF-8.
fn signature_of(file: &str, given: Option<&Path>) -> Result<String, ExitCode> {
    use corral::trust::file;
    let read = match given {
        Some(path) => file::read(path).map(|bytes| Some((path.to_owned(), bytes))),
        None => {
            let beside = file::beside(Path::new(file));
            file::read_if_there(&beside).map(|bytes| bytes.map(|bytes| (beside, bytes)))
        }
    };
    let Some((path, bytes)) = read.map_err(|e| usage_error(e.to_string()))? else {
        return Ok(String::new());
    };
    let text = String::from_utf8(bytes).map_err(|_| {
        usage_error(format!(
            "`{}` is not a signature: not UTF-8 (cosign writes base64)",
            path.display()
        ))
    })?;
    Ok(text.trim().to_owned())
}
