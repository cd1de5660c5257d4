//! The in-process engine: tasks this process submits itself (`corral run`,
//! the test harness, the admin API's `Run`) go through the same session loop
//! as an engine's, so they share its routing (aliases, named arguments),
//! admission (type and host limits), metrics, `info()`, cancellation and
//! shutdown.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::sandbox::{Failure, FailureClass, Outcome, RetryPolicy, TaskInfo, TaskObserver};
use crate::session::{
    Args, CancelReason, Connector, HeartbeatDetails, Inbound, Report, ReportError, Session,
    TaskKey, TaskStart,
};
use crate::sync::lock;

/// No engine waits to hear that a local task is alive: the pump's beat is
/// a no-op here, so it is kept rare.
const LIVENESS: Duration = Duration::from_secs(3600);

/// A task for [`Local::submit`].
pub struct Submission {
    pub tenant: String,
    /// A full WIT name or one of the tenant's aliases.
    pub activity_type: String,
    pub args: Args,
    /// What the guest's `info()` shows; the tenant is filled in, and an
    /// empty activity id becomes `local-<n>`.
    pub info: TaskInfo,
    /// The caller's deadline for this attempt (the tenant's timeout applies
    /// too).
    pub deadline: Option<Duration>,
    /// Sees the guest's heartbeats, logs and output as they happen.
    pub observer: Option<Arc<dyn TaskObserver>>,
}

/// [`Local::submit`] after the host began shutting down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the host is shutting down and takes no new tasks")]
pub struct Stopped;

/// The connector of tasks submitted in this process.
pub struct Local {
    session: Arc<Session>,
    /// `None` once the loop stopped polling: no new task is taken.
    queue: Mutex<Option<mpsc::UnboundedSender<Inbound>>>,
    inbound: tokio::sync::Mutex<mpsc::UnboundedReceiver<Inbound>>,
    waiting: Mutex<HashMap<TaskKey, oneshot::Sender<Report>>>,
    next_id: AtomicU64,
}

impl Local {
    /// A connector for `session`; serve it with [`Session::serve`] (or use
    /// [`LocalLoop`]).
    pub fn new(session: Arc<Session>) -> Arc<Self> {
        let (queue, inbound) = mpsc::unbounded_channel();
        Arc::new(Local {
            session,
            queue: Mutex::new(Some(queue)),
            inbound: tokio::sync::Mutex::new(inbound),
            waiting: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
        })
    }

    /// Hands a task to the session loop; the answer waits for its outcome.
    pub fn submit(self: &Arc<Self>, submission: Submission) -> Result<Pending, Stopped> {
        self.submit_as(self.ticket(), submission)
    }

    /// The canceller of a task not submitted yet, so that an observer can
    /// cancel it from the task's very first event: pass it to
    /// [`submit_as`](Local::submit_as).
    pub fn ticket(self: &Arc<Self>) -> Canceller {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        Canceller {
            id,
            // Engines' keys are their own bytes; a prefix keeps local ones
            // apart in the session's table of tasks in flight.
            key: format!("local:{id}").into_bytes(),
            local: self.clone(),
        }
    }

    /// [`submit`](Local::submit) under a [`ticket`](Local::ticket).
    pub fn submit_as(&self, ticket: Canceller, submission: Submission) -> Result<Pending, Stopped> {
        let key = ticket.key.clone();
        let Submission {
            tenant,
            activity_type,
            args,
            mut info,
            deadline,
            observer,
        } = submission;
        info.tenant = tenant.clone();
        if info.activity_id.is_empty() {
            info.activity_id = format!("local-{}", ticket.id);
        }
        let start = TaskStart {
            key: key.clone(),
            tenant,
            activity_type,
            args: Ok(args),
            info,
            deadline,
            heartbeat_every: LIVENESS,
            type_slot: None,
            observer,
        };
        let (report, outcome) = oneshot::channel();
        // The queue's lock orders this against `stop_polling`: a task is
        // either queued before the loop drains the queue, or refused.
        let queue = lock(&self.queue);
        let Some(queue) = queue.as_ref() else {
            return Err(Stopped);
        };
        lock(&self.waiting).insert(key.clone(), report);
        if queue.send(Inbound::Start(Box::new(start))).is_err() {
            lock(&self.waiting).remove(&key);
            return Err(Stopped);
        }
        Ok(Pending {
            canceller: ticket,
            outcome: Some(outcome),
        })
    }

    fn cancel(&self, key: &TaskKey, reason: CancelReason) {
        // At once when it runs (before this returns, so a guest sees it at
        // its next `is-cancelled`) …
        if self.session.cancel(key, reason) {
            return;
        }
        // … or in order behind its start when the loop has not taken it yet.
        if let Some(queue) = lock(&self.queue).as_ref() {
            let _ = queue.send(Inbound::Cancel {
                key: key.clone(),
                reason,
            });
        }
    }
}

#[async_trait]
impl Connector for Local {
    async fn next(&self) -> Option<Inbound> {
        // `None` once polling stopped and every queued task was taken.
        self.inbound.lock().await.recv().await
    }

    async fn report(&self, key: &TaskKey, report: Report) -> Result<(), ReportError> {
        match lock(&self.waiting).remove(key) {
            Some(waiting) => {
                // A caller that went away (the task was cancelled for it)
                // has nothing left to deliver to.
                let _ = waiting.send(report);
                Ok(())
            }
            None => Err(ReportError {
                retryable: false,
                message: "nobody waits for this task".to_owned(),
            }),
        }
    }

    fn heartbeat(&self, _key: &TaskKey, _details: Option<&HeartbeatDetails>) {}

    fn stop_polling(&self) {
        lock(&self.queue).take();
    }
}

/// A submitted task: await its [`outcome`](Pending::outcome). Dropped
/// before that, the task is cancelled (nobody is left to read its outcome).
pub struct Pending {
    canceller: Canceller,
    outcome: Option<oneshot::Receiver<Report>>,
}

impl Pending {
    /// Cancels the task when called (from anywhere, any time).
    pub fn canceller(&self) -> Canceller {
        self.canceller.clone()
    }

    /// Waits for the task's outcome.
    /// Dropped while it waits, the task is cancelled.
    pub async fn outcome(mut self) -> Outcome {
        let Some(outcome) = self.outcome.as_mut() else {
            return Err(lost());
        };
        let report = outcome.await;
        self.outcome = None;
        match report {
            Ok(Report::Completed(value)) => Ok(value),
            Ok(Report::Failed(failure) | Report::Cancelled(failure)) => Err(failure),
            Err(_) => Err(lost()),
        }
    }
}

/// The loop ended without reporting the task (its runner panicked).
fn lost() -> Failure {
    Failure::new(
        FailureClass::Host,
        &RetryPolicy::default(),
        "the task ended without an outcome",
    )
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.outcome.is_some() {
            self.canceller
                .local
                .cancel(&self.canceller.key, CancelReason::Gone);
        }
    }
}

/// Cancels one submitted task.
#[derive(Clone)]
pub struct Canceller {
    id: u64,
    key: TaskKey,
    local: Arc<Local>,
}

impl Canceller {
    /// Requests cancellation: the guest's `is-cancelled` is true when this
    /// returns if the task runs, or from its start if it has not started.
    pub fn cancel(&self) {
        self.local.cancel(&self.key, CancelReason::Requested);
    }
}

/// A session loop serving one [`Local`] connector, for a process with no
/// engine (`corral run`, the harness); stopped when dropped.
pub struct LocalLoop {
    local: Arc<Local>,
    shutdown: CancellationToken,
}

impl LocalLoop {
    /// Spawns the loop on the current Tokio runtime.
    pub fn start(session: Arc<Session>) -> Self {
        let local = Local::new(session.clone());
        let shutdown = CancellationToken::new();
        let connector: Arc<dyn Connector> = local.clone();
        let stop = shutdown.clone();
        tokio::spawn(async move { session.serve(connector, stop, Duration::ZERO).await });
        LocalLoop { local, shutdown }
    }

    /// The loop's connector.
    pub fn local(&self) -> &Arc<Local> {
        &self.local
    }
}

impl Drop for LocalLoop {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::metrics::Metrics;
    use crate::sandbox::{Sandbox, SandboxConfig};
    use crate::session::{Permits, Registry};

    fn local() -> Arc<Local> {
        let sandbox = Sandbox::new(SandboxConfig {
            max_instances: 2,
            ..SandboxConfig::default()
        })
        .unwrap();
        let session = Session::new(
            sandbox,
            Arc::new(Registry::default()),
            Arc::new(Metrics::default()),
            Permits::new(1, [("t".to_owned(), 1)]),
        );
        Local::new(session)
    }

    fn submission() -> Submission {
        Submission {
            tenant: "t".to_owned(),
            activity_type: "Greet".to_owned(),
            args: Args::Positional(vec![json!(1)]),
            info: TaskInfo {
                attempt: 1,
                ..TaskInfo::default()
            },
            deadline: None,
            observer: None,
        }
    }

    async fn started(local: &Local) -> TaskStart {
        match local.next().await {
            Some(Inbound::Start(start)) => *start,
            other => panic!("expected a start, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn the_guest_sees_the_tenant_and_an_activity_id_of_its_own() {
        let local = local();
        let _first = local.submit(submission()).unwrap();
        let _second = local.submit(submission()).unwrap();
        let (first, second) = (started(&local).await, started(&local).await);
        assert_eq!(first.info.tenant, "t");
        assert_eq!(first.args.ok(), Some(Args::Positional(vec![json!(1)])));
        assert_ne!(first.info.activity_id, second.info.activity_id);
        assert!(first.info.activity_id.starts_with("local-"));
        assert_ne!(first.key, second.key);
    }

    #[tokio::test]
    async fn the_report_reaches_its_caller() {
        let local = local();
        let pending = local.submit(submission()).unwrap();
        let start = started(&local).await;
        local
            .report(&start.key, Report::Completed(json!(42)))
            .await
            .unwrap();
        assert_eq!(pending.outcome().await.unwrap(), json!(42));
        let again = local.report(&start.key, Report::Completed(json!(42))).await;
        assert!(again.is_err_and(|e| !e.retryable), "reported twice");
    }

    #[tokio::test]
    async fn once_stopped_nothing_new_is_taken_and_what_was_queued_still_starts() {
        let local = local();
        let _queued = local.submit(submission()).unwrap();
        local.stop_polling();
        assert!(matches!(local.submit(submission()), Err(Stopped)));
        started(&local).await;
        assert!(local.next().await.is_none(), "the queue ends once drained");
    }

    #[tokio::test]
    async fn a_caller_that_goes_away_cancels_its_task() {
        let local = local();
        let pending = local.submit(submission()).unwrap();
        let start = started(&local).await;
        drop(pending);
        match local.next().await {
            Some(Inbound::Cancel { key, reason }) => {
                assert_eq!(key, start.key);
                assert_eq!(reason, CancelReason::Gone);
            }
            other => panic!("expected a cancel, got {other:?}"),
        }
    }
}
