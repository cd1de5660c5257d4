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

use std::path::{Path, PathBuf};

use serde::Deserialize;

use corral_core::sandbox::{Limits, PolicyError};

mod capabilities;
mod engine;
mod host;
mod source;
mod tenant;
mod values;

pub use engine::{AionBinding, Compression, Engine, TemporalBinding};
pub use host::{HostConfig, TlsFiles};
pub use source::ComponentSource;
pub use tenant::{Quota, TenantConfig};

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
    /// The same, at a line about secrets: where and what, without the
    /// line (toml's error quotes it), which may hold a secret's value
    /// pasted where its source belongs.
    #[error("line {line}, column {column}: {message}")]
    SyntaxAtSecrets {
        line: usize,
        column: usize,
        message: String,
    },
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
    host: host::RawHost,
    #[serde(default)]
    tenant: Vec<tenant::RawTenant>,
}

/// A TOML error, quoting its line unless the line is about secrets (it
/// names them, or is in a table whose header does).
fn syntax(text: &str, error: toml::de::Error) -> ConfigError {
    let Some(at) = error.span().map(|span| span.start) else {
        return ConfigError::Syntax(error);
    };
    let before = text.get(..at).unwrap_or(text);
    let start = before.rfind('\n').map_or(0, |i| i + 1);
    let line = text[start..].lines().next().unwrap_or("");
    let section = text[..start]
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('['))
        .unwrap_or("");
    if !line.contains("secret") && !section.contains("secret") {
        return ConfigError::Syntax(error);
    }
    ConfigError::SyntaxAtSecrets {
        line: before.matches('\n').count() + 1,
        column: before[start..].chars().count() + 1,
        message: error.message().trim_end().to_owned(),
    }
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
    /// against `base`. Each section is validated by its own module.
    pub fn parse(text: &str, base: &Path) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| syntax(text, e))?;
        let host = host::parse(raw.host, base)?;
        if raw.tenant.is_empty() {
            return Err(invalid(
                "tenant",
                "no [[tenant]] is configured: nothing to serve",
            ));
        }
        let mut tenants: Vec<TenantConfig> = Vec::with_capacity(raw.tenant.len());
        for (i, t) in raw.tenant.into_iter().enumerate() {
            let tenant = tenant::parse(i, t, &host, base, &tenants)?;
            tenants.push(tenant);
        }
        Ok(Config { host, tenants })
    }

    /// The largest value of one of the tenants' limits (0 with none): what
    /// the host must allow for whichever tenant is served.
    pub fn largest(&self, limit: impl Fn(&Limits) -> usize) -> usize {
        self.tenants
            .iter()
            .map(|t| limit(&t.tenant.limits))
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests;
