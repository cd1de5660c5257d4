//! The host test harness: the same sandbox, limits, failure classification
//! and session loop as production (routing with aliases and named
//! arguments, type and host limits, `info()`, cancellation), with an
//! in-process engine. Activity authors (and corral's own tests) load a
//! component, run activities with JSON arguments, inject cancellation or
//! deadlines, and read back the outcome, heartbeats, log lines and output.
//!
//! ```no_run
//! use corral_core::sandbox::FailureClass;
//! use corral_core::testing::TestHost;
//! use serde_json::json;
//! use std::time::Duration;
//!
//! # async fn example() -> anyhow::Result<()> {
//! let host = TestHost::builder()
//!     .memory(64 << 20)
//!     .timeout(Duration::from_secs(5))
//!     .build()?;
//! let greeter = host.load_file("examples/dist/greeter.wasm")?;
//! for activity in greeter.activity_types() {
//!     println!("{}: {}", activity.name, activity.signature());
//! }
//!
//! let run = greeter
//!     .call("demo:greeter/api.greet")
//!     .arg(json!({ "name": "Ada", "language": "english" }))
//!     .arg(json!("casual"))
//!     .run()
//!     .await;
//! assert_eq!(run.expect_ok()["message"], "Hi, Ada!");
//!
//! // Cancel a long activity at its third heartbeat: the guest sees the
//! // cancel when that heartbeat returns, and stops there.
//! let progress = host.load_file("examples/dist/progress.wasm")?;
//! let run = progress
//!     .call("demo:progress/api.count-to")
//!     .args([json!(100), json!(10)])
//!     .cancel_at_heartbeat(3)
//!     .run()
//!     .await;
//! run.expect_failure(FailureClass::Cancelled);
//! assert_eq!(run.heartbeats.len(), 3);
//! # Ok(())
//! # }
//! ```

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

mod call;

pub use call::{Call, LogLine, TestRun};

use crate::local::LocalLoop;
use crate::metrics::Metrics;
use crate::sandbox::{
    ActivityType, DirGrant, DirMode, FailureClass, HttpGrant, LoadError, LoadedComponent,
    PreparedTenant, Sandbox, SandboxConfig, Secrets, Tenant,
};
use crate::session::{Permits, Registry, Session};

/// Builds a [`TestHost`]. Defaults are the production defaults of
/// [`Limits`](crate::sandbox::Limits) and [`SandboxConfig`] with a small
/// instance pool, no compile cache and tenant `test`.
pub struct TestHostBuilder {
    config: SandboxConfig,
    tenant: Tenant,
    aliases: Vec<(String, String)>,
    type_limits: Vec<(String, usize)>,
    max_concurrent: Option<usize>,
}

impl TestHostBuilder {
    /// Linear memory per instance, in bytes.
    pub fn memory(mut self, bytes: u64) -> Self {
        self.tenant.limits.memory = bytes;
        self
    }

    /// Wall-clock deadline per attempt.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.tenant.limits.timeout = Some(timeout);
        self
    }

    /// No host deadline at all.
    pub fn no_timeout(mut self) -> Self {
        self.tenant.limits.timeout = None;
        self
    }

    /// Runs tasks in warm instances (see [`Reuse`](crate::sandbox::Reuse)).
    pub fn reuse(mut self, reuse: crate::sandbox::Reuse) -> Self {
        self.tenant.reuse = Some(reuse);
        self
    }

    /// CPU budget per attempt, in fuel units.
    pub fn fuel(mut self, fuel: u64) -> Self {
        self.tenant.limits.fuel = Some(fuel);
        self
    }

    /// Grants a host directory at `guest` (an absolute guest path).
    pub fn dir(mut self, host: impl Into<PathBuf>, guest: &str, mode: DirMode) -> Self {
        self.tenant.capabilities.dirs.push(DirGrant {
            host: host.into(),
            guest: guest.to_owned(),
            mode,
        });
        self
    }

    /// Adds an environment variable to the guest's (otherwise empty)
    /// environment.
    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.tenant
            .capabilities
            .env
            .push((name.to_owned(), value.to_owned()));
        self
    }

    /// Lets the guest send HTTP requests (`wasi:http`) to `host`
    /// (`api.example.com`, `127.0.0.1:8080`, `*.example.com`).
    ///
    /// # Panics
    /// When `host` is not a valid grant.
    pub fn http_host(self, host: &str) -> Self {
        let grant = host.parse().unwrap_or_else(|e| panic!("http_host: {e}"));
        self.http_grant(grant)
    }

    /// Lets the guest send the HTTP requests `grant` allows (methods, paths
    /// and non-public addresses as well as a destination).
    pub fn http_grant(mut self, grant: HttpGrant) -> Self {
        let mut hosts = self.tenant.capabilities.http_hosts.to_vec();
        hosts.push(grant);
        self.tenant.capabilities.http_hosts = hosts.into();
        self
    }

    /// Sets a `wasi:config` key the guest reads.
    pub fn config(mut self, key: &str, value: &str) -> Self {
        Arc::make_mut(&mut self.tenant.capabilities.config)
            .insert(key.to_owned(), value.to_owned());
        self
    }

    /// The tenant's secrets, loaded (see [`Secrets::load`]).
    pub fn secrets(mut self, secrets: Arc<Secrets>) -> Self {
        self.tenant.capabilities.secrets = secrets;
        self
    }

    /// Largest total JSON input, in bytes.
    pub fn max_input(mut self, bytes: usize) -> Self {
        self.tenant.limits.max_input = bytes;
        self
    }

    /// Largest JSON result (and heartbeat details), in bytes.
    pub fn max_output(mut self, bytes: usize) -> Self {
        self.tenant.limits.max_output = bytes;
        self
    }

    /// Outbound HTTP requests one task may send.
    pub fn max_http_requests(mut self, requests: u32) -> Self {
        self.tenant.limits.max_http_requests = requests;
        self
    }

    /// Bytes of outbound HTTP bodies one task may send and receive.
    pub fn max_http_bytes(mut self, bytes: u64) -> Self {
        self.tenant.limits.max_http_bytes = bytes;
        self
    }

    /// Guest stdout + stderr + log bytes kept per task (each line costing
    /// 64 more).
    pub fn max_stdio(mut self, bytes: usize) -> Self {
        self.tenant.limits.max_stdio = bytes;
        self
    }

    /// How long a cancelled guest may take to stop before it is interrupted.
    pub fn cancel_grace(mut self, grace: Duration) -> Self {
        self.tenant.limits.cancel_grace = grace;
        self
    }

    /// The whole tenant: its name, limits, capabilities and retry policy
    /// (as `corral serve` reads them from a configuration).
    pub fn policy(mut self, tenant: Tenant) -> Self {
        self.tenant = tenant;
        self
    }

    /// The tenant name the guest sees in `info()`.
    pub fn tenant(mut self, name: &str) -> Self {
        self.tenant.name = name.to_owned();
        self
    }

    /// Overrides the retryable default of a failure class.
    pub fn retry(mut self, class: FailureClass, retryable: bool) -> Self {
        self.tenant.retry.set(class, retryable);
        self
    }

    /// Instances alive at once (the pool size).
    pub fn max_instances(mut self, instances: u32) -> Self {
        self.config.max_instances = instances;
        self
    }

    /// Serves `target` (a full WIT name) under `alias` too, as a tenant's
    /// `aliases` do, in each loaded component that exports `target` (and
    /// no activity type named `alias`).
    pub fn alias(mut self, alias: &str, target: &str) -> Self {
        self.aliases.push((alias.to_owned(), target.to_owned()));
        self
    }

    /// Runs at most `limit` tasks of `activity_type` (an alias or a full
    /// name) at once; the others wait, as a tenant's `[tenants.types]` do.
    pub fn type_limit(mut self, activity_type: &str, limit: usize) -> Self {
        self.type_limits
            .push((activity_type.to_owned(), limit.max(1)));
        self
    }

    /// Runs at most `limit` tasks at once (host slots; by default the pool
    /// size).
    pub fn max_concurrent(mut self, limit: usize) -> Self {
        self.max_concurrent = Some(limit.max(1));
        self
    }

    /// Caches compiled components in `dir`.
    pub fn cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.config.cache_dir = Some(dir.into());
        self
    }

    /// Builds the host, validating the tenant's policy.
    pub fn build(self) -> anyhow::Result<TestHost> {
        let max_concurrent = self
            .max_concurrent
            .unwrap_or(self.config.max_instances as usize);
        let mut config = self.config;
        if self.tenant.reuse.is_none() {
            // No slots beyond `max_instances` for warm instances nobody keeps.
            config.max_warm = 0;
        }
        let sandbox = Sandbox::new(config)?;
        let tenant = sandbox.prepare(self.tenant)?;
        Ok(TestHost {
            sandbox,
            tenant,
            aliases: self.aliases,
            type_limits: self.type_limits,
            max_concurrent,
        })
    }
}

/// A sandbox and one tenant, for tests.
pub struct TestHost {
    sandbox: Arc<Sandbox>,
    tenant: PreparedTenant,
    aliases: Vec<(String, String)>,
    type_limits: Vec<(String, usize)>,
    max_concurrent: usize,
}

impl TestHost {
    pub fn builder() -> TestHostBuilder {
        TestHostBuilder {
            config: SandboxConfig {
                max_instances: 128,
                ..SandboxConfig::default()
            },
            tenant: Tenant {
                name: "test".to_owned(),
                ..Tenant::default()
            },
            aliases: Vec::new(),
            type_limits: Vec::new(),
            max_concurrent: None,
        }
    }

    /// Loads a component file.
    pub fn load_file(&self, path: impl AsRef<Path>) -> Result<TestComponent, LoadError> {
        let component = self.sandbox.load_file(path.as_ref())?;
        self.wrap(component)
    }

    /// Loads a component from bytes.
    pub fn load_bytes(&self, bytes: &[u8]) -> Result<TestComponent, LoadError> {
        let component = self.sandbox.load(bytes)?;
        self.wrap(component)
    }

    /// Each component is served by a session of its own, as the tenant's
    /// only component.
    fn wrap(&self, component: Arc<LoadedComponent>) -> Result<TestComponent, LoadError> {
        // An alias applies where its target is exported, and never hides
        // an activity type of the same name: so routing cannot fail.
        let exported = |name: &String| component.activity(name).is_some();
        let aliases: Vec<(String, String)> = self
            .aliases
            .iter()
            .filter(|(alias, target)| exported(target) && !exported(alias))
            .cloned()
            .collect();
        let registry = Arc::new(Registry::default());
        let table = Registry::prepare(
            self.tenant.clone(),
            std::slice::from_ref(&component),
            &aliases,
        )
        .map_err(|e| LoadError::Invalid(e.to_string()))?;
        registry.install(table);
        let name = self.tenant.name.clone();
        let permits = Permits::new(self.max_concurrent, [(name.clone(), self.max_concurrent)])
            .with_type_limits(&name, self.type_limits.clone());
        let session = Session::new(
            self.sandbox.clone(),
            registry,
            Arc::new(Metrics::default()),
            permits,
        );
        Ok(TestComponent {
            served: Arc::new(Served {
                session,
                running: OnceLock::new(),
            }),
            tenant: name,
            component,
        })
    }

    /// The underlying sandbox.
    pub fn sandbox(&self) -> &Arc<Sandbox> {
        &self.sandbox
    }
}

/// A loaded component, cheap to clone (e.g. into spawned tasks).
#[derive(Clone)]
pub struct TestComponent {
    served: Arc<Served>,
    tenant: String,
    component: Arc<LoadedComponent>,
}

/// A component's session; its loop starts at the first call (inside the
/// caller's runtime) and stops when the last clone is dropped.
struct Served {
    session: Arc<Session>,
    running: OnceLock<LocalLoop>,
}

impl Served {
    fn running(&self) -> &LocalLoop {
        self.running
            .get_or_init(|| LocalLoop::start(self.session.clone()))
    }
}

impl TestComponent {
    /// The component's activity types.
    pub fn activity_types(&self) -> &[ActivityType] {
        &self.component.activities
    }

    /// The loaded component (digest, imports, unsupported exports, cache
    /// status).
    pub fn loaded(&self) -> &LoadedComponent {
        &self.component
    }

    /// Starts describing a call of `activity_type`.
    pub fn call(&self, activity_type: &str) -> Call {
        Call::new(self.clone(), activity_type)
    }
}
