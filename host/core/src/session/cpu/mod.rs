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
//! runtime and goes first, whatever the guests do.

mod fair;
mod threads;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::share::{CpuShare, CpuUse};
pub use fair::CAP_WINDOW;
use fair::{Dispatch, Fair};
pub use threads::GUEST_NICE;
use threads::GuestThreads;

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

/// The host's guest slots, shared between tenants.
pub struct CpuScheduler {
    fair: Mutex<Fair<Ticket>>,
    metrics: Arc<Metrics>,
    /// The next window opening a timer is set for.
    timer: Mutex<Option<Instant>>,
    /// Where [`CpuScheduler::execute`] runs guests (none if the system
    /// refused the threads: then on the caller's).
    threads: Option<GuestThreads>,
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
        })
    }

    /// `work` run on a guest thread under the scheduler ([`CpuScheduler::run`]).
    pub async fn execute<F>(
        self: &Arc<Self>,
        tenant: Arc<str>,
        activity_type: String,
        share: CpuShare,
        work: F,
    ) -> (F::Output, CpuUse)
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        // The task's span and the caller's subscriber go with it to the
        // guest thread: its logs and spans are the task's, as before.
        use tracing::Instrument as _;
        use tracing::instrument::WithSubscriber as _;
        let work = work
            .instrument(tracing::Span::current())
            .with_current_subscriber();
        let scheduled = self.run(tenant, activity_type, share, work);
        match &self.threads {
            Some(threads) => threads.spawn(scheduled).await,
            None => scheduled.await,
        }
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
            work: Some(Box::pin(work)),
            holding: false,
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

/// A task's execution under the scheduler: see [`CpuScheduler::run`].
pub struct Scheduled<F> {
    scheduler: Arc<CpuScheduler>,
    tenant: Arc<str>,
    activity_type: String,
    /// Used since it was last added to the metrics.
    unreported: CpuUse,
    share: CpuShare,
    /// Until it ends (dropped then, while it holds its slot).
    work: Option<Pin<Box<F>>>,
    /// Holds a slot: set around each poll of `work`.
    holding: bool,
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

/// A place in line. It holds no waker until its task waits: a task granted
/// a slot at once, or one already woken by its own yield, needs no wake.
fn new_ticket() -> Ticket {
    Ticket(Arc::new(Waiter {
        granted: AtomicBool::new(false),
        waker: Mutex::new(None),
    }))
}

impl<F: Future> Future for Scheduled<F> {
    type Output = (F::Output, CpuUse);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let (ticket, since) = match &this.waiting {
            Some(waiting) => waiting.clone(),
            None => {
                let ticket = new_ticket();
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
        let Some(work) = this.work.as_mut() else {
            // Polled again after it ended: nothing to run.
            this.holding_release(Duration::ZERO);
            return Poll::Pending;
        };
        // Until released: a panic in the poll must not keep the slot.
        this.holding = true;
        let before = thread_cpu();
        let polled = work.as_mut().poll(&mut Context::from_waker(&this.waker));
        if polled.is_ready() {
            // Its teardown (the store, the instance) is its own CPU too.
            this.work = None;
        }
        let used = thread_cpu().saturating_sub(before);
        this.used.cpu += used;
        this.unreported.cpu += used;
        let now = Instant::now();
        // Woken while it was polled: it yielded and runs on, so it is back
        // in line before the slot is given to anyone.
        let again = (polled.is_pending() && this.noting.woken.load(Ordering::Acquire)).then(|| {
            let again = new_ticket();
            this.waiting = Some((again.clone(), now));
            again
        });
        this.holding = false;
        let dispatch = lock(&this.scheduler.fair).release(&this.tenant, used, again, now);
        this.scheduler.apply(dispatch);
        if polled.is_ready() || this.unreported.cpu + this.unreported.waited >= REPORT_EVERY {
            this.report();
        }
        polled.map(|output| (output, this.used))
    }
}

impl<F> Scheduled<F> {
    /// Gives back the slot this task holds.
    fn holding_release(&mut self, used: Duration) {
        let dispatch = lock(&self.scheduler.fair).release(&self.tenant, used, None, Instant::now());
        self.scheduler.apply(dispatch);
    }

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
        if self.holding {
            // Its poll panicked while it held a slot.
            self.holding = false;
            self.holding_release(Duration::ZERO);
            return;
        }
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
    use crate::share::CpuWeight;

    /// Yields as wasmtime's fuel and epoch yields do: wakes itself while it
    /// is polled, then returns `Pending` once.
    struct Yield(bool);

    impl Future for Yield {
        type Output = ();

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            if self.0 {
                return Poll::Ready(());
            }
            self.0 = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    /// Burns about `cpu` of CPU, yielding every millisecond of it (it may
    /// go on on another thread after each).
    async fn burn(cpu: Duration) {
        let mut burnt = Duration::ZERO;
        while burnt < cpu {
            let slice = thread_cpu();
            while thread_cpu().saturating_sub(slice) < Duration::from_millis(1) {}
            burnt += thread_cpu().saturating_sub(slice);
            Yield(false).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn guests_execute_on_their_own_threads_below_the_hosts_priority() {
        let scheduler = CpuScheduler::new(2, Arc::new(Metrics::default()));
        let host = threads::priority();
        let ((name, nice), _) = scheduler
            .execute(
                Arc::from("a"),
                "where".to_owned(),
                CpuShare::default(),
                async {
                    let name = std::thread::current().name().map(str::to_owned);
                    (name, threads::priority())
                },
            )
            .await;
        assert_eq!(name.as_deref(), Some("corral-guest"));
        assert_eq!(nice, (host + GUEST_NICE).min(19), "host at nice {host}");
        // A guest's panic reaches the caller, and its slot is free again.
        let panicked = tokio::spawn({
            let scheduler = scheduler.clone();
            async move {
                scheduler
                    .execute(
                        Arc::from("a"),
                        "panic".to_owned(),
                        CpuShare::default(),
                        async { panic!("a broken invariant") },
                    )
                    .await
            }
        })
        .await;
        assert!(panicked.unwrap_err().is_panic());
        let run = scheduler.execute(
            Arc::from("b"),
            "seven".to_owned(),
            CpuShare::default(),
            async { 7 },
        );
        let (seven, _) = tokio::time::timeout(Duration::from_secs(10), run)
            .await
            .expect("the slots are free");
        assert_eq!(seven, 7);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_task_that_panics_while_it_runs_gives_its_slot_back() {
        let scheduler = CpuScheduler::new(1, Arc::new(Metrics::default()));
        let panics = scheduler.run(
            Arc::from("a"),
            "panic".to_owned(),
            CpuShare::default(),
            async { panic!("a broken invariant") },
        );
        assert!(tokio::spawn(panics).await.is_err());
        let next = scheduler.run(
            Arc::from("b"),
            "seven".to_owned(),
            CpuShare::default(),
            async { 7 },
        );
        let (value, _) = tokio::time::timeout(Duration::from_secs(10), next)
            .await
            .expect("the slot is free");
        assert_eq!(value, 7);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_task_that_yields_is_back_in_line_before_its_slot_is_given_away() {
        // One slot; `a` weighs 10,000 times `b`, each has one task that
        // yields every millisecond. Once `b` has had its turn (it starts
        // level), `a` is owed the slot at each of its yields and keeps it:
        // were a yielding task not back in line before the slot is handed
        // on, `b`, the only one waiting, would take every other slice.
        let scheduler = CpuScheduler::new(1, Arc::new(Metrics::default()));
        let order = Arc::new(Mutex::new(Vec::new()));
        let task = |name: &'static str, weight: i64| {
            let order = order.clone();
            let share = CpuShare {
                weight: CpuWeight::new(weight).unwrap(),
                max: None,
            };
            scheduler.run(Arc::from(name), "turns".to_owned(), share, async move {
                for _ in 0..5 {
                    lock(&order).push(name);
                    let slice = thread_cpu();
                    while thread_cpu().saturating_sub(slice) < Duration::from_millis(1) {}
                    Yield(false).await;
                }
            })
        };
        let (a, b) = (tokio::spawn(task("a", 10_000)), tokio::spawn(task("b", 1)));
        a.await.unwrap();
        b.await.unwrap();
        let order = lock(&order).clone();
        let a_done = order.iter().rposition(|n| *n == "a").unwrap_or(0);
        assert!(
            a_done <= 6,
            "b took turns while a was owed the slot: {order:?}"
        );
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
