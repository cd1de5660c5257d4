//! A `[[tenant]]`: its engine, limits, capabilities, CPU share, components
//! and registries, each validated with errors that name the key.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use super::capabilities::{self, RawCapabilities, SecretEntry};
use super::engine::{self, Engine, RawAion, TemporalBinding};
use super::host::HostConfig;
use super::source::{ComponentSource, RawCredential, credentials, follows};
use super::values::{bytes, duration, positive, size, token_hash};
use super::{ConfigError, invalid};
use crate::control::rollout::{Ramp, Rollout};
use crate::control::shadow::Shadow;
use crate::oci::{Credential, RepositoryPrefix};
use crate::token::TokenHash;
use corral_core::name::Name;
use corral_core::sandbox::{
    DEFAULT_TIMEOUT, FailureClass, Limits, RetryPolicy, Reuse, Tenant, parse_duration,
};
use corral_core::share::{CpuMax, CpuShare, CpuWeight};

/// What one tenant may keep stored: versions and bytes (active or not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    pub versions: usize,
    pub bytes: u64,
}

impl Default for Quota {
    fn default() -> Self {
        Quota {
            versions: 100,
            bytes: 1 << 30,
        }
    }
}

#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TenantConfig {
    pub tenant: Tenant,
    /// Hex SHA-256 of the tenant's admin API token.
    pub token_sha256: Option<TokenHash>,
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
    /// What its new versions may activate by themselves.
    pub rollout: Rollout,
    /// The keys its versions must be signed by (the host's `trust` unless
    /// it has its own).
    pub trust: crate::trust::TrustPolicy,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTenant {
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
    #[serde(default, deserialize_with = "capabilities::secret_entries")]
    secrets: BTreeMap<String, SecretEntry>,
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
    /// Warm instances: `{ max_tasks = N, idle = "30s" }`.
    reuse: Option<RawReuse>,
    /// Roll-out gates: `{ hold = ["breaking", …] }`.
    rollout: Option<RawRollout>,
    /// Signed versions only: `{ keys = ["release.pub"], require = true }`.
    trust: Option<super::values::RawTrust>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRollout {
    #[serde(default)]
    hold: Vec<String>,
    canary: Option<RawCanary>,
    shadow: Option<RawShadow>,
}

/// `shadow = { types = ["shout"], sample = 50, expire = "24h",
/// max_bytes = "16MiB", min_agreement = 100 }`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawShadow {
    types: Vec<String>,
    #[serde(default = "default_sample")]
    sample: u32,
    expire: Option<String>,
    max_bytes: Option<String>,
    min_agreement: Option<u32>,
}

fn default_sample() -> u32 {
    crate::control::shadow::DEFAULT_SAMPLE
}

/// `canary = { steps = [10, 50], every = "5m", margin = 5, min_tasks = 20 }`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCanary {
    steps: Vec<u32>,
    every: String,
    #[serde(default = "default_margin")]
    margin: u32,
    #[serde(default = "default_min_tasks")]
    min_tasks: u32,
}

fn default_margin() -> u32 {
    crate::control::rollout::DEFAULT_MARGIN
}

fn default_min_tasks() -> u32 {
    crate::control::rollout::DEFAULT_MIN_TASKS
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReuse {
    max_tasks: i64,
    idle: String,
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

/// Validates tenant `i` of the file (`tenants`: those before it).
pub(super) fn parse(
    i: usize,
    t: RawTenant,
    host: &HostConfig,
    base: &Path,
    tenants: &[TenantConfig],
) -> Result<TenantConfig, ConfigError> {
    let key = |field: &str| format!("tenant[{i}] (`{}`).{field}", t.name);
    Name::new(t.name.as_str()).map_err(|e| invalid(format!("tenant[{i}].name"), e))?;
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
        memory: bytes(l.memory.as_deref(), defaults.memory, &key("limits.memory"))?,
        timeout: Some(duration(
            l.timeout.as_deref(),
            DEFAULT_TIMEOUT,
            &key("limits.timeout"),
        )?),
        fuel: l.fuel,
        cancel_grace: duration(
            l.cancel_grace.as_deref(),
            defaults.cancel_grace,
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
        capabilities: capabilities::parse(&t.capabilities, &t.config, &t.secrets, base, &key)?,
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
        reuse: t
            .reuse
            .as_ref()
            .map(|r| {
                let idle = parse_duration(&r.idle).map_err(|e| invalid(key("reuse.idle"), e))?;
                Reuse::new(r.max_tasks, idle).map_err(|e| invalid(key("reuse"), e))
            })
            .transpose()?,
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
            Quota::default().bytes,
            &key("limits.max_stored"),
        )?,
    };
    Ok(TenantConfig {
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
        trust: match &t.trust {
            Some(raw) => super::values::trust(raw, base, &key("trust"))?,
            None => host.trust.clone(),
        },
        rollout: match &t.rollout {
            None => Rollout::default(),
            Some(r) => {
                let mut rollout =
                    Rollout::new(&r.hold).map_err(|e| invalid(key("rollout.hold"), e))?;
                rollout.canary = r
                    .canary
                    .as_ref()
                    .map(|c| {
                        let every = parse_duration(&c.every)
                            .map_err(|e| invalid(key("rollout.canary.every"), e))?;
                        Ramp::new(c.steps.clone(), every, c.margin, c.min_tasks)
                            .map_err(|e| invalid(key("rollout.canary"), e))
                    })
                    .transpose()?;
                rollout.shadow = r
                    .shadow
                    .as_ref()
                    .map(|sh| {
                        let expire = duration(
                            sh.expire.as_deref(),
                            crate::control::shadow::DEFAULT_EXPIRE,
                            &key("rollout.shadow.expire"),
                        )?;
                        let max_bytes = bytes(
                            sh.max_bytes.as_deref(),
                            crate::control::shadow::DEFAULT_MAX_BYTES,
                            &key("rollout.shadow.max_bytes"),
                        )?;
                        Shadow::new(&sh.types, sh.sample, expire, max_bytes, sh.min_agreement)
                            .map_err(|e| invalid(key("rollout.shadow"), e))
                    })
                    .transpose()?;
                rollout
            }
        },
    })
}
