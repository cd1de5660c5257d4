//! The `corral serve` configuration: one TOML file, validated before
//! anything starts, with errors that name the key.
//!
//! ```toml
//! [host]
//! max_concurrent = 64          # tasks at once, host-wide
//! shutdown_grace = "30s"       # SIGINT/SIGTERM: how long in-flight tasks may finish
//! connect_timeout = "30s"      # how long to keep trying to reach an engine at start
//! admin_listen = "127.0.0.1:7466"   # the admin API (needs data_dir)
//! data_dir = "./corral-data"        # uploaded components and which are active
//! metrics_listen = "127.0.0.1:9466" # Prometheus GET /metrics
//! metrics_token_sha256 = "…"        # /metrics only with this bearer token
//! operator_token_sha256 = "…"       # `corral token` prints a token and its hash
//! max_upload = "64MiB"
//! compile_timeout = "2m"            # one component's compile, in a worker process
//! compile_memory = "2GiB"           # the compile worker's writable memory
//! admin_tls = { cert = "admin.pem", key = "admin.key" }
//! admin_plaintext = false           # true: allow a non-loopback admin_listen without TLS
//! log_format = "text"               # or "json"
//! secret_refresh = "60s"            # re-read secrets (and at once on SIGHUP)
//! tracing = { otlp_endpoint = "http://127.0.0.1:4317" }   # OTLP/gRPC spans, off by default
//!
//! [[tenant]]
//! name = "acme"
//! token_sha256 = "…"
//! temporal = { address = "http://127.0.0.1:7233", namespace = "default", task_queue = "acme" }
//! # or, for an Aion server: aion = { address = "127.0.0.1:50051", namespace = "default", task_queue = "acme" }
//! limits = { memory = "64MiB", timeout = "30s", max_concurrent = 16, per_type = { Greet = 4 } }
//! capabilities = { dirs = [{ host = "./data", guest = "/data", mode = "ro" }], env = { REGION = "eu" }, http_hosts = ["api.example.com"] }
//! config = { region = "eu" }                  # wasi:config, under each deployment's own
//! secrets = { STRIPE_KEY = { env = "ACME_STRIPE_KEY", hosts = ["api.stripe.com"] } }
//! components = ["examples/dist/greeter.wasm"]
//! aliases = { Greet = "demo:greeter/api.greet" }
//! ```
//!
//! Relative paths are relative to the configuration file.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::control::TlsFiles;
use crate::control::store::Quota;
use crate::sandbox::PolicyError;

mod capabilities;
mod engine;
mod source;
mod values;

pub use source::ComponentSource;
use source::{RawCredential, credentials, follows};
use values::{RawTracing, address, at_most, bytes, duration, positive, size, token_hash, tracing};

use crate::oci::{Credential, RepositoryPrefix};
use crate::telemetry::TracingConfig;

use capabilities::{RawCapabilities, RawSecret};
use engine::RawAion;
pub use engine::{AionBinding, Compression, Engine, TemporalBinding};

use crate::sandbox::{FailureClass, Limits, RetryPolicy, Tenant};
use crate::session::cpu::{CpuMax, CpuShare, CpuWeight};

/// Components compiling at once by default: serving goes on beside them.
pub const DEFAULT_MAX_COMPILES: usize = 1;
/// The most `host.max_compiles` may be.
pub const MAX_COMPILES: usize = 64;

/// A validated configuration.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    pub host: HostConfig,
    pub tenants: Vec<TenantConfig>,
}

#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct HostConfig {
    pub max_concurrent: usize,
    pub shutdown_grace: Duration,
    pub cache_dir: Option<PathBuf>,
    pub max_memory: u64,
    /// How long to keep trying to reach an engine at start.
    pub connect_timeout: Duration,
    pub admin_listen: Option<SocketAddr>,
    pub admin_tls: Option<TlsFiles>,
    pub data_dir: Option<PathBuf>,
    pub metrics_listen: Option<SocketAddr>,
    pub operator_token_sha256: Option<String>,
    /// Hex SHA-256 of the token `/metrics` requires (none: open).
    pub metrics_token_sha256: Option<String>,
    pub max_upload: u64,
    /// Wall-clock time one component's compile may take.
    pub compile_timeout: Duration,
    /// Writable memory of the process one component compiles in.
    pub compile_memory: u64,
    /// Components compiling at once, host-wide (each in its own worker
    /// process, taking a core and up to `compile_memory`).
    pub max_compiles: usize,
    /// Registries reached in plain HTTP (only these).
    pub insecure_registries: Vec<String>,
    /// How often followed tags are resolved (plus up to a fifth, at random).
    pub follow_interval: Duration,
    /// How long one pull (or a tag's resolution) may take, from first byte
    /// to last.
    pub registry_deadline: Duration,
    /// How long without a task before the pool's resident memory is given
    /// back to the kernel.
    pub idle_memory_release: Duration,
    /// How often secrets are re-read from their sources (SIGHUP: at once).
    pub secret_refresh: Duration,
    /// Where spans are exported (none: nowhere).
    pub tracing: Option<TracingConfig>,
    /// Credentials by registry host, for every tenant.
    pub registry_credentials: BTreeMap<String, Credential>,
    pub log_json: bool,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            max_concurrent: 256,
            shutdown_grace: Duration::from_secs(30),
            cache_dir: None,
            max_memory: 1 << 30,
            connect_timeout: Duration::from_secs(30),
            admin_listen: None,
            admin_tls: None,
            data_dir: None,
            metrics_listen: None,
            operator_token_sha256: None,
            metrics_token_sha256: None,
            max_upload: 64 << 20,
            compile_timeout: Duration::from_secs(120),
            compile_memory: 2 << 30,
            max_compiles: DEFAULT_MAX_COMPILES,
            insecure_registries: Vec::new(),
            follow_interval: Duration::from_secs(30),
            registry_deadline: crate::oci::DEFAULT_DEADLINE,
            idle_memory_release: Duration::from_secs(60),
            secret_refresh: Duration::from_secs(60),
            tracing: None,
            registry_credentials: BTreeMap::new(),
            log_json: false,
        }
    }
}

#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TenantConfig {
    pub tenant: Tenant,
    /// Hex SHA-256 of the tenant's admin API token.
    pub token_sha256: Option<String>,
    pub max_concurrent: usize,
    /// Activity types (an alias or a full name) with their own limit.
    pub type_limits: BTreeMap<String, usize>,
    /// The engine the tenant serves.
    pub engine: Engine,
    pub components: Vec<ComponentSource>,
    /// Where the tenant may `deploy oci://…` from (none: nowhere).
    pub registries: Vec<RepositoryPrefix>,
    /// Tags this host follows for the tenant: `oci://…:tag`.
    pub follow: Vec<crate::oci::OciRef>,
    /// The tenant's own credentials, by registry host (over the host's).
    pub registry_credentials: BTreeMap<String, Credential>,
    /// Alias → full activity type name.
    pub aliases: BTreeMap<String, String>,
    /// What the tenant may keep stored through the admin API.
    pub quota: Quota,
}

/// A configuration that cannot be used, naming the key. Its `Display` is
/// the whole story (what an operator reads); `source()` gives the cause
/// where there is one.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading `{}`: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A problem inside the file at `path`.
    #[error("{}: {source}", path.display())]
    InFile {
        path: PathBuf,
        source: Box<ConfigError>,
    },
    /// Not TOML, or not the shape of a configuration.
    #[error("{}", .0.to_string().trim_end())]
    Syntax(toml::de::Error),
    /// A value that cannot be used.
    #[error("{key}: {problem}")]
    Invalid { key: String, problem: String },
    /// Capabilities this host cannot grant.
    #[error("{key}: {source}")]
    Policy { key: String, source: PolicyError },
}

/// A value at `key` that cannot be used, and why.
fn invalid(key: impl Into<String>, problem: impl std::fmt::Display) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        problem: problem.to_string(),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    host: RawHost,
    #[serde(default)]
    tenant: Vec<RawTenant>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawHost {
    max_concurrent: Option<i64>,
    shutdown_grace: Option<String>,
    cache_dir: Option<PathBuf>,
    max_memory: Option<String>,
    connect_timeout: Option<String>,
    admin_listen: Option<String>,
    admin_tls: Option<RawTls>,
    data_dir: Option<PathBuf>,
    metrics_listen: Option<String>,
    operator_token_sha256: Option<String>,
    metrics_token_sha256: Option<String>,
    max_upload: Option<String>,
    compile_timeout: Option<String>,
    compile_memory: Option<String>,
    max_compiles: Option<i64>,
    #[serde(default)]
    insecure_registries: Vec<String>,
    follow_interval: Option<String>,
    registry_deadline: Option<String>,
    idle_memory_release: Option<String>,
    secret_refresh: Option<String>,
    tracing: Option<RawTracing>,
    #[serde(default)]
    registry_credentials: BTreeMap<String, RawCredential>,
    log_format: Option<String>,
    /// Serve the admin API in plain text on an address other than loopback.
    #[serde(default)]
    admin_plaintext: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    cert: PathBuf,
    key: PathBuf,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTenant {
    name: String,
    token_sha256: Option<String>,
    temporal: Option<TemporalBinding>,
    aion: Option<RawAion>,
    #[serde(default)]
    limits: RawLimits,
    #[serde(default)]
    capabilities: RawCapabilities,
    /// What the guest reads through `wasi:config`.
    #[serde(default)]
    config: BTreeMap<String, String>,
    #[serde(default)]
    secrets: BTreeMap<String, RawSecret>,
    #[serde(default)]
    components: Vec<String>,
    #[serde(default)]
    registries: Vec<String>,
    #[serde(default)]
    follow: Vec<String>,
    #[serde(default)]
    registry_credentials: BTreeMap<String, RawCredential>,
    #[serde(default)]
    aliases: BTreeMap<String, String>,
    #[serde(default)]
    retry: BTreeMap<String, bool>,
    /// Its share of the cores when tenants compete, against the others'.
    cpu_weight: Option<i64>,
    /// At most this many cores, whatever is idle.
    cpu_max: Option<f64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    memory: Option<String>,
    timeout: Option<String>,
    max_concurrent: Option<i64>,
    fuel: Option<u64>,
    cancel_grace: Option<String>,
    max_input: Option<String>,
    max_output: Option<String>,
    max_stdio: Option<String>,
    max_handles: Option<i64>,
    max_http_requests: Option<i64>,
    max_http_bytes: Option<String>,
    max_versions: Option<i64>,
    max_stored: Option<String>,
    #[serde(default)]
    per_type: BTreeMap<String, i64>,
}

impl Config {
    /// Reads and validates a configuration file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        Config::parse(&text, base).map_err(|e| ConfigError::InFile {
            path: path.to_owned(),
            source: Box::new(e),
        })
    }

    /// Parses and validates configuration text; relative paths are resolved
    /// against `base`.
    pub fn parse(text: &str, base: &Path) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(ConfigError::Syntax)?;
        let host = HostConfig {
            max_concurrent: positive(raw.host.max_concurrent, 256, "host.max_concurrent")?,
            shutdown_grace: duration(
                raw.host.shutdown_grace.as_deref(),
                "30s",
                "host.shutdown_grace",
            )?,
            cache_dir: raw.host.cache_dir.map(|d| base.join(d)),
            max_memory: bytes(raw.host.max_memory.as_deref(), "1GiB", "host.max_memory")?,
            connect_timeout: duration(
                raw.host.connect_timeout.as_deref(),
                "30s",
                "host.connect_timeout",
            )?,
            admin_listen: address(raw.host.admin_listen.as_deref(), "host.admin_listen")?,
            admin_tls: raw.host.admin_tls.map(|t| TlsFiles {
                cert: base.join(t.cert),
                key: base.join(t.key),
            }),
            data_dir: raw.host.data_dir.map(|d| base.join(d)),
            metrics_listen: address(raw.host.metrics_listen.as_deref(), "host.metrics_listen")?,
            operator_token_sha256: token_hash(
                raw.host.operator_token_sha256,
                "host.operator_token_sha256",
            )?,
            metrics_token_sha256: token_hash(
                raw.host.metrics_token_sha256,
                "host.metrics_token_sha256",
            )?,
            max_upload: bytes(raw.host.max_upload.as_deref(), "64MiB", "host.max_upload")?,
            compile_timeout: duration(
                raw.host.compile_timeout.as_deref(),
                "2m",
                "host.compile_timeout",
            )?,
            compile_memory: bytes(
                raw.host.compile_memory.as_deref(),
                "2GiB",
                "host.compile_memory",
            )?,
            max_compiles: at_most(
                positive(
                    raw.host.max_compiles,
                    DEFAULT_MAX_COMPILES as i64,
                    "host.max_compiles",
                )?,
                MAX_COMPILES,
                "host.max_compiles",
            )?,
            insecure_registries: raw.host.insecure_registries,
            tracing: raw.host.tracing.map(tracing).transpose()?,
            secret_refresh: duration(
                raw.host.secret_refresh.as_deref(),
                "60s",
                "host.secret_refresh",
            )?,
            follow_interval: duration(
                raw.host.follow_interval.as_deref(),
                "30s",
                "host.follow_interval",
            )?,
            registry_deadline: duration(
                raw.host.registry_deadline.as_deref(),
                "5m",
                "host.registry_deadline",
            )?,
            idle_memory_release: duration(
                raw.host.idle_memory_release.as_deref(),
                "60s",
                "host.idle_memory_release",
            )?,
            registry_credentials: credentials(
                &raw.host.registry_credentials,
                base,
                "host.registry_credentials",
            )?,
            log_json: match raw.host.log_format.as_deref() {
                None | Some("text") => false,
                Some("json") => true,
                Some(other) => {
                    return Err(invalid(
                        "host.log_format",
                        format!("`{other}` is not text or json"),
                    ));
                }
            },
        };
        if host.admin_listen.is_some() && host.data_dir.is_none() {
            return Err(invalid(
                "host.data_dir",
                "required with host.admin_listen, so uploaded components survive a restart",
            ));
        }
        if let Some(address) = host.admin_listen
            && !address.ip().is_loopback()
            && host.admin_tls.is_none()
            && !raw.host.admin_plaintext
        {
            return Err(invalid(
                "host.admin_listen",
                format!(
                    "{address} is reachable from other machines, and tokens would cross the \
                     network in clear text: set host.admin_tls, or host.admin_plaintext = true \
                     if something else encrypts the traffic"
                ),
            ));
        }
        if host.admin_tls.is_some() && host.admin_listen.is_none() {
            return Err(invalid(
                "host.admin_tls",
                "set host.admin_listen too (TLS for which endpoint?)",
            ));
        }
        if raw.tenant.is_empty() {
            return Err(invalid(
                "tenant",
                "no [[tenant]] is configured: nothing to serve",
            ));
        }
        let mut tenants: Vec<TenantConfig> = Vec::with_capacity(raw.tenant.len());
        for (i, t) in raw.tenant.into_iter().enumerate() {
            let key = |field: &str| format!("tenant[{i}] (`{}`).{field}", t.name);
            if t.name.is_empty() || !t.name.chars().all(crate::control::metadata::name_char) {
                return Err(invalid(
                    format!("tenant[{i}].name"),
                    format!(
                        "`{}` must be non-empty letters, digits, `-`, `_` or `.`",
                        t.name
                    ),
                ));
            }
            if tenants.iter().any(|other| other.tenant.name == t.name) {
                return Err(invalid(
                    format!("tenant[{i}].name"),
                    format!("`{}` is configured twice", t.name),
                ));
            }
            let engine = engine::validate(t.temporal.clone(), t.aion.clone(), &key)?;
            let defaults = Limits::default();
            let l = &t.limits;
            let limits = Limits {
                memory: bytes(l.memory.as_deref(), "128MiB", &key("limits.memory"))?,
                timeout: Some(duration(
                    l.timeout.as_deref(),
                    "5m",
                    &key("limits.timeout"),
                )?),
                fuel: l.fuel,
                cancel_grace: duration(
                    l.cancel_grace.as_deref(),
                    "5s",
                    &key("limits.cancel_grace"),
                )?,
                max_input: size(
                    l.max_input.as_deref(),
                    defaults.max_input,
                    &key("limits.max_input"),
                )?,
                max_output: size(
                    l.max_output.as_deref(),
                    defaults.max_output,
                    &key("limits.max_output"),
                )?,
                max_stdio: size(
                    l.max_stdio.as_deref(),
                    defaults.max_stdio,
                    &key("limits.max_stdio"),
                )?,
                max_handles: positive(
                    l.max_handles,
                    defaults.max_handles as i64,
                    &key("limits.max_handles"),
                )?,
                max_http_requests: u32::try_from(positive(
                    l.max_http_requests,
                    i64::from(defaults.max_http_requests),
                    &key("limits.max_http_requests"),
                )?)
                .map_err(|_| invalid(key("limits.max_http_requests"), "too large"))?,
                max_http_bytes: size(
                    l.max_http_bytes.as_deref(),
                    defaults.max_http_bytes as usize,
                    &key("limits.max_http_bytes"),
                )? as u64,
                ..defaults
            };
            let max_concurrent = positive(
                l.max_concurrent,
                host.max_concurrent as i64,
                &key("limits.max_concurrent"),
            )?;
            let mut type_limits = BTreeMap::new();
            for (name, limit) in &l.per_type {
                let limit = positive(Some(*limit), 1, &key(&format!("limits.per_type.{name}")))?;
                if limit > max_concurrent {
                    return Err(invalid(
                        key(&format!("limits.per_type.{name}")),
                        format!("{limit} is above the tenant's max_concurrent of {max_concurrent}"),
                    ));
                }
                type_limits.insert(name.clone(), limit);
            }
            let mut retry = RetryPolicy::default();
            for (class, retryable) in &t.retry {
                let Some(c) = FailureClass::ALL.iter().find(|c| c.as_str() == class) else {
                    return Err(invalid(
                        key("retry"),
                        format!(
                            "`{class}` is not a failure class ({})",
                            FailureClass::ALL.map(FailureClass::as_str).join(", ")
                        ),
                    ));
                };
                retry.set(*c, *retryable);
            }
            if t.components.is_empty() && t.follow.is_empty() && host.admin_listen.is_none() {
                return Err(invalid(
                    key("components"),
                    "no component to serve (list some, follow a tag, or set host.admin_listen to deploy them)",
                ));
            }
            let tenant = Tenant {
                name: t.name.clone(),
                limits,
                capabilities: capabilities::parse(
                    &t.capabilities,
                    &t.config,
                    &t.secrets,
                    base,
                    &key,
                )?,
                retry,
                cpu: CpuShare {
                    weight: t
                        .cpu_weight
                        .map(CpuWeight::new)
                        .transpose()
                        .map_err(|e| invalid(key("cpu_weight"), e))?
                        .unwrap_or_default(),
                    max: t
                        .cpu_max
                        .map(CpuMax::from_cores)
                        .transpose()
                        .map_err(|e| invalid(key("cpu_max"), e))?,
                },
            };
            tenant
                .capabilities
                .check()
                .map_err(|source| ConfigError::Policy {
                    key: key("capabilities"),
                    source,
                })?;
            let quota = Quota {
                versions: positive(
                    t.limits.max_versions,
                    Quota::default().versions as i64,
                    &key("limits.max_versions"),
                )?,
                bytes: bytes(
                    t.limits.max_stored.as_deref(),
                    "1GiB",
                    &key("limits.max_stored"),
                )?,
            };
            tenants.push(TenantConfig {
                tenant,
                token_sha256: token_hash(t.token_sha256.clone(), &key("token_sha256"))?,
                max_concurrent,
                type_limits,
                engine,
                components: t
                    .components
                    .iter()
                    .map(|c| ComponentSource::parse(c, base))
                    .collect::<Result<_, _>>()
                    .map_err(|e| invalid(key("components"), e.to_string()))?,
                registries: t
                    .registries
                    .iter()
                    .map(|r| r.parse())
                    .collect::<Result<_, _>>()
                    .map_err(|e: crate::oci::OciError| invalid(key("registries"), e.to_string()))?,
                follow: follows(&t.follow, &key("follow"))?,
                registry_credentials: credentials(
                    &t.registry_credentials,
                    base,
                    &key("registry_credentials"),
                )?,
                aliases: t.aliases.clone(),
                quota,
            });
        }
        Ok(Config { host, tenants })
    }
}

#[cfg(test)]
mod tests;
