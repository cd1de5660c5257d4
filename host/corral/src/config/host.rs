//! The `[host]` section: what the whole host may use and where it listens.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::source::{RawCredential, credentials};
use super::values::{RawTracing, address, at_most, bytes, duration, positive, token_hash, tracing};
use super::{ConfigError, DEFAULT_MAX_COMPILES, MAX_COMPILES, invalid};
use crate::oci::Credential;
use crate::telemetry::TracingConfig;
use crate::token::TokenHash;

/// The most warm instances a host may keep: each holds a pool slot and
/// its guest's memory.
const MAX_WARM_INSTANCES: u32 = 10_000;

/// A certificate and key (PEM) for the admin endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct HostConfig {
    pub max_concurrent: usize,
    pub shutdown_grace: Duration,
    pub cache_dir: Option<PathBuf>,
    pub max_memory: u64,
    /// Warm instances kept between tasks of tenants with `reuse`, in all
    /// (0: none are).
    pub max_warm_instances: u32,
    /// How long to keep trying to reach an engine at start.
    pub connect_timeout: Duration,
    pub admin_listen: Option<SocketAddr>,
    pub admin_tls: Option<TlsFiles>,
    pub data_dir: Option<PathBuf>,
    pub metrics_listen: Option<SocketAddr>,
    pub operator_token_sha256: Option<TokenHash>,
    /// Hex SHA-256 of the token `/metrics` requires (none: open).
    pub metrics_token_sha256: Option<TokenHash>,
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
    /// The keys tenants' versions must be signed by, for tenants without a
    /// `trust` of their own.
    pub trust: crate::trust::TrustPolicy,
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
            max_warm_instances: 64,
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
            trust: crate::trust::TrustPolicy::default(),
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

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHost {
    max_concurrent: Option<i64>,
    shutdown_grace: Option<String>,
    cache_dir: Option<PathBuf>,
    max_memory: Option<String>,
    max_warm_instances: Option<i64>,
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
    trust: Option<super::values::RawTrust>,
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

/// Validates the `[host]` section; every default is `HostConfig::default()`'s.
pub(super) fn parse(raw: RawHost, base: &Path) -> Result<HostConfig, ConfigError> {
    // Every default is the one `HostConfig::default()` states.
    let d = HostConfig::default();
    let host = HostConfig {
        max_concurrent: positive(
            raw.max_concurrent,
            d.max_concurrent as i64,
            "host.max_concurrent",
        )?,
        shutdown_grace: duration(
            raw.shutdown_grace.as_deref(),
            d.shutdown_grace,
            "host.shutdown_grace",
        )?,
        cache_dir: raw.cache_dir.map(|d| base.join(d)),
        max_memory: bytes(raw.max_memory.as_deref(), d.max_memory, "host.max_memory")?,
        max_warm_instances: match raw.max_warm_instances {
            None => d.max_warm_instances,
            Some(n) => u32::try_from(n)
                .ok()
                .filter(|n| *n <= MAX_WARM_INSTANCES)
                .ok_or_else(|| {
                    invalid(
                        "host.max_warm_instances",
                        format!("must be a whole number from 0 to {MAX_WARM_INSTANCES}, got {n}"),
                    )
                })?,
        },
        connect_timeout: duration(
            raw.connect_timeout.as_deref(),
            d.connect_timeout,
            "host.connect_timeout",
        )?,
        admin_listen: address(raw.admin_listen.as_deref(), "host.admin_listen")?,
        admin_tls: raw.admin_tls.map(|t| TlsFiles {
            cert: base.join(t.cert),
            key: base.join(t.key),
        }),
        data_dir: raw.data_dir.map(|d| base.join(d)),
        metrics_listen: address(raw.metrics_listen.as_deref(), "host.metrics_listen")?,
        operator_token_sha256: token_hash(raw.operator_token_sha256, "host.operator_token_sha256")?,
        metrics_token_sha256: token_hash(raw.metrics_token_sha256, "host.metrics_token_sha256")?,
        max_upload: bytes(raw.max_upload.as_deref(), d.max_upload, "host.max_upload")?,
        compile_timeout: duration(
            raw.compile_timeout.as_deref(),
            d.compile_timeout,
            "host.compile_timeout",
        )?,
        compile_memory: bytes(
            raw.compile_memory.as_deref(),
            d.compile_memory,
            "host.compile_memory",
        )?,
        max_compiles: at_most(
            positive(raw.max_compiles, d.max_compiles as i64, "host.max_compiles")?,
            MAX_COMPILES,
            "host.max_compiles",
        )?,
        insecure_registries: raw.insecure_registries,
        trust: match &raw.trust {
            Some(trust) => super::values::trust(trust, base, "host.trust")?,
            None => d.trust,
        },
        tracing: raw.tracing.map(tracing).transpose()?,
        secret_refresh: duration(
            raw.secret_refresh.as_deref(),
            d.secret_refresh,
            "host.secret_refresh",
        )?,
        follow_interval: duration(
            raw.follow_interval.as_deref(),
            d.follow_interval,
            "host.follow_interval",
        )?,
        registry_deadline: duration(
            raw.registry_deadline.as_deref(),
            d.registry_deadline,
            "host.registry_deadline",
        )?,
        idle_memory_release: duration(
            raw.idle_memory_release.as_deref(),
            d.idle_memory_release,
            "host.idle_memory_release",
        )?,
        registry_credentials: credentials(
            &raw.registry_credentials,
            base,
            "host.registry_credentials",
        )?,
        log_json: match raw.log_format.as_deref() {
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
        && !raw.admin_plaintext
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
    Ok(host)
}
