//! Tenant-fair CPU. A task's execution (conversion, instantiation, the
//! guest's call) runs only while it holds one of the host's guest slots,
//! one per core; every time it yields — at the end of each time slice
//! (fuel interval or watchdog), or to wait for I/O — the slot goes back and
//! [`fair`] decides who runs next: tenants by the CPU they have used for
//! their weight, then each tenant's tasks in order. The CPU a slice used is
//! the thread's own CPU clock around the poll, so it is exactly what the
//! guest (and the host's work for it) cost.
//!
//! Guests hold at most one slot per core, and the runtime has one thread
//! more than that (see `runtime_threads`): one thread is always free for
//! the host's own work — polling, reporting, heartbeats, the admin API and
//! `/metrics` — whatever the guests do.

mod fair;
mod policy;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

pub use fair::CAP_WINDOW;
use fair::{Dispatch, Fair};
pub use policy::{CpuMax, CpuPolicyError, CpuShare, CpuWeight};

use crate::metrics::Metrics;
use crate::sync::lock;

/// How much CPU (and waiting for it) a task counts before it adds it to the
/// metrics: they stay current within this per task, at one metrics update
/// per about ten slices.
const REPORT_EVERY: Duration = Duration::from_millis(10);

/// The guest slots of a host with this machine's cores.
pub fn host_slots() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// The async runtime's worker threads for `slots` guest slots: one more,
/// so the host's own work always has a thread.
pub fn runtime_threads(slots: usize) -> usize {
    slots + 1
}

/// One task's place in line.
struct Waiter {
    granted: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

/// A waiter, compared by identity.
#[derive(Clone)]
struct Ticket(Arc<Waiter>);

impl PartialEq for Ticket {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// What one task's execution cost in CPU, and waited for it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuUse {
    pub cpu: Duration,
    /// Runnable, but waiting for a slot (or for its cap's next window).
    pub waited: Duration,
}

/// The host's guest slots, shared between tenants.
pub struct CpuScheduler {
    fair: Mutex<Fair<Ticket>>,
    metrics: Arc<Metrics>,
    /// The next window opening a timer is set for.
    timer: Mutex<Option<Instant>>,
}

impl CpuScheduler {
    pub fn new(slots: usize, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(CpuScheduler {
            fair: Mutex::new(Fair::new(slots)),
            metrics,
            timer: Mutex::new(None),
        })
    }

    /// `work` of `tenant` (executing `activity_type`), run only while it
    /// holds a slot; its CPU is counted as it goes, under both names.
    pub fn run<F: Future>(
        self: &Arc<Self>,
        tenant: Arc<str>,
        activity_type: String,
        share: CpuShare,
        work: F,
    ) -> Scheduled<F> {
        let noting = Arc::new(Noting {
            woken: AtomicBool::new(false),
            outer: Mutex::new(Waker::noop().clone()),
        });
        Scheduled {
            scheduler: self.clone(),
            tenant,
            activity_type,
            unreported: CpuUse::default(),
            share,
            work: Box::pin(work),
            waiting: None,
            used: CpuUse::default(),
            waker: Waker::from(noting.clone()),
            noting,
        }
    }

    /// Wakes the tasks that now hold a slot, counts throttled time, and
    /// makes sure the next capped window opening wakes someone.
    fn apply(self: &Arc<Self>, dispatch: Dispatch<Ticket>) {
        for Ticket(waiter) in dispatch.granted {
            waiter.granted.store(true, Ordering::Release);
            if let Some(waker) = lock(&waiter.waker).take() {
                waker.wake();
            }
        }
        for (tenant, throttled) in dispatch.throttled {
            self.metrics.cpu_throttled(&tenant, throttled);
        }
        if let Some(at) = dispatch.retry_at {
            let mut timer = lock(&self.timer);
            if timer.is_none_or(|set| at < set) {
                *timer = Some(at);
                drop(timer);
                let scheduler = self.clone();
                tokio::spawn(async move {
                    tokio::time::sleep_until(at.into()).await;
                    *lock(&scheduler.timer) = None;
                    let dispatch = lock(&scheduler.fair).dispatch(Instant::now());
                    scheduler.apply(dispatch);
                });
            }
        }
    }
}

/// A task's execution under the scheduler: see [`CpuScheduler::run`].
pub struct Scheduled<F> {
    scheduler: Arc<CpuScheduler>,
    tenant: Arc<str>,
    activity_type: String,
    /// Used since it was last added to the metrics.
    unreported: CpuUse,
    share: CpuShare,
    work: Pin<Box<F>>,
    /// In line since then, when it is.
    waiting: Option<(Ticket, Instant)>,
    used: CpuUse,
    /// The waker `work` is polled with: [`Noting`].
    waker: Waker,
    noting: Arc<Noting>,
}

/// The waker a task's work is polled with: it notes a wake that comes
/// while the work is being polled — a yield, runnable again at once — and
/// passes every wake on to the task's own waker.
struct Noting {
    woken: AtomicBool,
    outer: Mutex<Waker>,
}

impl std::task::Wake for Noting {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        lock(&self.outer).wake_by_ref();
    }
}

fn new_ticket(waker: &Waker) -> Ticket {
    Ticket(Arc::new(Waiter {
        granted: AtomicBool::new(false),
        waker: Mutex::new(Some(waker.clone())),
    }))
}

impl<F: Future> Future for Scheduled<F> {
    type Output = (F::Output, CpuUse);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let (ticket, since) = match &this.waiting {
            Some(waiting) => waiting.clone(),
            None => {
                let ticket = new_ticket(cx.waker());
                let now = Instant::now();
                this.waiting = Some((ticket.clone(), now));
                let dispatch = lock(&this.scheduler.fair).request(
                    &this.tenant,
                    this.share,
                    ticket.clone(),
                    now,
                );
                this.scheduler.apply(dispatch);
                (ticket, now)
            }
        };
        if !ticket.0.granted.load(Ordering::Acquire) {
            *lock(&ticket.0.waker) = Some(cx.waker().clone());
            // Granted while the waker was being replaced: run now.
            if !ticket.0.granted.load(Ordering::Acquire) {
                return Poll::Pending;
            }
        }
        this.waiting = None;
        let waited = since.elapsed();
        this.used.waited += waited;
        this.unreported.waited += waited;
        {
            let mut outer = lock(&this.noting.outer);
            if !outer.will_wake(cx.waker()) {
                *outer = cx.waker().clone();
            }
        }
        this.noting.woken.store(false, Ordering::Release);
        let before = thread_cpu();
        let polled = this
            .work
            .as_mut()
            .poll(&mut Context::from_waker(&this.waker));
        let used = thread_cpu().saturating_sub(before);
        this.used.cpu += used;
        this.unreported.cpu += used;
        let now = Instant::now();
        // Woken while it was polled: it yielded and runs on, so it is back
        // in line before the slot is given to anyone.
        let again = (polled.is_pending() && this.noting.woken.load(Ordering::Acquire)).then(|| {
            let again = new_ticket(cx.waker());
            this.waiting = Some((again.clone(), now));
            again
        });
        let dispatch = lock(&this.scheduler.fair).release(&this.tenant, used, again, now);
        this.scheduler.apply(dispatch);
        if polled.is_ready() || this.unreported.cpu + this.unreported.waited >= REPORT_EVERY {
            this.report();
        }
        polled.map(|output| (output, this.used))
    }
}

impl<F> Scheduled<F> {
    /// Adds what it used since the last time to the metrics.
    fn report(&mut self) {
        let unreported = std::mem::take(&mut self.unreported);
        if unreported != CpuUse::default() {
            self.scheduler
                .metrics
                .cpu_used(&self.tenant, &self.activity_type, unreported);
        }
    }
}

impl<F> Drop for Scheduled<F> {
    fn drop(&mut self) {
        self.report();
        let Some((ticket, _)) = self.waiting.take() else {
            return;
        };
        let mut fair = lock(&self.scheduler.fair);
        if fair.cancel(&self.tenant, &ticket) {
            return;
        }
        // Granted, never used: the slot goes to the next.
        let dispatch = fair.release(&self.tenant, Duration::ZERO, None, Instant::now());
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
mod tests {
    use super::*;

    /// Burns about `cpu` of CPU, yielding every millisecond of it (it may
    /// go on on another thread after each).
    async fn burn(cpu: Duration) {
        let mut burnt = Duration::ZERO;
        while burnt < cpu {
            let slice = thread_cpu();
            while thread_cpu().saturating_sub(slice) < Duration::from_millis(1) {}
            burnt += thread_cpu().saturating_sub(slice);
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 3)]
    async fn two_tasks_on_one_slot_take_turns_and_count_their_cpu_and_wait() {
        let metrics = Arc::new(Metrics::default());
        let scheduler = CpuScheduler::new(1, metrics.clone());
        let run = |tenant: &str| {
            tokio::spawn(scheduler.run(
                Arc::from(tenant),
                "burn".to_owned(),
                CpuShare::default(),
                burn(Duration::from_millis(50)),
            ))
        };
        let (a, b) = (run("a"), run("b"));
        let ((_, a), (_, b)) = (a.await.unwrap(), b.await.unwrap());
        for used in [a, b] {
            assert!(used.cpu >= Duration::from_millis(50), "{used:?}");
        }
        // One slot: each waited while the other ran, about as long.
        assert!(
            a.waited + b.waited >= Duration::from_millis(40),
            "{a:?} {b:?}"
        );
        // And the metrics hold exactly what each task counted.
        for (tenant, used) in [("a", a), ("b", b)] {
            let counted = metrics.cpu(tenant);
            assert_eq!((counted.used, counted.waited), (used.cpu, used.waited));
        }
    }

    /// Runs `inside` while a task of tenant "a" holds the only slot.
    async fn while_held(scheduler: &Arc<CpuScheduler>, inside: impl FnOnce()) {
        let mut inside = Some(inside);
        let holder = std::future::poll_fn(move |_| {
            if let Some(inside) = inside.take() {
                inside();
            }
            Poll::Ready(())
        });
        scheduler
            .run(
                Arc::from("a"),
                "hold".to_owned(),
                CpuShare::default(),
                holder,
            )
            .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_task_dropped_while_in_line_or_granted_leaves_no_slot_taken() {
        let scheduler = CpuScheduler::new(1, Arc::new(Metrics::default()));
        let mut cx = Context::from_waker(Waker::noop());
        let next = |scheduler: &Arc<CpuScheduler>| {
            let run = scheduler.run(
                Arc::from("b"),
                "seven".to_owned(),
                CpuShare::default(),
                async { 7 },
            );
            tokio::time::timeout(Duration::from_secs(10), run)
        };

        // In line, then gone: it must not be granted the slot later.
        let mut gone = Box::pin(scheduler.run(
            Arc::from("b"),
            "none".to_owned(),
            CpuShare::default(),
            async {},
        ));
        while_held(&scheduler, || {
            assert!(gone.as_mut().poll(&mut cx).is_pending());
            drop(gone);
        })
        .await;
        let ran = next(&scheduler).await.expect("the slot is free");
        assert_eq!(ran.0, 7);

        // Granted when the holder finished, then dropped before it ran.
        let mut granted = Box::pin(scheduler.run(
            Arc::from("b"),
            "none".to_owned(),
            CpuShare::default(),
            async {},
        ));
        while_held(&scheduler, || {
            assert!(granted.as_mut().poll(&mut cx).is_pending());
        })
        .await;
        drop(granted);
        let ran = next(&scheduler).await.expect("the slot is free");
        assert_eq!(ran.0, 7);
    }
}
