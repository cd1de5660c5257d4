//! The host test harness: the same sandbox, limits, failure classification
//! and session loop as production (routing with aliases and named
//! arguments, type and host limits, `info()`, cancellation), with an
//! in-process engine. Activity authors (and corral's own tests) load a
//! component, run activities with JSON arguments, inject cancellation or
//! deadlines, and read back the outcome, heartbeats, log lines and output.
//!
//! ```no_run
//! use corral::sandbox::FailureClass;
//! use corral::testing::TestHost;
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
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use crate::connectors::local::{Canceller, LocalLoop, Submission};
use crate::metrics::Metrics;
use crate::sandbox::{
    ActivityType, DirGrant, DirMode, Failure, FailureClass, LoadError, LoadedComponent, LogLevel,
    Outcome, PreparedTenant, Sandbox, SandboxConfig, Stream, TaskInfo, TaskObserver, Tenant,
};
use crate::session::{Args, Permits, Registry, Session};

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
    pub fn http_host(mut self, host: &str) -> Self {
        let grant = host.parse().unwrap_or_else(|e| panic!("http_host: {e}"));
        let mut hosts = self.tenant.capabilities.http_hosts.to_vec();
        hosts.push(grant);
        self.tenant.capabilities.http_hosts = hosts.into();
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
        let sandbox = Sandbox::new(self.config)?;
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
        Call {
            component: self.clone(),
            activity_type: activity_type.to_owned(),
            args: Vec::new(),
            named: None,
            info: TaskInfo {
                tenant: self.tenant.clone(),
                activity_id: "test-activity".to_owned(),
                attempt: 1,
                ..TaskInfo::default()
            },
            deadline: None,
            cancel_after: None,
            cancel_at_heartbeat: None,
            cancel: CancellationToken::new(),
            started: None,
        }
    }
}

/// One activity call being set up; [`Call::run`] executes it.
pub struct Call {
    component: TestComponent,
    activity_type: String,
    args: Vec<Value>,
    named: Option<Map<String, Value>>,
    info: TaskInfo,
    deadline: Option<Duration>,
    cancel_after: Option<Duration>,
    cancel_at_heartbeat: Option<u32>,
    cancel: CancellationToken,
    started: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Call {
    /// Appends the JSON value of the next parameter.
    pub fn arg(mut self, value: Value) -> Self {
        self.args.push(value);
        self
    }

    /// Appends several parameters.
    pub fn args(mut self, values: impl IntoIterator<Item = Value>) -> Self {
        self.args.extend(values);
        self
    }

    /// All arguments at once, by parameter name (as Aion delivers them):
    /// a missing `option` parameter is `none`. Replaces positional ones.
    pub fn named(mut self, args: Map<String, Value>) -> Self {
        self.named = Some(args);
        self
    }

    /// The attempt number the guest sees (1 by default).
    pub fn attempt(mut self, attempt: u32) -> Self {
        self.info.attempt = attempt;
        self
    }

    /// The previous attempt's last heartbeat details.
    pub fn last_heartbeat(mut self, details: Value) -> Self {
        self.info.last_heartbeat = Some(details);
        self
    }

    /// The activity id the guest sees.
    pub fn activity_id(mut self, id: &str) -> Self {
        self.info.activity_id = id.to_owned();
        self
    }

    /// An engine deadline for this attempt (the tighter of it and the
    /// tenant's timeout applies).
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Cancels the task this long after it starts.
    pub fn cancel_after(mut self, delay: Duration) -> Self {
        self.cancel_after = Some(delay);
        self
    }

    /// Cancels the task when the guest sends its `n`-th heartbeat (1-based),
    /// before the heartbeat call returns to the guest.
    pub fn cancel_at_heartbeat(mut self, n: u32) -> Self {
        self.cancel_at_heartbeat = Some(n);
        self
    }

    /// Resolves once the guest's instance exists: the task holds its type
    /// and host slots and an instance of the pool. For ordering a test by
    /// that event instead of a sleep.
    pub fn started(&mut self) -> tokio::sync::oneshot::Receiver<()> {
        let (sender, receiver) = tokio::sync::oneshot::channel();
        self.started = Some(sender);
        receiver
    }

    /// A token that cancels the task when cancelled (from anywhere).
    pub fn cancel_token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Runs the call to its outcome.
    pub async fn run(self) -> TestRun {
        let running = self.component.served.running();
        let ticket = running.local().ticket();
        let recorder = Arc::new(Recorder {
            seen: Mutex::new(Seen::default()),
            cancel_at: self.cancel_at_heartbeat.map(|n| (n, ticket.clone())),
            started: Mutex::new(self.started),
        });
        let args = match self.named {
            Some(named) => Args::Named(named),
            None => Args::Positional(self.args),
        };
        let started = Instant::now();
        let submitted = running.local().submit_as(
            ticket,
            Submission {
                tenant: self.component.tenant.clone(),
                activity_type: self.activity_type,
                args,
                info: self.info,
                deadline: self.deadline,
                observer: Some(recorder.clone()),
            },
        );
        let outcome = match submitted {
            Ok(pending) => {
                let canceller = pending.canceller();
                let token = self.cancel.clone();
                let cancel_after = self.cancel_after;
                let watch = tokio::spawn(async move {
                    match cancel_after {
                        Some(delay) => {
                            tokio::select! {
                                () = token.cancelled() => {}
                                () = tokio::time::sleep(delay) => {}
                            }
                        }
                        None => token.cancelled().await,
                    }
                    canceller.cancel();
                });
                let outcome = pending.outcome().await;
                watch.abort();
                outcome
            }
            Err(stopped) => Err(Failure::new(
                FailureClass::Host,
                &crate::sandbox::RetryPolicy::default(),
                stopped.to_string(),
            )),
        };
        let finished = Instant::now();
        let elapsed = finished - started;
        let seen = std::mem::take(&mut *crate::sync::lock(&recorder.seen));
        TestRun {
            active: seen.instantiated.map(|at| (at, seen.last.unwrap_or(at))),
            finished,
            outcome,
            heartbeats: seen.heartbeats,
            logs: seen.logs,
            output: seen.output,
            dropped_output: seen.dropped,
            elapsed,
        }
    }
}

/// A guest log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    pub level: LogLevel,
    pub message: String,
}

/// What one call produced.
#[derive(Debug)]
pub struct TestRun {
    pub outcome: Outcome,
    /// Details of each heartbeat, in order.
    pub heartbeats: Vec<Option<Value>>,
    /// Lines logged through `corral:activity/context.log`.
    pub logs: Vec<LogLine>,
    /// Lines written to stdout and stderr (within the budget).
    pub output: Vec<(Stream, String)>,
    /// Bytes of output and logs dropped over the budget.
    pub dropped_output: u64,
    /// From the task's instance existing (the guest began to run) to the
    /// guest's last heartbeat, log line or output, if it got that far.
    pub active: Option<(Instant, Instant)>,
    /// When the outcome reached the caller.
    pub finished: Instant,
    pub elapsed: Duration,
}

impl TestRun {
    /// The result, if the call succeeded.
    pub fn result(&self) -> Option<&Value> {
        self.outcome.as_ref().ok()
    }

    /// The failure, if the call failed.
    pub fn failure(&self) -> Option<&Failure> {
        self.outcome.as_ref().err()
    }

    /// The result; panics with the failure if the call failed.
    #[track_caller]
    pub fn expect_ok(&self) -> &Value {
        match &self.outcome {
            Ok(value) => value,
            Err(failure) => panic!("expected success, got {failure}"),
        }
    }

    /// The failure; panics unless the call failed with `class`.
    #[track_caller]
    pub fn expect_failure(&self, class: FailureClass) -> &Failure {
        match &self.outcome {
            Err(failure) if failure.class == class => failure,
            Err(failure) => panic!("expected a {class} failure, got {failure}"),
            Ok(value) => panic!("expected a {class} failure, got success: {value}"),
        }
    }
}

#[derive(Default)]
struct Seen {
    heartbeats: Vec<Option<Value>>,
    logs: Vec<LogLine>,
    output: Vec<(Stream, String)>,
    dropped: u64,
    instantiated: Option<Instant>,
    /// The guest's latest heartbeat, log line or output.
    last: Option<Instant>,
}

struct Recorder {
    seen: Mutex<Seen>,
    cancel_at: Option<(u32, Canceller)>,
    started: Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
}

impl Recorder {
    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        let mut seen = crate::sync::lock(&self.seen);
        seen.last = Some(Instant::now());
        seen
    }
}

impl TaskObserver for Recorder {
    fn heartbeat(&self, count: u32, details: Option<&Value>) {
        self.seen().heartbeats.push(details.cloned());
        if let Some((n, canceller)) = &self.cancel_at
            && count >= *n
        {
            canceller.cancel();
        }
    }

    fn log(&self, level: LogLevel, message: &str) {
        self.seen().logs.push(LogLine {
            level,
            message: message.to_owned(),
        });
    }

    fn output(&self, stream: Stream, line: &str) {
        self.seen().output.push((stream, line.to_owned()));
    }

    fn output_dropped(&self, bytes: u64) {
        self.seen().dropped += bytes;
    }

    fn instantiated(&self, _took: Duration) {
        {
            let mut seen = self.seen();
            seen.instantiated = seen.last;
        }
        if let Some(started) = crate::sync::lock(&self.started).take() {
            let _ = started.send(());
        }
    }
}
