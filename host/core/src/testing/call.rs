//! One call of the harness: set up, run through the component's session,
//! and what it produced.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use super::TestComponent;
use crate::local::{Canceller, Submission};
use crate::sandbox::{
    Failure, FailureClass, HeartbeatDetails, LogLevel, Outcome, Stream, TaskInfo, TaskObserver,
};
use crate::session::Args;

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
    pub(super) fn new(component: TestComponent, activity_type: &str) -> Self {
        let tenant = component.tenant.clone();
        Call {
            component,
            activity_type: activity_type.to_owned(),
            args: Vec::new(),
            named: None,
            info: TaskInfo {
                tenant,
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
        self.info.last_heartbeat = Some(HeartbeatDetails::of(&details));
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
            warm: seen.warm,
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
    /// When the task ran in a warm instance: how many tasks it had run.
    pub warm: Option<u32>,
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
    warm: Option<u32>,
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

impl Recorder {
    /// The guest began to run, in a new instance or a warm one.
    fn began(&self, warm: Option<u32>) {
        {
            let mut seen = self.seen();
            seen.instantiated = seen.last;
            seen.warm = warm;
        }
        if let Some(started) = crate::sync::lock(&self.started).take() {
            let _ = started.send(());
        }
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
        self.began(None);
    }

    fn reused(&self, tasks: u32) {
        self.began(Some(tasks));
    }
}
