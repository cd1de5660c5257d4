//! Checked values of a configuration: addresses, token hashes, counts,
//! durations, sizes and the trace endpoint, each error naming its key.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, invalid};
use crate::telemetry::TracingConfig;
use crate::token::TokenHash;
use corral_core::sandbox::{parse_bytes, parse_duration};

pub(super) fn address(value: Option<&str>, key: &str) -> Result<Option<SocketAddr>, ConfigError> {
    value
        .map(|v| {
            v.parse().map_err(|_| {
                invalid(
                    key,
                    format!("`{v}` is not an address such as 127.0.0.1:7466"),
                )
            })
        })
        .transpose()
}

pub(super) fn token_hash(
    value: Option<String>,
    key: &str,
) -> Result<Option<TokenHash>, ConfigError> {
    match value {
        Some(h) => h.parse().map(Some).map_err(|e| invalid(key, e)),
        None => Ok(None),
    }
}

pub(super) fn positive(value: Option<i64>, default: i64, key: &str) -> Result<usize, ConfigError> {
    let v = value.unwrap_or(default);
    if v < 1 {
        return Err(invalid(key, format!("must be at least 1, got {v}")));
    }
    usize::try_from(v).map_err(|_| invalid(key, format!("{v} is too large")))
}

/// `value`, unless it is above `max`.
pub(super) fn at_most(value: usize, max: usize, key: &str) -> Result<usize, ConfigError> {
    if value > max {
        return Err(invalid(key, format!("must be at most {max}, got {value}")));
    }
    Ok(value)
}

pub(super) fn duration(
    value: Option<&str>,
    default: Duration,
    key: &str,
) -> Result<Duration, ConfigError> {
    let d = match value {
        None => default,
        Some(v) => parse_duration(v).map_err(|e| invalid(key, e))?,
    };
    if d.is_zero() {
        return Err(invalid(key, "must be above zero"));
    }
    Ok(d)
}

pub(super) fn bytes(value: Option<&str>, default: u64, key: &str) -> Result<u64, ConfigError> {
    value.map_or(Ok(default), |v| parse_bytes(v).map_err(|e| invalid(key, e)))
}

pub(super) fn size(value: Option<&str>, default: usize, key: &str) -> Result<usize, ConfigError> {
    match value {
        None => Ok(default),
        Some(v) => {
            let b = parse_bytes(v).map_err(|e| invalid(key, e))?;
            usize::try_from(b).map_err(|_| invalid(key, "too large"))
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTracing {
    otlp_endpoint: String,
    service_name: Option<String>,
}

/// `[host.tracing]`: an `http://` or `https://` OTLP/gRPC endpoint.
pub(super) fn tracing(raw: RawTracing) -> Result<TracingConfig, ConfigError> {
    let uri: Option<hyper::Uri> = raw.otlp_endpoint.parse().ok();
    let valid =
        uri.is_some_and(|u| matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some());
    if !valid {
        return Err(invalid(
            "host.tracing.otlp_endpoint",
            format!(
                "`{}` is not an OTLP/gRPC endpoint such as http://127.0.0.1:4317",
                raw.otlp_endpoint
            ),
        ));
    }
    Ok(TracingConfig {
        otlp_endpoint: raw.otlp_endpoint,
        service_name: raw.service_name.unwrap_or_else(|| "corral".to_owned()),
    })
}

/// `trust = { keys = ["keys/release.pub"] }` (a host's default, or a
/// tenant's own). Naming keys requires signatures by them, unless
/// `require = false` (audit: unsigned versions serve, and are counted).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTrust {
    #[serde(default)]
    keys: Vec<std::path::PathBuf>,
    require: Option<bool>,
}

/// The trust policy at `key`, its key files relative to `base`.
pub(super) fn trust(
    raw: &RawTrust,
    base: &std::path::Path,
    key: &str,
) -> Result<crate::trust::TrustPolicy, super::ConfigError> {
    let paths: Vec<std::path::PathBuf> = raw.keys.iter().map(|p| base.join(p)).collect();
    let require = raw.require.unwrap_or(!paths.is_empty());
    crate::trust::TrustPolicy::new(&paths, require).map_err(|e| super::invalid(key, e))
}
