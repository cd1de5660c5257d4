//! The session loop: the one place that owns admission, reporting,
//! liveness, cancellation and shutdown, written against the [`Connector`]
//! trait so pull engines (Temporal) and push engines (Aion) share it.

pub mod canary;
pub mod cpu;
mod liveness;
mod permits;
mod registry;
mod task;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use canary::{Counts, Routed, Side, Split};
pub use permits::{HostSlot, Permit, Permits, TenantSlots, TypeAdmission, TypeSlot, Usage};
pub use registry::{Deployment, Registry, Route, RouteError, TenantTable};

use crate::metrics::Metrics;
pub use crate::sandbox::HeartbeatDetails;
use crate::sandbox::{Failure, Sandbox, TaskInfo, TaskObserver};
use crate::sync::lock;

/// An engine's identifier of one task attempt (Temporal's task token).
pub type TaskKey = Vec<u8>;

/// How long a stopping session still waits, once its grace period is over
/// and what ran was interrupted, for its tasks to end and their reports to
/// be taken: an engine that never takes a report (one with no deadline, on
/// Aion) or a guest whose thread never runs again must not hold the host's
/// stop for ever. Past it the session returns and logs what it left: the
/// engine runs those attempts again after its own timeouts.
pub const FINAL_WAIT: Duration = Duration::from_secs(60);

/// Why an engine asked a task to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelReason {
    /// The workflow or a user asked for cancellation: report `Cancelled`.
    Requested,
    /// The engine already gave up on the attempt (timed out, not found).
    Gone,
    /// Paused, reset or the worker shutting down: report a (retryable)
    /// failure so the attempt is not recorded as cancelled.
    Interrupted,
}

/// A task as delivered by an engine.
pub struct TaskStart {
    pub key: TaskKey,
    pub tenant: String,
    /// As the engine named it (an alias or a full WIT name).
    pub activity_type: String,
    /// The decoded arguments, or why they could not be decoded.
    pub args: Result<Args, InputError>,
    pub info: TaskInfo,
    /// The engine's deadline for this attempt.
    pub deadline: Option<Duration>,
    /// How often the loop heartbeats the task on its own, so the engine
    /// hears from it well within its liveness window (the connector
    /// throttles what it forwards).
    pub heartbeat_every: Duration,
    /// The slot of the type's own limit, when the connector took it as it
    /// accepted the task (an engine that refuses rather than lets a task
    /// wait); otherwise the session waits for one.
    pub type_slot: Option<TypeSlot>,
    /// Someone in this process watching the guest's own heartbeats, logs
    /// and output as they happen (`corral run`, the test harness); engines
    /// hear only liveness, through [`Connector::heartbeat`].
    pub observer: Option<Arc<dyn TaskObserver>>,
}

/// Why a connector could not decode an engine's task input: its own error,
/// passed through unchanged. The task fails `InvalidInput` with its text.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct InputError(Box<dyn std::error::Error + Send + Sync>);

impl InputError {
    pub fn new(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        InputError(Box::new(error))
    }
}

impl std::fmt::Debug for TaskStart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskStart")
            .field("key", &self.key)
            .field("tenant", &self.tenant)
            .field("activity_type", &self.activity_type)
            .field("args", &self.args)
            .field("info", &self.info)
            .field("deadline", &self.deadline)
            .field("heartbeat_every", &self.heartbeat_every)
            .field("type_slot", &self.type_slot)
            .field("observer", &self.observer.is_some())
            .finish()
    }
}

/// A task's arguments, as its engine delivers them.
#[derive(Debug, Clone, PartialEq)]
pub enum Args {
    /// One value per WIT parameter, in order (Temporal: one payload each).
    Positional(Vec<Value>),
    /// One object keyed by parameter name (Aion's typed actions). A missing
    /// `option` parameter is `none`.
    Named(serde_json::Map<String, Value>),
}

/// What a connector delivers to the loop.
#[derive(Debug)]
pub enum Inbound {
    Start(Box<TaskStart>),
    Cancel { key: TaskKey, reason: CancelReason },
}

/// How a task ended, in the terms an engine reports.
#[derive(Debug, Clone, PartialEq)]
pub enum Report {
    Completed(Value),
    Failed(Failure),
    /// Only when cancellation was requested.
    Cancelled(Failure),
}

/// A report the transport did not deliver.
#[derive(Debug, Clone)]
pub struct ReportError {
    /// Whether trying again can help (a transport error) or not (the engine
    /// no longer knows the task).
    pub retryable: bool,
    pub message: String,
}

/// One engine connection for one tenant's queue.
#[async_trait]
pub trait Connector: Send + Sync + 'static {
    /// The next task or cancel. `None` once the connector has shut down and
    /// nothing more will come. The loop calls it again only once the
    /// previous call returned, and never drops a call midway, so a pull
    /// engine can poll its server right here.
    async fn next(&self) -> Option<Inbound>;

    /// Delivers an outcome. Transport failures come back as retryable
    /// errors; the loop retries until the report is accepted.
    async fn report(&self, key: &TaskKey, report: Report) -> Result<(), ReportError>;

    /// Liveness and progress: the connector forwards it (throttled as the
    /// engine needs). Called from the guest's thread: it must not block.
    fn heartbeat(&self, key: &TaskKey, details: Option<&HeartbeatDetails>);

    /// Stop asking for new work. `next` still delivers cancels, then `None`.
    fn stop_polling(&self);

    /// Called once the loop has reported everything.
    async fn finish(&self) {}
}

/// What one task in flight needs from the outside.
#[derive(Debug, Clone)]
struct InFlight {
    cancel: CancellationToken,
    reason: Arc<Mutex<Option<CancelReason>>>,
}

impl InFlight {
    /// Makes `is-cancelled` true at once; the first reason given is the one
    /// reported.
    fn cancel(&self, reason: CancelReason) {
        lock(&self.reason).get_or_insert(reason);
        self.cancel.cancel();
    }
}

/// Ends a runner's task: out of the in-flight table, no more heartbeats.
struct Done<'a> {
    session: &'a Session,
    progress: Arc<liveness::Progress>,
}

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.progress.end();
        self.session.in_flight().remove(self.progress.key());
    }
}

/// Shared by every task of a session.
pub struct Session {
    pub sandbox: Arc<Sandbox>,
    pub registry: Arc<Registry>,
    pub metrics: Arc<Metrics>,
    /// Host slots: a task executes only while it holds one.
    pub permits: Permits,
    /// The cores, shared between tenants while their tasks execute.
    pub cpu: Arc<cpu::CpuScheduler>,
    in_flight: Mutex<HashMap<TaskKey, InFlight>>,
}

impl Session {
    pub fn new(
        sandbox: Arc<Sandbox>,
        registry: Arc<Registry>,
        metrics: Arc<Metrics>,
        permits: Permits,
    ) -> Arc<Self> {
        Arc::new(Session {
            sandbox,
            registry,
            cpu: cpu::CpuScheduler::new(cpu::host_slots(), metrics.clone()),
            metrics,
            permits,
            in_flight: Mutex::new(HashMap::new()),
        })
    }

    fn in_flight(&self) -> std::sync::MutexGuard<'_, HashMap<TaskKey, InFlight>> {
        lock(&self.in_flight)
    }

    /// Tasks running now.
    pub fn in_flight_count(&self) -> usize {
        self.in_flight().len()
    }

    /// Runs one connector until `shutdown` fires and everything accepted is
    /// reported: stop polling, let in-flight tasks finish within `grace`,
    /// cancel the rest, report everything, return. Returns how many tasks
    /// it left running or unreported, [`FINAL_WAIT`] after the grace period
    /// (none, unless an engine or a guest never let them end).
    pub async fn serve(
        self: &Arc<Self>,
        connector: Arc<dyn Connector>,
        shutdown: CancellationToken,
        grace: Duration,
    ) -> usize {
        // Runners are not joined one by one: each ends its own liveness and
        // in-flight entry, so the loop wakes for arrivals, not completions.
        let tasks = TaskTracker::new();
        let mut pump = liveness::Pump::default();
        let stopping = shutdown.cancelled();
        tokio::pin!(stopping);
        let mut polling = true;
        let mut grace_over: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> =
            Box::pin(std::future::pending());
        // Armed when the grace period is over.
        let mut given_up: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> =
            Box::pin(std::future::pending());
        // One `next` at a time, never dropped mid-call: a pull engine may
        // be in the middle of taking a task from its server.
        let mut next = connector.next();
        loop {
            tokio::select! {
                biased;
                () = &mut stopping, if polling => {
                    polling = false;
                    connector.stop_polling();
                    tracing::info!("stopping: no new work; in-flight tasks have {grace:?} to finish");
                    grace_over = Box::pin(tokio::time::sleep(grace));
                }
                () = &mut grace_over => {
                    self.end_grace();
                    grace_over = Box::pin(std::future::pending());
                    given_up = Box::pin(tokio::time::sleep(FINAL_WAIT));
                }
                () = pump.due() => self.beat(&mut pump, &tasks),
                inbound = &mut next => {
                    let Some(inbound) = inbound else { break };
                    next = connector.next();
                    match inbound {
                        Inbound::Start(start) => self.start(&tasks, &mut pump, &connector, *start),
                        Inbound::Cancel { key, reason } => {
                            self.cancel(&key, reason);
                        }
                    }
                }
            }
        }
        drop(next);
        // The connector is closed: finish (and report) what is running, still
        // within the grace period if shutting down.
        tasks.close();
        let mut left = 0;
        let finished = tasks.wait();
        tokio::pin!(finished);
        loop {
            tokio::select! {
                () = &mut finished => break,
                () = pump.due() => self.beat(&mut pump, &tasks),
                () = &mut grace_over => {
                    self.end_grace();
                    grace_over = Box::pin(std::future::pending());
                    given_up = Box::pin(tokio::time::sleep(FINAL_WAIT));
                }
                () = &mut given_up => {
                    left = tasks.len();
                    tracing::error!(
                        "{left} task(s) still running or reporting {FINAL_WAIT:?} after the grace period: stopping without them (the engine runs them again after its timeouts)"
                    );
                    break;
                }
            }
        }
        connector.finish().await;
        left
    }

    /// Outcomes are reported by each task's own runner the moment they
    /// exist: the loop never holds a finished result while it waits for
    /// the next task.
    fn start(
        self: &Arc<Self>,
        tasks: &TaskTracker,
        pump: &mut liveness::Pump,
        connector: &Arc<dyn Connector>,
        mut start: TaskStart,
    ) {
        let entry = InFlight {
            cancel: CancellationToken::new(),
            reason: Arc::new(Mutex::new(None)),
        };
        self.in_flight().insert(start.key.clone(), entry.clone());
        let progress = Arc::new(liveness::Progress::new(
            start.key.clone(),
            connector.clone(),
            self.metrics.clone(),
            &start.tenant,
            start.info.last_heartbeat.clone(),
            start.observer.take(),
        ));
        pump.add(start.heartbeat_every, progress.clone());
        let session = self.clone();
        let connector = connector.clone();
        tasks.spawn(async move {
            // Even a runner that panics (a broken invariant) leaves the
            // in-flight table and stops being heartbeated.
            let _done = Done {
                session: &session,
                progress: progress.clone(),
            };
            task::run(&session, connector.as_ref(), start, entry, progress).await;
        });
    }

    /// Heartbeats what is due, and reports the tasks whose guests ran
    /// past their time limit and the backstop's margin: the guest's own
    /// deadline is kept on the guests' threads, below the host's priority,
    /// or not at all by a guest stuck in a host call. Its slots stay held
    /// until it does end; its late outcome is not reported again.
    fn beat(&self, pump: &mut liveness::Pump, tasks: &TaskTracker) {
        for (progress, limit) in pump.beat() {
            if !progress.take_report() {
                continue;
            }
            progress.end();
            if let Some(entry) = self.in_flight().get(progress.key()).cloned() {
                entry.cancel(CancelReason::Gone);
            }
            let policy = self
                .registry
                .tenant(progress.tenant())
                .map(|t| t.retry.clone())
                .unwrap_or_default();
            let failure = Failure::new(
                crate::sandbox::FailureClass::Timeout,
                &policy,
                format!(
                    "the task ran past its time limit of {limit:?} and its guest had not stopped {:?} later (its thread was not scheduled, or it is stuck in a host call): the host reported the timeout; the guest is stopped when it next runs",
                    liveness::BACKSTOP
                ),
            );
            tracing::warn!(tenant = %progress.tenant(), "{}", failure.message);
            tasks.spawn(async move {
                let give_up = std::time::Instant::now() + task::REPORT_PATIENCE;
                task::deliver(
                    progress.connector().as_ref(),
                    progress.key(),
                    Report::Failed(failure),
                    Some(give_up),
                )
                .await;
            });
        }
    }

    /// Cancels a task in flight at once (`is-cancelled` is true when this
    /// returns); false, doing nothing, when no task with `key` runs.
    pub fn cancel(&self, key: &TaskKey, reason: CancelReason) -> bool {
        let entry = self.in_flight().get(key).cloned();
        match entry {
            Some(entry) => {
                entry.cancel(reason);
                true
            }
            None => {
                tracing::debug!("cancel for a task that is not running here");
                false
            }
        }
    }

    /// The shutdown grace period is over: whatever still runs is cancelled
    /// (and interrupted after its own cancel grace), then reported.
    fn end_grace(&self) {
        let cancelled = self.cancel_all(CancelReason::Interrupted);
        if cancelled > 0 {
            tracing::warn!("grace period over: cancelling {cancelled} task(s)");
        }
    }

    fn cancel_all(&self, reason: CancelReason) -> usize {
        let entries: Vec<InFlight> = self.in_flight().values().cloned().collect();
        for entry in &entries {
            entry.cancel(reason);
        }
        entries.len()
    }
}

#[cfg(test)]
mod tests;
