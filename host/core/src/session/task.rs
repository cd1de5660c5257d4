//! One task from delivery to acknowledged report: route, execute (the
//! session's liveness pump heartbeats it meanwhile), map the outcome to what
//! the engine expects, and deliver the report until the engine accepts it.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use serde_json::Value;
use tracing::Instrument;

use super::liveness::Progress;
use super::{
    Args, CancelReason, Connector, InFlight, InputError, Report, ReportError, Session, TaskKey,
    TaskStart,
};
use crate::backoff::Backoff;
use crate::metrics::COMPLETED;
use crate::sandbox::shadow::{Attempt, Ending, MAX_ATTEMPT_BYTES, Sampler, Tape};
use crate::sandbox::{
    Failure, FailureClass, Outcome, RetryPolicy, Task, convert, listed_names, shown_name,
};
use crate::shown::{MAX_NAME, Shown};
use crate::sync::lock;
use crate::trace::PHASES;

/// The longest wait between two report attempts.
const MAX_REPORT_BACKOFF: Duration = Duration::from_secs(10);
/// How long past a task's deadline a report is still worth retrying: the
/// engine may still accept it while its own timeout has not fired.
pub(super) const REPORT_PATIENCE: Duration = Duration::from_secs(60);

pub(super) async fn run(
    session: &Session,
    connector: &dyn Connector,
    start: TaskStart,
    entry: InFlight,
    progress: Arc<Progress>,
) {
    let span = tracing::info_span!(
        "task",
        tenant = %start.tenant,
        // Chosen by whoever started the activity: escaped and bounded.
        activity_type = %Shown(&start.activity_type, MAX_NAME),
        activity_id = %Shown(&start.info.activity_id, MAX_NAME),
        attempt = start.info.attempt,
        outcome = tracing::field::Empty,
    );
    if let Some(parent) = &start.info.traceparent {
        crate::trace::adopt(&span, parent);
    }
    // What reporting needs stays; the rest moves into the task.
    let (key, deadline, tenant) = (start.key.clone(), start.deadline, start.tenant.clone());
    async {
        let started = Instant::now();
        session.metrics.task_started(&tenant);
        let (outcome, activity) = caught(execute(session, start, &entry, &progress)).await;
        // The outcome exists: no more heartbeats while it is reported.
        progress.end();
        if !progress.take_report() {
            // The host's backstop reported it timed out: its guest has
            // stopped now, and its slots are given back.
            tracing::info!(elapsed = ?started.elapsed(), "its guest stopped after the host reported its timeout");
            session.metrics.task_finished(
                &tenant,
                &activity,
                FailureClass::Timeout.as_str(),
                started.elapsed(),
            );
            return;
        }
        let reason = *lock(&entry.reason);
        let report = to_report(outcome, reason);
        let label = match &report {
            Report::Completed(_) => {
                tracing::info!(elapsed = ?started.elapsed(), "completed");
                COMPLETED
            }
            Report::Failed(f) | Report::Cancelled(f) => {
                // The guest chose the kind and message (its own failure
                // record, or its panic text): escaped and bounded here.
                tracing::info!(
                    elapsed = ?started.elapsed(),
                    class = %f.class,
                    kind = %Shown(&f.kind, MAX_NAME),
                    "failed: {}",
                    Shown(&f.message, MAX_LOGGED_MESSAGE)
                );
                f.class.as_str()
            }
        };
        tracing::Span::current().record("outcome", label);
        session
            .metrics
            .task_finished(&tenant, &activity, label, started.elapsed());
        let give_up = deadline.map(|d| started + d + REPORT_PATIENCE);
        deliver(connector, &key, report, give_up).await;
    }
    .instrument(span)
    .await
}

/// Most of a failure's or an engine's message the log keeps: the engine
/// has the whole failure.
const MAX_LOGGED_MESSAGE: usize = 2048;

/// `executing`, with a panic in it (a bug of the host's, never a guest's
/// doing) ending the task as a `Host` failure that is reported like any
/// other, not the runner: the engine hears of the task, and its slots and
/// permits are given back as it unwinds.
async fn caught(executing: impl Future<Output = (Outcome, Arc<str>)>) -> (Outcome, Arc<str>) {
    match unwinding(executing).await {
        Ok(done) => done,
        Err(Panicked(said)) => {
            tracing::error!("a task's run panicked (a bug): {}", Shown(&said, 300));
            let failure = Failure::new(
                FailureClass::Host,
                &RetryPolicy::default(),
                format!("the host failed running the task: {}", Shown(&said, 300)),
            );
            (Err(failure), Arc::from("<panicked>"))
        }
    }
}

/// What a panic said (a bug of the host's).
struct Panicked(String);

/// `future`'s output, or what it said when it panicked.
async fn unwinding<F: Future>(future: F) -> Result<F::Output, Panicked> {
    let mut future = std::pin::pin!(future);
    std::future::poll_fn(|cx| {
        match std::panic::catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(Poll::Ready(done)) => Poll::Ready(Ok(done)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(panic) => Poll::Ready(Err(Panicked(
                panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default(),
            ))),
        }
    })
    .await
}

/// Routes and runs the task; returns its outcome and the activity type's
/// full name (one label for every unknown name, so that engines, which can
/// send any name, keep the metrics' cardinality bounded).
async fn execute(
    session: &Session,
    start: TaskStart,
    entry: &InFlight,
    progress: &Arc<Progress>,
) -> (Outcome, Arc<str>) {
    // The engine's deadline counts from here, whatever the task then waits
    // for: one that passes before it has its slots ends it unrun.
    let arrived = Instant::now();
    let TaskStart {
        tenant,
        activity_type,
        args,
        info,
        deadline,
        type_slot,
        ..
    } = start;
    let default_policy = RetryPolicy::default();
    let policy = session.registry.tenant(&tenant);
    let policy = policy.as_ref().map_or(&default_policy, |t| &t.retry);
    let Some(route) = session.registry.route(&tenant, &activity_type) else {
        // Both the asked-for name and the served ones may be chosen by
        // someone else (an engine's caller, a tenant's guest): bounded.
        let served = session.registry.activity_types(&tenant);
        let unknown = Err(Failure::new(
            FailureClass::UnknownActivity,
            policy,
            format!(
                "tenant `{tenant}` serves no activity type `{}` (it serves: {})",
                shown_name(&activity_type),
                listed_names(served.iter().map(String::as_str)),
            ),
        ));
        return (unknown, Arc::from("<unknown>"));
    };
    let args = match args
        .map_err(BadInput::from)
        .and_then(|args| arguments(args, &route))
    {
        Ok(args) => args,
        Err(e) => {
            let invalid = Err(Failure::new(
                FailureClass::InvalidInput,
                policy,
                e.to_string(),
            ));
            // A candidate that refuses what the active version took counts.
            route.record(&invalid);
            return (invalid, route.activity);
        }
    };
    let recording = Recording::of(&route, &args);
    let task = Task {
        activity_type: route.activity.to_string(),
        args,
        info,
        deadline,
        cancel: entry.cancel.clone(),
        observer: progress.clone(),
        tape: recording.as_ref().map(|r| r.tape.clone()),
    };
    // The type slot (for a type with its own limit), then the host slot
    // are taken here, in arrival order, and held while the guest runs; the
    // session's liveness pump keeps the task alive with the engine while it
    // waits.
    // A cancel, or the engine's deadline, that comes while it waits ends it
    // there: it never runs (run, it would have had a full deadline and a
    // cancel's grace from its start, and held a slot others wait for).
    let waiting = tracing::debug_span!(target: PHASES, "permits");
    let slots = async {
        let type_slot = match type_slot {
            Some(taken) => Some(taken),
            None => {
                let names = session
                    .permits
                    .type_names(&session.registry, &tenant, &activity_type);
                session.permits.type_slot(&tenant, &names).await
            }
        };
        (type_slot, session.permits.host_slot().await)
    }
    .instrument(waiting);
    let expiry = async {
        match deadline {
            Some(d) => tokio::time::sleep_until((arrived + d).into()).await,
            None => std::future::pending().await,
        }
    };
    // Retryable whatever the tenant's policy says of its class: it never
    // ran, so another attempt may well succeed.
    let never_ran = |class, message: String| {
        let mut failure = Failure::new(class, policy, message);
        failure.retryable = true;
        (Err(failure), route.activity.clone())
    };
    let (_type, _slot) = tokio::select! {
        biased;
        () = entry.cancel.cancelled() => {
            return never_ran(
                FailureClass::Cancelled,
                "cancelled while it waited for a slot: it never ran".to_owned(),
            );
        }
        () = expiry => {
            return never_ran(
                FailureClass::Timeout,
                format!(
                    "the engine's deadline of {:?} passed while it waited for a slot: it never ran",
                    deadline.unwrap_or_default()
                ),
            );
        }
        slots = slots => slots,
    };
    // (Run, it has the engine's whole deadline from its start, as before:
    // the engine's own timeout, which counts from its arrival, reaches it
    // as a cancel.) Only while it holds one of the host's cores, on a guest thread from
    // its first wait: see `cpu`.
    let (sandbox, component, prepared) = (
        session.sandbox.clone(),
        route.component.clone(),
        route.tenant.clone(),
    );
    // The host's backstop, should the guest not end by its time limit
    // (see `liveness`).
    progress.guest_starts(match (deadline, route.tenant.limits.timeout) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    });
    let (outcome, _) = session
        .cpu
        .execute(
            route.tenant.label.clone(),
            route.cpu_of(&session.metrics),
            route.tenant.cpu,
            move || async move { sandbox.execute(&component, &prepared, task).await },
        )
        .await;
    route.record(&outcome);
    if let Some(recording) = recording {
        recording.offer(&route, &outcome);
    }
    (outcome, route.activity)
}

/// A task of a type its tenant records for shadow replay: its arguments
/// and its tape, until it has ended.
struct Recording {
    sampler: Arc<dyn Sampler>,
    args: Vec<Value>,
    tape: Arc<Tape>,
}

impl Recording {
    /// Recorded when its tenant records its type, it runs on the active
    /// version (a canary's candidate is not what replay compares against),
    /// and its arguments hold no secret and fit one attempt's bound.
    fn of(route: &super::Route, args: &[Value]) -> Option<Recording> {
        let sampler = route.tenant.shadow.as_ref()?.0.clone();
        let candidate = matches!(route.side, Some((_, super::Side::Candidate)));
        if candidate || !sampler.records(&route.activity) {
            return None;
        }
        let text = serde_json::to_string(args).ok()?;
        let secrets = &route.tenant.capabilities.secrets;
        if text.len() > MAX_ATTEMPT_BYTES || secrets.redact(&text) != text {
            // Too big to keep, or it holds a secret's value.
            return None;
        }
        Some(Recording {
            sampler,
            args: args.to_vec(),
            tape: Tape::record(text.len()),
        })
    }

    fn offer(self, route: &super::Route, outcome: &Outcome) {
        // A cancel or the host's own fault says nothing of the version.
        if let Err(f) = outcome
            && matches!(f.class, FailureClass::Cancelled | FailureClass::Host)
        {
            return;
        }
        let secrets = &route.tenant.capabilities.secrets;
        let Some(exchanges) = self.tape.recorded(secrets) else {
            return;
        };
        let at_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        self.sampler.offer(Attempt {
            activity_type: route.activity.to_string(),
            version: route.component.digest.clone(),
            args: self.args,
            ending: Ending::of(outcome),
            exchanges,
            fuel: self.tape.fuel(),
            at_ms,
        });
    }
}

/// Why a task's input is not arguments for its activity.
#[derive(Debug, thiserror::Error)]
enum BadInput {
    #[error(transparent)]
    Decode(#[from] InputError),
    #[error(transparent)]
    Named(#[from] convert::ArgsError),
    #[error("`{0}` is not exported by its component")]
    NotExported(String),
}

/// One JSON value per WIT parameter, in order.
fn arguments(args: Args, route: &super::Route) -> Result<Vec<Value>, BadInput> {
    match args {
        Args::Positional(values) => Ok(values),
        Args::Named(named) => match route.component.activity(&route.activity) {
            Some(activity) => Ok(convert::positional(&activity.params, named)?),
            // The route was built from this component's own activity types.
            None => Err(BadInput::NotExported(route.activity.to_string())),
        },
    }
}

/// A cancel is reported as cancelled only when one was requested; a task
/// interrupted by pause, reset or shutdown fails retryable, so the engine
/// runs it again.
fn to_report(outcome: Outcome, reason: Option<CancelReason>) -> Report {
    match (outcome, reason) {
        (Ok(value), _) => Report::Completed(value),
        (Err(f), Some(CancelReason::Requested)) if f.class == FailureClass::Cancelled => {
            Report::Cancelled(f)
        }
        (Err(mut f), Some(CancelReason::Interrupted)) if f.class == FailureClass::Cancelled => {
            f.retryable = true;
            f.message = format!(
                "interrupted by the worker (shutdown, pause or reset): {}",
                f.message
            );
            Report::Failed(f)
        }
        (Err(f), _) => Report::Failed(f),
    }
}

/// Delivers a report until the engine accepts it: a finished result is
/// never silently lost. Gives up only when the engine refuses it for good,
/// or long after the task's deadline, when the engine has retried the task
/// elsewhere anyway.
pub(super) async fn deliver(
    connector: &dyn Connector,
    key: &TaskKey,
    report: Report,
    give_up: Option<Instant>,
) {
    let mut backoff = Backoff::new(Duration::from_millis(100), MAX_REPORT_BACKOFF);
    loop {
        // A connector that panics (a bug) loses no result: the report is
        // tried again, as after a broken transport.
        let reported = unwinding(connector.report(key, report.clone()))
            .await
            .unwrap_or_else(|Panicked(said)| {
                tracing::error!("reporting panicked (a bug): {}", Shown(&said, 300));
                Err(ReportError {
                    retryable: true,
                    message: format!("reporting panicked: {said}"),
                })
            });
        match reported {
            Ok(()) => return,
            Err(e) if !e.retryable => {
                tracing::warn!(
                    "the engine refused the report: {}",
                    Shown(&e.message, MAX_LOGGED_MESSAGE)
                );
                return;
            }
            Err(e) => {
                if give_up.is_some_and(|at| Instant::now() >= at) {
                    tracing::error!(
                        "giving up reporting long after the task's deadline (the engine has timed it out): {}",
                        Shown(&e.message, MAX_LOGGED_MESSAGE)
                    );
                    return;
                }
                let wait = backoff.upcoming();
                tracing::warn!(
                    "reporting failed, retrying in {wait:?}: {}",
                    Shown(&e.message, MAX_LOGGED_MESSAGE)
                );
                backoff.wait().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cancelled() -> Failure {
        Failure::new(FailureClass::Cancelled, &RetryPolicy::default(), "stopped")
    }

    #[test]
    fn cancels_are_reported_as_cancelled_only_when_requested() {
        assert_eq!(
            to_report(Ok(json!(1)), Some(CancelReason::Requested)),
            Report::Completed(json!(1))
        );
        assert!(matches!(
            to_report(Err(cancelled()), Some(CancelReason::Requested)),
            Report::Cancelled(_)
        ));
        let Report::Failed(f) = to_report(Err(cancelled()), Some(CancelReason::Interrupted)) else {
            panic!("shutdown must fail, not cancel")
        };
        assert!(f.retryable);
        assert!(f.message.contains("interrupted by the worker"));
        assert!(matches!(
            to_report(Err(cancelled()), None),
            Report::Failed(_)
        ));
    }
}
