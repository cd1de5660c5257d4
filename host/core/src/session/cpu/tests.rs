//! The scheduler as tasks meet it: turns, slots given back, threads.

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

/// The name of the thread it runs on, and its nice value.
fn here() -> (Option<String>, i32) {
    let name = std::thread::current().name().map(str::to_owned);
    (name, threads::priority())
}

/// `work` executed by a task of `tenant`.
fn execute<F>(
    scheduler: &Arc<CpuScheduler>,
    tenant: &str,
    work: F,
) -> impl Future<Output = (F::Output, CpuUse)> + Send + 'static
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (scheduler, tenant) = (scheduler.clone(), Arc::from(tenant));
    async move {
        let share = CpuShare::default();
        scheduler
            .execute(tenant, Arc::default(), share, || work)
            .await
    }
}

/// A task of `tenant` that holds a slot, on a guest thread if `yields`
/// first or else on the caller's, until `end` is sent; returned once it
/// holds it.
fn hold(
    scheduler: &Arc<CpuScheduler>,
    tenant: &str,
    yields: bool,
) -> (
    tokio::task::JoinHandle<((), CpuUse)>,
    std::sync::mpsc::Sender<()>,
) {
    let (started, has_started) = std::sync::mpsc::channel();
    let (end, ended) = std::sync::mpsc::channel::<()>();
    let holder = tokio::spawn(execute(scheduler, tenant, async move {
        if yields {
            Yield(false).await;
        }
        let _ = started.send(());
        let _ = ended.recv_timeout(Duration::from_secs(10));
    }));
    has_started
        .recv_timeout(Duration::from_secs(10))
        .expect("it holds its slot");
    (holder, end)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guests_execute_on_their_own_threads_below_the_hosts_priority() {
    let scheduler = CpuScheduler::new(2, Arc::new(Metrics::default()));
    let host = threads::priority();
    // A task that used a whole slice (and yielded) goes on on a guest
    // thread, at the guests' priority.
    let ((name, nice), _) = execute(&scheduler, "a", async {
        Yield(false).await;
        here()
    })
    .await;
    assert_eq!(name.as_deref(), Some("corral-guest"));
    assert_eq!(nice, (host + GUEST_NICE).min(19), "host at nice {host}");
    // A short task, given a slot at once, runs where it was called...
    let caller = here();
    let (short, _) = execute(&scheduler, "a", async { here() }).await;
    assert_eq!(short, caller);
    // ...inside the guests' runtime: what it spawns runs on their threads.
    let (spawned, _) = execute(&scheduler, "a", async {
        tokio::spawn(async { here() }).await.ok()
    })
    .await;
    assert_eq!(
        spawned.and_then(|(name, _)| name).as_deref(),
        Some("corral-guest")
    );
    // A task that waits for I/O goes on on a guest thread once woken.
    let (wake, woken) = tokio::sync::oneshot::channel::<()>();
    let mut waits = Box::pin(execute(&scheduler, "a", async move {
        let _ = woken.await;
        here()
    }));
    let mut cx = Context::from_waker(Waker::noop());
    assert!(waits.as_mut().poll(&mut cx).is_pending());
    let _ = wake.send(());
    let ((name, _), _) = waits.await;
    assert_eq!(name.as_deref(), Some("corral-guest"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_moved_to_a_guest_thread_keeps_its_span_and_subscriber() {
    use tracing::Instrument as _;
    use tracing::instrument::WithSubscriber as _;
    let scheduler = CpuScheduler::new(2, Arc::new(Metrics::default()));
    // A subscriber of this test's own (none is the global default), and
    // a span the caller runs the task in.
    let subscriber = tracing::Dispatch::new(tracing_subscriber::registry());
    let span = tracing::dispatcher::with_default(&subscriber, || tracing::info_span!("the-task"));
    let ((span, ours, name), _) = execute(&scheduler, "a", async {
        Yield(false).await;
        (
            tracing::Span::current().metadata().map(|m| m.name()),
            tracing::dispatcher::get_default(|d| d.is::<tracing_subscriber::Registry>()),
            here().0,
        )
    })
    .instrument(span)
    .with_subscriber(subscriber)
    .await;
    assert_eq!(name.as_deref(), Some("corral-guest"));
    assert_eq!(span, Some("the-task"));
    assert!(ours, "the caller's subscriber");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_task_on_a_guest_thread_is_torn_down_in_its_span() {
    use tracing::Instrument as _;
    use tracing::instrument::WithSubscriber as _;
    /// Says, when dropped, which span was current.
    struct Torn(std::sync::mpsc::Sender<Option<&'static str>>);
    impl Drop for Torn {
        fn drop(&mut self) {
            let _ = self
                .0
                .send(tracing::Span::current().metadata().map(|m| m.name()));
        }
    }
    let scheduler = CpuScheduler::new(2, Arc::new(Metrics::default()));
    let subscriber = tracing::Dispatch::new(tracing_subscriber::registry());
    let span = tracing::dispatcher::with_default(&subscriber, || tracing::info_span!("the-task"));
    let (torn, torn_rx) = std::sync::mpsc::channel();
    let (moved, moved_rx) = tokio::sync::oneshot::channel();
    let (_never, never_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(
        execute(&scheduler, "a", async move {
            let _torn = Torn(torn);
            Yield(false).await;
            let _ = moved.send(here().0);
            let _ = never_rx.await;
        })
        .instrument(span)
        .with_subscriber(subscriber),
    );
    assert_eq!(
        moved_rx.await.ok().flatten().as_deref(),
        Some("corral-guest")
    );
    // Cancelled mid-run: its store and instance go with it.
    task.abort();
    let current = tokio::task::spawn_blocking(move || torn_rx.recv())
        .await
        .unwrap();
    assert_eq!(current, Ok(Some("the-task")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guests_panic_reaches_the_caller_and_frees_its_slot_and_place() {
    // On a guest thread: the only slot is free again.
    let scheduler = CpuScheduler::new(1, Arc::new(Metrics::default()));
    let panicked = tokio::spawn(execute(&scheduler, "a", async {
        Yield(false).await;
        panic!("a broken invariant")
    }))
    .await;
    assert!(panicked.unwrap_err().is_panic());
    let seven = execute(&scheduler, "b", async { 7 });
    let (seven, _) = tokio::time::timeout(Duration::from_secs(10), seven)
        .await
        .expect("the slot is free");
    assert_eq!(seven, 7);
    // On the caller's thread: its place there is free again.
    let scheduler = CpuScheduler::new(2, Arc::new(Metrics::default()));
    let panicked = tokio::spawn(execute(&scheduler, "a", async {
        panic!("a broken invariant")
    }))
    .await;
    assert!(panicked.unwrap_err().is_panic());
    let caller = here();
    let (short, _) = execute(&scheduler, "b", async { here() }).await;
    assert_eq!(short, caller);
}

/// Panics at its first poll; would end at its second.
struct PanicsOnce(bool);

impl Future for PanicsOnce {
    type Output = u8;

    fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<u8> {
        if !self.0 {
            self.0 = true;
            panic!("a broken invariant");
        }
        Poll::Ready(1)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_whose_first_poll_panicked_is_not_polled_on_as_if_it_had_not() {
    let scheduler = CpuScheduler::new(2, Arc::new(Metrics::default()));
    let mut task = Box::pin(scheduler.execute(
        Arc::from("a"),
        Arc::default(),
        CpuShare::default(),
        || PanicsOnce(false),
    ));
    let mut cx = Context::from_waker(Waker::noop());
    let mut poll =
        || std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| task.as_mut().poll(&mut cx)));
    assert!(
        poll().is_err(),
        "its first poll panics, on the caller's thread"
    );
    // Polled again (a caller that caught the panic), it must not wait on
    // for a wake that never comes, holding the slot it panicked in.
    let again = poll().expect_err("polled on after its panic");
    assert_eq!(
        again.downcast_ref::<&str>(),
        Some(&"a task's execution polled again after its first poll panicked")
    );
    drop(task);
    // Its slot and its place on the caller's thread are free again.
    let caller = here();
    let (short, _) = execute(&scheduler, "b", async { here() }).await;
    assert_eq!(short, caller);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn a_task_that_waits_for_a_slot_runs_on_a_guest_thread() {
    // Both slots held, on guest threads, and a task of tenant `0` in line
    // (its turn comes before `b`'s: as little CPU, nothing running, and
    // its name first): the caller's place is free, but `b` must wait, and
    // waits on a guest thread.
    let scheduler = CpuScheduler::new(2, Arc::new(Metrics::default()));
    let holders = [hold(&scheduler, "a", true), hold(&scheduler, "a", true)];
    let share = CpuShare::default();
    let mut ahead = scheduler.run(Arc::from("0"), Arc::from("t"), share, async {});
    let mut cx = Context::from_waker(Waker::noop());
    assert!(Pin::new(&mut ahead).poll(&mut cx).is_pending());
    let mut waits = Box::pin(execute(&scheduler, "b", async { here() }));
    assert!(
        waits.as_mut().poll(&mut cx).is_pending(),
        "ran without a slot"
    );
    for (holder, end) in holders {
        let _ = end.send(());
        holder.await.unwrap();
    }
    let ((name, _), _) = tokio::time::timeout(Duration::from_secs(10), waits)
        .await
        .expect("the slots are free");
    assert_eq!(name.as_deref(), Some("corral-guest"));
    ahead.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn a_tenant_whose_turn_comes_next_runs_its_first_slice_at_once_though_the_slots_are_taken() {
    // Both slots held by `a`'s tasks on guest threads, which the system
    // may push off their cores (they run at a lower priority than the
    // host's). `b` has nothing running and its turn comes next: its first
    // slice runs at once on the caller's thread, beyond the slots.
    let scheduler = CpuScheduler::new(2, Arc::new(Metrics::default()));
    let holders = [hold(&scheduler, "a", true), hold(&scheduler, "a", true)];
    let caller = here();
    let runs = Box::pin(execute(&scheduler, "b", async { here() }));
    let mut cx = Context::from_waker(Waker::noop());
    let Poll::Ready((ran, used)) = { runs }.as_mut().poll(&mut cx) else {
        panic!("waited for a slot held by a tenant whose turn came after it");
    };
    assert_eq!(ran, caller);
    assert_eq!(used.waited, Duration::ZERO);
    // It gave the slot beyond the others back: `a`'s two hold theirs.
    assert_eq!(lock(&scheduler.fair).running(), 2);
    for (holder, end) in holders {
        let _ = end.send(());
        holder.await.unwrap();
    }
    assert_eq!(lock(&scheduler.fair).running(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_half_the_slots_run_a_first_poll_on_the_callers_threads() {
    // Two slots: `a`'s first poll takes the one place on the host's
    // threads, so `b`, with a slot free, runs on a guest thread.
    let scheduler = CpuScheduler::new(2, Arc::new(Metrics::default()));
    // (Where its one poll ran is the test: it may end before a first
    // poll of the caller's would see it pending.)
    let (holder, end) = hold(&scheduler, "a", false);
    let runs = execute(&scheduler, "b", async { here() });
    let ((name, _), _) = tokio::time::timeout(Duration::from_secs(10), runs)
        .await
        .expect("a slot is free");
    assert_eq!(
        name.as_deref(),
        Some("corral-guest"),
        "ran on the caller's thread"
    );
    let _ = end.send(());
    holder.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_panics_while_it_runs_gives_its_slot_back() {
    let scheduler = CpuScheduler::new(1, Arc::new(Metrics::default()));
    let panics = scheduler.run(
        Arc::from("a"),
        Arc::from("panic"),
        CpuShare::default(),
        async { panic!("a broken invariant") },
    );
    assert!(tokio::spawn(panics).await.is_err());
    let next = scheduler.run(
        Arc::from("b"),
        Arc::from("seven"),
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
        scheduler.run(Arc::from(name), Arc::from("turns"), share, async move {
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
            Arc::from("burn"),
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
            Arc::from("hold"),
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
            Arc::from("seven"),
            CpuShare::default(),
            async { 7 },
        );
        tokio::time::timeout(Duration::from_secs(10), run)
    };

    // In line, then gone: it must not be granted the slot later.
    let mut gone = Box::pin(scheduler.run(
        Arc::from("b"),
        Arc::from("none"),
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
        Arc::from("none"),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_dropped_in_line_counts_the_time_it_waited_there() {
    // A deadline or cancel that ends a task while it waits for a core:
    // that wait is the tenant's too (`corral_tenant_cpu_wait_seconds_total`).
    let metrics = Arc::new(Metrics::default());
    let scheduler = CpuScheduler::new(1, metrics.clone());
    let mut cx = Context::from_waker(Waker::noop());
    let mut gone = Box::pin(scheduler.run(
        Arc::from("b"),
        Arc::from("none"),
        CpuShare::default(),
        async {},
    ));
    let mut between = Duration::ZERO;
    while_held(&scheduler, || {
        let asked = Instant::now();
        assert!(gone.as_mut().poll(&mut cx).is_pending());
        // A wait too long to be mistaken for none.
        std::thread::sleep(Duration::from_millis(5));
        drop(gone);
        between = asked.elapsed();
    })
    .await;
    let waited = metrics.cpu("b").waited;
    assert!(
        waited >= Duration::from_millis(5) && waited <= between,
        "counted {waited:?} of a wait of {between:?}"
    );
}

/// Work whose drop burns this much of its thread's CPU (a store and an
/// instance to tear down).
struct CostlyToDrop(Duration);

impl Drop for CostlyToDrop {
    fn drop(&mut self) {
        let start = thread_cpu();
        while thread_cpu().saturating_sub(start) < self.0 {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_tasks_teardown_is_counted_as_its_tenants_cpu() {
    // Cancelled while it waits for I/O: in no line, holding no slot.
    let metrics = Arc::new(Metrics::default());
    let scheduler = CpuScheduler::new(1, metrics.clone());
    let mut cx = Context::from_waker(Waker::noop());
    let costly = CostlyToDrop(Duration::from_millis(20));
    let mut waiting = Box::pin(scheduler.run(
        Arc::from("b"),
        Arc::from("io"),
        CpuShare::default(),
        async move {
            let _costly = costly;
            std::future::pending::<()>().await;
        },
    ));
    assert!(waiting.as_mut().poll(&mut cx).is_pending());
    let before = metrics.cpu("b").used;
    drop(waiting);
    let counted = metrics.cpu("b").used.saturating_sub(before);
    assert!(
        counted >= Duration::from_millis(20),
        "counted {counted:?} of a 20 ms teardown"
    );
}

/// A waker that, woken, has the task follow another waker at once, as a
/// waker that polls the task where it is woken would.
struct Reentrant(Mutex<Option<Arc<Waiter>>>);

impl std::task::Wake for Reentrant {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let waiter = lock(&self.0).clone();
        if let Some(waiter) = waiter {
            waiter.follow(Waker::noop());
        }
    }
}

#[test]
fn a_wake_is_passed_on_with_the_tasks_waker_let_go() {
    let waiter = Waiter::new();
    let reentrant = Arc::new(Reentrant(Mutex::new(Some(waiter.clone()))));
    waiter.follow(&Waker::from(reentrant.clone()));
    let waker = Waker::from(waiter.clone());
    let (done, woke) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        waker.wake_by_ref();
        let _ = done.send(());
    });
    let woke = woke.recv_timeout(Duration::from_secs(10));
    lock(&reentrant.0).take();
    assert!(
        woke.is_ok(),
        "the wake never returned: the task's waker found its lock held"
    );
}
