//! Tenant-fair CPU. A task's execution (conversion, instantiation, the
//! guest's call) runs only while it holds one of the host's guest slots,
//! one per core; every time it yields — at the end of each time slice
//! (fuel interval or watchdog), or to wait for I/O — the slot goes back and
//! [`fair`] decides who runs next: tenants by the CPU they have used for
//! their weight, then each tenant's tasks in order. The CPU a slice used is
//! the thread's own CPU clock around the poll, so it is exactly what the
//! guest (and the host's work for it) cost.
//!
//! Guests run on threads of their own ([`threads`]), one per slot, at a
//! lower priority than the host's: the host's own work — polling,
//! reporting, heartbeats, the admin API and `/metrics` — runs on its own
//! runtime and goes first, whatever the guests do. Only a task's first
//! poll may run on the caller's thread: when it gets a slot the moment it
//! asks, or, with the slots all taken, when its tenant wakes and its turn
//! comes next (wake-up preemption, `fair.rs` `Fair::take`): then no slot
//! holder the machine's other work pushed off its core keeps it waiting.
//! A short task never pays the hand-off, and the host's threads give a
//! task at most its first time slice, once, on at most half of them at a
//! time ([`CpuScheduler::execute`]).

mod boxes;
mod execute;
mod fair;
mod threads;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::share::{CpuShare, CpuUse};
use boxes::TaskBoxes;
use execute::Execute;
pub use fair::CAP_WINDOW;
use fair::{Beyond, Clock, Dispatch, Fair, Lazy};
pub use threads::GUEST_NICE;
use threads::GuestThreads;

use crate::metrics::{Metrics, TypeCpu};
use crate::sync::lock;

/// How much CPU (and waiting for it) a task counts before it adds it to its
/// type's counters: they stay current within this per task.
const REPORT_EVERY: Duration = Duration::from_millis(10);

/// The guest slots of a host with this machine's cores.
pub fn host_slots() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// One task's place in line, and the waker its work is polled with: one
/// allocation a task, whatever its slices.
struct Waiter {
    /// Granted a slot since it last asked for one.
    granted: AtomicBool,
    /// Who to wake when granted; only while it waits (a task granted a
    /// slot at once, or one already woken by its own yield, needs none).
    waker: Mutex<Option<Waker>>,
    /// Its work was woken while (or since) it was last polled.
    woken: AtomicBool,
    /// The task's own waker: every wake of its work is passed on to it.
    outer: Mutex<Waker>,
}

/// A waiter, compared by identity.
#[derive(Clone)]
struct Ticket(Arc<Waiter>);

impl PartialEq for Ticket {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// The host's guest slots, shared between tenants.
pub struct CpuScheduler {
    fair: Mutex<Fair<Ticket>>,
    metrics: Arc<Metrics>,
    /// The next window opening a timer is set for.
    timer: Mutex<Option<Instant>>,
    /// Where [`CpuScheduler::execute`] runs guests (none if the system
    /// refused the threads: then on the caller's).
    threads: Option<GuestThreads>,
    /// How many more tasks' first polls may run on the host's threads now:
    /// half the slots (one of two cores' threads stays the host's).
    inline: AtomicUsize,
    /// Boxes of tasks that ended, for the next tasks' futures.
    boxes: Arc<TaskBoxes>,
}

impl CpuScheduler {
    pub fn new(slots: usize, metrics: Arc<Metrics>) -> Arc<Self> {
        let threads = GuestThreads::new(slots)
            .inspect_err(|e| {
                tracing::warn!(
                    "no threads of their own for guests ({e}): they run beside the host's work"
                );
            })
            .ok();
        Arc::new(CpuScheduler {
            fair: Mutex::new(Fair::new(slots)),
            metrics,
            timer: Mutex::new(None),
            threads,
            inline: AtomicUsize::new(slots / 2),
            boxes: TaskBoxes::new(slots.max(1)),
        })
    }

    /// `work` run under the scheduler (`CpuScheduler::schedule`). Its first
    /// poll runs on the caller's thread when fewer than half the slots'
    /// first polls already do: a task given a slot at once that ends
    /// within its first time slice — most activities — then costs no
    /// hand-off between threads (about 100 µs of CPU, four times a small
    /// task's own). There, with the slots all taken, it runs beyond them
    /// when its tenant wakes and its turn comes next
    /// (`fair.rs` `Fair::take`): the guests' threads, at a lower priority,
    /// may be off their cores while they hold the slots, and would keep it
    /// waiting for the tenants its turn comes before. From its first
    /// `Pending` — it waits for a slot, used up its slice, or waits for
    /// I/O — it goes on on a guest thread. That first poll runs inside the
    /// guests' runtime (what it spawns, such as an HTTP request's
    /// connection, and its timers, are theirs), and the host's threads
    /// give a task at most its first slice (one fuel interval, or the
    /// watchdog's slice in host calls, with the task's conversion and
    /// instantiation), once; never more than half of them at a time.
    ///
    /// Inlined into its caller: `work` (the task's arguments, hundreds of
    /// bytes) is then built into its box where it is, not copied into this
    /// call's arguments first (`cargo bench -p corral --bench sandbox
    /// callgrind`).
    #[inline(always)]
    pub fn execute<F>(
        self: &Arc<Self>,
        tenant: Arc<str>,
        cpu: Arc<TypeCpu>,
        share: CpuShare,
        work: impl FnOnce() -> F,
    ) -> impl Future<Output = (F::Output, CpuUse)> + Send + '_
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        // In a box, so that moving the task to a guest thread moves a
        // pointer; one an ended task left, when there is one.
        let work = self.boxes.boxed(work);
        Execute::new(self, self.schedule(tenant, cpu, share, work))
    }

    /// [`CpuScheduler::schedule`] of any future, boxed, its CPU counted
    /// under `activity_type`: the tests' way in (the host's is
    /// [`CpuScheduler::execute`]).
    #[cfg(test)]
    pub(crate) fn run<F: Future>(
        self: &Arc<Self>,
        tenant: Arc<str>,
        activity_type: Arc<str>,
        share: CpuShare,
        work: F,
    ) -> Scheduled<Pin<Box<F>>> {
        let cpu = self.metrics.cpu_of(&tenant, &activity_type);
        self.schedule(tenant, cpu, share, Box::pin(work))
    }

    /// `work` of `tenant`, run only while it holds a slot; its CPU is
    /// counted as it goes, in its tenant's account and in `cpu`, its
    /// activity type's counters.
    /// `work` may move once polled: a boxed future, so that moving the task
    /// to a guest thread moves a pointer.
    fn schedule<W: Future + Unpin>(
        self: &Arc<Self>,
        tenant: Arc<str>,
        cpu: Arc<TypeCpu>,
        share: CpuShare,
        work: W,
    ) -> Scheduled<W> {
        let ticket = Waiter::new();
        Scheduled {
            scheduler: self.clone(),
            tenant,
            cpu,
            tally: Tally::default(),
            share,
            work: Some(work),
            holding: false,
            polled: false,
            beyond: Beyond::No,
            waiting: None,
            waker: Waker::from(ticket.clone()),
            ticket: Ticket(ticket),
            context: None,
        }
    }

    /// Wakes the tasks that now hold a slot, counts throttled time, and
    /// makes sure the next capped window opening wakes someone.
    #[inline]
    fn apply(self: &Arc<Self>, dispatch: Dispatch<Ticket>) {
        // (Most releases change nothing: no one waits. Checked where the
        // caller is, without a call.)
        if dispatch.is_empty() {
            return;
        }
        self.apply_changes(dispatch);
    }

    /// [`CpuScheduler::apply`] of a dispatch that changed something.
    fn apply_changes(self: &Arc<Self>, dispatch: Dispatch<Ticket>) {
        for Ticket(waiter) in dispatch.granted {
            waiter.granted.store(true, Ordering::Release);
            // Woken with the lock let go: a waker may poll at once.
            let waker = lock(&waiter.waker).take();
            if let Some(waker) = waker {
                waker.wake();
            }
        }
        for (tenant, throttled) in dispatch.throttled {
            self.metrics.cpu_throttled(&tenant, throttled);
        }
        if let Some(at) = dispatch.retry_at {
            let mut timer = lock(&self.timer);
            // Outside a runtime (a caller's own executor), the next release
            // dispatches instead.
            let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                return;
            };
            if timer.is_none_or(|set| at < set) {
                *timer = Some(at);
                drop(timer);
                let scheduler = self.clone();
                runtime.spawn(async move {
                    tokio::time::sleep_until(at.into()).await;
                    *lock(&scheduler.timer) = None;
                    let dispatch = lock(&scheduler.fair).dispatch(Instant::now());
                    scheduler.apply(dispatch);
                });
            }
        }
    }
}

/// A task's CPU and its wait for it: all of it, and what its type's
/// counters have not had yet.
#[derive(Default)]
struct Tally {
    total: CpuUse,
    unreported: CpuUse,
}

impl Tally {
    fn cpu(&mut self, used: Duration) {
        self.total.cpu += used;
        self.unreported.cpu += used;
    }

    fn waited(&mut self, waited: Duration) {
        self.total.waited += waited;
        self.unreported.waited += waited;
    }
}

/// A task's execution under the scheduler: see `CpuScheduler::schedule`.
pub struct Scheduled<W> {
    scheduler: Arc<CpuScheduler>,
    tenant: Arc<str>,
    /// Its activity type's CPU counters.
    cpu: Arc<TypeCpu>,
    /// What it used and waited so far.
    tally: Tally,
    share: CpuShare,
    /// Until it ends (dropped then, while it holds its slot; a task
    /// cancelled on the way is dropped, its store and instance with it, by
    /// whoever drops it, without a slot).
    work: Option<W>,
    /// Holds a slot: set around each poll of `work`.
    holding: bool,
    /// `work` has been polled.
    polled: bool,
    /// Where its next request for a slot may run if none is free: beyond
    /// the slots only when its caller set so for that one request (its
    /// first poll, on the host's thread).
    beyond: Beyond,
    /// In line since then, when it is.
    waiting: Option<Instant>,
    /// The waker `work` is polled with: [`Waiter`]'s.
    waker: Waker,
    /// Its place in line each time it asks for a slot.
    ticket: Ticket,
    /// The span and subscriber its work is polled in, once it runs on a
    /// guest thread (on the caller's thread they are current already). In
    /// a box: most tasks never need it, and every task is moved whole.
    context: Option<Box<TaskContext>>,
}

/// A task's span and its caller's subscriber.
type TaskContext = (tracing::Span, tracing::Dispatch);

impl Waiter {
    fn new() -> Arc<Waiter> {
        Arc::new(Waiter {
            granted: AtomicBool::new(false),
            waker: Mutex::new(None),
            woken: AtomicBool::new(false),
            outer: Mutex::new(Waker::noop().clone()),
        })
    }

    /// Passes wakes on to `waker` from now on.
    fn follow(&self, waker: &Waker) {
        let mut outer = lock(&self.outer);
        if !outer.will_wake(waker) {
            *outer = waker.clone();
        }
    }
}

/// As a waker it notes a wake that comes while the work is being polled —
/// a yield, runnable again at once — and passes every wake on to the
/// task's own waker.
impl std::task::Wake for Waiter {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        // Passed on with the lock let go: the task's waker may call back
        // in at once (a waker that polls the task where it is woken) and
        // must find the lock free.
        let outer = lock(&self.outer).clone();
        outer.wake();
    }
}

impl<W: Future + Unpin> Future for Scheduled<W> {
    type Output = (W::Output, CpuUse);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let me = &*this.ticket.0;
        // When it asked for a slot, unless it was given one at once in
        // this poll.
        let since = match this.waiting {
            Some(since) => Some(since),
            None => {
                // Polled before its work was woken (moved to a guest
                // thread after a wait for I/O, a spurious wake): it waits
                // on, asking for no slot.
                if this.polled && !me.woken.load(Ordering::Acquire) {
                    me.follow(cx.waker());
                    if !me.woken.load(Ordering::Acquire) {
                        return Poll::Pending;
                    }
                }
                // (The clock only if the decision needs it, or it waits.)
                let clock = Lazy::default();
                let mut fair = lock(&this.scheduler.fair);
                let beyond = std::mem::replace(&mut this.beyond, Beyond::No);
                if fair.take(&this.tenant, this.share, &clock, beyond) {
                    None
                } else {
                    let now = clock.now();
                    this.waiting = Some(now);
                    me.granted.store(false, Ordering::Release);
                    let dispatch = fair.enqueue(&this.tenant, this.share, this.ticket.clone(), now);
                    drop(fair);
                    this.scheduler.apply(dispatch);
                    Some(now)
                }
            }
        };
        // Given a slot at once, it never waited in line: no waker to set.
        if since.is_some() && !me.granted.load(Ordering::Acquire) {
            *lock(&me.waker) = Some(cx.waker().clone());
            if !me.granted.load(Ordering::Acquire) {
                return Poll::Pending;
            }
            // Granted while the waker was being set: run now, and keep no
            // waker for the next wait to find.
            lock(&me.waker).take();
        }
        this.waiting = None;
        // Given a slot at once, it did not wait: no clock read.
        if let Some(since) = since {
            this.tally.waited(since.elapsed());
        }
        me.follow(cx.waker());
        me.woken.store(false, Ordering::Release);
        let Some(work) = this.work.as_mut() else {
            // Polled again after it ended: nothing to run.
            this.holding_release(Duration::ZERO);
            return Poll::Pending;
        };
        // Until released: a panic in the poll must not keep the slot.
        this.holding = true;
        this.polled = true;
        let before = thread_cpu();
        let mut cx = Context::from_waker(&this.waker);
        let polled = in_context(&this.context, || Pin::new(work).poll(&mut cx));
        if polled.is_ready() {
            // Its teardown (the store, the instance) is its own CPU too.
            end_work(&mut this.work, &this.context);
        }
        let used = thread_cpu().saturating_sub(before);
        this.tally.cpu(used);
        let clock = Lazy::default();
        // Woken while it was polled: it yielded and runs on, so it is back
        // in line before the slot is given to anyone.
        let again = (polled.is_pending() && me.woken.load(Ordering::Acquire)).then(|| {
            me.granted.store(false, Ordering::Release);
            this.waiting = Some(clock.now());
            this.ticket.clone()
        });
        this.holding = false;
        let dispatch = lock(&this.scheduler.fair).release(&this.tenant, used, again, &clock);
        this.scheduler.apply(dispatch);
        let unreported = this.tally.unreported;
        if polled.is_ready() || unreported.cpu + unreported.waited >= REPORT_EVERY {
            this.report();
        }
        polled.map(|output| (output, this.tally.total))
    }
}

impl<W> Scheduled<W> {
    /// Gives back the slot this task holds.
    fn holding_release(&mut self, used: Duration) {
        let dispatch = lock(&self.scheduler.fair).release(&self.tenant, used, None, Instant::now());
        self.scheduler.apply(dispatch);
    }

    /// Adds what it used since the last time to its type's counters.
    fn report(&mut self) {
        let unreported = std::mem::take(&mut self.tally.unreported);
        if unreported != CpuUse::default() {
            self.cpu.add(unreported);
        }
    }
}

/// `f` in a task's span and subscriber, when it carries them.
fn in_context<R>(context: &Option<Box<TaskContext>>, f: impl FnOnce() -> R) -> R {
    match context {
        None => f(),
        Some(context) => {
            let (span, dispatch) = &**context;
            tracing::dispatcher::with_default(dispatch, || span.in_scope(f))
        }
    }
}

/// Drops a task's work (the store, the instance) in its span and
/// subscriber: the teardown logs as the task, as its polls did.
fn end_work<W>(work: &mut Option<W>, context: &Option<Box<TaskContext>>) {
    let work = work.take();
    in_context(context, || drop(work));
}

impl<W> Drop for Scheduled<W> {
    fn drop(&mut self) {
        // Cancelled on the way (a deadline, a cancel, its caller gone):
        // its teardown — the store, the instance, up to its memory limit
        // to unmap — is its tenant's CPU too, though it holds no slot for
        // it, so a tenant's cancels cost it its share. (An ended task's
        // work is gone already: no clock read.)
        let torn_down = if self.work.is_some() {
            let before = thread_cpu();
            end_work(&mut self.work, &self.context);
            thread_cpu().saturating_sub(before)
        } else {
            Duration::ZERO
        };
        if !torn_down.is_zero() {
            self.tally.cpu(torn_down);
        }
        let in_line = self.waiting.take().map(|since| (since, Instant::now()));
        if let Some((since, now)) = in_line {
            // Dropped in line (a deadline or cancel while it waited for a
            // core or its cap's window): that wait is counted too.
            let waited = now.saturating_duration_since(since);
            self.tally.waited(waited);
        }
        self.report();
        if self.holding {
            // Its poll panicked while it held a slot.
            self.holding = false;
            self.holding_release(torn_down);
            return;
        }
        let Some((_, now)) = in_line else {
            if !torn_down.is_zero() {
                lock(&self.scheduler.fair).charge(&self.tenant, torn_down, Instant::now());
            }
            return;
        };
        let mut fair = lock(&self.scheduler.fair);
        fair.charge(&self.tenant, torn_down, now);
        // Still in line: out of it (its throttled time counted), or
        // granted, never used: the slot goes to the next.
        let dispatch = match fair.cancel(&self.tenant, &self.ticket, now) {
            Some(left) => left,
            None => fair.release(&self.tenant, Duration::ZERO, None, now),
        };
        drop(fair);
        self.scheduler.apply(dispatch);
    }
}

/// This thread's CPU time so far.
fn thread_cpu() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        u64::try_from(now.tv_sec).unwrap_or(0),
        u32::try_from(now.tv_nsec).unwrap_or(0),
    )
}

#[cfg(test)]
mod tests;
