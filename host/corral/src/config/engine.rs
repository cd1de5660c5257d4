//! The engine a tenant serves: Temporal (its worker polls a task queue) or
//! Aion (the server pushes tasks down a registered worker stream). A tenant
//! names exactly one.

use std::num::NonZeroUsize;

use serde::Deserialize;

use super::{ConfigError, invalid};

/// Which engine a tenant's tasks come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Engine {
    Temporal(TemporalBinding),
    Aion(AionBinding),
}

impl Engine {
    /// One line for logs: where the tenant's tasks come from.
    pub fn describe(&self) -> String {
        match self {
            Engine::Temporal(t) => format!(
                "Temporal task queue `{}` (namespace `{}`) at {}",
                t.task_queue, t.namespace, t.address
            ),
            Engine::Aion(a) => format!(
                "Aion task queue `{}` (namespace `{}`) at {}",
                a.task_queue, a.namespace, a.address
            ),
        }
    }
}

/// Where a tenant's Temporal worker polls.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemporalBinding {
    pub address: String,
    #[serde(default = "default_namespace")]
    pub namespace: String,
    pub task_queue: String,
    /// gRPC compression of the worker's requests.
    #[serde(default)]
    pub compression: Compression,
    /// Activity-task long polls the worker keeps open (each also needs a
    /// free permit). Five by default, the Temporal SDKs' default: one poll
    /// serves a busy queue 12 % slower (measured by `--bench temporal`).
    /// A host of many small tenants wants 1: each open poll costs about
    /// 27 KiB here and a share of the server's rate limit at start (a
    /// thousand tenants with five each are throttled by a dev server for
    /// a minute; see `--bench tenants`).
    #[serde(default = "default_pollers")]
    pub pollers: NonZeroUsize,
}

/// [`TemporalBinding::pollers`] by default.
fn default_pollers() -> NonZeroUsize {
    NonZeroUsize::MIN.saturating_add(4)
}

/// The most polls a tenant's worker may keep open.
const MAX_POLLERS: usize = 64;

/// `temporal.compression`: `gzip` (the Temporal SDK's default) compresses
/// every request; `none` saves the CPU that costs (a quarter to half of a
/// worker's, for small payloads) where bandwidth is cheap, as on a LAN.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    #[default]
    Gzip,
    None,
}

/// Where a tenant's Aion worker registers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AionBinding {
    /// The server's gRPC address as a URL (`http://127.0.0.1:50051`).
    pub address: String,
    pub namespace: String,
    pub task_queue: String,
    /// The locality this worker advertises; empty serves only dispatches
    /// that are not pinned to a node.
    pub node: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAion {
    address: String,
    #[serde(default = "default_namespace")]
    namespace: String,
    #[serde(default = "default_queue")]
    task_queue: String,
    #[serde(default)]
    node: String,
}

fn default_namespace() -> String {
    "default".to_owned()
}

fn default_queue() -> String {
    "default".to_owned()
}

/// Checks that a tenant names exactly one engine, and that engine's keys.
pub(super) fn validate(
    temporal: Option<TemporalBinding>,
    aion: Option<RawAion>,
    key: &dyn Fn(&str) -> String,
) -> Result<Engine, ConfigError> {
    match (temporal, aion) {
        (Some(_), Some(_)) => Err(invalid(
            key("aion"),
            "a tenant serves one engine; remove `temporal` or `aion`",
        )),
        (None, None) => Err(invalid(
            key("temporal"),
            "missing (the engine this tenant serves: `temporal = {…}` or `aion = {…}`)",
        )),
        (Some(temporal), None) => {
            if !has_scheme(&temporal.address) {
                return Err(invalid(
                    key("temporal.address"),
                    format!(
                        "`{}` must be a URL such as http://127.0.0.1:7233",
                        temporal.address
                    ),
                ));
            }
            if temporal.task_queue.is_empty() {
                return Err(invalid(key("temporal.task_queue"), "must not be empty"));
            }
            if temporal.pollers.get() > MAX_POLLERS {
                return Err(invalid(
                    key("temporal.pollers"),
                    format!(
                        "{} is more than the {MAX_POLLERS} polls one worker may keep open",
                        temporal.pollers
                    ),
                ));
            }
            Ok(Engine::Temporal(temporal))
        }
        (None, Some(aion)) => {
            // `aion` itself takes `host:port`; accept that spelling too.
            let address = if has_scheme(&aion.address) {
                aion.address.clone()
            } else {
                format!("http://{}", aion.address)
            };
            if address.parse::<hyper::Uri>().is_err() || aion.address.is_empty() {
                return Err(invalid(
                    key("aion.address"),
                    format!(
                        "`{}` is not an address such as 127.0.0.1:50051",
                        aion.address
                    ),
                ));
            }
            for (field, value) in [
                ("aion.namespace", &aion.namespace),
                ("aion.task_queue", &aion.task_queue),
            ] {
                if value.is_empty() {
                    return Err(invalid(key(field), "must not be empty"));
                }
            }
            Ok(Engine::Aion(AionBinding {
                address,
                namespace: aion.namespace,
                task_queue: aion.task_queue,
                node: aion.node,
            }))
        }
    }
}

fn has_scheme(address: &str) -> bool {
    address.starts_with("http://") || address.starts_with("https://")
}
