//! One task from delivery to acknowledged report: route, execute (the
//! session's liveness pump heartbeats it meanwhile), map the outcome to what
//! the engine expects, and deliver the report until the engine accepts it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tracing::Instrument;

use super::liveness::Progress;
use super::{Args, CancelReason, Connector, InFlight, Report, Session, TaskStart};
use crate::backoff::Backoff;
use crate::metrics::COMPLETED;
use crate::sandbox::{Failure, FailureClass, Outcome, RetryPolicy, Task};
use crate::sync::lock;

/// The longest wait between two report attempts.
const MAX_REPORT_BACKOFF: Duration = Duration::from_secs(10);
/// How long past a task's deadline a report is still worth retrying: the
/// engine may still accept it while its own timeout has not fired.
const REPORT_PATIENCE: Duration = Duration::from_secs(60);

pub(super) async fn run(
    session: &Session,
    connector: &dyn Connector,
    mut start: TaskStart,
    entry: InFlight,
    progress: Arc<Progress>,
) {
    let span = tracing::info_span!(
        "task",
        tenant = %start.tenant,
        activity_type = %start.activity_type,
        activity_id = %start.info.activity_id,
        attempt = start.info.attempt,
    );
    async {
        let started = Instant::now();
        session.metrics.task_started(&start.tenant);
        let (outcome, activity) = execute(session, &mut start, &entry, &progress).await;
        // The outcome exists: no more heartbeats while it is reported.
        progress.end();
        let reason = *lock(&entry.reason);
        let report = to_report(outcome, reason);
        let label = match &report {
            Report::Completed(_) => {
                tracing::info!(elapsed = ?started.elapsed(), "completed");
                COMPLETED
            }
            Report::Failed(f) | Report::Cancelled(f) => {
                tracing::info!(elapsed = ?started.elapsed(), class = %f.class, kind = %f.kind, "failed: {}", f.message);
                f.class.as_str()
            }
        };
        session
            .metrics
            .task_finished(&start.tenant, &activity, label, started.elapsed());
        deliver(connector, &start, report, started).await;
    }
    .instrument(span)
    .await
}

async fn execute(
    session: &Session,
    start: &mut TaskStart,
    entry: &InFlight,
    progress: &Arc<Progress>,
) -> (Outcome, String) {
    let default_policy = RetryPolicy::default();
    let tenant = session.registry.tenant(&start.tenant);
    let policy = tenant.as_ref().map_or(&default_policy, |t| &t.retry);
    let Some(route) = session.registry.route(&start.tenant, &start.activity_type) else {
        let served = session.registry.activity_types(&start.tenant).join(", ");
        // Engines can send any name: one label for all unknown ones keeps the
        // metrics' cardinality bounded.
        let unknown = Err(Failure::new(
            FailureClass::UnknownActivity,
            policy,
            format!(
                "tenant `{}` serves no activity type `{}` (it serves: {served})",
                start.tenant, start.activity_type
            ),
        ));
        return (unknown, "<unknown>".to_owned());
    };
    let outcome = run_routed(session, start, entry, progress, &route, policy).await;
    (outcome, route.activity)
}

async fn run_routed(
    session: &Session,
    start: &mut TaskStart,
    entry: &InFlight,
    progress: &Arc<Progress>,
    route: &super::Route,
    policy: &RetryPolicy,
) -> Outcome {
    // The arguments move into the task: nothing after execution needs them.
    let args = std::mem::replace(&mut start.args, Ok(Args::Positional(Vec::new())))
        .and_then(|args| positional(args, route))
        .map_err(|e| Failure::new(FailureClass::InvalidInput, policy, e))?;
    let task = Task {
        activity_type: route.activity.clone(),
        args,
        info: start.info.clone(),
        deadline: start.deadline,
        cancel: entry.cancel.clone(),
        observer: progress.clone(),
    };
    // The type slot (for a type with its own limit), then the host slot
    // are taken here, in arrival order, and held while the guest runs; the
    // session's liveness pump keeps the task alive with the engine while it
    // waits.
    let _type = match start.type_slot.take() {
        Some(taken) => Some(taken),
        None => {
            session
                .permits
                .type_slot(&route.tenant.name, &[&start.activity_type, &route.activity])
                .await
        }
    };
    let _slot = session.permits.host_slot().await;
    session
        .sandbox
        .execute(&route.component, &route.tenant, task)
        .await
}

/// Named arguments in the activity type's parameter order. Names match as
/// record fields do (`max-len`, `max_len` and `maxLen` are one name); a
/// missing `option` parameter is `none`.
fn positional(args: Args, route: &super::Route) -> Result<Vec<Value>, String> {
    let mut named = match args {
        Args::Positional(values) => return Ok(values),
        Args::Named(named) => named,
    };
    let Some(activity) = route.component.activity(&route.activity) else {
        // The route was built from this component's own activity types.
        return Err(format!(
            "`{}` is not exported by its component",
            route.activity
        ));
    };
    let expected = || {
        activity
            .params
            .iter()
            .map(|(name, _)| format!("`{name}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut values = Vec::with_capacity(activity.params.len());
    for (name, ty) in &activity.params {
        let key = named
            .keys()
            .find(|key| crate::sandbox::convert::names_match(name, key))
            .cloned();
        match key.and_then(|key| named.remove(&key)) {
            Some(value) => values.push(value),
            None if matches!(ty, wasmtime::component::types::Type::Option(_)) => {
                values.push(Value::Null)
            }
            None => {
                return Err(format!(
                    "missing argument `{name}` (expected {})",
                    expected()
                ));
            }
        }
    }
    if let Some(unknown) = named.keys().next() {
        return Err(format!(
            "unknown argument `{unknown}` (expected {})",
            expected()
        ));
    }
    Ok(values)
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
async fn deliver(connector: &dyn Connector, start: &TaskStart, report: Report, started: Instant) {
    let give_up = start.deadline.map(|d| started + d + REPORT_PATIENCE);
    let mut backoff = Backoff::new(Duration::from_millis(100), MAX_REPORT_BACKOFF);
    loop {
        match connector.report(&start.key, report.clone()).await {
            Ok(()) => return,
            Err(e) if !e.retryable => {
                tracing::warn!("the engine refused the report: {}", e.message);
                return;
            }
            Err(e) => {
                if give_up.is_some_and(|at| Instant::now() >= at) {
                    tracing::error!(
                        "giving up reporting long after the task's deadline (the engine has timed it out): {}",
                        e.message
                    );
                    return;
                }
                let wait = backoff.upcoming();
                tracing::warn!("reporting failed, retrying in {wait:?}: {}", e.message);
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
