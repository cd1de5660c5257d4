//! A tenant's policy, and the same policy checked against this host with
//! its capabilities prepared: [`PreparedTenant`], the only form a task runs
//! under, built only by [`Sandbox::prepare`].

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime_wasi::{FsPerms, HostMonotonicClock, WasiCtx, WasiCtxBuilder};
use wasmtime_wasi_config::WasiConfigVariables;

use super::capabilities::{Capabilities, DirMode, MAX_RANDOM_BYTES};
use super::engine::Sandbox;
use super::failure::RetryPolicy;
use super::limits::{Limits, format_bytes};
use super::stdio::GuestOutput;
use super::warm::{DeploymentReuse, WarmPool};

/// A tenant's policy: its limits, capabilities and retry defaults, as
/// configured. [`Sandbox::prepare`] checks it.
#[derive(Debug, Clone, Default)]
pub struct Tenant {
    pub name: String,
    pub limits: Limits,
    /// Its share of the host's cores, and its cap.
    pub cpu: crate::share::CpuShare,
    pub capabilities: Capabilities,
    pub retry: RetryPolicy,
    /// Whether its instances serve more than one task (`None`: a fresh
    /// instance for every task).
    pub reuse: Option<super::Reuse>,
}

/// A policy this host cannot apply, naming what is wrong; the message
/// carries its cause, as the configuration's errors do.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("granted directory `{}` cannot be opened: {source}", path.display())]
    DirUnopenable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("granted path `{}` is not a directory", .0.display())]
    NotADirectory(PathBuf),
    #[error("guest path `{0}` must be absolute (e.g. /data)")]
    GuestPathRelative(String),
    #[error("guest path `{0}` is granted twice")]
    GrantedTwice(String),
    #[error("environment variable name `{0}` is not valid")]
    EnvName(String),
    #[error("tenant `{tenant}`: memory limit {limit} is above the host's maximum of {max}", limit = format_bytes(*.limit), max = format_bytes(*.max))]
    Memory {
        tenant: String,
        limit: u64,
        max: u64,
    },
    #[error(
        "tenant `{tenant}`: table limit of {limit} elements is above the host's maximum of {max}"
    )]
    Tables {
        tenant: String,
        limit: u64,
        max: u64,
    },
    #[error("tenant `{0}`: timeout must be above zero")]
    ZeroTimeout(String),
    #[error(transparent)]
    SecretShadows(#[from] SecretShadows),
}

/// A config key or environment variable with a secret's name: the guest
/// reads the secret's placeholder under that name, so one would hide the
/// other.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "secret `{name}` would hide the {what} `{name}`: the guest reads a secret's placeholder under the secret's name"
)]
pub struct SecretShadows {
    pub name: String,
    pub what: &'static str,
}

/// A granted directory, opened once when the tenant was prepared.
#[derive(Debug, Clone)]
struct OpenDir {
    /// Held open: the grant is this directory, wherever it is moved to.
    _handle: Arc<std::fs::File>,
    /// Where each task's context reopens it: the handle's own entry in
    /// `/proc/self/fd`, or the granted path where there is none.
    path: PathBuf,
    guest: String,
    perms: FsPerms,
}

/// A tenant checked against this host, its directories opened: a task can
/// only run under one, and a capability that cannot be prepared is an error
/// when the tenant is configured or deployed, never in the middle of a
/// task.
#[derive(Clone)]
pub struct PreparedTenant {
    tenant: Tenant,
    dirs: Arc<[OpenDir]>,
    /// What `wasi:config/store` answers: the tenant's `config`, a
    /// deployment's over it, and each secret's placeholder.
    config: Arc<WasiConfigVariables>,
    /// The environment: the tenant's `env` and each secret's placeholder.
    env: Arc<[(String, String)]>,
    /// The tenant's name, shared, not copied, by every task's log labels.
    pub(crate) label: Arc<str>,
    /// Its instances between tasks, if it reuses them (a clone starts
    /// with none: see `warm`).
    pub(crate) warm: WarmPool,
    /// Where its attempts are recorded for shadow replay, if they are.
    pub shadow: Option<super::shadow::SamplerRef>,
}

impl std::fmt::Debug for PreparedTenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedTenant")
            .field("tenant", &self.tenant)
            .field("dirs", &self.dirs)
            .finish_non_exhaustive()
    }
}

impl std::ops::Deref for PreparedTenant {
    type Target = Tenant;

    fn deref(&self) -> &Tenant {
        &self.tenant
    }
}

impl Sandbox {
    /// Checks a tenant's policy against this host and prepares its
    /// capabilities: every granted directory exists and is opened, guest
    /// paths are absolute and distinct, env names are well-formed, and the
    /// limits fit the host's pool.
    pub fn prepare(&self, tenant: Tenant) -> Result<PreparedTenant, PolicyError> {
        let config = self.config();
        let limits = &tenant.limits;
        if limits.memory > config.max_memory {
            return Err(PolicyError::Memory {
                tenant: tenant.name.clone(),
                limit: limits.memory,
                max: config.max_memory,
            });
        }
        if limits.table_elements > config.max_table_elements {
            return Err(PolicyError::Tables {
                tenant: tenant.name.clone(),
                limit: limits.table_elements,
                max: config.max_table_elements,
            });
        }
        if limits.timeout == Some(Duration::ZERO) {
            return Err(PolicyError::ZeroTimeout(tenant.name.clone()));
        }
        let dirs = open_dirs(&tenant.capabilities)?;
        let env = guest_env(&tenant.capabilities)?;
        let config = guest_config(&tenant.capabilities, &[])?;
        Ok(PreparedTenant {
            label: tenant.name.as_str().into(),
            warm: WarmPool::new(tenant.reuse, &self.warm),
            tenant,
            dirs: dirs.into(),
            config,
            env,
            shadow: None,
        })
    }
}

impl PreparedTenant {
    /// The same tenant for one deployment whose own `config` is laid over
    /// the tenant's (its keys win, a secret's name excepted), and whose own
    /// `reuse` (if it has one) replaces the tenant's.
    pub fn for_deployment(
        &self,
        overrides: &[(String, String)],
        reuse: DeploymentReuse,
    ) -> Result<PreparedTenant, SecretShadows> {
        let config = if overrides.is_empty() {
            self.config.clone()
        } else {
            guest_config(&self.tenant.capabilities, overrides)?
        };
        let reuse = reuse.over(self.tenant.reuse);
        Ok(PreparedTenant {
            tenant: Tenant {
                reuse,
                ..self.tenant.clone()
            },
            config,
            warm: self.warm.with(reuse),
            ..self.clone()
        })
    }

    /// The same tenant with every granted directory read-only: shadow
    /// replay's, whose tasks must change nothing.
    pub fn read_only(&self) -> PreparedTenant {
        let dirs: Arc<[OpenDir]> = self
            .dirs
            .iter()
            .map(|d| OpenDir {
                perms: FsPerms::ReadOnly,
                ..d.clone()
            })
            .collect();
        PreparedTenant {
            dirs,
            ..self.clone()
        }
    }

    pub(crate) fn config_vars(&self) -> Arc<WasiConfigVariables> {
        self.config.clone()
    }
}

/// The guest's environment: the granted variables and the secrets'
/// placeholders.
fn guest_env(capabilities: &Capabilities) -> Result<Arc<[(String, String)]>, SecretShadows> {
    let mut env = capabilities.env.clone();
    for (name, placeholder) in capabilities.secrets.placeholders() {
        if env.iter().any(|(k, _)| k == name) {
            return Err(SecretShadows {
                name: name.to_owned(),
                what: "environment variable",
            });
        }
        env.push((name.to_owned(), placeholder.to_owned()));
    }
    Ok(env.into())
}

/// The guest's `wasi:config`: the tenant's, a deployment's over it, and
/// the secrets' placeholders.
fn guest_config(
    capabilities: &Capabilities,
    overrides: &[(String, String)],
) -> Result<Arc<WasiConfigVariables>, SecretShadows> {
    let mut config = (*capabilities.config).clone();
    config.extend(overrides.iter().cloned());
    let mut vars = WasiConfigVariables::new();
    for (name, placeholder) in capabilities.secrets.placeholders() {
        if config.contains_key(name) {
            return Err(SecretShadows {
                name: name.to_owned(),
                what: "config key",
            });
        }
        vars.insert(name, placeholder);
    }
    for (key, value) in config {
        vars.insert(key, value);
    }
    Ok(Arc::new(vars))
}

impl Capabilities {
    /// What [`Sandbox::prepare`] checks of the capabilities, without keeping
    /// anything open: for a configuration read before any sandbox exists.
    pub fn check(&self) -> Result<(), PolicyError> {
        open_dirs(self)?;
        guest_env(self)?;
        guest_config(self, &[])?;
        Ok(())
    }
}

fn open_dirs(capabilities: &Capabilities) -> Result<Vec<OpenDir>, PolicyError> {
    for (name, _) in &capabilities.env {
        if name.is_empty() || name.contains('=') || name.contains('\0') {
            return Err(PolicyError::EnvName(name.clone()));
        }
    }
    let mut dirs = Vec::with_capacity(capabilities.dirs.len());
    for (i, grant) in capabilities.dirs.iter().enumerate() {
        let unopenable = |source| PolicyError::DirUnopenable {
            path: grant.host.clone(),
            source,
        };
        let meta = std::fs::metadata(&grant.host).map_err(unopenable)?;
        if !meta.is_dir() {
            return Err(PolicyError::NotADirectory(grant.host.clone()));
        }
        if !grant.guest.starts_with('/') {
            return Err(PolicyError::GuestPathRelative(grant.guest.clone()));
        }
        if capabilities.dirs[..i]
            .iter()
            .any(|g| g.guest == grant.guest)
        {
            return Err(PolicyError::GrantedTwice(grant.guest.clone()));
        }
        let handle = std::fs::File::open(&grant.host).map_err(unopenable)?;
        let own = PathBuf::from(format!("/proc/self/fd/{}", handle.as_raw_fd()));
        let path = if reopens(&own) {
            own
        } else {
            grant.host.clone()
        };
        dirs.push(OpenDir {
            _handle: Arc::new(handle),
            path,
            guest: grant.guest.clone(),
            perms: match grant.mode {
                DirMode::ReadOnly => FsPerms::ReadOnly,
                DirMode::ReadWrite => FsPerms::ReadWrite,
            },
        });
    }
    Ok(dirs)
}

/// Whether a directory can be opened through `path` (no `/proc` here).
fn reopens(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_dir())
}

impl PreparedTenant {
    /// The WASI context of one task. Sockets: TCP and UDP are off and no
    /// address passes the check (`WasiCtxBuilder`'s default, which refuses
    /// them all); name lookup is off. Directories are
    /// reopened from the handles held since the tenant was prepared; one
    /// removed since then is an empty directory to the guest.
    pub(crate) fn wasi_ctx(
        &self,
        stdout: GuestOutput,
        stderr: GuestOutput,
        born: Instant,
    ) -> Result<WasiCtx, PolicyError> {
        let mut builder = WasiCtxBuilder::new();
        builder
            .monotonic_clock(InstanceClock(born))
            .stdout(stdout)
            .stderr(stderr)
            .envs(&self.env)
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            // The host builds random bytes in full before the guest gets
            // them: a guest may not make it build more than this at once.
            .max_random_size(MAX_RANDOM_BYTES);
        // No `socket_addr_check`: the builder's own already refuses every
        // address, and setting one allocated a second check per task.
        for dir in self.dirs.iter() {
            builder
                .preopened_dir(&dir.path, &dir.guest, dir.perms)
                .map_err(|e| PolicyError::DirUnopenable {
                    path: dir.path.clone(),
                    source: std::io::Error::other(e.to_string()),
                })?;
        }
        Ok(builder.build())
    }
}

/// The guest's monotonic clock: time since its instance was made, so a
/// warm instance's clock goes on from one task to the next instead of
/// starting over (a deadline a guest kept would move back).
struct InstanceClock(Instant);

impl HostMonotonicClock for InstanceClock {
    fn resolution(&self) -> u64 {
        1
    }

    fn now(&self) -> u64 {
        u64::try_from(self.0.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::SandboxConfig;

    fn sandbox() -> Arc<Sandbox> {
        Sandbox::new(SandboxConfig {
            max_instances: 1,
            ..SandboxConfig::default()
        })
        .unwrap()
    }

    fn with(capabilities: Capabilities) -> Tenant {
        Tenant {
            name: "t".into(),
            capabilities,
            ..Tenant::default()
        }
    }

    #[test]
    fn preparing_names_the_bad_grant() {
        let sandbox = sandbox();
        let missing = with(Capabilities {
            dirs: vec!["/no/such/dir:/data".parse().unwrap()],
            ..Capabilities::default()
        });
        let err = sandbox.prepare(missing).unwrap_err();
        assert!(matches!(err, PolicyError::DirUnopenable { .. }), "{err}");
        assert!(err.to_string().contains("/no/such/dir"), "{err}");

        let dir = tempfile::tempdir().unwrap();
        let host = dir.path().display().to_string();
        let relative = with(Capabilities {
            dirs: vec![format!("{host}:data").parse().unwrap()],
            ..Capabilities::default()
        });
        let err = sandbox.prepare(relative).unwrap_err();
        assert!(err.to_string().contains("must be absolute"), "{err}");

        let twice = with(Capabilities {
            dirs: vec![
                format!("{host}:/d").parse().unwrap(),
                format!("{host}:/d:rw").parse().unwrap(),
            ],
            ..Capabilities::default()
        });
        let err = sandbox.prepare(twice).unwrap_err();
        assert!(err.to_string().contains("granted twice"), "{err}");

        let env = with(Capabilities {
            env: vec![("A=B".into(), "x".into())],
            ..Capabilities::default()
        });
        let err = sandbox.prepare(env).unwrap_err();
        assert!(err.to_string().contains("`A=B`"), "{err}");
    }

    #[test]
    fn a_granted_directory_is_the_one_opened_at_start_wherever_it_goes() {
        let root = tempfile::tempdir().unwrap();
        let granted = root.path().join("granted");
        std::fs::create_dir(&granted).unwrap();
        std::fs::write(granted.join("note"), "hi").unwrap();
        let tenant = with(Capabilities {
            dirs: vec![format!("{}:/data", granted.display()).parse().unwrap()],
            ..Capabilities::default()
        });
        let prepared = sandbox().prepare(tenant).unwrap();
        // Moved away, and another directory put in its place: the task
        // still sees the one that was granted.
        let moved = root.path().join("moved");
        std::fs::rename(&granted, &moved).unwrap();
        std::fs::create_dir(&granted).unwrap();
        let reopened = std::fs::read_dir(&prepared.dirs[0].path)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect::<Vec<_>>();
        assert_eq!(reopened, ["note"]);
        // Removed: still reopened (empty), not an error mid-task.
        std::fs::remove_file(moved.join("note")).unwrap();
        std::fs::remove_dir(&moved).unwrap();
        assert_eq!(
            std::fs::read_dir(&prepared.dirs[0].path).unwrap().count(),
            0
        );
    }
}
