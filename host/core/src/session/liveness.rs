//! Liveness: every task in flight is heartbeated at the pace its engine
//! asked for, whether or not its guest heartbeats itself. One timer serves
//! all of a connector's tasks: a timer per task would be registered (and
//! would wake the runtime's timer driver) once per task, which cost more
//! CPU than the sandbox itself for short activities.
//!
//! The same timer is the host's backstop for deadlines: a guest's deadline
//! is enforced on the guests' threads, which run below the host's priority
//! (and a guest may be stuck inside a host call); a task whose guest has
//! not ended [`BACKSTOP`] past its time limit is reported timed out by the
//! host itself, from here (see `Session::serve`).

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long past its time limit (the engine's deadline or its tenant's
/// timeout, from when its guest started) a task whose guest has not ended
/// is reported timed out by the host.
pub(super) const BACKSTOP: Duration = Duration::from_secs(5);
/// How often the pump looks for such tasks while any is in flight.
const BACKSTOP_CHECK: Duration = Duration::from_secs(1);

use serde_json::Value;
use tokio::time::{Instant, Sleep};

use super::{Connector, HeartbeatDetails, TaskKey};
use crate::metrics::Metrics;
use crate::sandbox::{LogLevel, Stream, TaskObserver};
use crate::sync::lock;

/// A task's liveness, as its guest and the pump share it: the guest's
/// heartbeats go to the connector as they come (its `heartbeat` never
/// blocks, and throttles), and the pump repeats the latest in between.
pub(super) struct Progress {
    key: TaskKey,
    connector: Arc<dyn Connector>,
    /// As text, not a tree: a guest's details of `max_output` bytes parse
    /// to many times that (about 36 times for `[0,0,…]`), held for the
    /// task's life and sent at every beat.
    last: Mutex<Option<HeartbeatDetails>>,
    /// Set once the outcome exists: the engine hears no more heartbeats.
    ended: AtomicBool,
    /// Set by whoever reports the task: its runner, or the backstop.
    reported: AtomicBool,
    /// The time limit its guest started under, and when the backstop
    /// reports it if it has not ended by then.
    limit: Mutex<Option<(Duration, Instant)>>,
    metrics: Arc<Metrics>,
    tenant: String,
    /// Sees the guest's own events too (see `TaskStart::observer`).
    observer: Option<Arc<dyn TaskObserver>>,
}

impl Progress {
    /// Starts from the previous attempt's last details, if any.
    pub(super) fn new(
        key: TaskKey,
        connector: Arc<dyn Connector>,
        metrics: Arc<Metrics>,
        tenant: &str,
        last: Option<HeartbeatDetails>,
        observer: Option<Arc<dyn TaskObserver>>,
    ) -> Self {
        Progress {
            key,
            connector,
            last: Mutex::new(last),
            ended: AtomicBool::new(false),
            reported: AtomicBool::new(false),
            limit: Mutex::new(None),
            metrics,
            tenant: tenant.to_owned(),
            observer,
        }
    }

    pub(super) fn key(&self) -> &TaskKey {
        &self.key
    }

    pub(super) fn tenant(&self) -> &str {
        &self.tenant
    }

    pub(super) fn connector(&self) -> &Arc<dyn Connector> {
        &self.connector
    }

    /// Its guest starts now, under `limit` (none: no backstop).
    pub(super) fn guest_starts(&self, limit: Option<Duration>) {
        *lock(&self.limit) = limit.map(|limit| (limit, Instant::now() + limit + BACKSTOP));
    }

    /// Takes the task's report for the caller: `false` when it is taken.
    pub(super) fn take_report(&self) -> bool {
        !self.reported.swap(true, Ordering::AcqRel)
    }

    /// Its time limit, when its guest has run past it and [`BACKSTOP`]
    /// more at `now`.
    fn overdue(&self, now: Instant) -> Option<Duration> {
        if self.ended() {
            return None;
        }
        lock(&self.limit).and_then(|(limit, at)| (at <= now).then_some(limit))
    }

    /// Tells the engine the task is alive, with the latest details; nothing
    /// once the outcome exists.
    fn beat(&self) {
        if !self.ended() {
            let last = lock(&self.last).clone();
            self.connector.heartbeat(&self.key, last.as_ref());
        }
    }

    pub(super) fn end(&self) {
        self.ended.store(true, Ordering::Release);
    }

    fn ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }
}

impl TaskObserver for Progress {
    fn heartbeat(&self, count: u32, details: Option<&Value>) {
        if let Some(details) = details {
            *lock(&self.last) = Some(HeartbeatDetails::of(details));
        }
        self.beat();
        if let Some(observer) = &self.observer {
            observer.heartbeat(count, details);
        }
    }

    fn log(&self, level: LogLevel, message: &str) {
        if let Some(observer) = &self.observer {
            observer.log(level, message);
        }
    }

    fn output(&self, stream: Stream, line: &str) {
        if let Some(observer) = &self.observer {
            observer.output(stream, line);
        }
    }

    fn output_dropped(&self, bytes: u64) {
        if let Some(observer) = &self.observer {
            observer.output_dropped(bytes);
        }
    }

    fn instantiated(&self, took: Duration) {
        self.metrics.instantiated(&self.tenant, took);
        if let Some(observer) = &self.observer {
            observer.instantiated(took);
        }
    }

    fn reused(&self, tasks: u32) {
        self.metrics.task_reused(&self.tenant);
        if let Some(observer) = &self.observer {
            observer.reused(tasks);
        }
    }
}

struct Due {
    every: Duration,
    next: Instant,
    progress: Arc<Progress>,
}

/// The heartbeat schedule of one connector's tasks in flight: a single
/// timer, armed for the earliest heartbeat due.
pub(super) struct Pump {
    tasks: Vec<Due>,
    timer: Pin<Box<Sleep>>,
    armed: Option<Instant>,
}

impl Default for Pump {
    fn default() -> Self {
        Pump {
            tasks: Vec::new(),
            timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
            armed: None,
        }
    }
}

impl Pump {
    /// Heartbeats the task every `every` from now on, until its progress
    /// ends (ended tasks are forgotten at the next beat, so a finished task
    /// costs the loop no wake-up of its own).
    pub(super) fn add(&mut self, every: Duration, progress: Arc<Progress>) {
        let next = Instant::now() + every;
        self.tasks.push(Due {
            every,
            next,
            progress,
        });
        // Tasks usually share one pace, so a newcomer is rarely the
        // earliest: the timer is re-armed only when it is (and at most
        // BACKSTOP_CHECK away).
        let next = next.min(Instant::now() + BACKSTOP_CHECK);
        if self.armed.is_none_or(|at| next < at) {
            self.arm(next);
        }
    }

    /// Waits until a heartbeat is due; never resolves while nothing is in
    /// flight. Cancel-safe.
    pub(super) async fn due(&mut self) {
        match self.armed {
            Some(_) => (&mut self.timer).await,
            None => std::future::pending().await,
        }
    }

    /// Heartbeats every task whose time has come, forgets the ones that
    /// ended, and re-arms the timer for the next one (at most
    /// [`BACKSTOP_CHECK`] away while any task is in flight); returns the
    /// tasks overdue (with their time limit), for the backstop.
    pub(super) fn beat(&mut self) -> Vec<(Arc<Progress>, Duration)> {
        let now = Instant::now();
        let mut earliest: Option<Instant> = None;
        let mut overdue = Vec::new();
        self.tasks.retain(|due| !due.progress.ended());
        for due in &mut self.tasks {
            if due.next <= now {
                due.progress.beat();
                due.next = now + due.every;
            }
            if let Some(limit) = due.progress.overdue(now) {
                overdue.push((due.progress.clone(), limit));
            }
            earliest = Some(earliest.map_or(due.next, |e| e.min(due.next)));
        }
        match earliest {
            Some(at) => self.arm(at.min(now + BACKSTOP_CHECK)),
            None => self.armed = None,
        }
        overdue
    }

    fn arm(&mut self, at: Instant) {
        self.timer.as_mut().reset(at);
        self.armed = Some(at);
    }
}
