//! A tenant's capabilities, `config` and `secrets` in the configuration:
//!
//! ```toml
//! capabilities = { env = { REGION = "eu" }, http_hosts = [
//!   "api.example.com",
//!   { host = "api.stripe.com", methods = ["POST"], paths = ["/v1/charges"] },
//!   { host = "db.internal:8080", addresses = ["10.0.0.0/8"] },
//! ] }
//! config = { region = "eu", currency = "EUR" }
//! secrets = { STRIPE_KEY = { env = "ACME_STRIPE_KEY", hosts = ["api.stripe.com"] } }
//! ```
//!
//! A secret's value comes from corral's environment (`env`) or a file
//! (`file`), never from this text.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;

use super::{ConfigError, invalid};
use corral_core::sandbox::{
    Capabilities, DirGrant, DirMode, GrantError, HttpGrant, SecretHost, SecretSource, SecretSpec,
    Secrets,
};

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCapabilities {
    #[serde(default)]
    dirs: Vec<RawDir>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    /// Each a string or a table; read by [`grant`], which names what is
    /// wrong with either.
    #[serde(default)]
    http_hosts: Vec<toml::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDir {
    host: PathBuf,
    guest: String,
    #[serde(default)]
    mode: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    host: String,
    #[serde(default)]
    methods: Vec<String>,
    #[serde(default)]
    paths: Vec<String>,
    #[serde(default)]
    addresses: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSecret {
    env: Option<String>,
    file: Option<PathBuf>,
    #[serde(default)]
    hosts: Vec<String>,
    #[serde(default)]
    in_query: bool,
    /// Accepted only to be refused without being quoted: a value written
    /// here would sit in clear in the file, and a parse error would print it.
    value: Option<toml::Value>,
}

/// A secret's entry under `secrets`: where its value comes from, or
/// anything else written in place of that (most likely the value itself),
/// refused without being quoted: deserialized as a source, a string would
/// be quoted whole in the parse error (`invalid type: string "sk_live_…"`).
pub(super) enum SecretEntry {
    Source(RawSecret),
    Written,
}

impl<'de> Deserialize<'de> for SecretEntry {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match toml::Value::deserialize(d)? {
            toml::Value::Table(table) => toml::Value::Table(table)
                .try_into()
                .map(SecretEntry::Source)
                .map_err(serde::de::Error::custom),
            _ => Ok(SecretEntry::Written),
        }
    }
}

/// A tenant's `secrets`: a table of named entries. Anything else is
/// refused without being quoted (most likely a value).
pub(super) fn secret_entries<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, SecretEntry>, D::Error> {
    match toml::Value::deserialize(d)? {
        toml::Value::Table(table) => table
            .into_iter()
            .map(|(name, entry)| {
                Ok((
                    name,
                    SecretEntry::deserialize(entry).map_err(serde::de::Error::custom)?,
                ))
            })
            .collect(),
        _ => Err(serde::de::Error::custom(
            "`secrets` names each secret's source ({ NAME = { env = \"VAR\", hosts = [\"host\"] } }), never a value",
        )),
    }
}

/// Validates a tenant's capabilities and loads its secrets; `key` names a
/// field of the tenant in errors.
pub(super) fn parse(
    raw: &RawCapabilities,
    config: &BTreeMap<String, String>,
    secrets: &BTreeMap<String, SecretEntry>,
    base: &Path,
    key: &dyn Fn(&str) -> String,
) -> Result<Capabilities, ConfigError> {
    let mut dirs = Vec::new();
    for (j, d) in raw.dirs.iter().enumerate() {
        let mode = match d.mode.as_deref() {
            None | Some("ro") => DirMode::ReadOnly,
            Some("rw") => DirMode::ReadWrite,
            Some(other) => {
                return Err(invalid(
                    key(&format!("capabilities.dirs[{j}].mode")),
                    format!("`{other}` is not ro or rw"),
                ));
            }
        };
        dirs.push(DirGrant {
            host: base.join(&d.host),
            guest: d.guest.clone(),
            mode,
        });
    }
    let http_hosts = raw
        .http_hosts
        .iter()
        .enumerate()
        .map(|(j, g)| {
            grant(g).map_err(|e| invalid(key(&format!("capabilities.http_hosts[{j}]")), e))
        })
        .collect::<Result<_, _>>()?;
    let mut specs = Vec::with_capacity(secrets.len());
    for (name, s) in secrets {
        let at = |field: &str| key(&format!("secrets.{name}{field}"));
        let SecretEntry::Source(s) = s else {
            return Err(invalid(
                at(""),
                "a secret's value is never written in the configuration: name its source, { env = \"VAR\" } or { file = \"path\" }, and its hosts",
            ));
        };
        if s.value.is_some() {
            return Err(invalid(
                at(".value"),
                "a secret's value is never read from the configuration: name its source with env or file",
            ));
        }
        let source = match (&s.env, &s.file) {
            (Some(var), None) => SecretSource::Env(var.clone()),
            (None, Some(file)) => SecretSource::File(base.join(file)),
            _ => {
                return Err(invalid(
                    at(""),
                    "give exactly one of env (a variable of corral's environment) or file",
                ));
            }
        };
        let hosts = s
            .hosts
            .iter()
            .enumerate()
            .map(|(j, h)| {
                h.parse::<SecretHost>()
                    .map_err(|e| invalid(at(&format!(".hosts[{j}]")), e))
            })
            .collect::<Result<_, _>>()?;
        specs.push(SecretSpec {
            name: name.clone(),
            source,
            hosts,
            in_query: s.in_query,
        });
    }
    let secrets = Secrets::load(specs).map_err(|e| invalid(key("secrets"), e))?;
    Ok(Capabilities {
        dirs,
        env: raw.env.clone().into_iter().collect(),
        http_hosts,
        config: Arc::new(config.clone()),
        secrets: Arc::new(secrets),
    })
}

/// Why an `http_hosts` entry is not a grant.
#[derive(Debug, thiserror::Error)]
enum RuleError {
    #[error(transparent)]
    Grant(#[from] GrantError),
    #[error("{}", .0.to_string().trim_end())]
    Table(#[source] toml::de::Error),
    #[error(
        "a grant is a host (\"api.example.com\") or a table ({{ host = \"…\", methods = […], paths = […], addresses = […] }})"
    )]
    Shape,
}

/// `"api.example.com"` or `{ host = "…", methods, paths, addresses }`.
fn grant(raw: &toml::Value) -> Result<HttpGrant, RuleError> {
    let rule = match raw {
        toml::Value::String(host) => return Ok(host.parse()?),
        toml::Value::Table(_) => RawRule::deserialize(raw.clone()).map_err(RuleError::Table)?,
        _ => return Err(RuleError::Shape),
    };
    let grant = rule
        .host
        .parse::<HttpGrant>()
        .and_then(|g| g.with_methods(&rule.methods))
        .and_then(|g| g.with_paths(&rule.paths))
        .and_then(|g| g.with_addresses(&rule.addresses))?;
    Ok(grant)
}
